"""bench/straggler_bench.py's report and the options it passes to bench/torch_iteration.py (issue 39),
without a testbed: the ratios divide by the same configuration's no-straggler launch of the same round,
and the straggler and deadline options refuse what cannot run."""

from __future__ import annotations

import sys

import pytest
from _netns import ROOT

sys.path.insert(0, str(ROOT / "bench"))
pytest.importorskip("torch", reason="PyTorch is not importable: bench/torch_iteration.py needs it")
import straggler_bench  # noqa: E402
import torch_iteration  # noqa: E402


def _run(rnd, scenario, config, it_s, missed=None):
    return {
        "round": rnd,
        "scenario": scenario,
        "config": config,
        "iteration_s": it_s,
        "fastest_rank_iteration_s": it_s,
        "missed": missed,
        "first_grad_spread_s": 0.01,
        "first_grad_spread_max_s": 0.02,
    }


def test_ratios_are_to_the_same_rounds_no_straggler_launch():
    a = straggler_bench.parse_args(["--scenarios", "none,slow-link"])
    runs = []
    for rnd, base in ((0, 1.0), (1, 2.0)):  # round 1's machine is twice as slow throughout
        for c in straggler_bench.CONFIGS:
            missed = None if c == "gloo-ddp" else (5.0 if c == "gs-deadline-ddp" else 0.0)
            runs += [_run(rnd, "none", c, base, missed), _run(rnd, "slow-link", c, 3 * base, missed)]
    rows = {tuple(line.split(" | ")[:2]): line for line in straggler_bench.summarize(runs, a).splitlines()}
    slow = rows["| slow-link", "gs-deadline-ddp"]
    assert "3.00x (3.00-3.00)" in slow, slow  # against round 0's or 1's own none, never the other's
    assert slow.endswith("| 5 |"), slow
    assert rows["| slow-link", "gloo-ddp"].endswith("| - |")


@pytest.mark.parametrize(
    "argv",
    [
        ["--slow-compute", "2"],  # no --slow-rank
        ["--slow-rank", "3"],  # no factor above 1
        ["--slow-rank", "3", "--slow-compute", "0.5"],
        ["--configs", "gs-deadline-ddp"],  # no --deadline-us
        ["--configs", "gs-concede-ddp"],
        ["--configs", "gs-concede-ef-ddp"],
    ],
)
def test_torch_iteration_refuses_half_an_option(argv, capsys):
    with pytest.raises(SystemExit):
        torch_iteration.parse_args(argv)
    assert "--" in capsys.readouterr().err


def test_torch_iteration_takes_a_straggler_and_a_deadline():
    a = torch_iteration.parse_args(
        ["--configs", "gs-deadline-ddp", "--deadline-us", "1000", "--slow-rank", "1", "--slow-compute", "2"]
    )
    assert (a.deadline_us, a.slow_rank, a.slow_compute) == (1000, 1, 2.0)


@pytest.mark.parametrize("scenarios", ["slow-link", "none,slow-disk"])
def test_the_bench_needs_known_scenarios_and_the_baseline(scenarios):
    with pytest.raises(SystemExit):
        straggler_bench.parse_args(["--scenarios", scenarios])


def test_the_bench_takes_some_configurations_only():
    a = straggler_bench.parse_args(["--configs", "gs-ddp,gs-concede-ddp"])
    assert a.configs == ["gs-ddp", "gs-concede-ddp"]
    with pytest.raises(SystemExit):
        straggler_bench.parse_args(["--configs", "gs-dedline-ddp"])
