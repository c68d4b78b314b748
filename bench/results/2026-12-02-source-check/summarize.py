"""Medians of alternate.sh's lines (stdin): per build, and the per-round ratio A/B."""

import statistics
import sys

runs: dict[str, dict[int, float]] = {"A": {}, "B": {}}
bad = 0
for line in sys.stdin:
    f = line.split()
    if len(f) < 8 or f[0] != "build":
        continue
    if f[7] != "1" or not f[5]:
        bad += 1
        continue
    runs[f[1]][int(f[3])] = float(f[5])
pairs = [runs["A"][r] / runs["B"][r] for r in runs["A"] if r in runs["B"]]
for b in "AB":
    v = sorted(runs[b].values())
    if v:
        print(f"{b}: n={len(v)} median {statistics.median(v):.2f} ms (min {v[0]:.2f}, max {v[-1]:.2f})")
if pairs:
    p = sorted(pairs)
    print(
        f"A/B per round: median {statistics.median(p):.3f} (min {p[0]:.3f}, max {p[-1]:.3f}), {len(p)} rounds"
    )
print(f"runs without an exact result or a figure: {bad}")
