#!/bin/bash
# issue 38's MLP accuracy check on the testbed: float32, mx8, mx8+EF alternated over 2 rounds
cd "$(dirname "$0")/../../.."
mkdir -p "${OUT:-/tmp/mx8-accuracy}"
T="${PY:-python3} bench/torch_testbed.py --configs gs-ddp --iters 1000"
M="--task teacher --inputs 64 --classes 10 --width 1024 --batch 32 --warmup 0 --lr 0.1"
run() { echo "== round $1 $2 ($(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg))"
  flock /tmp/gradswitch-netns.lock $T --out ${OUT:-/tmp/mx8-accuracy}/$2-$1 -- $M $3 > ${OUT:-/tmp/mx8-accuracy}/$2-$1.txt 2>&1
  echo "rc $?"; grep "test accuracy\|^gs-ddp  " ${OUT:-/tmp/mx8-accuracy}/$2-$1.txt; }
for r in 1 2; do
  if [ $r = 1 ]; then order="float32 mx8 mx8-ef"; else order="mx8-ef mx8 float32"; fi
  for v in $order; do
    case $v in float32) o="--wire float32";; mx8) o="--wire mx8";; mx8-ef) o="--wire mx8 --error-feedback";; esac
    run $r $v "$o"
  done
done
