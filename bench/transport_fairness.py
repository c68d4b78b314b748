#!/usr/bin/env python3
"""Two jobs sharing one switch (issue 17): each job alone, then both at once, on one loopback
`gradswitchd`; Jain's fairness index of their goodputs while shared, and their total against one job
alone. Every rank checks every sum (`gradswitch bench`).

    PYTHONPATH=<build> python3 bench/transport_fairness.py [--window adaptive|fixed] [-n 2]
        [--size 16M] [--iters 20] [--slots 256] [--out FILE.json]

Each job's goodput is the slowest rank's mean allreduce time over its run; both jobs start together
and run the same number of allreduces, so most of their runs overlap. Run it under
`flock /tmp/gradswitch-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys

from gradswitch.local_switch import LocalSwitch

ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)")


def start_job(address: str, job: str, a) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "import sys; from gradswitch.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["bench", "--switch", address, "--job", job, "-n", str(a.workers), "--size", a.size]
    cmd += ["--iters", str(a.iters), "--window", a.window]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/tmp")


def goodput(p: subprocess.Popen) -> float:
    out, _ = p.communicate(timeout=600)
    rows = [m.groups() for m in map(ROW.match, out.splitlines()) if m]
    if p.returncode != 0 or not rows or "all results exact: OK" not in out:
        raise SystemExit(f"a job failed:\n{out[-2000:]}")
    return min(float(r[3]) for r in rows)  # Gbit/s of the slowest rank


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--window", choices=("adaptive", "fixed"), default="adaptive")
    p.add_argument("-n", "--workers", type=int, default=2, help="ranks per job (default 2)")
    p.add_argument("--size", default="16M")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--slots", type=int, default=None, help="daemon --slots (default: its own)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    with LocalSwitch(threads=1, slots=a.slots) as sw:
        alone = [goodput(start_job(sw.address, f"alone{i}", a)) for i in range(2)]
        procs = [start_job(sw.address, f"shared{i}", a) for i in range(2)]
        shared = [goodput(q) for q in procs]
    jain = sum(shared) ** 2 / (len(shared) * sum(x * x for x in shared))
    res = {
        "window": a.window,
        "alone_gbps": alone,
        "shared_gbps": shared,
        "jain": round(jain, 3),
        "total_over_alone": round(sum(shared) / (sum(alone) / len(alone)), 3),
    }
    print(json.dumps(res))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"argv": sys.argv, **res}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
