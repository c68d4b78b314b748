"""A gradswitchd on this machine's loopback, for the demo, `gradswitch bench`, the examples and the tests.

with LocalSwitch(threads=2) as sw:
    g = gradswitch.connect(sw.address, job="j", rank=0, world_size=1)
    print(sw.stats()["pkts_in"])

LocalSwitch is gradswitch.daemon.Daemon (free loopback ports, log file, ready once it answers PING);
this module keeps the names its users import.
"""

from __future__ import annotations

from gradswitch.daemon import Daemon, SwitchError, read_reply

__all__ = ["LocalSwitch", "SwitchError", "control_request"]


def control_request(address: str, line: str, timeout: float = 5.0) -> str:
    """One control-plane request to the switch at host:port, on a fresh TCP connection; the reply line
    (EVENT lines set aside)."""
    import socket

    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(line.encode() + b"\n")
        return read_reply(s, bytearray())


class LocalSwitch(Daemon):
    """A gradswitchd child process bound to 127.0.0.1 (or `host`) on free ports; see Daemon."""
