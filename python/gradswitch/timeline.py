"""The worker timeline: Chrome traces of every rank's collectives, and one command to merge them.

Set GRADSWITCH_TIMELINE=path.json before the workers start. Each rank writes its own file ("{rank}"
in the path is replaced by the rank, otherwise ".rank<r>" goes before the extension) with, per
allreduce, the wait in the queue, the allreduce itself (seq, size, wire, algorithm, retransmissions,
status), the round trip to its first result, the stream of results, and each retransmission; the
torch backend adds its buckets, overlap chunks and backward passes. Then

    gradswitch timeline merge /tmp/tl.rank*.json -o /tmp/tl.json     # open in ui.perfetto.dev
    gradswitch timeline summary /tmp/tl.json                         # per rank, in words

Timestamps are microseconds since each file was opened; the merge places the ranks on one axis by
the wall clock each file recorded (otherData.wall_clock_ns), or, with --align results, by the ends of
the allreduces (every rank receives an allreduce's last result within microseconds), for hosts whose
clocks disagree.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV = "GRADSWITCH_TIMELINE"


def enabled() -> bool:
    """True when this process writes a timeline (GRADSWITCH_TIMELINE is set)."""
    return bool(os.environ.get(ENV))


def path_for(rank: int) -> str | None:
    """The file rank `rank` of this process writes (opened now if needed); None when off."""
    if not enabled():
        return None
    from gradswitch import _core

    return _core.timeline_path(rank) or None


def _args_text(args: dict[str, Any]) -> str:
    return json.dumps(args, separators=(",", ":"), default=str)[1:-1]


def span(
    rank: int, lane: str, name: str, begin_ns: int, end_ns: int, overlapping: bool = False, **args
) -> None:
    """Adds a span (time.monotonic_ns() values) to rank's timeline; nothing when off.

    `overlapping`: the lane's spans may overlap without nesting (buckets in flight together): they are
    written as async spans."""
    if not enabled():
        return
    from gradswitch import _core

    _core.timeline_span(rank, lane, name, int(begin_ns), int(end_ns), _args_text(args), overlapping)


@contextlib.contextmanager
def section(rank: int, lane: str, name: str, **args) -> Iterator[dict[str, Any]]:
    """A span around a block; the block may add to the yielded args."""
    begin = time.monotonic_ns()
    extra: dict[str, Any] = {}
    try:
        yield extra
    finally:
        span(rank, lane, name, begin, time.monotonic_ns(), **args, **extra)


def flush(rank: int) -> None:
    if enabled():
        from gradswitch import _core

        _core.timeline_flush(rank)


# ------------------------------------------------------------------------------------ reading
class TimelineError(ValueError):
    pass


def load(path: str | os.PathLike) -> dict[str, Any]:
    """A timeline file as a dict; a file cut short (the process was killed mid-write) is closed first."""
    text = Path(path).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    body = text.rstrip().rstrip(",")
    # the trailer "\n]}" may be missing or half written; cut back to the last complete event
    for end in (len(body), body.rfind("}\n,") + 1, body.rfind("},\n") + 1):
        if end <= 0:
            continue
        try:
            return json.loads(body[:end].rstrip().rstrip(",") + "\n]}")
        except json.JSONDecodeError:
            continue
    raise TimelineError(f"{path}: not a gradswitch timeline (neither JSON nor a cut-short timeline)")


def _wall_ns(doc: dict[str, Any], path: Any) -> int:
    try:
        return int(doc["otherData"]["wall_clock_ns"])
    except (KeyError, TypeError, ValueError):
        raise TimelineError(f"{path}: no otherData.wall_clock_ns (not written by gradswitch?)") from None


def spans(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every span of a trace, complete ("X") or async (a "b" and its "e"), as {pid, tid, name, ts, dur,
    args, id} (id None for "X"), in the order they begin."""
    out = []
    open_: dict[tuple, dict[str, Any]] = {}
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        if ph == "X":
            out.append({**e, "id": None})
        elif ph == "b":
            span = {**e, "dur": 0.0, "args": e.get("args", {})}
            open_.setdefault((e["pid"], e["tid"], e.get("id"), e["name"]), []).append(span)
            out.append(span)
        elif ph == "e":
            stack = open_.get((e["pid"], e["tid"], e.get("id"), e["name"]))
            if stack:
                span = stack.pop()
                span["dur"] = e["ts"] - span["ts"]
    for s in out:
        s.pop("ph", None)
    return sorted(out, key=lambda s: s["ts"])


def allreduce_ends(doc: dict[str, Any]) -> dict[tuple[Any, int], float]:
    """(lane name, seq) -> end time in µs of every allreduce that completed."""
    names = {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in doc["traceEvents"]
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    out = {}
    for s in spans(doc):
        a = s.get("args", {})
        if s["name"] == "allreduce" and "seq" in a and a.get("status") == "ok":
            out[(names.get((s["pid"], s["tid"])), a["seq"])] = s["ts"] + s["dur"]
    return out


def merge(paths: list[str | os.PathLike], align: str = "clock") -> dict[str, Any]:
    """One trace of several ranks' files. align: "clock" (the wall clocks the files recorded) or
    "results" (shift every file so that the ends of the allreduces they share line up)."""
    if align not in ("clock", "results"):
        raise ValueError(f"align must be 'clock' or 'results', got {align!r}")
    docs = [(str(p), load(p)) for p in paths]
    if not docs:
        raise TimelineError("nothing to merge")
    base = min(_wall_ns(d, p) for p, d in docs)
    shifts = [(_wall_ns(d, p) - base) / 1000.0 for p, d in docs]
    if align == "results" and len(docs) > 1:
        ref = allreduce_ends(docs[0][1])
        for i, (p, d) in enumerate(docs[1:], start=1):
            ends = allreduce_ends(d)
            common = [ref[k] - ends[k] for k in ends.keys() & ref.keys()]
            if not common:
                raise TimelineError(
                    f"{p}: no completed allreduce in common with {docs[0][0]}; use --align clock"
                )
            shifts[i] = shifts[0] + statistics.median(common)
    events: list[dict[str, Any]] = []
    used_pids: set[int] = set()
    for (_path, d), shift in zip(docs, shifts, strict=True):
        pids = {e["pid"] for e in d["traceEvents"] if "pid" in e}
        remap = {}
        for pid in sorted(pids):
            new = pid
            while new in used_pids:  # the same rank twice (two runs, two jobs): keep them apart
                new += 1000
            remap[pid] = new
        used_pids |= set(remap.values())
        for e in d["traceEvents"]:
            e = dict(e)
            if "pid" in e:
                e["pid"] = remap[e["pid"]]
            if e.get("ph") != "M" and "ts" in e:
                e["ts"] = round(e["ts"] + shift, 3)
            events.append(e)
    events.sort(key=lambda e: (e.get("ph") != "M", e.get("ts", 0)))
    return {
        "otherData": {
            "gradswitch_timeline": 1,
            "merged_from": [p for p, _ in docs],
            "align": align,
            "wall_clock_ns": base,
            "ranks": [d.get("otherData", {}) for _, d in docs],
        },
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }


def summary(doc: dict[str, Any]) -> list[str]:
    """Per process (rank): allreduces, their durations, the time to the first result, retransmissions."""
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    lines = []
    for pid in sorted(names):
        ar = [s for s in spans(doc) if s["pid"] == pid and s["name"] == "allreduce" and "status" in s["args"]]
        if not ar:
            lines.append(f"{names[pid]}: no allreduce")
            continue
        durs = sorted(e["dur"] for e in ar)
        failed = [e for e in ar if e["args"].get("status") != "ok"]
        first = [e["args"]["first_result_us"] for e in ar if e["args"].get("first_result_us", -1) >= 0]
        retx = sum(e["args"].get("retransmissions", 0) for e in ar)
        mb = sum(e["args"].get("bytes", 0) for e in ar) / 1e6
        lines.append(
            f"{names[pid]}: {len(ar)} allreduces ({mb:.1f} MB), {len(failed)} failed; duration median "
            f"{statistics.median(durs) / 1000:.3f} ms, max {durs[-1] / 1000:.3f} ms; first result after "
            f"{statistics.median(first) / 1000 if first else float('nan'):.3f} ms (median); "
            f"{retx} retransmissions"
        )
        for e in failed[:3]:
            lines.append(f"  seq {e['args'].get('seq', '?')} failed: {e['args'].get('status')}")
    return lines


# ------------------------------------------------------------------------------------ CLI
def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "timeline",
        help="merge or summarise worker timelines (GRADSWITCH_TIMELINE)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    cmds = p.add_subparsers(dest="timeline_command", metavar="{merge,summary}")
    cmds.required = True
    m = cmds.add_parser("merge", help="join the ranks' files into one Chrome trace")
    m.add_argument("files", nargs="+", help="timeline files (one per rank)")
    m.add_argument("-o", "--output", required=True, help="the merged trace (JSON)")
    m.add_argument(
        "--align",
        choices=("clock", "results"),
        default="clock",
        help="place ranks by their wall clocks (default) or by the ends of the allreduces they share",
    )
    m.set_defaults(func=_cmd_merge)
    s = cmds.add_parser("summary", help="per rank: allreduces, durations, retransmissions")
    s.add_argument("files", nargs="+", help="timeline files (per rank or merged)")
    s.set_defaults(func=_cmd_summary)


def _cmd_merge(args: argparse.Namespace) -> int:
    try:
        doc = merge(args.files, args.align)
    except (OSError, TimelineError) as e:
        print(f"gradswitch timeline merge: {e}", file=sys.stderr)
        return 1
    Path(args.output).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    n = sum(1 for e in doc["traceEvents"] if e.get("ph") != "M")
    print(f"{args.output}: {n} events of {len(args.files)} file(s) (align: {args.align})")
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    try:
        for path in args.files:
            for line in summary(load(path)):
                print(line)
    except (OSError, TimelineError, KeyError) as e:
        print(f"gradswitch timeline summary: {e}", file=sys.stderr)
        return 1
    return 0
