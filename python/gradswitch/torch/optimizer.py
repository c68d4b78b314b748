"""Horovod/BytePS-style conveniences: DistributedOptimizer, broadcast_parameters, broadcast_optimizer_state.

    dist.init_process_group("gradswitch")                      # or gloo/nccl + comm=GradswitchState(...)
    opt = gradswitch.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                                named_parameters=model.named_parameters())
    gradswitch.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    gradswitch.torch.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()   # step() waits for the averages

Gradients are averaged through the switch as they become ready during backward (ChunkedOverlap,
sync_in_backward=False); step() waits for the last chunks, writes the averages into p.grad and runs the
wrapped optimizer's step. The broadcasts use torch.distributed (with the gradswitch backend: its internal
gloo group).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from .overlap import DEFAULT_CHUNK_BYTES, ChunkedOverlap


class _DistributedOptimizer:
    """Methods mixed into a dynamic subclass of the wrapped optimizer's class."""

    def step(self, closure: Any = None) -> Any:
        if self._gs_synchronize:
            self._gs_overlap.synchronize()
        return self._gs_base.step(self, closure)

    def synchronize(self) -> None:
        """Waits for the in-flight averages and writes them into p.grad (step() does it for you)."""
        self._gs_overlap.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """Inside the block, step() does not synchronize (after an explicit synchronize(), e.g. for
        gradient clipping)."""
        self._gs_synchronize = False
        try:
            yield
        finally:
            self._gs_synchronize = True

    def no_sync(self):
        """Accumulate gradients locally inside the block."""
        return self._gs_overlap.no_sync()

    def remove_hooks(self) -> None:
        self._gs_overlap.remove()


def DistributedOptimizer(  # noqa: N802 - Horovod's name
    optimizer: torch.optim.Optimizer,
    named_parameters: Any = None,
    *,
    comm: Any = None,
    wire: str | None = None,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    backward_passes_per_step: int = 1,
    average: bool = True,
) -> torch.optim.Optimizer:
    """Wraps `optimizer` so that gradients are averaged through the switch before each step.

    The result is an instance of a subclass of the optimizer's class sharing its state (param_groups,
    state), so isinstance checks, schedulers and state_dict() keep working.
    named_parameters: (name, parameter) pairs fixing the order (e.g. model.named_parameters()); every
        rank must give the same. Default: the optimizer's parameters in param_group order.
    comm: the communication path (default: the default process group, which must be "gradswitch"; or a
        GradswitchState when the process group is gloo/nccl).
    """
    if named_parameters is not None:
        named = list(named_parameters)
        in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
        named = [(n, p) for n, p in named if id(p) in in_opt]
        names = [n for n, _ in named]
        if len(set(names)) != len(names):
            raise ValueError("gradswitch: named_parameters has duplicate names")
        missing = in_opt - {id(p) for _, p in named}
        if missing:
            raise ValueError(
                f"gradswitch: {len(missing)} optimizer parameter(s) are missing from named_parameters"
            )
    else:
        named = [
            (f"param{i}", p) for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
        ]
    base = type(optimizer)
    cls = type(
        base.__name__,
        (base,),
        {k: v for k, v in _DistributedOptimizer.__dict__.items() if not k.startswith("__") or k == "__doc__"},
    )
    obj = cls.__new__(cls)
    # Share param_groups, state and hooks with `optimizer` (a shallow copy of its attributes, minus any
    # instance-level `step` wrapper an LR scheduler may have installed on the original).
    obj.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k != "step"})
    obj._gs_base = base
    obj._gs_synchronize = True
    obj._gs_overlap = ChunkedOverlap(
        named,
        comm,
        chunk_bytes=chunk_bytes,
        wire=wire,
        average=average,
        sync_in_backward=False,
        backward_passes_per_step=backward_passes_per_step,
    )
    return obj


def _items(params: Any) -> list[tuple[str, torch.Tensor]]:
    if isinstance(params, dict):
        return sorted(params.items(), key=lambda kv: kv[0])
    if isinstance(params, torch.nn.Module):
        return sorted(params.state_dict().items(), key=lambda kv: kv[0])
    out = []
    for i, p in enumerate(params):
        out.append(p if isinstance(p, tuple) else (f"tensor{i}", p))
    return out


def broadcast_parameters(params: Any, root_rank: int = 0, process_group: Any = None) -> None:
    """Copies `root_rank`'s tensors to every rank, in place.

    params: a state_dict (as model.state_dict()), a Module, named_parameters() or a list of tensors.
    """
    works = []
    with torch.no_grad():
        for name, t in _items(params):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"gradswitch: {name} is not a tensor")
            data = t.data if t.is_contiguous() else None
            if data is None:
                raise ValueError(f"gradswitch: {name} is not contiguous")
            works.append(dist.broadcast(data, src=root_rank, group=process_group, async_op=True))
    for w in works:
        w.wait()


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, process_group: Any = None
) -> None:
    """Gives every rank `root_rank`'s optimizer state (hyper-parameters and per-parameter state)."""
    rank = dist.get_rank(process_group)
    payload = [_to_cpu(optimizer.state_dict()) if rank == root_rank else None]
    src = dist.get_global_rank(process_group, root_rank) if process_group is not None else root_rank
    dist.broadcast_object_list(payload, src=src, group=process_group)
    if rank != root_rank:
        optimizer.load_state_dict(payload[0])
