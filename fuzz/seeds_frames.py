"""Writes a seed corpus for fuzz_frames: a rules byte, then a frame (data to the aggregation address,
ARP for it, malformed IPv4/UDP, plain Ethernet).

Usage: python3 fuzz/seeds_frames.py DIR
"""

import struct
import sys
from pathlib import Path

AGG = bytes([10, 0, 0, 100])
HOST = bytes([10, 0, 0, 1])
MAC_A = bytes.fromhex("02000000000a")
MAC_AGG = bytes.fromhex("0200000000aa")


def ipv4(payload: bytes, proto: int = 17, frag: int = 0, ihl: int = 5, total: int | None = None) -> bytes:
    tl = total if total is not None else 20 + len(payload)
    return struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, tl, 1, frag, 64, proto, 0, HOST, AGG) + payload


def udp(payload: bytes, dport: int = 7701, length: int | None = None) -> bytes:
    return struct.pack("!HHHH", 40000, dport, length if length is not None else 8 + len(payload), 0) + payload


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    eth_ip = MAC_AGG + MAC_A + b"\x08\x00"
    gs = struct.pack(">HBBIIHHBBHIIbbH", 0x4753, 2, 1, 0x100, 1, 0, 0, 0, 2, 2, 0, 0, -128, -128, 0)
    arp = struct.pack("!HHBBH6s4s6s4s", 1, 0x0800, 6, 4, 1, MAC_A, HOST, bytes(6), AGG)
    seeds = {
        "data": b"\x01" + eth_ip + ipv4(udp(gs + bytes(8))),
        "data_thread1": b"\x02" + eth_ip + ipv4(udp(gs + bytes(8), dport=7702)),
        "arp": b"\x81" + b"\xff" * 6 + MAC_A + b"\x08\x06" + arp + bytes(18),
        "fragment": b"\x01" + eth_ip + ipv4(udp(gs), frag=0x2000),
        "bad_ihl": b"\x01" + eth_ip + ipv4(udp(gs), ihl=3),
        "bad_udp_len": b"\x01" + eth_ip + ipv4(udp(gs, length=3000)),
        "tcp": b"\x01" + eth_ip + ipv4(bytes(20), proto=6),
        "ether": b"\x00" + MAC_A + MAC_A + b"\x88\xb5" + bytes(46),
    }
    for name, data in seeds.items():
        (out / name).write_bytes(data)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
