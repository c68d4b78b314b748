"""`gradswitch testbed up --switch dpdk` (issue 4, item 4): gradswitchd --backend dpdk in place of the
Linux bridge. Ping and TCP between hosts through it, an allreduce N = 2 with the Python API from inside
the worker namespaces, loss, the CLI, rollback when the daemon does not come up, and nothing left behind.

Skips with the reason when not root / no netns / no gradswitchd built with DPDK, unless
GRADSWITCH_REQUIRE_DPDK=1 (then it fails). ~30 s.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from _netns import netns_unavailable_reason, skip_or_fail, unique
from _tb_run import cli, last_json, tcp_run, udp_loss

ALLREDUCE = r"""
import json, sys, time
import numpy as np
import gradswitch

switch = sys.argv[1]
rank, world, n, iters = map(int, sys.argv[2:6])

def grad(r, it):
    return ((np.arange(n, dtype=np.int64) * 7 + r * 13 + it * 5) % 61 - 30).astype(np.float32)

times, ok = [], True
with gradswitch.connect(switch, job="tbdpdk", rank=rank, world_size=world, timeout=30) as g:
    for it in range(iters):
        x = grad(rank, it)
        t0 = time.perf_counter()
        g.allreduce(x)
        times.append(time.perf_counter() - t0)
        ok = ok and bool(np.array_equal(x, sum(grad(r, it) for r in range(world))))
    st = g.stats()
print(json.dumps({"rank": rank, "ok": ok, "times": times, "retx": st.get("retransmissions", 0)}))
"""


def dpdk_unavailable_reason() -> str | None:
    why = netns_unavailable_reason()
    if why:
        return why
    from gradswitch import _tools

    missing = _tools.missing(["ethtool"])
    if missing:
        return f"not installed: {', '.join(missing)} (scripts/install-deps.sh installs it)"
    from gradswitch._paths import switch_binary

    try:
        b = switch_binary()
    except FileNotFoundError as e:
        return str(e)
    h = subprocess.run([b, "--backend", "dpdk", "--help"], capture_output=True, text=True)
    if "--agg-ip" not in h.stdout:
        return f"{b} was built without DPDK (install libdpdk-dev pkg-config and rebuild, or set GRADSWITCHD)"
    return None


@pytest.fixture(autouse=True)
def _dpdk():
    skip_or_fail(dpdk_unavailable_reason(), "GRADSWITCH_REQUIRE_DPDK")


def _tb():
    from gradswitch import testbed

    return testbed


def _stats(tb) -> dict:
    import time

    time.sleep(0.6)  # rewritten every 500 ms
    return dict(ln.split("=", 1) for ln in tb.stats_file.read_text().splitlines() if "=" in ln)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_dpdk_switch_ping_tcp_allreduce():
    t = _tb()
    name = unique("dp")
    tb = t.Testbed(workers=2, rate="1gbit", name=name, switch="dpdk")
    with tb:
        pid = tb.describe()["dpdk"]["pid"]
        assert pid and not _gone(pid)
        assert tb.address("switch") == "10.66.0.1" and tb.interface("switch") == t.core.TAP
        # no bridge; the switch-side veths carry no address, the daemon's tap carries .1
        assert tb.exec("switch", ["ip", "-o", "link", "show", "type", "bridge"]).stdout.strip() == ""
        addrs = tb.exec("switch", ["ip", "-o", "-4", "addr", "show"]).stdout
        assert all(tb.port(h) not in addrs for h in tb.endpoints), addrs
        assert f"{t.core.TAP}" in addrs and "10.66.0.1/24" in addrs, addrs
        for src, dst in (("w0", "w1"), ("w1", "host"), ("host", "switch"), ("switch", "w0")):
            tb.exec(src, ["ping", "-c1", "-W2", tb.address(dst)])
        r = tcp_run(tb, 0.5)
        assert r["bytes"] > 4 << 20, r
        before = _stats(tb)
        assert int(before["dpdk.l2_forwarded"]) > 3000, before
        # allreduce N = 2 through the DPDK switch with the Python API, run in the worker namespaces
        n = 1 << 20
        procs = [
            tb.popen(
                f"w{r}",
                [sys.executable, "-c", ALLREDUCE, "10.66.0.1:7700", r, 2, n, 3],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for r in range(2)
        ]
        res = [last_json(p) for p in procs]
        print("allreduce 4 MiB N=2 through DPDK, seconds:", [r["times"] for r in res])
        assert all(r["ok"] for r in res), res
        st = _stats(tb)
        epp = 1440 // 4
        assert int(st["engine.completed"]) >= 3 * ((n + epp - 1) // epp), st
        assert int(st["dpdk.agg_in"]) >= 2 * int(st["engine.completed"]), st
    assert t.leftovers(name) == []
    assert _gone(pid), f"gradswitchd {pid} still running after down"


def test_dpdk_loss_on_host_side():
    t = _tb()
    loss, count = 0.1, 4000
    with t.Testbed(workers=1, rate="none", loss=loss, name=unique("dl"), switch="dpdk") as tb:
        lost = udp_loss(tb, count)  # UDP does not see the host-side egress drop
        print(f"--switch dpdk: configured loss {loss}, measured {lost:.4f} over {count} datagrams")
        assert abs(lost - loss) < 0.03
        # the rules are on the host side, and they count
        rules = tb.exec("w0", ["nft", "list", "table", "netdev", "gs_loss"]).stdout
        assert "gs-eth0" in rules and "packets 0 " not in rules.split("chain up", 1)[1].split("}")[0]


def test_dpdk_daemon_failure_rolls_back():
    t = _tb()
    name = unique("df")
    tb = t.Testbed(workers=1, rate="100mbit", name=name, switch="dpdk", dpdk={"dpdk_args": ["--bogus"]})
    with pytest.raises(t.TestbedError, match="gradswitchd --backend dpdk"):
        tb.up()
    assert t.leftovers(name) == []
    tb = t.Testbed(workers=1, rate="100mbit", name=name, switch="dpdk", fail_at="dpdk")
    with pytest.raises(t.TestbedError, match="injected failure"):
        tb.up()
    assert t.leftovers(name) == []
    with pytest.raises(t.TestbedError, match="af_xdp"):
        t.Testbed(workers=1, mtu=9000, switch="dpdk", dpdk={"vdev": "af_xdp"})


def test_dpdk_cli_up_status_down():
    name = unique("dc")
    import gradswitch.testbed.core as core

    r = cli("up", "--name", name, "-n", "2", "--rate", "none", "--switch", "dpdk")
    assert r.returncode == 0, r.stdout + r.stderr
    pid = core.load_state(name).daemon_pid
    try:
        # the daemon outlives the `up` process
        assert not _gone(pid)
        r = cli("status")
        block = r.stdout.split(f"{name}:", 1)[1]
        assert "switch dpdk" in block and "running" in block and "NOT RUNNING" not in block, r.stdout
        r = cli("exec", "--name", name, "w0", "--", "ping", "-c1", "-W2", "w1")
        assert r.returncode == 0, r.stdout + r.stderr
    finally:
        r = cli("down", "--name", name)
    assert r.returncode == 0, r.stderr
    assert _tb().leftovers(name) == []
    assert _gone(pid)
