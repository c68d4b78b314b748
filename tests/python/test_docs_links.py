"""The front door stays consistent: every repository path that BENCHMARKS.md, README.md and docs/ cite
exists; every folder in bench/results/ is cited by BENCHMARKS.md, has a README and is in the index; no
prototype patch is kept there; and BENCHMARKS.md's headline table is the one bench/headline.py generates
from bench/headline.json (so the table and the rerun never disagree)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
# A path inside the repository as the docs write it: a top-level folder of the repository, then a name.
TOP = "bench|docs|src|include|python|tests|examples|tools|fuzz|scripts"
PATH = re.compile(rf"(?<![\w/.~$-])((?:{TOP})/[\w./+-]*[\w/])")


def _documents() -> list[Path]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    return [ROOT / "BENCHMARKS.md", ROOT / "README.md", *docs, RESULTS / "README.md"]


def cited_paths(text: str) -> set[str]:
    """Repository paths in a document (globs and placeholders such as <dir> or * are not paths)."""
    out = set()
    for m in PATH.finditer(text):
        p = m.group(1).rstrip("./")
        end = m.end(1)
        if end < len(text) and text[end] in "<*{":  # bench/results/<date>, tests/python/test_*.py
            continue
        out.add(p)
    return out


def missing_paths(docs: list[Path]) -> list[str]:
    bad = []
    for doc in docs:
        for p in sorted(cited_paths(doc.read_text())):
            if not (ROOT / p).exists():
                bad.append(f"{doc.relative_to(ROOT)} cites {p}, which does not exist")
    return bad


def uncited_folders(benchmarks: str, index: str) -> list[str]:
    bad = []
    for d in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        rel = f"bench/results/{d.name}"
        if rel not in cited_paths(benchmarks):
            bad.append(f"{rel} is not cited by BENCHMARKS.md")
        if not (d / "README.md").is_file():
            bad.append(f"{rel} has no README.md")
        if f"({d.name}/README.md)" not in index:
            bad.append(f"{rel} is not in bench/results/README.md")
    return bad


def test_cited_paths_exist():
    assert missing_paths(_documents()) == []


def test_every_results_folder_is_cited_described_and_indexed():
    benchmarks = (ROOT / "BENCHMARKS.md").read_text()
    assert uncited_folders(benchmarks, (RESULTS / "README.md").read_text()) == []


def test_no_prototype_patches_in_results():
    assert sorted(str(p.relative_to(ROOT)) for p in RESULTS.rglob("*.patch")) == []


def test_headline_table_is_generated_from_the_record():
    spec = importlib.util.spec_from_file_location("headline", ROOT / "bench" / "headline.py")
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    text = (ROOT / "BENCHMARKS.md").read_text()
    begin, end = text.find(headline.TABLE_BEGIN), text.find(headline.TABLE_END)
    assert begin >= 0 and end > begin, "BENCHMARKS.md has no generated headline table"
    assert text[begin : end + len(headline.TABLE_END)] == headline.table(headline.load()), (
        "BENCHMARKS.md's headline table differs from bench/headline.json: "
        "regenerate it with `python3 bench/headline.py --table`"
    )
    rows = headline.load()["rows"]
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["better"] in ("higher", "lower") and isinstance(r["figure"], (int, float)), r["id"]
        assert hasattr(headline.Runner, f"group_{r['group']}"), f"{r['id']}: no rerun for {r['group']}"
        assert f'<a id="s{r["section"]}"></a>' in text, f"{r['id']}: no section {r['section']}"


def test_the_checks_catch_what_they_are_for(tmp_path):
    # A cited path that does not exist, and a results folder nobody cites, are both reported.
    doc = tmp_path / "doc.md"
    doc.write_text("see `bench/results/1999-01-01-nothing` and docs/protocol.md, bench/results/<date>\n")
    bad = [m.replace(str(tmp_path), "") for m in _missing_in(doc)]
    assert bad == ["bench/results/1999-01-01-nothing"]
    some = next(p.name for p in RESULTS.iterdir() if p.is_dir())
    assert f"bench/results/{some} is not cited by BENCHMARKS.md" in uncited_folders("nothing cited", "")


def _missing_in(doc: Path) -> list[str]:
    return [p for p in sorted(cited_paths(doc.read_text())) if not (ROOT / p).exists()]
