"""`gradswitch mpirun`: an unmodified Open MPI program, run with libgradswitch_mpi.so preloaded so
that its MPI_Allreduce / MPI_Reduce / MPI_Iallreduce are summed by a gradswitch switch (docs/mpi.md).

    gradswitch mpirun [OPTIONS] [--] MPIRUN-ARGUMENTS...
    gradswitch mpirun --switch 10.0.0.1:7700 -np 4 -H a,b,c,d ./train
    gradswitch mpirun --local-switch -np 4 python train.py      # one machine: a switch on 127.0.0.1

The options below come first; the first argument that is not one of them (or everything after
`--`) is handed to mpirun unchanged, with `-x` settings added that export the library and its
settings to every rank.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

WIRES = ("native", "float32", "fixed32", "float64")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gradswitch mpirun",
        description=__doc__.split("\n\n", 1)[0] + "\n\nThe first argument that is not an option below "
        "(or everything after --) goes to mpirun unchanged.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--switch", help="host:port of the switch's control plane (default $GRADSWITCH_SWITCH)")
    p.add_argument(
        "--local-switch",
        action="store_true",
        help="start a gradswitchd on 127.0.0.1 for this run and stop it after (every rank on this machine)",
    )
    p.add_argument("--switch-threads", type=int, default=1, help="data threads of --local-switch (default 1)")
    p.add_argument(
        "--wire",
        choices=WIRES,
        help="how MPI_FLOAT/MPI_DOUBLE travel: native (each as itself; the default), float32, fixed32 "
        "(bitwise reproducible sums) or float64",
    )
    p.add_argument(
        "--min-bytes", help="reductions smaller than this stay with MPI (default: the library's, 256K)"
    )
    p.add_argument(
        "--reduce-timeout",
        type=float,
        help="seconds without progress before a reduction falls back to MPI (default: the library's, 60)",
    )
    p.add_argument("--strict", action="store_true", help="fail instead of falling back to MPI")
    p.add_argument("--stats", action="store_true", help="each rank prints its counters at MPI_Finalize")
    p.add_argument(
        "--stats-file", metavar="PREFIX", help="each rank writes PREFIX.<rank>.json at MPI_Finalize"
    )
    p.add_argument(
        "--library", help="libgradswitch_mpi.so to preload (default: the one installed with gradswitch)"
    )
    p.add_argument("--mpirun", default="mpirun", help="the Open MPI launcher (default: mpirun on PATH)")
    p.add_argument("--dry-run", action="store_true", help="print the mpirun command instead of running it")
    return p


# Options of ours that take a value (the rest are flags); used to find where mpirun's arguments start.
_VALUED = {"--switch", "--switch-threads", "--wire", "--min-bytes", "--reduce-timeout", "--stats-file"}
_VALUED |= {"--library", "--mpirun"}
_FLAGS = {"--local-switch", "--strict", "--stats", "--dry-run", "-h", "--help"}


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(our options, mpirun's arguments)."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return argv[:i], argv[i + 1 :]
        name = a.split("=", 1)[0]
        if name in _FLAGS or (name in _VALUED and "=" in a):
            i += 1
        elif name in _VALUED:
            i += 2
        else:
            break
    return argv[:i], argv[i:]


def mpirun_command(opts: argparse.Namespace, switch: str, library: str, rest: list[str]) -> list[str]:
    preload = library + (":" + os.environ["LD_PRELOAD"] if os.environ.get("LD_PRELOAD") else "")
    env = {"LD_PRELOAD": preload, "GRADSWITCH_SWITCH": switch}
    if opts.wire:
        env["GRADSWITCH_MPI_WIRE"] = opts.wire
    if opts.min_bytes:
        env["GRADSWITCH_MPI_MIN_BYTES"] = opts.min_bytes
    if opts.reduce_timeout:
        env["GRADSWITCH_MPI_TIMEOUT"] = repr(opts.reduce_timeout)
    if opts.strict:
        env["GRADSWITCH_MPI_STRICT"] = "1"
    if opts.stats_file:
        env["GRADSWITCH_MPI_STATS"] = os.path.abspath(opts.stats_file)
    elif opts.stats:
        env["GRADSWITCH_MPI_STATS"] = "1"
    exports = [x for k, v in env.items() for x in ("-x", f"{k}={v}")]
    return [opts.mpirun, *exports, *rest]


def _check_open_mpi(mpirun: str) -> None:
    path = shutil.which(mpirun)
    if path is None:
        raise SystemExit(f"gradswitch mpirun: {mpirun!r} not found (apt-get install openmpi-bin)")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"gradswitch mpirun: `{path} --version` failed: {e}") from e
    if "Open MPI" not in out and "OpenRTE" not in out:
        raise SystemExit(
            f"gradswitch mpirun: {path} is not Open MPI's launcher (libgradswitch_mpi.so is built "
            f"against Open MPI; `--version` said: {out.strip()[:200]!r})"
        )


def main(argv: list[str]) -> int:
    ours, rest = split_args(argv)
    opts = _parser().parse_args(ours)
    if not rest:
        raise SystemExit("gradswitch mpirun: no program given (e.g. gradswitch mpirun -np 4 ./app)")
    if opts.local_switch and opts.switch:
        raise SystemExit("gradswitch mpirun: --switch and --local-switch exclude each other")
    from gradswitch._paths import mpi_library

    try:
        library = os.path.abspath(opts.library) if opts.library else mpi_library()
    except FileNotFoundError as e:
        raise SystemExit(f"gradswitch mpirun: {e}") from e
    if not os.path.isfile(library):
        raise SystemExit(f"gradswitch mpirun: --library {library} is not a file")
    switch = opts.switch or os.environ.get("GRADSWITCH_SWITCH", "")
    if not switch and not opts.local_switch:
        raise SystemExit(
            "gradswitch mpirun: which switch? Give --switch HOST:PORT (or set GRADSWITCH_SWITCH), or "
            "--local-switch to start one on 127.0.0.1 for a run on this machine"
        )
    if opts.dry_run:
        print(" ".join(mpirun_command(opts, switch or "127.0.0.1:<port of --local-switch>", library, rest)))
        return 0
    _check_open_mpi(opts.mpirun)
    if not opts.local_switch:
        return subprocess.call(mpirun_command(opts, switch, library, rest))
    from gradswitch.local_switch import LocalSwitch

    with LocalSwitch(threads=opts.switch_threads) as sw:
        print(
            f"gradswitch mpirun: switch at {sw.address} (gradswitchd, {opts.switch_threads} thread(s))",
            file=sys.stderr,
        )
        return subprocess.call(mpirun_command(opts, sw.address, library, rest))
