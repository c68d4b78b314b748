"""Failures that the switch can see are reported to every rank at once, not after a timeout.

Ranks run as threads of this process (the worker releases the GIL while it streams). Each test
bounds how long the failure may take to reach the ranks; the timeouts they are given are far
longer, so a test that passes cannot have waited for one.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

import gradswitch

TIMEOUT = 30.0  # the ranks' allreduce timeout: never what ends these tests


def run_ranks(fn, world: int, deadline_s: float = 20.0) -> list[dict]:
    """Runs fn(rank) -> dict in one thread per rank; returns their reports (an exception is one)."""
    reports: list[dict] = [{} for _ in range(world)]

    def body(rank: int) -> None:
        try:
            reports[rank] = fn(rank) or {}
        except BaseException as e:  # noqa: BLE001 - reported to the test
            reports[rank] = {"exception": e}

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline_s))
        assert not t.is_alive(), f"a rank did not finish within {deadline_s} s"
    return reports


def timed_failure(g, x) -> tuple[BaseException, float]:
    t0 = time.monotonic()
    with pytest.raises(gradswitch.GradswitchError) as info:
        g.allreduce(x)
    return info.value, time.monotonic() - t0


@pytest.mark.parametrize(
    "wire, lengths, expect",
    [
        # Rank 0's last chunk is short: the counts of one round differ.
        ("float32", (1000, 2000), ("rank 0 passed 1000 elements", "more than 1080 elements")),
        # Whole chunks (360 elements each): only the LAST flag tells the lengths apart.
        ("float32", (720, 1080), ("passed 720 elements", "more than 720 elements")),
        # fixed32 disagrees already in the exponent rounds that precede the data.
        ("fixed32", (720, 1080), ("361 to 720 elements", "more than 720 elements")),
    ],
    ids=["short-chunk", "whole-chunks", "fixed32"],
)
def test_tensors_of_different_lengths_fail_every_rank_at_once(start_switch, wire, lengths, expect):
    sw = start_switch()

    def rank_fn(rank):
        kw = dict(job="lengths", rank=rank, world_size=2, wire=wire, timeout=TIMEOUT)
        with gradswitch.connect(sw.address, **kw) as g:
            g.allreduce(np.ones(50, dtype=np.float32))  # a good one first
            err, elapsed = timed_failure(g, np.ones(lengths[rank], dtype=np.float32))
            return {"err": err, "elapsed": elapsed}

    reports = run_ranks(rank_fn, 2)
    for rank, rep in enumerate(reports):
        assert "err" in rep, rep
        msg = str(rep["err"])
        print(f"rank {rank} after {rep['elapsed']:.2f} s: {msg}")
        assert isinstance(rep["err"], gradswitch.JobAborted) and rep["err"].reason == 5, msg
        assert rep["elapsed"] < 2.0, rep["elapsed"]
        assert "the ranks disagree on allreduce seq 1" in msg, msg
        assert "rank 0" in msg and "rank 1" in msg, msg
        for text in expect:
            assert text in msg, msg
        assert f"This rank passed {lengths[rank]} elements" in msg, msg


def test_int32_and_float32_tensors_in_one_allreduce_fail_at_once(start_switch):
    sw = start_switch()

    def rank_fn(rank):
        with gradswitch.connect(sw.address, job="dtypes", rank=rank, world_size=2, timeout=TIMEOUT) as g:
            x = np.ones(100, dtype=np.int32 if rank else np.float32)
            err, elapsed = timed_failure(g, x)
            return {"err": err, "elapsed": elapsed}

    for rep in run_ranks(rank_fn, 2):
        msg = str(rep["err"])
        assert rep["elapsed"] < 2.0 and "int32" in msg and "float32" in msg, msg


def test_a_rank_that_closes_during_the_others_allreduce_fails_them_at_once(start_switch):
    sw = start_switch()
    closed = threading.Event()

    def rank_fn(rank):
        g = gradswitch.connect(sw.address, job="leaver", rank=rank, world_size=3, timeout=TIMEOUT)
        g.allreduce(np.ones(1000, dtype=np.float32))
        if rank == 2:
            g.close()  # LEAVE: this rank is done, the others are not
            closed.set()
            return {}
        closed.wait(10)
        try:
            err, elapsed = timed_failure(g, np.ones(100_000, dtype=np.float32))
            return {"err": err, "elapsed": elapsed}
        finally:
            g.close()

    reports = run_ranks(rank_fn, 3)
    for rep in reports[:2]:
        msg = str(rep["err"])
        print(msg)
        assert isinstance(rep["err"], gradswitch.JobAborted) and rep["err"].rank == 2, msg
        assert "rank 2 left the job (it closed its group)" in msg, msg
        assert rep["elapsed"] < 2.0, rep["elapsed"]


def test_ranks_between_allreduces_learn_of_a_switch_shutdown_at_once(start_switch):
    sw = start_switch()
    joined = threading.Barrier(3)

    def rank_fn(rank):
        g = gradswitch.connect(sw.address, job="idle", rank=rank, world_size=2, timeout=TIMEOUT)
        g.allreduce(np.ones(10, dtype=np.float32))
        joined.wait(10)
        joined.wait(10)  # the switch is being stopped meanwhile
        time.sleep(0.5)
        err, elapsed = timed_failure(g, np.ones(10, dtype=np.float32))
        g.close()
        return {"err": err, "elapsed": elapsed}

    t = threading.Thread(target=lambda: reports.extend(run_ranks(rank_fn, 2)), daemon=True)
    reports: list[dict] = []
    t.start()
    joined.wait(10)
    sw.proc.send_signal(signal.SIGTERM)
    sw.proc.wait(10)
    joined.wait(10)
    t.join(20)
    assert len(reports) == 2
    for rep in reports:
        msg = str(rep["err"])
        assert isinstance(rep["err"], gradswitch.SwitchLost), msg
        assert "the switch is shutting down" in msg and "before allreduce seq 1" in msg, msg
        assert rep["elapsed"] < 1.0, rep["elapsed"]


def test_a_killed_switch_fails_the_allreduce_in_flight_at_once(start_switch):
    sw = start_switch()
    started, killed = threading.Event(), threading.Event()

    def rank_fn(rank):
        with gradswitch.connect(sw.address, job="kill", rank=rank, world_size=2, timeout=TIMEOUT) as g:
            g.allreduce(np.ones(10, dtype=np.float32))
            if rank == 1:  # never starts the allreduce: rank 0 waits in it
                killed.wait(10)
                return {}
            h = g.allreduce_async(np.ones(1_000_000, dtype=np.float32))
            started.set()
            t0 = time.monotonic()
            with pytest.raises(gradswitch.SwitchLost) as info:
                h.wait()
            return {"err": info.value, "elapsed": time.monotonic() - t0}

    reports: list[dict] = []
    t = threading.Thread(target=lambda: reports.extend(run_ranks(rank_fn, 2)), daemon=True)
    t.start()
    assert started.wait(10)
    time.sleep(0.2)
    sw.proc.send_signal(signal.SIGKILL)
    sw.proc.wait(10)
    killed.set()
    t.join(20)
    msg = str(reports[0]["err"])
    print(msg)
    assert "closed the control connection" in msg and "during allreduce seq 1" in msg, msg
    assert reports[0]["elapsed"] < 1.5, reports[0]["elapsed"]
