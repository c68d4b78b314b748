#!/bin/bash
# Offloads off (loss 1e-06) on the lossless testbed (N = 4, 1 Gbit/s): the controller before flow
# scaling (BEFORE) beside it (BUILD), a window of 64 and (16, 64 MB) the pool.
# Usage: BEFORE=<dir> BUILD=<dir> OUT=file.jsonl offloads-off.sh
set -u
here=$(cd "$(dirname "$0")/../../.." && pwd)
B=${BUILD:?}; P=${BEFORE:?}
for sz in 1M 4M 16M 64M; do
  it=20 rounds="1 2 3 4"; [ $sz = 16M ] && it=10 rounds="1 2 3"; [ $sz = 64M ] && it=5 rounds="1 2 3"
  c="w64-$sz:$B:GRADSWITCH_WINDOW=64:--nbytes,$sz before-$sz:$P::--nbytes,$sz adaptive-$sz:$B::--nbytes,$sz"
  case $sz in 16M|64M) c="w64-$sz:$B:GRADSWITCH_WINDOW=64:--nbytes,$sz pool-$sz:$B:GRADSWITCH_WINDOW=fixed:--nbytes,$sz before-$sz:$P::--nbytes,$sz adaptive-$sz:$B::--nbytes,$sz" ;; esac
  CONFIGS="$c" LOSSES="1e-06" ROUNDS="$rounds" ITERS=$it flock /tmp/gradswitch-bench.lock \
    bash "$here/bench/results/2026-11-27-transport/testbed-configs.sh"
done
