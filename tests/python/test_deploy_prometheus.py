"""deploy/prometheus/scrape.yml: a real Prometheus server with the shipped scrape job (only its target and
token file moved to the test's) scrapes a switch started from the shipped deploy/gradswitchd.toml, with
the operator's token that `gradswitch metrics-token` writes, and has the job's series."""

from __future__ import annotations

import time

import yaml
from _daemon import daemon_binary
from _deploy import ROOT, Process, run_ranks, shipped_config_for_test
from _prometheus import metrics_token, query, start_prometheus

SCRAPE = ROOT / "deploy" / "prometheus" / "scrape.yml"


def wait_for(what: str, cond, timeout: float = 60.0):
    """cond()'s first true value (the deadline bounds a hang; the shipped interval is 15 s)."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)
    return value


def shipped_scrape_job(target: str, token_file) -> str:
    """The shipped job with `target` and `token_file` in place of the examples, as the YAML list's item."""
    (job,) = yaml.safe_load(SCRAPE.read_text())["scrape_configs"]
    (static,) = job["static_configs"]
    assert job["authorization"]["type"] == "Bearer" and job["authorization"]["credentials_file"]
    static["targets"] = [target]
    job["authorization"]["credentials_file"] = str(token_file)
    return "".join("  " + line + "\n" for line in yaml.safe_dump([job], sort_keys=False).splitlines())


def test_prometheus_scrapes_the_shipped_switch_config_with_the_shipped_scrape_job(tmp_path):
    config, keys = shipped_config_for_test(tmp_path, threads=1)
    ops_secret = next(
        line.split("secret=")[1].split()[0]
        for line in keys["auth"].read_text().splitlines()
        if line.startswith("operator ops ")
    )
    (tmp_path / "ops.secret").write_text(ops_secret + "\n")
    (tmp_path / "ops.secret").chmod(0o600)
    token = metrics_token("ops", secret_file=tmp_path / "ops.secret")
    (tmp_path / "gradswitch.token").write_text(token)
    sw = Process([daemon_binary(), "--config", str(config)], tmp_path / "switch.log")
    prom = None
    try:
        sw.wait_ping(keys["control_port"])
        run_ranks(f"127.0.0.1:{keys['control_port']}", 2, keys["secret_file"], job="scraped", elements=4096)
        target = f"127.0.0.1:{keys['metrics_port']}"
        prom, url = start_prometheus(tmp_path, shipped_scrape_job(target, tmp_path / "gradswitch.token"))
        up = wait_for("the shipped job's first scrape", lambda: query(url, 'up{job="gradswitch"}'))
        assert up[0]["value"][1] == "1" and up[0]["metric"]["role"] == "switch", up
        # The operator's view: the switch's totals (the ranks' job has ended) and its configuration.
        res = query(url, 'gradswitch_jobs_started_total{job="gradswitch"}')
        assert res and float(res[0]["value"][1]) == 1, res
        assert float(query(url, 'gradswitch_max_jobs{job="gradswitch"}')[0]["value"][1]) == 64
    finally:
        if prom is not None:
            prom.terminate()
            prom.wait(10)
        assert sw.stop() == 0, sw.log()
