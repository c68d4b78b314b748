"""Bounded-time rounds end to end (docs/protocol.md §3.1, connect(deadline_us=...)): a late rank no
longer holds the others' rounds, every rank still ends with bitwise the same values, the worker
rescales float chunks and counts what its rounds missed, a rank missing again and again is reported,
and the JOIN options are validated and must agree."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from _ranks import in_threads

import gradswitch
from gradswitch import timeline

WORLD = 3
SIZE = 1000  # three chunks at the default MTU (358 float32 per packet with the trailer's room)
LATE_S = 0.3  # rank 2 starts its allreduces this late: far past the deadline


def _job(sw, name: str, **kw) -> list[gradswitch.Group]:
    return in_threads(
        lambda r: gradswitch.connect(f"127.0.0.1:{sw.control_port}", name, r, WORLD, timeout=10, **kw),
        WORLD,
    )


def _late_allreduces(groups, rounds: int, dtype=np.float32):
    """Each rank allreduces (rank + 1) * [1, 2, ...] `rounds` times, rank 2 LATE_S behind the others
    every time; per rank, (its results, its Handle.missed() per allreduce)."""

    def body(r):
        out, missed = [], []
        for k in range(rounds):
            if r == WORLD - 1:
                time.sleep(LATE_S)
            x = (np.arange(1, SIZE + 1) * (r + 1) + k).astype(dtype)
            h = groups[r].allreduce_async(x)
            h.wait()
            out.append(x)
            missed.append(h.missed())
        return out, missed

    return in_threads(body, WORLD)


def _run(sw, name: str, *runs, **kw):
    """Joins a job, runs _late_allreduces for each (rounds, dtype) of `runs`; their results and the
    ranks' stats() after them."""
    groups = _job(sw, name, **kw)
    try:
        results = [_late_allreduces(groups, rounds, dtype) for rounds, dtype in runs]
        return results, [g.stats() for g in groups]
    finally:
        for g in groups:
            g.close()


def test_a_late_rank_gets_the_same_partial_sum_rescaled(start_switch, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADSWITCH_TIMELINE", str(tmp_path / "tl.json"))
    (results,), stats = _run(
        start_switch(), "late", (2, np.float32), deadline_us=20_000, quorum=2, straggler_report=2
    )
    for r in range(WORLD):  # the timeline's allreduce spans say what each allreduce missed
        doc = json.loads((tmp_path / f"tl.rank{r}.json").read_text())
        spans = [s for s in timeline.spans(doc) if s["name"] == "allreduce"]
        assert [(s["args"]["missed"], s["args"]["missing_ranks"]) for s in spans] == [(3, 4), (3, 4)], spans
    chunks = -(-SIZE // 358)
    for k in range(2):
        # Ranks 0 and 1 made the deadline, rank 2 did not: (1 + 2) parts of 3, scaled by 3 / 2.
        present = (np.arange(1, SIZE + 1) * 3 + 2 * k).astype(np.float32)
        want = present * np.float32(WORLD / 2)
        for r in range(WORLD):
            got = results[r][0][k]
            assert got.tobytes() == results[0][0][k].tobytes(), f"rank {r} differs in allreduce {k}"
            np.testing.assert_allclose(got, want, rtol=1e-6)
            assert results[r][1][k] == chunks, (r, k, results[r][1])
    for r in range(WORLD):
        assert stats[r]["partial_results"] == 2 * chunks, stats[r]
        assert stats[r]["missed_contributions"] == 2 * chunks, stats[r]
        assert stats[r]["straggler_reports"] == 1, stats[r]  # rank 2, two allreduces in a row


def test_int32_is_left_as_summed_and_rescale_false_leaves_floats(start_switch):
    sw = start_switch()
    (ints,), _ = _run(sw, "ints", (1, np.int32), deadline_us=20_000, quorum=2)  # rescale on
    (floats,), _ = _run(sw, "norescale", (1, np.float32), deadline_us=20_000, quorum=2, rescale=False)
    for res, dtype in ((ints, np.int32), (floats, np.float32)):
        want = (np.arange(1, SIZE + 1) * 3).astype(dtype)
        for r in range(WORLD):
            np.testing.assert_array_equal(res[r][0][0], want)


def test_without_a_deadline_every_rank_is_waited_for(start_switch):
    (results,), stats = _run(start_switch(), "exact", (1, np.float32))
    want = (np.arange(1, SIZE + 1) * 6).astype(np.float32)
    for r in range(WORLD):
        np.testing.assert_array_equal(results[r][0][0], want)
        assert results[r][1] == [0]
        assert stats[r]["partial_results"] == 0


def test_the_options_are_checked_and_must_agree(start_switch):
    sw = start_switch()
    addr = f"127.0.0.1:{sw.control_port}"
    with pytest.raises(ValueError, match="quorum= needs deadline_us="):
        gradswitch.connect(addr, "q", 0, 2, quorum=1)
    with pytest.raises(ValueError, match="deadline_us"):
        gradswitch.connect(addr, "q", 0, 2, deadline_us=0)
    with pytest.raises(ValueError, match="quorum"):
        gradswitch.connect(addr, "q", 0, 2, deadline_us=10, quorum=3)

    def body(r):
        try:
            gradswitch.connect(addr, "differ", r, 2, deadline_us=1000 * (r + 1), join_timeout=10).close()
        except gradswitch.GradswitchError as e:
            return str(e)
        return ""

    errors = in_threads(body, 2)
    assert any("deadline_us=" in e and "conflict" in e for e in errors), errors


@pytest.mark.parametrize("wire", ["float32", "fixed32"])
def test_a_conceding_rank_arrives_without_its_values(start_switch, wire):
    """Rank 2 concedes half its chunks (concede_keep=0.5, the policy's test hook: of each block of 64
    chunks, a run of 32 from a random place): those rounds close at once without it (the deadline, a
    minute, never fires: a round that waited for it would time the allreduce out), every rank holds
    the same bits, and each chunk is either the whole sum or ranks 0 and 1's rescaled by 3/2."""
    per = 358  # 4-byte elements per chunk: 1440 bytes less the trailer's 8
    n = per * 128
    sw = start_switch()
    addr = f"127.0.0.1:{sw.control_port}"
    groups = in_threads(
        lambda r: gradswitch.connect(
            addr, f"concede-{wire}", r, WORLD, wire=wire, timeout=10, deadline_us=60_000_000,
            concede_keep=0.5 if r == 2 else None,
        ),
        WORLD,
    )
    try:
        def body(r):
            x = (np.arange(1, n + 1) * (r + 1)).astype(np.float32)
            groups[r].allreduce(x)
            return x

        results = in_threads(body, WORLD)
        stats = [g.stats() for g in groups]
    finally:
        for g in groups:
            g.close()
    whole = (np.arange(1, n + 1) * 6).astype(np.float32)
    without = (np.arange(1, n + 1) * 3).astype(np.float32) * np.float32(1.5)
    partial = 0
    for c in range(n // per):
        part = slice(c * per, (c + 1) * per)
        got = results[0][part]
        if np.allclose(got, whole[part], rtol=1e-6):
            continue
        np.testing.assert_allclose(got, without[part], rtol=1e-6, err_msg=f"chunk {c}")
        partial += 1
    for r in range(WORLD):
        assert results[r].tobytes() == results[0].tobytes(), f"rank {r} differs"
        assert stats[r]["partial_results"] == partial, stats[r]
        assert stats[r]["conceded_rounds"] == (64 if r == 2 else 0), stats[r]
    assert partial == 64


def test_unsummed_takes_what_each_sum_lacked_of_this_rank(start_switch):
    """Group.allreduce_async(x, unsummed=u): rank 2 concedes half its chunks in one job and is late
    for every round in another; its u then holds its own values of exactly the chunks whose sums lack
    it (what error feedback sends in a later step), and the others' u are left untouched. Rescaled
    (the third job), u holds its values less the estimate of them in the rescaled sum."""
    per, n = 358, 358 * 128
    sw = start_switch()
    addr = f"127.0.0.1:{sw.control_port}"
    for how in ("concede", "late", "late-rescaled"):
        groups = in_threads(
            lambda r, how=how: gradswitch.connect(
                addr, f"unsummed-{how}", r, WORLD, timeout=10, rescale=how == "late-rescaled",
                deadline_us=60_000_000 if how == "concede" else 20_000, quorum=2,
                concede_keep=0.5 if how == "concede" and r == 2 else None,
            ),
            WORLD,
        )
        try:
            def body(r, how=how, groups=groups):
                if how.startswith("late") and r == 2:
                    time.sleep(LATE_S)
                x = (np.arange(1, n + 1) * (r + 1)).astype(np.float32)
                u = np.full(n, np.nan, dtype=np.float32)
                groups[r].allreduce_async(x, unsummed=u).wait()
                return x, u

            results = in_threads(body, WORLD)
        finally:
            for g in groups:
                g.close()
        mine = (np.arange(1, n + 1) * 3).astype(np.float32)  # rank 2's values: (2 + 1) * [1, 2, ...]
        whole, without = (np.arange(1, n + 1) * 6).astype(np.float32), mine  # 1 + 2 + 3, and 1 + 2
        if how == "late-rescaled":  # the sum of 1 + 2 times 3/2; rank 2 is estimated as 1.5 of it
            without = (np.arange(1, n + 1) * 4.5).astype(np.float32)
            mine = (np.arange(1, n + 1) * 1.5).astype(np.float32)
        lacking = 0
        for c in range(n // per):
            part = slice(c * per, (c + 1) * per)
            u = results[2][1][part]
            if np.isnan(u).all():  # its values are in this chunk's sum
                assert results[0][0][part].tobytes() == whole[part].tobytes(), f"{how}: chunk {c}"
                continue
            assert u.tobytes() == mine[part].tobytes(), f"{how}: chunk {c}"
            assert results[0][0][part].tobytes() == without[part].tobytes(), f"{how}: chunk {c}"
            lacking += 1
        assert lacking == (64 if how == "concede" else 128), (how, lacking)
        for r in (0, 1):
            assert np.isnan(results[r][1]).all(), f"{how}: rank {r}'s unsummed was written"
        for r in range(WORLD):
            assert results[r][0].tobytes() == results[0][0].tobytes(), f"{how}: rank {r} differs"


def test_unsummed_is_refused_where_it_cannot_be_filled(start_switch):
    addr = f"127.0.0.1:{start_switch().control_port}"
    g = gradswitch.connect(addr, "u-no-deadline", 0, 1, timeout=5)
    try:
        with pytest.raises(ValueError, match="unsummed= needs connect\\(deadline_us"):
            g.allreduce_async(np.ones(8, np.float32), unsummed=np.zeros(8, np.float32))
    finally:
        g.close()
    g = gradswitch.connect(addr, "u-deadline", 0, 1, timeout=5, deadline_us=10_000)
    try:
        for x, u in (
            (np.ones(8, np.float32), np.zeros(7, np.float32)),
            (np.ones(8, np.float64), np.zeros(8, np.float64)),
            (np.ones(8, np.float32), np.zeros(8, np.float64)),
        ):
            with pytest.raises(ValueError, match="unsummed= needs float32 x and unsummed of the same size"):
                g.allreduce_async(x, unsummed=u)
        x = np.ones(8, np.float32)
        u = np.full(8, 5.0, np.float32)
        g.allreduce_async(x, unsummed=u).wait()  # a job of one: every sum holds its rank
        assert (u == 5.0).all() and (x == 1.0).all()
    finally:
        g.close()


def test_concede_needs_a_deadline_and_a_share_in_range(start_switch):
    addr = f"127.0.0.1:{start_switch().control_port}"
    with pytest.raises(ValueError, match="concede= needs deadline_us="):
        gradswitch.connect(addr, "c", 0, 2, concede=True)
    with pytest.raises(ValueError, match="concede_keep"):
        gradswitch.connect(addr, "c", 0, 2, deadline_us=1000, concede_keep=1.5)
    with pytest.raises(TypeError, match="concede must be"):
        gradswitch.connect(addr, "c", 0, 2, deadline_us=1000, concede="yes")
