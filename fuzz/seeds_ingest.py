"""Writes a seed corpus for fuzz_ingest: valid DATA packets of the fuzz target's two jobs.

Usage: python3 fuzz/seeds_ingest.py DIR
"""

import struct
import sys
from pathlib import Path

JOBS = [(0x100, 0x11111111, 2), (0x201, 0x22222222, 3)]  # ids as the engine assigns them


def packet(job, key, rank, slot, version, seq, offset, values, elem_type=1):
    header = struct.pack(
        ">HBBIIHHBBHIIbbH",
        0x4753,
        1,
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
    return header + struct.pack(f"<{len(values)}i", *values)


def framed(packets):
    return b"".join(struct.pack("<H", len(p)) + p for p in packets)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, (job, key, world) in enumerate(JOBS):
        rounds = [
            packet(job, key, r, s, v, 0, s * 16, [r + 1] * 16)
            for v in (0, 1)
            for s in range(4)
            for r in range(world)
        ]
        (out / f"job{i}_rounds").write_bytes(framed(rounds))
        (out / f"job{i}_retx").write_bytes(framed(rounds + rounds[:world]))


if __name__ == "__main__":
    main()
