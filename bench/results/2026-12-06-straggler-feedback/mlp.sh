#!/bin/bash
# issue 39's MLP accuracy check with error feedback (torch_iteration.py --task teacher, 1000 steps each,
# as 2026-12-03-mx8-accuracy/mlp.sh): exact mode without a straggler, and rank 3's uplink at 1/10 with
# concessions alone, with concessions and error feedback (Options(error_feedback=True): what a sum
# lacked of a rank, less the rescaled sum's estimate of it, goes in its later steps), and the same
# without rescaling (--no-rescale: the whole of it waits). Three rounds, the configurations alternated.
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-06-straggler-feedback/mlp
mkdir -p $OUT
T="${PY:-python3} bench/torch_testbed.py --iters ${ITERS:-1000}"
M="--task teacher --inputs 64 --classes 10 --width 1024 --batch 32 --warmup 0 --lr 0.1"
D="--deadline-us 100000 --quorum 3"
run() { echo "== $1 ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  flock /tmp/gradswitch-netns.lock $T --out /tmp/mlp-$1 "${@:2}" > $OUT/$1.txt 2>&1; echo "rc $?"
  grep -h "test accuracy\|^gs-" $OUT/$1.txt | cut -c1-100 | head -4; cp /tmp/mlp-$1/rank0.json $OUT/$1.json; }
for k in ${ROUNDS:-1 2 3}; do
  run exact-$k --configs gs-ddp -- $M
  run concede-$k --configs gs-concede-ddp --slow-uplink 3 -- $M $D
  run feedback-$k --configs gs-concede-ef-ddp --slow-uplink 3 -- $M $D
  run feedback-whole-$k --configs gs-concede-ef-ddp --slow-uplink 3 -- $M $D --no-rescale
done
# exact mode with the straggler, for its step time (100 steps)
run exact-slow-uplink --configs gs-ddp --slow-uplink 3 --iters 100 -- $M
