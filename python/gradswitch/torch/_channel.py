"""Ordered, asynchronous submission of torch tensors to one gradswitch Group.

A Channel turns `Group.allreduce_async` (numpy/CPU float32/int32, completion by `Handle.wait()`) into
what torch wants: any CPU or CUDA tensor of a supported dtype, and a `torch.futures.Future` that completes
with the reduced tensor. Everything that reaches the Group goes through one ordered path, so every rank
issues the same allreduces in the same order (the switch pairs chunks by position):

- CPU float32/float64/int32 contiguous tensors are reduced in place (no copy; a float64 tensor keeps
  double precision on the float64 wire, other wires round it to float32 chunk by chunk);
- CPU float16/bfloat16 (or non-contiguous) tensors go through a float32 (float64) staging buffer,
  uint8/int8/bool through an int32 one;
- CUDA tensors go through pinned host buffers in fixed-size pieces: the device-to-host copy of piece
  i+1 runs while piece i is on the network, and the host-to-device copy of piece i while piece i+1 is.

Completer threads wait the handles in order, one at a time, and complete the futures; callbacks chained
on a future run on the thread that completes it, as with torch's own backends. A callback may itself
issue an allreduce and wait for it (PowerSGD's hook does, from the callback of its first allreduce):
so a thread releases its turn before it completes a future, and a spare thread (started when none is
idle) takes the next handle meanwhile.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from typing import Any

import torch
from torch.futures import Future

from gradswitch import timeline as _timeline

FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
NATIVE_DTYPES = (torch.float32, torch.float64, torch.int32)
# 8-bit integers and bool travel as int32 (exact); converting the int32 sum back wraps as gloo's
# 8-bit SUM does, and a bool sum is True where any rank's is (gloo's bool SUM).
SMALL_INT_DTYPES = (torch.uint8, torch.int8, torch.bool)
SUPPORTED_DTYPES = FLOAT_DTYPES + (torch.int32,) + SMALL_INT_DTYPES
DEFAULT_CUDA_PIECE_BYTES = 4 << 20

_live_channels: weakref.WeakSet = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for ch in list(_live_channels):
        try:
            ch.close()
        except Exception:
            pass


atexit.register(_close_all_at_exit)


def dtype_error(dtype: torch.dtype) -> TypeError:
    names = ", ".join(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES)
    return TypeError(
        f"gradswitch: cannot reduce a {str(dtype).replace('torch.', '')} tensor on the switch; supported "
        f"dtypes are {names} (float16/bfloat16 are summed as float32 on the switch)"
    )


def fail_future(fut: Future, error: BaseException) -> None:
    """fut.set_exception(error) without error's traceback: that one is of a completer thread or a
    callback, and its frames (and their callers', through f_back) hold the operation's Handle and
    buffers for as long as the future is kept; torch keeps some futures to the end of the process,
    where nanobind then reports the Handles as leaked. The waiter's own traceback starts at wait()."""
    fut.set_exception(error.with_traceback(None))


def failing_in_cpp(fut: Future) -> Future:
    """fut as torch's C++ code must see it: failed when it failed. torch's Future.set_exception keeps
    the exception as the future's *value*, for Python to raise when it reads it; C++ that reads the
    value, DDP's reducer at the end of backward, takes it for the result, finds no tensor in it and
    crashed the process (SIGSEGV in parseCppCommHookResult) when a job was aborted. A then() whose
    callback raises marks its future failed in C++, so DDP raises the allreduce's error instead
    (prefixed by torch's "Got the following error when running the callback")."""
    return fut.then(_value_or_raise)


def _value_or_raise(fut: Future) -> Any:
    return fut.value()


class Channel:
    """Ordered submissions to one gradswitch.Group; see the module docstring."""

    def __init__(
        self, group: Any, *, cuda_piece_bytes: int = DEFAULT_CUDA_PIECE_BYTES, owns_group: bool = True
    ):
        self.group = group
        self.world_size = group.world_size
        self.cuda_piece_elems = max(1024, int(cuda_piece_bytes) // 4)
        self._owns_group = owns_group
        self._lock = threading.Lock()  # orders submissions to the group
        self._cv = threading.Condition()
        self._done_q: deque = deque()
        self._stage_q: deque = deque()
        self._stage_pending = 0
        self._closed = False
        self._copy_streams: dict[int, Any] = {}
        self._pinned: dict[int, list[torch.Tensor]] = {}
        self._pinned_lock = threading.Lock()
        # counters for compute/communication accounting
        self.ops = 0
        self.bytes = 0
        self.busy_s = 0.0  # union of intervals with at least one operation in flight
        self._inflight = 0
        self._busy_since = 0.0
        self._turn = threading.Lock()  # the completer that waits the next handle holds it
        self._completers: list[threading.Thread] = []
        self._in_callbacks = 0  # completers completing a future (running its callbacks)
        with self._cv:
            self._start_completer()
        self._stager: threading.Thread | None = None
        _live_channels.add(self)

    # ------------------------------------------------------------------ public
    def submit(
        self,
        tensor: torch.Tensor,
        *,
        average: bool = False,
        label: str = "torch allreduce",
        unsummed: torch.Tensor | None = None,
    ) -> Future:
        """Queues an in-place sum (or average) of `tensor` over the ranks; the future yields `tensor`.

        `label` names the operation on the timeline (GRADSWITCH_TIMELINE): "DDP bucket 3", ...
        `unsummed`: a deadline job's, for a float32 CPU tensor: a contiguous float32 CPU tensor of its
        size that receives this rank's values of the chunks whose sum lacks them (error feedback)."""
        if self._closed:
            raise RuntimeError("gradswitch: this channel (process group / hook state) was shut down")
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise dtype_error(tensor.dtype)
        if average and not tensor.is_floating_point():
            raise TypeError(
                "gradswitch: AVG needs a floating-point tensor, got "
                f"{str(tensor.dtype).replace('torch.', '')}"
            )
        if unsummed is not None and (tensor.device.type != "cpu" or tensor.dtype != torch.float32):
            raise ValueError(
                "gradswitch: unsummed values are kept for float32 CPU tensors only, got "
                f"{str(tensor.dtype).replace('torch.', '')} on {tensor.device}"
            )
        fut: Future = Future()
        if tensor.numel() == 0:
            fut.set_result(tensor)
            return fut
        if _timeline.enabled():
            self._trace(fut, tensor, average, label)
        self._begin()
        if tensor.device.type == "cuda":
            self._submit_cuda(tensor, average, fut)
        elif tensor.device.type == "cpu":
            self._submit_cpu_or_defer(tensor, average, fut, unsummed)
        else:
            self._end()
            raise ValueError(f"gradswitch: tensors on {tensor.device} are not supported (CPU or CUDA)")
        return fut

    def _trace(self, fut: Future, tensor: torch.Tensor, average: bool, label: str) -> None:
        """Puts the operation on the timeline, from its submission to its future's completion."""
        rank, begin = self.group.rank, time.monotonic_ns()
        info = {
            "bytes": tensor.numel() * tensor.element_size(),
            "dtype": str(tensor.dtype).replace("torch.", ""),
            "device": str(tensor.device),
            "average": average,
        }

        def done(f: Future) -> None:
            try:
                f.value()
                status = "ok"
            except Exception as e:  # noqa: BLE001 - recorded, raised to the waiter by torch
                status = str(e)
            end = time.monotonic_ns()
            _timeline.span(rank, "torch: collectives", label, begin, end, True, status=status, **info)

        fut.add_done_callback(done)

    def stats(self) -> dict[str, float]:
        with self._cv:
            busy = self.busy_s + (time.perf_counter() - self._busy_since if self._inflight else 0.0)
            return {"ops": self.ops, "bytes": self.bytes, "busy_s": busy}

    def close(self) -> None:
        """Waits for queued operations, stops the threads and (if owned) closes the Group. Idempotent."""
        if self._closed:
            return
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        with self._cv:
            threads = [self._stager, *self._completers]
        for t in threads:
            if t is not None and t is not threading.current_thread():
                t.join(timeout=60)
        if self._owns_group and self.group is not None:
            try:
                self.group.close()
            except Exception:
                pass
            self.group = None  # drop the native object now rather than at interpreter exit

    # ------------------------------------------------------------------ accounting
    def _begin(self) -> None:
        with self._cv:
            if self._inflight == 0:
                self._busy_since = time.perf_counter()
            self._inflight += 1
            self.ops += 1

    def _end(self) -> None:
        with self._cv:
            self._inflight -= 1
            if self._inflight == 0:
                self.busy_s += time.perf_counter() - self._busy_since

    def run_blocking(self, work: Any) -> Future:
        """Runs work(group) (block skipping: its allreduces, waited for) on the caller's thread, after
        the allreduces queued before it; a done future. Refused behind queued CUDA work, whose order
        the stager keeps and a blocking call here would break."""
        if self._closed:
            raise RuntimeError("gradswitch: this channel (process group / hook state) was shut down")
        fut: Future = Future()
        self._begin()
        try:
            with self._lock:
                if self._stage_pending:
                    raise RuntimeError(
                        "gradswitch: a sparse allreduce of a CPU tensor cannot follow queued CUDA "
                        "allreduces; wait for them first, or use Options(sparse='off')"
                    )
                work(self.group)
        finally:
            self._end()
        fut.set_result(None)
        return fut

    # ------------------------------------------------------------------ CPU
    def _submit_cpu_or_defer(
        self, tensor: torch.Tensor, average: bool, fut: Future, unsummed: torch.Tensor | None
    ) -> None:
        with self._lock:
            if self._stage_pending:  # CUDA work queued before us: keep the order through the stager
                self._stage_pending += 1
                with self._cv:
                    self._stage_q.append(("cpu", tensor, average, fut, unsummed))
                    self._cv.notify_all()
                return
            try:
                item = self._issue_cpu(tensor, average, fut, unsummed)
            except BaseException:
                self._end()
                raise
        with self._cv:
            self._done_q.append(item)
            self._cv.notify_all()

    def _issue_cpu(
        self, tensor: torch.Tensor, average: bool, fut: Future, unsummed: torch.Tensor | None = None
    ):
        """Caller holds self._lock. Returns the completer's item."""
        t = tensor.detach()
        if t.dtype in NATIVE_DTYPES and t.is_contiguous():
            buf = t
        elif t.dtype in FLOAT_DTYPES:
            staged = torch.float64 if t.dtype == torch.float64 else torch.float32
            buf = t.to(staged, memory_format=torch.contiguous_format).contiguous()
            if buf.data_ptr() == t.data_ptr():
                buf = buf.clone()
        elif t.dtype in SMALL_INT_DTYPES:
            buf = t.to(torch.int32, memory_format=torch.contiguous_format).contiguous()
        else:  # int32, not contiguous
            buf = t.contiguous()
        self.bytes += buf.numel() * buf.element_size()
        handle = self.group.allreduce_async(buf, unsummed)
        return ("cpu", tensor, average, fut, (buf, handle))

    # ------------------------------------------------------------------ CUDA
    def _copy_stream(self, device: torch.device):
        idx = device.index if device.index is not None else torch.cuda.current_device()
        s = self._copy_streams.get(idx)
        if s is None:
            s = torch.cuda.Stream(device=idx)
            self._copy_streams[idx] = s
        return s

    def _get_pinned(self, n: int) -> torch.Tensor:
        with self._pinned_lock:
            free = self._pinned.get(n)
            if free:
                return free.pop()
        return torch.empty(n, dtype=torch.float32, pin_memory=True)

    def _put_pinned(self, bufs: list[torch.Tensor]) -> None:
        with self._pinned_lock:
            for b in bufs:
                self._pinned.setdefault(b.numel(), []).append(b)

    def _submit_cuda(self, tensor: torch.Tensor, average: bool, fut: Future) -> None:
        # Work on the producer's stream: make a contiguous float32 (or int32) source, then record an
        # event the copy stream waits on.
        stream = torch.cuda.current_stream(tensor.device)
        t = tensor.detach()
        wire_dtype = torch.float32 if t.is_floating_point() else torch.int32
        src = t.reshape(-1) if (t.is_contiguous() and t.dtype == wire_dtype) else t.to(wire_dtype).reshape(-1)
        ready = torch.cuda.Event()
        ready.record(stream)
        with self._lock:
            self._stage_pending += 1
            with self._cv:
                self._stage_q.append(("cuda", tensor, average, fut, (src, ready, wire_dtype)))
                self._cv.notify_all()
            if self._stager is None:
                self._stager = threading.Thread(target=self._stage_loop, name="gradswitch-stage", daemon=True)
                self._stager.start()

    def _stage_loop(self) -> None:
        while True:
            with self._cv:
                while not self._stage_q and not self._closed:
                    self._cv.wait()
                if not self._stage_q:
                    return
                kind, tensor, average, fut, extra = self._stage_q.popleft()
            try:
                if kind == "cpu":
                    with self._lock:
                        try:
                            item = self._issue_cpu(tensor, average, fut, extra)  # extra: unsummed
                        finally:
                            self._stage_pending -= 1
                else:
                    item = self._issue_cuda(tensor, average, fut, *extra)  # decrements itself
            except BaseException as e:  # noqa: BLE001 - reported through the future
                self._end()
                fail_future(fut, e)
                continue
            with self._cv:
                self._done_q.append(item)
                self._cv.notify_all()

    def _issue_cuda(self, tensor, average, fut, src, ready, wire_dtype):
        try:
            cs = self._copy_stream(src.device)
            n = src.numel()
            step = self.cuda_piece_elems
            pieces = []
            with torch.cuda.stream(cs):
                cs.wait_event(ready)
                src.record_stream(cs)
                for off in range(0, n, step):
                    m = min(step, n - off)
                    host = self._get_pinned(m)
                    if wire_dtype == torch.int32:
                        host = host.view(torch.int32)
                    host.copy_(src[off : off + m], non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(cs)
                    pieces.append([off, m, host, ev, None])
            # Hand each piece to the network as soon as its copy landed; later copies keep running.
            for p in pieces:
                p[3].synchronize()
                with self._lock:
                    p[4] = self.group.allreduce_async(p[2])
                    self.bytes += p[1] * 4
        finally:
            with self._lock:
                self._stage_pending -= 1
        return ("cuda", tensor, average, fut, (src, pieces, cs))

    # ------------------------------------------------------------------ completion
    def _start_completer(self) -> None:
        """Caller holds self._cv."""
        t = threading.Thread(target=self._complete_loop, name="gradswitch-complete", daemon=True)
        self._completers.append(t)
        t.start()

    def _next_item(self):
        """The next operation to finish, in issue order; None once closed and drained."""
        with self._cv:
            while not self._done_q and not (self._closed and not self._stage_pending and not self._stage_q):
                self._cv.wait()
            return self._done_q.popleft() if self._done_q else None

    def _complete_loop(self) -> None:
        try:
            while self._complete_one():
                pass
        finally:
            with self._cv:
                self._completers.remove(threading.current_thread())

    def _complete_one(self) -> bool:
        """Waits the next operation (holding the turn), then completes its future (not holding it).
        False when this thread should stop: closed and drained, or enough others are idle."""
        with self._turn:
            item = self._next_item()
            if item is None:
                return False
            kind, tensor, average, fut, extra = item
            error = None
            try:
                if kind == "cpu":
                    self._finish_cpu(tensor, average, *extra)
                else:
                    self._finish_cuda(tensor, average, *extra)
            except BaseException as e:  # noqa: BLE001 - reported through the future
                error = e
            self._end()
            with self._cv:
                self._in_callbacks += 1
                if len(self._completers) - self._in_callbacks < 1 and not self._closed:
                    self._start_completer()  # it takes the next handle should a callback block
        try:
            if error is None:
                fut.set_result(tensor)
            else:
                fail_future(fut, error)
        finally:
            with self._cv:
                self._in_callbacks -= 1
                idle = len(self._completers) - self._in_callbacks
        return idle <= 2  # two idle threads are enough: one waits, one is ready for the next callback

    def _finish_cpu(self, tensor, average, buf, handle) -> None:
        handle.wait()
        staged = buf is not tensor and buf.data_ptr() != tensor.data_ptr()
        # A float16/bfloat16 average rounds the sum to the tensor's dtype first and divides there, as
        # gloo's does (dividing the float32 sum and rounding once can differ in the last bit).
        if average and not (staged and buf.dtype != tensor.dtype):
            buf.div_(self.world_size)
            average = False
        if staged:
            with torch.no_grad():
                tensor.copy_(buf.view(tensor.shape))
        if average:
            with torch.no_grad():
                tensor.div_(self.world_size)

    def _finish_cuda(self, tensor, average, src, pieces, cs) -> None:
        error = None
        with torch.cuda.stream(cs):
            for off, m, host, _ev, handle in pieces:
                if handle is None:
                    continue
                try:
                    handle.wait()
                except BaseException as e:  # noqa: BLE001
                    error = error or e
                    continue
                if average:
                    host.div_(self.world_size)
                src[off : off + m].copy_(host, non_blocking=True)
            if error is None:
                with torch.no_grad():
                    if src.data_ptr() != tensor.data_ptr():
                        tensor.copy_(src.view(tensor.shape))
            done = torch.cuda.Event()
            done.record(cs)
        done.synchronize()
        self._put_pinned([p[2].view(torch.float32) for p in pieces])
        if error is not None:
            raise error
