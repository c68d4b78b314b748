#!/bin/bash
# Session 12, one window per job beside main, on what hold-checks.sh runs too briefly for this hour's
# noise: loopback without loss (10 rounds), the testbed's loss (10 allreduces, 4 rounds), offloads off
# at 1, 16 and 64 MB beside fixed windows, and 2 jobs of 4 ranks at the shared switch link.
# Usage: BEFORE=<pip --target dir of main> AFTER=<... with the change> DIR=<output folder> more-checks.sh
set -u
here=$(cd "$(dirname "$0")/../../.." && pwd)
res=$here/bench/results
B=${BEFORE:?}; A=${AFTER:?}; D=${DIR:?}
lock() { flock /tmp/gradswitch-bench.lock "$@"; }
conf=(--config "pool=$A:GRADSWITCH_WINDOW=fixed:-n 4 --size 16M --iters 10"
      --config "main=$B::-n 4 --size 16M --iters 10" --config "onewindow=$A::-n 4 --size 16M --iters 10")
lock python3 "$here/bench/transport_bench.py" --rounds 10 "${conf[@]}" --out "$D/loopback-noloss.json"
OUT=$D/loss.jsonl CONFIGS="main:$B: onewindow:$A:" LOSSES="0.1 0.01 1e-06" ROUNDS="1 2 3 4" ITERS=10 \
  lock bash "$res/2026-11-27-transport/testbed-configs.sh"
for sz in 1M 16M 64M; do
  it=20; rounds="1 2 3 4"; [ $sz = 16M ] && rounds="1 2 3 4 5 6"; [ $sz = 64M ] && it=5 && rounds="1 2 3"
  OUT=$D/off-sizes.jsonl LOSSES="1e-06" ROUNDS="$rounds" ITERS=$it \
    CONFIGS="w64-$sz:$B:GRADSWITCH_WINDOW=64:--nbytes,$sz w96-$sz:$B:GRADSWITCH_WINDOW=96:--nbytes,$sz main-$sz:$B::--nbytes,$sz onewindow-$sz:$A::--nbytes,$sz" \
    lock bash "$res/2026-11-27-transport/testbed-configs.sh"
done
for rep in 1 2; do
  for stagger in 0 2; do
    for c in main:$B onewindow:$A; do
      PYTHONPATH=${c#*:} lock python3 "$here/bench/testbed_fairness.py" --jobs 2 --ranks 4 --window adaptive \
        --rounds 1 --stagger-s $stagger --out >(sed -u "s/^{/{\"config\": \"${c%%:*}\", /" >>"$D/fair4.jsonl") \
        2>&1 >/dev/null | grep '^round' >&2
    done
  done
done
