"""Uniform-chunk computing/communication overlap (paper 001's parameter-based overlap, PCCO).

DDP groups gradients into ~25 MB buckets and sends a bucket once every gradient in it is ready, so the
first bytes leave late and the last bucket's whole size is exposed after the backward pass. Here the
gradients are laid out in one flat buffer (in reverse registration order, the order backward produces
them) cut into fixed-size chunks; `register_post_accumulate_grad_hook` copies each parameter's gradient
into the buffer the moment it is accumulated, and every chunk whose elements are all present is handed
to the switch at once. Chunks are issued strictly in buffer order, so every rank sends the same
sequence whatever order its gradients arrive in.

    overlap = gradswitch.torch.ChunkedOverlap(model)          # default process group is gradswitch
    overlap = gradswitch.torch.ChunkedOverlap(model, comm=state, chunk_bytes=1 << 20)  # hook state
    loss.backward()   # returns once the averaged gradients are in p.grad (sync_in_backward=True)
    opt.step()
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable
from typing import Any

import torch

import gradswitch
from gradswitch import timeline

from ._backend import ProcessGroupGradswitch, gradswitch_group
from ._channel import Channel
from .hooks import GradswitchState

DEFAULT_CHUNK_BYTES = 1 << 20


def resolve_channel(comm: Any = None, wire: str | None = None) -> Channel:
    """A Channel from: None (the default process group, which must be gradswitch), a gradswitch process
    group, a GradswitchState (its `wire`, or the one given), a Channel, or a gradswitch.Group."""
    if comm is None:
        pg = gradswitch_group(None)
        if pg is None:
            raise RuntimeError(
                "gradswitch: no gradswitch process group: call dist.init_process_group('gradswitch'), "
                "or pass "
                "comm=gradswitch.torch.GradswitchState(...) when the process group is gloo or nccl"
            )
        comm = pg
    if isinstance(comm, ProcessGroupGradswitch):
        if wire is not None and wire != comm.wire:
            raise ValueError(f"gradswitch: the process group's wire is {comm.wire}, not {wire}")
        return comm.channel
    if isinstance(comm, GradswitchState):
        return comm.channel(wire)
    if isinstance(comm, Channel):
        return comm
    if isinstance(comm, gradswitch.Group):
        return Channel(comm, owns_group=False)
    raise TypeError(f"gradswitch: cannot communicate through a {type(comm).__name__}")


def _params_of(params: Any) -> list[tuple[str, torch.nn.Parameter]]:
    if isinstance(params, torch.nn.Module):
        items = list(params.named_parameters())
    else:
        items = []
        for i, p in enumerate(params if isinstance(params, Iterable) else [params]):
            items.append(p if isinstance(p, tuple) else (f"param{i}", p))
    seen: set[int] = set()
    out = []
    for name, p in items:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"gradswitch: {name} is not a tensor")
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


class ChunkedOverlap:
    """Streams gradients to the switch in fixed-size chunks as soon as they are accumulated.

    params: a Module, parameters, or (name, parameter) pairs; every rank must pass the same ones in the
        same order.
    comm: see resolve_channel (default: the default process group, which must be "gradswitch").
    chunk_bytes: size of a chunk (float32 elements x 4).
    average: divide the sums by the world size (gradient averaging, as DDP).
    sync_in_backward: at the end of backward, wait for every chunk and write the results into p.grad
        (then backward() returns with averaged gradients, as with DDP). Otherwise call synchronize().
    backward_passes_per_step: communicate only every k-th backward pass (local accumulation between).
    """

    def __init__(
        self,
        params: Any,
        comm: Any = None,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        wire: str | None = None,
        average: bool = True,
        sync_in_backward: bool = True,
        backward_passes_per_step: int = 1,
    ):
        self.channel = resolve_channel(comm, wire)
        self.world_size = self.channel.world_size
        named = _params_of(params)
        if not named:
            raise ValueError("gradswitch: no parameters that require grad")
        devices = {p.device for _, p in named}
        dtypes = {p.dtype for _, p in named}
        if len(devices) != 1:
            raise ValueError(f"gradswitch: ChunkedOverlap needs every parameter on one device, got {devices}")
        if not all(d.is_floating_point for d in dtypes):
            raise TypeError(f"gradswitch: ChunkedOverlap reduces floating-point gradients, got {dtypes}")
        self.named = list(reversed(named))  # backward produces gradients roughly in reverse order
        self.params = [p for _, p in self.named]
        self.device = next(iter(devices))
        self.average = average
        self.sync_in_backward = sync_in_backward
        self.backward_passes_per_step = max(1, int(backward_passes_per_step))
        self.chunk_elems = max(256, int(chunk_bytes) // 4)
        self._index: dict[int, int] = {}
        self._spans: list[tuple[int, int]] = []
        off = 0
        for i, p in enumerate(self.params):
            self._index[id(p)] = i
            self._spans.append((off, p.numel()))
            off += p.numel()
        self.numel = off
        self.flat = torch.zeros(off, dtype=torch.float32, device=self.device)
        self.chunks = [(s, min(s + self.chunk_elems, off)) for s in range(0, off, self.chunk_elems)]
        # chunks each parameter touches: (chunk index, elements of the parameter in it)
        self._touch: list[list[tuple[int, int]]] = []
        for start, n in self._spans:
            touch = []
            c = start // self.chunk_elems
            while c < len(self.chunks) and self.chunks[c][0] < start + n:
                lo, hi = self.chunks[c]
                touch.append((c, min(hi, start + n) - max(lo, start)))
                c += 1
            self._touch.append(touch)
        self.enabled = True
        self.wait_s = 0.0  # total time synchronize() spent waiting for chunks (exposed communication)
        self._passes = 0
        self._lock = threading.Lock()
        self._reset()
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    # ------------------------------------------------------------------ per-iteration state
    def _reset(self) -> None:
        self._ready = [False] * len(self.params)
        self._remaining = [hi - lo for lo, hi in self.chunks]
        self._next = 0
        self._futs: list[Any] = []
        self._callback_queued = False
        self._active = False

    def _communicating(self) -> bool:
        return self.enabled and (self._passes + 1) % self.backward_passes_per_step == 0

    def _on_grad(self, p: torch.Tensor) -> None:
        if not self._callback_queued:
            self._callback_queued = True
            self._backward_begin_ns = time.monotonic_ns()
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
        if not self._communicating():
            return
        i = self._index[id(p)]
        with self._lock:
            if self._ready[i] or p.grad is None:
                return
            if p.grad.is_sparse:
                raise TypeError("gradswitch: sparse gradients are not supported")
            start, n = self._spans[i]
            with torch.no_grad():
                self.flat[start : start + n].copy_(p.grad.reshape(-1))
            self._ready[i] = True
            self._active = True
            for c, k in self._touch[i]:
                self._remaining[c] -= k
            self._issue_ready()

    def _issue_ready(self) -> None:
        while self._next < len(self.chunks) and self._remaining[self._next] == 0:
            lo, hi = self.chunks[self._next]
            label = f"overlap chunk {self._next}"
            self._futs.append(self.channel.submit(self.flat[lo:hi], average=self.average, label=label))
            self._next += 1

    def _flush(self) -> None:
        """Zero-fills the gradients that did not arrive and issues every remaining chunk."""
        with self._lock:
            with torch.no_grad():
                for i, ready in enumerate(self._ready):
                    if not ready:
                        start, n = self._spans[i]
                        self.flat[start : start + n].zero_()
                        self._ready[i] = True
            self._remaining = [0] * len(self.chunks)
            self._issue_ready()

    def _on_backward_end(self) -> None:
        communicating = self._communicating()
        self._passes += 1
        self._callback_queued = False
        if not communicating:
            return
        if timeline.enabled():
            timeline.span(
                self.channel.group.rank, "torch: backward", "backward", self._backward_begin_ns,
                time.monotonic_ns(), chunks=len(self.chunks),
            )
        self._flush()
        if self.sync_in_backward:
            self.synchronize()

    # ------------------------------------------------------------------ public
    def synchronize(self) -> None:
        """Waits for every chunk and writes the reduced gradients into p.grad. No-op when idle."""
        if not self._active:
            return
        if self._next < len(self.chunks):
            self._flush()
        futs, self._futs = self._futs, []
        t0 = time.perf_counter()
        begin_ns = time.monotonic_ns()
        try:
            for f in futs:
                f.wait()
        finally:
            self.wait_s += time.perf_counter() - t0
            if timeline.enabled():
                timeline.span(
                    self.channel.group.rank, "torch: backward", "wait for the last chunks", begin_ns,
                    time.monotonic_ns(), chunks=len(futs),
                )
            active = self._active
            self._reset()
        if not active:
            return
        with torch.no_grad():
            for p, (start, n) in zip(self.params, self._spans, strict=True):
                view = self.flat[start : start + n].view(p.shape)
                if p.grad is None:
                    p.grad = view.to(p.dtype, copy=True)
                else:
                    p.grad.copy_(view)

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally inside the block (no communication)."""
        prev, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = prev

    def remove(self) -> None:
        """Unregisters the hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def stats(self) -> dict[str, float]:
        return self.channel.stats()
