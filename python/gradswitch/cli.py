"""The `gradswitch` command: switch, bench, demo, testbed, mpirun, timeline, status, top."""

from __future__ import annotations

import argparse
import os
import sys


def _switch(argv: list[str]) -> int:
    from gradswitch._paths import switch_binary

    binary = switch_binary()
    # The daemon owns its options (and their --help); run it in the foreground in our place, named
    # as the user called it (its usage line and hints use argv[0]).
    os.execv(binary, ["gradswitch switch", *argv])
    return 127  # not reached


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from gradswitch import __version__

    parser = argparse.ArgumentParser(
        prog="gradswitch",
        description="In-network gradient aggregation in software. Commands:\n"
        "  switch   run the switch daemon (gradswitchd) in the foreground; `gradswitch switch --help`\n"
        "  bench    N local workers allreduce through a switch; prints bandwidth and packet rate\n"
        "  demo     a switch and 4 workers on loopback summing a 64 MiB tensor, checked\n"
        "  testbed  an emulated cluster in network namespaces (root)\n"
        "  mpirun   an unmodified Open MPI program, its reductions summed by the switch (docs/mpi.md)\n"
        "  timeline merge or summarise worker timelines (GRADSWITCH_TIMELINE, docs/observability.md)\n"
        "  status   jobs, ranks, open rounds and counters of a running switch; says why a job is stuck\n"
        "  top      live per-job packet and round rates of a running switch, refreshed",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gradswitch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("switch", help="run the switch daemon", add_help=False)
    sub.add_parser("bench", help="local allreduce benchmark", add_help=False)
    sub.add_parser("demo", help="local demo with result check", add_help=False)
    sub.add_parser("mpirun", help="run an MPI program with libgradswitch_mpi.so", add_help=False)
    try:
        from gradswitch.testbed.cli import add_parser as add_testbed_parser
    except ImportError:
        add_testbed_parser = None
    if add_testbed_parser:
        add_testbed_parser(sub)
    from gradswitch import timeline

    timeline.add_parser(sub)
    from gradswitch import status

    status.add_parsers(sub)

    # Sub-commands that own their whole argument list are dispatched before argparse sees it.
    if argv and argv[0] == "switch":
        return _switch(argv[1:])
    if argv and argv[0] == "mpirun":
        from gradswitch import mpirun

        return mpirun.main(argv[1:])
    if argv and argv[0] in ("bench", "demo"):
        from gradswitch import bench

        return bench.main(argv[1:], demo=argv[0] == "demo")
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:  # no command, or a command group without its sub-command
        parser.parse_args([*argv, "--help"])
        return 2
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
