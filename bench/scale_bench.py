#!/usr/bin/env python3
"""Beyond one switch (issue 10) on the emulated testbed, side by side in one run; every rank checks every
sum (float32 gradients of small integers, so any order of additions is exact).

    sudo flock /tmp/gradswitch-bench.lock python3 bench/scale_bench.py [--series racks,sharding]
        [--rate 200mbit] [--mb 16] [--iters 3] [--racks 2] [--workers-per-rack 4] [--workers 4]
        [--shards 1,2,4] [--out bench/results/<date>-scale]

racks: R racks of W workers behind leaf machines, uplinks to the spine at the workers' rate B
  (testbed racks topology). Two-level gradswitch (a leaf with --uplink per rack, the spine) vs one flat
  switch on the spine reached over the same uplinks vs gloo's ring across the racks. Per system: median
  time of an allreduce (slowest rank), per-worker goodput M/t as a share of B, and the bytes that crossed
  each rack's uplink per allreduce (interface counters, both ways, barriers and headers included) over M.
sharding: N workers and S switch machines whose links are capped at B (testbed sharded topology): the
  job on one switch vs sharded over S switches, each S in --shards.
colocated (not run by default): N workers, a switch on every worker machine and the job sharded over
  all of them (S = N) vs one dedicated switch on the bridge machine (a switch with a port at B per worker:
  its own address is on the bridge, not behind a shaped link) vs gloo's ring.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def _import():
    try:
        import gradswitch  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(ROOT / "python"))


def _machine() -> str:
    model = next(
        (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?"
    )
    return f"{model}, {os.cpu_count()} cores shared with other work, Linux {os.uname().release}"


def _record(name, res, tb, nbytes, uplinks=None, before=None, after=None) -> dict:
    rec = {"system": name, "ok": res.ok, "times": res.times, "error": res.extra.get("error")}
    if res.times:
        med = statistics.median(res.times)
        rec["median_s"] = med
        rec["goodput_share"] = nbytes * 8 / med / tb.link.rate if tb.link.rate else None
    if uplinks and before and after:
        per_ar = []
        for b, a in zip(before, after, strict=True):
            moved = (a["tx_bytes"] - b["tx_bytes"]) + (a["rx_bytes"] - b["rx_bytes"])
            per_ar.append(moved / 2 / res.extra["allreduces"] / nbytes)
        rec["uplink_bytes_per_allreduce_over_M"] = per_ar  # each way, averaged over up and down
    return rec


def _run_gs(tb, addresses, nbytes, a, logs, counted=()) -> tuple:
    """Workers through `addresses` (one per rank); counters of the `counted` (host, dev) around the run."""
    from gradswitch.baselines.common import combine
    from gradswitch.baselines.gradswitch_sys import run_workers

    before = [tb.counters(h, d) for h, d in counted]
    rs = run_workers(tb, addresses, nbytes, a.iters + 1, 1, timeout=a.run_timeout, logs=logs)
    after = [tb.counters(h, d) for h, d in counted]
    res = combine("gradswitch", len(addresses), nbytes, a.iters, rs, len(addresses))
    # a worker's every allreduce (timed, warmup, and the 4-byte barrier before each) crossed the uplinks
    res.extra["allreduces"] = a.iters + 1
    return res, before, after


def racks_series(a, log) -> list[dict]:
    from gradswitch.baselines import run_gloo
    from gradswitch.baselines.gradswitch_sys import CONTROL_PORT, switch_daemon
    from gradswitch.testbed import Testbed

    nbytes = int(a.mb * MB) // 4 * 4
    out = []
    name = f"sc{os.getpid() % 100000}"
    with Testbed(
        racks=a.racks, workers_per_rack=a.workers_per_rack, rate=a.rate, uplink_rate=a.rate, name=name
    ) as tb:
        topo = tb.topology
        n = tb.workers
        ups = [topo.uplink_interfaces(r)[0] for r in range(a.racks)]
        rack_of = [topo.rack_of(f"w{r}") for r in range(n)]
        log(
            f"racks: {a.racks} x {a.workers_per_rack} workers, links and uplinks {a.rate}, "
            f"{a.mb:g} MB x {a.iters}"
        )
        with switch_daemon(tb, host="spine", control_host="0.0.0.0") as spine:
            leaves = [
                switch_daemon(
                    tb, host=f"leaf{r}", extra_args=["--uplink", f"{topo.spine_address(r)}:{CONTROL_PORT}"]
                )
                for r in range(a.racks)
            ]
            try:
                for lf in leaves:
                    lf.start()
                logs = lambda: "".join(s.log() for s in (spine, *leaves))  # noqa: E731
                res, b, af = _run_gs(tb, [leaves[k].address for k in rack_of], nbytes, a, logs, ups)
                out.append(_record("gradswitch two-level", res, tb, nbytes, ups, b, af))
            finally:
                for lf in leaves:
                    lf.stop()
            log(f"  two-level: {out[-1]}")
            spine_for = [f"{topo.spine_address(k)}:{CONTROL_PORT}" for k in rack_of]
            res, b, af = _run_gs(tb, spine_for, nbytes, a, spine.log, ups)
            out.append(_record("gradswitch flat (one switch on the spine)", res, tb, nbytes, ups, b, af))
            log(f"  flat: {out[-1]}")
        b = [tb.counters(h, d) for h, d in ups]
        res = run_gloo(tb, nbytes, a.iters, warmup=1, timeout=a.run_timeout)
        af = [tb.counters(h, d) for h, d in ups]
        res.extra["allreduces"] = a.iters + 1
        out.append(_record("gloo ring", res, tb, nbytes, ups, b, af))
        log(f"  gloo: {out[-1]}")
    return out


def sharding_series(a, log) -> list[dict]:
    from gradswitch.baselines.gradswitch_sys import switch_daemon
    from gradswitch.testbed import Testbed

    nbytes = int(a.mb * MB) // 4 * 4
    shards = [int(s) for s in a.shards.split(",")]
    out = []
    name = f"ss{os.getpid() % 100000}"
    with Testbed(workers=a.workers, switches=max(shards), rate=a.rate, switch_rate=a.rate, name=name) as tb:
        log(f"sharding: N = {a.workers}, switch links and worker links {a.rate}, {a.mb:g} MB x {a.iters}")
        for s in shards:
            daemons = [switch_daemon(tb, host=f"s{i}") for i in range(s)]
            try:
                for d in daemons:
                    d.start()
                addr = ",".join(d.address for d in daemons)
                logs = lambda ds=daemons: "".join(d.log() for d in ds)  # noqa: E731
                res, _, _ = _run_gs(tb, [addr] * a.workers, nbytes, a, logs)
            finally:
                for d in daemons:
                    d.stop()
            out.append({**_record(f"gradswitch S={s}", res, tb, nbytes), "shards": s})
            log(f"  S={s}: {out[-1]}")
    return out


def colocated_series(a, log) -> list[dict]:
    from gradswitch.baselines import run_gloo
    from gradswitch.baselines.gradswitch_sys import switch_daemon
    from gradswitch.testbed import Testbed

    nbytes = int(a.mb * MB) // 4 * 4
    out = []
    name = f"sk{os.getpid() % 100000}"
    with Testbed(workers=a.workers, rate=a.rate, name=name) as tb:
        n = a.workers
        log(f"co-located: N = {n}, every link {a.rate}, {a.mb:g} MB x {a.iters}")
        layouts = [
            ("one dedicated switch", ["switch"]),
            (f"co-located, S = N = {n}", [f"w{i}" for i in range(n)]),
        ]
        for label, hosts in layouts:
            daemons = [switch_daemon(tb, host=h) for h in hosts]
            try:
                for d in daemons:
                    d.start()
                addr = ",".join(d.address for d in daemons)
                logs = lambda ds=daemons: "".join(d.log() for d in ds)  # noqa: E731
                res, _, _ = _run_gs(tb, [addr] * n, nbytes, a, logs)
            finally:
                for d in daemons:
                    d.stop()
            out.append(_record(f"gradswitch, {label}", res, tb, nbytes))
            log(f"  {label}: {out[-1]}")
        res = run_gloo(tb, nbytes, a.iters, warmup=1, timeout=a.run_timeout)
        out.append(_record("gloo ring", res, tb, nbytes))
        log(f"  gloo: {out[-1]}")
    return out


def _table(title: str, columns: list[str], rows: list[dict], first: str, cells) -> list[str]:
    """A section: the title and a table whose first column is each row's `first`, then cells(row); a
    run that failed shows its error instead."""
    out = [title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        if not r.get("median_s"):
            out.append(f"| {r[first]} | failed: {str(r.get('error'))[:80]} |" + " |" * (len(columns) - 2))
        else:
            out.append(f"| {r[first]} | " + " | ".join(cells(r)) + " |")
    return out


def _vs(base: float | None, r: dict) -> str:
    return f"{base / r['median_s']:.2f}x" if base else "n/a"


def report(results: dict) -> str:
    a = results["args"]
    lines = [f"Machine: {results['machine']}", f"Command: `{results['command']}`", ""]
    size = f"{a['mb']:g} MB float32"
    if "racks" in results:
        rows = results["racks"]
        gloo = next((r.get("median_s") for r in rows if r["system"] == "gloo ring"), None)
        title = (
            f"### Two levels: {a['racks']} racks x {a['workers_per_rack']} workers, every link and uplink "
            f"{a['rate']}, {size}"
        )
        columns = [
            "system",
            "median time",
            "per-worker goodput / B",
            "vs gloo ring",
            "uplink bytes per allreduce / M",
        ]

        def racks(r):
            up = " / ".join(f"{x:.3f}" for x in r.get("uplink_bytes_per_allreduce_over_M", []))
            return [f"{r['median_s'] * 1e3:.0f} ms", f"{r['goodput_share']:.2f}", _vs(gloo, r), up]

        lines += _table(title, columns, rows, "system", racks) + [""]
    if "sharding" in results:
        rows = results["sharding"]
        one = next((r.get("median_s") for r in rows if r["shards"] == 1), None)
        title = (
            f"### Sharding: N = {a['workers']} workers, every link (switches' and workers') {a['rate']}, "
            f"{size}"
        )
        columns = ["switches S", "median time", "speed-up vs S = 1", "per-worker goodput / B"]

        def shards(r):
            return [f"{r['median_s'] * 1e3:.0f} ms", _vs(one, r), f"{r['goodput_share']:.2f}"]

        lines += _table(title, columns, rows, "shards", shards) + [""]
    if "colocated" in results:
        rows = results["colocated"]
        gloo = next((r.get("median_s") for r in rows if r["system"] == "gloo ring"), None)
        title = f"### Co-located: N = {a['workers']} workers, every worker link {a['rate']}, {size}"
        columns = ["system", "median time", "per-worker goodput / B", "vs gloo ring"]

        def colocated(r):
            return [f"{r['median_s'] * 1e3:.0f} ms", f"{r['goodput_share']:.2f}", _vs(gloo, r)]

        lines += _table(title, columns, rows, "system", colocated)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", default="racks,sharding", help="comma list of racks, sharding, colocated")
    p.add_argument("--rate", default="200mbit", help="rate of every link, uplinks and switch links included")
    p.add_argument("--mb", type=float, default=16.0, help="allreduce size in MiB (float32)")
    p.add_argument("--iters", type=int, default=3, help="timed allreduces per system (after 1 warmup)")
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--workers-per-rack", type=int, default=4)
    p.add_argument("--workers", type=int, default=4, help="N of the sharding series")
    p.add_argument("--shards", default="1,2,4", help="S values of the sharding series")
    p.add_argument("--run-timeout", type=float, default=300.0, help="seconds per system run")
    p.add_argument("--out", type=Path, default=None, help="directory (default bench/results/<date>-scale)")
    p.add_argument("--report-only", type=Path, default=None, metavar="DIR", help="re-render DIR/results.json")
    a = p.parse_args(argv)
    if a.report_only:
        text = report(json.loads((a.report_only / "results.json").read_text()))
        (a.report_only / "report.md").write_text(text)
        print(text)
        return 0
    _import()
    series = [s for s in a.series.split(",") if s]
    unknown = set(series) - {"racks", "sharding", "colocated"}
    if unknown:
        p.error(f"unknown series {', '.join(sorted(unknown))}: use racks, sharding, colocated")
    out = a.out or ROOT / "bench" / "results" / f"{_dt.date.today().isoformat()}-scale"
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[{time.time() - t0:6.1f} s] {msg}", flush=True)

    results = {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "command": " ".join(
            ["python3", "bench/scale_bench.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "machine": _machine(),
    }
    if "racks" in series:
        results["racks"] = racks_series(a, log)
    if "sharding" in series:
        results["sharding"] = sharding_series(a, log)
    if "colocated" in series:
        results["colocated"] = colocated_series(a, log)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    text = report(results)
    (out / "report.md").write_text(text)
    print(text)
    log(f"written to {out}")
    ok = all(r.get("ok") for k in ("racks", "sharding", "colocated") for r in results.get(k, []))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
