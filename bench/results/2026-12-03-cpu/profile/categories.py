"""Where the switch data thread's cpu-clock samples go, by kernel path (this folder's README):
python3 categories.py record-NAME.data (a `bench/cpu_bench.py --record` profile)."""

import re
import subprocess
import sys

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


def main(path: str) -> None:
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


if __name__ == "__main__":
    main(sys.argv[1])
