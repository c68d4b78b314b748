"""A worker that proves a deployment sums right: it allreduces tensors whose sum it knows and checks every
element. The deployment examples run it (examples/slurm/, deploy/kubernetes/, deploy/container/) and
their tests count its OK lines.

    # one process per rank; the rank and world size come from torchrun, Slurm or the arguments
    GRADSWITCH_SWITCH=10.0.0.1:7700 GRADSWITCH_TENANT=train GRADSWITCH_SECRET_FILE=/run/secrets/gs \\
        python examples/allreduce_check.py --rank 0 --world-size 2 --job check
    torchrun --nproc-per-node 2 examples/allreduce_check.py --torch   # through torch.distributed
    torchrun --nproc-per-node 2 examples/allreduce_check.py --ddp     # DistributedDataParallel training

Rank r contributes (i mod 1000) + 7 r + k at element i in round k, so the sum is known exactly: every
partial sum is an integer below 2^24, exact in float32 in any order. Prints one line
"OK rank R of W: ROUNDS allreduces of N floats, every element exact" and exits 0, or says which element
was wrong and exits 1.

--ddp trains a bias-free linear layer of N weights, from zero, with DistributedDataParallel over the
"gradswitch" backend and SGD at learning rate 1: rank r's input in step k is the contribution above and
its loss the output times the world size, so its gradient is world * input, DDP's average of them is the
sum above, and after step k every weight is minus the sum of the sums so far, exactly. Prints
"OK rank R of W: ROUNDS DDP steps of N weights, every weight exact".
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def env_int(*names: str) -> int | None:
    for n in names:
        if os.environ.get(n, "") != "":
            return int(os.environ[n])
    return None


def expected(n: int, world: int, k: int) -> np.ndarray:
    base = (np.arange(n) % 1000).astype(np.float64)
    return (world * (base + k) + 7 * world * (world - 1) / 2).astype(np.float32)


def contribution(n: int, rank: int, k: int) -> np.ndarray:
    return ((np.arange(n) % 1000) + 7 * rank + k).astype(np.float32)


def check(got: np.ndarray, want: np.ndarray, rank: int, k: int) -> None:
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        print(f"FAIL rank {rank} round {k}: {bad.size} wrong elements, first [{i}] = {got[i]} != {want[i]}",
              flush=True)
        sys.exit(1)


def ok(rank: int, world: int, a) -> None:
    print(f"OK rank {rank} of {world}: {a.rounds} allreduces of {a.elements} floats, every element exact",
          flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=env_int("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"))
    p.add_argument("--world-size", type=int,
                   default=env_int("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))
    p.add_argument("--job", default=os.environ.get("GRADSWITCH_JOB") or
                   "check-" + os.environ.get("SLURM_JOB_ID", "local"))
    p.add_argument("--switch", default=os.environ.get("GRADSWITCH_SWITCH", "127.0.0.1:7700"))
    p.add_argument("--elements", type=int, default=1 << 18)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--torch", action="store_true",
                   help="allreduce through torch.distributed's 'gradswitch' backend (under torchrun)")
    p.add_argument("--ddp", action="store_true", help="train with DistributedDataParallel (under torchrun)")
    a = p.parse_args()
    if a.ddp:
        return run_ddp(a)
    if a.torch:
        return run_torch(a)
    if a.rank is None or a.world_size is None:
        p.error("no rank/world size: give --rank and --world-size (or run under torchrun or srun)")

    import gradswitch

    with gradswitch.connect(a.switch, job=a.job, rank=a.rank, world_size=a.world_size,
                            tenant=os.environ.get("GRADSWITCH_TENANT") or None) as g:
        for k in range(a.rounds):
            x = contribution(a.elements, a.rank, k)
            g.allreduce(x)
            check(x, expected(a.elements, a.world_size, k), a.rank, k)
    ok(a.rank, a.world_size, a)
    return 0


def run_torch(a) -> int:
    import torch
    import torch.distributed as dist

    import gradswitch.torch  # noqa: F401 - registers the "gradswitch" backend

    dist.init_process_group("gradswitch")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        for k in range(a.rounds):
            x = torch.from_numpy(contribution(a.elements, rank, k))
            dist.all_reduce(x)
            check(x.numpy(), expected(a.elements, world, k), rank, k)
    finally:
        dist.destroy_process_group()
    ok(rank, world, a)
    return 0


def run_ddp(a) -> int:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import gradswitch.torch  # noqa: F401 - registers the "gradswitch" backend

    dist.init_process_group("gradswitch")
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        layer = torch.nn.Linear(a.elements, 1, bias=False)
        torch.nn.init.zeros_(layer.weight)
        model = DistributedDataParallel(layer)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        want = np.zeros(a.elements, dtype=np.float64)
        for k in range(a.rounds):
            opt.zero_grad()
            x = torch.from_numpy(contribution(a.elements, rank, k)).unsqueeze(0)
            (model(x).sum() * world).backward()  # DDP divides by the world size: the gradient is the sum
            opt.step()
            want -= expected(a.elements, world, k)
            check(layer.weight.detach().numpy()[0], want.astype(np.float32), rank, k)
    finally:
        dist.destroy_process_group()
    print(f"OK rank {rank} of {world}: {a.rounds} DDP steps of {a.elements} weights, every weight exact",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
