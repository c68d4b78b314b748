"""gradswitch: in-network gradient aggregation in software.

import gradswitch
with gradswitch.connect("127.0.0.1:7700", job="train", rank=r, world_size=n, wire="fixed32") as g:
    g.allreduce(grad)          # in place, numpy array or CPU torch tensor (float32 / int32)
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import _paths  # noqa: F401  (gradswitch._paths.switch_binary())
from ._core import GradswitchError, GradswitchTimeout, JobAborted
from ._group import WIRES, Group, Handle, connect

__all__ = [
    "GradswitchError",
    "GradswitchTimeout",
    "Group",
    "Handle",
    "JobAborted",
    "WIRES",
    "__version__",
    "connect",
]
