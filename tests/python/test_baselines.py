"""Tiny baseline runs on the testbed (N = 2 and 3) with every rank's sum checked."""

from __future__ import annotations

import shutil

import pytest
from _netns import require_netns, unique

NBYTES = 100_004  # not a multiple of any chunk size: exercises the tail chunk


@pytest.fixture(scope="module")
def tb():
    require_netns()
    from gradswitch.testbed import Testbed

    with Testbed(workers=3, rate="1gbit", name=unique("bl")) as t:
        yield t


@pytest.mark.parametrize("n", [2, 3])
def test_hostagg(tb, n):
    from gradswitch.baselines import run

    r = run("hostagg", tb, NBYTES, iters=2, workers=n, chunk=16384)  # several pipelined chunks
    print(r.summary())
    assert r.ok and len(r.times) == 2 and r.max_err == 0.0


@pytest.mark.parametrize("n", [2, 3])
def test_gloo(tb, n):
    pytest.importorskip("torch")
    from gradswitch.baselines import run

    r = run("gloo", tb, NBYTES, iters=2, workers=n)
    print(r.summary())
    assert r.ok and len(r.times) == 2


@pytest.mark.parametrize("system,n", [("mpi_allreduce", 2), ("mpi_allreduce", 3), ("mpi_reduce_bcast", 3)])
def test_mpi(tb, system, n):
    pytest.importorskip("mpi4py")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    from gradswitch.baselines import run

    r = run(system, tb, NBYTES, iters=2, workers=n, timeout=60)  # a healthy run takes seconds
    print(r.summary())
    assert r.ok and len(r.times) == 2


@pytest.mark.parametrize("system,n", [("mpi_allreduce_gs", 3), ("mpi_reduce_gs", 2)])
def test_mpi_baseline_program_through_the_library(tb, system, n):
    """The same mpi4py program with libgradswitch_mpi.so: every rank still checks its exact sum, and
    the library's and the switch's counters show each reduction went through the switch."""
    pytest.importorskip("mpi4py")
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (apt-get install openmpi-bin)")
    from gradswitch._paths import mpi_library
    from gradswitch.baselines import run

    try:
        mpi_library()
    except FileNotFoundError as e:  # Open MPI is here, so the build should have made it
        pytest.fail(str(e))
    # 100 KB is below the library's default threshold: take every size.
    r = run(system, tb, NBYTES, iters=2, workers=n, timeout=60, library_env={"GRADSWITCH_MPI_MIN_BYTES": "0"})
    print(r.summary(), r.extra)
    assert r.ok and len(r.times) == 2
    ranks = n + (system == "mpi_reduce_gs")  # the host is rank 0 of MPI_Reduce
    c = r.extra["gradswitch_mpi"]
    calls = "allreduce" if system == "mpi_allreduce_gs" else "reduce"
    assert c[calls] == ranks * 3 and c["mpi_fallback"] == 0 and c["jobs"] == ranks, c
    assert r.extra["switch"]["jobs_started"] == 1 and r.extra["switch"]["completed"] >= 3 * (NBYTES // 1440)


def test_wrong_sum_is_detected():
    from gradswitch.baselines.common import check, expected_sum

    s = expected_sum(3, 1000, it=1)
    assert check(s, 3, 1) == 0.0
    s[17] += 1
    assert check(s, 3, 1) == 1.0
    s[5] = float("nan")  # a NaN must fail, also through the callers' max(max_err, err)
    assert check(s, 3, 1) == float("inf") and max(0.0, check(s, 3, 1)) > 0


def test_gradients_and_sums_are_the_formula():
    """The tiled gradients (one 61-element period repeated) are the formula, element by element."""
    import numpy as np

    from gradswitch.baselines.common import expected_sum, grad

    n = 61 * 5 + 17
    i = np.arange(n, dtype=np.int64)
    formula = lambda r, it: (((i * 7 + r * 13 + it * 5) % 61) - 30).astype(np.float32)  # noqa: E731
    for it in (0, 1, 60, 61, 1000):
        for r in range(4):
            g = grad(r, n, it)
            assert g.dtype == np.float32 and g.shape == (n,) and np.array_equal(g, formula(r, it))
        assert np.array_equal(expected_sum(4, n, it), sum(formula(r, it) for r in range(4)))
        assert np.array_equal(expected_sum(4, n, it, ranks=[1, 3]), formula(1, it) + formula(3, it))
    assert grad(0, 0).shape == (0,) and grad(2, 3, 7).shape == (3,)


def test_wait_all_reads_every_process_at_once(tmp_path):
    """A rank that writes more than a pipe holds must not block while an earlier rank is waited for:
    here the first process waits for the second to finish writing 256 KB to stderr (as ranks wait for
    each other's allreduce), which with the pipes read one after another never happened."""
    import subprocess
    import sys

    from gradswitch.baselines.common import wait_all

    flag = tmp_path / "written"
    first = f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.01)\nprint('first')"
    second = f"import sys\nsys.stderr.write('x' * 262144)\nsys.stderr.flush()\nopen({str(flag)!r}, 'x')"
    procs = [
        (name, subprocess.Popen([sys.executable, "-c", code], stdout=-1, stderr=-1, text=True))
        for name, code in (("first", first), ("second", second))
    ]
    outs = wait_all(procs, 20)  # a deadlock ends in the timeout's kill: return codes -9
    assert [(n, rc) for n, rc, _, _ in outs] == [("first", 0), ("second", 0)], outs
    assert outs[0][2].strip() == "first" and len(outs[1][3]) == 262144


def test_cli_slots_reaches_the_switch_and_is_checked(tb, capsys, monkeypatch):
    import json

    import gradswitch.baselines.__main__ as cli

    argv = ["--system", "gradswitch", "--testbed", tb.name, "-n", "2", "--nbytes", "64K", "--iters", "1"]
    assert cli.main([*argv, "--slots", "4", "--json"]) == 0  # a real run through a 4-slot pool
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["ok"] and r["max_err"] == 0.0
    seen = []
    monkeypatch.setattr(cli, "run", lambda *a, **kw: seen.append(kw) or pytest.fail("stop here"))
    with pytest.raises(pytest.fail.Exception):
        cli.main([*argv, "--slots", "4"])
    assert seen == [{"slots": 4}]
    with pytest.raises(SystemExit):
        cli.main([*argv, "--slots", "0"])
    assert "a whole number of at least 1" in capsys.readouterr().err


def test_cli_daemon_args_reach_the_switch_and_bad_ones_are_clear_errors(tb, capsys, monkeypatch):
    import gradswitch.baselines.__main__ as cli

    argv = ["--system", "gradswitch", "--testbed", tb.name, "-n", "2", "--nbytes", "64K", "--iters", "1"]
    assert cli.main([*argv, "--daemon-args=--hold-us 0"]) == 0  # a real run, its switch not holding
    assert cli.main([*argv, "--daemon-args=--hold-us"]) == 1
    assert "gradswitchd" in capsys.readouterr().err  # the daemon refused it: its message, no traceback
    assert cli.main([*argv, "--daemon-args='--hold-us 0"]) == 1
    assert "--daemon-args" in capsys.readouterr().err
    seen = []
    monkeypatch.setattr(cli, "run", lambda *a, **kw: seen.append(kw) or pytest.fail("stop here"))
    with pytest.raises(pytest.fail.Exception):
        cli.main([*argv, "--daemon-args=--hold-us 0 --batch 8"])
    assert seen == [{"daemon_args": ["--hold-us", "0", "--batch", "8"]}]
