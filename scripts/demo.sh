#!/usr/bin/env bash
# The demo: installs gradswitch, starts a switch and 4 workers on loopback, sums a 64 MiB tensor,
# checks every element and prints the throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --minimal
echo "==> pip install . (builds gradswitchd and the worker library)"
python3 -m pip install -q --disable-pip-version-check --no-build-isolation .
exec gradswitch demo "$@"
