"""One torchft replica (a replica group of one rank) training a small linear model through
gradswitch.torchft.ProcessGroupGradswitch, for tests/python/test_torchft.py.

    python _torchft_replica.py --replica 1 --lighthouse http://127.0.0.1:P --switch 127.0.0.1:P --out DIR

Appends one JSON line per step to DIR/replicaN.log ({"t", "step", "committed", "participants",
"pid"}), stops once the step reaches the number in DIR/stop (written by the test), and then saves the
model's weights to DIR/replicaN.pt.
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


def _stop_step(out: Path) -> int | None:
    try:
        return int((out / "stop").read_text())
    except (FileNotFoundError, ValueError):
        return None


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
        pg=ProcessGroupGradswitch(timeout=TIMEOUT, switch=args.switch),
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
    parser.add_argument("--switch", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    optim = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    manager = _manager(args, model, optim)
    ddp = DistributedDataParallel(manager, model)
    log = (args.out / f"replica{args.replica}.log").open("a", buffering=1)
    while True:
        stop = _stop_step(args.out)
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
