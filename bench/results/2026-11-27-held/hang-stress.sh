#!/bin/bash
# Session 7: the adaptive window's hang, side by side. Per round and build (alternated, order reversed
# every other round): `gradswitch bench` of 4 ranks x 20 allreduces of 4 MiB on loopback, adaptive
# window with a 50 us target (it keeps one rank's window at a few rounds), 10% injected loss on every
# send, 8 s without progress fails a rank. Prints one line per run: build, round, rc (1: a rank timed
# out), seconds. Usage: BUILDS="name=pythonpath ..." ROUNDS=6 bash hang-stress.sh > out.txt
BUILDS=${BUILDS:?set BUILDS to name=pythonpath ...}
cd /tmp || exit 1
for round in $(seq 1 "${ROUNDS:-6}"); do
  list=$BUILDS; [ $((round % 2)) = 0 ] && list=$(echo "$BUILDS" | tr ' ' '\n' | tac | tr '\n' ' ')
  for spec in $list; do
    name=${spec%%=*}; path=${spec#*=}
    start=$(date +%s.%N)
    PYTHONPATH=$path GRADSWITCH_TARGET_DELAY_US=50 timeout 180 gradswitch bench -n 4 --size 4M --iters 20 \
      --window adaptive --drop-rate 0.1 --timeout 8 > /tmp/hang-stress.out 2>&1
    rc=$?
    end=$(date +%s.%N)
    echo "$name round $round rc $rc $(echo "$end - $start" | bc) s $(grep -c FAILED /tmp/hang-stress.out) ranks failed"
  done
done
