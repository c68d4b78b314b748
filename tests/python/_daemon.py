"""The gradswitchd every test runs: $GRADSWITCHD if set, else the installed package's daemon.

A missing daemon is a broken build, not a reason to skip: the test fails and says what to do.
"""

from __future__ import annotations

import pytest

from gradswitch._paths import switch_binary


def daemon_binary() -> str:
    try:
        return switch_binary()
    except FileNotFoundError as e:
        pytest.fail(f"{e}: install the package (pip install .) or set GRADSWITCHD")
