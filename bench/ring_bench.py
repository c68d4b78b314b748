#!/usr/bin/env python3
"""The ring's benchmarks on the emulated testbed (issue 11): paper 001's Fig. 4 analog, the ring vs gloo's
ring at 94 MB, back-to-back allreduces, and the fallback from a dying switch to the ring. Every rank
checks every sum.

    sudo python3 bench/ring_bench.py [--series fig4,ring94,fallback,b2b,physring] [--worlds 2,3,4,6,8]
        [--rate 1gbit] [--out bench/results/<date>-ring]
    python3 bench/ring_bench.py --report-only bench/results/<date>-ring     # re-render from results.json

fig4: allreduce latency (slowest rank, median) of 64 B .. 64 KB and of 64 MB vs N for the switch, the
  ring and gloo; least-squares fits of each system to the ring model T = a + 2 alpha (N - 1) and the
  tree model T = a + 2 beta log2 N, and their predictions for 32 and 1,024 nodes.
ring94: N = 4, 94 MB (ResNet-50): switch, ring, gloo.
fallback: N = 4, 64 MB allreduces with algorithm "auto"; the switch is SIGKILLed in the middle of the
  third; the time of every allreduce, against the same loop on the ring alone.
b2b: back-to-back allreduces, N = 4: 8 MB and 100 MB buffers, each as one allreduce, as 4 allreduces
  queued at once (DDP's buckets: 2 MB and 25 MB) and as the same 4 waited for one by one; switch, ring
  and gloo.
physring: paper 001's topology: the workers also wired in a physical ring (a veth pair between each
  worker and the next, shaped like the testbed's links), N = 4, 94 MB: the ring over those links
  against gloo's ring over the same links.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SMALL = [64, 256, 1024, 4096, 16384, 65536]
BIG = 64 * 1024 * 1024
M94 = 94_000_000
SYSTEMS = ("switch", "ring", "gloo")


def spawn(
    tb,
    sw,
    system: str,
    world: int,
    sizes: list[int],
    iters: int,
    big_iters: int,
    port: int,
    job: str,
    timeout: float = 600,
    extra: tuple = (),
):
    from gradswitch.baselines.common import fail_text, parse_results, wait_all

    procs = []
    for r in range(world):
        args = [
            "--system",
            system,
            "--rank",
            r,
            "--world",
            world,
            "--sizes",
            ",".join(map(str, sizes)),
            "--iters",
            iters,
            "--big-iters",
            big_iters,
            "--job",
            job,
            *extra,
        ]
        args += ["--master", f"{tb.address('w0')}:{port}"] if system == "gloo" else ["--switch", sw.address]
        procs.append(
            (
                f"w{r}",
                tb.python(f"w{r}", "gradswitch.baselines.sweep", *args, stdout=-1, stderr=-1, text=True),
            )
        )
    outs = wait_all(procs, timeout)
    if any(rc != 0 for _, rc, _, _ in outs):
        raise RuntimeError(f"{system} N={world} failed:\n" + fail_text(outs))
    reps = sorted((r for _, _, so, _ in outs for r in parse_results(so)), key=lambda r: r["rank"])
    if not all(r["ok"] for r in reps):
        raise RuntimeError(f"{system} N={world}: wrong sums {[r['max_err'] for r in reps]}")
    return reps


def slowest_median(reps: list[dict], size: int) -> float:
    """Median over iterations of the slowest rank's time."""
    per_iter = zip(*(r["times"][str(size)] for r in reps), strict=True)
    return statistics.median(max(t) for t in per_iter)


def fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares y = a + b x; returns (a, b, rms residual)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    rms = math.sqrt(sum((a + b * x - y) ** 2 for x, y in zip(xs, ys, strict=True)) / n)
    return a, b, rms


def series_fig4(tb, sw_factory, worlds, res, log):
    port = 17100
    for world in worlds:
        for system in SYSTEMS:
            port += 1
            t0 = time.monotonic()
            with sw_factory() as sw:
                reps = spawn(tb, sw, system, world, SMALL + [BIG], 30, 3, port, f"fig4-{system}-{world}")
            row = {str(s): slowest_median(reps, s) for s in SMALL + [BIG]}
            res.setdefault("fig4", {}).setdefault(system, {})[str(world)] = row
            log(
                f"fig4 {system:6s} N={world}: 64 B {row['64'] * 1e3:.2f} ms, "
                f"64 KB {row['65536'] * 1e3:.2f} ms, 64 MB {row[str(BIG)] * 1e3:.0f} ms "
                f"({time.monotonic() - t0:.0f} s)"
            )


def series_ring94(tb, sw_factory, res, log):
    port = 17300
    for system in SYSTEMS:
        port += 1
        with sw_factory() as sw:
            reps = spawn(tb, sw, system, 4, [M94], 0, 5, port, f"r94-{system}")
        res.setdefault("ring94", {})[system] = {
            "median_s": slowest_median(reps, M94),
            "times": [max(t) for t in zip(*(r["times"][str(M94)] for r in reps), strict=True)],
        }
        log(f"ring94 {system:6s}: {res['ring94'][system]['median_s'] * 1e3:.0f} ms")


def series_fallback(tb, sw_factory, res, log):
    from gradswitch.baselines.common import fail_text, parse_results, wait_all

    world, iters = 4, 8
    chunks = -(-BIG // 4 // 360)  # 1440-byte payloads
    for mode in ("ring", "auto"):
        with sw_factory() as sw:
            procs = []
            for r in range(world):
                args = [
                    "--system",
                    mode,
                    "--rank",
                    r,
                    "--world",
                    world,
                    "--sizes",
                    str(BIG),
                    "--iters",
                    0,
                    "--big-iters",
                    iters,
                    "--warmup",
                    0,
                    "--switch",
                    sw.address,
                    "--job",
                    f"fb-{mode}",
                ]
                procs.append(
                    (
                        f"w{r}",
                        tb.python(
                            f"w{r}", "gradswitch.baselines.sweep", *args, stdout=-1, stderr=-1, text=True
                        ),
                    )
                )
            killed_at = None
            if mode == "auto":  # SIGKILL half way through the third allreduce (the switch's STATS)
                target = int(2.5 * chunks)
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline:
                    try:
                        done = sw.stats().get("completed", 0)
                    except Exception:
                        done = 0
                    if done >= target:
                        break
                    time.sleep(0.005)
                sw.proc.kill()
                killed_at = done
            outs = wait_all(procs, 600)
            if any(rc != 0 for _, rc, _, _ in outs):
                raise RuntimeError(f"fallback {mode} failed:\n" + fail_text(outs))
        reps = sorted((r for _, _, so, _ in outs for r in parse_results(so)), key=lambda r: r["rank"])
        if not all(r["ok"] for r in reps):
            raise RuntimeError(f"fallback {mode}: wrong sums")
        times = [max(t) for t in zip(*(r["times"][str(BIG)] for r in reps), strict=True)]
        res.setdefault("fallback", {})[mode] = {
            "times": times,
            "algorithms": reps[0]["algorithms"],
            "killed_at_completed_rounds": killed_at,
            "held": [r["stats"].get("fallback_held", 0) for r in reps],
        }
        log(
            f"fallback {mode}: " + ", ".join(f"{t * 1e3:.0f}" for t in times) + " ms; "
            f"served by {reps[0]['algorithms']}"
        )


B2B_SIZES = [8_000_000, 100_000_000]
B2B_MODES = {"one": (), "queued": ("--buckets", 4), "serial": ("--buckets", 4, "--serial")}


def series_b2b(tb, sw_factory, res, log):
    port = 17500
    for system in SYSTEMS:
        for mode, extra in B2B_MODES.items():
            port += 1
            with sw_factory() as sw:
                reps = spawn(tb, sw, system, 4, B2B_SIZES, 0, 4, port, f"b2b-{system}-{mode}", extra=extra)
            row = {str(s): slowest_median(reps, s) for s in B2B_SIZES}
            res.setdefault("b2b", {}).setdefault(system, {})[mode] = row
            log(f"b2b {system:6s} {mode:6s}: " + ", ".join(f"{row[str(s)] * 1e3:.0f} ms" for s in B2B_SIZES))


RING_PORT = 17900


def add_ring_links(tb, n: int) -> list[str]:
    """Wires w_i to w_(i+1) with a veth pair (10.77.i.1 <-> 10.77.i.2), shaped like the testbed's links,
    with routes so that every worker reaches every other's gloo address (its right link's, 10.77.i.1)
    along the ring (neighbours directly). Returns each rank's gloo address. The namespaces' removal
    (testbed down) removes them."""
    lk = tb.link
    burst, limit = lk.tbf_params() if lk.rate else (0, 0)
    for i in range(n):
        j = (i + 1) % n
        right, left = f"w{i}", f"w{j}"
        tb.ip(
            right,
            "link",
            "add",
            "gs-rr",
            "mtu",
            str(lk.mtu),
            "type",
            "veth",
            "peer",
            "name",
            "gs-rl",
            "netns",
            tb.netns(left),
            "mtu",
            str(lk.mtu),
        )
        tb.ip(right, "addr", "add", f"10.77.{i}.1/30", "dev", "gs-rr")
        tb.ip(left, "addr", "add", f"10.77.{i}.2/30", "dev", "gs-rl")
        for host, dev in ((right, "gs-rr"), (left, "gs-rl")):
            if lk.rate:
                tb.tc(
                    host,
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "tbf",
                    "rate",
                    f"{lk.rate}bit",
                    "burst",
                    str(burst),
                    "limit",
                    str(limit),
                )
            tb.ip(host, "link", "set", dev, "up")
    for k in range(n):
        tb.exec(
            f"w{k}",
            [
                "sh",
                "-c",
                "echo 1 > /proc/sys/net/ipv4/ip_forward; for f in "
                "/proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done",
            ],
        )
        for i in range(n):
            d = (i - k) % n
            if d in (0, n - 1):  # itself, or the left neighbour (its right link is directly attached)
                continue
            via = f"10.77.{k}.2" if d <= n // 2 else f"10.77.{(k - 1) % n}.1"
            tb.ip(f"w{k}", "route", "replace", f"10.77.{i}.1/32", "via", via)
    return [f"10.77.{i}.1" for i in range(n)]


def series_physring(tb, res, log):
    import secrets

    from gradswitch.baselines.common import fail_text, parse_results, wait_all

    n = 4
    addrs = add_ring_links(tb, n)
    token = secrets.token_hex(16)  # the ring without a switch: every rank gets the same (connect(token=))
    for system in ("ring", "gloo"):
        procs = []
        for r in range(n):
            args = [
                "--system",
                system,
                "--rank",
                r,
                "--world",
                n,
                "--sizes",
                str(M94),
                "--iters",
                0,
                "--big-iters",
                5,
                "--job",
                "physring",
            ]
            if system == "gloo":
                args += ["--master", f"{addrs[0]}:17400", "--ifname", "gs-rr"]
            else:
                # this rank's neighbours at their ends of its own links; its own entry is its port
                peers = list(addrs)
                peers[(r + 1) % n] = f"10.77.{r}.2"
                peers[(r - 1) % n] = f"10.77.{(r - 1) % n}.1"
                peers[r] = "0.0.0.0"
                args += ["--peers", ",".join(f"{a}:{RING_PORT}" for a in peers), "--token", token]
            procs.append(
                (
                    f"w{r}",
                    tb.python(f"w{r}", "gradswitch.baselines.sweep", *args, stdout=-1, stderr=-1, text=True),
                )
            )
        outs = wait_all(procs, 900)
        if any(rc != 0 for _, rc, _, _ in outs):
            raise RuntimeError(f"physring {system} failed:\n" + fail_text(outs))
        reps = sorted((r for _, _, so, _ in outs for r in parse_results(so)), key=lambda r: r["rank"])
        res.setdefault("physring", {})[system] = {
            "median_s": slowest_median(reps, M94),
            "times": [max(t) for t in zip(*(r["times"][str(M94)] for r in reps), strict=True)],
            "stats": reps[0]["stats"],
        }
        log(f"physring {system:6s}: {res['physring'][system]['median_s'] * 1e3:.0f} ms")


def _vs_gloo(title: str, r: dict, systems) -> list[str]:
    """A section of one table: each of `systems` that ran, its median and gloo's median over it."""
    out = [title, "", "| system | median | vs gloo |", "|---|---:|---:|"]
    for system in systems:
        if system in r:
            out.append(
                f"| {system} | {r[system]['median_s'] * 1e3:.0f} ms | "
                f"{r['gloo']['median_s'] / r[system]['median_s']:.2f}x |"
            )
    return out + [""]


def _fittable(f4: dict, worlds: list[int]):
    """(system, its fig4 row, the worlds it ran at) for each system measured at two N or more."""
    for system in SYSTEMS:
        row = f4.get(system, {})
        ws = [w for w in worlds if str(w) in row]
        if len(ws) >= 2:
            yield system, row, ws


def report(res: dict) -> str:
    out = [
        f"# Ring benchmarks ({res.get('when', '')})",
        "",
        f"Command: `{res.get('command', '')}`",
        "",
        f"Testbed: {res.get('testbed', '')}",
        "",
    ]
    if "fig4" in res:
        f4 = res["fig4"]
        worlds = sorted({int(w) for s in f4.values() for w in s})
        out += ["## Latency vs N (paper 001 Fig. 4 analog): slowest rank, median", ""]
        for size in SMALL + [BIG]:
            label = f"{size} B" if size < 1024 else (f"{size // 1024} KB" if size < BIG else "64 MB")
            out.append(f"**{label}** (ms)")
            out.append("")
            out.append("| system | " + " | ".join(f"N={w}" for w in worlds) + " |")
            out.append("|---|" + "---:|" * len(worlds))
            for system in SYSTEMS:
                row = f4.get(system, {})
                cells = [f"{row[str(w)][str(size)] * 1e3:.2f}" if str(w) in row else "" for w in worlds]
                out.append(f"| {system} | " + " | ".join(cells) + " |")
            out.append("")
        out += [
            "### Fits and predictions",
            "",
            "T = a + 2·alpha·(N−1) (ring model) and T = a + 2·beta·log2 N (tree model), least squares "
            "over the measured N; a is the per-call overhead that does not depend on N.",
            "",
            "| size | system | ring model: a, alpha (ms) | rms | tree model: a, beta (ms) | rms | "
            "better | predicted N=32 | predicted N=1024 |",
            "|---|---|---|---:|---|---:|---|---:|---:|",
        ]
        for size in (64, 65536, BIG):
            for system, row, ws in _fittable(f4, worlds):
                ys = [row[str(w)][str(size)] * 1e3 for w in ws]
                a1, b1, r1 = fit([w - 1 for w in ws], ys)
                a2, b2, r2 = fit([math.log2(w) for w in ws], ys)
                ring_better = r1 <= r2
                a, b = (a1, b1) if ring_better else (a2, b2)
                x = (lambda n: n - 1) if ring_better else math.log2
                label = "64 B" if size == 64 else ("64 KB" if size == 65536 else "64 MB")
                out.append(
                    f"| {label} | {system} | {a1:.3f}, {b1 / 2:.4f} | {r1:.3f} | {a2:.3f}, {b2 / 2:.4f} | "
                    f"{r2:.3f} | {'ring' if ring_better else 'tree'} | {a + b * x(32):.1f} ms | "
                    f"{a + b * x(1024):.1f} ms |"
                )
        rate = res.get("rate_bps")
        if rate:
            out += [
                "",
                "64 MB with the bytes on the wire taken out: each system's time minus its bandwidth term "
                "(switch M/B, rings 2(N−1)/N·M/B, B = the link rate, headers included: 1500/1440 of the "
                "payload) fitted to a + 2·alpha·(N−1); predictions add the bandwidth term back.",
                "",
                "| system | a (ms) | alpha per hop (ms) | rms (ms) | predicted N=32 | predicted N=1024 |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            wire = BIG * 1500 / 1440 * 8 / rate * 1e3  # ms for M on one link direction

            def bw(system, n):
                return wire if system == "switch" else 2 * (n - 1) / n * wire

            for system, row, ws in _fittable(f4, worlds):
                ys = [row[str(w)][str(BIG)] * 1e3 - bw(system, w) for w in ws]
                a, b, r = fit([w - 1 for w in ws], ys)
                out.append(
                    f"| {system} | {a:.1f} | {b / 2:.2f} | {r:.1f} | {bw(system, 32) + a + b * 31:.0f} ms | "
                    f"{bw(system, 1024) + a + b * 1023:.0f} ms |"
                )
        out.append("")
    if "ring94" in res:
        out += _vs_gloo("## N = 4, 94 MB", res["ring94"], SYSTEMS)
    if "b2b" in res:
        b = res["b2b"]
        out += [
            "## Back-to-back allreduces, N = 4: one allreduce, 4 queued at once, 4 one by one",
            "",
            "| size | system | one | 4 queued | 4 one by one | one by one / queued | queued vs gloo queued |",
            "|---|---|---:|---:|---:|---:|---:|",
        ]
        for size in B2B_SIZES:
            for system in SYSTEMS:
                row = {m: b.get(system, {}).get(m, {}).get(str(size)) for m in B2B_MODES}
                if None in row.values():
                    continue
                gq = b.get("gloo", {}).get("queued", {}).get(str(size))
                out.append(
                    f"| {size / 1e6:g} MB | {system} | {row['one'] * 1e3:.0f} ms | "
                    f"{row['queued'] * 1e3:.0f} ms | {row['serial'] * 1e3:.0f} ms | "
                    f"{row['serial'] / row['queued']:.2f}x | "
                    + (f"{gq / row['queued']:.2f}x |" if gq else "— |")
                )
        out.append("")
    if "physring" in res:
        title = "## Physical ring (paper 001's topology): N = 4, 94 MB over the ring links"
        out += _vs_gloo(title, res["physring"], ("ring", "gloo"))
    if "fallback" in res:
        fb = res["fallback"]
        algos = fb["auto"]["algorithms"]
        first_ring = algos.index("ring") if "ring" in algos else len(algos)
        out += [
            f"## Fallback: N = 4, 64 MB allreduces, the switch SIGKILLed during allreduce {first_ring}",
            "",
            "| allreduce | " + " | ".join(str(i) for i in range(len(fb["auto"]["times"]))) + " |",
            "|---|" + "---:|" * len(fb["auto"]["times"]),
        ]
        for mode in ("auto", "ring"):
            if mode in fb:
                out.append(
                    f"| {mode} (ms) | " + " | ".join(f"{t * 1e3:.0f}" for t in fb[mode]["times"]) + " |"
                )
        out.append(
            "| auto served by | " + " | ".join(fb["auto"]["algorithms"][: len(fb["auto"]["times"])]) + " |"
        )
        out += ["", f"Chunks each rank already held when the switch died: {fb['auto']['held']}", ""]
    return "\n".join(out) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--series",
        default="fig4,ring94,fallback",
        help="comma separated: fig4, ring94, fallback, b2b, physring (default: %(default)s)",
    )
    p.add_argument("--worlds", default="2,3,4,6,8", help="fig4's numbers of ranks (default: %(default)s)")
    p.add_argument("--rate", default="1gbit", help="every link's rate per direction (default: %(default)s)")
    p.add_argument("--slots", type=int, default=256, help="gradswitchd --slots (default: %(default)s)")
    p.add_argument(
        "--out",
        type=Path,
        default=HERE / "results" / f"{_dt.date.today()}-ring",
        help="where results.json and report.md go (default: bench/results/<today>-ring)",
    )
    p.add_argument(
        "--report-only", type=Path, metavar="DIR", help="re-render DIR/report.md from DIR/results.json"
    )
    a = p.parse_args()
    if a.report_only:
        res = json.loads((a.report_only / "results.json").read_text())
        (a.report_only / "report.md").write_text(report(res))
        print(report(res))
        return 0
    from gradswitch.baselines.gradswitch_sys import switch_daemon
    from gradswitch.testbed import Testbed

    worlds = [int(w) for w in a.worlds.split(",")]
    series = a.series.split(",")
    a.out.mkdir(parents=True, exist_ok=True)
    res = {"when": _dt.datetime.now().isoformat(timespec="minutes"), "command": " ".join(sys.argv)}
    from gradswitch.testbed.core import parse_rate

    res["rate_bps"] = parse_rate(a.rate)

    def log(msg):
        print(msg, flush=True)

    def save():
        (a.out / "results.json").write_text(json.dumps(res, indent=1))
        (a.out / "report.md").write_text(report(res))

    n = max(worlds + [4])
    with Testbed(workers=n, rate=a.rate, name="rb") as tb:
        res["testbed"] = (
            f"{n} worker namespaces, Linux bridge, tbf {a.rate} per link direction, MTU "
            f"{tb.link.mtu}; gradswitchd 1 data thread, {a.slots} slots"
        )

        def sw_factory():
            return switch_daemon(tb, threads=1, slots=a.slots)

        if "fig4" in series:
            series_fig4(tb, sw_factory, worlds, res, log)
            save()
        if "ring94" in series:
            series_ring94(tb, sw_factory, res, log)
            save()
        if "fallback" in series:
            series_fallback(tb, sw_factory, res, log)
            save()
        if "b2b" in series:
            series_b2b(tb, sw_factory, res, log)
            save()
        if "physring" in series:  # last: it adds links to the namespaces
            series_physring(tb, res, log)
            save()
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
