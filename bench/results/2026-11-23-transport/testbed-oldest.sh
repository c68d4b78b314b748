#!/bin/bash
# Session 2, testbed (4 workers, 1 Gbit/s tbf links, MTU 1500): the oldest-chunk start rule (win3)
# fixed vs adaptive, and the in-order adaptive (win2) for reference, two alternated rounds.
R="$(cd "$(dirname "$0")" && pwd)"; cd /tmp
NEW=/work/transport-builds/win3
OLD=/work/transport-builds/win2
PY=/work/venv-fresh/bin/python
date -u; cat /proc/loadavg
for round in 1 2; do
for spec in "fixed:$NEW:fixed:0" "adaptive:$NEW:adaptive:0" "fixed:$NEW:fixed:0.01" "adaptive:$NEW:adaptive:0.01" "inorder-adaptive:$OLD:adaptive:0.01"; do
  IFS=: read name path win loss <<< "$spec"
  echo "== round $round $name loss $loss $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  env PYTHONPATH=$path ${win:+GRADSWITCH_WINDOW=$win} timeout 240 $PY -m gradswitch.baselines --system gradswitch \
    -n 4 --nbytes 16M --iters 5 --rate 1gbit --loss $loss --json 2>&1 | grep '^{' | \
    $PY -c "import sys,json; d=json.loads(sys.stdin.read()); d['config']='$name'; d['loss']=$loss; d['round']=$round; print(json.dumps(d))" >> $R/testbed-oldest.jsonl
done
done
date -u
