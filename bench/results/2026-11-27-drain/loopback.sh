#!/bin/bash
# Loopback, side by side: the whole pool (default), the adaptive window (1 ms target) before the drains
# and with them; 4 ranks, 16 MB, without loss and with 1% and 10% injected loss.
# Usage: BEFORE=/path/to/build DRAIN=/path/to/build OUT=file.json loopback.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
A="GRADSWITCH_WINDOW=adaptive,GRADSWITCH_TARGET_DELAY_US=1000"
args=()
for loss in 0 0.01 0.1; do
  drop=""; [ "$loss" != 0 ] && drop=" --drop-rate $loss"
  args+=(--config "pool-$loss=$DRAIN::-n 4 --size 16M --iters 10$drop")
  args+=(--config "adaptive-before-$loss=$BEFORE:$A:-n 4 --size 16M --iters 10$drop")
  args+=(--config "adaptive-drain-$loss=$DRAIN:$A:-n 4 --size 16M --iters 10$drop")
done
flock /tmp/gradswitch-bench.lock python3 "$here/bench/transport_bench.py" --rounds "${ROUNDS:-6}" "${args[@]}" --out "$OUT"
