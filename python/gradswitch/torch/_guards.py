"""Checks that a framework did not start the "gradswitch" process group for a run it will not distribute.

Accelerate (and the Hugging Face Trainer through it) on a CPU machine, without cpu=True, sets its state
to DistributedType.NO and then still calls init_process_group with the backend it was given: every
process would then train alone, on its own data, with no error. The backend refuses to be started
that way (`refuse_undistributed_accelerate`, called at group creation); gradswitch.accelerate refuses
it before any group is made and lets Accelerate use the backend properly.

Some runs never call the backend at all: a gradswitch group made before Accelerate's state (the
"pre-initialised" way) on a CPU machine without cpu=True, or backend "gradswitch" asked for while a
group of another backend exists; Accelerate would set DistributedType.NO and train each process alone.
So importing gradswitch.torch gives Accelerate gradswitch.accelerate's checks, now if accelerate.state
is imported, or as soon as it is (`patch_accelerate_when_loaded`); runs of other backends are untouched.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

NOT_DISTRIBUTED = (
    "gradswitch: Accelerate set up DistributedType.NO, which trains without any distribution (each of "
    "the launched processes would train alone on its own data), for a run that asked for the gradswitch "
    "backend. On a CPU machine pass cpu=True to Accelerator (use_cpu=True to TrainingArguments), and "
    "`import gradswitch.accelerate` before it, which lets Accelerate use the gradswitch backend "
    '(docs/torch.md, "Accelerate and the Hugging Face Trainer")'
)


def refuse_undistributed_accelerate() -> None:
    """Raises RuntimeError(NOT_DISTRIBUTED) when the caller is accelerate's PartialState.__init__ with a
    state of DistributedType.NO; nothing otherwise (nor when Accelerate was never imported)."""
    if "accelerate.state" not in sys.modules:
        return
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and frame.f_globals.get("__name__") == "accelerate.state":
            kind = getattr(frame.f_locals.get("self"), "distributed_type", None)
            if getattr(kind, "value", kind) == "NO":
                raise RuntimeError(NOT_DISTRIBUTED)
            return
        frame = frame.f_back


_ACCELERATE_STATE = "accelerate.state"


def _patch_accelerate() -> None:
    importlib.import_module("gradswitch.accelerate")


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Applies gradswitch.accelerate's patch right after accelerate.state has been executed (once)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _ACCELERATE_STATE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _patch_accelerate()

        spec.loader.exec_module = exec_then_patch
        return spec


def patch_accelerate_when_loaded() -> None:
    """Gives Accelerate gradswitch.accelerate's checks, whether accelerate.state is already imported or
    is imported later (no effect on runs that ask for other backends; nothing without Accelerate)."""
    if _ACCELERATE_STATE in sys.modules:
        _patch_accelerate()
    elif importlib.util.find_spec("accelerate") is not None and not any(
        isinstance(f, _PatchAfterImport) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _PatchAfterImport())
