"""JOIN latency on a switch with an auth file while thousands of idle control connections are held
(issue 34, finding 5), side by side for two gradswitchd binaries (e.g. main and a change).

    python3 bench/join_under_idle.py --binary main=/path/to/main/gradswitchd \\
        --binary new=/path/to/new/gradswitchd \\
        [--idle 4096] [--addresses 16] [--rounds 5] [--joins 20] [--json out.json]

Each switch runs on loopback (1 data thread) with an auth file of one tenant. The attacker: `--idle`
connections to each switch, from 127.0.0.1..127.0.0.<addresses> in turn, that send nothing. Before every
round it tops its connections up (those the switch closed are opened again), as an attacker holding them
would. One JOIN = connect from 127.0.0.1, CHALLENGE, AUTH, `JOIN world=1`, read the reply, close;
a JOIN the switch refuses or a connection it closes counts as refused (the reply is recorded). First a
round without idle connections on each switch, for reference; then rounds alternate between the
switches (the order flips each round) so that both see the same machine load. The table gives per
switch and phase the JOINs that succeeded, the median and 90th percentile of their latency, and the
replies of the refused ones.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gradswitch.control import ControlConnection
from gradswitch.local_switch import LocalSwitch


class Flood:
    """Idle connections to one switch from several loopback addresses."""

    def __init__(self, port: int, count: int, addresses: int):
        self.port, self.count = port, count
        self.addresses = [f"127.0.0.{1 + i}" for i in range(addresses)]
        self.socks: list[socket.socket] = []
        self.opened = 0

    def top_up(self) -> int:
        """Drops the connections the switch closed and opens new ones up to `count`; how many it opened."""
        alive = []
        for s in self.socks:
            s.setblocking(False)
            try:
                data = s.recv(4096)
            except BlockingIOError:
                alive.append(s)  # nothing said: still held
                continue
            except OSError:
                data = b""
            s.close()  # an ERR line or EOF: the switch closed it
            del data
        self.socks = alive
        opened = 0
        while len(self.socks) < self.count:
            s = socket.socket()
            s.bind((self.addresses[self.opened % len(self.addresses)], 0))
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", self.port))
            except OSError:
                s.close()
                break
            self.socks.append(s)
            self.opened += 1
            opened += 1
        return opened

    def close(self):
        for s in self.socks:
            s.close()
        self.socks = []


def one_join(address: str, n: int, credentials: tuple[str, str]) -> tuple[float | None, str]:
    """(seconds from connect to the JOIN's OK, or None when refused; the reply or error)."""
    t0 = time.perf_counter()
    try:
        with ControlConnection(address, credentials=credentials, timeout=15) as c:
            reply = c.request(f"JOIN job=j{n} world=1 rank=0 wire=float32 token=t port=9")
    except Exception as e:  # a refusal at connect or AUTH arrives as an exception of the client
        return None, str(e).split("\n")[0][:160]
    if not reply.startswith("OK "):
        return None, reply[:160]
    return time.perf_counter() - t0, "OK"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--binary", action="append", required=True, help="NAME=PATH of a gradswitchd (once or more)"
    )
    p.add_argument("--idle", type=int, default=4096, help="idle connections held per switch (default 4096)")
    p.add_argument("--addresses", type=int, default=16, help="source addresses 127.0.0.1.. (default 16)")
    p.add_argument("--joins", type=int, default=20, help="JOINs per round and switch (default 20)")
    p.add_argument(
        "--rounds", type=int, default=5, help="alternating rounds under idle connections (default 5)"
    )
    p.add_argument("--json", help="write every sample here")
    a = p.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = (a.idle + 256) * len(a.binary) + 1024
    if hard != resource.RLIM_INFINITY and hard < need:
        raise SystemExit(f"RLIMIT_NOFILE's hard limit {hard} is below the {need} descriptors this needs")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))  # the switches inherit it
    tmp = Path(tempfile.mkdtemp(prefix="join-under-idle-"))
    secret = secrets.token_hex(32)
    auth_file = tmp / "auth"
    auth_file.write_text(f"tenant bench secret={secret}\n")
    os.chmod(auth_file, 0o600)
    creds = ("bench", secret)
    switches = {}
    for spec in a.binary:
        name, _, path = spec.partition("=")
        switches[name] = LocalSwitch(
            threads=1, binary=path, extra_args=["--auth-file", str(auth_file)], log_path=tmp / f"{name}.log"
        )
    samples: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    refused: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    floods: dict[str, Flood] = {}
    n = 0

    def round_of(name: str, phase: str):
        nonlocal n
        for _ in range(a.joins):
            n += 1
            dt, what = one_join(switches[name].address, n, creds)
            if dt is None:
                refused[(name, phase)][what] += 1
            else:
                samples[(name, phase)].append(dt)

    try:
        for sw in switches.values():
            sw.start()
        for name in switches:
            round_of(name, "no idle connections")
        for name, sw in switches.items():
            floods[name] = Flood(sw.control_port, a.idle, a.addresses)
        names = list(switches)
        for r in range(a.rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                opened = floods[name].top_up()
                print(
                    f"round {r + 1}/{a.rounds} {name}: {len(floods[name].socks)} idle held ({opened} opened)",
                    file=sys.stderr,
                )
                round_of(name, f"{a.idle} idle connections")
    finally:
        for f in floods.values():
            f.close()
        for sw in switches.values():
            sw.stop()
    print(f"| switch | phase | JOINs OK | median | p90 | refused (reply) | (host {socket.gethostname()}) |")
    print("|---|---|---:|---:|---:|---|---|")
    for name, phase in sorted({*samples, *refused}, key=lambda k: (k[1], k[0])):
        t = sorted(samples.get((name, phase), []))
        total = len(t) + sum(refused[(name, phase)].values())
        med = f"{statistics.median(t) * 1e3:.2f} ms" if t else "-"
        p90 = f"{t[min(len(t) - 1, int(0.9 * len(t)))] * 1e3:.2f} ms" if t else "-"
        why = "; ".join(f"{c}x {w}" for w, c in refused[(name, phase)].most_common()) or "-"
        print(f"| {name} | {phase} | {len(t)}/{total} | {med} | {p90} | {why} | |")
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "args": vars(a),
                    "samples_s": {f"{k[0]} / {k[1]}": v for k, v in samples.items()},
                    "refused": {f"{k[0]} / {k[1]}": dict(v) for k, v in refused.items()},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
