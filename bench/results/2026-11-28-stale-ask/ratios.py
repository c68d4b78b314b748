"""Per-round ratios of a results file's configurations to one of them, in the same round.

testbed-configs.sh files (rows with `loss`): each configuration against --ref at each loss, and each
loss against the lossless (1e-06) run of the same configuration and round. dup-reorder.sh files (rows
with `window`): each configuration against --ref (default `none`) under the same window.

Usage: python3 ratios.py FILE.jsonl [--ref NAME]
"""

import argparse
import collections
import json
import statistics


def line(label: str, ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return (
        f"  {label:28s} median {statistics.median(ratios):.3f}x  quartiles {q[0]:.2f}-{q[2]:.2f}  "
        f"n={len(ratios)}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--ref", help="the configuration the others are divided by")
    a = ap.parse_args()
    rows = [json.loads(x) for x in open(a.file)]
    by = collections.defaultdict(dict)  # (group, round) -> config -> seconds
    grouped_by_window = "window" in rows[0]
    for r in rows:
        group = r["window"] if grouped_by_window else r["loss"]
        by[(group, r["round"])][r["config"]] = r["median_s"]
    configs = sorted({r["config"] for r in rows})
    ref = a.ref or ("none" if grouped_by_window else configs[0])
    for group in sorted({g for g, _ in by}, key=str):
        rounds = [v for (g, _), v in by.items() if g == group]
        print(f"{'window' if grouped_by_window else 'loss'} {group}:")
        for c in configs:
            if c != ref:
                ratios = [v[c] / v[ref] for v in rounds if c in v and ref in v]
                if ratios:
                    print(line(f"{c} / {ref}", ratios))
    if not grouped_by_window:
        for c in configs:
            for group in sorted({g for g, _ in by if g != 1e-06}):
                ratios = [
                    by[(group, rd)][c] / by[(1e-06, rd)][c]
                    for (g, rd) in by
                    if g == group and c in by[(g, rd)] and c in by.get((1e-06, rd), {})
                ]
                if ratios:
                    print(line(f"{c} loss {group} / lossless", ratios))


if __name__ == "__main__":
    main()
