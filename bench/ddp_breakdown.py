#!/usr/bin/env python3
"""Where a DDP iteration through the switch goes, from the ranks' timelines (issue 42).

    GRADSWITCH_TIMELINE=/tmp/tt/tl.json sudo python3 bench/torch_testbed.py --configs gs-ddp --stats \
        --out /tmp/tt
    python3 bench/ddp_breakdown.py /tmp/tt [more run folders ...]

Reads every rank's timeline (tl.rank*.json: the worker's allreduces and torch_iteration.py's
`iteration <i>` spans, written with --stats) and puts the ranks on one axis (each file's wall clock).
Per measured iteration it prints:
  pre     from the last rank's iteration start to the first admission of its first bucket (forward and
          the part of the backward before DDP hands the first bucket over: compute, and the host's load)
  spread  from the first to the last rank's admission of that bucket (ranks' compute skew)
  comm    from the last admission to the last result of the iteration's last allreduce (the wire)
  post    from there to the last rank's iteration end (the optimizer step)
and each rank's retransmissions and window (the job's window when each rank's first bucket ended).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys


def load(path: str) -> tuple[list, list]:
    """(allreduces, iterations) of one rank's timeline, as (begin_us, end_us, args) on the wall clock."""
    with open(path) as f:
        doc = json.load(f)
    off = doc.get("otherData", {}).get("wall_clock_ns", 0) / 1e3
    begun, allreduces, iterations = {}, [], []
    for e in doc["traceEvents"]:
        name = e.get("name", "")
        if name == "allreduce" and e["ph"] == "b":
            begun[e.get("id")] = e
        elif name == "allreduce" and e["ph"] == "e" and e.get("id") in begun:
            b = begun.pop(e["id"])
            allreduces.append((b["ts"] + off, e["ts"] + off, b.get("args", {})))
        elif name.startswith("iteration ") and e["ph"] == "X":
            iterations.append((e["ts"] + off, e["ts"] + e["dur"] + off, {}))
    return allreduces, iterations


def breakdown(run: str) -> list[dict]:
    """One dict per iteration of rank 0's timeline that every rank's allreduces fall in."""
    ranks = [load(p) for p in sorted(glob.glob(os.path.join(run, "tl.rank*.json")))]
    if not ranks or not ranks[0][1]:
        raise SystemExit(
            f"{run}: no timelines with iteration spans (run with --stats and GRADSWITCH_TIMELINE)"
        )
    rows = []
    for _begin0, end0, _ in ranks[0][1]:
        # every rank's iteration that ends within half a second of rank 0's, and its allreduces
        its = [[it for it in r[1] if abs(it[1] - end0) < 5e5] for r in ranks]
        ops = [
            [a for a in r[0] if it and it[0][0] <= a[0] < it[0][1]] for r, it in zip(ranks, its, strict=True)
        ]
        if not all(its) or not all(ops):
            continue
        start, end = max(it[0][0] for it in its), max(it[0][1] for it in its)
        admit = [o[0][0] for o in ops]
        done = max(o[-1][1] for o in ops)
        rows.append(
            {
                "iteration_ms": (end - start) / 1e3,
                "pre_ms": (min(admit) - start) / 1e3,
                "spread_ms": (max(admit) - min(admit)) / 1e3,
                "comm_ms": (done - max(admit)) / 1e3,
                "post_ms": (end - done) / 1e3,
                "retransmissions": [sum(a[2].get("retransmissions", 0) for a in o) for o in ops],
                "window": [o[0][2].get("window_rounds") for o in ops],
            }
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="folders of torch_testbed.py --out")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    a = p.parse_args(argv)
    for run in a.runs:
        rows = breakdown(run)
        if a.json:
            print(json.dumps({"run": run, "iterations": rows}))
            continue
        print(run)
        for i, r in enumerate(rows):
            print(
                f"  iteration {i}: {r['iteration_ms']:7.1f} ms = pre {r['pre_ms']:6.1f} + spread "
                f"{r['spread_ms']:6.1f} + comm {r['comm_ms']:6.1f} + post {r['post_ms']:6.1f}   "
                f"retransmissions {r['retransmissions']}  window {r['window']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
