#!/usr/bin/env python3
"""Jobs sharing the switch's link on the testbed (issue 17): J jobs of R ranks each (or of the sizes
listed: --ranks 2,4), every rank on a worker machine of its own, one gradswitchd on the switch machine
s0, whose link (--switch-rate) is the bottleneck (worker links run at --rate). Each job alone, then all
of them at once.

    python3 bench/testbed_fairness.py [--jobs 2] [--ranks 2|R0,R1,...] [--size 16M] [--iters 20]
        [--window adaptive|fixed|<rounds>] [--target-delay-us US] [--rounds 2] [--rate 10gbit]
        [--switch-rate 1gbit] [--stagger-s S] [--log-dir DIR]
        [--out FILE.json]

A job's goodput is tensor bytes per second: alone over its timed allreduces, shared over the window
in which every job was in its timed loop (an allreduce that straddles the window's edge counts for
the fraction inside it). Printed per round: the goodputs, Jain's fairness index of the shared ones
(1 = equal shares), their total against the mean of the jobs alone, and each job's resent packets (a
fraction of those it sent). Jobs of different sizes also get Jain's index of their shares of the
switch's link (goodput x ranks: a job of N ranks sends and receives N copies of its tensor). Each
rank sends one packet per round, so equal shares per rank (per flow) give equal goodputs, and equal
shares per job give equal link shares. Every rank checks every sum.
Needs root (network namespaces); run it under `flock /tmp/gradswitch-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

from gradswitch.bench import window_option


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    n = int(float(text[:-1]) * units[text[-1].upper()]) if text[-1].upper() in units else int(text)
    return n // 4 * 4


def rank_counts(text: str) -> list[int]:
    """--ranks: one number for every job, or one per job ("2,4")."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a number, or numbers separated by commas") from None
    if min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every job needs at least 1 rank")
    return counts


def run_jobs(tb, sw, jobs: list[int], a, nbytes: int) -> dict[int, dict]:
    """Jobs `jobs` at once; per job, rank 0's record (every rank's sums were checked)."""
    from gradswitch.baselines.common import fail_text, parse_results, wait_all
    from gradswitch.baselines.runner import BaselineError

    procs = []
    t0 = time.monotonic()
    for i, j in enumerate(jobs):
        time.sleep(max(0.0, t0 + i * a.stagger_s - time.monotonic()))
        world = a.ranks[j]
        for r in range(world):
            host = f"w{sum(a.ranks[:j]) + r}"
            p = tb.python(
                host, "gradswitch.baselines.gradswitch_sys", "worker",
                "--switch", sw.address, "--job", f"fair{os.getpid()}-{j}", "--rank", r, "--world", world,
                "--nbytes", nbytes, "--iters", a.iters + 1, "--warmup", 1,
                stdout=-1, stderr=-1, text=True, env=worker_env(a),
            )  # fmt: skip
            procs.append((f"job{j}/{host}", p))
    outs = wait_all(procs, a.timeout + a.stagger_s * len(jobs))
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
        run = "shared" if len(jobs) > 1 else "alone"
        for name, _, so, se in outs:
            stem = os.path.join(a.log_dir, f"{run}-{name.replace('/', '-')}")
            with open(stem + ".log", "a") as f:
                f.write(se)
            with open(stem + ".out", "a") as f:  # the rank's result line, its counters included
                f.write(so)
    if any(rc != 0 for _, rc, _, _ in outs):
        raise BaselineError("a job failed:\n" + fail_text(outs) + "\n--- gradswitchd log\n" + sw.log())
    records: dict[int, dict] = {}
    sent: dict[int, list[int]] = {}
    for name, _, so, _ in outs:
        j = int(name[3:].split("/")[0])
        for rec in parse_results(so):
            if not rec["ok"]:
                raise BaselineError(f"{name}: a sum was wrong (max error {rec['max_err']})")
            st = rec["timed_stats"]
            tot = sent.setdefault(j, [0, 0])
            tot[0] += st.get("retransmissions", 0)
            tot[1] += st.get("packets_sent", 0)
            if rec["rank"] == 0:
                records[j] = rec
    for j, (retx, pkts) in sent.items():
        records[j]["resent"] = retx / max(pkts, 1)  # the job's ranks together, timed allreduces
    return records


def spans(rec: dict) -> list[tuple[float, float]]:
    """Each timed allreduce as [previous end, own end] (the barrier before it included)."""
    ends = rec["ends"]
    first = ends[0] - rec["times"][0]
    return list(zip([first, *ends[:-1]], ends, strict=True))


def worker_env(a: argparse.Namespace) -> dict[str, str]:
    """The workers' window settings (docs/transport.md)."""
    env = {"GRADSWITCH_WINDOW": a.window} if a.window is not None else {}
    if a.target_delay_us is not None:
        env["GRADSWITCH_TARGET_DELAY_US"] = str(a.target_delay_us)
    return env


def goodput(rec: dict, nbytes: int, window: tuple[float, float] | None = None) -> float:
    """Bytes per second over the job's timed loop, or inside `window`."""
    sp = spans(rec)
    if window is None:
        return nbytes * len(sp) / (sp[-1][1] - sp[0][0])
    lo, hi = window
    done = sum(max(0.0, min(e, hi) - max(s, lo)) / (e - s) for s, e in sp)
    return nbytes * done / (hi - lo)


def jain(xs: list[float]) -> float:
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def one_round(tb, sw, a, nbytes: int) -> dict:
    alone_recs = [run_jobs(tb, sw, [j], a, nbytes)[j] for j in range(a.jobs)]
    alone = [goodput(r, nbytes) for r in alone_recs]
    recs = run_jobs(tb, sw, list(range(a.jobs)), a, nbytes)
    window = (max(spans(r)[0][0] for r in recs.values()), min(spans(r)[-1][1] for r in recs.values()))
    if window[1] <= window[0]:
        raise SystemExit("the jobs' timed loops did not overlap: raise --iters")
    shared = [goodput(recs[j], nbytes, window) for j in range(a.jobs)]
    gbps = lambda xs: [round(x * 8 / 1e9, 4) for x in xs]  # noqa: E731
    res = {
        "alone_gbps": gbps(alone),
        "shared_gbps": gbps(shared),
        "overlap_s": round(window[1] - window[0], 3),
        "jain": round(jain(shared), 4),
        "total_over_alone": round(sum(shared) / (sum(alone) / len(alone)), 4),
        "resent_alone": [round(r["resent"], 5) for r in alone_recs],
        "resent_shared": [round(recs[j]["resent"], 5) for j in range(a.jobs)],
    }
    if len(set(a.ranks)) > 1:
        res["jain_link_shares"] = round(jain([g * n for g, n in zip(shared, a.ranks, strict=True)]), 4)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=2, help="jobs sharing the switch (default 2)")
    p.add_argument(
        "--ranks", type=rank_counts, default=[2],
        help="ranks per job: one number for every job, or one per job (2,4; sets --jobs) (default 2)",
    )  # fmt: skip
    p.add_argument("--size", default="16M", help="tensor bytes (default 16M)")
    p.add_argument("--iters", type=int, default=20, help="timed allreduces per job (default 20)")
    p.add_argument(
        "--window", type=window_option, default=None,
        help="fixed, adaptive or rounds (default: the library's, adaptive)",
    )  # fmt: skip
    p.add_argument(
        "--target-delay-us", type=float, default=None,
        help="the adaptive window's target queueing delay (default: the library's, 1000)",
    )  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="alone-then-shared rounds (default 2)")
    p.add_argument("--rate", default="10gbit", help="worker links (default 10gbit)")
    p.add_argument("--switch-rate", default="1gbit", help="the switch machine's link (default 1gbit)")
    p.add_argument("--slots", type=int, default=None, help="daemon --slots (default: its own, 256)")
    p.add_argument(
        "--stagger-s", type=float, default=0.0,
        help="start job j's ranks j x S seconds after job 0's (default 0: one after another at once)",
    )
    p.add_argument(
        "--log-dir", default=None,
        help="append each rank's stderr to DIR/<alone|shared>-job<j>-<host>.log (GRADSWITCH_LOG=debug adds "
        "a line per allreduce, with the adaptive window) and its result line, counters included, to .out",
    )  # fmt: skip
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run of the jobs (300)")
    p.add_argument("--out", default=None, help="append the result as one JSON line to this file")
    a = p.parse_args(argv)
    if len(a.ranks) > 1:
        a.jobs = len(a.ranks)
    if a.jobs < 1 or a.iters < 2 or a.stagger_s < 0:
        p.error("--jobs must be >= 1, --iters >= 2 and --stagger-s >= 0")
    a.ranks = a.ranks * a.jobs if len(a.ranks) == 1 else a.ranks
    nbytes = parse_size(a.size)

    from gradswitch.baselines.gradswitch_sys import switch_daemon
    from gradswitch.testbed import Testbed

    rounds = []
    name = f"fa{os.getpid() % 100000}"
    topology = dict(workers=sum(a.ranks), switches=1, rate=a.rate, switch_rate=a.switch_rate, name=name)
    with Testbed(**topology) as tb:
        with switch_daemon(tb, host="s0", slots=a.slots) as sw:
            for i in range(a.rounds):
                t0 = time.time()
                rounds.append(one_round(tb, sw, a, nbytes))
                print(f"round {i + 1} ({time.time() - t0:.0f} s): {json.dumps(rounds[-1])}", file=sys.stderr)
    res = {
        "jobs": a.jobs, "ranks": a.ranks[0] if len(set(a.ranks)) == 1 else a.ranks,
        "size": a.size, "iters": a.iters, "window": a.window,
        "target_delay_us": a.target_delay_us,
        "rate": a.rate, "switch_rate": a.switch_rate, "slots": a.slots, "stagger_s": a.stagger_s,
        "rounds": rounds,
        "machine": f"{platform.node()} {os.cpu_count()} cores",
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }  # fmt: skip
    print(json.dumps(res))
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
