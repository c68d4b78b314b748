"""Two-level aggregation: leaf switches (--uplink) serve racks of workers and take part in a job at a
spine switch as one rank each (docs/protocol.md section 8).

Ranks run as threads of this process against real gradswitchd processes on loopback: one spine,
one leaf per rack. The same inputs also go through one flat switch, so fixed32 results can be
compared bit for bit. Failure tests bound how long the error takes to reach the ranks; their own
timeouts are far longer.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
from _daemon import daemon_binary
from test_allreduce import check, make_input
from test_fail_fast import run_ranks

import gradswitch

TIMEOUT = 30.0


@pytest.fixture
def racks(switch_factory):
    """racks(sizes, leaf_args=(), spine_args=()) -> (spine, [leaf per rack], rank -> leaf address)."""
    binary = daemon_binary()

    def make(sizes, leaf_args=(), spine_args=(), **kw):
        spine = switch_factory(binary=binary, extra_args=list(spine_args), **kw)
        leaves = [
            switch_factory(binary=binary, extra_args=["--uplink", spine.address, *leaf_args], **kw)
            for _ in sizes
        ]
        where = [leaf.address for leaf, n in zip(leaves, sizes, strict=True) for _ in range(n)]
        return spine, leaves, where

    return make


def allreduce_all(addresses, job, wire, cases, **connect_kw):
    """Every rank (one per address) runs the cases; returns per rank the list of result arrays."""

    def rank_fn(rank):
        out = []
        with gradswitch.connect(
            addresses[rank], job=job, rank=rank, world_size=len(addresses), wire=wire, timeout=TIMEOUT,
            **connect_kw,
        ) as g:
            for kind, size in cases:
                x = make_input(kind, rank, size)
                g.allreduce(x)
                out.append(x)
            return {"results": out, "stats": g.stats()}

    reports = run_ranks(rank_fn, len(addresses), deadline_s=120)
    for r, rep in enumerate(reports):
        assert "exception" not in rep, f"rank {r}: {rep.get('exception')!r}"
    return reports


CASES = [("exact", 1), ("exact", 361), ("normal", 100_003)]


@pytest.mark.parametrize("sizes", [(2, 2), (3, 2), (4, 4)], ids=lambda s: "x".join(map(str, s)))
def test_fixed32_over_two_racks_equals_the_flat_job_bit_for_bit(racks, switch_factory, sizes):
    spine, leaves, where = racks(sizes)
    flat = switch_factory(binary=daemon_binary())
    two = allreduce_all(where, "racks", "fixed32", CASES)
    one = allreduce_all([flat.address] * len(where), "flat", "fixed32", CASES)
    for r in range(len(where)):
        for (kind, size), a, b in zip(CASES, two[r]["results"], one[r]["results"], strict=True):
            assert a.tobytes() == b.tobytes(), f"rank {r}, {kind} {size}: two levels differ from one switch"
            ok, info = check(kind, "fixed32", len(where), a)
            assert ok, info
    # Cross-rack traffic: each leaf sends each round up once, whatever its rack's size.
    up = [leaf.stats()["sent_up"] for leaf in leaves]
    assert up[0] == up[1] > 0, up
    assert spine.stats()["completed"] == up[0], (spine.stats()["completed"], up)


@pytest.mark.parametrize("wire", ["int32", "float32", "float16", "bfloat16", "float64"])
def test_every_wire_sums_over_two_racks(racks, wire):
    spine, leaves, where = racks((2, 2))
    kinds = {"int32": "int", "float64": "exact64", "float16": "exact16", "bfloat16": "exact16"}
    kind = kinds.get(wire, "exact")
    cases = [(kind, 1), (kind, 4097), (kind, 250_001)]
    reports = allreduce_all(where, "w", wire, cases)
    for r, rep in enumerate(reports):
        for (k, size), x in zip(cases, rep["results"], strict=True):
            ok, info = check(k, wire, len(where), x)
            assert ok, f"rank {r}, {wire} {k} {size}: {info}"
        assert rep["results"][2].tobytes() == reports[0]["results"][2].tobytes(), "ranks disagree"


def test_loss_at_both_levels_is_recovered(racks, switch_factory):
    # 1% of what each switch receives is dropped (workers' DATA and the spine's results at the leaves,
    # the leaves' DATA at the spine), and 1% of what each worker sends.
    lossy = ["--drop-rate", "0.01"]
    spine, leaves, where = racks((2, 2), leaf_args=lossy, spine_args=lossy)
    cases = [("normal", 300_007), ("exact", 100_000)]
    two = allreduce_all(where, "lossy", "fixed32", cases, drop_rate=0.01, seed=7)
    one = allreduce_all([switch_factory(binary=daemon_binary()).address] * 4, "flat", "fixed32", cases)
    for r in range(4):
        for a, b in zip(two[r]["results"], one[r]["results"], strict=True):
            assert a.tobytes() == b.tobytes(), f"rank {r}: a lossy two-level result differs"
    resent = sum(leaf.stats()["resent_up"] for leaf in leaves)
    assert resent > 0, "no leaf ever resent upward: the spine's loss was not exercised"
    assert spine.stats()["retx_answered"] + spine.stats()["duplicates"] > 0
    assert sum(rep["stats"]["retransmissions"] for rep in two) > 0


def _fail_in_flight(where, kill, expect_type, bound_s=5.0):
    """Every rank starts a large allreduce; `kill()` runs once they all have; returns the errors."""
    started = threading.Barrier(len(where) + 1)

    def rank_fn(rank):
        n = len(where)
        with gradswitch.connect(where[rank], job="doomed", rank=rank, world_size=n, timeout=TIMEOUT) as g:
            g.allreduce(np.ones(1000, dtype=np.float32))
            h = g.allreduce_async(np.ones(20_000_000, dtype=np.float32))
            started.wait(10)
            t0 = time.monotonic()
            with pytest.raises(gradswitch.GradswitchError) as info:
                h.wait()
                # a rank that finished before the kill fails at its next allreduce
                g.allreduce(np.ones(1000, dtype=np.float32))
            return {"err": info.value, "elapsed": time.monotonic() - t0}

    reports: list[dict] = []
    t = threading.Thread(target=lambda: reports.extend(run_ranks(rank_fn, len(where), 60)), daemon=True)
    t.start()
    started.wait(20)
    time.sleep(0.1)
    kill()
    t.join(60)
    assert len(reports) == len(where)
    for r, rep in enumerate(reports):
        assert "err" in rep, f"rank {r}: {rep}"
        assert isinstance(rep["err"], expect_type), f"rank {r}: {rep['err']!r}"
        assert rep["elapsed"] < bound_s, f"rank {r} learned it after {rep['elapsed']:.1f} s: {rep['err']}"
    for rep in reports:
        print(rep["err"])
    return [str(rep["err"]) for rep in reports]


def test_a_killed_leaf_fails_every_worker(racks):
    spine, leaves, where = racks((2, 2))
    leaf = leaves[0]
    msgs = _fail_in_flight(where, lambda: leaf.proc.send_signal(signal.SIGKILL), gradswitch.JobAborted)
    for m in msgs[:2]:  # the dead leaf's own ranks: their switch is gone
        assert "closed the control connection" in m, m
    for m in msgs[2:]:  # the other rack: the spine ended the job because the leaf's ranks went away
        assert "the spine switch at " + spine.address in m and "ended the job" in m, m
        assert "rank 0" in m or "rank 1" in m, m


def test_a_killed_spine_fails_every_worker(racks):
    spine, leaves, where = racks((2, 2))
    msgs = _fail_in_flight(where, lambda: spine.proc.send_signal(signal.SIGKILL), gradswitch.SwitchLost)
    for m in msgs:
        assert "the spine switch at " + spine.address in m and "was lost" in m, m


def test_a_spine_that_refuses_the_job_fails_every_join(racks):
    # The spine's job table is full (one job, still joining): both racks' JOINs get the spine's reason.
    spine, leaves, where = racks((1, 1), spine_args=["--max-jobs", "1"])
    holder = threading.Thread(target=_hold, args=(spine.address,), daemon=True)
    holder.start()
    deadline = time.monotonic() + 10
    while not spine.jobs() and time.monotonic() < deadline:
        time.sleep(0.05)

    def rank_fn(rank):
        with pytest.raises(gradswitch.GradswitchError) as info:
            gradswitch.connect(where[rank], job="refused", rank=rank, world_size=2, join_timeout=10)
        return {"err": info.value}

    for rep in run_ranks(rank_fn, 2, 30):
        m = str(rep["err"])
        assert "the spine switch at " + spine.address in m and "job table full" in m, m


def _hold(address):
    with pytest.raises(gradswitch.GradswitchError):
        gradswitch.connect(address, job="holder", rank=0, world_size=2, join_timeout=5)


def test_an_unreachable_spine_fails_the_join_at_once(switch_factory):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    leaf = switch_factory(binary=daemon_binary(), extra_args=["--uplink", dead])
    t0 = time.monotonic()
    with pytest.raises(gradswitch.GradswitchError) as info:
        gradswitch.connect(leaf.address, job="alone", rank=0, world_size=1, join_timeout=20)
    assert time.monotonic() - t0 < 5
    assert f"lost the spine switch at {dead}" in str(info.value) and "refused" in str(info.value), info.value
