"""Type stubs for the native module gradswitch._core (python/csrc/module.cpp)."""

from typing import Any

class GradswitchError(RuntimeError):
    """Any gradswitch failure (switch unreachable, JOIN refused, lost control connection, ...)."""

class GradswitchTimeout(GradswitchError, TimeoutError):
    """An allreduce made no progress within the timeout, or not every rank joined in time."""

class JobAborted(GradswitchError):
    """The switch aborted the job; `reason` is a gs_abort_reason, `rank` the rank at fault (or None)."""

    reason: int
    rank: int | None

class SwitchLost(JobAborted):
    """The switch is gone: it announced its shutdown, or it closed the control connection."""

class Handle:
    def wait(self) -> None: ...
    def done(self) -> bool: ...
    def missed(self) -> int: ...

class Group:
    def __init__(
        self,
        switch: str,
        job: str,
        rank: int,
        world_size: int,
        wire: str = "float32",
        timeout: float = 30.0,
        drop_rate: float = 0.0,
        seed: int = 0,
        token: str = "",
        join_timeout: float = 120.0,
        connect_timeout: float = 5.0,
        shuffle_seed: int = 0,
        rto_initial: float = 0.004,
        rto_max: float = 0.2,
        optimizer: str = "",
        params: int = 0,
        optimizer_keys: list[tuple[str, str]] = ...,
        algorithm: str = "switch",
        peers: list[str] = ...,
        peer_exchange: Any = None,
        ring_slots: int = 256,
        ring_payload: int = 1440,
        bind_ip: str = "",
        tenant: str = "",
        secret: str = "",
        types: str = "",
        deadline_us: int = 0,
        quorum: int = 0,
        rescale: bool = True,
        straggler_report: int = 10,
        concede: bool = False,
        concede_keep: float = -1.0,
    ) -> None: ...
    def allreduce(self, x: Any) -> None:
        """Sums x over all ranks in place. When it raises, x is undefined: the elements whose rounds
        completed hold the sum, the others this rank's input (gradswitch.Group.allreduce)."""
    def allreduce_async(self, x: Any, unsummed: Any | None = None) -> Handle:
        """Queues allreduce(x); the same holds for x when the handle's wait() raises. `unsummed`
        (float32, x's size; deadline jobs): this rank's values of the chunks whose sum lacks them."""
    def close(self, abort: bool = False) -> None: ...
    def upload_params(self, x: Any) -> None: ...
    def set_lr(self, lr: float) -> float: ...
    def state_get(self) -> bytes: ...
    def state_set(self, blob: bytes) -> None: ...
    @property
    def algorithm(self) -> str: ...
    @property
    def optimizer(self) -> str: ...
    @property
    def params(self) -> int: ...
    @property
    def chunk(self) -> int: ...
    @property
    def state_bytes(self) -> int: ...
    def stats(self) -> dict[str, int]:
        """Counters, dropped_foreign and unconfirmed_aborts among them (gradswitch.Group.stats)."""
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def job(self) -> str: ...
    @property
    def wire(self) -> str: ...
    @property
    def job_id(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def payload_bytes(self) -> int: ...
    @property
    def closed(self) -> bool: ...

def feedback_round(grad: Any, residual: Any, add: bool, wire: str) -> None:
    """In place: grad += residual when add, then residual = grad - what `wire` delivers of grad
    (float32, fixed32: 0)."""

def timeline_span(
    rank: int, lane: str, name: str, begin_ns: int, end_ns: int, args: str = "", overlapping: bool = False
) -> bool: ...
def timeline_path(rank: int) -> str: ...
def timeline_flush(rank: int) -> None: ...
