"""Allreduce with torch.distributed's gloo backend (ring-style allreduce for large CPU tensors).

Each rank runs in its worker namespace; rendezvous through the TCP store on w0:

    python -m gradswitch.baselines.gloo --master 10.66.0.10:17100 --rank r --world N --nbytes B --iters I
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

import numpy as np

from .common import add_rank_options, check, emit, grad


def work(
    master: str,
    rank: int,
    world: int,
    nbytes: int,
    iters: int,
    warmup: int,
    ifname: str | None,
    timeout: float = 60,
) -> dict:
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{master}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout)
    )
    n = nbytes // 4
    buf = np.empty(n, np.float32)
    t = torch.from_numpy(buf)
    times, cpu, max_err = [], 0.0, 0.0
    for it in range(iters):
        np.copyto(buf, grad(rank, n, it))
        dist.barrier()
        c0 = time.process_time()
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t1 = time.perf_counter()
        c1 = time.process_time()
        max_err = max(max_err, check(buf, world, it))
        if it >= warmup:
            times.append(t1 - t0)
            cpu += c1 - c0
    dist.barrier()
    dist.destroy_process_group()
    # cpu_s: this process's CPU (every thread, gloo's included) inside the timed calls
    return {"rank": rank, "times": times, "max_err": max_err, "ok": max_err == 0.0, "cpu_s": cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradswitch.baselines.gloo")
    p.add_argument("--master", required=True, help="addr:port of the TCP store (rank 0 listens)")
    add_rank_options(p)
    p.add_argument("--ifname", default="gs-eth0")
    a = p.parse_args(argv)
    emit(**work(a.master, a.rank, a.world, a.nbytes, a.iters, a.warmup, a.ifname))
    return 0


if __name__ == "__main__":
    sys.exit(main())
