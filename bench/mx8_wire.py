"""The mx8 wire against float32 and bfloat16 on the emulated testbed (issue 38 part 2): one allreduce
of a 94 MB float32 gradient through gradswitchd, 4 workers, 1 Gbit/s links, the wires alternated
round by round (A, B, C, A, B, C, ...) so that the machine's load falls on each alike.

    sudo flock /tmp/gradswitch-netns.lock python3 bench/mx8_wire.py [--rounds 3] [--iters 3] [--mb 94]

Each round runs every wire once (a fresh switch each: gradswitch.baselines' gradswitch system), `iters`
timed allreduces after one warm-up; a run's time is the median over iterations of the slowest rank's.
Reported per wire: the median and the range over rounds, the ratio to float32 in each round (median,
range), and the byte bound: the payload's bytes plus 60 bytes of headers per packet on each link, at the
link's rate. Every rank checks its sums: exactly for float32 and bfloat16 (the gradients are small
integers), within mx8's rounding (MX8_MAX_ERR, docs/protocol.md 2.2) for mx8.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from gradswitch.baselines import run
from gradswitch.testbed import Testbed

WIRES = ("float32", "bfloat16", "mx8")
HEADERS = 20 + 8 + 32  # IPv4, UDP, gradswitch
PAYLOAD = 1500 - HEADERS
# mx8 rounds each rank's gradient (integers up to 30: steps of 2 in [16, 32), 28-30 saturating to 28)
# by at most 2, and the sum of 4 (up to 120) once by at most 8 (steps of 8, saturation at 112): 16.
MX8_MAX_ERR = 16.0


def wire_bytes(wire: str, nbytes: int) -> int:
    """Bytes one link carries each way for a float32 tensor of `nbytes` on `wire` (headers included)."""
    n = nbytes // 4
    per, size = {"float32": (360, 4), "bfloat16": (720, 2), "mx8": (1376, None)}[wire]
    packets = -(-n // per)
    payload = n * size if size else n + -(-n // 32)
    return payload + packets * HEADERS


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--mb", type=float, default=94.0, help="tensor size in MB (10^6 bytes)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--out", default=None, help="results folder (default: print only)")
    a = p.parse_args(argv)
    nbytes = int(a.mb * 1e6) // 4 * 4
    rate_bps = 1e9 if a.rate == "1gbit" else float(a.rate.rstrip("bit").replace("m", "e6").replace("g", "e9"))
    runs: list[dict] = []
    with Testbed(workers=a.workers, rate=a.rate, name="mx8b") as tb:
        for rnd in range(a.rounds):
            for wire in WIRES:
                t0 = time.time()
                res = run("gradswitch", tb, nbytes, a.iters, a.workers, wire=wire, timeout=600)
                checked = res.ok or (
                    wire == "mx8" and res.max_err <= MX8_MAX_ERR and len(res.times) == a.iters
                )
                rec = {
                    "round": rnd,
                    "wire": wire,
                    "median_s": statistics.median(res.times),
                    "times_s": res.times,
                    "max_err": res.max_err,
                    "checked": checked,
                    "wall_s": time.time() - t0,
                }
                runs.append(rec)
                print(json.dumps(rec), flush=True)
                if not checked:
                    print(f"wrong sums on {wire}: max error {res.max_err}", file=sys.stderr)
                    return 1
    report = summarize(runs, nbytes, rate_bps)
    print(report)
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(
            json.dumps({"args": vars(a), "nbytes": nbytes, "runs": runs}, indent=1)
        )
        (out / "summary.md").write_text(report + "\n")
    return 0


def summarize(runs: list[dict], nbytes: int, rate_bps: float) -> str:
    lines = [
        "| wire | median ms | range ms | vs float32 (median, range) | byte bound ms | of the bound |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    f32 = {r["round"]: r["median_s"] for r in runs if r["wire"] == "float32"}
    for wire in WIRES:
        ts = [r["median_s"] for r in runs if r["wire"] == wire]
        ratios = [f32[r["round"]] / r["median_s"] for r in runs if r["wire"] == wire]
        bound = wire_bytes(wire, nbytes) * 8 / rate_bps
        med = statistics.median(ts)
        lines.append(
            f"| {wire} | {med * 1e3:.0f} | {min(ts) * 1e3:.0f}-{max(ts) * 1e3:.0f} | "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) | {bound * 1e3:.0f} | "
            f"{bound / med:.0%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
