#!/usr/bin/env python3
"""Packets/s of the DPDK switch: aggregating vs forwarding only, and DPDK vs the kernel-UDP backend.

    sudo python3 bench/dpdk_bench.py [--sizes 64,128,192,512,1024,1518,9000] [--seconds 3]
                                     [--udp-sizes 128,512,1518] [--json out.json]

Testbed (tests/python/test_dpdk.py's Topology): two host namespaces, each linked by a veth to a
switch namespace. The generator (gs_dpdk_pktgen, af_xdp on host 0's veth, pinned to CPU 0) sends
  fwd: frames of the given size to host 1's MAC (the switch forwards them, L2 only);
  agg: gradswitch DATA packets of that frame size for both ranks of a world-2 job, closed loop
       (a slot is reused once its result is back), i.e. a worker window of 256 slots.
The switch runs on one lcore pinned to CPU 1 (`-l 1`, busy polling). Its packets/s are read from
its own counters (--stats-file) over the middle of the run: `rx` = frames received from the
generator per second, `out` = frames sent per second. The kernel-UDP backend runs on the same
testbed with a Linux bridge in the switch namespace and gradswitchd --backend udp --threads 1
pinned to CPU 1 (kernel softirq work is not confined to that CPU; see BENCHMARKS.md).
9000-byte frames use net_af_packet (af_xdp on veth takes frames up to ~3.5 KB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
import test_dpdk as T  # noqa: E402

BUILD = Path(os.environ.get("GRADSWITCH_BUILD", REPO / "build-dpdk"))
JUMBO_AF_PACKET = "blocksz=12288,framesz=12288,framecnt=1024"
PKTGEN = BUILD / "tools/dpdk/gs_dpdk_pktgen"


def read_stats(path: Path) -> dict[str, int]:
    out = {}
    for line in path.read_text().splitlines():
        k, _, v = line.partition("=")
        if v.isdigit():
            out[k] = int(v)
    return out


def join_job(topo: T.Topology) -> tuple[list[subprocess.Popen], int, int]:
    holders = [topo.popen_helper(i, "join", topo.agg_ip, "7700", "bench", "2", str(i)) for i in range(2)]
    line = holders[0].stdout.readline().strip()
    holders[1].stdout.readline()
    if not line.startswith("OK"):
        raise RuntimeError("JOIN failed: " + line)
    kv = dict(x.split("=", 1) for x in line.split()[1:])
    return holders, int(kv["job_id"]), int(kv["key"])


def generator(
    topo: T.Topology,
    mode: str,
    size: int,
    seconds: float,
    job_id: int = 0,
    key: int = 0,
    vdev: str = "af_xdp",
) -> subprocess.Popen:
    v = (
        f"--vdev=net_af_xdp0,iface={topo.host_if[0]}"
        if vdev == "af_xdp"
        else f"--vdev=net_af_packet0,iface={topo.host_if[0]},{JUMBO_AF_PACKET}"
    )
    cmd = [
        "ip",
        "netns",
        "exec",
        topo.host_ns[0],
        "taskset",
        "-c",
        "0",
        str(PKTGEN),
        "-l",
        "0",
        "--no-huge",
        "--no-pci",
        "--no-shconf",
        "-m",
        "512",
        "--log-level=*:error",
        v,
        "--",
        "--mode",
        mode,
        "--size",
        str(size),
        "--seconds",
        str(seconds),
        "--dst-mac",
        topo.mac_of(1),
        "--src-ip",
        topo.ip_of(0),
        "--dst-ip",
        topo.agg_ip,
        "--job-id",
        str(job_id),
        "--key",
        str(key),
        "--world",
        "2",
    ]
    if mode == "agg":
        # results come back to the rank-0 endpoint, i.e. this port: frames go to the aggregation MAC
        r = T._run("ip", "-n", topo.host_ns[0], "-j", "neigh", "show", topo.agg_ip)
        cmd[cmd.index("--dst-mac") + 1] = json.loads(r.stdout)[0]["lladdr"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def measure(stats_path: Path, seconds: float, gen: subprocess.Popen) -> dict:
    time.sleep(seconds * 0.25)
    a = read_stats(stats_path)
    time.sleep(seconds * 0.5)
    b = read_stats(stats_path)
    out, err = gen.communicate(timeout=seconds + 30)
    dt = (b["time_ns"] - a["time_ns"]) / 1e9
    rate = lambda k: (b.get(k, 0) - a.get(k, 0)) / dt if dt > 0 else 0.0  # noqa: E731
    return {
        "rx_pps": rate("port0.ipackets"),
        "out_pps": rate("dpdk.tx_frames"),
        "agg_in_pps": rate("dpdk.agg_in"),
        "completed_ps": rate("engine.completed"),
        "drops": b.get("engine.drops", 0),
        "generator": out.strip() or err.strip()[-300:],
    }


def set_mtu(topo: T.Topology, mtu: int) -> None:
    for i in range(topo.hosts):
        T._run("ip", "-n", topo.sw_ns, "link", "set", topo.sw_if[i], "mtu", str(mtu))
        T._run("ip", "-n", topo.host_ns[i], "link", "set", topo.host_if[i], "mtu", str(mtu))


def run_dpdk(size: int, mode: str, seconds: float, tmp: Path) -> dict:
    topo = T.Topology(2)
    sw = None
    holders: list[subprocess.Popen] = []
    try:
        topo.up()
        jumbo = size > 1518
        if jumbo:
            set_mtu(topo, 9000)
        vdev = "af_packet" if jumbo else "af_xdp"
        extra = ["--mtu", "9000"] if jumbo else []
        sw = T.DpdkSwitch(
            topo,
            tmp,
            lcores="1",
            extra=extra,
            vdev=vdev,
            af_packet_args=JUMBO_AF_PACKET,
            dpdk_opts=["--idle-sleep-us", "0", "--mbufs", "16383"]
            if not jumbo
            else ["--idle-sleep-us", "0", "--mbufs", "4095"],
        )
        if jumbo:
            sw.cmd.insert(sw.cmd.index("--no-huge") + 1, "-m")
            sw.cmd.insert(sw.cmd.index("-m") + 1, "1024")
        sw.start()
        job_id = key = 0
        if mode == "agg":
            holders, job_id, key = join_job(topo)
        else:  # the switch learns host 1's MAC
            topo.exec(1, "ping", "-c", "1", "-W", "1", topo.agg_ip)
        gen = generator(topo, mode, size, seconds, job_id, key, vdev)
        res = measure(sw.stats_path, seconds, gen)
        res.update(backend="dpdk", mode=mode, size=size, vdev=vdev)
        return res
    finally:
        for h in holders:
            h.kill()
            h.wait()
        if sw:
            sw.stop()
        topo.down()


def run_udp(size: int, seconds: float, tmp: Path) -> dict:
    """The kernel-UDP backend on the same testbed: a Linux bridge in place of the DPDK switch."""
    topo = T.Topology(2)
    proc = None
    holders: list[subprocess.Popen] = []
    try:
        topo.up()
        ns = topo.sw_ns
        T._run("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
        for i in range(2):
            T._run("ip", "-n", ns, "link", "set", topo.sw_if[i], "master", "br0")
        T._run("ip", "-n", ns, "addr", "add", f"{topo.agg_ip}/24", "dev", "br0")
        T._run("ip", "-n", ns, "link", "set", "br0", "up")
        stats = tmp / "udp-stats.log"
        log = open(stats, "w")
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                ns,
                "taskset",
                "-c",
                "1",
                str(T.find_switch_binary()),
                "--backend",
                "udp",
                "--threads",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        time.sleep(1)
        topo.exec(0, "ping", "-c", "1", "-W", "1", topo.agg_ip)
        holders, job_id, key = join_job(topo)
        gen = generator(topo, "agg", size, seconds, job_id, key)
        out, err = gen.communicate(timeout=seconds + 30)
        kv = dict(x.split("=", 1) for x in out.split() if "=" in x)
        # The generator's closed loop: every round = 2 DATA in, 2 RESULT out at the switch.
        rounds = int(kv.get("rounds", 0))
        secs = float(kv.get("seconds", seconds))
        return {
            "backend": "udp",
            "mode": "agg",
            "size": size,
            "rx_pps": 2 * rounds / secs,
            "out_pps": 2 * rounds / secs,
            "generator": out.strip() or err.strip()[-300:],
        }
    finally:
        for h in holders:
            h.kill()
            h.wait()
        if proc:
            proc.terminate()
            proc.wait(timeout=15)
        topo.down()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="64,128,192,512,1024,1518,9000")
    ap.add_argument("--udp-sizes", default="128,512,1518")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json")
    a = ap.parse_args()
    why = T.dpdk_unavailable_reason()
    if why or not PKTGEN.exists():
        print("cannot run:", why or f"{PKTGEN} not built", file=sys.stderr)
        return 1
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"gsd-bench-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    rows = []
    for size in [int(x) for x in a.sizes.split(",") if x]:
        for mode in ("fwd", "agg"):
            if mode == "agg" and size < 128:
                continue  # 64-byte frames cannot carry a gradswitch header plus data
            r = run_dpdk(size, mode, a.seconds, tmp)
            rows.append(r)
            print(json.dumps(r), flush=True)
    for size in [int(x) for x in a.udp_sizes.split(",") if x]:
        r = run_udp(size, a.seconds, tmp)
        rows.append(r)
        print(json.dumps(r), flush=True)
    # Summary table.
    print(f"\n{'size':>5} {'fwd Mpps':>9} {'agg Mpps':>9} {'agg/fwd':>8} {'agg Gbit/s':>10}")
    for size in sorted({r["size"] for r in rows if r["backend"] == "dpdk"}):
        f = next(
            (r for r in rows if r["backend"] == "dpdk" and r["mode"] == "fwd" and r["size"] == size), None
        )
        g = next(
            (r for r in rows if r["backend"] == "dpdk" and r["mode"] == "agg" and r["size"] == size), None
        )
        fp = f["rx_pps"] / 1e6 if f else float("nan")
        gp = g["rx_pps"] / 1e6 if g else float("nan")
        print(
            f"{size:>5} {fp:>9.3f} {gp:>9.3f} {gp / fp if f and g else float('nan'):>8.2f} "
            f"{gp * size * 8 / 1e3 if g else float('nan'):>10.2f}"
        )
    for r in rows:
        if r["backend"] == "udp":
            d = next(
                (x for x in rows if x["backend"] == "dpdk" and x["mode"] == "agg" and x["size"] == r["size"]),
                None,
            )
            ratio = d["rx_pps"] / r["rx_pps"] if d and r["rx_pps"] else float("nan")
            print(f"udp backend {r['size']:>5} B: {r['rx_pps'] / 1e6:.3f} Mpps in; dpdk/udp = {ratio:.2f}x")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
