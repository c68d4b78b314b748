#!/bin/bash
# Batch B (testbed: 4 workers, 1 Gbit/s tbf links, MTU 1500): gradswitch main vs new fixed vs new adaptive.
cd /tmp
R=/work/wt-transport/bench/results/2026-11-23-transport
NEW=/work/transport-builds/win2
MAIN=/work/transport-builds/item1
date -u; cat /proc/loadavg
for spec in "before:/work/transport-builds/main-04c1393::0" "main:$MAIN::0" "fixed:$NEW:fixed:0" "adaptive:$NEW:adaptive:0" "main:$MAIN::0.01" "fixed:$NEW:fixed:0.01" "adaptive:$NEW:adaptive:0.01"; do
  IFS=: read name path win loss <<< "$spec"
  echo "== $name loss $loss $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  env PYTHONPATH=$path ${win:+GRADSWITCH_WINDOW=$win} timeout 240 python3 -m gradswitch.baselines --system gradswitch \
    -n 4 --nbytes 16M --iters 5 --rate 1gbit --loss $loss --json 2>&1 | grep '^{' | \
    python3 -c "import sys,json; d=json.loads(sys.stdin.read()); d['config']='$name'; d['loss']=$loss; print(json.dumps(d))" >> $R/testbed.jsonl
done
date -u
