"""`gradswitch testbed up|down|status|exec` — wire with `add_parser(subparsers)`."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from .core import (
    DEFAULT_SUBNET,
    Testbed,
    TestbedError,
    fmt_rate,
    list_testbeds,
    load_state,
    remove_testbed,
)
from .dpdk import DpdkOptions


def _safe(fn):
    """Sub-command handler that prints TestbedError as one clean message and returns 1."""

    def run(a) -> int:
        try:
            return fn(a)
        except TestbedError as e:
            print(f"gradswitch testbed: error: {e}", file=sys.stderr)
            return 1

    run.__name__ = fn.__name__
    return run


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `testbed` sub-command (with up/down/status/exec) to an argparse subparsers object."""
    p = subparsers.add_parser(
        "testbed",
        help="emulated cluster in network namespaces (needs root)",
        description="Emulated cluster: N worker namespaces (w0..), a host namespace "
        "(host) and a switch namespace (switch) joined by a bridge; with --switches S also switch "
        "machines s0..; with --racks R --workers-per-rack W racks of workers behind leaves and a spine.",
    )
    sub = p.add_subparsers(dest="testbed_cmd", metavar="{up,down,status,exec}")
    sub.required = True

    def common(sp):
        sp.add_argument(
            "--name",
            default=os.environ.get("GRADSWITCH_TESTBED", "tb"),
            help="testbed name, objects are called gs-<name>-... (default tb or $GRADSWITCH_TESTBED)",
        )

    up = sub.add_parser("up", help="create the testbed")
    common(up)
    up.add_argument("-n", "--workers", type=int, default=4, help="worker namespaces (default 4)")
    up.add_argument(
        "--rate",
        default="1gbit",
        help="per-link rate, both directions, tc tbf; 'none' = unshaped (default 1gbit)",
    )
    up.add_argument(
        "--delay", default="0ms", help="one-way delay per link (only 0ms: no netem in this kernel)"
    )
    up.add_argument("--mtu", type=int, default=1500, help="link MTU, 1500 or 9000 (default 1500)")
    up.add_argument(
        "--loss",
        type=float,
        default=0.0,
        help="random drop probability per packet, per link direction (default 0)",
    )
    up.add_argument(
        "--dup",
        type=float,
        default=0.0,
        help="probability per packet, per link direction, that it arrives twice (default 0; bridge and "
        "--switches topologies)",
    )
    up.add_argument(
        "--reorder",
        type=float,
        default=0.0,
        help="probability per packet, per link direction, that it arrives after the rest of its sender's "
        "burst (default 0; bridge and --switches topologies; not a delay: docs/testbed.md)",
    )
    up.add_argument("--burst", type=int, default=None, help="tbf bucket bytes (default auto)")
    up.add_argument("--queue", default="5ms", help="tbf queue length as time at rate (default 5ms)")
    up.add_argument(
        "--offload",
        choices=["auto", "on", "off"],
        default="auto",
        help="TSO/GSO/GRO on links (auto: off when loss, dup or reorder > 0, so they act per packet)",
    )
    up.add_argument(
        "--subnet",
        default=DEFAULT_SUBNET,
        help=f"address range inside the namespaces (default {DEFAULT_SUBNET})",
    )
    up.add_argument(
        "--switch",
        choices=["bridge", "dpdk"],
        default="bridge",
        help="what joins the links: a Linux bridge (default) or gradswitchd --backend dpdk, started by "
        "up and stopped by down (docs/testbed.md)",
    )
    g = up.add_argument_group("topologies (docs/testbed.md)")
    g.add_argument(
        "--switches",
        type=int,
        default=0,
        help="S switch machines s0..s{S-1} on the bridge, each on its own link (a sharded job)",
    )
    g.add_argument("--switch-rate", default=None, help="rate of the switch machines' links (default --rate)")
    g.add_argument(
        "--racks",
        type=int,
        default=0,
        help="R racks: each a leaf machine leaf<r> bridging its workers, routed to a spine machine",
    )
    g.add_argument("--workers-per-rack", type=int, default=0, help="W workers per rack (-n is then R*W)")
    g.add_argument("--uplink-rate", default=None, help="rate of each uplink to the spine (default --rate)")
    dd = DpdkOptions()
    g = up.add_argument_group("--switch dpdk")
    g.add_argument(
        "--dpdk-vdev",
        choices=["auto", "af_xdp", "af_packet"],
        default=dd.vdev,
        help="DPDK port kind on the switch-side veths (auto: af_xdp, af_packet when mtu > 3000)",
    )
    g.add_argument("--dpdk-lcores", default=dd.lcores, help=f"EAL -l (default {dd.lcores})")
    g.add_argument(
        "--dpdk-threads", type=int, default=dd.threads, help=f"aggregation threads (default {dd.threads})"
    )
    g.add_argument(
        "--dpdk-idle-sleep-us",
        type=int,
        default=dd.idle_sleep_us,
        help=f"sleep after idle polls, 0 = busy-poll (default {dd.idle_sleep_us})",
    )
    g.add_argument(
        "--dpdk-memory-mb", type=int, default=None, help="EAL -m (default 256 af_xdp, 1024 af_packet)"
    )
    g.add_argument(
        "--dpdk-daemon-args", default="", help="extra gradswitchd options (one string, shell-split)"
    )
    g.add_argument("--dpdk-eal-args", default="", help="extra EAL arguments (one string)")
    g.add_argument("--dpdk-args", default="", help="extra DPDK options after the second -- (one string)")
    up.set_defaults(func=_safe(_up))

    down = sub.add_parser("down", help="remove the testbed (everything named gs-<name>-*)")
    common(down)
    down.add_argument("--all", action="store_true", help="remove every gradswitch testbed on this machine")
    down.set_defaults(func=_safe(_down))

    st = sub.add_parser("status", help="what exists")
    common(st)
    st.add_argument("--json", action="store_true")
    st.add_argument("-v", "--verbose", action="store_true", help="also qdisc and nft counters")
    st.set_defaults(func=_safe(_status))

    ex = sub.add_parser("exec", help="run a command on a host: exec w0 -- ping -c1 host")
    common(ex)
    ex.add_argument("host", help="w0..w{N-1}, host, switch (s0.., leaf0.., spine in other topologies)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command ...")
    ex.set_defaults(func=_safe(_exec))
    return p


def _up(a) -> int:
    offload = {"auto": None, "on": True, "off": False}[a.offload]
    tb = Testbed(
        workers=None if a.racks else a.workers,
        switches=a.switches,
        switch_rate=a.switch_rate,
        racks=a.racks,
        workers_per_rack=a.workers_per_rack,
        uplink_rate=a.uplink_rate,
        rate=a.rate,
        delay=a.delay,
        mtu=a.mtu,
        loss=a.loss,
        dup=a.dup,
        reorder=a.reorder,
        name=a.name,
        subnet=a.subnet,
        burst=a.burst,
        queue=a.queue,
        offload=offload,
        switch=a.switch,
        dpdk=DpdkOptions(
            vdev=a.dpdk_vdev,
            lcores=a.dpdk_lcores,
            threads=a.dpdk_threads,
            idle_sleep_us=a.dpdk_idle_sleep_us,
            memory_mb=a.dpdk_memory_mb,
            daemon_args=shlex.split(a.dpdk_daemon_args),
            eal_args=shlex.split(a.dpdk_eal_args),
            dpdk_args=shlex.split(a.dpdk_args),
        ),
    )
    tb.up()
    d = tb.describe()
    print(
        f"testbed {a.name} up: {tb.workers} workers, {d['topology']}, rate {d['rate']}, mtu {d['mtu']}, "
        f"loss {d['loss']}, dup {d['dup']}, reorder {d['reorder']}"
    )
    if tb.switch == "dpdk":
        x = d["dpdk"]
        print(f"  switch: gradswitchd --backend dpdk pid {x['pid']} ({x['vdev_used']}), log {x['log']}")
    for h, info in d["hosts"].items():
        print(f"  {h:7s} {info['address']:15s} netns {info['netns']}  if {info['if']}")
    return 0


def _down(a) -> int:
    names = list_testbeds() if a.all else [a.name]
    for n in names:
        removed = remove_testbed(n)
        print(
            f"testbed {n}: removed {len(removed)} objects" + (f" ({', '.join(removed)})" if removed else "")
        )
    return 0


def _status(a) -> int:
    names = list_testbeds()
    if a.json:
        out = {}
        for n in names:
            st = load_state(n)
            out[n] = Testbed.attach(n).describe() if st else {"state": "no state file (stray namespaces)"}
            if st:
                out[n]["complete"] = st.complete
        print(json.dumps(out, indent=1))
        return 0
    if not names:
        print("no gradswitch testbeds")
        return 0
    for n in names:
        st = load_state(n)
        if st is None:
            print(f"{n}: namespaces without a state file; `gradswitch testbed down --name {n}` removes them")
            continue
        tb = Testbed.attach(n)
        from .core import _netns_list

        live = set(_netns_list())
        flag = "" if st.complete else " (INCOMPLETE: up failed or still running)"
        print(
            f"{n}: {st.workers} workers, rate {fmt_rate(tb.link.rate)}, mtu {tb.link.mtu}, "
            f"loss {tb.link.loss}, dup {tb.link.dup}, reorder {tb.link.reorder}, "
            f"offload {'on' if tb.link.offloads_on() else 'off'}, switch {tb.switch}, "
            f"topology {tb.topology.kind}{flag}"
        )
        if tb.switch == "dpdk":
            pid = st.daemon_pid
            alive = bool(pid) and os.path.exists(f"/proc/{pid}")
            print(
                f"  gradswitchd --backend dpdk pid {pid} {'running' if alive else 'NOT RUNNING'}"
                f", log {tb.daemon_log}, stats {tb.stats_file}"
            )
        for h in tb.hosts:
            ns = tb.netns(h)
            print(f"  {h:7s} {tb.address(h):15s} {ns:20s} {'ok' if ns in live else 'MISSING'}")
        if a.verbose:
            for host in tb.hosts:  # every shaped egress and loss/dup rule, wherever the topology put them
                if tb.netns(host) not in live:
                    continue
                r = tb.exec(host, ["tc", "-s", "qdisc", "show"], check=False)
                for line in r.stdout.split("qdisc ")[1:]:
                    if line.startswith("tbf"):
                        print(f"  [{host}] qdisc " + " ".join(line.split()))
                r = tb.exec(host, ["nft", "list", "ruleset"], check=False)
                if r.stdout.strip():
                    print(f"  [{host}] nft:\n{r.stdout}")
    return 0


def _exec(a) -> int:
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        raise TestbedError("nothing to run: gradswitch testbed exec w0 -- ping -c1 host")
    tb = Testbed.attach(a.name)
    os.execvpe("ip", tb._cmd(a.host, cmd), tb.env())
    return 127  # not reached


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gradswitch")
    sub = parser.add_subparsers(dest="cmd")
    sub.required = True
    add_parser(sub)
    a = parser.parse_args(argv)
    return a.func(a)
