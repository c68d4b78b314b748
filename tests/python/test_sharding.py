"""A job sharded over several switches: connect(switch="a:port,b:port,...") joins the same job on
every switch and stripes each allreduce's chunks over them (chunk c to switch c mod S).

Ranks run as threads of this process against real gradswitchd processes on loopback. Results are
checked against the exact sums, and fixed32 results bit for bit against one switch. Failure tests
bound how long the error takes; the ranks' own timeouts are far longer.
"""

from __future__ import annotations

import signal

import pytest
from _daemon import daemon_binary
from test_allreduce import check
from test_hierarchy import _fail_in_flight as fail_in_flight
from test_hierarchy import allreduce_all as allreduce_at

import gradswitch

TIMEOUT = 30.0
WORLD = 3


def allreduce_all(address, job, wire, cases, world=WORLD, **kw):
    return allreduce_at([address] * world, job, wire, cases, **kw)


def switches(switch_factory, n, **kw):
    binary = daemon_binary()
    return [switch_factory(binary=binary, threads=1, **kw) for _ in range(n)]


WIRE_KIND = {"int32": "int", "float32": "exact", "fixed32": "exact", "float16": "exact16",
             "bfloat16": "exact16", "float64": "exact64"}


@pytest.mark.parametrize("shards", [2, 3])
@pytest.mark.parametrize("wire", sorted(WIRE_KIND))
def test_every_wire_sums_exactly_over_several_switches(switch_factory, shards, wire):
    sw = switches(switch_factory, shards)
    kind = WIRE_KIND[wire]
    # 1 element (one switch only), 2 chunks (fewer than the switches when 3), non-multiples of a chunk
    sizes = [1, 361, 4097, 200_003]
    reports = allreduce_all(",".join(s.address for s in sw), f"s{wire}", wire, [(kind, n) for n in sizes])
    for r, rep in enumerate(reports):
        for n, x in zip(sizes, rep["results"], strict=True):
            ok, info = check(kind, wire, WORLD, x)
            assert ok, f"rank {r}, {wire} {n}: {info}"
    # Every switch carried its share: chunk c went to switch c mod S.
    completed = [s.stats()["completed"] for s in sw]
    assert all(c > 0 for c in completed), completed
    assert max(completed) - min(completed) <= 4 * len(sizes) * (2 if wire == "fixed32" else 1), completed


def test_fixed32_over_two_switches_equals_one_switch_bit_for_bit(switch_factory):
    sw = switches(switch_factory, 3)
    cases = [("normal", 100_003), ("exact", 7)]
    sharded = allreduce_all(f"{sw[0].address},{sw[1].address}", "two", "fixed32", cases)
    single = allreduce_all(sw[2].address, "one", "fixed32", cases)
    for r in range(WORLD):
        for a, b in zip(sharded[r]["results"], single[r]["results"], strict=True):
            assert a.tobytes() == b.tobytes(), f"rank {r}: sharded fixed32 differs from one switch"


def test_loss_is_recovered_per_switch(switch_factory):
    sw = switches(switch_factory, 2, drop_rate=0.01)
    cases = [("exact", 300_007), ("int", 50_000)]
    addrs = ",".join(s.address for s in sw)
    reports = allreduce_all(addrs, "lossy", "float32", cases, drop_rate=0.01, seed=3)
    for r, rep in enumerate(reports):
        for (kind, n), x in zip(cases, rep["results"], strict=True):
            ok, info = check(kind, "float32", WORLD, x)
            assert ok, f"rank {r}, {kind} {n}: {info}"
    assert all(s.stats()["retx_answered"] + s.stats()["duplicates"] > 0 for s in sw)


def test_a_killed_shard_fails_every_rank_naming_that_switch(switch_factory):
    sw = switches(switch_factory, 2)
    victim = sw[1]
    where = [",".join(s.address for s in sw)] * WORLD
    msgs = fail_in_flight(where, lambda: victim.proc.send_signal(signal.SIGKILL), gradswitch.SwitchLost)
    for m in msgs:
        assert f"the switch at {victim.address} closed the control connection" in m, m
        assert "shard 2 of 2" in m, m


def test_bad_switch_lists_are_refused_before_joining(switch_factory):
    (sw,) = switches(switch_factory, 1)
    with pytest.raises(ValueError, match="twice"):
        gradswitch.connect(f"{sw.address},{sw.address}", job="dup", rank=0, world_size=1)
    with pytest.raises(ValueError, match="empty entry"):
        gradswitch.connect(f"{sw.address},", job="empty", rank=0, world_size=1)
    with pytest.raises(ValueError, match="cannot be sharded"):
        gradswitch.connect(
            f"{sw.address},127.0.0.1:1", job="opt", rank=0, world_size=1, params=10,
            optimizer=dict(algo="sgd", lr=0.1),
        )
