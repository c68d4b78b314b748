"""The one way to run and query gradswitchd from Python: for LocalSwitch's users (the demo, `gradswitch
bench`, examples), the testbed, the benchmarks and the tests.

    with Daemon(threads=2, metrics_port=0) as d:     # free loopback ports; 0 = pick a free one
        g = gradswitch.connect(d.address, job="j", rank=0, world_size=1)
        d.stats()["pkts_in"], d.jobs(), d.status(job_id), d.metric("gradswitch_jobs", state="running")

    Daemon(netns="gs-tb-switch", host="10.66.0.1", control_port=17700, ...)   # inside a namespace (root)
    Daemon(netns=..., host="0.0.0.0", connect_host="10.66.0.1", ...)   # listens on every address there

A Daemon picks free ports unless given them (and picks again if one was taken meanwhile), writes the
daemon's stderr to a log file, and is ready when it answers PING. In a network namespace it is started
with `ip netns exec`, and this process reaches its control plane and metrics endpoint from inside the
namespace (the connecting thread enters it for the connect() only). Queries set aside the switch's
EVENT lines (docs/protocol.md section 1.4). A daemon whose readiness is not a PING answer (the DPDK
backend's stats file) starts with ready="none" and then waits with `wait_until`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from gradswitch._paths import switch_binary


class SwitchError(RuntimeError):
    """The daemon did not start, or answered a query with an error."""


# ------------------------------------------------------------------------------------ namespaces
_CLONE_NEWNET = 0x40000000
_netns_lock = threading.Lock()


@contextlib.contextmanager
def _in_netns(netns: str | None) -> Iterator[None]:
    """This thread inside network namespace `netns` (None: stay) for the block: sockets created in it
    belong to that namespace and keep working after the thread left it."""
    if netns is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    with _netns_lock, open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{netns}") as target:
        if libc.setns(target.fileno(), _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise SwitchError(f"cannot enter network namespace {netns}: {os.strerror(err)} (root needed)")
        try:
            yield
        finally:
            libc.setns(home.fileno(), _CLONE_NEWNET)


def connect(host: str, port: int, timeout: float, netns: str | None = None) -> socket.socket:
    with _in_netns(netns):
        return socket.create_connection((host, port), timeout=timeout)


def http_exchange(
    s: socket.socket, method: str, path: str, host: str, headers: str = ""
) -> tuple[bytes, bytes]:
    """One HTTP/1.1 request on the connected socket s (`headers`: lines ending in CRLF), read until the
    server closes: (status line and headers, body)."""
    s.sendall(f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{headers}\r\n".encode())
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head, body


def _port_free(host: str, port: int, kind: int, netns: str | None) -> bool:
    with _in_netns(netns), socket.socket(socket.AF_INET, kind) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_ports(threads: int, host: str = "127.0.0.1", netns: str | None = None, extra: int = 0) -> list[int]:
    """A control port, `threads` consecutive UDP data ports after it, then `extra` more TCP ports, all free
    right now (on `host`, in `netns`)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000)
        control, data = base, base + 1
        others = [data + threads + i for i in range(extra)]
        if (
            _port_free(host, control, socket.SOCK_STREAM, netns)
            and all(_port_free(host, data + t, socket.SOCK_DGRAM, netns) for t in range(threads))
            and all(_port_free(host, p, socket.SOCK_STREAM, netns) for p in others)
        ):
            return [control, data, *others]
    raise SwitchError(f"could not find free ports on {host} for a switch")


# ------------------------------------------------------------------------------------ queries
def read_reply(sock: socket.socket, buf: bytearray, events: list[str] | None = None) -> str:
    """The next reply line on a control connection; EVENT lines go to `events` (or are dropped)."""
    while True:
        while b"\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise SwitchError("the switch closed the control connection")
            buf += chunk
        i = buf.index(b"\n")
        line = bytes(buf[:i]).decode(errors="replace").rstrip("\r")
        del buf[: i + 1]
        if line.startswith("EVENT "):
            if events is not None:
                events.append(line)
            continue
        return line


def parse_kv(reply: str) -> dict[str, str]:
    """The key=value pairs of an OK reply; SwitchError for ERR."""
    if not reply.startswith("OK"):
        raise SwitchError(reply)
    return dict(tok.split("=", 1) for tok in reply.split()[1:] if "=" in tok)


def parse_metrics(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text format -> {(name, frozenset(labels.items())): value}."""
    out: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        name, labels = series, {}
        if "{" in series:
            name, rest = series.split("{", 1)
            rest = rest.rstrip("}")
            while rest:
                key, rest = rest.split("=", 1)
                assert rest.startswith('"'), line
                i, val = 1, []
                while rest[i] != '"':
                    if rest[i] == "\\":
                        i += 1
                        val.append({"n": "\n"}.get(rest[i], rest[i]))
                    else:
                        val.append(rest[i])
                    i += 1
                labels[key] = "".join(val)
                rest = rest[i + 1 :].lstrip(",")
        out[(name, frozenset(labels.items()))] = float(value)
    return out


# ------------------------------------------------------------------------------------ the daemon
class Daemon:
    """A gradswitchd child process; see the module docstring."""

    def __init__(
        self,
        *args: str,
        threads: int = 1,
        host: str = "127.0.0.1",
        connect_host: str | None = None,
        control_port: int = 0,
        data_port: int = 0,
        metrics_port: int | None = None,
        slots: int | None = None,
        mtu: int | None = None,
        drop_rate: float = 0.0,
        seed: int = 1,
        extra_args: list[str] | None = None,
        binary: str | None = None,
        log_path: str | os.PathLike | None = None,
        netns: str | None = None,
        env: dict[str, str] | None = None,
        new_session: bool = False,
        ready: str = "ping",
        start_timeout: float = 10.0,
    ):
        """`args` (and `extra_args`) go to gradswitchd after the options this class sets; `host` is the
        address it listens on and `connect_host` (default: `host`) the one clients and queries use;
        `ready` is "ping" (start() waits up to `start_timeout` for a PING answer) or "none" (the caller
        checks readiness itself, e.g. with wait_until)."""
        self.threads = threads
        self.host = host
        self.connect_host = connect_host or host
        self.binary = binary or switch_binary()
        self.netns = netns
        self._fixed = (control_port, data_port, metrics_port)
        self.control_port, self.data_port = control_port, data_port
        self.metrics_port = metrics_port
        self._opts = {"slots": slots, "mtu": mtu, "drop_rate": drop_rate, "seed": seed}
        self._args = [*map(str, args), *map(str, extra_args or [])]
        self._log_path = Path(log_path) if log_path else None
        self._env = env
        self._new_session = new_session
        if ready not in ("ping", "none"):
            raise ValueError(f"ready must be 'ping' or 'none', got {ready!r}")
        self._ready = ready
        self._start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self._log = None

    # ---- addresses
    @property
    def address(self) -> str:
        return f"{self.connect_host}:{self.control_port}"

    @property
    def metrics_url(self) -> str | None:
        return f"http://{self.connect_host}:{self.metrics_port}/metrics" if self.metrics_port else None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise SwitchError("the switch is not running")
        return self.proc.pid

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
        if self.metrics_port is not None:
            cmd += ["--metrics-port", str(self.metrics_port), "--metrics-host", self.host]
        if self.netns:
            cmd.append("--insecure")  # a namespace of our own: only its hosts reach the switch
        return cmd + self._args

    # ---- life cycle
    def start(self, timeout: float | None = None) -> Daemon:
        timeout = self._start_timeout if timeout is None else timeout
        for attempt in range(3):  # a port taken between picking and binding: pick again
            self._choose_ports()
            if self._log_path is None:
                fd, name = tempfile.mkstemp(prefix="gradswitchd-", suffix=".log")
                os.close(fd)
                self._log_path = Path(name)
            self._log = open(self._log_path, "ab")
            cmd = self.command()
            if self.netns:
                cmd = ["ip", "netns", "exec", self.netns, *cmd]
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env=self._env,
                start_new_session=self._new_session,
            )
            if self._ready == "none":
                return self
            if self._answers_ping(timeout):
                return self
            timed_out = self.proc.poll() is None
            self.stop()
            clash = "cannot listen" in self.log() or "Address already in use" in self.log()
            if timed_out or not clash or attempt == 2 or all(self._fixed[:2]):
                why = f"did not answer PING within {timeout:.0f} s" if timed_out else "exited"
                raise SwitchError(f"gradswitchd {why}: {' '.join(cmd)}\nits log:\n{self.log()[-4000:]}")
        raise AssertionError("unreachable")

    def _answers_ping(self, timeout: float) -> bool:
        def ping() -> bool:
            try:
                return self.request("PING", timeout=0.5).startswith("OK")
            except (OSError, SwitchError):
                return False

        try:
            self.wait_until(ping, timeout, "answer PING", interval=0.02)
            return True
        except SwitchError:
            return False

    def wait_until(self, ready: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
        """Polls `ready()` until it is true; SwitchError when the daemon exits first or `timeout` passes
        (the daemon keeps running: the caller stops it)."""
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc is None or self.proc.poll() is not None:
                rc = None if self.proc is None else self.proc.returncode
                raise SwitchError(f"gradswitchd exited with rc={rc} before it could {what}")
            if time.monotonic() > deadline:
                raise SwitchError(f"gradswitchd did not {what} within {timeout:.0f} s")
            time.sleep(interval)

    def _choose_ports(self) -> None:
        control, data, metrics = self._fixed
        want_metrics = metrics == 0
        if not control or not data:
            picked = pick_ports(self.threads, self.host, self.netns, extra=1 if want_metrics else 0)
            self.control_port = control or picked[0]
            self.data_port = data or picked[1]
            if want_metrics:
                self.metrics_port = picked[2]
        elif want_metrics:
            self.metrics_port = pick_ports(0, self.host, self.netns)[0]

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """Stops the daemon (SIGTERM, then SIGKILL after `timeout`); its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log:
            self._log.close()
            self._log = None
        code = self.proc.returncode
        self.proc = None
        return code

    def __enter__(self) -> Daemon:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        try:
            return self._log_path.read_text(errors="replace") if self._log_path else ""
        except OSError:
            return ""

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    # ---- queries
    def connect(self, timeout: float = 5.0) -> socket.socket:
        """A new control-plane connection (inside the daemon's namespace)."""
        return connect(self.connect_host, self.control_port, timeout, self.netns)

    def request(self, line: str, timeout: float = 5.0) -> str:
        """One request on a fresh control connection; the reply line (EVENT lines set aside)."""
        with self.connect(timeout) as s:
            s.settimeout(timeout)
            s.sendall(line.encode() + b"\n")
            return read_reply(s, bytearray())

    def stats(self, job_id: int | None = None) -> dict[str, int]:
        kv = parse_kv(self.request("STATS" + (f" job_id={job_id}" if job_id is not None else "")))
        return {k: int(v) for k, v in kv.items() if v.lstrip("-").isdigit()}

    def jobs(self) -> list[str]:
        value = parse_kv(self.request("JOBS")).get("jobs", "")
        return [j for j in value.split(",") if j]

    def status(self, job_id: int, slot: int | None = None, version: int | None = None) -> dict[str, str]:
        line = f"STATUS job_id={job_id}"
        if slot is not None:
            line += f" slot={slot} version={version or 0}"
        return parse_kv(self.request(line))

    def metrics(self, timeout: float = 5.0, token: str | None = None) -> str:
        """The body of GET /metrics (the daemon needs metrics_port); `token`: the bearer token a switch
        with --auth-file needs (gradswitch.control.metrics_token)."""
        if not self.metrics_port:
            raise SwitchError("this switch has no metrics endpoint (Daemon(metrics_port=0) starts one)")
        auth = f"Authorization: Bearer {token}\r\n" if token else ""
        with connect(self.connect_host, self.metrics_port, timeout, self.netns) as s:
            s.settimeout(timeout)
            head, body = http_exchange(s, "GET", "/metrics", self.connect_host, auth)
        if not head.startswith(b"HTTP/1.1 200"):
            raise SwitchError(f"GET /metrics: {head.decode(errors='replace').splitlines()[:1]}")
        return body.decode()

    def metric(self, name: str, token: str | None = None, **labels: str) -> float | None:
        """The value of one series of the metrics (labels must match exactly); None when absent."""
        return parse_metrics(self.metrics(token=token)).get((name, frozenset(labels.items())))
