#!/usr/bin/env python3
"""Discrete-event model of the slot protocol at scales the testbed cannot run (issue 10, docs/scaling.md).

One event per packet-sized chunk per link hop. Every link direction is a FIFO with exact serialization
(rate), a propagation delay, a tail-drop queue limit in bytes and an optional random loss. Each worker
keeps a window of `slots` chunks outstanding per switch it sends to; a switch completes a chunk when all
its members' copies are in and sends the result to each member (one copy per member, serialized on its
NIC); a lost chunk or result is recovered by the sender's retransmission timer (starts at --rto, doubles
per expiry up to --rto-max), and a switch answers a retransmitted chunk it has completed from its copy
of the result. Layouts: flat (one switch), sharded (chunk c to switch c mod S), co-located (S = N, switch
j on worker j's machine, its share on loopback) and two-level (a leaf per rack sums its rack, sends one
copy up to the spine and multicasts the spine's result down).

What it leaves out: CPU (the switch's per-packet cost unless --switch-pps is given, the workers', the
kernel's), the workers' adaptive window (the window here is fixed at --slots), RACK's early loss
detection (only timers recover), tbf's token bucket bursts, barriers and control traffic.

    python3 bench/scale_sim.py                    # the table for N up to 1,024 (defaults below)
    python3 bench/scale_sim.py --validate         # against the testbed runs in bench/results/
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
HEADER_BYTES = 60  # IPv4 + UDP + gradswitch header (docs/protocol.md)
FRAME_BYTES = 14  # Ethernet header, which tbf counts
HOST_QUEUE_BYTES = 8 << 20  # the testbed's tbf limit on hosts' egress (testbed/core.py)


class Link:
    """One direction of a link: FIFO, serialization at `rate` bits/s (None = unshaped), then `delay`."""

    def __init__(self, sim, rate, delay=0.0, limit=None, loss=0.0, per_packet_s=0.0, drop=()):
        self.sim, self.rate, self.delay, self.limit, self.loss = sim, rate, delay, limit, loss
        self.per_packet_s = per_packet_s
        self.drop = set(drop)  # indices of packets to lose (for exact tests)
        self.busy_until = 0.0
        self.sent = self.bytes = self.dropped = 0

    def send(self, t, size, then, *args) -> None:
        index = self.sent
        self.sent += 1
        service = (size * 8 / self.rate if self.rate else 0.0) + self.per_packet_s
        if self.limit is not None and self.rate and (self.busy_until - t) * self.rate / 8 > self.limit:
            self.dropped += 1
            return
        self.bytes += size
        start = max(t, self.busy_until)
        self.busy_until = start + service
        if index in self.drop or (self.loss and self.sim.rng.random() < self.loss):
            self.dropped += 1
            return
        self.sim.at(self.busy_until + self.delay, then, *args)


class Sim:
    def __init__(self, seed=1):
        self.events, self.seq, self.now = [], 0, 0.0
        self.rng = random.Random(seed)

    def at(self, t, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def run(self) -> None:
        events = self.events
        while events:
            t, _, fn, args = heapq.heappop(events)
            self.now = t
            fn(t, *args)

    def path(self, t, links, size, then, *args) -> None:
        """Sends a packet along `links` hop by hop, calling then(t, *args) where it arrives."""
        if not links:
            self.at(t, then, *args)
            return
        links[0].send(t, size, self._hop, links, 1, size, then, args)

    def _hop(self, t, links, i, size, then, args) -> None:
        if i == len(links):
            then(t, *args)
        else:
            links[i].send(t, size, self._hop, links, i + 1, size, then, args)


@dataclass
class Params:
    chunks: list  # wire bytes of each chunk's packet
    slots: int = 256
    rto: float = 0.004
    rto_max: float = 0.2
    fixed_window: bool = False
    rate: float | None = None  # the worker link's: the timer's floor covers full windows draining at it
    fan_in_pps: float = 0.0  # a switch's packet rate over its members (0 = not modelled)

    def rto_floor(self, windows: int) -> float:
        """Stand-in for the worker's learned timer floor and adaptive window (not modelled), which keep
        full windows queued on a slow link or behind a switch's packet rate from firing spurious
        timeouts: twice their drain time."""
        drain = windows * self.slots * self.chunks[0] * 8 / self.rate if self.rate else 0.0
        if self.fan_in_pps:
            drain = max(drain, windows * self.slots / self.fan_in_pps)
        return max(self.rto, 2 * drain)


class Timers:
    """The retransmission timer of a sender: srtt + 4 rttvar within [rto, rto_max] (RFC 6298, Karn's
    rule: only chunks sent once are sampled), doubling per expiry, as the worker's loss detector."""

    def __init__(self, params, floor):
        self.p, self.floor, self.srtt, self.rttvar = params, floor, 0.0, 0.0
        self.sent_at = {}  # chunk -> time of its only send; None once resent

    def timeout(self, c, t, attempt) -> float:
        self.sent_at[c] = t if attempt == 0 else None
        base = max(self.floor, self.srtt + 4 * self.rttvar)
        return min(base * 2**attempt, self.p.rto_max)

    def spurious(self) -> None:
        """As the worker's learned floor, raised by a timeout proven spurious (it never decays here)."""
        self.floor = min(self.p.rto_max, 2 * self.floor)

    def acked(self, c, t) -> None:
        sent = self.sent_at.pop(c, None)
        if sent is None:
            return
        sample = t - sent
        if not self.srtt:
            self.srtt, self.rttvar = sample, sample / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - sample)
            self.srtt = 0.875 * self.srtt + 0.125 * sample


class Switch:
    """Aggregates one chunk from each member; a leaf forwards the sum to its parent, the root returns it."""

    def __init__(self, sim, params, members, down, parent=None, up=None):
        self.sim, self.p, self.members = sim, params, members
        self.down = down  # member -> links from this switch to it
        self.parent, self.up = parent, up  # a leaf: the spine and the links to it
        self.arrived = {}  # chunk -> set of members counted
        self.result = set()  # chunks whose result this switch holds
        self.timers = Timers(params, params.rto_floor(1))

    def on_chunk(self, t, c, member) -> None:
        if c in self.result:
            self._send_result(t, c, member)  # a retransmission: answer from the copy of the result
            return
        got = self.arrived.setdefault(c, set())
        if member in got:
            member.spurious(c)  # its first copy is here: the timeout that resent it was spurious
            return
        got.add(member)
        if len(got) < len(self.members):
            return
        del self.arrived[c]
        if self.parent is None:
            self.on_result(t, c)
        else:
            self._send_up(t, c, 0)

    def _send_up(self, t, c, attempt) -> None:
        self.sim.path(t, self.up, self.p.chunks[c], self.parent.on_chunk, c, self)
        self.sim.at(t + self.timers.timeout(c, t, attempt), self._timer, c, attempt + 1)

    def _timer(self, t, c, attempt) -> None:
        if c not in self.result:
            self._send_up(t, c, attempt)

    def spurious(self, c) -> None:
        self.timers.spurious()

    def on_result(self, t, c, _from=None) -> None:
        if c in self.result:
            return
        self.result.add(c)
        self.timers.acked(c, t)
        for m in self.members:
            self._send_result(t, c, m)

    def _send_result(self, t, c, member) -> None:
        self.sim.path(t, self.down[member], self.p.chunks[c], member.on_result, c, self)


class Worker:
    """Sends its chunks to their switches, a window per switch; the window is at most `slots` and, unless
    the window is fixed, halves on a timeout (at most once per smoothed RTT) and grows by one per window
    of results: an AIMD stand-in for the worker's delay-target adaptive window, which is not modelled."""

    def __init__(self, sim, params, shards):
        self.sim, self.p = sim, params
        self.shards = shards  # [(switch, links to it, chunks it owns)]
        self.done = set()
        self.finished_at = None
        self.owner = {}

    def start(self, t) -> None:
        count = len(self.shards)
        self.next, self.inflight, self.last_cut = [0] * count, [0] * count, [-1.0] * count
        self.window = [float(self.p.slots)] * count
        self.timers = [Timers(self.p, self.p.rto_floor(count)) for _ in self.shards]
        for s, (_, _, owned) in enumerate(self.shards):
            for c in owned:
                self.owner[c] = s
        # the first windows go out in chunk order, so interleaved over the switches as the worker sends
        for c in range(min(len(self.p.chunks), self.p.slots * count)):
            s = self.owner[c]
            if self.inflight[s] < int(self.window[s]):
                self.next[s] += 1
                self.inflight[s] += 1
                self._send(t, c, 0)

    def _fill(self, t, s) -> None:
        owned = self.shards[s][2]
        while self.inflight[s] < int(self.window[s]) and self.next[s] < len(owned):
            c = owned[self.next[s]]
            self.next[s] += 1
            self.inflight[s] += 1
            self._send(t, c, 0)

    def _send(self, t, c, attempt) -> None:
        switch, links, _ = self.shards[self.owner[c]]
        self.sim.path(t, links, self.p.chunks[c], switch.on_chunk, c, self)
        self.sim.at(t + self.timers[self.owner[c]].timeout(c, t, attempt), self._timer, c, attempt + 1)

    def _timer(self, t, c, attempt) -> None:
        if c in self.done:
            return
        s = self.owner[c]
        if not self.p.fixed_window and t - self.last_cut[s] > self.timers[s].srtt:
            self.window[s] = max(1.0, self.window[s] / 2)
            self.last_cut[s] = t
        self._send(t, c, attempt)

    def spurious(self, c) -> None:
        self.timers[self.owner[c]].spurious()

    def on_result(self, t, c, _switch) -> None:
        if c in self.done:
            return
        self.done.add(c)
        s = self.owner[c]
        self.timers[s].acked(c, t)
        self.inflight[s] -= 1
        self.window[s] = min(float(self.p.slots), self.window[s] + 1 / self.window[s])
        if len(self.done) == len(self.p.chunks):
            self.finished_at = t
        self._fill(t, s)


@dataclass
class Net:
    """Link settings; rates in bits/s (None = unshaped), delays in seconds per link direction."""

    rate: float = 25e9  # every worker link
    switch_rate: float | None = 100e9  # each switch machine's NIC; None = a port per member
    delay: float = 1e-6
    queue: int | None = 393216  # tail-drop limit on links into a machine (bytes); None = unlimited
    host_queue: int | None = HOST_QUEUE_BYTES  # on a host's own egress
    loss: float = 0.0
    switch_pps: float = 0.0  # a switch's packet rate (0 = not modelled)
    drops: dict = field(default_factory=dict)  # link name -> packet indices to lose (tests)

    def link(self, sim, name, rate, limit):
        return Link(sim, rate, self.delay, limit, self.loss, drop=self.drops.get(name, ()))


def chunk_sizes(nbytes: int, mtu: int) -> list:
    payload = (mtu - HEADER_BYTES) & ~3
    n = max(1, math.ceil(nbytes / payload))
    last = nbytes - (n - 1) * payload
    return [payload + HEADER_BYTES + FRAME_BYTES] * (n - 1) + [last + HEADER_BYTES + FRAME_BYTES]


def simulate(
    layout,
    n,
    nbytes,
    net=None,
    shards=1,
    rack=4,
    slots=256,
    mtu=1500,
    rto=0.004,
    seed=1,
    fixed_window=False,
    machines=False,
) -> dict:
    """One allreduce of `nbytes` over `n` workers; returns time (s), goodput share and link counters.

    layout: flat | sharded | colocated | two-level | flat-racks (one switch on the spine, reached across
    the racks' uplinks; machines: leaves and the spine are machines with a NIC and a packet rate as
    the flat switch and the shards are). net.switch_rate None: a port per member at the members' rates.
    """
    net = net or Net()
    sim = Sim(seed)
    p = Params(chunk_sizes(nbytes, mtu), slots, rto, fixed_window=fixed_window, rate=net.rate)
    if net.switch_pps:
        fan_in = {"flat": n, "sharded": n, "colocated": n, "flat-racks": n}.get(layout, max(rack, n / rack))
        p.fan_in_pps = net.switch_pps / fan_in
    nchunks = len(p.chunks)
    w_up = [net.link(sim, f"w{i}.up", net.rate, net.host_queue) for i in range(n)]
    w_down = [net.link(sim, f"w{i}.down", net.rate, net.queue) for i in range(n)]
    workers = [Worker(sim, p, []) for _ in range(n)]
    counters = {}

    def switch_nic(name):
        """The links into and out of a switch machine: its NIC (unless a port per member), then its
        packet rate as a FIFO server with an unbounded queue (the socket buffer is not modelled)."""
        into, out = [], []
        if net.switch_rate is not None:
            into.append(net.link(sim, f"{name}.in", net.switch_rate, net.queue))
            out.append(net.link(sim, f"{name}.out", net.switch_rate, net.host_queue))
        if net.switch_pps:
            into.append(Link(sim, None, 0.0, None, per_packet_s=1 / net.switch_pps))
        return into, out

    if layout in ("flat", "sharded"):
        s_count = shards if layout == "sharded" else 1
        for s in range(s_count):
            into, out = switch_nic(f"s{s}")
            sw = Switch(sim, p, workers, {w: out + [w_down[i]] for i, w in enumerate(workers)})
            owned = list(range(s, nchunks, s_count))
            for i, w in enumerate(workers):
                w.shards.append((sw, [w_up[i]] + into, owned))
            counters[f"s{s}"] = (into, out)
    elif layout == "colocated":
        for j in range(n):
            down = {w: ([] if i == j else [w_up[j], w_down[i]]) for i, w in enumerate(workers)}
            sw = Switch(sim, p, workers, down)
            owned = list(range(j, nchunks, n))
            for i, w in enumerate(workers):
                w.shards.append((sw, [] if i == j else [w_up[i], w_down[j]], owned))
    elif layout in ("two-level", "flat-racks"):
        racks = math.ceil(n / rack)
        up_up = [net.link(sim, f"r{r}.up", net.switch_rate or net.rate, net.queue) for r in range(racks)]
        up_down = [net.link(sim, f"r{r}.down", net.switch_rate or net.rate, net.queue) for r in range(racks)]
        counters["uplinks"] = (up_up, up_down)
        if layout == "flat-racks":
            sw = Switch(sim, p, workers, {w: [up_down[i // rack], w_down[i]] for i, w in enumerate(workers)})
            for i, w in enumerate(workers):
                w.shards.append((sw, [w_up[i], up_up[i // rack]], list(range(nchunks))))
        else:
            spine = Switch(sim, p, [], {})
            spine_in, spine_out = switch_nic("spine") if machines else ([], [])
            for r in range(racks):
                members = workers[r * rack : (r + 1) * rack]
                leaf = Switch(sim, p, members, {}, parent=spine, up=[up_up[r]] + spine_in)
                leaf_in, _ = switch_nic(f"leaf{r}") if machines else ([], [])
                for k, w in enumerate(members):
                    leaf.down[w] = [w_down[r * rack + k]]
                    w.shards.append((leaf, [w_up[r * rack + k]] + leaf_in, list(range(nchunks))))
                spine.members.append(leaf)
                spine.down[leaf] = spine_out + [up_down[r]]
    else:
        raise ValueError(f"unknown layout {layout!r} (flat, sharded, colocated, two-level, flat-racks)")

    for w in workers:
        sim.at(0.0, lambda t, w=w: w.start(t))
    sim.run()
    unfinished = sum(w.finished_at is None for w in workers)
    if unfinished:
        raise RuntimeError(f"{unfinished} of {n} workers did not finish (a bug in the model)")
    t = max(w.finished_at for w in workers)
    out = {"time_s": t, "goodput_share": nbytes * 8 / t / net.rate, "chunks": nchunks}
    out["worker_link_bytes"] = [lk.bytes for lk in w_up]
    out["dropped"] = sum(lk.dropped for lk in w_up + w_down)
    if "uplinks" in counters:
        ups, downs = counters["uplinks"]
        out["uplink_bytes"] = [(a.bytes, b.bytes) for a, b in zip(ups, downs, strict=True)]
        out["dropped"] += sum(lk.dropped for lk in ups + downs)
    for name, (into, out_links) in counters.items():
        if name != "uplinks":
            out["dropped"] += sum(lk.dropped for lk in into + out_links)
    return out


def _rate(s: str) -> float | None:
    s = s.strip().lower()
    if s in ("none", "port"):
        return None
    for suffix, mult in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if s.endswith(suffix):
            return float(s[: -len(suffix)]) * mult
    raise argparse.ArgumentTypeError(f"bad rate {s!r}: want e.g. 25gbit, 200mbit or 'port'")


def _sizes(s: str) -> list:
    try:
        sizes = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad list of sizes {s!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError("sizes must be positive integers")
    return sizes


def _emit(rows: list, cells: tuple) -> None:
    """Adds a markdown row and shows it on stderr as progress (the table goes to stdout at the end)."""
    rows.append("| " + " | ".join(str(c) for c in cells) + " |")
    print("progress:", rows[-1], file=sys.stderr, flush=True)


def table(a) -> str:
    net = Net(
        rate=a.rate,
        switch_rate=a.switch_rate,
        delay=a.delay_us * 1e-6,
        queue=a.queue,
        loss=a.loss,
        switch_pps=a.switch_pps,
    )
    nbytes = int(a.mb * MIB)
    fan = a.per_switch
    rows = [
        "| N | layout | switches | allreduce time | per-worker goodput / B | packets dropped |",
        "|---|---|---|---|---|---|",
    ]
    for n in a.sizes:
        for layout, shards, label in (
            ("flat", 1, "1"),
            ("sharded", max(1, n // fan), f"S = {max(1, n // fan)}"),
            ("two-level", 1, f"{math.ceil(n / fan)} leaves + spine"),
        ):
            r = simulate(
                layout,
                n,
                nbytes,
                net,
                shards=shards,
                rack=fan,
                slots=a.slots,
                mtu=a.mtu,
                rto=a.rto_ms / 1e3,
                seed=a.seed,
                machines=True,
            )
            cells = (
                n,
                layout,
                label,
                f"{r['time_s'] * 1e3:.2f} ms",
                f"{r['goodput_share']:.3f}",
                r["dropped"],
            )
            _emit(rows, cells)
    return "\n".join(rows)


# The testbed runs of BENCHMARKS.md §13: (result dir, series, system name) -> how to simulate it
VALIDATION = [
    ("2026-11-23-scale", "sharding", "gradswitch S=1", dict(layout="sharded", n=4, shards=1)),
    ("2026-11-23-scale", "sharding", "gradswitch S=2", dict(layout="sharded", n=4, shards=2)),
    ("2026-11-23-scale", "sharding", "gradswitch S=4", dict(layout="sharded", n=4, shards=4)),
    ("2026-11-23-scale", "racks", "gradswitch two-level", dict(layout="two-level", n=8, rack=4)),
    (
        "2026-11-23-scale",
        "racks",
        "gradswitch flat (one switch on the spine)",
        dict(layout="flat-racks", n=8, rack=4),
    ),
    (
        "2026-11-23-scale-colocated",
        "colocated",
        "gradswitch, one dedicated switch",
        dict(layout="flat", n=4, port=True),
    ),
    (
        "2026-11-23-scale-colocated",
        "colocated",
        "gradswitch, co-located, S = N = 4",
        dict(layout="colocated", n=4),
    ),
]


def validate(a) -> str:
    rows = ["| testbed run | system | measured | simulated | simulated / measured |", "|---|---|---|---|---|"]
    for folder, series, system, how in VALIDATION:
        res = json.loads((a.results / folder / "results.json").read_text())
        rec = next((r for r in res[series] if r["system"] == system), None)
        if rec is None or not rec.get("ok"):
            raise SystemExit(f"{folder}/results.json has no successful {system!r} in {series!r}")
        args = res["args"]
        rate = _rate(args["rate"])
        how = dict(how)
        port = how.pop("port", False)
        # the testbed: every link at B, 0 ms delay (veth: tens of us), tbf queue limits as in testbed/core.py
        net = Net(
            rate=rate,
            switch_rate=None if port else rate,
            delay=a.delay_us * 1e-6,
            queue=max(int(rate / 8 * 0.005), 4 * 98304, 64 * 1514),
        )
        layout, n = how.pop("layout"), how.pop("n")
        sim = simulate(
            layout, n, int(args["mb"] * MIB), net, slots=a.slots, rto=a.rto_ms / 1e3, seed=a.seed, **how
        )
        measured = rec["median_s"]
        ratio = sim["time_s"] / measured
        _emit(
            rows,
            (folder, system, f"{measured * 1e3:.0f} ms", f"{sim['time_s'] * 1e3:.0f} ms", f"{ratio:.2f}"),
        )
    return "\n".join(rows)


# The model's settings: (flag, type, default, help); the defaults are the table's scenario.
OPTIONS = [
    ("--sizes", _sizes, [4, 16, 64, 256, 1024], "worker counts N of the table (default 4,16,64,256,1024)"),
    ("--mb", float, 1.0, "allreduce size in MiB (default 1)"),
    ("--rate", _rate, 25e9, "every worker link's rate (default 25gbit)"),
    (
        "--switch-rate",
        _rate,
        None,
        "each switch's NIC (flat, shard, leaf, spine); 'port' = a port per member "
        "at the members' rate (default port)",
    ),
    ("--per-switch", int, 32, "workers per shard (S = N / this) and per rack (default 32)"),
    ("--delay-us", float, 1.0, "one-way delay per link in us (default 1)"),
    (
        "--queue",
        int,
        393216,
        "tail-drop limit of a queue into a machine, bytes (default 393216, the testbed's at 200 Mbit/s)",
    ),
    ("--loss", float, 0.0, "random loss per packet per link (default 0)"),
    (
        "--switch-pps",
        float,
        256e3,
        "a switch's packet rate in, packets/s, 0 = not modelled (default 256000: "
        "the UDP daemon's one data thread at MTU 1500 on the development VM, BENCHMARKS.md section 2)",
    ),
    ("--slots", int, 256, "window per worker per switch (default 256)"),
    ("--mtu", int, 1500, "IP MTU (default 1500: 1440 bytes of payload)"),
    ("--rto-ms", float, 4.0, "first retransmission timeout, ms, doubling to 200 ms (default 4)"),
    ("--seed", int, 1, "random seed of the loss (default 1)"),
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--validate",
        action="store_true",
        help="simulate the testbed runs in --results and print simulated vs measured times",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=ROOT / "bench" / "results",
        help="folder holding the testbed results (default bench/results)",
    )
    for flag, kind, default, text in OPTIONS:
        p.add_argument(flag, type=kind, default=default, help=text)
    a = p.parse_args(argv)
    if a.per_switch < 1 or a.slots < 1 or a.mb <= 0 or not 0 <= a.loss < 1:
        p.error("--per-switch and --slots must be >= 1, --mb > 0, 0 <= --loss < 1")
    print(validate(a) if a.validate else table(a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
