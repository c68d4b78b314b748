"""The Wireshark/tshark dissector (tools/wireshark/gradswitch.lua) decodes what was sent.

Two captures: one written here, datagram by datagram, covering every message type, element type,
flag, ABORT reason and malformed length (the decoded fields must equal the packed ones); and one of
real traffic, a testbed allreduce through gradswitchd captured with tcpdump (root; skipped with the
reason otherwise, failed under GRADSWITCH_REQUIRE_NETNS=1), whose decoded elements must be each
rank's gradient and the sums. Any "Lua Error" fails the test.
"""

from __future__ import annotations

import math
import re
import signal
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from gradswitch import _tools

REPO = Path(__file__).resolve().parents[2]
DISSECTOR = REPO / "tools" / "wireshark" / "gradswitch.lua"
HEADER = struct.Struct(">HBBIIHHBBHIIbbH")
ELEM = {
    1: ("int32", "<i", 4),
    2: ("float32", "<f", 4),
    3: ("fixed32", "<i", 4),
    4: ("float16", "<e", 2),
    5: ("bfloat16", None, 2),
    6: ("float64", "<d", 8),
}
FIELDS = [
    "frame.number",
    "gradswitch.magic",
    "gradswitch.version",
    "gradswitch.type",
    "gradswitch.job_id",
    "gradswitch.key",
    "gradswitch.rank",
    "gradswitch.slot",
    "gradswitch.flags",
    "gradswitch.flags.version",
    "gradswitch.flags.retx",
    "gradswitch.flags.unicast",
    "gradswitch.flags.last",
    "gradswitch.flags.sum",
    "gradswitch.flags.dsack",
    "gradswitch.flags.concede",
    "gradswitch.elem_type",
    "gradswitch.count",
    "gradswitch.seq",
    "gradswitch.offset",
    "gradswitch.next_exp",
    "gradswitch.abort_reason",
    "gradswitch.scale_exp",
    "gradswitch.reserved",
    "gradswitch.window",
    "gradswitch.contributors",
]


def tshark() -> str:
    try:
        return _tools.require("tshark")
    except _tools.ToolMissing as e:
        pytest.fail(str(e))


def decode(pcap: Path, fields: list[str], *extra: str) -> list[dict[str, str]]:
    """tshark's decoded fields of every gradswitch packet; fails on any Lua error."""
    base = [
        tshark(),
        "-n",
        "-X",
        f"lua_script:{DISSECTOR}",
        "-o",
        "gradswitch.max_elements:100000",
        "-r",
        str(pcap),
        *extra,
    ]
    verbose = subprocess.run([*base, "-V"], capture_output=True, text=True, timeout=120)
    assert verbose.returncode == 0, verbose.stderr
    for text in (verbose.stdout, verbose.stderr):
        assert "Lua Error" not in text and "lua_script" not in text, text[-3000:]
    cmd = [
        *base,
        "-Y",
        "gradswitch",
        "-T",
        "fields",
        "-E",
        "separator=\t",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ]
    for name in fields:
        cmd += ["-e", name]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [dict(zip(fields, line.split("\t"), strict=True)) for line in r.stdout.splitlines()]


def ipv4_udp(payload: bytes, src: str, dst: str, sport: int, dport: int) -> bytes:
    udp = struct.pack(">HHHH", sport, dport, 8 + len(payload), 0) + payload
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(udp),
        0,
        0x4000,
        64,
        17,
        0,
        bytes(map(int, src.split("."))),
        bytes(map(int, dst.split("."))),
    )
    csum = sum(struct.unpack(">10H", ip))
    csum = (csum & 0xFFFF) + (csum >> 16)
    csum = ~((csum & 0xFFFF) + (csum >> 16)) & 0xFFFF
    return ip[:10] + struct.pack(">H", csum) + ip[12:] + udp


def write_pcap(path: Path, datagrams: list[bytes]) -> None:
    """A libpcap file of raw IPv4 packets (LINKTYPE_RAW), one UDP datagram each."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 101))
        for i, d in enumerate(datagrams):
            pkt = ipv4_udp(d, "10.0.0.2", "10.0.0.1", 40000, 7701 + i % 2)
            f.write(struct.pack("<IIII", 1_700_000_000 + i, 0, len(pkt), len(pkt)) + pkt)


def is_set(flag: str) -> bool:
    return flag in ("1", "True")


def bf16(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0] >> 16


def encode(elem: int, values) -> bytes:
    if not values:
        return b""
    if elem == 5:
        return b"".join(struct.pack("<H", bf16(v)) for v in values)
    fmt = ELEM[elem][1]
    return b"".join(struct.pack(fmt, v) for v in values)


def test_every_field_of_written_packets(tmp_path):
    # (fields, element values or None); the header fields in HEADER's order after magic/version
    cases = []

    def add(
        mtype,
        job,
        key,
        rank,
        slot,
        flags,
        elem,
        count,
        seq,
        offset,
        next_exp,
        scale,
        values=(),
        last16=0,
        trailing=b"",
    ):
        hdr = HEADER.pack(
            0x4753, 2, mtype, job, key, rank, slot, flags, elem, count, seq, offset, next_exp, scale, last16
        )
        cases.append(
            (
                dict(
                    type=mtype,
                    job_id=job,
                    key=key,
                    rank=rank,
                    slot=slot,
                    flags=flags,
                    elem=elem,
                    count=count,
                    seq=seq,
                    offset=offset,
                    next_exp=next_exp,
                    scale=scale,
                    last16=last16,
                ),
                list(values),
                hdr + encode(elem, values) + trailing,
            )
        )

    # bytes 30-31: DATA, the sender's window; RESULT, the smallest its round's DATA declared; others 0
    add(1, 0x100, 0xA5A5A5A5, 0, 0, 0x00, 1, 4, 0, 0, -128, 0, [1, -2, 2**31 - 1, -(2**31)], last16=64)
    add(1, 0x100, 0xA5A5A5A5, 1, 1, 0x01 | 0x02, 2, 3, 7, 360, -128, 0, [1.5, -0.25, 3e38])
    add(2, 0x100, 0xA5A5A5A5, 1, 2, 0x01, 3, 2, 0xFFFFFFFF, 720, 3, 26, [2**26, -3 * 2**24], last16=96)
    # a UNICAST+DSACK answer whose round rank 2 completed, the smallest window declared 65535
    add(2, 0x100, 0xA5A5A5A5, 2, 3, 0x24, 4, 3, 5, 16, -128, 0, [1.0, -2.5, 65504.0], last16=0xFFFF)
    # a leaf's RESULT whose round another rack completed
    add(2, 0x100, 0xA5A5A5A5, 0xFFFF, 3, 0x00, 1, 1, 5, 16, -128, 0, [3], last16=12)
    # HELD with DSACK; its body: the round's contributors (ranks 0, 2 and 63)
    add(7, 0x100, 0xA5A5A5A5, 0xFFFF, 3, 0x21, 4, 0, 5, 16, -128, 0, trailing=struct.pack(">Q", 1 << 63 | 5))
    add(1, 0x200, 0x01020304, 63, 65535, 0x08 | 0x01, 5, 3, 9, 4294967295 - 3, -128, 0, [1.0, -0.5, 256.0])
    add(1, 0x300, 7, 2, 4, 0x08, 6, 2, 1, 2, -128, 0, [2.0**53, 0.1])
    add(4, 0x301, 7, 1, 5, 0x12, 2, 1, 3, 8, -128, 0, [42.0])  # RING_PARTIAL, RETX|SUM
    add(5, 0x301, 7, 2, 5, 0x04, 1, 1, 3, 8, -128, 0, [-7])  # RING_RESULT, UNICAST
    add(6, 0x301, 7, 0, 0, 0x00, 0, 0, 3, 0, -128, 0)  # RING_DONE
    add(1, 0x100, 0xA5A5A5A5, 0, 7, 0x08, 3, 0, 4, 100, -3, -128)  # fixed32 exponent round, count 0
    for reason in range(1, 7):  # ABORT: the reason travels in next_exp
        add(3, 0x100, 0xA5A5A5A5, 0xFFFF if reason % 2 else 1, 0, 0, 0, 0, 1, 0, reason, 0)
    add(1, 0x100, 0xA5A5A5A5, 0, 0, 0x60, 2, 2, 0, 0, -128, 0, [1.0, 2.0], last16=0xBEEF)
    # a concession (protocol.md 3.1): the header alone, its count the chunk's, no elements
    concede_index = len(cases)
    add(1, 0x100, 0xA5A5A5A5, 2, 1, 0x80 | 0x02, 1, 4, 3, 8, -128, 0, last16=8)
    add(6, 0x301, 7, 0, 0, 0x00, 0, 0, 3, 0, -128, 0, last16=0xBEEF)  # RING_DONE: reserved, not 0
    bad_len_index = len(cases)
    add(1, 0x100, 0xA5A5A5A5, 0, 0, 0, 2, 2, 0, 0, -128, 0, [1.0, 2.0], trailing=b"\x00\x00")
    add(1, 0x100, 0xA5A5A5A5, 0, 0, 0x80, 1, 1, 0, 0, -128, 0, [5])  # a concession with a payload
    datagrams = [c[2] for c in cases]
    # not gradswitch: wrong magic, wrong version, unknown type, too short, plain text
    others = [
        b"GT\x02\x01" + bytes(28),
        b"GS\x01\x01" + bytes(28),
        b"GS\x02\x09" + bytes(28),
        b"GS\x02\x01" + bytes(10),
        b"hello, not a gradswitch datagram at all......",
    ]
    pcap = tmp_path / "written.pcap"
    write_pcap(pcap, datagrams + others)

    value_fields = [f"gradswitch.{ELEM[e][0]}" for e in ELEM] + ["gradswitch.fixed32_value"]
    rows = decode(
        pcap,
        FIELDS
        + value_fields
        + ["gradswitch.bad_length", "gradswitch.reserved_set", "gradswitch.payload", "_ws.col.Info"],
    )
    assert [int(r["frame.number"]) for r in rows] == list(range(1, len(cases) + 1)), "heuristic"
    for i, ((want, values, _), row) in enumerate(zip(cases, rows, strict=True)):
        where = f"packet {i + 1}: {row}"
        assert int(row["gradswitch.magic"], 16) == 0x4753 and row["gradswitch.version"] == "2", where
        assert int(row["gradswitch.type"]) == want["type"], where
        assert int(row["gradswitch.job_id"], 0) == want["job_id"], where
        assert int(row["gradswitch.key"], 16) == want["key"], where
        assert int(row["gradswitch.rank"]) == want["rank"], where
        assert int(row["gradswitch.slot"]) == want["slot"], where
        assert int(row["gradswitch.flags"], 16) == want["flags"], where
        assert int(row["gradswitch.flags.version"]) == want["flags"] & 1, where
        for name, bit in (
            ("retx", 2),
            ("unicast", 4),
            ("last", 8),
            ("sum", 16),
            ("dsack", 32),
            ("concede", 128),
        ):
            assert is_set(row[f"gradswitch.flags.{name}"]) == bool(want["flags"] & bit), (name, where)
        assert int(row["gradswitch.elem_type"]) == want["elem"], where
        assert int(row["gradswitch.count"]) == want["count"], where
        assert int(row["gradswitch.seq"]) == want["seq"], where
        assert int(row["gradswitch.offset"]) == want["offset"], where
        assert int(row["gradswitch.scale_exp"]) == want["scale"], where
        if want["type"] in (1, 2):  # DATA, RESULT: bytes 30-31 are a window
            assert int(row["gradswitch.window"]) == want["last16"], where
            assert row["gradswitch.reserved"] == "", where
        else:
            assert row["gradswitch.window"] == "", where
            assert int(row["gradswitch.reserved"], 16) == want["last16"], where
            assert bool(row["gradswitch.reserved_set"]) == (want["last16"] != 0), where
        if want["type"] == 3:
            assert int(row["gradswitch.abort_reason"]) == want["next_exp"], where
            assert row["gradswitch.next_exp"] == "", where
            reason = ["rank_left", "idle", "shutdown", "operator", "mismatch", "uplink"][want["next_exp"] - 1]
            assert f"reason {reason}" in row["_ws.col.Info"], where
        else:
            assert int(row["gradswitch.next_exp"]) == want["next_exp"], where
        if want["type"] == 7:
            assert int(row["gradswitch.contributors"], 16) == 1 << 63 | 5, where
        else:
            assert row["gradswitch.contributors"] == "", where
        assert bool(row["gradswitch.bad_length"]) == (i >= bad_len_index), where
        if i == concede_index:
            assert row["gradswitch.int32"] == "" and row["gradswitch.payload"] == "", where
            assert "[RETX,CONCEDE]" in row["_ws.col.Info"], where
        if want["count"] and i < bad_len_index and i != concede_index:
            name = ELEM[want["elem"]][0]
            got = [float(v) for v in row[f"gradswitch.{name}"].split(",")]
            expect = [float(v) for v in values]
            if name == "float32":
                expect = [struct.unpack("<f", struct.pack("<f", v))[0] for v in expect]
            assert got == pytest.approx(expect, rel=1e-6), where
            if name == "fixed32":
                scaled = [float(v) for v in row["gradswitch.fixed32_value"].split(",")]
                assert scaled == [math.ldexp(v, -want["scale"]) for v in values], where


def test_decodes_a_captured_testbed_allreduce(tmp_path):
    """tcpdump on the testbed's bridge while two workers allreduce with injected loss."""
    from _netns import require_netns, unique

    require_netns()
    try:
        _tools.require("tcpdump")
    except _tools.ToolMissing as e:
        pytest.fail(str(e))
    from gradswitch import testbed
    from gradswitch.baselines.common import expected_sum, grad
    from gradswitch.baselines.gradswitch_sys import DATA_PORT, run_gradswitch

    n, iters, threads = 5000, 2, 2
    pcap = tmp_path / "testbed.pcap"
    with testbed.Testbed(workers=2, rate="none", name=unique("ws")) as tb:
        tcpdump = ["tcpdump", "-i", testbed.core.BRIDGE, "-U", "-Z", "root", "-w", pcap, "udp"]
        dump = tb.popen("switch", tcpdump, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 10
            line = b""
            while b"listening" not in line and time.monotonic() < deadline and dump.poll() is None:
                line = dump.stderr.readline()
            assert b"listening" in line, f"tcpdump did not start: {line!r}"
            res = run_gradswitch(
                tb,
                nbytes=4 * n,
                iters=iters,
                warmup=0,
                threads=threads,
                drop_rate=0.05,
                gso=False,
                timeout=120,
            )
        finally:
            # tcpdump gets packets from the kernel in blocks retired after at most 1 s (its buffer
            # timeout): a block still open at SIGINT would never reach the file
            time.sleep(1.5)
            dump.send_signal(signal.SIGINT)
            dump.communicate(timeout=10)
        ip_rank = {tb.address(f"w{r}"): r for r in range(2)}
        switch_ip = tb.address("switch")
    assert res.extra["workers"]["retransmissions"] > 0, "the injected loss caused no retransmission"

    rows = decode(pcap, FIELDS + ["ip.src", "ip.dst", "udp.dstport", "gradswitch.float32"])
    assert rows, "no gradswitch packet decoded from the capture"
    assert len({(r["gradswitch.job_id"], r["gradswitch.key"]) for r in rows}) == 1, "one job, one key"
    payload = 1500 - 60
    chunk = payload // 4
    # the run's allreduces: a 1-element barrier (even seq), then the gradient of iteration it (odd seq)
    seen_data: dict[tuple[int, int, int], int] = {}  # (rank, seq, offset) -> the window its DATA declared
    results = retx = windows_checked = 0
    for r in rows:
        mtype, seq = int(r["gradswitch.type"]), int(r["gradswitch.seq"])
        off, count = int(r["gradswitch.offset"]), int(r["gradswitch.count"])
        if mtype == 7:  # HELD: a resend found its round open; to the ranks it lacks (DSACK: and the resender)
            assert count == 0 and r["ip.src"] == switch_ip and int(r["gradswitch.rank"]) == 0xFFFF, r
            contributors = int(r["gradswitch.contributors"], 16)
            assert 0 < contributors < 1 << len(ip_rank), r
            if not is_set(r["gradswitch.flags.dsack"]):  # the resend was needed: only the lacking are told
                assert not contributors >> ip_rank[r["ip.dst"]] & 1, r
            continue
        values = np.array([float(v) for v in r["gradswitch.float32"].split(",")] if count else [], np.float32)
        it, is_grad = seq // 2, seq % 2 == 1
        size = n if is_grad else 1
        assert count == min(chunk, size - off), r
        # LAST marks a rank's last chunk (DATA); the switch's RESULT carries only the slot version
        assert is_set(r["gradswitch.flags.last"]) == (mtype == 1 and off + count == size), r
        assert int(r["gradswitch.elem_type"]) == 2, r
        if mtype == 1:
            rank = int(r["gradswitch.rank"])
            assert ip_rank[r["ip.src"]] == rank and r["ip.dst"] == switch_ip, r
            assert int(r["udp.dstport"]) == DATA_PORT + int(r["gradswitch.slot"]) % threads, r
            want = grad(rank, n, it)[off : off + count] if is_grad else np.zeros(1, np.float32)
            np.testing.assert_array_equal(values, want, err_msg=str(r))
            assert int(r["gradswitch.window"]) > 0, r
            seen_data[(rank, seq, off)] = int(r["gradswitch.window"])
            retx += is_set(r["gradswitch.flags.retx"])
        else:
            assert mtype == 2 and r["ip.src"] == switch_ip, r
            want = expected_sum(2, n, it)[off : off + count] if is_grad else np.zeros(1, np.float32)
            np.testing.assert_array_equal(values, want, err_msg=str(r))
            # the rank whose DATA completed the round, and the smallest window the round's DATA declared
            completer = int(r["gradswitch.rank"])
            assert completer in ip_rank.values(), r
            declared = [seen_data.get((rank, seq, off)) for rank in ip_rank.values()]
            if None not in declared:
                assert int(r["gradswitch.window"]) == min(declared), r
                windows_checked += 1
            results += 1
    grad_chunks = math.ceil(n / chunk)
    for rank in range(2):
        for it in range(iters):
            missing = [c for c in range(grad_chunks) if (rank, 2 * it + 1, c * chunk) not in seen_data]
            assert not missing, f"rank {rank} iteration {it}: chunks {missing} never captured"
    assert retx > 0, "no DATA packet decoded with the RETX flag, though workers retransmitted"
    assert results >= iters * (grad_chunks + 1) * 2, "a result per round and rank"
    assert windows_checked >= results // 2, "most RESULTs' rounds had every rank's DATA captured"


def wire_enum(prefix: str) -> dict[str, int]:
    """NAME -> value of every `GS_<prefix>_NAME = value` in include/gradswitch/wire.h."""
    text = (REPO / "include" / "gradswitch" / "wire.h").read_text()
    return {m[1]: int(m[2], 0) for m in re.finditer(rf"\bGS_{prefix}_(\w+) = (0x[0-9a-fA-F]+|\d+)", text)}


def test_dissector_knows_every_value_of_wire_h(tmp_path):
    """A value added to wire.h (a message type, element type, flag, ABORT reason) fails here until the
    dissector names it."""
    types, elems, flags, reasons = (wire_enum(p) for p in ("MSG", "ELEM", "FLAG", "ABORT"))
    assert types and elems and len(flags) >= 5 and len(reasons) >= 5
    packets, expect = [], []
    for name, value in types.items():
        packets.append(HEADER.pack(0x4753, 2, value, 1, 2, 0, 0, 0, 2, 0, 0, 0, -128, 0, 0))
        expect.append(name)
    for name, value in elems.items():
        packets.append(HEADER.pack(0x4753, 2, 1, 1, 2, 0, 0, 0, value, 0, 0, 0, -128, 0, 0))
        expect.append(f" {name.lower()}")
    for name, value in reasons.items():
        packets.append(HEADER.pack(0x4753, 2, 3, 1, 2, 0, 0, 0, 0, 0, 0, 0, value, 0, 0))
        expect.append(f"reason {name.lower()}")
    every_flag = sum(flags.values())
    packets.append(HEADER.pack(0x4753, 2, 1, 1, 2, 0, 0, every_flag, 2, 0, 0, 0, -128, 0, 0))
    pcap = tmp_path / "enums.pcap"
    write_pcap(pcap, packets)
    flag_fields = [f"gradswitch.flags.{n.lower()}" for n in flags]
    rows = decode(pcap, ["_ws.col.Info", *flag_fields])
    assert len(rows) == len(packets)
    for row, want in zip(rows[:-1], expect, strict=True):
        assert want in row["_ws.col.Info"], (want, row)
    assert all(rows[-1][f] == "1" or is_set(rows[-1][f]) for f in flag_fields), rows[-1]
