"""Small traffic tools for checking a testbed (no iperf3 needed). Run inside a namespace:

    python -m gradswitch.testbed.tools tcp-sink --port 5301 --timeout 10
    python -m gradswitch.testbed.tools tcp-source --to 10.66.0.11:5301 --seconds 2
    python -m gradswitch.testbed.tools udp-sink --port 5302 --timeout 5 --idle 0.5
    python -m gradswitch.testbed.tools udp-source --to 10.66.0.1:5302 --count 5000 --pps 20000 [--burst 20]

Each prints one JSON line with its result.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time


def _addr(s: str) -> tuple[str, int]:
    h, p = s.rsplit(":", 1)
    return h, int(p)


def tcp_sink(port: int, timeout: float) -> dict:
    """Accept one connection and count bytes until it closes; throughput over first..last byte."""
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", port))
    ls.listen(1)
    print(json.dumps({"listening": port}), flush=True)
    ls.settimeout(timeout)
    c, _ = ls.accept()
    c.settimeout(timeout)
    buf = bytearray(1 << 20)
    n = 0
    t0 = t1 = None
    while True:
        k = c.recv_into(buf)
        if not k:
            break
        now = time.perf_counter()
        if t0 is None:
            t0 = now
        t1 = now
        n += k
    dt = (t1 - t0) if t0 is not None and t1 > t0 else float("nan")
    return {"bytes": n, "seconds": dt, "bits_per_second": n * 8 / dt if dt == dt and dt > 0 else 0.0}


def tcp_source(to: str, seconds: float, connect_timeout: float = 5.0) -> dict:
    deadline = time.time() + connect_timeout
    while True:
        try:
            s = socket.create_connection(_addr(to), timeout=connect_timeout)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
    buf = memoryview(bytearray(1 << 20))
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        s.sendall(buf)
        n += len(buf)
    s.shutdown(socket.SHUT_WR)
    s.recv(1)
    s.close()
    return {"bytes": n, "seconds": time.perf_counter() - t0}


def udp_sink(port: int, timeout: float, idle: float) -> dict:
    """Count datagrams (and distinct sequence numbers) until `idle` s of silence after the first; `late`:
    those that arrived after a higher sequence number, `displacement`: by how many numbers (quantiles)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.bind(("0.0.0.0", port))
    print(json.dumps({"listening": port}), flush=True)
    s.settimeout(timeout)
    seen = set()
    got = 0
    top = -1
    late = []
    buf = bytearray(65536)
    try:
        while True:
            k = s.recv_into(buf)
            got += 1
            if k >= 8:
                seq = struct.unpack_from("!Q", buf)[0]
                seen.add(seq)
                if seq < top:
                    late.append(top - seq)
                top = max(top, seq)
            s.settimeout(idle)
    except TimeoutError:
        pass
    late.sort()
    quantiles = {f"p{q}": late[(len(late) - 1) * q // 100] for q in (50, 90, 100)} if late else {}
    return {"received": got, "distinct": len(seen), "late": len(late), "displacement": quantiles}


UDP_SEGMENT = 103  # linux/udp.h: send one buffer as datagrams of this size (UDP GSO)


def udp_source(to: str, count: int, pps: float, size: int, burst: int = 1) -> dict:
    """`count` numbered datagrams, `burst` per send call (burst > 1: one UDP_SEGMENT send, as the
    gradswitch worker and switch send runs of DATA/RESULTs), at `pps` datagrams per second on average."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dst = _addr(to)
    size = max(size, 8)
    payload = bytearray(size * burst)
    gso = [(socket.SOL_UDP, UDP_SEGMENT, struct.pack("=H", size))]
    t0 = time.perf_counter()
    errors = 0
    for first in range(0, count, burst):
        n = min(burst, count - first)
        for j in range(n):
            struct.pack_into("!Q", payload, j * size, first + j)
        try:
            if n > 1:
                s.sendmsg([memoryview(payload)[: n * size]], gso, 0, dst)
            else:
                s.sendto(memoryview(payload)[:size], dst)
        except OSError:
            errors += n
        if pps > 0:
            lag = t0 + (first + n) / pps - time.perf_counter()
            if lag > 0:
                time.sleep(lag)
    return {"sent": count, "send_errors": errors, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradswitch.testbed.tools")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("tcp-sink")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--timeout", type=float, default=30)
    a = sub.add_parser("tcp-source")
    a.add_argument("--to", required=True)
    a.add_argument("--seconds", type=float, default=2)
    a = sub.add_parser("udp-sink")
    a.add_argument("--port", type=int, required=True)
    a.add_argument("--timeout", type=float, default=30)
    a.add_argument("--idle", type=float, default=0.5)
    a = sub.add_parser("udp-source")
    a.add_argument("--to", required=True)
    a.add_argument("--count", type=int, default=1000)
    a.add_argument("--pps", type=float, default=10000)
    a.add_argument("--size", type=int, default=200)
    a.add_argument("--burst", type=int, default=1, help="datagrams per send call (UDP_SEGMENT when > 1)")
    x = p.parse_args(argv)
    if x.cmd == "tcp-sink":
        r = tcp_sink(x.port, x.timeout)
    elif x.cmd == "tcp-source":
        r = tcp_source(x.to, x.seconds)
    elif x.cmd == "udp-sink":
        r = udp_sink(x.port, x.timeout, x.idle)
    else:
        if not 1 <= x.burst <= 64:
            p.error("--burst must be in 1..64 (UDP_SEGMENT sends at most 64 datagrams)")
        r = udp_source(x.to, x.count, x.pps, x.size, x.burst)
    print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
