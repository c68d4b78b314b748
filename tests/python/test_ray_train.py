"""Ray Train on the switch: TorchTrainer with gradswitch.ray.TorchConfig, and with Ray's own
TorchConfig(backend="gradswitch") plus the documented worker setup hook, on a local Ray cluster (two CPU
workers); each rank's weights equal those of the same DDP training on gloo (docs/torch.md, "Ray Train")."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import require_or_skip

HERE = Path(__file__).resolve().parent
WORKERS = 2


def _require_ray():
    try:
        import ray
        import ray.train.torch  # noqa: F401
    except ImportError as e:
        require_or_skip("TOOLS", f"Ray Train is not installed ({e}); scripts/install-deps.sh installs it")
    import gradswitch.ray  # noqa: F401 - not a reason to skip

    return ray


@pytest.fixture
def ray_train():
    """Ray Train, or a skip naming it (before the other fixtures start anything)."""
    return _require_ray()


@contextmanager
def _ray_cluster(env_vars: dict | None = None, **runtime_env):
    """A local Ray cluster for this test (the job's runtime_env is fixed at ray.init)."""
    ray = _require_ray()
    # the workers import the training function by name (tests/python on their path)
    path = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    runtime_env["env_vars"] = {"PYTHONPATH": path, **(env_vars or {})}
    ray.init(num_cpus=WORKERS + 1, include_dashboard=False, runtime_env=runtime_env, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def gloo_weights() -> list[dict]:
    from _ray_train_loop import gloo_reference

    return gloo_reference(WORKERS)


def _fit(tmp_path: Path, tag: str, torch_config) -> list[dict]:
    """One TorchTrainer run of _ray_train_loop.train_func; each rank's saved record."""
    import torch
    from _ray_train_loop import train_func
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_func,
        train_loop_config={"out": str(tmp_path), "tag": tag},
        torch_config=torch_config,
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        run_config=RunConfig(name=tag, storage_path=str(tmp_path / "ray")),
    )
    trainer.fit()
    return [torch.load(tmp_path / f"{tag}-{r}.pt") for r in range(WORKERS)]


def _assert_gloo_weights(records: list[dict], gloo_weights: list[dict]) -> None:
    import torch

    for r, want in zip(records, gloo_weights, strict=True):
        for name, value in want.items():
            torch.testing.assert_close(r["weights"][name], value, rtol=0, atol=1e-6, msg=name)


def _assert_on_switch(records: list[dict], switch) -> None:
    for r in records:
        assert (r["backend"], r["world_size"]) == ("gradswitch", WORKERS)
        assert r["group"].endswith("ProcessGroupGradswitch"), r["group"]
    assert switch.stats()["pkts_in"] > 0  # the gradients went through the switch


def test_gradswitch_torch_config_matches_gloo(ray_train, gloo_weights, switch, tmp_path):
    """gradswitch.ray.TorchConfig alone: nothing in the workers' environment knows gradswitch."""
    with _ray_cluster():
        import gradswitch.ray

        records = _fit(tmp_path, "gradswitch", gradswitch.ray.TorchConfig(switch=switch.address))
    _assert_on_switch(records, switch)
    _assert_gloo_weights(records, gloo_weights)


def test_ray_torch_config_with_setup_hook_matches_gloo(ray_train, gloo_weights, switch, tmp_path):
    """Ray's own TorchConfig(backend="gradswitch"), the job's workers set up by gradswitch's hook."""
    hook = {"worker_process_setup_hook": "gradswitch.ray.setup_worker"}
    with _ray_cluster({"GRADSWITCH_SWITCH": switch.address}, **hook):
        from ray.train.torch import TorchConfig

        records = _fit(tmp_path, "hook", TorchConfig(backend="gradswitch"))
    _assert_on_switch(records, switch)
    _assert_gloo_weights(records, gloo_weights)


def test_gradswitch_torch_config_refuses_another_backend(ray_train):
    import gradswitch.ray

    with pytest.raises(ValueError, match="backend='gradswitch'"):
        gradswitch.ray.TorchConfig(backend="gloo")
