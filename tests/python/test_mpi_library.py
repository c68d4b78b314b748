"""Unmodified MPI programs with libgradswitch_mpi.so (docs/mpi.md).

A C program built here with mpicc (tests/mpi/reduce_check.c) and an mpi4py program
(tests/mpi/reduce_check.py) run under mpirun on this machine (4 ranks on loopback) with and without
the library, against a local gradswitchd; their results are compared (bitwise for integers and for
fixed32 runs against each other, within the float error bound otherwise), and the library's and the
switch's counters show the reductions went through the switch. A switch that cannot be reached or
that dies mid-run falls back to MPI with one warning (or fails, with GRADSWITCH_MPI_STRICT=1).
The testbed's MPI baseline program with the library is in test_baselines.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from _daemon import daemon_binary

REPO = Path(__file__).resolve().parents[2]
RANKS = 4
N = 100_000  # elements: 400 KB of float32, above the library's 256 KiB threshold
MPIRUN_ARGS = [
    "--allow-run-as-root",
    "--oversubscribe",
    "-np",
    str(RANKS),
    "--mca",
    "btl",
    "tcp,self",
    "--mca",
    "btl_tcp_if_include",
    "lo",
    "--mca",
    "oob_tcp_if_include",
    "lo",
    # 4 ranks on 2 cores: yield instead of busy-polling.
    "--mca",
    "mpi_yield_when_idle",
    "1",
]
ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


@pytest.fixture(scope="module")
def library():
    if shutil.which("mpirun") is None or shutil.which("mpicc") is None:
        pytest.skip("Open MPI is not installed (scripts/install-deps.sh: openmpi-bin libopenmpi-dev)")
    from gradswitch._paths import mpi_library

    try:
        return mpi_library()
    except FileNotFoundError as e:  # Open MPI is here, so the build should have made it
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def c_program(tmp_path_factory, library):
    exe = tmp_path_factory.mktemp("mpi") / "reduce_check"
    subprocess.run(
        ["mpicc", "-O2", "-Wall", "-o", str(exe), str(REPO / "tests/mpi/reduce_check.c")], check=True
    )
    return [str(exe)]


@pytest.fixture
def switch(switch_factory):
    return switch_factory(binary=daemon_binary())


def mpirun(prog: list[str], env: dict[str, str] | None = None, timeout: float = 120, wrapper=None):
    """Runs `prog` on RANKS ranks; `env` is exported to them with -x; `wrapper` (a list) runs it
    through `gradswitch mpirun <wrapper>` instead of plain mpirun."""
    exports = [x for k, v in (env or {}).items() for x in ("-x", f"{k}={v}")]
    if wrapper is None:
        cmd = ["mpirun", *MPIRUN_ARGS, *exports, *prog]
    else:
        cmd = [sys.executable, "-m", "gradswitch.cli", "mpirun", *wrapper, *MPIRUN_ARGS, *exports, *prog]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **ENV})
    r.seconds = time.monotonic() - t0
    return r


def ok(r) -> None:
    assert r.returncode == 0, f"mpirun failed ({r.returncode}):\n{r.stderr[-4000:]}\n{r.stdout[-2000:]}"


def preload(library: str, switch_addr: str, **settings: str) -> dict[str, str]:
    env = {"LD_PRELOAD": library, "GRADSWITCH_SWITCH": switch_addr}
    env.update({f"GRADSWITCH_MPI_{k.upper()}": v for k, v in settings.items()})
    return env


def stats(prefix: Path) -> list[dict]:
    return [json.loads((prefix.parent / f"{prefix.name}.{r}.json").read_text()) for r in range(RANKS)]


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("gradswitch-mpi:") and "warning" in line]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------- the C program's output


def c_segments(rank: int, n: int) -> list[tuple[str, np.dtype, int]]:
    """(what, dtype, count) of every result reduce_check.c writes, in order (see its reduce_on)."""
    out = []
    # MPI_COMM_WORLD, the halves of MPI_Comm_split(rank % 2), a dup of the world, the world again,
    # MPI_Comm_create of ranks 1..3 (rank 0 is not in it); MPI_Reduce's root is each communicator's
    # last rank.
    blocks = [("world", rank == 3), ("half", rank in (2, 3)), ("dup", rank == 3), ("world2", rank == 3)]
    if rank in CREATED:
        blocks.append(("created", rank == 3))
    for comm, root in blocks:
        seg = [("allreduce", np.float32, n), ("allreduce", np.float64, n), ("inplace", np.int32, n)]
        if root:
            seg += [("reduce-inplace", np.int32, n), ("reduce", np.float64, n)]
        seg += [
            ("iallreduce", np.float32, n),
            ("iallreduce", np.int32, n),
            ("iallreduce-test", np.float64, n),
        ]
        seg += [("iallreduce-wait", np.int32, n), ("iallreduce-barrier", np.int32, n)]
        seg += [("small", np.int32, 16), ("max", np.int32, n)]
        out += [(f"{comm}-{what}", np.dtype(t), c) for what, t, c in seg]
    # pass_through: int64 on the world, int32 on an inter-communicator (both by MPI)
    return out + [("int64", np.dtype(np.int64), n), ("intercomm", np.dtype(np.int32), n)]


CREATED = (1, 2, 3)  # the ranks in reduce_check.c's MPI_Comm_create communicator


def c_blocks(rank: int) -> int:
    """How many blocks of reductions (reduce_on) `rank` runs in reduce_check.c."""
    return 5 if rank in CREATED else 4


def read_c(outdir: Path, rank: int, n: int = N) -> dict[str, np.ndarray]:
    raw = (outdir / f"rank{rank}.bin").read_bytes()
    res, pos = {}, 0
    for name, dt, count in c_segments(rank, n):
        res[name] = np.frombuffer(raw, dt, count, pos)
        pos += count * dt.itemsize
    assert pos == len(raw), f"rank {rank}: {len(raw)} bytes, expected {pos}"
    return res


def bound(dt: np.dtype, max_input: float, wire: str) -> float:
    """How far two correct sums of RANKS values of magnitude <= max_input may differ: each order of
    summation is within (RANKS-1) u sum|x| of the exact sum; fixed32 adds each rank's rounding."""
    u = 2.0**-24 if dt == np.float32 else 2.0**-53
    b = 2 * (RANKS - 1) * u * RANKS * max_input
    if wire == "fixed32":  # RANKS * 2^(E + ceil(log2 RANKS) - 31), max_input < 2^E
        b += RANKS * 2.0 ** (np.ceil(np.log2(max_input)) + np.ceil(np.log2(RANKS)) - 31)
    return b


def compare(a: dict, b: dict, max_input: dict, wire: str = "native") -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if x.dtype.kind == "i":
            assert np.array_equal(x, y), f"{k}: integer sums differ"
        else:
            worst = float(np.max(np.abs(x.astype(np.float64) - y)))
            assert worst <= bound(x.dtype, max_input[x.dtype], wire), f"{k}: differs by {worst}"


C_MAX_INPUT = {np.dtype(np.float32): 1.0, np.dtype(np.float64): 1e3}  # reduce_check.c's fill_*


# ---------------------------------------------------------------------------- tests


def test_c_program_same_results_through_the_switch(library, c_program, switch, tmp_path):
    plain, lib = tmp_path / "plain", tmp_path / "lib"
    plain.mkdir(), lib.mkdir()
    before = switch.stats()
    # Through `gradswitch mpirun`, as a user would.
    r = mpirun(
        [*c_program, str(lib), str(N)],
        wrapper=["--switch", switch.address, "--stats-file", str(lib / "stats")],
    )
    ok(r)
    assert not warnings(r.stderr), r.stderr
    ok(mpirun([*c_program, str(plain), str(N)]))
    for rank in range(RANKS):
        compare(read_c(lib, rank), read_c(plain, rank), C_MAX_INPUT)
    # Each rank, per block: 3 MPI_Allreduce, 2 MPI_Reduce, 5 MPI_Iallreduce through the switch, a
    # 64-byte one and an MPI_MAX by MPI; 4 blocks on 3 communicators (the world twice), and ranks 1..3
    # a fifth on the created communicator; then an int64 and an inter-communicator sum by MPI.
    for rank, s in enumerate(stats(lib / "stats")):
        b = c_blocks(rank)
        assert (s["allreduce"], s["reduce"], s["iallreduce"]) == (3 * b, 2 * b, 5 * b), s
        assert (s["mpi_small"], s["mpi_other"], s["mpi_no_switch"], s["mpi_fallback"]) == (b, b + 2, 0, 0), s
        assert s["jobs"] == b - 1 and s["switch_bytes"] == b * 52 * N, s
    after = switch.stats()
    # The world, its two halves (two jobs), the dup and the created one; every reduction summed there.
    assert after["jobs_started"] - before["jobs_started"] == 5
    rounds = 4 * (3 * N // 360 + 3 * N // 180)  # at least one round per 1440-byte packet of one rank
    assert after["completed"] - before["completed"] >= rounds
    deadline = time.monotonic() + 5
    while switch.jobs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert switch.jobs() == [], "MPI_Finalize / MPI_Comm_free left jobs at the switch"


def test_fixed32_runs_are_bitwise_identical(library, c_program, switch, tmp_path):
    runs = []
    for i in range(2):
        d = tmp_path / f"fixed{i}"
        d.mkdir()
        if i == 0:  # `gradswitch mpirun` with a switch of its own for the run
            r = mpirun([*c_program, str(d), str(N)], wrapper=["--local-switch", "--wire", "fixed32"])
            assert "gradswitch mpirun: switch at 127.0.0.1:" in r.stderr
        else:
            r = mpirun([*c_program, str(d), str(N)], preload(library, switch.address, wire="fixed32"))
        ok(r)
        runs.append(d)
    plain = tmp_path / "plain"
    plain.mkdir()
    ok(mpirun([*c_program, str(plain), str(N)]))
    for rank in range(RANKS):
        assert (runs[0] / f"rank{rank}.bin").read_bytes() == (runs[1] / f"rank{rank}.bin").read_bytes()
        compare(read_c(runs[0], rank), read_c(plain, rank), C_MAX_INPUT, wire="fixed32")


def test_a_sharded_job_through_two_switches(library, c_program, switch_factory, tmp_path):
    # GRADSWITCH_SWITCH as a list (docs/scaling.md): every switch is probed, each sums its share.
    a, b = switch_factory(), switch_factory()
    lib, plain = tmp_path / "lib", tmp_path / "plain"
    lib.mkdir(), plain.mkdir()
    r = mpirun([*c_program, str(lib), str(N)], preload(library, f"{a.address},{b.address}", wire="fixed32"))
    ok(r)
    assert not warnings(r.stderr), r.stderr
    ok(mpirun([*c_program, str(plain), str(N)]))
    for rank in range(RANKS):
        compare(read_c(lib, rank), read_c(plain, rank), C_MAX_INPUT, wire="fixed32")
    assert a.stats()["completed"] > 0 and b.stats()["completed"] > 0


def test_mpi4py_program_same_results_through_the_switch(library, switch, tmp_path):
    pytest.importorskip("mpi4py")
    prog = [sys.executable, str(REPO / "tests/mpi/reduce_check.py")]
    plain, lib = tmp_path / "plain", tmp_path / "lib"
    plain.mkdir(), lib.mkdir()
    ok(mpirun([*prog, str(lib), str(N)], preload(library, switch.address, stats=str(lib / "stats"))))
    ok(mpirun([*prog, str(plain), str(N)]))
    max_input = {np.dtype(np.float32): 10.0, np.dtype(np.float64): 1e4}  # normal(0, 1) and 1e3 normal(0, 1)
    for rank in range(RANKS):
        a, b = np.load(lib / f"rank{rank}.npz"), np.load(plain / f"rank{rank}.npz")
        compare({k: a[k] for k in a.files}, {k: b[k] for k in b.files}, max_input)
    for s in stats(lib / "stats"):
        # 3 blocks (world, a half, world) x 3 dtypes: 2 Allreduce, 1 Reduce, 1 Iallreduce each.
        assert (s["allreduce"], s["reduce"], s["iallreduce"], s["mpi_fallback"]) == (18, 9, 9, 0), s


def test_two_threads_reduce_on_two_communicators_at_once(library, switch, tmp_path):
    """MPI_THREAD_MULTIPLE: each rank's two threads make the first reductions on two communicators at
    once, in opposite orders on even and odd ranks (tests/mpi/threads_check.c). Setting up one
    communicator's switch job must not hold up the other's: that would hang every rank."""
    exe = tmp_path / "threads_check"
    src = REPO / "tests/mpi/threads_check.c"
    subprocess.run(["mpicc", "-O2", "-Wall", "-pthread", "-o", str(exe), str(src)], check=True)
    try:
        r = mpirun([str(exe), str(N)], preload(library, switch.address, stats=str(tmp_path / "stats")), 60)
    except subprocess.TimeoutExpired:
        pytest.fail("the ranks hung: one communicator's first reduction waited behind another's")
    ok(r)  # the program checks its sums
    for s in stats(tmp_path / "stats"):
        assert (s["allreduce"], s["jobs"], s["mpi_fallback"]) == (2, 2, 0), s


def test_unreachable_switch_falls_back_with_one_warning(library, c_program, tmp_path):
    plain, lib = tmp_path / "plain", tmp_path / "lib"
    plain.mkdir(), lib.mkdir()
    r = mpirun(
        [*c_program, str(lib), str(N)],
        preload(library, f"127.0.0.1:{closed_port()}", stats=str(lib / "stats")),
    )
    ok(r)
    w = warnings(r.stderr)
    assert len(w) == 1 and "cannot reach the switch" in w[0] and "every reduction uses MPI" in w[0], r.stderr
    ok(mpirun([*c_program, str(plain), str(N)]))
    for rank in range(RANKS):  # all by MPI: the same bytes
        assert (lib / f"rank{rank}.bin").read_bytes() == (plain / f"rank{rank}.bin").read_bytes()
    for rank, s in enumerate(stats(lib / "stats")):
        assert s["allreduce"] + s["reduce"] + s["iallreduce"] == 0, s
        assert s["mpi_no_switch"] == 10 * c_blocks(rank), s
    # A malformed setting is named, and the library stays out of the way.
    r = mpirun([*c_program, str(lib), "1000"], preload(library, "127.0.0.1:1", wire="float128"))
    ok(r)
    assert len(warnings(r.stderr)) == 1 and "GRADSWITCH_MPI_WIRE='float128'" in r.stderr, r.stderr


def test_strict_mode_errors_instead(library, c_program, tmp_path):
    r = mpirun(
        [*c_program, str(tmp_path), str(N)], preload(library, f"127.0.0.1:{closed_port()}", strict="1")
    )
    assert r.returncode != 0
    assert "error (GRADSWITCH_MPI_STRICT=1)" in r.stderr and "cannot reach the switch" in r.stderr, r.stderr
    assert r.seconds < 60


def test_switch_killed_mid_run_falls_back_to_mpi(library, switch, tmp_path):
    pytest.importorskip("mpi4py")
    started, stop = tmp_path / "started", tmp_path / "stop"
    prog = [sys.executable, str(REPO / "tests/mpi/reduce_check.py"), str(tmp_path), str(N)]
    prog += ["--until-file", str(stop), "--started-file", str(started)]
    env = preload(library, switch.address, timeout="2", stats=str(tmp_path / "stats"))
    exports = [x for k, v in env.items() for x in ("-x", f"{k}={v}")]
    p = subprocess.Popen(
        ["mpirun", *MPIRUN_ARGS, *exports, *prog],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **ENV},
    )
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert p.poll() is None, p.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.05)
        switch.proc.send_signal(signal.SIGKILL)  # gone without a word: found by the 2 s timeout
        time.sleep(4)
        stop.touch()
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 0, err[-4000:]
    w = warnings(err)
    assert len(w) == 1 and "the switch failed during a reduction" in w[0], err
    for rank in range(RANKS):
        res = np.load(tmp_path / f"rank{rank}.npz")
        assert int(res["bad"]) == 0 and int(res["rounds"]) >= 2
    for s in stats(tmp_path / "stats"):
        assert s["allreduce"] >= 2 and s["mpi_fallback"] >= 1, s


def test_mpirun_wrapper_command_line(tmp_path):
    from gradswitch.mpirun import split_args

    assert split_args(["--switch", "h:1", "--stats", "-np", "4", "./a", "--stats"]) == (
        ["--switch", "h:1", "--stats"],
        ["-np", "4", "./a", "--stats"],
    )
    assert split_args(["--wire=fixed32", "--", "--switch", "x"]) == (["--wire=fixed32"], ["--switch", "x"])
    lib = tmp_path / "libgradswitch_mpi.so"
    lib.write_bytes(b"")
    cmd = [
        sys.executable,
        "-m",
        "gradswitch.cli",
        "mpirun",
        "--library",
        str(lib),
        "--switch",
        "10.0.0.1:7700",
    ]
    r = subprocess.run(
        [*cmd, "--min-bytes", "1M", "--dry-run", "-np", "2", "./app"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert f"-x LD_PRELOAD={lib}" in r.stdout and "-x GRADSWITCH_SWITCH=10.0.0.1:7700" in r.stdout
    assert "-x GRADSWITCH_MPI_MIN_BYTES=1M" in r.stdout and r.stdout.strip().endswith("-np 2 ./app")
    r = subprocess.run(
        [*cmd[:-2], "-np", "2", "./app"],
        capture_output=True,
        text=True,
        env={**os.environ, "GRADSWITCH_SWITCH": ""},
    )
    assert r.returncode != 0 and "which switch?" in r.stderr
