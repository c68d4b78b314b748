"""What the deployment tests share: the shipped example config with a test's ports and files, an auth
file, a switch started from an exact command line, and ranks that run examples/allreduce_check.py (which
checks every element of known sums) as separate processes, as a deployment runs them."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import tomllib  # Python 3.11; the deployment tests need it

from gradswitch.daemon import SwitchError, pick_ports, read_reply

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CONFIG = ROOT / "deploy" / "gradswitchd.toml"
CHECK_PROGRAM = ROOT / "examples" / "allreduce_check.py"
TENANT = "train"


def write_auth(directory: Path) -> tuple[Path, Path]:
    """An auth file with a tenant `train` and an operator `ops`, and the tenant's secret file (0600)."""
    secret = secrets.token_hex(32)
    auth = directory / "auth"
    auth.write_text(f"tenant {TENANT} secret={secret}\noperator ops secret={secrets.token_hex(32)}\n")
    auth.chmod(0o600)
    secret_file = directory / "train.secret"
    secret_file.write_text(secret + "\n")
    secret_file.chmod(0o600)
    return auth, secret_file


def config_with(text: str, **keys: object) -> str:
    """The config `text` with top-level `keys` (Python names: metrics_port is metrics-port) set: a line
    that sets the key is rewritten in place, a key the file does not set is added at the top."""
    for name, value in keys.items():
        key = name.replace("_", "-")
        line = f"{key} = {value!r}".replace("'", '"') if isinstance(value, str) else f"{key} = {value}"
        pattern = re.compile(rf"^{re.escape(key)}\s*=.*$", re.M)
        text, n = pattern.subn(line, text, count=1)
        if n == 0:
            text = line + "\n" + text
    parsed = tomllib.loads(text)
    for name, value in keys.items():
        assert parsed[name.replace("_", "-")] == value, (name, parsed)
    return text


def shipped_config_for_test(directory: Path, threads: int | None = None) -> tuple[Path, dict]:
    """The shipped deploy/gradswitchd.toml with only what a test must change: free ports, and the auth
    file path (to a generated one). Returns the file and {control_port, data_port, metrics_port,
    threads, secret_file}."""
    text = SHIPPED_CONFIG.read_text()
    shipped = tomllib.loads(text)
    threads = threads or shipped.get("threads", 1)
    host = shipped.get("control-host", "127.0.0.1")
    control, data, metrics = pick_ports(threads, host=host, extra=1)
    auth, secret_file = write_auth(directory)
    keys = {"control_port": control, "data_port": data, "metrics_port": metrics, "threads": threads,
            "auth_file": str(auth)}
    path = directory / "gradswitchd.toml"
    path.write_text(config_with(text, **keys))
    return path, {**keys, "secret_file": secret_file, "auth": auth}


def wait_ping(port: int, alive, log, what: str, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
    """Until the switch's control port answers PING; fails with `log()`'s tail when `alive()` turns
    false (it exited) or after `timeout` seconds."""
    import socket

    deadline = time.monotonic() + timeout
    while True:
        if not alive():
            raise SwitchError(f"{what} exited:\n{log()[-3000:]}")
        try:
            with socket.create_connection((host, port), timeout=0.5) as s:
                s.settimeout(2)
                s.sendall(b"PING\n")
                if read_reply(s, bytearray()).startswith("OK"):
                    return
        except (OSError, SwitchError):
            pass
        if time.monotonic() > deadline:
            raise SwitchError(f"{what} did not answer PING in {timeout} s:\n{log()[-3000:]}")
        time.sleep(0.05)


class Process:
    """A gradswitchd started from an exact command line; ready when its control port answers PING."""

    def __init__(self, argv: list[str], log: Path, env: dict | None = None):
        self.argv, self.log_path = argv, log
        self._log = open(log, "ab")
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, env=env
        )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ping(self, port: int, host: str = "127.0.0.1", timeout: float = 15.0) -> None:
        wait_ping(port, lambda: self.proc.poll() is None, self.log, str(self.argv), host, timeout)

    def stop(self, timeout: float = 10.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


def rank_env(switch: str, secret_file: Path | None, job: str) -> dict[str, str]:
    env = {**os.environ, "GRADSWITCH_SWITCH": switch, "GRADSWITCH_JOB": job}
    if secret_file is not None:
        env.update(GRADSWITCH_TENANT=TENANT, GRADSWITCH_SECRET_FILE=str(secret_file))
    return env


def run_ranks(switch: str, world: int, secret_file: Path | None, job: str = "check", elements: int = 1 << 18,
              rounds: int = 3, timeout: float = 90.0) -> list[str]:
    """`world` processes of examples/allreduce_check.py against `switch`; asserts that every rank checked
    every element of every round. Their outputs, in rank order."""
    env = rank_env(switch, secret_file, job)
    procs = [
        subprocess.Popen([sys.executable, str(CHECK_PROGRAM), "--rank", str(r), "--world-size", str(world),
                          "--elements", str(elements), "--rounds", str(rounds)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(world)
    ]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for r, (p, out) in enumerate(zip(procs, outs, strict=True)):
        want = f"OK rank {r} of {world}: {rounds} allreduces of {elements} floats, every element exact"
        assert p.returncode == 0 and want in out, (r, p.returncode, out)
    return outs


def require(program: str) -> str:
    """The path of `program` (a row of scripts/programs.tsv, which tests/python/test_tools.py finds by this
    call); a skip naming its package when it is missing, a failure under GRADSWITCH_REQUIRE_TOOLS=1 (CI)."""
    from conftest import require_or_skip

    from gradswitch import _tools

    try:
        return _tools.require(program)
    except _tools.ToolMissing as e:
        require_or_skip("TOOLS", str(e))
        raise


def unit_directives(text: str, section: str = "Service") -> dict[str, list[str]]:
    """A systemd unit's (or drop-in's) directives of `section`: name -> values in order, where an empty
    assignment resets the list (systemd.unit(5))."""
    out: dict[str, list[str]] = {}
    current = None
    lines = text.replace("\\\n", " ").splitlines()
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = line.strip("[]")
            continue
        if current != section or "=" not in line:
            continue
        key, value = (s.strip() for s in line.split("=", 1))
        out[key] = [] if value == "" else [*out.get(key, []), value]
    return out
