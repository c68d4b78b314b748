#!/usr/bin/env python3
"""Summarise the per-rank window traces that trace.patch writes (GS_DBG_TRACE=<prefix>: one file per
worker process, <prefix>.<pid>): each rank's own window and the job's (after the RESULT) at the end of
every BUCKET ms, the number of cuts (own window down by more than 10% at one RESULT), and how fast
the job's window grew between its falls of more than 10%: the net rounds gained over those stretches
divided by their time (rounds per ms; a window that flips up and down between two values gains none).
Usage: windows.py [--bucket-ms 25] FILE..."""

import argparse
import re

LINE = re.compile(r"^(\d+) r(\d+) .* b([\d.]+) a([\d.]+) n([\d.]+)(?: j(\d+))?")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+")
    ap.add_argument("--bucket-ms", type=float, default=25)
    a = ap.parse_args()
    for path in a.files:
        rows = [m for m in map(LINE.match, open(path)) if m]
        if not rows:
            print(f"{path}: no trace lines")
            continue
        t0 = int(rows[0][1])
        buckets: dict[int, str] = {}
        cuts = 0
        rise_rounds = rise_us = 0.0
        start = prev = None  # the stretch since the job's window last fell by more than 10%
        for m in rows:
            t, before, own = int(m[1]), float(m[3]), float(m[5])
            job = int(m[6]) if m[6] else int(own)
            if own < 0.9 * before:
                cuts += 1
            if prev is not None and job < 0.9 * prev[1]:
                rise_rounds += prev[1] - start[1]
                rise_us += prev[0] - start[0]
                start = None
            if start is None:
                start = (t, job)
            prev = (t, job)
            buckets[int((t - t0) / (a.bucket_ms * 1000))] = f"{own:.0f}/{job}"
        rank = rows[0][2]
        rate = rise_rounds / (rise_us / 1000) if rise_us else 0.0
        print(f"{path} rank {rank}: {len(rows)} lines, {cuts} cuts, job window rising {rate:.2f} rounds/ms")
        series = " ".join(buckets.get(i, "-") for i in range(max(buckets) + 1))
        print(f"  own/job every {a.bucket_ms:g} ms: {series}")


if __name__ == "__main__":
    main()
