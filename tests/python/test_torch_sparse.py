"""Block skipping through the torch backend (Options.sparse, docs/torch.md "Sparse gradients"): dense
tensors with zero blocks give the dense bits, and DDP with nn.Embedding(sparse=True) goes through the
switch and ends with gloo's weights."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from test_torch import _binary, _init, run_workers

ROWS, DIM = 20000, 16


@pytest.fixture
def switch(switch_factory):
    return switch_factory(binary=_binary(), threads=1)


def _grad_like(rank: int, n: int, block: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(n, generator=g)
    keep = torch.rand(-(-n // block), generator=g) < 0.2
    x[~keep.repeat_interleave(block)[:n]] = 0
    return x


def _dense_worker(rank, world, switch_addr):
    gst = _init(switch_addr, sparse="on")
    pg = gst.gradswitch_group()
    block = pg.group._native.payload_bytes // 4
    x = _grad_like(rank, 50 * block + 7, block)
    y, z = x.clone(), x.clone()

    def sent(t, mode, **kw):
        pg.sparse = mode
        before = pg.group.stats()["bytes_sent"]
        dist.all_reduce(t, **kw)
        return pg.group.stats()["bytes_sent"] - before

    sparse_bytes = sent(x, "on")  # block skipping
    dense_bytes = sent(y, "off")  # every element
    sent(z, "on", op=dist.ReduceOp.AVG)
    dist.destroy_process_group()
    return x, y, z, sparse_bytes, dense_bytes


def test_dense_tensors_skip_zero_blocks_bitwise(switch):
    (x0, y0, z0, sparse_bytes, dense_bytes), (x1, *_) = run_workers(_dense_worker, switch.address, world=2)
    assert torch.equal(x0.view(torch.int32), y0.view(torch.int32))
    assert torch.equal(x0, x1)
    assert torch.equal(z0, y0 / 2)
    assert sparse_bytes < dense_bytes * 0.6, (sparse_bytes, dense_bytes)  # about 36% of the blocks kept


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(ROWS, DIM, sparse=True), torch.nn.Linear(DIM, 1))


def _steps(rank: int, steps: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    return [torch.randint(0, ROWS, (64,), generator=g) for _ in range(steps)]


def _train(model, pg, rank, steps=5):
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=pg)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    for idx in _steps(rank, steps):
        opt.zero_grad()
        ddp(idx).pow(2).mean().backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _embedding_worker(rank, world, switch_addr, mode):
    gst = _init(switch_addr, sparse=mode)
    gloo = dist.new_group(backend="gloo")
    pg = gst.gradswitch_group()
    before = pg.group.stats()["allreduces"]
    ours = _train(_model(), None, rank)
    allreduces = pg.group.stats()["allreduces"] - before
    theirs = _train(_model(), gloo, rank)
    dist.destroy_process_group()
    return ours, theirs, allreduces


@pytest.mark.parametrize("mode", ["off", "on"])
def test_ddp_sparse_embedding_matches_gloo(switch, mode):
    """Today ("off") the COO gradient goes to the internal gloo group: the switch carries only the
    Linear's gradient; with "on" the embedding's union rows go through the switch too."""
    results = run_workers(_embedding_worker, switch.address, mode, world=2, timeout=120)
    for ours, theirs, _ in results:
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b), (a - b).abs().max()
    # per step: the Linear's bucket; with "on" also the embedding's row counts and its union rows
    assert results[0][2] == (5 if mode == "off" else 15), results[0][2]


def _deadline_worker(rank, world, switch_addr):
    try:
        _init(switch_addr, sparse="on", deadline_us=20_000)
    except Exception as e:  # noqa: BLE001
        return str(e)
    dist.destroy_process_group()
    return None


def test_sparse_refuses_a_deadline_at_init(switch):
    """A late rank would drop out of phase 1's union unnoticed (docs/protocol.md §9): refused before
    the group joins, on every rank."""
    for err in run_workers(_deadline_worker, switch.address, world=2, timeout=60):
        assert err and "does not apply with deadline_us" in err, err
