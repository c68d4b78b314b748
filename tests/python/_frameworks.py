"""Helpers of the framework tests (Lightning, Accelerate, the HF Trainer): the skip-or-fail rule for a
framework package, running a launcher, and comparing two runs' weights and metrics."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

from conftest import require_or_skip

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def require_package(module: str, pin: str):
    """The module, or a skip naming the pin (a failure with GRADSWITCH_REQUIRE_TOOLS=1, as in CI)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        require_or_skip("TOOLS", f"{module} is not importable ({e}); scripts/install-deps.sh installs {pin}")


def run_launcher(cmd: list[str], env: dict[str, str], timeout: float = 240.0) -> subprocess.CompletedProcess:
    """Runs a launcher command line to its end; fails the test with its output if it fails."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **env}
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        full_env.pop(k, None)  # a launcher's own environment must not leak into another launch
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    )
    return proc


def torchrun(script: Path, args: list[str], port: int, nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        str(script),
        *args,
    ]


def assert_same_weights(ref: dict, got: dict, atol: float = 1e-6) -> None:
    """Every tensor of two state_dicts within atol (float32 sums of two ranks are in fact bitwise equal)."""
    assert ref.keys() == got.keys()
    for k in ref:
        a, b = ref[k].double(), got[k].double()
        assert a.shape == b.shape, k
        diff = (a - b).abs().max().item() if a.numel() else 0.0
        assert diff <= atol, f"{k}: max |gloo - gradswitch| = {diff}"


def assert_same_metrics(ref: dict, got: dict, rtol: float = 1e-6) -> None:
    assert ref.keys() == got.keys(), (sorted(ref), sorted(got))
    for k in ref:
        assert abs(ref[k] - got[k]) <= rtol * max(1.0, abs(ref[k])), (
            f"{k}: gloo {ref[k]}, gradswitch {got[k]}"
        )
