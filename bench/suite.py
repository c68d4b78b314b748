#!/usr/bin/env python3
"""Side-by-side benchmark suite (issue 3, part 3): gradswitch and every baseline on the same emulated
testbed, sums checked, report (Markdown + PNG plots) written under bench/results/.

    sudo python3 bench/suite.py [--quick] [--out bench/results/<date>] [--series models,scaling,...]
    python3 bench/suite.py --report-only bench/results/<date>      # re-render from results.json

Series (see bench/results/*/report.md for what each measures): models, scaling, loss, frames, small,
variation, cpu, ddp (a DDP training iteration of bench/torch_iteration.py's MLP: gloo DDP, gradswitch DDP
and the uniform-chunk overlap beside their bounds, issue 42). Every run is bounded (--run-timeout)
and the whole suite by --max-minutes (runs that would start later are skipped and listed as such).
Progress goes to stdout, one line per run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))


def _import_gradswitch():
    """The importable gradswitch (installed, editable, or on PYTHONPATH) with its native module and the
    gradswitch system adapter; processes in the testbed namespaces import the same copy."""
    try:
        import gradswitch.baselines.gradswitch_sys  # noqa: F401
    except ImportError as e:
        try:
            import gradswitch
        except ImportError:
            raise SystemExit(
                f"bench/suite.py: cannot import gradswitch ({e}); build and install it first: "
                "`pip install --no-build-isolation .` in the repository"
            ) from e
        raise SystemExit(
            f"bench/suite.py: the gradswitch at {Path(gradswitch.__file__).parent} lacks "
            f"baselines/gradswitch_sys.py ({e}): it was installed before the suite's adapter was added; "
            "reinstall with `pip install --no-build-isolation .` (or `pip install -e .`)"
        ) from e


MB = 1_000_000  # model sizes are given in MB (10^6 bytes), as in the papers
MODELS = [  # paper 000 Fig. 11 / Table 3
    ("GoogleNet", 24.7),
    ("VGG19", 80.2),
    ("ResNet-50", 94.0),
    ("ResNet-101", 170.0),
    ("ResNet-152", 232.6),
]
SYSTEMS = ("gradswitch", "hostagg", "gloo", "mpi_allreduce", "mpi_reduce_bcast")
LABELS = {
    "gradswitch": "gradswitch (in-network)",
    "hostagg": "host aggregation",
    "gloo": "gloo ring (torch.distributed)",
    "mpi_allreduce": "MPI_Allreduce",
    "mpi_reduce_bcast": "MPI_Reduce+Bcast (host)",
}
FRAMES = [64, 146, 256, 512, 1024, 1518, 9018]  # Ethernet frame bytes incl. 14 B header + 4 B FCS
GS_OVERHEAD = 20 + 8 + 32  # IPv4 + UDP + gradswitch header
DDP_CONFIGS = "local,gloo-ddp,gs-ddp,gs-overlap:256"


def nbytes_of(mb: float) -> int:
    return int(round(mb * MB)) // 4 * 4


@dataclass
class Config:
    quick: bool
    rate: str
    scale_rate: str
    mtu: int
    slots: int
    threads: int
    systems: list[str]
    series: list[str]
    models: list[tuple[str, float]]
    model_workers: list[int]
    model_iters: int
    scale_workers: list[int]
    scale_mb: float
    loss_levels: list[float]
    loss_mb: float
    loss_workers: int
    frames: list[int]
    frame_workers: int
    small_sizes: list[int]
    small_iters: int
    small_workers: int
    var_mb: float
    var_iters: int
    var_workers: int
    cpu_mb: float
    cpu_iters: int
    cpu_workers: int
    ddp_workers: int
    ddp_iters: int
    ddp_options: list[str]
    run_timeout: float
    max_minutes: float
    name: str

    @classmethod
    def make(cls, a) -> Config:
        q = a.quick
        c = cls(
            quick=q,
            rate=a.rate,
            scale_rate=a.scale_rate or ("500mbit" if q else "300mbit"),
            mtu=a.mtu,
            slots=a.slots,
            threads=a.threads,
            systems=a.systems.split(","),
            series=a.series.split(","),
            models=[("tiny-2MB", 2.0)] if q else MODELS,
            model_workers=[2, 3] if q else [3, 4],
            model_iters=a.iters or (3 if q else 3),
            scale_workers=[2, 3] if q else [2, 3, 4, 6, 8],
            scale_mb=a.scale_mb or (1.0 if q else 24.7),
            loss_levels=[0.0, 0.01] if q else [0.0, 0.001, 0.01, 0.05],
            loss_mb=a.loss_mb or (2.0 if q else 94.0),
            loss_workers=3 if q else 4,
            frames=[512, 1518] if q else FRAMES,
            frame_workers=2 if q else 4,
            small_sizes=[4, 65536] if q else [4, 64, 256, 1024, 4096, 16384, 65536],
            small_iters=20 if q else 50,
            small_workers=3 if q else 4,
            var_mb=0.25 if q else 4.0,
            var_iters=30 if q else 100,
            var_workers=3 if q else 4,
            cpu_mb=4.0 if q else 32.0,
            cpu_iters=2 if q else 3,
            cpu_workers=3 if q else 4,
            ddp_workers=3 if q else 4,
            ddp_iters=2 if q else 5,
            ddp_options=["--width", "1024"] if q else [],  # a 4 M-parameter MLP in the quick suite
            run_timeout=a.run_timeout or (120 if q else 600),
            max_minutes=a.max_minutes or (15 if q else 240),
            name=a.name or f"su{os.getpid() % 100000}",
        )
        bad = [s for s in c.systems if s not in SYSTEMS]
        if bad:
            raise SystemExit(f"unknown systems {bad}: use {','.join(SYSTEMS)}")
        return c


@dataclass
class Step:
    series: str
    tb: tuple  # testbed key: (workers, rate, mtu, loss, offload)
    system: str
    nbytes: int
    workers: int
    iters: int
    warmup: int = 1
    kw: dict = field(default_factory=dict)
    tag: dict = field(default_factory=dict)  # series-specific labels (model, loss, frame, ...)


def plan(c: Config) -> list[Step]:
    steps: list[Step] = []
    main_tb = (
        max(
            c.model_workers + [c.small_workers, c.var_workers, c.cpu_workers, c.frame_workers, c.ddp_workers]
        ),
        c.rate,
        c.mtu,
        0.0,
        None,
    )
    gs_kw = {"slots": c.slots, "threads": c.threads}

    def kw(system, extra=None):
        d = dict(gs_kw) if system == "gradswitch" else {}
        d.update(extra or {})
        return d

    if "models" in c.series:
        for n in c.model_workers:
            for name, mb in c.models:
                for s in c.systems:
                    iters = c.model_iters if mb < 150 else max(2, c.model_iters - 1)
                    steps.append(
                        Step(
                            "models", main_tb, s, nbytes_of(mb), n, iters, 1, kw(s), {"model": name, "mb": mb}
                        )
                    )
    if "scaling" in c.series:
        tbk = (max(c.scale_workers), c.scale_rate, c.mtu, 0.0, None)
        for n in c.scale_workers:
            for s in c.systems:
                steps.append(Step("scaling", tbk, s, nbytes_of(c.scale_mb), n, c.model_iters, 1, kw(s)))
    if "small" in c.series:
        for size in c.small_sizes:
            for s in c.systems:
                steps.append(
                    Step("small", main_tb, s, size, c.small_workers, c.small_iters, 3, kw(s), {"size": size})
                )
    if "variation" in c.series:
        for s in c.systems:
            steps.append(
                Step("variation", main_tb, s, nbytes_of(c.var_mb), c.var_workers, c.var_iters, 2, kw(s))
            )
    if "cpu" in c.series:
        # CPU inside the timed iterations, as each process measures it (suite_report.cpu_table)
        for s in c.systems:
            steps.append(Step("cpu", main_tb, s, nbytes_of(c.cpu_mb), c.cpu_workers, c.cpu_iters, 1, kw(s)))
    if "ddp" in c.series and "gradswitch" in c.systems:
        # one launch of every configuration side by side; the sums are checked by their equal losses
        kw_ddp = {"configs": DDP_CONFIGS, "options": c.ddp_options, "slots": 256}
        steps.append(
            Step("ddp", main_tb, "gradswitch", 0, c.ddp_workers, c.ddp_iters, 1, kw_ddp, {"model": "mlp"})
        )
    if "frames" in c.series and "gradswitch" in c.systems:
        for f in c.frames:
            mtu = f - 18
            if mtu - GS_OVERHEAD < 4 or mtu < 128:
                steps.append(
                    Step(
                        "frames",
                        main_tb,
                        "gradswitch",
                        0,
                        c.frame_workers,
                        0,
                        0,
                        {},
                        {
                            "frame": f,
                            "skip": f"a {f}-byte frame has {mtu} B of IP packet: "
                            f"below the daemon's minimum MTU 128 / the {GS_OVERHEAD} B of headers",
                        },
                    )
                )
                continue
            payload = (mtu - GS_OVERHEAD) // 4 * 4
            pkts = 4000 if c.quick else 20000  # per worker: bounded time even for tiny frames
            nb = min(nbytes_of(8.0 if c.quick else 32.0), payload * pkts)
            window = max(c.slots, min(256, math.ceil(c.slots * 1440 / payload)))  # same bytes in flight
            tbk = main_tb if mtu <= 1500 else (c.frame_workers, c.rate, 9000, 0.0, None)
            steps.append(
                Step(
                    "frames",
                    tbk,
                    "gradswitch",
                    nb,
                    c.frame_workers,
                    2 if c.quick else 3,
                    1,
                    {"mtu": mtu, "slots": window, "threads": c.threads},
                    {"frame": f, "payload": payload},
                )
            )
    if "loss" in c.series:
        for p in c.loss_levels:
            # offloads off at every level (also 0), so TCP is compared with itself per wire packet; UDP
            # segmentation is also turned off on the links (Suite.testbed), see per_datagram_loss()
            tbk = (c.loss_workers, c.rate, c.mtu, p, False)
            for s in c.systems:
                extra = {"op_timeout": 60.0} if s == "gradswitch" else {}
                steps.append(
                    Step(
                        "loss",
                        tbk,
                        s,
                        nbytes_of(c.loss_mb),
                        c.loss_workers,
                        2 if not c.quick else 2,
                        1,
                        kw(s, extra),
                        {"loss": p},
                    )
                )
    return steps


# ------------------------------------------------------------------------------------------ running
def per_datagram_loss(tb) -> None:
    """Make the testbed's random loss drop UDP datagrams one by one.

    With offloads off the testbed turns TSO/GSO/GRO off, but `tx-udp-segmentation` stays on on the veths
    and everything on the bridge. gradswitch sends UDP_SEGMENT bursts (worker DATA runs, the daemon's
    result trains; ~32 datagrams each), which then cross the links as one skb, and the nftables loss
    rule drops a whole burst at once: measured, 641 rule hits for ~20k lost datagrams at 1%. With the
    feature off on every device the kernel segments the burst in software before the link (the
    sender keeps its one-syscall GSO path) and each datagram is one drop candidate, like TCP segments.
    """
    for h in tb.endpoints:
        tb.exec(h, ["ethtool", "-K", tb.interface(h), "tx-udp-segmentation", "off"], check=False)
        tb.exec("switch", ["ethtool", "-K", tb.port(h), "tx-udp-segmentation", "off"], check=False)
    tb.exec("switch", ["ethtool", "-K", tb.interface("switch"), "tx-udp-segmentation", "off"], check=False)


class Suite:
    def __init__(self, c: Config, out: Path):
        self.c = c
        self.out = out
        self.records: list[dict] = []
        self.t0 = time.time()
        self.tb = None
        self.tbkey = None

    def log(self, msg: str) -> None:
        el = time.time() - self.t0
        print(f"[{int(el // 60):3d}:{int(el % 60):02d}] {msg}", flush=True)

    def testbed(self, key):
        from gradswitch.testbed import Testbed

        if key == self.tbkey and self.tb is not None:
            return self.tb
        self.close_testbed()
        workers, rate, mtu, loss, offload = key
        self.log(
            f"testbed up: {workers} workers, rate {rate}, MTU {mtu}, loss {loss * 100:g}%"
            + ("" if offload is None else f", offloads {'on' if offload else 'off'}")
        )
        self.tb = Testbed(
            workers=workers, rate=rate, mtu=mtu, loss=loss, offload=offload, name=self.c.name
        ).up()
        if offload is False:
            per_datagram_loss(self.tb)
        self.tbkey = key
        return self.tb

    def close_testbed(self) -> None:
        if self.tb is not None:
            try:
                self.tb.down()
            finally:
                self.tb = None
                self.tbkey = None

    def save(self) -> None:
        (self.out / "results.json").write_text(
            json.dumps(
                {
                    "config": self.c.__dict__,
                    "records": self.records,
                    "started": self.t0,
                    "elapsed_s": time.time() - self.t0,
                    "command": " ".join(sys.argv),
                },
                indent=1,
                default=str,
            )
        )

    def run_step(self, i: int, total: int, st: Step) -> dict:
        from suite_measure import Counters, busy_fraction, loadavg, machine_cpu

        from gradswitch.baselines import run

        rec = {
            "series": st.series,
            "system": st.system,
            "nbytes": st.nbytes,
            "workers": st.workers,
            "iters": st.iters,
            "warmup": st.warmup,
            "kw": st.kw,
            **st.tag,
            "testbed": {
                "workers": st.tb[0],
                "rate": st.tb[1],
                "mtu": st.tb[2],
                "loss": st.tb[3],
                "offload": st.tb[4],
            },
        }
        what = (
            f"[{i}/{total}] {st.series:9s} {st.system:16s} N={st.workers} "
            f"{st.nbytes / MB:9.3f} MB x{st.iters} "
            + " ".join(f"{k}={v}" for k, v in st.tag.items() if k not in ("mb", "skip"))
        )
        if "skip" in st.tag:
            rec["skipped"] = st.tag["skip"]
            self.log(what + "  n/a: " + st.tag["skip"])
            return rec
        if time.time() - self.t0 > self.c.max_minutes * 60:
            rec["skipped"] = f"suite time limit ({self.c.max_minutes:g} min) reached"
            self.log(what + "  skipped: time limit")
            return rec
        tb = self.testbed(st.tb)
        rec["rate_bps"] = tb.link.rate
        if st.series == "ddp":
            return self.run_ddp(st, tb, rec, what)
        cnt = Counters(tb, [f"w{r}" for r in range(st.workers)] + ["host"])
        self.log(what + " ...")
        k0, m0, l0, w0 = cnt.read(), machine_cpu(), loadavg(), time.time()
        try:
            r = run(
                st.system, tb, st.nbytes, st.iters, st.workers, st.warmup, timeout=self.c.run_timeout, **st.kw
            )
            rec.update(
                ok=r.ok,
                times=r.times,
                max_err=r.max_err,
                extra=r.extra,
                median_s=r.median if r.times else None,
            )
            if not r.ok:
                rec["error"] = r.extra.get("error") or f"wrong sum (max_err={r.max_err})"
        except Exception as e:  # recorded, the suite goes on
            rec.update(ok=False, error=f"{type(e).__name__}: {e}"[-3000:])
        rec["wall_s"] = time.time() - w0
        rec["machine_busy"] = busy_fraction(m0, machine_cpu())
        rec["load_before"] = l0
        rec["counters"] = Counters.delta(k0, cnt.read())
        if rec.get("times"):
            med = rec["median_s"]
            rate = tb.link.rate
            rec["algbw_gbps"] = st.nbytes * 8 / med / 1e9
            rec["link_share"] = (st.nbytes * 8 / med) / rate if rate else None
            self.log(
                f"    -> median {med * 1e3:10.2f} ms  {rec['algbw_gbps']:.3f} Gbit/s"
                f"  sums {'OK' if rec['ok'] else 'WRONG'}  machine busy {rec['machine_busy'] * 100:.0f}%"
                f"  tcp retx {rec['counters'].get('Tcp.RetransSegs', 0)}"
                + (
                    f"  gs retx {rec['extra']['timed_workers'].get('retransmissions', 0)}"
                    if st.system == "gradswitch" and rec.get("extra", {}).get("timed_workers")
                    else ""
                )
            )
        elif rec.get("ok"):
            self.log(f"    -> ok (no timed iterations)  wall {rec['wall_s']:.1f} s")
        else:
            self.log(f"    -> FAILED: {rec.get('error', '')[:400]}")
        return rec

    def run_ddp(self, st: Step, tb, rec: dict, what: str) -> dict:
        """A "ddp" step: bench/torch_testbed.py's launch on the suite's testbed. ok when every
        configuration that sums the gradients ends at gloo's loss (float32: within 1e-3)."""
        from types import SimpleNamespace

        from torch_testbed import launch

        self.log(what + " ...")
        a = SimpleNamespace(
            workers=st.workers,
            slots=st.kw["slots"],
            iters=st.iters,
            rate=st.tb[1],
            model=st.tag["model"],
            stats=False,
            extra=st.kw["options"],
            timeout=self.c.run_timeout,
        )
        w0 = time.time()
        try:
            rep = launch(tb, a, st.kw["configs"], self.out / f"ddp-{st.tag['model']}")
        except (SystemExit, Exception) as e:  # recorded, the suite goes on
            rec.update(ok=False, error=f"{type(e).__name__}: {e}"[-3000:], wall_s=time.time() - w0)
            self.log(f"    -> FAILED: {rec['error'][:400]}")
            return rec
        res = {r["config"]: r for r in rep["results"]}
        ref = res["gloo-ddp"]["loss"]
        off = [c for c, r in res.items() if c != "local" and abs(r["loss"] - ref) > 1e-3 * abs(ref)]
        rec.update(ok=not off, ddp=rep, nbytes=rep["grad_bytes"], wall_s=time.time() - w0)
        rec["times"] = [res["gs-overlap:256"]["iteration_s"]]  # the series' figure (headline ddp-overlap)
        rec["median_s"] = rec["times"][0]
        if off:
            rec["error"] = f"wrong sum: {off} end at another loss than gloo-ddp's {ref}"
        self.log(
            "    -> "
            + "  ".join(f"{c} {r['iteration_s'] * 1e3:.0f} ms" for c, r in res.items())
            + f"  losses {'equal' if not off else 'DIFFER'}"
        )
        return rec

    def run(self, steps: list[Step]) -> None:
        # group by testbed (stable: series order kept within a testbed)
        order = []
        for st in steps:
            if st.tb not in order:
                order.append(st.tb)
        steps = sorted(steps, key=lambda s: order.index(s.tb))
        try:
            for i, st in enumerate(steps, 1):
                self.records.append(self.run_step(i, len(steps), st))
                self.save()
        finally:
            self.close_testbed()
            self.save()


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bench/suite.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, N = 2 and 3: a few minutes (CI)")
    p.add_argument("--out", default=None, help="output directory (default bench/results/<date>[-quick])")
    p.add_argument("--rate", default="1gbit", help="per-link rate of the main testbed (default 1gbit)")
    p.add_argument("--scale-rate", default=None, help="per-link rate of the scaling series (default 300mbit)")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument(
        "--slots",
        type=int,
        default=32,
        help="gradswitch window (slots per job, daemon --slots); default 32: the best of 16/32/64 "
        "at N=4, 94 MB, 1 Gbit/s",
    )
    p.add_argument("--threads", type=int, default=1, help="gradswitchd data threads")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--series", default="models,scaling,loss,frames,small,variation,cpu,ddp")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per model-size run")
    p.add_argument("--scale-mb", type=float, default=None)
    p.add_argument("--loss-mb", type=float, default=None)
    p.add_argument("--models", default=None, help="comma list of model names or MB values to run")
    p.add_argument("--model-workers", default=None, help="comma list of N for the models series")
    p.add_argument("--loss-levels", default=None, help="comma list of loss probabilities")
    p.add_argument("--run-timeout", type=float, default=None, help="seconds per run (default 120 / 600)")
    p.add_argument("--max-minutes", type=float, default=None, help="bound on the whole suite")
    p.add_argument("--name", default=None, help="testbed name (default su<pid>)")
    p.add_argument("--report-only", default=None, metavar="DIR", help="re-render DIR/results.json")
    return p


def main(argv=None) -> int:
    a = make_parser().parse_args(argv)

    if a.report_only:
        import suite_report

        d = Path(a.report_only)
        suite_report.write(d, json.loads((d / "results.json").read_text()))
        print(f"report: {d / 'report.md'}")
        return 0
    _import_gradswitch()
    from gradswitch.testbed import TestbedError
    from gradswitch.testbed.core import check_environment

    try:
        check_environment(need_ethtool=True)  # the loss series turns offloads off with ethtool
    except TestbedError as e:
        print(f"bench/suite.py: {e}", file=sys.stderr)
        return 1
    c = Config.make(a)
    if a.models:
        want = a.models.split(",")
        known = dict(MODELS + c.models)
        c.models = [(w, known[w]) if w in known else (f"{float(w):g}MB", float(w)) for w in want]
    if a.model_workers:
        c.model_workers = [int(x) for x in a.model_workers.split(",")]
    if a.loss_levels:
        c.loss_levels = [float(x) for x in a.loss_levels.split(",")]
    stamp = _dt.datetime.now().strftime("%Y-%m-%d-%H%M")
    out = Path(a.out) if a.out else ROOT / "bench" / "results" / (stamp + ("-quick" if c.quick else ""))
    out.mkdir(parents=True, exist_ok=True)
    steps = plan(c)
    print(
        f"gradswitch benchmark suite: {len(steps)} runs, series {','.join(c.series)}, systems "
        f"{','.join(c.systems)}; bounded by {c.max_minutes:g} min, {c.run_timeout:g} s per run; "
        f"output {out}",
        flush=True,
    )
    suite = Suite(c, out)
    try:
        suite.run(steps)
    except KeyboardInterrupt:
        print("interrupted: writing the report of what ran", flush=True)
    data = json.loads((out / "results.json").read_text())
    import suite_report

    summary = suite_report.write(out, data)
    print(f"report: {out / 'report.md'}", flush=True)
    print(summary, flush=True)
    bad = [r for r in suite.records if not r.get("skipped") and not r.get("ok")]
    wrong = [r for r in bad if "wrong sum" in str(r.get("error", ""))]
    if wrong:
        print(f"{len(wrong)} runs returned WRONG SUMS", flush=True)
        return 2
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
