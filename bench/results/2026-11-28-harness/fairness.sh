#!/bin/bash
# Two and three jobs at the testbed's 1 Gbit/s switch link (bench/testbed_fairness.py, 2 ranks per
# job), the jobs started at once or 2 s apart, 2 repetitions, configurations alternated.
# Usage: OUT=file.jsonl CONFIGS="name:build:window ..." fairness.sh
#   build: a `pip install --target` directory (or "installed"); window: adaptive, fixed or rounds.
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
for rep in 1 2; do
  for jobs in 2 3; do
    for stagger in 0 2; do
      for config in $CONFIGS; do
        IFS=: read -r name build window <<<"$config"
        pypath=$([ "$build" = installed ] && echo "" || echo "$build")
        echo "== $name, $jobs jobs, stagger $stagger (rep $rep)" >&2
        PYTHONPATH=$pypath flock /tmp/gradswitch-bench.lock python3 "$here/bench/testbed_fairness.py" \
          --jobs "$jobs" --window "$window" --rounds 1 --stagger-s "$stagger" \
          --out >(sed -u "s/^{/{\"config\": \"$name\", /" >>"$OUT") 2>&1 >/dev/null | grep '^round' >&2
      done
    done
  done
done
