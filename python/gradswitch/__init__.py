"""gradswitch: in-network gradient aggregation in software.

    import gradswitch
    with gradswitch.connect("127.0.0.1:7700", job="train", rank=r, world_size=n, wire="fixed32") as g:
        g.allreduce(grad)          # in place, numpy array or CPU torch tensor (float32 / int32)

The names below are loaded on first use, so that the pure-Python parts (testbed, baselines, CLI)
import without the native module having been built.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "GradswitchError": "._core",
    "GradswitchTimeout": "._core",
    "JobAborted": "._core",
    "SwitchLost": "._core",
    "WIRES": "._group",
    "ALGORITHMS": "._group",
    "Group": "._group",
    "Handle": "._group",
    "connect": "._group",
    "ConnectOptions": "._group",
    "OPTIMIZERS": "._group",
    "decode_state": "._group",
}

__all__ = [*sorted(_LAZY), "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from ._core import GradswitchError, GradswitchTimeout, JobAborted, SwitchLost  # noqa: F401
    from ._group import (  # noqa: F401
        ALGORITHMS,
        OPTIMIZERS,
        WIRES,
        ConnectOptions,
        Group,
        Handle,
        connect,
        decode_state,
    )


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gradswitch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
