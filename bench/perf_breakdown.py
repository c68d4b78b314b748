"""Where the switch's data thread spends a datagram, from a `bench/cpu_bench.py --record` profile.

    python3 bench/perf_breakdown.py paths record-NAME.data   # cpu-clock samples by kernel path
    perf script -F tid,time,event,trace -i record-NAME.data > ev.txt   # a --record-events trace
    python3 bench/perf_breakdown.py sleeps ev.txt            # the thread's ppoll sleeps, recvmmsg batches

`paths` sums perf's children percentages of the kernel functions that each path enters (sleeping and
waking, recvmmsg and its copy, sendmmsg with its copy, delivery and wake-ups, the tbf softirq) and lists
the self time per object; `sleeps` takes the thread with the most events as the data thread and prints
its sleeps' quantiles and the GRO trains per receive call. BENCHMARKS.md §9 and
bench/results/2026-12-03-cpu/ show what they measured.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess

ROWS = [
    ("sleeping and waking (ppoll: schedule out and in)", ("__x64_sys_ppoll", "__x64_sys_poll")),
    ("recvmmsg", ("__x64_sys_recvmmsg",)),
    ("  of which the copy to user", ("_copy_to_iter",)),
    ("sendmmsg", ("__x64_sys_sendmmsg",)),
    ("  of which the copy from user (once per destination)", ("_copy_from_iter",)),
    ("  of which the delivery: bridge, tbf, veth, the worker's UDP receive", ("__dev_queue_xmit",)),
    ("    of which waking the worker (sock_def_readable)", ("sock_def_readable",)),
    ("softirq in interrupts (tbf releasing queued packets)", ("__irq_exit_rcu",)),
]


def paths(path: str) -> None:
    cmd = ["perf", "report", "-i", path, "--children", "--sort", "sym", "--stdio", "-g", "none"]
    out = subprocess.run(cmd, capture_output=True, text=True).stdout
    children = {}
    for ln in out.splitlines():
        m = re.match(r"\s+([\d.]+)%\s+([\d.]+)%\s+\[.\]\s+(\S+)", ln)
        if m:
            children[m.group(3)] = float(m.group(1))
    for label, syms in ROWS:
        print(f"{sum(children.get(s, 0.0) for s in syms):5.1f}%  {label}")
    cmd = ["perf", "report", "-i", path, "--no-children", "--sort", "dso", "--stdio", "-g", "none"]
    for ln in subprocess.run(cmd, capture_output=True, text=True).stdout.splitlines():
        if "%" in ln and not ln.startswith("#"):
            print("self", ln.strip())


def sleeps_of(path: str) -> None:
    rows = [ln.split(None, 3) for ln in open(path) if ln.strip()]
    tid = collections.Counter(r[0] for r in rows).most_common(1)[0][0]
    sleeps, batches, entered = [], [], None
    for r in rows:
        if r[0] != tid or len(r) < 3:
            continue
        t, ev = float(r[1].rstrip(":")), r[2].rstrip(":")
        if ev.endswith("enter_ppoll"):
            entered = t
        elif ev.endswith("exit_ppoll") and entered is not None:
            sleeps.append((t - entered) * 1e6)
            entered = None
        elif ev.endswith("exit_recvmmsg") and len(r) > 3 and int(r[3], 16) < 1 << 63:
            batches.append(int(r[3], 16))
    sleeps.sort()
    q = {p: sleeps[int(p * (len(sleeps) - 1))] for p in (0.1, 0.25, 0.5, 0.75, 0.9)}
    print(f"ppolls {len(sleeps)}, us: " + ", ".join(f"p{int(p * 100)} {v:.0f}" for p, v in q.items()))
    for lim in (5, 10, 20, 50, 100, 200, 500):
        print(f"  <= {lim} us: {sum(1 for x in sleeps if x <= lim)}")
    print(f"recvmmsg that returned datagrams: {len(batches)}, messages (GRO trains) per call:")
    print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(collections.Counter(batches).items())))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    sub.add_parser("paths", help="cpu-clock samples by kernel path").add_argument("perf_data")
    sub.add_parser("sleeps", help="ppoll sleeps and recvmmsg batches").add_argument("perf_script_text")
    a = p.parse_args()
    if a.what == "paths":
        paths(a.perf_data)
    else:
        sleeps_of(a.perf_script_text)


if __name__ == "__main__":
    main()
