"""Command-line argument types shared by the package's commands (argparse `type=` callables)."""

from __future__ import annotations

import argparse


def bounded(kind, lo, hi=None, what=""):
    """A `type=` for argparse: `kind(text)` (int or float) within [lo, hi] (hi None: no upper
    bound), else a clear error naming the value and `what` (default: the range)."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            noun = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{text}: {what or f'must be in {lo}..{hi}'}")
        return v

    return parse
