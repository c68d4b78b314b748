"""Block skipping for torch tensors (docs/protocol.md §9, docs/torch.md "Sparse gradients"): a dense
CPU tensor's zero blocks, and a sparse COO tensor's untouched rows, never cross the wire.

Both run on the caller's thread, blocking, so the two allreduces of each keep their place among the
group's queued ones on every rank.
"""

from __future__ import annotations

import numpy as np
import torch

import gradswitch

from .._sparse import union_rows

MODES = ("off", "on", "auto")
DENSE_DTYPES = (torch.float32, torch.float64, torch.int32)
_ROW_DTYPES = {torch.float32: np.float32, torch.float64: np.float64, torch.int32: np.int32}


def serves_dense(t: torch.Tensor) -> bool:
    """A tensor the dense block-skipping path takes (others go densely through the channel)."""
    return t.device.type == "cpu" and t.dtype in DENSE_DTYPES and t.is_contiguous()


def serves_rows(t: torch.Tensor) -> bool:
    """A sparse COO tensor whose sparse dimension is its first (an embedding's gradient)."""
    return (
        t.layout == torch.sparse_coo
        and t.device.type == "cpu"
        and t.sparse_dim() == 1
        and t.dtype in _ROW_DTYPES
    )


def reduce_dense(group: gradswitch.Group, t: torch.Tensor, average: bool, mode: str) -> None:
    group.allreduce(t.detach(), sparse=True if mode == "on" else "auto")
    if average:
        t.detach().div_(group.world_size)


def reduce_rows(group: gradswitch.Group, t: torch.Tensor, average: bool) -> None:
    """Sums a row-sparse COO tensor over the ranks, in place: the union of every rank's rows (an int32
    count per row, phase 1), then those rows' values densely (phase 2); t becomes coalesced."""
    own = t.detach().coalesce()
    rows = own.indices()[0].numpy()
    union = union_rows(t.size(0), rows, lambda a: group.allreduce(a))
    values = own.values()
    compact = torch.zeros((union.size, *values.shape[1:]), dtype=values.dtype)
    if union.size:
        compact[torch.from_numpy(np.searchsorted(union, rows))] = values
        group.allreduce(compact.view(-1))
        if average:
            compact.div_(group.world_size)
    index = torch.from_numpy(union).view(1, -1)
    out = torch.sparse_coo_tensor(index, compact, t.shape, is_coalesced=True, check_invariants=False)
    with torch.no_grad():
        t.copy_(out)
