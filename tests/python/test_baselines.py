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


def test_wrong_sum_is_detected():
    from gradswitch.baselines.common import check, expected_sum

    s = expected_sum(3, 1000, it=1)
    assert check(s, 3, 1) == 0.0
    s[17] += 1
    assert check(s, 3, 1) == 1.0
