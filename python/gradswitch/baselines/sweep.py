"""One worker of a latency sweep: allreduces of several sizes in one process, through gradswitch (the
switch, or paper 001's ring among the workers) or torch.distributed's gloo, a barrier before each
timed call (a 1-element allreduce, or gloo's barrier), every sum checked. Used by bench/ring_bench.py
for paper 001's Fig. 4 analog (latency vs N), the ring vs gloo comparison and the fallback timings.

    python -m gradswitch.baselines.sweep --system ring --switch 10.66.0.1:17700 --rank r --world N \
        --sizes 64,1024,67108864 --iters 20 --big-iters 4
    python -m gradswitch.baselines.sweep --system gloo --master 10.66.0.10:17100 ...

--system auto runs the allreduces with algorithm="auto" and reports, per iteration, which algorithm
served it (the bench kills the switch during the run).

--buckets K splits each buffer into K equal allreduces, as DDP hands its buckets to the process group:
all K queued at once (gradswitch's allreduce_async, gloo's async_op=True) and then waited for, or, with
--serial, each waited for before the next starts. The time of one iteration covers all K.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from .common import check, emit, grad

BIG = 1 << 20  # sizes from here on run --big-iters times


def _sizes(text: str) -> list[int]:
    out = [int(s) for s in text.split(",") if s]
    if not out or any(s < 4 or s % 4 for s in out):
        raise SystemExit(f"sweep: --sizes must be multiples of 4 bytes, got {text!r}")
    return out


def run(a) -> dict:
    times: dict[int, list[float]] = {}
    algos: list[str] = []
    max_err = 0.0
    if a.system == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", a.ifname)
        from datetime import timedelta

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{a.master}",
            rank=a.rank,
            world_size=a.world,
            timeout=timedelta(seconds=a.timeout),
        )

        def barrier():
            dist.barrier()

        def allreduce(buf):
            dist.all_reduce(torch.from_numpy(buf))

        def allreduce_async(buf):
            return dist.all_reduce(torch.from_numpy(buf), async_op=True)

        group = None
    else:
        import gradswitch

        algorithm = {"switch": "switch", "ring": "ring", "auto": "auto"}[a.system]
        group = gradswitch.connect(
            a.switch,
            peers=a.peers.split(",") if a.peers else None,
            job=a.job,
            rank=a.rank,
            world_size=a.world,
            wire=a.wire,
            algorithm=algorithm,
            timeout=a.timeout,
            token=a.token,
        )
        tok = np.zeros(1, np.float32)

        def barrier():
            group.allreduce(tok)

        def allreduce(buf):
            group.allreduce(buf)

        def allreduce_async(buf):
            return group.allreduce_async(buf)

    def buckets(buf):
        parts = np.array_split(buf, a.buckets)
        if a.serial:
            for part in parts:
                allreduce(part)
        else:
            for handle in [allreduce_async(part) for part in parts]:
                handle.wait()

    try:
        for nbytes in a.sizes:
            n = nbytes // 4
            iters = a.big_iters if nbytes >= BIG else a.iters
            buf = np.empty(n, np.float32)
            times[nbytes] = []
            for it in range(a.warmup + iters):
                np.copyto(buf, grad(a.rank, n, it))
                barrier()
                t0 = time.perf_counter()
                if a.buckets > 1:
                    buckets(buf)
                else:
                    allreduce(buf)
                dt = time.perf_counter() - t0
                if it >= a.warmup:
                    times[nbytes].append(dt)
                    if group is not None:
                        algos.append(group.algorithm)
                max_err = max(max_err, check(buf, a.world, it))
        out = {"stats": group.stats() if group is not None else {}}
    finally:
        if group is not None:
            group.close()
        else:
            dist.barrier()
            dist.destroy_process_group()
    return {
        "rank": a.rank,
        "times": {str(k): v for k, v in times.items()},
        "algorithms": algos,
        "max_err": max_err,
        "ok": max_err == 0.0,
        **out,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m gradswitch.baselines.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--system", choices=("switch", "ring", "auto", "gloo"), required=True)
    p.add_argument("--switch", help="host:port of gradswitchd's control port (switch, ring, auto)")
    p.add_argument("--master", help="addr:port of gloo's TCP store (rank 0 listens)")
    p.add_argument("--peers", help="the ring's addresses, host:port per rank, comma separated (no switch)")
    p.add_argument(
        "--token",
        help="the job's token, the same for every rank (the ring without a switch needs one)",
    )
    p.add_argument("--ifname", default="gs-eth0", help="gloo's interface (default: %(default)s)")
    p.add_argument("--job", default="sweep")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--sizes", type=_sizes, required=True, help="bytes, comma separated")
    p.add_argument(
        "--iters", type=int, default=20, help="timed iterations per small size (default: %(default)s)"
    )
    p.add_argument(
        "--big-iters", type=int, default=4, help="timed iterations per size >= 1 MiB (default: %(default)s)"
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed iterations per size (default: %(default)s)")
    p.add_argument("--wire", default="float32")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument(
        "--buckets", type=int, default=1, help="split each buffer into this many allreduces (default: 1)"
    )
    p.add_argument("--serial", action="store_true", help="with --buckets: wait for each before the next")
    a = p.parse_args(argv)
    if a.buckets < 1:
        p.error(f"--buckets must be >= 1, got {a.buckets}")
    if a.system == "gloo" and not a.master:
        p.error("--system gloo needs --master")
    if a.system != "gloo" and not (a.switch or (a.system == "ring" and a.peers)):
        p.error(f"--system {a.system} needs --switch (or, for the ring, --peers)")
    emit(**run(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
