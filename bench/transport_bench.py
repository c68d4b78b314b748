#!/usr/bin/env python3
"""The transport's benchmarks on loopback (issue 17): `gradswitch bench` runs of several builds and
window settings, alternated round by round so that they share the machine's load, with every rank
checking every sum. Per configuration: median allreduce time, goodput, and retransmitted packets as a
fraction of the packets the switch received (and how many of those the workers proved spurious).

    python3 bench/transport_bench.py --config NAME=[PYTHONPATH]:[ENV=V,...]:[bench args] ...
        [--rounds 3] [--out bench/results/<date>-transport.json]

A configuration is `name=pythonpath:env:args`: `pythonpath` a directory holding a `gradswitch` package
(empty: the installed one), `env` comma-separated VAR=VALUE, `args` extra `gradswitch bench` arguments
separated by spaces, e.g.
    --config "main=/work/transport-builds/item1::-n 4 --size 16M --iters 10" \\
    --config "adaptive=:GRADSWITCH_WINDOW=adaptive:-n 4 --size 16M --iters 10"
Ratios are against the first configuration. Run it under `flock /tmp/gradswitch-bench.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\S+)")
SWITCH = re.compile(r"switch: (\d+) packets in")


def parse_config(text: str) -> dict:
    name, sep, rest = text.partition("=")
    parts = rest.split(":", 2)
    if not sep or len(parts) != 3:
        raise argparse.ArgumentTypeError(f"--config {text!r}: expected name=pythonpath:env:args")
    path, env, args = parts
    envs = dict(kv.split("=", 1) for kv in env.split(",") if kv)
    return {"name": name, "path": path, "env": envs, "args": args.split()}


def run_once(cfg: dict, timeout: float) -> dict:
    env = dict(os.environ, **cfg["env"])
    if cfg["path"]:
        env["PYTHONPATH"] = cfg["path"]
    cmd = [sys.executable, "-c", "import sys; from gradswitch.cli import main; sys.exit(main(sys.argv[1:]))"]
    cmd += ["bench", *cfg["args"]]
    t0 = time.time()
    p = subprocess.run(cmd, env=env, cwd="/tmp", capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    rows = [m.groups() for m in map(ROW.match, out.splitlines()) if m]
    sw = SWITCH.search(out)
    if p.returncode != 0 or not rows or "all results exact: OK" not in out:
        return {"ok": False, "output": out[-2000:]}
    spurious = [int(r[5]) if r[5].isdigit() else 0 for r in rows]
    return {
        "ok": True,
        "mean_ms": max(float(r[1]) for r in rows),  # the slowest rank's mean
        "gbps": min(float(r[3]) for r in rows),
        "retx": sum(int(r[4]) for r in rows),
        "spurious": sum(spurious),
        "pkts_in": int(sw.group(1)) if sw else None,
        "wall_s": round(time.time() - t0, 1),
    }


def summary(runs: list[dict]) -> dict:
    ok = [r for r in runs if r["ok"]]
    if not ok:
        return {"ok": 0}
    pk = [r for r in ok if r["pkts_in"]]
    return {
        "ok": len(ok),
        "runs": len(runs),
        "ms": statistics.median(r["mean_ms"] for r in ok),
        "gbps": statistics.median(r["gbps"] for r in ok),
        "retx_frac": sum(r["retx"] for r in pk) / sum(r["pkts_in"] for r in pk) if pk else None,
        "spurious_frac": sum(r["spurious"] for r in pk) / sum(r["pkts_in"] for r in pk) if pk else None,
    }


def table(configs: list[dict], results: dict) -> str:
    lines = [
        "| configuration | median ms (slowest rank) | Gbit/s | ratio | resent / packets | proven spurious |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ref = results[configs[0]["name"]]["summary"].get("ms")
    for c in configs:
        s = results[c["name"]]["summary"]
        if not s.get("ok"):
            lines.append(f"| {c['name']} | failed | | | | |")
            continue
        frac = "-" if s["retx_frac"] is None else f"{100 * s['retx_frac']:.2f}%"
        spur = "-" if s["spurious_frac"] is None else f"{100 * s['spurious_frac']:.2f}%"
        ratio = f"{s['ms'] / ref:.2f}x" if ref else "-"
        lines.append(
            f"| {c['name']} | {s['ms']:.1f} | {s['gbps']:.2f} | {ratio} | {frac} | {spur} |"
            + ("" if s["ok"] == s["runs"] else f" ({s['runs'] - s['ok']} failed)")
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=parse_config, action="append", required=True, help="see above")
    p.add_argument("--rounds", type=int, default=3, help="runs per configuration, alternated (default 3)")
    p.add_argument("--timeout", type=float, default=240, help="seconds per run (default 240)")
    p.add_argument("--out", default=None, help="write the runs and the summary as JSON here")
    a = p.parse_args(argv)
    results = {c["name"]: {"config": c, "runs": []} for c in a.config}
    for i in range(a.rounds):
        for c in a.config:
            try:
                r = run_once(c, a.timeout)
            except subprocess.TimeoutExpired:
                r = {"ok": False, "output": "timed out"}
            results[c["name"]]["runs"].append(r)
            load = open("/proc/loadavg").read().split()[0]
            print(f"round {i + 1}/{a.rounds} {c['name']}: {json.dumps(r)[:300]} (load {load})", flush=True)
    for c in a.config:
        results[c["name"]]["summary"] = summary(results[c["name"]]["runs"])
    text = table(a.config, results)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"argv": sys.argv, "results": results, "table": text}, f, indent=1)
    return 0 if all(results[c["name"]]["summary"].get("ok") for c in a.config) else 1


if __name__ == "__main__":
    sys.exit(main())
