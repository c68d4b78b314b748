"""SIGHUP re-reads the auth file (issue 36 item 1, docs/security.md "Changing the auth file"): end to end
with a real gradswitchd. A tenant added to the file can AUTH and JOIN; a removed one can AUTH no more, its
idle authenticated connection is closed and its running job goes on; a new secret replaces the old one; a
bad, missing or unreadable new file is refused with a log line naming the file (and the line), while a
job runs: the job's allreduces still sum exactly and the tenants in force still work. Every reload and
refusal is counted in the operator's STATS and in the metrics.
"""

from __future__ import annotations

import re
import secrets
import signal
import threading

import pytest
from test_switch_daemon import Daemon, Job, parse_ok, wait_for
from test_tenancy import SECRETS, TenantJob, as_tenant, auth_line, one_round
from test_tenancy_metrics import MeteredDaemon, http_get, token


def auth_text(tenants: dict[str, str], operator: bool = True) -> str:
    lines = [f"tenant {name} secret={secret}" for name, secret in tenants.items()]
    if operator:
        lines.append(f"operator ops secret={SECRETS['ops']}")
    return "# tenants of the reload tests\n" + "\n".join(lines) + "\n"


def auth_reply(client, tenant: str, secret: str) -> str:
    """The AUTH reply line (OK ... or ERR ...) for `secret`, which need not be the tenant's."""
    nonce = parse_ok(client.request("CHALLENGE"))["nonce"]
    return client.request(auth_line(tenant, secret, nonce, secrets.token_hex(16)))


def operator_stats(d) -> dict[str, str]:
    with as_tenant(d, "ops") as op:
        return parse_ok(op.request("STATS"))


def hangup(d, reloads: int = 0, failures: int = 0) -> None:
    """SIGHUP, then wait until the operator's STATS counts the reload or its refusal."""
    d.proc.send_signal(signal.SIGHUP)
    wait_for(
        lambda: (
            (s := operator_stats(d))["auth_reloads"] == str(reloads)
            and s["auth_reload_failures"] == str(failures)
        ),
        f"{reloads} reloads and {failures} refused",
    )
    assert d.proc.poll() is None, "SIGHUP stopped the switch"


@pytest.fixture
def reloadable(tmp_path):
    path = tmp_path / "auth"
    path.write_text(auth_text({"alice": SECRETS["alice"], "bob": SECRETS["bob"]}))
    path.chmod(0o600)
    d = MeteredDaemon(tmp_path, "--auth-file", str(path), "--join-timeout", "5")
    d.auth_path = path
    yield d
    rc = d.stop()
    print(f"--- gradswitchd log ---\n{d.log()[-4000:]}")
    assert rc == 0, f"gradswitchd exited {rc}"


def rewrite(d, text: str) -> None:
    d.auth_path.write_text(text)
    d.auth_path.chmod(0o600)


def test_a_tenant_added_to_the_file_can_join_after_sighup(reloadable):
    d = reloadable
    with d.connect() as c:  # not yet in the file
        assert auth_reply(c, "carol", SECRETS["carol"]).startswith("ERR auth ")
    assert operator_stats(d)["auth_reloads"] == "0"
    rewrite(d, auth_text({"alice": SECRETS["alice"], "bob": SECRETS["bob"], "carol": SECRETS["carol"]}))
    hangup(d, reloads=1)
    one_round(d, "carol", "new")
    status, _, _ = http_get(d.metrics_port, f"Authorization: Bearer {token('carol')}\r\n")
    assert status == 200  # the new tenant's metrics token works too
    log = d.log()
    assert re.search(r"auth file .*auth read again: 4 tenants and operators \(1 added, 0 removed", log), log


def test_a_removed_tenant_cannot_auth_and_its_running_job_goes_on(reloadable):
    d = reloadable
    job = TenantJob(d, "bob", "long")
    job.allreduce_round(slot=0, seq=0)
    idle = as_tenant(d, "bob")  # authenticated, outside a job
    rewrite(d, auth_text({"alice": SECRETS["alice"]}))
    hangup(d, reloads=1)
    with d.connect() as c:
        assert auth_reply(c, "bob", SECRETS["bob"]).startswith("ERR auth authentication failed")
    # Its idle connection is told why and closed: it could otherwise still JOIN.
    assert idle.readline() == (
        "ERR auth 'bob' is no longer in the auth file (read again on SIGHUP): authenticate again; "
        "closing the connection"
    )
    with pytest.raises(ConnectionError):
        idle.readline(timeout=2)
    # The running job was admitted under the old file: it goes on, exact sums and all.
    for seq in range(1, 4):
        job.allreduce_round(slot=seq % 2, seq=seq)
    assert parse_ok(job.ctl[0].request("STATUS"))["state"] == "running"
    status, _, _ = http_get(d.metrics_port, f"Authorization: Bearer {token('bob')}\r\n")
    assert status == 401  # nor does its metrics token work
    job.close()
    # alice, still in the file, is unaffected.
    one_round(d, "alice", "after")


def test_a_new_secret_replaces_the_old_one(reloadable):
    d = reloadable
    new = secrets.token_hex(32)
    job = TenantJob(d, "alice", "steady")
    rewrite(d, auth_text({"alice": new, "bob": SECRETS["bob"]}))
    hangup(d, reloads=1)
    with d.connect() as c:
        assert auth_reply(c, "alice", SECRETS["alice"]).startswith("ERR auth ")
    with d.connect() as c:
        assert parse_ok(auth_reply(c, "alice", new))["tenant"] == "alice"
    job.allreduce_round(slot=0, seq=0)  # its ranks authenticated with the old secret, and stay
    job.close()


@pytest.mark.parametrize(
    "bad, mentions",
    [
        ("tenant alice secret=short\n", r"auth: line 1: the secret must be 16..256 characters"),
        (f"tenant alice secret={'a' * 32}\nbogus entry\n", r"auth: line 2: unknown entry 'bogus'"),
        (
            f"tenant alice secret={'a' * 32} max_jobs=100000\n",
            r"auth: line 1: max_jobs: .*at most --max-jobs",
        ),
        (f"tenant alice secret={'a' * 32} max_memory=lots\n", r"auth: line 1: max_memory: "),
        ("missing", r"auth: No such file or directory"),
        ("directory", r"auth: not a regular file"),
        ("group-readable", r"auth holds secrets but group or others may read it"),
    ],
    ids=["bad-secret", "syntax", "quota-over-limit", "bad-quota", "missing", "directory", "group-readable"],
)
def test_a_bad_new_auth_file_is_refused_and_the_running_job_is_unharmed(reloadable, bad, mentions):
    d = reloadable
    job = TenantJob(d, "alice", "train")
    job.allreduce_round(slot=0, seq=0)
    if bad == "missing":
        d.auth_path.unlink()
    elif bad == "directory":
        d.auth_path.unlink()
        d.auth_path.mkdir(mode=0o700)
    elif bad == "group-readable":
        d.auth_path.chmod(0o640)
    else:
        rewrite(d, bad)
    hangup(d, reloads=0, failures=1)
    refusal = [line for line in d.log().splitlines() if "SIGHUP: refused the new auth file" in line]
    assert len(refusal) == 1 and str(d.auth_path) in refusal[0], d.log()[-2000:]
    assert re.search(mentions, refusal[0]), refusal[0]
    assert "the tenants, secrets and quotas in force stay" in refusal[0]
    # The job is unharmed: every later allreduce sums exactly.
    for seq in range(1, 5):
        job.allreduce_round(slot=seq % 2, seq=seq)
    assert parse_ok(job.ctl[1].request("STATUS"))["state"] == "running"
    # The old table is in force: both old tenants authenticate and start jobs.
    one_round(d, "bob", "other")
    with d.connect() as c:
        assert auth_reply(c, "alice", SECRETS["alice"]).startswith("OK ")
    job.close()
    # Counted in the metrics, for the operator.
    status, _, body = http_get(d.metrics_port, f"Authorization: Bearer {token('ops')}\r\n")
    assert status == 200
    assert 'gradswitch_auth_reloads_total{result="refused"} 1' in body, body[-2000:]
    assert 'gradswitch_auth_reloads_total{result="ok"} 0' in body


def test_reloads_while_metrics_are_scraped_keep_every_tenant_its_own(reloadable):
    # The metrics endpoint's thread reads the table while the control thread replaces it: every scrape
    # with alice's token, before, during and after 20 reloads that drop and restore bob, shows her job
    # and never bob's, which runs on throughout (retired and restored with him).
    d = reloadable
    job, bobs = TenantJob(d, "alice", "steady"), TenantJob(d, "bob", "other")
    # alice first in one file and second in the other: a table indexed by file order would give her
    # index to bob, a scrape mixing two tables would show her his job.
    files = [
        auth_text({"bob": SECRETS["bob"], "alice": SECRETS["alice"]}),
        auth_text({"alice": SECRETS["alice"], "carol": SECRETS["carol"]}),
    ]
    stop, seen = threading.Event(), []

    def scrape() -> None:
        while not stop.is_set():
            status, _, body = http_get(d.metrics_port, f"Authorization: Bearer {token('alice')}\r\n")
            seen.append((status, "alice/steady" in body, "bob/" in body))

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for n in range(1, 21):
            rewrite(d, files[n % 2])
            hangup(d, reloads=n)
            job.allreduce_round(slot=n % 2, seq=n)
            bobs.allreduce_round(slot=n % 2, seq=n)
    finally:
        stop.set()
        scraper.join()
    assert len(seen) > 20 and set(seen) == {(200, True, False)}, set(seen)
    job.close()
    bobs.close()


def test_a_joining_job_of_a_removed_tenant_is_cancelled(reloadable):
    d = reloadable
    waiting = as_tenant(d, "bob")
    waiting.send("JOIN job=half world=2 rank=0 wire=int32 token=t port=9\n")  # waits for rank 1
    wait_for(lambda: operator_stats(d)["joining"] == "1", "bob's join")
    rewrite(d, auth_text({"alice": SECRETS["alice"]}))
    hangup(d, reloads=1)
    reply = waiting.readline()
    assert reply == (
        "ERR auth job 'bob/half' was joining when tenant 'bob' is no longer in the auth file "
        "(read again on SIGHUP)"
    ), reply
    # And the connection, now outside a job of a tenant that is gone, is closed as the idle ones are.
    assert waiting.readline().startswith("ERR auth 'bob' is no longer in the auth file")
    assert operator_stats(d)["joining"] == "0"
    waiting.close()


def test_sighup_without_an_auth_file_changes_nothing(tmp_path):
    d = Daemon(tmp_path, "--join-timeout", "5")
    try:
        job = Job(d, "plain")
        d.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "there is no auth file to read again" in d.log(), "the SIGHUP log line")
        job.allreduce_round(slot=0, seq=0)
        assert "auth_reloads" not in parse_ok(d.request("STATS"))  # the keys need an auth file
        job.close()
    finally:
        assert d.stop() == 0
