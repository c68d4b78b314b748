"""Ray Train on the switch: TorchTrainer with gradswitch.ray.TorchConfig, and with Ray's own
TorchConfig(backend="gradswitch") plus the documented worker setup hook, on a local Ray cluster (two CPU
workers); DDP's weights equal gloo's under the same trainer (docs/torch.md, "Ray Train")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import require_or_skip

HERE = Path(__file__).resolve().parent
WORKERS = 2


@pytest.fixture(scope="module")
def ray_session():
    try:
        import ray
        import ray.train.torch  # noqa: F401

        import gradswitch.ray  # noqa: F401
    except ImportError as e:
        require_or_skip("TOOLS", f"Ray Train is not installed ({e}); scripts/install-deps.sh installs it")
    # the workers import the training function by name (tests/python on their path)
    path = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(
        num_cpus=WORKERS + 1,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def _fit(tmp_path: Path, tag: str, torch_config, worker_runtime_env=None) -> list[dict]:
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
        run_config=RunConfig(
            name=tag, storage_path=str(tmp_path / "ray"), worker_runtime_env=worker_runtime_env
        ),
    )
    trainer.fit()
    return [torch.load(tmp_path / f"{tag}-{r}.pt") for r in range(WORKERS)]


def _assert_same_weights(got: list[dict], want: list[dict]) -> None:
    import torch

    for g, w in zip(got, want, strict=True):
        for name, value in w["weights"].items():
            torch.testing.assert_close(g["weights"][name], value, rtol=0, atol=1e-6, msg=name)


def _assert_on_switch(records: list[dict], switch) -> None:
    for r in records:
        assert (r["backend"], r["world_size"]) == ("gradswitch", WORKERS)
        assert r["group"].endswith("ProcessGroupGradswitch"), r["group"]
    assert switch.stats()["pkts_in"] > 0  # the gradients went through the switch


@pytest.fixture(scope="module")
def gloo_records(ray_session, tmp_path_factory):
    from ray.train.torch import TorchConfig

    return _fit(tmp_path_factory.mktemp("gloo"), "gloo", TorchConfig(backend="gloo"))


def test_gradswitch_torch_config_matches_gloo(ray_session, gloo_records, switch, tmp_path):
    import gradswitch.ray

    records = _fit(tmp_path, "gradswitch", gradswitch.ray.TorchConfig(switch=switch.address))
    _assert_on_switch(records, switch)
    _assert_same_weights(records, gloo_records)


def test_ray_torch_config_with_setup_hook_matches_gloo(ray_session, gloo_records, switch, tmp_path):
    from ray.train.torch import TorchConfig

    hook = {
        "worker_process_setup_hook": "gradswitch.ray.setup_worker",
        "env_vars": {"GRADSWITCH_SWITCH": switch.address},
    }
    records = _fit(tmp_path, "hook", TorchConfig(backend="gradswitch"), worker_runtime_env=hook)
    _assert_on_switch(records, switch)
    _assert_same_weights(records, gloo_records)


def test_gradswitch_torch_config_refuses_another_backend(ray_session):
    import gradswitch.ray

    with pytest.raises(ValueError, match="backend='gradswitch'"):
        gradswitch.ray.TorchConfig(backend="gloo")
