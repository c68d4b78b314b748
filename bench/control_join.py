"""Control-plane JOIN latency, side by side: two gradswitchd binaries (e.g. before and after a change),
and on the second optionally with an auth file (CHALLENGE + AUTH before the JOIN).

    python3 bench/control_join.py --binary A=/path/before/gradswitchd --binary B=/path/after/gradswitchd \\
        [--auth B] [--joins 400] [--rounds 5]

Every switch runs on loopback with 1 data thread. One JOIN = open a TCP connection, (authenticate,) send
`JOIN world=1`, read the OK (the job starts at once: a world-1 job), close (the job ends). Rounds
alternate between the switches so that both see the same machine load; the table gives the median
and 99th percentile per switch over all rounds, in microseconds.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gradswitch.control import ControlConnection
from gradswitch.local_switch import LocalSwitch


def one_join(address: str, n: int, credentials: tuple[str, str] | None) -> float:
    """Seconds from connect to the JOIN's OK."""
    t0 = time.perf_counter()
    with ControlConnection(address, credentials=credentials) as c:
        reply = c.request(f"JOIN job=j{n} world=1 rank=0 wire=float32 token=t port=9")
        if not reply.startswith("OK "):
            raise SystemExit(f"JOIN failed at {address}: {reply}")
        dt = time.perf_counter() - t0
    return dt


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--binary", action="append", required=True, help="NAME=PATH of a gradswitchd (twice)")
    p.add_argument("--auth", action="append", default=[], help="NAME of a switch to run with an auth file")
    p.add_argument("--joins", type=int, default=400, help="JOINs per round and switch (default 400)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="control-join-"))
    secret = secrets.token_hex(32)
    auth_file = tmp / "auth"
    auth_file.write_text(f"tenant bench secret={secret}\n")
    os.chmod(auth_file, 0o600)
    switches = {}
    for spec in a.binary:
        name, _, path = spec.partition("=")
        extra = ["--auth-file", str(auth_file)] if name in a.auth else []
        switches[name] = LocalSwitch(threads=1, binary=path, extra_args=extra, log_path=tmp / f"{name}.log")
    times: dict[str, list[float]] = {name: [] for name in switches}
    try:
        for sw in switches.values():
            sw.start()
        n = 0
        for r in range(a.rounds):
            for name, sw in switches.items():
                creds = ("bench", secret) if name in a.auth else None
                for _ in range(a.joins):
                    n += 1
                    times[name].append(one_join(sw.address, n, creds))
            print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    finally:
        for sw in switches.values():
            sw.stop()
    print(f"| switch | JOINs | median | p99 | (host {socket.gethostname()}) |")
    print("|---|---:|---:|---:|---|")
    for name, t in times.items():
        t = sorted(t)
        p99 = t[min(len(t) - 1, int(0.99 * len(t)))]
        what = "CHALLENGE + AUTH + JOIN" if name in a.auth else "JOIN"
        print(f"| {name} | {len(t)} | {statistics.median(t) * 1e6:.0f} µs | {p99 * 1e6:.0f} µs | {what} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
