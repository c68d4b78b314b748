"""The training function Ray Train's workers run for tests/python/test_ray_train.py (a module of its
own so that Ray's workers import it by name through PYTHONPATH).

DDP (ray.train.torch.prepare_model) of a small MLP for a few SGD steps, each rank its own data; each
rank saves its weights, its process group's backend name and class, and its world size to
config["out"]/<tag>-<rank>.pt.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

STEPS = 5


def train_func(config: dict) -> None:
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    model = ray.train.torch.prepare_model(model)
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(24, 12, generator=gen), torch.randn(24, 3, generator=gen)
        optim.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optim.step()
    group = dist.distributed_c10d._get_default_group()
    torch.save(
        {
            "backend": dist.get_backend(),
            "group": type(group).__module__ + "." + type(group).__name__,
            "world_size": dist.get_world_size(),
            "weights": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
        },
        Path(config["out"]) / f"{config['tag']}-{rank}.pt",
    )
