"""torchft on the switch: gradswitch.torchft.ProcessGroupGradswitch as the replica-dimension group of
three replicas (examples/train_torchft.py) on a local lighthouse; one replica is killed mid-training
and restarted, training goes on, and every replica ends with the same weights (docs/torch.md, "torchft").

Also: abort() (torchft's call when an operation failed, and before every reconfiguration) fails a
running allreduce at once and ends the job for the other replicas through the switch.

The recovery phases are printed (kill -> the survivors' first step without it; restart -> its Manager up ->
its first step with all): figures of this loaded machine, never asserted (bench/torchft_recovery.py).
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from conftest import require_or_skip

import gradswitch


@pytest.fixture
def torchft_installed() -> None:
    """torchft, or a skip naming it (before the other fixtures start anything)."""
    try:
        import torchft.coordination  # noqa: F401
    except ImportError as e:
        require_or_skip("TOOLS", f"torchft is not installed ({e}); scripts/install-deps.sh installs it")


def test_replica_killed_and_restarted_rejoins_with_equal_weights(torchft_installed, switch, tmp_path):
    import torch
    from _torchft_cluster import ClusterError, Replicas

    try:
        with Replicas(tmp_path, switch=switch.address) as replicas:
            phases = replicas.kill_and_restart(2)
            print(f"torchft on gradswitch, recovery phases: {phases}")
            stop = phases["step"] + 5
            finals = replicas.finish(stop)
    except ClusterError as e:
        pytest.fail(str(e))
    assert [f["step"] for f in finals] == [stop] * 3
    for f in finals[1:]:
        for name, value in finals[0]["model"].items():
            assert torch.equal(f["model"][name], value), name
    # the steps ran on the switch: its packet counter moved (not a local fallback)
    assert switch.stats()["pkts_in"] > 0


def test_abort_fails_a_running_allreduce_and_tells_the_other_replica(torchft_installed, switch):
    import torch
    import torch.distributed as dist
    from _ranks import in_threads

    from gradswitch.torchft import ProcessGroupGradswitch

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    address = f"127.0.0.1:{store.port}/torchft/1/0"
    # a timeout far beyond the test's: an abort that waited for it would fail the test's deadline
    pgs = [ProcessGroupGradswitch(timedelta(seconds=300), switch=switch.address) for _ in range(2)]
    in_threads(lambda r: pgs[r].configure(address, f"replica{r}", r, 2))
    assert pgs[0].getBackendName() == "torchft-gradswitch"
    job = pgs[0].gradswitch_group.job
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    running = pgs[0].allreduce([torch.ones(1 << 16)], opts)  # replica 1 never sends its part
    in_threads(lambda _: pgs[0].abort(), world=1, deadline_s=10)
    with pytest.raises(gradswitch.GradswitchError, match="cancelled"):
        running.wait()
    with pytest.raises(gradswitch.JobAborted, match="rank 0 left the job"):
        pgs[1].allreduce([torch.ones(4)], opts).wait()
    assert pgs[0].gradswitch_group is None
    pgs[1].shutdown()
    assert re.search(rf"job '{job}' .* aborted: rank 0 disconnected", switch.log()), switch.log()


def test_options_are_gradswitch_options_with_a_clear_error_for_a_typo(torchft_installed):
    from gradswitch.torchft import ProcessGroupGradswitch

    pg = ProcessGroupGradswitch(switch="127.0.0.1:7700", wire="fixed32")
    assert (pg._options.switch, pg._options.wire) == ("127.0.0.1:7700", "fixed32")
    assert pg.gradswitch_group is None  # nothing joined before torchft's first configure()
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['swtich'\]"):
        ProcessGroupGradswitch(swtich="127.0.0.1:7700")
    with pytest.raises(ValueError, match="unknown wire"):
        ProcessGroupGradswitch(wire="int4")
