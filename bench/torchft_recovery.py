"""torchft's recovery from a replica killed mid-training, with the replica-dimension allreduce on a
gradswitch switch (gradswitch.torchft.ProcessGroupGradswitch) and on torchft's own ProcessGroupGloo,
side by side (docs/torch.md, "torchft").

    python3 bench/torchft_recovery.py [--rounds 3] [--json out.json]

Each round: a local lighthouse (heartbeat timeout 1 s) and three replicas of examples/train_torchft.py
(tests/python/_torchft_cluster.py); once all three commit steps together, replica 2 is killed (SIGKILL)
and, once the others committed a step without it, restarted. Phases: kill -> the survivors' first
committed step without it; restart -> its Manager is up (process start, imports); Manager up -> its
first committed step with all three (quorum, the new process group, healing from a peer). Rounds
alternate between the two process groups (the order flips each round) so that both see the same machine
load; the table gives each phase's median and range per process group.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

from _torchft_cluster import Replicas  # noqa: E402

from gradswitch.local_switch import LocalSwitch  # noqa: E402

PHASES = ("kill_to_survivors_step_s", "restart_to_ready_s", "ready_to_step_with_all_s")


def one_round(pg: str, switch: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"torchft-{pg}-") as out:
        with Replicas(Path(out), switch=switch if pg == "gradswitch" else None, pg=pg) as replicas:
            phases = replicas.kill_and_restart(2)
            finals = replicas.finish(phases["step"] + 3)
    import torch

    phases["weights_equal"] = all(
        torch.equal(f["model"][k], finals[0]["model"][k]) for f in finals for k in finals[0]["model"]
    )
    return phases


def table(samples: dict[str, list[dict]]) -> str:
    rows = [
        "| process group | " + " | ".join(PHASES) + " | weights equal |",
        "|---" * (len(PHASES) + 2) + "|",
    ]
    for pg, runs in samples.items():
        cells = []
        for phase in PHASES:
            values = [r[phase] for r in runs]
            cells.append(f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})")
        equal = sum(r["weights_equal"] for r in runs)
        rows.append(f"| {pg} | " + " | ".join(cells) + f" | {equal}/{len(runs)} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    samples: dict[str, list[dict]] = {"gradswitch": [], "gloo": []}
    with LocalSwitch(threads=1) as sw:
        for r in range(args.rounds):
            order = ("gradswitch", "gloo") if r % 2 == 0 else ("gloo", "gradswitch")
            for pg in order:
                phases = one_round(pg, sw.address)
                samples[pg].append(phases)
                print(f"round {r} {pg}: {json.dumps(phases)}", flush=True)
    print(table(samples))
    if args.json:
        args.json.write_text(json.dumps(samples, indent=1) + "\n")


if __name__ == "__main__":
    main()
