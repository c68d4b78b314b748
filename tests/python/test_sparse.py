"""Block skipping (docs/protocol.md §9) through a real gradswitchd on loopback: sparse=True gives dense's
bits, sends only the union's blocks, and refuses bad input before anything is sent."""

from __future__ import annotations

import numpy as np
import pytest
from _ranks import in_threads

import gradswitch
from gradswitch import _sparse


def _join(sw, job: str, world: int, **kw) -> list:
    return in_threads(
        lambda r: gradswitch.connect(sw.address, job=job, rank=r, world_size=world, timeout=20, **kw), world
    )


def _block_pattern(rng, blocks: int, density: float) -> np.ndarray:
    return rng.random(blocks) < density


def _inputs(kind: str, world: int, n: int, block: int, pattern: str, dtype) -> list[np.ndarray]:
    """Each rank's tensor: values of `kind` in the blocks its pattern keeps, +0 elsewhere."""
    out = []
    blocks = -(-n // block)
    for r in range(world):
        rng = np.random.default_rng(100 * r + 7)
        if kind == "int":
            x = rng.integers(-(1 << 20), 1 << 20, n).astype(np.int32)
        elif kind == "exact":  # k * 2^e: float32 sums of a few of them are exact in any order
            x = np.ldexp(rng.integers(-1024, 1025, n).astype(np.float32), rng.integers(-4, 4, n)).astype(
                dtype
            )
        else:
            x = rng.standard_normal(n).astype(dtype)
        if pattern == "random":
            keep = _block_pattern(rng, blocks, 0.3)
        elif pattern == "disjoint":  # rank r alone holds blocks r, r + world, ...
            keep = np.arange(blocks) % world == r
        elif pattern == "zero":
            keep = np.zeros(blocks, bool)
        elif pattern == "dense":
            keep = np.ones(blocks, bool)
        else:  # "tail": only the short last block
            keep = np.arange(blocks) == blocks - 1
        x[~np.repeat(keep, block)[:n]] = 0
        out.append(x)
    return out


def _reduce_both(groups, inputs, sparse) -> tuple[list, list]:
    """Every rank's dense result and its sparse result."""

    def body(r: int):
        d = inputs[r].copy()
        groups[r].allreduce(d)
        s = inputs[r].copy()
        groups[r].allreduce(s, sparse=sparse)
        return d, s

    res = in_threads(body, len(groups))
    return [x[0] for x in res], [x[1] for x in res]


CASES = [
    ("float32", "normal", np.float32, 2),  # two contributions: a + b is the same bits in either order
    ("float32", "exact", np.float32, 3),
    ("fixed32", "normal", np.float32, 3),  # exact integer sums: any order
    ("int32", "int", np.int32, 3),
    ("float16", "exact", np.float32, 2),
    ("float64", "normal", np.float64, 2),
    ("mx8", "normal", np.float32, 2),  # the compact buffer's chunks are dense's: the same scale blocks
]


@pytest.mark.parametrize("wire,kind,dtype,world", CASES, ids=[c[0] + "-" + c[1] for c in CASES])
def test_sparse_is_dense_bitwise(start_switch, wire, kind, dtype, world):
    sw = start_switch()
    groups = _join(sw, f"sp-{wire}-{kind}", world, wire="float32" if wire == "int32" else wire)
    try:
        block = _sparse.block_elements(groups[0]._native.payload_bytes, groups[0].wire, np.dtype(dtype))
        n = 37 * block + block // 3  # not a multiple of the block
        for pattern in ("random", "disjoint", "zero", "dense", "tail"):
            for mode in (True, "auto"):
                inputs = _inputs(kind, world, n, block, pattern, dtype)
                dense, sparse = _reduce_both(groups, inputs, mode)
                for r in range(world):
                    assert sparse[r].tobytes() == dense[r].tobytes(), (pattern, mode, r)
                if pattern == "zero":
                    assert not dense[0].any()
    finally:
        for g in groups:
            g.close()


def test_sparse_sends_only_the_union(start_switch):
    """Phase 2 carries the union's blocks alone: the switch sees about union/blocks of dense's packets."""
    sw = start_switch()
    groups = _join(sw, "sp-bytes", 2)
    try:
        block = _sparse.block_elements(groups[0]._native.payload_bytes, "float32", np.dtype(np.float32))
        n = 400 * block
        inputs = _inputs("normal", 2, n, block, "disjoint", np.float32)
        for x in inputs:  # keep 10 blocks per rank: 20 of 400 in the union
            x[20 * block :] = 0

        def count(sparse):
            before = sw.stats()["pkts_in"]
            in_threads(lambda r: groups[r].allreduce(inputs[r].copy(), sparse=sparse), 2)
            return sw.stats()["pkts_in"] - before

        dense, sparse = count(False), count(True)
        # phase 1: 400 int32 counts (about 2 packets per rank); phase 2: 20 blocks, once per rank
        assert sparse < dense / 8, (sparse, dense)
    finally:
        for g in groups:
            g.close()


def test_auto_compacts_only_a_mostly_zero_union(start_switch):
    """sparse="auto" sends a union of 70% of the blocks whole (block skipping loses there on every link
    measured, BENCHMARKS.md §18) and compacts one of 30%."""
    sw = start_switch()
    groups = _join(sw, "sp-auto", 2)
    try:
        block = _sparse.block_elements(groups[0]._native.payload_bytes, "float32", np.dtype(np.float32))
        n = 200 * block

        def packets(kept: int, sparse) -> int:
            x = np.ones(n, np.float32)
            x[kept * block :] = 0
            before = sw.stats()["pkts_in"]
            in_threads(lambda r: groups[r].allreduce(x.copy(), sparse=sparse), 2)
            return (sw.stats()["pkts_in"] - before) // 2

        assert packets(140, "auto") >= 200  # every block, after phase 1's mask
        assert packets(140, True) < 150
        assert packets(60, "auto") < 70
    finally:
        for g in groups:
            g.close()


def test_sparse_refuses_before_sending(start_switch):
    sw = start_switch()
    (g,) = _join(sw, "sp-bad", 1, wire="fixed32")
    try:
        block = _sparse.block_elements(g._native.payload_bytes, "fixed32", np.dtype(np.float32))
        x = np.zeros(4 * block, np.float32)
        x[3 * block + 1] = np.nan
        before = sw.stats()["pkts_in"]
        with pytest.raises(ValueError, match="fixed32 cannot carry element"):
            g.allreduce(x, sparse=True)
        with pytest.raises(ValueError, match="sparse must be"):
            g.allreduce(x, sparse="yes")
        assert sw.stats()["pkts_in"] == before
        small = np.ones(block, np.float32)  # one block: goes densely
        g.allreduce(small, sparse=True)
        assert (small == 1).all()
    finally:
        g.close()
    (g,) = _join(sw, "sp-int", 1, wire="int32")
    try:
        with pytest.raises(ValueError, match="carries only int32"):
            g.allreduce(np.ones(100000, np.float32), sparse=True)
    finally:
        g.close()


def test_sparse_refuses_an_optimizer_job(start_switch):
    sw = start_switch()
    n = 50000
    (g,) = _join(sw, "sp-opt", 1, optimizer=dict(algo="sgd", lr=0.1), params=np.zeros(n, np.float32))
    try:
        with pytest.raises(ValueError, match="optimizer job"):
            g.allreduce(np.zeros(n, np.float32), sparse=True)
    finally:
        g.close()


def test_sparse_refuses_a_job_with_a_deadline(start_switch):
    sw = start_switch()
    (g,) = _join(sw, "sp-deadline", 1, deadline_us=20_000)
    try:
        before = sw.stats()["pkts_in"]
        with pytest.raises(ValueError, match="deadline_us"):
            g.allreduce(np.ones(100000, np.float32), sparse=True)
        assert sw.stats()["pkts_in"] == before
    finally:
        g.close()


def test_block_layout_vector():
    """The worked example of docs/protocol.md §9 (block 4, 10 elements, two ranks)."""
    a = np.array([0, 0, 0, 0, 1, 0, 0, 0, 0, 0], np.float32)
    b = np.array([0, 0, 0, 0, 0, 0, 0, 0, 0, -0.0], np.float32)
    assert _sparse.block_mask(a, 4).tolist() == [0, 1, 0]
    assert _sparse.block_mask(b, 4).tolist() == [0, 0, 1]  # -0.0 is a non-zero bit pattern
    union = (_sparse.block_mask(a, 4) + _sparse.block_mask(b, 4)) != 0
    assert _sparse.gather(a, 4, union).tolist() == [1, 0, 0, 0, 0, 0]
    out = a.copy()
    _sparse.scatter(out, 4, union, np.array([2, 0, 0, 0, 0, 5], np.float32))
    assert out.tolist() == [0, 0, 0, 0, 2, 0, 0, 0, 0, 5]
