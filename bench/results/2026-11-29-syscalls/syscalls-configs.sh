#!/bin/bash
# Syscalls, context switches and CPU per run, configurations x losses alternated (order reversed every other
# round). A configuration is name:build[:ENV=V,ENV2=V2[:args]] (args to gradswitch.baselines, commas for spaces).
OUT=${OUT:?}; CONFIGS=${CONFIGS:?}; ROUNDS=${ROUNDS:-1 2 3 4}; ITERS=${ITERS:-5}; LOSSES=${LOSSES:-0.01 1e-06}
cd /tmp || exit 1
EV=syscalls:sys_enter_sendmmsg,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_ppoll,raw_syscalls:sys_enter,context-switches
for round in $ROUNDS; do
for loss in $LOSSES; do
  cfgs=$CONFIGS; [ $((round % 2)) = 0 ] && cfgs=$(echo $CONFIGS | tr ' ' '\n' | tac | tr '\n' ' ')
  for spec in $cfgs; do
    IFS=: read -r name path envv args <<< "$spec"
    # shellcheck disable=SC2086
    env ${envv//,/ } PYTHONPATH=$path perf stat -a -x, -o /tmp/perfstat.txt -e $EV -- timeout 300 python3 -m gradswitch.baselines \
      --system gradswitch -n 4 --nbytes 16M --iters $ITERS --rate 1gbit --loss $loss ${args//,/ } --json > /tmp/sc.out 2>&1
    python3 - "$loss" "$round" "$name" >> "$OUT" <<'PY'
import json, sys
loss, rnd, name = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = next(json.loads(l) for l in open('/tmp/sc.out') if l.startswith('{'))
except StopIteration:
    print('FAILED', name, loss, rnd, open('/tmp/sc.out').read()[-2000:], file=sys.stderr); sys.exit()
ev = {}
for l in open('/tmp/perfstat.txt'):
    p = l.strip().split(',')
    if len(p) > 3 and p[0] and p[0][0].isdigit(): ev[p[2]] = float(p[0])
e = d['extra']; d.update(config=name, loss=float(loss), round=rnd, ev=ev)
print(json.dumps(d))
print(name, loss, rnd, '%.1f ms' % (d['median_s']*1e3), 'sendmmsg %d' % ev.get('syscalls:sys_enter_sendmmsg', -1), file=sys.stderr)
PY
  done
done; done
