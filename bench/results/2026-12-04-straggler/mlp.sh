#!/bin/bash
# issue 39's MLP accuracy check (torch_iteration.py --task teacher, as 2026-12-03-mx8-accuracy/mlp.sh):
# exact mode without a straggler against concessions with rank 3's uplink at 1/10, 1000 steps each.
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-04-straggler/mlp
mkdir -p $OUT
T="${PY:-python3} bench/torch_testbed.py --iters 1000"
M="--task teacher --inputs 64 --classes 10 --width 1024 --batch 32 --warmup 0 --lr 0.1"
D="--deadline-us 100000 --quorum 3"
run() { echo "== $1 ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  flock /tmp/gradswitch-netns.lock $T --out /tmp/mlp-$1 "${@:2}" > $OUT/$1.txt 2>&1; echo "rc $?"
  grep -h "test accuracy\|^gs-" $OUT/$1.txt | head -4; cp /tmp/mlp-$1/rank0.json $OUT/$1.json; }
run exact --configs gs-ddp -- $M
run concede-slow-uplink --configs gs-concede-ddp --slow-uplink 3 -- $M $D
run exact-slow-uplink --configs gs-ddp --slow-uplink 3 --iters 100 -- $M
# the same at 1500 steps: how far the conceding job gets in a fifth of exact mode's time with the straggler
T="${T/--iters 1000/--iters 1500}"
run exact-1500 --configs gs-ddp -- $M
run concede-slow-uplink-1500 --configs gs-concede-ddp --slow-uplink 3 -- $M $D
