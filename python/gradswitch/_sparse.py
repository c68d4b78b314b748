"""Block skipping (docs/protocol.md §9): an allreduce whose all-zero blocks never cross the wire.

Two ordinary allreduces of the dense protocol: phase 1 sums every rank's int32 block mask (the union of
the blocks anyone holds non-zero), phase 2 sums the union's blocks gathered into one compact buffer.
A block is one packet's elements, so phase 2's chunks are dense's chunks of the union's blocks and each
element's sum is computed exactly as dense computes it (fixed32's per-chunk exponent included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

# sparse="auto" compacts when at least this share of the union's blocks is zero; below it the tensor
# goes densely in place (phase 2 then saves too few bytes to pay for gathering and scattering). Set
# from bench/sparse_bench.py's sweep (BENCHMARKS.md §18): below the crossover density of every link it
# measured, loopback's lowest of them (bytes are cheapest there, the copies cost the same), so that
# auto compacts only where block skipping won; on slower links it forgoes some of the gain above.
AUTO_MIN_ZERO_SHARE = 0.5

_WIRE_BYTES = {"float32": 4, "fixed32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4}
_MAX_CHUNK = 0xFFFF  # a chunk's count field (docs/protocol.md §2)
_FIXED32_LIMIT = 2.0**127  # fixed32 cannot carry |x| >= 2^127 (docs/protocol.md §5)


def block_elements(payload_bytes: int, wire: str, dtype: np.dtype) -> int:
    """Elements per block: one packet's payload of the wire the tensor travels on (int32 tensors: int32;
    mx8: whole blocks of 32 with their scale bytes, docs/protocol.md §2.2)."""
    if wire == "mx8" and dtype != np.int32:
        return min(payload_bytes // 33 * 32, _MAX_CHUNK)
    elem = 4 if dtype == np.int32 else _WIRE_BYTES[wire]
    return min(payload_bytes // elem, _MAX_CHUNK)


def check_mode(sparse: Any) -> str:
    """allreduce's sparse= argument as "off", "on" or "auto"."""
    if sparse is False or sparse is None:
        return "off"
    if sparse is True:
        return "on"
    if sparse == "auto":
        return "auto"
    raise ValueError(f"gradswitch: sparse must be False, True or 'auto', got {sparse!r}")


def refuse_before_sending(
    flat: np.ndarray, wire: str, optimizer: str | None, deadline_us: int | None = None
) -> None:
    """The errors the dense allreduce of phase 2 would raise, raised before phase 1 is sent, and a job
    whose rounds may close without a rank (docs/protocol.md §9)."""
    if deadline_us:
        raise ValueError(
            f"gradswitch: sparse allreduce does not apply to a job with deadline_us={deadline_us}: a rank "
            "late for phase 1 would leave its blocks out of the union unnoticed; use sparse=False"
        )
    if optimizer:
        raise ValueError(
            f"gradswitch: sparse allreduce does not apply to an optimizer job ({optimizer}): the switch "
            "updates every parameter on every step, so every block is sent; use sparse=False"
        )
    if flat.dtype == np.int32:
        return
    if wire == "int32":
        raise ValueError(
            "gradswitch: the job's wire int32 carries only int32 tensors; connect with wire='float32', "
            "'fixed32', 'float16', 'bfloat16' or 'float64' to reduce float tensors"
        )
    if wire == "fixed32":
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(flat) < _FIXED32_LIMIT)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(
                f"gradswitch: fixed32 cannot carry element {i} = {flat[i]!r} (non-finite or >= 2^127 in "
                "magnitude); nothing was sent"
            )


def block_mask(flat: np.ndarray, block: int) -> np.ndarray:
    """int32 per block: 1 where any element's bits are non-zero (NaN, inf and -0.0 count), else 0."""
    bits = flat.view({1: np.uint8, 4: np.uint32, 8: np.uint64}[flat.itemsize])
    n = bits.size
    full = n // block
    mask = np.zeros(-(-n // block), dtype=np.int32)
    if full:
        mask[:full] = bits[: full * block].reshape(full, block).any(axis=1)
    if n % block:
        mask[full] = bits[full * block :].any()
    return mask


def gather(flat: np.ndarray, block: int, union: np.ndarray) -> np.ndarray:
    """The union's blocks of flat, in block order, as one compact array (phase 2's layout)."""
    n = flat.size
    full = n // block
    idx = np.flatnonzero(union)
    head = idx[idx < full]
    parts = [flat[: full * block].reshape(full, block)[head].reshape(-1)]
    if idx.size and idx[-1] == full:  # the short last block, last in the buffer as in the tensor
        parts.append(flat[full * block :])
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def scatter(flat: np.ndarray, block: int, union: np.ndarray, compact: np.ndarray) -> None:
    """Writes the compact sums back into flat's union blocks. The other blocks stay as they are: +0 on
    every rank, which is their sum."""
    n = flat.size
    full = n // block
    idx = np.flatnonzero(union)
    head = idx[idx < full]
    flat[: full * block].reshape(full, block)[head] = compact[: head.size * block].reshape(-1, block)
    if n % block and union[full]:
        flat[full * block :] = compact[head.size * block :]


def allreduce(flat: np.ndarray, block: int, mode: str, reduce: Callable[[np.ndarray], None]) -> np.ndarray:
    """Sums flat (1-D, in place) by block skipping; reduce(a) is the group's dense in-place allreduce.

    Returns the union mask (bool per block). Every rank runs the same reduces: phase 1 always, phase 2
    unless the union is empty; "auto" runs phase 2 densely in place when the union is nearly full."""
    counts = block_mask(flat, block)
    reduce(counts)  # phase 1: int32 on every wire, exact
    union = counts != 0
    kept = int(union.sum())
    if kept == 0:
        return union  # no rank holds a non-zero bit (this one's tensor is +0 already): dense's sum
    if kept == union.size or (mode == "auto" and 1.0 - kept / union.size < AUTO_MIN_ZERO_SHARE):
        reduce(flat)  # phase 2 over the whole tensor: the identity layout
        return union
    compact = gather(flat, block, union)
    reduce(compact)
    scatter(flat, block, union, compact)
    return union


def union_rows(rows: int, indices: np.ndarray, reduce: Callable[[np.ndarray], None]) -> np.ndarray:
    """Phase 1 of a row-sparse tensor: the sorted union of every rank's touched rows (int64)."""
    counts = np.zeros(rows, dtype=np.int32)
    counts[indices] = 1
    reduce(counts)
    return np.flatnonzero(counts)
