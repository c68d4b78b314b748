#!/bin/bash
# The hold rule (a rank that completed none of a round trip's rounds does not grow its window) beside
# main's adaptive window, on every target issue 17 names: testbed loss, offloads on, loopback, two and
# three jobs of two ranks, duplication and reordering. Usage:
#   BEFORE=<pip --target dir of main> HOLD=<... of main with the rule> DIR=<output folder> hold-checks.sh
# NAME (default hold) names the change in the configurations and the files (session 12: onewindow).
set -u
here=$(cd "$(dirname "$0")/../../.." && pwd)
res=$here/bench/results
B=${BEFORE:?}; H=${HOLD:?}; D=${DIR:?}; N=${NAME:-hold}
OUT=$D/$N-loss.jsonl CONFIGS="adaptive:$B: $N:$H:" LOSSES="0.1 0.01 1e-06" ROUNDS="1 2 3" ITERS=5 \
  flock /tmp/gradswitch-bench.lock bash "$res/2026-11-27-transport/testbed-configs.sh"
for sz in 1M 16M 64M; do
  it=20; [ $sz = 16M ] && it=10; [ $sz = 64M ] && it=5
  OUT=$D/$N-offloads-on.jsonl LOSSES="0" ROUNDS="1 2 3" ITERS=$it \
    CONFIGS="w64-$sz:$B:GRADSWITCH_WINDOW=64:--nbytes,$sz pool-$sz:$B:GRADSWITCH_WINDOW=fixed:--nbytes,$sz adaptive-$sz:$B::--nbytes,$sz $N-$sz:$H::--nbytes,$sz" \
    flock /tmp/gradswitch-bench.lock bash "$res/2026-11-27-transport/testbed-configs.sh"
done
BEFORE=$B AHEAD=$H OUT=$D/$N-loopback.json bash "$res/2026-11-28-harness/loopback.sh"
OUT=$D/$N-fairness.jsonl CONFIGS="adaptive:$B:adaptive $N:$H:adaptive" bash "$res/2026-11-28-harness/fairness.sh"
for b in "$B" "$H"; do
  BUILD=$b OUT=$D/$N-dup-reorder-$(basename "$b").jsonl flock /tmp/gradswitch-bench.lock \
    bash "$res/2026-11-27-drain/dup-reorder.sh" 2
done
