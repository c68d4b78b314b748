#!/bin/bash
# A/B: kernel receive timestamps for the adaptive window's delay samples, alternated launches.
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/ab-rxts}; mkdir -p $OUT
for r in ${ROUNDS:-1 2 3 4 5 6 7}; do
  for v in 0 1; do
    [ $((r % 2)) -eq 0 ] && v=$((1 - v))
    D=$OUT/r$r-ts$v; rm -rf $D
    GRADSWITCH_RX_TIMESTAMPS=$v flock /tmp/gradswitch-netns.lock nice python3 bench/torch_testbed.py --workers 4 --rate 1gbit --configs gs-overlap:256,gs-ddp --iters 4 --stats --out $D > $D.log 2>&1
    echo "r$r ts=$v $(grep -E '^(gs-overlap:256|gs-ddp) +iteration' $D.log | awk '{print $1, $3}' | tr '\n' ' ') cuts=$(grep -o '"window_delay_cuts": [0-9]*' $D.log | awk '{s+=$2} END {print s}') load=$(cut -d' ' -f1 /proc/loadavg)"
  done
done
