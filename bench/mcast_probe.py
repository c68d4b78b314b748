#!/usr/bin/env python3
"""What a result write costs the switch's data thread when it goes once to an IP multicast group that the
testbed's Linux bridge replicates, beside once per worker as the UDP backend sends it: a probe of issue 37's
multicast option before it is built (no gradswitch code runs here).

    flock /tmp/gradswitch-netns.lock python3 bench/mcast_probe.py --rounds 5 --out bench/results/tmp/mcast

On the emulated testbed (docs/testbed.md: N workers, 1 Gbit/s links, the bridge in the switch's
namespace), one thread in the switch's namespace sends UDP GSO trains of --segments datagrams of --size
bytes (what the data thread writes per destination after a window of full trains), paced at
--trains-per-s, in blocks of --block trains that take turns: `unicast`, each train to each of the N
workers (N writes, as the UDP backend sends now), and `multicast`, each train once to a group (one
write; the bridge, with multicast snooping and its querier on, clones it to the ports whose workers
joined). Taking turns within one sender lets the machine's load drift over both alike. A receiver in
every worker's namespace (UDP_GRO, joined to the group) counts what arrives, so a mode that loses trains
shows, and the host's port counts what snooping should keep from it. The figure is the sending
thread's CPU per train (CLOCK_THREAD_CPUTIME_ID around its sendmsg calls), which on veths includes the
bridge's, the links' and the receivers' softirq work that the kernel runs inline in the sender's system
call, as it does for gradswitchd's data thread; a NIC and a top-of-rack switch would take that part off
the host. Per round (a sender process) each mode's CPU per train and their ratio; medians and ranges
over rounds go to --out/summary.json.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOL_UDP, UDP_SEGMENT, UDP_GRO = 17, 103, 104
GROUP = "239.255.37.1"  # administratively scoped (RFC 2365): never leaves the testbed's bridge
PORT = 47037
MODES = ("unicast", "multicast")


def send(a) -> None:
    """In the switch's namespace: paced trains, blocks of --block unicast (to each of a.workers) and
    multicast (to the group) in turn so that load drifts over both alike; JSON on stdout."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((a.src, 0))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(a.src))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 1)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
    payload = bytes(a.size) * a.segments
    cmsg = [(SOL_UDP, UDP_SEGMENT, struct.pack("H", a.size))]
    workers = [(w, PORT) for w in a.workers.split(",")]
    dests = {"unicast": workers, "multicast": [(GROUP, PORT)]}
    gap = 1.0 / a.trains_per_s
    cpu = dict.fromkeys(MODES, 0)
    trains = dict.fromkeys(MODES, 0)
    errors = 0
    nxt = time.monotonic()
    for i in range(a.trains):
        mode = MODES[(i // a.block) % 2] if a.mode == "both" else a.mode
        nxt += gap
        pause = nxt - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        t0 = time.thread_time_ns()
        for d in dests[mode]:
            try:
                s.sendmsg([payload], cmsg, 0, d)
            except OSError:
                errors += 1
        cpu[mode] += time.thread_time_ns() - t0
        trains[mode] += 1
    for w in workers:  # one byte ends each receiver
        s.sendto(b"x", w)
    print(json.dumps({"trains": trains, "cpu_ns": cpu, "send_errors": errors}), flush=True)


def recv(a) -> None:
    """In a worker's namespace: joins the group, counts datagram bytes until a 1-byte datagram."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    s.setsockopt(SOL_UDP, UDP_GRO, 1)
    s.bind(("", PORT))
    mreq = socket.inet_aton(GROUP) + socket.inet_aton(a.src)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
    print("ready", flush=True)
    buf = bytearray(1 << 16)
    nbytes = 0
    s.settimeout(a.timeout)
    while True:
        try:
            n = s.recv_into(buf)
        except TimeoutError:
            break
        if n == 1:
            break
        nbytes += n
    print(json.dumps({"bytes": nbytes}), flush=True)


def one_round(tb, mode: str, a) -> dict:
    """One sender process: `mode` unicast, multicast or both (alternating blocks)."""
    from gradswitch.testbed.base import HOST_IF

    workers = [f"w{i}" for i in range(a.workers)]
    addrs = [tb.address(w) for w in workers]
    me = [sys.executable, str(Path(__file__).resolve())]
    rx = []
    for w, addr in zip(workers, addrs, strict=True):
        p = tb.popen(w, [*me, "recv", "--src", addr, "--timeout", "20"], stdout=-1, text=True)
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"receiver on {w} did not start")
        rx.append(p)
    time.sleep(0.3)  # the joins' IGMP reports reach the bridge
    host0 = tb.counters("host", HOST_IF)["rx_bytes"]  # a port without members: snooping keeps it quiet
    args = ["send", "--src", tb.address("switch"), "--workers", ",".join(addrs), "--mode", mode]
    args += ["--trains", str(a.trains), "--trains-per-s", str(a.trains_per_s), "--block", str(a.block)]
    args += ["--segments", str(a.segments), "--size", str(a.size)]
    out = tb.exec("switch", [*me, *args], timeout=120)
    r = json.loads(out.stdout.splitlines()[-1])
    got = [json.loads(p.communicate(timeout=30)[0].splitlines()[-1])["bytes"] for p in rx]
    want = a.trains * a.segments * a.size
    res = {f"{m}_us_per_train": r["cpu_ns"][m] / r["trains"][m] / 1e3 for m in MODES if r["trains"][m]}
    res["send_errors"] = r["send_errors"]
    res["delivered"] = [g / want for g in got]  # each worker's share of the trains' bytes
    res["host_rx_bytes"] = tb.counters("host", HOST_IF)["rx_bytes"] - host0
    return res


def wait_for_snooping(tb, a, most_s: float = 30.0) -> float:
    """Multicast rounds until the bridge stops flooding the host's port (its querier counts once the
    query response interval passed); returns the seconds it took."""
    t0 = time.monotonic()
    quick = argparse.Namespace(**{**vars(a), "trains": 200})
    while time.monotonic() - t0 < most_s:
        if one_round(tb, "multicast", quick)["host_rx_bytes"] < a.size * a.segments:
            return time.monotonic() - t0
        time.sleep(1)
    raise RuntimeError(f"the bridge still floods the group after {most_s:.0f} s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd")
    ps = sub.add_parser("send")
    for k in ("--src", "--workers"):
        ps.add_argument(k, required=True)
    ps.add_argument("--mode", choices=[*MODES, "both"], required=True)
    ps.add_argument("--block", type=int, required=True)
    ps.add_argument("--trains", type=int, required=True)
    ps.add_argument("--trains-per-s", type=float, required=True)
    ps.add_argument("--segments", type=int, required=True)
    ps.add_argument("--size", type=int, required=True)
    pr = sub.add_parser("recv")
    pr.add_argument("--src", required=True)
    pr.add_argument("--timeout", type=float, default=20)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--trains", type=int, default=2000, help="per round, both modes together")
    p.add_argument("--block", type=int, default=20, help="trains of one mode before the other's")
    p.add_argument(
        "--trains-per-s", type=float, default=1000.0, help="per destination (default 1000: 380 Mbit/s)"
    )
    p.add_argument("--segments", type=int, default=32, help="datagrams per train (the suite's window)")
    p.add_argument("--size", type=int, default=1472, help="bytes per datagram (MTU 1500)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "tmp" / "mcast")
    a = p.parse_args(argv)
    if a.cmd == "send":
        send(a)
        return 0
    if a.cmd == "recv":
        recv(a)
        return 0
    from gradswitch.testbed import Testbed
    from gradswitch.testbed.base import BRIDGE

    a.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with Testbed(workers=a.workers, rate=a.rate, name="mcp") as tb:
        # snooping forwards a group only to the ports that joined it, once a querier exists
        tb.ip("switch", "link", "set", BRIDGE, "type", "bridge", "mcast_snooping", "1", "mcast_querier", "1")
        warm = wait_for_snooping(tb, a)
        for rnd in range(a.rounds):
            r = one_round(tb, "both", a)
            r["round"] = rnd
            r["ratio"] = r["multicast_us_per_train"] / r["unicast_us_per_train"]
            runs.append(r)
            print(json.dumps(r), flush=True)
            (a.out / "runs.json").write_text(json.dumps(runs, indent=1))
    summary = {"snooping_after_s": warm}
    for k in ("unicast_us_per_train", "multicast_us_per_train", "ratio"):
        xs = [r[k] for r in runs]
        summary[k] = {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}
    summary["least_delivered"] = min(min(r["delivered"]) for r in runs)
    summary["most_host_rx_bytes"] = max(r["host_rx_bytes"] for r in runs)
    cmd = " ".join(sys.argv)
    (a.out / "summary.json").write_text(
        json.dumps({"command": cmd, "args": vars(a) | {"out": str(a.out)}, "summary": summary}, indent=1)
    )
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
