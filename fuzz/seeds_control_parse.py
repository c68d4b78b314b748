"""Writes a seed corpus for fuzz_control_parse: valid and near-valid control-plane requests.

Usage: python3 fuzz/seeds_control_parse.py DIR
"""

import sys
from pathlib import Path

SEEDS = [
    b"JOIN job=train world=4 rank=0 wire=fixed32 token=abc port=9000\n",
    b"JOIN job=t world=65 rank=0 wire=float32 token=x port=1\r\n",
    b"STATUS job_id=0x101 slot=3 version=1\n",
    b"STATS\nJOBS\nPING\nLEAVE\n",
    b"LEAVE lost=127.0.0.1:7700\nLEAVE lost=[::1]:9\nLEAVE lost=a b\n",
    b"STATS job_id=257\n",
    b"JOIN job=t world=2 rank=1 wire=float32 token=x port=9 types=float64,int32\n",
    b"CHALLENGE\nAUTH tenant=alice cnonce=" + b"ab" * 16 + b" proof=" + b"0f" * 32 + b"\n",
    b"ABORT job_id=0x12345678\n",
]


def write(seeds: list[bytes]) -> None:
    """Writes `seeds` as files seed0, seed1, ... into the directory argv[1] (the other control seeds too)."""
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(seeds):
        (out / f"seed{i}").write_bytes(s)


if __name__ == "__main__":
    write(SEEDS)
