#!/bin/bash
# Loopback `gradswitch bench` with two worker builds in turn against one switch binary: A (PY_A, this
# branch: the source check) and B (PY_B, main's: none), order reversed every other round. One line per
# run: build, round, mean ms per allreduce of the slowest rank, whether every result was exact.
# Usage: PY_A=.venv/bin/python PY_B=python3 SIZE=16M ITERS=10 ROUNDS="1 2 3 4" THREADS=1 bash alternate.sh
ROUNDS=${ROUNDS:-1 2 3 4 5 6 7 8}
BIN=${BIN:-$($PY_B -c "import gradswitch._paths as p; print(p.switch_binary())")}
cd /tmp || exit 1
for round in $ROUNDS; do
  order="A B"; [ $((round % 2)) = 0 ] && order="B A"
  for w in $order; do
    py=$PY_A; [ $w = B ] && py=$PY_B
    port=$((40000 + RANDOM % 10000))
    $BIN --control-port $port --data-port $((port + 1)) --threads ${THREADS:-1} --log-level warn > /tmp/sc-d.log 2>&1 &
    pid=$!; sleep 0.5
    out=$(timeout 120 $py -m gradswitch.cli bench --switch 127.0.0.1:$port -n ${WORKERS:-4} --size ${SIZE:-16M} \
          --iters ${ITERS:-10} 2>&1)
    kill $pid; wait $pid 2>/dev/null
    ms=$(echo "$out" | awk '/^ +[0-9]+ +[0-9.]+ /{ if ($2 > m) m = $2 } END { print m }')
    ok=$(echo "$out" | grep -c "all results exact: OK")
    echo "build $w round $round slowest_mean_ms $ms ok $ok"
  done
done
