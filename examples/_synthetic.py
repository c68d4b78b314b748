"""The data and model of the framework examples (lightning_ddp.py, accelerate_ddp.py): made from a seed,
nothing downloaded, the same in every process whatever the launcher."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.data import TensorDataset, random_split

FEATURES, CLASSES = 16, 4


def synthetic_split(seed: int, n: int = 512, val: int = 128):
    """(train, val) datasets of points labelled by a fixed random linear teacher: learnable in a few steps."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    teacher = torch.randn(FEATURES, CLASSES, generator=g)
    data = TensorDataset(x, (x @ teacher).argmax(1))
    return random_split(data, [n - val, val], torch.Generator().manual_seed(seed))


def mlp(seed: int, hidden: int = 32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))
