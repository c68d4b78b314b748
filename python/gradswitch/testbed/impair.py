"""Packet duplication and reordering on the links of a testbed whose switch namespace has a bridge
(docs/testbed.md, "Duplication" and "Reordering"). Both act once the packets are single datagrams:
* toward the switch, on the ingress hook of the link's switch-side port. The sender's own egress hook
  would see a whole UDP_SEGMENT burst as one skb: the sender segments only after its qdisc.
* from the switch, on that port's egress hook, before its tbf: the bridge has segmented by then.
A packet leaves its path through a *detour*: a veth pair whose far end is a bridge port with learning
and flooding off, so what is sent into it enters the bridge again as if it came from the link, and the
bridge delivers or forwards it as it did the original. Random numbers come first in every rule, so a
packet that is left alone costs one comparison per rule."""

from __future__ import annotations

from .base import BRIDGE, PREFIX

DUP_TX, DUP_PORT = f"{PREFIX}dup-tx", f"{PREFIX}dup-port"
REORDER_TX, REORDER_PORT = f"{PREFIX}reo-tx", f"{PREFIX}reo-port"
# skb mark bits. Packets keep their mark on a detour inside the switch namespace; it is scrubbed when
# they cross into the receiver's, so a bit means "this passage through the egress hook was handled".
DUP_BIT = 0x1  # the egress copy re-enters the egress hook: without it, copies would be copied again
REORDER_BIT = 0x2  # a packet back from the reorder detour passes the egress hook a second time


def _detour(tb, host: str, tx: str, port: str) -> None:
    """veth tx <-> port in `host`, port on the bridge; learning off, as the packets sent into tx carry
    the hosts' source MACs, which must stay on the hosts' own ports."""
    mtu = str(tb.link.mtu)
    tb.ip(host, "link", "add", tx, "mtu", mtu, "type", "veth", "peer", "name", port, "mtu", mtu)
    for dev in (tx, port):  # single datagrams: nothing to coalesce or segment
        features = ["tso", "off", "gso", "off", "gro", "off", "tx-udp-segmentation", "off"]
        tb.exec(host, ["ethtool", "-K", dev, *features], check=False)
    tb.ip(host, "link", "set", port, "master", BRIDGE)
    quiet = ["learning", "off", "flood", "off", "mcast_flood", "off", "bcast_flood", "off"]
    tb.exec(host, ["bridge", "link", "set", "dev", port, *quiet])
    for dev in (tx, port):
        tb.ip(host, "link", "set", dev, "up")


def _table(tb, host: str, name: str, ports: list[str], up: str, down: str, up_prio: int, down_prio: int):
    """nft netdev table `name`: rule `up` on each port's ingress, `down` on its egress ({dev} = the port)."""
    chains = []
    for dev in ports:
        ident = dev.replace("-", "_")
        for tag, hook, prio, rule in (("up", "ingress", up_prio, up), ("down", "egress", down_prio, down)):
            chains.append(
                f'  chain {tag}_{ident} {{\n    type filter hook {hook} device "{dev}" priority {prio};\n'
                f"    meta protocol ip {rule.format(dev=dev)}\n  }}\n"
            )
    tb.exec(host, ["nft", "-f", "-"], input=f"table netdev {name} {{\n" + "".join(chains) + "}\n")


def _random(p: float) -> str:
    return f"numgen random mod 1000000 < {int(round(p * 1_000_000))}"


def duplicate(tb, host: str, ports: list[str], p: float) -> None:
    """With probability p a second copy of the packet arrives (table gs_dup, priority 10: after gs_loss,
    so a dropped packet is not copied). Toward the switch the copy takes the detour DUP_TX; from the
    switch it is sent out of the port itself (`dup to`), so it takes link time like a real duplicate."""
    if p <= 0:
        return
    _detour(tb, host, DUP_TX, DUP_PORT)
    first = f"meta mark & {DUP_BIT:#x} == 0 meta mark set meta mark | {DUP_BIT:#x}"
    _table(tb, host, "gs_dup", ports, f'{_random(p)} counter dup to "{DUP_TX}"',
           f'{_random(p)} {first} counter dup to "{{dev}}"', 10, 10)


def reorder(tb, host: str, ports: list[str], p: float) -> None:
    """With probability p the packet takes the detour REORDER_TX instead of its path (`fwd to`): it enters
    the CPU's receive backlog behind the packets already there, so it arrives after the rest of the
    burst its sender handed the kernel in one call (a UDP_SEGMENT send, a GSO packet). A sender that
    sends one datagram per call sees no reordering: this is not a delay (no netem here). Toward the
    switch the rule runs last (priority 20: after loss and dup); from the switch first (-10), so that
    the packet back from the detour meets loss and dup once, on its second passage."""
    if p <= 0:
        return
    _detour(tb, host, REORDER_TX, REORDER_PORT)
    # unicast only: the bridge would flood a broadcast back from the detour to every port
    unicast = "ether daddr & 01:00:00:00:00:00 == 00:00:00:00:00:00"
    first = f"meta mark & {REORDER_BIT:#x} == 0 meta mark set meta mark | {REORDER_BIT:#x}"
    _table(tb, host, "gs_reorder", ports, f'{_random(p)} counter fwd to "{REORDER_TX}"',
           f'{_random(p)} {unicast} {first} counter fwd to "{REORDER_TX}"', 20, -10)
