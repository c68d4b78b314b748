"""The training function Ray Train's workers run for tests/python/test_ray_train.py (a module of its
own so that Ray's workers import it by name through PYTHONPATH), and the same training under plain DDP
on gloo, ranks as threads of the test process, as the reference.

DDP of a small MLP for a few SGD steps, each rank its own data. Under Ray each rank saves its weights,
its process group's backend name and class, and its world size to config["out"]/<tag>-<rank>.pt.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

STEPS = 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def _train(model: torch.nn.Module, rank: int) -> dict[str, torch.Tensor]:
    """STEPS of SGD on the DDP-wrapped `model`; the weights after them."""
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(24, 12, generator=gen), torch.randn(24, 3, generator=gen)
        optim.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optim.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items()}


def train_func(config: dict) -> None:
    import ray.train
    import ray.train.torch

    rank = ray.train.get_context().get_world_rank()
    weights = _train(ray.train.torch.prepare_model(_model()), rank)
    group = dist.distributed_c10d._get_default_group()
    torch.save(
        {
            "backend": dist.get_backend(),
            "group": type(group).__module__ + "." + type(group).__name__,
            "world_size": dist.get_world_size(),
            "weights": weights,
        },
        Path(config["out"]) / f"{config['tag']}-{rank}.pt",
    )


def gloo_reference(world: int) -> list[dict[str, torch.Tensor]]:
    """Each rank's weights after the same training under DDP on gloo (ranks as threads)."""
    from _ranks import in_threads

    store = dist.HashStore()
    # built here, one after the other: _model() seeds the global generator, which the rank threads
    # share, so building in the threads interleaves their draws and, under load, gives rank 0
    # weights no Ray worker starts from (CI failed on that, 1 run in ~20 on a loaded machine)
    models = [_model() for _ in range(world)]

    def rank_weights(rank: int) -> dict[str, torch.Tensor]:
        pg = dist.ProcessGroup(store, rank, world)  # DDP wants a ProcessGroup, gloo's is a backend
        pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        gloo = dist.ProcessGroupGloo(store, rank, world)
        pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
        return _train(torch.nn.parallel.DistributedDataParallel(models[rank], process_group=pg), rank)

    return in_threads(rank_weights, world)
