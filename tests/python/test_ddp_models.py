"""bench/ddp_models.py's models train the same through gradswitch as through gloo (issue 42): a tiny
version of each (MLP, ResNet-style convnet, transformer LM), two spawned ranks on loopback with a real
gradswitchd, a few SGD steps with gloo DDP, gradswitch DDP (float32 and fixed32 wires) and the
uniform-chunk overlap. Every rank also computes the reference in-process (each rank's batch through its
own copy of the model, the gradients averaged by hand), so a path that does not sum the gradients
differs from it even if it agrees with another such path.
"""

from __future__ import annotations

import argparse
import sys

import pytest
from _netns import ROOT
from test_torch import _binary, _init, run_workers

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the gradswitch.torch tests need it")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")

TINY = {
    "mlp": ["--inputs", "12", "--width", "16", "--classes", "5", "--batch", "4"],
    "convnet": ["--channels", "4,8", "--image", "8", "--classes", "5", "--batch", "3"],
    "transformer": ["--vocab", "40", "--d-model", "16", "--heads", "2", "--layers", "2", "--seq", "6"],
}
STEPS = 3


@pytest.fixture
def switch(switch_factory):
    return switch_factory(binary=_binary(), threads=1)


def _args(model: str):
    sys.path.insert(0, str(ROOT / "bench"))
    import ddp_models

    p = argparse.ArgumentParser()
    ddp_models.add_arguments(p)
    a = p.parse_args(["--model", model, *TINY[model]])
    ddp_models.check_arguments(p, a)
    return ddp_models, a


def _train(m, a, wrap, batches) -> list[float]:
    """STEPS of SGD on this rank's batch through wrap(model); the loss before each step."""
    torch.manual_seed(0)
    model = m.make_model(a)
    net, overlap = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = m.loss_of(net(batches[0]), batches[1])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if overlap:
        overlap.remove()
    return losses


def _reference(m, a, world: int, rank: int) -> list[float]:
    """This rank's losses when every rank's gradients are averaged: computed here, one model copy per
    rank stepped with the mean of their gradients."""
    torch.manual_seed(0)
    copies = [m.make_model(a) for _ in range(world)]
    for c in copies[1:]:
        c.load_state_dict(copies[0].state_dict())
    data = [m.make_batch(a, torch.Generator().manual_seed(100 + r)) for r in range(world)]
    losses = []
    for _ in range(STEPS):
        grads = []
        for c, (x, y) in zip(copies, data, strict=True):
            c.zero_grad(set_to_none=True)
            loss = m.loss_of(c(x), y)
            loss.backward()
            grads.append([p.grad for p in c.parameters()])
            if c is copies[rank]:
                losses.append(loss.item())
        with torch.no_grad():
            for i, ps in enumerate(zip(*(c.parameters() for c in copies), strict=True)):
                mean = sum(g[i] for g in grads) / world
                for p in ps:
                    p -= 0.1 * mean
    return losses


def _worker(rank, world, switch_addr, model):
    from torch.nn.parallel import DistributedDataParallel as DDP

    gst = _init(switch_addr)
    gloo = dist.new_group(backend="gloo")
    fixed = dist.new_group(backend="gradswitch", pg_options=gst.Options(switch=switch_addr, wire="fixed32"))
    m, a = _args(model)
    batches = m.make_batch(a, torch.Generator().manual_seed(100 + rank))
    paths = {
        "gloo-ddp": lambda net: (DDP(net, process_group=gloo), None),
        "gs-ddp": lambda net: (DDP(net), None),
        "gs-ddp-fixed32": lambda net: (DDP(net, process_group=fixed), None),
        "gs-overlap": lambda net: (net, gst.ChunkedOverlap(net, chunk_bytes=1 << 10)),
    }
    out = {name: _train(m, a, wrap, batches) for name, wrap in paths.items()}
    out["reference"] = _reference(m, a, world, rank)
    dist.destroy_process_group()
    return out


@pytest.mark.parametrize("model", sorted(TINY))
def test_model_trains_the_same_through_gradswitch_as_gloo(switch, model):
    for rank, losses in enumerate(run_workers(_worker, switch.address, model, timeout=120)):
        ref = losses.pop("reference")
        assert ref[0] != ref[-1], "the reference did not train: the test would not see unsummed gradients"
        for name, got in losses.items():
            # fixed32 rounds each gradient to the wire's fixed point (docs/protocol.md): close, not equal
            tol = 1e-3 if name.endswith("fixed32") else 1e-5
            assert got == pytest.approx(ref, rel=tol, abs=tol), f"rank {rank} {model} {name}: {got} vs {ref}"


def test_time_to_accuracy_is_the_training_time_until_the_first_epoch_at_the_target():
    """examples/train_ddp.py --target-accuracy (bench/torch_testbed.py --digits reads it)."""
    sys.path.insert(0, str(ROOT / "examples"))
    from train_ddp import time_to_target

    hist = [
        {"epoch": 1, "accuracy": 80.0, "wall_s": 1.0},
        {"epoch": 2, "accuracy": 95.5, "wall_s": 1.5},
        {"epoch": 3, "accuracy": 97.0, "wall_s": 1.0},
    ]
    assert time_to_target(hist, 95.0) == {"target_accuracy": 95.0, "time_to_target_s": 2.5, "target_epoch": 2}
    assert time_to_target(hist, 99.0)["time_to_target_s"] is None
    assert time_to_target(hist, None) == {}


def test_digits_entries_name_a_backend_a_wire_and_error_feedback():
    """bench/torch_testbed.py --digits BACKEND[:WIRE[+ef]] (issue 38's accuracy runs)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from torch_testbed import digits_entries

    assert digits_entries("gloo,gradswitch:mx8,gradswitch:mx8+ef") == {
        "gloo": ("gloo", []),
        "gradswitch:mx8": ("gradswitch", ["--wire", "mx8"]),
        "gradswitch:mx8+ef": ("gradswitch", ["--wire", "mx8", "--error-feedback"]),
    }
    for bad in ("gloo:mx8", "gradswitch:int4", "gradswitch:mx8+pf", "nccl", ","):
        with pytest.raises(SystemExit):
            digits_entries(bad)


def test_teacher_task_is_learnable_and_held_out():
    """--task teacher: labels from the fixed teacher, a fresh batch per draw, a held-out test set that a
    trained MLP scores well above chance on and an untrained one does not."""
    _, a = _args("mlp")
    a.task, a.test_samples, a.batch = "teacher", 512, 32
    from ddp_models import make_batch, make_model, teacher_labels, test_accuracy

    g = torch.Generator().manual_seed(1)
    x, y = make_batch(a, g)
    assert torch.equal(y, teacher_labels(a, x))
    assert not torch.equal(make_batch(a, g)[0], x)
    torch.manual_seed(0)
    m = make_model(a)
    before = test_accuracy(a, m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(300):
        x, y = make_batch(a, g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    after = test_accuracy(a, m)
    assert after > 2 * 100 / a.classes and after > before + 20, (before, after)
