"""Per round of a testbed-configs.sh .jsonl: each configuration's median (ms) and its ratio to the best
of the named fixed windows in the same round (the runs of one round are minutes apart, so a ratio
within a round is steadier than a ratio of medians taken over an hour).

Usage: python3 ratios.py FILE.jsonl w64,w96
"""

import collections
import json
import statistics
import sys


def main(path: str, fixed: list[str]) -> None:
    by_round: dict[str, dict[str, float]] = collections.defaultdict(dict)
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            by_round[r["round"]][r["config"]] = statistics.median(r["times"]) * 1e3
    for rnd in sorted(by_round, key=int):
        row = by_round[rnd]
        if not any(c in row for c in fixed):
            continue  # a round of other sizes only
        best = min(row[c] for c in fixed if c in row)
        print(rnd, " ".join(f"{c} {v:.1f} ({v / best:.2f}x)" for c, v in sorted(row.items())))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2].split(","))
