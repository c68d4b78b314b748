"""gradswitch itself as a system of the side-by-side comparison: `gradswitchd` in the testbed's switch
namespace, one worker process per worker namespace using the Python API (`gradswitch.connect`).

Same rules as the baselines: gradients from `common.grad` (small integers in float32, so any summation
order is exact), every rank checks every sum with `common.check`, a barrier before each timed call (a
1-element allreduce through the switch, as gloo's and MPI's barriers are small collectives), and the
time of iteration i is the slowest rank's. Also reported (Result.extra): the switch's STATS counters over
the whole run, the workers' counters summed (retransmissions, packets), the workers' process CPU time
spent inside the timed allreduce calls, and the daemon's CPU time over rank 0's timed window (the whole
process from /proc, and its data threads from the backend's counters).

    python -m gradswitch.baselines.gradswitch_sys worker --switch 10.66.0.1:7700 --rank r --world N \
        --nbytes B --iters I [--warmup 1] [--wire float32] [--switch-pid PID]
    python -m gradswitch.baselines.gradswitch_sys request --switch 10.66.0.1:7700 STATS
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from gradswitch.daemon import Daemon
from gradswitch.local_switch import control_request

from .common import add_rank_options, check, combine, emit, grad, results_of, start_ranks, worker_count

CONTROL_PORT = 17700
DATA_PORT = 17701
_CLK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process (all its threads) from /proc/<pid>/stat; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, IndexError, ValueError):
        return None


def data_thread_cpu_s(switch: str) -> float | None:
    """CPU seconds of the daemon's data threads so far (the backend's `*.cpu_ns` counters in STATS,
    nanosecond resolution), None when the backend does not report them or STATS did not get through
    (under heavy emulated loss a fresh connection's handshake can outlast the timeout: a reading is not
    worth failing the run)."""
    try:
        reply = request(switch, "STATS")
    except OSError as e:
        print(f"gradswitch_sys: no STATS from {switch} ({e}): the switch's data-thread CPU is not reported",
              file=sys.stderr, flush=True)
        return None
    ns = [int(v) for k, _, v in (kv.partition("=") for kv in reply.split()[1:]) if k.endswith(".cpu_ns")]
    return sum(ns) / 1e9 if reply.startswith("OK") and ns else None


def request(switch: str, line: str, timeout: float = 5.0) -> str:
    """One control-plane request on a fresh TCP connection; the reply line."""
    return control_request(switch, line, timeout)


def work(
    switch: str,
    job: str,
    rank: int,
    world: int,
    nbytes: int,
    iters: int,
    warmup: int,
    wire: str = "float32",
    timeout: float = 30.0,
    drop_rate: float = 0.0,
    switch_pid: int | None = None,
    barrier: bool = True,
) -> dict:
    import gradswitch

    n = nbytes // 4
    x = np.empty(n, np.float32)
    tok = np.zeros(1, np.float32)
    times, ends, cpu, max_err = [], [], 0.0, 0.0
    sw_cpu0 = sw_cpu1 = sw_data0 = sw_data1 = None
    with gradswitch.connect(
        switch,
        job=job,
        rank=rank,
        world_size=world,
        wire=wire,
        timeout=timeout,
        drop_rate=drop_rate,
        seed=rank + 1,
    ) as g:
        st0 = None
        for it in range(iters):
            np.copyto(x, grad(rank, n, it))
            if it == warmup:  # before the barrier: the other ranks' timed call must not wait for it
                st0 = g.stats()
                if switch_pid and rank == 0:
                    # STATS opens a TCP connection; under loss its handshake can take a 1 s SYN
                    # retransmission, which (read after the barrier) landed in the first timed
                    # iteration of every other rank
                    sw_cpu0 = proc_cpu_seconds(switch_pid)
                    sw_data0 = data_thread_cpu_s(switch)
            if barrier:
                g.allreduce(tok)
            c0 = time.process_time()
            t0 = time.perf_counter()
            g.allreduce(x)
            t1 = time.perf_counter()
            c1 = time.process_time()
            if it >= warmup:
                times.append(t1 - t0)
                ends.append(time.time())  # wall clock: comparable between the testbed's namespaces
                cpu += c1 - c0
            max_err = max(max_err, check(x, world, it))
        if switch_pid and rank == 0 and sw_cpu0 is not None:
            sw_cpu1 = proc_cpu_seconds(switch_pid)
            sw_data1 = data_thread_cpu_s(switch)
        st1 = g.stats()
    timed_stats = {k: v - (st0 or {}).get(k, 0) for k, v in st1.items()} if st0 is not None else {}
    return {
        "rank": rank,
        "times": times,
        "ends": ends,
        "max_err": max_err,
        "ok": max_err == 0.0,
        "cpu_s": cpu,  # this process's CPU inside the timed allreduce calls
        "stats": st1,  # whole run (warmup + barriers included)
        "timed_stats": timed_stats,  # from the first timed iteration on (its barrier included)
        "switch_cpu_s": (sw_cpu1 - sw_cpu0) if sw_cpu1 is not None and sw_cpu0 is not None else None,
        "switch_data_cpu_s": (sw_data1 - sw_data0) if sw_data1 is not None and sw_data0 is not None else None,
    }


def switch_daemon(
    tb,
    threads: int = 1,
    mtu: int | None = None,
    drop_rate: float = 0.0,
    slots: int | None = None,
    extra_args: list[str] | None = None,
    control_port: int = CONTROL_PORT,
    data_port: int = DATA_PORT,
    binary: str | None = None,
    host: str = "switch",
    control_host: str | None = None,
) -> Daemon:
    """gradswitchd in the testbed's switch namespace, or on machine `host` of another topology (a
    Daemon, not started; a context manager). control_host="0.0.0.0" listens on every address of that
    machine (a spine, which each rack reaches over its own uplink); clients and queries use the
    machine's testbed address."""
    return Daemon(
        threads=threads,
        host=control_host or tb.address(host),
        connect_host=tb.address(host),
        control_port=control_port,
        data_port=data_port,
        mtu=mtu or tb.link.mtu,
        drop_rate=drop_rate,
        slots=slots,
        extra_args=["--log-level", "warn", *(extra_args or [])],
        binary=binary,
        netns=tb.netns(host),  # also adds --insecure: the testbed's own namespaces, only its hosts reach it
        start_timeout=15.0,
    )


def run_workers(
    tb,
    addresses: list[str],
    nbytes: int,
    total: int,
    warmup: int,
    wire: str = "float32",
    op_timeout: float = 30.0,
    drop_rate: float = 0.0,
    timeout: float = 300,
    env: dict | None = None,
    switch_pid: int | None = None,
    logs=lambda: "",
) -> list[dict]:
    """One worker process per rank r on machine w<r>, joining through addresses[r] (one switch, its
    rack's leaf, or a "a:port,b:port" list of shards); their result records in rank order. A failure
    raises BaselineError with every rank's output and `logs()` (the switches' logs)."""
    n = len(addresses)
    args = ["--world", n, "--nbytes", nbytes, "--iters", total, "--warmup", warmup, "--wire", wire]
    args += ["--timeout", op_timeout, "--drop-rate", drop_rate, "--job", f"bench{os.getpid()}"]
    args += ["--switch-pid", switch_pid] if switch_pid else []
    procs = start_ranks(
        tb,
        "gradswitch.baselines.gradswitch_sys",
        n,
        lambda r: ["worker", "--switch", addresses[r], "--rank", r, *args],
        env=env,
    )
    rs = results_of(procs, timeout, "gradswitch", tail=lambda: "\n--- gradswitchd log\n" + logs())
    rs.sort(key=lambda r: r["rank"])
    return rs


def run_gradswitch(
    tb,
    nbytes: int,
    iters: int,
    workers: int | None = None,
    warmup: int = 1,
    threads: int = 1,
    mtu: int | None = None,
    wire: str = "float32",
    drop_rate: float = 0.0,
    switch_drop_rate: float = 0.0,
    slots: int | None = None,
    op_timeout: float = 30.0,
    timeout: float = 300,
    daemon_args: list[str] | None = None,
    gso: bool | None = None,
) -> Result:  # noqa: F821 - common.Result, imported inside
    """Run `iters` timed allreduces (after `warmup`) through gradswitchd on the testbed's switch.

    Result.extra: switch (STATS deltas over the run), workers (worker counters summed over ranks, whole
    run), timed_workers (summed from the first timed iteration), worker_cpu_s (per rank, inside the
    timed calls), switch_cpu_s (daemon CPU over rank 0's timed window), switch_data_cpu_s (its data
    threads' CPU over that window), threads, mtu, wire.

    gso=False turns UDP segmentation offload off in the daemon (--udp-gso off) and the workers
    (GRADSWITCH_GSO=0): every datagram is then its own skb, so the testbed's random loss (an nftables
    rule sees one skb: a whole UDP_SEGMENT burst when GSO is on) drops datagrams one by one."""
    n = worker_count(tb, workers)
    total = iters + warmup
    env = None
    if gso is not None:
        daemon_args = list(daemon_args or []) + ["--udp-gso", "on" if gso else "off"]
        env = {"GRADSWITCH_GSO": "1" if gso else "0"}
    with switch_daemon(tb, threads, mtu, switch_drop_rate, slots, daemon_args) as sw:
        s0 = sw.stats()
        rs = run_workers(
            tb, [sw.address] * n, nbytes, total, warmup, wire, op_timeout, drop_rate, timeout, env,
            switch_pid=sw.pid, logs=sw.log,
        )
        s1 = sw.stats() if sw.poll() is None else {}

    def summed(key):
        out: dict[str, int] = {}
        for r in rs:
            for k, v in (r.get(key) or {}).items():
                out[k] = out.get(k, 0) + v
        return out

    extra = {
        "threads": threads,
        "mtu": mtu or tb.link.mtu,
        "wire": wire,
        "gso": gso,
        "switch": {k: v - s0.get(k, 0) for k, v in s1.items() if isinstance(v, int)},
        "workers": summed("stats"),
        "timed_workers": summed("timed_stats"),
        "worker_cpu_s": [r.get("cpu_s") for r in rs],
        "switch_cpu_s": next((r.get("switch_cpu_s") for r in rs if r["rank"] == 0), None),
        "switch_data_cpu_s": next((r.get("switch_data_cpu_s") for r in rs if r["rank"] == 0), None),
    }
    return combine("gradswitch", n, nbytes, iters, rs, n, extra)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradswitch.baselines.gradswitch_sys")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--switch", required=True, help="host:port of the switch's control plane")
    w.add_argument("--job", default="bench")
    add_rank_options(w)
    w.add_argument("--wire", default="float32")
    w.add_argument("--timeout", type=float, default=30.0)
    w.add_argument("--drop-rate", type=float, default=0.0)
    w.add_argument("--switch-pid", type=int, default=None)
    w.add_argument("--no-barrier", action="store_true")
    r = sub.add_parser("request", help="one control-plane request; retries until the switch answers")
    r.add_argument("--switch", required=True)
    r.add_argument("--wait", type=float, default=0.0, help="retry connecting for this many seconds")
    r.add_argument("line", nargs="+")
    a = p.parse_args(argv)
    if a.cmd == "request":
        deadline = time.time() + a.wait
        while True:
            try:
                print(request(a.switch, " ".join(a.line)), flush=True)
                return 0
            except OSError as e:
                if time.time() >= deadline:
                    print(f"ERR unreachable {e}", flush=True)
                    return 1
                time.sleep(0.05)
    if a.nbytes % 4:
        p.error("--nbytes must be a multiple of 4 (float32)")
    emit(
        **work(
            a.switch,
            a.job,
            a.rank,
            a.world,
            a.nbytes,
            a.iters,
            a.warmup,
            a.wire,
            a.timeout,
            a.drop_rate,
            a.switch_pid,
            not a.no_barrier,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
