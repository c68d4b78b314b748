"""Writes a seed corpus for fuzz_ring: the datagrams rank 1 of 3 receives in one allreduce of 100
elements (64-byte payloads, 4 slots), on the float32, int32 and float16 wires: partial sums from rank 0
(its previous rank) and finished sums from rank 2 (its next), in order, with duplicates, and as sums a
rank already held (the fallback's SUM flag).

Usage: python3 fuzz/seeds_ring.py DIR
"""

import itertools
import struct
import sys
from pathlib import Path

JOB, KEY = 9, 0xABCD  # fuzz_ring.cpp's kJob, kKey
N, SLOTS, PAYLOAD, ELEMENTS = 3, 4, 64, 100
PARTIAL, RESULT = 4, 5  # wire.h: GS_MSG_RING_PARTIAL, GS_MSG_RING_RESULT
FLAG_SUM = 0x10
# the target's first byte (its index into the wires it tries) -> (gs_elem_type, struct code, size)
WIRES = {0: (2, "f", 4), 2: (1, "i", 4), 3: (4, "e", 2)}


def packet(msg, rank, slot, flags, elem, count, offset, values, code, seq=0):
    header = struct.pack(
        ">HBBIIHHBBHIIbbH", 0x4753, 2, msg, JOB, KEY, rank, slot, flags, elem, count, seq, offset, -128, 0, 0
    )
    return header + struct.pack(f"<{count}{code}", *values)


def rounds(elem, code, size, flags=0, seq=0):
    """Chunk c travels in slot c mod SLOTS (its version flips at each reuse); slot s's root is s mod N.
    Allreduce `seq` 1's chunks follow allreduce 0's through the slots (back to back)."""
    per = PAYLOAD // size
    chunks = -(-ELEMENTS // per)
    partials, results = [], []
    for c in range(chunks):
        number = c + seq * chunks
        slot, version = number % SLOTS, (number // SLOTS) % 2
        count = min(per, ELEMENTS - c * per)
        root = slot % N
        vals = [c % 5 + 1] * count
        if root in (0, 2):  # rank 0 forwards a partial to rank 1 (root 0) or rank 1 ends the chain (root 2)
            partials.append(packet(PARTIAL, 0, slot, version | flags, elem, count, c * per, vals, code, seq))
        if root in (0, 1):  # the sum comes back from rank 2
            results.append(packet(RESULT, 2, slot, version | flags, elem, count, c * per, vals, code, seq))
    return partials, results


def framed(wire, packets):
    return bytes([wire]) + b"".join(struct.pack("<H", len(p)) + p for p in packets)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for wire, (elem, code, size) in WIRES.items():
        partials, results = rounds(elem, code, size)
        interleaved = [p for pair in itertools.zip_longest(partials, results) for p in pair if p]
        (out / f"wire{wire}_ordered").write_bytes(framed(wire, partials + results))
        (out / f"wire{wire}_interleaved").write_bytes(framed(wire, interleaved))
        (out / f"wire{wire}_duplicates").write_bytes(framed(wire, interleaved + interleaved[:4]))
        held_p, held_r = rounds(elem, code, size, FLAG_SUM)
        (out / f"wire{wire}_held").write_bytes(framed(wire, held_p + held_r))
        next_p, _ = rounds(elem, code, size, seq=1)  # the next allreduce's partials arrive early
        (out / f"wire{wire}_early").write_bytes(framed(wire, next_p[:2] + interleaved + next_p[2:]))


if __name__ == "__main__":
    main()
