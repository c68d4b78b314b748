"""The worker's log level (GRADSWITCH_LOG, src/worker/log.h): silent by default, what the group joined
and how it ended at info, a line per operation at debug, every line naming host, pid and rank."""

from __future__ import annotations

import os
import re
import subprocess
import sys

SCRIPT = """
import sys, numpy as np, gradswitch
with gradswitch.connect(sys.argv[1], job="logged", rank=0, world_size=1) as g:
    g.allreduce(np.ones(1000, np.float32))
"""


def run(address: str, level: str | None) -> str:
    env = dict(os.environ)
    env.pop("GRADSWITCH_LOG", None)
    if level is not None:
        env["GRADSWITCH_LOG"] = level
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, address], capture_output=True, text=True, env=env, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


def test_levels(switch):
    assert "gradswitch " not in run(switch.address, None)  # default warn: nothing to say
    info = run(switch.address, "info")
    prefix = r"gradswitch info \[[^\]:]+:\d+ rank 0\] job 'logged' \(job_id \d+, rank 0 of 1\)"
    assert re.search(prefix + r" joined at 127\.0\.0\.1:\d+: wire float32, 256 slots of 1440 B", info), info
    assert re.search(prefix + r" left after 1 allreduce\(s\), 3 packets sent, 0 retransmission", info), info
    assert "debug" not in info
    debug = run(switch.address, "DEBUG")
    assert re.search(
        r"gradswitch debug \[.*rank 0\] job 'logged' .*: allreduce of 1000 float32 elements "
        r"\(seq 0, 3 chunks of float32, switch, 0 retransmission\(s\), adaptive window \d+ rounds, "
        r"base rtt \d+ us\) done in [0-9.]+ ms",
        debug,
    ), debug
    bad = run(switch.address, "loud")
    assert "GRADSWITCH_LOG=loud is not one of error, warn, info, debug; using warn" in bad, bad
