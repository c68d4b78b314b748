"""Summarise a transport results file (.jsonl, one run per line, from the scripts in
bench/results/2026-11-29-syscalls/: syscalls-configs.sh, syscalls-dup.sh, testbed-configs.sh): per
configuration and loss (or duplication), the medians of time, CPU seconds (workers + switch), resends
and, where the run was counted by `perf stat -a`, system calls and context switches; with --ref, each
configuration's time against the reference's in the same round; and each configuration's lossy (or
duplicating) run against its 1e-06 run of the same round (the median of those per-round ratios is the
figure BENCHMARKS.md §10 quotes).

    python3 bench/transport_summary.py bench/results/2026-11-29-syscalls/hold.jsonl --ref hold0
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

EVENTS = (
    ("sendmmsg", "syscalls:sys_enter_sendmmsg"),
    ("recvmmsg", "syscalls:sys_enter_recvmmsg"),
    ("ppoll", "syscalls:sys_enter_ppoll"),
    ("syscalls", "raw_syscalls:sys_enter"),
    ("cs", "context-switches"),
)


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="bench/transport_summary.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("file", help="a .jsonl of runs")
    ap.add_argument("--ref", help="the configuration the others are compared with, round by round")
    a = ap.parse_args()
    rows = [json.loads(line) for line in open(a.file) if line.strip()]
    groups = collections.defaultdict(list)
    by_round = {}
    for r in rows:
        groups[(r["config"], r["loss"])].append(r)
        by_round[(r["config"], r["loss"], r["round"])] = r
    for (config, loss), runs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):

        def med(f, runs=runs):
            return statistics.median(f(x) for x in runs)

        line = f"{config:>10} {loss:<7} n={len(runs):2} ms={med(lambda x: x['median_s'] * 1e3):6.1f}"
        line += f" cpu={med(lambda x: sum(x['extra']['worker_cpu_s']) + x['extra']['switch_cpu_s']):.2f}"
        for name, ev in EVENTS:
            if all(ev in x.get("ev", {}) for x in runs):  # counted by perf stat (syscalls-*.sh)
                line += f" {name}={med(lambda x, ev=ev: x['ev'][ev]):7.0f}"
        line += f" resent={med(lambda x: x['extra']['timed_workers']['retransmissions']):6.0f}"
        if a.ref and config != a.ref:
            ref = [(x, by_round.get((a.ref, loss, x["round"]))) for x in runs]
            ratios = [x["median_s"] / r["median_s"] for x, r in ref if r]
            if ratios:
                line += f" vs {a.ref} {statistics.median(ratios):.3f}x"
        print(line)
    for config in sorted({c for c, _ in groups}):
        ratios = [
            r["median_s"] / by_round[(config, 1e-06, rnd)]["median_s"]
            for (c, loss, rnd), r in by_round.items()
            if c == config and loss != 1e-06 and (config, 1e-06, rnd) in by_round
        ]
        if ratios:
            m = statistics.median(ratios)
            print(f"{config}: against its 1e-06 run, per round: median {m:.3f}x (n={len(ratios)})")


if __name__ == "__main__":
    main()
