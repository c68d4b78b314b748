"""Summary of alternate.sh's runs: bench/mx8_wire.py's table for each build over its five rounds, and
main's time over this branch's, round by round (each pair ran back to back).

    python3 bench/results/2026-12-03-mx8/aggregate.py /tmp/ab-mx8 > summary.md
"""

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/
from mx8_wire import WIRES, summarize  # noqa: E402


def main() -> None:
    base = Path(sys.argv[1])
    builds = {}
    for b, label in (("new", "this branch"), ("old", "main (d09ca4d)")):
        runs, nbytes = [], 0
        for i in range(1, 6):
            d = json.loads((base / f"{b}-{i}" / "results.json").read_text())
            runs += [dict(r, round=i - 1) for r in d["runs"]]
            nbytes = d["nbytes"]
        builds[b] = runs
        print(f"{label}, {len(runs) // len(WIRES)} rounds:\n\n{summarize(runs, nbytes, 1e9)}\n")
    print("| wire | main / this branch, per round (median, range) |\n|---|---:|")
    for w in WIRES:
        new = {r["round"]: r["median_s"] for r in builds["new"] if r["wire"] == w}
        old = {r["round"]: r["median_s"] for r in builds["old"] if r["wire"] == w}
        ratios = [old[k] / new[k] for k in sorted(new)]
        print(f"| {w} | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |")
    (base / "results.json").write_text(json.dumps(builds, indent=1))


if __name__ == "__main__":
    main()
