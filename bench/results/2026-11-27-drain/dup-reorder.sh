#!/bin/bash
# Duplication and reordering on the testbed, the whole pool against the adaptive window (1 ms target,
# with the drains): 4 workers, 1 Gbit/s tbf links, MTU 1500, offloads off (what --dup/--reorder turn on),
# 16 MB float32, 10 timed allreduces; the six configurations alternated, order reversed every other round.
# Usage: BUILD=/path/to/build OUT=file.jsonl [CONFIGS="none dup5 reorder10"] [SPECS=...] [WINDOWS=...]
#        flock /tmp/gradswitch-bench.lock bash dup-reorder.sh [ROUNDS]
# (the emulation: docs/testbed.md, "Duplication" and "Reordering")
set -u
OUT=${OUT:?set OUT}; BUILD=${BUILD:?set BUILD}; NAME=dr$$
export PYTHONPATH=$BUILD
# SPECS (name:dup:reorder ...) and WINDOWS (name:GRADSWITCH_WINDOW ...) may be set to run others.
read -r -a SPECS <<< "${SPECS:-none:0:0 dup5:0.05:0 reorder10:0:0.1}"
read -r -a WINDOWS <<< "${WINDOWS:-pool:fixed adaptive:adaptive}"
date -u; cat /proc/loadavg
for round in $(seq 1 "${1:-4}"); do
  runs=(); for s in "${SPECS[@]}"; do for w in "${WINDOWS[@]}"; do runs+=("$s:$w"); done; done
  if (( round % 2 == 0 )); then r=(); for ((i=${#runs[@]}-1; i>=0; i--)); do r+=("${runs[i]}"); done; runs=("${r[@]}"); fi
  for spec in "${runs[@]}"; do
    IFS=: read -r cfg dup reorder wname window <<< "$spec"
    [[ -z "${CONFIGS:-}" || " $CONFIGS " == *" $cfg "* ]] || continue
    python3 -m gradswitch.testbed up --name $NAME -n 4 --rate 1gbit --offload off --dup "$dup" --reorder "$reorder" >/dev/null
    GRADSWITCH_WINDOW=$window GRADSWITCH_TARGET_DELAY_US=1000 timeout 300 python3 -m gradswitch.baselines \
      --system gradswitch --testbed $NAME -n 4 --nbytes 16M --iters 10 --json 2>&1 | grep '^{' | python3 -c "
import sys, json
d = json.loads(sys.stdin.read()); d.update(config='$cfg', window='$wname', round=$round, dup=$dup, reorder=$reorder)
w = d['extra']['timed_workers']; print(json.dumps(d))
print('$cfg $wname round $round median %.1f ms resent %.3f%%' % (d['median_s'] * 1e3, 100 * w['retransmissions'] / w['packets_sent']), file=sys.stderr)" >> "$OUT"
    python3 -m gradswitch.testbed down --name $NAME >/dev/null
  done
done
date -u
