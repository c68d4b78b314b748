#!/bin/bash
# 5% duplication against the same rules at 1e-6: system calls and context switches of the run alone
# (perf stat -a around the benchmark, the testbed set up before). Alternated, order reversed every other round.
# CONFIGS (optional): name:args ... (args to gradswitch.baselines, commas for spaces), each run on every testbed.
# IMPAIR=reorder HIGH=0.1: the same for the testbed's reordering (the field `loss` holds its probability).
OUT=${OUT:?}; B=${B:?}; ROUNDS=${ROUNDS:-1 2 3 4 5 6}; NAME=scd$$; CONFIGS=${CONFIGS:-adaptive:}
IMPAIR=${IMPAIR:-dup}; HIGH=${HIGH:-0.05}
EV=syscalls:sys_enter_sendmmsg,syscalls:sys_enter_recvmmsg,syscalls:sys_enter_ppoll,raw_syscalls:sys_enter,context-switches
cd /tmp || exit 1
for round in $ROUNDS; do
  dups="1e-06 $HIGH"; [ $((round % 2)) = 0 ] && dups="$HIGH 1e-06"
  for dup in $dups; do
    PYTHONPATH=$B python3 -m gradswitch.testbed up --name $NAME -n 4 --rate 1gbit --offload off --$IMPAIR $dup >/dev/null
    cfgs=$CONFIGS; [ $((round % 2)) = 0 ] && cfgs=$(echo $CONFIGS | tr ' ' '\n' | tac | tr '\n' ' ')
    for spec in $cfgs; do
    IFS=: read -r name args <<< "$spec"
    # shellcheck disable=SC2086
    PYTHONPATH=$B perf stat -a -x, -o /tmp/perfstat-dup.txt -e $EV -- timeout 300 python3 -m gradswitch.baselines \
      --system gradswitch --testbed $NAME -n 4 --nbytes 16M --iters 5 ${args//,/ } --json > /tmp/scd.out 2>&1
    python3 - "$dup" "$round" "$name" >> "$OUT" <<'PY'
import json, sys
dup, rnd, name = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = next(json.loads(l) for l in open('/tmp/scd.out') if l.startswith('{'))
except StopIteration:
    print('FAILED', dup, rnd, open('/tmp/scd.out').read()[-2000:], file=sys.stderr); sys.exit()
ev = {}
for l in open('/tmp/perfstat-dup.txt'):
    p = l.strip().split(',')
    if len(p) > 3 and p[0] and p[0][0].isdigit(): ev[p[2]] = float(p[0])
d.update(config=name, loss=float(dup), round=rnd, ev=ev)
print(json.dumps(d))
print(name, dup, rnd, '%.1f ms' % (d['median_s']*1e3), file=sys.stderr)
PY
    done
    PYTHONPATH=$B python3 -m gradswitch.testbed down --name $NAME >/dev/null
  done
done
