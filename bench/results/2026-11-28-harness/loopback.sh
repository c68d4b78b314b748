#!/bin/bash
# Loopback, side by side: the whole pool, the adaptive window (the default) before and with the rules
# for ranks that run ahead; 4 ranks, 16 MB, without loss and with 1% and 10% injected loss.
# Usage: BEFORE=/path/to/build AHEAD=/path/to/build OUT=file.json loopback.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
args=()
for loss in 0 0.01 0.1; do
  drop=""; [ "$loss" != 0 ] && drop=" --drop-rate $loss"
  args+=(--config "pool-$loss=$AHEAD:GRADSWITCH_WINDOW=fixed:-n 4 --size 16M --iters 10$drop")
  args+=(--config "before-$loss=$BEFORE::-n 4 --size 16M --iters 10$drop")
  args+=(--config "ahead-$loss=$AHEAD::-n 4 --size 16M --iters 10$drop")
done
flock /tmp/gradswitch-bench.lock python3 "$here/bench/transport_bench.py" --rounds "${ROUNDS:-6}" "${args[@]}" --out "$OUT"
