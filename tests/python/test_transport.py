"""The worker's window (docs/protocol.md section 4.2) end to end: ranks whose windows differ -- one
always using the whole pool, one adaptive with a target so small that its window shrinks to a few
rounds, one with a window of 4 rounds -- stream allreduces through a lossy switch and still agree on
exact sums (chunks start in order, so no two ranks wait on each other's windows; fixed32 keeps its
agreed exponents when a slot waits between chunks); and the window options are checked."""

from __future__ import annotations

import os

import pytest
from test_allreduce import _plan_worker, assert_reports, run_workers

import gradswitch


def _env_worker(q, rank, world, address, plan, connect_kwargs, env):
    os.environ.update(env)  # read by Group::connect in this process only
    _plan_worker(q, rank, world, address, plan, connect_kwargs)


def test_mixed_windows_agree_under_loss(start_switch):
    sw = start_switch(slots=32, drop_rate=0.05, seed=5)
    world = 3
    # A 1 us target: every own round trip is "queued", so windows shrink and grow all the time,
    # and a window below the rounds already in flight must not keep a rank from the oldest chunk.
    tiny = {"GRADSWITCH_WINDOW": "adaptive", "GRADSWITCH_TARGET_DELAY_US": "1"}
    envs = [{"GRADSWITCH_WINDOW": "fixed"}, tiny, {"GRADSWITCH_WINDOW": "4"}]
    plan = [
        ("win-fixed32", "fixed32", [("exact", 100_003), ("int", 100_003), ("exact", 361)]),
        ("win-f32", "float32", [("exact", 100_003), ("int", 50_003), ("exact", 7)]),
    ]
    reports = run_workers(
        _env_worker,
        [(r, world, sw.address, plan, {"drop_rate": 0.05, "seed": 11}, envs[r]) for r in range(world)],
        deadline_s=120,
    )
    assert_reports(reports)
    for job in ("win-fixed32", "win-f32"):
        assert sum(rep["stats"][job]["retransmissions"] for rep in reports.values()) > 0


@pytest.mark.parametrize(
    "env, words",
    [
        ({"GRADSWITCH_WINDOW": "cubic"}, "window must be 'adaptive', 'fixed' or a number of rounds"),
        ({"GRADSWITCH_WINDOW": "0"}, "window must be 'adaptive', 'fixed' or a number of rounds"),
        ({"GRADSWITCH_WINDOW": "65536"}, "window must be 'adaptive', 'fixed' or a number of rounds"),
        ({"GRADSWITCH_WINDOW": "-8"}, "window must be 'adaptive', 'fixed' or a number of rounds"),
        ({"GRADSWITCH_TARGET_DELAY_US": "0"}, "target delay must be in"),
        ({"GRADSWITCH_TARGET_DELAY_US": "nan"}, "target delay must be in"),
    ],
)
def test_bad_window_options_are_refused(monkeypatch, env, words):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValueError, match=words):
        gradswitch.connect("127.0.0.1:1", job="j", rank=0, world_size=1)
