"""What watching costs: the switch's packet rate with and without its metrics endpoint scraped every
second, and the workers' allreduce rate with and without GRADSWITCH_TIMELINE, side by side in one run.

    python3 bench/observability_cost.py [--rounds 8] [--seconds 4] [--size 64K --iters 1500]
        [--loopback build/test/bench/switch_loopback] [--out bench/results/<date>-observability/results.json]

Metrics: bench/switch_loopback (4 worker threads with their own sockets, 128 slots in flight each)
against a fresh gradswitchd, `--metrics-port` off, or on with a client fetching GET /metrics every
second. Timeline: `gradswitch bench` (2 worker processes through a fresh switch, every result checked)
with and without GRADSWITCH_TIMELINE, 64 KiB tensors by default (per-allreduce costs dominate).

Then the switch's CPU time per GET /metrics (two live jobs, scraped back to back, read from /proc), which
says what one scrape a second costs as a share of a core, a figure that hardly depends on the load.

Each comparison runs its two configurations at the same time, side by side, so load from elsewhere on
a shared machine falls on both; the ratio of each pair is reported (median and quartiles over rounds),
next to A/A pairs (the same configuration twice) that show how much the method itself scatters.
Run under `flock /tmp/gradswitch-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from gradswitch.daemon import Daemon

REPO = Path(__file__).resolve().parents[1]


def loopback_rate(loopback: str, seconds: float, metrics: bool) -> tuple[float, int]:
    """Server-side input packet rate (Mpps) of switch_loopback against a fresh switch; scrapes made."""
    with Daemon(threads=1, metrics_port=0 if metrics else None) as d:
        scrapes = 0
        stop = threading.Event()

        def scrape() -> None:
            nonlocal scrapes
            while not stop.wait(1.0):
                d.metrics()
                scrapes += 1

        t = threading.Thread(target=scrape, daemon=True)
        if metrics:
            t.start()
        try:
            out = subprocess.run(
                [
                    loopback,
                    "--switch",
                    d.address,
                    "--workers",
                    "4",
                    "--window",
                    "128",
                    "--seconds",
                    str(seconds),
                ],
                capture_output=True,
                text=True,
                timeout=seconds + 60,
                check=True,
            ).stdout
        finally:
            stop.set()
            if metrics:
                t.join(5)
    m = re.search(r"server in ([0-9.]+) Mpps", out)
    if not m:
        raise RuntimeError(f"switch_loopback printed no rate:\n{out}")
    return float(m.group(1)), scrapes


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc, clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scrape_cost(scrapes: int) -> dict[str, float]:
    """The switch's CPU time per GET /metrics with two live jobs (per-job series and histograms filled),
    scraped back to back; next to its CPU time over as long a wall time without scrapes."""
    import numpy as np

    import gradswitch

    with Daemon(threads=1, metrics_port=0) as d:
        groups = [gradswitch.connect(d.address, job=f"j{i}", rank=0, world_size=1) for i in range(2)]
        try:
            for g in groups:
                for _ in range(20):
                    g.allreduce(np.ones(100_000, np.float32))
            size = len(d.metrics().encode())
            c0, t0 = process_cpu_s(d.pid), time.monotonic()
            for _ in range(scrapes):
                d.metrics()
            c1, t1 = process_cpu_s(d.pid), time.monotonic()
            time.sleep(t1 - t0)  # the same wall time, no scrapes: what the switch spends anyway
            c2 = process_cpu_s(d.pid)
        finally:
            for g in groups:
                g.close()
    per_scrape = (c1 - c0) / scrapes
    idle_per_s = (c2 - c1) / (t1 - t0)
    return {
        "scrapes": scrapes,
        "bytes_per_scrape": size,
        "cpu_ms_per_scrape": per_scrape * 1e3,
        "idle_cpu_ms_per_s": idle_per_s * 1e3,
        "core_fraction_at_1_scrape_per_s": per_scrape,
    }


def bench_rate(size: str, iters: int, timeline_dir: str | None) -> float:
    """Allreduces per second per worker of `gradswitch bench -n 2` (mean over ranks of 1 / mean time)."""
    env = dict(os.environ)
    env.pop("GRADSWITCH_TIMELINE", None)
    if timeline_dir:
        env["GRADSWITCH_TIMELINE"] = os.path.join(timeline_dir, "tl.json")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gradswitch.cli",
            "bench",
            "-n",
            "2",
            "--size",
            size,
            "--iters",
            str(iters),
            "--warmup",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=True,
    ).stdout
    means = [float(m.group(1)) for m in re.finditer(r"^\s*\d+\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+", out, re.M)]
    if len(means) != 2:
        raise RuntimeError(f"gradswitch bench printed no per-rank times:\n{out}")
    if timeline_dir:  # the timeline really was written, one event per allreduce and rank
        for r in range(2):
            doc = json.loads(Path(timeline_dir, f"tl.rank{r}.json").read_text())
            n = sum(1 for e in doc["traceEvents"] if e.get("name") == "allreduce" and e.get("ph") == "b")
            if n < iters:
                raise RuntimeError(f"rank {r}'s timeline has {n} allreduces, fewer than {iters}")
    return statistics.mean(1e3 / m for m in means)


def side_by_side(a, b):
    """Runs a() and b() at the same time; their results. Load from elsewhere falls on both."""
    out = [None, None]

    def run(i, fn):
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if None in out:
        raise RuntimeError("a side-by-side run failed (see above)")
    return out


def summary(ratios: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return {
        "median": statistics.median(ratios),
        "q1": q[0],
        "q3": q[2],
        "min": min(ratios),
        "max": max(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=8, help="side-by-side pairs of each comparison")
    p.add_argument("--seconds", type=float, default=4.0, help="measured seconds of each loopback run")
    p.add_argument("--loopback", default=str(REPO / "build" / "test" / "bench" / "switch_loopback"))
    p.add_argument("--size", default="64K", help="tensor of the timeline runs (small: per-allreduce costs)")
    p.add_argument("--iters", type=int, default=1500, help="allreduces per timeline run")
    p.add_argument(
        "--scrapes", type=int, default=1000, help="back-to-back scrapes for the CPU cost per scrape"
    )
    p.add_argument("--only-scrape-cost", action="store_true", help="measure the CPU per scrape only")
    p.add_argument("--out", help="write the results as JSON here")
    a = p.parse_args(argv)
    if not os.access(a.loopback, os.X_OK):
        p.error(f"{a.loopback} is not built (ninja -C build/test switch_loopback)")

    def loop(metrics):
        return lambda: loopback_rate(a.loopback, a.seconds, metrics)[0]

    def bench(timeline):
        def run():
            with tempfile.TemporaryDirectory(prefix="gs-tl-") as tmp:
                return bench_rate(a.size, a.iters, tmp if timeline else None)

        return run

    # (name, first, second): the ratio is second / first; the A/A pairs measure the method's own noise
    comparisons = [
        ("metrics scraped every 1 s / no metrics (switch packet rate)", loop(False), loop(True)),
        ("A/A: no metrics / no metrics (switch packet rate)", loop(False), loop(False)),
        (f"timeline / no timeline ({a.size} allreduces per second)", bench(False), bench(True)),
        (f"A/A: no timeline / no timeline ({a.size} allreduces per second)", bench(False), bench(False)),
    ]
    if a.only_scrape_cost:
        comparisons = []
    results = {name: {"pairs": [], "ratios": []} for name, _, _ in comparisons}
    for r in range(a.rounds if comparisons else 0):
        for name, first, second in comparisons:
            x, y = side_by_side(first, second)
            results[name]["pairs"].append([x, y])
            results[name]["ratios"].append(y / x)
        print(
            f"round {r + 1}/{a.rounds}: " + "; ".join(f"{v['ratios'][-1]:.3f}" for v in results.values()),
            flush=True,
        )
    if comparisons:
        print("\nratio second / first, run side by side (median [quartiles] over rounds):")
    for name, v in results.items():
        v["summary"] = summary(v["ratios"])
        s = v["summary"]
        print(f"  {name}: {s['median']:.3f} [{s['q1']:.3f}, {s['q3']:.3f}]")
    cost = scrape_cost(a.scrapes)
    print(
        f"  one GET /metrics (2 live jobs, {cost['bytes_per_scrape']} bytes): "
        f"{cost['cpu_ms_per_scrape']:.3f} ms of the switch's CPU "
        f"({cost['core_fraction_at_1_scrape_per_s'] * 100:.3f}% of a core at one scrape per second; "
        f"the idle switch spends {cost['idle_cpu_ms_per_s']:.2f} ms/s)"
    )
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(
            json.dumps(
                {
                    "command": " ".join(
                        [
                            "python3",
                            "bench/observability_cost.py",
                            *(argv if argv is not None else sys.argv[1:]),
                        ]
                    ),
                    "machine": f"{platform.node()}, {platform.processor() or platform.machine()}, "
                    f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
                    "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "results": results,
                    "scrape_cost": cost,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
