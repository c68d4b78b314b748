"""Two levels: R racks of W workers. Rack r's workers are on a bridge in its leaf machine leaf<r>,
which routes to the spine machine over an uplink of its own (rate `uplink_rate`, default the workers'
rate): a gradswitchd with --uplink runs on each leaf, a plain one on the spine (docs/scaling.md), and
anything else between racks (gloo's ring, a flat switch on the spine) crosses the same uplinks::

    w0 .. w{W-1}      w{W} .. w{2W-1}            one link each (rate)
       |  gs-p-w*        |
    leaf0 (gs-br0)    leaf1 (gs-br0)     ...     rack r: <a.b>.(c+r).0/24, leaf .1, worker j .10+j
       |  gs-up0         |  gs-up0               uplink r (uplink_rate): <a.b>.(c+100+r).0/24
       +--- gs-p-leaf0 --+-- gs-p-leaf1 --- spine         spine .1, leaf .2; routed, no bridge

(<a.b.c> are the first three numbers of `subnet`: 10.66.0 by default.)"""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from .base import BRIDGE, HOST_IF, HOST_QUEUE_BYTES, PREFIX, TestbedError, Topology, fmt_rate, parse_rate
from .bridge import check_count

UPLINK_IF = f"{PREFIX}up0"  # a leaf's interface toward the spine
MAX_RACKS = 50
MAX_PER_RACK = 100


class RacksTopology(Topology):
    kind = "racks"

    def __init__(self, tb, racks: int, uplink_rate=None):
        super().__init__(tb)
        self.racks = check_count("racks", racks, MAX_RACKS)
        if tb.workers % self.racks:
            raise TestbedError(f"{tb.workers} workers do not fill {self.racks} racks evenly")
        self.per_rack = check_count("workers_per_rack", tb.workers // self.racks, MAX_PER_RACK)
        self.uplink_rate = parse_rate(uplink_rate) if uplink_rate is not None else tb.link.rate
        self.uplink = replace(tb.link, rate=self.uplink_rate)
        a, b, c, _ = tb.subnet.network_address.packed
        if c + 100 + self.racks > 255:
            last = f"{a}.{b}.{c + 100 + self.racks}.0"
            raise TestbedError(f"subnet {tb.subnet}: {self.racks} racks use {a}.{b}.{c}.0 .. {last}")
        self._abc = (a, b, c)

    # -------------------------------------------------------------------------- naming
    def hosts(self) -> list[str]:
        return (
            [f"w{i}" for i in range(self.tb.workers)] + [f"leaf{r}" for r in range(self.racks)] + ["spine"]
        )

    def endpoints(self) -> list[str]:
        return [f"w{i}" for i in range(self.tb.workers)]

    def aliases(self) -> dict[str, str]:
        return {"switch": "spine", "sw": "spine"}

    def rack_of(self, host: str) -> int:
        """The rack of a worker or leaf."""
        return int(host[1:]) // self.per_rack if host.startswith("w") else int(host[4:])

    def _net(self, third: int, last: int) -> str:
        a, b, c = self._abc
        return str(ipaddress.IPv4Address(bytes([a, b, c + third, last])))

    def address(self, host: str) -> str:
        if host == "spine":
            return self.spine_address(0)
        if host.startswith("leaf"):
            return self._net(self.rack_of(host), 1)
        return self._net(self.rack_of(host), 10 + int(host[1:]) % self.per_rack)

    def spine_address(self, rack: int) -> str:
        """The spine's address on rack `rack`'s uplink: what that rack's leaf gives as --uplink (the
        spine answers a leaf from the address of the link toward it)."""
        return self._net(100 + rack, 1)

    def leaf_uplink_address(self, rack: int) -> str:
        return self._net(100 + rack, 2)

    def interface(self, host: str) -> str:
        if host == "spine":
            return self.port("leaf0")
        return BRIDGE if host.startswith("leaf") else HOST_IF

    def port(self, host: str) -> str:
        return f"{PREFIX}p-{host}"  # a worker's in its leaf, a leaf's in the spine

    def uplink_interfaces(self, rack: int) -> tuple[tuple[str, str], tuple[str, str]]:
        """((leaf host, its device), (spine, its device)) of rack `rack`'s uplink: where a rack's
        traffic to and from the other racks is counted."""
        return (f"leaf{rack}", UPLINK_IF), ("spine", self.port(f"leaf{rack}"))

    # -------------------------------------------------------------------------- build
    def build(self) -> None:
        tb = self.tb
        tb._step("bridge")
        for r in range(self.racks):
            leaf = f"leaf{r}"
            tb._bridge(leaf, f"{self.address(leaf)}/24")
            self._forwarding(leaf)
        self._forwarding("spine")
        for w in self.endpoints():
            tb._step(f"link:{w}")
            leaf = f"leaf{self.rack_of(w)}"
            tb._veth(leaf, self.port(w), w, HOST_IF, tb.link)
            tb.ip(leaf, "link", "set", self.port(w), "master", BRIDGE)
            tb.ip(w, "addr", "add", f"{self.address(w)}/24", "dev", HOST_IF)
        for r in range(self.racks):
            tb._step(f"uplink:{r}")
            leaf = f"leaf{r}"
            tb._veth("spine", self.port(leaf), leaf, UPLINK_IF, self.uplink)
            tb.ip("spine", "addr", "add", f"{self.spine_address(r)}/24", "dev", self.port(leaf))
            tb.ip(leaf, "addr", "add", f"{self.leaf_uplink_address(r)}/24", "dev", UPLINK_IF)
            if not tb.link.offloads_on():  # results leave the leaf through its bridge: segment them
                tb.exec(leaf, ["ethtool", "-K", BRIDGE, "tx-udp-segmentation", "off"])
        self._shape()
        if tb.link.loss > 0:
            tb._step("loss")
            for r in range(self.racks):
                ports = [self.port(w) for w in self.endpoints() if self.rack_of(w) == r]
                tb._loss(f"leaf{r}", ports, tb.link.loss)
            tb._loss("spine", [self.port(f"leaf{r}") for r in range(self.racks)], tb.link.loss)
        tb._step("up")
        self._up_and_route()

    def _forwarding(self, host: str) -> None:
        cmd = "echo 1 > /proc/sys/net/ipv4/ip_forward; echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter"
        self.tb.exec(host, ["sh", "-c", cmd])

    def _shape(self) -> None:
        tb = self.tb
        for w in self.endpoints():
            if tb.link.rate is None:
                break
            tb._step(f"shape:{w}")
            tb._shape(w, HOST_IF, tb.link, max(tb.link.tbf_params()[1], HOST_QUEUE_BYTES))
            tb._shape(f"leaf{self.rack_of(w)}", self.port(w), tb.link)
        for r in range(self.racks):  # an uplink: switch port buffers at both ends
            if self.uplink.rate is None:
                break
            tb._shape(f"leaf{r}", UPLINK_IF, self.uplink)
            tb._shape("spine", self.port(f"leaf{r}"), self.uplink)

    def _up_and_route(self) -> None:
        tb = self.tb
        a, b, c = self._abc
        for r in range(self.racks):
            leaf = f"leaf{r}"
            tb.ip(leaf, "link", "set", BRIDGE, "up")
            tb.ip(leaf, "link", "set", UPLINK_IF, "up")
            tb.ip("spine", "link", "set", self.port(leaf), "up")
            # Everything beyond the rack and its uplink goes to the spine; the spine knows each rack.
            tb.ip(leaf, "route", "add", f"{a}.{b}.0.0/16", "via", self.spine_address(r))
            tb.ip("spine", "route", "add", f"{self._net(r, 0)}/24", "via", self.leaf_uplink_address(r))
        for w in self.endpoints():
            leaf = f"leaf{self.rack_of(w)}"
            tb.ip(leaf, "link", "set", self.port(w), "up")
            tb.ip(w, "link", "set", HOST_IF, "up")
            tb.ip(w, "route", "add", "default", "via", self.address(leaf))
        for r in range(self.racks):
            tb._wait_bridge(f"leaf{r}", self.per_rack)

    def state(self) -> dict:
        return {"kind": self.kind, "racks": self.racks, "uplink_rate": self.uplink_rate}

    def describe(self) -> dict:
        return {
            "racks": self.racks,
            "workers_per_rack": self.per_rack,
            "uplink_rate": fmt_rate(self.uplink_rate),
            "spine_addresses": [self.spine_address(r) for r in range(self.racks)],
        }


