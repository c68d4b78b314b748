"""Replicas of examples/train_torchft.py on a local torchft lighthouse, with one killed and restarted
mid-training: the orchestration of tests/python/test_torchft.py and bench/torchft_recovery.py.

    with Replicas(out_dir, switch="127.0.0.1:7700") as r:   # pg="gloo": torchft's own ProcessGroupGloo
        phases = r.kill_and_restart(2)                       # seconds of each recovery phase
        finals = r.finish(stop=phases["step"] + 5)           # every replica's saved weights
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_torchft.py"


class ClusterError(RuntimeError):
    """A replica exited early, or an expected step did not come within the deadline."""


class Replicas:
    """`n` replicas of one rank each, with a lighthouse in this process (torchft's LighthouseServer)."""

    def __init__(
        self, out: Path, *, switch: str | None = None, pg: str = "gradswitch", n: int = 3, deadline_s=60.0
    ):
        from torchft.coordination import LighthouseServer

        self.out, self.switch, self.pg, self.n, self.deadline_s = Path(out), switch, pg, n, deadline_s
        # the survivors' quorum comes once the lighthouse gives up on the dead replica's heartbeat
        self.lighthouse = LighthouseServer(
            bind="127.0.0.1:0", min_replicas=2, join_timeout_ms=1000, heartbeat_timeout_ms=1000
        )
        self.logs = {i: (self.out / f"replica{i}.stderr").open("ab") for i in range(n)}
        self.procs = {i: self.start(i) for i in range(n)}

    def start(self, i: int) -> subprocess.Popen:
        command = [
            sys.executable,
            str(EXAMPLE),
            "--replica",
            str(i),
            "--lighthouse",
            self.lighthouse.address(),
        ]
        command += ["--out", str(self.out), "--pg", self.pg] + (
            ["--switch", self.switch] if self.switch else []
        )
        return subprocess.Popen(command, stdout=self.logs[i], stderr=subprocess.STDOUT)

    def events(self, i: int, event: str = "step") -> list[dict]:
        path = self.out / f"replica{i}.log"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [e for e in lines if e["event"] == event]

    def first_commit(self, i: int, participants: int, *, pid: int | None = None, after: float = 0.0):
        """Replica i's first committed step with `participants` replicas (of process pid, after t)."""
        for e in self.events(i):
            if e["committed"] and e["participants"] == participants and e["t"] > after:
                if pid is None or e["pid"] == pid:
                    return e
        return None

    def wait_for(self, what: str, predicate):
        """The first truthy value of predicate(); ClusterError after the deadline or when a replica
        exited (other than by the kill)."""
        end = time.monotonic() + self.deadline_s
        while time.monotonic() < end:
            value = predicate()
            if value:
                return value
            for i, p in self.procs.items():
                if p.poll() not in (None, -signal.SIGKILL):
                    raise ClusterError(f"replica {i} exited with {p.returncode} while waiting for {what}")
            time.sleep(0.05)
        raise ClusterError(f"timed out after {self.deadline_s} s waiting for {what}")

    def kill_and_restart(self, victim: int) -> dict:
        """Once all train together: kills `victim`, waits for the others' first step without it,
        restarts it and waits for its first step with all. The phases' seconds, and that step."""
        everyone = self.n
        self.wait_for(
            f"{everyone} replicas training", lambda: all(self.first_commit(i, everyone) for i in self.procs)
        )
        self.procs[victim].send_signal(signal.SIGKILL)
        killed = time.time()
        self.procs[victim].wait()
        survivor = next(i for i in self.procs if i != victim)
        shrunk = self.wait_for(
            f"the survivors' step without replica {victim}",
            lambda: self.first_commit(survivor, everyone - 1, after=killed),
        )
        self.procs[victim] = self.start(victim)
        restarted, pid = time.time(), self.procs[victim].pid
        rejoined = self.wait_for(
            f"replica {victim}'s first step after its restart",
            lambda: self.first_commit(victim, everyone, pid=pid),
        )
        ready = next(e for e in self.events(victim, "ready") if e["pid"] == pid)
        return {
            "kill_to_survivors_step_s": shrunk["t"] - killed,
            "restart_to_ready_s": ready["t"] - restarted,
            "ready_to_step_with_all_s": rejoined["t"] - ready["t"],
            "step": rejoined["step"],
        }

    def finish(self, stop: int) -> list[dict]:
        """Tells every replica to stop at step `stop`; their saved records ({"step", "model"})."""
        import torch

        (self.out / "stop").write_text(str(stop))
        for i, p in self.procs.items():
            try:
                code = p.wait(timeout=self.deadline_s)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                tail = (self.out / f"replica{i}.stderr").read_text(errors="replace")[-4000:]
                raise ClusterError(f"replica {i} ended with {code}:\n{tail}")
        return [torch.load(self.out / f"replica{i}.pt") for i in range(self.n)]

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        self.lighthouse.shutdown()
        for f in self.logs.values():
            f.close()

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
