"""Writes a seed corpus for fuzz_worker_switch: the RESULTs (and HELDs) that rank 1 of the fuzz target's
job expects for its allreduce of 100 elements, for each wire, with and without bounded-time rounds
(PARTIAL RESULTs carrying the contributor trailer of docs/protocol.md §3.1).

Usage: python3 fuzz/seeds_worker_switch.py DIR
"""

import struct
import sys
from pathlib import Path

JOB, KEY, SLOTS, PAYLOAD, ELEMENTS = 9, 0xABCD, 4, 64, 100
# the target's first byte picks the wire: index into (float32, fixed32, int32, float16, bfloat16, mx8)
WIRES = [(2, 4), (3, 4), (1, 4), (4, 2), (5, 2), (7, 1)]  # (elem_type, bytes per element)
PARTIAL, RETX, UNICAST = 0x40, 0x02, 0x04
TRAILER = 8


def header(msg, rank, slot, flags, elem_type, count, offset, seq=0):
    return struct.pack(
        ">HBBIIHHBBHIIbbH",
        0x4753,
        2,
        msg,
        JOB,
        KEY,
        rank,
        slot,
        flags,
        elem_type,
        count,
        seq,
        offset,
        -128,
        0,
        0,
    )


def elements(elem_type, count):
    if elem_type == 7:  # per block of 32: its scale byte, then its E4M3 codes (protocol.md §2.2)
        return b"".join(bytes([0x7F]) + bytes([0x38] * min(32, count - b)) for b in range(0, count, 32))
    size = 2 if elem_type in (4, 5) else 4
    return bytes(count * size)


def per_chunk(elem_type, size, payload):
    return payload // 33 * 32 if elem_type == 7 else payload // size


def framed(packets):
    return b"".join(struct.pack("<H", len(p)) + p for p in packets)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for w, (elem_type, size) in enumerate(WIRES):
        for deadline in (False, True):
            payload = PAYLOAD - (TRAILER if deadline else 0)
            per = per_chunk(elem_type, size, payload)
            results, partials = [], []
            for c in range((ELEMENTS + per - 1) // per):
                count = min(per, ELEMENTS - c * per)
                slot, version = c % SLOTS, (c // SLOTS) & 1
                body = elements(elem_type, count)
                results.append(header(2, 0, slot, version, elem_type, count, c * per) + body)
                trailer = struct.pack(">Q", 0b011)  # ranks 0 and 1 contributed
                partials.append(
                    header(2, 0xFFFF, slot, version | PARTIAL, elem_type, count, c * per) + body + trailer
                )
            held = [
                header(7, 0xFFFF, s, 0, elem_type, 0, s * per) + struct.pack(">Q", 0b001)
                for s in range(SLOTS)
            ]
            first = bytes([w | (0x80 if deadline else 0)])
            tag = f"wire{elem_type}{'_deadline' if deadline else ''}"
            (out / f"{tag}_results").write_bytes(first + framed(results))
            (out / f"{tag}_held").write_bytes(first + framed(held + results))
            if deadline:
                (out / f"{tag}_partial").write_bytes(first + framed(partials))


if __name__ == "__main__":
    main()
