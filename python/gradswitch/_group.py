"""The Python face of a worker: connect(), Group and Handle over the native module."""

from __future__ import annotations

import math
import os
import struct
import threading
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from . import _core, _sparse
from .control import credentials

WIRES = ("float32", "fixed32", "float16", "bfloat16", "float64", "mx8", "int32")
ALGORITHMS = ("switch", "ring", "auto")
_NUMPY_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32))
_TORCH_DTYPES = ("torch.float32", "torch.float64", "torch.int32")

# ---------------------------------------------------------------------------------------------
# Optimization in the switch (docs/optimizer.md): the optimizer= dict of connect().

OPTIMIZERS = ("sgd", "adagrad", "adam", "adamw", "smorms3")
_COMMON_KEYS = ("lr", "weight_decay", "average")
_ALGO_KEYS = {
    "sgd": ("momentum", "dampening", "nesterov"),
    "adagrad": ("eps", "eps_mode", "lr_decay", "initial_accumulator"),
    "adam": ("beta1", "beta2", "eps", "eps_mode"),
    "adamw": ("beta1", "beta2", "eps", "eps_mode"),
    "smorms3": ("eps",),
}
_ALIASES = {"initial_accumulator_value": "initial_accumulator"}  # torch.optim.Adagrad's name
_BOOL_KEYS = ("average", "nesterov")
_STATE_MAGIC = b"GSOPTST1"
_STATE_ARRAYS = {
    "sgd": ("momentum_buffer",),
    "adagrad": ("sum",),
    "adam": ("exp_avg", "exp_avg_sq"),
    "adamw": ("exp_avg", "exp_avg_sq"),
    "smorms3": ("s", "m", "v"),
}


def format_float32(x: float) -> str:
    """The shortest decimal that reads back as exactly float32(x): how hyperparameters travel."""
    f = np.float32(x)
    text = str(f)
    if np.float32(text) != f:  # pragma: no cover - numpy's str is the shortest round trip
        text = repr(float(f))
    return text


def _float32_arg(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"gradswitch: optimizer {key!r} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"gradswitch: optimizer {key!r} must be finite, got {value!r}")
    with np.errstate(over="ignore", under="ignore"):
        f = np.float32(v)
    if not np.isfinite(f) or (v != 0.0 and f == 0.0):
        raise ValueError(
            f"gradswitch: optimizer {key!r} = {value!r} is outside the float32 range the switch computes in"
        )
    return float(f)


def optimizer_keys(optimizer: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """Checks connect()'s optimizer= dict; returns (algo, [(JOIN key, value text), ...]).

    Keys: algo (sgd, adagrad, adam, adamw, smorms3) and lr (required); weight_decay, average (all);
    momentum, dampening, nesterov (sgd); betas=(b1, b2) or beta1, beta2 (adam, adamw); eps (all but
    sgd); eps_mode "paper"/"torch" (adagrad, adam, adamw); lr_decay, initial_accumulator (adagrad).
    """
    if not isinstance(optimizer, dict):
        raise TypeError(
            f"gradswitch: optimizer= must be a dict such as dict(algo='adam', lr=1e-3), got {optimizer!r}"
        )
    opts = dict(optimizer)
    algo = opts.pop("algo", None)
    if algo not in OPTIMIZERS:
        raise ValueError(f"gradswitch: optimizer 'algo' must be one of {', '.join(OPTIMIZERS)}, got {algo!r}")
    for old, new in _ALIASES.items():
        if old in opts:
            if new in opts:
                raise ValueError(f"gradswitch: optimizer has both {old!r} and {new!r}")
            opts[new] = opts.pop(old)
    if "betas" in opts:
        if "beta1" in opts or "beta2" in opts:
            raise ValueError("gradswitch: optimizer has both 'betas' and 'beta1'/'beta2'")
        betas = opts.pop("betas")
        if algo not in ("adam", "adamw"):
            raise ValueError(f"gradswitch: optimizer key 'betas' does not apply to {algo}")
        try:
            opts["beta1"], opts["beta2"] = betas
        except (TypeError, ValueError):
            raise ValueError(
                f"gradswitch: optimizer 'betas' must be a pair (beta1, beta2), got {betas!r}"
            ) from None
    allowed = _COMMON_KEYS + _ALGO_KEYS[algo]
    unknown = [k for k in opts if k not in allowed]
    if unknown:
        raise ValueError(
            f"gradswitch: optimizer key(s) {', '.join(map(repr, unknown))} do not apply to {algo}; "
            f"{algo} takes {', '.join(allowed)}"
        )
    if "lr" not in opts:
        raise ValueError(f"gradswitch: optimizer {algo} needs 'lr'")
    out: list[tuple[str, str]] = []
    vals: dict[str, Any] = {}
    for key in allowed:  # a fixed order: every rank sends the same line
        if key not in opts:
            continue
        value = opts[key]
        if key in _BOOL_KEYS:
            if value not in (True, False, 0, 1):
                raise ValueError(f"gradswitch: optimizer {key!r} must be True/False, got {value!r}")
            vals[key] = bool(value)
            out.append((key, "1" if value else "0"))
        elif key == "eps_mode":
            if value not in ("paper", "torch"):
                raise ValueError(
                    f"gradswitch: optimizer 'eps_mode' must be 'paper' or 'torch', got {value!r}"
                )
            vals[key] = value
            out.append((key, value))
        else:
            v = _float32_arg(key, value)
            if key in ("beta1", "beta2"):
                if not 0.0 <= v < 1.0:
                    raise ValueError(f"gradswitch: optimizer {key!r} must be in [0, 1), got {value!r}")
            elif key == "eps" and algo == "smorms3":
                if not v > 0.0:
                    raise ValueError(f"gradswitch: optimizer 'eps' of smorms3 must be > 0, got {value!r}")
            elif key != "dampening" and v < 0.0:
                raise ValueError(f"gradswitch: optimizer {key!r} must be >= 0, got {value!r}")
            vals[key] = v
            out.append((key, format_float32(v)))
    if vals.get("nesterov") and (vals.get("momentum", 0.0) <= 0.0 or vals.get("dampening", 0.0) != 0.0):
        raise ValueError(
            "gradswitch: nesterov=True needs momentum > 0 and dampening = 0 (as torch.optim.SGD)"
        )
    return algo, out


def decode_state(blob: bytes) -> dict[str, Any]:
    """Unpacks a checkpoint blob from Group.state_get() (docs/protocol.md §1.3).

    Returns dict(algo, lr, chunk, params (float32 array), state {name: float32 array}, steps (uint32
    per chunk)). The arrays are read-only views of `blob`.
    """
    if len(blob) < 32 or bytes(blob[:8]) != _STATE_MAGIC:
        raise ValueError("gradswitch: not a gradswitch optimizer checkpoint (magic GSOPTST1 missing)")
    algo_id, arrays, _, chunk, n, chunks, lr = struct.unpack_from("<BBHIQIf", blob, 8)
    if algo_id >= len(OPTIMIZERS) or len(blob) != 32 + 4 * arrays * n + 4 * chunks:
        raise ValueError("gradswitch: malformed optimizer checkpoint (header and size disagree)")
    algo = OPTIMIZERS[algo_id]
    a = np.frombuffer(blob, "<f4", count=arrays * n, offset=32).reshape(arrays, n)
    names = _STATE_ARRAYS[algo]
    return {
        "algo": algo,
        "lr": float(lr),
        "chunk": chunk,
        "params": a[0],
        "state": {name: a[1 + i] for i, name in enumerate(names[: arrays - 1])},
        "steps": np.frombuffer(blob, "<u4", count=chunks, offset=32 + 4 * arrays * n),
    }


def _is_torch_tensor(x: Any) -> bool:
    # Recognise torch.Tensor (and subclasses such as Parameter) without importing torch.
    return any(c.__name__ == "Tensor" and c.__module__.startswith("torch") for c in type(x).__mro__)


def _why_not(dtype: str) -> str:
    """Why a dtype that the torch backend takes is refused here (the two APIs differ only there)."""
    if dtype in ("float16", "bfloat16"):
        return (
            f". Group.allreduce reduces the array's own memory in place, and the worker reads float32, "
            f"float64 or int32 memory: convert with x.astype(np.float32) / x.float() and back (the torch "
            f"process group does that copy for {dtype} tensors, and the float16/bfloat16 wires halve the "
            f"bytes on the network whatever the tensor's dtype)"
        )
    if dtype == "int64":
        return (
            ". int64 has no wire type (the switch sums int32 exactly); the torch process group runs int64 "
            "SUM through its internal gloo group"
        )
    return ""


def _native_view(x: Any) -> Any:
    """Checks x and returns an object sharing its memory that the native module accepts."""
    if isinstance(x, np.ndarray):
        if x.dtype not in _NUMPY_DTYPES:
            raise TypeError(
                "gradswitch: allreduce supports float32, float64 and int32 arrays, got dtype "
                f"{x.dtype}{_why_not(str(x.dtype))}"
            )
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
            raise TypeError(
                "gradswitch: allreduce supports float32, float64 and int32 tensors, got "
                f"{x.dtype}{_why_not(str(x.dtype).replace('torch.', ''))}"
            )
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

    __slots__ = ("_native", "_x", "_view", "_unsummed")

    def __init__(self, native: _core.Handle, x: Any, view: Any, unsummed: Any = None) -> None:
        self._native = native
        self._x = x
        self._view = view  # keeps the memory alive while the native thread writes into it
        self._unsummed = unsummed

    def wait(self) -> Any:
        """Blocks until the allreduce finished; returns the tensor or raises the error."""
        self._native.wait()
        return self._x

    def done(self) -> bool:
        return self._native.done()

    def missed(self) -> int:
        """Once finished: the contributions its rounds lacked, summed over its chunks (bounded-time
        rounds, connect(deadline_us=...); 0 without a deadline or when every rank made it)."""
        return self._native.missed()


class Group:
    """A worker's membership in one job. Use gradswitch.connect() to make one."""

    def __init__(self, native: _core.Group, switch: str | None, deadline_us: int | None = None) -> None:
        self._native = native
        self._switch = switch
        self._deadline_us = deadline_us
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
    def switch(self) -> str | None:
        return self._switch

    @property
    def algorithm(self) -> str:
        """Where allreduces run now: "switch" or "ring" (after a fallback, "ring")."""
        return self._native.algorithm

    @property
    def closed(self) -> bool:
        return self._native.closed

    @property
    def optimizer(self) -> str | None:
        """The switch's optimizer algorithm, or None for a plain allreduce job."""
        return self._native.optimizer or None

    @property
    def params(self) -> int:
        """Optimizer job: the number of fp32 parameters (every allreduce's length); else 0."""
        return self._native.params

    @property
    def state_bytes(self) -> int:
        """Optimizer job: the size of the state_get() checkpoint; else 0."""
        return self._native.state_bytes

    # -- operations
    def allreduce(self, x: Any, sparse: bool | str = False) -> Any:
        """Sums x over all ranks, in place; returns x.

        sparse=True skips the blocks (a packet's elements) that are zero on every rank: one small int32
        allreduce of the ranks' block masks, then one of the union's blocks only (docs/protocol.md §9;
        the same sums as dense). sparse="auto" sends the union's blocks compacted when at least
        AUTO_MIN_ZERO_SHARE of them are zero, else the whole tensor. Every rank must pass the same value.
        A tensor of at most one block goes densely. Not for optimizer jobs (ValueError).

        x: a C-contiguous numpy array or CPU torch tensor of float32, float64 or int32. Float tensors
        travel in the job's wire format (a float64 tensor on a 32- or 16-bit float wire is rounded to
        float32 first: use wire="float64" for double-precision sums); int32 tensors always travel as
        int32 (exact, wrapping).

        After a failed allreduce (JobAborted, SwitchLost, GradswitchTimeout, a cancel) x is partly
        written: the elements whose rounds completed before the failure hold the sum (of an optimizer
        job: the updated parameters), the others still hold this rank's input, and which are which
        differs between ranks. Treat x as undefined: recompute it, or restore it from a copy.
        """
        mode = _sparse.check_mode(sparse)
        if mode != "off":
            return self._allreduce_sparse(x, mode)
        # Queued like allreduce_async so that an interrupted wait (Ctrl-C) leaves the tensor
        # referenced until the background thread is done with it.
        return self.allreduce_async(x).wait()

    def _allreduce_sparse(self, x: Any, mode: str) -> Any:
        view = _native_view(x)
        flat = (view.numpy() if _is_torch_tensor(view) else view).reshape(-1)
        block = _sparse.block_elements(self._native.payload_bytes, self.wire, flat.dtype)
        _sparse.refuse_before_sending(flat, self.wire, self.optimizer, self._deadline_us)
        if flat.size <= block:  # one packet at most: nothing to skip
            return self.allreduce_async(x).wait()
        _sparse.allreduce(flat, block, mode, lambda a: self.allreduce_async(a).wait())
        return x

    def allreduce_async(self, x: Any, unsummed: Any = None) -> Handle:
        """Queues an in-place allreduce of x (run in order on the group's thread); returns a Handle.

        x must not be read or written until the handle's wait() returned. When wait() raises, x is
        undefined (partly sums, partly this rank's input: see allreduce()).

        unsummed: with connect(deadline_us=...), a float32 array or CPU tensor of x's size (x float32):
        for every chunk whose sum lacks this rank's contribution (conceded, or closed at its deadline
        without it), this rank's values of the chunk are copied into it at the same offsets, less the
        estimate of them that a rescaled sum holds (rescale=True: the sum / world_size); its other
        elements are left as they are. Adding it to the next step's input delays a contribution
        instead of losing it (gradswitch.torch's error_feedback does). Not read or written by the
        caller until wait() returned.
        """
        view = _native_view(x)
        uview = None
        if unsummed is not None:
            if not self._deadline_us:
                raise ValueError(
                    "gradswitch: unsummed= needs connect(deadline_us=...): only a job with bounded-time "
                    "rounds sums without a rank's contribution"
                )
            uview = _native_view(unsummed)
        with self._lock:
            native = self._native.allreduce_async(view, uview)
            h = Handle(native, x, view, uview)
            self._pending = [p for p in self._pending if not p.done()]
            self._pending.append(h)
        return h

    # -- optimizer jobs (connect(optimizer=...)); each runs in order with the queued allreduces
    def upload_params(self, params: Any) -> None:
        """Rank 0, before the first allreduce: the switch's initial parameters (float32, `params` long).

        connect(params=array) does this for you.
        """
        self._native.upload_params(_float32_copy(params, "params"))

    def set_lr(self, lr: float) -> float:
        """Sets the learning rate of the following steps (between allreduces; any rank, normally rank 0).

        Returns the value stored at the switch (float32).
        """
        return self._native.set_lr(_float32_arg("lr", lr))

    def state_get(self) -> bytes:
        """Checkpoint: the switch's parameters, optimizer state, step counters and lr as one blob.

        Any rank, between allreduces. decode_state() unpacks it; state_set() restores it.
        """
        return self._native.state_get()

    def state_set(self, blob: bytes) -> None:
        """Restore (rank 0, between allreduces): replaces the parameters, state, step counters and lr
        with a blob from state_get() of a job with the same algorithm, params and switch --mtu."""
        self._native.state_set(bytes(blob))

    def stats(self) -> dict[str, int]:
        """Worker counters: packets, bytes, retransmissions, injected drops, ...

        `dropped_foreign` counts datagrams dropped for their source (neither the switch's data ports nor,
        on the ring, a peer: docs/protocol.md §2.1), `unconfirmed_aborts` ABORT datagrams that the
        switch's control connection did not confirm and that were therefore ignored (§4). With
        connect(deadline_us=...) (§3.1): `partial_results` results that closed at their deadline
        without every rank, `missed_contributions` the contributions they lacked, `straggler_reports`
        ranks reported for missing `straggler_report` allreduces in a row.
        """
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
            f"switch={self._switch} algorithm={self.algorithm} {state}>"
        )


def _float32_copy(x: Any, what: str) -> np.ndarray:
    """A C-contiguous float32 numpy copy of a numpy array, a torch tensor or a sequence."""
    if _is_torch_tensor(x):
        x = x.detach().to("cpu").float().contiguous().numpy()
    arr = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).reshape(-1)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"gradswitch: {what} holds non-finite values")
    return arr


MAX_WORLD = 64  # GS_MAX_WORLD: a slot's contributor bitmap is one 64-bit word


def _int_arg(name: str, value: Any, lo: int, hi: int, span: str | None = None) -> int:
    """An integer argument of connect() within [lo, hi], or a TypeError/ValueError in our words."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"gradswitch: {name} must be an integer, got {value!r} ({type(value).__name__})")
    if not lo <= int(value) <= hi:
        raise ValueError(f"gradswitch: {name} must be in {span or f'{lo}..{hi}'}, got {int(value)}")
    return int(value)


def _seconds_arg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"gradswitch: {name} must be a number of seconds, got {value!r}")
    if not (math.isfinite(float(value)) and float(value) > 0):
        raise ValueError(f"gradswitch: {name} must be a finite number of seconds > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ConnectOptions:
    """Every option of connect() with its default: connect() takes the defaults of the arguments it is not
    given from here (or from its `options=`). `dataclasses.replace(opts, rank=r)` derives one rank's.

    switch: "host:port" of the switch's control port (default "127.0.0.1:7700"), "host:port,host:port,..."
        to shard the job over several switches, or None for the ring alone (needs `peers` and `token`).
    job: the job's name at the switch (default "default"); 1..64 characters of [A-Za-z0-9._:-].
    rank, world_size: this process's rank (default 0) in a job of `world_size` ranks (default 1, at most
        64).
    wire: how float tensors travel (default "float32"): float32, fixed32, float16, bfloat16, float64 or
        mx8 (8-bit blocks, docs/protocol.md 2.2; the switch only, not the ring or an optimizer job).
    timeout: seconds an allreduce may make no progress before GradswitchTimeout (default 30).
    drop_rate, seed: the fraction of this worker's data packets dropped on purpose (default 0, for loss
        tests) and the seed of the drops (default 0).
    token: the JOIN token (default None: "gradswitch" with a switch; the ring without a switch needs one,
        shared by every rank and by nobody else).
    join_timeout: seconds to wait for every rank to join (default 120).
    connect_timeout: seconds to wait for the switch's control port to answer (default 5).
    shuffle_seed: test hook: permutes the order of each window's first packets (default 0: off).
    optimizer, params: an optimizer job (default None: a plain allreduce job): the optimizer dict
        (optimizer_keys()) and the initial parameters or their number.
    algorithm: "switch" (default), "ring" or "auto" (the switch, then the ring when it is gone).
    peers: the ring's "host:port" per rank, in rank order (default None: from the switch).
    peer_exchange: internal (the torch backend): a callable from this rank's UDP port to every rank's
        "host:port" (default None).
    bind_ip: the data socket's local address (default None: the one that reaches the switch, else any).
    tenant, secret_file: a switch with an auth file (default None: $GRADSWITCH_TENANT, and the secret from
        $GRADSWITCH_SECRET or the file $GRADSWITCH_SECRET_FILE).
    deadline_us, quorum: bounded-time rounds (docs/protocol.md §3.1; default None: off, every round waits
        for every rank): the switch closes a round `deadline_us` microseconds after its first contribution
        once `quorum` ranks contributed (default None: world_size - 1). Every rank gives the same values.
    rescale: with a deadline, a float chunk that lacked contributions is scaled by world_size /
        contributors (default True; False leaves the sum of those present). int32 chunks stay as summed.
    straggler_report: a rank missing from this many allreduces in a row is reported (a warning and
        stats()["straggler_reports"]; default 10).
    concede: with a deadline, this rank sends header-only concedes (docs/protocol.md §3.1, "Concede")
        for a share of its chunks while its own DATA completes most rounds, i.e. while its uplink paces
        the job, and sends them with data again as it catches up (default False). The chunks it
        concedes are summed without it and rescaled like any partial chunk; stats()["conceded_rounds"]
        counts them. For a rank with a slower link than the others'; a healthy rank never concedes.
    concede_keep: test hook: a fixed share (0..1) of chunks sent with data instead of the policy
        (default None).

    The values are checked by connect(), with the same errors whichever way they were given.
    """

    switch: str | None = "127.0.0.1:7700"
    job: str = "default"
    rank: int = 0
    world_size: int = 1
    wire: str = "float32"
    timeout: float = 30.0
    drop_rate: float = 0.0
    seed: int = 0
    token: str | None = None
    join_timeout: float = 120.0
    connect_timeout: float = 5.0
    shuffle_seed: int = 0
    optimizer: dict[str, Any] | None = None
    params: Any = None
    algorithm: str = "switch"
    peers: list[str] | None = None
    peer_exchange: Any = None
    bind_ip: str | None = None
    tenant: str | None = None
    secret_file: str | os.PathLike | None = None
    deadline_us: int | None = None
    quorum: int | None = None
    rescale: bool = True
    straggler_report: int = 10
    concede: bool = False
    concede_keep: float | None = None


class _Default:
    """connect()'s default of an argument it was not given: the ConnectOptions field of that name (of
    `options=`, when given). Its repr is the field's default, so help(connect) reads as the values."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return repr(getattr(ConnectOptions, self.name))


# connect()'s defaults, by argument name (Any: each stands for its field's type).
_DEFAULT: dict[str, Any] = {f.name: _Default(f.name) for f in fields(ConnectOptions)}


def connect(
    switch: str | None = _DEFAULT["switch"],
    job: str = _DEFAULT["job"],
    rank: int = _DEFAULT["rank"],
    world_size: int = _DEFAULT["world_size"],
    *,
    wire: str = _DEFAULT["wire"],
    timeout: float = _DEFAULT["timeout"],
    drop_rate: float = _DEFAULT["drop_rate"],
    seed: int = _DEFAULT["seed"],
    token: str | None = _DEFAULT["token"],
    join_timeout: float = _DEFAULT["join_timeout"],
    connect_timeout: float = _DEFAULT["connect_timeout"],
    shuffle_seed: int = _DEFAULT["shuffle_seed"],
    optimizer: dict[str, Any] | None = _DEFAULT["optimizer"],
    params: Any = _DEFAULT["params"],
    algorithm: str = _DEFAULT["algorithm"],
    peers: list[str] | None = _DEFAULT["peers"],
    peer_exchange: Any = _DEFAULT["peer_exchange"],
    bind_ip: str | None = _DEFAULT["bind_ip"],
    tenant: str | None = _DEFAULT["tenant"],
    secret_file: str | os.PathLike | None = _DEFAULT["secret_file"],
    deadline_us: int | None = _DEFAULT["deadline_us"],
    quorum: int | None = _DEFAULT["quorum"],
    rescale: bool = _DEFAULT["rescale"],
    straggler_report: int = _DEFAULT["straggler_report"],
    concede: bool = _DEFAULT["concede"],
    concede_keep: float | None = _DEFAULT["concede_keep"],
    options: ConnectOptions | None = None,
) -> Group:
    """Joins `job` as `rank` of `world_size` at the switch `switch` ("host:port" of its control port).

    Every argument not given takes its default from `options` (a ConnectOptions), else from
    ConnectOptions(), which documents each: `connect(options=opts, rank=r)` is opts with this rank.

    `switch` may list several switches, "host:port,host:port,...": the job is then sharded over them
    (every rank joins it on each, in the given order, and each allreduce's chunks are striped over
    them, chunk c to switch c mod S, each with its own window and loss recovery); a switch that
    fails ends the allreduce with an error naming it. A leaf switch (gradswitchd --uplink) is
    given like any switch: the two levels are invisible to the workers (docs/scaling.md).

    Blocks until every rank joined (at most `join_timeout` seconds). `wire` is how float tensors
    travel: float32, fixed32 (exact, order-independent sums), float16, bfloat16, float64 (double
    precision sums, twice float32's bytes) or mx8 (about a quarter of float32's bytes: blocks of 32
    8-bit floats sharing a scale, summed in fp32 on the switch). An allreduce fails
    with GradswitchTimeout after `timeout` seconds without progress. `drop_rate`/`seed` drop a fraction
    of this worker's outgoing data packets (loss testing); `shuffle_seed` (test hook) permutes the
    order of each window's first packets.

    `algorithm` (docs/algorithms.md): "switch" sums in the switch; "ring" runs paper 001's pipelined
    ring among the workers (the switch, if given, only tells every rank the others' addresses);
    "auto" uses the switch and hands the job over to the ring when the switch cannot be reached at
    connect or goes away later (one warning on stderr; the allreduce in flight completes with the
    right sum; the group stays on the ring). Without a switch (switch=None, or unreachable with
    "auto") the ring needs `peers`: "host:port" per rank, in rank order (each rank receives on its
    own entry's port). `peer_exchange` (internal, used by the torch backend) is a callable that
    takes this rank's UDP port and returns every rank's "host:port". `bind_ip` is the local address
    of the data socket (default: the address this host reaches the switch from, so that no other
    interface takes datagrams for it; any address, 0.0.0.0, without a switch, with `peers`, or when
    a sharded job's switches are reached from different addresses).

    `token` (docs/protocol.md §1.2, §7): with a switch, every rank's JOIN gives the same token (default
    "gradswitch"); the job's id and key are the switch's random ones. The ring without a switch
    (switch=None, or algorithm="auto" with `peers`, which may fall back to it) derives the job's id and
    key from the job name, world size and token, so it needs a token that every rank is given and
    nobody else knows (e.g. secrets.token_hex(16), shared by the launcher): there is no default then,
    and connect() raises ValueError without one. The torch backend draws one itself.

    Workers take results only from the switch's data ports and ring datagrams only from the peers
    (Group.stats()["dropped_foreign"] counts the rest); an ABORT datagram ends the job only once the
    switch confirms it over the control connection.

    A switch with an auth file (docs/security.md) knows its tenants: `tenant` (default
    $GRADSWITCH_TENANT) proves its secret, read from `secret_file` or else $GRADSWITCH_SECRET or the
    file $GRADSWITCH_SECRET_FILE (never from a command line), before joining; job names are then
    the tenant's own.

    Bounded-time rounds (docs/protocol.md §3.1, opt-in): with `deadline_us`, the switch closes each
    round that long after its first contribution with the contributions present (at least `quorum`),
    and every rank receives the same partial sum; float chunks are rescaled to world_size/contributors
    (`rescale`). Handle.missed() and stats()["missed_contributions"] say how many contributions were
    missing; a rank missing from `straggler_report` allreduces in a row is reported. With `concede`,
    a rank whose uplink paces the job concedes a share of its chunks (arrives without its values) so
    that their rounds close at once.

    Optimization in the switch (docs/optimizer.md): `optimizer=dict(algo="adam", lr=1e-3, ...)` makes
    the switch hold the fp32 parameters and the optimizer state; every rank must pass the same dict
    (see optimizer_keys() for the keys; values are sent as float32). `params` is the initial
    parameters (a float32 numpy array or CPU tensor; other ranks may pass the same array or just its
    length as an int): rank 0 uploads them right after joining. Then each allreduce takes the
    gradient (float32, exactly `params` elements, any wire but float32 is refused) and writes the
    updated parameters into it. Group.set_lr(), state_get() and state_set() change the learning rate
    and checkpoint / restore between allreduces.
    """
    given = {k: v for k, v in locals().items() if k != "options" and not isinstance(v, _Default)}
    if options is None:
        options = ConnectOptions()
    elif not isinstance(options, ConnectOptions):
        raise TypeError(
            f"gradswitch: options= must be a gradswitch.ConnectOptions, got {type(options).__name__}"
        )
    o = _checked(replace(options, **given))
    creds = credentials(o.tenant, o.secret_file) or ("", "")
    algo, keys, n_params, initial = _optimizer_args(o)
    group = Group(_native_group(o, creds, algo, keys, n_params), o.switch, o.deadline_us)
    if initial is not None and group.rank == 0:
        try:
            group._native.upload_params(initial)
        except BaseException:
            group.close(abort=True)  # the other ranks then fail at once instead of timing out
            raise
    return group


def _checked(o: ConnectOptions) -> ConnectOptions:
    """The options checked (TypeError / ValueError in connect()'s words), with their numbers as int and
    float and `peers` as a list."""
    if o.wire not in WIRES:
        raise ValueError(f"gradswitch: unknown wire {o.wire!r}; expected one of {', '.join(WIRES)}")
    if o.switch is not None and not isinstance(o.switch, str):
        raise TypeError("gradswitch: switch must be a 'host:port' string (or None for the ring alone)")
    if o.algorithm not in ALGORITHMS:
        raise ValueError(
            f"gradswitch: unknown algorithm {o.algorithm!r}; expected one of {', '.join(ALGORITHMS)}"
        )
    if o.switch is None and o.algorithm == "switch":
        raise ValueError("gradswitch: algorithm='switch' needs a switch address")
    if o.wire == "mx8" and o.algorithm != "switch":
        raise ValueError(
            f"gradswitch: wire='mx8' is summed by the switch only; algorithm={o.algorithm!r} would reduce "
            "on the ring, which carries 32- and 16-bit wires (use algorithm='switch', or wire='bfloat16')"
        )
    peers = o.peers
    if peers is not None:
        if isinstance(peers, str) or not all(isinstance(p, str) for p in peers):
            raise TypeError("gradswitch: peers must be a list of 'host:port' strings, one per rank")
        peers = list(peers)
    for name, value in (("job", o.job), ("token", o.token), ("bind_ip", o.bind_ip)):
        if not isinstance(value, str) and not (value is None and name != "job"):
            raise TypeError(f"gradswitch: {name} must be a string, got {type(value).__name__}")
    world_size = _int_arg("world_size", o.world_size, 1, MAX_WORLD)
    checked = replace(
        o,
        world_size=world_size,
        rank=_int_arg("rank", o.rank, 0, world_size - 1, f"0..world_size-1 = 0..{world_size - 1}"),
        seed=_int_arg("seed", o.seed, 0, 2**64 - 1),
        shuffle_seed=_int_arg("shuffle_seed", o.shuffle_seed, 0, 2**64 - 1),
        timeout=_seconds_arg("timeout", o.timeout),
        join_timeout=_seconds_arg("join_timeout", o.join_timeout),
        connect_timeout=_seconds_arg("connect_timeout", o.connect_timeout),
        peers=peers,
    )
    if o.deadline_us is not None:
        _int_arg("deadline_us", o.deadline_us, 1, 60_000_000)
    elif o.quorum is not None:
        raise ValueError(
            "gradswitch: quorum= needs deadline_us= (a round without a deadline waits for every rank)"
        )
    if o.quorum is not None:
        _int_arg("quorum", o.quorum, 1, world_size, f"1..world_size = 1..{world_size}")
    if not isinstance(o.rescale, bool):
        raise TypeError(f"gradswitch: rescale must be True or False, got {o.rescale!r}")
    _int_arg("straggler_report", o.straggler_report, 1, 2**31 - 1)
    if not isinstance(o.concede, bool):
        raise TypeError(f"gradswitch: concede must be True or False, got {o.concede!r}")
    if o.concede_keep is not None and (
        isinstance(o.concede_keep, bool)
        or not isinstance(o.concede_keep, (int, float))
        or not 0 <= o.concede_keep <= 1
    ):
        raise ValueError(f"gradswitch: concede_keep must be a number in [0, 1], got {o.concede_keep!r}")
    if (o.concede or o.concede_keep is not None) and o.deadline_us is None:
        raise ValueError(
            "gradswitch: concede= needs deadline_us= (only a job with bounded-time rounds closes a round "
            "without a rank)"
        )
    drop_rate = o.drop_rate
    if isinstance(drop_rate, bool) or not isinstance(drop_rate, (int, float, np.floating, np.integer)):
        raise TypeError(f"gradswitch: drop_rate must be a number in [0, 1), got {drop_rate!r}")
    if not 0.0 <= float(drop_rate) < 1.0:
        raise ValueError(f"gradswitch: drop_rate must be in [0, 1), got {drop_rate!r}")
    return replace(checked, drop_rate=float(drop_rate))


def _optimizer_args(o: ConnectOptions) -> tuple[str, list[tuple[str, str]], int, np.ndarray | None]:
    """An optimizer job's (algo, JOIN keys, number of parameters, initial parameters or None); ("", [], 0,
    None) for a plain allreduce job."""
    if o.optimizer is None:
        if o.params is not None:
            raise ValueError(
                "gradswitch: params= needs optimizer= (it is the switch optimizer's initial parameters)"
            )
        return "", [], 0, None
    if o.wire != "float32":
        raise ValueError(
            "gradswitch: an optimizer job needs wire='float32' (the switch holds fp32 parameters), "
            f"got {o.wire!r}"
        )
    algo, keys = optimizer_keys(o.optimizer)
    if o.params is None:
        raise ValueError(
            "gradswitch: connect(optimizer=...) needs params= (the initial parameters, or their number)"
        )
    initial = None
    if isinstance(o.params, (int, np.integer)) and not isinstance(o.params, bool):
        n_params = int(o.params)
    else:
        initial = _float32_copy(o.params, "params")
        n_params = initial.size
    if not 1 <= n_params <= 0xFFFFFFFF:
        raise ValueError(f"gradswitch: an optimizer job needs 1..4294967295 parameters, got {n_params}")
    return algo, keys, n_params, initial


def _native_group(
    o: ConnectOptions, creds: tuple[str, str], algo: str, keys: list[tuple[str, str]], n_params: int
) -> _core.Group:
    """Joins the job (the native Group: blocks until every rank joined)."""
    return _core.Group(
        o.switch or "",
        o.job,
        o.rank,
        o.world_size,
        wire=o.wire,
        timeout=o.timeout,
        drop_rate=o.drop_rate,
        seed=o.seed,
        token=o.token or "",
        join_timeout=o.join_timeout,
        connect_timeout=o.connect_timeout,
        shuffle_seed=o.shuffle_seed,
        optimizer=algo,
        params=n_params,
        optimizer_keys=keys,
        algorithm=o.algorithm,
        peers=o.peers or [],
        peer_exchange=o.peer_exchange,
        bind_ip=o.bind_ip or "",
        tenant=creds[0],
        secret=creds[1],
        deadline_us=o.deadline_us or 0,
        quorum=o.quorum or 0,
        rescale=o.rescale,
        straggler_report=o.straggler_report,
        concede=o.concede,
        concede_keep=-1.0 if o.concede_keep is None else float(o.concede_keep),
    )
