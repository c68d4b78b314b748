#!/bin/bash
# issue 39's accuracy check on digits (examples/train_ddp.py, 4 workers, 1 Gbit/s): exact
# mode without a straggler and with rank 3's uplink at 1/10 of 1 Gbit/s, and with that straggler
# conceding: alone, with error feedback (--error-feedback: what a sum lacked of a rank, less the
# rescaled sum's estimate, goes in its later steps) and with it unrescaled (--no-rescale: the whole
# of it waits). Four runs each.
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-06-straggler-feedback/digits
mkdir -p $OUT
T="${PY:-python3} bench/torch_testbed.py --digits gradswitch --repeat 4 --epochs 10"
D="--deadline-us 20000 --quorum 3 --concede"
run() { echo "== $1 ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  flock /tmp/gradswitch-netns.lock $T --out /tmp/digits-$1 "${@:2}" > $OUT/$1.txt 2>&1; echo "rc $?"
  grep -h 'time to\|accuracy' $OUT/$1.txt | tail -2
  for f in /tmp/digits-$1/digits-*/rank0.json; do cp "$f" "$OUT/$1-$(basename "$(dirname "$f")").json"; done; }
run exact
run exact-slow-uplink --slow-uplink 3
run concede-slow-uplink --slow-uplink 3 -- $D
run feedback-slow-uplink --slow-uplink 3 -- $D --error-feedback
run feedback-whole-slow-uplink --slow-uplink 3 -- $D --error-feedback --no-rescale
