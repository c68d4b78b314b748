"""torch's own DDP communication hooks on a gradswitch process group, CPU, against gloo.

`work.get_future()` of the backend's allreduce, and DDP with torch's default allreduce hook,
fp16_compress_hook, bf16_compress_hook, PowerSGD's hook and a user hook built on
`dist.all_reduce(..., async_op=True).get_future()`: in each rank one DDP model on the gradswitch default
group and one on a gloo group, same data; the weights after a few steps must agree within 1e-6.
World size 2, one worker pair for every case (tests/python/test_torch.py's run_workers).
"""

from __future__ import annotations

import pytest
from test_torch import _binary, _init, run_workers

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the gradswitch.torch tests need it")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")

HOOKS = ("none", "allreduce", "fp16_compress", "bf16_compress", "powerSGD", "user_get_future")
STEPS = 4


@pytest.fixture
def switch(switch_factory):
    return switch_factory(binary=_binary(), threads=1)


def _user_hook(pg, bucket):
    """A user hook as torch's tutorial writes one: an async allreduce's future, then a division."""
    size = dist.get_world_size(pg)
    fut = dist.all_reduce(bucket.buffer(), group=pg, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0].div_(size))


def _bf16_hook(pg, bucket):
    """torch's bf16_compress_hook under another name: DDP refuses the hook by its name on builds
    without CUDA 11 and NCCL 2.10 (whatever the process group: gloo too), though it runs on CPU."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    return default_hooks.bf16_compress_hook(pg, bucket)


def _register(model, name: str, pg) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "none":
        return
    if name == "powerSGD":
        state = powerSGD_hook.PowerSGDState(
            process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2, random_seed=0
        )
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return
    hook = {
        "allreduce": default_hooks.allreduce_hook,
        "fp16_compress": default_hooks.fp16_compress_hook,
        "bf16_compress": _bf16_hook,
        "user_get_future": _user_hook,
    }[name]
    model.register_comm_hook(pg, hook)


def _train(hook: str, pg, rank: int) -> list:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = DDP(net, process_group=pg, bucket_cap_mb=0.001)  # several buckets
    _register(model, hook, pg)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def _worker(rank, world, switch_addr):
    _init(switch_addr)
    gs = dist.group.WORLD
    gloo = dist.new_group(backend="gloo")
    out = {}
    # get_future of the process group's own Work (what the upstream test_get_future checks)
    t = torch.full((5,), float(rank + 1))
    fut = gs.allreduce([t]).get_future()
    out["get_future"] = (fut.then(lambda f: [x * 3 for x in f.wait()]).wait()[0], type(fut).__name__)
    for hook in HOOKS:
        out[hook] = (_train(hook, gs, rank), _train(hook, gloo, rank))
    dist.destroy_process_group()
    return out


def test_ddp_comm_hooks_on_the_gradswitch_group_match_gloo(switch):
    results = run_workers(_worker, switch.address, timeout=150.0)
    for rank, out in enumerate(results):
        value, kind = out["get_future"]
        assert kind == "Future", f"rank {rank}: get_future() returned a {kind}"
        assert torch.equal(value, torch.full((5,), 9.0)), f"rank {rank}: {value}"
        for hook in HOOKS:
            mine, gloo = out[hook]
            for a, b in zip(mine, gloo, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=f"rank {rank}, hook {hook}")
    for hook in HOOKS:  # DDP kept the ranks in step
        for a, b in zip(results[0][hook][0], results[1][hook][0], strict=True):
            assert torch.equal(a, b), f"hook {hook}: ranks differ"
