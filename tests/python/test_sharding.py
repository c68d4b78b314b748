"""A job sharded over several switches: connect(switch="a:port,b:port,...") joins the same job on
every switch and stripes each allreduce's chunks over them (chunk c to switch c mod S).

Ranks run as threads of this process against real gradswitchd processes on loopback. Results are
checked against the exact sums, and fixed32 results bit for bit against one switch. Failure tests
bound how long the error takes; the ranks' own timeouts are far longer.
"""

from __future__ import annotations

import signal
import socket
import threading
import time

import numpy as np
import pytest
from _daemon import daemon_binary
from _raw_job import contribute, join_raw
from test_allreduce import check
from test_hierarchy import _fail_in_flight as fail_in_flight
from test_hierarchy import allreduce_all as allreduce_at

import gradswitch
from gradswitch.daemon import parse_kv, read_reply
from gradswitch.local_switch import control_request

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
        # Seen first-hand, or from the rank that saw it first and left the other switch (LEAVE lost=).
        assert (f"the switch at {victim.address} closed the control connection" in m
                or f"the switch at {victim.address} is gone for job" in m), m
        assert "shard 2 of 2" in m, m


def _join_by_hand(address: str, job: str, world: int) -> tuple[socket.socket, bytearray]:
    """Rank 0 of `job`, JOINed over a plain control connection (the real ranks' wire and token)."""
    host, port = address.rsplit(":", 1)
    c = socket.create_connection((host, int(port)), timeout=TIMEOUT)
    c.sendall(f"JOIN job={job} world={world} rank=0 wire=float32 token=gradswitch port=9\n".encode())
    return c, bytearray()


@pytest.mark.parametrize("shards", [1, 2])
def test_a_rank_that_left_for_a_lost_switch_fails_the_others_with_switch_lost(switch_factory, shards):
    # Rank 0 (by hand) says, as it leaves switch 1, that it lost another switch: with one switch the
    # others learn which; with two they fail naming switch 2 of 2 (alive here: only rank 0's word
    # says it is gone, as when its FIN reaches the ranks later than rank 0's LEAVE).
    sw = switches(switch_factory, shards)
    lost = sw[1].address if shards == 2 else "127.0.0.1:9"
    by_hand = [_join_by_hand(s.address, "told", 2) for s in sw]
    errors: list[BaseException] = []

    def rank1():
        addrs = ",".join(s.address for s in sw)
        with gradswitch.connect(addrs, job="told", rank=1, world_size=2, timeout=TIMEOUT) as g:
            try:
                g.allreduce(np.ones(1_000_000, dtype=np.float32))
            except gradswitch.GradswitchError as e:
                errors.append(e)

    t = threading.Thread(target=rank1, daemon=True)
    t.start()
    for c, buf in by_hand:
        assert parse_kv(read_reply(c, buf))["job_id"]
    # A LEAVE whose lost= is not an address is refused, and the rank stays in the job.
    c, buf = by_hand[0]
    c.sendall(b"LEAVE lost=bad\n")
    assert read_reply(c, buf).startswith("ERR bad_request lost=bad is not a switch address")
    time.sleep(0.3)  # rank 1's rounds wait for rank 0
    c.sendall(f"LEAVE lost={lost}\n".encode())
    assert read_reply(c, buf) == "OK"
    t.join(TIMEOUT)
    assert len(errors) == 1, errors
    e = errors[0]
    assert isinstance(e, gradswitch.SwitchLost), repr(e)
    if shards == 1:
        assert f"rank 0 left the job because it lost the switch at {lost}" in str(e), e
    else:
        assert f"the switch at {lost} is gone for job 'told'" in str(e), e
        assert "shard 2 of 2" in str(e) and "rank 0 lost it first" in str(e), e
    for c, _ in by_hand:
        c.close()


def test_the_switch_a_leaving_rank_lost_is_in_the_abort_event_and_status(start_switch):
    d = start_switch(threads=1)
    ctl, udp, job_id, key = join_raw(d, "ev", 3)
    contribute(d, udp[1], job_id, key, rank=1, slot=0, seq=1, threads=1)  # a round that needs rank 0
    time.sleep(0.2)
    ctl[0].sendall(b"LEAVE lost=10.0.0.7:7700\n")
    assert read_reply(ctl[0], bytearray()) == "OK"
    events: list[str] = []
    ctl[1].sendall(b"PING\n")
    read_reply(ctl[1], bytearray(), events)
    assert any("reason=rank_left rank=0 left=0 lost=10.0.0.7:7700" in e for e in events), events
    status = parse_kv(control_request(d.address, f"STATUS job_id={job_id}"))
    assert status["state"] == "aborted" and status["abort_rank"] == "0", status
    assert status["lost"] == "10.0.0.7:7700", status
    for c in ctl:
        c.close()


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
