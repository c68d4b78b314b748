"""DDP communication hooks that send gradient buckets through a gradswitch switch.

For users whose process group stays gloo or nccl (for broadcasts, barriers, the optimizer, ...) but whose
gradient allreduce should go through the switch:

    state = gradswitch.torch.GradswitchState(switch="10.0.0.1:7700")       # collective: every rank
    ddp.register_comm_hook(state, gradswitch.torch.allreduce_hook)        # or fixed32_hook, ...

GradswitchState agrees on a job name and token through the process group (rank 0 draws them and
broadcasts them), then joins one job per wire at the switch: the state's `wire` (default float32) at
construction, the others the first time a hook using them runs (every rank runs the same hooks in the
same order, so they join together). The hooks average: each bucket is summed on the switch and divided
by the world size, as DDP's own allreduce does.
"""

# No `from __future__ import annotations` here: DDP's register_comm_hook inspects the hooks' annotations
# and needs the real dist.GradBucket / torch.futures.Future[torch.Tensor] objects, not strings.
import os
import secrets
import threading
import uuid
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

import gradswitch

from ._channel import DEFAULT_CUDA_PIECE_BYTES, Channel
from .error_feedback import FEEDBACK_WIRES, MISSED_ONLY_WIRES, ErrorFeedback


class GradswitchState:
    """Hook state: the switch address, the agreed job/token, and one gradswitch Group per wire.

    Collective: every rank of `process_group` (default: the default group) must construct it.
    switch: "host:port" (default $GRADSWITCH_SWITCH; ranks without one use rank 0's).
    deadline_us, quorum, rescale, straggler_report: bounded-time rounds (docs/protocol.md §3.1; default
    off), as gradswitch.connect() takes them; concede likewise (a rank whose uplink paces the job
    concedes a share of its chunks; default off).
    error_feedback: on the lossy wires (mx8, float16, bfloat16), each rank adds to a bucket what its own
    encoding of that bucket lost last step and keeps what it loses now (error_feedback.py). With
    deadline_us, on any wire and for CPU buckets, also what a sum lacked of this rank (conceded, or
    late; less the rescaled sum's estimate of it): delayed, not lost. Off by default; float32 buckets
    only.
    """

    def __init__(
        self,
        switch: str | None = None,
        *,
        process_group: Any = None,
        wire: str = "float32",
        timeout: float = 30.0,
        join_timeout: float = 60.0,
        connect_timeout: float = 5.0,
        job: str = "ddp-hook",
        cuda_piece_bytes: int = DEFAULT_CUDA_PIECE_BYTES,
        deadline_us: Any = None,
        quorum: Any = None,
        rescale: bool = True,
        straggler_report: int = 10,
        concede: bool = False,
        error_feedback: bool = False,
    ):
        if not dist.is_initialized():
            raise RuntimeError(
                "gradswitch: GradswitchState needs torch.distributed initialized (any backend)"
            )
        if wire not in gradswitch.WIRES:
            raise ValueError(f"gradswitch: unknown wire {wire!r}; expected one of {gradswitch.WIRES}")
        self.error_feedback = bool(error_feedback)
        self._feedback: dict[str, ErrorFeedback] = {}
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        switch = switch or os.environ.get("GRADSWITCH_SWITCH") or None
        payload = [None]
        if self.rank == 0:
            payload = [(f"{job}-{uuid.uuid4().hex[:12]}", secrets.token_hex(16), switch or "")]
        src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        dist.broadcast_object_list(payload, src=src, group=process_group)
        self.job, self.token, root_switch = payload[0]
        self.switch = switch or root_switch
        if not self.switch:
            raise RuntimeError(
                "gradswitch: no switch address: pass switch='host:port' or set GRADSWITCH_SWITCH"
            )
        self._kw = dict(
            timeout=timeout,
            join_timeout=join_timeout,
            connect_timeout=connect_timeout,
            deadline_us=deadline_us,
            quorum=quorum,
            rescale=rescale,
            straggler_report=straggler_report,
            concede=concede,
        )
        self._cuda_piece_bytes = cuda_piece_bytes
        self._channels: dict[str, Channel] = {}
        self._lock = threading.Lock()
        self.wire = wire
        self.channel(wire)

    def channel(self, wire: str | None = None) -> Channel:
        """The Channel (joined gradswitch Group) for `wire`, joining the job on first use."""
        wire = wire or self.wire
        with self._lock:
            ch = self._channels.get(wire)
            if ch is None:
                try:
                    group = gradswitch.connect(
                        self.switch,
                        job=f"{self.job}-{wire}",
                        rank=self.rank,
                        world_size=self.world_size,
                        wire=wire,
                        token=self.token,
                        **self._kw,
                    )
                except gradswitch.GradswitchError as e:
                    raise RuntimeError(
                        f"gradswitch: rank {self.rank} could not join job {self.job}-{wire} at the switch "
                        f"{self.switch}: {e}"
                    ) from e
                ch = Channel(group, cuda_piece_bytes=self._cuda_piece_bytes)
                self._channels[wire] = ch
            return ch

    def group(self, wire: str | None = None) -> "gradswitch.Group":
        return self.channel(wire).group

    def stats(self) -> dict[str, float]:
        out = {"ops": 0, "bytes": 0, "busy_s": 0.0}
        for ch in self._channels.values():
            for k, v in ch.stats().items():
                out[k] += v
        return out

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()

    # DDP pickles hook states only for its own tooling; a live connection cannot travel.
    def __getstate__(self):
        raise TypeError("gradswitch: GradswitchState holds live switch connections and cannot be pickled")


def _bucket_hook(state: Any, bucket: dist.GradBucket, wire: str) -> Future:
    channel = _channel_of(state, wire)
    buffer = bucket.buffer()
    unsummed = None
    if getattr(state, "error_feedback", False):
        missed = bool(getattr(state, "_kw", {}).get("deadline_us"))
        if wire not in FEEDBACK_WIRES and not (missed and wire in MISSED_ONLY_WIRES):
            raise ValueError(
                f"gradswitch: error_feedback=True needs a lossy wire ({', '.join(FEEDBACK_WIRES)}) or "
                f"deadline_us; this hook sends {wire}, which a rank cannot round alone (fixed32) or "
                "does not round"
            )
        feedback = state._feedback.setdefault(wire, ErrorFeedback(wire, missed=missed))
        residual = feedback.apply(bucket.index(), buffer)
        unsummed = residual if missed else None
    return channel.submit(buffer, average=True, label=f"DDP bucket {bucket.index()}", unsummed=unsummed)


def _channel_of(state: Any, wire: str) -> Channel:
    if isinstance(state, GradswitchState):
        return state.channel(wire)
    if isinstance(state, Channel):
        return state
    raise TypeError(
        "gradswitch: the hook state must be a gradswitch.torch.GradswitchState "
        f"(ddp.register_comm_hook(GradswitchState(...), hook)), got {type(state).__name__}"
    )


def allreduce_hook(state: GradswitchState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket on the switch, float32 on the wire."""
    return _bucket_hook(state, bucket, "float32")


def fixed32_hook(state: GradswitchState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket on the switch, fixed32 on the wire (exact, order-independent sums)."""
    return _bucket_hook(state, bucket, "fixed32")


def float16_hook(state: GradswitchState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket on the switch, float16 on the wire (half the bytes, fp32 sums)."""
    return _bucket_hook(state, bucket, "float16")


def bfloat16_hook(state: GradswitchState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket on the switch, bfloat16 on the wire (half the bytes, fp32 sums)."""
    return _bucket_hook(state, bucket, "bfloat16")


def mx8_hook(state: GradswitchState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket on the switch, mx8 on the wire (8-bit blocks, fp32 sums; see error_feedback)."""
    return _bucket_hook(state, bucket, "mx8")


def state_hook(state: GradswitchState, bucket: dist.GradBucket) -> Future[torch.Tensor]:
    """Averages the bucket on the switch with the state's own wire."""
    return _bucket_hook(state, bucket, state.wire)


HOOKS = {
    "float32": allreduce_hook,
    "fixed32": fixed32_hook,
    "float16": float16_hook,
    "bfloat16": bfloat16_hook,
    "mx8": mx8_hook,
}
