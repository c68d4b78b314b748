#!/usr/bin/env python3
"""Per size, every configuration's time as a ratio to the best fixed window: the fixed window whose
median over the rounds is lowest, chosen once per size (a window is a choice made before the run), and
compared round by round (each round's configurations ran one after the other). Prints the median of
the per-round ratios. Taking the faster of two noisy fixed windows in every round instead would bias
the reference low by about the noise: `--per-round` shows that too; `--against NAME` takes another
configuration as the reference. Configurations are named <name>-<size>, e.g. w64-16M.
Usage: size_ratios.py FILE.jsonl [--fixed w64,w96] [--per-round | --against NAME]"""

import argparse
import collections
import json
import statistics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--fixed", default="w64,w96", help="the fixed windows' names (default: w64,w96)")
    ap.add_argument("--per-round", action="store_true", help="the faster fixed window of each round")
    ap.add_argument("--against", help="a configuration to compare with instead of a fixed window")
    a = ap.parse_args()
    fixed = a.fixed.split(",")
    runs: dict[tuple[str, str], dict[str, float]] = collections.defaultdict(dict)
    for line in open(a.file):
        r = json.loads(line)
        name, size = r["config"].rsplit("-", 1)
        runs[(size, r["round"])][name] = r["median_s"] * 1e3
    for size in sorted({s for s, _ in runs}):
        rounds = [times for (s, _), times in sorted(runs.items()) if s == size]
        medians = {f: statistics.median(t[f] for t in rounds if f in t) for f in fixed}
        best = a.against or min(medians, key=medians.get)
        names = sorted({n for t in rounds for n in t})
        ref = "the faster fixed window of each round" if a.per_round else best
        if not a.per_round and not a.against:
            ref += " (the fixed window with the lowest median)"
        print(f"{size}: against {ref}, {len(rounds)} rounds")
        for name in names:
            rs = []
            for t in rounds:
                base = min(t[f] for f in fixed if f in t) if a.per_round and not a.against else t.get(best)
                if name in t and base:
                    rs.append(t[name] / base)
            each = " ".join(f"{x:.2f}" for x in rs)
            print(f"  {name:10} median {statistics.median(rs):.2f}x: {each}")


if __name__ == "__main__":
    main()
