"""The torch.distributed backend "gradswitch".

`import gradswitch.torch` registers it; then, in every process (torchrun sets RANK/WORLD_SIZE/MASTER_*):

    dist.init_process_group("gradswitch")                  # switch from $GRADSWITCH_SWITCH
    dist.init_process_group("gradswitch", pg_options=gradswitch.torch.Options(switch="10.0.0.1:7700",
                                                                               wire="fixed32"))

allreduce with SUM and AVG runs through the switch (float32, float16, bfloat16, int32, uint8, int8,
bool; float64 with wire="float64"). allreduce with other ops (MAX, MIN, PRODUCT, ...), of int64, float64
on a narrower wire, sparse or other dtypes, and every other collective (broadcast, allgather, barrier,
reduce_scatter, all_to_all, send/recv, gather, scatter, reduce, ...) run through an internal gloo group
built on the same store under the prefix "gradswitch-gloo/" (Options.other_ops="error" refuses the other
allreduce ops instead).
Every allreduce gives gloo's numbers (docs/torch.md, "What runs where"); integer AVG, which gloo refuses,
is the SUM divided by the world size rounded toward zero (NCCL's integer average).
"""

from __future__ import annotations

import datetime
import os
import secrets
import socket
import uuid
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future
from torch.utils.weak import WeakIdKeyDictionary

import gradswitch

from . import _sparse
from ._channel import DEFAULT_CUDA_PIECE_BYTES, SUPPORTED_DTYPES, Channel, fail_future, failing_in_cpp
from ._guards import refuse_undistributed_accelerate
from .error_feedback import (
    FEEDBACK_WIRES,
    MISSED_ONLY_WIRES,
    ErrorFeedback,
    check_feedback_dtype,
)

BACKEND_NAME = "gradswitch"
_KEY = "gradswitch/"
SUPPORTED_OPS = ("SUM", "AVG")


@dataclass
class Options:
    """Options of the gradswitch process group (pass as `pg_options=` to init_process_group/new_group).

    switch: "host:port" of the switch's control port (or "host:port,host:port,..." to shard the job
        over several switches, as gradswitch.connect); default $GRADSWITCH_SWITCH; ranks without one use
        rank 0's (published through the store).
    wire: how float tensors travel: float32, fixed32, float16, bfloat16, float64 or mx8 (default
        $GRADSWITCH_WIRE or float32).
    timeout: seconds an allreduce may go without progress before it fails (default $GRADSWITCH_TIMEOUT or
        30).
    join_timeout: seconds to wait for every rank to join the job at the switch.
    connect_timeout: seconds to wait for the switch's control port to answer.
    other_ops: what allreduce does with MIN/MAX/PRODUCT/BAND/BOR/BXOR/PREMUL_SUM, which the switch does
        not compute: "gloo" (default: run through the internal gloo group, as every other collective
        is) or "error" (a ValueError, for users who want to know that a call leaves the switch).
    int64: what allreduce does with int64 tensors: "gloo" (default; exact, through the internal gloo
        group) or "error".
    float64: where SUM/AVG of float64 CPU tensors runs when the wire is not float64: "gloo" (default;
        double precision, as gloo) or "wire" (the switch, each chunk rounded to the wire's precision).
        With wire="float64" they always run on the switch, in double precision.
    job: prefix of the job name at the switch (a random suffix is added by rank 0).
    algorithm: "switch", "ring" (paper 001's ring among the ranks) or "auto" (the switch, and the ring
        when the switch is unreachable or goes away); default $GRADSWITCH_ALGORITHM or "switch". The
        ring's addresses come from the switch, or without one through the store (each rank announces
        the address it uses towards $MASTER_ADDR).
    cuda_piece_bytes: size of the pinned-memory pieces CUDA tensors are staged through.
    sparse: block skipping (docs/protocol.md §9, docs/torch.md "Sparse gradients"): "off" (default:
        every element travels; sparse COO tensors go to gloo), "on" (dense CPU float32/float64/int32
        tensors skip the blocks that are zero on every rank; sparse COO tensors with one sparse
        dimension, such as nn.Embedding(sparse=True)'s gradients, go through the switch as the union of
        the rows the ranks touched) or "auto" (as "on", but a dense tensor whose union has few zero
        blocks is sent whole). Default $GRADSWITCH_SPARSE or "off".
    tenant, secret_file: a switch with an auth file (docs/security.md): the tenant (default
        $GRADSWITCH_TENANT) and the file holding its secret (default $GRADSWITCH_SECRET, else the file
        $GRADSWITCH_SECRET_FILE). Never put the secret itself in a command line.
    deadline_us, quorum, rescale, straggler_report: bounded-time rounds (docs/protocol.md §3.1; default
        None: off, every round waits for every rank), as gradswitch.connect() takes them: a round closes
        `deadline_us` after its first contribution with at least `quorum` contributions, every rank gets
        the same partial sum, rescaled to world_size/contributors (`rescale`), and a rank missing from
        `straggler_report` allreduces in a row is reported. `gradswitch.torch.gradswitch_group().group`
        counts them in `stats()`.
    concede: with deadline_us, a rank whose uplink paces the job concedes a share of its chunks
        (gradswitch.connect()'s concede; docs/protocol.md §3.1, "Concede"). Off by default; safe on
        every rank: a rank that keeps up never concedes.
    error_feedback: on the lossy wires (mx8, float16, bfloat16), each rank adds to a float32 tensor what
        its own encoding of that tensor lost at its last allreduce and keeps what it loses now
        (error_feedback.py, as the DDP hook's GradswitchState(error_feedback=True)). With deadline_us,
        on any wire and for CPU tensors, it also keeps this rank's values that a sum lacked (conceded,
        or late; less the rescaled sum's estimate of them), so a straggler's contribution is delayed,
        not lost. Off by default; algorithm="switch" only; integer tensors are exact and pass untouched, other
        float dtypes on the switch and sparse COO tensors through it (sparse="on"/"auto") are refused.
    """

    switch: str | None = None
    wire: str | None = None
    timeout: float | None = None
    join_timeout: float = 60.0
    connect_timeout: float = 5.0
    other_ops: str = "gloo"
    int64: str = "gloo"
    float64: str = "gloo"
    job: str = "torch"
    algorithm: str | None = None
    cuda_piece_bytes: int = DEFAULT_CUDA_PIECE_BYTES
    sparse: str | None = None
    tenant: str | None = None
    secret_file: str | None = None
    deadline_us: int | None = None
    quorum: int | None = None
    rescale: bool = True
    straggler_report: int = 10
    concede: bool = False
    error_feedback: bool = False

    def __post_init__(self) -> None:
        if self.other_ops not in ("error", "gloo"):
            raise ValueError("gradswitch: Options.other_ops must be 'error' or 'gloo'")
        if self.int64 not in ("error", "gloo"):
            raise ValueError("gradswitch: Options.int64 must be 'error' or 'gloo'")
        if self.float64 not in ("gloo", "wire"):
            raise ValueError("gradswitch: Options.float64 must be 'gloo' or 'wire'")
        if self.algorithm is not None and self.algorithm not in gradswitch.ALGORITHMS:
            raise ValueError(
                f"gradswitch: unknown algorithm {self.algorithm!r}; expected one of {gradswitch.ALGORITHMS}"
            )
        if self.sparse is not None and self.sparse not in _sparse.MODES:
            raise ValueError(
                f"gradswitch: Options.sparse must be one of {_sparse.MODES}, got {self.sparse!r}"
            )
        if self.wire is not None and self.wire not in gradswitch.WIRES:
            raise ValueError(f"gradswitch: unknown wire {self.wire!r}; expected one of {gradswitch.WIRES}")

    @classmethod
    def coerce(cls, value: Any) -> Options:
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            names = {f.name for f in fields(cls)}
            unknown = set(value) - names
            if unknown:
                raise TypeError(f"gradswitch: unknown option(s) {sorted(unknown)}; known: {sorted(names)}")
            return cls(**value)
        raise TypeError(
            f"gradswitch: pg_options must be gradswitch.torch.Options or a dict, got {type(value).__name__}"
        )


def op_name(op: Any) -> str:
    for name, value in dist.ReduceOp.RedOpType.__members__.items():
        try:
            if op == value:
                return name
        except TypeError:
            pass
    return str(op)


def unsupported_op_error(op: Any) -> ValueError:
    return ValueError(
        f"gradswitch: allreduce with ReduceOp.{op_name(op)} is not supported; the switch supports "
        f"ReduceOp.SUM and ReduceOp.AVG, and this process group was made with "
        f"gradswitch.torch.Options(other_ops='error') (the default, other_ops='gloo', runs other ops through "
        f"the internal gloo group)"
    )


def _reduce_op(opts: Any) -> Any:
    """The ReduceOp of AllreduceOptions / AllreduceCoalescedOptions / a ReduceOp / None (SUM)."""
    if opts is None:
        return dist.ReduceOp.SUM
    return getattr(opts, "reduceOp", opts)


def _allreduce_options(op: Any) -> dist.AllreduceOptions:
    o = dist.AllreduceOptions()
    o.reduceOp = op
    return o


def _integer_average(t: torch.Tensor, name: str) -> bool:
    return name == "AVG" and not (t.is_floating_point() or t.is_complex())


def _then_integer_average(fut: Future, t: torch.Tensor, world_size: int) -> Future:
    """AVG of an integer tensor: the SUM (wrapping as gloo's SUM does) divided by the world size,
    rounded toward zero. gloo itself refuses integer AVG ("result type Float can't be cast to the
    desired output type Long"); this is NCCL's integer average, and what Lightning computes on gloo
    (a SUM, then `copy_(result / world_size)`), so frameworks that average counters get it unchanged."""

    def divide(_value: Any) -> torch.Tensor:
        view = _distinct_view(t)  # an expanded tensor cannot be written through all its elements
        with torch.no_grad():
            view.copy_(torch.div(view, world_size, rounding_mode="trunc"))
        return t

    return _chain(fut, divide)


def _chain(fut: Future, fn: Any) -> Future:
    """fut.then(fn) that fails with the original exception (then() wraps it in "Got the following
    error when running the callback", which hides gloo's and the switch's own message)."""
    out: Future = Future()

    def done(f: Future) -> None:
        try:
            out.set_result(fn(f.value()))
        except Exception as e:  # noqa: BLE001 - handed to the waiter
            fail_future(out, e)

    fut.add_done_callback(done)
    return out


def _collect(futs: list[Future], tensors: list[torch.Tensor]) -> Future:
    """One future for several, whose value is the list of (in-place reduced) tensors."""

    def values(done: list[Future]) -> list[torch.Tensor]:
        for x in done:
            x.value()  # raises the first error
        return list(tensors)

    return _chain(torch.futures.collect_all(futs), values)


def _distinct_view(t: torch.Tensor) -> torch.Tensor:
    """A view of t that holds each of its memory locations once: an expanded (stride-0) dimension
    is cut to its first index. Every element of such a dimension is the same memory, so reducing the
    cut view gives the expanded tensor the value gloo gives it (the sum at that location), where
    copying a contiguous result back into overlapping memory is an error."""
    if not any(st == 0 and n > 1 for n, st in zip(t.shape, t.stride(), strict=True)):
        return t
    return t[tuple(slice(0, 1) if st == 0 else slice(None) for st in t.stride())]


def _is_dense(t: torch.Tensor) -> bool:
    """Every element at its own memory location, the locations one block (any dimension order)."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _has_overlap(t: torch.Tensor) -> bool:
    """Whether two elements may share memory: true unless, dimensions ordered by stride, each stride
    steps over the whole extent of the smaller ones (torch's own check answers "too hard" for most
    strided tensors, and copy_ then writes overlapping memory without a word)."""
    if t.numel() == 0:
        return False
    reach = 1
    for stride, size in sorted((st, n) for n, st in zip(t.shape, t.stride(), strict=True) if n != 1):
        if stride < reach:
            return True
        reach = stride * size
    return False


def _dtype_op_error(dtype: torch.dtype, name: str) -> TypeError:
    what = str(dtype).replace("torch.", "")
    if dtype == torch.int64:
        return TypeError(
            f"gradswitch: int64 allreduce ({name}) runs through the internal gloo group, and this process "
            "group was made with gradswitch.torch.Options(int64='error'); convert to int32 or float32 to "
            "use the switch"
        )
    return TypeError(
        f"gradswitch: allreduce with ReduceOp.{name} of a {what} tensor has no meaning (gloo refuses it too)"
    )


def _feedback_of(options: Options, wire: str, algorithm: str) -> ErrorFeedback | None:
    """Options.error_feedback's residuals, or None; refuses, before the store or the switch is
    contacted, the combinations where a rank cannot know what its encoding lost."""
    if not options.error_feedback:
        return None
    missed = bool(options.deadline_us)
    if wire not in FEEDBACK_WIRES and not (missed and wire in MISSED_ONLY_WIRES):
        raise ValueError(
            f"gradswitch: Options(error_feedback=True) needs a lossy wire ({', '.join(FEEDBACK_WIRES)}) "
            f"or deadline_us; wire={wire!r} is one a rank cannot round alone (fixed32) or does not round"
        )
    if algorithm != "switch":
        raise ValueError(  # the ring rounds the partial sums at every hop, not each rank's own gradient
            f"gradswitch: Options(error_feedback=True) needs algorithm='switch', not {algorithm!r}"
        )
    # Keyed by the tensor itself, weakly: DDP hands the same bucket tensors to every step's allreduce
    # (torch keeps one Python object per live tensor), so a bucket finds its own residual; a tensor
    # that dies takes its residual with it, so a later tensor that reuses its memory (an address and
    # shape key would match it) or any other tensor never picks up a residual that is not its own.
    return ErrorFeedback(wire, WeakIdKeyDictionary(), missed=missed)


def agree(store: dist.Store, rank: int, options: Options, switch: str | None) -> tuple[str, str, str]:
    """Rank 0 picks the job name and token (and publishes its switch address); the others read them.

    Rank 0 publishes before it contacts the switch, so a failure at one rank never leaves the others
    waiting on the store.
    """
    if rank == 0:
        job = f"{options.job}-{uuid.uuid4().hex[:12]}"
        token = secrets.token_hex(16)
        store.set(_KEY + "token", token)
        store.set(_KEY + "switch", switch or "")
        store.set(_KEY + "job", job)
        return job, token, switch or ""
    job = store.get(_KEY + "job").decode()
    token = store.get(_KEY + "token").decode()
    root_switch = store.get(_KEY + "switch").decode()
    return job, token, switch or root_switch


def _local_ip(towards: str | None) -> str:
    """This host's address on the route to `towards` (no packet is sent), for the ring's peers."""
    host = (towards or "").rsplit(":", 1)[0] if towards and ":" in towards else towards
    if not host or host.startswith("127.") or host == "localhost":
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _store_exchange(store: dist.Store, job: str, rank: int, world_size: int, switch: str | None) -> Any:
    """The ring's peer exchange through the store: each rank publishes "ip:port", reads the others'."""

    def exchange(port: int) -> list[str]:
        ip = _local_ip(os.environ.get("MASTER_ADDR") or switch)
        store.set(f"{_KEY}{job}/peer/{rank}", f"{ip}:{port}")
        return [store.get(f"{_KEY}{job}/peer/{r}").decode() for r in range(world_size)]

    return exchange


def _check_feedback_route(t: torch.Tensor, route: str) -> None:
    """With error feedback on: refuses what would cross the switch without a residual."""
    if route == "rows":
        raise ValueError(
            "gradswitch: Options(error_feedback=True) keeps dense residuals; a sparse COO tensor's rows "
            "change every step (use sparse='off', which sums it exactly through gloo, or "
            "error_feedback=False)"
        )
    if route == "switch" and t.is_floating_point():
        check_feedback_dtype(t)


class FutureWork(dist.Work):
    """A Work completed by a torch Future (whose value is the list of output tensors)."""

    def __init__(self, fut: Future, tensors: list[torch.Tensor]):
        super().__init__()
        self._fut = fut
        self._tensors = tensors
        self._cpp_fut: Future | None = None

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        self._fut.wait()  # raises the allreduce's error
        if self._cpp_fut is not None:
            # get_future()'s future is a then() of ours, completed by a callback that may not have run
            # yet: a caller that waits and then reads it (work.wait(); fut.value()) must find it done.
            self._cpp_fut.wait()
        return True

    def is_completed(self) -> bool:
        return self._fut.done()

    def is_success(self) -> bool:
        if not self._fut.done():
            return False
        try:
            self._fut.value()
        except Exception:
            return False
        return True

    def exception(self) -> Any:
        try:
            self._fut.value()
        except Exception as e:
            return e
        return None

    def get_future(self) -> Future:
        # DDP reads this future in C++: it must fail there as it fails here (failing_in_cpp).
        if self._cpp_fut is None:
            self._cpp_fut = failing_in_cpp(self._fut)
        return self._cpp_fut

    def result(self) -> list[torch.Tensor]:
        self.wait()
        return self._tensors


class ProcessGroupGradswitch(dist.ProcessGroup):
    """torch.distributed process group: allreduce SUM/AVG on the switch, the rest on internal gloo."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        world_size: int,
        timeout: datetime.timedelta = datetime.timedelta(minutes=30),
        options: Options | None = None,
    ):
        super().__init__(rank, world_size)
        options = Options.coerce(options)
        self.options = options
        switch = options.switch or os.environ.get("GRADSWITCH_SWITCH") or None
        wire = options.wire or os.environ.get("GRADSWITCH_WIRE") or "float32"
        op_timeout = options.timeout or float(os.environ.get("GRADSWITCH_TIMEOUT", "30"))
        algorithm = options.algorithm or os.environ.get("GRADSWITCH_ALGORITHM") or "switch"
        self.sparse = options.sparse or os.environ.get("GRADSWITCH_SPARSE") or "off"
        if self.sparse not in _sparse.MODES:
            raise ValueError(f"gradswitch: GRADSWITCH_SPARSE={self.sparse!r} is not one of {_sparse.MODES}")
        if self.sparse != "off" and options.deadline_us:
            raise ValueError(  # docs/protocol.md §9: a late rank would drop out of the union unnoticed
                f"gradswitch: sparse={self.sparse!r} does not apply with deadline_us={options.deadline_us}"
            )
        if algorithm not in gradswitch.ALGORITHMS:
            raise ValueError(
                f"gradswitch: GRADSWITCH_ALGORITHM={algorithm!r} is not one of {gradswitch.ALGORITHMS}"
            )
        self._feedback = _feedback_of(options, wire, algorithm)
        job, token, switch = agree(store, rank, options, switch)
        if not switch and algorithm == "switch":
            raise RuntimeError(
                "gradswitch: no switch address: set GRADSWITCH_SWITCH=host:port (at least on rank 0) or pass "
                "pg_options=gradswitch.torch.Options(switch='host:port')"
            )
        # gloo serves every collective except allreduce SUM/AVG
        self._gloo = dist.ProcessGroupGloo(
            dist.PrefixStore("gradswitch-gloo/", store), rank, world_size, timeout
        )
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        if torch.cuda.is_available():
            self._register_backend(torch.device("cuda"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        try:
            group = gradswitch.connect(
                switch,
                job=job,
                rank=rank,
                world_size=world_size,
                wire=wire,
                timeout=op_timeout,
                token=token,
                join_timeout=options.join_timeout,
                connect_timeout=options.connect_timeout,
                algorithm=algorithm,
                peer_exchange=_store_exchange(store, job, rank, world_size, switch),
                tenant=options.tenant,
                secret_file=options.secret_file,
                deadline_us=options.deadline_us,
                quorum=options.quorum,
                rescale=options.rescale,
                straggler_report=options.straggler_report,
                concede=options.concede,
            )
        except gradswitch.GradswitchError as e:
            raise RuntimeError(
                f"gradswitch: rank {rank} could not join job {job!r} at the switch {switch}: {e} "
                "(is gradswitchd running there? GRADSWITCH_SWITCH / Options.switch)"
            ) from e
        self.switch = switch
        self.job = job
        self.wire = wire
        self.algorithm = algorithm
        self.channel = Channel(group, cuda_piece_bytes=options.cuda_piece_bytes)

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    @property
    def group(self) -> gradswitch.Group:
        """The gradswitch.Group this process group streams through."""
        return self.channel.group

    # ------------------------------------------------------------------ allreduce
    def allreduce(self, tensors: Any, opts: Any = None) -> dist.Work:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _reduce_op(opts)
        if len(tensors) != 1:
            # The legacy multi-tensor form (one tensor per local device) reduces the inputs together
            # as well as across ranks; only gloo has that meaning (dist.all_reduce always passes one).
            return self._gloo.allreduce(list(tensors), _allreduce_options(op))
        return self._allreduce_each(list(tensors), op)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        return self._allreduce_each(list(tensors), _reduce_op(opts))

    def _route(self, t: torch.Tensor, name: str) -> str:
        """Where one tensor's SUM/AVG runs: "switch", "rows" (a row-sparse COO tensor through the switch),
        "gloo" or "error" (gloo refuses it too)."""
        if self.sparse != "off" and _sparse.serves_rows(t) and (t.is_floating_point() or name == "SUM"):
            return "rows"
        if t.layout != torch.strided or t.device.type not in ("cpu", "cuda"):
            return "gloo"  # sparse tensors (gloo sums them), other devices: gloo's answer or error
        if t.dtype == torch.bool and name == "AVG":
            return "error"
        if t.dtype == torch.int64:
            return "gloo" if self.options.int64 == "gloo" else "error"
        if t.dtype == torch.float64 and not (
            (self.wire == "float64" and t.device.type == "cpu") or self.options.float64 == "wire"
        ):
            return "gloo"  # a float32 wire would round a double-precision sum
        if t.dtype not in SUPPORTED_DTYPES:
            return "gloo"  # int16, unsigned wider than 8 bits, float8, ...: gloo's answer or its error
        return "switch"

    def _gloo_future(self, t: torch.Tensor, op: Any) -> Future:
        """One tensor through the internal gloo group, whatever its layout.

        gloo reduces the memory from the tensor's first element on as if the tensor were dense: a
        strided slice gets wrong numbers and an expanded tensor is read and written past its storage
        (a heap corruption). So a tensor that is not dense goes through a contiguous copy of its
        distinct elements, copied back."""
        opts = _allreduce_options(op)
        if t.layout != torch.strided or _is_dense(t):
            return self._gloo.allreduce([t], opts).get_future()
        view = _distinct_view(t)
        buf = view if _is_dense(view) else view.contiguous()
        fut = self._gloo.allreduce([buf], opts).get_future()

        def back(_value: Any) -> list[torch.Tensor]:
            if buf is not view:
                with torch.no_grad():
                    view.copy_(buf)
            return [t]

        return _chain(fut, back)

    def _allreduce_each(self, tensors: list[torch.Tensor], op: Any) -> dist.Work:
        """Each tensor reduced on its own (a coalesced list is several allreduces, not one summed)."""
        name = op_name(op)
        for t in tensors:
            if t.layout == torch.strided and _has_overlap(_distinct_view(t)):
                raise ValueError(
                    "gradswitch: allreduce of a tensor whose elements share memory other than by expand() "
                    f"(shape {tuple(t.shape)}, stride {t.stride()}) has no defined result; reduce a "
                    "contiguous copy"
                )
        if name not in SUPPORTED_OPS:
            if self.options.other_ops != "gloo":
                raise unsupported_op_error(op)
            # gloo's own allreduce_coalesced wants one dtype and dense tensors; one call per tensor
            # gives the same numbers for every list.
            futs = [self._gloo_future(t, op) for t in tensors]
            return FutureWork(_collect(futs, tensors), tensors)
        routes = [self._route(t, name) for t in tensors]  # refuse before any tensor is sent
        for t, route in zip(tensors, routes, strict=True):
            if route == "error":
                raise _dtype_op_error(t.dtype, name)
            if self._feedback is not None:
                _check_feedback_route(t, route)
        futs = []
        for t, route in zip(tensors, routes, strict=True):
            unsummed = None
            if self._feedback is not None and route == "switch" and t.is_floating_point():
                residual = self._feedback.apply(t, _distinct_view(t))
                unsummed = residual if self._feedback.missed else None
            int_avg = _integer_average(t, name)
            average = name == "AVG" and not int_avg
            if route == "gloo":
                fut = self._gloo_future(t, dist.ReduceOp.SUM if int_avg else op)
            elif route == "rows":
                fut = self.channel.run_blocking(lambda g, t=t, a=average: _sparse.reduce_rows(g, t, a))
            elif self.sparse != "off" and not int_avg and _sparse.serves_dense(t):
                fut = self.channel.run_blocking(
                    lambda g, t=t, a=average: _sparse.reduce_dense(g, t, a, self.sparse)
                )
            else:
                fut = self.channel.submit(_distinct_view(t), average=average, unsummed=unsummed)
            futs.append(_then_integer_average(fut, t, self.size()) if int_avg else fut)
        return FutureWork(_collect(futs, tensors), tensors)

    # ------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        self.channel.close()
        try:
            self._gloo.shutdown()
        except Exception:
            pass

    def abort(self) -> None:
        # Cancels the running and queued allreduces (they fail now rather than after their timeout)
        # and drops the job without LEAVE, so the switch ends it for the other ranks too.
        if self.channel.group is not None:
            self.channel.group.close(abort=True)
        self.channel.close()
        try:
            self._gloo.abort()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"<ProcessGroupGradswitch rank={self.rank()}/{self.size()} job={self.job!r} wire={self.wire} "
            f"switch={self.switch} algorithm={self.group.algorithm}>"
        )


# Every collective the switch does not serve goes to the internal gloo group through these explicit
# methods, not through the gloo backend registered for the device: torch reaches a registered
# backend of a Python process group with the GIL held, and gloo's worker thread needs the GIL to drop
# the last reference to a finished work's tensors while it holds its queue lock, which the next
# enqueue waits for: a deadlock seen in ~3% of runs of test_process_group_collectives (gdb: main
# thread in ProcessGroupGloo::enqueue with the GIL, pt_gloo_runloop in ~AsyncBroadcastWork waiting
# for the GIL). Called directly, ProcessGroupGloo's bindings release the GIL first.
_GLOO_OPS = (
    "broadcast",
    "allgather",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "gather",
    "scatter",
    "alltoall",
    "alltoall_base",
    "barrier",
    "send",
    "recv",
    "recv_anysource",
)


def _through_gloo(name: str):
    def op(self, *args, **kwargs):
        return getattr(self._gloo, name)(*args, **kwargs)

    op.__name__ = name
    op.__doc__ = f"{name} through the internal gloo group (the switch serves allreduce SUM/AVG only)."
    return op


for _name in _GLOO_OPS:
    if hasattr(dist.ProcessGroupGloo, _name):
        setattr(ProcessGroupGradswitch, _name, _through_gloo(_name))


def _create(dist_opts: Any, pg_options: Any = None) -> ProcessGroupGradswitch:
    refuse_undistributed_accelerate()
    return ProcessGroupGradswitch(
        dist_opts.store,
        dist_opts.group_rank,
        dist_opts.group_size,
        dist_opts.timeout,
        Options.coerce(pg_options),
    )


def register() -> None:
    """Registers the backend "gradswitch" with torch.distributed (done by `import gradswitch.torch`)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


def gradswitch_group(process_group: Any = None) -> ProcessGroupGradswitch | None:
    """The ProcessGroupGradswitch behind `process_group` (default: the default group), or None."""
    if process_group is None:
        if not dist.is_initialized():
            return None
        process_group = dist.distributed_c10d._get_default_group()
    return process_group if isinstance(process_group, ProcessGroupGradswitch) else None
