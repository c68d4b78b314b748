#!/usr/bin/env python3
"""Unmodified MPI programs with and without libgradswitch_mpi.so, side by side on the emulated testbed
(issue 12; paper 000 Case 3 / Fig. 13 analog). The program is the testbed's MPI baseline
(gradswitch.baselines.mpi, plain mpi4py); the *_gs runs preload the library with gradswitchd in the
switch namespace. Every rank checks its sums.

    sudo python3 bench/mpi_library.py [--series models,small] [--workers 4] [--rate 1gbit]
        [--models GoogleNet,ResNet-50] [--iters 3] [--out bench/results/<dir>]

models: for each model size of paper 000 Table 3, N workers: MPI_Reduce to the host (rank 0 on the
        host machine, as in Case 3) vs the same with the library, then MPI_Allreduce vs the library.
small:  MPI_Allreduce of small tensors with GRADSWITCH_MPI_MIN_BYTES=0 (every size through the switch)
        vs plain MPI: where the switch starts to win sets the library's threshold. 256 KiB is the
        library's default threshold, which a call of that size passes with the default settings too:
        its row is the latency at the threshold as users get it.

Progress goes to stdout; results.json and report.md to --out. Whole-machine CPU (both cores) over
each run and the ranks' CPU inside their timed calls (from the ranks' own reports) are recorded, to
tell a link-bound from a CPU-bound run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from suite import MODELS, nbytes_of  # noqa: E402  (paper 000 Table 3)
from suite_measure import busy_fraction, machine_cpu  # noqa: E402

SMALL = [16 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20]


def measure(tb, system: str, nbytes: int, iters: int, workers: int, args) -> dict:
    from gradswitch.baselines import run

    kw = {"timeout": args.run_timeout}
    if system.endswith("_gs"):
        kw["switch_options"] = {"slots": args.slots, "threads": args.threads}
        kw["library_env"] = dict(args.library_env)
    m0 = machine_cpu()
    t0 = time.time()
    r = run(system, tb, nbytes, iters, workers, args.warmup, **kw)
    rec = r.as_dict()
    rec.update(
        wall_s=time.time() - t0,
        machine_busy=busy_fraction(m0, machine_cpu()),  # the whole run, start-up included
        library_env=kw.get("library_env", {}),
    )
    return rec


def log(t0: float, msg: str) -> None:
    el = time.time() - t0
    print(f"[{int(el // 60):3d}:{int(el % 60):02d}] {msg}", flush=True)


def worker_cpu(rec: dict) -> float:
    """Mean CPU seconds a worker rank spent inside one timed call (the library's threads included)."""
    cpus = [c for c in rec["extra"].get("worker_cpu_s", []) if c is not None]
    return sum(cpus) / len(cpus) / max(1, len(rec["times"])) if cpus else float("nan")


def report(res: dict) -> str:
    cfg = res["config"]
    n = cfg["workers"]
    lib_env = cfg.get("library_env", {"GRADSWITCH_MPI_WIRE": cfg["wire"]})
    lines = [
        f"# MPI programs with and without libgradswitch_mpi.so ({res['date']})",
        "",
        f"Testbed (docs/testbed.md): {n} workers + the host machine, tc tbf at {cfg['rate']} per link, MTU "
        f"{cfg['mtu']}. gradswitchd in the switch namespace ({cfg['threads']} data thread, window "
        f"{cfg['slots']} slots). The program: `gradswitch.baselines.mpi` (mpi4py, float32 gradients), "
        "every rank checks its sums. Times: median over the timed iterations of the slowest rank's call. "
        "Machine: 2 CPU cores, shared; `busy` = both cores' busy share during the run.",
        "",
        f"Command: `{res['command']}`",
        "",
        "Library runs' environment: " + ", ".join(f"`{k}={v}`" for k, v in lib_env.items()),
        "",
    ]
    models = [r for r in res["runs"] if r["series"] == "models"]
    if models:
        lines += [
            "## Time to reduce (paper 000 Fig. 13 analog)",
            "",
            "| model | MB | MPI_Reduce (host) | with the library | speedup | MPI_Allreduce "
            "| with the library | speedup | machine busy, plain / library (reduce; allreduce) "
            "| worker CPU per call, plain / library (reduce; allreduce) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|---|",
        ]
        by = {(r["model"], r["system"]): r for r in models}
        for name, mb in cfg["models"]:
            row = [name, f"{mb:g}"]
            busy, cpu = [], []
            for plain in ("mpi_reduce", "mpi_allreduce"):
                a, b = by.get((name, plain)), by.get((name, plain + "_gs"))
                if not a or not b:
                    row += ["-", "-", "-"]
                    continue
                ok = a["ok"] and b["ok"]
                row += [
                    f"{a['median_s'] * 1e3:.0f} ms",
                    f"{b['median_s'] * 1e3:.0f} ms",
                    f"**{a['median_s'] / b['median_s']:.2f}x**" + ("" if ok else " (WRONG SUM)"),
                ]
                busy.append(f"{a['machine_busy'] * 100:.0f}% / {b['machine_busy'] * 100:.0f}%")
                cpu.append(f"{worker_cpu(a):.2f} / {worker_cpu(b):.2f} s")
            lines.append("| " + " | ".join(row + ["; ".join(busy), "; ".join(cpu)]) + " |")
        lines.append("")
    small = [r for r in res["runs"] if r["series"] == "small"]
    if small:
        lines += [
            "## Small messages: MPI_Allreduce vs every size through the switch",
            "",
            "| bytes | MPI_Allreduce | through the switch | ratio (MPI / switch) |",
            "|---:|---:|---:|---:|",
        ]
        by = {(r["nbytes"], r["system"]): r for r in small}
        for nb in sorted({r["nbytes"] for r in small}):
            a, b = by.get((nb, "mpi_allreduce")), by.get((nb, "mpi_allreduce_gs"))
            if a and b:
                lines.append(
                    f"| {nb} | {a['median_s'] * 1e3:.2f} ms | {b['median_s'] * 1e3:.2f} ms | "
                    f"{a['median_s'] / b['median_s']:.2f} |"
                )
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/mpi_library.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--series", default="models,small", help="comma list of models, small (default both)")
    p.add_argument("--workers", "-n", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--models", default=",".join(m for m, _ in MODELS), help="names from paper 000 Table 3")
    p.add_argument("--iters", type=int, default=3, help="timed iterations per model run (default 3)")
    p.add_argument("--small-iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--slots", type=int, default=32, help="switch window (the suite's default, BENCHMARKS.md)")
    p.add_argument("--threads", type=int, default=1, help="switch data threads")
    p.add_argument("--wire", default="native", help="GRADSWITCH_MPI_WIRE of the library runs")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="more environment for the library runs' ranks (repeatable), e.g. GRADSWITCH_WINDOW=fixed",
    )
    p.add_argument("--run-timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=None, help="directory (default bench/results/<date>-mpi)")
    p.add_argument("--name", default="mpilib", help="testbed name")
    a = p.parse_args(argv)
    from gradswitch.testbed import Testbed

    series = [s.strip() for s in a.series.split(",") if s.strip()]
    models = [(m, mb) for m, mb in MODELS if m in a.models.split(",")]
    a.library_env = {"GRADSWITCH_MPI_WIRE": a.wire}
    for item in a.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            p.error(f"--env wants NAME=VALUE, got {item!r}")
        a.library_env[name] = value
    out = a.out or HERE / "results" / f"{_dt.date.today().isoformat()}-mpi"
    out.mkdir(parents=True, exist_ok=True)
    res = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "command": " ".join(
            ["python3", "bench/mpi_library.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "config": {
            "workers": a.workers,
            "rate": a.rate,
            "mtu": a.mtu,
            "slots": a.slots,
            "threads": a.threads,
            "wire": a.wire,
            "library_env": dict(a.library_env),
            "models": models,
        },
        "runs": [],
    }
    t0 = time.time()

    def save() -> None:
        (out / "results.json").write_text(json.dumps(res, indent=1))
        (out / "report.md").write_text(report(res))

    with Testbed(workers=a.workers, rate=a.rate, mtu=a.mtu, name=a.name) as tb:
        log(t0, f"testbed up: {a.workers} workers + host, {a.rate}, MTU {a.mtu}")
        if "models" in series:
            for name, mb in models:
                for plain in ("mpi_reduce", "mpi_allreduce"):
                    for system in (plain, plain + "_gs"):
                        rec = measure(tb, system, nbytes_of(mb), a.iters, a.workers, a)
                        rec.update(series="models", model=name)
                        res["runs"].append(rec)
                        save()
                        log(
                            t0,
                            f"{name:10s} {system:17s} {rec['median_s'] * 1e3:8.0f} ms  ok={rec['ok']}"
                            f"  busy {rec['machine_busy'] * 100:.0f}%",
                        )
        if "small" in series:
            for nb in SMALL:
                for system in ("mpi_allreduce", "mpi_allreduce_gs"):
                    a.library_env["GRADSWITCH_MPI_MIN_BYTES"] = "0"
                    rec = measure(tb, system, nb, a.small_iters, a.workers, a)
                    rec.update(series="small")
                    res["runs"].append(rec)
                    save()
                    log(t0, f"{nb:>9d} B {system:17s} {rec['median_s'] * 1e3:8.2f} ms  ok={rec['ok']}")
            a.library_env.pop("GRADSWITCH_MPI_MIN_BYTES", None)
    save()
    print(report(res))
    print(f"\nwritten: {out / 'report.md'}, {out / 'results.json'}")
    bad = [r for r in res["runs"] if not r["ok"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
