"""The control port's capacity on a switch shared by tenants (issue 34, findings 5-7; docs/security.md).

Black box over plain sockets, as test_tenancy.py: thousands of idle connections from many loopback
addresses (127.0.0.x: Linux routes all of 127/8 to lo, so binding a source address needs no root),
the handshake deadline and incomplete lines, a tenant with default quotas against the job table,
and the backoff of failed AUTHs and the rate limit of their log lines.
"""

from __future__ import annotations

import resource
import secrets
import socket

import pytest
from conftest import require_or_skip
from test_switch_daemon import Client, Daemon, parse_ok, wait_for
from test_tenancy import SECRETS, as_tenant, auth_line, authenticate, joining, one_round

# No `defaults` entry: the quotas are the switch's defaults (half of its limits, --tenant-share).
AUTH_FILE = f"""tenant alice secret={SECRETS["alice"]}
tenant bob   secret={SECRETS["bob"]}
operator ops secret={SECRETS["ops"]}
"""
IDLE = 4096  # the finding: 4,096 idle connections from 127.0.0.1-127.0.0.16
ADDRESSES = [f"127.0.0.{i}" for i in range(1, 17)]


def auth_file(tmp_path) -> str:
    path = tmp_path / "auth"
    path.write_text(AUTH_FILE)
    path.chmod(0o600)
    return str(path)


def client_from(address: str, port: int) -> Client:
    """A Client whose connection comes from `address` (a 127.0.0.x of this machine)."""
    c = Client.__new__(Client)
    c.sock = socket.socket()
    c.sock.bind((address, 0))
    c.sock.settimeout(5)
    c.sock.connect(("127.0.0.1", port))
    c.buf, c.events = b"", []
    return c


@pytest.fixture
def many_descriptors():
    """Room for the test's thousands of sockets and, inherited, the switch's."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 3 * IDLE
    if hard != resource.RLIM_INFINITY and hard < want:
        require_or_skip(
            "MANY_FDS",
            f"RLIMIT_NOFILE's hard limit is {hard}: this test holds {IDLE} connections and needs {want}",
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_thousands_of_idle_connections_from_many_addresses_do_not_stop_a_join(tmp_path, many_descriptors):
    # Before: 256 connections outside a job per address, and 4096 in all: 4096 idle connections
    # from 16 addresses (256 each, A's own 127.0.0.1 among them) and A got
    # `ERR no_resources too many control connections`. Now a new connection closes the oldest
    # unauthenticated one of the address that holds the most of them.
    d = Daemon(tmp_path, "--auth-file", auth_file(tmp_path))
    floods = []
    try:
        for i in range(IDLE):
            s = socket.socket()
            s.bind((ADDRESSES[i % len(ADDRESSES)], 0))
            s.connect(("127.0.0.1", d.control_port))
            floods.append(s)
        one_round(d, "alice", "still")  # CHALLENGE, AUTH and JOIN on two new connections
        # The room came from the flood, oldest first, and each evicted connection was told why.
        floods[0].settimeout(5)
        reply = floods[0].recv(300).decode()
        assert reply.startswith("ERR no_resources closed to make room"), reply
        with as_tenant(d, "ops") as op:  # the switch still serves its operator
            assert parse_ok(op.request("PING")) == {}
    finally:
        for s in floods:
            s.close()
        rc = d.stop()
        print(d.log()[-3000:])
    assert rc == 0


def test_an_address_floods_its_own_connections_out_first(tmp_path):
    # The unauthenticated pool at its cap (8 here): a new connection from another address takes the
    # place of the oldest connection of the address that holds the most, not of the newcomer's.
    d = Daemon(tmp_path, "--auth-file", auth_file(tmp_path), "--max-unauth-connections", "8")
    try:
        mine = client_from("127.0.0.3", d.control_port)
        assert mine.request("PING") == "OK"
        floods = [client_from("127.0.0.2", d.control_port) for _ in range(7)]  # the pool is full
        newcomer = client_from("127.0.0.4", d.control_port)
        assert newcomer.request("PING") == "OK"
        assert floods[0].readline().startswith("ERR no_resources closed to make room: 8 control connections")
        for c in (mine, *floods[1:]):  # only the flood's oldest went
            assert c.request("PING") == "OK"
        for c in (mine, newcomer, *floods):
            c.close()
    finally:
        assert d.stop() == 0


def test_idle_and_half_line_connections_are_closed_at_the_handshake_deadline(tmp_path):
    # Before: a connection that never authenticated, and one holding bytes without a newline, stayed
    # open for ever.
    d = Daemon(tmp_path, "--auth-file", auth_file(tmp_path))  # the default deadline: 10 s
    try:
        idle = d.connect()  # says nothing
        talker = d.connect()  # unauthenticated requests do not extend the deadline
        assert talker.request("PING") == "OK"
        half = as_tenant(d, "alice")  # authenticated, then an incomplete line
        half.send("PIN")
        kept = as_tenant(d, "bob")  # authenticated and idle: it may stay
        for c in (idle, talker):
            reply = c.readline(timeout=30)
            assert reply == IDLE_CLOSED
            with pytest.raises(ConnectionError):
                c.readline(timeout=5)
        reply = half.readline(timeout=30)
        assert reply.startswith("ERR timeout an incomplete request line (no newline) for 10 s"), reply
        with pytest.raises(ConnectionError):
            half.readline(timeout=5)
        assert kept.request("PING") == "OK"  # the deadline has passed for it too
        for c in (idle, talker, half, kept):
            c.close()
    finally:
        assert d.stop() == 0


def test_a_tenant_with_default_quotas_cannot_fill_the_job_table(tmp_path):
    # Before: a quota the auth file left out was the switch's whole limit, so bob alone filled
    # --max-jobs with JOINs that never complete, and alice got `job table full`.
    d = Daemon(tmp_path, "--auth-file", auth_file(tmp_path), "--max-jobs", "4", "--join-timeout", "30")
    bob = [as_tenant(d, "bob") for _ in range(4)]
    try:
        # The memory budget too: an optimizer job of 50M parameters of Adam (600 MB) fits the
        # switch's 1 GiB, but not bob's default half of it.
        with as_tenant(d, "bob") as b:
            hog = "JOIN job=hog world=1 rank=0 wire=float32 token=t port=9 optimizer=adam params=50000000"
            reply = b.request(hog + " lr=0.001")
            assert reply.startswith("ERR no_resources tenant 'bob' is at its memory quota"), reply
        for i, c in enumerate(bob):  # JOINs that wait for a rank 1 that never comes
            c.send(f"JOIN job=fill{i} world=2 rank=0 wire=int32 token=t port=9\n")
        for c in bob[2:]:
            reply = c.readline()
            assert reply.startswith("ERR no_resources tenant 'bob' is at its quota of 2 jobs"), reply
        assert joining(d) == 2
        one_round(d, "alice", "mine")  # alice still gets a job
    finally:
        for c in bob:
            c.close()
        assert d.stop() == 0


def failed_auth(address: str, port: int, tenant: str) -> Client:
    """A connection from `address` that has sent a wrong AUTH as `tenant` (its answer not read)."""
    c = client_from(address, port)
    nonce = parse_ok(c.request("CHALLENGE"))["nonce"]
    c.send(auth_line(tenant, "wrong-" + secrets.token_hex(16), nonce, secrets.token_hex(16)) + "\n")
    return c


IDLE_CLOSED = "ERR timeout no AUTH or JOIN within 10 s (--handshake-timeout); closing the connection"
FAILED = "ERR auth authentication failed (unknown tenant or wrong secret); closing the connection"


def test_failed_auths_back_off_per_address_and_per_tenant(tmp_path):
    # Before: AUTH guessing was answered at once, 12.4k tries per second from one host.
    d = Daemon(tmp_path, "--auth-file", auth_file(tmp_path))
    try:
        for _ in range(3):  # three failures from 127.0.0.5 as bob are answered at once
            with failed_auth("127.0.0.5", d.control_port, "bob") as c:
                assert c.readline() == FAILED
        # The next one from that address (as a tenant never tried before) waits; a correct AUTH of
        # another tenant from another address meanwhile does not, and is answered first.
        guess = failed_auth("127.0.0.5", d.control_port, "carol")
        with client_from("127.0.0.6", d.control_port) as alice:
            assert authenticate(alice, "alice", SECRETS["alice"])["role"] == "tenant"
            assert guess.nothing_pending(), "the fourth failure from one address was answered at once"
        assert guess.readline(timeout=15) == FAILED
        guess.close()
        # Per tenant: three failures as bob from three other addresses, then a wrong AUTH as bob from
        # a fourth waits, and so does a right one from a fifth (the timing of an answer must not tell
        # a right guess from a wrong one).
        for address in ("127.0.0.11", "127.0.0.12", "127.0.0.13"):
            with failed_auth(address, d.control_port, "bob") as c:
                assert c.readline() == FAILED
        wrong = failed_auth("127.0.0.7", d.control_port, "bob")
        right = client_from("127.0.0.8", d.control_port)
        nonce = parse_ok(right.request("CHALLENGE"))["nonce"]
        right.send(auth_line("bob", SECRETS["bob"], nonce, secrets.token_hex(16)) + "\n")
        with client_from("127.0.0.9", d.control_port) as alice:
            assert authenticate(alice, "alice", SECRETS["alice"])["role"] == "tenant"
            assert wrong.nothing_pending() and right.nothing_pending()
        assert wrong.readline(timeout=15) == FAILED
        assert parse_ok(right.readline(timeout=15))["tenant"] == "bob"
        assert right.request("PING") == "OK"
        wrong.close()
        right.close()
        # Many connections from one address in backoff do not multiply its guesses: two answers may
        # wait per address, a third AUTH is refused unchecked at once.
        for _ in range(3):
            with failed_auth("127.0.0.20", d.control_port, "erin") as c:
                assert c.readline() == FAILED
        waiting = [failed_auth("127.0.0.20", d.control_port, f"dave{i}") for i in range(3)]
        assert waiting[2].readline().startswith("ERR auth too many AUTH attempts waiting from this address")
        with client_from("127.0.0.10", d.control_port) as alice:
            assert authenticate(alice, "alice", SECRETS["alice"])["role"] == "tenant"
            assert waiting[0].nothing_pending() and waiting[1].nothing_pending()
        for c in waiting[:2]:
            assert c.readline(timeout=20) == FAILED
        for c in waiting:
            c.close()
    finally:
        assert d.stop() == 0


def test_failed_auths_are_logged_a_few_lines_then_a_count(tmp_path):
    # Before: one WARN line per failure (~71 GiB of log a day at the guessing rate).
    d = Daemon(tmp_path, "--auth-file", auth_file(tmp_path))
    try:
        for i in range(20):  # one failure per address and per name: no backoff, every one counts
            with failed_auth(f"127.0.1.{i + 1}", d.control_port, f"mallory{i}") as c:
                assert c.readline() == FAILED
        summary = wait_for(
            lambda: [line for line in d.log().splitlines() if "more failed AUTHs in the last 10 s" in line],
            "the summary line",
            timeout=20,
        )
        log = d.log()
        assert log.count("failed AUTH as tenant") == 5, log[-3000:]
        assert len(summary) == 1 and "control: 15 more failed AUTHs" in summary[0], summary
        assert "as tenant 'mallory19'" in summary[0], summary
    finally:
        assert d.stop() == 0
