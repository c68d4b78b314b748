#!/bin/bash
# Loopback: gradswitch bench against a daemon started with --hold-us 0 and with the default (100),
# alternated, order reversed every other round. Prints one line per run: hold, round, mean ms of the slowest rank.
ROUNDS=${ROUNDS:-1 2 3 4 5 6 7 8}; BIN=$(python3 -c "import gradswitch._paths as p; print(p.switch_binary())" 2>/dev/null)
cd /tmp || exit 1
for round in $ROUNDS; do
  holds="0 100"; [ $((round % 2)) = 0 ] && holds="100 0"
  for h in $holds; do
    port=$((40000 + RANDOM % 10000))
    $BIN --control-port $port --data-port $((port + 1)) --hold-us $h --log-level warn > /tmp/lh-d.log 2>&1 &
    pid=$!; sleep 0.5
    out=$(timeout 120 gradswitch bench --switch 127.0.0.1:$port -n 4 --size ${SIZE:-16M} --iters ${ITERS:-10} 2>&1)
    kill $pid; wait $pid 2>/dev/null
    ms=$(echo "$out" | awk '/^ +[0-9]+ +[0-9.]+ /{ if ($2 > m) m = $2 } END { print m }')
    ok=$(echo "$out" | grep -c "all results exact: OK")
    echo "hold $h round $round slowest_mean_ms $ms ok $ok"
  done
done
