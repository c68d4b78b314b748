#!/bin/bash
# Lossless testbed (N = 4, 1 Gbit/s links, 16 MB unless named), offloads on (loss 0) and off (1e-06):
# fixed windows of 16 and 64 rounds, the pool (256), a pool of 1,024, and the adaptive window, at 1, 4,
# 16 and 64 MB, 3 rounds alternated. Usage: BUILD=<pip --target dir> OUT=file.jsonl sweep.sh
set -u
here=$(cd "$(dirname "$0")/../../.." && pwd)
B=${BUILD:?set BUILD to a pip install --target directory}
for sz in 1M 4M 16M 64M; do
  it=20; [ $sz = 16M ] && it=10; [ $sz = 64M ] && it=5
  c="w16-$sz:$B:GRADSWITCH_WINDOW=16:--nbytes,$sz w64-$sz:$B:GRADSWITCH_WINDOW=64:--nbytes,$sz"
  c="$c pool-$sz:$B:GRADSWITCH_WINDOW=fixed:--nbytes,$sz pool1024-$sz:$B:GRADSWITCH_WINDOW=fixed:--nbytes,$sz,--slots,1024"
  c="$c adaptive-$sz:$B::--nbytes,$sz"
  CONFIGS="$c" LOSSES="0 1e-06" ROUNDS="1 2 3" ITERS=$it flock /tmp/gradswitch-bench.lock \
    bash "$here/bench/results/2026-11-27-transport/testbed-configs.sh"
done
