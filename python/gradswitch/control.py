"""The control protocol from Python: its names, credentials, and a connection that authenticates.

The names mirror include/gradswitch/control.h (tests/python/test_control_names.py checks that they
agree); docs/protocol.md section 1 is the specification. For tools that talk to a switch directly
(`gradswitch status`, monitoring, tests):

    with ControlConnection("10.0.0.1:7700", credentials=credentials()) as c:
        print(c.request("JOBS"))        # an operator sees every job, a tenant only its own

Secrets come from the environment or a file, never from a command line (where `ps` shows them):
GRADSWITCH_TENANT names the tenant (or operator); GRADSWITCH_SECRET holds its secret, or
GRADSWITCH_SECRET_FILE names a file whose first line is the secret.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import socket
import time
from pathlib import Path

# Verbs, replies, error codes and keys (include/gradswitch/control.h).
VERB_JOIN, VERB_LEAVE, VERB_STATUS, VERB_STATS, VERB_JOBS, VERB_PING = (
    "JOIN",
    "LEAVE",
    "STATUS",
    "STATS",
    "JOBS",
    "PING",
)
VERB_CHALLENGE, VERB_AUTH, VERB_ABORT = "CHALLENGE", "AUTH", "ABORT"
VERB_PARAMS, VERB_SETLR, VERB_STATE_GET, VERB_STATE_SET = "PARAMS", "SETLR", "STATE_GET", "STATE_SET"
REPLY_OK, REPLY_ERR, EVENT = "OK", "ERR", "EVENT"
ERR_BAD_REQUEST, ERR_TOO_LONG, ERR_CONFLICT, ERR_STATE = "bad_request", "too_long", "conflict", "state"
ERR_TIMEOUT, ERR_NO_RESOURCES, ERR_NOT_FOUND, ERR_AUTH = "timeout", "no_resources", "not_found", "auth"
KEY_TENANT, KEY_NONCE, KEY_CNONCE, KEY_PROOF, KEY_ROLE = "tenant", "nonce", "cnonce", "proof", "role"
ROLE_TENANT, ROLE_OPERATOR = "tenant", "operator"
AUTH_CLIENT_LABEL = "gradswitch-auth-v1 client"
AUTH_SWITCH_LABEL = "gradswitch-auth-v1 switch"
METRICS_TOKEN_LABEL = "gradswitch-metrics-v1"
TENANT_SEPARATOR = "/"
STATE_MAGIC = b"GSOPTST1"
MAX_LINE = 4096

ENV_TENANT, ENV_SECRET, ENV_SECRET_FILE = "GRADSWITCH_TENANT", "GRADSWITCH_SECRET", "GRADSWITCH_SECRET_FILE"

_TENANT_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SECRET_RE = re.compile(r"[A-Za-z0-9._~+/=-]{16,256}")


class ControlError(RuntimeError):
    """An ERR reply, a refused AUTH, or a switch that does not answer as the protocol says."""


def proof(label: str, secret: str, tenant: str, nonce: str, cnonce: str) -> str:
    """HMAC-SHA-256(secret, "label\\ntenant\\nnonce\\ncnonce") in lower-case hex (docs/protocol.md §1.5)."""
    message = f"{label}\n{tenant}\n{nonce}\n{cnonce}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def metrics_token(tenant: str, secret: str) -> str:
    """The bearer token of the switch's GET /metrics for an auth-file entry (docs/observability.md):
    HMAC-SHA-256(secret, "gradswitch-metrics-v1\\ntenant") in lower-case hex. It lets Prometheus read
    what that entry may see, and proves nothing in AUTH: the secret itself stays off the network."""
    return hmac.new(secret.encode(), f"{METRICS_TOKEN_LABEL}\n{tenant}".encode(), hashlib.sha256).hexdigest()


def read_secret_file(path: str | os.PathLike) -> str:
    """The secret in a file: its first line, without surrounding whitespace."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ValueError(f"gradswitch: cannot read the secret file {path}: {e.strerror}") from None
    secret = text.splitlines()[0].strip() if text.strip() else ""
    if not _SECRET_RE.fullmatch(secret):
        raise ValueError(
            f"gradswitch: the secret file {path} must start with a secret of 16..256 characters of "
            "[A-Za-z0-9._~+/=-] (e.g. `openssl rand -hex 32`)"
        )
    return secret


def credentials(
    tenant: str | None = None, secret_file: str | os.PathLike | None = None
) -> tuple[str, str] | None:
    """(tenant, secret) from the arguments or the environment, or None for anonymous use.

    tenant: else $GRADSWITCH_TENANT. The secret: from `secret_file`, else $GRADSWITCH_SECRET, else
    the file $GRADSWITCH_SECRET_FILE. A tenant without a secret, or a secret without a tenant, is an
    error (a half-configured client should not silently join anonymously).
    """
    tenant = tenant if tenant is not None else os.environ.get(ENV_TENANT) or None
    secret = None
    if secret_file is not None:
        secret = read_secret_file(secret_file)
    elif os.environ.get(ENV_SECRET):
        secret = os.environ[ENV_SECRET].strip()
        if not _SECRET_RE.fullmatch(secret):
            raise ValueError(f"gradswitch: ${ENV_SECRET} must be 16..256 characters of [A-Za-z0-9._~+/=-]")
    elif os.environ.get(ENV_SECRET_FILE):
        secret = read_secret_file(os.environ[ENV_SECRET_FILE])
    if tenant is None and secret is None:
        return None
    if tenant is None:
        raise ValueError(f"gradswitch: a secret was given but no tenant (set ${ENV_TENANT} or pass tenant=)")
    if not isinstance(tenant, str) or not _TENANT_RE.fullmatch(tenant):
        raise ValueError(f"gradswitch: tenant {tenant!r} must be 1..64 characters of [A-Za-z0-9._-]")
    if secret is None:
        raise ValueError(
            f"gradswitch: tenant {tenant!r} needs its secret: set ${ENV_SECRET} or ${ENV_SECRET_FILE}, "
            "or pass secret_file= (never put it on a command line)"
        )
    return tenant, secret


def parse_reply(line: str) -> dict[str, str]:
    """The key=value pairs of an OK line; raises ControlError for an ERR line."""
    if not line.startswith(REPLY_OK):
        raise ControlError(line)
    return dict(tok.split("=", 1) for tok in line.split()[1:] if "=" in tok)


class ControlConnection:
    """One control-plane connection: requests and replies, EVENT lines set aside, optional AUTH."""

    def __init__(
        self,
        address: str,
        timeout: float = 5.0,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.timeout = timeout
        self.sock = socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout)
        self.buf = b""
        self.events: list[str] = []  # EVENT lines (docs/protocol.md §1.4) that arrived between replies
        self.role: str | None = None
        if credentials is not None:
            try:
                self.authenticate(*credentials)
            except BaseException:
                self.close()
                raise

    def __enter__(self) -> ControlConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, data: str | bytes) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def readline(self) -> str:
        """The next reply line (EVENT lines go to self.events)."""
        deadline = time.monotonic() + self.timeout
        while True:
            while b"\n" not in self.buf:
                self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ControlError(f"the switch at {self.address} closed the control connection")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\n", 1)
            line = raw.decode(errors="replace").rstrip("\r")
            if line.startswith(EVENT + " "):
                self.events.append(line)
                continue
            return line

    def request(self, line: str) -> str:
        """Sends one request line; returns its reply line (OK or ERR)."""
        self.send(line + "\n")
        return self.readline()

    def authenticate(self, tenant: str, secret: str) -> str:
        """CHALLENGE and AUTH as `tenant`; checks the switch's proof. Returns the role."""
        challenge = self.request(VERB_CHALLENGE)
        if not challenge.startswith(REPLY_OK):
            raise ControlError(
                f"the switch at {self.address} does not authenticate ({challenge}): is it started with "
                "--auth-file?"
            )
        nonce = parse_reply(challenge).get(KEY_NONCE, "")
        cnonce = secrets.token_hex(32)
        reply = self.request(
            f"{VERB_AUTH} {KEY_TENANT}={tenant} {KEY_CNONCE}={cnonce} "
            f"{KEY_PROOF}={proof(AUTH_CLIENT_LABEL, secret, tenant, nonce, cnonce)}"
        )
        if not reply.startswith(REPLY_OK):
            raise ControlError(f"the switch at {self.address} refused tenant {tenant!r}: {reply}")
        kv = parse_reply(reply)
        want = proof(AUTH_SWITCH_LABEL, secret, tenant, nonce, cnonce)
        if not hmac.compare_digest(kv.get(KEY_PROOF, ""), want):
            raise ControlError(
                f"the switch at {self.address} could not prove that it knows tenant {tenant!r}'s secret"
            )
        self.role = kv.get(KEY_ROLE)
        return self.role or ""
