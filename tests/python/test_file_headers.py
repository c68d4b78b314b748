"""Every source file opens with a comment that says what it is (issue 41).

A reader who opens any file should learn first what it is for. The rule, kept simple: after an optional
shebang and blank lines, a file's first line is a comment (`//` or `/*` in C/C++, `#` in Python, shell
and CMake, `--` in Lua) or, in Python, a module docstring. Files that are data, generated or vendored
(JSON, TOML, YAML, CRD schemas, results) are not source and are not checked.
"""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("src", "include", "python", "bench", "tests", "tools", "fuzz", "scripts", "examples", "deploy")
COMMENT = {
    ".c": ("//", "/*"),
    ".cpp": ("//", "/*"),
    ".h": ("//", "/*"),
    ".py": ("#", '"""', "'''", 'r"""'),
    ".pyi": ("#", '"""'),
    ".sh": ("#",),
    ".cmake": ("#",),
    ".lua": ("--",),
}


def source_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *FOLDERS], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    out = []
    for name in listed:
        path = Path(name)
        if path.parts[:2] == ("bench", "results") or "k8s_crd_schemas" in path.parts:
            continue
        if path.suffix in COMMENT or path.name == "CMakeLists.txt":
            out.append(path)
    return out


def opening_line(text: str) -> str:
    lines = text.splitlines()
    if lines and lines[0].startswith("#!"):
        lines = lines[1:]
    for line in lines:
        if line.strip():
            return line.strip()
    return ""


def lacks_header(path: Path) -> bool:
    prefixes = COMMENT.get(path.suffix, ("#",))
    first = opening_line((ROOT / path).read_text(encoding="utf-8", errors="replace"))
    if not first:
        return path.suffix != ".py"  # an empty __init__.py says nothing and needs to say nothing
    return not first.startswith(prefixes)


def test_the_rule_tells_a_bare_file_from_a_commented_one(tmp_path):
    assert opening_line("#!/bin/sh\n\n# what it is\nx\n") == "# what it is"
    assert opening_line("#include <x>\n") == "#include <x>"
    assert not "#include <x>".startswith(COMMENT[".cpp"])


def test_every_source_file_opens_with_what_it_is():
    files = source_files()
    assert len(files) > 100, "git ls-files found too few source files: is this a checkout?"
    offenders = [str(p) for p in files if lacks_header(p)]
    assert not offenders, "files that do not open with a comment saying what they are:\n  " + "\n  ".join(
        offenders
    )
