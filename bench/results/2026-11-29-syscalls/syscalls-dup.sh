#!/bin/bash
# 5% duplication against the same rules at 1e-6: system calls and context switches of the run alone
# (perf stat -a around the benchmark, the testbed set up before). Alternated, order reversed every other round.
OUT=${OUT:?}; B=${B:?}; ROUNDS=${ROUNDS:-1 2 3 4 5 6}; NAME=scd$$
EV=syscalls:sys_enter_sendmmsg,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_ppoll,raw_syscalls:sys_enter,context-switches
cd /tmp || exit 1
for round in $ROUNDS; do
  dups="1e-06 0.05"; [ $((round % 2)) = 0 ] && dups="0.05 1e-06"
  for dup in $dups; do
    PYTHONPATH=$B python3 -m gradswitch.testbed up --name $NAME -n 4 --rate 1gbit --offload off --dup $dup >/dev/null
    PYTHONPATH=$B perf stat -a -x, -o /tmp/perfstat-dup.txt -e $EV -- timeout 300 python3 -m gradswitch.baselines \
      --system gradswitch --testbed $NAME -n 4 --nbytes 16M --iters 5 --json > /tmp/scd.out 2>&1
    PYTHONPATH=$B python3 -m gradswitch.testbed down --name $NAME >/dev/null
    python3 - "$dup" "$round" >> "$OUT" <<'PY'
import json, sys
dup, rnd = sys.argv[1], sys.argv[2]
try:
    d = next(json.loads(l) for l in open('/tmp/scd.out') if l.startswith('{'))
except StopIteration:
    print('FAILED', dup, rnd, open('/tmp/scd.out').read()[-2000:], file=sys.stderr); sys.exit()
ev = {}
for l in open('/tmp/perfstat-dup.txt'):
    p = l.strip().split(',')
    if len(p) > 3 and p[0] and p[0][0].isdigit(): ev[p[2]] = float(p[0])
d.update(config='adaptive', loss=float(dup), dup=float(dup), round=rnd, ev=ev)
print(json.dumps(d))
print(dup, rnd, '%.1f ms' % (d['median_s']*1e3), file=sys.stderr)
PY
  done
done
