#!/bin/bash
# Session 4, testbed (4 workers, 1 Gbit/s tbf links, MTU 1500, loss per link direction, offloads off
# under loss): the switch's results grouped by destination (NEW) against main (BASE), alternated rounds.
# BASE=/NEW= (named BASE_NAME/NEW_NAME in the output) are directories holding a gradswitch package (pip install --target); loss 1e-06 = the
# same nft rules and offloads as the lossy runs, without (measurable) loss.
R="$(cd "$(dirname "$0")" && pwd)"; cd /tmp
BASE=${BASE:-/work/builds/base}; NEW=${NEW:-/work/builds/new}
OUT=${OUT:-$R/testbed-grouping.jsonl}
date -u; cat /proc/loadavg
for round in ${ROUNDS:-1 2 3}; do
for loss in ${LOSSES:-1e-06 0.01 0.1}; do
for spec in "${BASE_NAME:-base}:$BASE" "${NEW_NAME:-new}:$NEW"; do
  IFS=: read name path <<< "$spec"
  echo "== round $round $name loss $loss $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  env PYTHONPATH=$path timeout 300 python3 -m gradswitch.baselines --system gradswitch \
    -n 4 --nbytes 16M --iters 5 --rate 1gbit --loss $loss --json > /tmp/testbed-grouping.out 2>&1
  rc=$?
  if grep -q '^{' /tmp/testbed-grouping.out; then
    grep '^{' /tmp/testbed-grouping.out | python3 -c "import sys,json; d=json.loads(sys.stdin.read()); d['config']='$name'; d['loss']=$loss; d['round']='$round'; print(json.dumps(d))" >> $OUT
  else  # a failed run is kept, with why
    { echo "== round $round $name loss $loss rc $rc"; tail -40 /tmp/testbed-grouping.out; } >> $OUT.failures.log
    echo "   FAILED rc $rc (see $OUT.failures.log)"
  fi
done
done
done
date -u
