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
gradswitch's allreduce_hook), local (no communication: the compute-only reference). For each it reports
the median time of an iteration (forward, backward with its communication, SGD step) and of the backward
pass plus communication; exposed communication = that minus the local backward. A final all-reduce
of the loss checks that every configuration trains the same model (loss after the timed iterations).
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
import torch.nn as nn
import torch.nn.functional as F


def make_model(width: int, depth: int, inputs: int, classes: int) -> nn.Module:
    layers, d = [], inputs
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, classes))
    return nn.Sequential(*layers)


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
    p.add_argument("--configs", default="local,gloo-ddp,gs-ddp,gs-overlap")
    p.add_argument("--chunk-kb", default="1024", help="comma-separated chunk sizes for gs-overlap")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket cap")
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--depth", type=int, default=2, help="hidden layers")
    p.add_argument("--inputs", type=int, default=1024)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="per worker")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    p.add_argument(
        "--stats",
        action="store_true",
        help="per configuration through the switch: every rank's iteration times and worker counters",
    )
    return p.parse_args(argv)


def expand_configs(args) -> list[str]:
    out = []
    for c in args.configs.split(","):
        c = c.strip()
        if c == "gs-overlap":
            out += [f"gs-overlap:{kb}" for kb in args.chunk_kb.split(",")]
        elif c:
            out.append(c)
    return out


def run_config(name: str, args, rank: int, world: int, gloo_pg, state, ring_pg=None) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradswitch.timeline as _timeline
    import gradswitch.torch as gst

    torch.manual_seed(0)
    model = make_model(args.width, args.depth, args.inputs, args.classes)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    net, overlap = model, None
    if name == "gloo-ddp":
        net = DDP(model, process_group=gloo_pg, bucket_cap_mb=args.bucket_mb)
    elif name == "gs-ddp":
        net = DDP(model, bucket_cap_mb=args.bucket_mb)  # default group: gradswitch
    elif name == "gs-ring-ddp":
        net = DDP(model, process_group=ring_pg, bucket_cap_mb=args.bucket_mb)
    elif name == "gs-hook":
        net = DDP(model, process_group=gloo_pg, bucket_cap_mb=args.bucket_mb)
        net.register_comm_hook(state, gst.state_hook)
    elif name.startswith("gs-overlap"):
        kb = int(name.split(":")[1]) if ":" in name else 1024
        overlap = gst.ChunkedOverlap(model, chunk_bytes=kb << 10)
    elif name != "local":
        raise SystemExit(f"unknown config {name}")
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.batch, args.inputs, generator=g)
    y = torch.randint(0, args.classes, (args.batch,), generator=g)
    it_t, bwd_t = [], []
    gs_group = gst.gradswitch_group() if args.stats and name.startswith("gs-") else None
    stats0 = None
    for i in range(args.warmup + args.iters):
        if gs_group and i == args.warmup:
            stats0 = gs_group.group.stats()
            cpu0 = _thread_cpu()
        dist.barrier(group=gloo_pg)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        t1 = time.perf_counter()
        loss.backward()  # DDP and ChunkedOverlap return once the gradients are averaged
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if gs_group and _timeline.enabled():  # the iteration beside its buckets, for their timing in it
            end = time.monotonic_ns()
            _timeline.span(rank, "bench: iterations", f"iteration {i}", end - int((t3 - t0) * 1e9), end)
        if i >= args.warmup:
            it_t.append(t3 - t0)
            bwd_t.append(t2 - t1)
    if overlap:
        overlap.remove()
    final = torch.tensor([loss.item()])
    dist.all_reduce(final, group=gloo_pg)
    # every rank's medians; report the slowest rank (the iteration ends when the last rank is done)
    med = torch.tensor([statistics.median(it_t), statistics.median(bwd_t)], dtype=torch.float64)
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=gloo_pg)
    out = {
        "config": name,
        "iteration_s": med[0].item(),
        "backward_comm_s": med[1].item(),
        "loss": final.item() / world,
    }
    if gs_group:
        out["per_rank"] = _rank_stats(gloo_pg, it_t, stats0, gs_group.group.stats(), cpu0)
    return out


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
    dist.init_process_group(
        "gradswitch",
        rank=rank,
        world_size=world,
        pg_options=gst.Options(switch=args.switch, wire=args.wire, timeout=60),
    )
    gloo_pg = dist.new_group(backend="gloo")
    configs = expand_configs(args)
    ring_pg = (
        dist.new_group(
            backend="gradswitch",
            pg_options=gst.Options(switch=args.switch, wire=args.wire, timeout=60, algorithm="ring"),
        )
        if "gs-ring-ddp" in configs
        else None
    )
    state = (
        gst.GradswitchState(args.switch, process_group=gloo_pg, wire=args.wire)
        if "gs-hook" in configs
        else None
    )
    nparams = sum(
        p.numel() for p in make_model(args.width, args.depth, args.inputs, args.classes).parameters()
    )
    results = []
    for name in configs:
        r = run_config(name, args, rank, world, gloo_pg, state, ring_pg)
        results.append(r)
        if rank == 0:
            print(
                f"{name:16s} iteration {r['iteration_s'] * 1e3:8.1f} ms   backward+comm "
                f"{r['backward_comm_s'] * 1e3:8.1f} ms   loss {r['loss']:.5f}",
                flush=True,
            )
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
        out = {
            "world_size": world,
            "params": nparams,
            "grad_bytes": nparams * 4,
            "wire": args.wire,
            "batch_per_worker": args.batch,
            "switch": args.switch,
            "threads_per_worker": args.threads,
            "cpus": os.cpu_count(),
            "results": results,
        }
        by = {r["config"]: r for r in results}
        if "gloo-ddp" in by and "gs-ddp" in by:
            out["speedup_gs_ddp_vs_gloo"] = by["gloo-ddp"]["iteration_s"] / by["gs-ddp"]["iteration_s"]
        if "gloo-ddp" in by and "gs-ring-ddp" in by:
            out["speedup_gs_ring_ddp_vs_gloo"] = (
                by["gloo-ddp"]["iteration_s"] / by["gs-ring-ddp"]["iteration_s"]
            )
        print(json.dumps({k: v for k, v in out.items() if k != "results"}), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    return results


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
    nparams = sum(
        p.numel() for p in make_model(args.width, args.depth, args.inputs, args.classes).parameters()
    )
    print(
        f"MLP {args.inputs}-{'-'.join([str(args.width)] * args.depth)}-{args.classes}: {nparams / 1e6:.1f} M "
        f"parameters ({nparams * 4 / 2**20:.0f} MiB of gradients), {args.nproc} workers, "
        f"batch {args.batch}/worker, "
        f"switch {args.switch}, wire {args.wire}",
        flush=True,
    )
    try:
        import torch.multiprocessing as mp

        mp.start_processes(_spawn_entry, args=(args.nproc, args), nprocs=args.nproc, start_method="spawn")
    finally:
        if sw:
            sw.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
