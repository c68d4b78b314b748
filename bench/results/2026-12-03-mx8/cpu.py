"""CPU on the testbed (each worker's, the switch's data thread), float32 and mx8, 94 MB, N = 4, 1 Gbit/s:
one launch, 3 timed allreduces per wire, the CPU summed over them (gradswitch.baselines' Result.extra).

    flock /tmp/gradswitch-netns.lock python3 bench/results/2026-12-03-mx8/cpu.py
"""

import json

from gradswitch.baselines import run
from gradswitch.testbed import Testbed

iters = 3
with Testbed(workers=4, rate="1gbit", name="mx8c") as tb:
    for wire in ("float32", "mx8"):
        res = run("gradswitch", tb, 94_000_000, iters, 4, wire=wire, timeout=600)
        ex = res.extra
        print(
            json.dumps(
                {
                    "wire": wire,
                    "times_s": res.times,
                    "worker_cpu_s": ex.get("worker_cpu_s"),
                    "switch_data_cpu_s": ex.get("switch_data_cpu_s"),
                    "switch_cpu_s": ex.get("switch_cpu_s"),
                    "iters": iters,
                }
            ),
            flush=True,
        )
