"""Issue 14's figures, side by side in one run: what tenancy (random job ids in a hash table, the
source-address and element-type checks, CHALLENGE/AUTH) costs, and how much one tenant's flood of
forged DATA takes from another tenant's job.

    python3 bench/tenancy_bench.py --before /tmp/before/build --after build/test [--rounds 3]

--before and --after are CMake build directories of two checkouts (before: the parent of the data
plane's tenancy commit; after: the current tree), each with src/switch/gradswitchd,
bench/engine_bench and bench/switch_loopback built. Rounds alternate between the two builds so that
both see the same machine load (each first in every other round); tables give the best round of
each and the median (and range) of the rounds' paired ratios.

1. engine: `engine_bench --cpu-time` (Engine::ingest alone, no I/O; rates per second of the thread's
   CPU time, so that preemption by other programs does not count), hot packets: Mpps and ns/packet.
2. loopback: each build's gradswitchd (1 data thread) driven by its own `switch_loopback` (4 workers,
   window 128, 1472-byte datagrams): the switch's received packet rate.
3. join: control-plane JOIN latency (connect, JOIN world=1, OK, close; bench/control_join.py) on the
   before switch, the after switch, and the after switch with an auth file (CHALLENGE + AUTH first).
4. flood: the after switch's packet rate for one tenant's job (as in 2) alone, and while another
   process sends forged DATA (random job ids and keys, 1472 bytes) to the same data port as fast as
   it can; the flood's own rate is read from the switch's STATS (drops).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import secrets
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control_join import one_join  # noqa: E402

from gradswitch.local_switch import LocalSwitch  # noqa: E402

SWITCH, ENGINE, LOOPBACK = "src/switch/gradswitchd", "bench/engine_bench", "bench/switch_loopback"


def engine_mpps(build: Path, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [build / ENGINE, "--seconds", str(seconds), "--cpu-time"], capture_output=True, text=True, check=True
    )
    return {
        m[1]: float(m[2])
        for m in re.finditer(r"ingest (\w+)\s+\(hot\)\s+\S+ GB/s\s+([\d.]+) Mpps", out.stdout)
    }


def loopback_mpps(build: Path, address: str, seconds: float) -> float:
    cmd = [build / LOOPBACK, "--switch", address, *"--workers 4 --window 128 --seconds".split(), str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=seconds + 30)
    m = re.search(r"server in ([\d.]+) Mpps", out.stdout)
    if not m:
        raise SystemExit(f"switch_loopback printed no rate: {out.stdout}{out.stderr}")
    return float(m[1])


def flood(host: str, port: int, stop: multiprocessing.Event) -> None:
    """Forged DATA as an off-path tenant sends it: random job ids and keys, from its own socket."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    payload = bytes(1440)
    while not stop.is_set():
        for _ in range(1000):
            job_id, key = struct.unpack("<II", secrets.token_bytes(8))
            # magic, version, DATA, job_id, key, rank 0, slot 0, flags, float32, count 360 (wire.h)
            hdr = struct.pack(
                ">HBBIIHHBBHIIbbH", 0x4753, 2, 1, job_id, key, 0, 0, 0, 2, 360, 0, 0, -128, 0, 0
            )
            try:
                s.sendto(hdr + payload, (host, port))
            except OSError:
                pass  # a full socket buffer: keep going


def flooded_mpps(sw: LocalSwitch, build: Path, seconds: float) -> tuple[float, float]:
    """The job's packet rate while the flood runs, and the flood's rate as the switch counted it."""
    stop = multiprocessing.Event()
    flooder = multiprocessing.Process(target=flood, args=(sw.host, sw.data_port, stop), daemon=True)
    flooder.start()
    try:
        time.sleep(0.5)
        d0, t0 = sw.stats().get("drops", 0), time.monotonic()
        rate = loopback_mpps(build, sw.address, seconds)
        return rate, (sw.stats().get("drops", 0) - d0) / (time.monotonic() - t0)
    finally:
        stop.set()
        flooder.join()


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, required=True, help="build directory of the checkout before")
    p.add_argument("--after", type=Path, required=True, help="build directory of the checkout after")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--seconds", type=float, default=4, help="seconds per packet-rate run (default 4)")
    p.add_argument("--engine-seconds", type=float, default=0.5, help="engine_bench --seconds (default 0.5)")
    p.add_argument("--joins", type=int, default=200, help="JOINs per round and switch (default 200)")
    a = p.parse_args()
    builds = {"before": a.before.resolve(), "after": a.after.resolve()}
    for b in builds.values():
        for f in (SWITCH, ENGINE, LOOPBACK):
            if not (b / f).is_file():
                raise SystemExit(
                    f"{b / f} is missing: build gradswitchd, engine_bench and switch_loopback there"
                )
    tmp = Path(tempfile.mkdtemp(prefix="tenancy-bench-"))
    secret = secrets.token_hex(32)
    auth = tmp / "auth"
    auth.write_text(f"tenant bench secret={secret}\n")
    os.chmod(auth, 0o600)

    engine = {n: [] for n in builds}
    loop = {n: [] for n in builds}
    joins = {n: [] for n in ("before", "after", "after+auth")}
    alone, flooded, flood_pps = [], [], []
    switches = {
        n: LocalSwitch(threads=1, mtu=1500, binary=str(b / SWITCH), log_path=tmp / f"{n}.log")
        for n, b in builds.items()
    }
    switches["after+auth"] = LocalSwitch(
        threads=1,
        mtu=1500,
        binary=str(builds["after"] / SWITCH),
        extra_args=["--auth-file", str(auth)],
        log_path=tmp / "auth.log",
    )
    try:
        for sw in switches.values():
            sw.start()
        n_join = 0
        for r in range(a.rounds):
            order = list(builds.items())  # each build first in every other round: no bias from a trend
            for name, b in order if r % 2 == 0 else order[::-1]:
                engine[name].append(engine_mpps(b, a.engine_seconds))
            for name, b in order if r % 2 == 0 else order[::-1]:
                loop[name].append(loopback_mpps(b, switches[name].address, a.seconds))
            for name, sw in switches.items():
                creds = ("bench", secret) if name == "after+auth" else None
                for _ in range(a.joins):
                    n_join += 1
                    joins[name].append(one_join(sw.address, n_join, creds))
            for flooding in (False, True) if r % 2 == 0 else (True, False):
                if flooding:
                    rate, pps = flooded_mpps(switches["after"], builds["after"], a.seconds)
                    flooded.append(rate)
                    flood_pps.append(pps)
                else:
                    alone.append(loopback_mpps(builds["after"], switches["after"].address, a.seconds))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        for sw in switches.values():
            sw.stop()

    # The machine is shared: the best round of each is the least disturbed estimate of its cost, and
    # the ratios of the paired runs of one round (taken a few seconds apart) show the spread.
    def paired(xs: list[float], ys: list[float]) -> str:
        r = sorted(y / x for x, y in zip(xs, ys, strict=True))
        return f"{median(r):.3f} ({r[0]:.2f}–{r[-1]:.2f})"

    print(f"\nhost {socket.gethostname()}, {os.cpu_count()} CPUs, {a.rounds} rounds")
    print("best round of each; paired: median (min–max) over rounds of the ratio of a round's two runs\n")
    print("| engine, hot, per CPU second | before | after | after / before | paired | ns/packet added |")
    print("|---|---:|---:|---:|---:|---:|")
    for t in engine["before"][0]:
        xs, ys = [e[t] for e in engine["before"]], [e[t] for e in engine["after"]]
        b, f = max(xs), max(ys)
        print(
            f"| {t} | {b:.2f} Mpps | {f:.2f} Mpps | {f / b:.3f} | {paired(xs, ys)} "
            f"| {1e3 / f - 1e3 / b:+.1f} |"
        )
    b, f = max(loop["before"]), max(loop["after"])
    print("\n| switch over loopback (1 thread, 1472 B) | before | after | after / before | paired |")
    print("|---|---:|---:|---:|---:|")
    print(
        f"| packets received | {b:.3f} Mpps | {f:.3f} Mpps | {f / b:.3f} "
        f"| {paired(loop['before'], loop['after'])} |"
    )
    print("\n| JOIN latency | JOINs | median | p99 |")
    print("|---|---:|---:|---:|")
    for name, t in joins.items():
        t = sorted(t)
        print(
            f"| {name} | {len(t)} | {median(t) * 1e6:.0f} µs | {t[int(0.99 * (len(t) - 1))] * 1e6:.0f} µs |"
        )
    print(
        "\n| a tenant's job (after) | alone | another tenant floods forged DATA | flooded / alone | paired |"
    )
    print("|---|---:|---:|---:|---:|")
    print(
        f"| packets received | {max(alone):.3f} Mpps | {max(flooded):.3f} Mpps "
        f"(flood: median {median(flood_pps) / 1e6:.3f} Mpps dropped) | {max(flooded) / max(alone):.3f} "
        f"| {paired(alone, flooded)} |"
    )
    print(f"\nraw: engine={engine} loopback={loop} alone={alone} flooded={flooded} flood_pps={flood_pps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
