"""The Hugging Face Trainer over the "gradswitch" process group (CPU), with a tiny GPT-2.

    torchrun --nproc-per-node 2 examples/hf_trainer_ddp.py
    accelerate launch --multi_gpu --num_processes 2 examples/hf_trainer_ddp.py
    # the group initialised by the script before the TrainingArguments:
    torchrun --nproc-per-node 2 examples/hf_trainer_ddp.py --way preinit
    # gloo, for comparison; an existing switch:
    torchrun --nproc-per-node 2 examples/hf_trainer_ddp.py --backend gloo
    GRADSWITCH_SWITCH=10.0.0.1:7700 torchrun --nproc-per-node 2 examples/hf_trainer_ddp.py

The gradswitch-specific lines are `import gradswitch.accelerate` (the Trainer sets up its processes
through Accelerate, which refuses backend names it does not know) and ddp_backend="gradswitch" with
use_cpu=True in the TrainingArguments. (HfArgumentParser's --ddp_backend lists the backends it knows
as choices: pass the name in code.) The switch: GRADSWITCH_SWITCH in the launching shell's environment
(only rank 0 needs it); without it, rank 0 starts a loopback switch.

The model is a GPT-2 of two layers and 32 dimensions built from its config (randomly initialised from
--seed, nothing downloaded), trained for --steps steps on synthetic token sequences (arithmetic
progressions modulo the vocabulary: learnable). The main process prints (and with --json writes) the
Trainer's logged losses and its parallel mode, and with --save writes the final weights.
"""

from __future__ import annotations

import sys
import tempfile

import torch
import torch.distributed as dist
from _launch import add_run_options, parser, switch_if_needed, write_report

try:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
except ImportError:
    raise SystemExit("this example needs transformers: pip install transformers==5.24.0") from None

import gradswitch.accelerate  # noqa: F401 - lets Accelerate (under the Trainer) use the gradswitch backend

VOCAB, LENGTH = 64, 16


class Progressions(torch.utils.data.Dataset):
    """Sequences start, start+step, ... modulo VOCAB; the model learns to continue them."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        step = torch.randint(1, 5, (n, 1), generator=g)
        self.ids = (start + step * torch.arange(LENGTH)) % VOCAB

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def parse_args(argv=None):
    ways = {
        "ddp_backend": "TrainingArguments(ddp_backend=...)",
        "preinit": "dist.init_process_group(backend) before the TrainingArguments (which then name no "
        "backend)",
    }
    p = parser(__doc__, ways)
    p.add_argument("--steps", type=int, default=6)
    add_run_options(p, 4, "the main process", "its report")
    return p.parse_args(argv)


def train(args, output_dir: str) -> dict:
    if args.way == "preinit":
        dist.init_process_group(args.backend)
    training_args = TrainingArguments(
        output_dir=output_dir,
        use_cpu=True,
        ddp_backend=args.backend if args.way == "ddp_backend" else None,
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=3e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        data_seed=args.seed,
    )
    torch.manual_seed(args.seed)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2)
    trainer = Trainer(
        model=GPT2LMHeadModel(config), args=training_args, train_dataset=Progressions(256, args.seed)
    )
    trainer.train()
    return {
        "backend": dist.get_backend(),
        "parallel_mode": str(training_args.parallel_mode),
        "world_size": training_args.world_size,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "main": trainer.is_world_process_zero(),
        "weights": trainer.model.state_dict(),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    with switch_if_needed(args.backend):
        with tempfile.TemporaryDirectory() as output_dir:
            report = train(args, output_dir)
        weights = report.pop("weights")
        if report.pop("main"):
            write_report(report, weights, args.json, args.save)
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
