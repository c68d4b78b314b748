"""The metrics endpoint on a switch shared by tenants (issue 34, docs/security.md, docs/observability.md).

Each finding of the outside test as a test: `GET /metrics` answered anyone with every tenant's jobs;
its per-job drop reasons told a wrong key from a right key sent from the wrong address (a key oracle);
idle connections to the metrics port kept scrapes out; STATS totals showed anyone that jobs exist
and how fast they run; and `--metrics-host 0.0.0.0` was refused even with an auth file. Black box over
plain sockets: the bearer tokens are computed here with hashlib from docs/observability.md's formula,
not with the gradswitch package (whose `gradswitch metrics-token` is checked against them).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import socket
import subprocess
import time

import pytest
from _prometheus import metrics_token, start_prometheus
from _prometheus import query as prometheus_query
from test_switch_daemon import Daemon, daemon_path, data_packet, parse_ok, udp_socket, wait_for
from test_tenancy import AUTH_FILE, SECRETS, TenantJob, as_tenant

import gradswitch.daemon
from gradswitch.daemon import http_exchange, parse_metrics, pick_ports


def token(name: str) -> str:
    """The /metrics bearer token of an entry: HMAC-SHA-256(secret, "gradswitch-metrics-v1\\n" name)."""
    msg = f"gradswitch-metrics-v1\n{name}".encode()
    return hmac.new(SECRETS[name].encode(), msg, hashlib.sha256).hexdigest()


def almost(t: str) -> str:
    """The token with its last hex digit changed (the secrets are random: it may end in any digit)."""
    return t[:-1] + ("1" if t[-1] == "0" else "0")


class MeteredDaemon(Daemon):
    """test_switch_daemon's Daemon (a line-level connect()), with a metrics endpoint."""

    def __init__(self, tmp_path, *args: str):
        gradswitch.daemon.Daemon.__init__(
            self,
            *args,
            threads=2,
            binary=str(daemon_path()),
            metrics_port=0,
            log_path=tmp_path / f"gradswitchd-{time.monotonic_ns()}.log",
        )
        self.start()


@pytest.fixture
def metered(tmp_path):
    path = tmp_path / "auth"
    path.write_text(AUTH_FILE)
    path.chmod(0o600)
    d = MeteredDaemon(tmp_path, "--auth-file", str(path), "--join-timeout", "5")
    yield d
    rc = d.stop()
    print(f"--- gradswitchd log ---\n{d.log()[-4000:]}")
    assert rc == 0, f"gradswitchd exited {rc}"


def http_get(port: int, headers: str = "", method: str = "GET", path: str = "/metrics", timeout: float = 5.0):
    """(status code, header block, body) of one request to 127.0.0.1:port."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.settimeout(timeout)
        head, body = http_exchange(s, method, path, "t", headers)
    return int(head.split()[1]), head.decode(), body.decode()


def scrape(d, who: str | None) -> str:
    """The metrics as the entry `who` sees them (None: without a credential); an HTTP error fails."""
    status, head, body = http_get(d.metrics_port, f"Authorization: Bearer {token(who)}\r\n" if who else "")
    assert status == 200, head
    return body


def test_metrics_need_a_bearer_token(metered):
    # Before: GET /metrics answered anyone, with every tenant's job names, ids and counters.
    job = TenantJob(metered, "alice", "train")
    refusals = [
        "",  # no credential
        "Authorization: Basic YWxpY2U6eA==\r\n",  # another scheme
        f"Authorization: Bearer {SECRETS['alice']}\r\n",  # the secret itself is no token
        f"Authorization: Bearer {almost(token('alice'))}\r\n",  # almost a token
    ]
    for headers in refusals:
        for method in ("GET", "HEAD"):
            status, head, body = http_get(metered.metrics_port, headers, method)
            assert status == 401, (headers, head)
            assert re.search(r"(?m)^WWW-Authenticate: Bearer realm=\"gradswitch\"", head), head
            assert ('error="invalid_token"' in head) == bool(headers), head
            assert "gradswitch_" not in body and "alice" not in body and str(job.job_id) not in body, body
    assert http_get(metered.metrics_port, path="/")[0] == 200  # the index page shows nothing
    assert f'job_name="alice/train",job_id="{job.job_id}"' in scrape(metered, "alice")
    job.close()


def test_a_tenants_token_shows_only_its_own_jobs_and_an_operators_every_job(metered):
    from gradswitch import _tools

    alice = TenantJob(metered, "alice", "train")
    bob = TenantJob(metered, "bob", "mine")
    alice.allreduce_round(slot=0, seq=0)
    bob.allreduce_round(slot=1, seq=0)
    views = {who: scrape(metered, who) for who in ("alice", "bob", "ops")}
    for who, text in views.items():
        check = subprocess.run(
            [_tools.require("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
        )
        assert check.returncode == 0 and not check.stdout.strip(), (who, check.stdout + check.stderr)
    for who, (own, foreign) in {"alice": (alice, bob), "bob": (bob, alice)}.items():
        m, text = parse_metrics(views[who]), views[who]
        name = "alice/train" if who == "alice" else "bob/mine"
        labels = frozenset({("job_name", name), ("job_id", str(own.job_id))})
        assert m[("gradswitch_job_rounds_completed_total", labels)] == 1, who
        assert str(foreign.job_id) not in text and ("bob/" if who == "alice" else "alice/") not in text, text
        # The switch-wide series move with every tenant's jobs: none for a tenant (the configuration only).
        names = {name for name, _ in m}
        assert names.isdisjoint(
            {
                "gradswitch_received_packets_total",
                "gradswitch_rounds_completed_total",
                "gradswitch_jobs",
                "gradswitch_jobs_started_total",
                "gradswitch_open_rounds",
                "gradswitch_memory_reserved_bytes",
                "gradswitch_control_connections",
                "process_cpu_seconds_total",
            }
        ), names
        assert not [n for n in names if n.startswith("gradswitch_udp_")], names
        assert m[("gradswitch_max_jobs", frozenset())] == 64
    ops = parse_metrics(views["ops"])
    assert ops[("gradswitch_jobs", frozenset({("state", "running")}))] == 2
    assert ops[("gradswitch_rounds_completed_total", frozenset())] == 2
    assert f'job_name="alice/train",job_id="{alice.job_id}"' in views["ops"]
    assert f'job_name="bob/mine",job_id="{bob.job_id}"' in views["ops"]
    assert ("gradswitch_dropped_packets_total", frozenset({("reason", "wrong_key")})) in ops
    alice.close()
    bob.close()


def _counters(text: str) -> dict:
    """The counters of a scrape (series ending in _total): gauges of time (idle, ages) move by themselves."""
    return {k: v for k, v in parse_metrics(text).items() if k[0].endswith("_total")}


def _reply(conn, line: str) -> dict[str, str] | str:
    """A request's OK reply as its keys, or the ERR line itself."""
    reply = conn.request(line)
    return parse_ok(reply) if reply.startswith("OK") else reply


def _delta(before, after):
    """What moved from one view to the next: None for an unchanged line, else per key the numeric
    difference (or both values), keys that appeared or vanished included."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return None if before == after else (before, after)
    out = {}
    for k in set(before) | set(after):
        b, a = before.get(k, 0), after.get(k, 0)
        if a == b:
            continue
        try:
            out[k] = float(a) - float(b)
        except (TypeError, ValueError):
            out[k] = (b, a)
    return out


def test_the_key_search_moves_nothing_a_non_operator_can_read(metered):
    # Finding 2: a guessed DATA packet moved the job's drops reason="wrong_key" when the key was wrong
    # and reason="bad_source" when it was right but sent from another address: a 2^32 search for the
    # key, one packet per guess. Here bob, who even knows alice's job id, sends each kind of guess; what
    # every non-operator can read (the metrics with bob's token, with alice's, STATS and STATUS on
    # bob's, an anonymous and alice's own connections) must move the same whatever the guess was.
    job = TenantJob(metered, "alice", "train")
    bob, anon, alice, op = (
        as_tenant(metered, "bob"),
        metered.connect(),
        as_tenant(metered, "alice"),
        as_tenant(metered, "ops"),
    )

    def non_operator_views() -> dict:
        rank_status = _reply(job.ctl[0], "STATUS")
        rank_status.pop("idle_ms")
        return {
            "metrics as bob": _counters(scrape(metered, "bob")),
            "metrics as alice": _counters(scrape(metered, "alice")),
            "STATS as bob": _reply(bob, "STATS"),
            "STATS job_id= as bob": _reply(bob, f"STATS job_id={job.job_id}"),
            "STATUS job_id= as bob": _reply(bob, f"STATUS job_id={job.job_id}"),
            "JOBS as bob": _reply(bob, "JOBS"),
            "STATS unauthenticated": _reply(anon, "STATS"),
            "STATS as alice": _reply(alice, "STATS"),
            "STATS job_id= as alice": _reply(alice, f"STATS job_id={job.job_id}"),
            "STATS job_id= as the rank": _reply(job.ctl[0], f"STATS job_id={job.job_id}"),
            "STATUS as the rank": rank_status,
        }

    guesses = {
        "unknown job": lambda s, n: data_packet(job.job_id ^ 0x5A5A, job.key, 0, 0, [1], seq=n),
        "wrong key": lambda s, n: data_packet(job.job_id, job.key ^ (n + 1), 0, 0, [1], seq=n),
        "right key, wrong source": lambda s, n: data_packet(job.job_id, job.key, 0, 0, [1], seq=n),
    }
    counted = {
        "unknown job": "drop.unknown_job",
        "wrong key": "drop.wrong_key",
        "right key, wrong source": "drop.bad_source",
    }
    moved, operator_moved = {}, {}
    with udp_socket() as s:
        for kind, packet in guesses.items():
            before, op_before = non_operator_views(), parse_ok(op.request("STATS"))
            for n in range(5):
                s.sendto(packet(s, n), ("127.0.0.1", job.port_of(0)))
            want = int(op_before[counted[kind]]) + 5
            wait_for(
                lambda key=counted[kind], want=want: int(parse_ok(op.request("STATS"))[key]) == want,
                f"the {kind} guesses counted",
            )
            after, op_after = non_operator_views(), parse_ok(op.request("STATS"))
            moved[kind] = {view: _delta(before[view], after[view]) for view in after}
            operator_moved[kind] = {
                k: v for k, v in op_after.items() if k.startswith("drop.") and v != op_before[k]
            }
    # The operator still sees the breakdown (so the guesses did reach different checks) ...
    assert operator_moved["wrong key"] != operator_moved["right key, wrong source"], operator_moved
    # ... no one else does: bob and anonymous users see nothing move at all, alice's views move alike.
    for view in moved["wrong key"]:
        assert moved["wrong key"][view] == moved["right key, wrong source"][view], (view, moved)
        if "alice" not in view and "rank" not in view:
            for kind in guesses:
                assert not moved[kind][view], (kind, view, moved[kind][view])
    # What alice's own view does show for either guess: packets reached her job and were rejected.
    assert moved["wrong key"]["STATS job_id= as the rank"] == {
        "pkts_in": 5,
        "bytes_in": 5 * 36,
        "drops": 5,
        "drop.rejected": 5,
    }, moved["wrong key"]
    job.allreduce_round(slot=0, seq=0)  # alice's job is unharmed
    for c in (bob, anon, alice, op):
        c.close()
    job.close()


def test_stats_totals_and_jobs_show_a_non_operator_only_what_it_may_see(metered):
    # Finding 7: STATS totals told anyone that jobs exist and how fast they run. A non-operator's total
    # is now over the jobs it may see; a tenant's credential sees its tenant's jobs, wherever used.
    job = TenantJob(metered, "alice", "train")
    for seq in range(3):
        job.allreduce_round(slot=seq, seq=seq)
    own = parse_ok(job.ctl[0].request(f"STATS job_id={job.job_id}"))
    with (
        as_tenant(metered, "bob") as bob,
        metered.connect() as anon,
        as_tenant(metered, "alice") as alice,
        as_tenant(metered, "ops") as op,
    ):
        for view in (parse_ok(bob.request("STATS")), parse_ok(anon.request("STATS"))):
            assert view["jobs"] == "0" and view["pkts_in"] == "0" and view["completed"] == "0", view
            assert "jobs_started" not in view and not [k for k in view if k.startswith(("udp.", "drop."))], (
                view
            )
        mine = parse_ok(alice.request("STATS"))  # alice's other connection: her jobs' sum
        assert mine["jobs"] == "1" and mine["completed"] == own["completed"] == "3", (mine, own)
        assert parse_ok(alice.request(f"STATUS job_id={job.job_id}"))["name"] == "alice/train"
        assert f"{job.job_id}:alice/train:2:running" in parse_ok(alice.request("JOBS"))["jobs"]
        assert parse_ok(bob.request("JOBS"))["jobs"] == ""
        assert bob.request(f"STATUS job_id={job.job_id}") == f"ERR not_found no job with id {job.job_id}"
        total = parse_ok(op.request("STATS"))
        assert total["jobs"] == "1" and int(total["completed"]) >= 3 and "jobs_started" in total, total
        assert "drop.wrong_key" in total and "udp.send_errors" in total
    job.close()


def _flood(port: int, idle: int, half: int) -> list[socket.socket]:
    """`idle` connections that send nothing and `half` that send half a request (non-blocking
    connects: a server that does not accept does not stall the flood)."""
    out = []
    for _ in range(idle + half):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    time.sleep(0.5)  # the connects' handshakes
    for s in out[idle:]:
        try:
            s.send(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")
        except OSError:
            pass  # not connected (yet): an idle one then
    return out


def test_idle_connections_do_not_keep_a_scrape_out(metered):
    # Finding 7: 64 idle connections to the metrics port made 5 of 7 scrapes fail. A scrape must be
    # answered within Prometheus' scrape timeout (4 s here, its default is 10 s) while they are held;
    # before, the switch did not even accept it until an idle one had timed out (5 s).
    job = TenantJob(metered, "alice", "train")
    flood = _flood(metered.metrics_port, idle=150, half=50)
    try:
        for _ in range(7):
            status, head, body = http_get(
                metered.metrics_port, f"Authorization: Bearer {token('ops')}\r\n", timeout=4.0
            )
            assert status == 200 and f'job_id="{job.job_id}"' in body, head
        # a half request times out: the switch closes it (within its 3 s deadline, or evicted before)
        s = flood[-1]
        s.setblocking(True)
        s.settimeout(10)
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
    finally:
        for s in flood:
            s.close()
    job.close()


def test_prometheus_scrapes_with_a_credentials_file(metered, tmp_path):
    # The real Prometheus server with `authorization: {credentials_file: ...}`: the operator's token
    # (written by `gradswitch metrics-token`) sees alice's job; bob's token gets his own view (up, no
    # series of alice); no credential gets 401 (up == 0).

    job = TenantJob(metered, "alice", "train")
    for seq in range(2):
        job.allreduce_round(slot=seq, seq=seq)
    printed = metrics_token("ops", secret=SECRETS["ops"])
    assert printed.strip() == token("ops"), printed
    (tmp_path / "ops.token").write_text(printed)
    (tmp_path / "bob.token").write_text(token("bob") + "\n")
    target = f"127.0.0.1:{metered.metrics_port}"
    scrape_configs = "".join(
        f"  - job_name: {name}\n    static_configs: [{{targets: ['{target}']}}]\n"
        + (
            f"    authorization: {{credentials_file: {tmp_path / (name + '.token')}}}\n"
            if name != "anon"
            else ""
        )
        for name in ("ops", "bob", "anon")
    )
    prom, url = start_prometheus(tmp_path, scrape_configs)

    def query(promql: str) -> list[dict]:
        return prometheus_query(url, promql)

    try:
        q = f'gradswitch_job_rounds_completed_total{{job="ops",job_name="alice/train",job_id="{job.job_id}"}}'
        res = wait_for(
            lambda: query(q), "Prometheus has alice's series through the operator's token", timeout=60
        )
        assert float(res[0]["value"][1]) == 2
        wait_for(lambda: query('up{job="bob"} == 1'), "bob's scrapes up", timeout=30)
        wait_for(lambda: query('up{job="anon"} == 0'), "the scrapes without a credential refused", timeout=30)
        wait_for(lambda: query('up{job="ops"} == 1'), "the operator's scrapes up", timeout=30)
        assert query('{job="bob",job_name="alice/train"}') == []
        assert query('gradswitch_max_jobs{job="bob"}')  # the configuration is everyone's
        assert query('{job="anon",__name__=~"gradswitch_.+"}') == []
    finally:
        prom.terminate()
        prom.wait(10)
    job.close()


def test_a_reachable_metrics_host_needs_an_auth_file_or_insecure(tmp_path):
    # docs/observability.md said `--metrics-host 0.0.0.0` lets Prometheus scrape; the switch refused it
    # without --insecure, even with an auth file. With one, scrapes need a token, so it is allowed.
    control, data, metrics = pick_ports(1, extra=1)
    base = [str(daemon_path()), "--control-port", str(control), "--data-port", str(data)]
    out = subprocess.run(
        [*base, "--metrics-port", str(metrics), "--metrics-host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert out.returncode == 2 and "--auth-file" in out.stderr and "--insecure" in out.stderr, out.stderr
    path = tmp_path / "auth"
    path.write_text(AUTH_FILE)
    path.chmod(0o600)
    d = gradswitch.daemon.Daemon(  # the options given last count: --metrics-host 0.0.0.0
        "--auth-file",
        str(path),
        "--metrics-host",
        "0.0.0.0",
        metrics_port=0,
        binary=str(daemon_path()),
        log_path=tmp_path / "sw.log",
    )
    try:
        d.start()
        assert "metrics on http://0.0.0.0:" in d.log()
        assert http_get(d.metrics_port)[0] == 401
        assert "gradswitch_max_jobs 64" in scrape(d, "bob")
    finally:
        d.stop()
