"""What an operator sees of a running gradswitchd: its log as JSON lines (--log-format json), and its
Prometheus metrics (--metrics-port), checked against STATS, by promtool and by a real Prometheus server."""

from __future__ import annotations

import datetime
import json
import socket
import subprocess
import time

import numpy as np
import pytest
from _prometheus import query, start_prometheus
from _ranks import in_threads
from _raw_job import contribute, join_raw

from gradswitch.daemon import parse_metrics
from gradswitch.local_switch import LocalSwitch


def test_json_log_lines(tmp_path):
    sw = LocalSwitch(
        extra_args=["--log-format", "json", "--log-level", "debug"], log_path=tmp_path / "sw.log"
    )
    with sw:
        ctl = socket.create_connection(("127.0.0.1", sw.control_port), timeout=5)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        ctl.sendall(
            f"JOIN job=logjob world=1 rank=0 wire=float32 token=t port={udp.getsockname()[1]}\n".encode()
        )
        assert ctl.recv(4096).startswith(b"OK")
        ctl.sendall(b'NOPE "quoted"\tand tab\n')  # answered with an error, logged at debug
        assert ctl.recv(4096).startswith(b"ERR")
        ctl.close()
        udp.close()
    lines = [ln for ln in sw.log().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    for r in records:
        assert set(r) == {"time", "level", "logger", "pid", "msg"}, r
        assert r["level"] in ("error", "warn", "info", "debug") and r["logger"] == "gradswitchd"
        assert r["pid"] == records[0]["pid"]
        when = datetime.datetime.strptime(r["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        assert (
            abs(when - datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)).total_seconds()
            < 600
        ), r
    msgs = [r["msg"] for r in records]
    assert msgs[0].startswith("gradswitchd ") and ": control 127.0.0.1:" in msgs[0]
    assert any("job 'logjob'" in m and "started" in m for m in msgs), msgs
    assert any(r["level"] == "debug" and "ERR bad_request" in r["msg"] for r in records), msgs
    assert msgs[-1].startswith("gradswitchd: stopped after")


# ------------------------------------------------------------------------------------ metrics


def _prometheus(tmp_path, targets: list[str]):
    """A real Prometheus server scraping `targets` (host:port) every second; (process, its URL)."""
    return start_prometheus(
        tmp_path,
        "  - job_name: gradswitch\n    static_configs:\n"
        f"      - targets: [{', '.join(repr(t) for t in targets)}]\n",
    )


def _wait(what: str, fn, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
            if value:
                return value
        except OSError:
            value = None
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s (last: {value!r})")
        time.sleep(0.2)


def test_metrics_match_stats_pass_promtool_and_reach_prometheus(tmp_path):
    import gradswitch
    from gradswitch import _tools
    from gradswitch.daemon import Daemon

    n, iters = 100_000, 5
    with Daemon(threads=2, metrics_port=0, log_path=tmp_path / "sw.log") as d:
        prom, prom_url = _prometheus(tmp_path, [f"127.0.0.1:{d.metrics_port}"])
        try:
            groups = in_threads(
                lambda r: gradswitch.connect(d.address, job="metered", rank=r, world_size=2, timeout=30)
            )
            in_threads(lambda r: [groups[r].allreduce(np.ones(n, np.float32)) for _ in range(iters)])
            job_id = int(next(j for j in d.jobs() if ":metered:" in j).split(":")[0])
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b"XX" + bytes(40), ("127.0.0.1", d.data_port))  # garbage: bad_magic
            _wait("the garbage datagram counted", lambda: d.stats().get("drop.bad_magic") == 1)
            # a stuck job: rank 0's contribution waits for rank 1, which sends nothing
            ctl, udp, stuck_id, key = join_raw(d, "stuck", 2)
            contribute(d, udp[0], stuck_id, key, rank=0, slot=0, seq=0, threads=2)
            _wait("the stuck round open", lambda: d.metric("gradswitch_open_rounds") == 1)

            text = d.metrics()
            check = subprocess.run(
                [_tools.require("promtool"), "check", "metrics"],
                input=text,
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
            m = parse_metrics(text)
            total, job = d.stats(), d.stats(job_id)
            labels = {"job_name": "metered", "job_id": str(job_id)}

            def get(name, **lab):
                return m.get((name, frozenset(lab.items())))

            assert get("gradswitch_rounds_completed_total") == total["completed"] > 0
            assert get("gradswitch_received_packets_total") == total["pkts_in"]
            assert get("gradswitch_sent_bytes_total") == total["bytes_out"]
            assert get("gradswitch_dropped_packets_total", reason="bad_magic") == 1
            assert get("gradswitch_job_rounds_completed_total", **labels) == job["completed"]
            assert get("gradswitch_job_received_packets_total", **labels) == job["pkts_in"]
            assert get("gradswitch_round_duration_seconds_count") == total["completed"]
            assert get("gradswitch_job_allreduce_duration_seconds_count", **labels) == iters
            assert get("gradswitch_job_allreduce_duration_seconds_bucket", le="+Inf", **labels) == iters
            assert get("gradswitch_job_allreduce_duration_seconds_sum", **labels) > 0
            assert get("gradswitch_jobs", state="running") == 2 and get("gradswitch_jobs_started_total") == 2
            assert get("gradswitch_memory_reserved_bytes") > 0
            stuck = {"job_name": "stuck", "job_id": str(stuck_id)}
            assert get("gradswitch_job_open_rounds", **stuck) == 1
            age = get("gradswitch_job_oldest_open_round_seconds", **stuck)
            assert age > 0 and get("gradswitch_job_oldest_open_round_seconds", **labels) == 0
            assert get("gradswitch_job_rank_lag_allreduces", **stuck) == 1  # rank 1 never sent (-1)
            assert d.metric("gradswitch_job_oldest_open_round_seconds", **stuck) > age  # it keeps growing

            # the real Prometheus server scraped the same series
            q = 'gradswitch_job_rounds_completed_total{job_name="metered"}'
            res = _wait("Prometheus has the job's series", lambda: query(prom_url, q))
            assert float(res[0]["value"][1]) == job["completed"]
            assert res[0]["metric"]["job"] == "gradswitch" and res[0]["metric"]["job_id"] == str(job_id)
            assert _wait("up", lambda: query(prom_url, 'up{job="gradswitch"} == 1'))
            assert _wait(
                "the stuck job", lambda: query(prom_url, "gradswitch_job_oldest_open_round_seconds > 0")
            )

            # the job's series go with the job: the label sets stay bounded
            for g in groups:
                g.close()
            for c in ctl:
                c.close()
            _wait("the jobs gone", lambda: d.jobs() == [])
            text = d.metrics()
            assert 'job_name="metered"' not in text and 'job_name="stuck"' not in text
            assert (
                parse_metrics(text)[("gradswitch_jobs_aborted_total", frozenset({("reason", "rank_left")}))]
                == 1
            )
        finally:
            prom.terminate()
            prom.wait(10)


def test_metrics_options(tmp_path):
    from gradswitch.daemon import Daemon, SwitchError

    with Daemon(log_path=tmp_path / "a.log") as d:  # off by default
        assert "metrics" not in d.log()
        with pytest.raises(SwitchError, match="no metrics endpoint"):
            d.metrics()
    with Daemon(metrics_port=0, log_path=tmp_path / "b.log") as d:
        assert f"metrics on http://127.0.0.1:{d.metrics_port}/metrics" in d.log()
        # the port is taken: a clear error, not a half-started switch
        clash = Daemon(metrics_port=d.metrics_port, log_path=tmp_path / "c.log")
        with pytest.raises(SwitchError, match="--metrics-port"):
            clash.start()
    bad = Daemon("--metrics-port", "7700", control_port=7700, data_port=7701, log_path=tmp_path / "d.log")
    with pytest.raises(SwitchError, match="is the control port"):
        bad.start()
