#!/bin/bash
# Session 3, testbed (4 workers, 1 Gbit/s tbf links, MTU 1500, loss per link direction, offloads off
# under loss): the loss detector before (main e1fa106, the installed package) and after (rack2: RTT
# from rounds this rank completed, answered resends, RACK wake-ups), two alternated rounds.
# loss 1e-06 = the same nft rules and offloads as the lossy runs, without (measurable) loss.
R="$(cd "$(dirname "$0")" && pwd)"; cd /tmp
NEW=/work/transport-builds/rack2
PY=/work/venv-fresh/bin/python
OUT=$R/testbed-rack.jsonl
date -u; cat /proc/loadavg
# ROUNDS="3 4" LOSSES=0.01 for the extra rounds at 1%.
for round in ${ROUNDS:-1 2}; do
for loss in ${LOSSES:-1e-06 0.01 0.1}; do
for spec in "main:" "new:$NEW"; do
  IFS=: read name path <<< "$spec"
  echo "== round $round $name loss $loss $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  env ${path:+PYTHONPATH=$path} timeout 300 $PY -m gradswitch.baselines --system gradswitch \
    -n 4 --nbytes 16M --iters 5 --rate 1gbit --loss $loss --json 2>&1 | grep '^{' | \
    $PY -c "import sys,json; d=json.loads(sys.stdin.read()); d['config']='$name'; d['loss']=$loss; d['round']=$round; print(json.dumps(d))" >> $OUT
done
done
done
date -u
