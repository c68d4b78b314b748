"""An ordinary mpi4py program (it knows nothing of gradswitch), run by the tests with and without
libgradswitch_mpi.so preloaded. It reduces numpy float64, float32 and int32 arrays the ways mpi4py
programs do and saves every result it holds to OUTDIR/rank<R>.npz, so that the two runs can be
compared.

    mpirun -np 4 python reduce_check.py OUTDIR [ELEMENTS]
    mpirun -np 4 python reduce_check.py OUTDIR ELEMENTS --until-file STOP --started-file STARTED

With --until-file the program repeats an exactly checkable int32 and float64 allreduce until STOP
exists (rank 0 looks, everyone learns it by broadcast), after touching STARTED once the first round
is done: the tests stop the switch in between.
"""

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI


def inputs(rank: int, n: int, tag: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * tag + rank)
    return {
        "f64": rng.standard_normal(n) * 1e3,
        "f32": rng.standard_normal(n).astype(np.float32),
        "i32": rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32),
    }


def reduce_all(comm, n: int, tag: int, out: dict) -> None:
    rank, size = comm.Get_rank(), comm.Get_size()
    x = inputs(rank, n, tag)
    for name, a in x.items():
        r = np.empty_like(a)
        comm.Allreduce(a, r, op=MPI.SUM)
        out[f"{tag}-allreduce-{name}"] = r
        b = a.copy()
        comm.Allreduce(MPI.IN_PLACE, b, op=MPI.SUM)
        out[f"{tag}-inplace-{name}"] = b
        root = size - 1
        r = np.empty_like(a) if rank == root else None
        comm.Reduce(a, r, op=MPI.SUM, root=root)
        if rank == root:
            out[f"{tag}-reduce-{name}"] = r
    reqs, bufs = [], {}
    for name, a in x.items():
        bufs[name] = np.empty_like(a)
        reqs.append(comm.Iallreduce(a, bufs[name], op=MPI.SUM))
    MPI.Request.Waitall(reqs)
    for name, r in bufs.items():
        out[f"{tag}-iallreduce-{name}"] = r
    # the lowercase (pickle) API reduces Python objects: MPI's own path, never the switch
    out[f"{tag}-object"] = np.array(comm.allreduce(rank + tag, op=MPI.SUM))


def until_stopped(comm, n: int, stop: str, started: str) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    rounds, bad = 0, 0
    while True:
        a = (np.arange(n, dtype=np.int64) * (rank + 1) + rounds).astype(np.int32)
        comm.Allreduce(MPI.IN_PLACE, a, op=MPI.SUM)
        want = (np.arange(n, dtype=np.int64) * (size * (size + 1) // 2) + size * rounds).astype(np.int32)
        d = np.full(n, 0.25 * (rank + 1) + rounds)
        comm.Allreduce(MPI.IN_PLACE, d, op=MPI.SUM)  # exact: quarters below 2^53
        bad += int((a != want).sum()) + int((d != 0.25 * size * (size + 1) / 2 + size * rounds).sum())
        rounds += 1
        if rounds == 1 and rank == 0:
            open(started, "w").close()
        done = comm.bcast(os.path.exists(stop) if rank == 0 else None, root=0)
        if done:
            return {"rounds": np.array(rounds), "bad": np.array(bad)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("outdir")
    p.add_argument("elements", type=int, nargs="?", default=100_000)
    p.add_argument("--until-file")
    p.add_argument("--started-file")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if a.until_file:
        out = until_stopped(comm, a.elements, a.until_file, a.started_file)
    else:
        out = {}
        reduce_all(comm, a.elements, 1, out)
        halves = comm.Split(rank % 2, rank)
        reduce_all(halves, a.elements, 2, out)
        halves.Free()
        reduce_all(comm, a.elements, 3, out)
    np.savez(os.path.join(a.outdir, f"rank{rank}.npz"), **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
