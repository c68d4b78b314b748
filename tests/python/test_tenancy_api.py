"""Tenants from the Python side (docs/security.md): connect() proves a tenant's secret taken from a file
or the environment, gradswitch.control speaks the protocol for tools, and its names agree with
include/gradswitch/control.h."""

from __future__ import annotations

import re
import secrets
import threading
from pathlib import Path

import numpy as np
import pytest

import gradswitch
from gradswitch import control

REPO = Path(__file__).resolve().parents[2]
SECRETS = {name: secrets.token_hex(32) for name in ("alice", "ops")}


@pytest.fixture
def tenant_switch(start_switch, tmp_path):
    path = tmp_path / "auth"
    path.write_text(f"tenant alice secret={SECRETS['alice']}\noperator ops secret={SECRETS['ops']}\n")
    path.chmod(0o600)
    return start_switch(extra_args=["--auth-file", str(path)])


def secret_file(tmp_path: Path, name: str) -> Path:
    p = tmp_path / f"{name}.secret"
    p.write_text(SECRETS[name] + "\n")
    p.chmod(0o600)
    return p


def allreduce_in_threads(world: int, connect) -> list:
    """Each rank connects with connect(rank) and sums [rank+1]*1000; returns the results or errors."""
    out: list = [None] * world

    def run(rank: int) -> None:
        try:
            with connect(rank) as g:
                x = np.full(1000, rank + 1, dtype=np.float32)
                g.allreduce(x)
                out[rank] = x
        except Exception as e:  # reported to the test
            out[rank] = e

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_connect_proves_the_secret_from_a_file(tenant_switch, tmp_path):
    path = secret_file(tmp_path, "alice")
    out = allreduce_in_threads(
        2,
        lambda r: gradswitch.connect(
            tenant_switch.address, job="t", rank=r, world_size=2, tenant="alice", secret_file=path
        ),
    )
    for x in out:
        assert isinstance(x, np.ndarray) and np.all(x == 3.0), out


def test_connect_takes_the_tenant_and_secret_from_the_environment(tenant_switch, monkeypatch):
    monkeypatch.setenv("GRADSWITCH_TENANT", "alice")
    monkeypatch.setenv("GRADSWITCH_SECRET", SECRETS["alice"])
    with gradswitch.connect(tenant_switch.address, job="env", rank=0, world_size=1) as g:
        x = np.ones(10, dtype=np.float32)
        g.allreduce(x)
    creds = control.credentials()
    with control.ControlConnection(tenant_switch.address, credentials=("ops", SECRETS["ops"])) as op:
        assert op.role == "operator"
        assert control.parse_reply(op.request("JOBS"))["jobs"] == ""  # the job ended with its group
    assert creds == ("alice", SECRETS["alice"])


def test_a_wrong_or_missing_secret_is_a_clear_error(tenant_switch, tmp_path, monkeypatch):
    monkeypatch.delenv("GRADSWITCH_SECRET", raising=False)
    monkeypatch.delenv("GRADSWITCH_SECRET_FILE", raising=False)
    monkeypatch.delenv("GRADSWITCH_TENANT", raising=False)
    wrong = tmp_path / "wrong"
    wrong.write_text(secrets.token_hex(32))
    with pytest.raises(gradswitch.GradswitchError, match="refused tenant 'alice'"):
        gradswitch.connect(tenant_switch.address, job="w", tenant="alice", secret_file=wrong)
    with pytest.raises(ValueError, match="needs its secret"):
        gradswitch.connect(tenant_switch.address, job="w", tenant="alice")
    with pytest.raises(gradswitch.GradswitchError, match="needs AUTH before JOIN"):
        gradswitch.connect(tenant_switch.address, job="w")  # anonymous, and the switch has no anonymous entry
    short = tmp_path / "short"
    short.write_text("tooshort")
    with pytest.raises(ValueError, match="16..256 characters"):
        control.credentials("alice", short)


def test_a_tenant_on_a_switch_without_auth_file_is_refused(start_switch, tmp_path):
    sw = start_switch()
    with pytest.raises(gradswitch.GradswitchError, match="does not authenticate"):
        gradswitch.connect(sw.address, job="x", tenant="alice", secret_file=secret_file(tmp_path, "alice"))


def test_python_names_agree_with_control_h():
    text = (REPO / "include/gradswitch/control.h").read_text()
    macros = dict(re.findall(r'#define GS_([A-Z0-9_]+) "([^"]*)"', text))
    checked = 0
    for name, value in macros.items():
        if hasattr(control, name) and name != "STATE_MAGIC":  # bytes in Python
            assert getattr(control, name) == value, name
            checked += 1
    for prefix in ("VERB_", "ERR_"):  # every verb and error code has its Python name
        for name, value in macros.items():
            if name.startswith(prefix):
                assert getattr(control, name, None) == value, f"gradswitch.control.{name} is missing"
    assert control.STATE_MAGIC == macros["STATE_MAGIC"].encode()
    assert gradswitch._group._STATE_MAGIC == control.STATE_MAGIC
    algos = re.findall(r"GS_OPT_([A-Z0-9]+) = (\d+)", text)
    assert [a.lower() for a, _ in sorted(algos, key=lambda x: int(x[1]))] == list(
        gradswitch._group.OPTIMIZERS
    )
    assert checked >= 25
