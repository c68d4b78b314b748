"""Report of the benchmark suite: report.md + PNG plots from results.json (see bench/suite.py)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

MB = 1_000_000
LABELS = {
    "gradswitch": "gradswitch (in-network)",
    "hostagg": "host aggregation",
    "gloo": "gloo ring",
    "mpi_allreduce": "MPI_Allreduce",
    "mpi_reduce_bcast": "MPI_Reduce+Bcast",
}
ORDER = list(LABELS)
COLORS = {"gradswitch": "C3", "hostagg": "C0", "gloo": "C2", "mpi_allreduce": "C1", "mpi_reduce_bcast": "C4"}


def _ok(r) -> bool:
    return bool(r.get("ok")) and bool(r.get("times")) and not r.get("skipped")


def _fmt_t(s) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "–"
    return f"{s * 1e3:.1f} ms" if s < 10 else f"{s:.2f} s"


def _cell(r) -> str:
    if r is None:
        return "–"
    if r.get("skipped"):
        return "skipped"
    if not _ok(r):
        return "FAILED" if "wrong sum" not in str(r.get("error", "")) else "WRONG SUM"
    return _fmt_t(r["median_s"])


def _rate_bps(r) -> float | None:
    return r.get("rate_bps")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _gs_retx(r) -> tuple[int, int]:
    tw = (r.get("extra") or {}).get("timed_workers") or {}
    return tw.get("retransmissions", 0), tw.get("packets_sent", 0)


def _retx(r) -> int:
    """Retransmissions of one run: gradswitch's own counter, the kernel's for the TCP systems."""
    if r["system"] == "gradswitch":
        return _gs_retx(r)[0]
    return (r.get("counters") or {}).get("Tcp.RetransSegs", 0)


def _save(plt, fig, out: Path, name: str, lines: list[str], lead: bool = True) -> None:
    """Writes the figure beside the report and links it from the markdown."""
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    lines += ([""] if lead else []) + [f"![{name}]({name}.png)", ""]


def _systems(rs) -> list[str]:
    """The systems that have runs in rs, in report order."""
    return [s for s in ORDER if any(r["system"] == s for r in rs)]


def diagnose(r) -> str:
    """Where the time of one run went, from what was measured alongside it."""
    if not r or not _ok(r):
        return "no successful run"
    parts = []
    busy = r.get("machine_busy")
    if busy is not None:
        parts.append(f"machine CPU {busy * 100:.0f}% busy (load {r.get('load_before', 0):.1f} before)")
    c = r.get("counters") or {}
    if r["system"] == "gradswitch":
        retx, sent = _gs_retx(r)
        if sent:
            parts.append(f"retransmissions {retx} of {sent} packets ({retx / sent * 100:.1f}%)")
        ex = r.get("extra") or {}
        sw = ex.get("switch") or {}
        drops = c.get("tbf_drops_switch", 0) + c.get("tbf_drops_hosts", 0) + c.get("Udp.RcvbufErrors", 0)
        if sent and retx / sent > 0.01:
            if drops == 0 and r["testbed"]["loss"] == 0:
                parts.append(
                    "no queue or socket-buffer drop anywhere: the retransmissions are spurious "
                    "(timer shorter than the queueing delay of the window)"
                )
            else:
                parts.append(
                    f"drops: injected random loss {c.get('loss_drops', 0)}, "
                    f"tbf switch ports {c.get('tbf_drops_switch', 0)}, hosts' egress "
                    f"{c.get('tbf_drops_hosts', 0)}, UDP rcvbuf {c.get('Udp.RcvbufErrors', 0)}"
                )
        slots = (r.get("kw") or {}).get("slots")
        mtu = ex.get("mtu") or r["testbed"]["mtu"]
        if slots and r.get("rate_bps"):
            win = slots * (mtu - 60)
            parts.append(
                f"window {slots} slots x {mtu - 60} B = {win / 1024:.0f} KiB "
                f"({win * 8 / r['rate_bps'] * 1e3:.2f} ms at the link rate)"
            )
        if ex.get("switch_cpu_s") is not None and r.get("times"):
            tot = sum(r["times"])
            parts.append(
                f"daemon CPU {ex['switch_cpu_s'] / max(tot, 1e-9) * 100:.0f}% of one core "
                "during the timed window"
            )
        if sw.get("duplicates"):
            parts.append(f"switch duplicates {sw['duplicates']}")
    else:
        parts.append(
            f"TCP retransmitted segments {c.get('Tcp.RetransSegs', 0)}; tbf drops switch ports "
            f"{c.get('tbf_drops_switch', 0)}"
        )
    return "; ".join(parts)


# ------------------------------------------------------------------------------------------------ series
def _by(records, series):
    return [r for r in records if r["series"] == series]


def section_models(recs, out: Path, lines: list[str]) -> None:
    rs = _by(recs, "models")
    if not rs:
        return
    plt = _plt()
    lines += ["## Aggregation time for the papers' model sizes (paper 000 Fig. 11 / Table 3)", ""]
    ns = sorted({r["workers"] for r in rs})
    models = list(dict.fromkeys((r["model"], r["mb"]) for r in rs))
    systems = _systems(rs)
    fig, axes = plt.subplots(1, len(ns), figsize=(6 * len(ns), 4.2), squeeze=False)
    for ax, n in zip(axes[0], ns, strict=True):
        lines += [
            f"N = {n} workers, link {rs[0]['testbed']['rate']} (median of the timed iterations; "
            "speed-up = system time / gradswitch time):",
            "",
        ]
        lines += [
            "| model | MB | " + " | ".join(LABELS[s] for s in systems) + " | gs vs ring | gs vs host |",
            "|---|---:|" + "---:|" * len(systems) + "---:|---:|",
        ]
        width = 0.8 / max(1, len(systems))
        for mi, (m, mb) in enumerate(models):
            cells, t = [], {}
            for s in systems:
                r = next((x for x in rs if x["workers"] == n and x["model"] == m and x["system"] == s), None)
                cells.append(_cell(r))
                if r and _ok(r):
                    t[s] = r["median_s"]
            sp = {
                b: f"{t[b] / t['gradswitch']:.2f}x" if b in t and "gradswitch" in t else "–"
                for b in ("gloo", "hostagg")
            }
            lines.append(f"| {m} | {mb:g} | " + " | ".join(cells) + f" | {sp['gloo']} | {sp['hostagg']} |")
            for si, s in enumerate(systems):
                if s in t:
                    ax.bar(
                        mi + si * width, t[s], width, color=COLORS[s], label=LABELS[s] if mi == 0 else None
                    )
        lines.append("")
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(models))], [m for m, _ in models], fontsize=8)
        ax.set_ylabel("aggregation time (s)")
        ax.set_title(f"N = {n}, {rs[0]['testbed']['rate']} links")
        ax.legend(fontsize=7)
    _save(plt, fig, out, "models", lines, lead=False)


def section_scaling(recs, out: Path, lines: list[str]) -> None:
    rs = _by(recs, "scaling")
    if not rs:
        return
    plt = _plt()
    nb = rs[0]["nbytes"]
    rate = rs[0].get("rate_bps") or next((r.get("rate_bps") for r in rs if r.get("rate_bps")), None)
    ns = sorted({r["workers"] for r in rs})
    systems = _systems(rs)
    lines += [f"## Scaling with N at a fixed per-link rate ({rs[0]['testbed']['rate']}, {nb / MB:g} MB)", ""]
    lines += [
        "Bounds with B = link rate: in-network M/B, ring 2(N-1)/N·M/B, host N·M/B (payload only; "
        "headers add ~5% at MTU 1500).",
        "",
    ]
    lines += [
        "| N | " + " | ".join(LABELS[s] for s in systems) + " | M/B | 2(N-1)/N·M/B | N·M/B | gs algbw |",
        "|---:|" + "---:|" * len(systems) + "---:|---:|---:|---:|",
    ]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for s in systems:
        pts = [(r["workers"], r["median_s"], r["algbw_gbps"]) for r in rs if r["system"] == s and _ok(r)]
        pts.sort()
        if pts:
            a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color=COLORS[s], label=LABELS[s])
            a2.plot([p[0] for p in pts], [p[2] for p in pts], "o-", color=COLORS[s], label=LABELS[s])
    if rate:
        mb_s = nb * 8 / rate
        xs = np.array(ns, dtype=float)
        a1.plot(xs, [mb_s] * len(xs), "k--", lw=1, label="M/B (in-network bound)")
        a1.plot(xs, 2 * (xs - 1) / xs * mb_s, "k-.", lw=1, label="2(N-1)/N·M/B (ring)")
        a1.plot(xs, xs * mb_s, "k:", lw=1, label="N·M/B (host)")
        a2.axhline(rate / 1e9, color="k", ls="--", lw=1, label="link rate")
    for n in ns:
        cells = [
            _cell(next((r for r in rs if r["workers"] == n and r["system"] == s), None)) for s in systems
        ]
        g = next((r for r in rs if r["workers"] == n and r["system"] == "gradswitch" and _ok(r)), None)
        b = [_fmt_t(nb * 8 / rate * f) if rate else "–" for f in (1, 2 * (n - 1) / n, n)]
        tail = f" | {g['algbw_gbps']:.3f} Gbit/s |" if g else " | – |"
        lines.append(f"| {n} | " + " | ".join(cells) + " | " + " | ".join(b) + tail)
    a1.set_xlabel("workers N")
    a1.set_ylabel("time per allreduce (s)")
    a1.set_yscale("log")
    a1.legend(fontsize=7)
    a2.set_xlabel("workers N")
    a2.set_ylabel("per-worker algorithm bandwidth (Gbit/s)")
    a2.legend(fontsize=7)
    _save(plt, fig, out, "scaling", lines)


def section_loss(recs, out: Path, lines: list[str]) -> None:
    rs = _by(recs, "loss")
    if not rs:
        return
    plt = _plt()
    levels = sorted({r["loss"] for r in rs})
    systems = _systems(rs)
    nb, n = rs[0]["nbytes"], rs[0]["workers"]
    lines += [
        f"## Random loss (N = {n}, {nb / MB:g} MB, {rs[0]['testbed']['rate']}; offloads off at every "
        "level so each wire packet is one drop candidate)",
        "",
        "Loss p per packet per link direction (nftables on the switch ports): worker -> switch -> worker "
        "crosses 2 directions, worker -> worker (ring) also 2. Retransmissions: gradswitch = worker "
        "retransmitted packets (timed iterations); TCP systems = `Tcp.RetransSegs` summed over the "
        "namespaces (whole run).",
        "",
    ]
    lines += [
        "| loss | " + " | ".join(f"{LABELS[s]} time (retx)" for s in systems) + " |",
        "|---:|" + "---:|" * len(systems),
    ]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for p in levels:
        cells = []
        for s in systems:
            r = next((x for x in rs if x["loss"] == p and x["system"] == s), None)
            if r and _ok(r):
                retx = _retx(r)
                cells.append(f"{_fmt_t(r['median_s'])} ({retx})")
            else:
                cells.append(
                    _cell(r)
                    + (f": {str(r.get('error', ''))[:60]}" if r and not _ok(r) and r.get("error") else "")
                )
        lines.append(f"| {p * 100:g}% | " + " | ".join(cells) + " |")
    xs_lab = [f"{p * 100:g}%" for p in levels]
    for s in systems:
        t, rx = [], []
        for p in levels:
            r = next((x for x in rs if x["loss"] == p and x["system"] == s), None)
            t.append(r["median_s"] if r and _ok(r) else np.nan)
            if r and _ok(r):
                rx.append(_retx(r))
            else:
                rx.append(np.nan)
        a1.plot(xs_lab, t, "o-", color=COLORS[s], label=LABELS[s])
        a2.plot(xs_lab, rx, "o-", color=COLORS[s], label=LABELS[s])
    a1.set_ylabel("time per allreduce (s)")
    a1.set_xlabel("random loss per link direction")
    a1.set_yscale("log")
    a1.legend(fontsize=7)
    a2.set_ylabel("retransmitted packets / segments")
    a2.set_xlabel("random loss per link direction")
    a2.set_yscale("symlog")
    _save(plt, fig, out, "loss", lines)


def section_frames(recs, out: Path, lines: list[str]) -> None:
    rs = _by(recs, "frames")
    if not rs:
        return
    plt = _plt()
    n = rs[0]["workers"]
    lines += [
        f"## Frame size: switch throughput as a share of the offered rate (paper 000 Fig. 10; gradswitch, "
        f"N = {n})",
        "",
        "Each worker offers its link rate; the frame size is set by the daemon's `--mtu` (frame = IP MTU + "
        "18 B Ethernet header and FCS; 9018 on a 9000-MTU testbed). Throughput share = data frames the "
        "switch received per worker x frame bytes (14 B L2 header counted, as tbf does) / time / link "
        "rate; goodput share = tensor bytes / time / link rate. Window = same bytes in flight as the "
        "default window at MTU 1500 (at most 256 slots).",
        "",
        "| frame B | payload B | slots | time | Mpkt/s per worker | throughput share | goodput share "
        "| switch CPU | machine busy |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    xs, thr, good = [], [], []
    for r in rs:
        f = r["frame"]
        if r.get("skipped"):
            lines.append(f"| {f} | – | – | n/a | – | – | – | – | {r['skipped']} |")
            continue
        if not _ok(r):
            lines.append(f"| {f} | {r.get('payload')} | – | {_cell(r)} | – | – | – | – | – |")
            continue
        ex = r["extra"]
        tw = ex.get("timed_workers") or {}
        tot = sum(r["times"])
        mtu = r["kw"]["mtu"]
        pk = tw.get("packets_sent", 0) / n
        pps = pk / tot
        share = pps * (mtu + 14) * 8 / r["rate_bps"]
        gshare = r["nbytes"] * 8 / r["median_s"] / r["rate_bps"]
        swc = ex.get("switch_cpu_s")
        xs.append(f)
        thr.append(share)
        good.append(gshare)
        lines.append(
            f"| {f} | {r['payload']} | {r['kw']['slots']} | {_fmt_t(r['median_s'])} | {pps / 1e6:.3f} | "
            f"{share * 100:.0f}% | {gshare * 100:.0f}% | "
            f"{(swc / tot * 100 if swc is not None else float('nan')):.0f}% | "
            f"{r['machine_busy'] * 100:.0f}% |"
        )
    if xs:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, [t * 100 for t in thr], "o-", color="C3", label="wire throughput")
        ax.plot(xs, [g * 100 for g in good], "s--", color="C0", label="goodput (tensor bytes)")
        ax.set_xscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel("frame size (bytes)")
        ax.set_ylabel("% of offered rate")
        ax.set_ylim(0, 105)
        ax.legend()
        _save(plt, fig, out, "frames", lines)


def fit_alpha_beta(pts):
    """Least squares t = a + b·M over (M bytes, t s) points; (a s, b s/byte)."""
    if len(pts) < 2:
        return None
    m = np.array([p[0] for p in pts], float)
    t = np.array([p[1] for p in pts], float)
    A = np.vstack([np.ones_like(m), m]).T
    (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
    return float(a), float(b)


def section_small(recs, out: Path, lines: list[str]) -> None:
    rs = _by(recs, "small")
    if not rs:
        return
    plt = _plt()
    n = rs[0]["workers"]
    sizes = sorted({r["size"] for r in rs})
    systems = _systems(rs)
    lines += [
        f"## Small tensors: latency and the alpha-beta model (N = {n}, paper 001)",
        "",
        "| size | " + " | ".join(LABELS[s] for s in systems) + " |",
        "|---:|" + "---:|" * len(systems),
    ]
    for sz in sizes:
        cells = []
        for s in systems:
            r = next((x for x in rs if x["size"] == sz and x["system"] == s), None)
            cells.append(f"{r['median_s'] * 1e6:.0f} µs" if r and _ok(r) else _cell(r))
        lines.append(f"| {sz} B | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Fit t = a + b·M (least squares over the medians). Model: ring allreduce "
        "t = 2(N-1)·α + 2(N-1)/N·M·β; in-network t = 2α + M·β (one hop to the switch, one back); host "
        "aggregation t = 2α + N·M·β at the host link. α per step below = a / steps.",
        "",
        "| system | a (µs) | steps | α per step (µs) | 1/b (Gbit/s) |",
        "|---|---:|---:|---:|---:|",
    ]
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    steps = {
        "gradswitch": 2,
        "hostagg": 2,
        "gloo": 2 * (n - 1),
        "mpi_allreduce": 2 * (n - 1),
        "mpi_reduce_bcast": 2 * math.ceil(math.log2(n + 1)),
    }
    for s in systems:
        pts = sorted((r["size"], r["median_s"]) for r in rs if r["system"] == s and _ok(r))
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] * 1e6 for p in pts], "o", color=COLORS[s], label=LABELS[s])
        f = fit_alpha_beta(pts)
        if f:
            a, b = f
            xs = np.geomspace(pts[0][0], pts[-1][0], 50)
            ax.plot(xs, (a + b * xs) * 1e6, "-", color=COLORS[s], lw=1)
            lines.append(
                f"| {LABELS[s]} | {a * 1e6:.0f} | {steps[s]} | {a * 1e6 / steps[s]:.0f} | "
                f"{(8 / b / 1e9) if b > 0 else float('inf'):.3f} |"
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tensor bytes")
    ax.set_ylabel("latency (µs)")
    ax.legend(fontsize=7)
    _save(plt, fig, out, "small", lines)


def section_variation(recs, out: Path, lines: list[str]) -> None:
    rs = [r for r in _by(recs, "variation") if _ok(r)]
    if not rs:
        return
    plt = _plt()
    r0 = rs[0]
    lines += [
        f"## Run-to-run variation ({r0['iters']} iterations, N = {r0['workers']}, {r0['nbytes'] / MB:g} MB; "
        "paper 001 Fig. 7)",
        "",
        "p99.9 is interpolated between the two largest samples (with fewer than 1000 samples it is "
        "essentially the maximum).",
        "",
        "| system | p50 | p90 | p99 | p99.9 | max/min |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    for r in sorted(rs, key=lambda x: ORDER.index(x["system"])):
        t = np.sort(np.array(r["times"]))
        q = np.percentile(t, [50, 90, 99, 99.9])
        lines.append(
            f"| {LABELS[r['system']]} | " + " | ".join(_fmt_t(v) for v in q) + f" | {t[-1] / t[0]:.2f} |"
        )
        ax.plot(
            t * 1e3, np.arange(1, len(t) + 1) / len(t), color=COLORS[r["system"]], label=LABELS[r["system"]]
        )
    ax.set_xscale("log")
    ax.set_xlabel("allreduce time (ms)")
    ax.set_ylabel("CDF")
    ax.legend(fontsize=7)
    _save(plt, fig, out, "variation", lines)


def section_ddp(recs, lines: list[str]) -> None:
    """The DDP iteration (bench/torch_iteration.py's configurations side by side, one launch)."""
    for r in _by(recs, "ddp"):
        if not r.get("ddp"):
            continue
        d = r["ddp"]
        res = {x["config"]: x for x in d["results"]}
        gloo = res.get("gloo-ddp", {}).get("iteration_s")
        lines += [
            f"## DDP training iteration ({d['model']}, {d['params'] / 1e6:.1f} M parameters, "
            f"N = {r['workers']}, median of {r['iters']} iterations; issue 42)",
            "",
            "Bound: forward + max(backward, first gradient + wire time) + step of the no-communication run.",
            "",
            "| configuration | iteration | vs gloo | bound | iteration / bound | final loss |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for c, x in res.items():
            vs = f"{gloo / x['iteration_s']:.2f}x" if gloo and c != "local" else ""
            bound = _fmt_t(x["bound_s"]) if "bound_s" in x else ""
            ratio = f"{x['vs_bound']:.2f}" if "vs_bound" in x else ""
            lines.append(f"| {c} | {_fmt_t(x['iteration_s'])} | {vs} | {bound} | {ratio} | {x['loss']:.5f} |")
        lines.append("")


def cpu_table(recs) -> list[dict]:
    """CPU seconds per GB reduced, from what each process measured inside the timed iterations (warm-up
    excluded): `worker` the mean over workers of their process CPU inside the timed calls (every
    thread), `host` an aggregator on the host (hostagg's server, MPI_Reduce+Bcast's root), `switch`
    gradswitchd's data threads (its backend's cpu_ns counters) and `daemon` the whole daemon process
    (/proc, 10 ms ticks). GB = gradient bytes each worker reduces per iteration x timed iterations.
    `per_train`, `per_sleep`: the data threads' datagrams per GRO train and per wake-up over the run
    (STATS `udp.*`), the counts its CPU per datagram follows (BENCHMARKS.md §9)."""
    rows = []
    for s in ORDER:
        r = next((r for r in _by(recs, "cpu") if r["system"] == s and _ok(r)), None)
        if r is None:
            if any(x["system"] == s for x in _by(recs, "cpu")):
                rows.append({"system": s, "error": "the run failed"})
            continue
        ex = r.get("extra") or {}
        gb = r["nbytes"] * r["iters"] / 1e9
        per = lambda v, gb=gb: v / gb if v is not None else None  # noqa: E731
        workers = [c for c in ex.get("worker_cpu_s") or [] if c is not None]
        sw = ex.get("switch") or {}  # the daemon's STATS over the run: what its CPU per datagram follows
        rx = sum(v for k, v in sw.items() if k.startswith("udp.") and k.endswith(".rx_datagrams"))
        per_dg = lambda k, rx=rx, sw=sw: rx / sw[k] if rx and sw.get(k) else None  # noqa: E731
        rows.append(
            {
                "system": s,
                "worker": per(statistics.mean(workers)) if workers else None,
                "host": per(ex.get("host_cpu_s")),
                "switch": per(ex.get("switch_data_cpu_s")),
                "daemon": per(ex.get("switch_cpu_s")),
                "per_train": per_dg("udp.gro_trains"),
                "per_sleep": per_dg("udp.sleeps"),
                "gb": gb,
                "workers": r["workers"],
            }
        )
    return rows


def section_cpu(recs, lines: list[str]) -> None:
    rows = cpu_table(recs)
    if not rows:
        return
    r0 = next(r for r in _by(recs, "cpu"))
    cell = lambda v: f"{v:.2f}" if v is not None else "–"  # noqa: E731
    lines += [
        f"## CPU time per GB reduced (N = {r0['workers']}, {r0['nbytes'] / MB:g} MB x {r0['iters']})",
        "",
        "CPU seconds per GB of gradient each worker reduces, as each process measured it inside the timed "
        "iterations: workers their process CPU (every thread) inside the timed allreduce calls; the host "
        "aggregator (hostagg's server, MPI_Reduce+Bcast's root) over the timed iterations; gradswitchd's "
        "data threads from the backend's counters (STATS `*.cpu_ns`) and the whole daemon from /proc, over "
        "rank 0's timed window. Gradient generation and checking are outside the timed calls. Kernel work "
        "run inline in a process's system call counts to that process: on the testbed's "
        "veths the switch's data thread carries the bridge, tbf and the workers' receive path of its "
        "results, and a worker's send the switch's receive path (BENCHMARKS.md §9); softirq work run by "
        "ksoftirqd or on an idle core counts to no one.",
        "",
        "| system | per worker (s/GB) | host (s/GB) | switch data threads (s/GB) "
        "| the same per GB of DATA received | switch daemon (s/GB) "
        "| switch datagrams per GRO train | per wake-up |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    count = lambda v: f"{v:.1f}" if v is not None else "–"  # noqa: E731
    for r in rows:
        if "error" in r:
            lines.append(f"| {LABELS[r['system']]} | {r['error']} | | | | | | |")
            continue
        per_data = r["switch"] / r["workers"] if r["switch"] is not None else None  # N gradients of DATA
        lines.append(
            f"| {LABELS[r['system']]} | {cell(r['worker'])} | {cell(r['host'])} | {cell(r['switch'])} "
            f"| {cell(per_data)} | {cell(r['daemon'])} | {count(r['per_train'])} | {count(r['per_sleep'])} |"
        )
    lines.append("")


# ------------------------------------------------------------------------------------------------ targets
def targets(recs) -> list[tuple[str, str, str, str]]:
    """(target, measured, verdict, why) rows."""
    out = []
    models = [r for r in _by(recs, "models") if _ok(r)]

    def pick(n, mb, s):
        return next((r for r in models if r["workers"] == n and r["mb"] == mb and r["system"] == s), None)

    ns = sorted({r["workers"] for r in models})
    big = 94.0 if any(r["mb"] == 94.0 for r in models) else (max((r["mb"] for r in models), default=None))
    note = (
        ""
        if big is None or big == 94.0
        else f" (measured at {big:g} MB: the 94 MB run is not in this report)"
    )
    n4 = 4 if 4 in ns else (max(ns) if ns else None)
    if n4 is not None and big is not None:
        g, ring = pick(n4, big, "gradswitch"), pick(n4, big, "gloo")
        if g and ring:
            sp = ring["median_s"] / g["median_s"]
            out.append(
                (
                    f"gradswitch >= 1.35x faster than gloo ring (N={n4}; bound 1.5x){note}",
                    f"{sp:.2f}x",
                    "met" if sp >= 1.35 else "MISSED",
                    "" if sp >= 1.35 else f"gradswitch: {diagnose(g)}. gloo: {diagnose(ring)}",
                )
            )
    for n in [x for x in (3, 4) if x in ns] or ns[-1:]:
        g, h = pick(n, big, "gradswitch"), pick(n, big, "hostagg")
        if g and h:
            sp = h["median_s"] / g["median_s"]
            out.append(
                (
                    f"gradswitch >= {0.9 * n:.1f}x (0.9·N) faster than host aggregation (N={n}){note}",
                    f"{sp:.2f}x",
                    "met" if sp >= 0.9 * n else "MISSED",
                    "" if sp >= 0.9 * n else f"gradswitch: {diagnose(g)}. hostagg: {diagnose(h)}",
                )
            )
    if n4 is not None and big is not None:
        g = pick(n4, big, "gradswitch")
        if g and g.get("rate_bps"):
            share = g["nbytes"] * 8 / g["median_s"] / g["rate_bps"]
            out.append(
                (
                    f"per-worker goodput >= 90% of the link rate (N={n4}){note}",
                    f"{share * 100:.1f}% ({g['nbytes'] * 8 / g['median_s'] / 1e6:.0f} of "
                    f"{g['rate_bps'] / 1e6:.0f} Mbit/s)",
                    "met" if share >= 0.9 else "MISSED",
                    (
                        "payload is 1440 of 1514 wire bytes per frame at MTU 1500: 95.1% is the ceiling. "
                        if share < 0.9
                        else ""
                    )
                    + ("" if share >= 0.9 else diagnose(g)),
                )
            )
    sc = [r for r in _by(recs, "scaling") if _ok(r) and r["system"] == "gradswitch"]
    if sc:
        lo = min(sc, key=lambda r: r["workers"])
        hi = max(sc, key=lambda r: r["workers"])
        if hi["workers"] > lo["workers"]:
            d = hi["median_s"] / lo["median_s"] - 1
            out.append(
                (
                    f"time at N={hi['workers']} within 10% of N={lo['workers']} (target: N=8 vs N=2)",
                    f"{d * 100:+.1f}%",
                    "met" if d <= 0.10 else "MISSED",
                    ""
                    if d <= 0.10
                    else f"N={hi['workers']}: {diagnose(hi)}; N={lo['workers']}: {diagnose(lo)}",
                )
            )
    ls = [r for r in _by(recs, "loss") if _ok(r) and r["system"] == "gradswitch"]
    l0 = next((r for r in ls if r["loss"] == 0), None)
    l1 = next((r for r in ls if abs(r["loss"] - 0.01) < 1e-9), None)
    if l0 and l1:
        d = l1["median_s"] / l0["median_s"] - 1
        out.append(
            (
                "1% loss costs <= 30% more time than no loss (gradswitch)",
                f"{d * 100:+.1f}%",
                "met" if d <= 0.30 else "MISSED",
                "" if d <= 0.30 else f"at 1%: {diagnose(l1)}",
            )
        )
    return out


def closing_note(recs, tg) -> list[str]:
    """What would close each missed target, from the evidence gathered (rules over the measurements)."""
    missed = [t for t in tg if t[2] != "met"]
    if not missed:
        return []
    gs = [
        r
        for r in recs
        if _ok(r) and r["system"] == "gradswitch" and r["series"] in ("models", "scaling", "loss")
    ]
    busy = [r["machine_busy"] for r in recs if _ok(r) and r.get("machine_busy") is not None]
    out = ["## Closing note: what would close the missed targets", ""]
    if busy and statistics.median(busy) >= 0.9:
        out.append(
            f"- **CPU, not links, limited this run**: the machine was >= 90% busy during most runs "
            f"(median {statistics.median(busy) * 100:.0f}%; load before runs up to "
            f"{max(r.get('load_before', 0) for r in recs if r.get('load_before') is not None):.1f} on "
            f"{__import__('os').cpu_count()} cores, other work included). Per-packet costs (tbf on both "
            "link ends, bridge, UDP per 1500-byte datagram vs TCP's 64 KiB GSO segments) fall harder on "
            "gradswitch than on the TCP baselines. Re-run on an idle machine, at a lower --rate, or with "
            "--mtu 9000 (6x fewer packets)."
        )
    spur = [
        r
        for r in gs
        if _gs_retx(r)[1]
        and _gs_retx(r)[0] / _gs_retx(r)[1] > 0.01
        and r["testbed"]["loss"] == 0
        and not (r.get("counters") or {}).get("tbf_drops_switch")
        and not (r.get("counters") or {}).get("Udp.RcvbufErrors")
    ]
    if spur:
        out.append(
            f"- **Spurious retransmissions** in {len(spur)} loss-free gradswitch runs (no queue or socket "
            "drop anywhere): the worker's retransmission timer (initial 4 ms, then srtt + 4·rttvar) fires "
            "while results wait for the slowest worker or in a queue; each spurious resend adds load. Fix "
            "in the worker (src/worker/group.cpp): base the RTO on the round's completion time across "
            "ranks, with a floor above the scheduling jitter of a busy host (the switch counts the "
            "resulting `duplicates`/`retx_answered`)."
        )
    small_win = [
        r
        for r in gs
        if (r.get("kw") or {}).get("slots")
        and r["series"] in ("models", "scaling")
        and r.get("rate_bps")
        and r.get("link_share")
        and r["link_share"] < 0.9
    ]
    if small_win:
        r = small_win[0]
        win = r["kw"]["slots"] * ((r.get("extra") or {}).get("mtu", 1500) - 60)
        rtt_needed = win * 8 / r["rate_bps"]
        out.append(
            f"- **Window vs bandwidth-delay product**: {r['kw']['slots']} slots keep {win / 1024:.0f} KiB in "
            f"flight per worker, enough for the link rate only while a round trip (worker -> switch, wait "
            f"for all N, -> worker) stays under {rtt_needed * 1e3:.2f} ms. Larger windows (--slots) help "
            "only while the retransmission timer does not fire spuriously: with more packets queued "
            "ahead of each one, the round trip grows past the 4 ms timer (see the notes' slot sweep)."
        )
    lossy = [r for r in gs if r["series"] == "loss" and r["testbed"]["loss"] > 0]
    clean = next((r for r in gs if r["series"] == "loss" and r["testbed"]["loss"] == 0), None)
    if lossy and clean and any(t[0].startswith("1% loss") and t[2] != "met" for t in tg):
        r = min(lossy, key=lambda x: abs(x["testbed"]["loss"] - 0.01))
        p, n = r["testbed"]["loss"], r["workers"]
        slots = (r.get("kw") or {}).get("slots") or 0
        rtt = slots * 1440 * 8 / r["rate_bps"] if r.get("rate_bps") else float("nan")
        out.append(
            f"- **Loss recovery is timer-driven**: a round completes only when all {n} workers' packets "
            f"and the result arrive, so at p = {p * 100:g}% per link direction a worker's slot stalls in "
            f"about {(n + 1) * p * 100:.0f}% of rounds, and each stall lasts a retransmission timeout "
            f"(>= 4 ms, the worker's rto_initial) while a round normally takes ~{rtt * 1e3:.2f} ms at "
            "this rate: ~10x. "
            "What would close it: a retransmission timeout from the measured round time (floor well under "
            "1 ms) and fast retransmit, i.e. resend a slot's packet when results of slots sent after it have "
            "arrived (the window is self-clocked, so later results are the loss signal), plus a larger "
            "window so that a stalled slot does not idle the link."
        )
    out.append("")
    return out


def bottleneck(recs) -> list[str]:
    lines = ["## Where the bottleneck is", ""]
    ok = [r for r in recs if _ok(r) and r["series"] in ("models", "scaling", "loss")]
    if not ok:
        return []
    lines += [
        "Machine CPU busy (all cores, whole run including start-up; other engineers' load included) and the "
        "share of the link rate the system reached (tensor bytes / time / per-link rate). A system at "
        ">= 90% CPU with a link share below its bound is CPU-bound; one near its bound with idle CPU is "
        "link-bound.",
        "",
        "| series | system | N | MB | time | link share | bound share | machine busy | retx |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ok:
        n = r["workers"]
        bound = {
            "gradswitch": 1.0,
            "gloo": n / (2 * (n - 1)) if n > 1 else 1.0,
            "mpi_allreduce": n / (2 * (n - 1)) if n > 1 else 1.0,
            "hostagg": 1 / n,
            "mpi_reduce_bcast": 1 / n,
        }[r["system"]]
        retx = _retx(r)
        ls = r.get("link_share")
        lines.append(
            f"| {r['series']}{' ' + str(r.get('loss')) if r['series'] == 'loss' else ''} | "
            f"{r['system']} | {n} | "
            f"{r['nbytes'] / MB:g} | {_fmt_t(r['median_s'])} | "
            f"{(ls * 100 if ls else float('nan')):.0f}% | {bound * 100:.0f}% | "
            f"{r['machine_busy'] * 100:.0f}% | {retx} |"
        )
    lines.append("")
    return lines


def write(out: Path, data: dict) -> str:
    out = Path(out)
    recs = data["records"]
    c = data["config"]
    lines = [
        "# gradswitch benchmark suite: side by side on the emulated testbed",
        "",
        f"Command: `{data.get('command', 'bench/suite.py')}`  ",
        f"Elapsed: {data.get('elapsed_s', 0) / 60:.1f} min"
        f"{' (quick configuration)' if c.get('quick') else ''}",
        "",
        "Testbed (docs/testbed.md): one veth link per machine into a Linux bridge, tc tbf at "
        f"{c['rate']} per "
        f"link (scaling series: {c['scale_rate']}), MTU {c['mtu']}. gradswitchd runs in the switch namespace "
        f"with {c['threads']} data thread(s) and a window of {c['slots']} slots per worker. Machine: "
        f"{__import__('os').cpu_count()} CPU cores, shared. Every system's sums are checked by every rank.",
        "",
    ]
    failed = [r for r in recs if not r.get("skipped") and not r.get("ok")]
    wrong = [r for r in failed if "wrong sum" in str(r.get("error", ""))]
    checked = [r for r in recs if r.get("ok")]
    lines += [
        f"**Sums:** {len(checked)} runs verified correct by every rank, {len(wrong)} wrong, "
        f"{len(failed) - len(wrong)} failed otherwise, {sum(1 for r in recs if r.get('skipped'))} skipped.",
        "",
    ]
    if failed:
        lines += ["Failed runs:", ""]
        for r in failed:
            lines.append(
                f"- {r['series']} {r['system']} N={r['workers']} {r['nbytes'] / MB:g} MB: "
                f"`{str(r.get('error', ''))[:300].replace(chr(10), ' ')}`"
            )
        lines.append("")
    tg = targets(recs)
    if tg:
        lines += [
            "## Targets (issue 3; ratios from one run)",
            "",
            "| target | measured | verdict |",
            "|---|---|---|",
        ]
        lines += [f"| {t} | {m} | {v} |" for t, m, v, _ in tg]
        why = [(t, w) for t, _, v, w in tg if v != "met" and w]
        if why:
            lines += ["", "Why missed (measured alongside each run):", ""]
            lines += [f"- **{t}**: {w}" for t, w in why]
        lines.append("")
    for f in (
        section_models,
        section_scaling,
        section_loss,
        section_frames,
        section_small,
        section_variation,
    ):
        f(recs, out, lines)
    section_cpu(recs, lines)
    section_ddp(recs, lines)
    lines += bottleneck(recs)
    lines += closing_note(recs, tg)
    extra = out / "notes.md"  # hand-written observations kept next to the generated report
    if extra.exists():
        lines += ["## Notes", "", extra.read_text().strip(), ""]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    summ = [f"{t}: {m} [{v}]" for t, m, v, _ in tg]
    return "\n".join(summ)
