"""Open MPI baselines (mpi4py), launched by `mpirun` across testbed namespaces.

mode allreduce:     N ranks on w0..w{N-1}, MPI_Allreduce(SUM).
mode reduce_bcast:  rank 0 on `host` (paper 000 Case 3: the host machine aggregates), ranks 1..N on the
                    workers; MPI_Reduce(SUM) to the host, then MPI_Bcast of the sum back to the workers.
                    The host contributes zeros; the sum is over the workers only.
mode reduce:        as reduce_bcast without the MPI_Bcast: the time to reduce to the host (paper 000
                    Fig. 13); only the host holds (and checks) the sum.

The program is plain mpi4py: with libgradswitch_mpi.so preloaded (runner: the *_gs systems) the same
calls go through the switch.

    mpirun ... python -m gradswitch.baselines.mpi --mode allreduce --nbytes B --iters I
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .common import check, emit, grad


def work(mode: str, nbytes: int, iters: int, warmup: int) -> dict:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n = nbytes // 4
    out = np.empty(n, np.float32)
    hosted = mode in ("reduce_bcast", "reduce")
    wrank = rank - 1 if hosted else rank  # gradient rank (-1: the host)
    world = size - 1 if hosted else size
    times, cpu, max_err = [], 0.0, 0.0
    zeros = np.zeros(n, np.float32)
    for it in range(iters):
        g = grad(wrank, n, it) if wrank >= 0 else zeros
        comm.Barrier()
        c0 = time.process_time()
        t0 = time.perf_counter()
        if hosted:
            comm.Reduce(g, out if rank == 0 else None, op=MPI.SUM, root=0)
            if mode == "reduce_bcast":
                comm.Bcast(out, root=0)
        else:
            comm.Allreduce(g, out, op=MPI.SUM)
        t1 = time.perf_counter()
        c1 = time.process_time()
        if mode != "reduce" or rank == 0:
            max_err = max(max_err, check(out, world, it))
        if it >= warmup:
            times.append(t1 - t0)
            cpu += c1 - c0
    comm.Barrier()
    return {
        "rank": rank,
        "worker_rank": wrank,
        "times": times,
        "max_err": max_err,
        "ok": max_err == 0.0,
        "cpu_s": cpu,  # this process's CPU inside the timed calls
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradswitch.baselines.mpi")
    p.add_argument("--mode", choices=["allreduce", "reduce_bcast", "reduce"], required=True)
    p.add_argument("--nbytes", type=int, required=True)
    p.add_argument("--iters", type=int, required=True, help="total, warmup included")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--out", default=None, help="directory for rank<r>.json (mpirun interleaves stdout lines)")
    a = p.parse_args(argv)
    r = work(a.mode, a.nbytes, a.iters, a.warmup)
    if a.out:
        with open(os.path.join(a.out, f"rank{r['rank']}.json"), "w") as f:
            json.dump(r, f)
    else:
        emit(**r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
