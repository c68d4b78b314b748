"""bench/torch_iteration.py on the emulated testbed: one rank per worker namespace, the switch in
the switch namespace, links shaped to --rate (issue 5's benchmark).

    sudo python3 bench/torch_testbed.py [--workers 4] [--rate 1gbit] \
        [--configs local,gloo-ddp,gs-ddp,gs-overlap:256] [--iters 5] [--out /tmp/torch-testbed]

Prints rank 0's report (iteration time per configuration, and the speed-up of gs-ddp over gloo-ddp).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from gradswitch._paths import switch_binary
from gradswitch.testbed import Testbed

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--configs", default="local,gloo-ddp,gs-ddp,gs-overlap:256")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--slots", type=int, default=256, help="gradswitchd --slots")
    p.add_argument("--out", type=Path, default=Path("/tmp/torch-testbed"))
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--stats", action="store_true", help="torch_iteration.py --stats: per-rank counters")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    with Testbed(workers=a.workers, rate=a.rate, name="tt") as tb:
        with open(a.out / "switch.log", "w") as log:
            sw = tb.popen(
                "switch",
                [
                    switch_binary(),
                    "--control-host",
                    tb.address("switch"),
                    "--insecure",  # the testbed's own namespaces
                    "--threads",
                    "1",
                    "--slots",
                    str(a.slots),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        time.sleep(1)
        procs = []
        for r in range(a.workers):
            cmd = [
                sys.executable,
                str(HERE / "torch_iteration.py"),
                "--rank",
                str(r),
                "--world-size",
                str(a.workers),
                "--master-addr",
                tb.address("w0"),
                "--master-port",
                "29500",
                "--switch",
                f"{tb.address('switch')}:7700",
                "--configs",
                a.configs,
                "--iters",
                str(a.iters),
                "--warmup",
                "1",
                "--threads",
                "1",
                "--json",
                str(a.out / f"rank{r}.json"),
            ] + (["--stats"] if a.stats else [])
            with open(a.out / f"rank{r}.log", "w") as log:
                # gloo binds to the address of the namespace's link, not the hostname's
                procs.append(
                    tb.popen(
                        f"w{r}",
                        cmd,
                        env={"GLOO_SOCKET_IFNAME": "gs-eth0"},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
        codes = [proc.wait(timeout=a.timeout) for proc in procs]
        sw.terminate()
        sw.wait()
    print((a.out / "rank0.log").read_text()[-2000:])
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
