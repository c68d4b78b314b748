"""The `gradswitch` command as a new user meets it: help texts, defaults, argument errors, sizes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gradswitch.bench import human_bytes


def gradswitch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gradswitch.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def test_switch_help_is_named_as_the_user_typed_it():
    r = gradswitch("switch", "--help")
    assert r.returncode == 0
    assert r.stdout.startswith("usage: gradswitch switch "), r.stdout[:80]
    r = gradswitch("switch", "--no-such-option")
    assert r.returncode == 2 and "Try 'gradswitch switch --help'" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["bench", "demo"])
def test_bench_help_shows_every_default(command):
    out = gradswitch(command, "--help").stdout
    for option, default in [("--iters", "10" if command == "bench" else "3"), ("--timeout", "30.0"),
                            ("--size", "16M" if command == "bench" else "64M"), ("--workers", "4")]:
        text = " ".join(out.split(option, 2)[-1].split("--", 1)[0].split())
        assert f"(default: {default})" in text, (option, text)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--size", "3"], "--size 3: not a whole number of float32 elements (4 bytes each)"),
        (["--size", "6", "--wire", "float64"], "float64 elements (8 bytes each)"),
        (["--size", "0"], "a whole number of bytes >= 1"),
        (["--size", "12Q"], "use a number of bytes"),
        (["--iters", "0"], "at least 1"),
        (["--workers", "65"], "must be in 1..64"),
        (["--drop-rate", "1"], "a fraction in [0, 0.99]"),
        (["--timeout", "0"], "more than 0 s"),
    ],
)
def test_bench_arguments_are_checked_before_anything_runs(args, words):
    r = gradswitch("bench", *args, timeout=30)
    assert r.returncode == 2 and words in r.stderr, r.stderr


def test_sizes_are_printed_in_readable_units():
    assert human_bytes(3) == "3 B"
    assert human_bytes(1000) == "1000 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(64 << 20) == "64 MiB"
    assert human_bytes(3 << 30) == "3 GiB"


def test_a_small_bench_runs_and_reports_its_elements():
    r = gradswitch("bench", "--size", "1000", "--workers", "2", "--iters", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 workers x 2 allreduces of 1000 B (250 elements), wire float32" in r.stdout, r.stdout
    assert "all results exact: OK" in r.stdout
