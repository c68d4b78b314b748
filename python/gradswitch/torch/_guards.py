"""Checks that a framework did not start the "gradswitch" process group for a run it will not distribute.

Accelerate (and the Hugging Face Trainer through it) on a CPU machine, without cpu=True, sets its state
to DistributedType.NO and then still calls init_process_group with the backend it was given: every
process would then train alone, on its own data, with no error. The backend refuses to be started
that way (`refuse_undistributed_accelerate`, called at group creation); gradswitch.accelerate refuses
it before any group is made and lets Accelerate use the backend properly.
"""

from __future__ import annotations

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
