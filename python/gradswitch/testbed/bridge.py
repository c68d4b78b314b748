"""The star topology (the default): every machine on one veth link into the switch namespace, whose
Linux bridge joins them and carries the switch's address (gradswitchd runs there). dpdk.py and
sharded.py vary it."""

from __future__ import annotations

from . import impair
from .base import BRIDGE, HOST_IF, HOST_QUEUE_BYTES, LinkOptions, TestbedError, Topology


class BridgeTopology(Topology):
    """Hosts w0..w{N-1}, host and switch; addresses: switch .1, host .2, worker i .10+i."""

    kind = "bridge"

    def hosts(self) -> list[str]:
        return [f"w{i}" for i in range(self.tb.workers)] + ["host", "switch"]

    def endpoints(self) -> list[str]:
        return [f"w{i}" for i in range(self.tb.workers)] + ["host"]

    def address(self, host: str) -> str:
        base = self.tb.subnet.network_address
        off = {"switch": 1, "host": 2}.get(host)
        if off is None:
            off = 10 + int(host[1:])
        return str(base + off)

    def interface(self, host: str) -> str:
        return BRIDGE if host == "switch" else HOST_IF

    def link_for(self, host: str) -> LinkOptions:
        """The options of host's link (every link alike here; sharded.py's switch hosts differ)."""
        return self.tb.link

    # -------------------------------------------------------------------------- build
    def build(self) -> None:
        tb = self.tb
        self.make_switch()
        for h in self.endpoints():  # links
            tb._step(f"link:{h}")
            lk = self.link_for(h)
            tb._veth("switch", self.port(h), h, HOST_IF, lk)
            self.attach_port(h)
            tb.ip(h, "addr", "add", f"{self.address(h)}/{tb.subnet.prefixlen}", "dev", HOST_IF)
        self.after_links()
        for h in self.endpoints():  # shaping: egress of both ends of every link
            lk = self.link_for(h)
            if lk.rate is None:
                continue
            tb._step(f"shape:{h}")
            # host side: a NIC queue, deep enough that senders see backpressure rather than local
            # drops (4 TCP flows out of `host` into a 5 ms queue lost 2000 packets and ~30% of the rate);
            # switch side: a switch port buffer of `queue` time at rate
            tb._shape(h, HOST_IF, lk, max(lk.tbf_params()[1], HOST_QUEUE_BYTES))
            tb._shape("switch", self.port(h), lk)
        if tb.link.loss > 0:
            tb._step("loss")
            self.add_loss()
        ports = [self.port(h) for h in self.endpoints()]
        if tb.link.dup > 0:
            tb._step("dup")
            impair.duplicate(tb, "switch", ports, tb.link.dup)
        if tb.link.reorder > 0:
            tb._step("reorder")
            impair.reorder(tb, "switch", ports, tb.link.reorder)
        tb._step("up")
        for h in self.endpoints():
            tb.ip("switch", "link", "set", self.port(h), "up")
            tb.ip(h, "link", "set", HOST_IF, "up")
        self.finish()

    # Steps that dpdk.py replaces.
    def make_switch(self) -> None:
        """The bridge with the switch's address."""
        self.tb._step("bridge")
        self.tb._bridge("switch", f"{self.address('switch')}/{self.tb.subnet.prefixlen}")

    def attach_port(self, host: str) -> None:
        self.tb.ip("switch", "link", "set", self.port(host), "master", BRIDGE)

    def after_links(self) -> None:
        if not self.tb.link.offloads_on():
            # the switch's own sends (results) leave through the bridge: segment them there too
            self.tb.exec("switch", ["ethtool", "-K", BRIDGE, "tx-udp-segmentation", "off"])

    def add_loss(self) -> None:
        """netdev ingress+egress hooks on the switch-side ports (silent to both endpoints)."""
        self.tb._loss("switch", [self.port(h) for h in self.endpoints()], self.tb.link.loss)

    def finish(self) -> None:
        self.tb.ip("switch", "link", "set", BRIDGE, "up")
        self.tb._wait_bridge("switch", len(self.endpoints()))


def check_count(what: str, n: int, most: int) -> int:
    """A count of machines of a topology, within what its addressing allows."""
    if not 1 <= int(n) <= most:
        raise TestbedError(f"{what} must be in 1..{most}, got {n}")
    return int(n)

