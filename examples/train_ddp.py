"""Data-parallel training of an MLP on scikit-learn's digits (shipped with scikit-learn, nothing downloaded).

    # 4 workers, gradients summed by a gradswitch switch (rank 0 starts one on loopback if none is given):
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend gradswitch
    # the same with gloo's ring allreduce, for comparison:
    torchrun --nproc-per-node 4 examples/train_ddp.py --backend gloo
    # an existing switch, fixed32 wire (bitwise reproducible):
    GRADSWITCH_SWITCH=10.0.0.1:7700 torchrun --nproc-per-node 4 examples/train_ddp.py --wire fixed32

--mode picks how gradients reach the switch: ddp (DDP over the "gradswitch" process group, default),
hook (DDP over gloo with gradswitch's comm hook), overlap (uniform-chunk overlap, ChunkedOverlap) or
optimizer (gradswitch.torch.DistributedOptimizer). With --backend gloo only ddp applies.
--deadline-us/--quorum turn on bounded-time rounds (docs/protocol.md §3.1, --mode ddp); --slow-rank R
--slow-ms MS makes rank R a straggler, MS later to every backward pass (the accuracy check of issue 39).
--wire mx8 --error-feedback (--mode ddp or hook) feeds each rank's rounding back (docs/torch.md section 2);
with --deadline-us, --error-feedback on any wire also sends what a sum lacked of a rank in its next steps.

Each epoch rank 0 prints the training loss, the test accuracy and where the time went: compute
(forward, backward until the last gradient was handed to communication, optimizer step) and
communication (exposed = the wait after the last gradient; in flight = time with a reduction running).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def load_digits_split(seed: int = 0):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return (
        torch.from_numpy(xtr),
        torch.from_numpy(ytr).long(),
        torch.from_numpy(xte),
        torch.from_numpy(yte).long(),
    )


class MLP(nn.Module):
    def __init__(self, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
        )

    def forward(self, x):
        return self.net(x)


class CommTimer:
    """Wraps a DDP comm hook: records when buckets are handed over and how long reductions are in flight."""

    def __init__(self, hook, state):
        self.hook, self.state = hook, state
        self.last_handoff = 0.0
        self.inflight = 0
        self.busy = 0.0
        self._since = 0.0

    def handoff(self, bucket):
        now = time.perf_counter()
        self.last_handoff = now
        if self.inflight == 0:
            self._since = now
        self.inflight += 1
        fut = self.hook(self.state, bucket)

        def done(f):
            self.inflight -= 1
            if self.inflight == 0:
                self.busy += time.perf_counter() - self._since
            return f.value()

        return fut.then(done)


def timed_hook(timer: CommTimer, bucket):
    """DDP comm hook: the wrapped hook, timed (the timer is the hook's state)."""
    return timer.handoff(bucket)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["gradswitch", "gloo"], default="gradswitch")
    p.add_argument("--mode", choices=["ddp", "hook", "overlap", "optimizer"], default="ddp")
    p.add_argument(
        "--switch",
        default=None,
        help="host:port of a running switch (default $GRADSWITCH_SWITCH, "
        "else rank 0 starts one on 127.0.0.1)",
    )
    p.add_argument("--wire", default="float32", choices=["float32", "fixed32", "float16", "bfloat16", "mx8"])
    p.add_argument(
        "--error-feedback",
        action="store_true",
        help="--mode ddp (the process group's Options.error_feedback) or hook, wire mx8/float16/bfloat16: "
        "each rank feeds its rounding back; with --deadline-us, any wire: also what a sum lacked of the "
        "rank (conceded or late chunks) goes in its next steps (docs/torch.md)",
    )
    p.add_argument("--deadline-us", type=int, default=None, help="Options.deadline_us (off by default)")
    p.add_argument("--quorum", type=int, default=None, help="Options.quorum, with --deadline-us")
    p.add_argument(
        "--no-rescale",
        action="store_true",
        help="Options(rescale=False), with --deadline-us: partial sums stay as summed (with --error-feedback "
        "a missed contribution then waits whole for the rank's next steps)",
    )
    p.add_argument(
        "--concede",
        action="store_true",
        help="Options.concede, with --deadline-us: a rank whose uplink paces the job concedes chunks",
    )
    p.add_argument("--slow-rank", type=int, default=None, help="the straggler of --slow-ms")
    p.add_argument("--slow-ms", type=float, default=0.0, help="its sleep before every backward pass")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--save", default=None, help="rank 0 writes the final state_dict here")
    p.add_argument("--json", default=None, help="rank 0 writes per-epoch metrics here")
    p.add_argument(
        "--target-accuracy",
        type=float,
        default=None,
        help="percent: print the training time (sum of the epochs' wall) until the test accuracy reached it",
    )
    a = p.parse_args(argv)
    if a.epochs < 1 or a.batch_size < 1 or a.hidden < 1:
        p.error("--epochs, --batch-size and --hidden must be at least 1")
    lossy = a.wire in ("mx8", "float16", "bfloat16")
    feeds = lossy or a.deadline_us is not None
    if a.error_feedback and (a.backend != "gradswitch" or a.mode not in ("ddp", "hook") or not feeds):
        p.error(
            "--error-feedback needs --backend gradswitch, --mode ddp or hook, "
            "and --wire mx8, float16 or bfloat16 or --deadline-us"
        )
    if a.deadline_us is not None and (a.backend, a.mode) != ("gradswitch", "ddp"):
        p.error("--deadline-us needs --backend gradswitch --mode ddp")
    if a.concede and a.deadline_us is None:
        p.error("--concede needs --deadline-us")
    if a.no_rescale and a.deadline_us is None:
        p.error("--no-rescale needs --deadline-us")
    if a.slow_ms < 0 or (a.slow_ms > 0) != (a.slow_rank is not None):
        p.error("--slow-ms MS (positive) and --slow-rank R go together")
    if a.target_accuracy is not None and not 0 < a.target_accuracy <= 100:
        p.error(f"--target-accuracy {a.target_accuracy}: a percentage in (0, 100]")
    return a


def time_to_target(history: list[dict], target: float | None) -> dict:
    """The training time (epochs' wall, evaluation excluded) until the first epoch whose test accuracy
    reached `target` percent; {} without a target."""
    if target is None:
        return {}
    spent = 0.0
    for rec in history:
        spent += rec["wall_s"]
        if rec["accuracy"] >= target:
            return {"target_accuracy": target, "time_to_target_s": spent, "target_epoch": rec["epoch"]}
    return {"target_accuracy": target, "time_to_target_s": None, "target_epoch": None}


def deadline_counts() -> dict:
    """This rank's bounded-time round counters (docs/protocol.md §3.1), with the gradswitch backend."""
    import gradswitch.torch as gst

    group = gst.gradswitch_group()
    stats = group.group.stats() if group else {}
    keys = ("partial_results", "missed_contributions", "straggler_reports", "conceded_rounds")
    return {k: stats.get(k, 0) for k in keys} if group else {}


def start_switch_if_needed(args):
    """Rank 0 starts a loopback switch when no address is known; the backend publishes it to the others."""
    if args.switch:
        os.environ["GRADSWITCH_SWITCH"] = args.switch
    if args.backend == "gloo" and args.mode == "ddp":
        return None
    if os.environ.get("GRADSWITCH_SWITCH") or int(os.environ.get("RANK", "0")) != 0:
        return None
    from gradswitch.local_switch import LocalSwitch

    sw = LocalSwitch(threads=1).start()
    os.environ["GRADSWITCH_SWITCH"] = sw.address
    print(f"[rank 0] started gradswitchd at {sw.address}", flush=True)
    return sw


def train(args) -> dict:
    import gradswitch.torch as gst

    torch.set_num_threads(args.threads)
    switch = start_switch_if_needed(args)
    pg_backend = "gloo" if (args.backend == "gloo" or args.mode == "hook") else "gradswitch"
    deadline = {"deadline_us": args.deadline_us, "quorum": args.quorum, "concede": args.concede}
    deadline["rescale"] = not args.no_rescale
    feedback = {"error_feedback": args.error_feedback}
    pg_options = gst.Options(wire=args.wire, **deadline, **feedback) if pg_backend == "gradswitch" else None
    dist.init_process_group(pg_backend, pg_options=pg_options)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.backend == "gloo" and args.mode != "ddp":
        raise SystemExit("--backend gloo supports only --mode ddp")

    xtr, ytr, xte, yte = load_digits_split(args.seed)
    torch.manual_seed(args.seed)
    model = MLP(args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    timer = None
    overlap = None
    if args.mode in ("ddp", "hook"):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        net = nn.parallel.DistributedDataParallel(model)
        if args.mode == "hook":
            state = gst.GradswitchState(wire=args.wire, error_feedback=args.error_feedback)
            timer = CommTimer(gst.state_hook, state)
        else:
            timer = CommTimer(default_hooks.allreduce_hook, None)
        net.register_comm_hook(timer, timed_hook)
    else:
        net = model
        gst.broadcast_parameters(model.state_dict(), root_rank=0)
        if args.mode == "overlap":
            overlap = gst.ChunkedOverlap(model, chunk_bytes=64 << 10)
        else:
            opt = gst.DistributedOptimizer(
                opt, named_parameters=model.named_parameters(), chunk_bytes=64 << 10
            )
            gst.broadcast_optimizer_state(opt, root_rank=0)

    n = xtr.shape[0]
    per_rank = n // world
    steps = per_rank // args.batch_size
    history = []
    for epoch in range(args.epochs):
        g = torch.Generator().manual_seed(args.seed * 1000 + epoch)
        perm = torch.randperm(n, generator=g)[: per_rank * world].view(world, per_rank)[rank]
        net.train()
        t_compute = t_exposed = 0.0
        busy0 = timer.busy if timer else 0.0
        chunked = None if timer else (overlap or opt._gs_overlap)
        chan0 = chunked.stats()["busy_s"] if chunked else 0.0
        wait0 = chunked.wait_s if chunked else 0.0
        loss_sum = torch.zeros(2)
        t_epoch = time.perf_counter()
        for s in range(steps):
            idx = perm[s * args.batch_size : (s + 1) * args.batch_size]
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xtr[idx]), ytr[idx])
            if rank == args.slow_rank:
                time.sleep(args.slow_ms / 1e3)
            t1 = time.perf_counter()
            if timer:
                timer.last_handoff = t1
            loss.backward()
            t2 = time.perf_counter()
            if timer:
                handoff = max(timer.last_handoff, t1)
            else:
                handoff = t2  # chunked modes: accounted from the overlap object below
            opt.step()
            t3 = time.perf_counter()
            if timer:
                t_compute += (t1 - t0) + (handoff - t1) + (t3 - t2)
                t_exposed += t2 - handoff
            else:
                # chunked overlap: the exposed part is synchronize()'s wait (inside backward for overlap,
                # inside step for the optimizer)
                t_compute += t3 - t0
            loss_sum += torch.tensor([loss.item() * len(idx), len(idx)])
        wall = time.perf_counter() - t_epoch
        if chunked is not None:
            inflight = chunked.stats()["busy_s"] - chan0
            t_exposed = chunked.wait_s - wait0
            t_compute -= t_exposed
        else:
            inflight = timer.busy - busy0
        dist.all_reduce(loss_sum)  # through the switch with the gradswitch backend (SUM)
        net.eval()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item() * 100
        rec = {
            "epoch": epoch + 1,
            "loss": loss_sum[0].item() / loss_sum[1].item(),
            "accuracy": acc,
            "wall_s": wall,
            "compute_s": t_compute,
            "comm_exposed_s": t_exposed,
            "comm_inflight_s": inflight,
        }
        history.append(rec)
        if rank == 0:
            hidden = max(0.0, 100.0 * (1 - t_exposed / inflight)) if inflight > 0 else 0.0
            print(
                f"epoch {rec['epoch']:3d}  loss {rec['loss']:.4f}  test acc {acc:6.2f}%  |  "
                f"wall {wall:.2f}s  "
                f"compute {t_compute:.2f}s  comm exposed {t_exposed:.2f}s  in flight {inflight:.2f}s "
                f"({hidden:.0f}% hidden)",
                flush=True,
            )
    if rank == 0:
        info = {
            "backend": args.backend,
            "mode": args.mode,
            "wire": args.wire,
            "world_size": world,
            "history": history,
            **time_to_target(history, args.target_accuracy),
            **deadline_counts(),
        }
        if args.target_accuracy is not None:
            t = info["time_to_target_s"]
            reached = "not reached" if t is None else f"{t:.2f} s of training (epoch {info['target_epoch']})"
            print(f"time to {args.target_accuracy:g}% test accuracy: {reached}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(info, f, indent=1)
        if args.save:
            torch.save(model.state_dict(), args.save)
    if overlap:
        overlap.remove()
    dist.barrier()
    dist.destroy_process_group()
    if switch is not None:
        switch.stop()
    return {"history": history}


def main(argv=None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        print(
            "run under torchrun, e.g.: "
            "torchrun --nproc-per-node 4 examples/train_ddp.py --backend gradswitch",
            file=sys.stderr,
        )
        return 2
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
