"""Hugging Face Accelerate over the "gradswitch" process group (CPU).

    # torchrun or accelerate launch start the processes (--multi_gpu is accelerate's word for "several
    # processes on this machine"; with cpu=True they run on the CPU):
    torchrun --nproc-per-node 2 examples/accelerate_ddp.py
    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_ddp.py
    # the group initialised by the script before the Accelerator, instead of through Accelerate:
    torchrun --nproc-per-node 2 examples/accelerate_ddp.py --way preinit
    # gloo, for comparison; an existing switch:
    torchrun --nproc-per-node 2 examples/accelerate_ddp.py --backend gloo
    GRADSWITCH_SWITCH=10.0.0.1:7700 torchrun --nproc-per-node 2 examples/accelerate_ddp.py

The gradswitch-specific lines are `import gradswitch.accelerate` (Accelerate refuses backend names it
does not know, and on a CPU machine without cpu=True it would not distribute at all: the module makes
it accept gradswitch and makes that case an error) and the backend's name in InitProcessGroupKwargs.
The switch: GRADSWITCH_SWITCH in the launching shell's environment reaches every process (only rank 0
needs it); without it, rank 0 starts a loopback switch.

A small MLP on synthetic data trains for --steps steps; the main process prints (and with --json
writes) the distributed type, the losses averaged over the processes, and the validation accuracy
gathered from all of them, and with --save writes the final weights.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _launch import add_run_options, parser, switch_if_needed, write_report
from _synthetic import mlp, synthetic_split
from torch.utils.data import DataLoader

try:
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs
except ImportError:
    raise SystemExit("this example needs Accelerate: pip install accelerate==1.15.0") from None

import gradswitch.accelerate  # noqa: F401 - lets Accelerate use the gradswitch backend


def parse_args(argv=None):
    ways = {
        "kwargs": "InitProcessGroupKwargs(backend=...) to the Accelerator",
        "preinit": "dist.init_process_group(backend) before it",
    }
    p = parser(__doc__, ways)
    p.add_argument("--steps", type=int, default=8)
    add_run_options(p, 16, "the main process", "its report")
    return p.parse_args(argv)


def make_accelerator(args) -> Accelerator:
    if args.way == "preinit":
        dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_* from the launcher
        return Accelerator(cpu=True)
    return Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend=args.backend)])


def train(args, accelerator: Accelerator) -> dict:
    train_set, val_set = synthetic_split(args.seed)
    model = mlp(args.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed)
    shuffled = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, generator=g)
    val = DataLoader(val_set, batch_size=args.batch_size)
    model, opt, shuffled, val = accelerator.prepare(model, opt, shuffled, val)
    losses = []
    while len(losses) < args.steps:
        for x, y in shuffled:
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(accelerator.reduce(loss.detach(), "mean").item())
            if len(losses) == args.steps:
                break
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in val:
            hits = accelerator.gather_for_metrics((model(x).argmax(1) == y).long())
            correct, total = correct + int(hits.sum()), total + hits.numel()
    return {
        "backend": dist.get_backend(),
        "distributed_type": str(accelerator.distributed_type),
        "num_processes": accelerator.num_processes,
        "losses": losses,
        "val_accuracy": correct / total,
        "weights": accelerator.unwrap_model(model).state_dict(),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    with switch_if_needed(args.backend):
        accelerator = make_accelerator(args)
        report = train(args, accelerator)
        if accelerator.is_main_process:
            weights = report.pop("weights")
            write_report(report, weights, args.json, args.save)
        accelerator.wait_for_everyone()
        accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
