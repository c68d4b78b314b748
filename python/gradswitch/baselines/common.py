"""Shared pieces of the baselines: deterministic gradients, verification, results, process plumbing,
and the error and checks that the runner (runner.py) and each system's adapter share."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

import numpy as np


class BaselineError(RuntimeError):
    pass


def worker_count(tb, workers: int | None) -> int:
    """The workers a run uses on testbed `tb`: all of its worker namespaces when None."""
    n = tb.workers if workers is None else workers
    if not 1 <= n <= tb.workers:
        raise BaselineError(f"workers={n}: the testbed has {tb.workers} worker namespaces")
    return n


# The gradients repeat every 61 elements, so each is one period of 61 values tiled: building or
# checking 16 MB takes a few ms, not the 0.2-0.4 s of evaluating the formula element by element
# (which, between two allreduces, idled the link of a benchmark that times whole loops).
_PERIOD = 61


def _tiled(period: np.ndarray, n: int) -> np.ndarray:
    return np.tile(period, -(-n // _PERIOD))[:n]


def _grad_period(rank: int, it: int) -> np.ndarray:
    j = np.arange(_PERIOD, dtype=np.int64)
    return (((j * 7 + rank * 13 + it * 5) % _PERIOD) - 30).astype(np.float32)


def grad(rank: int, n: int, it: int = 0) -> np.ndarray:
    """Worker `rank`'s float32 gradient for iteration `it`: element i is ((7i + 13 rank + 5 it) mod 61)
    - 30, small integers, so any sum order is exact."""
    return _tiled(_grad_period(rank, it), n)


def expected_sum(world: int, n: int, it: int = 0, ranks=None) -> np.ndarray:
    period = np.zeros(_PERIOD, dtype=np.float32)
    for r in range(world) if ranks is None else ranks:
        period += _grad_period(r, it)
    return _tiled(period, n)


def check(result: np.ndarray, world: int, it: int) -> float:
    """Max abs error of `result` against the exact sum (0.0 when right; inf for a NaN, which callers'
    max() would otherwise pass over)."""
    exp = expected_sum(world, result.size, it)
    if np.array_equal(result, exp):  # one pass; the error is measured only when there is one
        return 0.0
    err = float(np.max(np.abs(result - exp)))
    return float("inf") if math.isnan(err) else err


def emit(**kw) -> None:
    """Worker side: one JSON result line on stdout (prefixed so other output cannot be mistaken for it)."""
    print("GSRESULT " + json.dumps(kw), flush=True)


def parse_results(text: str) -> list[dict]:
    return [json.loads(ln.split(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("GSRESULT ")]


@dataclass
class Result:
    system: str
    workers: int
    nbytes: int
    iters: int
    times: list[float] = field(default_factory=list)  # per timed iteration: slowest rank's allreduce time
    ok: bool = False
    max_err: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    @property
    def algbw_gbps(self) -> float:
        """Gradient bits per second: nbytes * 8 / median time."""
        return self.nbytes * 8 / self.median / 1e9 if self.times else float("nan")

    def as_dict(self) -> dict:
        d = asdict(self)
        d["median_s"] = self.median
        d["algbw_gbps"] = self.algbw_gbps
        return d

    def summary(self) -> str:
        return (
            f"{self.system:12s} N={self.workers} {self.nbytes / 2**20:9.3f} MiB"
            f"  median {self.median * 1e3:9.3f} ms"
            f"  {self.algbw_gbps:7.3f} Gbit/s  {'OK' if self.ok else f'WRONG SUM max_err={self.max_err:g}'}"
        )


def combine(
    system: str,
    workers: int,
    nbytes: int,
    iters: int,
    per_rank: list[dict],
    expect_ranks: int,
    extra: dict | None = None,
) -> Result:
    """Merge worker result lines: time of iteration i = max over ranks."""
    res = Result(system, workers, nbytes, iters, extra=extra or {})
    if len(per_rank) != expect_ranks:
        res.extra["error"] = f"got {len(per_rank)} of {expect_ranks} rank results"
        return res
    ts = [r["times"] for r in per_rank if r.get("times") is not None]
    if ts and all(len(t) == len(ts[0]) for t in ts):
        res.times = [max(col) for col in zip(*ts, strict=True)]
    res.max_err = max(float(r.get("max_err", 0.0)) for r in per_rank)
    # CPU inside the timed calls: per worker, and of a rank on `host` (MPI_Reduce+Bcast's root)
    if any("cpu_s" in r for r in per_rank):
        ranked = sorted(per_rank, key=lambda r: r.get("worker_rank", r.get("rank", 0)))
        res.extra.setdefault("worker_cpu_s", [r.get("cpu_s") for r in ranked if r.get("worker_rank", 0) >= 0])
        hosted = [r.get("cpu_s") for r in ranked if r.get("worker_rank", 0) < 0]
        if hosted:
            res.extra.setdefault("host_cpu_s", hosted[0])
    res.ok = all(r.get("ok") for r in per_rank) and res.max_err == 0.0 and len(res.times) == iters
    return res


def wait_all(procs: list[tuple[str, subprocess.Popen]], timeout: float) -> list[tuple[str, int, str, str]]:
    """Wait for named processes; on timeout kill all of them. Returns (name, rc, stdout, stderr).

    Every process's pipes are read at once, one thread each: read one after another, a rank whose
    output filled its pipe while an earlier one was waited for blocked in write, and with it every
    rank's allreduce, until the timeout (a worker logging at debug level does that)."""
    deadline = time.time() + timeout
    got: list[tuple[str, str]] = [("", "")] * len(procs)

    def drain(i: int, p: subprocess.Popen) -> None:
        try:
            so, se = p.communicate(timeout=max(0.1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for _, q in procs:
                if q.poll() is None:
                    q.kill()
            so, se = p.communicate()
            se = (se or "") + f"\n[killed after {timeout}s timeout]"
        got[i] = (so or "", se or "")

    readers = [threading.Thread(target=drain, args=(i, p), daemon=True) for i, (_, p) in enumerate(procs)]
    for r in readers:
        r.start()
    for r in readers:
        r.join()
    return [(name, p.returncode, *got[i]) for i, (name, p) in enumerate(procs)]


def fail_text(outs) -> str:
    return "\n".join(f"--- {n} rc={rc}\n{se.strip()[-2000:]}" for n, rc, so, se in outs if rc != 0)


def add_rank_options(p) -> None:
    """A worker's options that every system shares: its rank, the world, the size and the iterations."""
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--nbytes", type=int, required=True)
    p.add_argument("--iters", type=int, required=True, help="total, warmup included")
    p.add_argument("--warmup", type=int, default=1)


def start_ranks(tb, module: str, ranks: int, args_of, env: dict | None = None) -> list:
    """One `python -m module *args_of(r)` per rank r on machine w<r> of testbed tb, its output piped:
    (name, process) pairs for wait_all."""
    return [
        (f"w{r}", tb.python(f"w{r}", module, *args_of(r), stdout=-1, stderr=-1, text=True, env=env))
        for r in range(ranks)
    ]


def results_of(procs, timeout: float, what: str, tail=lambda: "", error=BaselineError) -> list[dict]:
    """Waits for the processes (wait_all) and returns their result lines; if any failed, raises `error`
    "<what> failed:" with every failed process's stderr and tail() (the switches' logs, say)."""
    outs = wait_all(procs, timeout)
    if any(rc != 0 for _, rc, _, _ in outs):
        raise error(f"{what} failed:\n" + fail_text(outs) + tail())
    return [r for _, _, so, _ in outs for r in parse_results(so)]


def python() -> str:
    return sys.executable
