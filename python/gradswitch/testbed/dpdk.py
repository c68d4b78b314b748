"""The DPDK switch in place of the bridge (switch="dpdk", docs/testbed.md): the same star of links,
switched by gradswitchd --backend dpdk, which owns the switch-side veths (one DPDK port each) and a
net_tap port with the switch's address. Its options, command line, start, and the topology."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field

from ..daemon import Daemon, SwitchError
from .base import HOST_IF, TAP, TestbedError
from .bridge import BridgeTopology

AF_XDP_MAX_MTU = 3000  # net_af_xdp on veth takes frames up to ~3.5 KB (docs/dpdk.md)
CONTROL_PORT = 7700  # gradswitchd's default, where the testbed's clients find the switch (data: +1)


@dataclass
class DpdkOptions:
    """How `switch="dpdk"` runs `gradswitchd --backend dpdk` in the switch namespace (docs/testbed.md)."""

    vdev: str = "auto"  # af_xdp | af_packet | auto (af_xdp up to MTU 3000, else af_packet)
    lcores: str = "0"  # EAL -l
    threads: int = 1  # aggregation threads X (--threads)
    idle_sleep_us: int = 50  # --idle-sleep-us: sleep after idle polls (0 = busy-poll a core)
    memory_mb: int | None = None  # EAL -m; None = 256 (af_xdp) / 1024 (af_packet)
    daemon_args: list = field(default_factory=list)  # daemon options, before the first `--`
    eal_args: list = field(default_factory=list)  # extra EAL arguments
    dpdk_args: list = field(default_factory=list)  # extra DPDK options, after the second `--`
    binary: str | None = None  # gradswitchd; None = $GRADSWITCHD or the package's
    start_timeout: float = 20.0  # seconds for the daemon to switch (ping through it)

    def kind(self, mtu: int) -> str:
        if self.vdev == "auto":
            return "af_xdp" if mtu <= AF_XDP_MAX_MTU else "af_packet"
        return self.vdev

    def check(self, mtu: int) -> None:
        if self.vdev not in ("auto", "af_xdp", "af_packet"):
            raise TestbedError(f"dpdk vdev {self.vdev!r}: use auto, af_xdp or af_packet")
        if self.kind(mtu) == "af_xdp" and mtu > AF_XDP_MAX_MTU:
            raise TestbedError(
                f"mtu {mtu} with net_af_xdp: af_xdp on veth takes frames up to ~3.5 KB; "
                "use vdev af_packet (or auto) for jumbo frames"
            )
        if int(self.threads) < 1:
            raise TestbedError("dpdk threads must be >= 1")
        if not re.fullmatch(r"[0-9,\-@()]+", str(self.lcores)):
            raise TestbedError(f"dpdk lcores {self.lcores!r}: an EAL -l list such as 0 or 0,1 or 0-2")


class DpdkTopology(BridgeTopology):
    """The bridge topology's hosts and links; the daemon, not a bridge, joins them."""

    kind = "dpdk"

    def __init__(self, tb):
        super().__init__(tb)
        tb.dpdk.check(tb.link.mtu)

    def interface(self, host: str) -> str:
        return TAP if host == "switch" else HOST_IF

    def make_switch(self) -> None:
        self.tb._step("bridge")  # no bridge: the daemon's tap gets the address once it runs

    def attach_port(self, host: str) -> None:
        # af_xdp/af_packet hand the daemon the frame as the sender's kernel left it: with TX
        # checksum offload a veth leaves TCP/UDP checksums partial and the receiver drops them
        self.tb.exec(host, ["ethtool", "-K", HOST_IF, "tx", "off"])

    def after_links(self) -> None:
        pass

    def add_loss(self) -> None:
        """On the host-side ends (XDP and packet sockets take frames before the switch side's nft
        ingress hook, and af_xdp transmits past its egress hook: measured, docs/testbed.md)."""
        for h in self.endpoints():
            self.tb._loss(h, [HOST_IF], self.tb.link.loss, hooks=(("egress", "up"), ("ingress", "down")))

    def finish(self) -> None:
        self.tb._step("dpdk")
        start_daemon(self.tb)

    def describe(self) -> dict:
        tb = self.tb
        return {
            "dpdk": {
                **asdict(tb.dpdk),
                "vdev_used": tb.dpdk.kind(tb.link.mtu),
                "pid": tb._state.daemon_pid if tb._state else 0,
                "log": str(tb.daemon_log),
                "stats_file": str(tb.stats_file),
            }
        }


def daemon_command(tb) -> list[str]:
    """The gradswitchd --backend dpdk command line that switch="dpdk" runs in the switch namespace."""
    return dpdk_daemon(tb).command()


def dpdk_daemon(tb) -> Daemon:
    """switch="dpdk"'s gradswitchd --backend dpdk in the switch namespace (not started). Its control
    plane answers on the tap, in namespaces only the testbed's hosts reach (--insecure, from netns)."""
    o, lk = tb.dpdk, tb.link
    if o.binary:
        binary = o.binary
    else:
        from .._paths import switch_binary

        try:
            binary = switch_binary()
        except FileNotFoundError as e:
            raise TestbedError(str(e)) from e
    kind = o.kind(lk.mtu)
    vdevs = []
    for i, h in enumerate(tb.endpoints):
        if kind == "af_xdp":
            vdevs.append(f"--vdev=net_af_xdp{i},iface={tb.port(h)}")
        else:
            # qdisc_bypass=0: transmit through the port's qdisc, so its tbf shapes switch -> host;
            # frames of a jumbo MTU need 12 KiB ring frames (the block must be whole pages)
            ring = ",blocksz=12288,framesz=12288" if lk.mtu > 1500 else ""
            vdevs.append(
                f"--vdev=net_af_packet{i},iface={tb.port(h)},qpairs=1{ring},framecnt=4096,"
                "qdisc_bypass=0"
            )
    vdevs.append(f"--vdev=net_tap0,iface={TAP}")
    mem = o.memory_mb or (256 if kind == "af_xdp" else 1024)
    return Daemon(
        "--backend",
        "dpdk",
        *map(str, o.daemon_args),
        "--",
        "-l",
        str(o.lcores),
        "--no-huge",
        "--no-pci",
        "-m",
        str(mem),
        "--log-level=pmd.net.af_xdp:warning",
        *vdevs,
        *map(str, o.eal_args),
        "--",
        "--agg-ip",
        tb.address("switch"),
        "--agg-prefix",
        str(tb.subnet.prefixlen),
        "--idle-sleep-us",
        str(o.idle_sleep_us),
        "--stats-file",
        str(tb.stats_file),
        "--stats-interval-ms",
        "500",
        *map(str, o.dpdk_args),
        binary=str(binary),
        threads=o.threads,
        host="0.0.0.0",
        connect_host=tb.address("switch"),
        control_port=CONTROL_PORT,
        data_port=CONTROL_PORT + 1,
        mtu=None if "--mtu" in o.daemon_args else lk.mtu,
        netns=tb.netns("switch"),
        log_path=tb.daemon_log,
        new_session=True,  # it outlives `gradswitch testbed up`; down stops it (SIGTERM)
        ready="none",  # it switches once its stats file is there and every host pings through it
        start_timeout=o.start_timeout,
    )


def start_daemon(tb) -> None:
    d = dpdk_daemon(tb)
    sd = tb.switch_dir
    sd.mkdir(parents=True, exist_ok=True)
    tb._state.files.append(str(sd))
    tb._state.daemon_cmd = d.command()
    tb._save()
    d.start()
    tb._state.daemon_pid = d.pid
    tb._save()
    tb._daemon = d  # reaped by this process's down() (it stays our child until this process exits)
    deadline = time.monotonic() + tb.dpdk.start_timeout

    def fail(why: str) -> TestbedError:
        return TestbedError(
            f"gradswitchd --backend dpdk {why}; rolled back.\ncommand: {' '.join(d.command())}\n"
            f"log ({tb.daemon_log}):\n{d.log()[-3000:]}"
        )

    try:
        d.wait_until(tb.stats_file.exists, tb.dpdk.start_timeout, "start (write its stats file)")
    except SwitchError as e:
        raise fail(str(e).removeprefix("gradswitchd ")) from None
    # every switch-side veth must be a port (EAL skips a vdev that fails to probe and goes on)
    ports = set(re.findall(r"^port\d+\.iface=(\S+)$", tb.stats_file.read_text(), re.M))
    missing = [tb.port(h) for h in tb.endpoints if tb.port(h) not in ports]
    if missing:
        raise fail(f"did not open port(s) {', '.join(missing)}")
    # switching: every endpoint reaches the switch address (the tap) through the daemon; this
    # also teaches it every host's MAC
    for h in tb.endpoints:

        def reaches(h=h) -> bool:
            r = tb.exec(h, ["ping", "-c1", "-W1", tb.address("switch")], check=False, timeout=5)
            return r.returncode == 0

        try:
            d.wait_until(reaches, max(0.0, deadline - time.monotonic()), "switch", interval=0)
        except SwitchError:
            if d.poll() is not None:
                raise fail(f"exited with rc={d.poll()}") from None
            raise fail(f"up, but {h} cannot ping {tb.address('switch')} through it") from None
