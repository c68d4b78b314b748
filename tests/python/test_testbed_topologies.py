"""The testbed's topologies beyond the star (issue 10): switch machines s0.. for a sharded job, and racks
behind leaf machines routed to a spine. Each builds, carries a real gradswitch job (sums checked by every
rank), and comes down without leftovers; in racks, a rack's uplink carries one rack sum per allreduce."""

from __future__ import annotations

import re

import pytest
from _netns import require_netns, unique

from gradswitch.baselines.gradswitch_sys import CONTROL_PORT, run_workers, switch_daemon


@pytest.fixture(autouse=True)
def _netns():
    require_netns()


def _tb():
    from gradswitch import testbed

    return testbed


def test_sharded_topology_carries_a_job_over_two_switch_machines():
    t = _tb()
    name = unique("sh")
    with t.Testbed(workers=2, switches=2, rate="1gbit", switch_rate="300mbit", name=name) as tb:
        assert tb.hosts == ["w0", "w1", "host", "switch", "s0", "s1"]
        # the switch machines' links have their own rate, the workers' the testbed's
        qd = tb.exec("switch", ["tc", "qdisc", "show", "dev", tb.port("s1")]).stdout
        assert re.search(r"rate 300Mbit", qd), qd
        qd = tb.exec("switch", ["tc", "qdisc", "show", "dev", tb.port("w0")]).stdout
        assert re.search(r"rate 1Gbit", qd), qd
        with switch_daemon(tb, host="s0") as a, switch_daemon(tb, host="s1") as b:
            shards = f"{a.address},{b.address}"
            rs = run_workers(
                tb, [shards] * 2, 1 << 20, 2, 0, timeout=120, logs=lambda: a.log() + b.log()
            )
        assert [r["ok"] for r in rs] == [True, True], rs
    assert t.leftovers(name) == []


def test_racks_route_between_racks_and_each_uplink_carries_one_rack_sum():
    t = _tb()
    name = unique("rk")
    nbytes, total = 4 << 20, 2
    with t.Testbed(racks=2, workers_per_rack=2, rate="none", name=name) as tb:
        topo = tb.topology
        assert tb.hosts == ["w0", "w1", "w2", "w3", "leaf0", "leaf1", "spine"]
        tb.exec("w0", ["ping", "-c1", "-W2", tb.address("w3")])  # across racks, through the spine
        spine = switch_daemon(tb, host="spine", control_host="0.0.0.0")
        with spine:
            leaves = [
                switch_daemon(
                    tb, host=f"leaf{r}", extra_args=["--uplink", f"{topo.spine_address(r)}:{CONTROL_PORT}"]
                )
                for r in range(2)
            ]
            with leaves[0], leaves[1]:
                up = [topo.uplink_interfaces(r)[0] for r in range(2)]
                before = [tb.counters(host, dev) for host, dev in up]
                where = [leaves[topo.rack_of(f"w{r}")].address for r in range(4)]
                rs = run_workers(
                    tb, where, nbytes, total, 0, timeout=120,
                    logs=lambda: "".join(s.log() for s in (spine, *leaves)),
                )  # fmt: skip
                after = [tb.counters(host, dev) for host, dev in up]
        assert [r["ok"] for r in rs] == [True] * 4, rs
        for r in range(2):
            sent = after[r]["tx_bytes"] - before[r]["tx_bytes"]
            got = after[r]["rx_bytes"] - before[r]["rx_bytes"]
            print(f"rack {r}: uplink tx {sent} B, rx {got} B for {total} x {nbytes} B")
            # one rack sum up and one result down per allreduce (headers and barriers on top); a flat
            # job would move 2 workers' worth each way (>= 2 x nbytes x total)
            assert nbytes * total <= sent < 1.3 * nbytes * total
            assert nbytes * total <= got < 1.3 * nbytes * total
    assert t.leftovers(name) == []


def test_topology_arguments_are_checked():
    t = _tb()
    with pytest.raises(t.TestbedError, match="not both"):
        t.Testbed(workers=4, switches=2, racks=2, workers_per_rack=2)
    with pytest.raises(t.TestbedError, match="racks=2 x workers_per_rack=2"):
        t.Testbed(workers=3, racks=2, workers_per_rack=2)
    with pytest.raises(t.TestbedError, match="switch='bridge' only"):
        t.Testbed(workers=2, switches=2, switch="dpdk")
    with pytest.raises(t.TestbedError, match="switches must be in"):
        t.Testbed(workers=2, switches=51)
