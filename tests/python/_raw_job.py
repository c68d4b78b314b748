"""A job driven by hand over plain sockets, for tests that need a switch in a state real workers avoid
(a round that waits forever for a rank): JOIN on control connections, single DATA packets."""

from __future__ import annotations

import socket
import struct

from gradswitch.daemon import Daemon, parse_kv, read_reply


def join_raw(d: Daemon, name: str, world: int) -> tuple[list[socket.socket], list[socket.socket], int, int]:
    """`world` ranks JOINed over plain sockets (int32 wire): control connections, UDP sockets, job id, key."""
    ctl, udp = [], []
    for r in range(world):
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        u.bind(("127.0.0.1", 0))
        c = d.connect()
        c.sendall(
            f"JOIN job={name} world={world} rank={r} wire=int32 token=t port={u.getsockname()[1]}\n".encode()
        )
        ctl.append(c)
        udp.append(u)
    replies = [parse_kv(read_reply(c, bytearray())) for c in ctl]
    return ctl, udp, int(replies[0]["job_id"]), int(replies[0]["key"])


def contribute(
    d: Daemon, udp: socket.socket, job_id: int, key: int, rank: int, slot: int, seq: int, threads: int
) -> None:
    """One int32 element (7) from `rank` to `slot` (version 0) of allreduce `seq` (docs/protocol.md §2),
    sent to the data thread that owns the slot (slot % threads)."""
    fields = (0x4753, 2, 1, job_id, key, rank, slot, 0, 1, 1, seq, 0, -128, 0, 0)
    header = struct.pack(">HBBIIHHBBHIIbbH", *fields)
    udp.sendto(header + struct.pack("<i", 7), ("127.0.0.1", d.data_port + slot % threads))
