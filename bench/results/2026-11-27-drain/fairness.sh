#!/bin/bash
# Two (and three) adaptive jobs at the testbed's 1 Gbit/s switch link, side by side: a build
# without the drains ("before") and one with them ("drain"), the second job started at once after
# the first or 2 s later. Usage: BEFORE=/path/to/build DRAIN=/path/to/build OUT=file.jsonl fairness.sh
set -euo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd)
for rep in 1 2; do
  for stagger in 0 2; do
    for name in before drain; do
      [ "$name" = before ] && build=$BEFORE || build=$DRAIN
      echo "== $name stagger $stagger (rep $rep)" >&2
      PYTHONPATH=$build flock /tmp/gradswitch-bench.lock python3 "$here/bench/testbed_fairness.py" \
        --jobs "${JOBS:-2}" --window adaptive --target-delay-us 1000 --rounds 1 --stagger-s "$stagger" \
        --out >(sed "s/^{/{\"build\": \"$name\", /" >>"$OUT") >/dev/null
    done
  done
done
