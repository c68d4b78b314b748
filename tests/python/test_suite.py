"""The benchmark suite's quick configuration (bench/suite.py --quick): every system runs on the testbed
with N = 2 and 3, every rank's sums are checked, and the report (Markdown + PNG plots) is written.

Needs root and network namespaces (skips with the reason otherwise; GRADSWITCH_REQUIRE_NETNS=1 fails
instead). Takes a few minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _netns import ROOT, require_netns, unique

SYSTEMS = ("gradswitch", "hostagg", "gloo", "mpi_allreduce", "mpi_reduce_bcast")


def _python_path() -> str:
    """PYTHONPATH for the suite: the gradswitch this test imports (installed, or the source tree)."""
    import gradswitch

    pkg_parent = str(Path(gradswitch.__file__).absolute().parent.parent)
    parts = [pkg_parent] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(parts))


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    require_netns()
    pytest.importorskip("matplotlib")
    for mod, why in (("torch", "gloo baseline"), ("mpi4py", "MPI baselines")):
        pytest.importorskip(mod, reason=f"{mod} not installed ({why})")
    out = tmp_path_factory.mktemp("suite")
    env = dict(os.environ, PYTHONPATH=_python_path())
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "suite.py"),
        "--quick",
        "--out",
        str(out),
        "--name",
        unique("sq"),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    print(p.stdout[-6000:])
    print(p.stderr[-3000:])
    assert (out / "results.json").exists(), (
        f"the suite wrote no results (rc={p.returncode}):\n{p.stderr[-3000:]}"
    )
    return out, p


def test_quick_suite_every_sum_checked(quick_run):
    out, p = quick_run
    data = json.loads((out / "results.json").read_text())
    recs = data["records"]
    wrong = [r for r in recs if "wrong sum" in str(r.get("error", ""))]
    assert not wrong, f"wrong sums: {wrong}"
    assert p.returncode != 2, "the suite reported wrong sums"
    # every system was verified correct at N = 2 and N = 3 in the model-size series
    for s in SYSTEMS:
        for n in (2, 3):
            ok = [
                r
                for r in recs
                if r["series"] == "models" and r["system"] == s and r["workers"] == n and r.get("ok")
            ]
            assert ok, f"{s} N={n}: no verified run: " + str(
                [r.get("error") for r in recs if r["system"] == s and r["workers"] == n][:2]
            )
    # every series produced at least one verified run
    for series in ("models", "scaling", "loss", "frames", "small", "variation", "cpu", "ddp"):
        assert any(r["series"] == series and r.get("ok") for r in recs), f"series {series}: nothing verified"
    failed = [r for r in recs if not r.get("skipped") and not r.get("ok")]
    assert len(failed) <= 2, f"{len(failed)} runs failed: " + "; ".join(
        str(r.get("error"))[:200] for r in failed
    )


def test_quick_suite_report_written(quick_run):
    out, _ = quick_run
    report = (out / "report.md").read_text()
    for head in (
        "## Targets",
        "## Aggregation time",
        "## Scaling",
        "## Random loss",
        "## Frame size",
        "## Small tensors",
        "## Run-to-run variation",
        "## CPU time per GB",
        "## Where the bottleneck",
    ):
        assert head in report, f"report lacks {head!r}"
    for png in ("models.png", "scaling.png", "loss.png", "frames.png", "small.png", "variation.png"):
        f = out / png
        assert f.exists() and f.stat().st_size > 1000, f"{png} missing"
        assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "runs verified correct by every rank, 0 wrong" in report


def test_report_renders_from_results_alone(quick_run, tmp_path):
    """--report-only re-renders a results.json (no testbed needed)."""
    out, _ = quick_run
    (tmp_path / "results.json").write_text((out / "results.json").read_text())
    p = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "suite.py"), "--report-only", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "report.md").exists() and (tmp_path / "models.png").exists()


def test_cpu_per_gb_is_in_call_cpu_over_timed_bytes():
    """The CPU series divides what each process measured inside its timed iterations by the bytes those
    iterations reduced: no start-up run subtracted (it made the switch's cost negative)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import suite_report

    def rec(system, **extra):
        return {"series": "cpu", "system": system, "nbytes": 50_000_000, "iters": 4, "workers": 2, "ok": True,
                "times": [0.1] * 4, "extra": extra}  # fmt: skip

    rows = suite_report.cpu_table(
        [
            rec("gradswitch", worker_cpu_s=[0.1, 0.3], switch_data_cpu_s=0.05, switch_cpu_s=0.06),
            rec("gloo", worker_cpu_s=[0.4, 0.4]),
            rec("hostagg", worker_cpu_s=[0.2, 0.2], host_cpu_s=0.8),
            {"series": "cpu", "system": "mpi_allreduce", "nbytes": 4, "iters": 1, "ok": False, "times": []},
        ]
    )
    by = {r["system"]: r for r in rows}
    assert by["gradswitch"]["worker"] == pytest.approx(1.0)  # mean 0.2 s over 0.2 GB
    assert by["gradswitch"]["switch"] == pytest.approx(0.25)
    assert by["gradswitch"]["daemon"] == pytest.approx(0.3)
    assert by["gloo"]["worker"] == pytest.approx(2.0) and by["gloo"]["switch"] is None
    assert by["hostagg"]["host"] == pytest.approx(4.0)
    assert by["mpi_allreduce"] == {"system": "mpi_allreduce", "error": "the run failed"}
    lines: list[str] = []
    stats = {"udp.thread0.rx_datagrams": 640, "udp.thread1.rx_datagrams": 320, "udp.gro_trains": 30}
    stats |= {"udp.sleeps": 16, "udp.thread0.cpu_ns": 5}
    suite_report.section_cpu(
        [rec("gradswitch", worker_cpu_s=[0.1, 0.3], switch_data_cpu_s=0.05, switch_cpu_s=0.06, switch=stats)],
        lines,
    )
    # DATA: 2 workers' worth; 960 datagrams in 30 GRO trains and 16 wake-ups
    assert "| gradswitch (in-network) | 1.00 | – | 0.25 | 0.12 | 0.30 | 32.0 | 60.0 |" in lines, lines


def test_ddp_series_runs_by_default_and_reports_the_overlap():
    """The overlap path has a series that the default suite plans (issue 42: a regression shows), and
    the report prints each configuration beside gloo and its bound."""
    sys.path.insert(0, str(ROOT / "bench"))
    import suite
    import suite_report

    steps = suite.plan(suite.Config.make(suite.make_parser().parse_args([])))
    ddp = [s for s in steps if s.series == "ddp"]
    assert len(ddp) == 1 and "gs-overlap:256" in ddp[0].kw["configs"], ddp
    res = [
        {"config": "local", "iteration_s": 0.2, "loss": 6.0},
        {"config": "gloo-ddp", "iteration_s": 1.6, "loss": 5.0, "bound_s": 1.0, "vs_bound": 1.6},
        {"config": "gs-overlap:256", "iteration_s": 1.0, "loss": 5.0, "bound_s": 0.9, "vs_bound": 1.11},
    ]
    rec = {"series": "ddp", "workers": 4, "iters": 5, "ddp": {"model": "mlp", "params": 25e6, "results": res}}
    lines: list[str] = []
    suite_report.section_ddp([rec], lines)
    assert "| gs-overlap:256 | 1000.0 ms | 1.60x | 900.0 ms | 1.11 | 5.00000 |" in lines, lines
