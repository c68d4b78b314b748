"""An MLP on sklearn's digits: one rank of a SwitchOptimizer run, or the torch.optim.Adam reference.

    python _switch_optimizer_mlp.py switch <address> <job> <rank> <world>   -> prints {"accuracy": ..}
    python _switch_optimizer_mlp.py reference                                 (same, one process)

Both see the same data in the same order: each global batch of BATCH examples is split evenly between
the ranks, and every rank's loss is the mean over its share, so the average of the ranks' gradients is
the gradient of the whole batch that the reference uses.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

EPOCHS, BATCH, LR = 12, 64, 2e-3


def data():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    rng = np.random.default_rng(0)
    idx = rng.permutation(len(x))
    tr, te = idx[:1400], idx[1400:]
    return torch.from_numpy(x[tr]), torch.from_numpy(y[tr]), torch.from_numpy(x[te]), torch.from_numpy(y[te])


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def train(opt_factory, rank=0, world=1):
    torch.set_num_threads(1)
    xtr, ytr, xte, yte = data()
    net = model()
    opt = opt_factory(net.parameters())
    g = torch.Generator().manual_seed(1)
    share = BATCH // world
    for _ in range(EPOCHS):
        perm = torch.randperm(len(xtr), generator=g)
        for b in range(len(xtr) // BATCH):
            idx = perm[b * BATCH : (b + 1) * BATCH][rank * share : (rank + 1) * share]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
            opt.step()
    with torch.no_grad():
        acc = (net(xte).argmax(1) == yte).float().mean().item() * 100
    return acc, opt


def main(argv):
    if argv[0] == "reference":
        acc, _ = train(lambda p: torch.optim.Adam(p, lr=LR))
    else:
        _, address, job, rank, world = argv
        import gradswitch.torch as gt

        rank, world = int(rank), int(world)
        acc, opt = train(
            lambda p: gt.SwitchOptimizer(
                p, algo="adam", lr=LR, switch=address, job=job, rank=rank, world_size=world
            ),
            rank,
            world,
        )
        opt.close()
    print(json.dumps({"accuracy": acc}))


if __name__ == "__main__":
    main(sys.argv[1:])
