"""Run a gradswitchd process on this machine: for the demo, `gradswitch bench` and the tests.

with LocalSwitch(threads=2) as sw:
    g = gradswitch.connect(sw.address, job="j", rank=0, world_size=1)
    print(sw.stats()["pkts_in"])
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from gradswitch._paths import switch_binary


def _port_free(port: int, kind: int) -> bool:
    with socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_ports(threads: int) -> tuple[int, int]:
    """A control port and `threads` consecutive UDP data ports, all free right now."""
    rng = random.Random()
    for _ in range(200):
        control = rng.randrange(20000, 60000)
        data = control + 1
        if _port_free(control, socket.SOCK_STREAM) and all(
            _port_free(data + t, socket.SOCK_DGRAM) for t in range(threads)
        ):
            return control, data
    raise RuntimeError("could not find free loopback ports for a local switch")


def control_request(address: str, line: str, timeout: float = 5.0) -> str:
    """One control-plane request to the switch at host:port, on a fresh TCP connection; the reply line."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(line.encode() + b"\n")
        buf = b""
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf.decode().strip()


class SwitchError(RuntimeError):
    pass


class LocalSwitch:
    """A gradswitchd child process bound to 127.0.0.1 on free ports."""

    def __init__(
        self,
        *,
        threads: int = 1,
        slots: int | None = None,
        mtu: int | None = None,
        drop_rate: float = 0.0,
        seed: int = 1,
        extra_args: list[str] | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        log_path: str | os.PathLike | None = None,
    ):
        self.threads = threads
        self.host = host
        self.binary = binary or switch_binary()
        self._opts = {"slots": slots, "mtu": mtu, "drop_rate": drop_rate, "seed": seed}
        self._extra = list(extra_args or [])
        self._log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self.control_port = 0
        self.data_port = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.control_port}"

    def command(self) -> list[str]:
        cmd = [
            self.binary,
            "--control-host",
            self.host,
            "--control-port",
            str(self.control_port),
            "--data-port",
            str(self.data_port),
            "--threads",
            str(self.threads),
            "--seed",
            str(self._opts["seed"]),
        ]
        if self._opts["slots"]:
            cmd += ["--slots", str(self._opts["slots"])]
        if self._opts["mtu"]:
            cmd += ["--mtu", str(self._opts["mtu"])]
        if self._opts["drop_rate"]:
            cmd += ["--drop-rate", str(self._opts["drop_rate"])]
        return cmd + self._extra

    def start(self, timeout: float = 10.0) -> LocalSwitch:
        for attempt in range(3):  # a port taken between picking and binding: pick again
            self.control_port, self.data_port = _pick_ports(self.threads)
            if self._log_path is None:
                fd, name = tempfile.mkstemp(prefix="gradswitchd-", suffix=".log")
                os.close(fd)
                self._log_path = Path(name)
            self._log = open(self._log_path, "ab")
            self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    if self.request("PING", timeout=0.5).startswith("OK"):
                        return self
                except OSError:
                    time.sleep(0.02)
            self.stop()
            if attempt == 2:
                raise SwitchError(f"gradswitchd did not start; its log:\n{self.log()}")
        raise AssertionError("unreachable")

    def request(self, line: str, timeout: float = 5.0) -> str:
        """Sends one control-plane request on a fresh connection and returns the reply line."""
        return control_request(self.address, line, timeout)

    def stats(self, job_id: int | None = None) -> dict[str, int]:
        reply = self.request("STATS" + (f" job_id={job_id}" if job_id is not None else ""))
        if not reply.startswith("OK"):
            raise SwitchError(reply)
        return {k: int(v) for k, v in (kv.split("=", 1) for kv in reply.split()[1:])}

    def jobs(self) -> list[str]:
        reply = self.request("JOBS")
        if not reply.startswith("OK"):
            raise SwitchError(reply)
        value = reply.split("jobs=", 1)[1] if "jobs=" in reply else ""
        return [j for j in value.split(",") if j]

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace") if self._log_path else ""
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        code = self.proc.returncode
        self.proc = None
        return code

    def __enter__(self) -> LocalSwitch:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()
