"""End-to-end allreduce over UDP: real worker processes (spawn) against a real gradswitchd.

Inputs are deterministic functions of (rank, index), so every worker computes the exact
expectation itself and reports only verdicts, digests and counters. Every wait is bounded.
"""

from __future__ import annotations

import functools
import hashlib
import multiprocessing as mp
import os
import queue
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
from _ranks import join_or_kill

import gradswitch

REPO = Path(__file__).resolve().parents[2]
WORKER_TIMEOUT = 10.0  # an allreduce without progress for this long fails




# ---------------------------------------------------------------------------- inputs


def make_input(kind: str, rank: int, size: int) -> np.ndarray:
    """A fresh (writable) copy of rank `rank`'s input."""
    return _input(kind, rank, size).copy()


@functools.lru_cache(maxsize=16)
def _input(kind: str, rank: int, size: int) -> np.ndarray:
    """Rank `rank`'s tensor. 'int': int32; 'exact': k * 2^e, |k| <= 1024, e in [-8, 7] varying slowly
    (float32 sums and fixed32 quantisation are then exact); 'exact16': the same with e in [-10, -1]
    (within float16 range, not exact there); 'normal': standard normal float32."""
    i = np.arange(size, dtype=np.int64)
    if kind == "int":
        return (((i * 2654435761 + rank * 40503) % (1 << 21)) - (1 << 20)).astype(np.int32)
    if kind in ("exact", "exact16"):
        k = ((i * 7919 + rank * 104729) % 2049) - 1024
        e = (i // 4096) % 16 - 8 if kind == "exact" else (i // 4096) % 10 - 10  # exact16: fits float16
        return np.ldexp(k.astype(np.float32), e.astype(np.int32)).astype(np.float32)
    if kind == "normal":
        return np.random.default_rng(1000 + rank).standard_normal(size).astype(np.float32)
    if kind == "exact64":  # float64: 2^30 + k * 2^-20 (exact float64 sums, far beyond float32's precision)
        k = ((i * 7919 + rank * 104729) % 2049) - 1024
        return 2.0**30 + np.ldexp(k.astype(np.float64), -20) * (1 + (i % 3))
    if kind == "normal64":
        return np.random.default_rng(2000 + rank).standard_normal(size) * 1e3
    raise ValueError(kind)


def expected_sum(kind: str, world: int, size: int) -> np.ndarray:
    acc = np.zeros(size, dtype=np.int64 if kind == "int" else np.float64)
    for r in range(world):
        acc += _input(kind, r, size)
    if kind == "int":
        return acc.astype(np.int32)  # wrapping, like the switch (no wrap happens with these inputs)
    return acc


def abs_sum(kind: str, world: int, size: int) -> np.ndarray:
    acc = np.zeros(size, dtype=np.float64)
    for r in range(world):
        acc += np.abs(_input(kind, r, size))
    return acc


# Per-element bound for inexact inputs: rtol * sum_r |x_r| + atol.
# float16/bfloat16: each input and the result are rounded once (2^-11 / 2^-8 relative each).
# fixed32: every rank rounds once at scale 2^-S, S = 30 - E - ceil(log2 N) with max |x| < 2^E.
# float64: the arrival order changes the last bits of a double.
TOLERANCE = {"float32": 1e-6, "fixed32": 1e-6, "float16": 2e-3, "bfloat16": 2e-2, "float64": 1e-15}


def atol(wire: str, world: int, max_abs: float) -> float:
    if wire == "fixed32":
        return world * max_abs * 2.0 ** -(30 - int(np.ceil(np.log2(world))))
    if wire == "float16":
        return (world + 1) * 2.0**-24  # subnormal spacing
    return 0.0


def check(kind: str, wire: str, world: int, x: np.ndarray) -> tuple[bool, str]:
    size = x.size
    want = expected_sum(kind, world, size)
    if kind == "int":
        bad = np.flatnonzero(x != want)
        if bad.size:
            j = bad[0]
            return False, f"int32 mismatch at {j}: {x[j]} != {want[j]} ({bad.size} bad)"
        return True, "exact"
    exact = (kind == "exact" and wire in ("float32", "fixed32", "float64")) or (
        kind == "exact64" and wire == "float64"
    )
    if exact:  # by construction
        bad = np.flatnonzero(x.astype(np.float64) != want)
        if bad.size:
            j = bad[0]
            return False, f"{wire} not exact at {j}: {x[j]!r} != {want[j]!r} ({bad.size} bad)"
        return True, "exact"
    mags = abs_sum(kind, world, size)
    max_abs = max(float(np.abs(_input(kind, r, size)).max()) for r in range(world))
    excess = np.abs(x.astype(np.float64) - want) - (TOLERANCE[wire] * mags + atol(wire, world, max_abs))
    if np.isnan(excess).any() or (excess > 0).any():
        j = int(np.nanargmax(np.where(np.isnan(excess), np.inf, excess)))
        return False, f"{wire} error too large at {j}: {x[j]!r} vs {want[j]!r} (sum |x| {mags[j]:.3g})"
    return True, "within tolerance"


# ---------------------------------------------------------------------------- process plumbing


def reporting(body):
    """A worker for run_workers from body(out, rank, *args), which fills its report `out` ("results" to
    begin with): an exception goes into out["error"], and the report is queued whatever happens."""

    @functools.wraps(body)
    def worker(q, rank, *args):
        out = {"results": []}
        try:
            body(out, rank, *args)
        except Exception:
            out["error"] = traceback.format_exc()
        q.put((rank, out))

    return worker


def run_workers(target, args_per_rank: list[tuple], deadline_s: float) -> dict[int, dict]:
    """Starts one spawned process per entry (args start with rank) and collects one report each."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target, args=(q, *a), daemon=True) for a in args_per_rank]
    for p in procs:
        p.start()
    reports: dict[int, dict] = {}
    deadline = time.monotonic() + deadline_s
    try:
        while len(reports) < len(procs):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"workers did not report within {deadline_s} s (got ranks {sorted(reports)})"
                )
            try:
                rank, report = q.get(timeout=min(left, 0.5))
                reports[rank] = report
            except queue.Empty:
                dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0) and i not in reports]
                if dead:
                    raise AssertionError(
                        f"worker(s) {dead} died without a report: exit codes "
                        f"{[procs[i].exitcode for i in dead]}"
                    ) from None
    finally:
        join_or_kill(procs, 5)
    return reports


@reporting
def _plan_worker(out, rank, world, address, plan, connect_kwargs):
    """Runs `plan`: a list of (job, wire, cases); a case is (kind, size). Reports verdicts."""
    out.update(stats={}, digests={})
    for job, wire, cases in plan:
        kw = dict(connect_kwargs)
        if isinstance(kw.get("shuffle_seed"), list):
            kw["shuffle_seed"] = kw["shuffle_seed"][rank]
        with gradswitch.connect(
            address, job=job, rank=rank, world_size=world, wire=wire, timeout=WORKER_TIMEOUT, **kw
        ) as g:
            for kind, size in cases:
                x = make_input(kind, rank, size)
                t0 = time.perf_counter()
                y = g.allreduce(x)
                dt = time.perf_counter() - t0
                assert y is x
                ok, info = check(kind, wire, world, x)
                out["results"].append((job, wire, kind, size, ok, info, dt))
                out["digests"][(job, kind, size)] = hashlib.sha256(x.tobytes()).hexdigest()
            out["stats"][job] = g.stats()


def assert_reports(reports: dict[int, dict]) -> None:
    errors = {r: rep["error"] for r, rep in reports.items() if "error" in rep}
    assert not errors, "worker errors:\n" + "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())
    bad = [(r, res) for r, rep in reports.items() for res in rep["results"] if not res[4]]
    assert not bad, f"wrong results: {bad[:5]}"


SIZES = [1, 359, 360, 361, 4097, 1_000_003]


BIG = 16 * 1024 * 1024  # 64 MB of float32


def matrix_plan(world: int, big_wires: tuple[str, ...]) -> list:
    plan = []
    for wire in ("float32", "fixed32", "float16", "bfloat16"):
        fkind = "exact" if wire in ("float32", "fixed32") else "exact16"
        cases = [(fkind, s) for s in SIZES] + [("int", s) for s in SIZES[:4] + [100_003]]
        cases += [("normal", 200_003)]
        if wire in big_wires:
            cases.append((fkind, BIG))
        plan.append((f"matrix-{world}-{wire}", wire, cases))
    return plan


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_allreduce_every_wire(start_switch, world):
    sw = start_switch()
    big_wires = {2: ("float32", "fixed32", "float16", "bfloat16"), 4: ("fixed32",)}.get(world, ())
    plan = matrix_plan(world, big_wires)
    if world == 2:
        plan.append(("matrix-2-int64mb", "float32", [("int", BIG)]))
    reports = run_workers(
        _plan_worker, [(r, world, sw.address, plan, {}) for r in range(world)], deadline_s=240
    )
    assert_reports(reports)
    slow = sorted(reports[0]["results"], key=lambda r: -r[6])[:3]
    print("slowest allreduces (rank 0):", [(r[0], r[2], r[3], f"{r[6]:.3f}s") for r in slow])
    # Every rank holds the same bytes.
    for key in reports[0]["digests"]:
        assert len({rep["digests"][key] for rep in reports.values()}) == 1, f"ranks disagree on {key}"
    # The switch saw the jobs come and go.
    assert sw.stats()["completed"] > 0
    deadline = time.monotonic() + 5
    while sw.jobs() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sw.jobs() == [], f"jobs left behind: {sw.jobs()}"


def test_fixed32_bitwise_identical_across_arrival_orders(start_switch):
    sw = start_switch(threads=2)
    world = 4
    cases = [("normal", 300_007), ("exact", 50_000)]
    digests = []
    for run, seeds in enumerate(([0, 0, 0, 0], [11, 22, 33, 44], [7, 0, 9, 1])):
        plan = [(f"order-{run}", "fixed32", cases)]
        reports = run_workers(
            _plan_worker,
            [(r, world, sw.address, plan, {"shuffle_seed": seeds}) for r in range(world)],
            deadline_s=90,
        )
        assert_reports(reports)
        per_rank = {rep["digests"][(f"order-{run}", "normal", 300_007)] for rep in reports.values()}
        assert len(per_rank) == 1
        digests.append(per_rank.pop())
    assert len(set(digests)) == 1, "fixed32 results differ between arrival orders"


@pytest.mark.parametrize("loss", [0.01, 0.1])
def test_loss_on_both_sides_gives_exact_results(start_switch, loss):
    sw = start_switch(drop_rate=loss, seed=3)
    world = 3
    size = 300_007 if loss > 0.05 else 1_000_003
    plan = [
        (f"loss-fixed-{loss}", "fixed32", [("exact", size), ("int", size), ("exact", 361)]),
        (f"loss-f32-{loss}", "float32", [("exact", size)]),
    ]
    reports = run_workers(
        _plan_worker,
        [(r, world, sw.address, plan, {"drop_rate": loss, "seed": 17}) for r in range(world)],
        deadline_s=180,
    )
    assert_reports(reports)
    retx = sum(rep["stats"][job]["retransmissions"] for rep in reports.values() for job in rep["stats"])
    injected = sum(rep["stats"][job]["injected_drops"] for rep in reports.values() for job in rep["stats"])
    assert injected > 0
    assert retx > 0
    st = sw.stats()
    assert st["retx_answered"] > 0
    assert st.get("udp.injected_drops", st.get("drops", 0)) > 0


def test_float64_arrays_on_every_float_wire(start_switch):
    """float64 arrays keep double precision on the float64 wire (exact where the inputs make float64
    sums exact), are rounded to float32 on the float32 wire, quantised from doubles on fixed32; a
    float32 array on the float64 wire is summed exactly and rounded once."""
    sw = start_switch()
    world = 3
    plan = [
        ("f64-float64", "float64", [("exact64", 100_003), ("normal64", 50_001), ("exact", 20_011)]),
        ("f64-float32", "float32", [("normal64", 50_001)]),
        ("f64-fixed32", "fixed32", [("normal64", 50_001), ("exact64", 361)]),
    ]
    args = [(r, world, sw.address, plan, {}) for r in range(world)]
    reports = run_workers(_plan_worker, args, deadline_s=90)
    assert_reports(reports)
    for key in reports[0]["digests"]:
        assert len({rep["digests"][key] for rep in reports.values()}) == 1, f"ranks disagree on {key}"
    # 2^30 + k 2^-20 summed in float32 would be off by up to 2^6: the float64 wire got it exactly.
    results = [r[:6] for r in reports[0]["results"]]
    assert ("f64-float64", "float64", "exact64", 100_003, True, "exact") in results


@reporting
def _async_worker(out, rank, world, address, use_torch):
    with gradswitch.connect(
        address, job="async", rank=rank, world_size=world, wire="fixed32", timeout=WORKER_TIMEOUT
    ) as g:
        xs = [make_input("exact", rank, n) for n in (10, 70_001, 3, 500_000)]
        ints = make_input("int", rank, 12_345)
        handles = [g.allreduce_async(x) for x in xs] + [g.allreduce_async(ints)]
        for h, x in zip(handles, xs + [ints], strict=True):
            y = h.wait()
            assert y is x and h.done()
            kind = "int" if x.dtype == np.int32 else "exact"
            out["results"].append(
                ("async", "fixed32", kind, x.size) + check(kind, "fixed32", world, x) + (0,)
            )
        if use_torch:
            import torch

            t = torch.from_numpy(make_input("exact", rank, 100_001))
            p = torch.nn.Parameter(torch.from_numpy(make_input("exact", rank, 1001)))
            ti = torch.from_numpy(make_input("int", rank, 777))
            assert g.allreduce(t) is t
            g.allreduce(p.data)
            g.allreduce_async(ti).wait()
            for kind, arr in (("exact", t.numpy()), ("exact", p.detach().numpy()), ("int", ti.numpy())):
                out["results"].append(
                    ("torch", "fixed32", kind, arr.size) + check(kind, "fixed32", world, arr) + (0,)
                )


def test_async_api_and_torch(start_switch):
    sw = start_switch()
    try:
        import torch  # noqa: F401

        use_torch = True
    except ImportError:
        use_torch = False
    reports = run_workers(_async_worker, [(r, 2, sw.address, use_torch) for r in range(2)], deadline_s=90)
    assert_reports(reports)
    assert len(reports[0]["results"]) == (8 if use_torch else 5)


@pytest.mark.skipif(os.environ.get("GRADSWITCH_BENCH") != "1", reason="set GRADSWITCH_BENCH=1 to measure")
@pytest.mark.parametrize("world,wire", [(2, "float32"), (2, "fixed32"), (4, "fixed32"), (8, "fixed32")])
def test_throughput(start_switch, world, wire):
    sw = start_switch()
    size = 16 * 1024 * 1024
    plan = [(f"bench-{world}-{wire}", wire, [("exact", size), ("exact", size)])]
    reports = run_workers(
        _plan_worker, [(r, world, sw.address, plan, {}) for r in range(world)], deadline_s=300
    )
    assert_reports(reports)
    dt = max(rep["results"][1][6] for rep in reports.values())
    rate = size * 4 / dt / 1e6
    print(f"\nworld {world} wire {wire}: 64 MB allreduce in {dt:.3f} s = {rate:.0f} MB/s per worker")
