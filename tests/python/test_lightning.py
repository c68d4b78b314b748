"""PyTorch Lightning over the "gradswitch" backend: DDPStrategy(process_group_backend="gradswitch") with
sync_dist metrics, launched by Lightning's subprocess launcher, by torchrun and by spawn (ddp_spawn).

Each launch runs examples/lightning_ddp.py (a small MLP, a few steps on the CPU, two processes) against
a gradswitchd on loopback whose address the test exports as GRADSWITCH_SWITCH, as a user would; the
final weights and the synced metrics must equal those of the same run on gloo (one reference run, made
by Lightning's own launcher), and the switch must have carried the gradients.
"""

from __future__ import annotations

import json
import sys

import pytest
from _frameworks import (
    EXAMPLES,
    assert_same_metrics,
    assert_same_weights,
    require_package,
    run_launcher,
    torchrun,
)
from test_torch import _binary, _free_port

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the gradswitch.torch tests need it")

EXAMPLE = EXAMPLES / "lightning_ddp.py"
ARGS = ["--steps", "6", "--val-every", "3", "--seed", "3"]


@pytest.fixture(scope="module")
def lightning():
    return require_package("pytorch_lightning", "pytorch-lightning==2.6.6")


def _launch(launcher: str, backend: str, out, env: dict) -> tuple[dict, dict]:
    args = [*ARGS, "--backend", backend, "--json", str(out / "m.json"), "--save", str(out / "w.pt")]
    port = _free_port()
    if launcher == "torchrun":
        cmd = torchrun(EXAMPLE, args, port)
    else:
        cmd = [sys.executable, str(EXAMPLE), "--devices", "2", "--launcher", launcher, *args]
    run_launcher(cmd, {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    report = json.loads((out / "m.json").read_text())
    assert report["backend"] == backend and report["world_size"] == 2, report
    return report, torch.load(out / "w.pt")


@pytest.fixture(scope="module")
def gloo_run(lightning, tmp_path_factory):
    return _launch("subprocess", "gloo", tmp_path_factory.mktemp("gloo"), {})


@pytest.mark.parametrize("launcher", ["subprocess", "torchrun", "spawn"])
def test_lightning_ddp_matches_gloo(launcher, gloo_run, switch_factory, tmp_path):
    switch = switch_factory(binary=_binary(), threads=1)
    report, weights = _launch(launcher, "gradswitch", tmp_path, {"GRADSWITCH_SWITCH": switch.address})
    ref_report, ref_weights = gloo_run
    assert report["global_step"] == ref_report["global_step"] == 6
    # val_loss (mean: ReduceOp.AVG), val_loss_max (MAX), val_correct (SUM of an int64 count) and the
    # training loss, each synced across the ranks at every validation
    assert {"val_loss", "val_loss_max", "val_correct", "train_loss_epoch"} <= set(report["metrics"])
    assert_same_metrics(ref_report["metrics"], report["metrics"])
    assert_same_weights(ref_weights, weights)
    assert switch.stats()["completed"] > 0, "no allreduce went through the switch"
