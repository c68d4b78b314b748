"""Seed corpus for fuzz_control_metrics_http: requests a scraper, a browser and a confused client send."""

import sys
from pathlib import Path

SEEDS = [
    b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:9100\r\nAccept: text/plain;version=0.0.4\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"HEAD /metrics HTTP/1.1\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /metrics?name[]=x HTTP/1.1\r\n\r\n",
    b"GET /nothing HTTP/1.1\r\n\r\n",
    b"GET\r\n\r\n",
    b"\r\n\r\n",
]

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
for i, seed in enumerate(SEEDS):
    (out / f"seed{i}").write_bytes(seed)
