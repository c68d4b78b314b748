"""bench/plot_sparse_sweep.py draws the recorded density sweep (BENCHMARKS.md section 18) and says what
is missing when matplotlib is not installed (it is no dependency of gradswitch)."""

from __future__ import annotations

import sys

import pytest
from _netns import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import plot_sparse_sweep  # noqa: E402

SWEEP = ROOT / "bench" / "results" / "2026-12-03-sparse" / "sweep-1gbit" / "results.json"


def test_plot_draws_both_lines_and_the_crossover(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: nothing to draw with")
    out = tmp_path / "sweep.svg"
    assert plot_sparse_sweep.main([str(out), f"{SWEEP}:testbed"]) == 0
    svg = out.read_text()
    assert "crossover 81%" in svg and "testbed: gradswitch dense" in svg
    assert "zero blocks skipped" in svg and "gloo" not in svg  # the recorded sweep has no gloo series


def test_bad_input_and_missing_matplotlib_are_clear_errors(tmp_path, monkeypatch):
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit, match="not a sparse_bench.py results.json"):
        plot_sparse_sweep.load(str(bad))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    with pytest.raises(SystemExit, match="matplotlib is not installed"):
        plot_sparse_sweep.plot([plot_sparse_sweep.load(str(SWEEP))], str(tmp_path / "p.svg"))
