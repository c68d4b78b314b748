"""Emulated cluster: creation/removal leaves nothing behind (also after a failure half way), hosts reach
each other, and rate, loss, duplication and reordering take effect."""

from __future__ import annotations

import re
import subprocess

import pytest
from _netns import require_netns, unique
from _tb_run import cli, tcp_run, udp_loss, udp_run


@pytest.fixture(autouse=True)
def _netns():
    require_netns()


def _tb():
    from gradswitch import testbed

    return testbed


def test_up_down_leaves_nothing():
    t = _tb()
    name = unique("ud")
    tb = t.Testbed(workers=3, rate="1gbit", loss=0.01, name=name)
    with tb:
        assert {tb.netns(h) for h in tb.hosts} <= set(
            subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        )
        assert name in t.list_testbeds()
        # a process left running in a namespace must not keep anything alive
        tb.popen("w1", ["sleep", "60"])
    assert t.leftovers(name) == []
    assert name not in t.list_testbeds()


@pytest.mark.parametrize("step", ["netns:w1", "link:host", "shape:w0", "loss", "dup", "reorder", "up"])
def test_failure_half_way_rolls_back(step):
    t = _tb()
    name = unique("fl")
    tb = t.Testbed(workers=2, rate="100mbit", loss=0.05, dup=0.05, reorder=0.05, name=name, fail_at=step)
    with pytest.raises(t.TestbedError, match="injected failure"):
        tb.up()
    assert t.leftovers(name) == []


def test_down_from_another_process_and_cli():
    name = unique("cl")
    r = cli("up", "--name", name, "-n", "2", "--rate", "none")
    assert r.returncode == 0, r.stderr
    try:
        r = cli("status")
        assert name in r.stdout and "MISSING" not in r.stdout.split(name, 1)[1].split("\n\n")[0]
        r = cli("exec", "--name", name, "w0", "--", "ping", "-c1", "-W2", "w1")
        assert r.returncode == 0, r.stdout + r.stderr
        r = cli("up", "--name", name)
        assert r.returncode == 1 and "already exists" in r.stderr
    finally:
        r = cli("down", "--name", name)
    assert r.returncode == 0, r.stderr
    assert _tb().leftovers(name) == []


def test_clear_error_when_not_root(monkeypatch):
    t = _tb()
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(t.TestbedError, match="needs root"):
        t.check_environment()


def test_ping_and_tcp_between_hosts():
    t = _tb()
    with t.Testbed(workers=2, rate="1gbit", name=unique("pt")) as tb:
        for src, dst in (("w0", "w1"), ("w1", "host"), ("host", "switch"), ("switch", "w0")):
            tb.exec(src, ["ping", "-c1", "-W2", tb.address(dst)])
        r = tcp_run(tb, 0.3)
        assert r["bytes"] > 1 << 20


@pytest.mark.parametrize("rate_mbit", [200])
def test_rate_takes_effect(rate_mbit):
    t = _tb()
    with t.Testbed(workers=2, rate=f"{rate_mbit}mbit", name=unique("rt")) as tb:
        r = tcp_run(tb, 2)
        got = r["bits_per_second"] / 1e6
        print(f"configured {rate_mbit} Mbit/s, TCP goodput {got:.1f} Mbit/s")
        # goodput is ~95% of the wire rate (headers); tbf's bucket lets the first ~100 KB through at once
        assert 0.85 * rate_mbit <= got <= 1.03 * rate_mbit


def test_loss_takes_effect():
    t = _tb()
    loss, count = 0.1, 4000
    with t.Testbed(workers=1, rate="none", loss=loss, name=unique("ls")) as tb:
        lost = udp_loss(tb, count)
        print(f"configured loss {loss}, measured {lost:.4f} over {count} datagrams (one link direction)")
        assert abs(lost - loss) < 0.03  # ~5 binomial sigmas
        # ping crosses the link twice (request and reply): success ~ (1-p)^2
        out = tb.exec(
            "w0", ["ping", "-q", "-c", "300", "-i", "0.002", "-W", "1", tb.address("switch")], check=False
        ).stdout
        recv = int(out.split(" received")[0].rsplit(" ", 1)[-1])
        assert abs(recv / 300 - (1 - loss) ** 2) < 0.1, out


def _udp_copies(tb, src, dst, count):
    """(distinct, extra copies per distinct datagram) of `count` datagrams src -> dst."""
    r = udp_run(tb, src, dst, count)
    return r["distinct"], r["received"] / max(r["distinct"], 1) - 1


@pytest.fixture(scope="module")
def dup_tb():
    require_netns()
    t = _tb()
    with t.Testbed(workers=2, rate="1gbit", dup=0.3, name=unique("dp")) as tb:
        yield tb


def test_dup_takes_effect(dup_tb):
    """Each link direction delivers a copy of p of the packets, and only one: a copy that were copied
    again (the egress rule seeing its own copy) would give p/(1-p) = 0.43 extra instead of 0.3."""
    tb, dup, count = dup_tb, 0.3, 4000
    assert tb.describe()["dup"] == dup and not tb.link.offloads_on()
    for src, dst, hops in (("w0", "switch", 1), ("switch", "w0", 1), ("w0", "w1", 2)):
        distinct, extra = _udp_copies(tb, src, dst, count)
        want = (1 + dup) ** hops - 1  # w0 -> w1 crosses two link directions, each copying independently
        print(f"{src} -> {dst}: dup {dup} per direction, measured {extra:.4f} extra (want {want:.2f})")
        assert distinct >= 0.98 * count  # no loss configured (a loaded receiver may miss a few)
        assert abs(extra - want) < 0.05, (src, dst, extra)  # binomial sigma ~0.007 (0.013 for 2 hops)


def test_allreduce_exact_over_duplicating_links(dup_tb):
    """30% of DATA and of results arrive twice: every sum stays exact, and the switch saw the copies."""
    from gradswitch.baselines import run

    r = run("gradswitch", dup_tb, 1_000_004, iters=2, workers=2, timeout=60)
    sw, w = r.extra["switch"], r.extra["workers"]
    copies = sw["pkts_in"] - w["packets_sent"]
    seen = sw["duplicates"] + sw["retx_answered"] + sw["drop.stale_round"]
    print(r.summary(), f"sent {w['packets_sent']}, switch got {sw['pkts_in']} (+{copies}), recognised {seen}")
    assert r.ok and r.max_err == 0.0 and len(r.times) == 2
    assert copies > 0.2 * w["packets_sent"], (sw, w)  # ~30% of DATA arrived twice
    # every copy (and every resend) found its contribution already counted or its round answered
    assert seen >= copies, (sw, w)


def test_reorder_takes_effect():
    """A reordered packet arrives after the rest of its sender's burst (one UDP_SEGMENT send), never
    later, and nothing is lost or copied; a sender of single datagrams sees no reordering."""
    t = _tb()
    p, count, burst = 0.2, 4000, 20
    with t.Testbed(workers=1, rate="1gbit", reorder=p, name=unique("ro")) as tb:
        assert tb.describe()["reorder"] == p and not tb.link.offloads_on()
        for src, dst in (("w0", "switch"), ("switch", "w0")):
            r = udp_run(tb, src, dst, count, burst)
            late = r["late"] / count
            want = p * (burst - 1) / burst  # the last packet of a burst has nothing to fall behind
            print(f"{src} -> {dst}: reorder {p}, bursts of {burst}: late {late:.4f} (want {want:.3f}), {r}")
            assert r["received"] == r["distinct"] >= 0.98 * count
            assert abs(late - want) < 0.04, r
            assert 0 < r["displacement"]["p100"] < burst, r
            r = udp_run(tb, src, dst, 1000)  # one datagram per send: the backlog is empty each time
            assert r["late"] == 0, r
        # the packets the rules diverted, both directions (nft counters): about p of those sent
        rules = tb.exec("switch", ["nft", "list", "table", "netdev", "gs_reorder"]).stdout
        diverted = sum(int(n) for n in re.findall(r"counter packets (\d+)", rules))
        assert abs(diverted / (2 * (count + 1000)) - p) < 0.04, rules


def test_allreduce_exact_over_reordering_links():
    t = _tb()
    from gradswitch.baselines import run

    with t.Testbed(workers=2, rate="1gbit", reorder=0.2, name=unique("ra")) as tb:
        r = run("gradswitch", tb, 1_000_004, iters=2, workers=2, timeout=60)
        rules = tb.exec("switch", ["nft", "list", "table", "netdev", "gs_reorder"]).stdout
    diverted = sum(int(n) for n in re.findall(r"counter packets (\d+)", rules))
    sw = r.extra["switch"]
    print(r.summary(), f"switch got {sw['pkts_in']}, sent {sw['pkts_out']}, diverted {diverted}")
    assert r.ok and r.max_err == 0.0 and len(r.times) == 2
    assert diverted > 0.1 * (sw["pkts_in"] + sw["pkts_out"]), rules  # ~20% of DATA and RESULTs


def test_dup_validated():
    t = _tb()
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(t.TestbedError, match=r"dup .*\[0, 1\)"):
            t.Testbed(workers=1, dup=bad)
        with pytest.raises(t.TestbedError, match=r"reorder .*\[0, 1\)"):
            t.Testbed(workers=1, reorder=bad)
    with pytest.raises(t.TestbedError, match="emulated on the bridge and sharded topologies only"):
        t.Testbed(racks=1, workers_per_rack=1, dup=0.1)
    with pytest.raises(t.TestbedError, match="emulated on the bridge and sharded topologies only"):
        t.Testbed(workers=1, dup=0.1, switch="dpdk")
    with pytest.raises(t.TestbedError, match="reorder 0.1: .* only, not racks"):
        t.Testbed(racks=1, workers_per_rack=1, reorder=0.1)
