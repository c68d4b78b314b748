"""One torchft replica (a replica group of one rank) training a small linear model, its replica-dimension
allreduce on a gradswitch switch (gradswitch.torchft.ProcessGroupGradswitch; docs/torch.md, "torchft").

    torchft_lighthouse --min_replicas 2 --bind 127.0.0.1:29510 &     # torchft's lighthouse
    gradswitch switch --threads 2 &                                  # a switch on 127.0.0.1:7700
    for i in 0 1 2; do
      python examples/train_torchft.py --replica $i --lighthouse http://127.0.0.1:29510 \
        --switch 127.0.0.1:7700 --out /tmp/ft --steps 200 &
    done                          # kill one and start it again: it heals from the others and rejoins

Appends one JSON line per event to OUT/replicaN.log: {"event": "ready", "t"} once the Manager is up, then
one {"event": "step", "t", "step", "committed", "participants", "pid"} per step. Stops once the step
reaches --steps or the number in the file OUT/stop (tests/python/test_torchft.py writes it), and saves
the weights to OUT/replicaN.pt. --pg gloo runs torchft's own ProcessGroupGloo instead (the comparison
of bench/torchft_recovery.py).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torchft.ddp import DistributedDataParallel
from torchft.manager import Manager

from gradswitch.torchft import ProcessGroupGradswitch

TIMEOUT = timedelta(seconds=10)


def _stop_step(args: argparse.Namespace) -> int | None:
    try:
        return int((args.out / "stop").read_text())
    except (FileNotFoundError, ValueError):
        return args.steps


def _process_group(args: argparse.Namespace):
    if args.pg == "gloo":
        from torchft.process_group import ProcessGroupGloo

        return ProcessGroupGloo(timeout=TIMEOUT)
    return ProcessGroupGradswitch(timeout=TIMEOUT, switch=args.switch)


def _manager(args: argparse.Namespace, model: torch.nn.Module, optim: torch.optim.Optimizer) -> Manager:
    # torchelastic's part: the replica group's store (the Manager is its client)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    args.store = store  # kept alive with the Manager

    def state_dict() -> dict:
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def load_state_dict(state: dict) -> None:
        model.load_state_dict(state["model"])
        optim.load_state_dict(state["optim"])

    return Manager(
        pg=_process_group(args),
        min_replica_size=2,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica{args.replica}",
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        hostname="127.0.0.1",
        timeout=TIMEOUT,
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=TIMEOUT,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--switch", help="host:port of the switch's control port (--pg gradswitch)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, help="stop at this step (default: at OUT/stop's)")
    parser.add_argument("--pg", choices=("gradswitch", "gloo"), default="gradswitch")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    manager = _manager(args, model, optim)
    ddp = DistributedDataParallel(manager, model)
    log = (args.out / f"replica{args.replica}.log").open("a", buffering=1)
    log.write(json.dumps({"event": "ready", "t": time.time(), "pid": os.getpid()}) + "\n")
    while True:
        stop = _stop_step(args)
        if stop is not None and manager.current_step() >= stop:
            break
        # each replica its own data, as data parallelism has it
        gen = torch.Generator().manual_seed(1000 * args.replica + manager.current_step())
        x, y = torch.randn(32, 16, generator=gen), torch.randn(32, 4, generator=gen)
        manager.start_quorum()
        optim.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        committed = manager.should_commit()
        if committed:
            optim.step()
        line = {
            "event": "step",
            "t": time.time(),
            "step": manager.current_step(),
            "committed": committed,
            "participants": manager.num_participants(),
            "pid": os.getpid(),
        }
        log.write(json.dumps(line) + "\n")
        time.sleep(0.05)  # a training step's compute, so the test can kill a replica mid-training
    torch.save(
        {"step": manager.current_step(), "model": model.state_dict()}, args.out / f"replica{args.replica}.pt"
    )
    manager.shutdown(wait=False)


if __name__ == "__main__":
    main()
