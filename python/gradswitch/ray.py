"""Ray Train integration of gradswitch (docs/torch.md, "Ray Train").

    from gradswitch.ray import TorchConfig
    trainer = TorchTrainer(train_func, torch_config=TorchConfig(switch="10.0.0.1:7700"),
                           scaling_config=ScalingConfig(num_workers=2))

Ray Train calls `dist.init_process_group(backend)` in each worker process, where nothing has imported
gradswitch.torch (which registers the backend) nor told the process group where the switch is.
TorchConfig here is Ray's, with backend="gradswitch", whose backend first runs setup_worker() in every
worker: the switch settings become the worker's GRADSWITCH_* environment (read by the process group)
and the backend is registered. Ray's own TorchConfig(backend="gradswitch") works too when every worker
process runs setup_worker at start: ray.init(runtime_env={"worker_process_setup_hook":
"gradswitch.ray.setup_worker", "env_vars": {"GRADSWITCH_SWITCH": "10.0.0.1:7700"}}).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

try:
    from ray.train.torch import TorchConfig as _RayTorchConfig
    from ray.train.torch.config import _TorchBackend
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("gradswitch.ray needs Ray Train: pip install 'ray[train]==2.60.0'") from e

# TorchConfig field -> the environment variable gradswitch.torch.ProcessGroupGradswitch reads it from
_ENV = {
    "switch": "GRADSWITCH_SWITCH",
    "wire": "GRADSWITCH_WIRE",
    "algorithm": "GRADSWITCH_ALGORITHM",
    "op_timeout_s": "GRADSWITCH_TIMEOUT",
    "tenant": "GRADSWITCH_TENANT",
    "secret_file": "GRADSWITCH_SECRET_FILE",
}


def setup_worker(env: dict[str, str] | None = None) -> None:
    """Sets `env` in this process and registers the torch.distributed backend "gradswitch".

    Run in each Ray worker by TorchConfig's backend; also usable as Ray's worker_process_setup_hook."""
    os.environ.update(env or {})
    import gradswitch.torch  # noqa: F401 - registers the backend


@dataclass
class TorchConfig(_RayTorchConfig):
    """ray.train.torch.TorchConfig for the "gradswitch" backend.

    switch: "host:port" of the switch's control port, as every worker reaches it (default: the
        driver's $GRADSWITCH_SWITCH when this config is made; else each worker's own, which rank 0
        publishes to the others).
    wire, algorithm, op_timeout_s, tenant, secret_file: gradswitch.torch.Options' wire, algorithm,
        timeout, tenant and secret_file (default: the driver's GRADSWITCH_* variables, as switch).
    backend, init_method, timeout_s: Ray's (timeout_s is the process group's store timeout).
    """

    backend: str | None = "gradswitch"
    switch: str | None = None
    wire: str | None = None
    algorithm: str | None = None
    op_timeout_s: float | None = None
    tenant: str | None = None
    secret_file: str | None = None

    def __post_init__(self) -> None:
        if self.backend != "gradswitch":
            raise ValueError(
                f"gradswitch.ray.TorchConfig is for backend='gradswitch', got {self.backend!r} "
                "(use ray.train.torch.TorchConfig for other backends)"
            )
        for name, variable in _ENV.items():
            if getattr(self, name) is None and os.environ.get(variable):
                setattr(self, name, os.environ[variable])

    def worker_env(self) -> dict[str, str]:
        """The GRADSWITCH_* variables each worker gets (the fields that are set)."""
        return {
            var: str(getattr(self, name)) for name, var in _ENV.items() if getattr(self, name) is not None
        }

    @property
    def backend_cls(self):
        return _GradswitchBackend

    def to_dict(self) -> dict:
        return {**super().to_dict(), **{name: getattr(self, name) for name in _ENV}}


class _GradswitchBackend(_TorchBackend):
    """Ray's torch backend, with gradswitch set up in every worker before its init_process_group."""

    def on_start(self, worker_group, backend_config: TorchConfig):
        worker_group.execute(setup_worker, env=backend_config.worker_env())
        super().on_start(worker_group, backend_config)
