"""Shared fixtures: a local switch factory, and the skip-or-fail rule for privileged tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def switch_factory(tmp_path):
    """switch_factory(threads=1, slots=None, mtu=None, drop_rate=0.0, extra_args=None) -> LocalSwitch.

    Every switch started through it is stopped at the end of the test; its log is printed when
    the test fails (pytest shows captured output).
    """
    from gradswitch.local_switch import LocalSwitch

    started: list[LocalSwitch] = []

    def make(**kwargs) -> LocalSwitch:
        sw = LocalSwitch(log_path=tmp_path / f"switch{len(started)}.log", **kwargs)
        sw.start()
        started.append(sw)
        return sw

    yield make
    for sw in started:
        sw.stop()
        print(f"--- gradswitchd log ({sw.command()}) ---\n{sw.log()[-4000:]}")


@pytest.fixture
def switch(switch_factory):
    return switch_factory()


@pytest.fixture
def start_switch(switch_factory):
    """start_switch(**LocalSwitch options) -> a switch with 2 data threads unless told otherwise, run by
    the daemon under test ($GRADSWITCHD or the installed package's, tests/python/_daemon.py)."""
    from _daemon import daemon_binary

    binary = daemon_binary()

    def make(**kwargs):
        kwargs.setdefault("threads", 2)
        return switch_factory(binary=binary, **kwargs)

    return make


def require_or_skip(variable: str, reason: str) -> None:
    """Skips with `reason`, or fails when CI set GRADSWITCH_REQUIRE_<variable>=1."""
    if os.environ.get(f"GRADSWITCH_REQUIRE_{variable}") == "1":
        pytest.fail(f"{reason} (GRADSWITCH_REQUIRE_{variable}=1 forbids skipping)")
    pytest.skip(reason)
