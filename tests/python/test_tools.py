"""The table of programs (scripts/programs.tsv) against the code, both ways.

1. Every program the Python code runs is in the table, so scripts/install-deps.sh installs its
   package: the source is scanned for commands (argument lists given to subprocess and to the
   project's run helpers, `ip netns exec NS <program>`, `shutil.which(...)`).
2. Every program in the table is run somewhere (no stale rows), and every package in it is what
   scripts/install-deps.sh installs.
3. In CI (GRADSWITCH_REQUIRE_TOOLS=1) every program of the table is on PATH once the install
   script ran: a program missing from the script fails here, by name, instead of as a timeout in
   some namespace test.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gradswitch import _tools

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "scripts" / "programs.tsv"  # the source tree's, not a (maybe older) installed copy
SCANNED = ["python", "tests", "bench", "examples", "fuzz"]
# Calls whose arguments are a command line (the project's helpers included).
RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "exec", "popen", "_run", "_cmd", "execvp"}
# Strings that head an argument list passed to a runner but are not programs.
NOT_PROGRAMS = {
    "up": "`gradswitch testbed up` (a subcommand after sys.executable -m ...)",
    "down": "likewise",
    "status": "likewise",
    "exec": "likewise",
    "accelerate": "the command of the pip package accelerate (pinned in scripts/install-deps.sh's pip list)",
}
PROGRAM_NAME = re.compile(r"^[a-z][a-z0-9+._-]*$")


def _strings(node: ast.AST) -> list[str | None]:
    """A command's words: str constants, None for anything computed."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # [prog, ...] + rest
        return _strings(node.left)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None
                for e in node.elts]
    return []


def _programs_of(words: list[str | None]) -> list[str]:
    """The program of a command line, and the one `ip netns exec NS` or `--` runs."""
    out = []
    if words and words[0]:
        out.append(words[0])
    for i, w in enumerate(words):
        if w == "exec" and i >= 2 and words[:2] == ["ip", "netns"] and i + 2 < len(words) and words[i + 2]:
            out.append(words[i + 2])
        if w == "--" and i + 1 < len(words) and words[i + 1]:
            out.append(words[i + 1])
    return [p for p in out if PROGRAM_NAME.match(p)]


def run_programs() -> dict[str, list[str]]:
    """program -> ["file:line", ...] for every command the scanned Python code runs."""
    found: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path == Path(__file__).resolve():  # this test names programs that do not exist
                continue
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                progs: list[str] = []
                if name == "which" and node.args and isinstance(node.args[0], ast.Constant):
                    progs = [node.args[0].value]
                elif name == "require" and node.args and isinstance(node.args[0], ast.Constant):
                    progs = [node.args[0].value]
                elif name in RUNNERS:
                    lists = [a for a in node.args if _strings(a)]
                    if lists:
                        progs = _programs_of(_strings(lists[0]))
                    else:  # varargs: _run("ip", "netns", ...), topo.exec(0, "ping", "-c", ...)
                        args = list(node.args)
                        while args and isinstance(args[0], ast.Constant) and isinstance(args[0].value, int):
                            args.pop(0)  # a host index
                        # At least two literal words: tb.exec("switch", cmd) names a host, not a program.
                        if len(args) >= 2 and all(isinstance(a, ast.Constant) for a in args[:2]):
                            words = [a.value if isinstance(a, ast.Constant) else None for a in args]
                            progs = _programs_of(words)
                for p in progs:
                    found.setdefault(p, []).append(where)
    return found


def test_every_program_the_code_runs_is_in_the_table():
    table = _tools.programs(TABLE)
    unknown = {
        p: where for p, where in run_programs().items() if p not in table and p not in NOT_PROGRAMS
    }
    assert not unknown, (
        "programs run by the code but missing from scripts/programs.tsv (so scripts/install-deps.sh does not "
        f"install them): {unknown}"
    )


def test_every_program_in_the_table_is_run_by_the_code_or_the_scripts():
    run = set(run_programs())
    scripts = "\n".join(p.read_text() for p in [*(ROOT / "scripts").glob("*.sh"), ROOT / ".ci" / "run"])
    build = {"c++", "cmake", "ctest", "ninja", "pkg-config", "clang", "clang++"}  # CMake and scripts/test.sh
    in_scripts = {p for p in _tools.programs(TABLE) if re.search(rf"\b{re.escape(p)}\b", scripts)}
    stale = [p for p in _tools.programs(TABLE) if p not in run | build | in_scripts]
    assert not stale, f"rows of scripts/programs.tsv that nothing runs: {stale}"


def test_install_script_installs_exactly_the_table():
    script = ROOT / "scripts" / "install-deps.sh"
    for flags, stage in ((["--minimal"], "build"), ([], "test")):
        out = subprocess.run(
            ["bash", str(script), *flags, "--print-packages"], capture_output=True, text=True, check=True
        ).stdout.split()
        want = sorted({r.package for r in _tools.rows(TABLE) if stage == "test" or r.stage == "build"})
        assert sorted(out) == want, (stage, out, want)


def test_require_names_the_package_of_a_missing_program(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(_tools.ToolMissing, match=r"apt-get install ethtool"):
        _tools.require("ethtool")
    with pytest.raises(KeyError, match="programs.tsv"):
        _tools.require("no-such-program")


def test_every_program_of_the_table_is_installed():
    absent = _tools.missing(_tools.programs(TABLE), TABLE)
    if absent:
        reason = f"not installed: {', '.join(absent)} (run scripts/install-deps.sh)"
        if os.environ.get("GRADSWITCH_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{reason}; GRADSWITCH_REQUIRE_TOOLS=1 forbids skipping")
        pytest.skip(reason)
