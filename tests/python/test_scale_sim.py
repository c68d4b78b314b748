"""bench/scale_sim.py against closed forms it must match: pipelined store-and-forward times, the bytes a
layout puts on a link, recovery of a lost packet by the timer (docs/scaling.md, issue 10)."""

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "scale_sim.py"
_spec = importlib.util.spec_from_file_location("scale_sim", _PATH)
sim = importlib.util.module_from_spec(_spec)
sys.modules["scale_sim"] = sim
_spec.loader.exec_module(sim)

RATE = 1e9
DELAY = 5e-6
FRAME = 1440 + 60 + 14  # a full chunk on the wire


def _net(**kw):
    base = dict(rate=RATE, switch_rate=None, delay=DELAY, queue=None, host_queue=None, switch_pps=0.0)
    base.update(kw)
    return sim.Net(**base)


def _pipeline(chunks, hops):
    """Last chunk out of the first link after all chunks, then one store-and-forward per further hop."""
    per = FRAME * 8 / RATE
    return chunks * per + (hops - 1) * per + hops * DELAY


def test_one_worker_is_pipelined_store_and_forward():
    chunks = 200
    r = sim.simulate("flat", 1, chunks * 1440, _net(switch_rate=RATE))
    # worker link up, switch NIC in, switch NIC out, worker link down
    assert r["time_s"] == pytest.approx(_pipeline(chunks, 4), rel=1e-9)
    assert r["worker_link_bytes"] == [chunks * FRAME]


def test_flat_switch_at_n_times_the_rate_is_no_bottleneck():
    chunks, n = 100, 8
    one = sim.simulate("flat", 1, chunks * 1440, _net(switch_rate=RATE))["time_s"]
    many = sim.simulate("flat", n, chunks * 1440, _net(switch_rate=n * RATE))
    assert one == pytest.approx(_pipeline(chunks, 4), rel=1e-9)
    # the N copies of a chunk take one worker-packet time through the N-times-faster NIC, each way
    assert many["time_s"] == pytest.approx(one, rel=1e-9)


def test_flat_switch_at_the_workers_rate_takes_n_times_longer():
    chunks, n = 200, 4
    r = sim.simulate("flat", n, chunks * 1440, _net(switch_rate=RATE))
    assert r["time_s"] == pytest.approx(n * chunks * FRAME * 8 / RATE, rel=0.01)
    sharded = sim.simulate("sharded", n, chunks * 1440, _net(switch_rate=RATE), shards=n)
    # each shard's link carries M in and out; the last chunk's N copies in and N results out add 2N + 1
    per = FRAME * 8 / RATE
    assert sharded["time_s"] == pytest.approx(chunks * per + (2 * n + 1) * per + 4 * DELAY, rel=1e-6)


def test_two_level_puts_m_on_each_uplink_and_flat_puts_w_m():
    chunks, racks, rack = 50, 3, 4
    two = sim.simulate("two-level", racks * rack, chunks * 1440, _net(), rack=rack)
    assert two["uplink_bytes"] == [(chunks * FRAME, chunks * FRAME)] * racks
    flat = sim.simulate("flat-racks", racks * rack, chunks * 1440, _net(), rack=rack)
    assert flat["uplink_bytes"] == [(rack * chunks * FRAME, rack * chunks * FRAME)] * racks


def test_a_lost_chunk_costs_one_timeout():
    rto = 0.01
    clean = sim.simulate("flat", 1, 1440, _net(), rto=rto)["time_s"]
    assert clean == pytest.approx(_pipeline(1, 2), rel=1e-9)
    lost_up = sim.simulate("flat", 1, 1440, _net(drops={"w0.up": [0]}), rto=rto)
    assert lost_up["time_s"] == pytest.approx(rto + clean, rel=1e-9)
    # a lost result: the resent chunk is answered from the switch's copy of the result
    lost_down = sim.simulate("flat", 1, 1440, _net(drops={"w0.down": [0]}), rto=rto)
    assert lost_down["time_s"] == pytest.approx(rto + clean, rel=1e-9)
    assert lost_down["worker_link_bytes"] == [2 * FRAME]


def test_random_loss_completes_and_costs_time():
    chunks = 300
    clean = sim.simulate("two-level", 8, chunks * 1440, _net(), rack=4)["time_s"]
    lossy = sim.simulate("two-level", 8, chunks * 1440, _net(loss=0.01), rack=4, seed=3)
    assert lossy["dropped"] > 0
    assert lossy["time_s"] > clean
    assert all(up > chunks * FRAME for up, _ in lossy["uplink_bytes"])


def test_bad_layout_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown layout"):
        sim.simulate("ring", 4, 1440, _net())
