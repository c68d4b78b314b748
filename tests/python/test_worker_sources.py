"""Whom a worker believes (issue 34, findings 3, 4 and 7; docs/protocol.md §2.1, §4 "ABORT", §7).

A real worker (rank 0) and rank 1 played by the test over plain sockets, so that the test holds the job's
id and key as any rank of the job does, and decides when rank 1 contributes. An attacker's socket sends
RESULT and ABORT datagrams built with that id and key to rank 0's port while rank 0's round waits for
rank 1: they must be dropped and counted (`dropped_foreign`), and the sum must stay right. An ABORT that
even comes from the switch's own data port (spoofed with a raw socket, root only) must not end the job
unless the switch confirms it; a real abort still ends it at once, naming the rank that left. The ring
takes datagrams only from its peers, and the ring without a switch needs a token.
"""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest
from conftest import require_or_skip

import gradswitch
from gradswitch.daemon import parse_kv, read_reply

HDR = struct.Struct(">HBBIIHHBBHIIbbH")  # docs/protocol.md §2, 32 bytes
MAGIC, VERSION = 0x4753, 2
DATA, RESULT, ABORT, RING_PARTIAL, RING_RESULT = 1, 2, 3, 4, 5
INT32 = 1
LAST, UNICAST = 0x08, 0x04
REASON_RANK_LEFT, REASON_OPERATOR = 1, 4
N = 4  # elements: one chunk, in slot 0
DEADLINE_S = 20.0


def header(kind, job_id, key, rank, slot=0, flags=0, count=0, seq=0, offset=0, next_exp=-128) -> bytes:
    elem = INT32 if count else 0
    return HDR.pack(
        MAGIC, VERSION, kind, job_id, key, rank, slot, flags, elem, count, seq, offset, next_exp, 0, 0
    )


def int32s(values) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def counted(g, h, counter: str, n: int):
    """A condition: `n` datagrams counted in `counter`, or (old workers, which believe them) the
    allreduce already ended by them."""
    return lambda: h.done() or g.stats().get(counter, 0) >= n


def wait_for(what: str, cond) -> None:
    """Waits until cond() holds (a condition, not a speed: the deadline only bounds a hang)."""
    end = time.monotonic() + DEADLINE_S
    while not cond():
        assert time.monotonic() < end, f"gave up waiting for {what}"
        time.sleep(0.005)


class RawRank:
    """Rank 1 of a two-rank int32 job, over plain sockets (JOIN on a control connection, DATA by hand)."""

    def __init__(self, sw, name: str):
        self.sw = sw
        self.udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.udp.bind(("127.0.0.1", 0))
        self.ctl = sw.connect()
        self.buf = bytearray()
        self.ctl.sendall(
            f"JOIN job={name} world=2 rank=1 wire=int32 token=t port={self.udp.getsockname()[1]}\n".encode()
        )

    def joined(self) -> None:
        kv = parse_kv(read_reply(self.ctl, self.buf))
        self.job_id, self.key = int(kv["job_id"]), int(kv["key"])
        host, port = kv["peers"].split(",")[0].rsplit(":", 1)
        self.rank0 = (host, int(port))  # what the switch lists (and /proc/net/udp shows anyone)

    def contribute(self, values) -> None:
        pkt = header(DATA, self.job_id, self.key, 1, flags=LAST, count=len(values)) + int32s(values)
        self.udp.sendto(pkt, ("127.0.0.1", self.sw.data_port))

    def rank0_contributed(self) -> bool:
        return self.sw.status(self.job_id)["rank_seq"].split(",")[0] == "0"

    def close(self) -> None:
        self.ctl.close()
        self.udp.close()


@pytest.fixture
def job(start_switch, request):
    """(switch, rank 0's Group, rank 1 played by hand), joined; rank 0's allreduce not started."""
    sw = start_switch(threads=1)
    name = "".join(c if c.isalnum() else "_" for c in request.node.name)[:60]
    raw = RawRank(sw, name)
    g = gradswitch.connect(
        sw.address, job=name, rank=0, world_size=2, wire="int32", token="t", timeout=DEADLINE_S
    )
    raw.joined()
    yield sw, g, raw
    g.close(abort=True)
    raw.close()


def start_round(g, raw):
    """Rank 0's allreduce of [1, 2, 3, 4], in flight once the switch holds rank 0's contribution."""
    x = np.arange(1, N + 1, dtype=np.int32)
    h = g.allreduce_async(x)
    wait_for("rank 0's contribution at the switch", raw.rank0_contributed)
    return x, h


def attacker() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s


def forged_results(raw) -> list[bytes]:
    """RESULTs of rank 0's round (both slot versions, multicast and unicast) with a wrong sum."""
    return [
        header(RESULT, raw.job_id, raw.key, 1, flags=v | extra, count=N) + int32s([1_000_000] * N)
        for v in (0, 1)
        for extra in (0, UNICAST)
    ]


def test_forged_results_from_another_socket_are_dropped_and_counted(job):
    sw, g, raw = job
    x, h = start_round(g, raw)
    forged = forged_results(raw)
    with attacker() as a:
        for pkt in forged:
            a.sendto(pkt, raw.rank0)
    wait_for("the forged results to be dropped", counted(g, h, "dropped_foreign", len(forged)))
    raw.contribute([10, 20, 30, 40])
    h.wait()
    assert x.tolist() == [11, 22, 33, 44]
    assert g.stats().get("dropped_foreign") == len(forged)


def test_a_forged_abort_from_another_socket_does_not_end_the_job(job):
    sw, g, raw = job
    x, h = start_round(g, raw)
    with attacker() as a:
        a.sendto(header(ABORT, raw.job_id, raw.key, 0xFFFF, next_exp=REASON_OPERATOR), raw.rank0)
    wait_for("the forged abort to be dropped", counted(g, h, "dropped_foreign", 1))
    raw.contribute([10, 20, 30, 40])
    h.wait()
    assert x.tolist() == [11, 22, 33, 44]


def spoofer() -> socket.socket:
    """A raw socket that writes IPv4 headers (root, CAP_NET_RAW), or a skip saying so."""
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    except PermissionError:
        require_or_skip("RAW_SOCKETS", "spoofing the switch's source address needs a raw socket (root)")
        raise


def spoofed(src: tuple[str, int], dst: tuple[str, int], payload: bytes) -> bytes:
    """An IPv4/UDP datagram from `src` (checksum 0: none, allowed for UDP over IPv4)."""
    udp = struct.pack(">HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(udp),
        0,
        0,
        64,
        socket.IPPROTO_UDP,
        0,
        socket.inet_aton(src[0]),
        socket.inet_aton(dst[0]),
    )
    return ip + udp


def test_an_abort_datagram_from_the_switch_address_needs_the_switchs_confirmation(job):
    """Even with the switch's source address (spoofed), the datagram alone ends nothing: the control
    connection says the job runs."""
    sw, g, raw = job
    s = spoofer()
    with s:
        x, h = start_round(g, raw)
        pkt = header(ABORT, raw.job_id, raw.key, 0xFFFF, next_exp=REASON_OPERATOR)
        s.sendto(spoofed(("127.0.0.1", sw.data_port), raw.rank0, pkt), raw.rank0)
        wait_for("the abort datagram to be looked at", counted(g, h, "unconfirmed_aborts", 1))
    raw.contribute([10, 20, 30, 40])
    h.wait()
    assert x.tolist() == [11, 22, 33, 44]
    assert g.stats()["dropped_foreign"] == 0  # it passed the source check: the control connection decided


@pytest.mark.parametrize("forger", ["socket", "spoofed"])
def test_a_real_abort_after_a_forged_one_names_the_rank_that_left(job, forger):
    """A forged ABORT first (blaming the operator), then rank 1 really leaves: rank 0 fails at once
    (not at its timeout) with the switch's reason, rank 1 left, never the operator."""
    sw, g, raw = job
    s = spoofer() if forger == "spoofed" else attacker()
    with s:
        x, h = start_round(g, raw)
        pkt = header(ABORT, raw.job_id, raw.key, 0xFFFF, next_exp=REASON_OPERATOR)
        if forger == "spoofed":
            s.sendto(spoofed(("127.0.0.1", sw.data_port), raw.rank0, pkt), raw.rank0)
            wait_for("the abort datagram to be looked at", counted(g, h, "unconfirmed_aborts", 1))
        else:
            s.sendto(pkt, raw.rank0)
            wait_for("the forged abort to be dropped", counted(g, h, "dropped_foreign", 1))
    assert not h.done(), h.wait()  # raises what ended it
    raw.ctl.close()  # rank 1 "crashes": its control connection closes without LEAVE
    with pytest.raises(gradswitch.JobAborted) as info:
        h.wait()
    assert info.value.rank == 1 and info.value.reason == REASON_RANK_LEFT, str(info.value)
    assert "rank 1 left the job" in str(info.value) and "control plane" not in str(info.value)


def test_the_data_socket_binds_the_address_that_reaches_the_switch(job):
    """Not 0.0.0.0 (finding 3: any interface then takes datagrams for it)."""
    sw, g, raw = job
    host, port = raw.rank0
    assert host == "127.0.0.1"
    with open("/proc/net/udp") as f:
        local = [line.split()[1] for line in f.readlines()[1:]]
    assert f"0100007F:{port:04X}" in local, f"rank 0's port {port} is not bound to 127.0.0.1"
    assert f"00000000:{port:04X}" not in local


def ring_identity(job: str, token: str, world: int) -> tuple[int, int]:
    """docs/protocol.md §7: FNV-1a-64 of job, token and world size."""
    h = 0xCBF29CE484222325
    for c in f"{job}\n{token}\n{world}".encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return (h & 0xFFFFFFFF) | 1, h >> 32


def test_the_ring_takes_datagrams_only_from_its_peers():
    """Ring without a switch: rank 1 played by hand. A RING_RESULT with the right ids from a third
    socket is dropped; rank 1's own answer completes the sum."""
    r1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r1.bind(("127.0.0.1", 0))
    r0 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r0.bind(("127.0.0.1", 0))
    port0 = r0.getsockname()[1]
    r0.close()  # rank 0 binds its own entry's port
    peers = [f"127.0.0.1:{port0}", f"127.0.0.1:{r1.getsockname()[1]}"]
    job_id, key = ring_identity("ringsrc", "s3cret", 2)
    g = gradswitch.connect(
        None,
        job="ringsrc",
        rank=0,
        world_size=2,
        wire="int32",
        algorithm="ring",
        peers=peers,
        token="s3cret",
        timeout=DEADLINE_S,
    )
    try:
        x = np.arange(1, N + 1, dtype=np.int32)
        h = g.allreduce_async(x)
        r1.settimeout(DEADLINE_S)
        while True:  # rank 0's partial of slot 0 (root 0): rank 1 holds the sum's other half
            pkt, _ = r1.recvfrom(65536)
            f = HDR.unpack_from(pkt)
            if f[2] == RING_PARTIAL and f[6] == 0:
                break
        assert (f[3], f[4]) == (job_id, key)
        partial = np.frombuffer(pkt[32:], dtype="<i4")
        fields = list(f)
        fields[2], fields[5] = RING_RESULT, 1  # type, rank (the sender: rank 0's next)
        with attacker() as a:
            a.sendto(HDR.pack(*fields) + int32s([1_000_000] * N), ("127.0.0.1", port0))
        wait_for("the forged ring result to be dropped", counted(g, h, "dropped_foreign", 1))
        r1.sendto(HDR.pack(*fields) + int32s(partial + np.array([10, 20, 30, 40])), ("127.0.0.1", port0))
        h.wait()
        assert x.tolist() == [11, 22, 33, 44]
    finally:
        g.close(abort=True)
        r1.close()


def test_the_ring_without_a_switch_needs_a_token():
    """The ring's id and key derive from job, world size and token: no default token (finding 7)."""
    for switch, algorithm in ((None, "ring"), ("127.0.0.1:1", "auto")):
        with pytest.raises(ValueError, match="pass token="):
            gradswitch.connect(
                switch,
                job="j",
                rank=0,
                world_size=2,
                algorithm=algorithm,
                peers=["127.0.0.1:1", "127.0.0.1:2"],
                connect_timeout=0.5,
            )
