#!/usr/bin/env python3
"""Block skipping (issue 38; docs/protocol.md §9, docs/torch.md "Sparse gradients") against the dense
allreduce, side by side in one run, on a loopback gradswitchd.

    python3 bench/sparse_bench.py [--series ddp,sweep] [--rounds 5] [--out bench/results/<date>-sparse]
    sudo flock /tmp/gradswitch-netns.lock python3 bench/sparse_bench.py --series sweep --rate 1gbit

ddp: bench/torch_iteration.py's embbag model (an nn.EmbeddingBag table of --rows x --dim, each worker's
  batch reading --touch of its rows, then a small MLP) under DDP, --workers processes. Configurations,
  all in one torch_iteration run and alternated round by round: gloo-ddp (the dense table gradient over
  gloo), gloo-ddp+coo (sparse=True: gloo's sparse allreduce), gs-ddp (dense through the switch),
  gs-ddp+sparse (the dense gradient's zero blocks skipped) and gs-ddp+coo+sparse (the union of the
  touched rows through the switch). Per configuration: the median iteration over rounds (each round's
  figure is torch_iteration's median over its iterations, slowest rank) with the range, and per round
  the ratio to gs-ddp (median, range). torch_iteration checks that every configuration ends with the
  same loss curve.
sweep: Group.allreduce of a float32 tensor of --mb MB in which a share of the blocks (a packet's
  elements) is non-zero, the same blocks on every rank (so the union's share is the density), with
  sparse=False and sparse=True alternated (the order swapped every round): --workers ranks as threads
  of this process on loopback, or with --rate one rank per machine of the emulated testbed (links at
  that rate; a one-element allreduce lines the ranks up before each timed one). Per density: both
  medians with their ranges over rounds (a round's figure: the median over --iters allreduces of the
  slowest rank's time), the per-round ratio dense / sparse, and the bytes each rank sent per
  allreduce; every sparse result is compared bitwise with the dense one. The crossover is the highest
  density where the median ratio falls through 1 (linear between the sweep's points): the figure
  sparse="auto"'s threshold (gradswitch._sparse.AUTO_MIN_ZERO_SHARE) is set from.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import gradswitch
from gradswitch import _sparse
from gradswitch.local_switch import LocalSwitch

DDP_CONFIGS = ("gloo-ddp", "gloo-ddp+coo", "gs-ddp", "gs-ddp+sparse", "gs-ddp+coo+sparse")
DENSITIES = (0.01, 0.05, 0.125, 0.25, 0.5, 0.75, 1.0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--series", default="ddp,sweep", help="comma list of ddp, sweep")
    p.add_argument("--rounds", type=int, default=5, help="alternated rounds of every configuration")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--iters", type=int, default=5, help="timed iterations / allreduces per round")
    p.add_argument("--rows", type=int, default=200_000, help="ddp: rows of the embedding table")
    p.add_argument("--dim", type=int, default=64, help="ddp: the table's columns")
    p.add_argument("--touch", type=float, default=0.026, help="ddp: share of the rows a worker reads")
    p.add_argument("--configs", default=",".join(DDP_CONFIGS), help="ddp: torch_iteration configurations")
    p.add_argument("--mb", type=float, default=16.0, help="sweep: tensor size in MB (10^6 bytes)")
    p.add_argument("--densities", default=",".join(map(str, DENSITIES)), help="sweep: non-zero block shares")
    p.add_argument("--rate", default=None, help="sweep: on the emulated testbed at this link rate (root)")
    p.add_argument("--out", default=None, help="results folder (default: print only)")
    p.add_argument(
        "--plot",
        default=None,
        metavar="FILE",
        help="sweep: also draw it into FILE (.svg/.png; bench/plot_sparse_sweep.py, needs matplotlib)",
    )
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)  # a testbed rank
    p.add_argument("--switch", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.series = [s.strip() for s in a.series.split(",") if s.strip()]
    if set(a.series) - {"ddp", "sweep"} or a.rounds < 1 or a.iters < 1 or a.workers < 1:
        p.error("--series takes ddp and sweep; --rounds, --iters and --workers at least 1")
    if a.plot and "sweep" not in a.series:
        p.error("--plot draws the sweep: add sweep to --series")
    a.density_list = [float(d) for d in a.densities.split(",")]
    if not all(0 < d <= 1 for d in a.density_list):
        p.error("--densities: shares in (0, 1]")
    return a


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def fmt(s: dict, scale: float = 1e3, digits: int = 1) -> str:
    return f"{s['median'] * scale:.{digits}f} ({s['min'] * scale:.{digits}f}-{s['max'] * scale:.{digits}f})"


# ---------------------------------------------------------------------------------------------- ddp
def run_ddp(a: argparse.Namespace) -> dict:
    import torch_iteration  # bench/, beside this file

    configs = list(dict.fromkeys(c for c in a.configs.split(",") if c))
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "ddp.json"
        argv = ["--model", "embbag", "--nproc", str(a.workers), "--iters", str(a.iters), "--warmup", "1"]
        argv += ["--rows", str(a.rows), "--dim", str(a.dim), "--touch", str(a.touch), "--json", str(js)]
        argv += ["--configs", ",".join(configs * a.rounds)]  # A, B, C, A, B, C, ...
        if torch_iteration.main(argv) != 0 or not js.exists():
            raise SystemExit("bench/torch_iteration.py failed")
        out = json.loads(js.read_text())
    per = {c: [r for r in out["results"] if r["config"] == c] for c in configs}
    losses = {c: per[c][0]["losses"] for c in configs}
    ref = losses[configs[0]]
    summary = {"params": out["params"], "union": ddp_union(a), "configs": {}}
    # the same training whatever carries the gradients (float sums differ only in their order)
    summary["max_loss_diff"] = max(abs(x - y) for c in configs for x, y in zip(losses[c], ref, strict=True))
    for c in configs:
        its = [r["iteration_s"] for r in per[c]]
        row = {"iteration_s": spread(its), "rounds_s": its, "losses": losses[c]}
        if "gs-ddp" in per:
            row["speedup_vs_gs_ddp"] = spread(
                [d["iteration_s"] / r["iteration_s"] for d, r in zip(per["gs-ddp"], per[c], strict=True)]
            )
        summary["configs"][c] = row
    return summary


def ddp_union(a: argparse.Namespace) -> dict:
    """The union's share of rows and of float32 blocks: the batches torch_iteration.run_config draws
    (generator seed 1000 + rank)."""
    import torch
    from ddp_models import make_batch

    ns = argparse.Namespace(model="embbag", rows=a.rows, touch=a.touch, batch=16, classes=1000)
    touched = np.zeros(a.rows, bool)
    for rank in range(a.workers):
        x, _ = make_batch(ns, torch.Generator().manual_seed(1000 + rank))
        touched[x.reshape(-1).numpy()] = True
    elems = np.repeat(touched, a.dim).astype(np.float32)
    block = _sparse.block_elements(1500 - 60, "float32", np.dtype(np.float32))
    return {"rows": float(touched.mean()), "blocks": float(_sparse.block_mask(elems, block).mean())}


def ddp_table(s: dict) -> str:
    lines = [
        f"{s['params'] / 1e6:.1f} M parameters; union of the workers' rows {s['union']['rows']:.1%}, "
        f"of the dense gradient's blocks {s['union']['blocks']:.1%}; loss curves agree within "
        f"{s['max_loss_diff']:.1e}",
        "",
        "| configuration | iteration ms, median (range) | vs gs-ddp, median (range) |",
        "|---|---:|---:|",
    ]
    for c, r in s["configs"].items():
        sp = r.get("speedup_vs_gs_ddp")
        ratio = f"{sp['median']:.2f}x ({sp['min']:.2f}-{sp['max']:.2f})" if sp else "-"
        lines.append(f"| {c} | {fmt(r['iteration_s'])} | {ratio} |")
    return "\n".join(lines)


# -------------------------------------------------------------------------------------------- sweep
def sweep_inputs(n: int, block: int, density: float, world: int) -> list[np.ndarray]:
    """Each rank's tensor: small integers (float32 sums of them are exact in any order, so sparse and
    dense must agree bitwise) in the same round(density * blocks) blocks, +0 elsewhere."""
    blocks = -(-n // block)
    keep = np.zeros(blocks, bool)
    keep[np.random.default_rng(7).permutation(blocks)[: max(1, round(density * blocks))]] = True
    mask = np.repeat(keep, block)[:n]
    out = []
    for r in range(world):
        x = np.random.default_rng(r).integers(-1000, 1001, n).astype(np.float32)
        x[~mask] = 0
        out.append(x)
    return out


def sweep_rank(r: int, a, address: str, sync=None) -> dict:
    """One rank's share of the sweep: every round, every density, both modes (order swapped). Returns
    {"times": [[round, density, sparse, [seconds per allreduce]], ...], "bytes": [[density, sparse,
    bytes sent per allreduce], ...]}. sync() lines the ranks up before each allreduce (default: a
    one-element allreduce through the switch)."""
    n = int(a.mb * 1e6) // 4
    out: dict = {"rank": r, "times": [], "bytes": []}
    with gradswitch.connect(address, "sparse-sweep", r, a.workers, timeout=120) as g:
        sync = sync or (lambda: g.allreduce(np.zeros(1, np.int32)))
        block = _sparse.block_elements(g._native.payload_bytes, g.wire, np.dtype(np.float32))
        inputs = {d: sweep_inputs(n, block, d, a.workers)[r] for d in a.density_list}
        buf = np.empty(n, np.float32)
        for rnd in range(a.rounds):
            for d in a.density_list:
                results = {}
                for mode in (False, True) if rnd % 2 == 0 else (True, False):
                    sent0, ts = g.stats()["bytes_sent"], []
                    for _ in range(a.iters):
                        buf[:] = inputs[d]
                        sync()
                        t = time.perf_counter()
                        g.allreduce(buf, sparse=mode)
                        ts.append(time.perf_counter() - t)
                    out["times"].append([rnd, d, mode, ts])
                    if rnd == 0:
                        out["bytes"].append([d, mode, (g.stats()["bytes_sent"] - sent0) / a.iters])
                    results[mode] = buf.copy()
                if not np.array_equal(results[True].view(np.int32), results[False].view(np.int32)):
                    raise AssertionError(f"rank {r}: sparse sum differs from dense at density {d}")
    return out


def sweep_threads(a: argparse.Namespace) -> list[dict]:
    """The ranks as threads of this process, on a loopback gradswitchd."""
    barrier = threading.Barrier(a.workers)

    def rank(r: int, address: str) -> dict:
        try:
            return sweep_rank(r, a, address, barrier.wait)
        except BaseException:
            barrier.abort()  # the other ranks' waits raise instead of hanging
            raise

    with LocalSwitch(threads=1) as sw, ThreadPoolExecutor(a.workers) as pool:
        return list(pool.map(rank, range(a.workers), [sw.address] * a.workers))


def sweep_testbed(a: argparse.Namespace) -> list[dict]:
    """One rank per worker machine of the emulated testbed (docs/testbed.md, --rate links), gradswitchd
    in the switch's namespace (gradswitch.baselines' daemon); each rank prints its GSRESULT line."""
    from gradswitch.baselines.common import results_of
    from gradswitch.baselines.gradswitch_sys import switch_daemon
    from gradswitch.testbed import Testbed

    own = [f"--{k}={v}" for k, v in (("mb", a.mb), ("rounds", a.rounds), ("iters", a.iters))]
    own += [f"--workers={a.workers}", f"--densities={a.densities}"]
    with Testbed(workers=a.workers, rate=a.rate, name="spb") as tb, switch_daemon(tb) as sw:
        procs = [
            (
                f"w{r}",
                tb.popen(
                    f"w{r}",
                    [sys.executable, __file__, *own, f"--rank={r}", f"--switch={sw.address}"],
                    stdout=-1,
                    stderr=-1,
                    text=True,
                ),
            )
            for r in range(a.workers)
        ]
        return sorted(results_of(procs, 900, "sparse sweep"), key=lambda o: o["rank"])


def run_sweep(a: argparse.Namespace) -> dict:
    outs = sweep_testbed(a) if a.rate else sweep_threads(a)
    per = {}  # (round, density, sparse) -> every rank's times
    for o in outs:
        for rnd, d, m, ts in o["times"]:
            per.setdefault((rnd, d, m), []).append(ts)
    sent = {(d, m): b for d, m, b in outs[0]["bytes"]}
    rows = []
    for d in a.density_list:
        # a round's figure: the median over its allreduces of the slowest rank's time
        med = {
            m: [statistics.median(map(max, zip(*per[(rnd, d, m)], strict=True))) for rnd in range(a.rounds)]
            for m in (False, True)
        }
        ratio = [x / y for x, y in zip(med[False], med[True], strict=True)]
        rows.append(
            {
                "density": d,
                "dense_s": spread(med[False]),
                "sparse_s": spread(med[True]),
                "dense_over_sparse": spread(ratio),
                "bytes_dense": sent[(d, False)],
                "bytes_sparse": sent[(d, True)],
            }
        )
    return {"nbytes": int(a.mb * 1e6) // 4 * 4, "rate": a.rate, "rows": rows, "crossover": crossover(rows)}


def crossover(rows: list[dict]) -> float | None:
    """The highest density where the median dense / sparse ratio falls through 1 (linear between the
    sweep's points; from the top, so that a noisy point below does not hide it); None where sparse wins
    at no density or at every one."""
    pts = sorted((r["density"], r["dense_over_sparse"]["median"]) for r in rows)
    for (d0, q0), (d1, q1) in reversed(list(zip(pts, pts[1:], strict=False))):
        if q0 > 1 >= q1:
            return d0 + (q0 - 1) / (q0 - q1) * (d1 - d0)
    return None


def sweep_table(s: dict) -> str:
    lines = [
        f"{s['nbytes'] / 1e6:.0f} MB float32, {s['rate'] or 'loopback'}; crossover density "
        + (f"{s['crossover']:.1%}" if s["crossover"] is not None else "none in the sweep"),
        "",
        "| non-zero blocks | dense ms | sparse ms | dense / sparse | bytes sent, sparse / dense |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in s["rows"]:
        q = r["dense_over_sparse"]
        lines.append(
            f"| {r['density']:.1%} | {fmt(r['dense_s'])} | {fmt(r['sparse_s'])} | "
            f"{q['median']:.2f}x ({q['min']:.2f}-{q['max']:.2f}) | "
            f"{r['bytes_sparse'] / r['bytes_dense']:.3f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.rank is not None:  # one rank of sweep_testbed, in its namespace
        print("GSRESULT " + json.dumps(sweep_rank(a.rank, a, a.switch)), flush=True)
        return 0
    out: dict = {"args": {k: v for k, v in vars(a).items() if k != "density_list"}}
    out["machine"] = {"cpus": __import__("os").cpu_count(), "platform": platform.platform()}
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report = []
    if "sweep" in a.series:
        out["sweep"] = run_sweep(a)
        report += ["## sweep: Group.allreduce, sparse=False vs True", "", sweep_table(out["sweep"]), ""]
        print(report[-2], flush=True)
        if a.plot:
            from plot_sparse_sweep import plot

            plot([(a.rate or "loopback", out["sweep"])], a.plot)
    if "ddp" in a.series:
        out["ddp"] = run_ddp(a)
        report += ["## ddp: embedding-bag model", "", ddp_table(out["ddp"]), ""]
        print(report[-2], flush=True)
    if a.out:
        d = Path(a.out)
        d.mkdir(parents=True, exist_ok=True)
        (d / "results.json").write_text(json.dumps(out, indent=1))
        (d / "summary.md").write_text("\n".join(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
