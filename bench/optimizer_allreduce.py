"""Allreduce with Adam in the switch vs a plain float32 allreduce of the same tensor (issue 6).

    python bench/optimizer_allreduce.py [--sizes 800000,25000000] [--iters 20] [--threads 1]

Two workers (threads of this process, each with its own gradswitch.Group, sockets and background
thread) and a local gradswitchd on loopback. For each size it times `iters` allreduces of a plain
job (wire float32: the switch returns the sum) and of an optimizer job (optimizer=adam: the switch
also applies Adam and returns the parameters), after 3 warm-up iterations, and prints the medians
and their ratio. Both jobs run on the same switch, alternating `rounds` times (a fresh job each time).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import numpy as np

import gradswitch
from gradswitch.local_switch import LocalSwitch


def run(address: str, job: str, n: int, iters: int, optimizer: dict | None) -> list[float]:
    times: list[list[float]] = [[], []]
    errors: list[BaseException] = []
    barrier = threading.Barrier(2)

    def rank(r: int) -> None:
        try:
            p0 = np.zeros(n, np.float32)
            kwargs = dict(optimizer=optimizer, params=p0 if r == 0 else n) if optimizer else {}
            with gradswitch.connect(address, job, r, 2, timeout=60, **kwargs) as g:
                x = np.random.default_rng(r).standard_normal(n).astype(np.float32)
                for k in range(iters + 3):
                    barrier.wait()
                    t = time.perf_counter()
                    g.allreduce(x)
                    if k >= 3:
                        times[r].append(time.perf_counter() - t)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            barrier.abort()

    ts = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return [max(a, b) for a, b in zip(*times, strict=True)]  # an allreduce ends when both ranks have it


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="800000,25000000")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="switch data threads")
    ap.add_argument("--slots", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=3, help="plain and adam jobs alternate this many times")
    args = ap.parse_args()
    adam = dict(algo="adam", lr=1e-3, eps_mode="torch")
    with LocalSwitch(threads=args.threads, slots=args.slots) as sw:
        print(f"switch: {' '.join(sw.command())}")
        cols = ("params", "plain ms", "adam ms", "ratio", "plain GB/s", "adam GB/s")
        print(" ".join(f"{c:>11}" for c in cols))
        for i, n in enumerate(int(s) for s in args.sizes.split(",")):
            ps: list[float] = []
            os_: list[float] = []
            for k in range(args.rounds):  # alternate, so that drifts in machine load hit both alike
                ps += run(sw.address, f"plain{i}-{k}", n, args.iters, None)
                os_ += run(sw.address, f"adam{i}-{k}", n, args.iters, adam)
            plain, opt = statistics.median(ps), statistics.median(os_)
            gb = 4 * n / 1e9
            row = (f"{n}", f"{plain * 1e3:.2f}", f"{opt * 1e3:.2f}", f"{opt / plain:.3f}")
            print(" ".join(f"{c:>11}" for c in (*row, f"{gb / plain:.2f}", f"{gb / opt:.2f}")))


if __name__ == "__main__":
    main()
