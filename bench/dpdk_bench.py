#!/usr/bin/env python3
"""What the DPDK switch costs per packet: aggregating vs forwarding, DPDK vs the UDP backend.

    sudo python3 bench/dpdk_bench.py [--sizes 64,128,256,512,1024,1518,9000] [--rate 100000]
        [--seconds 3] [--onset-sizes 128,512,1518] [--scaling-sizes 512,1518] [--json out.json]

Testbed (tests/python/test_dpdk.py's Topology): two host namespaces, each linked by a veth to a
switch namespace. The generator (tools/dpdk/gs_dpdk_pktgen, af_xdp on host 0's veth, CPU 0) sends
open loop and never reads: the switch's output goes to host 1, where a holder process has joined
a 2-rank job (both ranks) and keeps UDP sinks open that nobody reads.
  fwd: IPv4/UDP frames to host 1 (the switch forwards them by MAC, L2 only);
  agg: DATA packets of both ranks of the job; every round completes, and its result goes to host 1
       as two frames (one per rank): one frame out per frame in, as for fwd.

Measured (the switch, not the generator):
  1. cycles per packet at a fixed offered rate (--rate, below the drop onset of every mode): the
     switch lcore's busy TSC cycles (loop iterations that handled frames) per frame received, from
     the backend's counters (STATS); for --backend udp (a Linux bridge in the switch namespace, one
     data thread pinned to CPU 1) the data thread's CPU time per datagram, in the same TSC cycles.
  2. the drop onset: the open-loop rate at which the switch starts to lose frames (frames the
     generator sent that the switch did not receive or hand on), rate stepped up until >= 0.1% loss.
  3. scaling: the generator at full speed against the switch on 1 lcore (CPU 1) and on 2 lcores
     (layout io: ports on CPU 1, aggregation on CPU 2; needs >= 3 CPUs, so that no lcore shares the
     generator's CPU 0).
9000-byte frames use net_af_packet (af_xdp on veth takes frames up to ~3.5 KB).
Only two cores exist on the machine this was written on: every figure says so.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests/python"))
import test_dpdk as T  # noqa: E402

BUILD = Path(os.environ.get("GRADSWITCH_BUILD", REPO / "build/test"))
PKTGEN = BUILD / "tools/dpdk/gs_dpdk_pktgen"
JUMBO_AF_PACKET = "blocksz=12288,framesz=12288,framecnt=1024"
SINK_PORTS = (9000, 9001, 9002)  # rank 0 and rank 1 results, forwarded frames
LOSS_ONSET = 0.001
# The switch lcore sleeps this long after 64 empty polls: on a machine shared with other work, a
# sleeper keeps its claim on the CPU where a spinning poller competes (and loses frames).
IDLE_SLEEP_US = 20


# --------------------------------------------------------------------------------------------
# Helper run inside host 1's namespace


def holder(agg: str, job: str) -> None:
    """job '-': binds the UDP sinks (never read) and holds; else joins both ranks of `job` (their results
    go to the sinks), prints the JOIN reply and holds (the job lives until this process is killed)."""
    keep = []
    if job == "-":
        for port in SINK_PORTS:
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("0.0.0.0", port))
            keep.append(s)
        print("OK sinks", flush=True)
    else:
        for rank in (0, 1):
            c = socket.create_connection((agg, 7700), timeout=30)
            c.sendall(
                f"JOIN job={job} world=2 rank={rank} wire=float32 token=b port={9000 + rank}\n".encode()
            )
            keep.append(c)
        print(keep[0].makefile("r").readline().strip(), flush=True)
        keep[1].makefile("r").readline()
    time.sleep(3600)


# --------------------------------------------------------------------------------------------
# The testbed


def stats(ns: str) -> dict[str, int]:
    """The daemon's STATS reply (engine and backend counters), asked inside its namespace."""
    r = T._run(
        "ip",
        "netns",
        "exec",
        ns,
        "timeout",
        "5",
        "bash",
        "-c",
        "exec 3<>/dev/tcp/127.0.0.1/7700 && echo STATS >&3 && head -n1 <&3",
        check=False,
    )
    line = r.stdout.strip()
    if not line.startswith("OK "):
        raise RuntimeError(f"STATS failed in {ns}: {line!r} {r.stderr[-500:]}")
    out = {}
    for kv in line.split()[1:]:
        k, _, v = kv.partition("=")
        if v.isdigit():
            out[k] = int(v)
    return out


class Bed:
    """A topology with a switch (DPDK on `lcores`, or the UDP backend behind a bridge), host 1 holding."""

    tags_in_use: set[str] = set()

    def __init__(self, backend: str, size: int, tmp: Path, lcores: str = "1"):
        self.backend, self.size, self.tmp = backend, size, tmp
        self.jumbo = size > 1518
        self.topo = T.Topology(2)
        while self.topo.tag in Bed.tags_in_use:  # two beds side by side need distinct names
            self.topo = T.Topology(2)
        Bed.tags_in_use.add(self.topo.tag)
        self.sw: T.DpdkSwitch | None = None
        self.udp: subprocess.Popen | None = None
        self.holders: list[subprocess.Popen] = []
        self.lcores = lcores
        self.jobs = 0

    def __enter__(self):
        try:
            self._up()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _up(self) -> None:
        t = self.topo
        t.up()
        if self.jumbo:
            for i in range(2):
                T._run("ip", "-n", t.sw_ns, "link", "set", t.sw_if[i], "mtu", "9000")
                T._run("ip", "-n", t.host_ns[i], "link", "set", t.host_if[i], "mtu", "9000")
        mtu = ["--mtu", "9000"] if self.jumbo else []
        if self.backend == "dpdk":
            opts = ["--idle-sleep-us", str(IDLE_SLEEP_US), "--mbufs", "4095" if self.jumbo else "16383"]
            if self.lcores != "1":
                opts += ["--layout", "io"]
            self.sw = T.DpdkSwitch(
                t,
                self.tmp,
                lcores=self.lcores,
                extra=mtu,
                vdev="af_packet" if self.jumbo else "af_xdp",
                af_packet_args=JUMBO_AF_PACKET,
                dpdk_opts=opts,
            )
            if self.jumbo:
                self.sw.cmd[self.sw.cmd.index("--no-huge") + 1 : self.sw.cmd.index("--no-huge") + 1] = [
                    "-m",
                    "1024",
                ]
            self.sw.start()
        else:
            ns = t.sw_ns
            T._run("ip", "-n", ns, "link", "add", "br0", "type", "bridge")
            for i in range(2):
                T._run("ip", "-n", ns, "link", "set", t.sw_if[i], "master", "br0")
            T._run("ip", "-n", ns, "addr", "add", f"{t.agg_ip}/24", "dev", "br0")
            T._run("ip", "-n", ns, "link", "set", "br0", "up")
            self.log = open(self.tmp / f"udp-{t.tag}.log", "w")
            binary = str(T.find_switch_binary())
            self.udp = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    ns,
                    "taskset",
                    "-c",
                    "1",
                    binary,
                    "--backend",
                    "udp",
                    "--control-host",  # the bench's own namespaces: only its hosts reach it
                    "0.0.0.0",
                    "--insecure",
                    "--threads",
                    "1",
                ]
                + mtu,
                stdout=self.log,
                stderr=subprocess.STDOUT,
            )
            for _ in range(50):
                if t.exec(0, "ping", "-c", "1", "-W", "1", t.agg_ip).returncode == 0:
                    break
        self._hold("-")  # the sinks on host 1
        t.exec(1, "ping", "-c", "1", "-W", "1", t.agg_ip)  # the switch learns host 1 (MAC, neighbour)

    def _hold(self, job: str) -> tuple[subprocess.Popen, str]:
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.topo.host_ns[1], T.PY, str(Path(__file__).resolve()), "holder"]
            + [self.topo.agg_ip, job],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = p.stdout.readline().strip()
        if not line.startswith("OK"):
            p.kill()
            raise RuntimeError(f"holder on host 1: {line!r} {p.stderr.read()[-2000:] if p.stderr else ''}")
        self.holders.append(p)
        return p, line

    def new_job(self) -> tuple[int, int]:
        """A fresh 2-rank job, both ranks on host 1 (so that no stuck round carries over between runs)."""
        self.jobs += 1
        _, line = self._hold(f"bench{self.jobs}")
        kv = dict(x.split("=", 1) for x in line.split()[1:] if "=" in x)
        return int(kv["job_id"]), int(kv["key"])

    @property
    def ns(self) -> str:
        return self.topo.sw_ns

    def generate(
        self, mode: str, rate: float, seconds: float, job: tuple[int, int] = (0, 0)
    ) -> subprocess.Popen:
        t = self.topo
        if mode == "agg":  # to the aggregation address: its MAC as host 0 learned it
            t.exec(0, "ping", "-c", "1", "-W", "1", t.agg_ip)
            r = T._run("ip", "-n", t.host_ns[0], "-j", "neigh", "show", t.agg_ip)
            dst_mac, dst_ip = json.loads(r.stdout)[0]["lladdr"], t.agg_ip
        else:
            dst_mac, dst_ip = t.mac_of(1), t.ip_of(1)
        vdev = (
            f"--vdev=net_af_packet0,iface={t.host_if[0]},{JUMBO_AF_PACKET}"
            if self.jumbo
            else f"--vdev=net_af_xdp0,iface={t.host_if[0]}"
        )
        cmd = [
            "ip",
            "netns",
            "exec",
            t.host_ns[0],
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
            vdev,
            "--",
            "--mode",
            mode,
            "--size",
            str(self.size),
            "--seconds",
            str(seconds),
            "--rate",
            str(int(rate)),
            "--dst-mac",
            dst_mac,
            "--src-ip",
            t.ip_of(1) if mode == "agg" else t.ip_of(0),  # agg: the ranks joined from host 1
            "--dst-ip",
            dst_ip,
            "--dst-port",
            "9002",
            "--job-id",
            str(job[0]),
            "--key",
            str(job[1]),
            "--world",
            "2",
            "--seq-base",
            str(self.jobs << 20),
        ]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def __exit__(self, *exc):
        for p in self.holders:
            p.kill()
            p.wait()
        self.holders.clear()
        if self.sw:
            self.sw.stop()
        if self.udp:
            self.udp.terminate()
            try:
                self.udp.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.udp.kill()
                self.udp.wait()
            self.log.close()
        self.topo.down()
        Bed.tags_in_use.discard(self.topo.tag)


# --------------------------------------------------------------------------------------------
# Measurements


def lcore_ids(st: dict[str, int]) -> list[str]:
    return sorted({k.split(".")[1] for k in st if k.startswith("dpdk.lcore") and k.endswith(".busy_cycles")})


def switch_cycles(a: dict[str, int], b: dict[str, int], backend: str, tsc_hz: float) -> tuple[float, dict]:
    """The switch's cycles between two STATS replies. DPDK: each lcore's busy cycles, scaled up to the
    frames of the iterations left out as preempted (the same cost per frame); UDP: the data thread's CPU
    time in TSC cycles."""
    d = lambda k: b.get(k, 0) - a.get(k, 0)  # noqa: E731
    if backend != "dpdk":
        return d("udp.thread0.cpu_ns") * tsc_hz / 1e9, {}
    cycles, info = 0.0, {"preempted_iterations": 0, "busy_iterations": 0, "busy_frames": 0}
    for lc in lcore_ids(b):
        busy, frames, pre = (
            d(f"dpdk.{lc}.busy_cycles"),
            d(f"dpdk.{lc}.busy_frames"),
            d(f"dpdk.{lc}.preempted_frames"),
        )
        cycles += busy * (frames + pre) / frames if frames else 0.0
        info["preempted_iterations"] += d(f"dpdk.{lc}.preempted_iterations")
        info["busy_iterations"] += d(f"dpdk.{lc}.busy_iterations")
        info["busy_frames"] += frames
    return cycles, info


def received(st: dict[str, int], backend: str) -> int:
    """Frames the switch took in (from the generator's port; ARP and the like are negligible)."""
    return st["dpdk.rx_frames"] if backend == "dpdk" else st["udp.thread0.rx_datagrams"]


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def run_once(bed: Bed, mode: str, rate: float, seconds: float, tsc_hz: float) -> dict:
    """One generator run; the cost over its middle half, the loss over all of it."""
    job = bed.new_job() if mode == "agg" else (0, 0)
    load0 = loadavg()
    s0 = stats(bed.ns)
    gen = bed.generate(mode, rate, seconds, job)
    time.sleep(0.5 + seconds * 0.25)
    a, ta = stats(bed.ns), time.monotonic()
    time.sleep(seconds * 0.5)
    b, tb = stats(bed.ns), time.monotonic()
    out, err = gen.communicate(timeout=seconds + 60)
    time.sleep(0.4)  # the DPDK port counters are snapshots every 100 ms
    s1 = stats(bed.ns)
    kv = dict(x.split("=", 1) for x in out.split() if "=" in x)
    if "sent" not in kv:
        raise RuntimeError(f"generator failed: {out!r} {err[-1500:]!r}")
    sent = int(kv["sent"])
    cycles, info = switch_cycles(a, b, bed.backend, tsc_hz)
    packets = received(b, bed.backend) - received(a, bed.backend)
    got = received(s1, bed.backend) - received(s0, bed.backend)
    out_key = "dpdk.tx_frames" if bed.backend == "dpdk" else "pkts_out"
    res = {
        "backend": bed.backend,
        "mode": mode,
        "size": bed.size,
        "lcores": bed.lcores if bed.backend == "dpdk" else "thread0@cpu1",
        "offered_pps": rate,
        "sent_pps": float(kv["tx_pps"]),
        "generator_skipped": int(kv.get("skipped", 0)),
        "rx_pps": packets / (tb - ta),
        "out_pps": (b.get(out_key, 0) - a.get(out_key, 0)) / (tb - ta),
        "cycles_per_packet": cycles / packets if packets else float("nan"),
        "sent": sent,
        "received": got,
        "loss": max(0.0, 1 - got / sent) if sent else float("nan"),
        "engine_drops": s1.get("drops", 0) - s0.get("drops", 0),
        "completed": s1.get("completed", 0) - s0.get("completed", 0),
        "load_before": load0,
        **info,
    }
    if info.get("busy_iterations"):
        res["frames_per_busy_iteration"] = info["busy_frames"] / info["busy_iterations"]
    return res


def onset(
    backend: str, mode: str, size: int, rates: list[float], seconds: float, tmp: Path, tsc_hz: float
) -> dict:
    """Steps the offered rate up until the switch loses >= LOSS_ONSET of the frames."""
    steps = []
    with Bed(backend, size, tmp) as bed:
        for rate in rates:
            r = run_once(bed, mode, rate, seconds, tsc_hz)
            steps.append(
                {k: r[k] for k in ("offered_pps", "sent_pps", "loss", "engine_drops", "cycles_per_packet")}
            )
            print(
                f"    onset {backend} {mode} {size} B: offered {rate / 1e3:.0f} kpps sent "
                f"{r['sent_pps'] / 1e3:.0f} kpps loss {r['loss'] * 100:.2f}%",
                flush=True,
            )
            # Stop at the first loss, or when the generator no longer gets faster (its own limit).
            if r["loss"] >= LOSS_ONSET or (len(steps) > 1 and r["sent_pps"] < 1.05 * steps[-2]["sent_pps"]):
                break
    clean = [s for s in steps if s["loss"] < LOSS_ONSET]
    lossy = [s for s in steps if s["loss"] >= LOSS_ONSET]
    return {
        "backend": backend,
        "mode": mode,
        "size": size,
        "steps": steps,
        "last_clean_pps": clean[-1]["sent_pps"] if clean else 0.0,
        "onset_pps": lossy[0]["sent_pps"] if lossy else None,  # None: the generator's limit came first
    }


PROFILE_GROUPS = (  # (name, test on "dso symbol") in order; the first that matches takes the sample
    (
        "engine (checks, sums, result header)",
        lambda d, s: "gradswitchd" in d and ("Engine" in s or "Kernels" in s),
    ),
    ("switch: parse, tables, frames, loop", lambda d, s: "gradswitchd" in d),
    ("DPDK (af_xdp PMD, mempool, rings)", lambda d, s: "librte" in d),
    ("libc (memcpy, clock)", lambda d, s: "libc" in d or "vdso" in d),
    ("kernel (AF_XDP, veth, the receiving host's stack)", lambda d, s: "kernel" in d),
)


def switch_thread(bed: Bed) -> int:
    """The switch's main lcore thread: the daemon's main thread (`ip netns exec` execs it in place)."""
    pid = bed.sw.proc.pid
    if Path(f"/proc/{pid}/comm").read_text().strip() != "gradswitchd":
        pid = int(T._run("pgrep", "-P", str(pid)).stdout.split()[0])
    return pid


def profile(size: int, mode: str, seconds: float, tmp: Path, out_dir: Path) -> dict:
    """perf samples (cpu-clock: this VM has no hardware counters) of the switch lcore with the generator
    at full speed, where the lcore is busy nearly all the time: the share of each part of the path."""
    data = out_dir / f"perf-{mode}-{size}.data"
    with Bed("dpdk", size, tmp) as bed:
        job = bed.new_job() if mode == "agg" else (0, 0)
        gen = bed.generate(mode, 0, seconds + 2, job)
        time.sleep(1.0)
        tid = switch_thread(bed)
        T._run("perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-t", str(tid), "-o", str(data),
               "--", "sleep", str(seconds))  # fmt: skip
        gen.communicate(timeout=seconds + 60)
    rep = T._run("perf", "report", "-i", str(data), "--stdio", "--no-children", "--sort", "dso,sym",
                 "-F", "overhead,dso,sym", check=False).stdout  # fmt: skip
    (out_dir / f"perf-{mode}-{size}.txt").write_text(rep)
    shares = {name: 0.0 for name, _ in PROFILE_GROUPS}
    top = []
    for line in rep.splitlines():
        parts = line.split(None, 2)
        if len(parts) < 3 or not parts[0].endswith("%"):
            continue
        pct, dso, sym = float(parts[0][:-1]), parts[1], parts[2].split("]", 1)[-1].strip()
        top.append((pct, dso, sym))
        for name, test in PROFILE_GROUPS:
            if test(dso, sym):
                shares[name] += pct
                break
    return {"size": size, "mode": mode, "shares": shares, "top": top[:15], "report": str(data)}


def tsc_hz_of_machine(tmp: Path) -> float:
    with Bed("dpdk", 512, tmp) as bed:
        return float(stats(bed.ns)["dpdk.tsc_hz"])


def fmt(x: float, spec: str = ".0f") -> str:
    return "–" if x is None or x != x else format(x, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--sizes", default="64,128,256,512,1024,1518,9000", help="frame sizes for cycles per packet"
    )
    ap.add_argument("--rate", type=float, default=100000, help="offered frames/s for cycles per packet")
    ap.add_argument("--seconds", type=float, default=3.0, help="generator time per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="repetitions of each cost measurement (medians)")
    ap.add_argument("--onset-sizes", default="128,512,1518", help="frame sizes of the drop-onset sweep")
    ap.add_argument("--onset-rates", default="100,150,200,250,300,350,400,500,600,800", help="kpps steps")
    ap.add_argument("--scaling-sizes", default="512,1518", help="frame sizes of the 1 vs 2 lcore runs")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: cost,onset,scaling")
    ap.add_argument("--perf", metavar="DIR", help="also profile the switch lcore (perf), reports in DIR")
    ap.add_argument("--perf-sizes", default="512,1518", help="frame sizes of the --perf profiles")
    ap.add_argument("--json", help="write every measurement here")
    a = ap.parse_args()
    why = T.dpdk_unavailable_reason()
    if why or not PKTGEN.exists():
        print("cannot run:", why or f"{PKTGEN} not built (GRADSWITCH_BUILD={BUILD})", file=sys.stderr)
        return 1
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"gsd-bench-{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    skip = set(a.skip.split(","))
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    tsc_hz = tsc_hz_of_machine(tmp)
    print(f"TSC {tsc_hz / 1e9:.3f} GHz; {os.cpu_count()} CPUs on this machine", flush=True)
    data: dict = {
        "tsc_hz": tsc_hz,
        "cpus": os.cpu_count(),
        "command": " ".join(sys.argv),
        "cost": [],
        "onset": [],
    }
    data["scaling"] = []
    data["profile"] = []

    if "cost" not in skip:
        # Both switches stand side by side; the three measurements of a repetition run back to back,
        # so that a ratio compares runs a few seconds apart (the machine's load drifts).
        for size in ints(a.sizes):
            with Bed("dpdk", size, tmp) as dpdk, Bed("udp", size, tmp) as udp:
                for rep in range(a.repeat):
                    for bed, mode in ((dpdk, "fwd"), (dpdk, "agg"), (udp, "agg")):
                        if mode == "agg" and size < 128:
                            continue  # 64-byte frames cannot carry a gradswitch header plus data
                        r = run_once(bed, mode, a.rate, a.seconds, tsc_hz)
                        r["rep"] = rep
                        data["cost"].append(r)
                        print(json.dumps(r), flush=True)
    if "onset" not in skip:
        rates = [k * 1e3 for k in ints(a.onset_rates)]
        for size in ints(a.onset_sizes):
            for backend, mode in (("dpdk", "fwd"), ("dpdk", "agg"), ("udp", "agg")):
                data["onset"].append(onset(backend, mode, size, rates, 2.0, tmp, tsc_hz))
    if "scaling" not in skip:
        layouts = ["1", "1,2"]
        if (os.cpu_count() or 1) < 3:
            # On CPUs 0,1 the ports lcore shares CPU 0 with the spinning generator: it measured 98.7%
            # loss (port_rx_missed) on 2 CPUs, a figure of the generator's CPU, not of the layout.
            print("scaling: 2 lcores need CPUs 1 and 2 beside the generator's CPU 0: skipped", flush=True)
            layouts = ["1"]
        for size in ints(a.scaling_sizes):
            for lcores in layouts:
                with Bed("dpdk", size, tmp, lcores=lcores) as bed:
                    r = run_once(bed, "agg", 0, a.seconds, tsc_hz)
                data["scaling"].append(r)
                print(json.dumps(r), flush=True)
    if a.perf:
        if not shutil.which("perf"):
            print(
                "--perf needs perf (Debian: linux-perf; scripts/install-deps.sh installs it)", file=sys.stderr
            )
            return 1
        Path(a.perf).mkdir(parents=True, exist_ok=True)
        for size in ints(a.perf_sizes):
            for mode in ("fwd", "agg"):
                data["profile"].append(profile(size, mode, a.seconds, tmp, Path(a.perf)))
    if a.json:
        Path(a.json).write_text(json.dumps(data, indent=1))
    report(data)
    return 0


def report(data: dict) -> None:
    cost = data["cost"]

    def cycles(backend, mode, size) -> dict[int, float]:
        return {
            r["rep"]: r["cycles_per_packet"]
            for r in cost
            if (r["backend"], r["mode"], r["size"]) == (backend, mode, size)
        }

    def median(xs) -> float:
        xs = sorted(x for x in xs if x == x)
        return statistics.median(xs) if xs else float("nan")

    def paired(num: dict, den: dict) -> float:
        return median(num[k] / den[k] for k in num if k in den)

    if cost:
        rate = cost[0]["offered_pps"]
        reps = len({r["rep"] for r in cost})
        print(
            f"\nCycles per packet at {rate / 1e3:.0f} kpps offered, median of {reps} ({data['cpus']} CPUs; "
            f"TSC {data['tsc_hz'] / 1e9:.2f} GHz); ratios: median of the ratios of runs side by side"
        )
        print("| frame | DPDK fwd | DPDK agg | agg / fwd | UDP backend agg | DPDK agg / UDP | max loss |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for size in sorted({r["size"] for r in cost}):
            f, g, u = cycles("dpdk", "fwd", size), cycles("dpdk", "agg", size), cycles("udp", "agg", size)
            loss = max(r["loss"] for r in cost if r["size"] == size)
            print(
                f"| {size} | {fmt(median(f.values()))} | {fmt(median(g.values()))} "
                f"| {fmt(paired(g, f), '.2f')} | {fmt(median(u.values()))} | {fmt(paired(g, u), '.2f')} "
                f"| {loss * 100:.2f}% |"
            )
    if data["onset"]:
        print("\nDrop onset (open loop, >= 0.1% of the generator's frames lost)")
        print("| frame | backend | mode | last rate without loss | onset |")
        print("|---:|---|---|---:|---:|")
        for o in data["onset"]:
            on = f"{o['onset_pps'] / 1e3:.0f} kpps" if o["onset_pps"] else "none (generator limit)"
            print(
                f"| {o['size']} | {o['backend']} | {o['mode']} "
                f"| {o['last_clean_pps'] / 1e3:.0f} kpps | {on} |"
            )
    if data.get("profile"):
        print("\nWhere the switch lcore's time goes (perf cpu-clock samples, generator at full speed)")
        sizes = sorted({p["size"] for p in data["profile"]})
        print("| part | " + " | ".join(f"{m} {s} B" for s in sizes for m in ("fwd", "agg")) + " |")
        print("|---|" + "---:|" * (2 * len(sizes)))
        for name, _ in PROFILE_GROUPS:
            cells = []
            for s in sizes:
                for m in ("fwd", "agg"):
                    p = next((p for p in data["profile"] if (p["size"], p["mode"]) == (s, m)), None)
                    cells.append(f"{p['shares'][name]:.1f}%" if p else "–")
            print(f"| {name} | " + " | ".join(cells) + " |")
    if data["scaling"]:
        print("\nScaling (generator at full speed on CPU 0; the switch's lcores on CPUs 1 and 2)")
        print("| frame | lcores | frames in | results out | cycles per packet (all lcores) | loss |")
        print("|---:|---|---:|---:|---:|---:|")
        for r in data["scaling"]:
            print(
                f"| {r['size']} | {r['lcores']} | {r['rx_pps'] / 1e3:.0f} kpps "
                f"| {r['out_pps'] / 1e3:.0f} kpps | {fmt(r['cycles_per_packet'])} | {r['loss'] * 100:.2f}% |"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "holder":
        holder(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
