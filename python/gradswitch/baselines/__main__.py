"""python -m gradswitch.baselines --system hostagg,gloo -n 4 --nbytes 16M --iters 5 [--testbed NAME]"""

import argparse
import json
import shlex
import sys

from .._args import bounded
from ..daemon import SwitchError
from ..testbed import Testbed, TestbedError
from .runner import ALL_SYSTEMS, SYSTEMS, BaselineError, run


def _size(s: str) -> int:
    s = s.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    return int(float(s[:-1] if s[-1:] in "KMG" else s) * mult)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--system",
        default=",".join(SYSTEMS),
        help=f"comma list of {', '.join(ALL_SYSTEMS)} (default {','.join(SYSTEMS)})",
    )
    p.add_argument("-n", "--workers", type=int, default=4)
    p.add_argument("--nbytes", type=_size, default=_size("4M"), help="gradient bytes (float32), e.g. 64M")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--testbed", default=None, help="use this existing testbed (else a temporary one)")
    p.add_argument("--rate", default="1gbit", help="temporary testbed link rate")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--loss", type=float, default=0.0, help="temporary testbed: drop probability per packet")
    p.add_argument(
        "--dup", type=float, default=0.0, help="temporary testbed: probability that a packet arrives twice"
    )
    p.add_argument(
        "--reorder", type=float, default=0.0, help="temporary testbed: probability that a packet is reordered"
    )
    p.add_argument(
        "--slots",
        type=bounded(int, 1, what="a whole number of at least 1"),
        default=None,
        help="gradswitch only: the daemon's slot pool per job (default: the daemon's, 256)",
    )
    p.add_argument(
        "--daemon-args",
        default="",
        help="gradswitch only: more gradswitchd options, e.g. '--hold-us 0' (see gradswitchd --help)",
    )
    p.add_argument("--json", action="store_true", help="one JSON line per result")


def run_args(a) -> int:
    systems = [s.strip() for s in a.system.split(",") if s.strip()]
    try:
        daemon_args = shlex.split(a.daemon_args)
    except ValueError as e:
        print(f"gradswitch baselines: error: --daemon-args {a.daemon_args!r}: {e}", file=sys.stderr)
        return 1
    try:
        if a.testbed:
            tb, owned = Testbed.attach(a.testbed), False
        else:
            impair = {"loss": a.loss, "dup": a.dup, "reorder": a.reorder}
            tb = Testbed(workers=a.workers, rate=a.rate, mtu=a.mtu, name="bl", **impair)
            tb, owned = tb.up(), True
        rc = 0
        try:
            for s in systems:
                kw = {}
                if s == "gradswitch":  # options of gradswitch's own switch; the other systems have none
                    kw = {k: v for k, v in (("slots", a.slots), ("daemon_args", daemon_args)) if v}
                r = run(s, tb, a.nbytes, a.iters, a.workers, a.warmup, **kw)
                print(json.dumps(r.as_dict()) if a.json else r.summary(), flush=True)
                rc |= 0 if r.ok else 2
        finally:
            if owned:
                tb.down()
        return rc
    except (TestbedError, BaselineError, SwitchError) as e:
        print(f"gradswitch baselines: error: {e}", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m gradswitch.baselines")
    add_arguments(p)
    return run_args(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
