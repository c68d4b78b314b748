#!/bin/bash
# 5% duplication on the testbed, the switch answering a completed round's DATA always (old: win3's
# gradswitchd) vs only when it carries RETX (new: this build's); same workers, same testbed (the
# daemon picked with $GRADSWITCHD). 4 workers, 1 Gbit/s, offloads off, 16 MB float32, 10 iterations.
# Run under: flock /tmp/gradswitch-bench.lock bash dup-retx-runs.sh [ROUNDS]   (writes dup-retx.jsonl)
set -u
PY=${PY:-/work/venv-fresh/bin/python}
OLD=${OLD:-/work/transport-builds/win3/gradswitch/bin/gradswitchd}
NEW=${NEW:-$($PY -c 'from gradswitch._paths import switch_binary; print(switch_binary())')}
R=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$R/dup-retx.jsonl}
NAME=dupretx
ROUNDS=${1:-4}
date -u; cat /proc/loadavg
SPECS=("nodup-new:$NEW:0" "dup5-old:$OLD:0.05" "dup5-new:$NEW:0.05")
for round in $(seq 1 "$ROUNDS"); do
  order=("${SPECS[@]}")
  if (( round % 2 == 0 )); then order=(); for ((i=${#SPECS[@]}-1; i>=0; i--)); do order+=("${SPECS[i]}"); done; fi
  for spec in "${order[@]}"; do
    IFS=: read -r cfg bin dup <<< "$spec"
    echo "== round $round $cfg $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    $PY -m gradswitch.testbed up --name $NAME -n 4 --rate 1gbit --offload off --dup "$dup" >/dev/null
    GRADSWITCHD=$bin timeout 300 $PY -m gradswitch.baselines --system gradswitch --testbed $NAME -n 4 --nbytes 16M \
      --iters 10 --json 2>&1 | grep '^{' | $PY -c "import sys,json; d=json.loads(sys.stdin.read()); d.update(config='$cfg', round=$round, dup=$dup); print(json.dumps(d))" >> "$OUT"
    $PY -m gradswitch.testbed down --name $NAME >/dev/null
  done
done
date -u
