"""`gradswitch bench` / `gradswitch demo`: N local worker processes allreduce through a switch.

Each worker sums a tensor of `size` bytes `iters` times and checks every result against the
exact expected sum. Printed: per-worker algorithm bandwidth (tensor bytes / time per allreduce,
as nccl-tests' algbw), the switch's packet rate, and retransmission counters (per worker: resends,
those proven spurious by the switch's DSACK/HELD answers or a late original result, and why each was
sent: RACK, a timer with a later round answered, a lone probe, the switch asking for it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

from ._args import bounded

WIRES = ("float32", "fixed32", "float16", "bfloat16", "float64", "mx8", "int32")


def window_option(text: str) -> str:
    """argparse type of --window: fixed, adaptive, or rounds 1..65535 (checked again by connect)."""
    if text in ("fixed", "adaptive") or (text.isdigit() and 1 <= int(text) <= 65535):
        return text
    raise argparse.ArgumentTypeError(f"{text!r} is not fixed, adaptive or a number of rounds from 1 to 65535")


def _parse_size(text: str) -> int:
    units = {
        "": 1,
        "B": 1,
        "K": 1 << 10,
        "KB": 1 << 10,
        "M": 1 << 20,
        "MB": 1 << 20,
        "G": 1 << 30,
        "GB": 1 << 30,
    }
    t = text.strip().upper()
    num = t.rstrip("KMGB")
    unit = t[len(num) :]
    try:
        value = float(num) * units[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(
            f"size {text!r}: use a number of bytes with an optional K, M or G suffix (binary: 1K = 1024)"
        ) from None
    if not value >= 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"size {text!r}: a whole number of bytes >= 1 is needed")
    return int(value)


def human_bytes(n: int) -> str:
    """1000 -> '1000 B', 1536 -> '1.5 KiB', 64 << 20 -> '64 MiB'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} B"


def add_arguments(p: argparse.ArgumentParser, *, demo: bool) -> None:
    p.add_argument("--workers", "-n", type=bounded(int, 1, 64), default=4, help="worker processes")
    p.add_argument(
        "--size",
        type=_parse_size,
        default="64M" if demo else "16M",  # argparse applies `type` to a string default
        help="tensor size in bytes, e.g. 1000, 4M, 1G (binary units; a whole number of elements)",
    )
    p.add_argument("--iters", type=bounded(int, 1, what="at least 1"), default=3 if demo else 10,
                   help="timed allreduces per worker")
    p.add_argument("--warmup", type=bounded(int, 0, what="0 or more"), default=1,
                   help="untimed allreduces first")
    p.add_argument("--wire", choices=WIRES, default="float32", help="element encoding on the wire")
    p.add_argument(
        "--switch",
        default=None,
        help="host:port of a running switch (default: start one on loopback for the run)",
    )
    p.add_argument("--threads", type=bounded(int, 1, 64), default=1,
                   help="switch data threads when starting one")
    p.add_argument("--slots", type=bounded(int, 1, 65535), default=None,
                   help="slot pool per job of the switch started here (default: the daemon's, 256)")
    p.add_argument("--window", type=window_option, default=None,
                   help="workers' window: fixed (the whole pool), adaptive, or a number of rounds "
                        "(docs/protocol.md 4.2; default: $GRADSWITCH_WINDOW, else adaptive)")
    p.add_argument(
        "--drop-rate",
        type=bounded(float, 0.0, 0.99, "a fraction in [0, 0.99]"),
        default=0.0,
        help="injected loss, on the switch (when started here) and on every worker",
    )
    p.add_argument("--timeout", type=bounded(float, 0.001, what="more than 0 s"), default=30.0,
                   help="seconds without progress before a worker fails")
    p.add_argument("--job", default="bench", help="job name")


def element_dtype(wire: str):
    return {"int32": np.int32, "float64": np.float64}.get(wire, np.float32)


def _expected(n: int, world: int, dtype, wire: str = "float32") -> np.ndarray:
    # Small integers: exact in fp32, fp16 (< 2048 in sum) and bf16 (< 256 in sum),
    # so every wire checks exactly. mx8 keeps 4 significant bits: powers of two times N.
    if wire == "mx8":
        return (_tensor(n, 0, np.int64, wire) * world).astype(dtype)
    base = (np.arange(n, dtype=np.int64) % 16).astype(np.int64)
    total = sum(base * (r + 1) % 17 for r in range(world))
    return total.astype(dtype)


def _tensor(n: int, rank: int, dtype, wire: str = "float32") -> np.ndarray:
    i = np.arange(n, dtype=np.int64)
    if wire == "mx8":  # the same on every rank: 0, 1, 2 or 4 (a sum N * 2^k is exact in E4M3 for N <= 16)
        return ((i % 5 != 0) << (i % 3)).astype(dtype)
    return ((i % 16) * (rank + 1) % 17).astype(dtype)


def _worker(args, rank: int, results) -> None:
    import gradswitch

    if args.window:
        os.environ["GRADSWITCH_WINDOW"] = args.window  # read by connect, in this worker process only

    dtype = element_dtype(args.wire)
    n = args.size // np.dtype(dtype).itemsize
    try:
        with gradswitch.connect(
            args.switch,
            job=args.job,
            rank=rank,
            world_size=args.workers,
            wire="float32" if args.wire == "int32" else args.wire,
            timeout=args.timeout,
            drop_rate=args.drop_rate,
            seed=rank + 1,
        ) as g:
            expected = _expected(n, args.workers, dtype, args.wire)
            # Made once: generating it each time (~40 ms for 16 MB) would start the ranks' allreduces
            # that far apart, and the first rounds would time the slowest rank's numpy, not the network.
            src = _tensor(n, rank, dtype, args.wire)
            x = np.empty(n, dtype=dtype)
            times = []
            for i in range(args.warmup + args.iters):
                np.copyto(x, src)
                t0 = time.perf_counter()
                g.allreduce(x)
                dt = time.perf_counter() - t0
                if not np.array_equal(x, expected):
                    bad = int(np.flatnonzero(x != expected)[0])
                    raise AssertionError(
                        f"rank {rank}: wrong sum at element {bad}: {x[bad]} != {expected[bad]}"
                    )
                if i >= args.warmup:
                    times.append(dt)
            stats = g.stats() if hasattr(g, "stats") else {}
        results.put((rank, "ok", times, stats))
    except BaseException as e:  # report every failure to the parent, never hang it
        results.put((rank, "error", f"{type(e).__name__}: {e}", {}))


def run(args, *, out=sys.stdout) -> int:
    from gradswitch.local_switch import LocalSwitch

    local = None
    if args.switch is None:
        local = LocalSwitch(threads=args.threads, drop_rate=args.drop_rate, slots=args.slots).start()
        args.switch = local.address
        print(f"started gradswitchd on {local.address} ({args.threads} data thread(s))", file=out)
    try:
        before = local.stats() if local else None
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(args, r, results)) for r in range(args.workers)]
        print(
            f"{args.workers} workers x {args.iters} allreduces of {human_bytes(args.size)} "
            f"({args.size // np.dtype(element_dtype(args.wire)).itemsize} elements), wire {args.wire}",
            file=out,
            flush=True,
        )
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        reports = []
        deadline = time.monotonic() + args.timeout * (args.iters + args.warmup + 2) + 60
        while len(reports) < args.workers:
            try:
                reports.append(results.get(timeout=max(0.1, deadline - time.monotonic())))
            except Exception:
                print("error: workers did not report in time", file=out)
                break
        wall = time.perf_counter() - t0
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        after = local.stats() if local else None
    finally:
        if local:
            local.stop()
    failed = [r for r in reports if r[1] != "ok"]
    for rank, _, msg, _ in sorted(failed):
        print(f"rank {rank} FAILED: {msg}", file=out)
    if failed or len(reports) < args.workers:
        return 1
    print(
        f"{'rank':>4} {'mean ms':>9} {'best ms':>9} {'algbw Gbit/s':>13} {'retransmits':>11} "
        f"{'spurious':>8}  by cause (rack/timer/probe/asked)",
        file=out,
    )
    for rank, _, times, stats in sorted(reports):
        mean = sum(times) / len(times)
        st = stats if isinstance(stats, dict) else {}
        retx = st.get("retransmissions", "-")
        spurious = st.get("spurious_retransmissions", "-")
        causes = "/".join(str(st.get(f"retx_{k}", "-")) for k in ("rack", "timeout", "probe", "asked"))
        algbw = args.size * 8 / mean / 1e9
        print(
            f"{rank:>4} {mean * 1e3:9.2f} {min(times) * 1e3:9.2f} {algbw:13.2f} {retx:>11} "
            f"{spurious:>8}  {causes}",
            file=out,
        )
    if before and after:
        pkts = after["pkts_in"] - before["pkts_in"]
        print(
            f"switch: {pkts} packets in, {after['pkts_out'] - before['pkts_out']} out, "
            f"{pkts / wall / 1e6:.3f} Mpps in over the {wall:.1f} s run (incl. start-up); "
            f"retransmissions answered {after['retx_answered'] - before['retx_answered']}, "
            f"duplicates {after['duplicates'] - before['duplicates']} "
            f"(held answered {after.get('held_answered', 0) - before.get('held_answered', 0)}), "
            f"drops {after['drops'] - before['drops']}",
            file=out,
        )
    print("all results exact: OK", file=out)
    return 0


def main(argv: list[str] | None = None, *, demo: bool = False) -> int:
    p = argparse.ArgumentParser(
        prog="gradswitch demo" if demo else "gradswitch bench",
        description=__doc__,
        formatter_class=_HelpFormatter,
    )
    add_arguments(p, demo=demo)
    args = p.parse_args(argv)
    item = np.dtype(element_dtype(args.wire)).itemsize
    if args.size % item:
        p.error(
            f"--size {args.size}: not a whole number of {args.wire} elements ({item} bytes each); "
            f"try --size {max(item, args.size // item * item)}"
        )
    return run(args)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module's text as written, and every option's default (an option without one says why)."""

    def _get_help_string(self, action):
        return action.help if action.default is None else super()._get_help_string(action)
