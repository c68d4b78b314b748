"""Run a baseline on a testbed: `run(system, tb, nbytes, iters)` -> Result (sums verified by every rank).

Systems: hostagg (aggregator on `host`), gloo (torch.distributed ring), mpi_allreduce (MPI_Allreduce),
mpi_reduce_bcast (MPI_Reduce to `host` + MPI_Bcast, paper 000 Case 3), mpi_reduce (MPI_Reduce to
`host` alone, paper 000 Fig. 13). Each mpi_* system with the suffix `_gs` is the same unmodified
program with libgradswitch_mpi.so preloaded and gradswitchd on the testbed's switch (docs/mpi.md).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import sys
import tempfile

from ..testbed import Testbed, TestbedError
from .common import (
    BaselineError,
    Result,
    combine,
    fail_text,
    python,
    results_of,
    start_ranks,
    wait_all,
    worker_count,
)
from .gradswitch_sys import run_gradswitch, switch_daemon

SYSTEMS = ("hostagg", "gloo", "mpi_allreduce", "mpi_reduce_bcast")
MPI_MODES = ("allreduce", "reduce_bcast", "reduce")
# gradswitch itself (gradswitch_sys.run_gradswitch), and MPI programs with and without the MPI library
ALL_SYSTEMS = ("gradswitch",) + SYSTEMS + ("mpi_reduce",) + tuple(f"mpi_{m}_gs" for m in MPI_MODES)


def run_hostagg(
    tb: Testbed,
    nbytes: int,
    iters: int,
    workers: int | None = None,
    warmup: int = 1,
    chunk: int | None = None,
    port: int = 17000,
    timeout: float = 120,
) -> Result:
    n = worker_count(tb, workers)
    if chunk is None:  # small enough to pipeline (>= 32 chunks), big enough to keep per-chunk cost low
        chunk = min(1 << 20, max(64 << 10, (nbytes // 32) // 4096 * 4096))
    total = iters + warmup
    args = ["--world", n, "--nbytes", nbytes, "--chunk", chunk, "--iters", total, "--warmup", warmup]
    srv = tb.python(
        "host",
        "gradswitch.baselines.hostagg",
        "server",
        "--port",
        port,
        *args,
        stdout=-1,
        stderr=-1,
        text=True,
    )
    first = srv.stdout.readline()  # READY once listening (workers also retry connecting)
    if not first.startswith("READY"):
        outs = wait_all([("server", srv)], 5)
        raise BaselineError("hostagg server did not start:\n" + fail_text(outs) + first)
    connect = ["--connect", f"{tb.address('host')}:{port}"]
    procs = [("server", srv)] + start_ranks(
        tb, "gradswitch.baselines.hostagg", n, lambda r: ["worker", *connect, "--rank", r, *args]
    )
    lines = results_of(procs, timeout, "hostagg")
    rs = [r for r in lines if r.get("role") != "server"]
    server = next((r for r in lines if r.get("role") == "server"), {})
    return combine("hostagg", n, nbytes, iters, rs, n, {"chunk": chunk, "host_cpu_s": server.get("cpu_s")})


def run_gloo(
    tb: Testbed,
    nbytes: int,
    iters: int,
    workers: int | None = None,
    warmup: int = 1,
    port: int = 17100,
    timeout: float = 180,
) -> Result:
    n = worker_count(tb, workers)
    master = f"{tb.address('w0')}:{port}"
    args = ["--master", master, "--world", n, "--nbytes", nbytes, "--iters", iters + warmup]
    args += ["--warmup", warmup]
    procs = start_ranks(
        tb, "gradswitch.baselines.gloo", n, lambda r: [*args, "--rank", r, "--ifname", tb.interface(f"w{r}")]
    )
    rs = results_of(procs, timeout, "gloo")
    return combine("gloo", n, nbytes, iters, rs, n)


_RSH = """#!/bin/sh
# rsh agent for mpirun: `agent [opts] HOST CMD...` -> run CMD in testbed namespace gs-{name}-HOST
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
h="$1"; shift
exec ip netns exec "gs-{name}-$h" /bin/sh -c "$*"
"""


def mpirun_command(tb: Testbed, hosts: list[str], prog: list[str], agent: str) -> list[str]:
    """mpirun line that runs from the `host` namespace and starts one rank per listed testbed host."""
    if shutil.which("mpirun") is None:
        raise BaselineError(
            "mpirun not found: apt-get install openmpi-bin libopenmpi-dev; pip install mpi4py"
        )
    net = str(tb.subnet)
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(len(hosts)),
        "-H",
        ",".join(f"{h}:1" for h in hosts),
        "--map-by",
        "node",
        "--mca",
        "plm_rsh_agent",
        agent,
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        # All "nodes" share this machine's cores: yield instead of busy-polling when idle.
        "--mca",
        "mpi_yield_when_idle",
        "1",
        "--mca",
        "pml",
        "ob1",
        "--mca",
        "btl",
        "tcp,self",
        "--mca",
        "btl_tcp_if_include",
        net,
        "--mca",
        "oob_tcp_if_include",
        net,
        "-x",
        "PYTHONPATH",
        "-x",
        "OMPI_ALLOW_RUN_AS_ROOT",
        "-x",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM",
        *prog,
    ]


def _kill_mpi_leftovers(tb: Testbed, hosts: list[str]) -> None:
    """Kills what a stalled mpirun left in the hosts' namespaces (orted daemons, ranks)."""
    from ..testbed.core import _ns_pids

    for h in hosts:
        for pid in _ns_pids(tb.netns(h)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def run_mpi(
    tb: Testbed,
    nbytes: int,
    iters: int,
    workers: int | None = None,
    warmup: int = 1,
    mode: str = "allreduce",
    timeout: float = 180,
    library: bool = False,
    library_env: dict[str, str] | None = None,
    switch_options: dict | None = None,
) -> Result:
    """The MPI program in `mode`; with `library`, preloading libgradswitch_mpi.so with gradswitchd on the
    switch (gradswitch_sys.switch_daemon with `switch_options`, e.g. {"slots": 32, "threads": 1}) and
    `library_env` (e.g. {"GRADSWITCH_MPI_WIRE": "fixed32"}) exported to the ranks. Result.extra then
    holds the library's counters summed over ranks and the switch's STATS deltas."""
    if mode not in MPI_MODES:
        raise BaselineError(f"unknown MPI mode {mode!r}: one of {', '.join(MPI_MODES)}")
    n = worker_count(tb, workers)
    hosts = (["host"] if mode != "allreduce" else []) + [f"w{r}" for r in range(n)]
    d = tempfile.mkdtemp(prefix="gs-mpi-")
    daemon = None
    try:
        exports: list[str] = []
        if library:
            from .._paths import mpi_library

            daemon = switch_daemon(tb, **(switch_options or {})).start()
            before = daemon.stats()
            env = {
                "LD_PRELOAD": mpi_library(),
                "GRADSWITCH_SWITCH": daemon.address,
                "GRADSWITCH_MPI_STATS": os.path.join(d, "gsmpi"),
                **(library_env or {}),
            }
            exports = [x for k, v in env.items() for x in ("-x", f"{k}={v}")]
        agent = os.path.join(d, "netns-rsh")
        with open(agent, "w") as f:
            f.write(_RSH.replace("{name}", tb.name))
        os.chmod(agent, stat.S_IRWXU)
        cmd = mpirun_command(
            tb,
            hosts,
            [
                *exports,
                python(),
                "-m",
                "gradswitch.baselines.mpi",
                "--mode",
                mode,
                "--nbytes",
                str(nbytes),
                "--iters",
                str(iters + warmup),
                "--warmup",
                str(warmup),
                "--out",
                d,
            ],
            agent,
        )
        env = {
            "OMPI_ALLOW_RUN_AS_ROOT": "1",
            "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
        }
        # Open MPI's start-up over the netns rsh agent stalls now and then (one run in five to ten
        # here: mpirun and one orted wait, no rank process exists); a stalled run is killed and
        # started again, at most twice, and says so (two stalls in a row failed a CI run).
        attempts = 3
        for attempt in range(attempts):
            p = tb.popen("host", cmd, env=env, stdout=-1, stderr=-1, text=True)
            outs = wait_all([("mpirun", p)], timeout)
            name, rc, so, se = outs[0]
            stalled = "killed after" in (se or "") and not any(f.startswith("rank") for f in os.listdir(d))
            if not stalled or attempt == attempts - 1:
                break
            _kill_mpi_leftovers(tb, hosts)
            print(
                f"mpirun ({mode}) stalled for {timeout}s before any rank finished; "
                f"starting it again ({attempt + 2} of {attempts})",
                file=sys.stderr,
            )
        if rc != 0:
            raise BaselineError(
                f"mpirun ({mode}) failed rc={rc}:\n{se.strip()[-3000:]}\n{so.strip()[-1000:]}"
            )
        rs, counters = [], {}
        for f in sorted(os.listdir(d)):
            if f.endswith(".json") and f.startswith(("rank", "gsmpi.")):
                with open(os.path.join(d, f)) as fh:
                    r = json.load(fh)
                if f.startswith("rank"):
                    rs.append(r)
                else:  # the library's counters of one rank
                    for k, v in r.items():
                        if k != "rank":
                            counters[k] = counters.get(k, 0) + v
        extra = {}
        if daemon is not None:
            after = daemon.stats()
            extra["gradswitch_mpi"] = counters
            keys = ("completed", "pkts_in", "jobs_started")
            extra["switch"] = {k: after[k] - before.get(k, 0) for k in keys}
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(d, ignore_errors=True)
    return combine(f"mpi_{mode}" + ("_gs" if library else ""), n, nbytes, iters, rs, len(hosts), extra)


def run(
    system: str, tb: Testbed, nbytes: int, iters: int, workers: int | None = None, warmup: int = 1, **kw
) -> Result:
    """Run `iters` timed allreduces (after `warmup`) of `nbytes` float32 bytes with `workers` workers."""
    if nbytes <= 0 or nbytes % 4:
        raise BaselineError("nbytes must be a positive multiple of 4 (float32 gradients)")
    if system == "hostagg":
        return run_hostagg(tb, nbytes, iters, workers, warmup, **kw)
    if system == "gloo":
        return run_gloo(tb, nbytes, iters, workers, warmup, **kw)
    if system.startswith("mpi_"):
        library = system.endswith("_gs")
        mode = system[4:-3] if library else system[4:]
        return run_mpi(tb, nbytes, iters, workers, warmup, mode=mode, library=library, **kw)
    if system == "gradswitch":
        return run_gradswitch(tb, nbytes, iters, workers, warmup, **kw)
    raise BaselineError(f"unknown system {system!r}: one of {', '.join(ALL_SYSTEMS)}")


__all__ = [
    "ALL_SYSTEMS",
    "MPI_MODES",
    "SYSTEMS",
    "BaselineError",
    "Result",
    "run",
    "run_hostagg",
    "run_gloo",
    "run_mpi",
    "TestbedError",
]
