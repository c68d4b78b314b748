"""What every topology of the testbed shares (core.py builds the testbed, one module per topology
joins its machines): the names of its interfaces, its error, rate and time parsing, a link's
options, and the Topology base class. It imports nothing of the testbed's, so that core.py and the
topology modules can both import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .core import Testbed

PREFIX = "gs-"
HOST_IF = "gs-eth0"
BRIDGE = "gs-br0"
TAP = "gs-tap0"  # --switch dpdk: the daemon's net_tap port, carrying the switch address
HOST_QUEUE_BYTES = 8 << 20  # tbf limit on the hosts' egress (the switch ports use LinkOptions.queue)


class TestbedError(RuntimeError):
    """Anything that went wrong creating, using or removing a testbed; the message says what to check."""


# ----------------------------------------------------------------------------------------- parsing
_RATE_UNITS = {
    "bit": 1,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 8,
    "kbps": 8e3,
    "mbps": 8e6,
    "gbps": 8e9,
    "k": 1e3,
    "m": 1e6,
    "g": 1e9,
    "": 1,
}


def parse_rate(rate) -> int | None:
    """'1gbit', '500mbit', '100M', 1e9 -> bits per second; None/'none'/0 -> None (unshaped)."""
    if rate is None:
        return None
    if isinstance(rate, (int, float)):
        return int(rate) if rate > 0 else None
    s = str(rate).strip().lower()
    if s in ("", "none", "0", "off", "unlimited"):
        return None
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", s)
    if not m or m.group(2) not in _RATE_UNITS:
        raise TestbedError(f"cannot parse rate {rate!r}: use e.g. '100mbit', '1gbit', '2.5gbit' or 'none'")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2)])


def parse_time(t) -> float:
    """'0ms', '2ms', '150us', '1s', 0.002 -> seconds."""
    if isinstance(t, (int, float)):
        return float(t)
    s = str(t).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(s|ms|us|ns|)", s)
    if not m:
        raise TestbedError(f"cannot parse time {t!r}: use e.g. '0ms', '2ms', '100us'")
    scale = {"s": 1, "": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[m.group(2)]
    return float(m.group(1)) * scale


def fmt_rate(bps: int | None) -> str:
    if bps is None:
        return "none"
    for unit, div in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bps >= div and bps % div == 0:
            return f"{bps // int(div)}{unit}"
    return f"{bps}bit"


@dataclass
class LinkOptions:
    rate: int | None = 1_000_000_000  # bit/s, None = unshaped
    delay: float = 0.0  # seconds, one way, per link
    mtu: int = 1500
    loss: float = 0.0  # drop probability per packet, per direction, per link
    dup: float = 0.0  # probability per packet, per direction, per link, that a second copy arrives
    reorder: float = 0.0  # probability per packet, per direction, per link, that it goes behind its burst
    burst: int | None = None  # tbf bucket in bytes; None = auto
    queue: float = 0.005  # tbf queue length expressed as time at `rate` (seconds)
    offload: bool | None = None  # TSO/GSO/GRO on the links; None = on unless loss, dup or reorder > 0

    def tbf_params(self) -> tuple[int, int]:
        """(burst, limit) in bytes for tbf at this rate."""
        assert self.rate is not None
        bps = self.rate / 8
        frame = self.mtu + 14
        if self.burst is not None:
            burst = max(int(self.burst), frame)
        else:
            # enough for ~1 ms at rate (timer slack on a busy 2-core box), never below 2 frames, and
            # when offloads are on a whole GSO packet: tbf counts a 64 KiB GSO skb as ~68 KB (headers
            # of every segment) and software-segments anything larger than the bucket, which made a
            # 500 Mbit/s link CPU-bound with a 67 KB bucket (measured); 96 KiB leaves room
            burst = max(int(bps * 1e-3), 2 * frame)
            if self.offloads_on():
                burst = max(burst, 98304)
        limit = max(int(bps * self.queue), 4 * burst, 64 * frame)
        return burst, limit

    def offloads_on(self) -> bool:
        # loss, dup and reorder act on one skb: with offloads on, a whole GSO burst of ~40 datagrams
        if self.offload is None:
            return self.loss <= 0 and self.dup <= 0 and self.reorder <= 0
        return bool(self.offload)


class Topology:
    """How a testbed's machines are joined: its hosts, their addresses and interfaces, and how to
    build the links. One subclass per topology (bridge.py, dpdk.py, sharded.py, racks.py); the
    Testbed does everything else (namespaces, state, exec, down) the same way for all of them."""

    kind = ""

    def __init__(self, tb: Testbed):
        self.tb = tb

    def hosts(self) -> list[str]:
        """Every machine (namespace), in creation order."""
        raise NotImplementedError

    def endpoints(self) -> list[str]:
        """The machines with a link into the switch namespace (or, in racks, into their leaf)."""
        raise NotImplementedError

    def aliases(self) -> dict[str, str]:
        """Other names a host may be called by (e.g. "sw" for "switch")."""
        return {"sw": "switch", "h": "host"}

    def address(self, host: str) -> str:
        raise NotImplementedError

    def interface(self, host: str) -> str:
        """The host's interface toward its switch."""
        return HOST_IF

    def port(self, host: str) -> str:
        """Name of the switch-side port of host's link."""
        return f"{PREFIX}p-{host}"

    def build(self) -> None:
        raise NotImplementedError

    def state(self) -> dict:
        """What attach() needs to rebuild this object (kind and parameters)."""
        return {"kind": self.kind}

    def describe(self) -> dict:
        return {}
