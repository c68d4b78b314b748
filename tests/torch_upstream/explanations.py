"""Why each upstream test that does not pass on gradswitch does not (docs/torch_upstream.md's "why").

Keyed by the harness's skip reason (a pattern) or, for failures and test-specific cases, by test name.
A row of the listing without an explanation says "unexplained", which tests/python/test_torch_upstream.py
refuses for the stored listing.
"""

from __future__ import annotations

import re

CUDA = "CUDA test: this machine has no GPU (the harness skips it for gloo too)"

# skip reason (regular expression, matched from its start) -> sentence
BY_REASON: list[tuple[str, str]] = [
    (r"CUDA is not available|Need at least \d+ CUDA device|.*CUDA", CUDA),
]

# test name -> sentence, for failures and skips whose reason alone does not say why
BY_TEST: dict[str, str] = {}


def why(name: str, outcome: str, reason: str, overridden: dict[str, str]) -> str:
    if name in BY_TEST:
        return BY_TEST[name]
    if outcome == "pass":
        if name in overridden:
            return f'runs despite the name-based skip "{overridden[name]}" (tests/torch_upstream/_harness.py)'
        return ""
    for pattern, sentence in BY_REASON:
        if re.match(pattern, reason):
            return sentence
    return "unexplained"
