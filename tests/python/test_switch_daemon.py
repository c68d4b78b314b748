"""Black-box tests of the gradswitchd binary: options, signals, control plane, data-plane hygiene.

Only plain sockets and subprocess: no gradswitch Python package. Every wait is bounded by a
deadline; waiting is never itself the assertion.
"""

from __future__ import annotations

import random
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from _daemon import daemon_binary

import gradswitch.daemon

REPO = Path(__file__).resolve().parents[2]


def daemon_path() -> Path:
    """The gradswitchd under test (tests/python/_daemon.py)."""
    return Path(daemon_binary())


HEADER = struct.Struct(">HBBIIHHBBHIIbbH")
MAGIC, VERSION = 0x4753, 2
MSG_DATA, MSG_RESULT, MSG_ABORT = 1, 2, 3
MSG_HELD = 7  # a retransmission found its round open with the sender's contribution in it
INT32 = 1
FLAG_RETX, FLAG_UNICAST, FLAG_LAST, FLAG_DSACK = 0x02, 0x04, 0x08, 0x20
ABORT_RANK_LEFT, ABORT_SHUTDOWN, ABORT_MISMATCH = 1, 3, 5

ALL_OPTIONS = [
    "control-host",
    "control-port",
    "data-port",
    "threads",
    "slots",
    "mtu",
    "max-jobs",
    "join-timeout",
    "idle-timeout",
    "drop-rate",
    "seed",
    "batch",
    "hold-us",
    "stats-interval",
    "log-level",
    "backend",
    "max-memory",
]


def header(job_id, key, rank, slot, count, seq=0, offset=0, mtype=MSG_DATA, elem=INT32, magic=MAGIC, flags=0):
    return HEADER.pack(
        magic, VERSION, mtype, job_id, key, rank, slot, flags, elem, count, seq, offset, -128, -128, 0
    )


def data_packet(job_id, key, rank, slot, values, seq=0, offset=0, flags=0):
    """flags=FLAG_RETX marks a resend: only those are answered once their round completed."""
    payload = struct.pack(f"<{len(values)}i", *values)
    return header(job_id, key, rank, slot, len(values), seq, offset, flags=flags) + payload


def parse_ok(line: str) -> dict[str, str]:
    assert line.startswith("OK"), line
    return dict(tok.split("=", 1) for tok in line.split()[1:])


class Daemon(gradswitch.daemon.Daemon):
    """gradswitch.daemon.Daemon, started at once on free local ports, its log in tmp_path; connect()
    gives a line-level Client; stop() fails a daemon that ignores SIGTERM."""

    def __init__(self, tmp_path: Path, *args: str, threads: int = 2):
        super().__init__(
            *args,
            threads=threads,
            binary=str(daemon_path()),
            log_path=tmp_path / f"gradswitchd-{time.monotonic_ns()}.log",
        )
        self.start()

    def stop(self) -> int:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                super().stop(timeout=0)
                raise AssertionError("gradswitchd ignored SIGTERM for 10 s") from None
        return super().stop()

    def connect(self, timeout: float = 5.0) -> Client:
        return Client(self.control_port)

    def request(self, line: str, timeout: float = 5.0) -> str:
        with self.connect() as c:
            return c.request(line)

    def stats(self, job_id: int | None = None) -> dict[str, int]:
        """STATS as ints; an ERR reply fails as an AssertionError (parse_ok), as tests expect."""
        return {
            k: int(v)
            for k, v in parse_ok(
                self.request("STATS" + (f" job_id={job_id}" if job_id is not None else ""))
            ).items()
        }


class Client:
    """A control-plane connection with line-level helpers and timeouts."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        self.buf = b""
        self.events: list[str] = []  # `EVENT ...` lines, set aside by readline() (protocol.md §1.4)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.sock.close()

    def send(self, data: bytes | str):
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def readline(self, timeout: float = 5.0, events: bool = False) -> str:
        """The next reply line; EVENT lines are kept in self.events (returned too when `events`)."""
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" not in self.buf:
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError(f"closed by the switch (buffered {self.buf!r})")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\n", 1)
            line = raw.decode()
            if not line.startswith("EVENT "):
                return line
            self.events.append(line)
            if events:
                return line

    def wait_event(self, timeout: float = 5.0) -> dict[str, str]:
        """The next EVENT line's key=value pairs (plus "event": its kind)."""
        if not self.events:
            line = self.readline(timeout, events=True)
            assert line.startswith("EVENT "), f"a reply arrived instead of an event: {line}"
        kind, *kv = self.events.pop(0).split()[1:]
        return {"event": kind, **dict(tok.split("=", 1) for tok in kv)}

    def request(self, line: str) -> str:
        self.send(line + "\n")
        return self.readline()

    def nothing_pending(self) -> bool:
        """True when no reply is waiting (checked after a PING round trip on another client)."""
        self.sock.settimeout(0.0)
        try:
            chunk = self.sock.recv(65536)
        except BlockingIOError:
            return not self.buf
        finally:
            self.sock.settimeout(5)
        self.buf += chunk
        return False


def udp_socket() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # a window of results must fit
    s.bind(("127.0.0.1", 0))
    s.settimeout(5)
    return s


class Job:
    """`world` ranks joined to one job, each with its own control connection and UDP socket."""

    def __init__(self, daemon: Daemon, name: str, world: int = 2, token: str = "tok"):
        self.daemon = daemon
        self.udp = [udp_socket() for _ in range(world)]
        self.ctl = [daemon.connect() for _ in range(world)]
        for r in range(world):
            port = self.udp[r].getsockname()[1]
            self.ctl[r].send(f"JOIN job={name} world={world} rank={r} wire=int32 token={token} port={port}\n")
        replies = [parse_ok(c.readline()) for c in self.ctl]
        assert all(rep == replies[0] for rep in replies), replies
        self.job_id, self.key = int(replies[0]["job_id"]), int(replies[0]["key"])
        self.reply = replies[0]

    def port_of(self, slot: int) -> int:
        return self.daemon.data_port + slot % self.daemon.threads

    def allreduce_round(self, slot: int, seq: int) -> None:
        """Every rank sends one chunk to `slot`; every rank must get the exact sum back."""
        world = len(self.udp)
        for r, s in enumerate(self.udp):
            s.sendto(
                data_packet(self.job_id, self.key, r, slot, [r + seq, -r, 7], seq=seq),
                ("127.0.0.1", self.port_of(slot)),
            )
        want = [sum(r + seq for r in range(world)), -sum(range(world)), 7 * world]
        for s in self.udp:
            pkt = s.recv(65536)
            h = HEADER.unpack(pkt[:32])
            assert h[2] == MSG_RESULT and h[6] == slot and h[10] == seq, h
            assert list(struct.unpack("<3i", pkt[32:])) == want

    def close(self):
        for c in self.ctl:
            c.close()
        for s in self.udp:
            s.close()


def serve(tmp_path, *args: str):
    """A Daemon for a fixture (`yield from serve(...)`): stopped afterwards, its log printed, a clean
    exit asserted."""
    d = Daemon(tmp_path, *args)
    yield d
    rc = d.stop()
    print(f"--- gradswitchd log ---\n{d.log()[-4000:]}")
    assert rc == 0, f"gradswitchd exited {rc}"


@pytest.fixture
def daemon(tmp_path):
    yield from serve(tmp_path, "--join-timeout", "2")


def wait_for(predicate, what: str, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# ---------------------------------------------------------------------------------------------
# Command line


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(daemon_path()), *args], capture_output=True, text=True, timeout=10)


def test_help_lists_every_option_with_its_default():
    out = run_cli("--help")
    assert out.returncode == 0, out.stderr
    for name in ALL_OPTIONS:
        lines = [ln for ln in out.stdout.splitlines() if f"--{name} " in ln]
        assert lines, f"--{name} missing from --help"
        assert "(default " in lines[0], lines[0]
    assert "(default 7700)" in out.stdout and "(default 256)" in out.stdout


def test_version():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("gradswitchd 0."), out


@pytest.mark.parametrize(
    "args, mentions",
    [
        (["--threads", "0"], "--threads"),
        (["--threads", "many"], "--threads"),
        (["--mtu", "9001"], "--mtu"),
        (["--mtu", "100"], "--mtu"),
        (["--control-port", "70000"], "--control-port"),
        (["--control-host", "not-an-ip"], "--control-host"),
        (["--drop-rate", "1.5"], "--drop-rate"),
        (["--drop-rate", "nan"], "--drop-rate"),
        (["--backend", "rdma"], "--backend"),
        (["--log-level", "loud"], "--log-level"),
        (["--max-memory", "12Q"], "--max-memory"),
        (["--max-jobs", "1000"], "--max-jobs"),
        (["--no-such-option"], "--no-such-option"),
        (["--slots"], "--slots"),
        (["stray"], "stray"),
        (["--data-port", "65535", "--threads", "2"], "--data-port"),
        (["--", "-l", "0"], "dpdk"),
    ],
)
def test_bad_option_is_a_clear_error(args, mentions):
    out = run_cli(*args)
    assert out.returncode != 0
    assert mentions in out.stderr, out.stderr
    assert "Try 'gradswitchd --help'" in out.stderr


def test_sigterm_stops_cleanly_with_a_running_job(tmp_path):
    d = Daemon(tmp_path)
    job = Job(d, "sigterm")
    job.allreduce_round(slot=0, seq=0)
    assert d.stop() == 0
    log = d.log()
    assert "aborted: the switch is shutting down" in log
    assert "stopped after" in log and "completed=1" in log
    # Every rank, though between allreduces, was told why; then the switch closed the connections.
    for c in job.ctl:
        with pytest.raises(ConnectionError):
            c.readline(timeout=5)
        assert len(c.events) == 1 and "reason=shutdown" in c.events[0], c.events
    job.close()


def test_sigint_stops_idle_daemon(tmp_path):
    d = Daemon(tmp_path)
    d.proc.send_signal(signal.SIGINT)
    assert d.proc.wait(timeout=10) == 0


# ---------------------------------------------------------------------------------------------
# Control plane


def test_join_reply_and_allreduce(daemon):
    job = Job(daemon, "basic", world=3)
    assert job.reply["slots"] == "256" and job.reply["payload"] == "1440"
    assert job.reply["data_port"] == str(daemon.data_port) and job.reply["threads"] == "2"
    for seq, slot in enumerate(range(6)):
        job.allreduce_round(slot, seq)
    st = parse_ok(job.ctl[1].request("STATUS slot=5 version=0"))
    assert st["state"] == "running" and st["rank_seq"] == "5,5,5"
    assert st["slot_state"] == "complete" and st["seen"] == "0,1,2" and st["slot_seq"] == "5"
    jobs = parse_ok(job.ctl[0].request("JOBS"))["jobs"]
    assert f"{job.job_id}:basic:3:running" in jobs.split(",")
    per_job = daemon.stats(job.job_id)
    assert per_job["completed"] == 6 and per_job["pkts_in"] == 18
    for c in job.ctl:
        assert c.request("LEAVE") == "OK"
    wait_for(lambda: "ended: all ranks left" in daemon.log(), "the job to end")
    job.close()


BAD_LINES = [
    ("", "bad_request"),
    ("ping", "bad_request"),
    ("FROB x=1", "bad_request"),
    ("PING extra=1", "bad_request"),
    ("JOIN job", "bad_request"),
    ("JOIN job=a world=2 rank=0 wire=int32 token=t", "bad_request"),  # no port
    ("JOIN job=a world=2 rank=0 wire=int64 token=t port=5", "bad_request"),
    ("JOIN job=a world=0 rank=0 wire=int32 token=t port=5", "bad_request"),
    ("JOIN job=a world=65 rank=0 wire=int32 token=t port=5", "bad_request"),
    ("JOIN job=a world=2 rank=2 wire=int32 token=t port=5", "bad_request"),  # rank out of range
    ("JOIN job=a world=2 rank=-1 wire=int32 token=t port=5", "bad_request"),
    ("JOIN job=a/b world=2 rank=0 wire=int32 token=t port=5", "bad_request"),
    ("JOIN job=a world=2 rank=0 rank=1 wire=int32 token=t port=5", "bad_request"),
    ("JOIN job=a world=2 rank=0 wire=int32 token=t port=0", "bad_request"),
    ("JOIN job=a world=99999999999999999999999 rank=0 wire=int32 token=t port=5", "bad_request"),
    ("STATUS", "bad_request"),  # not joined and no job_id
    ("STATUS job_id=12345", "not_found"),
    ("STATUS job_id=1 slot=3", "bad_request"),
    ("STATS job_id=4294967296", "bad_request"),
    ("STATS job_id=77", "not_found"),
    ("LEAVE", "state"),
    ("JOBS now=1", "bad_request"),
    ("PING\tx", "bad_request"),
    ("\x00\x01\xff", "bad_request"),
]


def test_malformed_requests_get_err_and_the_connection_survives(daemon):
    job = Job(daemon, "bystander")
    with daemon.connect() as c:
        for line, code in BAD_LINES:
            c.send(line.encode("latin-1") + b"\n")
            reply = c.readline()
            assert reply.startswith(f"ERR {code} "), (line, reply)
            assert len(reply.split(" ", 2)) == 3 and reply.split(" ", 2)[2].strip(), reply  # has a message
        c.send(b"PING\r\n")  # CRLF is fine
        assert c.readline() == "OK"
    # The other client's job never saw any of it.
    assert all(c.nothing_pending() for c in job.ctl)
    job.allreduce_round(slot=1, seq=0)
    job.close()


def test_oversized_line_is_refused_and_closed(daemon):
    with daemon.connect() as ok:
        # 4095 bytes + "\n" is the longest allowed line: parsed (and rejected as a bad verb).
        ok.send("X" * 4095 + "\n")
        assert ok.readline().startswith("ERR bad_request ")
        assert ok.request("PING") == "OK"
    with daemon.connect() as c:
        c.send("PING " + "a=b " * 2000)  # no newline, over the limit
        assert c.readline().startswith("ERR too_long ")
        with pytest.raises(ConnectionError):
            c.readline()
    with daemon.connect() as c:
        assert c.request("PING") == "OK"


def test_join_with_another_token_answers_only_the_offender(daemon):
    a = daemon.connect()
    a.send("JOIN job=cj world=2 rank=0 wire=int32 token=good port=9\n")
    with daemon.connect() as b:
        reply = b.request("JOIN job=cj world=2 rank=1 wire=int32 token=evil port=9")
        assert reply.startswith("ERR conflict ") and "different token" in reply, reply
        assert "evil" not in reply and "good" not in reply
    assert a.nothing_pending()
    # JOIN twice on one connection.
    u = [udp_socket(), udp_socket()]
    c = daemon.connect()
    c.send(f"JOIN job=cj world=2 rank=1 wire=int32 token=good port={u[1].getsockname()[1]}\n")
    ok_a, ok_c = parse_ok(a.readline()), parse_ok(c.readline())
    assert ok_a == ok_c
    assert c.request("JOIN job=other world=1 rank=0 wire=int32 token=t port=9").startswith("ERR state ")
    # The job is running; a latecomer cannot take a rank.
    with daemon.connect() as late:
        reply = late.request("JOIN job=cj world=2 rank=1 wire=int32 token=good port=9")
        assert reply.startswith("ERR conflict "), reply
    a.close()
    c.close()


@pytest.mark.parametrize(
    "line, differs",
    [
        ("JOIN job=cj world=3 rank=1 wire=int32 token=good port=9", "world=3 but the job has world=2"),
        ("JOIN job=cj world=2 rank=1 wire=float32 token=good port=9", "wire=float32 but the job has wire="),
        ("JOIN job=cj world=2 rank=0 wire=int32 token=good port=9", "rank 0, which already joined from "),
    ],
    ids=["world", "wire", "duplicate-rank"],
)
def test_conflicting_join_cancels_the_joining_job_for_every_rank_at_once(daemon, line, differs):
    a = daemon.connect()
    a.send("JOIN job=cj world=2 rank=0 wire=int32 token=good port=9\n")
    assert daemon.connect().request("PING") == "OK"  # a's JOIN is held
    with daemon.connect() as b:
        t0 = time.monotonic()
        b.send(line + "\n")
        # The waiting rank is told now, not after the 2 s join timeout, and so is the newcomer.
        waiting = a.readline(timeout=1.5)
        newcomer = b.readline(timeout=1.5)
        assert time.monotonic() - t0 < 1.5
        rank = line.split("rank=")[1].split()[0]
        addr = f"rank {rank} (127.0.0.1:{b.sock.getsockname()[1]})"
        for reply in (waiting, newcomer):
            assert reply.startswith("ERR conflict ") and addr in reply and differs in reply, reply
            assert "cancelled" in reply
    assert "refused JOIN" in daemon.log() and addr in daemon.log()
    # The job is gone: a JOIN may create it again.
    assert a.request("JOIN job=cj world=1 rank=0 wire=int32 token=good port=9").startswith("OK job_id=")
    a.close()


def test_join_timeout(daemon):
    with daemon.connect() as a:
        a.send("JOIN job=lonely world=3 rank=1 wire=int32 token=t port=9\n")
        t0 = time.monotonic()
        reply = a.readline(timeout=10)
        assert reply.startswith("ERR timeout ") and "missing ranks 0,2" in reply, reply
        assert 1.5 < time.monotonic() - t0 < 8
        # The connection may try again.
        assert a.request("PING") == "OK"


def test_requests_queued_behind_a_held_join_are_answered_in_order(daemon):
    u = [udp_socket(), udp_socket()]
    a, b = daemon.connect(), daemon.connect()
    a.send(f"JOIN job=q world=2 rank=0 wire=int32 token=t port={u[0].getsockname()[1]}\nPING\n")
    assert b.request("PING") == "OK"
    assert a.nothing_pending()  # the PING waits behind the JOIN
    b.send(f"JOIN job=q world=2 rank=1 wire=int32 token=t port={u[1].getsockname()[1]}\n")
    assert a.readline().startswith("OK job_id=") and a.readline() == "OK"
    assert b.readline().startswith("OK job_id=")
    a.close()
    b.close()


def test_length_mismatch_aborts_every_rank_at_once(daemon):
    """Rank 0's tensor ends in slot 1's chunk (LAST); rank 1 sends more: every rank is told at once."""
    job = Job(daemon, "lengths", world=2)
    job.allreduce_round(slot=0, seq=0)
    last = data_packet(job.job_id, job.key, 0, 1, [1, 2, 3], seq=1)
    last = last[:16] + bytes([last[16] | FLAG_LAST]) + last[17:]
    job.udp[0].sendto(last, ("127.0.0.1", job.port_of(1)))
    job.udp[1].sendto(data_packet(job.job_id, job.key, 1, 1, [1, 2, 3], seq=1), ("127.0.0.1", job.port_of(1)))
    for r in range(2):  # an ABORT datagram to both ranks, not only the sender
        h = HEADER.unpack(job.udp[r].recv(65536)[:32])
        assert h[2] == MSG_ABORT and h[5] == 1 and h[12] == ABORT_MISMATCH, h
    for c in job.ctl:  # and an EVENT on both control connections, with both contributions
        ev = c.wait_event(timeout=2)
        assert ev["event"] == "aborted" and ev["reason"] == "mismatch" and ev["rank"] == "1", ev
        assert ev["mismatch_ranks"] == "0,1" and ev["mismatch_last"] == "1,0", ev
        assert ev["mismatch_counts"] == "3,3" and ev["mismatch_offset"] == "0", ev
        assert ev["mismatch_seq"] == "1", ev
    st = parse_ok(job.ctl[0].request("STATUS"))
    assert st["state"] == "aborted" and st["abort_reason"] == "mismatch"
    assert st["mismatch_types"] == "int32,int32"
    assert daemon.stats(job.job_id)["drop.inconsistent"] == 1
    job.close()


def test_leave_during_an_allreduce_fails_the_others_at_once(daemon):
    job = Job(daemon, "leaver", world=2)
    job.allreduce_round(slot=0, seq=0)
    # Rank 0 waits in slot 1 for rank 1, which leaves instead of contributing.
    job.udp[0].sendto(data_packet(job.job_id, job.key, 0, 1, [5], seq=1), ("127.0.0.1", job.port_of(1)))
    wait_for(lambda: parse_ok(job.ctl[0].request("STATUS"))["rank_seq"] == "1,0", "rank 0's packet")
    assert job.ctl[1].request("LEAVE") == "OK"
    ev = job.ctl[0].wait_event(timeout=2)
    assert ev["event"] == "aborted" and ev["reason"] == "rank_left" and ev["rank"] == "1", ev
    st = parse_ok(job.ctl[0].request("STATUS"))
    assert st["state"] == "aborted" and st["left"] == "1"
    assert "left (LEAVE) while the others were in an allreduce" in daemon.log()
    job.close()


def test_leave_after_the_last_allreduce_keeps_answering_retransmissions(daemon):
    job = Job(daemon, "polite", world=2)
    job.allreduce_round(slot=0, seq=0)
    assert job.ctl[0].request("LEAVE") == "OK"
    assert parse_ok(job.ctl[1].request("STATUS"))["state"] == "running"
    # Rank 1 lost its result: the shadow copy still answers.
    copy = data_packet(job.job_id, job.key, 1, 0, [1, -1, 7], seq=0)  # a network duplicate: no answer
    job.udp[1].sendto(copy, ("127.0.0.1", job.port_of(0)))
    resend = data_packet(job.job_id, job.key, 1, 0, [1, -1, 7], seq=0, flags=FLAG_RETX)
    job.udp[1].sendto(resend, ("127.0.0.1", job.port_of(0)))
    h = HEADER.unpack(job.udp[1].recv(65536)[:32])
    assert h[2] == MSG_RESULT and h[7] == FLAG_UNICAST | FLAG_DSACK, h
    # A new round needs rank 0, which left: ABORT to every rank.
    job.udp[1].sendto(data_packet(job.job_id, job.key, 1, 2, [1], seq=1), ("127.0.0.1", job.port_of(2)))
    h = HEADER.unpack(job.udp[1].recv(65536)[:32])
    assert h[2] == MSG_ABORT and h[5] == 0 and h[12] == ABORT_RANK_LEFT, h
    assert job.ctl[1].wait_event(timeout=2)["reason"] == "rank_left"
    job.close()


def test_disconnect_aborts_the_job_and_data_gets_abort(daemon):
    job = Job(daemon, "crash", world=2)
    job.allreduce_round(slot=0, seq=0)
    job.ctl[1].close()  # rank 1 "crashes"
    st = wait_for(
        lambda: (s := parse_ok(job.ctl[0].request("STATUS")))["state"] == "aborted" and s,
        "the job to be aborted",
    )
    assert st["abort_reason"] == "rank_left" and st["abort_rank"] == "1"
    job.udp[0].sendto(data_packet(job.job_id, job.key, 0, 2, [1, 2, 3], seq=1), ("127.0.0.1", job.port_of(2)))
    h = HEADER.unpack(job.udp[0].recv(65536)[:32])
    assert h[2] == MSG_ABORT and h[5] == 1 and h[12] == ABORT_RANK_LEFT, h
    assert "aborted: rank 1 disconnected" in daemon.log()
    job.ctl[0].close()
    wait_for(lambda: "ended: aborted (rank 1 disconnected)" in daemon.log(), "the job to be destroyed")
    # Its name is free again.
    again = Job(daemon, "crash", world=1)
    again.allreduce_round(slot=0, seq=0)
    again.close()


# ---------------------------------------------------------------------------------------------
# Data plane hygiene


def test_flood_of_bad_datagrams_is_counted_and_harmless(daemon):
    job = Job(daemon, "victim", world=2)
    job.allreduce_round(slot=0, seq=0)
    rng = random.Random(7)
    flood = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    jid, key = job.job_id, job.key

    def garbage_long():
        b = bytearray(rng.randbytes(rng.randrange(32, 1500)))
        if b[0:2] == b"GS":
            b[0] = 0
        return bytes(b)

    categories = {
        "drop.short_packet": lambda: rng.randbytes(rng.randrange(0, 32)),
        "drop.bad_magic": garbage_long,
        "drop.bad_version": lambda: header(jid, key, 0, 2, 0)[:2] + b"\x09" + header(jid, key, 0, 2, 0)[3:],
        "drop.bad_type": lambda: header(jid, key, 0, 2, 0, mtype=MSG_RESULT),
        "drop.unknown_job": lambda: data_packet(rng.randrange(1 << 32) | 1 << 31, key, 0, 2, [1]),
        "drop.wrong_key": lambda: data_packet(jid, key ^ rng.randrange(1, 1 << 32), 0, 2, [1]),
        "drop.bad_rank": lambda: data_packet(jid, key, rng.randrange(2, 1 << 16), 2, [1]),
        "drop.bad_source": lambda: data_packet(jid, key, 0, 2, [1]),  # right id and key, not rank 0's port
        # The rest come from rank 0's own socket: from anywhere else they are bad_source.
        "drop.slot_out_of_range": lambda: data_packet(jid, key, 0, rng.randrange(256, 1 << 16) & ~1, [1]),
        "drop.bad_elem_type": lambda: header(jid, key, 0, 2, 1, elem=9) + b"\0" * 4,
        # count beyond the packet
        "drop.bad_length": lambda: header(jid, key, 0, 2, rng.randrange(2, 1 << 16)) + b"\0" * 4,
        "drop.wrong_thread": lambda: data_packet(jid, key, 0, 3, [1]),  # odd slot sent to thread 0's port
    }
    from_rank0 = {"drop.slot_out_of_range", "drop.bad_elem_type", "drop.bad_length", "drop.wrong_thread"}
    before = daemon.stats()
    per_category = 40
    for name, make in categories.items():
        sender = job.udp[0] if name in from_rank0 else flood
        for _ in range(per_category):
            sender.sendto(make(), ("127.0.0.1", daemon.data_port))
        # Paced per category so that the kernel's socket buffer never overflows.
        wait_for(
            lambda name=name: daemon.stats()[name] - before[name] >= per_category, f"{name} to be counted"
        )
    after = daemon.stats()
    for name in categories:
        assert after[name] - before[name] == per_category, (name, after[name] - before[name])
    assert after["drops"] - before["drops"] == per_category * len(categories)
    assert after["completed"] == before["completed"]
    # The switch is up and the job unaffected.
    job.allreduce_round(slot=2, seq=1)
    assert parse_ok(job.ctl[0].request("STATUS"))["state"] == "running"
    flood.close()
    job.close()


def test_injected_drops_are_counted(tmp_path):
    d = Daemon(tmp_path, "--drop-rate", "1", threads=1)
    try:
        job = Job(d, "lossy", world=1)
        for i in range(10):
            job.udp[0].sendto(data_packet(job.job_id, job.key, 0, i, [i]), ("127.0.0.1", d.data_port))
        wait_for(lambda: d.stats()["udp.injected_drops"] == 10, "10 injected drops")
        assert d.stats()["pkts_in"] == 0
        job.close()
    finally:
        assert d.stop() == 0


def test_bursts_and_sleeps_are_counted(tmp_path):
    """udp.rx_bursts counts the receive calls that returned datagrams, udp.sleeps the data thread's waits:
    each DATA sent a while after the previous RESULT arrived is a burst of its own after a wait."""
    d = Daemon(tmp_path, threads=1)
    try:
        job = Job(d, "bursts", world=1)
        job.udp[0].settimeout(5)
        s0 = d.stats()
        for seq in range(5):
            job.udp[0].sendto(
                data_packet(job.job_id, job.key, 0, 0, [seq], seq=seq), ("127.0.0.1", d.data_port)
            )
            assert HEADER.unpack(job.udp[0].recv(65536)[:32])[2] == MSG_RESULT
            time.sleep(0.02)  # the data thread finds its socket empty and waits
        s1 = d.stats()
        assert s1["udp.rx_bursts"] - s0["udp.rx_bursts"] == 5
        assert s1["udp.sleeps"] - s0["udp.sleeps"] >= 5
        job.close()
    finally:
        assert d.stop() == 0


def test_many_results_in_flight_arrive_intact(daemon):
    """A window of slots at once: bursts of results (UDP GSO writes) reach every rank intact."""
    job = Job(daemon, "window", world=3)
    slots = 96
    for r, s in enumerate(job.udp):
        for slot in range(slots):
            pkt = data_packet(job.job_id, job.key, r, slot, [slot] * 300 + [r], seq=slot, offset=slot * 301)
            s.sendto(pkt, ("127.0.0.1", job.port_of(slot)))
    for s in job.udp:
        got = {}
        for _ in range(slots):
            pkt = s.recv(65536)
            h = HEADER.unpack(pkt[:32])
            assert h[2] == MSG_RESULT and h[9] == 301, h
            got[h[6]] = list(struct.unpack("<301i", pkt[32:]))
        assert sorted(got) == list(range(slots))
        assert all(v == [3 * slot] * 300 + [0 + 1 + 2] for slot, v in got.items())
    stats = daemon.stats()
    assert stats["completed"] == slots and stats["pkts_out"] == 3 * slots
    print("udp.gso_writes", stats["udp.gso_writes"])
    job.close()


def test_results_wait_only_while_a_round_is_left_open(tmp_path):
    """--hold-us: a burst's results wait for the next bursts' only while the burst leaves a round open,
    and never longer than the hold (src/switch/io/udp/result_hold.h)."""
    hold_s = 0.3
    d = Daemon(tmp_path, "--hold-us", str(int(hold_s * 1e6)), threads=1)
    try:
        job = Job(d, "held", world=2)
        dst = ("127.0.0.1", d.data_port)
        for s in job.udp:
            s.settimeout(5)
        # Nothing left open: rank 0's contribution waits alone, rank 1's completes the round.
        for seq in range(3):
            job.udp[0].sendto(data_packet(job.job_id, job.key, 0, 0, [1], seq=seq), dst)
            time.sleep(0.02)
            t0 = time.monotonic()
            job.udp[1].sendto(data_packet(job.job_id, job.key, 1, 0, [2], seq=seq), dst)
            for s in job.udp:
                h = HEADER.unpack(s.recv(65536)[:32])
                assert h[2] == MSG_RESULT and h[10] == seq, h
            took = time.monotonic() - t0
            assert took < hold_s / 2, f"a round that left nothing open waited {took:.3f} s"
        # Slot 1 completes in the burst that opens slot 2 (when both land in one burst, which the
        # sends' order makes likely): slot 1's result waits for the hold, then goes, nothing lost.
        held_before, waited = d.stats()["udp.held_bursts"], []
        for seq in range(3, 23):
            job.udp[0].sendto(data_packet(job.job_id, job.key, 0, 1, [1], seq=seq), dst)
            time.sleep(0.02)
            t0 = time.monotonic()
            job.udp[1].sendto(data_packet(job.job_id, job.key, 1, 1, [2], seq=seq), dst)
            job.udp[1].sendto(data_packet(job.job_id, job.key, 1, 2, [5], seq=seq), dst)
            for s in job.udp:
                h = HEADER.unpack(s.recv(65536)[:32])
                assert h[2] == MSG_RESULT and h[6] == 1 and h[10] == seq, h
            took = time.monotonic() - t0
            held_now = d.stats()["udp.held_bursts"]
            if held_now > held_before:
                waited.append(took)
                held_before = held_now
            # slot 2 completes: nothing left open, its result goes at once
            job.udp[0].sendto(data_packet(job.job_id, job.key, 0, 2, [3], seq=seq), dst)
            for s in job.udp:
                h = HEADER.unpack(s.recv(65536)[:32])
                assert h[2] == MSG_RESULT and h[6] == 2 and h[10] == seq, h
            if len(waited) >= 3:
                break
        assert waited, "no burst held its results in 20 tries"
        assert all(hold_s * 0.9 <= w < hold_s + 1.0 for w in waited), waited
        job.close()
    finally:
        assert d.stop() == 0


def test_idle_job_is_aborted(tmp_path):
    d = Daemon(tmp_path, "--idle-timeout", "1", threads=1)
    try:
        job = Job(d, "sleepy", world=1)
        other = d.connect()  # requests on an unrelated connection do not keep the job alive

        def aborted():
            st = parse_ok(other.request(f"STATUS job_id={job.job_id}"))
            return st if st["state"] == "aborted" else None

        st = wait_for(aborted, "the idle abort", timeout=8)
        assert st["abort_reason"] == "idle" and int(st["idle_ms"]) >= 1000
        job.udp[0].sendto(data_packet(job.job_id, job.key, 0, 0, [1]), ("127.0.0.1", d.data_port))
        h = HEADER.unpack(job.udp[0].recv(65536)[:32])
        assert h[2] == MSG_ABORT and h[12] == 2, h  # GS_ABORT_IDLE
        other.close()
        job.close()
    finally:
        assert d.stop() == 0
