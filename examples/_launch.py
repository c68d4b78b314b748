"""What the framework examples (accelerate_ddp.py, hf_trainer_ddp.py, lightning_ddp.py) share besides
their data: the common options, a loopback switch when no address is known, and the main process's
report."""

from __future__ import annotations

import argparse
import contextlib
import json
import os

import torch


def parser(doc: str, ways: dict[str, str] | None = None) -> argparse.ArgumentParser:
    """The example's docstring as its help, --backend (gloo to compare against) and, with `ways` (each way
    the example can set up the process group, and what it does; the first is the default), --way."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=["gradswitch", "gloo"], default="gradswitch")
    if ways:
        help = "; ".join(f"{k}: {v}" for k, v in ways.items())
        p.add_argument("--way", choices=list(ways), default=next(iter(ways)), help=help)
    return p


def add_run_options(p: argparse.ArgumentParser, batch_size: int, who: str, report: str) -> None:
    """--batch-size, --seed, and where `who` (the process that reports) writes `report` and the weights."""
    p.add_argument("--batch-size", type=int, default=batch_size, help="per process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help=f"{who} writes {report} here")
    p.add_argument("--save", default=None, help=f"{who} writes the final state_dict here")


@contextlib.contextmanager
def switch_if_needed(backend: str):
    """A loopback switch for the with block, started by rank 0 (local rank 0) when no address is known,
    its address in GRADSWITCH_SWITCH; nothing otherwise (the backend gives the other ranks rank 0's
    address)."""
    if (
        backend != "gradswitch"
        or os.environ.get("GRADSWITCH_SWITCH")
        or int(os.environ.get("RANK", "0")) != 0
        or int(os.environ.get("LOCAL_RANK", "0")) != 0
    ):
        yield None
        return
    from gradswitch.local_switch import LocalSwitch

    sw = LocalSwitch(threads=1).start()
    os.environ["GRADSWITCH_SWITCH"] = sw.address
    print(f"started gradswitchd at {sw.address}", flush=True)
    try:
        yield sw
    finally:
        sw.stop()


def write_report(report: dict, weights: dict, json_path: str | None, save_path: str | None,
                 sort_keys: bool = False) -> None:  # fmt: skip
    """Prints the report as JSON and writes it to json_path, and the weights to save_path. The weights
    are cloned: tied parameters (GPT-2's embedding and head) are then saved as the values they hold."""
    print(json.dumps(report, sort_keys=sort_keys), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, sort_keys=sort_keys)
    if save_path:
        torch.save({k: v.detach().cpu().clone() for k, v in weights.items()}, save_path)
