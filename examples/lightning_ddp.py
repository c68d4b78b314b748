"""PyTorch Lightning's DDPStrategy over the "gradswitch" process group, with sync_dist metrics.

    # Lightning starts the second process itself (its subprocess launcher):
    python examples/lightning_ddp.py --devices 2
    # torchrun starts both (Lightning sees the torchrun environment and launches nothing):
    torchrun --nproc-per-node 2 examples/lightning_ddp.py
    # Lightning spawns both (strategy "ddp_spawn", i.e. DDPStrategy(start_method="spawn")):
    python examples/lightning_ddp.py --devices 2 --launcher spawn
    # the same with gloo, for comparison; or an existing switch:
    python examples/lightning_ddp.py --devices 2 --backend gloo
    GRADSWITCH_SWITCH=10.0.0.1:7700 python examples/lightning_ddp.py --devices 2

The only gradswitch-specific lines are `import gradswitch.torch` and
`DDPStrategy(process_group_backend="gradswitch")`. Every launcher hands its workers the launching
shell's environment, so GRADSWITCH_SWITCH set there reaches them all (only rank 0 needs it: the backend
publishes rank 0's address to the others). Without it, the process that launches (or torchrun's rank
0) starts a loopback switch and exports its address before Lightning starts the workers.

A small MLP on synthetic data (made from --seed, nothing downloaded) trains on the CPU for --steps steps;
training and validation metrics are logged with sync_dist=True (mean, max and sum reductions, and an
integer count). Global rank 0 prints the synced metrics and can write them (--json) and the final
weights (--save).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from _launch import add_run_options, parser, switch_if_needed, write_report
from _synthetic import mlp, synthetic_split
from torch.utils.data import DataLoader

import gradswitch.torch  # noqa: F401 - registers the "gradswitch" backend, in every worker

try:
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import DDPStrategy
except ImportError:  # the unified package ships the same API under lightning.pytorch
    try:
        import lightning.pytorch as pl
        from lightning.pytorch.strategies import DDPStrategy
    except ImportError:
        raise SystemExit(
            "this example needs PyTorch Lightning: pip install pytorch-lightning==2.6.6"
        ) from None


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.1, seed: int = 0):
        super().__init__()
        self.net = mlp(seed)
        self.lr = lr

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, _idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.log("val_loss", loss, sync_dist=True)  # mean over ranks (ReduceOp.AVG on non-gloo backends)
        self.log("val_loss_max", loss, sync_dist=True, reduce_fx="max")
        correct = (logits.argmax(1) == y).sum()  # int64: Lightning casts it to float32 (with a warning)
        self.log("val_correct", correct, sync_dist=True, reduce_fx="sum")

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class Report(pl.Callback):
    """Global rank 0, at the end of fit (inside the worker, whichever launcher): print, --json, --save."""

    def __init__(self, json_path: str | None, save_path: str | None):
        self.json_path, self.save_path = json_path, save_path

    def on_fit_end(self, trainer, module):
        if trainer.global_rank != 0:
            return
        import torch.distributed as dist

        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        out = {
            "backend": dist.get_backend() if dist.is_initialized() else None,
            "world_size": trainer.world_size,
            "global_step": trainer.global_step,
            "metrics": metrics,
        }
        write_report(out, module.state_dict(), self.json_path, self.save_path, sort_keys=True)


def parse_args(argv=None):
    p = parser(__doc__)
    p.add_argument(
        "--launcher",
        choices=["subprocess", "spawn"],
        default="subprocess",
        help="how Lightning starts its workers when not under torchrun: its subprocess launcher (strategy "
        "'ddp', the default) or multiprocessing spawn (strategy 'ddp_spawn')",
    )
    p.add_argument(
        "--devices",
        type=int,
        default=int(os.environ.get("LOCAL_WORLD_SIZE", "2")),
        help="processes on this machine (default: torchrun's LOCAL_WORLD_SIZE, else 2)",
    )
    p.add_argument(
        "--switch", default=None, help="host:port of a running switch (default $GRADSWITCH_SWITCH)"
    )
    p.add_argument("--wire", default=None, choices=["float32", "fixed32", "float16", "bfloat16", "float64"])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps (validation every --val-every)")
    p.add_argument("--val-every", type=int, default=4, help="training batches between validations")
    add_run_options(p, 16, "global rank 0", "the synced metrics")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.wire:
        os.environ["GRADSWITCH_WIRE"] = args.wire
    torch.set_num_threads(1)
    # before Lightning launches anything, so that the workers it starts inherit GRADSWITCH_SWITCH
    # (torchrun's other ranks get it through the store)
    if args.switch:
        os.environ["GRADSWITCH_SWITCH"] = args.switch
    with switch_if_needed(args.backend):
        strategy = DDPStrategy(
            process_group_backend=args.backend,
            start_method="spawn" if args.launcher == "spawn" else "popen",
        )
        train, val = synthetic_split(args.seed)
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=args.devices,
            strategy=strategy,
            max_steps=args.steps,
            val_check_interval=args.val_every,
            limit_val_batches=2,
            num_sanity_val_steps=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            callbacks=[Report(args.json, args.save)],
        )
        trainer.fit(
            Classifier(seed=args.seed),
            DataLoader(train, batch_size=args.batch_size, shuffle=True),
            DataLoader(val, batch_size=args.batch_size),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
