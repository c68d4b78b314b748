"""Run by test_accelerate.py in a fresh interpreter (Accelerate's state and gradswitch.accelerate's patch
are per process): each way a run can ask Accelerate for gradswitch and not get a distributed run must
raise, and the ways that distribute must say so. One process, a world of one (LOCAL_RANK=0 as a
launcher sets it); GRADSWITCH_SWITCH from the test. Prints one line per case: name, then the outcome."""

from __future__ import annotations

import os
import sys
import tempfile

import torch.distributed as dist


def outcome(fn) -> str:
    try:
        return f"ok {fn()}"
    except Exception as e:  # noqa: BLE001 - the outcome is the test's to judge
        return f"{type(e).__name__} {str(e).splitlines()[0]}"


def reset() -> None:
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    if dist.is_initialized():
        dist.destroy_process_group()


def state(**kwargs):
    from accelerate.state import PartialState

    s = PartialState(**kwargs)
    return f"{s.distributed_type} {s.backend} {dist.get_backend() if dist.is_initialized() else None}"


def main() -> int:
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    import gradswitch.torch  # noqa: F401 - the backend alone, as a user who did not import gradswitch.accelerate

    if "--late" in sys.argv:  # the group first, Accelerate imported only afterwards
        os.environ["MASTER_PORT"] = os.environ["GRADSWITCH_TEST_PORT"]
        dist.init_process_group("gradswitch")
        print("late-loaded", "accelerate.state" in sys.modules, flush=True)
        print("late-no-cpu", outcome(state), flush=True)
        return 0
    cases = [
        ("stock-no-cpu", lambda: state(backend="gradswitch")),
        ("stock-cpu", lambda: state(cpu=True, backend="gradswitch")),
        ("stock-preinit-no-cpu", lambda: dist.init_process_group("gradswitch") or state()),
        ("stock-preinit-cpu", lambda: dist.init_process_group("gradswitch") or state(cpu=True)),
        ("patch", lambda: __import__("gradswitch.accelerate") and "patched"),
        ("no-cpu", lambda: state(backend="gradswitch")),
        ("cpu", lambda: state(cpu=True, backend="gradswitch")),
        ("preinit-no-cpu", lambda: dist.init_process_group("gradswitch") or state()),
        ("preinit-cpu", lambda: dist.init_process_group("gradswitch") or state(cpu=True)),
        ("gloo-preinit", lambda: dist.init_process_group("gloo") or state(cpu=True, backend="gradswitch")),
        ("gloo-untouched", lambda: state(cpu=True, backend="gloo")),
    ]
    if "--trainer" in sys.argv:
        from transformers import TrainingArguments

        def trainer(**kwargs):
            with tempfile.TemporaryDirectory() as out:
                args = TrainingArguments(output_dir=out, report_to="none", **kwargs)
                return f"{args.parallel_mode} {args.device} {dist.get_backend()}"

        cases += [
            ("trainer-no-cpu", lambda: trainer(ddp_backend="gradswitch")),
            ("trainer-cpu", lambda: trainer(ddp_backend="gradswitch", use_cpu=True)),
        ]
    for i, (name, fn) in enumerate(cases):
        os.environ["MASTER_PORT"] = str(int(os.environ["GRADSWITCH_TEST_PORT"]) + i)
        print(name, outcome(fn), flush=True)
        reset()
    return 0


if __name__ == "__main__":
    sys.exit(main())
