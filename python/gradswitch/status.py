"""`gradswitch status` and `gradswitch top`: what a running switch is doing, from its control plane.

    gradswitch status [--switch host:port] [JOB]     jobs, ranks and their addresses, per-rank highest seq,
                                                    open rounds and who has not contributed to the oldest,
                                                    counters, and a diagnosis in words
    gradswitch top [--switch host:port] [-i 1] [-n COUNT]   live per-job rates, refreshed (like top)

    gradswitch metrics-token                         the bearer token of the switch's /metrics for
                                                    $GRADSWITCH_TENANT (for Prometheus' credentials_file)

JOB is a job's name or id (default: every job). The switch answers STATUS, STATS and JOBS
(docs/protocol.md section 1.2). On a switch with tenants (--auth-file) an operator sees every job and
the switch's totals, a tenant its own jobs and their sums (docs/security.md): the name comes from
GRADSWITCH_TENANT, the secret from GRADSWITCH_SECRET or GRADSWITCH_SECRET_FILE.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

DEFAULT_SWITCH = "127.0.0.1:7700"
# A round open this long is worth a word in the diagnosis: far above any round trip, well below the
# workers' default timeout (30 s).
STALL_MS = 1000


class StatusError(RuntimeError):
    pass


# ------------------------------------------------------------------------------------ talking
class Session:
    """One control connection for a series of requests (authenticated when credentials are set)."""

    def __init__(self, address: str, timeout: float = 5.0):
        from gradswitch import control

        self.address = address
        if not address.rpartition(":")[2].isdigit():
            raise StatusError(f"--switch {address!r} is not host:port")
        try:
            self._conn = control.ControlConnection(
                address, timeout=timeout, credentials=control.credentials()
            )
        except OSError as e:
            raise StatusError(f"cannot reach the switch at {address}: {e.strerror or e}") from None
        except (ValueError, control.ControlError) as e:
            raise StatusError(str(e)) from None

    def close(self) -> None:
        self._conn.close()

    @property
    def scope(self) -> str:
        """Whose jobs and counters the switch shows this session: "switch" (an operator's, or any
        connection without --auth-file), else "tenant '<name>'" (its own only, docs/security.md)."""
        if self._conn.role in (None, "operator"):
            return "switch"
        from gradswitch import control

        return f"tenant {control.credentials()[0]!r}"

    def kv(self, line: str) -> dict[str, str]:
        from gradswitch import control

        try:
            reply = self._conn.request(line)
        except OSError as e:
            raise StatusError(f"the switch at {self.address} did not answer {line.split()[0]}: {e}") from None
        except control.ControlError as e:
            raise StatusError(str(e)) from None
        if not reply.startswith("OK"):
            raise StatusError(f"{line.split()[0]}: {reply}")
        return dict(tok.split("=", 1) for tok in reply.split()[1:] if "=" in tok)


def counters(kv: dict[str, str]) -> dict[str, int]:
    return {k: int(v) for k, v in kv.items() if v.lstrip("-").isdigit()}


def ranks(text: str) -> list[int]:
    return [int(r) for r in text.split(",") if r != ""]


@dataclass
class Job:
    job_id: int
    name: str
    world: int
    state: str
    status: dict[str, str] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)


def list_jobs(s: Session) -> list[Job]:
    out = []
    for entry in filter(None, s.kv("JOBS").get("jobs", "").split(",")):
        job_id, rest = entry.split(":", 1)
        name, world, state = rest.rsplit(":", 2)
        out.append(Job(int(job_id), name, int(world), state))
    return out


def select(jobs: list[Job], which: str | None) -> list[Job]:
    if which is None:
        return jobs
    picked = [j for j in jobs if j.name == which or str(j.job_id) == which or j.name.endswith("/" + which)]
    if not picked:
        names = ", ".join(f"{j.name} ({j.job_id})" for j in jobs) or "none"
        raise StatusError(f"no job {which!r} at the switch (jobs: {names})")
    return picked


def fetch(s: Session, job: Job) -> Job:
    if job.state != "joining":
        job.status = s.kv(f"STATUS job_id={job.job_id}")
        job.stats = counters(s.kv(f"STATS job_id={job.job_id}"))
    return job


# ------------------------------------------------------------------------------------ status
def diagnose(job: Job) -> list[str]:
    """What is wrong with a job, in words (empty when nothing is)."""
    st = job.status
    if job.state == "joining":
        return ["waiting for its ranks to join (JOIN replies are held until every rank has joined)"]
    out = []
    if st.get("state") == "aborted":
        rank = st.get("abort_rank", "-")
        why = f"aborted: {st.get('abort_reason')}" + (f" (rank {rank})" if rank != "-" else "")
        if st.get("abort_reason") == "mismatch":
            r = st.get("mismatch_ranks", "?,?").split(",")
            c = st.get("mismatch_counts", "?,?").split(",")
            why += (
                f"; allreduce seq {st.get('mismatch_seq')} offset {st.get('mismatch_offset')}: "
                f"rank {r[0]} sent "
                f"{c[0]} elements, rank {r[-1]} {c[-1]} (the ranks' tensors or calls differ)"
            )
        if st.get("lost"):
            lost = st["lost"]
            why += f"; rank {rank} left because it lost the switch at {lost} (another switch of the job)"
        out.append(why)
    seqs = [int(x) for x in st.get("rank_seq", "").split(",") if x]
    left = set(ranks(st.get("left", "")))
    peers = st.get("peers", "").split(",") if st.get("peers") else []

    def who(r: int) -> str:
        return f"rank {r}" + (f" ({peers[r]})" if r < len(peers) else "")

    open_rounds = int(st.get("open_rounds", "0") or 0)
    age = int(st.get("oldest_age_ms", "0") or 0)
    if open_rounds and "oldest_seen" in st and st.get("state") != "aborted":
        seen = set(ranks(st["oldest_seen"]))
        missing = [r for r in range(job.world) if r not in seen]
        if age >= STALL_MS:
            names = ", ".join(who(r) for r in missing) or "no rank"
            detail = []
            for r in missing:
                if r < len(seqs):
                    last = seqs[r]
                    detail.append(
                        f"rank {r} last sent allreduce seq {last}"
                        if last >= 0
                        else f"rank {r} sent nothing yet"
                    )
                if r in left:
                    detail.append(f"rank {r} left the job (LEAVE)")
            out.append(
                f"stalled: slot {st.get('oldest_slot')} (allreduce seq {st.get('oldest_seq')}, offset "
                f"{st.get('oldest_offset')}) has waited {age / 1000:.1f} s for {names}"
                + (f"; {'; '.join(detail)}" if detail else "")
                + f" ({open_rounds} round(s) open)"
            )
    if seqs and min(seqs) >= -1 and st.get("state") != "aborted":
        hi, lo = max(seqs), min(seqs)
        if hi - lo >= 2:
            slow = [r for r, q in enumerate(seqs) if q == lo]
            out.append(
                f"rank(s) {', '.join(map(str, slow))} behind: at allreduce seq {lo} while others reached {hi}"
            )
    idle = int(st.get("idle_ms", "0") or 0)
    if not out and idle >= 60_000:
        out.append(f"idle for {idle / 1000:.0f} s (no packet or request)")
    return out


def drop_reasons(counters: dict[str, int]) -> list[str]:
    """The "  drops: reason n, ..." line of the nonzero drop.<reason> counters (none when all are 0)."""
    drops = {k[5:]: v for k, v in counters.items() if k.startswith("drop.") and v}
    return ["  drops: " + ", ".join(f"{k} {v}" for k, v in sorted(drops.items()))] if drops else []


def render_status(total: dict[str, int], jobs: list[Job], scope: str = "switch") -> str:
    started = f", {total['jobs_started']} started" if "jobs_started" in total else ""
    lines = [
        f"{scope}: {total.get('jobs', 0)} running job(s), {total.get('joining', 0)} joining{started}; "
        f"packets in {total.get('pkts_in', 0)}, out "
        f"{total.get('pkts_out', 0)}, rounds {total.get('completed', 0)}, retransmissions answered "
        f"{total.get('retx_answered', 0)}, drops {total.get('drops', 0)}"
    ]
    lines.extend(drop_reasons(total))
    for j in jobs:
        st = j.status
        lines.append("")
        lines.append(f"job {j.name!r} (id {j.job_id}): {st.get('state', j.state)}, world {j.world}")
        if j.state == "joining":
            lines.extend("  " + d for d in diagnose(j))
            continue
        peers = st.get("peers", "").split(",") if st.get("peers") else []
        seqs = st.get("rank_seq", "").split(",")
        left = set(ranks(st.get("left", "")))
        lines.append(f"  {'rank':>4}  {'address':21}  {'highest seq':>11}")
        for r in range(j.world):
            addr = peers[r] if r < len(peers) else "-"
            seq = seqs[r] if r < len(seqs) and seqs[r] != "-1" else "-"
            lines.append(f"  {r:>4}  {addr:21}  {seq:>11}" + ("  left" if r in left else ""))
        lines.append(
            f"  idle {int(st.get('idle_ms', 0)) / 1000:.1f} s; open rounds {st.get('open_rounds', '?')}"
            + (
                f"; oldest: slot {st['oldest_slot']} v{st.get('oldest_version')} seq {st.get('oldest_seq')} "
                f"offset {st.get('oldest_offset')}, open {int(st.get('oldest_age_ms', 0)) / 1000:.1f} s, "
                f"contributed: {st.get('oldest_seen') or 'nobody'}"
                if st.get("oldest_slot")
                else ""
            )
        )
        c = j.stats
        lines.append(
            f"  packets in {c.get('pkts_in', 0)}, out {c.get('pkts_out', 0)}; "
            f"rounds {c.get('completed', 0)}; "
            f"retransmissions answered {c.get('retx_answered', 0)}; duplicates {c.get('duplicates', 0)}; "
            f"drops {c.get('drops', 0)}"
        )
        lines.extend(drop_reasons(c))
        problems = diagnose(j)
        lines.extend(("  ! " + p) for p in problems)
        if not problems:
            lines.append("  ok")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    try:
        s = Session(args.switch, args.timeout)
        try:
            scope = s.scope
            total = counters(s.kv("STATS"))
            jobs = []
            for j in select(list_jobs(s), args.job):
                try:
                    jobs.append(fetch(s, j))
                except StatusError:  # it ended between JOBS and STATUS
                    continue
        finally:
            s.close()
    except StatusError as e:
        print(f"gradswitch status: {e}", file=sys.stderr)
        return 1
    print(render_status(total, jobs, scope))
    return 0


# ------------------------------------------------------------------------------------ top
RATE_KEYS = (
    ("pkts_in", "pkt/s in"),
    ("pkts_out", "pkt/s out"),
    ("completed", "rounds/s"),
    ("retx_answered", "retx/s"),
    ("drops", "drops/s"),
)


def rates(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    out = {k: (after.get(k, 0) - before.get(k, 0)) / seconds for k, _ in RATE_KEYS}
    out["gbit_in"] = (after.get("bytes_in", 0) - before.get("bytes_in", 0)) * 8 / seconds / 1e9
    return out


def render_top(
    when: str, total: dict[str, float], per_job: list[tuple[Job, dict[str, float]]], scope: str = "switch"
) -> str:
    head = f"{'job':24} {'id':>10} {'state':8} " + " ".join(f"{label:>11}" for _, label in RATE_KEYS)
    head += f" {'Gbit/s in':>9} {'stall s':>7}"
    lines = [f"gradswitch top  {when}", head]

    def row(name: str, jid: str, state: str, r: dict[str, float], stall: str) -> str:
        return (
            f"{name[:24]:24} {jid:>10} {state:8} "
            + " ".join(f"{r[k]:11.0f}" for k, _ in RATE_KEYS)
            + f" {r['gbit_in']:9.3f} {stall:>7}"
        )

    lines.append(row("(switch)" if scope == "switch" else "(your jobs)", "-", "-", total, "-"))
    for j, r in per_job:
        age = int(j.status.get("oldest_age_ms", "0") or 0)
        lines.append(
            row(j.name, str(j.job_id), j.status.get("state", j.state), r, f"{age / 1000:.1f}" if age else "0")
        )
    return "\n".join(lines)


def cmd_top(args: argparse.Namespace) -> int:
    tty = sys.stdout.isatty()
    try:
        s = Session(args.switch, args.timeout)
    except StatusError as e:
        print(f"gradswitch top: {e}", file=sys.stderr)
        return 1
    try:
        prev_total, prev_jobs, prev_t = counters(s.kv("STATS")), {}, time.monotonic()
        for j in list_jobs(s):
            if j.state != "joining":
                prev_jobs[j.job_id] = counters(s.kv(f"STATS job_id={j.job_id}"))
        n = 0
        while args.count is None or n < args.count:
            time.sleep(args.interval)
            now = time.monotonic()
            total = counters(s.kv("STATS"))
            jobs = []
            for j in select(list_jobs(s), args.job) if args.job else list_jobs(s):
                try:
                    jobs.append(fetch(s, j))
                except StatusError:  # ended between JOBS and STATUS
                    continue
            dt = now - prev_t
            per_job = [(j, rates(prev_jobs.get(j.job_id, j.stats), j.stats, dt)) for j in jobs]
            frame = render_top(time.strftime("%H:%M:%S"), rates(prev_total, total, dt), per_job, s.scope)
            print(("\x1b[H\x1b[2J" if tty else "") + frame + ("" if tty else "\n"), flush=True)
            prev_total, prev_t = total, now
            prev_jobs = {j.job_id: j.stats for j in jobs}
            n += 1
    except StatusError as e:
        print(f"gradswitch top: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        s.close()
    return 0


# ------------------------------------------------------------------------------------ metrics-token
def cmd_metrics_token(args: argparse.Namespace) -> int:
    """Prints the /metrics bearer token of $GRADSWITCH_TENANT (its secret from the environment, never
    an argument): what Prometheus' `authorization: {credentials_file: ...}` holds."""
    from gradswitch import control

    try:
        creds = control.credentials()
    except ValueError as e:
        print(f"gradswitch metrics-token: {e}", file=sys.stderr)
        return 1
    if creds is None:
        print(
            f"gradswitch metrics-token: set ${control.ENV_TENANT} and ${control.ENV_SECRET_FILE} (or "
            f"${control.ENV_SECRET}) to the auth-file entry whose token you want",
            file=sys.stderr,
        )
        return 1
    print(control.metrics_token(*creds))
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    env_switch = os.environ.get("GRADSWITCH_SWITCH", DEFAULT_SWITCH)
    for name, func, helptext in (
        ("status", cmd_status, "jobs, ranks, open rounds and counters of a running switch, diagnosed"),
        ("top", cmd_top, "live per-job rates of a running switch, refreshed"),
    ):
        p = sub.add_parser(
            name, help=helptext, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        p.add_argument("job", nargs="?", help="a job's name or id (default: every job)")
        p.add_argument(
            "--switch",
            default=env_switch,
            help=f"control address (default {env_switch}, or $GRADSWITCH_SWITCH)",
        )
        p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each reply")
        if name == "top":
            p.add_argument("-i", "--interval", type=float, default=1.0, help="seconds between refreshes")
            p.add_argument(
                "-n",
                "--count",
                type=int,
                default=None,
                help="refreshes before exiting (default: until Ctrl-C)",
            )
        p.set_defaults(func=func)
    p = sub.add_parser(
        "metrics-token",
        help="the bearer token of the switch's /metrics for $GRADSWITCH_TENANT (Prometheus credentials_file)",
        description=cmd_metrics_token.__doc__,
    )
    p.set_defaults(func=cmd_metrics_token)
