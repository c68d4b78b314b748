#!/bin/bash
# Experiment (not landed): does absorbing a completed round's DATA that lacks RETX (a network copy)
# instead of answering it from the shadow copy shorten 5% duplication? Two daemons built from the same
# tree (main 82a350d, build/test RelWithDebInfo: `ninja -C build/test gradswitchd`), stock and with this
# at the top of step 2 of src/switch/engine/engine.cpp (`if (same_round && state == kComplete) {`):
#     if (!(h.flags & GS_FLAG_RETX)) { count duplicates; r.kind = IngestResult::kAbsorbed; return r; }
# Run: flock /tmp/gradswitch-bench.lock bash dupfix-runs.sh   (daemons in /tmp/tx17/gradswitchd-{stock,dupfix})
cd "$(dirname "$0")"
for round in 1 2 3; do
  for d in stock dupfix; do
    out=dupfix-$([ $d = stock ] && echo stock || echo absorb).jsonl
    GRADSWITCHD=/tmp/tx17/gradswitchd-$d CONFIGS="offload-off dup5" OUT=$PWD/$out bash dup-runs.sh 1
  done
done
