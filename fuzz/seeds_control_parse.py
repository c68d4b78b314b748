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
    b"STATS job_id=257\n",
]


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for i, s in enumerate(SEEDS):
        (out / f"seed{i}").write_bytes(s)


if __name__ == "__main__":
    main()
