"""Black-box tests of optimization in the switch (docs/protocol.md §1.3) with raw sockets.

JOIN's optimizer keys and their agreement, the memory check, PARAMS / SETLR / STATE_GET /
STATE_SET including their binary framing, and steps applied through real DATA packets: exactly
once per round, also when a result is lost and the round retransmitted.
"""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from test_switch_daemon import (
    HEADER,
    MAGIC,
    MSG_DATA,
    MSG_RESULT,
    VERSION,
    Daemon,
    parse_ok,
    udp_socket,
    wait_for,
)

FLOAT32 = 2
FLAG_RETX, FLAG_UNICAST, FLAG_DSACK = 2, 4, 0x20
CHUNK = 360  # float32 elements per packet with the default --mtu 1500


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, "--join-timeout", "5", "--slots", "8")
    yield d
    rc = d.stop()
    print(f"--- gradswitchd log ---\n{d.log()[-4000:]}")
    assert rc == 0, f"gradswitchd exited {rc}"


def f32_packet(job_id, key, rank, slot, version, values, seq, offset, flags=0):
    values = np.asarray(values, dtype="<f4")
    h = HEADER.pack(
        MAGIC,
        VERSION,
        MSG_DATA,
        job_id,
        key,
        rank,
        slot,
        version | flags,
        FLOAT32,
        len(values),
        seq,
        offset,
        -128,
        0,
        0,
    )
    return h + values.tobytes()


def recv_exact(sock: socket.socket, n: int, buf: bytearray) -> bytes:
    while len(buf) < n:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed by the switch")
        buf += chunk
    out = bytes(buf[:n])
    del buf[:n]
    return out


class Conn:
    """A control connection that can also send and receive the binary payloads."""

    def __init__(self, daemon: Daemon):
        self.sock = socket.create_connection(("127.0.0.1", daemon.control_port), timeout=10)
        self.buf = bytearray()
        self.events: list[str] = []  # EVENT lines, set aside (docs/protocol.md §1.4)

    def send(self, data: bytes | str):
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def readline(self) -> str:
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    raise ConnectionError(f"closed by the switch (buffered {bytes(self.buf)!r})")
                self.buf += chunk
            i = self.buf.index(b"\n")
            line = self.buf[:i].decode()
            del self.buf[: i + 1]
            if not line.startswith("EVENT "):
                return line
            self.events.append(line)

    def request(self, line: str) -> str:
        self.send(line + "\n")
        return self.readline()

    def read(self, n: int) -> bytes:
        return recv_exact(self.sock, n, self.buf)

    def closed_by_switch(self, timeout=5.0) -> bool:
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    return True
                self.buf += chunk
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def upload_params(self, values, offset=0) -> str:
        values = np.asarray(values, dtype="<f4")
        self.send(f"PARAMS offset={offset} count={len(values)}\n".encode() + values.tobytes())
        return self.readline()

    def state_get(self) -> tuple[dict[str, str], bytes]:
        kv = parse_ok(self.request("STATE_GET"))
        return kv, self.read(int(kv["bytes"]))

    def state_set(self, blob: bytes) -> str:
        self.send(f"STATE_SET bytes={len(blob)}\n".encode() + blob)
        return self.readline()

    def close(self):
        self.sock.close()


def opt_keys(params, algo="sgd", lr="0.5", extra=""):
    return f"optimizer={algo} params={params} lr={lr} {extra}".strip()


class OptJob:
    def __init__(self, daemon: Daemon, name: str, params: int, world: int = 2, keys: str | None = None):
        self.daemon, self.world, self.params = daemon, world, params
        self.udp = [udp_socket() for _ in range(world)]
        self.ctl = [Conn(daemon) for _ in range(world)]
        keys = keys if keys is not None else opt_keys(params)
        for r in range(world):
            port = self.udp[r].getsockname()[1]
            self.ctl[r].send(
                f"JOIN job={name} world={world} rank={r} wire=float32 token=t port={port} {keys}\n"
            )
        self.replies = [parse_ok(c.readline()) for c in self.ctl]
        self.job_id, self.key = int(self.replies[0]["job_id"]), int(self.replies[0]["key"])
        self.version = {}  # per slot: the version of its next round
        self.seq = 0

    def port_of(self, slot):
        return self.daemon.data_port + slot % self.daemon.threads

    def step(self, grads: list[np.ndarray], lose_result_of: int | None = None) -> np.ndarray:
        """One allreduce of the whole tensor, a chunk per slot; returns rank 0's result.

        With `lose_result_of=r`, rank r discards its first result of every chunk and retransmits.
        """
        n = self.params
        out = [np.zeros(n, np.float32) for _ in range(self.world)]
        for c0 in range(0, n, CHUNK):
            slot = (c0 // CHUNK) % 8
            v = self.version.get(slot, 0)
            self.version[slot] = v ^ 1
            pkts = [
                f32_packet(self.job_id, self.key, r, slot, v, grads[r][c0 : c0 + CHUNK], self.seq, c0)
                for r in range(self.world)
            ]
            for r in range(self.world):
                self.udp[r].sendto(pkts[r], ("127.0.0.1", self.port_of(slot)))
            for r in range(self.world):
                res = self.udp[r].recv(65536)
                h = HEADER.unpack(res[:32])
                assert h[2] == MSG_RESULT and h[11] == c0 and h[10] == self.seq, h
                if r == lose_result_of:  # "lost": ask again; the shadow copy answers
                    self.udp[r].sendto(
                        f32_packet(
                            self.job_id,
                            self.key,
                            r,
                            slot,
                            v,
                            grads[r][c0 : c0 + CHUNK],
                            self.seq,
                            c0,
                            FLAG_RETX,
                        ),
                        ("127.0.0.1", self.port_of(slot)),
                    )
                    again = self.udp[r].recv(65536)
                    assert HEADER.unpack(again[:32])[7] == v | FLAG_UNICAST | FLAG_DSACK  # it held our part
                    assert again[32:] == res[32:]
                    res = again
                out[r][c0 : c0 + h[9]] = np.frombuffer(res[32:], "<f4")
        self.seq += 1
        for r in range(1, self.world):
            assert out[r].tobytes() == out[0].tobytes()
        return out[0]

    def close(self):
        for c in self.ctl:
            c.close()
        for s in self.udp:
            s.close()


def blob_arrays(blob: bytes, params: int, arrays: int):
    body = np.frombuffer(blob[32 : 32 + arrays * params * 4], "<f4").reshape(arrays, params)
    steps = np.frombuffer(blob[32 + arrays * params * 4 :], "<u4")
    return body, steps


# ---------------------------------------------------------------------------------------------


def test_join_reply_names_the_optimizer_and_state_size(daemon):
    job = OptJob(daemon, "reply", params=1000, keys=opt_keys(1000, "adam", "0.001"))
    rep = job.replies[0]
    assert rep["optimizer"] == "adam" and rep["params"] == "1000" and rep["chunk"] == str(CHUNK)
    assert int(rep["state_bytes"]) == 32 + 3 * 1000 * 4 + 3 * 4
    job.close()


@pytest.mark.parametrize("other", [opt_keys(100, lr="0.25"), opt_keys(101), opt_keys(100, "adam"), ""])
def test_ranks_must_agree_on_the_optimizer(daemon, other):
    a, b = Conn(daemon), Conn(daemon)
    a.send(f"JOIN job=agree world=2 rank=0 wire=float32 token=t port=5000 {opt_keys(100)}\n")
    rep = b.request(f"JOIN job=agree world=2 rank=1 wire=float32 token=t port=5001 {other}")
    assert rep.startswith("ERR conflict") and "optimizer" in rep, rep
    # The waiting rank is told at once: the job cannot start.
    rep = a.readline()
    assert rep.startswith("ERR conflict") and "cancelled" in rep, rep
    # Same values written differently agree.
    a.send(f"JOIN job=agree world=2 rank=0 wire=float32 token=t port=5000 {opt_keys(100)}\n")
    rep = b.request(
        "JOIN job=agree world=2 rank=1 wire=float32 token=t port=5001 optimizer=sgd params=100 lr=5e-1 "
        "momentum=0 average=1"
    )
    assert rep.startswith("OK"), rep
    assert a.readline().startswith("OK")
    a.close(), b.close()


def test_bad_optimizer_keys_are_bad_requests(daemon):
    c = Conn(daemon)
    for keys, mention in [
        ("optimizer=adam params=10 lr=1 momentum=0.9", "does not apply"),
        ("optimizer=adam params=10", "lr="),
        ("lr=0.1", "optimizer="),
        ("optimizer=sgd params=10 lr=1 wire2=1", "unknown key"),
    ]:
        rep = c.request(f"JOIN job=bad world=1 rank=0 wire=float32 token=t port=5000 {keys}")
        assert rep.startswith("ERR bad_request") and mention in rep, rep
    rep = c.request("JOIN job=bad world=1 rank=0 wire=fixed32 token=t port=5000 optimizer=sgd params=10 lr=1")
    assert rep.startswith("ERR bad_request") and "float32" in rep, rep
    c.close()


def test_memory_check_names_the_bytes(tmp_path):
    d = Daemon(tmp_path, "--max-memory", "64M", "--slots", "8")
    try:
        c = Conn(d)
        rep = c.request(
            f"JOIN job=big world=1 rank=0 wire=float32 token=t port=5000 {opt_keys(10_000_000, 'adam')}"
        )
        assert rep.startswith("ERR no_resources"), rep
        opt_bytes = 10_000_000 * 4 * 3 + -(-10_000_000 // CHUNK) * 4  # docs/optimizer.md's formula
        assert f"optimizer {opt_bytes} for 10000000 parameters" in rep and "--max-memory" in rep, rep
        rep = c.request(
            f"JOIN job=fits world=1 rank=0 wire=float32 token=t port=5000 {opt_keys(1_000_000, 'adam')}"
        )
        assert rep.startswith("OK"), rep
        c.close()
    finally:
        assert d.stop() == 0


def test_sgd_step_through_the_switch_exactly_once(daemon):
    n = 1000  # 3 chunks, the last one short
    job = OptJob(daemon, "sgd", params=n, keys=opt_keys(n, "sgd", "0.5"))
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(n).astype(np.float32)
    assert job.ctl[0].upload_params(p0) == "OK"
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(2)]
    got = job.step(grads, lose_result_of=1)
    gsum = grads[0] + grads[1]
    want = p0 - np.float32(0.5) * (gsum * np.float32(0.5))
    np.testing.assert_array_equal(got, want)
    kv, blob = job.ctl[1].state_get()  # any rank may read
    assert kv["algo"] == "sgd" and kv["params"] == str(n) and kv["arrays"] == "2" and kv["chunks"] == "3"
    body, steps = blob_arrays(blob, n, 2)
    np.testing.assert_array_equal(body[0], want)
    assert list(steps) == [1, 1, 1]  # the retransmissions did not step again
    # SETLR changes the next step.
    assert job.ctl[0].request("SETLR lr=0.25") == "OK lr=0.25"
    got2 = job.step(grads)
    np.testing.assert_array_equal(got2, want - np.float32(0.25) * (gsum * np.float32(0.5)))
    assert parse_ok(job.ctl[0].request("STATUS"))["state"] == "running"
    job.close()


def test_params_and_state_errors_keep_the_connection_framed(daemon):
    n = 100
    job = OptJob(daemon, "errs", params=n)
    c0, c1 = job.ctl
    # Rank 1 may not upload; the payload is consumed, the connection stays usable.
    rep = c1.upload_params(np.ones(4))
    assert rep.startswith("ERR state") and "rank 0" in rep, rep
    assert c1.request("PING") == "OK"
    rep = c0.upload_params(np.ones(10), offset=95)
    assert rep.startswith("ERR bad_request") and "beyond" in rep, rep
    c0.send(b"PARAMS offset=0 count=2 junk=1\n" + b"\n\n\n\n\n\n\n\n")
    rep = c0.readline()
    assert rep.startswith("ERR bad_request") and "junk" in rep, rep
    assert c0.request("PING") == "OK"
    # STATE_SET with the wrong size: consumed, ERR conflict naming the size.
    rep = c0.state_set(b"\0" * 40)
    assert rep.startswith("ERR conflict") and "bytes" in rep, rep
    kv, blob = c0.state_get()
    bad = b"XXXXXXXX" + blob[8:]
    rep = c0.state_set(bad)
    assert rep.startswith("ERR bad_request") and "magic" in rep, rep
    assert c0.request("PING") == "OK"
    # Nothing was changed by the rejected requests.
    assert c0.state_get()[1] == blob
    assert c0.request("SETLR lr=-1").startswith("ERR bad_request")
    job.close()


@pytest.mark.parametrize(
    "line",
    [
        b"PARAMS offset=0\n",
        b"PARAMS offset=0 count=zz\n",
        b"STATE_SET\n",
        b"PARAMS offset=0 count=4 Bad=1\n",
        b"STATE_SET bytes=99999999999999999\n",
    ],
)
def test_unknown_payload_length_closes_the_connection(daemon, line):
    c = Conn(daemon)
    c.send(line + b"\x00\x01\x02\x03" * 8)
    assert c.readline().startswith("ERR bad_request")
    assert c.closed_by_switch()
    other = Conn(daemon)  # the daemon is unaffected
    assert other.request("PING") == "OK"
    other.close()


def test_verbs_need_an_optimizer_job(daemon):
    c = Conn(daemon)
    assert c.request("SETLR lr=0.1").startswith("ERR state")
    assert c.request("STATE_GET").startswith("ERR state")
    assert c.upload_params([1.0, 2.0]).startswith("ERR state")
    u = udp_socket()
    c.send(f"JOIN job=plain world=1 rank=0 wire=float32 token=t port={u.getsockname()[1]}\n")
    assert c.readline().startswith("OK")
    rep = c.request("SETLR lr=0.1")
    assert rep.startswith("ERR state") and "optimizer" in rep, rep
    assert c.state_set(b"x" * 10).startswith("ERR state")
    assert c.request("PING") == "OK"
    c.close()
    u.close()


def test_checkpoint_restore_continues_bit_for_bit(daemon):
    n = 777
    keys = opt_keys(n, "adam", "0.01", "eps_mode=torch")
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(n).astype(np.float32)
    grads = [[rng.standard_normal(n).astype(np.float32) for _ in range(2)] for _ in range(6)]

    a = OptJob(daemon, "ckpt-a", params=n, keys=keys)
    assert a.ctl[0].upload_params(p0) == "OK"
    for g in grads[:3]:
        a.step(g)
    assert a.ctl[0].request("SETLR lr=0.005").startswith("OK")
    kv, blob = a.ctl[0].state_get()
    assert kv["lr"] == "0.005"
    ref = [a.step(g) for g in grads[3:]]
    a.close()

    b = OptJob(daemon, "ckpt-b", params=n, keys=keys)
    assert b.ctl[0].state_set(blob) == "OK"
    assert b.ctl[1].state_get()[1] == blob  # includes the lr and the step counters
    b.seq = 3  # any seq works; keep the same for readability
    for g, want in zip(grads[3:], ref, strict=True):
        assert b.step(g).tobytes() == want.tobytes()
    b.close()


def test_large_upload_streams_and_does_not_stall_others(daemon):
    n = 6_000_000  # 24 MB of parameters, 72 MB of Adam state to read back
    job = OptJob(daemon, "large", params=n, world=1, keys=opt_keys(n, "adam", "0.001"))
    c = job.ctl[0]
    p = np.arange(n, dtype=np.float32)
    payload = p.tobytes()
    c.send(f"PARAMS offset=0 count={n}\n".encode() + payload[: len(payload) // 2])
    # Half-way through the upload, the control plane still serves everyone else promptly.
    other = Conn(daemon)
    t0 = time.monotonic()
    assert other.request("PING") == "OK"
    assert time.monotonic() - t0 < 1.0
    c.send(payload[len(payload) // 2 :])
    assert c.readline() == "OK"
    kv, blob = c.state_get()
    body, steps = blob_arrays(blob, n, 3)
    assert body[0].tobytes() == payload and not body[1].any() and not body[2].any() and not steps.any()
    assert other.request("PING") == "OK"
    other.close()
    job.close()


def test_disconnect_during_upload_aborts_the_job(daemon):
    job = OptJob(daemon, "cut", params=1000)
    job.ctl[0].send(b"PARAMS offset=0 count=1000\n" + b"\0" * 100)
    job.ctl[0].close()
    wait_for(lambda: parse_ok(job.ctl[1].request("STATUS"))["state"] == "aborted", "the job to abort")
    job.ctl[1].close()
    for s in job.udp:
        s.close()
