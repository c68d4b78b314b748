#!/usr/bin/env python3
"""The switch's and the workers' CPU per datagram, builds or options side by side in alternated rounds.

    sudo flock /tmp/gradswitch-netns.lock python3 bench/cpu_bench.py \
        --variant main --variant 'hold0|--hold-us 0' --variant 'old=/path/to/site||GRADSWITCH_WINDOW=32' \
        --rounds 3 --out bench/results/tmp/cpu

The workload is the suite's cpu series (bench/suite.py --series cpu: N = 4, 32 MB x 3 after a warm-up,
1 Gbit/s links, MTU 1500, the daemon's --slots 32) on the emulated testbed (docs/testbed.md). Each
variant is `NAME[=SITE][|DAEMON ARGS[|WORKER ENV]]`: SITE is a directory holding an installed gradswitch
package (`pip install --target SITE .` of another commit; its bin/gradswitchd and its worker library
run; default: this checkout's), DAEMON ARGS go to gradswitchd, WORKER ENV (`K=V K=V`) to the workers.
Rounds run every variant once, in an order rotated each round, so load drifts over all of them alike.

Per run it reports, for the switch's data thread (perf stat --per-thread attached to the daemon, the
thread with the most CPU): CPU ns per DATA datagram received (the backend's rx_datagrams), its system
calls and context switches per datagram, datagrams per recvmmsg and per wake-up (the backend's own
`udp.sleeps`, without perf), and the STATS figures the suite
reports (data-thread s/GB of DATA received and s/GB reduced); for the workers: their CPU inside the
timed calls per GB reduced (as the suite), and per worker datagram. perf's hardware counters are not
available on this VM (no PMU), so CPU is task-clock (ns on the CPU); the counts of system calls and
wake-ups do not depend on the machine's speed. The medians over rounds, per variant, go to
--out/summary.json and are printed as a table.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

GB = 1e9
PERF_EVENTS = [
    "task-clock",
    "context-switches",
    "syscalls:sys_enter_recvmmsg",
    "syscalls:sys_enter_sendmmsg",
    "syscalls:sys_enter_ppoll",
    "syscalls:sys_enter_poll",
    "syscalls:sys_enter_sendmsg",
    "syscalls:sys_enter_recvmsg",
    "syscalls:sys_enter_epoll_wait",
    "syscalls:sys_enter_futex",
]


def parse_variant(spec: str) -> dict:
    head, _, rest = spec.partition("|")
    args, _, env = rest.partition("|")
    name, _, site = head.partition("=")
    envd = dict(kv.split("=", 1) for kv in env.split())
    return {"name": name, "site": site or None, "args": args.split(), "env": envd}


def perf_start(pids: list[int], out: Path) -> subprocess.Popen:
    cmd = ["perf", "stat", "-x", ",", "--per-thread", "-e", ",".join(PERF_EVENTS), "-o", str(out)]
    cmd += ["-p", ",".join(map(str, pids))]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def perf_stop(p: subprocess.Popen, out: Path) -> dict[str, dict[str, float]]:
    """{thread "comm-tid": {event: count}} from perf stat's CSV."""
    p.send_signal(signal.SIGINT)
    p.wait(10)
    threads: dict[str, dict[str, float]] = {}
    for ln in out.read_text().splitlines():
        f = ln.split(",")
        if len(f) < 4 or ln.startswith("#"):
            continue
        try:
            v = float(f[1])
        except ValueError:
            continue
        ev = f[3].replace("syscalls:sys_enter_", "")
        threads.setdefault(f[0], {})[ev] = v
    return threads


def worker_stat_sum(rs: list[dict], key: str) -> int:
    return sum(int((r.get("timed_stats") or r.get("stats") or {}).get(key, 0)) for r in rs)


def one_run(tb, v: dict, a, tmp: Path) -> dict:
    from gradswitch.baselines.common import combine, parse_results, wait_all
    from gradswitch.baselines.gradswitch_sys import switch_daemon

    site = v["site"]
    binary = str(Path(site) / "gradswitch" / "bin" / "gradswitchd") if site else None
    env = dict(v["env"])
    if site:
        env["PYTHONPATH"] = site  # replaces the testbed's own path: that build's worker library
    nbytes, total = int(a.mb * 1e6) // 4 * 4, a.iters + 1
    with switch_daemon(tb, 1, None, 0.0, a.slots, v["args"], binary=binary) as sw:
        s0 = sw.stats()
        perf_out = tmp / f"perf-{v['name']}.csv"
        perf = perf_start([sw.pid], perf_out)
        rec = None
        if a.record:  # a profile of the daemon (cpu-clock samples: no PMU here)
            rec_cmd = ["perf", "record", "-q", "-p", str(sw.pid)]
            rec_cmd += ["-e", a.record_events] if a.record_events else ["-e", "cpu-clock", "-F", "2000", "-g"]
            rec_cmd += ["-o", str(tmp / f"record-{v['name']}.data")]
            rec = subprocess.Popen(rec_cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)  # perf attached before the first datagram
        procs = []
        for r in range(a.workers):
            args = ["--switch", sw.address, "--rank", r, "--world", a.workers, "--nbytes", nbytes]
            args += ["--iters", total, "--warmup", 1, "--job", f"cpu{os.getpid()}"]
            if r == 0:
                args += ["--switch-pid", sw.pid]
            cmd = [sys.executable, "-m", "gradswitch.baselines.gradswitch_sys", "worker", *map(str, args)]
            procs.append((f"w{r}", tb.popen(f"w{r}", cmd, env=env, stdout=-1, stderr=-1, text=True)))
        wperf_out = tmp / f"wperf-{v['name']}.csv"
        wperf = perf_start([p.pid for _, p in procs], wperf_out)
        outs = wait_all(procs, a.run_timeout)
        wthreads = perf_stop(wperf, wperf_out)
        threads = perf_stop(perf, perf_out)
        if rec:
            rec.send_signal(signal.SIGINT)
            rec.wait(30)
        s1 = sw.stats()
    for name, _, _, err in outs:
        (tmp / f"{v['name']}-{name}.stderr").write_text(err)
    if any(rc != 0 for _, rc, _, _ in outs):
        raise RuntimeError(f"{v['name']}: a worker failed:\n" + "\n".join(e[-2000:] for _, _, _, e in outs))
    rs = sorted((r for _, _, so, _ in outs for r in parse_results(so)), key=lambda r: r["rank"])
    res = combine("gradswitch", a.workers, nbytes, a.iters, rs, a.workers)
    d = {k: v1 - s0.get(k, 0) for k, v1 in s1.items() if isinstance(v1, int)}

    def stat(name: str) -> int:  # STATS names a backend counter `udp.NAME` (per thread: `...thread=i`)
        return sum(val for k, val in d.items() if k == name or k.split(".")[-1].startswith(name))

    rx = stat("rx_datagrams")
    data = max(threads.values(), key=lambda t: t.get("task-clock", 0))
    wsum: dict[str, float] = {}
    for t in wthreads.values():
        for k, val in t.items():
            wsum[k] = wsum.get(k, 0) + val
    wdgrams = worker_stat_sum(rs, "packets_sent") + worker_stat_sum(rs, "packets_received")
    data_cpu = next((r.get("switch_data_cpu_s") for r in rs if r["rank"] == 0), None)
    reduced_gb = nbytes * a.iters / GB  # each worker's gradient over the timed calls; DATA is N times it
    return {
        "variant": v["name"],
        "ok": res.ok,
        "median_ms": res.median * 1e3,
        "rx_datagrams": rx,
        "switch_ns_per_dgram": data.get("task-clock", 0) * 1e6 / rx if rx else None,  # task-clock: ms
        "switch_recvmmsg_per_dgram": data.get("recvmmsg", 0) / rx if rx else None,
        "switch_dgrams_per_recvmmsg": rx / data["recvmmsg"] if data.get("recvmmsg") else None,
        "switch_sendmmsg_per_dgram": data.get("sendmmsg", 0) / rx if rx else None,
        "switch_polls_per_dgram": (data.get("ppoll", 0) + data.get("poll", 0)) / rx if rx else None,
        "switch_cs_per_dgram": data.get("context-switches", 0) / rx if rx else None,
        "switch_dgrams_per_train": rx / stat("gro_trains") if stat("gro_trains") else None,
        "switch_gso_writes": stat("gso_writes"),
        "switch_gro_trains": stat("gro_trains"),
        "switch_held_bursts": stat("held_bursts"),
        # from the backend's own counters (no perf): datagrams per wake-up of the data threads
        "switch_dgrams_per_sleep": rx / stat("sleeps") if stat("sleeps") else None,
        "switch_stats": d,
        # as the suite: the data thread's CPU over rank 0's timed window per GB reduced, and per GB of
        # DATA received (the N workers' gradients)
        "switch_s_per_gb_data": data_cpu / (reduced_gb * a.workers) if data_cpu else None,
        "switch_s_per_gb_reduced": data_cpu / reduced_gb if data_cpu else None,
        "worker_s_per_gb": statistics.mean(r["cpu_s"] for r in rs) / reduced_gb,
        "worker_ns_per_dgram": wsum.get("task-clock", 0) * 1e6 / wdgrams if wdgrams else None,
        "worker_syscalls_per_dgram": sum(
            val for k, val in wsum.items() if k not in ("task-clock", "context-switches")
        )
        / wdgrams
        if wdgrams
        else None,
        "worker_cs_per_dgram": wsum.get("context-switches", 0) / wdgrams if wdgrams else None,
        "worker_retx": worker_stat_sum(rs, "retransmissions"),
        "load": os.getloadavg()[0],
        "switch_perf": data,
        "worker_perf": wsum,
    }


KEYS = [
    ("switch_dgrams_per_train", "dg/GRO train", "{:.1f}"),
    ("switch_ns_per_dgram", "sw ns/dg", "{:.0f}"),
    ("switch_dgrams_per_recvmmsg", "dg/recvmmsg", "{:.2f}"),
    ("switch_sendmmsg_per_dgram", "sendmmsg/dg", "{:.3f}"),
    ("switch_polls_per_dgram", "polls/dg", "{:.3f}"),
    ("switch_dgrams_per_sleep", "dg/sleep", "{:.1f}"),
    ("switch_cs_per_dgram", "cs/dg", "{:.3f}"),
    ("switch_s_per_gb_data", "sw s/GB DATA", "{:.3f}"),
    ("switch_s_per_gb_reduced", "sw s/GB red", "{:.2f}"),
    ("worker_s_per_gb", "wk s/GB", "{:.2f}"),
    ("worker_ns_per_dgram", "wk ns/dg", "{:.0f}"),
    ("worker_syscalls_per_dgram", "wk sys/dg", "{:.3f}"),
    ("median_ms", "ms", "{:.0f}"),
]


def summarize(runs: list[dict], names: list[str]) -> dict:
    out = {}
    for n in names:
        rs = [r for r in runs if r["variant"] == n and r.get("ok")]
        out[n] = {
            k: statistics.median(r[k] for r in rs if r.get(k) is not None)
            for k, _, _ in KEYS
            if any(r.get(k) is not None for r in rs)
        }
        out[n]["rounds"] = len(rs)
    return out


def print_table(summary: dict) -> None:
    print("| variant | rounds | " + " | ".join(h for _, h, _ in KEYS) + " |")
    print("|---|---:|" + "---:|" * len(KEYS))
    for n, s in summary.items():
        cells = [fmt.format(s[k]) if k in s else "-" for k, _, fmt in KEYS]
        print(f"| {n} | {s['rounds']} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", action="append", default=[], help="NAME[=SITE][|DAEMON ARGS[|WORKER ENV]]")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--mb", type=float, default=32.0)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--record", action="store_true", help="also perf record the daemon (out/record-NAME.data)")
    p.add_argument(
        "--record-events",
        default=None,
        help="with --record: these perf events (e.g. syscalls:sys_enter_ppoll,sched:sched_switch) instead of "
        "cpu-clock samples, to time the data thread's sleeps and system calls (perf script)",
    )
    p.add_argument("--run-timeout", type=float, default=150)
    p.add_argument("--out", type=Path, default=HERE / "results" / "tmp" / "cpu")
    p.add_argument("--summarize", type=Path, default=None, help="print the table of DIR/runs.json and exit")
    a = p.parse_args(argv)
    if a.summarize:
        runs = json.loads((a.summarize / "runs.json").read_text())
        for r in runs:  # runs recorded before the train count was a column
            st = r.get("switch_stats") or {}
            trains = r.get("switch_gro_trains") or sum(v for k, v in st.items() if "gro_trains" in k)
            if trains and r.get("rx_datagrams"):
                r["switch_dgrams_per_train"] = r["rx_datagrams"] / trains
        print_table(summarize(runs, list(dict.fromkeys(r["variant"] for r in runs))))
        return 0
    from gradswitch.testbed import Testbed

    variants = [parse_variant(s) for s in (a.variant or ["main"])]
    a.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    with Testbed(workers=a.workers, rate=a.rate, name="cpub") as tb:
        for rnd in range(a.rounds):
            k = rnd % len(variants)
            for v in variants[k:] + variants[:k]:
                try:
                    r = one_run(tb, v, a, a.out)
                except Exception as e:  # recorded, the others go on
                    r = {"variant": v["name"], "ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}
                r["round"] = rnd
                runs.append(r)
                shown = {k2: r.get(k2) for k2, _, _ in KEYS}
                print(
                    f"round {rnd} {v['name']}: ok={r.get('ok')} " + json.dumps(shown, default=str), flush=True
                )
                if not r.get("ok"):
                    print(r.get("error", ""), flush=True)
                (a.out / "runs.json").write_text(json.dumps(runs, indent=1))
    summary = summarize(runs, [v["name"] for v in variants])
    (a.out / "summary.json").write_text(
        json.dumps({"command": " ".join(sys.argv), "summary": summary}, indent=1)
    )
    print_table(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
