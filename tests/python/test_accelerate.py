"""Hugging Face Accelerate and the Trainer over the "gradswitch" backend, through gradswitch.accelerate.

- Accelerate (examples/accelerate_ddp.py, a small MLP) and the Trainer (examples/hf_trainer_ddp.py, a
  tiny GPT-2 built from its config) on two CPU processes, started by torchrun and by `accelerate
  launch`, asking for gradswitch by name (InitProcessGroupKwargs / ddp_backend) or through a process
  group the script initialised first: final weights and the losses equal gloo's (one gloo reference
  run per framework), and the switch carried the gradients.
- Never the silent single-process mode: each way of asking for gradswitch that Accelerate would not
  distribute (no cpu=True on a CPU machine, with or without gradswitch.accelerate, through the Trainer
  too; a default group of another backend) raises, in one fresh interpreter (_accelerate_cases.py).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from _frameworks import (
    EXAMPLES,
    assert_same_weights,
    require_package,
    run_launcher,
    torchrun,
)
from test_torch import _binary, _free_port

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the gradswitch.torch tests need it")

CASES = Path(__file__).with_name("_accelerate_cases.py")
SCRIPTS = {"accelerate": EXAMPLES / "accelerate_ddp.py", "trainer": EXAMPLES / "hf_trainer_ddp.py"}
WAYS = {"accelerate": "kwargs", "trainer": "ddp_backend"}  # asking by name, for each framework
STEPS = {"accelerate": 6, "trainer": 4}


@pytest.fixture(scope="module")
def accelerate():
    return require_package("accelerate", "accelerate==1.15.0")


@pytest.fixture(scope="module")
def transformers(accelerate):
    return require_package("transformers", "transformers==5.24.0")


def _accelerate_launch(script: Path, args: list[str], port: int) -> list[str]:
    exe = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
    assert exe, "accelerate is importable but its `accelerate` command is not on PATH"
    # --multi_gpu: accelerate's launcher for several processes on this machine (torchrun underneath);
    # the scripts pass cpu=True / use_cpu=True, so they run on the CPU
    common = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    return [
        exe,
        "launch",
        *common,
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port),
        str(script),
        *args,
    ]


def _launch(framework: str, launcher: str, backend: str, way: str, out: Path, env: dict) -> tuple[dict, dict]:
    args = ["--backend", backend, "--way", way, "--steps", str(STEPS[framework]), "--seed", "5"]
    args += ["--json", str(out / "r.json"), "--save", str(out / "w.pt")]
    port = _free_port()
    launch = torchrun if launcher == "torchrun" else _accelerate_launch
    # no accelerate config, cache or hub of the user's: a home of the run's own, offline
    hermetic = {"HF_HOME": str(out / "hf-home"), "HF_HUB_OFFLINE": "1"}
    run_launcher(launch(SCRIPTS[framework], args, port), {**hermetic, **env})
    report = json.loads((out / "r.json").read_text())
    assert report["backend"] == backend, report
    return report, torch.load(out / "w.pt")


@pytest.fixture(scope="module")
def gloo_runs(tmp_path_factory):
    """framework -> its gloo reference run (made once, on demand)."""
    runs: dict = {}

    def get(framework: str):
        if framework not in runs:
            out = tmp_path_factory.mktemp(f"gloo-{framework}")
            runs[framework] = _launch(framework, "torchrun", "gloo", WAYS[framework], out, {})
        return runs[framework]

    return get


def _check(framework, launcher, way, gloo_runs, switch_factory, tmp_path):
    switch = switch_factory(binary=_binary(), threads=1)
    env = {"GRADSWITCH_SWITCH": switch.address}
    report, weights = _launch(framework, launcher, "gradswitch", way, tmp_path, env)
    ref_report, ref_weights = gloo_runs(framework)
    assert len(report["losses"]) == STEPS[framework]
    assert report["losses"] == pytest.approx(ref_report["losses"], rel=1e-6, abs=1e-6)
    assert_same_weights(ref_weights, weights)
    assert switch.stats()["completed"] > 0, "no allreduce went through the switch"
    return report


@pytest.mark.parametrize("launcher, way", [("accelerate", "kwargs"), ("torchrun", "preinit")])
def test_accelerate_matches_gloo(launcher, way, accelerate, gloo_runs, switch_factory, tmp_path):
    report = _check("accelerate", launcher, way, gloo_runs, switch_factory, tmp_path)
    assert report["distributed_type"] == "DistributedType.MULTI_CPU" and report["num_processes"] == 2
    assert report["val_accuracy"] == gloo_runs("accelerate")[0]["val_accuracy"]


@pytest.mark.parametrize("launcher, way", [("torchrun", "ddp_backend"), ("accelerate", "preinit")])
def test_hf_trainer_matches_gloo(launcher, way, transformers, gloo_runs, switch_factory, tmp_path):
    report = _check("trainer", launcher, way, gloo_runs, switch_factory, tmp_path)
    assert report["parallel_mode"] == "ParallelMode.DISTRIBUTED" and report["world_size"] == 2


def test_accelerate_never_runs_undistributed(transformers, switch_factory, tmp_path):
    switch = switch_factory(binary=_binary(), threads=1)
    env = {"GRADSWITCH_SWITCH": switch.address, "GRADSWITCH_TEST_PORT": str(_free_port())}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1")
    proc = run_launcher([sys.executable, str(CASES), "--trainer"], env, timeout=180)
    got = dict(line.partition(" ")[::2] for line in proc.stdout.splitlines())
    undistributed = "RuntimeError gradswitch: Accelerate set up DistributedType.NO"
    # gradswitch.torch alone (no gradswitch.accelerate imported) gives Accelerate the same checks: on
    # main, stock-cpu was "ValueError Your assigned backend gradswitch is not available" and
    # stock-preinit-no-cpu ran undistributed with no error
    assert got["stock-no-cpu"].startswith(undistributed), got
    assert got["stock-cpu"] == "ok DistributedType.MULTI_CPU gradswitch gradswitch", got
    assert got["stock-preinit-no-cpu"].startswith(undistributed), got
    assert got["stock-preinit-cpu"] == "ok DistributedType.MULTI_CPU gradswitch gradswitch", got
    # with it
    for case in ("no-cpu", "preinit-no-cpu", "trainer-no-cpu"):
        assert got[case].startswith(undistributed), (case, got)
    assert got["cpu"] == "ok DistributedType.MULTI_CPU gradswitch gradswitch", got
    assert got["preinit-cpu"] == "ok DistributedType.MULTI_CPU gradswitch gradswitch", got
    assert got["gloo-preinit"].startswith(
        "RuntimeError gradswitch: Accelerate was asked for the gradswitch"
    ), got
    assert got["gloo-untouched"] == "ok DistributedType.MULTI_CPU gloo gloo", got
    assert got["trainer-cpu"].startswith("ok ParallelMode.DISTRIBUTED") and got["trainer-cpu"].endswith(
        " gradswitch"
    ), got


def test_a_group_made_before_accelerate_is_imported_is_never_run_undistributed(
    accelerate, switch_factory, tmp_path
):
    switch = switch_factory(binary=_binary(), threads=1)
    env = {"GRADSWITCH_SWITCH": switch.address, "GRADSWITCH_TEST_PORT": str(_free_port())}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_OFFLINE="1")
    proc = run_launcher([sys.executable, str(CASES), "--late"], env, timeout=120)
    got = dict(line.partition(" ")[::2] for line in proc.stdout.splitlines())
    assert got["late-loaded"] == "False", got
    assert got["late-no-cpu"].startswith("RuntimeError gradswitch: Accelerate set up DistributedType.NO"), got
