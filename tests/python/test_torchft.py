"""torchft on the switch: gradswitch.torchft.ProcessGroupGradswitch as the replica-dimension group of
three replicas (examples/train_torchft.py) on a local lighthouse; one replica is killed mid-training
and restarted, training goes on, and every replica ends with the same weights (docs/torch.md, "torchft").

Also: abort() (torchft's call when an operation failed, and before every reconfiguration) fails a
running allreduce at once and ends the job for the other replicas through the switch.

The time to recover is printed (kill -> the survivors' first step without it; restart -> the first step
with it again): a figure of this loaded machine, never asserted.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from conftest import require_or_skip

import gradswitch

REPLICA = Path(__file__).resolve().parents[2] / "examples" / "train_torchft.py"
DEADLINE_S = 60


def _require_torchft():
    try:
        import torchft  # noqa: F401
        from torchft.coordination import LighthouseServer
    except ImportError as e:
        require_or_skip("TOOLS", f"torchft is not installed ({e}); scripts/install-deps.sh installs it")
    return LighthouseServer


def _events(out: Path, replica: int, event: str = "step") -> list[dict]:
    path = out / f"replica{replica}.log"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in lines if e["event"] == event]


def _wait_for(what: str, predicate, procs: dict) -> dict:
    """The first truthy value of predicate() within the deadline; fails naming `what` (and any replica
    that exited) otherwise."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        for i, p in procs.items():
            if p.poll() not in (None, -signal.SIGKILL):
                pytest.fail(f"replica {i} exited with {p.returncode} while waiting for {what}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _first_commit(out: Path, replica: int, participants: int, pid: int | None = None, after: float = 0.0):
    for s in _events(out, replica):
        if (
            s["committed"]
            and s["participants"] == participants
            and s["t"] > after
            and (pid is None or s["pid"] == pid)
        ):
            return s
    return None


def test_replica_killed_and_restarted_rejoins_with_equal_weights(switch, tmp_path):
    LighthouseServer = _require_torchft()
    import torch

    lighthouse = LighthouseServer(
        bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000, heartbeat_timeout_ms=1000
    )
    logs = {i: (tmp_path / f"replica{i}.stderr").open("ab") for i in range(3)}

    def start(i: int) -> subprocess.Popen:
        command = [sys.executable, str(REPLICA), "--replica", str(i), "--lighthouse", lighthouse.address()]
        command += ["--switch", switch.address, "--out", str(tmp_path)]
        return subprocess.Popen(command, stdout=logs[i], stderr=subprocess.STDOUT)

    procs = {i: start(i) for i in range(3)}
    try:
        _wait_for("3 replicas training", lambda: all(_first_commit(tmp_path, i, 3) for i in range(3)), procs)
        procs[2].send_signal(signal.SIGKILL)
        killed = time.time()
        procs[2].wait()
        shrunk = _wait_for(
            "the survivors' step without replica 2",
            lambda: _first_commit(tmp_path, 0, 2, after=killed),
            procs,
        )
        procs[2] = start(2)
        restarted = time.time()
        rejoined = _wait_for(
            "replica 2's first step after its restart",
            lambda: _first_commit(tmp_path, 2, 3, pid=procs[2].pid),
            procs,
        )
        ready = next(e for e in _events(tmp_path, 2, "ready") if e["pid"] == procs[2].pid)
        print(
            f"torchft on gradswitch: kill -> survivors' first step {shrunk['t'] - killed:.2f} s; "
            f"restart -> replica ready (imports, Manager) {ready['t'] - restarted:.2f} s; "
            f"ready -> first step with it (quorum, new job, healing) {rejoined['t'] - ready['t']:.2f} s"
        )
        stop = rejoined["step"] + 5
        (tmp_path / "stop").write_text(str(stop))
        for i, p in procs.items():
            assert p.wait(timeout=DEADLINE_S) == 0, (tmp_path / f"replica{i}.stderr").read_text()[-4000:]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        lighthouse.shutdown()
        for f in logs.values():
            f.close()
    finals = [torch.load(tmp_path / f"replica{i}.pt") for i in range(3)]
    assert [f["step"] for f in finals] == [stop] * 3
    for f in finals[1:]:
        for name, value in finals[0]["model"].items():
            assert torch.equal(f["model"][name], value), name
    # the steps ran on the switch: its packet counter moved (not a local fallback)
    assert switch.stats()["pkts_in"] > 0


def test_abort_fails_a_running_allreduce_and_tells_the_other_replica(switch):
    _require_torchft()
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
