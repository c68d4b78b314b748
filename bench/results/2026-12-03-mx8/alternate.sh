#!/bin/bash
# A/B on the testbed: bench/mx8_wire.py one round at a time, this branch's package (PY_NEW) then
# main's (PY_OLD), five times; aggregate.py makes summary.md from the folders it leaves in $OUT.
cd "$(git rev-parse --show-toplevel)"
OUT=${OUT:-/tmp/ab-mx8}; mkdir -p "$OUT"
for i in 1 2 3 4 5; do
  for b in new old; do
    if [ $b = new ]; then py=${PY_NEW:-.venv/bin/python3}; else py=${PY_OLD:?main\'s venv python}; fi
    uptime >> "$OUT/load.txt"
    flock /tmp/gradswitch-netns.lock "$py" bench/mx8_wire.py --rounds 1 --iters 3 --out "$OUT/$b-$i" > "$OUT/$b-$i.log" 2>&1
  done
done
