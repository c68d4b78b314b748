"""torch's own distributed tests on the gradswitch backend (tests/torch_upstream, docs/torch_upstream.md).

CI runs a curated subset, bounded in time: the tests behind gradswitch's fixes and lifted skips
(get_future, the coalesced MIN/MAX/PRODUCT, comm hooks through DDP's no_sync path, gloo-served
timeouts) and a DDP one; every one must pass. The full run is the documented command; its stored
listing must explain every test that does not pass.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from _daemon import daemon_binary
from conftest import require_or_skip

REPO = Path(__file__).resolve().parents[2]
LISTING = REPO / "docs" / "torch_upstream.md"
CURATED = (
    "test_get_future",
    "test_all_reduce_sum",
    "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_full_group_product",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_barrier_timeout_global",
    "test_DistributedDataParallelCPU",
)


def _runner(*args: str, timeout: float) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("expecttest") is None:
        require_or_skip(
            "TOOLS", "expecttest is not installed (torch's test harness needs it: scripts/install-deps.sh)"
        )
    return subprocess.run(
        [sys.executable, "-m", "tests.torch_upstream", *args],
        cwd=REPO,
        env={**os.environ, "GRADSWITCHD": daemon_binary()},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_curated_upstream_tests_pass(tmp_path):
    results = tmp_path / "results.json"
    args = [a for name in CURATED for a in ("-k", name)]
    proc = _runner(*args, "--timeout", "90", "--results", str(results), timeout=420)
    assert results.exists(), proc.stdout[-3000:] + proc.stderr[-6000:]
    rows = {r["name"]: r for r in json.loads(results.read_text())["tests"]}
    assert sorted(rows) == sorted(CURATED)
    bad = {n: f"{r['outcome']}: {r['reason']}" for n, r in rows.items() if r["outcome"] != "pass"}
    assert not bad, f"{bad}\n{proc.stderr[-6000:]}"


def _sections() -> dict[str, str]:
    """The listings of docs/torch_upstream.md by their marker (one per world size)."""
    text = LISTING.read_text()
    return dict(re.findall(r"<!-- listing:begin (\S+) -->(.*?)<!-- listing:end \1 -->", text, re.S))


def _rows(section: str) -> list[tuple[str, str, str]]:
    """(test, outcome, why) of each row of a listing."""
    pattern = r"^\| `(test_\w+)` \| (pass|fail|skip) \|.*\|(.*)\|$"
    return [(m[0], m[1], m[2].strip()) for m in re.findall(pattern, section, re.M)]


def test_stored_listing_explains_every_test_that_does_not_pass():
    sections = _sections()
    assert "ws=3" in sections, f"{LISTING} has no world-size-3 listing"
    names = set(_runner("--list", timeout=120).stdout.split())
    for key, section in sections.items():
        rows = _rows(section)
        listed = {r[0] for r in rows}
        assert listed <= names, f"{key}: listed but not in the harness: {sorted(listed - names)}"
        unexplained = [r[0] for r in rows if r[1] != "pass" and r[2] in ("", "unexplained")]
        assert not unexplained, f"{key}: tests without a why in {LISTING.name}: {unexplained}"
        counts = re.search(r"\*\*(\d+) pass, (\d+) fail, (\d+) skip\*\* of (\d+)", section)
        assert counts, f"{key}: no counts line"
        done = tuple(sum(1 for r in rows if r[1] == o) for o in ("pass", "fail", "skip"))
        assert tuple(map(int, counts.groups()[:3])) == done and int(counts[4]) == len(rows), key
    assert len(_rows(sections["ws=3"])) == len(names), "the world-size-3 listing is not a full run"
