"""The Python face of a worker: connect(), Group and Handle over the native module."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _core

WIRES = ("float32", "fixed32", "float16", "bfloat16", "int32")
_NUMPY_DTYPES = (np.dtype(np.float32), np.dtype(np.int32))
_TORCH_DTYPES = ("torch.float32", "torch.int32")


def _is_torch_tensor(x: Any) -> bool:
    # Recognise torch.Tensor (and subclasses such as Parameter) without importing torch.
    return any(c.__name__ == "Tensor" and c.__module__.startswith("torch") for c in type(x).__mro__)


def _native_view(x: Any) -> Any:
    """Checks x and returns an object sharing its memory that the native module accepts."""
    if isinstance(x, np.ndarray):
        if x.dtype not in _NUMPY_DTYPES:
            raise TypeError(f"gradswitch: allreduce supports float32 and int32 arrays, got dtype {x.dtype}")
        if not x.flags.c_contiguous:
            raise ValueError(
                "gradswitch: allreduce works in place on a C-contiguous array; this one is not "
                "(use np.ascontiguousarray(x), reduce it, and copy the result back)"
            )
        if not x.flags.writeable:
            raise ValueError("gradswitch: allreduce works in place, but the array is read-only")
        return x
    if _is_torch_tensor(x):
        if str(x.dtype) not in _TORCH_DTYPES:
            raise TypeError(f"gradswitch: allreduce supports float32 and int32 tensors, got {x.dtype}")
        if x.device.type != "cpu":
            raise ValueError(f"gradswitch: allreduce needs a CPU tensor, got one on {x.device}")
        if not x.is_contiguous():
            raise ValueError(
                "gradswitch: allreduce works in place on a contiguous tensor; this one is not "
                "(use x.contiguous(), reduce it, and copy the result back)"
            )
        return x.detach()  # same storage; DLPack refuses tensors that require grad
    raise TypeError(
        f"gradswitch: allreduce expects a numpy.ndarray or a torch.Tensor, got {type(x).__module__}."
        f"{type(x).__qualname__}"
    )


class Handle:
    """An allreduce queued with Group.allreduce_async(); wait() returns the reduced tensor."""

    __slots__ = ("_native", "_x", "_view")

    def __init__(self, native: _core.Handle, x: Any, view: Any) -> None:
        self._native = native
        self._x = x
        self._view = view  # keeps the memory alive while the native thread writes into it

    def wait(self) -> Any:
        """Blocks until the allreduce finished; returns the tensor or raises the error."""
        self._native.wait()
        return self._x

    def done(self) -> bool:
        return self._native.done()


class Group:
    """A worker's membership in one job. Use gradswitch.connect() to make one."""

    def __init__(self, native: _core.Group, switch: str) -> None:
        self._native = native
        self._switch = switch
        self._pending: list[Handle] = []
        self._lock = threading.Lock()

    # -- properties
    @property
    def rank(self) -> int:
        return self._native.rank

    @property
    def world_size(self) -> int:
        return self._native.world_size

    @property
    def job(self) -> str:
        return self._native.job

    @property
    def wire(self) -> str:
        return self._native.wire

    @property
    def switch(self) -> str:
        return self._switch

    @property
    def closed(self) -> bool:
        return self._native.closed

    # -- operations
    def allreduce(self, x: Any) -> Any:
        """Sums x over all ranks, in place; returns x.

        x: a C-contiguous numpy array or CPU torch tensor of float32 or int32. Float tensors travel in
        the job's wire format; int32 tensors always travel as int32 (exact, wrapping).
        """
        # Queued like allreduce_async so that an interrupted wait (Ctrl-C) leaves the tensor
        # referenced until the background thread is done with it.
        return self.allreduce_async(x).wait()

    def allreduce_async(self, x: Any) -> Handle:
        """Queues an in-place allreduce of x (run in order on the group's thread); returns a Handle.

        x must not be read or written until the handle's wait() returned.
        """
        view = _native_view(x)
        with self._lock:
            h = Handle(self._native.allreduce_async(view), x, view)
            self._pending = [p for p in self._pending if not p.done()]
            self._pending.append(h)
        return h

    def stats(self) -> dict[str, int]:
        """Worker counters: packets, bytes, retransmissions, injected drops, ..."""
        return self._native.stats()

    def close(self, abort: bool = False) -> None:
        """Finishes queued allreduces, leaves the job and releases the sockets. Idempotent.

        abort=True instead cancels queued and running allreduces and drops the control connection
        without LEAVE: the switch then aborts the job, and the other ranks get JobAborted naming this
        rank rather than waiting for their timeout. Leaving a `with` block by an exception does this.
        """
        native = getattr(self, "_native", None)
        if native is None:
            return
        native.close(abort)
        with self._lock:
            self._pending.clear()

    def __enter__(self) -> Group:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(abort=exc_type is not None)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<gradswitch.Group job={self.job!r} rank={self.rank}/{self.world_size} wire={self.wire} "
            f"switch={self._switch} {state}>"
        )


def connect(
    switch: str = "127.0.0.1:7700",
    job: str = "default",
    rank: int = 0,
    world_size: int = 1,
    *,
    wire: str = "float32",
    timeout: float = 30.0,
    drop_rate: float = 0.0,
    seed: int = 0,
    token: str = "gradswitch",
    join_timeout: float = 120.0,
    connect_timeout: float = 5.0,
    shuffle_seed: int = 0,
) -> Group:
    """Joins `job` as `rank` of `world_size` at the switch `switch` ("host:port" of its control port).

    Blocks until every rank joined (at most `join_timeout` seconds). `wire` is how float32 tensors
    travel: float32, fixed32 (exact, order-independent sums), float16 or bfloat16. An allreduce fails
    with GradswitchTimeout after `timeout` seconds without progress. `drop_rate`/`seed` drop a fraction
    of this worker's outgoing data packets (loss testing); `shuffle_seed` (test hook) permutes the
    order of each window's first packets.
    """
    if wire not in WIRES:
        raise ValueError(f"gradswitch: unknown wire {wire!r}; expected one of {', '.join(WIRES)}")
    if not isinstance(switch, str):
        raise TypeError("gradswitch: switch must be a 'host:port' string")
    native = _core.Group(
        switch,
        job,
        int(rank),
        int(world_size),
        wire=wire,
        timeout=float(timeout),
        drop_rate=float(drop_rate),
        seed=int(seed),
        token=token,
        join_timeout=float(join_timeout),
        connect_timeout=float(connect_timeout),
        shuffle_seed=int(shuffle_seed),
    )
    return Group(native, switch)
