#!/bin/bash
# The benchmark suite's window (bench/suite.py --slots, default 32) against the daemon's default pool
# (256) and the adaptive window, at the suite's main setting: 4 workers, 1 Gbit/s, 94 MB float32.
# Run under: flock /tmp/gradswitch-bench.lock bash suite-window-runs.sh [ROUNDS]  (writes suite-window.jsonl)
set -u
PY=${PY:-/work/venv-fresh/bin/python}
R=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$R/suite-window.jsonl}
ROUNDS=${1:-2}
cd /tmp
date -u; cat /proc/loadavg
SPECS=("slots32:fixed:32" "pool256:fixed:" "adaptive256:adaptive:")
for round in $(seq 1 "$ROUNDS"); do
  order=("${SPECS[@]}")
  if (( round % 2 == 0 )); then order=(); for ((i=${#SPECS[@]}-1; i>=0; i--)); do order+=("${SPECS[i]}"); done; fi
  for spec in "${order[@]}"; do
    IFS=: read -r cfg win slots <<< "$spec"
    echo "== round $round $cfg $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
    GRADSWITCH_WINDOW=$win timeout 300 $PY -m gradswitch.baselines --system gradswitch -n 4 --nbytes 94M --iters 3 \
      --rate 1gbit ${slots:+--slots $slots} --json 2>&1 | grep '^{' | \
      $PY -c "import sys,json; d=json.loads(sys.stdin.read()); d.update(config='$cfg', round=$round); print(json.dumps(d))" >> "$OUT"
  done
done
date -u
