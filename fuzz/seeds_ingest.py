"""Writes a seed corpus for fuzz_ingest: valid DATA packets of the fuzz target's three jobs, every element
type, and for the job with a deadline rounds that only the quorum (ranks 0 and 1) contributes to, and
rounds that ranks concede (a header-only DATA with CONCEDE, protocol.md 3.1): closed at once, resent,
below the quorum, by every rank; and concessions to the jobs without a deadline (bad_length).

Usage: python3 fuzz/seeds_ingest.py DIR
"""

import struct
import sys
from pathlib import Path

JOBS = [(0x100, 0x11111111, 2, 64), (0x201, 0x22222222, 3, 64), (0x302, 0x33333333, 3, 56)]  # id, key, world,
# payload bytes: ids as the engine assigns them; the third job has a deadline (its payload 8 bytes less)
# elem_type -> (struct code of one element, element size): wire.h's gs_elem_type
ELEMS = {1: ("i", 4), 2: ("f", 4), 3: ("i", 4), 4: ("e", 2), 5: ("H", 2), 6: ("d", 8)}
MX8 = 7  # 32 elements per 33 bytes
RETX, CONCEDE = 0x02, 0x80  # wire.h's gs_flags


def packet(job, key, rank, slot, version, seq, offset, values, elem_type=1):
    header = struct.pack(
        ">HBBIIHHBBHIIbbH",
        0x4753,
        2,
        1,
        job,
        key,
        rank,
        slot,
        version,
        elem_type,
        len(values),
        seq,
        offset,
        -128,
        0,
        0,
    )
    if elem_type == MX8:  # per block of 32: its scale byte, then its E4M3 codes (protocol.md §2.2)
        body = b"".join(
            bytes([0x7F]) + bytes([0x38] * min(32, len(values) - b)) for b in range(0, len(values), 32)
        )
        return header + body
    code, _ = ELEMS[elem_type]
    return header + struct.pack(f"<{len(values)}{code}", *values)


def concession(job, key, rank, slot, flags, seq, offset, count, elem_type=1):
    """A DATA with CONCEDE: the header of the chunk's DATA (its count and type), no payload."""
    header = packet(job, key, rank, slot, flags | CONCEDE, seq, offset, [], elem_type)
    return header[:18] + struct.pack(">H", count) + header[20:]


def framed(packets):
    return b"".join(struct.pack("<H", len(p)) + p for p in packets)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, (job, key, world, payload) in enumerate(JOBS):
        rounds = [
            packet(job, key, r, s, v, 0, s * 16, [r + 1] * 16)
            for v in (0, 1)
            for s in range(4)
            for r in range(world)
        ]
        (out / f"job{i}_rounds").write_bytes(framed(rounds))
        (out / f"job{i}_retx").write_bytes(framed(rounds + rounds[:world]))
        # resends to open rounds: rank 0's twice (HELD to it and the lacking ranks), then rank 1's
        # first as a resend (HELD to the ranks still lacking)
        opened = [packet(job, key, 0, s, 0, 2, s * 16, [1] * 16) for s in range(4)]
        resent = [packet(job, key, r, s, 2, 2, s * 16, [r + 1] * 16) for s in range(4) for r in (0, 1)]
        (out / f"job{i}_held").write_bytes(framed(opened + resent))
        if world == 3:  # only the quorum's contributions: the deadline job's rounds close early
            quorum = [packet(job, key, r, s, 0, 3, s * 8, [r + 1] * 8) for s in range(4) for r in (0, 1)]
            late = [packet(job, key, 2, s, 0, 3, s * 8, [3] * 8) for s in range(4)]
            # 300 bytes of junk between: the fuzz target's clock passes the deadline
            (out / f"job{i}_quorum").write_bytes(framed([*quorum, bytes(300), *late]))
        # concessions (in the jobs without a deadline: bad_length): the last rank concedes each round
        # of seq 5, which closes it at once, then resends the concession (RETX); seq 6 (version 1):
        # every rank but rank 0 concedes, below the quorum; seq 7: every rank concedes float16 rounds
        last = world - 1
        given = [packet(job, key, r, s, 0, 5, s * 8, [r + 1] * 8) for s in range(4) for r in range(last)]
        conceded = [concession(job, key, last, s, 0, 5, s * 8, 8) for s in range(4)]
        resent = [concession(job, key, last, s, RETX, 5, s * 8, 8) for s in range(4)]
        alone = [concession(job, key, r, s, 1, 6, s * 8, 8) for s in range(4) for r in range(1, world)]
        alone += [packet(job, key, 0, s, 1, 6, s * 8, [1] * 8) for s in range(4)]
        everyone = [concession(job, key, r, s, 0, 7, s * 8, 8, 4) for s in range(4) for r in range(world)]
        (out / f"job{i}_concede").write_bytes(framed(given + conceded + resent + alone + everyone))
        mx8 = [packet(job, key, r, s, 0, 4, s * 32, [1.0] * 32, MX8) for s in range(4) for r in range(world)]
        (out / f"job{i}_mx8").write_bytes(framed(mx8))
        for elem_type, (_, size) in ELEMS.items():
            per = payload // size
            typed = [
                packet(job, key, r, s, 0, 1, s * per, [r + 1] * per, elem_type)
                for s in range(4)
                for r in range(world)
            ]
            (out / f"job{i}_type{elem_type}").write_bytes(framed(typed))


if __name__ == "__main__":
    main()
