"""`gradswitch status` and `gradswitch top` against a running gradswitchd: a healthy job and a stuck one
(rank 0 contributed to a round, rank 1 sent nothing), the diagnosis in words, STATUS's open-round keys,
live rates, and clear errors for an unreachable switch or an unknown job."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from _ranks import in_threads
from _raw_job import contribute, join_raw

from gradswitch import cli
from gradswitch.daemon import Daemon

THREADS = 2


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def switch():
    with Daemon(threads=THREADS) as d:
        yield d


def _wait(what: str, fn, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s (last: {value!r})")
        time.sleep(0.1)


def test_status_names_the_ranks_a_stuck_job_waits_for(switch, capsys):
    import gradswitch

    d = switch
    groups = in_threads(
        lambda r: gradswitch.connect(d.address, job="healthy", rank=r, world_size=2, timeout=30)
    )
    ctl, udp = [], []
    try:
        in_threads(lambda r: [groups[r].allreduce(np.ones(1000, np.float32)) for _ in range(3)])
        ctl, udp, stuck_id, key = join_raw(d, "stuck", 3)
        # allreduce 0 completes (every rank), allreduce 1 waits at slot 5 for ranks 1 and 2
        for r in range(3):
            contribute(d, udp[r], stuck_id, key, r, 4, 0, THREADS)
        contribute(d, udp[0], stuck_id, key, 0, 5, 1, THREADS)

        # slots 4 and 5 belong to different data threads: wait until both have taken their packets
        def settled():
            st = d.status(stuck_id)
            ok = (
                st.get("rank_seq") == "1,0,0"
                and st.get("open_rounds") == "1"
                and st.get("oldest_slot") == "5"
            )
            return st if ok else None

        st = _wait("slot 4 complete and slot 5 open", settled)
        assert st["oldest_slot"] == "5" and st["oldest_seq"] == "1" and st["oldest_seen"] == "0", st
        assert st["peers"].split(",") == [f"127.0.0.1:{u.getsockname()[1]}" for u in udp], st
        healthy = d.status(int(next(j for j in d.jobs() if ":healthy:" in j).split(":")[0]))
        assert healthy["open_rounds"] == "0" and "oldest_slot" not in healthy, healthy

        _wait("the round a second old", lambda: int(d.status(stuck_id)["oldest_age_ms"]) >= 1000)
        rc, out, err = _run(capsys, "status", "--switch", d.address)
        assert rc == 0, err
        assert "job 'healthy'" in out and "job 'stuck'" in out, out
        blocks = {b.split("'")[1]: b for b in out.split("\n\n") if b.startswith("job '")}
        stuck_part, healthy_part = blocks["stuck"], blocks["healthy"]
        assert "  ok" in healthy_part and "!" not in healthy_part, out
        for u in udp:
            assert f"127.0.0.1:{u.getsockname()[1]}" in stuck_part, out
        assert "stalled: slot 5 (allreduce seq 1, offset 0)" in stuck_part, out
        assert "for rank 1 (127.0.0.1:" in stuck_part and ", rank 2 (127.0.0.1:" in stuck_part, out
        assert "rank 1 last sent allreduce seq 0" in stuck_part, out
        assert "contributed: 0" in stuck_part, out

        # one job by name; the others are not shown
        rc, out, err = _run(capsys, "status", "--switch", d.address, "stuck")
        assert rc == 0 and "job 'stuck'" in out and "healthy" not in out, out + err
    finally:
        for g in groups:
            g.close()
        for s in ctl + udp:
            s.close()
        _wait("the jobs gone", lambda: d.jobs() == [])


def test_top_shows_live_rates(switch, capsys):
    import gradswitch

    d = switch
    groups = in_threads(lambda r: gradswitch.connect(d.address, job="busy", rank=r, world_size=2, timeout=30))
    stop = threading.Event()
    done = [0, 0]
    # Both ranks decide together whether to run another allreduce: a rank that ran one more than
    # the other would wait for it until its timeout.
    go = [True]
    together = threading.Barrier(2, action=lambda: go.__setitem__(0, not stop.is_set()))

    def work(r: int) -> None:
        while True:
            together.wait(30)
            if not go[0]:
                return
            groups[r].allreduce(np.ones(10_000, np.float32))
            done[r] += 1

    threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    try:
        _wait("allreduces running", lambda: min(done) > 0)
        rc, out, err = _run(capsys, "top", "--switch", d.address, "-i", "1", "-n", "2")
    finally:
        stop.set()
        for t in threads:
            t.join(35)
        for g in groups:
            g.close()
        _wait("the jobs gone", lambda: d.jobs() == [])
    assert rc == 0, err
    frames = [f for f in out.split("gradswitch top") if f.strip()]
    assert len(frames) == 2, out
    rows = [ln for ln in frames[-1].splitlines() if ln.startswith("busy")]
    assert len(rows) == 1, frames[-1]
    cols = rows[0].split()
    # job, id, state, pkt/s in, pkt/s out, rounds/s, retx/s, drops/s, Gbit/s in, stall s
    assert cols[2] == "running" and float(cols[3]) > 0 and float(cols[5]) > 0, rows[0]
    switch_row = next(ln for ln in frames[-1].splitlines() if ln.startswith("(switch)"))
    # the total is read a moment before the job's counters: about the job's rate, not exactly
    assert float(switch_row.split()[3]) > 0, frames[-1]


def test_clear_errors(switch, capsys):
    from gradswitch.daemon import pick_ports

    rc, out, err = _run(capsys, "status", "--switch", switch.address, "no-such-job")
    assert rc == 1 and "no job 'no-such-job' at the switch" in err, err
    closed = pick_ports(0)[0]
    for argv in (["status"], ["top", "-n", "1"]):
        rc, out, err = _run(capsys, *argv, "--switch", f"127.0.0.1:{closed}")
        assert rc == 1 and f"cannot reach the switch at 127.0.0.1:{closed}" in err, err
    rc, out, err = _run(capsys, "status", "--switch", "nonsense")
    assert rc == 1 and "is not host:port" in err, err


def test_help(capsys):
    for cmd in ("status", "top"):
        with pytest.raises(SystemExit) as e:
            cli.main([cmd, "--help"])
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert "--switch" in out and "GRADSWITCH_SWITCH" in out
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "status" in out and "top" in out


def test_status_on_a_switch_with_tenants_shows_a_tenant_its_own_jobs(tmp_path, capsys, monkeypatch):
    import secrets as tokens

    import gradswitch

    TENANTS = (("tenant", "alice"), ("tenant", "bob"), ("operator", "ops"))  # noqa: N806
    keys = {name: tokens.token_hex(32) for _, name in TENANTS}
    auth = tmp_path / "auth"
    auth.write_text("".join(f"{kind} {who} secret={keys[who]}\n" for kind, who in TENANTS))
    auth.chmod(0o600)
    with Daemon("--auth-file", str(auth), threads=THREADS) as d:
        monkeypatch.setenv("GRADSWITCH_TENANT", "alice")
        monkeypatch.setenv("GRADSWITCH_SECRET", keys["alice"])
        with gradswitch.connect(d.address, job="train", rank=0, world_size=1) as g:
            g.allreduce(np.ones(10, np.float32))
            # a tenant sees its own jobs and their sums, an operator every job and the switch's totals
            # (docs/security.md); another tenant nothing of alice's
            for who, first in (
                ("alice", "tenant 'alice': 1 running"),
                ("bob", "tenant 'bob': 0 running"),
                ("ops", "switch: 1 running"),
            ):
                monkeypatch.setenv("GRADSWITCH_TENANT", who)
                monkeypatch.setenv("GRADSWITCH_SECRET", keys[who])
                rc, out, err = _run(capsys, "status", "--switch", d.address)
                assert rc == 0, err
                assert out.startswith(first), (who, out)
                assert ("job 'alice/train'" in out) == (who != "bob"), (who, out)
            monkeypatch.setenv("GRADSWITCH_SECRET", tokens.token_hex(32))  # a wrong secret
            rc, out, err = _run(capsys, "status", "--switch", d.address)
            assert rc == 1 and "refused tenant 'ops'" in err, err


def test_drop_reasons_line_lists_nonzero_reasons_in_order():
    from gradswitch.status import drop_reasons

    assert drop_reasons({"drops": 0, "drop.stale": 0}) == []
    counters = {"drops": 5, "drop.wrong_key": 2, "drop.stale": 3, "drop.short": 0, "pkts_in": 9}
    assert drop_reasons(counters) == ["  drops: stale 3, wrong_key 2"]


def test_diagnose_says_which_switch_the_leaving_rank_lost():
    from gradswitch.status import Job, diagnose

    st = {"state": "aborted", "abort_reason": "rank_left", "abort_rank": "0", "left": "0",
          "lost": "10.0.0.7:7700", "rank_seq": "3,3"}
    lines = diagnose(Job(job_id=1, name="j", world=2, state="aborted", status=st))
    assert lines[0] == (
        "aborted: rank_left (rank 0); rank 0 left because it lost the switch at 10.0.0.7:7700 "
        "(another switch of the job)"
    ), lines
