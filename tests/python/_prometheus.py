"""A real Prometheus server for the metrics tests: started on a scrape configuration, queried by PromQL;
and the bearer token it scrapes with, from `gradswitch metrics-token`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from gradswitch import _tools
from gradswitch.daemon import pick_ports


def metrics_token(tenant: str, secret: str | None = None, secret_file=None) -> str:
    """What `gradswitch metrics-token` prints for `tenant`, given its secret in GRADSWITCH_SECRET or
    its file in GRADSWITCH_SECRET_FILE (the other variable unset); the command must succeed."""
    env = {k: v for k, v in os.environ.items() if k not in ("GRADSWITCH_SECRET", "GRADSWITCH_SECRET_FILE")}
    env["GRADSWITCH_TENANT"] = tenant
    if secret is not None:
        env["GRADSWITCH_SECRET"] = secret
    if secret_file is not None:
        env["GRADSWITCH_SECRET_FILE"] = str(secret_file)
    cmd = [sys.executable, "-m", "gradswitch.cli", "metrics-token"]
    cli = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    return cli.stdout


def start_prometheus(tmp_path, scrape_configs: str):
    """Prometheus scraping every second with `scrape_configs` (the YAML list's items, indented two
    spaces); (process, its URL). A missing prometheus fails the test: install-deps.sh installs it."""
    try:
        binary = _tools.require("prometheus")
    except _tools.ToolMissing as e:
        pytest.fail(str(e))
    port = pick_ports(0)[0]
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n" + scrape_configs)
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "prometheus.log", "wb"),
    )
    return proc, f"http://127.0.0.1:{port}"


def query(url: str, promql: str) -> list[dict]:
    """The instant query's result; [] while the server does not answer yet."""
    q = urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
            doc = json.load(r)
    except OSError:
        return []
    assert doc["status"] == "success", doc
    return doc["data"]["result"]
