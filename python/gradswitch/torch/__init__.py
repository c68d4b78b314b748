"""PyTorch integration of gradswitch (docs/torch.md).

    import gradswitch.torch                 # registers the torch.distributed backend "gradswitch"
    dist.init_process_group("gradswitch")   # GRADSWITCH_SWITCH=host:port; allreduce SUM/AVG on the switch

- ProcessGroupGradswitch / Options: the backend (other collectives through an internal gloo group);
- GradswitchState + allreduce_hook / fixed32_hook / float16_hook / bfloat16_hook / mx8_hook: DDP comm
  hooks for users who keep gloo or nccl as their process group (error feedback on the lossy wires);
- ChunkedOverlap: uniform-chunk overlap of backward and communication (paper 001's PCCO);
- DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state: Horovod-style API;
- SwitchOptimizer: a torch.optim.Optimizer whose update runs in the switch (docs/optimizer.md).

Importing it also gives Accelerate (and the Hugging Face Trainer) gradswitch.accelerate's handling of
backend "gradswitch", now or whenever Accelerate is imported: no run that asks for gradswitch is ever
left undistributed (docs/torch.md, section 9).
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401
    import torch.distributed as _dist
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "gradswitch.torch needs PyTorch: pip install 'gradswitch[torch]' (torch==2.13.0)"
    ) from e

if not _dist.is_available():  # pragma: no cover
    raise ImportError("gradswitch.torch needs a PyTorch built with torch.distributed")

from . import _guards
from ._backend import (
    BACKEND_NAME,
    SUPPORTED_OPS,
    FutureWork,
    Options,
    ProcessGroupGradswitch,
    gradswitch_group,
    register,
)
from ._channel import SUPPORTED_DTYPES, Channel
from .hooks import (
    GradswitchState,
    allreduce_hook,
    bfloat16_hook,
    fixed32_hook,
    float16_hook,
    mx8_hook,
    state_hook,
)
from .optimizer import DistributedOptimizer, broadcast_optimizer_state, broadcast_parameters
from .overlap import ChunkedOverlap
from .switch_optimizer import SwitchOptimizer

register()
_guards.patch_accelerate_when_loaded()

__all__ = [
    "BACKEND_NAME",
    "SUPPORTED_DTYPES",
    "SUPPORTED_OPS",
    "Channel",
    "ChunkedOverlap",
    "DistributedOptimizer",
    "FutureWork",
    "GradswitchState",
    "Options",
    "ProcessGroupGradswitch",
    "SwitchOptimizer",
    "allreduce_hook",
    "bfloat16_hook",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "fixed32_hook",
    "float16_hook",
    "gradswitch_group",
    "mx8_hook",
    "register",
    "state_hook",
]
