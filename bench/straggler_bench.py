"""Bounded-time rounds against stragglers and loss on the emulated testbed (issue 39): bench/
torch_iteration.py's DDP MLP over gloo (gloo-ddp), gradswitch's default exact mode (gs-ddp) and
gradswitch with deadline_us/quorum (gs-deadline-ddp, docs/protocol.md §3.1) and the same with every
rank allowed to concede (gs-concede-ddp, §3.1 "Concede"), and conceding with error feedback
(gs-concede-ef-ddp: what a sum lacked of a rank goes in its later steps), side by side in each
launch, in every scenario:

    none          no straggler
    slow-link     the straggler's link (both directions) at 1/10 of --rate
    slow-uplink   only its uplink (worker to switch) at 1/10
    slow-compute  the straggler computes --slow-compute times slower (torch_iteration.py --slow-compute:
                  it sleeps its extra forward + backward, leaving the shared CPUs to the others)
    loss1         --loss random loss on every link, both directions

    sudo flock /tmp/gradswitch-netns.lock python3 bench/straggler_bench.py [--rounds 3] [--iters 3] \
        [--width 2048] [--deadline-us 100000] [--quorum 3] [--out bench/results/<date>-straggler]

The straggler is the last rank. Each round runs every scenario once (one launch of all configurations
on the same testbed, reshaped between launches), the scenarios' and the configurations' order reversed
every other round so the machine's load falls on each alike. A launch's figure is the slowest rank's
median iteration (torch_iteration.py); per scenario and configuration the report gives the median and
range over rounds, and the ratio to the same configuration's no-straggler iteration of the same round.
Offloads are off on every link in every scenario (the loss emulation drops single datagrams only
without them, bridge.py), so the loss scenario's baseline is the same links without the loss.
Also printed: the healthy spread of the ranks' first gradients (what the deadline must exceed, §3.1)
and the contributions the deadline configuration's rounds missed per iteration.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

from torch_testbed import launch, shape

from gradswitch.testbed import Testbed, parse_rate

SCENARIOS = ("none", "slow-link", "slow-uplink", "slow-compute", "loss1")
CONFIGS = ("gloo-ddp", "gs-ddp", "gs-deadline-ddp", "gs-concede-ddp", "gs-concede-ef-ddp")


def set_scenario(tb, a, scenario: str, on: bool) -> list[str]:
    """Apply (on) or undo a scenario's impairment; the torch_iteration.py options it needs."""
    slow = f"w{a.workers - 1}"
    if scenario in ("slow-link", "slow-uplink"):
        shape(tb, slow, tb.link.rate // 10 if on else tb.link.rate, down=scenario == "slow-link" or not on)
    elif scenario == "loss1":
        if on:
            tb._loss("switch", [tb.port(h) for h in tb.endpoints], a.loss)
        else:
            tb.exec("switch", ["nft", "delete", "table", "netdev", "gs_loss"])
    elif scenario == "slow-compute" and on:
        return ["--slow-rank", str(a.workers - 1), "--slow-compute", str(a.slow_compute)]
    return []


def one_launch(tb, a, scenario: str, configs: list[str], out: Path) -> dict:
    """torch_iteration.py's configurations under `scenario`: rank 0's report."""
    la = copy.copy(a)
    la.stats, la.model = True, "mlp"
    try:
        la.extra = set_scenario(tb, a, scenario, True) + [
            "--width", str(a.width), "--deadline-us", str(a.deadline_us), "--quorum", str(a.quorum),
        ]  # fmt: skip
        return launch(tb, la, ",".join(configs), out)
    finally:
        set_scenario(tb, a, scenario, False)


def missed_per_iteration(r: dict, iters: int) -> float | None:
    """Contributions rank 0's rounds missed per measured iteration (None outside gradswitch)."""
    ranks = r.get("per_rank")
    if not ranks:
        return None
    return ranks[0]["counters"].get("missed_contributions", 0) / iters


def summarize(runs: list[dict], a) -> str:
    """The table: per scenario and configuration, medians and ranges over rounds, and the ratios."""
    base = {(x["round"], x["config"]): x["iteration_s"] for x in runs if x["scenario"] == "none"}
    lines = [
        "| scenario | config | iteration ms, median (range) | vs its no-straggler (median, range) | "
        "fastest rank ms | missed contributions / iteration |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for sc in a.scenarios:
        for c in a.configs:
            xs = [x for x in runs if x["scenario"] == sc and x["config"] == c]
            if not xs:
                continue
            ts = [x["iteration_s"] * 1e3 for x in xs]
            ratio = [x["iteration_s"] / base[x["round"], c] for x in xs if (x["round"], c) in base]
            fast = statistics.median(x["fastest_rank_iteration_s"] * 1e3 for x in xs)
            missed = [x["missed"] for x in xs if x["missed"] is not None]
            lines.append(
                f"| {sc} | {c} | {statistics.median(ts):.0f} ({min(ts):.0f}-{max(ts):.0f}) | "
                + (
                    f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}) | "
                    if ratio
                    else "- | "
                )
                + f"{fast:.0f} | "
                + (f"{statistics.median(missed):.0f} |" if missed else "- |")
            )
    healthy = [x for x in runs if x["scenario"] == "none" and x["config"] != "gloo-ddp"]
    if healthy:  # what the switch sees: the gradswitch configurations' spreads
        med = statistics.median(x["first_grad_spread_s"] * 1e3 for x in healthy)
        most = sorted(x["first_grad_spread_max_s"] * 1e3 for x in healthy)
        lines.append(
            f"\nHealthy (scenario none, gs-ddp and gs-deadline-ddp) spread of the ranks' first gradients: "
            f"median {med:.1f} ms; per launch at most {', '.join(f'{m:.0f}' for m in most)} ms; "
            f"deadline_us={a.deadline_us} quorum={a.quorum}."
        )
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=3, help="timed, after 1 warm-up")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--width", type=int, default=2048, help="the MLP's hidden width (torch_iteration.py)")
    p.add_argument("--deadline-us", type=int, default=100000)
    p.add_argument("--quorum", type=int, default=3)
    p.add_argument("--slow-compute", type=float, default=2.0, help="the slow-compute straggler's factor")
    p.add_argument("--loss", type=float, default=0.01, help="loss1: drop probability per link and direction")
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"some of {','.join(CONFIGS)}")
    p.add_argument("--slots", type=int, default=256, help="gradswitchd --slots")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    p.add_argument("--out", type=Path, default=Path("/tmp/straggler-bench"))
    a = p.parse_args(argv)
    a.scenarios = [s for s in a.scenarios.split(",") if s]
    a.configs = [c for c in a.configs.split(",") if c]
    if not a.configs or any(c not in CONFIGS for c in a.configs):
        p.error(f"--configs: choose from {','.join(CONFIGS)}")
    bad = [s for s in a.scenarios if s not in SCENARIOS]
    if bad or "none" not in a.scenarios:
        p.error(f"--scenarios: {bad or 'none is missing'}; choose from {','.join(SCENARIOS)}, none included")
    if a.rounds < 1 or a.iters < 1 or a.workers < 2 or not 1 <= a.quorum <= a.workers:
        p.error("--rounds and --iters at least 1, --workers at least 2, --quorum in 1..workers")
    if parse_rate(a.rate) is None:
        p.error(f"--rate {a.rate}: the scenarios need a shaped link")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict] = []
    with Testbed(workers=a.workers, rate=a.rate, offload=False, name="strg") as tb:
        for rnd in range(a.rounds):
            order = a.scenarios if rnd % 2 == 0 else a.scenarios[::-1]
            for sc in order:
                configs = list(a.configs) if rnd % 2 == 0 else list(a.configs[::-1])
                rep = one_launch(tb, a, sc, configs, a.out / f"round{rnd}-{sc}")
                for r in rep["results"]:
                    rec = {"round": rnd, "scenario": sc, "config": r["config"], "missed": None}
                    rec.update({k: r[k] for k in ("iteration_s", "fastest_rank_iteration_s", "loss")})
                    rec.update({k: r[k] for k in ("first_grad_spread_s", "first_grad_spread_max_s")})
                    rec["missed"] = missed_per_iteration(r, a.iters)
                    runs.append(rec)
                    print(json.dumps(rec), flush=True)
    report = summarize(runs, a)
    print(report)
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(a).items()}
    (a.out / "results.json").write_text(json.dumps({"args": args, "runs": runs}, indent=1))
    (a.out / "summary.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
