"""The runner behind `python -m tests.torch_upstream` (tests/torch_upstream/__init__.py says what it is).

It starts a loopback gradswitchd, sets the environment the harness reads at import (BACKEND, WORLD_SIZE,
GRADSWITCH_SWITCH, the per-test timeout), runs the selected tests one by one with unittest (each spawns
WORLD_SIZE ranks) and writes every test's outcome, skip reason and failure summary to a JSON results
file, and optionally the Markdown listing of docs/torch_upstream.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import multiprocessing
import os
import sys
import time
import unittest
from pathlib import Path

from . import explanations

DOC_BEGIN = "<!-- listing:begin ws={} -->"  # one listing per world size; python -m tests.torch_upstream --doc
DOC_END = "<!-- listing:end ws={} -->"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.torch_upstream",
        description="Runs torch's upstream distributed_test.py (collective and DDP tests) on the gradswitch "
        "backend, CPU, against a local gradswitchd, and lists pass/fail/skip with each skip's reason.",
    )
    p.add_argument(
        "-k",
        dest="patterns",
        action="append",
        default=[],
        metavar="GLOB",
        help="run the tests whose name matches GLOB (fnmatch; repeatable); default: all",
    )
    p.add_argument("--world-size", type=int, default=3, help="ranks per test (upstream CI uses 3)")
    p.add_argument(
        "--timeout",
        type=int,
        default=180,
        help="seconds one test may take before the harness kills its ranks",
    )
    p.add_argument(
        "--results", type=Path, default=Path("torch_upstream_results.json"), help="JSON file of the outcomes"
    )
    p.add_argument(
        "--doc",
        type=Path,
        default=None,
        help="also rewrite the listing between the markers of this Markdown file (docs/torch_upstream.md)",
    )
    p.add_argument("--list", action="store_true", help="print the test names and exit")
    p.add_argument(
        "--stacks-after",
        type=float,
        default=0,
        metavar="S",
        help="each rank prints every thread's stack after S seconds (a hang's diagnosis)",
    )
    p.add_argument(
        "--no-lifts",
        action="store_true",
        help="keep every name-based skip and name-chosen code path of the harness (only the feature sets "
        "change): the configuration before this runner",
    )
    p.add_argument("--threads", type=int, default=1, help="data threads of the gradswitchd")
    return p.parse_args(argv)


class _Recorder(unittest.TextTestResult):
    """A unittest result that keeps one row per test: outcome, reason, seconds."""

    switch_chunks = staticmethod(lambda: 0)  # the switch's count of completed chunks (set by run)

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.rows: list[dict] = []
        self._t0 = 0.0
        self._chunks0 = 0

    def startTest(self, test):  # noqa: N802 - unittest's names
        self._t0 = time.monotonic()
        self._chunks0 = self.switch_chunks()
        super().startTest(test)

    def _row(self, test, outcome: str, reason: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.rows.append(
            {
                "name": name,
                "outcome": outcome,
                "reason": reason,
                "seconds": round(time.monotonic() - self._t0, 1),
                # chunks this test had the switch reduce: 0 for a test whose collectives all ran
                # through the backend's internal gloo group (or that skipped)
                "switch_chunks": self.switch_chunks() - self._chunks0,
            }
        )
        print(f"[{len(self.rows)}] {name}: {outcome} {reason[:160]}", file=sys.__stdout__, flush=True)

    def addSuccess(self, test):  # noqa: N802
        super().addSuccess(test)
        self._row(test, "pass")

    def addSkip(self, test, reason):  # noqa: N802
        super().addSkip(test, reason)
        self._row(test, "skip", reason)

    def addFailure(self, test, err):  # noqa: N802
        super().addFailure(test, err)
        self._row(test, "fail", _summary(self.failures[-1][1]))

    def addError(self, test, err):  # noqa: N802
        super().addError(test, err)
        self._row(test, "fail", _summary(self.errors[-1][1]))

    def addExpectedFailure(self, test, err):  # noqa: N802
        super().addExpectedFailure(test, err)
        self._row(test, "pass", "expected failure")

    def addUnexpectedSuccess(self, test):  # noqa: N802
        super().addUnexpectedSuccess(test)
        self._row(test, "fail", "unexpected success")


def _summary(traceback_text: str) -> str:
    """The last exception line of a (possibly multi-rank) traceback, for the listing."""
    lines = [ln.strip() for ln in traceback_text.splitlines() if ln.strip()]
    errors = [
        ln
        for ln in lines
        if ("Error" in ln.split(":", 1)[0] or "Exception" in ln.split(":", 1)[0])
        and not ln.startswith(("File ", "raise "))
    ]
    return (errors[-1] if errors else lines[-1] if lines else "")[:300]


def _select(names: list[str], patterns: list[str]) -> list[str]:
    if not patterns:
        return names
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _environment(world_size: int, timeout: int, switch_address: str, work_dir: Path) -> None:
    # INIT_METHOD: upstream runs the suite once with env:// and once with a shared file; a file is what
    # the tests that re-create the default group (test_barrier_timeout_global) need. The harness gives
    # each test its own (tests/torch_upstream/_harness.py); each test's first group is made from the
    # harness's per-test file either way.
    os.environ.update(
        INIT_METHOD=f"file://{work_dir.resolve()}/torch_upstream_init_file",
        BACKEND="gradswitch",
        WORLD_SIZE=str(world_size),
        GRADSWITCH_SWITCH=switch_address,
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(timeout),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )


def run(
    patterns: list[str],
    world_size: int = 3,
    timeout: int = 180,
    threads: int = 1,
    log_dir: Path | None = None,
) -> dict:
    """Runs the matching upstream tests; returns the results document (written as JSON by main)."""
    from gradswitch.local_switch import LocalSwitch

    log = (log_dir or Path.cwd()) / "torch_upstream_gradswitchd.log"
    with LocalSwitch(threads=threads, log_path=log) as sw:
        _environment(world_size, timeout, sw.address, log.parent)
        from . import _harness  # after the environment: the harness reads it at import

        multiprocessing.set_forkserver_preload([_harness.__name__])

        names = _select(_harness.test_names(), patterns)
        suite = unittest.TestSuite(_harness.TestGradswitchSpawn(n) for n in names)
        _Recorder.switch_chunks = staticmethod(lambda: sw.stats().get("completed", 0))
        runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=0, stream=sys.stderr)
        t0 = time.monotonic()
        result = runner.run(suite)
    import torch

    return {
        "torch": torch.__version__,
        "upstream": _harness.upstream_file().split("site-packages/")[-1],
        "world_size": world_size,
        "patterns": patterns,
        "seconds": round(time.monotonic() - t0),
        "overridden": dict(sorted(_harness.overridden_tests.items())),
        "tests": sorted(result.rows, key=lambda r: r["name"]),
    }


def counts(doc: dict) -> dict[str, int]:
    out = {"pass": 0, "fail": 0, "skip": 0}
    for row in doc["tests"]:
        out[row["outcome"]] += 1
    return out


def listing(doc: dict) -> str:
    """The Markdown listing: counts, then one row per test with its outcome and, where not a pass, why."""
    c = counts(doc)
    lines = [
        f"torch {doc['torch']}, `{doc['upstream']}`, world size {doc['world_size']}, CPU: "
        f"**{c['pass']} pass, {c['fail']} fail, {c['skip']} skip** of {len(doc['tests'])} "
        f"({doc['seconds']} s).",
        "",
        "`chunks`: the chunks the switch reduced for the test (0: all its collectives ran through the "
        "backend's internal gloo group, or it skipped).",
        "",
        "| test | outcome | chunks | reason (harness) | why |",
        "|---|---|---|---|---|",
    ]
    for row in doc["tests"]:
        why = explanations.why(row["name"], row["outcome"], row["reason"], doc["overridden"])
        reason = row["reason"].replace("|", "\\|").replace("\n", " ")
        chunks = row.get("switch_chunks", "")
        lines.append(f"| `{row['name']}` | {row['outcome']} | {chunks} | {reason} | {why} |")
    return "\n".join(lines) + "\n"


def update_doc(path: Path, text: str, world_size: int) -> None:
    """Replaces the listing of this world size in the Markdown file `path` (between its markers)."""
    begin, end = DOC_BEGIN.format(world_size), DOC_END.format(world_size)
    doc = path.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: no listing markers {begin!r} ... {end!r}")
    head, rest = doc.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{text}{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.list:
        os.environ.update(BACKEND="gradswitch", WORLD_SIZE=str(args.world_size))
        from . import _harness

        print("\n".join(_select(_harness.test_names(), args.patterns)))
        return 0
    args.results.parent.mkdir(parents=True, exist_ok=True)
    if args.no_lifts:
        os.environ["TORCH_UPSTREAM_NO_LIFTS"] = "1"
    if args.stacks_after:
        os.environ["TORCH_UPSTREAM_STACKS_AFTER"] = str(args.stacks_after)
    doc = run(args.patterns, args.world_size, args.timeout, args.threads, args.results.parent)
    args.results.write_text(json.dumps(doc, indent=1) + "\n")
    if args.doc:
        update_doc(args.doc, listing(doc), args.world_size)
    c = counts(doc)
    print(f"{c['pass']} pass, {c['fail']} fail, {c['skip']} skip -> {args.results}")
    return 1 if c["fail"] else 0
