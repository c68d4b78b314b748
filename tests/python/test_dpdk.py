"""The DPDK backend as an L2 switch (issue 4): network namespaces, veths, gradswitchd --backend dpdk.

Each test builds its own namespaces (prefix `gsd<tag>`): one switch namespace whose veth ends are DPDK
af_xdp ports plus a net_tap port carrying the aggregation address (the TCP control plane answers
there), and one namespace per host. Tests skip with the reason when root, netns, DPDK or af_xdp are
missing, unless GRADSWITCH_REQUIRE_DPDK=1 (then they fail). Everything is removed even on failure.

This file is also the helper that runs inside the host namespaces:
    python3 test_dpdk.py worker|send|sniff|listen ...   (see _main at the bottom)
The worker speaks wire.h directly over UDP after a TCP JOIN (docs/protocol.md §1), so the data path
is tested independently of the Python worker API.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from gradswitch import _tools

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
PY = sys.executable

GS_MAGIC, GS_VERSION = 0x4753, 2
DATA, RESULT, ABORT = 1, 2, 3
WIRES = {"int32": 1, "float32": 2, "fixed32": 3, "float16": 4, "bfloat16": 5}
HDR = struct.Struct(">HBBIIHHBBHIIbbH")  # wire.h gs_header, 32 bytes
ETH_P_ALL = 0x0003
TEST_ETHERTYPE = 0x88B5  # IEEE local experimental: the kernel ignores it


def _notify_definition() -> tuple[struct.Struct, list[str], dict[str, int]]:
    """The completion signal as include/gradswitch/notify.h defines it: its fields (struct gs_notify,
    big-endian) and constants, read from the header itself so the test follows the one definition."""
    text = (REPO / "include/gradswitch/notify.h").read_text()
    body = re.search(r"struct gs_notify \{(.*?)\};", text, re.S).group(1)
    codes = {"uint8_t": "B", "uint16_t": "H", "uint32_t": "I", "uint64_t": "Q"}
    fields = re.findall(r"(uint\d+_t)\s+(\w+);", body)
    layout = struct.Struct(">" + "".join(codes[t] for t, _ in fields))
    consts = {k: int(v, 0) for k, v in re.findall(r"#define (GS_NOTIFY_\w+) (0x[0-9A-Fa-f]+|\d+)u", text)}
    consts.update({k: int(v) for k, v in re.findall(r"(GS_NOTIFY_\w+) = (\d+)", text)})
    assert layout.size == consts["GS_NOTIFY_BYTES"], (layout.format, consts)
    return layout, [n for _, n in fields], consts


NOTIFY_LAYOUT, NOTIFY_FIELDS, NOTIFY = _notify_definition()


def decode_notify(datagram: bytes) -> dict[str, int]:
    assert len(datagram) == NOTIFY_LAYOUT.size, datagram.hex()
    return dict(zip(NOTIFY_FIELDS, NOTIFY_LAYOUT.unpack(datagram), strict=True))


# --------------------------------------------------------------------------------------------
# Helpers that run inside a host namespace


def _values(n: int, rank: int, seq: int):
    import numpy as np

    i = np.arange(n, dtype=np.int64)
    return ((i * 7 + rank * 13 + seq * 5) % 61 - 30).astype(np.int64)


def _encode(vals, wire: str) -> bytes:

    if wire in ("int32", "fixed32"):
        return vals.astype("<i4").tobytes()
    if wire == "float32":
        return vals.astype("<f4").tobytes()
    if wire == "float16":
        return vals.astype("<f2").tobytes()
    f = vals.astype("<f4").view("<u4")
    return (f >> 16).astype("<u2").tobytes()


def _decode(buf: bytes, wire: str):
    import numpy as np

    if wire in ("int32", "fixed32"):
        return np.frombuffer(buf, "<i4").astype(np.int64)
    if wire == "float32":
        return np.frombuffer(buf, "<f4").astype(np.float64)
    if wire == "float16":
        return np.frombuffer(buf, "<f2").astype(np.float64)
    u = np.frombuffer(buf, "<u2").astype(np.uint32) << 16
    return u.astype("<u4").view("<f4").astype(np.float64)


def worker(
    agg: str,
    control_port: int,
    job: str,
    world: int,
    rank: int,
    wire: str,
    n: int,
    seqs: int,
    timeout: float = 40.0,
) -> dict:
    """JOIN, then `seqs` allreduces of n elements; returns a summary (exactness checked here)."""
    import numpy as np

    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", 0))
    u.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    port = u.getsockname()[1]
    c = socket.create_connection((agg, control_port), timeout=timeout)
    c.sendall(f"JOIN job={job} world={world} rank={rank} wire={wire} token=t1 port={port}\n".encode())
    f = c.makefile("r")
    line = f.readline().strip()
    if not line.startswith("OK"):
        return {"ok": False, "error": "join: " + line}
    kv = dict(x.split("=", 1) for x in line.split()[1:])
    job_id, key, slots = int(kv["job_id"]), int(kv["key"]), int(kv["slots"])
    payload, data_port, threads = int(kv["payload"]), int(kv["data_port"]), int(kv["threads"])
    esize = 2 if wire in ("float16", "bfloat16") else 4
    epp = payload // esize
    nchunks = (n + epp - 1) // epp
    window = min(slots, 64)
    scale = 0 if wire == "fixed32" else -128
    u.settimeout(0.02)
    retx = 0
    t0 = time.time()
    for seq in range(seqs):
        data = _values(n, rank, seq)
        enc = _encode(data, wire)
        out = np.zeros(n, dtype=np.float64)
        done = [False] * nchunks
        remaining = nchunks
        nxt = 0
        inflight: set[int] = set()

        def send(i: int, again: bool) -> None:
            off = i * epp
            cnt = min(epp, n - off)
            slot = i % slots
            flags = ((i // slots) & 1) | (2 if again else 0)
            h = HDR.pack(
                GS_MAGIC,
                GS_VERSION,
                DATA,
                job_id,
                key,
                rank,
                slot,
                flags,
                WIRES[wire],
                cnt,
                seq,  # noqa: B023 (called within the iteration)
                off,
                scale,
                scale,
                0,
            )
            u.sendto(h + enc[off * esize : (off + cnt) * esize], (agg, data_port + slot % threads))  # noqa: B023

        while nxt < nchunks and len(inflight) < window:
            send(nxt, False)
            inflight.add(nxt)
            nxt += 1
        while remaining:
            if time.time() - t0 > timeout:
                return {
                    "ok": False,
                    "error": f"timeout at seq {seq}, {remaining} chunks missing",
                    "retx": retx,
                }
            try:
                buf = u.recv(65536)
            except TimeoutError:
                for i in sorted(inflight):
                    send(i, True)
                    retx += 1
                continue
            if len(buf) < 32:
                continue
            h = HDR.unpack_from(buf)
            if h[2] == ABORT:
                return {"ok": False, "error": f"aborted reason={h[12]}"}
            if h[2] != RESULT or h[3] != job_id or h[10] != seq:
                continue
            i = h[11] // epp
            if i >= nchunks or done[i]:
                continue
            cnt = h[9]
            out[h[11] : h[11] + cnt] = _decode(buf[32 : 32 + cnt * esize], wire)
            done[i] = True
            remaining -= 1
            inflight.discard(i)
            while nxt < nchunks and len(inflight) < window and (nxt < slots or done[nxt - slots]):
                send(nxt, False)
                inflight.add(nxt)
                nxt += 1
        expect = sum(_values(n, r, seq) for r in range(world)).astype(np.float64)
        if not np.array_equal(out, expect):
            bad = int(np.argmax(out != expect))
            return {"ok": False, "error": f"seq {seq}: element {bad} is {out[bad]}, expected {expect[bad]}"}
    c.sendall(b"LEAVE\n")
    f.readline()
    return {"ok": True, "retx": retx, "seconds": time.time() - t0, "job_id": job_id}


def raw_send(iface: str, frames_hex: list[str], count: int = 1) -> None:
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((iface, 0))
    frames = [bytes.fromhex(f) for f in frames_hex]
    for _ in range(count):
        for fr in frames:
            try:
                s.send(fr)
            except OSError:  # the kernel refuses frames shorter than an Ethernet header
                pass
        time.sleep(0.002)  # paced: the point is the counters, not overrunning the af_xdp ring
    s.close()


def sniff(iface: str, seconds: float, marker: str) -> list[str]:
    """Frames of TEST_ETHERTYPE whose payload starts with `marker`, as hex of the first 32 bytes."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    s.bind((iface, 0))
    s.settimeout(0.05)
    got = []
    end = time.time() + seconds
    m = marker.encode()
    while time.time() < end:
        try:
            fr, addr = s.recvfrom(65536)
        except TimeoutError:
            continue
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        if (
            len(fr) >= 14
            and struct.unpack("!H", fr[12:14])[0] == TEST_ETHERTYPE
            and fr[14 : 14 + len(m)] == m
        ):
            got.append(fr[:32].hex())
    return got


def listen_udp(port: int, seconds: float) -> list[str]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    s.settimeout(0.05)
    got = []
    end = time.time() + seconds
    while time.time() < end:
        try:
            got.append(s.recv(2048).hex())
        except TimeoutError:
            pass
    return got


# --------------------------------------------------------------------------------------------
# Topology and switch (test process side)


def _run(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True, **kw)


def find_switch_binary() -> Path | None:
    """$GRADSWITCHD, else the installed package's daemon."""
    from gradswitch._paths import switch_binary

    try:
        return Path(switch_binary())
    except FileNotFoundError:
        return None


def dpdk_unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, af_xdp)"
    missing = _tools.missing(["ip", "ethtool", "ping"])
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/install-deps.sh installs them)"
    b = find_switch_binary()
    if b is None:
        return "gradswitchd not found: install the package (pip install .) or set GRADSWITCHD"
    h = _run(str(b), "--backend", "dpdk", "--help", check=False)
    if "built without DPDK" in h.stdout + h.stderr or "--agg-ip" not in h.stdout:
        return f"{b} was built without DPDK (install libdpdk-dev pkg-config and rebuild)"
    r = _run("ip", "netns", "add", "gsdprobe", check=False)
    if r.returncode != 0:
        return "cannot create network namespaces: " + r.stderr.strip()
    _run("ip", "netns", "del", "gsdprobe", check=False)
    return None


def require_dpdk():
    import pytest

    why = dpdk_unavailable_reason()
    if why:
        if os.environ.get("GRADSWITCH_REQUIRE_DPDK") == "1":
            pytest.fail(f"{why} (GRADSWITCH_REQUIRE_DPDK=1 forbids skipping)")
        pytest.skip(why)


class Topology:
    """A switch namespace and `hosts` host namespaces, each host linked to the switch by a veth."""

    def __init__(self, hosts: int, subnet: int | None = None) -> None:
        self.tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"[-5:]
        self.subnet = subnet if subnet is not None else 100 + random.randrange(100)
        self.hosts = hosts
        self.sw_ns = f"gsd{self.tag}sw"
        self.host_ns = [f"gsd{self.tag}h{i}" for i in range(hosts)]
        self.sw_if = [f"gsd{self.tag}s{i}" for i in range(hosts)]
        self.host_if = [f"gsd{self.tag}e{i}" for i in range(hosts)]
        self.tap = f"gsd{self.tag}cp"
        self.agg_ip = f"10.{self.subnet}.0.100"
        self.created: list[str] = []

    def ip_of(self, i: int) -> str:
        return f"10.{self.subnet}.0.{i + 1}"

    def up(self) -> None:
        _run("ip", "netns", "add", self.sw_ns)
        self.created.append(self.sw_ns)
        _run("ip", "-n", self.sw_ns, "link", "set", "lo", "up")
        for i in range(self.hosts):
            ns = self.host_ns[i]
            _run("ip", "netns", "add", ns)
            self.created.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "add", self.sw_if[i], "type", "veth", "peer", "name", self.host_if[i])
            _run("ip", "link", "set", self.sw_if[i], "netns", self.sw_ns)
            _run("ip", "link", "set", self.host_if[i], "netns", ns)
            _run("ip", "-n", self.sw_ns, "link", "set", self.sw_if[i], "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.ip_of(i)}/24", "dev", self.host_if[i])
            _run("ip", "-n", ns, "link", "set", self.host_if[i], "up")
            # af_xdp hands the switch the frame as the sender's kernel left it: with checksum
            # offload on, TCP/UDP checksums would be left partial. Real NICs do not need this.
            _run("ip", "netns", "exec", ns, _tools.require("ethtool"), "-K", self.host_if[i], "tx", "off")

    def down(self) -> None:
        for ns in reversed(self.created):
            _run("ip", "netns", "del", ns, check=False)
        self.created.clear()

    def exec(self, i: int, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Runs cmd in host i's namespace; the exit code is the caller's to judge (a program that is
        not installed is an error here, not an exit code)."""
        prog = _tools.require(cmd[0]) if cmd[0] in _tools.programs() else cmd[0]
        return _run("ip", "netns", "exec", self.host_ns[i], prog, *cmd[1:], check=False, timeout=timeout)

    def popen_helper(self, i: int, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            ["ip", "netns", "exec", self.host_ns[i], PY, str(HERE), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def mac_of(self, i: int) -> str:
        r = _run("ip", "-n", self.host_ns[i], "-j", "link", "show", self.host_if[i])
        return json.loads(r.stdout)[0]["address"]


class DpdkSwitch:
    """gradswitchd --backend dpdk in the topology's switch namespace, a gradswitch.daemon.Daemon."""

    def __init__(
        self,
        topo: Topology,
        tmp: Path,
        threads: int = 1,
        extra: list[str] | None = None,
        dpdk_opts: list[str] | None = None,
        lcores: str = "0",
        vdev: str = "af_xdp",
        af_packet_args: str = "framecnt=4096",
    ) -> None:
        from gradswitch.daemon import Daemon

        self.topo, self.tmp = topo, tmp
        self.stats_path = tmp / f"dpdk-stats-{topo.tag}.txt"
        vdevs = []
        for i, ifname in enumerate(topo.sw_if):
            if vdev == "af_xdp":
                vdevs.append(f"--vdev=net_af_xdp{i},iface={ifname}")
            else:
                vdevs.append(f"--vdev=net_af_packet{i},iface={ifname},qpairs=1,{af_packet_args}")
        vdevs.append(f"--vdev=net_tap0,iface={topo.tap}")
        # JOINs come through the tap, from the test's own namespaces (docs/security.md; the netns
        # adds --insecure)
        self.daemon = Daemon(
            "--backend",
            "dpdk",
            *(extra or []),
            "--",
            "-l",
            lcores,
            "--no-huge",
            "--no-pci",
            "--log-level=pmd.net.af_xdp:warning",
            *vdevs,
            "--",
            "--agg-ip",
            topo.agg_ip,
            "--idle-sleep-us",
            "50",
            "--stats-file",
            str(self.stats_path),
            "--stats-interval-ms",
            "200",
            *(dpdk_opts or []),
            binary=str(find_switch_binary()),
            threads=threads,
            host="0.0.0.0",
            connect_host=topo.agg_ip,
            control_port=7700,
            data_port=7701,
            netns=topo.sw_ns,
            log_path=tmp / f"gradswitchd-dpdk-{topo.tag}.log",
            ready="none",  # it is up once it writes its stats file, and switching once the tap answers
        )
        self.cmd = ["ip", "netns", "exec", topo.sw_ns, *self.daemon.command()]

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.daemon.proc

    def start(self) -> None:
        self.daemon.start()
        try:
            self.daemon.wait_until(self.stats_path.exists, 20, "write its stats file")
        except Exception as e:
            raise RuntimeError(f"gradswitchd --backend dpdk did not start: {e}\n{self.log_text()}") from None
        # The control plane answers through the switch once the tap has its address.
        for _ in range(50):
            if self.topo.exec(0, "ping", "-c", "1", "-W", "1", self.topo.agg_ip).returncode == 0:
                return
        raise RuntimeError("aggregation address not reachable through the switch:\n" + self.log_text())

    def stop(self) -> int | None:
        return self.daemon.stop(timeout=15)

    def log_text(self) -> str:
        return self.daemon.log()[-6000:]

    def control_stats(self) -> dict[str, str]:
        """The control plane's STATS reply (engine totals and the backend's counters), asked from host 0
        through the switch."""
        r = self.topo.exec(0, PY, str(HERE), "stats", self.topo.agg_ip, "7700")
        line = r.stdout.strip()
        assert line.startswith("OK "), f"STATS failed: {line!r} {r.stderr[-2000:]}"
        return dict(kv.split("=", 1) for kv in line.split()[1:])

    def stats(self) -> dict[str, str]:
        time.sleep(0.45)  # the file is rewritten every 200 ms
        out = {}
        for line in self.stats_path.read_text().splitlines():
            if "=" in line:
                k, v = line.split("=", 1)
                out[k] = v
        return out


def run_workers(topo: Topology, job: str, hosts: list[int], wire: str, n: int, seqs: int) -> list[dict]:
    procs = [
        topo.popen_helper(
            h, "worker", topo.agg_ip, "7700", job, str(len(hosts)), str(r), wire, str(n), str(seqs)
        )
        for r, h in enumerate(hosts)
    ]
    res = []
    for p in procs:
        out, err = p.communicate(timeout=90)
        try:
            res.append(json.loads(out.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            res.append({"ok": False, "error": f"worker output: {out!r} {err[-2000:]!r}"})
    return res


# --------------------------------------------------------------------------------------------
# Tests

try:
    import pytest
except ImportError:  # helper mode inside a namespace does not need pytest
    pytest = None

if pytest is not None:

    @pytest.fixture
    def net(request, tmp_path):
        """net(hosts, **switch_kwargs) -> (Topology, DpdkSwitch); torn down after the test."""
        require_dpdk()
        made: list[tuple[Topology, DpdkSwitch | None]] = []

        def make(hosts: int, dpdk_opts_for=None, **kw):
            topo = Topology(hosts)
            made.append((topo, None))
            topo.up()
            if dpdk_opts_for:
                kw["dpdk_opts"] = dpdk_opts_for(topo)
            sw = DpdkSwitch(topo, tmp_path, **kw)
            made[-1] = (topo, sw)
            sw.start()
            return topo, sw

        yield make
        for topo, sw in made:
            if sw:
                rc = sw.stop()
                print(f"--- gradswitchd (rc={rc}) {' '.join(sw.cmd)}\n{sw.log_text()}")
            topo.down()

    def test_ping_and_tcp_between_hosts(net):
        topo, sw = net(2)
        r = topo.exec(0, "ping", "-c", "3", "-i", "0.2", "-W", "2", topo.ip_of(1))
        assert r.returncode == 0, r.stdout + r.stderr
        srv = topo.popen_helper(1, "tcpserver", "5001")
        time.sleep(0.5)
        cli = topo.popen_helper(0, "tcpclient", topo.ip_of(1), "5001", str(4 << 20))
        cout, cerr = cli.communicate(timeout=30)
        sout, serr = srv.communicate(timeout=30)
        assert cli.returncode == 0, cerr
        assert f"got {4 << 20}" in sout, sout + serr
        st = sw.stats()
        assert int(st["dpdk.l2_forwarded"]) > 1000
        # The same counters reach the control plane's STATS through the backend interface, with the
        # ports' ethdev counters (snapshots every 100 ms) and the lcore's busy cycles.
        time.sleep(0.25)
        cs = sw.control_stats()
        assert int(cs["dpdk.l2_forwarded"]) >= int(st["dpdk.l2_forwarded"]), cs
        assert int(cs["dpdk.port0.port_rx_packets"]) > 1000, cs
        assert int(cs["dpdk.port1.port_tx_packets"]) > 1000, cs
        assert int(cs["dpdk.lcore0.busy_cycles"]) > 0 and int(cs["dpdk.tsc_hz"]) > 0, cs
        # The daemon's own kernel (the tap) is reachable: ping the aggregation address.
        assert topo.exec(1, "ping", "-c", "1", "-W", "2", topo.agg_ip).returncode == 0

    def test_mac_learning_and_flooding(net):
        topo, sw = net(3)
        macs = [topo.mac_of(i) for i in range(3)]
        unknown = "02:00:00:aa:bb:cc"

        def frame(dst: str, src: str, marker: str) -> str:
            return (
                dst.replace(":", "")
                + src.replace(":", "")
                + f"{TEST_ETHERTYPE:04x}"
                + (marker.encode() + bytes(46)).hex()
            )

        def deliver(dst: str, marker: str) -> tuple[list[str], list[str]]:
            sniffers = [topo.popen_helper(i, "sniff", topo.host_if[i], "1.5", marker) for i in (1, 2)]
            time.sleep(0.5)
            topo.popen_helper(0, "send", topo.host_if[0], frame(dst, macs[0], marker)).communicate(timeout=10)
            return tuple(json.loads(p.communicate(timeout=10)[0]) for p in sniffers)

        # Unknown unicast and broadcast are flooded to every other port.
        got1, got2 = deliver(unknown, "UNK1")
        assert got1 and got2, "unknown unicast must be flooded"
        got1, got2 = deliver("ff:ff:ff:ff:ff:ff", "BCAST")
        assert got1 and got2, "broadcast must be flooded"
        # Host 2 speaks: the switch learns its MAC on its port; frames to it go there only.
        topo.popen_helper(1, "send", topo.host_if[1], frame(unknown, macs[1], "LEARN")).communicate(
            timeout=10
        )
        time.sleep(0.2)
        got1, got2 = deliver(macs[1], "UCAST")
        assert got1 and not got2, f"known unicast must go to its port only: {got1} {got2}"
        st = sw.stats()
        assert st.get(f"mac.{macs[1].upper()}") == "1", st
        assert int(st["dpdk.l2_flooded"]) >= 2

    @pytest.mark.parametrize(
        "hosts,wire,threads",
        [
            (2, "float32", 1),
            (4, "float32", 2),
            (4, "int32", 1),
            (2, "fixed32", 1),
            (4, "float16", 1),
            (4, "bfloat16", 1),
        ],
    )
    def test_allreduce_through_dpdk_switch(net, hosts, wire, threads):
        lcores = "0,1" if threads > 1 and os.cpu_count() and os.cpu_count() >= 2 else "0"
        topo, sw = net(hosts, threads=threads, lcores=lcores)
        res = run_workers(topo, f"j{wire}", list(range(hosts)), wire, 20000, 3)
        assert all(r["ok"] for r in res), res
        st = sw.stats()
        epp = 1440 // (2 if wire in ("float16", "bfloat16") else 4)
        assert int(st["engine.completed"]) >= 3 * ((20000 + epp - 1) // epp)
        assert int(st["dpdk.agg_in"]) >= hosts * int(st["engine.completed"])

    def test_completion_signal(net, tmp_path):
        # Host 2 plays paper 000's host machine: it receives one signal per completed allreduce.
        topo, sw = net(3, dpdk_opts_for=lambda t: ["--notify", f"{t.ip_of(2)}:9911"])
        listener = topo.popen_helper(2, "listen", "9911", "8")
        res = run_workers(topo, "jn", [0, 1], "float32", 5000, 3)
        assert all(r["ok"] for r in res), res
        sigs = json.loads(listener.communicate(timeout=20)[0])
        assert sigs, "no completion signal arrived: " + sw.log_text()
        decoded = [decode_notify(bytes.fromhex(s)) for s in sigs]
        assert all(d["magic"] == NOTIFY["GS_NOTIFY_MAGIC"] for d in decoded), decoded
        assert all(d["version"] == NOTIFY["GS_NOTIFY_VERSION"] for d in decoded), decoded
        assert all(d["job_id"] == res[0]["job_id"] for d in decoded), decoded
        assert max(d["seq"] for d in decoded) == 2, decoded  # seq 0..2: completed through seq 2
        last = [d for d in decoded if d["seq"] == 2][0]
        assert last["elements"] == 5000, decoded  # elements of the last allreduce
        reasons = {NOTIFY["GS_NOTIFY_NEWER_SEQ"], NOTIFY["GS_NOTIFY_QUIET"]}
        assert all(d["reason"] in reasons for d in decoded), decoded

    def test_loss_injection(net):
        topo, sw = net(2, extra=["--drop-rate", "0.05", "--seed", "7"])
        res = run_workers(topo, "jloss", [0, 1], "float32", 30000, 2)
        assert all(r["ok"] for r in res), res
        assert sum(r["retx"] for r in res) > 0
        st = sw.stats()
        assert int(st["dpdk.drop_injected"]) > 0
        assert int(st["engine.retx_answered"]) + int(st["engine.duplicates"]) > 0

    def test_garbage_and_malformed_packets(net):
        topo, sw = net(2)
        agg_mac = None
        # Learn the aggregation MAC (the tap's) through ARP.
        topo.exec(0, "ping", "-c", "1", "-W", "2", topo.agg_ip)
        r = topo.exec(0, "ip", "-j", "neigh", "show", topo.agg_ip)
        agg_mac = json.loads(r.stdout)[0]["lladdr"]
        src_mac = topo.mac_of(0)
        frames = []
        rng = random.Random(5)
        # Random garbage of every size, runts, a bad IPv4 header to the aggregation address.
        for size in (1, 13, 14, 60, 100, 1514):
            frames.append(bytes(rng.randrange(256) for _ in range(size)).hex())
        eth = bytes.fromhex(agg_mac.replace(":", "") + src_mac.replace(":", "")) + b"\x08\x00"
        dst = socket.inet_aton(topo.agg_ip)
        src = socket.inet_aton(topo.ip_of(0))

        def ipv4(
            payload: bytes, ihl_words: int = 5, total: int | None = None, proto: int = 17, frag: int = 0
        ):
            tl = total if total is not None else 20 + len(payload)
            h = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl_words, 0, tl, 1, frag, 64, proto, 0, src, dst)
            return h + payload

        def udp(payload: bytes, dport: int = 7701, length: int | None = None) -> bytes:
            return (
                struct.pack("!HHHH", 40000, dport, length if length is not None else 8 + len(payload), 0)
                + payload
            )

        good_hdr = HDR.pack(GS_MAGIC, GS_VERSION, DATA, 12345, 1, 0, 0, 0, 2, 1, 0, 0, -128, -128, 0)
        bad = [
            ipv4(udp(b""), ihl_words=3),  # bad IHL
            ipv4(udp(b"x" * 10), total=2000),  # total length past the frame
            ipv4(udp(b"x" * 10, length=3000)),  # UDP length past the IP payload
            ipv4(udp(b"x" * 10), frag=0x2000),  # a fragment
            ipv4(udp(b"short")),  # gradswitch: short packet
            ipv4(udp(b"\x00" * 32)),  # bad magic
            ipv4(udp(good_hdr + b"\x00" * 4)),  # unknown job
            ipv4(udp(b"\x47\x53\x09" + b"\x00" * 29)),  # bad version
        ]
        frames += [(eth + b).hex() for b in bad]
        sender = topo.popen_helper(0, "send", topo.host_if[0], *frames, "--count", "200")
        res = run_workers(topo, "jg", [0, 1], "float32", 20000, 2)
        sender.communicate(timeout=60)
        assert sender.returncode == 0
        assert all(r["ok"] for r in res), res
        st = sw.stats()
        assert int(st["dpdk.drop_bad_ipv4"]) >= 300, st
        assert int(st["dpdk.drop_bad_udp"]) >= 150, st
        assert int(st["dpdk.drop_ip_fragment"]) >= 150, st
        assert int(st["engine.drop.short_packet"]) >= 150, st
        assert int(st["engine.drop.bad_magic"]) >= 150, st
        assert int(st["engine.drop.unknown_job"]) >= 150, st
        assert int(st["engine.drop.bad_version"]) >= 150, st
        # The switch is still switching.
        assert topo.exec(1, "ping", "-c", "1", "-W", "2", topo.ip_of(0)).returncode == 0

    def test_clean_stop_on_sigint(net):
        topo, sw = net(2)
        sw.proc.send_signal(signal.SIGINT)
        assert sw.proc.wait(timeout=15) == 0, sw.log_text()
        assert "dpdk: stopped" in sw.log_text()


# --------------------------------------------------------------------------------------------


def _main(argv: list[str]) -> int:
    cmd = argv[0]
    if cmd == "worker":
        agg, cport, job, world, rank, wire, n, seqs = argv[1:9]
        print(json.dumps(worker(agg, int(cport), job, int(world), int(rank), wire, int(n), int(seqs))))
    elif cmd == "send":
        count = 1
        args = argv[2:]
        if "--count" in args:
            i = args.index("--count")
            count = int(args[i + 1])
            args = args[:i] + args[i + 2 :]
        raw_send(argv[1], args, count)
    elif cmd == "sniff":
        print(json.dumps(sniff(argv[1], float(argv[2]), argv[3])))
    elif cmd == "listen":
        print(json.dumps(listen_udp(int(argv[1]), float(argv[2]))))
    elif cmd == "stats":  # stats agg cport: the STATS reply line
        c = socket.create_connection((argv[1], int(argv[2])), timeout=10)
        c.sendall(b"STATS\n")
        print(c.makefile("r").readline().strip())
    elif cmd == "join":  # join agg cport job world rank: JOIN, print the reply, hold until killed
        agg, cport, job, world, rank = argv[1:6]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("0.0.0.0", 9000))  # the rank's data port; never read (a sink, no ICMP unreachable)
        c = socket.create_connection((agg, int(cport)), timeout=30)
        c.sendall(f"JOIN job={job} world={world} rank={rank} wire=float32 token=b port=9000\n".encode())
        print(c.makefile("r").readline().strip(), flush=True)
        time.sleep(3600)
    elif cmd == "tcpserver":
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", int(argv[1])))
        s.listen(1)
        s.settimeout(20)
        c, _ = s.accept()
        c.settimeout(20)
        got = 0
        while d := c.recv(1 << 16):
            got += len(d)
        print("got", got)
    elif cmd == "tcpclient":
        s = socket.create_connection((argv[1], int(argv[2])), timeout=20)
        s.sendall(b"x" * int(argv[3]))
        s.close()
    else:
        print("unknown helper command", cmd, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
