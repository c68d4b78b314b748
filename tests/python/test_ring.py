"""The ring (paper 001) end to end over UDP on loopback: real worker processes, with and without a
switch, every wire, loss, fixed32 bit-identical to the switch's sums, and the fallback of
algorithm="auto" when the switch is killed in the middle of an allreduce or absent at start.

Inputs and verdicts come from test_allreduce (deterministic inputs, exact expectations).
"""

from __future__ import annotations

import hashlib
import socket
import time
import traceback

import numpy as np
import pytest
from _daemon import daemon_binary
from _ranks import join_or_kill
from test_allreduce import WORKER_TIMEOUT, abs_sum, check, expected_sum, make_input, run_workers

import gradswitch

# The ring without a switch derives its ids from job, world size and token: the ranks share one (the
# connect() default is none, docs/protocol.md §7).
RING_TOKEN = "ring-test-" + hashlib.sha256(b"test_ring").hexdigest()[:16]


def free_udp_ports(n: int) -> list[int]:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ring_check(kind: str, wire: str, world: int, x: np.ndarray) -> tuple[bool, str]:
    """check() of test_allreduce, with the ring's float16/bfloat16 error: one rounding per hop."""
    if wire not in ("float16", "bfloat16") or kind == "int":
        return check(kind, wire, world, x)
    want = expected_sum(kind, world, x.size)
    ulp = 2.0**-11 if wire == "float16" else 2.0**-8
    bound = (2 * world + 1) * ulp * abs_sum(kind, world, x.size) + (world + 1) * 2.0**-24
    excess = np.abs(x.astype(np.float64) - want) - bound
    if (excess > 0).any():
        j = int(np.argmax(excess))
        return False, f"{wire} ring error too large at {j}: {x[j]!r} vs {want[j]!r}"
    return True, "within the ring's tolerance"


def _pattern(n: int, values: np.ndarray) -> np.ndarray:
    return np.resize(values.astype(np.float32), n)  # repeats the 1024 values: cheap for 64 MB


def _cheap_input(rank: int, n: int) -> np.ndarray:
    """Multiples of 1/16 below 40 in magnitude: fixed32 and float32 sums are exact, and cheap to check."""
    return _pattern(n, (np.arange(1024) - 512 + rank) / 16)


def _cheap_sum(world: int, n: int) -> np.ndarray:
    return _pattern(n, (world * (np.arange(1024) - 512) + world * (world - 1) // 2) / 16)


def _ring_worker(q, rank, world, switch, connect_kwargs, plan):
    """plan: list of (job, wire, algorithm, cases); a case is (kind, size)."""
    out = {"results": [], "digests": {}, "stats": {}, "algorithm": {}}
    try:
        for job, wire, algorithm, cases in plan:
            with gradswitch.connect(
                switch,
                job=job,
                rank=rank,
                world_size=world,
                wire=wire,
                algorithm=algorithm,
                timeout=WORKER_TIMEOUT,
                token=RING_TOKEN,
                **connect_kwargs,
            ) as g:
                for kind, size in cases:
                    if kind == "cheap":  # 64 MB cases: exact sums that are quick to build and check
                        x = _cheap_input(rank, size)
                        g.allreduce(x)
                        ok, info = bool(np.array_equal(x, _cheap_sum(world, size))), "exact"
                    else:
                        x = make_input(kind, rank, size)
                        g.allreduce(x)
                        ok, info = ring_check(kind, wire, world, x)
                    out["results"].append((job, wire, kind, size, ok, info))
                    out["digests"][(job, kind, size)] = hashlib.sha256(x.tobytes()).hexdigest()
                out["stats"][job] = g.stats()
                out["algorithm"][job] = g.algorithm
    except Exception:
        out["error"] = traceback.format_exc()
    q.put((rank, out))


def assert_ok(reports: dict[int, dict]) -> None:
    errors = {r: rep["error"] for r, rep in reports.items() if "error" in rep}
    assert not errors, "worker errors:\n" + "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())
    bad = [(r, res) for r, rep in reports.items() for res in rep["results"] if not res[4]]
    assert not bad, f"wrong results: {bad[:5]}"
    for key in reports[0]["digests"]:
        assert len({rep["digests"][key] for rep in reports.values()}) == 1, f"ranks disagree on {key}"


SIZES = [1, 361, 100_003]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_ring_without_switch_every_wire(world):
    """N ranks, no switch: addresses from peers=; every wire, sizes from 1 element, 64 MB at N = 4."""
    peers = [f"127.0.0.1:{p}" for p in free_udp_ports(world)]
    plan = []
    for wire in ("float32", "fixed32", "float16", "bfloat16"):
        fkind = "exact" if wire in ("float32", "fixed32") else "exact16"
        cases = [(fkind, s) for s in SIZES] + [("int", s) for s in SIZES] + [("normal", 50_001)]
        if world == 4 and wire == "fixed32":
            cases.append(("cheap", 16 * 1024 * 1024))  # 64 MB
        plan.append((f"ring-{world}-{wire}", wire, "ring", cases))
    reports = run_workers(
        _ring_worker, [(r, world, None, {"peers": peers}, plan) for r in range(world)], deadline_s=240
    )
    assert_ok(reports)
    for rep in reports.values():
        assert set(rep["algorithm"].values()) == {"ring"}
        assert all(s["ring_allreduces"] > 0 for s in rep["stats"].values())


def test_ring_fixed32_bit_identical_to_switch_and_peers_from_join(switch_factory):
    """The same fixed32 inputs through the switch and through the ring (peers from the JOIN reply):
    the same bits on every rank; with 10% loss on the ring too."""
    sw = switch_factory(binary=daemon_binary(), threads=2)
    world = 4
    cases = [("normal", 300_007), ("exact", 50_000)]
    plan = [
        ("bits-switch", "fixed32", "switch", cases),
        ("bits-ring", "fixed32", "ring", cases),
    ]
    reports = run_workers(
        _ring_worker, [(r, world, sw.address, {}, plan) for r in range(world)], deadline_s=120
    )
    assert_ok(reports)
    for kind, size in cases:
        assert (
            reports[0]["digests"][("bits-switch", kind, size)]
            == reports[0]["digests"][("bits-ring", kind, size)]
        )
    assert reports[0]["algorithm"] == {"bits-switch": "switch", "bits-ring": "ring"}
    # The ring job sent nothing through the switch's data plane.
    assert reports[0]["stats"]["bits-ring"]["ring_allreduces"] == 2


@pytest.mark.parametrize("drop", [0.01, 0.1])
def test_ring_loss_exact(drop):
    world = 4
    peers = [f"127.0.0.1:{p}" for p in free_udp_ports(world)]
    plan = [(f"loss-{drop}", "fixed32", "ring", [("exact", 400_000), ("int", 100_003)])]
    reports = run_workers(
        _ring_worker,
        [(r, world, None, {"peers": peers, "drop_rate": drop, "seed": 7}, plan) for r in range(world)],
        deadline_s=120,
    )
    assert_ok(reports)
    st = [rep["stats"][f"loss-{drop}"] for rep in reports.values()]
    assert sum(s["injected_drops"] for s in st) > 0
    assert sum(s["retransmissions"] for s in st) > 0


def test_ring_peers_checked():
    with pytest.raises(ValueError, match="one host:port per rank"):
        gradswitch.connect(None, job="x", rank=0, world_size=2, algorithm="ring", peers=["127.0.0.1:1"])
    with pytest.raises(ValueError, match="needs a switch address"):
        gradswitch.connect(None, job="x", rank=0, world_size=2)
    with pytest.raises(ValueError, match="unknown algorithm"):
        gradswitch.connect(None, job="x", rank=0, world_size=2, algorithm="tree")
    with pytest.raises(gradswitch.GradswitchError, match="needs every rank's address"):
        gradswitch.connect(None, job="x", rank=0, world_size=2, algorithm="ring")


# ---------------------------------------------------------------------------- fallback


def _fallback_worker(q, rank, world, switch, peers, sizes, ready, timeout, queued, drop=0.0):
    """Allreduces of `sizes` (the first is the one the switch dies in), each checked exactly; with
    `queued`, all submitted at once (several in flight when the switch dies); `drop`: injected loss
    on this rank's sends."""
    out = {"results": [], "times": []}
    try:
        inputs = [_cheap_input(rank, n) for n in sizes]
        want = {n: _cheap_sum(world, n) for n in set(sizes)}
        with gradswitch.connect(
            switch,
            job="fallback",
            rank=rank,
            world_size=world,
            wire="fixed32",
            algorithm="auto",
            peers=peers,
            token=RING_TOKEN,
            timeout=timeout,
            drop_rate=drop,
            seed=rank + 1,
        ) as g:
            ready.put(rank)
            handles = [g.allreduce_async(x) for x in inputs] if queued else []
            for i, x in enumerate(inputs):
                t0 = time.perf_counter()
                if queued:
                    handles[i].wait()
                else:
                    g.allreduce(x)
                out["times"].append((time.perf_counter() - t0, g.algorithm))
                ok = bool(np.array_equal(x, want[x.size]))
                out["results"].append(("fallback", "fixed32", "exact", x.size, ok, f"#{i}"))
            out["stats"] = g.stats()
            out["algorithm"] = g.algorithm
    except Exception:
        out["error"] = traceback.format_exc()
    q.put((rank, out))


def _stop_when(sw, completed: int, signal_name: str, limit_s: float = 60) -> None:
    """Sends SIGKILL/SIGTERM to the switch once it completed `completed` rounds (its STATS)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if sw.stats()["completed"] >= completed:
                break
        except OSError:
            pass
        time.sleep(0.002)
    if signal_name == "kill":
        sw.proc.kill()
    else:
        sw.proc.terminate()


def _run_fallback_workers(sw, sizes, queued, stop, drop=0.0, world=4) -> dict[int, dict]:
    """`world` _fallback_workers through switch `sw`; `stop()` once they all joined. Returns each
    rank's report after checking that none failed and every sum is exact."""
    import multiprocessing as mp
    import queue as queue_mod

    peers = [f"127.0.0.1:{p}" for p in free_udp_ports(world)]
    ctx = mp.get_context("spawn")
    q, ready = ctx.Queue(), ctx.Queue()
    procs = [
        ctx.Process(
            target=_fallback_worker,
            args=(q, r, world, sw.address, peers, sizes, ready, 10.0, queued, drop),
            daemon=True,
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        for _ in range(world):
            ready.get(timeout=120)
        stop()
        reports = {}
        deadline = time.monotonic() + 180
        while len(reports) < world:
            try:
                rank, rep = q.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_mod.Empty:
                raise AssertionError(f"workers did not report in time (got {sorted(reports)})") from None
            reports[rank] = rep
    finally:
        join_or_kill(procs, 10)
    errors = {r: rep["error"] for r, rep in reports.items() if "error" in rep}
    assert not errors, "worker errors:\n" + "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())
    for r, rep in reports.items():
        assert len(rep["results"]) == len(sizes)
        bad = [res for res in rep["results"] if not res[4]]
        assert not bad, f"rank {r}: wrong sums {bad}"
        assert rep["stats"]["fallbacks"] == 1, f"rank {r} did not fall back once: {rep['stats']}"
    return reports


BIG = 16 * 1024 * 1024  # 64 MB of float32: 46,604 chunks of 360 elements


@pytest.mark.parametrize(
    ("signal_name", "fraction", "queued"),
    [("kill", 0.0, False), ("kill", 0.3, False), ("kill", 0.9, True), ("term", 0.6, True)],
)
def test_switch_killed_mid_allreduce_falls_back_to_ring(switch_factory, signal_name, fraction, queued):
    """SIGKILL (or SIGTERM) the switch at a point of a 64 MB allreduce of N = 4 ranks (after
    `fraction` of its rounds completed at the switch): that allreduce and the next 10 complete
    with the exact sum on every rank, on the ring, after one fallback each. `queued`: all eleven
    submitted at once, so that several are in flight (streaming) when the switch dies."""
    sw = switch_factory(binary=daemon_binary(), threads=2)
    sizes = [BIG] + [1_000_003, 1, 360, 361, 250_000] * 2
    chunks = -(-BIG // 360)
    completed = int(fraction * chunks) + (256 if fraction > 0 else 0)
    reports = _run_fallback_workers(sw, sizes, queued, lambda: _stop_when(sw, completed, signal_name))
    assert all(rep["algorithm"] == "ring" for rep in reports.values())
    held = [rep["stats"]["fallback_held"] for rep in reports.values()]
    print(
        f"chunks each rank held when the switch went: {held}; times (rank 0):",
        [(round(t, 3), a) for t, a in reports[0]["times"]],
    )
    if signal_name == "kill" and 0 < fraction < 1:
        # SIGKILL in the middle of the 64 MB allreduce: ranks already held sums, reconciled on the ring.
        # (SIGTERM lets the switch take a moment: that allreduce may complete before it stops.)
        assert max(held) > 0


def test_switch_stopped_while_ranks_hold_different_allreduces(switch_factory):
    """SIGTERM the switch while many small allreduces stream with 5% loss on every send (switch and
    workers): when it stops, some rank nearly always lacks the RESULT of a round that the others
    received, so it has not finished an allreduce that they have. It asks the stopping switch again
    for its rounds (answered from its copies during the shutdown grace), so every rank hands the
    ring the same allreduces and all 120 complete exactly; before, the ring started at different
    allreduces on different ranks and they waited for each other until the timeout."""
    sw = switch_factory(binary=daemon_binary(), threads=2, drop_rate=0.05)
    sizes = [3600] * 120  # 10 chunks each, up to 16 allreduces in flight
    reports = _run_fallback_workers(sw, sizes, True, lambda: _stop_when(sw, 400, "term"), drop=0.05)
    on_switch = [sum(a == "switch" for _, a in rep["times"]) for rep in reports.values()]
    print("allreduces each rank finished on the switch:", on_switch)


def test_switch_absent_at_start_runs_on_ring():
    """algorithm="auto" with nothing listening at the switch address: the ring from the first
    allreduce (the warning names the address)."""
    world = 3
    dead = free_udp_ports(1)[0]  # a port nothing listens on (TCP)
    peers = [f"127.0.0.1:{p}" for p in free_udp_ports(world)]
    plan = [("absent", "float32", "auto", [("exact", 100_000), ("int", 1000)])]
    reports = run_workers(
        _ring_worker,
        [(r, world, f"127.0.0.1:{dead}", {"peers": peers}, plan) for r in range(world)],
        deadline_s=60,
    )
    assert_ok(reports)
    for rep in reports.values():
        assert rep["algorithm"]["absent"] == "ring"
        assert rep["stats"]["absent"]["fallbacks"] == 1


def _dying_worker(q, rank, world, switch, algorithm, peers, die_after):
    out = {}
    try:
        with gradswitch.connect(
            switch,
            job="dead",
            rank=rank,
            world_size=world,
            algorithm=algorithm,
            peers=peers,
            token=RING_TOKEN,
            timeout=1.5,
        ) as g:
            for i in range(20):
                if rank == world - 1 and i == die_after:
                    import os

                    os._exit(0)  # dies without a word
                x = make_input("exact", rank, 200_000)
                g.allreduce(x)
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {e}"
    q.put((rank, out))


@pytest.mark.parametrize("mode", ["ring", "auto", "auto-fallen-back"])
def test_dead_rank_is_a_clear_error(switch_factory, mode):
    """A rank that dies ends the job for the others with an error naming it: on the ring (no
    switch) a timeout naming the rank; with algorithm="auto" and a live switch, JobAborted at once
    (the switch saw the rank leave); with algorithm="auto" after the fallback (the switch absent
    at start, so the ranks run on the ring), the same timeout naming the rank: no fallback hides a
    dead rank."""
    import multiprocessing as mp
    import queue as queue_mod

    world = 3
    peers = [f"127.0.0.1:{p}" for p in free_udp_ports(world)]
    algorithm = "ring" if mode == "ring" else "auto"
    if mode == "auto":
        switch = switch_factory(binary=daemon_binary(), threads=1).address
    elif mode == "auto-fallen-back":
        switch = f"127.0.0.1:{free_udp_ports(1)[0]}"  # a port nothing listens on (TCP)
    else:
        switch = None
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [
        ctx.Process(target=_dying_worker, args=(q, r, world, switch, algorithm, peers, 3), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    reports = {}
    try:
        while len(reports) < world - 1:
            try:
                rank, rep = q.get(timeout=30)
            except queue_mod.Empty:
                raise AssertionError("ranks did not fail in time") from None
            reports[rank] = rep
    finally:
        join_or_kill(procs, 5)
    for r in range(world - 1):
        err = reports[r].get("error", "")
        if mode != "auto":
            assert "GradswitchTimeout" in err and "ring allreduce timed out" in err, err
            assert f"rank {world - 1} alive" in err or f", {world - 1} alive" in err, err
        else:
            assert "JobAborted" in err and f"rank {world - 1}" in err, err
