"""A real Prometheus server for the metrics tests: started on a scrape configuration, queried by PromQL."""

from __future__ import annotations

import json
import subprocess
import urllib.parse
import urllib.request

import pytest

from gradswitch import _tools
from gradswitch.daemon import pick_ports


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
