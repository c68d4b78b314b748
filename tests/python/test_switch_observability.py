"""What an operator sees of a running gradswitchd: its log as JSON lines (--log-format json)."""

from __future__ import annotations

import datetime
import json
import socket

from gradswitch.local_switch import LocalSwitch


def test_json_log_lines(tmp_path):
    sw = LocalSwitch(
        extra_args=["--log-format", "json", "--log-level", "debug"], log_path=tmp_path / "sw.log"
    )
    with sw:
        ctl = socket.create_connection(("127.0.0.1", sw.control_port), timeout=5)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        ctl.sendall(
            f"JOIN job=logjob world=1 rank=0 wire=float32 token=t port={udp.getsockname()[1]}\n".encode()
        )
        assert ctl.recv(4096).startswith(b"OK")
        ctl.sendall(b'NOPE "quoted"\tand tab\n')  # answered with an error, logged at debug
        assert ctl.recv(4096).startswith(b"ERR")
        ctl.close()
        udp.close()
    lines = [ln for ln in sw.log().splitlines() if ln.strip()]
    records = [json.loads(ln) for ln in lines]  # every line is one JSON object
    for r in records:
        assert set(r) == {"time", "level", "logger", "pid", "msg"}, r
        assert r["level"] in ("error", "warn", "info", "debug") and r["logger"] == "gradswitchd"
        assert r["pid"] == records[0]["pid"]
        when = datetime.datetime.strptime(r["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        assert (
            abs(when - datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)).total_seconds()
            < 600
        ), r
    msgs = [r["msg"] for r in records]
    assert msgs[0].startswith("gradswitchd ") and ": control 127.0.0.1:" in msgs[0]
    assert any("job 'logjob'" in m and "started" in m for m in msgs), msgs
    assert any(r["level"] == "debug" and "ERR bad_request" in r["msg"] for r in records), msgs
    assert msgs[-1].startswith("gradswitchd: stopped after")
