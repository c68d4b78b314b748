"""Measurement helpers of the benchmark suite (bench/suite.py): machine CPU, kernel counters of each
testbed namespace (TCP retransmissions, UDP buffer errors) and tc drops at the switch ports. (CPU per
GB is measured by the processes themselves, inside their timed calls: see suite_report.cpu_table.)"""

from __future__ import annotations

import re
import time


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


def busy_fraction(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Share of the machine's CPU time (all cores) that was busy between two machine_cpu() samples."""
    dt = b[1] - a[1]
    return (b[0] - a[0]) / dt if dt > 0 else float("nan")


def loadavg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def snmp(tb, host: str) -> dict[str, int]:
    """/proc/net/snmp of a testbed namespace, as {'Tcp.RetransSegs': n, 'Udp.RcvbufErrors': n, ...}."""
    r = tb.exec(host, ["cat", "/proc/net/snmp"], check=False)
    lines = r.stdout.splitlines()
    d: dict[str, int] = {}
    for a, b in zip(lines[::2], lines[1::2], strict=False):
        k = a.split(":")[0]
        for x, y in zip(a.split()[1:], b.split()[1:], strict=False):
            try:
                d[f"{k}.{x}"] = int(y)
            except ValueError:
                pass
    return d


_TC_RE = re.compile(
    r"qdisc \S+ \S+ dev (\S+) .*?\n\s*Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", re.S
)


def tc_drops(tb, host: str = "switch") -> dict[str, int]:
    """Packets dropped by each qdisc of a namespace (tbf queue overflow)."""
    r = tb.exec(host, ["tc", "-s", "qdisc", "show"], check=False)
    return {m.group(1): int(m.group(4)) for m in _TC_RE.finditer(r.stdout)}


def nft_loss_drops(tb) -> int:
    """Packets the testbed's random-loss rules dropped (nftables counters in the switch namespace)."""
    r = tb.exec("switch", ["nft", "list", "table", "netdev", "gs_loss"], check=False)
    return sum(int(x) for x in re.findall(r"counter packets (\d+)", r.stdout)) if r.returncode == 0 else 0


class Counters:
    """Kernel counters of the testbed before/after a run: TCP retransmitted segments and UDP receive
    buffer errors summed over the endpoint namespaces (and the switch), tbf drops at the switch ports
    and on the hosts' egress."""

    KEYS = ("Tcp.RetransSegs", "Tcp.OutSegs", "Udp.RcvbufErrors", "Udp.SndbufErrors", "Udp.InDatagrams")

    def __init__(self, tb, hosts: list[str]):
        self.tb = tb
        self.hosts = hosts

    def read(self) -> dict[str, int]:
        tot = {k: 0 for k in self.KEYS}
        for h in self.hosts + ["switch"]:
            s = snmp(self.tb, h)
            for k in self.KEYS:
                tot[k] += s.get(k, 0)
        tot["tbf_drops_switch"] = sum(tc_drops(self.tb, "switch").values())
        tot["tbf_drops_hosts"] = sum(sum(tc_drops(self.tb, h).values()) for h in self.hosts)
        tot["loss_drops"] = nft_loss_drops(self.tb) if self.tb.link.loss > 0 else 0
        return tot

    @staticmethod
    def delta(a: dict, b: dict) -> dict[str, int]:
        return {k: b.get(k, 0) - a.get(k, 0) for k in b}


def wait_quiet(max_wait: float = 0.0) -> None:
    """Give the machine a moment between runs (exited processes, TIME_WAIT sockets)."""
    if max_wait > 0:
        time.sleep(max_wait)
