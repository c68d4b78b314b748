"""Why each upstream test that does not pass on gradswitch does not (docs/torch_upstream.md's "why").

Keyed by test name (failures, and skips whose reason alone does not say why) or by the harness's skip
reason (a regular expression matched from its start). A row without an explanation says "unexplained",
which tests/python/test_torch_upstream.py refuses in the stored listing.
"""

from __future__ import annotations

import re

_UPSTREAM_OFF = "disabled upstream for every backend (the reason links torch's issue or pull request)"

# test name (regular expression, whole name) -> sentence
BY_TEST: list[tuple[str, str]] = [
    (
        r"test_monitored_barrier_.*",
        "torch.distributed.monitored_barrier refuses every group whose backend is not named gloo "
        "(`get_backend(group) != Backend.GLOO` in distributed_c10d.py) before it reaches the group; "
        "torch's check, not gradswitch's",
    ),
]

# skip reason (regular expression, matched from its start) -> sentence
BY_REASON: list[tuple[str, str]] = [
    (
        r"CUDA is not available|Need at least \d+ CUDA devices?",
        "CUDA test: this machine has no GPU (the harness skips it for gloo too)",
    ),
    (
        r"Skipped due to small world size",
        "needs 8 ranks or more (the harness's skip_if_small_worldsize); upstream CI skips it too",
    ),
    (r"Test requires (an exact )?world size of 4", "needs 4 ranks: see the world-size-4 listing"),
    (r"Test requires world size of [3-9]", "needs more ranks than this listing's world size"),
    (
        r"Only N[cC][cC][lL] |NCCL (Batch )?Send Recv Only|Only NCCL backend|Coalescing manager currently "
        r"tests with NCCL only|Test requires backend gradswitch to be one of \{'nccl'\}",
        "NCCL test (CUDA tensors or an NCCL-only feature): skipped for gloo too",
    ),
    (
        r"Only MPI supports all_to_all",
        "MPI-only in the harness, skipped for gloo too: its tensors have different sizes per rank, which "
        "gloo's list all_to_all refuses (`ProcessGroupGloo::alltoall: invalid tensor size`), and gradswitch "
        "runs all_to_all through its internal gloo group (all_to_all_single, uneven splits included, passes)",
    ),
    (r"https://github.com/pytorch/pytorch/|Test is failing, see|Skipped due to flakiness", _UPSTREAM_OFF),
    (r"no torchvision", "needs torchvision, which is not installed here (not a dependency of gradswitch)"),
]


def why(name: str, outcome: str, reason: str, overridden: dict[str, str]) -> str:
    """The listing's "why" of one test ("" for a plain pass)."""
    for pattern, sentence in BY_TEST:
        if re.fullmatch(pattern, name):
            return sentence
    if outcome == "pass":
        if name in overridden:
            return f'runs although the harness skips it by name: "{overridden[name]}" (see above)'
        return ""
    for pattern, sentence in BY_REASON:
        if re.match(pattern, reason):
            return sentence
    return "unexplained"
