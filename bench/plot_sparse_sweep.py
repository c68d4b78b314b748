#!/usr/bin/env python3
"""Plots bench/sparse_bench.py's density sweep (BENCHMARKS.md section 18) from its recorded results.json.

    python3 bench/plot_sparse_sweep.py bench/results/2026-12-03-sparse/sweep.svg \
        bench/results/2026-12-03-sparse/sweep-1gbit/results.json:"1 Gbit/s testbed" \
        bench/results/2026-12-03-sparse/sweep-loopback-fine/results.json:loopback

One panel: the time of one allreduce against the share of non-zero blocks (log axis), per results file a
dense line (sparse=False) and a block-skipping line (sparse=True), each the median over rounds with its
range shaded, and the file's crossover (sparse_bench.crossover) marked. Every series the file holds is
drawn: a sweep with gloo's times (rows with "gloo_s") gets a gloo line too. matplotlib is needed only
here (it is no dependency of gradswitch); the format follows the output's suffix (.svg, .png, .pdf).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (key in a sweep row, legend name, line style)
SERIES = (
    ("dense_s", "gradswitch dense", "-"),
    ("sparse_s", "gradswitch, zero blocks skipped", "--"),
    ("gloo_s", "gloo dense", ":"),
)


def _pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise SystemExit(
            "plot_sparse_sweep: matplotlib is not installed (pip install matplotlib); it is needed only "
            "to draw the plot, the sweep's figures are in its results.json and summary.md"
        ) from e
    matplotlib.use("Agg")  # no display needed
    matplotlib.rcParams["svg.hashsalt"] = "gradswitch"  # the same SVG from the same data
    import matplotlib.pyplot as plt

    return plt


def load(spec: str) -> tuple[str, dict]:
    """FILE[:LABEL] -> (label, the file's sweep); the label defaults to the sweep's rate or 'loopback'."""
    path, _, label = spec.partition(":")
    try:
        sweep = json.loads(Path(path).read_text())["sweep"]
    except (OSError, ValueError, KeyError) as e:
        what = "not a sparse_bench.py results.json with a sweep"
        raise SystemExit(f"plot_sparse_sweep: {path}: {what} ({e})") from e
    return label or sweep.get("rate") or "loopback", sweep


def plot(sweeps: list[tuple[str, dict]], out: str) -> None:
    """Draws the sweeps into `out`."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for i, (label, sweep) in enumerate(sweeps):
        color = f"C{i}"
        rows = sorted(sweep["rows"], key=lambda r: r["density"])
        x = [r["density"] * 100 for r in rows]
        for key, name, style in SERIES:
            if not all(key in r for r in rows):
                continue
            ms = {k: [r[key][k] * 1e3 for r in rows] for k in ("median", "min", "max")}
            ax.plot(x, ms["median"], style, marker="o", ms=3.5, color=color, label=f"{label}: {name}")
            ax.fill_between(x, ms["min"], ms["max"], color=color, alpha=0.12, linewidth=0)
        c = sweep.get("crossover")
        if c is not None:
            ax.axvline(c * 100, color=color, linewidth=0.8, alpha=0.7)
            ax.annotate(
                f"crossover {c:.0%}",
                (c * 100, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-4, -4 - 12 * i),
                textcoords="offset points",
                ha="right",
                va="top",
                color=color,
                fontsize=8,
            )
    mb = sweeps[0][1]["nbytes"] / 1e6
    ax.set_xscale("log")
    ax.set_xlabel("non-zero blocks, % of the tensor's (log)")
    ax.set_ylabel(f"one {mb:.0f} MB float32 allreduce, ms")
    ax.set_title("Block skipping against the dense allreduce (4 workers; median, range shaded)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(out, metadata={"Date": None} if out.endswith(".svg") else None)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the plot's file (.svg, .png or .pdf)")
    p.add_argument("results", nargs="+", help="sparse_bench.py results.json files, each FILE[:LABEL]")
    a = p.parse_args(argv)
    plot([load(s) for s in a.results], a.out)
    print(f"wrote {a.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
