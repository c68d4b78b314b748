#!/bin/bash
# issue 39's accuracy check with a bandwidth straggler: examples/train_ddp.py (digits) on the testbed,
# rank 3's uplink at 1/10 of 1 Gbit/s, concessions on, against exact mode without a straggler.
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-12-04-straggler/digits
T="${PY:-python3} bench/torch_testbed.py --digits gradswitch --repeat 2 --epochs 10"
run() { echo "== $1 ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  flock /tmp/gradswitch-netns.lock $T --out /tmp/digits-$1 "${@:2}" > $OUT/$1.txt 2>&1; echo "rc $?"
  grep -h 'time to\|accuracy' $OUT/$1.txt | tail -2
  for f in /tmp/digits-$1/digits-*/rank0.json; do cp "$f" "$OUT/$1-$(basename "$(dirname "$f")").json"; done; }
run exact
run exact-slow-uplink --slow-uplink 3
run concede -- --deadline-us 20000 --quorum 3 --concede
run concede-slow-uplink --slow-uplink 3 -- --deadline-us 20000 --quorum 3 --concede
# the same given 15 epochs: time to 95% (the straggler's rounds are cheaper, its contributions fewer)
T="${T/--epochs 10/--epochs 15}"
run concede-slow-uplink-15 --slow-uplink 3 -- --deadline-us 20000 --quorum 3 --concede
