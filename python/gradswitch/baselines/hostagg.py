"""Host aggregation (the conventional method of papers 000/004): every worker streams its gradient to an
aggregator on the host machine, which sums and streams the sum back.

Server (on `host`): one receiver and one sender thread per worker connection. Receivers `recv_into`
preallocated per-worker buffers chunk by chunk; the receiver that completes chunk k (the last of the N
workers to deliver it) sums it with numpy (GIL released) into the accumulator and signals chunk k; each
sender streams completed chunks back in order. So chunk k is summed while chunk k+1 is received and
chunk k-1 is sent back. Worker: a sender thread streams chunks while the main thread receives the sum.
Each iteration starts with a barrier through the server (READY/GO, one round trip, like the barrier
the gloo and MPI baselines do before each timed call), so a worker's time does not include waiting for
a slower worker that is still verifying the previous sum.

    python -m gradswitch.baselines.hostagg server --port P --world N --nbytes B --chunk C --iters I
    python -m gradswitch.baselines.hostagg worker --connect ADDR:P --rank r --world N --nbytes B --iters I
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
import threading
import time

import numpy as np

from .common import add_rank_options, check, emit, grad

HELLO = struct.Struct("!4sIIQQ")  # magic, rank, world, nbytes, chunk bytes
MAGIC = b"GSHA"


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    while view.nbytes:
        k = sock.recv_into(view)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        view = view[k:]


class _Iter:
    """Per-iteration chunk state."""

    def __init__(self, nchunks: int):
        self.count = [0] * nchunks
        self.done = [threading.Event() for _ in range(nchunks)]
        self.senders_left = 0


def serve(
    port: int,
    world: int,
    nbytes: int,
    chunk: int,
    iters: int,
    bind: str = "0.0.0.0",
    ready=None,
    warmup: int = 1,
) -> dict:
    n = nbytes // 4
    ce = max(1, chunk // 4)
    bounds = [(s, min(n, s + ce)) for s in range(0, n, ce)] or [(0, 0)]
    bufs = [np.empty(n, np.float32) for _ in range(world)]
    acc = np.empty(n, np.float32)
    lock = threading.Lock()
    iters_state: dict[int, _Iter] = {}

    def state(it: int) -> _Iter:
        with lock:
            st = iters_state.get(it)
            if st is None:
                st = iters_state[it] = _Iter(len(bounds))
                st.senders_left = world
            return st

    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((bind, port))
    ls.listen(world)
    if ready:
        ready()
    conns: dict[int, socket.socket] = {}
    while len(conns) < world:
        c, _ = ls.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = bytearray(HELLO.size)
        _recv_exact(c, memoryview(hello))
        magic, rank, w, nb, ch = HELLO.unpack(hello)
        if magic != MAGIC or w != world or nb != nbytes or rank >= world or rank in conns:
            c.close()
            raise RuntimeError(f"bad hello from a worker: rank={rank} world={w} nbytes={nb}")
        conns[rank] = c
    ls.close()
    errors: list[BaseException] = []
    barrier = threading.Barrier(world)
    cpu_from: list[float] = []  # process CPU when the first timed iteration starts

    def receiver(r: int) -> None:
        try:
            c = conns[r]
            mv = memoryview(bufs[r]).cast("B")
            tok = bytearray(4)
            for it in range(iters):
                if r == 0 and it == warmup:
                    cpu_from.append(time.process_time())
                st = state(it)
                # start barrier: every worker says READY, then all get GO (its sender is idle now:
                # the worker only says READY after receiving the whole previous sum)
                _recv_exact(c, memoryview(tok))
                barrier.wait()
                c.sendall(b"GO!!")
                for k, (a, b) in enumerate(bounds):
                    _recv_exact(c, mv[a * 4 : b * 4])
                    with lock:
                        st.count[k] += 1
                        last = st.count[k] == world
                    if last:
                        out = acc[a:b]
                        np.add(bufs[0][a:b], bufs[1][a:b], out=out) if world > 1 else np.copyto(
                            out, bufs[0][a:b]
                        )
                        for q in range(2, world):
                            np.add(out, bufs[q][a:b], out=out)
                        st.done[k].set()
        except BaseException as e:  # noqa: B036 - reported to the caller
            errors.append(e)
            barrier.abort()
            for st in list(iters_state.values()):
                for ev in st.done:
                    ev.set()

    def sender(r: int) -> None:
        try:
            c = conns[r]
            mv = memoryview(acc).cast("B")
            for it in range(iters):
                st = state(it)
                for k, (a, b) in enumerate(bounds):
                    st.done[k].wait()
                    if errors:
                        return
                    c.sendall(mv[a * 4 : b * 4])
                with lock:
                    st.senders_left -= 1
                    if st.senders_left == 0:
                        del iters_state[it]
        except BaseException as e:  # noqa: B036
            errors.append(e)

    threads = [
        threading.Thread(target=f, args=(r,), daemon=True) for r in range(world) for f in (receiver, sender)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns.values():
        c.close()
    if errors:
        raise errors[0]
    # cpu_s: the aggregator's CPU (every thread) from the first timed iteration to the end
    cpu = time.process_time() - cpu_from[0] if cpu_from else None
    return {"server_seconds": time.perf_counter() - t0, "cpu_s": cpu}


def work(
    connect: str,
    rank: int,
    world: int,
    nbytes: int,
    iters: int,
    warmup: int,
    chunk: int,
    connect_timeout: float = 20.0,
) -> dict:
    host, port = connect.rsplit(":", 1)
    deadline = time.time() + connect_timeout
    while True:
        try:
            s = socket.create_connection((host, int(port)), timeout=connect_timeout)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    s.settimeout(None)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(HELLO.pack(MAGIC, rank, world, nbytes, chunk))
    n = nbytes // 4
    out = np.empty(n, np.float32)
    outv = memoryview(out).cast("B")
    go = threading.Event()
    box: dict = {}
    errs: list[BaseException] = []

    def send_loop() -> None:
        try:
            while True:
                go.wait()
                go.clear()
                g = box.get("g")
                if g is None:
                    return
                mv = memoryview(g).cast("B")
                for a in range(0, len(mv), chunk):
                    s.sendall(mv[a : a + chunk])
        except BaseException as e:  # noqa: B036
            errs.append(e)

    th = threading.Thread(target=send_loop, daemon=True)
    th.start()
    times, cpu, max_err = [], 0.0, 0.0
    tok = bytearray(4)
    for it in range(iters):
        g = grad(rank, n, it)
        box["g"] = g
        s.sendall(b"RDY!")
        _recv_exact(s, memoryview(tok))
        c0 = time.process_time()
        t0 = time.perf_counter()
        go.set()
        _recv_exact(s, outv)
        t1 = time.perf_counter()
        c1 = time.process_time()
        if errs:
            raise errs[0]
        max_err = max(max_err, check(out, world, it))
        if it >= warmup:
            times.append(t1 - t0)
            cpu += c1 - c0
    box["g"] = None
    go.set()
    th.join()
    s.close()
    # cpu_s: this process's CPU (its sender thread included) inside the timed calls
    return {"rank": rank, "times": times, "max_err": max_err, "ok": max_err == 0.0, "cpu_s": cpu}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradswitch.baselines.hostagg")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--world", type=int, required=True)
    s.add_argument("--nbytes", type=int, required=True)
    s.add_argument("--chunk", type=int, default=1 << 20)
    s.add_argument("--iters", type=int, required=True, help="total, warmup included")
    s.add_argument("--warmup", type=int, default=1, help="untimed first iterations (not in its cpu_s)")
    w = sub.add_parser("worker")
    w.add_argument("--connect", required=True)
    add_rank_options(w)
    w.add_argument("--chunk", type=int, default=1 << 20)
    a = p.parse_args(argv)
    if a.nbytes % 4:
        p.error("--nbytes must be a multiple of 4 (float32)")
    if a.cmd == "server":
        r = serve(
            a.port,
            a.world,
            a.nbytes,
            a.chunk,
            a.iters,
            ready=lambda: print("READY", flush=True),
            warmup=a.warmup,
        )
        emit(role="server", **r)
    else:
        emit(**work(a.connect, a.rank, a.world, a.nbytes, a.iters, a.warmup, a.chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
