#!/bin/bash
# Duplication on the testbed (issue 17): 4 workers, 1 Gbit/s tbf links, MTU 1500, 16 MB float32, the
# default configuration (no --slots, default window), configurations alternated round by round.
#   offload-on  : dup 0, the testbed's default for a clean link (offloads on)
#   offload-off : dup 0, offloads off (what dup/loss > 0 turn on: the fair baseline for them)
#   dup-rules   : dup 1e-6: the gs_dup rules on every packet, (almost) no copies: their own cost
#   dup5        : 5% duplication per packet and link direction (offloads off)
#   loss1       : 1% loss per packet and link direction (offloads off), for reference
#   reorder-rules, reorder10: --reorder 1e-6 / 0.1 (offloads off; not in the default CONFIGS), e.g.
#     CONFIGS="offload-off reorder-rules reorder10" OUT=$PWD/reorder.jsonl bash dup-runs.sh 4
# Run under: flock /tmp/gradswitch-bench.lock bash dup-runs.sh [ROUNDS]   (writes dup.jsonl)
# Only some configurations, e.g.: CONFIGS="offload-off dup5" OUT=$PWD/dup-pairs.jsonl bash dup-runs.sh 6
set -u
PY=${PY:-/work/venv-transport/bin/python}
R=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$R/dup.jsonl}
CONFIGS=${CONFIGS:-offload-on offload-off dup-rules dup5 loss1}
NAME=dupb17
ROUNDS=${1:-3}
date -u; cat /proc/loadavg
SPECS=("offload-on:auto:0:0:0" "offload-off:off:0:0:0" "dup-rules:auto:0.000001:0:0" "dup5:auto:0.05:0:0"
       "loss1:auto:0:0.01:0" "reorder-rules:auto:0:0:0.000001" "reorder10:auto:0:0:0.1")
for round in $(seq 1 "$ROUNDS"); do
  order=("${SPECS[@]}")
  if (( round % 2 == 0 )); then order=(); for ((i=${#SPECS[@]}-1; i>=0; i--)); do order+=("${SPECS[i]}"); done; fi
  for spec in "${order[@]}"; do  # reversed every other round: load that drifts within a round hits both ends
    IFS=: read -r cfg off dup loss reorder <<< "$spec"
    [[ " $CONFIGS " == *" $cfg "* ]] || continue
    echo "== round $round $cfg $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    $PY -m gradswitch.testbed up --name $NAME -n 4 --rate 1gbit --offload "$off" --dup "$dup" --loss "$loss" \
      --reorder "$reorder" >/dev/null
    timeout 300 $PY -m gradswitch.baselines --system gradswitch --testbed $NAME -n 4 --nbytes 16M --iters 10 --json \
      2>&1 | grep '^{' | $PY -c "import sys,json; d=json.loads(sys.stdin.read()); d.update(config='$cfg', round=$round, dup=$dup, loss=$loss, reorder=$reorder, offload='$off'); print(json.dumps(d))" >> "$OUT"
    $PY -m gradswitch.testbed down --name $NAME >/dev/null
  done
done
date -u
