"""Shared skip logic for the testbed tests: skip (with the reason) when network namespaces cannot be
used, unless GRADSWITCH_REQUIRE_NETNS=1, in which case fail."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("gradswitch") is None:  # not installed: use the source tree
    sys.path.insert(0, str(ROOT / "python"))


def netns_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "not root (the testbed creates network namespaces)"
    for tool in ("ip", "tc", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` not installed (apt-get install iproute2 nftables)"
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns` unavailable: {r.stderr.strip()}"
    return None


def skip_or_fail(reason: str | None, require_env: str) -> None:
    """Nothing when reason is None; else skip the test with the reason printed, or fail it when the
    environment variable require_env is 1 (CI that must run it)."""
    if reason is None:
        return
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{require_env}=1 but {reason}")
    print(f"skipping: {reason}")
    pytest.skip(reason)


def require_netns() -> None:
    skip_or_fail(netns_unavailable_reason(), "GRADSWITCH_REQUIRE_NETNS")


def unique(tag: str) -> str:
    """A testbed name no other test run on this machine uses."""
    return f"{tag}{os.getpid() % 100000}"
