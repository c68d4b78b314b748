"""Every program gradswitch runs, with the Debian package that provides it.

The table itself is scripts/programs.tsv (installed into the package as programs.tsv): one place,
read by scripts/install-deps.sh to install the packages, by require() to name the package of a
missing program (instead of letting it surface later as an opaque timeout), and by
tests/python/test_tools.py, which checks it both ways against the code.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Row:
    program: str  # "-" for a package that provides no program the code runs
    package: str  # the Debian package
    stage: str  # "build" (the demo needs it too) or "test"
    why: str


class ToolMissing(RuntimeError):
    """A program gradswitch needs is not installed."""


def table_path() -> Path:
    here = Path(__file__).resolve().parent
    for p in (here / "programs.tsv", here.parents[1] / "scripts" / "programs.tsv"):
        if p.is_file():
            return p
    raise FileNotFoundError("gradswitch: programs.tsv is missing from the package and the source tree")


@lru_cache(maxsize=4)
def rows(path: Path | None = None) -> tuple[Row, ...]:
    """The table's rows (from `path`, default: the package's copy or the source tree's)."""
    out = []
    for line in (path or table_path()).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        program, package, stage, why = line.split("\t")
        out.append(Row(program, package, stage, why))
    return tuple(out)


def programs(path: Path | None = None) -> dict[str, Row]:
    return {r.program: r for r in rows(path) if r.program != "-"}


def require(program: str) -> str:
    """The absolute path of `program`; ToolMissing naming its package when it is not installed."""
    row = programs().get(program)
    if row is None:
        raise KeyError(f"gradswitch: {program!r} is not in scripts/programs.tsv; add it with its package")
    path = shutil.which(program)
    if path is None:
        raise ToolMissing(
            f"`{program}` is not installed ({row.why}): apt-get install {row.package} "
            f"(scripts/install-deps.sh installs every package gradswitch needs)"
        )
    return path


def missing(names, path: Path | None = None) -> list[str]:
    """Those of `names` that are not on PATH, each as "program (package)"."""
    table = programs(path)
    return [f"{p} ({table[p].package})" for p in names if shutil.which(p) is None]
