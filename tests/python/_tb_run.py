"""What the testbed tests (test_testbed.py, test_testbed_dpdk.py) run on a testbed: the `gradswitch
testbed` CLI, gradswitch.testbed.tools processes in a namespace, their JSON result, and TCP and
numbered UDP datagrams from one host to another."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m gradswitch.testbed *args`, with this test's gradswitch on its path; output captured."""
    import gradswitch.testbed.core as core

    path = os.pathsep.join([str(core.PYTHON_ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "gradswitch.testbed", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": path},
    )


def tool(tb, host, *args, **kw):
    """`python -m gradswitch.testbed.tools *args` in host's namespace, its output piped."""
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    return tb.python(host, "gradswitch.testbed.tools", *args, **pipes, **kw)


def last_json(p, timeout=60):
    """The JSON result a tool prints last; the tool must have succeeded."""
    so, se = p.communicate(timeout=timeout)
    assert p.returncode == 0, so + se
    return json.loads(so.strip().splitlines()[-1])


def tcp_run(tb, seconds):
    """TCP w0 -> w1 for `seconds`; the sink's JSON result (bytes, bits_per_second)."""
    sink = tool(tb, "w1", "tcp-sink", "--port", "5301", "--timeout", "20")
    assert "listening" in sink.stdout.readline()
    last_json(tool(tb, "w0", "tcp-source", "--to", f"{tb.address('w1')}:5301", "--seconds", str(seconds)))
    return last_json(sink)


def udp_run(tb, src, dst, count, burst=1, port=5303):
    """Send `count` numbered datagrams src -> dst, `burst` per send call; the sink's JSON result. The
    sender sees no send error (a drop on the link is silent to UDP without IP_RECVERR)."""
    sink = tool(tb, dst, "udp-sink", "--port", str(port), "--timeout", "10", "--idle", "0.5")
    assert "listening" in sink.stdout.readline()
    to = f"{tb.address(dst)}:{port}"
    args = ["--to", to, "--count", str(count), "--pps", "20000", "--size", "200", "--burst", str(burst)]
    assert last_json(tool(tb, src, "udp-source", *args))["send_errors"] == 0
    return last_json(sink)


def udp_loss(tb, count):
    """The share of `count` datagrams w0 -> switch that did not arrive (one link direction)."""
    return 1 - udp_run(tb, "w0", "switch", count, port=5302)["distinct"] / count
