"""Iteration time of a communication-bound model (an MLP with >= 25 M parameters): gradswitch vs gloo,
and uniform-chunk overlap (ChunkedOverlap) vs DDP buckets.

Local (spawns N workers and a loopback switch):

    python bench/torch_iteration.py --nproc 4 --iters 20
    python bench/torch_iteration.py --nproc 4 --configs gloo-ddp,gs-ddp,gs-overlap --chunk-kb 256,1024

One rank per host (testbed / several machines): run on every host with the same arguments

    python bench/torch_iteration.py --rank R --world-size 4 --master-addr 10.0.0.1 --master-port 29500 \
        --switch 10.0.0.254:7700 --json out.json

Configurations: gloo-ddp (DDP over gloo's ring allreduce), gs-ddp (DDP over the "gradswitch" process
group, 25 MB buckets), gs-ring-ddp (the same over the ring among the workers, algorithm="ring", paper
001), gs-overlap[:KB] (ChunkedOverlap, chunks of KB KiB), gs-hook (DDP over gloo with
gradswitch's allreduce_hook), gs-deadline-ddp (gs-ddp with bounded-time rounds, --deadline-us and
--quorum, docs/protocol.md §3.1), gs-concede-ddp (gs-deadline-ddp whose ranks concede chunks while their
uplink paces the job, Options.concede, §3.1 "Concede"), gs-concede-ef-ddp (gs-concede-ddp with
Options.error_feedback: what a sum lacked of a rank goes in its later steps), local (no communication:
the compute-only reference). Suffixes (issue 38):
+coo makes the gradients of nn.Embedding and nn.EmbeddingBag layers sparse COO tensors (sparse=True),
+sparse / +auto run that configuration with the default gradswitch group's Options.sparse "on" / "auto"
(docs/torch.md "Sparse gradients"), e.g. gs-ddp+coo+sparse. For each it reports
the median time of an iteration (forward, backward with its communication, SGD step) and of the backward
pass plus communication; exposed communication = that minus the local backward. A final all-reduce
of the loss checks that every configuration trains the same model (loss after the timed iterations).
Also reported: the spread (latest minus earliest rank, by the clock every rank of one machine shares)
of the instant each rank's backward pass produced its first gradient, the earliest a contribution can
reach the switch: what a deadline must exceed (§3.1). --slow-rank R --slow-compute F emulates one
rank with an F times slower accelerator: R sleeps (F - 1) times its measured forward + backward before
each backward pass (a sleep, not work, so the other ranks keep the CPUs they share with it).
--task teacher (the MLP; issue 38's accuracy check) trains on a fresh batch each iteration, labelled by a
fixed random linear teacher, and reports each configuration's accuracy on held-out samples; with
--wire mx8 --error-feedback the gradswitch groups feed each rank's rounding back (docs/torch.md); the
deadline configurations (gs-deadline-ddp, gs-concede-ddp) take --error-feedback on any wire: there it
also keeps what a sum lacked of a rank (its concessions, its late chunks) for its next steps.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ddp_models import (  # noqa: E402
    add_arguments,
    bound_s,
    check_arguments,
    describe,
    loss_of,
    make_batch,
    make_model,
    test_accuracy,
    wire_s,
)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=4, help="local mode: workers to spawn")
    p.add_argument("--rank", type=int, default=None, help="multi-host mode: this process's rank")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int, default=None)
    p.add_argument("--switch", default=None, help="host:port of the switch (default: start one on loopback)")
    p.add_argument("--switch-threads", type=int, default=1)
    p.add_argument("--wire", default="float32")
    p.add_argument(
        "--error-feedback",
        action="store_true",
        help="the gradswitch groups' and the hook's error feedback (lossy wires: mx8, float16, bfloat16; "
        "the deadline configurations on any wire)",
    )
    p.add_argument("--lr", type=float, default=0.01, help="SGD's learning rate")
    p.add_argument("--configs", default="local,gloo-ddp,gs-ddp,gs-overlap")
    p.add_argument("--chunk-kb", default="1024", help="comma-separated chunk sizes for gs-overlap")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket cap")
    p.add_argument("--deadline-us", type=int, default=None, help="gs-deadline-ddp: Options.deadline_us")
    p.add_argument("--quorum", type=int, default=None, help="gs-deadline-ddp: Options.quorum")
    p.add_argument(
        "--no-rescale",
        action="store_true",
        help="the deadline configurations: Options(rescale=False), partial sums left as summed",
    )
    p.add_argument("--slow-rank", type=int, default=None, help="the rank --slow-compute slows")
    p.add_argument("--slow-compute", type=float, default=1.0, help="its compute, times the others'")
    add_arguments(p)
    p.add_argument("--rate", default=None, help="link rate (e.g. 1gbit): prints each configuration's bound")
    p.add_argument("--mtu", type=int, default=1500, help="the links' MTU, for the wire time of the bound")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    p.add_argument(
        "--stats",
        action="store_true",
        help="per configuration through the switch: every rank's iteration times and worker counters",
    )
    a = p.parse_args(argv)
    check_arguments(p, a)
    if a.rate is not None:
        from gradswitch.testbed import TestbedError, parse_rate

        try:
            a.rate_bps = parse_rate(a.rate)
        except TestbedError as e:
            p.error(str(e))
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be at least 1 and --warmup at least 0")
    if a.slow_compute < 1.0 or (a.slow_compute > 1.0) != (a.slow_rank is not None):
        p.error("--slow-compute F (at least 1) and --slow-rank R go together")
    for c in ("gs-deadline-ddp", "gs-concede-ddp", "gs-concede-ef-ddp"):
        if c in a.configs and a.deadline_us is None:
            p.error(f"configuration {c} needs --deadline-us")
    return a


def expand_configs(args) -> list[str]:
    out = []
    for c in args.configs.split(","):
        c = c.strip()
        if c == "gs-overlap":
            out += [f"gs-overlap:{kb}" for kb in args.chunk_kb.split(",")]
        elif c:
            out.append(c)
    return out


def _wrap(name: str, model, args, gloo_pg, state, pgs):
    """(the module to call, the ChunkedOverlap or None) of configuration `name`; pgs: the process
    groups of gs-ring-ddp and the deadline configurations."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradswitch.torch as gst

    groups = {"gloo-ddp": gloo_pg, "gs-ddp": None, "gs-hook": gloo_pg, **(pgs or {})}
    if name in groups:  # gs-ddp: the default group, gradswitch
        net = DDP(model, process_group=groups[name], bucket_cap_mb=args.bucket_mb)
        if name == "gs-hook":
            net.register_comm_hook(state, gst.state_hook)
        return net, None
    if name.startswith("gs-overlap"):
        kb = int(name.split(":")[1]) if ":" in name else 1024
        return model, gst.ChunkedOverlap(model, chunk_bytes=kb << 10)
    if name != "local":
        raise SystemExit(f"unknown config {name}")
    return model, None


class FirstGrad:
    """When the backward pass produced its first gradient (the earliest a stream could start): the
    no-communication run's reference for the bound (ddp_models.bound_s); `wall`, the same instant by
    the clock the ranks share, for the spread of the ranks' first contributions."""

    def __init__(self, model):
        self.at = self.wall = None
        self.handles = [p.register_post_accumulate_grad_hook(self._hook) for p in model.parameters()]

    def _hook(self, _p) -> None:
        if self.at is None:
            self.at, self.wall = time.perf_counter(), time.time()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def _apply_suffixes(name: str, model) -> str:
    """The configuration's name without its suffixes; applies them: +coo to the model's embedding
    layers, +sparse / +auto to the gradswitch group (without either: $GRADSWITCH_SPARSE, as at init)."""
    import gradswitch.torch as gst

    base, *flags = name.split("+")
    unknown = set(flags) - {"coo", "sparse", "auto"}
    if unknown:
        raise SystemExit(f"unknown suffix {'+'.join(sorted(unknown))} in config {name}")
    for m in model.modules():
        if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
            m.sparse = "coo" in flags
    mode = "on" if "sparse" in flags else "auto" if "auto" in flags else None
    gst.gradswitch_group().sparse = mode or os.environ.get("GRADSWITCH_SPARSE") or "off"
    return base


def run_config(name: str, args, rank: int, world: int, gloo_pg, state, pgs=None) -> dict:
    import gradswitch.timeline as _timeline
    import gradswitch.torch as gst

    torch.manual_seed(0)
    model = make_model(args)
    base = _apply_suffixes(name, model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    net, overlap = _wrap(base, model, args, gloo_pg, state, pgs)
    first = FirstGrad(model)
    slow_s = getattr(args, "slow_s", 0.0) if rank == args.slow_rank else 0.0
    batches = torch.Generator().manual_seed(1000 + rank)
    fresh = getattr(args, "task", "random") == "teacher"  # a new batch each iteration, to learn from
    x, y = make_batch(args, batches)
    phases, losses = [], []  # per measured iteration: iteration, forward, backward(+comm), step, first grad
    walls = []  # per measured iteration: the wall clock of the first gradient
    pg = (pgs or {}).get(base)  # the configuration's own group, else the default one
    gs_group = gst.gradswitch_group(pg) if args.stats and name.startswith("gs-") else None
    stats0 = None
    for i in range(args.warmup + args.iters):
        if gs_group and i == args.warmup:
            stats0 = gs_group.group.stats()
            cpu0 = _thread_cpu()
        if fresh and i:
            x, y = make_batch(args, batches)
        dist.barrier(group=gloo_pg)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_of(net(x), y)
        if slow_s:
            time.sleep(slow_s)  # --slow-compute: the rest of a slower accelerator's forward + backward
        t1 = time.perf_counter()
        first.at = None
        loss.backward()  # DDP and ChunkedOverlap return once the gradients are averaged
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if gs_group and _timeline.enabled():  # the iteration beside its buckets, for their timing in it
            end = time.monotonic_ns()
            _timeline.span(rank, "bench: iterations", f"iteration {i}", end - int((t3 - t0) * 1e9), end)
        if i >= args.warmup:
            phases.append((t3 - t0, t1 - t0, t2 - t1, t3 - t2, (first.at - t1) if base == "local" else 0.0))
            walls.append(first.wall)
    for h in (overlap, first):
        if h:
            h.remove()
    # the loss of every iteration averaged over the ranks (their batches differ): the same curve for
    # every configuration that sums the gradients
    curve = torch.tensor(losses, dtype=torch.float64)
    dist.all_reduce(curve, group=gloo_pg)
    # every rank's medians; report the slowest rank (the iteration ends when the last rank is done)
    med = torch.tensor([statistics.median(col) for col in zip(*phases, strict=True)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=gloo_pg)
    keys = ("iteration_s", "forward_s", "backward_comm_s", "step_s", "first_grad_s")
    out = {"config": name, **{k: v.item() for k, v in zip(keys, med, strict=True)}}
    out["losses"] = [v / world for v in curve.tolist()]
    out["loss"] = out["losses"][-1]
    out.update(_spread_and_fastest(gloo_pg, walls, statistics.median(ph[0] for ph in phases)))
    if fresh:
        out["accuracy"] = test_accuracy(args, model)
    if gs_group:
        out["per_rank"] = _rank_stats(gloo_pg, [ph[0] for ph in phases], stats0, gs_group.group.stats(), cpu0)
    return out


def _spread_and_fastest(gloo_pg, walls: list[float], iteration_s: float) -> dict:
    """The spread over ranks of each measured iteration's first gradient (its median and largest), and
    the fastest rank's median iteration (beside the slowest's, how far a straggler holds the others)."""
    late, early = (torch.tensor(walls, dtype=torch.float64) for _ in range(2))
    dist.all_reduce(late, op=dist.ReduceOp.MAX, group=gloo_pg)
    dist.all_reduce(early, op=dist.ReduceOp.MIN, group=gloo_pg)
    spread = (late - early).tolist()
    fastest = torch.tensor([iteration_s], dtype=torch.float64)
    dist.all_reduce(fastest, op=dist.ReduceOp.MIN, group=gloo_pg)
    return {
        "first_grad_spread_s": statistics.median(spread),
        "first_grad_spread_max_s": max(spread),
        "fastest_rank_iteration_s": fastest.item(),
    }


def compute_s(args, reps: int = 5) -> float:
    """The median forward + backward of the model alone (no communication, after one warm-up): what
    --slow-compute scales. Every rank runs it at once, so it is measured under the load of training."""
    torch.manual_seed(0)
    model = make_model(args)
    x, y = make_batch(args, torch.Generator().manual_seed(1))
    loss_of(model(x), y).backward()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        loss_of(model(x), y).backward()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process's threads by name (Linux; {} elsewhere)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for task in Path("/proc/self/task").glob("*") if Path("/proc/self/task").exists() else []:
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _rank_stats(gloo_pg, it_t: list[float], before: dict, after: dict, cpu0: dict) -> list[dict]:
    """Every rank's iteration times, the worker counters its measured iterations moved and the CPU
    seconds its threads spent in them (--stats)."""
    cpu = _thread_cpu()
    mine = {
        "iterations_ms": [round(t * 1e3, 1) for t in it_t],
        "counters": {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)},
        "thread_cpu_s": {
            k: round(v - cpu0.get(k, 0.0), 3) for k, v in cpu.items() if v - cpu0.get(k, 0.0) > 0.005
        },
    }
    every: list = [None] * dist.get_world_size(gloo_pg)
    dist.all_gather_object(every, mine, group=gloo_pg)
    return every


def worker(rank: int, world: int, args) -> list[dict]:
    import gradswitch.torch as gst

    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", args.master_addr)
    os.environ["MASTER_PORT"] = str(args.master_port)
    from gradswitch.torch.error_feedback import FEEDBACK_WIRES

    # Error feedback where it applies: the lossy wires everywhere, any wire in a deadline job.
    feedback = {"error_feedback": args.error_feedback and args.wire in FEEDBACK_WIRES}
    dist.init_process_group(
        "gradswitch",
        rank=rank,
        world_size=world,
        pg_options=gst.Options(switch=args.switch, wire=args.wire, timeout=60, **feedback),
    )
    gloo_pg = dist.new_group(backend="gloo")
    configs = expand_configs(args)
    rescale = not args.no_rescale
    extra = {
        "gs-ring-ddp": {"algorithm": "ring"},
        "gs-deadline-ddp": {
            "deadline_us": args.deadline_us, "quorum": args.quorum, "job": "deadline", "rescale": rescale,
            "error_feedback": args.error_feedback,
        },
        "gs-concede-ddp": {
            "deadline_us": args.deadline_us, "quorum": args.quorum, "concede": True, "job": "concede",
            "rescale": rescale,
            "error_feedback": args.error_feedback,
        },
        "gs-concede-ef-ddp": {
            "deadline_us": args.deadline_us, "quorum": args.quorum, "concede": True, "job": "concede-ef",
            "rescale": rescale,
            "error_feedback": True,
        },
    }
    pgs = {
        c: dist.new_group(
            backend="gradswitch",
            pg_options=gst.Options(
                switch=args.switch, wire=args.wire, timeout=60, **{**feedback, **extra[c]}
            ),
        )
        for c in extra
        if c in configs
    }
    state = (
        gst.GradswitchState(
            args.switch, process_group=gloo_pg, wire=args.wire, **feedback
        )
        if "gs-hook" in configs
        else None
    )
    nparams = sum(p.numel() for p in make_model(args).parameters())
    if rank == 0 and args.rank is not None:
        print(f"{describe(args, nparams)}, {world} workers, wire {args.wire}", flush=True)
    if args.slow_rank is not None:
        dist.barrier(group=gloo_pg)
        alone = compute_s(args)
        args.slow_s = (args.slow_compute - 1) * alone
    if rank == args.slow_rank:
        print(
            f"rank {rank}: forward + backward {alone * 1e3:.1f} ms; "
            f"sleeps {args.slow_s * 1e3:.1f} ms more each iteration (--slow-compute)",
            flush=True,
        )
    results = []
    for name in configs:
        r = run_config(name, args, rank, world, gloo_pg, state, pgs)
        results.append(r)
        if rank == 0:
            print(
                f"{name:16s} iteration {r['iteration_s'] * 1e3:8.1f} ms   backward+comm "
                f"{r['backward_comm_s'] * 1e3:8.1f} ms   loss {r['loss']:.5f}   first gradient spread "
                f"{r['first_grad_spread_s'] * 1e3:.1f} ms (at most {r['first_grad_spread_max_s'] * 1e3:.1f})",
                flush=True,
            )
            print(f"  loss per iteration: {' '.join(f'{v:.5f}' for v in r['losses'])}", flush=True)
            if "accuracy" in r:
                held_out = f"{args.test_samples} held-out samples"
                print(f"  test accuracy {r['accuracy']:.2f}% ({held_out})", flush=True)
            for rk, st in enumerate(r.get("per_rank", [])):
                print(f"  rank {rk}: {st['iterations_ms']} ms  {json.dumps(st['counters'])}", flush=True)
    local = next((r for r in results if r["config"] == "local"), None)
    for r in results:
        r["exposed_comm_s"] = r["backward_comm_s"] - local["backward_comm_s"] if local else None
    if state:
        state.close()
    dist.barrier(group=gloo_pg)
    dist.destroy_process_group()
    if rank == 0:
        report(args, world, nparams, results)
    return results


def bounds(args, world: int, nbytes: int, results: list[dict]) -> dict:
    """Each configuration's bound (ddp_models.bound_s: the no-communication run's phases and the wire
    time of `nbytes` at --rate), iteration / bound, and gradswitch DDP's speed-up over gloo beside the
    speed-up the bounds allow; {} without --rate or a `local` configuration."""
    local = next((r for r in results if r["config"] == "local"), None)
    if local is None or getattr(args, "rate_bps", None) is None:
        return {}
    out = {}
    for r in results:
        if r["config"] == "local":
            continue
        system = "gloo" if r["config"].startswith("gloo") else "gradswitch"
        wire = wire_s(nbytes, args.rate_bps, args.mtu, world, system)
        r["wire_s"], r["bound_s"] = wire, bound_s(local, wire)
        r["vs_bound"] = r["iteration_s"] / r["bound_s"]
    by = {r["config"]: r for r in results}
    if "gloo-ddp" in by and "gs-ddp" in by:
        allowed = by["gloo-ddp"]["bound_s"] / by["gs-ddp"]["bound_s"]
        got = by["gloo-ddp"]["iteration_s"] / by["gs-ddp"]["iteration_s"]
        # (got - 1) / (allowed - 1): the share of the gain the bounds allow (none where they allow none)
        share = (got - 1) / (allowed - 1) if allowed > 1.02 else None
        out = {"allowed_speedup_gs_ddp": allowed, "share_of_allowed_gain": share}
    return out


def report(args, world: int, nparams: int, results: list[dict]) -> None:
    """Rank 0: bounds, speed-ups and the JSON summary (--json)."""
    out = {
        "model": args.model,
        "world_size": world,
        "params": nparams,
        "grad_bytes": nparams * 4,
        "wire": args.wire,
        "error_feedback": args.error_feedback,
        "rescale": not args.no_rescale,
        "task": args.task,
        "lr": args.lr,
        "batch_per_worker": args.batch,
        "switch": args.switch,
        "rate": args.rate,
        "threads_per_worker": args.threads,
        "cpus": os.cpu_count(),
        "results": results,
    }
    out.update(bounds(args, world, nparams * 4, results))
    for r in results:
        if "bound_s" in r:
            print(
                f"{r['config']:16s} bound {r['bound_s'] * 1e3:8.1f} ms (wire {r['wire_s'] * 1e3:.1f} ms)   "
                f"iteration / bound {r['vs_bound']:.2f}",
                flush=True,
            )
    if out.get("share_of_allowed_gain") is not None:
        print(
            f"gs-ddp vs gloo-ddp: the bounds allow {out['allowed_speedup_gs_ddp']:.2f}x; measured "
            f"{out['share_of_allowed_gain'] * 100:.0f}% of that gain",
            flush=True,
        )
    by = {r["config"]: r for r in results}
    for name in ("gs-ddp", "gs-ring-ddp") + tuple(c for c in by if c.startswith("gs-overlap")):
        if "gloo-ddp" in by and name in by:
            key = "speedup_" + name.replace("-", "_").replace(":", "_") + "_vs_gloo"
            out[key] = by["gloo-ddp"]["iteration_s"] / by[name]["iteration_s"]
    print(json.dumps({k: v for k, v in out.items() if k != "results"}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def _spawn_entry(rank, world, args):
    worker(rank, world, args)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.master_port is None:
        args.master_port = int(os.environ.get("MASTER_PORT", 0)) or _free_port()
    if args.rank is not None:  # one rank of a multi-host run
        if not args.switch or not args.world_size:
            raise SystemExit("--rank needs --world-size and --switch")
        worker(args.rank, args.world_size, args)
        return 0
    sw = None
    if not args.switch:
        from gradswitch.local_switch import LocalSwitch

        sw = LocalSwitch(threads=args.switch_threads).start()
        args.switch = sw.address
    nparams = sum(p.numel() for p in make_model(args).parameters())
    what = describe(args, nparams)
    print(f"{what}, {args.nproc} workers, switch {args.switch}, wire {args.wire}", flush=True)
    try:
        import torch.multiprocessing as mp

        mp.start_processes(_spawn_entry, args=(args.nproc, args), nprocs=args.nproc, start_method="spawn")
    finally:
        if sw:
            sw.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
