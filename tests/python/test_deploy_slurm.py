"""examples/slurm/gradswitch.sbatch under a real one-host Slurm (Debian's slurmctld, slurmd and munged, with a
generated slurm.conf in a temporary directory, on free ports): the batch job starts the switch from the
shipped config as one step and the ranks as another (plain processes, or torchrun training a DDP model),
and every rank checks every element of its sums (or every weight).
Needs root (slurmd launches the steps as the job's user). A few seconds."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _daemon import daemon_binary
from _deploy import ROOT, require, shipped_config_for_test
from conftest import require_or_skip

from gradswitch.daemon import pick_ports

SBATCH = ROOT / "examples" / "slurm" / "gradswitch.sbatch"


def slurm_conf(d: Path, host: str, ctld_port: int, slurmd_port: int) -> str:
    return f"""# a one-host cluster for the test
ClusterName=gstest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.sock
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=gs Nodes={host} Default=YES MaxTime=10 State=UP
"""


@pytest.fixture
def slurm(tmp_path):
    if os.geteuid() != 0:
        require_or_skip("TOOLS", "the Slurm test needs root (slurmd runs the job's steps as its user)")
    progs = {"munged": require("munged"), "mungekey": require("mungekey"), "slurmctld": require("slurmctld"),
             "slurmd": require("slurmd"), "sbatch": require("sbatch"), "sinfo": require("sinfo")}
    d = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True)
    subprocess.run([progs["mungekey"], "-c", "-k", str(d / "munge.key")], check=True, timeout=30)
    (d / "munge.key").chmod(0o600)
    host = socket.gethostname()
    ctld_port, _, slurmd_port = pick_ports(0, extra=1)
    conf = d / "slurm.conf"
    conf.write_text(slurm_conf(d, host, ctld_port, slurmd_port))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [
        # --force: the temporary directory's parents are world-writable (/tmp); munged refuses them otherwise.
        subprocess.Popen([progs["munged"], "-F", "--force", f"--key-file={d}/munge.key",
                          f"--socket={d}/munge.sock", f"--pid-file={d}/munged.pid",
                          f"--log-file={d}/munged.log", f"--seed-file={d}/munge.seed"]),
    ]
    try:
        deadline = time.monotonic() + 10
        while not (d / "munge.sock").exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, "munged did not start"
            time.sleep(0.05)
        procs.append(subprocess.Popen([progs["slurmctld"], "-D", "-f", str(conf)], env=env))
        procs.append(subprocess.Popen([progs["slurmd"], "-D", "-f", str(conf), "-N", host], env=env))
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run([progs["sinfo"], "-h", "-o", "%T"], env=env, capture_output=True,
                                   text=True, timeout=10).stdout.strip()
            if state == "idle":
                break
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), (
                f"the node is {state!r}, not idle:\n" + (d / "slurmctld.log").read_text()[-2000:]
            )
            time.sleep(0.2)
        yield d, env, progs
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def submit(slurm, tmp_path, ranks: int, **env_vars: str) -> tuple[str, str]:
    """sbatch --wait of the example on the one node with `ranks` tasks, the switch from the shipped
    config, and `env_vars`; (the job's id, its output). Asserts that it succeeded."""
    d, env, progs = slurm
    config, keys = shipped_config_for_test(tmp_path, threads=1)
    out = tmp_path / "job.out"
    env = {**env, "GRADSWITCHD": daemon_binary(), "GRADSWITCH_CONFIG": str(config),
           "GRADSWITCH_PORT": str(keys["control_port"]), "PYTHON": sys.executable,
           "RANKS_PER_NODE": str(ranks), "GRADSWITCH_TENANT": "train",
           "GRADSWITCH_SECRET_FILE": str(keys["secret_file"]), **env_vars}
    p = subprocess.run([progs["sbatch"], "--wait", "--nodes=1", f"--ntasks-per-node={ranks}", "--time=5",
                        f"--output={out}", f"--chdir={ROOT}", str(SBATCH)],
                       env=env, capture_output=True, text=True, timeout=180)
    text = out.read_text() if out.exists() else ""
    assert p.returncode == 0, (p.stdout, p.stderr, text, (d / "slurmd.log").read_text()[-2000:])
    assert f"switch on {socket.gethostname()} at " in text, text
    return p.stdout.split()[-1], text


def test_the_sbatch_example_starts_the_switch_and_three_ranks_that_sum_exactly(slurm, tmp_path):
    job_id, text = submit(slurm, tmp_path, 3)
    for r in range(3):
        assert f"OK rank {r} of 3: 3 allreduces of 262144 floats, every element exact" in text, text
    assert f"job 'train/slurm-{job_id}'" in text and "ended: all ranks left" in text, text


def test_the_sbatch_example_trains_with_ddp_under_torchrun_and_every_weight_is_exact(slurm, tmp_path):
    # LAUNCHER=torchrun: srun starts torchrun, whose 2 ranks rendezvous (c10d) and train a DDP model over
    # the "gradswitch" backend; each checks every weight after every step (examples/allreduce_check.py --ddp).
    program = "examples/allreduce_check.py --ddp --elements 65536"
    rdzv = str(pick_ports(0)[0])
    _, text = submit(slurm, tmp_path, 2, LAUNCHER="torchrun", PROGRAM=program, RDZV_PORT=rdzv,
                     TORCHRUN=f"{sys.executable} -m torch.distributed.run")
    for r in range(2):
        assert f"OK rank {r} of 2: 3 DDP steps of 65536 weights, every weight exact" in text, text
