"""gradswitchd's config file (--config, src/switch/options/config_file.cpp; docs/deploy.md): the shipped
example deploy/gradswitchd.toml starts a switch that sums exactly, it names every option of the daemon,
the command line overrides it, and every kind of bad file stops the switch with the file, line and key."""

from __future__ import annotations

import re
import subprocess

import pytest
from _daemon import daemon_binary
from _deploy import SHIPPED_CONFIG, Process, config_with, run_ranks, shipped_config_for_test

from gradswitch.daemon import pick_ports


def test_the_shipped_config_starts_a_switch_that_sums_exactly(tmp_path):
    config, keys = shipped_config_for_test(tmp_path)
    sw = Process([daemon_binary(), "--config", str(config)], tmp_path / "switch.log")
    try:
        sw.wait_ping(keys["control_port"])
        # Tenants from the file's auth-file: ranks authenticate, and every element of 3 rounds is exact.
        run_ranks(f"127.0.0.1:{keys['control_port']}", 3, keys["secret_file"])
    finally:
        rc = sw.stop()
    log = sw.log()
    assert rc == 0, log
    # The file's other settings took effect: JSON log lines, its thread count, its auth file.
    first = log.splitlines()[1]
    assert first.startswith("{") and '"msg"' in first, log
    assert f"from {keys['auth']}" in log, log
    data = f"{keys['data_port']}-{keys['data_port'] + keys['threads'] - 1}"
    assert f"control 0.0.0.0:{keys['control_port']}, data udp {data} (4 threads" in log, log


def option_names() -> dict[str, str]:
    """name -> group ("" or "dpdk") of every option, from the daemon's --help."""
    out = subprocess.run([daemon_binary(), "--help"], capture_output=True, text=True, check=True).stdout
    names: dict[str, str] = {}
    group = None
    for line in out.splitlines():
        if line == "Options:":
            group = ""
        elif line.startswith("DPDK backend options"):
            group = "dpdk"
        elif group is not None and (m := re.match(r"^  --([a-z0-9-]+)", line)) and m.group(1) != "config":
            names[m.group(1)] = group
        elif group is not None and not line.strip():
            group = None if group == "dpdk" else group
    assert len(names) > 30 and "agg-ip" in names and "threads" in names, names
    return names


def test_the_shipped_config_names_every_option_of_the_daemon():
    # Each option is set or shown commented out with its default, in its table, so that the example is the
    # file's reference; a new option of the option table fails here until it is added.
    text = SHIPPED_CONFIG.read_text()
    top, _, dpdk = text.partition("\n[dpdk]\n")
    missing = [
        name for name, group in option_names().items()
        if not re.search(rf"^#? ?{re.escape(name)} = ", dpdk if group else top, re.M)
    ]
    assert not missing, f"options missing from {SHIPPED_CONFIG}: {missing}"


def test_the_command_line_overrides_the_file(tmp_path):
    config, keys = shipped_config_for_test(tmp_path, threads=1)
    control, data = pick_ports(1, host="0.0.0.0")
    sw = Process(
        [daemon_binary(), "--control-port", str(control), "--config", str(config), "--data-port", str(data),
         "--log-format", "text"],
        tmp_path / "switch.log",
    )
    try:
        sw.wait_ping(control)
        run_ranks(f"127.0.0.1:{control}", 2, keys["secret_file"], rounds=1)
    finally:
        assert sw.stop() == 0
    assert f"control 0.0.0.0:{control}, data udp {data} " in sw.log(), sw.log()
    assert "{" not in sw.log(), sw.log()  # --log-format text over the file's json


BAD = [
    # (what, file text, the error after "gradswitchd: ")
    ("unknown key", 'threads = 2\nthread = 3\n', "{f}:2:1: unknown key 'thread'"),
    ("bad value", 'threads = 2\n\nslots = -4\n',
     "{f}:3:9: key 'slots': expected an unsigned integer, got '-4'"),
    ("out of range", 'threads = 65\n', "{f}:1:11: key 'threads': '65' is out of range 1..64"),
    ("bad choice", 'log-level = "loud"\n',
     "{f}:1:13: key 'log-level': expected one of error|warn|info|debug, got 'loud'"),
    ("wrong type", 'insecure = "yes"\n', "{f}:1:12: key 'insecure': expected true or false, got a string"),
    ("syntax error", 'threads = 2\nslots = [\n', "{f}:2:"),
    ("dpdk option at the top", 'agg-ip = "10.0.0.1"\n',
     "{f}:1:1: unknown key 'agg-ip' (an option of the [dpdk] table)"),
    ("options that do not go together", 'control-host = "0.0.0.0"\n',
     "--control-host 0.0.0.0 can be reached"),
]


@pytest.mark.parametrize("what,text,error", BAD, ids=[b[0] for b in BAD])
def test_a_bad_config_file_stops_the_switch_with_the_file_line_and_key(tmp_path, what, text, error):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    p = subprocess.run([daemon_binary(), "--config", str(f)], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.startswith("gradswitchd: " + error.format(f=f)), p.stderr
    assert p.stdout == ""


def test_an_unreadable_config_file_stops_the_switch(tmp_path):
    cases = ((tmp_path / "missing.toml", "No such file or directory"), (tmp_path, "not a regular file"))
    for path, why in cases:
        p = subprocess.run([daemon_binary(), "--config", str(path)], capture_output=True, text=True,
                           timeout=30)
        assert p.returncode == 2 and p.stderr.startswith(
            f"gradswitchd: cannot read the config file {path}: {why}"
        ), p.stderr
    # A file of the right shape keeps the switch from starting too when a later flag is bad.
    good = tmp_path / "good.toml"
    good.write_text(config_with("", threads=1))
    p = subprocess.run([daemon_binary(), "--config", str(good), "--threads", "0"], capture_output=True,
                       text=True, timeout=30)
    assert p.returncode == 2 and "bad value for --threads" in p.stderr, p.stderr
