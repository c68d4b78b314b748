"""Worker error paths: argument checks, unreachable switch, timeouts, a rank crashing mid-allreduce.

Every wait is bounded; the assertions check the error type, its message and how fast it came.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import time

import numpy as np
import pytest
from _ranks import join_or_kill
from test_allreduce import assert_reports, check, make_input, reporting, run_workers

import gradswitch


def test_public_api_surface():
    assert gradswitch.__version__ == "0.1.0"
    assert issubclass(gradswitch.GradswitchTimeout, gradswitch.GradswitchError)
    assert issubclass(gradswitch.GradswitchTimeout, TimeoutError)
    assert issubclass(gradswitch.JobAborted, gradswitch.GradswitchError)
    assert issubclass(gradswitch.GradswitchError, RuntimeError)


def test_switch_binary_env(tmp_path, monkeypatch):
    from gradswitch._paths import switch_binary

    fake = tmp_path / "gradswitchd"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("GRADSWITCHD", str(fake))
    assert switch_binary() == str(fake)
    monkeypatch.setenv("GRADSWITCHD", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        switch_binary()


def test_unreachable_switch_fails_fast():
    with socket.socket() as s:  # a port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(
        gradswitch.GradswitchError, match=r"cannot reach the switch control port at 127\.0\.0\.1"
    ):
        gradswitch.connect(f"127.0.0.1:{port}", job="nobody", rank=0, world_size=1)
    assert time.monotonic() - t0 < 3


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(rank=-1), ValueError, "rank must be in 0..world_size-1 = 0..1, got -1"),
        (dict(rank=2), ValueError, "rank must be in 0..world_size-1"),
        (dict(rank="0"), TypeError, "rank must be an integer"),
        (dict(rank=1.0), TypeError, "rank must be an integer"),
        (dict(world_size=0), ValueError, "world_size must be in 1..64"),
        (dict(world_size=65, rank=0), ValueError, "world_size must be in 1..64"),
        (dict(timeout=0), ValueError, "timeout must be a finite number of seconds > 0"),
        (dict(timeout=float("nan")), ValueError, "timeout must be"),
        (dict(join_timeout="1"), TypeError, "join_timeout must be a number of seconds"),
        (dict(drop_rate=1.0), ValueError, "drop_rate must be in [0, 1)"),
        (dict(seed=-1), ValueError, "seed must be in"),
        (dict(job=3), TypeError, "job must be a string"),
    ],
)
def test_every_argument_error_is_in_our_words(kwargs, error, words):
    args = dict(job="j", rank=0, world_size=2)
    args.update(kwargs)
    with pytest.raises(error) as info:
        gradswitch.connect("127.0.0.1:1", **args)
    msg = str(info.value)
    assert words in msg and msg.startswith("gradswitch: "), msg
    assert "incompatible function arguments" not in msg and "Invoked with" not in msg, msg


def test_numpy_and_torch_apis_say_why_a_dtype_differs(start_switch):
    sw = start_switch()
    with gradswitch.connect(sw.address, job="dtypes", rank=0, world_size=1, timeout=5) as g:
        for bad in (np.zeros(4, dtype=np.float16), np.zeros(4, dtype=np.int64)):
            with pytest.raises(TypeError, match="torch process group") as info:
                g.allreduce(bad)
            assert str(bad.dtype) in str(info.value)


def test_bad_connect_arguments():
    with pytest.raises(ValueError, match="wire"):
        gradswitch.connect("127.0.0.1:1", job="j", rank=0, world_size=1, wire="float128")
    with pytest.raises(ValueError, match="rank"):
        gradswitch.connect("127.0.0.1:1", job="j", rank=2, world_size=2)
    with pytest.raises(ValueError, match="job name"):
        gradswitch.connect("127.0.0.1:1", job="has space", rank=0, world_size=1)


def test_type_and_value_errors(start_switch):
    sw = start_switch()
    with gradswitch.connect(sw.address, job="solo", rank=0, world_size=1, wire="fixed32", timeout=5) as g:
        assert (g.rank, g.world_size, g.job, g.wire) == (0, 1, "solo", "fixed32")
        with pytest.raises(TypeError, match="float32, float64 and int32"):
            g.allreduce(np.zeros(4, dtype=np.float16))
        with pytest.raises(TypeError, match="float32, float64 and int32"):
            g.allreduce(np.zeros(4, dtype=np.int64))
        with pytest.raises(TypeError, match="numpy.ndarray or a torch.Tensor"):
            g.allreduce([1.0, 2.0])
        with pytest.raises(ValueError, match="C-contiguous"):
            g.allreduce(np.zeros((4, 4), dtype=np.float32)[:, 1])
        with pytest.raises(ValueError, match="C-contiguous"):
            g.allreduce(np.zeros((4, 4), dtype=np.float32).T)
        ro = np.zeros(4, dtype=np.float32)
        ro.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            g.allreduce(ro)
        # fixed32 refuses non-finite values before sending anything; the group stays usable.
        for bad in (np.inf, -np.inf, np.nan, 2.0**127):
            x = np.ones(1000, dtype=np.float32)
            x[777] = bad
            with pytest.raises(ValueError, match="element 777"):
                g.allreduce(x)
        assert g.stats()["packets_sent"] == 0
        # A world of one: the sum is the tensor; 2-D and 0-d arrays are fine when contiguous.
        x = np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5
        assert g.allreduce(x) is x
        assert np.array_equal(x, np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5)
        z = np.array(3.25, dtype=np.float32)
        g.allreduce(z)
        assert float(z) == 3.25
        i = np.arange(-5, 5, dtype=np.int32)
        g.allreduce(i)
        assert np.array_equal(i, np.arange(-5, 5, dtype=np.int32))
        g.allreduce(np.zeros(0, dtype=np.float32))
    assert g.closed


def test_torch_type_and_value_errors(start_switch):
    torch = pytest.importorskip("torch")
    sw = start_switch()
    with gradswitch.connect(sw.address, job="solo-torch", rank=0, world_size=1, timeout=5) as g:
        with pytest.raises(TypeError, match="float32, float64 and int32"):
            g.allreduce(torch.zeros(4, dtype=torch.float16))
        # A world of one: the sum is the tensor, here as the float32 wire carries it (rounded once).
        d = torch.full((5,), 0.1, dtype=torch.float64)
        assert g.allreduce(d) is d and d.dtype == torch.float64 and d[0].item() == float(np.float32(0.1))
        with pytest.raises(ValueError, match="contiguous"):
            g.allreduce(torch.zeros(4, 4)[:, 1])
        t = torch.arange(6, dtype=torch.float32)
        assert g.allreduce(t) is t
        # A tensor viewing the middle of its storage (non-zero offset).
        base = torch.arange(10, dtype=torch.int32)
        view = base[3:7]
        g.allreduce(view)
        assert base.tolist() == list(range(10))
        p = torch.nn.Parameter(torch.ones(5))
        assert g.allreduce(p) is p  # requires_grad: reduced through a detached view


def test_int32_wire_rejects_float(start_switch):
    sw = start_switch()
    with gradswitch.connect(sw.address, job="intwire", rank=0, world_size=1, wire="int32", timeout=5) as g:
        with pytest.raises(ValueError, match="int32"):
            g.allreduce(np.zeros(3, dtype=np.float32))
        x = np.arange(3, dtype=np.int32)
        g.allreduce(x)


def test_closed_group_refuses_work(start_switch):
    sw = start_switch()
    g = gradswitch.connect(sw.address, job="closing", rank=0, world_size=1, timeout=5)
    h = g.allreduce_async(np.ones(100_000, dtype=np.float32))
    g.close()  # finishes queued work first
    assert h.done()
    g.close()  # idempotent
    with pytest.raises(gradswitch.GradswitchError, match="closed"):
        g.allreduce(np.ones(3, dtype=np.float32))


# ---------------------------------------------------------------------------- multi-process failures


def _expect(out, error, key, not_raised, allreduce):
    """allreduce() must raise `error`: its message goes to out[key], the seconds it took to
    out["elapsed"], and out["error"] says `not_raised` when it returned. The error, or None."""
    t0 = time.monotonic()
    try:
        allreduce()
        out["error"] = not_raised
    except error as e:
        out[key] = str(e)
        out["elapsed"] = time.monotonic() - t0
        return e
    return None


@reporting
def _idle_rank_worker(out, rank, world, address, timeout, hold_s):
    """Rank 0 allreduces; the others join and then do nothing for hold_s seconds."""
    with gradswitch.connect(address, job="stuck", rank=rank, world_size=world, timeout=timeout) as g:
        if rank == 0:
            why = "allreduce returned although a rank never contributed"
            _expect(
                out,
                gradswitch.GradswitchTimeout,
                "timeout",
                why,
                lambda: g.allreduce(np.ones(10_000, np.float32)),
            )
        else:
            time.sleep(hold_s)


def test_timeout_names_job_seq_and_missing_ranks(start_switch):
    sw = start_switch()
    reports = run_workers(_idle_rank_worker, [(r, 3, sw.address, 1.5, 4.0) for r in range(3)], deadline_s=60)
    assert_reports(reports)
    msg = reports[0]["timeout"]
    print(msg)
    assert 1.4 <= reports[0]["elapsed"] < 4.0, reports[0]["elapsed"]
    assert "job 'stuck'" in msg and "allreduce seq 0" in msg, msg
    assert "1, 2" in msg, msg  # the ranks that have not contributed
    assert sw.address in msg, msg  # what to check: reaching the switch


@reporting
def _crash_worker(out, rank, world, address, ready):
    with gradswitch.connect(address, job="crash", rank=rank, world_size=world, timeout=8) as g:
        x = make_input("exact", rank, 200_003)
        g.allreduce(x)  # one good round first
        out["results"].append(
            ("crash", "float32", "exact", x.size) + check("exact", "float32", world, x) + (0,)
        )
        if rank == world - 1:
            ready.set()

        def keep_going():
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20:
                g.allreduce(make_input("exact", rank, 4_000_000))

        why = "allreduce kept working although a rank was killed"
        e = _expect(out, gradswitch.JobAborted, "aborted", why, keep_going)
        if e is not None:
            out["aborted_rank"] = e.rank


def test_killed_rank_aborts_others_and_switch_frees_job(start_switch):
    sw = start_switch()
    world = 3
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ready = ctx.Event()
    procs = [
        ctx.Process(target=_crash_worker, args=(q, r, world, sw.address, ready), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    try:
        assert ready.wait(60), "workers never finished their first allreduce"
        time.sleep(0.3)  # now every rank is inside a 16 MB allreduce
        victim = procs[world - 1]
        os.kill(victim.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        reports = {}
        while len(reports) < world - 1:
            left = 30 - (time.monotonic() - t_kill)
            assert left > 0, f"survivors did not report (got {sorted(reports)})"
            rank, rep = q.get(timeout=left)
            reports[rank] = rep
        detect = time.monotonic() - t_kill
    finally:
        join_or_kill(procs, 5)
    assert_reports(reports)
    for r, rep in reports.items():
        print(f"rank {r} after {rep['elapsed']:.2f} s: {rep['aborted']}")
        assert "rank 2 left the job" in rep["aborted"], rep
        assert rep["aborted_rank"] == 2
    assert detect < 8, f"took {detect:.1f} s to notice the crash"
    # The switch frees the job once the survivors have closed.
    deadline = time.monotonic() + 10
    while sw.jobs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sw.jobs() == [], sw.jobs()
    # ... and a new job of the same name works.
    reports = run_workers(_pair_worker, [(r, 2, sw.address) for r in range(2)], deadline_s=60)
    assert_reports(reports)


@reporting
def _pair_worker(out, rank, world, address):
    with gradswitch.connect(address, job="crash", rank=rank, world_size=world, timeout=8) as g:
        x = make_input("int", rank, 100_000)
        g.allreduce(x)
        out["results"].append(("crash", "int32", "int", x.size) + check("int", "float32", world, x) + (0,))


@reporting
def _exception_worker(out, rank, world, address):
    if rank == 1:
        try:
            with gradswitch.connect(address, job="exc", rank=rank, world_size=world, timeout=20):
                time.sleep(0.5)
                raise RuntimeError("user code failed")
        except RuntimeError:
            out["left"] = True
    else:
        with gradswitch.connect(address, job="exc", rank=rank, world_size=world, timeout=20) as g:
            why = "allreduce returned although rank 1 left"
            _expect(
                out, gradswitch.JobAborted, "aborted", why, lambda: g.allreduce(np.ones(1000, np.float32))
            )


def test_exception_in_with_block_aborts_job_for_others(start_switch):
    sw = start_switch()
    reports = run_workers(_exception_worker, [(r, 2, sw.address) for r in range(2)], deadline_s=60)
    assert_reports(reports)
    assert reports[1]["left"]
    assert "rank 1 left the job" in reports[0]["aborted"], reports[0]
    assert reports[0]["elapsed"] < 5  # far below the 20 s timeout


def test_ctrl_c_interrupts_wait_and_abort_close_is_quick(start_switch):
    import threading

    sw = start_switch()
    groups = {}

    def join(rank):
        groups[rank] = gradswitch.connect(sw.address, job="sigint", rank=rank, world_size=2, timeout=30)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert set(groups) == {0, 1}
    x = np.ones(1000, dtype=np.float32)
    # Python's own handler, as in a terminal: a process started in the background by a
    # non-interactive shell (`cmd &`) inherits SIGINT ignored, and Python then installs none (the
    # wait ran to the group's 30 s timeout when CI was started that way)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    handle = groups[0].allreduce_async(x)  # rank 1 never contributes
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            timer.start()
            handle.wait()
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.monotonic() - t0 < 3
    t0 = time.monotonic()
    groups[0].close(abort=True)
    assert time.monotonic() - t0 < 2
    deadline = time.monotonic() + 5  # the switch notices the dropped control connection
    while not any(j.endswith(":aborted") for j in sw.jobs()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert any(j.endswith(":aborted") for j in sw.jobs()), sw.jobs()
    with pytest.raises(gradswitch.JobAborted, match="rank 0 left the job"):
        groups[1].allreduce(np.ones(1000, dtype=np.float32))
    groups[1].close()
