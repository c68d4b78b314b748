"""Accelerate and the Hugging Face Trainer over the "gradswitch" backend (docs/torch.md).

    import gradswitch.accelerate    # once, before the Accelerator or the TrainingArguments
    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="gradswitch")])
    args = TrainingArguments(..., ddp_backend="gradswitch", use_cpu=True)

Accelerate picks the backend from the device (gloo or mpi on CPU, nccl on CUDA, ...) and refuses any
other name ("Your assigned backend gradswitch is not available, please use gloo"); on a CPU machine
without cpu=True it does not distribute at all (DistributedType.NO), even under a launcher. Importing
this module registers the backend (gradswitch.torch) and wraps accelerate's
PartialState._prepare_backend, so that when a run asks for gradswitch (the backend named, or the
default process group already initialised with it):
- the distributed type is the one Accelerate picks for the device with its own backend, MULTI_CPU
  (cpu=True) or MULTI_GPU (CUDA), and Accelerate initialises the gradswitch process group where it
  would have initialised gloo or nccl (with the ranks and timeout it would have passed);
- any other outcome is a RuntimeError saying what to change: DistributedType.NO (each process would
  train alone), another device type, or a default process group of another backend.
Runs that ask for another backend are untouched.
"""

from __future__ import annotations

import functools
from typing import Any

import torch.distributed as dist

import gradswitch.torch as _gst
from gradswitch.torch._guards import NOT_DISTRIBUTED

try:
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("gradswitch.accelerate needs Accelerate: pip install accelerate==1.15.0") from e

BACKEND = _gst.BACKEND_NAME
_DISTRIBUTED = (DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)


def _asks_for_gradswitch(backend: str | None) -> bool:
    return backend == BACKEND or (backend is None and dist.is_initialized() and dist.get_backend() == BACKEND)


def _wrap_prepare_backend(original: Any) -> Any:
    @functools.wraps(original)
    def prepare_backend(self, cpu: bool = False, sagemaker_dp: bool = False, backend: str | None = None):
        if not _asks_for_gradswitch(backend):
            return original(self, cpu, sagemaker_dp, backend)
        if dist.is_initialized() and dist.get_backend() != BACKEND:
            raise RuntimeError(
                f"gradswitch: Accelerate was asked for the gradswitch backend, but the default process group "
                f"is already initialised with {dist.get_backend()!r}, which Accelerate would use instead"
            )
        # Accelerate's own choice for this device and launch, with its default backend
        _, distributed_type = original(self, cpu, sagemaker_dp, None)
        if distributed_type == DistributedType.NO:
            raise RuntimeError(NOT_DISTRIBUTED)
        if distributed_type not in _DISTRIBUTED:
            raise RuntimeError(
                f"gradswitch: Accelerate chose {distributed_type} for this machine; the gradswitch backend "
                "serves CPU (cpu=True: DistributedType.MULTI_CPU) and CUDA (DistributedType.MULTI_GPU)"
            )
        return BACKEND, distributed_type

    prepare_backend.__gradswitch__ = True
    return prepare_backend


def patch() -> None:
    """Lets Accelerate accept the gradswitch backend (done by `import gradswitch.accelerate`; idempotent)."""
    if not getattr(PartialState._prepare_backend, "__gradswitch__", False):
        PartialState._prepare_backend = _wrap_prepare_backend(PartialState._prepare_backend)


patch()

__all__ = ["BACKEND", "patch"]
