"""Error feedback for the lossy wires: each rank keeps what its own encoding dropped and adds it back.

A rank's gradient g travels as Q(g), its wire encoding (mx8: docs/protocol.md section 2.2; float16 and
bfloat16: a round-to-nearest-even cast). With error feedback the rank sends Q(g + e) instead and keeps
e' = (g + e) - Q(g + e) for the next step, as PowerSGD's DDP hook keeps its compression residuals
(torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook): what one step's rounding loses, a later
step sends, so the sum of the updates follows the sum of the true gradients.

In a job with bounded-time rounds (deadline_us, docs/protocol.md §3.1) the residual also takes what a
sum lacked of the rank altogether: the chunks it conceded, or whose round its deadline closed without
it. The worker copies the rank's values of those chunks into the residual as their sums arrive
(Group.allreduce_async's `unsummed`), less the estimate of them that a rescaled partial sum holds
(`rescale`, the default: the mean of the ranks present), so a straggler's contribution comes a step
or a few late instead of never. This works on every wire: on float32 and fixed32 the residual holds
only what the sums lacked.

`wire_round` reproduces the worker's encoding bit for bit (tests/python/test_mx8.py checks it against an
allreduce through a real switch), in torch operations, so it runs on the gradient's own device. On
the CPU, `ErrorFeedback.apply` takes one native pass with the worker's own kernels instead
(`_core.feedback_round`, src/common/feedback_round.h; the same bits, tests/python/test_mx8.py).
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import torch

from gradswitch import _core

# Wires whose encoding a rank can reproduce alone. fixed32's scale is agreed over the ranks per chunk
# (docs/protocol.md section 5), float32 and float64 lose nothing on the way up.
FEEDBACK_WIRES = ("mx8", "float16", "bfloat16")
# Wires whose rounding a rank does not keep (none lost, or not its own to reproduce), where error
# feedback keeps only what a deadline job's sums lacked (`missed`).
MISSED_ONLY_WIRES = ("float32", "fixed32")
MX8_BLOCK = 32


def _mx8_round(x: torch.Tensor) -> torch.Tensor:
    """The mx8 encoding of a float32 tensor's blocks of 32 (from its first element), decoded."""
    flat = x.reshape(-1)
    n = flat.numel()
    blocks = torch.nn.functional.pad(flat, (0, (-n) % MX8_BLOCK)).view(-1, MX8_BLOCK)
    amax = blocks.abs().amax(dim=1, keepdim=True)
    poisoned = ~torch.isfinite(amax)  # a NaN or an infinity: the whole block decodes as NaN
    # floor(log2 amax) exactly, from frexp (amax = m * 2^e, m in [0.5, 1)); an all-zero block's scale
    # is irrelevant to its (zero) values.
    _, e = torch.frexp(torch.where(poisoned | (amax == 0), torch.ones_like(amax), amax))
    scale_exp = torch.clamp(e - 1 - 8, min=-127)
    v = torch.ldexp(blocks, -scale_exp)  # exact (docs/protocol.md 2.2)
    # E4M3: 3 mantissa bits, exponents down to -6 (below: subnormal steps of 2^-9).
    _, ve = torch.frexp(torch.where(v == 0, torch.ones_like(v), v))
    step_exp = torch.clamp(ve - 1, min=-6) - 3
    q = torch.round(torch.ldexp(v, -step_exp))  # torch.round: half to even
    q = torch.clamp(torch.ldexp(q, step_exp), -448.0, 448.0)
    out = torch.ldexp(q, scale_exp)
    out = torch.where(poisoned.expand_as(out), torch.full_like(out, float("nan")), out)
    return out.reshape(-1)[:n].view_as(x)


def wire_round(x: torch.Tensor, wire: str) -> torch.Tensor:
    """What `x` (float32) arrives as at the switch on `wire`, as float32."""
    if wire == "mx8":
        return _mx8_round(x)
    if wire == "float16":
        return x.to(torch.float16).to(x.dtype)
    if wire == "bfloat16":
        return x.to(torch.bfloat16).to(x.dtype)
    if wire in MISSED_ONLY_WIRES:
        return x
    raise ValueError(
        f"gradswitch: error feedback needs a lossy wire a rank encodes alone ({', '.join(FEEDBACK_WIRES)}), "
        f"not {wire!r}"
    )


def check_feedback_dtype(t: torch.Tensor) -> None:
    """Refuses a tensor whose residual error feedback cannot keep (before anything is sent)."""
    if t.dtype != torch.float32:
        raise TypeError(
            "gradswitch: error feedback keeps float32 residuals; the tensor is "
            f"{str(t.dtype).replace('torch.', '')} (train in float32, or turn error feedback off)"
        )


class ErrorFeedback:
    """One rank's residuals, one per key: the DDP hook keys them by bucket index, the process group by
    the tensor itself (`residuals` a torch.utils.weak.WeakIdKeyDictionary there). A key whose tensor's
    shape changes starts afresh, as after DDP rebuilds its buckets on the first iterations.

    `missed`: a deadline job's; the residual apply() returns is the allreduce's `unsummed` (CPU only)."""

    def __init__(
        self, wire: str, residuals: MutableMapping[Any, torch.Tensor] | None = None, *, missed: bool = False
    ):
        if wire not in FEEDBACK_WIRES and not (missed and wire in MISSED_ONLY_WIRES):
            if wire in MISSED_ONLY_WIRES:
                raise ValueError(
                    f"gradswitch: error feedback on wire={wire!r} keeps only what a deadline job's sums "
                    f"lack (deadline_us); without one it needs a lossy wire ({', '.join(FEEDBACK_WIRES)})"
                )
            wire_round(torch.zeros(1), wire)  # raises the explanation
        self.wire = wire
        self.missed = missed
        self._residuals = {} if residuals is None else residuals

    def apply(self, key: Any, grad: torch.Tensor) -> torch.Tensor:
        """Adds the residual kept under `key` to `grad` in place, keeps the new one and returns it
        (what a deadline job's allreduce of `grad` fills further: `unsummed`)."""
        if self.missed and grad.device.type != "cpu":
            raise ValueError(
                "gradswitch: error feedback in a deadline job (deadline_us) keeps what the sums lack in "
                f"CPU tensors; this gradient is on {grad.device} (train on the CPU, or turn one of them off)"
            )
        check_feedback_dtype(grad)
        r = self._residuals.get(key)
        fits = r is not None and r.shape == grad.shape and r.device == grad.device
        if grad.device.type == "cpu" and grad.is_contiguous():
            # One native pass with the worker's own kernels (src/common/feedback_round.h), the same bits as
            # below; the residual tensor is this object's alone, so it is rewritten in place.
            if not fits or not r.is_contiguous():
                r, fits = torch.empty_like(grad, memory_format=torch.contiguous_format), False
            _core.feedback_round(grad.detach().view(-1), r.view(-1), fits, self.wire)
            self._residuals[key] = r
            return r
        if fits:
            grad.add_(r)
        sent = wire_round(grad, self.wire)
        r = grad - sent
        # A non-finite gradient leaves no residual: it would poison every later step.
        r = torch.nan_to_num(r, nan=0.0, posinf=0.0, neginf=0.0).contiguous()  # unsummed is flat
        self._residuals[key] = r
        return r

    def reset(self) -> None:
        self._residuals.clear()
