"""Ranks as threads of the test process (the worker releases the GIL while it streams), and the end of
ranks run as processes."""

from __future__ import annotations

import threading


def in_threads(fn, world: int = 2, deadline_s: float = 120.0) -> list:
    """fn(rank) in one thread per rank; their results in rank order. Re-raises a rank's exception."""
    out: list = [None] * world
    errors: list[BaseException] = []

    def body(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(deadline_s)
        assert not t.is_alive(), f"a rank did not finish within {deadline_s} s"
    if errors:
        raise errors[0]
    return out


def join_or_kill(procs, timeout: float) -> None:
    """Waits up to `timeout` seconds for each process (multiprocessing) to end, and kills (and reaps)
    those still running: a test's `finally`, so that no rank outlives it."""
    for p in procs:
        p.join(timeout=timeout)
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
