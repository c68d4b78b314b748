"""A job sharded over several switches: the bridge star plus S switch machines s0..s{S-1}, each on a
link of its own (rate `switch_rate`, default the workers' rate), each running a gradswitchd. With the
switch links as the bottleneck (S = 1 serving N workers moves N·M each way through one link), the
aggregate capacity grows with S (docs/scaling.md)."""

from __future__ import annotations

from dataclasses import replace

from .base import LinkOptions, fmt_rate, parse_rate
from .bridge import BridgeTopology, check_count

MAX_SWITCHES = 50  # addresses .200 .. .249


class ShardedTopology(BridgeTopology):
    """Hosts w*, host, switch (the bridge) and s0..s{S-1} at .200+i."""

    kind = "sharded"

    def __init__(self, tb, switches: int, switch_rate=None):
        super().__init__(tb)
        self.switches = check_count("switches", switches, MAX_SWITCHES)
        self.switch_rate = parse_rate(switch_rate) if switch_rate is not None else tb.link.rate
        self.switch_link = replace(tb.link, rate=self.switch_rate)

    def hosts(self) -> list[str]:
        return super().hosts() + self.switch_hosts()

    def endpoints(self) -> list[str]:
        return super().endpoints() + self.switch_hosts()

    def switch_hosts(self) -> list[str]:
        return [f"s{i}" for i in range(self.switches)]

    def address(self, host: str) -> str:
        if host.startswith("s") and host[1:].isdigit():
            return str(self.tb.subnet.network_address + 200 + int(host[1:]))
        return super().address(host)

    def link_for(self, host: str) -> LinkOptions:
        return self.switch_link if host in self.switch_hosts() else self.tb.link

    def state(self) -> dict:
        return {"kind": self.kind, "switches": self.switches, "switch_rate": self.switch_rate}

    def describe(self) -> dict:
        return {"switches": self.switch_hosts(), "switch_rate": fmt_rate(self.switch_rate)}
