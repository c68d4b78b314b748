#!/bin/bash
# Session 3, testbed (4 workers, 1 Gbit/s tbf links, MTU 1500, loss per link direction, offloads off
# under loss): the loss detector before (main e1fa106, the installed package) and after (rack2: RTT
# from rounds this rank completed, answered resends, RACK wake-ups; rack3 also the floor from a
# probe's own round trip), alternated rounds. NEW=<build> OUT=<file> override the defaults; BASE=<build>
# BASE_NAME=<name> NEW_NAME=<name> compare two builds other than the installed one.
# loss 1e-06 = the same nft rules and offloads as the lossy runs, without (measurable) loss.
R="$(cd "$(dirname "$0")" && pwd)"; cd /tmp
NEW=${NEW:-/work/transport-builds/rack3}
PY=/work/venv-fresh/bin/python
OUT=${OUT:-$R/testbed-rack3.jsonl}
date -u; cat /proc/loadavg
# ROUNDS="3 4" LOSSES=0.01: other rounds and losses (testbed-rack2.jsonl: rack2, rounds 1-2 all
# losses, 3-5 at 1e-06 and 0.01).
for round in ${ROUNDS:-1 2}; do
for loss in ${LOSSES:-1e-06 0.01 0.1}; do
for spec in "${BASE_NAME:-main}:${BASE:-}" "${NEW_NAME:-new}:$NEW"; do
  IFS=: read name path <<< "$spec"
  echo "== round $round $name loss $loss $(date -u +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  env ${path:+PYTHONPATH=$path} timeout 300 $PY -m gradswitch.baselines --system gradswitch \
    -n 4 --nbytes 16M --iters 5 --rate 1gbit --loss $loss --json > /tmp/testbed-rack.out 2>&1
  rc=$?
  if grep -q '^{' /tmp/testbed-rack.out; then
    grep '^{' /tmp/testbed-rack.out | $PY -c "import sys,json; d=json.loads(sys.stdin.read()); d['config']='$name'; d['loss']=$loss; d['round']='$round'; print(json.dumps(d))" >> $OUT
  else  # a failed run is kept, with why
    { echo "== round $round $name loss $loss rc $rc"; tail -40 /tmp/testbed-rack.out; } >> $OUT.failures.log
    echo "   FAILED rc $rc (see $OUT.failures.log)"
  fi
done
done
done
date -u
