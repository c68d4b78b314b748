"""A switch shared by tenants (issue 14, docs/security.md): each attack a malicious tenant tried, as a test.

Black box over plain sockets, with an independent client written from docs/protocol.md (the HMAC
proofs of §1.5 are computed here with hashlib, not with the gradswitch package): authentication,
job names scoped by tenant, quotas, what a connection may see, the operator's ABORT, DATA from
another address, the withdrawal of a connection that queued megabytes, the JOIN wire binding the
element types, and the refusal to serve a reachable address anonymously.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import resource
import secrets
import socket
import struct
import subprocess
import time

import pytest
from test_switch_daemon import (
    HEADER,
    MAGIC,
    MSG_DATA,
    VERSION,
    Daemon,
    Job,
    daemon_path,
    data_packet,
    parse_ok,
    serve,
    udp_socket,
    wait_for,
)

# carol is in no file here: test_tenancy_reload adds her.
SECRETS = {name: secrets.token_hex(32) for name in ("alice", "bob", "ops", "carol")}
AUTH_FILE = f"""# the tenants of a shared switch
defaults max_jobs=8
tenant alice secret={SECRETS["alice"]}
tenant bob   secret={SECRETS["bob"]} max_jobs=2 max_memory=16M   # a small quota
operator ops secret={SECRETS["ops"]}
"""
FLOAT16 = 4
CLIENT, SWITCH = "gradswitch-auth-v1 client", "gradswitch-auth-v1 switch"  # the proofs' labels (§1.5)


def proof(label: str, secret: str, tenant: str, nonce: str, cnonce: str) -> str:
    msg = f"{label}\n{tenant}\n{nonce}\n{cnonce}".encode()
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest()


def auth_line(tenant: str, secret: str, nonce: str, cnonce: str) -> str:
    return f"AUTH tenant={tenant} cnonce={cnonce} proof={proof(CLIENT, secret, tenant, nonce, cnonce)}"


def authenticate(client, tenant: str, secret: str) -> dict[str, str]:
    nonce = parse_ok(client.request("CHALLENGE"))["nonce"]
    cnonce = secrets.token_hex(16)
    kv = parse_ok(client.request(auth_line(tenant, secret, nonce, cnonce)))
    # The switch proves it knows the secret too.
    assert kv["proof"] == proof(SWITCH, secret, tenant, nonce, cnonce), kv
    return kv


@pytest.fixture
def shared(tmp_path):
    """A switch with the auth file above."""
    path = tmp_path / "auth"
    path.write_text(AUTH_FILE)
    path.chmod(0o600)
    yield from serve(tmp_path, "--auth-file", str(path), "--join-timeout", "5")


class TenantJob(Job):
    """A job whose ranks authenticate as `tenant` before they JOIN."""

    def __init__(self, daemon, tenant: str, name: str, world: int = 2):
        self.daemon = daemon
        self.udp = [udp_socket() for _ in range(world)]
        self.ctl = [daemon.connect() for _ in range(world)]
        for r in range(world):
            authenticate(self.ctl[r], tenant, SECRETS[tenant])
            port = self.udp[r].getsockname()[1]
            self.ctl[r].send(f"JOIN job={name} world={world} rank={r} wire=int32 token=t port={port}\n")
        replies = [parse_ok(c.readline()) for c in self.ctl]
        self.job_id, self.key = int(replies[0]["job_id"]), int(replies[0]["key"])


def one_round(daemon, tenant: str, name: str) -> None:
    """A job of `tenant` joins, completes a round and closes: the switch still serves the tenant."""
    job = TenantJob(daemon, tenant, name)
    job.allreduce_round(slot=0, seq=0)
    job.close()


def as_tenant(daemon, tenant: str):
    c = daemon.connect()
    authenticate(c, tenant, SECRETS[tenant])
    return c


def joining(daemon) -> int:
    """The switch's joining jobs, as its operator sees them (a non-operator's STATS counts its own)."""
    with as_tenant(daemon, "ops") as op:
        return int(parse_ok(op.request("STATS"))["joining"])


def test_join_needs_a_proven_secret_and_a_proof_cannot_be_replayed(shared):
    with shared.connect() as c:
        assert c.request("JOIN job=j world=1 rank=0 wire=int32 token=t port=9").startswith("ERR auth ")
        assert c.request("AUTH tenant=alice cnonce=" + "a" * 32 + " proof=" + "b" * 64).startswith(
            "ERR state "
        )
    # A wrong secret and an unknown tenant get the same answer, and the connection is closed.
    for tenant, secret in (("alice", SECRETS["bob"]), ("mallory", SECRETS["alice"])):
        with shared.connect() as c:
            nonce = parse_ok(c.request("CHALLENGE"))["nonce"]
            cnonce = "c" * 32
            reply = c.request(auth_line(tenant, secret, nonce, cnonce))
            assert (
                reply
                == "ERR auth authentication failed (unknown tenant or wrong secret); closing the connection"
            )
            with pytest.raises(ConnectionError):
                c.readline(timeout=2)
    # A sniffed AUTH line is worth nothing on another connection: its nonce was another.
    with shared.connect() as c1:
        nonce = parse_ok(c1.request("CHALLENGE"))["nonce"]
        cnonce = "d" * 32
        sniffed = auth_line("alice", SECRETS["alice"], nonce, cnonce)
        with shared.connect() as c2:
            parse_ok(c2.request("CHALLENGE"))
            assert c2.request(sniffed).startswith("ERR auth ")
        assert parse_ok(c1.request(sniffed))["role"] == "tenant"
    with as_tenant(shared, "ops") as op:  # operators watch jobs; they do not join them
        assert op.request("JOIN job=j world=1 rank=0 wire=int32 token=t port=9").startswith("ERR auth ")


def test_a_job_is_invisible_to_other_tenants_and_its_key_cannot_be_recovered(shared):
    job = TenantJob(shared, "alice", "train")
    with as_tenant(shared, "bob") as bob, as_tenant(shared, "ops") as op:
        # Nothing of alice's job shows: not in JOBS, and STATUS/STATS answer as for no job at all.
        assert parse_ok(bob.request("JOBS"))["jobs"] == ""
        for verb in ("STATUS", "STATS"):
            assert bob.request(f"{verb} job_id={job.job_id}") == f"ERR not_found no job with id {job.job_id}"
            assert bob.request(f"{verb} job_id=12345") == "ERR not_found no job with id 12345"
        assert not [k for k in parse_ok(bob.request("STATS")) if k.startswith("drop.")]
        # The attack of the issue, even with the job id leaked: guessed keys carried in seq, from
        # bob's own socket. None counts (wrong key, or the right key from the wrong address) and
        # nothing shows in the job's rank_seq.
        with udp_socket() as s:
            port = job.port_of(0)
            for guess in (job.key ^ 1, job.key, job.key ^ 2):
                s.sendto(
                    data_packet(job.job_id, guess, 0, 0, [1, 2, 3], seq=guess & 0xFFFF), ("127.0.0.1", port)
                )
            st = wait_for(
                lambda: (
                    (kv := parse_ok(op.request(f"STATS job_id={job.job_id}")))["drop.bad_source"] == "1"
                    and kv
                ),
                "bob's packets to be counted",
            )
        assert st["drop.wrong_key"] == "2" and st["completed"] == "0"
        own = parse_ok(job.ctl[0].request("STATUS"))  # alice's rank reads its own job
        assert own["rank_seq"] == "-1,-1" and own["name"] == "alice/train", own
        # The operator sees every job, and drop reasons.
        assert f"{job.job_id}:alice/train:2:running" in parse_ok(op.request("JOBS"))["jobs"]
        assert "drop.bad_source" in parse_ok(op.request("STATS"))
        job.allreduce_round(slot=0, seq=0)  # alice's job is unharmed
    job.close()


def test_job_names_are_scoped_by_tenant(shared):
    with as_tenant(shared, "bob") as squatter:
        squatter.send("JOIN job=train world=2 rank=0 wire=int32 token=mine port=9\n")  # waits for rank 1
        job = TenantJob(shared, "alice", "train")  # alice's own "train": no conflict, no wait
        job.allreduce_round(slot=1, seq=0)
        with as_tenant(shared, "ops") as op:
            jobs = parse_ok(op.request("JOBS"))["jobs"].split(",")
            assert f"{job.job_id}:alice/train:2:running" in jobs and "0:bob/train:2:joining" in jobs, jobs
        job.close()


def test_a_tenant_at_its_quota_gets_no_resources_and_others_are_unaffected(shared):
    bob = [as_tenant(shared, "bob") for _ in range(3)]
    try:
        # The table fill: bob's joining jobs count against his max_jobs=2, not the switch's 64.
        for i in range(2):
            bob[i].send(f"JOIN job=fill{i} world=2 rank=0 wire=int32 token=t port=9\n")
        wait_for(lambda: joining(shared) == 2, "bob's two joins")
        reply = bob[2].request("JOIN job=fill2 world=2 rank=0 wire=int32 token=t port=9")
        assert reply.startswith("ERR no_resources tenant 'bob' is at its quota of 2 jobs"), reply
        # The memory hog: an optimizer job beyond bob's max_memory=16M (4M parameters of Adam: 48 MiB).
        hog = "JOIN job=hog world=1 rank=0 wire=float32 token=t port=9 optimizer=adam params=4000000 lr=0.001"
        with as_tenant(shared, "bob") as b:
            bob[0].close()  # frees one of bob's jobs, so that memory is what refuses
            wait_for(lambda: joining(shared) == 1, "the withdrawal")
            reply = b.request(hog)
            assert reply.startswith("ERR no_resources tenant 'bob' is at its memory quota"), reply
        # alice is unaffected: her own jobs, and the same optimizer job, start.
        with as_tenant(shared, "alice") as a:
            assert a.request(hog.replace("job=hog", "job=big")).startswith("OK job_id=")
        one_round(shared, "alice", "after")
    finally:
        for c in bob:
            c.close()


def test_one_address_cannot_take_every_control_connection(tmp_path):
    # Idle connections from one host (127.0.0.2) held the switch's 4096 connections, and nobody else
    # could JOIN. Now connections neither authenticated nor in a job are a pool of
    # --max-unauth-connections (256 here): one more closes the oldest of the address that holds the
    # most, and other hosts (127.0.0.1) still join (test_tenancy_limits.py: 4096 from 16 addresses).
    path = tmp_path / "auth"
    path.write_text(AUTH_FILE)
    path.chmod(0o600)
    d = Daemon(tmp_path, "--auth-file", str(path), "--max-unauth-connections", "256")
    floods = []
    try:
        for _ in range(256 + 1):
            s = socket.socket()
            s.bind(("127.0.0.2", 0))
            s.connect(("127.0.0.1", d.control_port))
            floods.append(s)
        floods[0].settimeout(5)
        reply = floods[0].recv(300).decode()
        assert reply.startswith("ERR no_resources closed to make room: 256 control connections"), reply
        one_round(d, "alice", "still")
    finally:
        for s in floods:
            s.close()
        assert d.stop() == 0


def test_the_operator_aborts_a_job_and_tenants_cannot(shared):
    job = TenantJob(shared, "alice", "victim")
    with as_tenant(shared, "bob") as bob:
        assert bob.request(f"ABORT job_id={job.job_id}").startswith("ERR auth ")
    with as_tenant(shared, "ops") as op:
        assert op.request(f"ABORT job_id={job.job_id}") == "OK"
        assert op.request(f"ABORT job_id={job.job_id}").startswith("ERR state ")
        assert op.request("ABORT job_id=77").startswith("ERR not_found ")
    for c in job.ctl:
        ev = c.wait_event()
        assert ev["event"] == "aborted" and ev["reason"] == "operator" and ev["rank"] == "-", ev
    job.close()


# ---------------------------------------------------------------------------------------------
# Without an auth file (loopback): the forgery-proof data plane, the withdrawal, the wire binding


@pytest.fixture
def loopback(tmp_path):
    # A long join timeout: a withdrawal must not be mistaken for a JOIN that timed out.
    yield from serve(tmp_path, "--join-timeout", "30")


def test_data_from_another_address_than_the_ranks_is_dropped(loopback):
    job = Job(loopback, "spoofed")
    with udp_socket() as other:  # right job id, key and rank; another UDP port
        other.sendto(data_packet(job.job_id, job.key, 0, 2, [100, 100, 100]), ("127.0.0.1", job.port_of(2)))
        wait_for(lambda: loopback.stats(job.job_id)["drop.bad_source"] == 1, "the spoofed packet")
    st = parse_ok(job.ctl[0].request("STATUS slot=2 version=0"))
    assert st["slot_state"] == "empty" and st["rank_seq"] == "-1,-1", st
    job.allreduce_round(slot=2, seq=0)  # the real rank 0's contribution, not the forged one
    job.close()


def test_a_connection_that_closes_is_noticed_whatever_it_queued(loopback):
    u = [udp_socket() for _ in range(2)]
    hog = loopback.connect()
    hog.send("JOIN job=w world=2 rank=0 wire=int32 token=t port=9\n")
    wait_for(lambda: loopback.stats()["joining"] == 1, "the held JOIN")
    # ~4 MiB of requests behind the held JOIN, then the client goes away.
    try:
        hog.sock.settimeout(5)
        hog.send(b"PING\n" * (800 * 1024))
    except OSError:
        pass  # the switch gave the JOIN up and closed: what is asserted next
    hog.close()
    wait_for(lambda: loopback.stats()["joining"] == 0, "the withdrawal of rank 0")
    ranks = [loopback.connect() for _ in range(2)]
    for r, c in enumerate(ranks):
        c.send(f"JOIN job=w world=2 rank={r} wire=int32 token=t port={u[r].getsockname()[1]}\n")
    assert all(c.readline().startswith("OK job_id=") for c in ranks)
    for s in (*u, *ranks):
        s.close()


def test_connections_beyond_the_file_descriptor_limit_are_refused_not_spun_on(loopback):
    # Under a service manager's usual limit (1024 descriptors, below the switch's own cap of 4096
    # connections), anyone who can connect could make accept() fail with EMFILE; the listening
    # socket then stays readable and the switch spun on it, logging a warning each turn, while
    # the clients waited unanswered. Here the limit is lowered on the running switch.
    job = Job(loopback, "kept")
    resource.prlimit(loopback.proc.pid, resource.RLIMIT_NOFILE, (64, 64))
    floods = []
    try:
        for _ in range(80):
            floods.append(socket.create_connection(("127.0.0.1", loopback.control_port), timeout=5))
        time.sleep(1.5)  # the refusals' time to arrive; before, the switch spun and logged meanwhile
        refused = []
        for s in floods:
            s.setblocking(False)
            try:
                reply = s.recv(200).decode()
            except BlockingIOError:
                continue  # accepted: a connection like any other, it said nothing yet
            assert reply.startswith("ERR no_resources too many control connections"), reply
            refused.append(s)
        assert refused, "no connection was refused: the limit did not bite"
        log = loopback.log()
        assert log.count("accept()") == 0 and log.count("out of file descriptors") == 1, log[-2000:]
    finally:
        for s in floods:
            s.close()

    # Room again: the switch answers, and the job that was running is unharmed.
    def answers():
        try:
            return loopback.stats()
        except (AssertionError, OSError):
            return None  # refused while the closed floods are still being swept

    wait_for(answers, "the switch to answer again")
    job.allreduce_round(slot=0, seq=0)
    job.close()


def test_the_join_wire_binds_the_element_type_of_data(loopback):
    job = Job(loopback, "typed")  # joined with wire=int32
    pkt = HEADER.pack(MAGIC, VERSION, MSG_DATA, job.job_id, job.key, 0, 0, 0, FLOAT16, 2, 0, 0, -128, 0, 0)
    job.udp[0].sendto(pkt + struct.pack("<2H", 0x3C00, 0x3C00), ("127.0.0.1", job.port_of(0)))
    wait_for(lambda: loopback.stats(job.job_id)["drop.bad_elem_type"] == 1, "the float16 packet")
    job.allreduce_round(slot=0, seq=0)
    job.close()
    with loopback.connect() as c:  # types= lists what else a job's DATA may carry
        assert c.request(
            "JOIN job=t2 world=1 rank=0 wire=float32 token=t port=9 types=float64,float16"
        ).startswith("OK ")
    with loopback.connect() as c:
        assert c.request("JOIN job=t3 world=1 rank=0 wire=float32 token=t port=9 types=float64,").startswith(
            "ERR bad_request types="
        )


# ---------------------------------------------------------------------------------------------
# Starting


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(daemon_path()), *args], capture_output=True, text=True, timeout=10)


def test_a_reachable_address_needs_an_auth_file_or_insecure(tmp_path):
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the refusal comes before any bind.
    out = run("--control-host", "192.0.2.1")
    assert out.returncode == 2 and "--auth-file" in out.stderr and "--insecure" in out.stderr, out.stderr
    out = run("--control-host", "192.0.2.1", "--insecure", "--control-port", "1")
    assert out.returncode == 1 and "cannot listen" in out.stderr, out.stderr  # past the check, bind fails


@pytest.mark.parametrize(
    "text, mode, mentions",
    [
        (AUTH_FILE, 0o644, "chmod 600"),
        ("tenant alice secret=short\n", 0o600, "line 1: the secret must be 16"),
        ("# nobody\n\n", 0o600, "nobody could use the switch"),
        (f"tenant a secret={'x' * 20}\ntenant a secret={'y' * 20}\n", 0o600, "line 2: 'a' is named twice"),
        (f"tenant a secret={'x' * 20} max_jobs=1000\n", 0o600, "line 1: max_jobs"),
        ("wizard merlin\n", 0o600, "line 1: unknown entry 'wizard'"),
    ],
)
def test_a_bad_auth_file_is_a_clear_error(tmp_path, text, mode, mentions):
    path = tmp_path / "auth"
    path.write_text(text)
    os.chmod(path, mode)
    out = run("--auth-file", str(path))
    assert out.returncode == 2 and mentions in out.stderr, out.stderr


def test_anonymous_joins_share_one_quota_when_the_auth_file_allows_them(tmp_path):
    path = tmp_path / "auth"
    path.write_text(
        f"anonymous max_jobs=1\ntenant alice secret={SECRETS['alice']}\n"
        f"operator ops secret={SECRETS['ops']}\n"
    )
    path.chmod(0o600)
    d = Daemon(tmp_path, "--auth-file", str(path))
    try:
        with d.connect() as a, d.connect() as b:
            a.send("JOIN job=one world=2 rank=0 wire=int32 token=t port=9\n")
            wait_for(lambda: joining(d) == 1, "the anonymous JOIN")
            assert b.request("JOIN job=two world=1 rank=0 wire=int32 token=t port=9").startswith(
                "ERR no_resources anonymous use is at its quota of 1 jobs"
            )
            with as_tenant(d, "alice") as t:
                assert t.request("JOIN job=two world=1 rank=0 wire=int32 token=t port=9").startswith("OK ")
    finally:
        assert d.stop() == 0


def test_loopback_needs_no_configuration_and_sees_everything(loopback):
    job = Job(loopback, "demo")
    with loopback.connect() as other:  # anonymous, as the demo and the quick start
        assert other.request("CHALLENGE").startswith("ERR state authentication is off")
        assert parse_ok(other.request(f"STATUS job_id={job.job_id}"))["name"] == "demo"
        assert "drop.bad_source" in parse_ok(other.request("STATS"))
    job.close()
