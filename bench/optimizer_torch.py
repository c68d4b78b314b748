"""torch.optim on the worker's CPU: one optimizer step over N parameters, per algorithm.

The counterpart of bench/optimizer_step (the switch's kernels), for paper 004 Fig. 17:

    python bench/optimizer_torch.py [--params 800000] [--threads 1] [--seconds 1]

torch.optim has no SMORMS3: it is written with torch tensor operations (what a user would do).
Prints the best time per step in ms (after warm-up), one line per algorithm.
"""

from __future__ import annotations

import argparse
import time

import torch


class SMORMS3(torch.optim.Optimizer):
    """SMORMS3 (paper 004 Algorithm 4) with in-place torch operations."""

    def __init__(self, params, lr=1e-3, eps=1e-16):
        super().__init__(params, dict(lr=lr, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                st = self.state[p]
                if not st:
                    st["s"], st["m"], st["v"] = torch.ones_like(p), torch.zeros_like(p), torch.zeros_like(p)
                g, s, m, v = p.grad, st["s"], st["m"], st["v"]
                x = m * m / (v + eps)
                s.mul_(1 - x).add_(1)
                rho = 1 / (s + 1)
                m.mul_(1 - rho).addcmul_(rho, g)
                v.mul_(1 - rho).addcmul_(rho, g * g)
                x = m * m / (v + eps)
                p.sub_(torch.clamp(x, max=lr) / torch.sqrt(v + eps) * g)


CASES = {
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-3),
    "sgd+momentum": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=1e-3),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01),
    "smorms3": lambda p: SMORMS3(p, lr=1e-3),
}


def time_step(make, n: int, seconds: float) -> float:
    p = torch.nn.Parameter(torch.full((n,), 0.5))
    p.grad = torch.randn(n) * 1e-3
    opt = make([p])
    for _ in range(3):
        opt.step()
    best = float("inf")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        t = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", type=int, default=800_000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.params} parameters")
    print(f"{'algorithm':<14} {'step ms':>9}")
    for name, make in CASES.items():
        print(f"{name:<14} {time_step(make, args.params, args.seconds) * 1e3:9.3f}")


if __name__ == "__main__":
    main()
