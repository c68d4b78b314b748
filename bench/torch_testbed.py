"""bench/torch_iteration.py on the emulated testbed: one rank per worker namespace, the switch in
the switch namespace, links shaped to --rate (issues 5 and 42).

    sudo python3 bench/torch_testbed.py [--workers 4] [--rate 1gbit] [--model mlp|...|embbag] \
        [--configs local,gloo-ddp,gs-ddp,gs-overlap:256] [--iters 5] [--out /tmp/torch-testbed]
    # the spread: N launches in a row, the configurations' order alternated, each one's runs listed
    sudo python3 bench/torch_testbed.py --configs local,gloo-ddp,gs-ddp --repeat 20
    # time to accuracy: examples/train_ddp.py (scikit-learn's digits) with each backend, alternated
    sudo python3 bench/torch_testbed.py --digits gloo,gradswitch --target-accuracy 95 --epochs 10
    # the same through the switch with other wires: BACKEND[:WIRE[+ef]] (+ef: --error-feedback)
    sudo python3 bench/torch_testbed.py --digits gradswitch,gradswitch:mx8,gradswitch:mx8+ef --repeat 2

Prints rank 0's report: per configuration the iteration time, the loss of every iteration, the bound
(with a `local` configuration: forward + max(backward, first gradient + wire time) + step of the
no-communication run) and the speed-ups. Other torch_iteration.py options (--wire, --width, --vocab, ...)
go after `--` (with --digits: train_ddp.py's, e.g. -- --deadline-us 5000 --slow-rank 3 --slow-ms 20).
--slow-uplink R puts rank R's uplink at 1/10 of --rate (with --digits ... -- --deadline-us D --concede:
issue 39's bandwidth straggler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from gradswitch._paths import switch_binary
from gradswitch.testbed import Testbed, parse_rate
from gradswitch.testbed.base import HOST_IF, HOST_QUEUE_BYTES

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from ddp_models import MODELS  # noqa: E402


def shape(tb, host: str, rate: int, down: bool) -> None:
    """host's link at `rate`: its uplink (the host's egress), and with `down` the switch port's egress
    too, with the queues bridge.py gives them."""
    lk = replace(tb.link, rate=rate)
    tb._shape(host, HOST_IF, lk, max(lk.tbf_params()[1], HOST_QUEUE_BYTES))
    if down:
        tb._shape("switch", tb.port(host), lk)


def start_switch(tb, out: Path, slots: int):
    """gradswitchd in the switch namespace, its log in out/switch.log."""
    with open(out / "switch.log", "w") as log:
        sw = tb.popen(
            "switch",
            [switch_binary(), "--control-host", tb.address("switch"), "--insecure", "--threads", "1"]
            + ["--slots", str(slots)],  # --insecure: the testbed's own namespaces
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    time.sleep(1)
    return sw


def run_ranks(tb, workers: int, out: Path, argv, timeout: float, env=None) -> list[int]:
    """argv(rank) in worker namespace w<rank> for every rank, logs in out/rank<r>.log; their exit codes."""
    procs = []
    for r in range(workers):
        with open(out / f"rank{r}.log", "w") as log:
            # gloo binds to the address of the namespace's link, not the hostname's
            procs.append(
                tb.popen(
                    f"w{r}",
                    argv(r),
                    env={"GLOO_SOCKET_IFNAME": "gs-eth0", **(env(r) if env else {})},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        return [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise SystemExit(f"ranks still running after {timeout:g} s (--timeout); logs in {out}") from None


def launch(tb, a, configs: str, out: Path) -> dict:
    """One torch_iteration.py run of `configs` on testbed tb: rank 0's JSON report."""
    out.mkdir(parents=True, exist_ok=True)
    sw = start_switch(tb, out, a.slots)
    common = [
        "--world-size", str(a.workers), "--master-addr", tb.address("w0"), "--master-port", "29500",
        "--switch", f"{tb.address('switch')}:7700", "--configs", configs, "--iters", str(a.iters),
        "--warmup", "1", "--threads", "1", "--rate", a.rate, "--model", a.model,
    ] + (["--stats"] if a.stats else []) + a.extra  # fmt: skip

    def argv(r):
        return [sys.executable, str(HERE / "torch_iteration.py"), "--rank", str(r), *common] + [
            "--json",
            str(out / f"rank{r}.json"),
        ]

    try:
        codes = run_ranks(tb, a.workers, out, argv, a.timeout)
    finally:
        sw.terminate()
        sw.wait()
    if any(codes) or not (out / "rank0.json").exists():
        tail = (out / "rank0.log").read_text()[-2000:]
        raise SystemExit(f"torch_iteration.py failed (exit codes {codes}); rank 0's log ends:\n{tail}")
    return json.loads((out / "rank0.json").read_text())


def spread(tb, a) -> None:
    """--repeat: a.repeat launches, the configurations' order reversed every other one; each
    configuration's iteration medians, their median, and the runs slower than 0.9x it."""
    names = [c for c in a.configs.split(",") if c]
    runs: dict[str, list[float]] = {c: [] for c in names}
    vs_bound: dict[str, list[float]] = {c: [] for c in names}
    vs_gloo: dict[str, list[float]] = {c: [] for c in names}
    for i in range(a.repeat):
        order = names if i % 2 == 0 else names[::-1]
        rep = launch(tb, a, ",".join(order), a.out / f"run{i:02d}")
        line = []
        gloo = next((r["iteration_s"] for r in rep["results"] if r["config"] == "gloo-ddp"), None)
        for r in rep["results"]:
            runs[r["config"]].append(r["iteration_s"])
            if "vs_bound" in r:
                vs_bound[r["config"]].append(r["vs_bound"])
            if gloo and r["config"] not in ("local", "gloo-ddp"):
                vs_gloo[r["config"]].append(gloo / r["iteration_s"])  # side by side in one launch
            line.append(f"{r['config']} {r['iteration_s'] * 1e3:.0f} ms")
        print(f"run {i + 1}/{a.repeat}: " + ", ".join(line), flush=True)
    summary = {}
    for c, ts in runs.items():
        med = statistics.median(ts)
        slow = [t for t in ts if t > med / 0.9]  # slower than 0.9x the median's speed
        summary[c] = {"runs_s": ts, "median_s": med, "slower_than_0.9x_median": len(slow)}
        summary[c].update(vs_bound=vs_bound[c], vs_gloo=vs_gloo[c])
        ratios = [
            f"{what} median {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
            for what, v in (("iteration/bound", vs_bound[c]), ("vs gloo", vs_gloo[c]))
            if v
        ]
        print(
            f"{c:16s} median {med * 1e3:7.1f} ms  range {min(ts) * 1e3:.0f}-{max(ts) * 1e3:.0f} ms  "
            f"{len(slow)} of {len(ts)} runs slower than 0.9x the median  "
            f"runs: {' '.join(f'{t * 1e3:.0f}' for t in ts)}  " + "  ".join(ratios),
            flush=True,
        )
    (a.out / "spread.json").write_text(json.dumps(summary, indent=1))


DIGITS_WIRES = ("float32", "fixed32", "float16", "bfloat16", "mx8")


def digits_entries(spec: str) -> dict[str, tuple[str, list[str]]]:
    """--digits's entries, BACKEND[:WIRE[+ef]]: each name -> (backend, its train_ddp.py options)."""
    entries = {}
    for name in (e for e in spec.split(",") if e):
        backend, _, rest = name.partition(":")
        wire, plus, flag = rest.partition("+")
        if backend not in ("gloo", "gradswitch") or (plus and flag != "ef") or (rest and backend == "gloo"):
            raise SystemExit(f"--digits {spec}: {name!r} is not gloo or gradswitch[:WIRE[+ef]]")
        if wire and wire not in DIGITS_WIRES:
            raise SystemExit(f"--digits {spec}: {name!r}: the wire is one of {', '.join(DIGITS_WIRES)}")
        entries[name] = (backend, (["--wire", wire] if wire else []) + (["--error-feedback"] if plus else []))
    if not entries:
        raise SystemExit("--digits: name at least one of gloo, gradswitch[:WIRE[+ef]]")
    return entries


def digits(tb, a) -> None:
    """--digits: examples/train_ddp.py with each entry in turn (alternated over --repeat rounds);
    the time each took to reach --target-accuracy and its final test accuracy."""
    entries = digits_entries(a.digits)
    names = list(entries)
    times: dict[str, list] = {b: [] for b in names}
    accuracy: dict[str, list] = {b: [] for b in names}
    for i in range(a.repeat):
        for b in names if i % 2 == 0 else names[::-1]:
            out = a.out / f"digits-{b.replace(':', '-').replace('+', '-')}-{i:02d}"
            hist = train_digits(tb, a, *entries[b], out)
            t = hist.get("time_to_target_s")
            times[b].append(t)
            final = hist["history"][-1]
            accuracy[b].append(final["accuracy"])
            reached = f"{t:.2f} s (epoch {hist['target_epoch']})" if t is not None else "not reached"
            print(
                f"round {i + 1} {b:10s} {a.target_accuracy:g}% in {reached}; after {len(hist['history'])} "
                f"epochs: accuracy {final['accuracy']:.2f}%, loss {final['loss']:.4f}",
                flush=True,
            )
    for b, ts in times.items():
        got = [t for t in ts if t is not None]
        med = f"median {statistics.median(got):.2f} s" if got else "never reached"
        acc = " ".join(f"{v:.2f}" for v in accuracy[b])
        print(f"{b:10s} time to {a.target_accuracy:g}%: {med}  runs: {ts}  accuracy {acc}", flush=True)


def train_digits(tb, a, backend: str, options: list[str], out: Path) -> dict:
    """One examples/train_ddp.py run on the testbed (the switch up for --backend gradswitch)."""
    out.mkdir(parents=True, exist_ok=True)
    sw = start_switch(tb, out, a.slots) if backend == "gradswitch" else None
    cmd = [sys.executable, str(ROOT / "examples" / "train_ddp.py"), "--backend", backend, *options]
    cmd += ["--epochs", str(a.epochs), "--target-accuracy", str(a.target_accuracy), *a.extra, "--json"]

    def env(r):
        return {
            "RANK": str(r),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(a.workers),
            "MASTER_ADDR": tb.address("w0"),
            "MASTER_PORT": "29500",
            "GRADSWITCH_SWITCH": f"{tb.address('switch')}:7700",
        }

    try:
        codes = run_ranks(tb, a.workers, out, lambda r: cmd + [str(out / f"rank{r}.json")], a.timeout, env)
    finally:
        if sw:
            sw.terminate()
            sw.wait()
    if any(codes):
        tail = (out / "rank0.log").read_text()[-2000:]
        raise SystemExit(f"train_ddp.py --backend {backend} failed ({codes}); rank 0's log ends:\n{tail}")
    return json.loads((out / "rank0.json").read_text())


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--rate", default="1gbit")
    p.add_argument("--model", choices=MODELS, default="mlp")
    p.add_argument("--configs", default="local,gloo-ddp,gs-ddp,gs-overlap:256")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--slots", type=int, default=256, help="gradswitchd --slots")
    p.add_argument("--out", type=Path, default=Path("/tmp/torch-testbed"))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per launch")
    p.add_argument("--stats", action="store_true", help="torch_iteration.py --stats: per-rank counters")
    p.add_argument("--repeat", type=int, default=1, help="launches in a row, order alternated (the spread)")
    p.add_argument(
        "--digits",
        default=None,
        metavar="ENTRIES",
        help="time to accuracy of examples/train_ddp.py: gloo, gradswitch, gradswitch:WIRE (float32, "
        "fixed32, float16, bfloat16, mx8), gradswitch:WIRE+ef (with --error-feedback), comma-separated",
    )
    p.add_argument("--target-accuracy", type=float, default=95.0, help="with --digits: test accuracy, %%")
    p.add_argument("--epochs", type=int, default=10, help="with --digits: epochs per run")
    p.add_argument("--loss", type=float, default=0.0, help="random loss per link and direction")
    p.add_argument(
        "--slow-uplink",
        type=int,
        default=None,
        metavar="RANK",
        help="RANK's uplink (worker to switch) at 1/10 of --rate: a bandwidth straggler (issue 39)",
    )
    p.add_argument("extra", nargs="*", help="after --: more torch_iteration.py (train_ddp.py) options")
    a = p.parse_args(argv)
    if a.workers < 2 or a.iters < 1 or a.repeat < 1 or a.epochs < 1:
        p.error("--workers must be at least 2, --iters, --repeat and --epochs at least 1")
    if a.slow_uplink is not None and not 0 <= a.slow_uplink < a.workers:
        p.error(f"--slow-uplink {a.slow_uplink}: a rank in 0..{a.workers - 1}")
    if a.slow_uplink is not None and parse_rate(a.rate) is None:
        p.error("--slow-uplink needs a shaped link (--rate)")
    if not 0 < a.target_accuracy <= 100:
        p.error(f"--target-accuracy {a.target_accuracy}: a percentage in (0, 100]")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    with Testbed(workers=a.workers, rate=a.rate, loss=a.loss, name="tt") as tb:
        if a.slow_uplink is not None:
            shape(tb, f"w{a.slow_uplink}", tb.link.rate // 10, down=False)
        if a.digits:
            digits(tb, a)
        elif a.repeat > 1:
            spread(tb, a)
        else:
            launch(tb, a, a.configs, a.out)
            print((a.out / "rank0.log").read_text()[-4000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
