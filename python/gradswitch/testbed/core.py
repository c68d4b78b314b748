"""Emulated cluster: network namespaces, veth links, tc shaping, nftables loss (and impair.py's
duplication and reordering), in one of several topologies (one strategy each):

* ``bridge`` (bridge.py, the default): N workers and a host, one veth each into a switch namespace
  whose Linux bridge joins them and carries the switch's address (gradswitchd runs there)::

      gs-tb-w0 ... gs-tb-w{N-1}, gs-tb-host     one namespace per machine, one interface ``gs-eth0``
           |  veth (gs-eth0 <-> gs-p-<host>)    per-link rate / loss / MTU
      gs-tb-switch                              ports gs-p-w0.. gs-p-host joined by bridge ``gs-br0``

* ``dpdk`` (dpdk.py): the same links, switched by gradswitchd --backend dpdk instead of the bridge.
* ``sharded`` (sharded.py): the bridge star plus S switch machines ``s0..s{S-1}``, each on its own
  link (rate ``switch_rate``): a job sharded over several switches.
* ``racks`` (racks.py): R racks of W workers; each rack's leaf machine ``leaf<r>`` bridges its
  workers and routes to a spine machine ``spine`` over a rate-limited uplink: two-level aggregation.

Every kernel object lives inside a namespace this module creates (veth pairs are created directly
in their namespaces, nothing is ever created in the caller's namespace), so deleting the namespaces
removes links, qdiscs, nftables tables and routes. The only other objects are the state file under
``/run/gradswitch-testbed/`` and the per-namespace ``/etc/netns/gs-<name>-<host>/hosts`` files
(``ip netns exec`` bind-mounts them over /etc/hosts so host names resolve), and with
switch="dpdk" the daemon process (pid in the state file) and its ``/run/gradswitch-testbed/<name>-switch/``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import _tools
from .base import (  # noqa: F401  (re-exported: the testbed's names, as before the split)
    BRIDGE,
    HOST_IF,
    HOST_QUEUE_BYTES,
    PREFIX,
    TAP,
    LinkOptions,
    TestbedError,
    Topology,
    fmt_rate,
    parse_rate,
    parse_time,
)
from .bridge import BridgeTopology
from .dpdk import DpdkOptions, DpdkTopology
from .dpdk import daemon_command as dpdk_daemon_command
from .racks import RacksTopology
from .sharded import ShardedTopology

STATE_DIR = Path(os.environ.get("GRADSWITCH_TESTBED_STATE", "/run/gradswitch-testbed"))
ETC_NETNS = Path("/etc/netns")
SWITCH_KINDS = ("bridge", "dpdk")
TOPOLOGIES = ("bridge", "dpdk", "sharded", "racks")
# Host names of every topology (namespaces gs-<name>-<host>): what `down` recognises as the testbed's.
HOST_PATTERN = r"w\d+|host|switch|s\d+|leaf\d+|spine"
LOSS_HOOKS = (("ingress", "up"), ("egress", "down"))  # nft hooks of a switch-side port, and their tags
# dup and reorder send packets around a detour into the switch's bridge (impair.py): these topologies have it
DETOUR_TOPOLOGIES = ("bridge", "sharded")
DEFAULT_SUBNET = "10.66.0.0/24"
# python/ directory that holds the gradswitch package (for PYTHONPATH of processes in namespaces)
PYTHON_ROOT = Path(__file__).absolute().parents[2]


# ----------------------------------------------------------------------------------------- helpers
REQUIRED_TOOLS = ("ip", "bridge", "tc", "nft")


def check_environment(need_ethtool: bool = False) -> None:
    """Raise TestbedError (with the fix) when not root or a tool is missing."""
    if os.geteuid() != 0:
        raise TestbedError(
            "the testbed needs root (it creates network namespaces, veth links, qdiscs and nftables "
            "tables): run as root, e.g. `sudo gradswitch testbed up`"
        )
    missing = _tools.missing([*REQUIRED_TOOLS, *(["ethtool"] if need_ethtool else [])])
    if missing:
        raise TestbedError(
            f"missing tools: {', '.join(missing)}; install the packages named "
            f"(scripts/install-deps.sh installs everything gradswitch needs)"
        )
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if r.returncode != 0:
        raise TestbedError(f"`ip netns list` failed ({r.stderr.strip()}): is iproute2 netns support there?")


def _run(cmd: list[str], *, input: str | None = None, check: bool = True, timeout: float = 30):
    r = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise TestbedError(f"command failed (rc={r.returncode}): {' '.join(cmd)}\n{r.stderr.strip()}")
    return r


def _netns_list() -> list[str]:
    r = _run(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def _valid_name(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9]{1,12}", name):
        raise TestbedError(f"testbed name {name!r}: use 1-12 characters of [a-z0-9]")
    return name


@dataclass
class State:
    name: str
    workers: int
    subnet: str
    link: dict
    namespaces: list[str] = field(default_factory=list)  # created so far, in order
    files: list[str] = field(default_factory=list)  # created so far
    complete: bool = False
    created: float = 0.0
    pid: int = 0
    switch: str = "bridge"  # bridge | dpdk: what joins the workers' links
    dpdk: dict | None = None  # DpdkOptions (switch == "dpdk")
    daemon_pid: int = 0  # gradswitchd --backend dpdk, in the switch namespace
    daemon_cmd: list = field(default_factory=list)
    topology: dict = field(default_factory=dict)  # Topology.state(): its kind and parameters


def make_topology(tb: Testbed, kind: str, params: dict) -> Topology:
    """The strategy object of topology `kind`."""
    if kind == "bridge":
        return BridgeTopology(tb)
    if kind == "dpdk":
        return DpdkTopology(tb)
    if kind == "sharded":
        return ShardedTopology(tb, **params)
    if kind == "racks":
        return RacksTopology(tb, **params)
    raise TestbedError(f"unknown topology {kind!r}: one of {', '.join(TOPOLOGIES)}")


class Testbed:
    """Machines in network namespaces joined by shaped veth links, in one of the topologies of this
    module's docstring. Use as a context manager or call up()/down().

    >>> with Testbed(workers=3, rate="1gbit") as tb:                      # bridge
    ...     tb.exec("w0", ["ping", "-c1", tb.address("w1")])
    >>> Testbed(workers=4, switches=2, switch_rate="300mbit")              # sharded
    >>> Testbed(racks=2, workers_per_rack=4, rate="300mbit", uplink_rate="300mbit")  # racks
    """

    def __init__(
        self,
        workers: int | None = None,
        rate="1gbit",
        delay="0ms",
        mtu: int = 1500,
        loss: float = 0.0,
        dup: float = 0.0,
        reorder: float = 0.0,
        name: str = "tb",
        subnet: str = DEFAULT_SUBNET,
        burst: int | None = None,
        queue="5ms",
        offload: bool | None = None,
        fail_at: str | None = None,
        switch: str = "bridge",
        dpdk=None,
        switches: int = 0,
        switch_rate=None,
        racks: int = 0,
        workers_per_rack: int = 0,
        uplink_rate=None,
    ):
        if racks:
            if racks < 1 or workers_per_rack < 1:
                raise TestbedError("racks and workers_per_rack must both be >= 1")
            if workers is not None and workers != racks * workers_per_rack:
                raise TestbedError(
                    f"workers={workers} but racks={racks} x workers_per_rack={workers_per_rack}: "
                    "give racks and workers_per_rack alone"
                )
            workers = racks * workers_per_rack
        workers = 2 if workers is None else workers
        if workers < 1:
            raise TestbedError("workers must be >= 1")
        if mtu not in (1500, 9000) and not (576 <= mtu <= 9000):
            raise TestbedError(f"mtu {mtu}: use 1500 or 9000 (anything in 576..9000 is accepted)")
        if not 0.0 <= float(loss) < 1.0:
            raise TestbedError(f"loss {loss}: a probability in [0, 1)")
        if not 0.0 <= float(dup) < 1.0:
            raise TestbedError(f"dup {dup}: a probability in [0, 1)")
        if not 0.0 <= float(reorder) < 1.0:
            raise TestbedError(f"reorder {reorder}: a probability in [0, 1)")
        self.name = _valid_name(name)
        self.workers = int(workers)
        self.subnet = ipaddress.ip_network(subnet)
        if self.subnet.num_addresses < 16 + self.workers:
            raise TestbedError(f"subnet {subnet} too small for {workers} workers")
        self.link = LinkOptions(
            rate=parse_rate(rate),
            delay=parse_time(delay),
            mtu=int(mtu),
            loss=float(loss),
            dup=float(dup),
            reorder=float(reorder),
            burst=burst,
            queue=parse_time(queue),
            offload=offload,
        )
        if self.link.delay > 0:
            raise TestbedError(
                f"delay={delay!r} is not supported on this kernel: it has no sch_netem, sch_fq or sch_etf "
                "(checked /proc/config.gz), so nothing can hold packets back; use delay='0ms'"
            )
        if switch not in SWITCH_KINDS:
            raise TestbedError(
                f"switch {switch!r}: use bridge (Linux bridge) or dpdk (gradswitchd --backend dpdk)"
            )
        if (switches or racks) and switch != "bridge":
            raise TestbedError("switches= and racks= build on Linux bridges: they take switch='bridge' only")
        if switches and racks:
            raise TestbedError("give switches= (a sharded job) or racks= (two levels), not both")
        self.switch = switch
        self.dpdk = DpdkOptions(**dpdk) if isinstance(dpdk, dict) else (dpdk or DpdkOptions())
        self.fail_at = fail_at or os.environ.get("GRADSWITCH_TESTBED_FAIL_AT") or None
        self._state: State | None = None
        if racks:
            kind, params = "racks", {"racks": racks, "uplink_rate": uplink_rate}
        elif switches:
            kind, params = "sharded", {"switches": switches, "switch_rate": switch_rate}
        else:
            kind, params = switch, {}
        for what, value in (("dup", self.link.dup), ("reorder", self.link.reorder)):
            if value > 0 and kind not in DETOUR_TOPOLOGIES:
                raise TestbedError(
                    f"{what} {value}: packet duplication and reordering are emulated on the "
                    f"{' and '.join(DETOUR_TOPOLOGIES)} topologies only, not {kind} (docs/testbed.md)"
                )
        self.topology = make_topology(self, kind, params)

    # ------------------------------------------------------------------------------- naming
    @property
    def hosts(self) -> list[str]:
        return self.topology.hosts()

    @property
    def endpoints(self) -> list[str]:
        """Hosts that have a link to their switch."""
        return self.topology.endpoints()

    def _canon(self, host: str) -> str:
        h = self.topology.aliases().get(host, host)
        if re.fullmatch(r"\d+", h):
            h = f"w{h}"
        if h not in self.hosts:
            raise TestbedError(f"unknown host {host!r}: one of {', '.join(self.hosts)}")
        return h

    def netns(self, host: str) -> str:
        return f"{PREFIX}{self.name}-{self._canon(host)}"

    def address(self, host: str) -> str:
        return self.topology.address(self._canon(host))

    def interface(self, host: str) -> str:
        """Name of the host's interface toward its switch (for the switch itself: the bridge, or
        the DPDK daemon's tap with switch="dpdk")."""
        return self.topology.interface(self._canon(host))

    def port(self, host: str) -> str:
        """Name of the switch-side port of host's link."""
        return self.topology.port(self._canon(host))

    @property
    def state_file(self) -> Path:
        return STATE_DIR / f"{self.name}.json"

    @property
    def switch_dir(self) -> Path:
        """switch="dpdk": the daemon's log and stats file (removed by down)."""
        return STATE_DIR / f"{self.name}-switch"

    @property
    def daemon_log(self) -> Path:
        return self.switch_dir / "gradswitchd.log"

    @property
    def stats_file(self) -> Path:
        return self.switch_dir / "stats.txt"

    # ------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> Testbed:
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def _save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self._state), indent=1))
        tmp.replace(self.state_file)

    def _step(self, what: str) -> None:
        if self.fail_at and self.fail_at == what:
            raise TestbedError(f"injected failure at step {what!r} (fail_at)")

    def up(self) -> Testbed:
        check_environment(need_ethtool=not self.link.offloads_on() or self.switch == "dpdk")
        existing = [n for n in _netns_list() if n.startswith(f"{PREFIX}{self.name}-")]
        if existing or self.state_file.exists():
            raise TestbedError(
                f"testbed {self.name!r} already exists ({', '.join(existing) or self.state_file}): "
                f"run `gradswitch testbed down --name {self.name}` or pick another name"
            )
        self._state = State(
            name=self.name,
            workers=self.workers,
            subnet=str(self.subnet),
            link=asdict(self.link),
            created=time.time(),
            pid=os.getpid(),
            switch=self.switch,
            dpdk=asdict(self.dpdk) if self.switch == "dpdk" else None,
            topology=self.topology.state(),
        )
        try:
            self._save()
            self._machines()
            self.topology.build()
            self._state.complete = True
            self._save()
        except BaseException as e:
            try:
                self.down()
            except Exception as e2:  # pragma: no cover - reported together with the original error
                raise TestbedError(f"{e}\n(and cleaning up failed too: {e2})") from e
            if isinstance(e, TestbedError):
                raise
            if isinstance(e, Exception):
                raise TestbedError(f"testbed up failed and was rolled back: {e}") from e
            raise
        return self

    # ------------------------------------------------------------------------------- building blocks
    def _ns_add(self, host: str) -> None:
        ns = self.netns(host)
        _run(["ip", "netns", "add", ns])
        self._state.namespaces.append(ns)
        self._save()

    def _machines(self) -> None:
        """Step 1 of every topology: namespaces, loopback, /etc/netns/<ns>/hosts, no IPv6."""
        hosts_txt = "127.0.0.1 localhost\n" + "".join(
            f"{self.address(h)} {h} {self.netns(h)}\n" for h in self.hosts
        )
        for h in self.hosts:
            self._step(f"netns:{h}")
            self._ns_add(h)
            d = ETC_NETNS / self.netns(h)
            d.mkdir(parents=True, exist_ok=True)
            self._state.files.append(str(d))
            self._save()
            (d / "hosts").write_text(hosts_txt)
            self.ip(h, "link", "set", "lo", "up")
        # no IPv6 (router/neighbour solicitations would only add noise to counters)
        for h in self.hosts:
            self.exec(
                h,
                [
                    "sh",
                    "-c",
                    "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; "
                    "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
                ],
                check=False,
            )

    def _bridge(self, host: str, address: str | None) -> None:
        """A Linux bridge BRIDGE in `host` (not up yet), with `address` ("a.b.c.d/len") if given."""
        self.ip(host, "link", "add", BRIDGE, "type", "bridge", "stp_state", "0", "forward_delay", "0",
                "mcast_snooping", "0")
        self.ip(host, "link", "set", BRIDGE, "mtu", str(self.link.mtu))
        if address:
            self.ip(host, "addr", "add", address, "dev", BRIDGE)
        # bridged IPv4 must not traverse iptables (br_netfilter) in the bridge's namespace: pure cost
        for key in ("bridge-nf-call-iptables", "bridge-nf-call-ip6tables", "bridge-nf-call-arptables"):
            p = f"/proc/sys/net/bridge/{key}"
            self.exec(host, ["sh", "-c", f"[ -w {p} ] && echo 0 > {p} || true"], check=False)

    def _veth(self, a: str, a_dev: str, b: str, b_dev: str, link: LinkOptions) -> None:
        """A veth pair between hosts a (dev a_dev) and b (dev b_dev), created in a's namespace with its
        peer straight into b's; offloads off on both ends when the link drops packets."""
        mtu = str(link.mtu)
        self.ip(a, "link", "add", a_dev, "mtu", mtu, "type", "veth", "peer", "name", b_dev,
                "netns", self.netns(b), "mtu", mtu)
        if not link.offloads_on():
            # tx-udp-segmentation too: a UDP_SEGMENT burst (gradswitch's GSO sends) would
            # otherwise cross the link as one skb and the loss rule would drop ~32 datagrams at once.
            for host, dev in ((b, b_dev), (a, a_dev)):
                features = ["tso", "off", "gso", "off", "gro", "off", "tx-udp-segmentation", "off"]
                self.exec(host, ["ethtool", "-K", dev, *features])

    def _shape(self, host: str, dev: str, link: LinkOptions, limit: int | None = None) -> None:
        """tbf on the egress of `dev` at the link's rate (limit: bytes queued; default the link's)."""
        if link.rate is None:
            return
        burst, lim = link.tbf_params()
        self.tc(host, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{link.rate}bit",
                "burst", str(burst), "limit", str(limit or lim))

    def _loss(self, host: str, devs: list[str], loss: float, hooks=LOSS_HOOKS) -> None:
        """nft netdev table gs_loss in `host`: drop IPv4 with probability `loss` on each device's hooks."""
        if loss <= 0:
            return
        thr = int(round(loss * 1_000_000))
        chains = []
        for dev in devs:
            ident = dev.replace("-", "_")
            for hook, tag in hooks:
                chains.append(
                    f'  chain {tag}_{ident} {{ type filter hook {hook} device "{dev}" priority 0; '
                    f"meta protocol ip numgen random mod 1000000 < {thr} counter drop; }}\n"
                )
        self.exec(host, ["nft", "-f", "-"], input="table netdev gs_loss {\n" + "".join(chains) + "}\n")

    def _wait_bridge(self, host: str, ports: int, timeout: float = 5.0) -> None:
        """Wait until the bridge in `host` forwards on all its `ports` (no STP: normally immediate)."""
        deadline = time.time() + timeout
        while True:
            r = self.exec(host, ["bridge", "link", "show"], check=False)
            states = re.findall(r"state (\w+)", r.stdout)
            if len(states) >= ports and all(s == "forwarding" for s in states):
                return
            if time.time() > deadline:
                raise TestbedError(f"bridge ports not forwarding after {timeout}s:\n{r.stdout}")
            time.sleep(0.05)

    def daemon_command(self) -> list[str]:
        """The gradswitchd --backend dpdk command line that switch="dpdk" runs in the switch namespace."""
        return dpdk_daemon_command(self)

    def counters(self, host: str, dev: str) -> dict[str, int]:
        """The interface's kernel counters (rx_bytes, tx_bytes, rx_packets, tx_packets, ...) in `host`:
        what crossed a link, e.g. a rack's uplink."""
        r = self.exec(host, ["ip", "-s", "-j", "link", "show", "dev", dev])
        stats = json.loads(r.stdout)[0]["stats64"]
        out = {}
        for direction in ("rx", "tx"):
            for k, v in stats[direction].items():
                out[f"{direction}_{k}"] = int(v)
        return out

    def down(self) -> None:
        """Remove everything this testbed created (works from another process via the state file)."""
        try:
            remove_testbed(self.name)
        finally:
            d = getattr(self, "_daemon", None)
            if d is not None:  # started by this process: reap it (remove_testbed stopped it)
                d.stop(timeout=5)
                self._daemon = None
        self._state = None

    # ------------------------------------------------------------------------------- use
    def _cmd(self, host: str, cmd) -> list[str]:
        ns = self.netns(host)
        if isinstance(cmd, str):
            cmd = ["sh", "-c", cmd]
        cmd = [str(c) for c in cmd]
        # `ip netns exec` turns a missing program into an exit code: name its package instead.
        if cmd and "/" not in cmd[0] and cmd[0] in _tools.programs():
            _tools.require(cmd[0])
        return ["ip", "netns", "exec", ns, *cmd]

    def env(self, extra: dict | None = None) -> dict:
        """Environment for processes in the namespaces: PYTHONPATH reaches this gradswitch package."""
        env = dict(os.environ)
        pp = [str(PYTHON_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(pp))
        if extra:
            env.update({k: str(v) for k, v in extra.items()})
        return env

    def exec(
        self,
        host: str,
        cmd,
        *,
        check: bool = True,
        timeout: float | None = 60,
        input: str | None = None,
        env: dict | None = None,
    ) -> subprocess.CompletedProcess:
        """Run cmd (list, or str for `sh -c`) in host's namespace; returns CompletedProcess (text)."""
        full = self._cmd(host, cmd)
        r = subprocess.run(
            full, capture_output=True, text=True, timeout=timeout, input=input, env=self.env(env)
        )
        if check and r.returncode != 0:
            raise TestbedError(
                f"on {host}: `{' '.join(full[4:])}` failed rc={r.returncode}\n{r.stderr.strip()}"
            )
        return r

    def popen(self, host: str, cmd, env: dict | None = None, **kw) -> subprocess.Popen:
        """Start cmd in host's namespace (subprocess.Popen keyword arguments pass through)."""
        return subprocess.Popen(self._cmd(host, cmd), env=self.env(env), **kw)

    def python(self, host: str, module: str, *args, **kw) -> subprocess.Popen:
        """Start `python -m module args` in host's namespace."""
        return self.popen(host, [sys.executable, "-m", module, *map(str, args)], **kw)

    def ip(self, host: str, *args: str):
        return _run(["ip", "-n", self.netns(host), *args])

    def tc(self, host: str, *args: str):
        return self.exec(host, ["tc", *args])

    # ------------------------------------------------------------------------------- inspection
    @classmethod
    def attach(cls, name: str = "tb") -> Testbed:
        """A Testbed object for an existing testbed (created by another process)."""
        st = load_state(name)
        if st is None:
            raise TestbedError(
                f"no testbed {name!r} (no {STATE_DIR / (name + '.json')}): run `gradswitch testbed up`"
            )
        tb = cls.__new__(cls)
        tb.name = st.name
        tb.workers = st.workers
        tb.subnet = ipaddress.ip_network(st.subnet)
        tb.link = LinkOptions(**st.link)
        tb.switch = st.switch
        tb.dpdk = DpdkOptions(**st.dpdk) if st.dpdk else DpdkOptions()
        tb.fail_at = None
        tb._state = st
        params = dict(st.topology or {"kind": st.switch})
        tb.topology = make_topology(tb, params.pop("kind"), params)
        return tb

    def describe(self) -> dict:
        return {
            "name": self.name,
            "workers": self.workers,
            "topology": self.topology.kind,
            "rate": fmt_rate(self.link.rate),
            "mtu": self.link.mtu,
            "loss": self.link.loss,
            "dup": self.link.dup,
            "reorder": self.link.reorder,
            "offload": self.link.offloads_on(),
            "tbf_burst_limit": list(self.link.tbf_params()) if self.link.rate else None,
            "switch": self.switch,
            **self.topology.describe(),
            "hosts": {
                h: {"netns": self.netns(h), "address": self.address(h), "if": self.interface(h)}
                for h in self.hosts
            },
        }


# ----------------------------------------------------------------------------------------- module level
def load_state(name: str) -> State | None:
    f = STATE_DIR / f"{name}.json"
    try:
        return State(**json.loads(f.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError) as e:
        raise TestbedError(f"state file {f} is unreadable ({e}); remove it after `testbed down`") from e


def list_testbeds() -> list[str]:
    names = set()
    if STATE_DIR.is_dir():
        names |= {p.stem for p in STATE_DIR.glob("*.json")}
    for ns in _netns_list():
        m = re.fullmatch(rf"{PREFIX}([a-z0-9]{{1,12}})-({HOST_PATTERN})", ns)
        if m:
            names.add(m.group(1))
    return sorted(names)


def _ns_pids(ns: str) -> list[int]:
    r = _run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def remove_testbed(name: str) -> list[str]:
    """Kill processes left in the testbed's namespaces, delete the namespaces (and with them every
    link, qdisc and nft table) and the /etc/netns files and state file. Returns what was removed."""
    _valid_name(name)
    st = load_state(name)
    pat = re.compile(rf"{PREFIX}{name}-({HOST_PATTERN})")
    nss = [n for n in _netns_list() if pat.fullmatch(n)]
    if st:
        nss = list(dict.fromkeys([n for n in st.namespaces if n in nss] + nss))
    removed = []
    # the DPDK switch first, alone, with time for a clean stop (it detaches its XDP programs)
    sw_ns = f"{PREFIX}{name}-switch"
    if st and st.daemon_pid and sw_ns in nss and st.daemon_pid in _ns_pids(sw_ns):
        try:
            os.kill(st.daemon_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.time() + 10.0
        while time.time() < deadline and st.daemon_pid in _ns_pids(sw_ns):
            time.sleep(0.05)
    # processes first: a namespace with live processes keeps its interfaces alive after `ip netns del`
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [p for ns in nss for p in _ns_pids(ns) if p != os.getpid()]
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 2.0
        while time.time() < deadline and any(_ns_pids(ns) for ns in nss):
            time.sleep(0.05)
    errors = []
    for ns in nss:
        r = _run(["ip", "netns", "del", ns], check=False)
        if r.returncode != 0:
            errors.append(f"ip netns del {ns}: {r.stderr.strip()}")
        else:
            removed.append(ns)
    dirs = {str(ETC_NETNS / f"{PREFIX}{name}-{h}") for h in ("host", "switch")}
    dirs.add(str(STATE_DIR / f"{name}-switch"))
    if ETC_NETNS.is_dir():
        dirs |= {str(p) for p in ETC_NETNS.iterdir() if pat.fullmatch(p.name)}
    if st:
        dirs |= set(st.files)
    for d in sorted(dirs):
        if Path(d).exists():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    try:
        if ETC_NETNS.is_dir() and not any(ETC_NETNS.iterdir()):
            ETC_NETNS.rmdir()
    except OSError:
        pass
    f = STATE_DIR / f"{name}.json"
    if f.exists():
        f.unlink()
        removed.append(str(f))
    if errors:
        raise TestbedError("testbed down left things behind:\n" + "\n".join(errors))
    return removed


def leftovers(name: str) -> list[str]:
    """Everything of testbed `name` that still exists (empty after a clean down)."""
    out = [n for n in _netns_list() if n.startswith(f"{PREFIX}{name}-")]
    if ETC_NETNS.is_dir():
        out += [str(p) for p in ETC_NETNS.iterdir() if p.name.startswith(f"{PREFIX}{name}-")]
    for p in (STATE_DIR / f"{name}.json", STATE_DIR / f"{name}-switch"):
        if p.exists():
            out.append(str(p))
    r = _run(["ip", "-o", "link", "show"], check=False)
    out += [ln for ln in r.stdout.splitlines() if re.search(rf": {PREFIX}(eth0|p-|br0|tap0|up0)", ln)]
    return out
