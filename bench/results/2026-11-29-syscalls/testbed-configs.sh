#!/bin/bash
# Session 5, testbed side by side (4 workers, 1 Gbit/s tbf links, MTU 1500, loss per link direction,
# offloads off under loss; 16 MB float32, $ITERS timed allreduces): configurations alternated per
# round, their order reversed every other round. A configuration is name:build[:ENV=V,ENV2=V2[:args]],
# where build holds a gradswitch package (pip install --target) and args go to gradswitch.baselines
# (commas for spaces, e.g. --slots,128). Loss 1e-06 = the same nft rules and offloads without loss.
# Prints one summary line per run on stderr; failed runs go to $OUT.failures.log with their output.
OUT=${OUT:?set OUT to the .jsonl to append to}
CONFIGS=${CONFIGS:?set CONFIGS to name:build[:env[:args]] ...}
cd /tmp || exit 1
date -u; cat /proc/loadavg
for round in ${ROUNDS:-1 2 3}; do
for loss in ${LOSSES:-0.1 0.01 1e-06}; do
cfgs=$CONFIGS; [ $((round % 2)) = 0 ] && cfgs=$(echo $CONFIGS | tr ' ' '\n' | tac | tr '\n' ' ')
for spec in $cfgs; do
  IFS=: read -r name path envv args <<< "$spec"
  # shellcheck disable=SC2086
  env ${envv//,/ } PYTHONPATH="$path" timeout 300 python3 -m gradswitch.baselines --system gradswitch \
    -n 4 --nbytes 16M --iters "${ITERS:-5}" --rate 1gbit --loss "$loss" ${args//,/ } --json > /tmp/testbed-configs.out 2>&1
  rc=$?
  if grep -q '^{' /tmp/testbed-configs.out; then
    grep '^{' /tmp/testbed-configs.out | python3 -c "
import sys, json
d = json.loads(sys.stdin.read()); d.update(config='$name', loss=$loss, round='$round')
w = d['extra']['timed_workers']; print(json.dumps(d))
print('$name', $loss, 'round $round', 'median %.1f ms' % (d['median_s'] * 1e3),
      'resent %.2f%%' % (100 * w['retransmissions'] / w['packets_sent']), file=sys.stderr)" >> "$OUT"
  else
    { echo "== round $round $name loss $loss rc $rc"; cat /tmp/testbed-configs.out; } >> "$OUT.failures.log"
    echo "   FAILED $name loss $loss round $round rc $rc (see $OUT.failures.log)" >&2
  fi
done; done; done
date -u
