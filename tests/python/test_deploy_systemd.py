"""The systemd unit (deploy/systemd/gradswitchd.service) and the DPDK backend's drop-in: `systemd-analyze
verify` accepts both without a warning, `systemd-analyze security` rates the unit's sandbox, and the unit's
exact ExecStart command line, with the shipped example config, runs a switch as an unprivileged user
without capabilities that sums exactly. systemd is not PID 1 here: what the service manager itself would do
(the sandbox, User=, the restart policy) is not exercised, only checked by systemd-analyze."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from _daemon import daemon_binary
from _deploy import ROOT, Process, require, run_ranks, shipped_config_for_test, unit_directives

UNIT = ROOT / "deploy" / "systemd" / "gradswitchd.service"
DROP_IN = ROOT / "deploy" / "systemd" / "gradswitchd.service.d" / "dpdk.conf"
INSTALLED_BINARY = "/usr/bin/gradswitchd"
INSTALLED_CONFIG = "/etc/gradswitch/gradswitchd.toml"
NOBODY = 65534


def verify(unit_dir: Path) -> str:
    """systemd-analyze verify's complaints (stdout and stderr) about unit_dir/gradswitchd.service."""
    p = subprocess.run([require("systemd-analyze"), "verify", str(unit_dir / UNIT.name)],
                       capture_output=True, text=True, timeout=60)
    return (p.stdout + p.stderr).strip() + ("" if p.returncode == 0 else f" (rc={p.returncode})")


def installed_copy(tmp_path: Path, drop_in: bool) -> Path:
    """The unit (and the drop-in) as they would be installed, except for the binary's path: verify checks
    that ExecStart's program exists, and /usr/bin/gradswitchd does not here."""
    d = tmp_path / "units"
    (d / f"{UNIT.name}.d").mkdir(parents=True)
    (d / UNIT.name).write_text(UNIT.read_text().replace(INSTALLED_BINARY, daemon_binary()))
    if drop_in:
        (d / f"{UNIT.name}.d" / DROP_IN.name).write_text(DROP_IN.read_text().replace(INSTALLED_BINARY,
                                                                                   daemon_binary()))
    return d


def test_the_unit_and_the_dpdk_drop_in_pass_systemd_analyze_verify(tmp_path):
    assert verify(installed_copy(tmp_path / "plain", drop_in=False)) == ""
    assert verify(installed_copy(tmp_path / "dpdk", drop_in=True)) == ""
    # The check can fail: a misspelt value is reported, and so is a missing binary.
    bad = installed_copy(tmp_path / "bad", drop_in=True)
    conf = bad / f"{UNIT.name}.d" / DROP_IN.name
    conf.write_text(conf.read_text() + "ProtectSystem=sometimes\n")
    assert "Failed to parse protect system value" in verify(bad)
    (bad / UNIT.name).write_text(UNIT.read_text())
    conf.unlink()
    assert f"Command {INSTALLED_BINARY} is not executable" in verify(bad)


def test_the_unit_is_hardened(tmp_path):
    s = unit_directives(UNIT.read_text())
    for key, value in {"User": "gradswitch", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
                       "PrivateTmp": "yes", "ProtectHome": "yes", "Restart": "on-failure",
                       "StateDirectory": "gradswitch", "LogsDirectory": "gradswitch"}.items():
        assert s.get(key) == [value], (key, s.get(key))
    assert "CapabilityBoundingSet" in s and s["CapabilityBoundingSet"] == []  # no capability at all
    assert s["RestrictAddressFamilies"] == ["AF_INET AF_UNIX"]
    assert s["ExecReload"] == ["/bin/kill -HUP $MAINPID"]  # SIGHUP re-reads the auth file
    # systemd's own rating of the sandbox: at most 2.0 of 10 ("OK"; the unit rates 1.2). On a copy: next to
    # the unit in the source tree, the drop-in would be read too.
    unit = installed_copy(tmp_path, drop_in=False) / UNIT.name
    p = subprocess.run([require("systemd-analyze"), "security", "--offline=yes", "--threshold=20", str(unit)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr
    assert "Overall exposure level for gradswitchd.service: 1." in p.stdout, p.stdout[-500:]
    # The drop-in keeps the user and the sandbox, and adds only what DPDK needs.
    merged = unit_directives(UNIT.read_text() + "\n" + DROP_IN.read_text())
    assert merged["User"] == ["gradswitch"] and merged["ProtectSystem"] == ["strict"]
    assert merged["ExecStart"] == [f"{INSTALLED_BINARY} --config {INSTALLED_CONFIG} --backend dpdk -- "
                                   "$GRADSWITCH_EAL_ARGS"]


def test_the_units_exact_command_line_runs_unprivileged_and_sums_exactly(tmp_path, request):
    (exec_start,) = unit_directives(UNIT.read_text())["ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == INSTALLED_BINARY and INSTALLED_CONFIG in argv, argv
    # The service's files, readable by its user only (as the unit's ConfigurationDirectory holds them).
    # Not under tmp_path: pytest's directories are its user's alone.
    top = Path(tempfile.mkdtemp(prefix="gs-systemd-"))
    request.addfinalizer(lambda: shutil.rmtree(top, ignore_errors=True))
    etc = top / "etc-gradswitch"
    etc.mkdir()
    config, keys = shipped_config_for_test(etc)
    argv = [daemon_binary() if a == INSTALLED_BINARY else str(config) if a == INSTALLED_CONFIG else a
            for a in argv]
    if os.geteuid() == 0:
        # Root here: run it as the unit does, as a user of its own (nobody) with no capability and no
        # way to gain one. Without root the test's own unprivileged user is that user already.
        for p in (top, etc, config, keys["auth"]):
            os.chown(p, NOBODY, NOBODY)
        argv = [require("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", *argv]
    sw = Process(argv, tmp_path / "switch.log")
    try:
        sw.wait_ping(keys["control_port"])
        status = Path(f"/proc/{sw.proc.pid}/status").read_text()
        uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
        cap_eff = next(line.split()[1] for line in status.splitlines() if line.startswith("CapEff:"))
        assert int(uid) != 0 and int(cap_eff, 16) == 0, status
        run_ranks(f"127.0.0.1:{keys['control_port']}", 4, keys["secret_file"], rounds=2)
    finally:
        rc = sw.stop()
    assert rc == 0, sw.log()
    assert "job 'train/check'" in sw.log() and "ended: all ranks left" in sw.log(), sw.log()
