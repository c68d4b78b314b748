"""The models bench/torch_iteration.py trains (issue 42): the communication-bound MLP, a ResNet-style
convnet on synthetic images, a small transformer language model on synthetic tokens and an embedding-bag
model whose steps touch a few rows of a large table (issue 38, bench/sparse_bench.py). Each is made
from a seed (nothing downloaded), with its batch and its loss; `bound_s` is the iteration time the link
allows a model, from a run's own no-communication phases and the wire time of its gradients.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("mlp", "convnet", "transformer", "embbag")
GS_HEADERS = 20 + 8 + 32  # IPv4 + UDP + gradswitch header per datagram (docs/protocol.md)
TCP_HEADERS = 20 + 32  # IPv4 + TCP with timestamps per segment (gloo's ring)
ETHERNET = 14  # what tc's shaper counts beyond the IP packet


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The model options of bench/torch_iteration.py (and bench/torch_testbed.py, which passes them on)."""
    p.add_argument("--model", choices=MODELS, default="mlp", help="what to train (default mlp)")
    p.add_argument("--batch", type=int, default=None, help="per worker (16; convnet 8, LM 4)")
    g = p.add_argument_group("mlp")
    g.add_argument("--width", type=int, default=4096)
    g.add_argument("--depth", type=int, default=2, help="hidden layers")
    g.add_argument("--inputs", type=int, default=1024)
    g.add_argument("--classes", type=int, default=1000, help="also the convnet's")
    g.add_argument(
        "--task",
        choices=("random", "teacher"),
        default="random",
        help="random (default: random labels, one fixed batch per rank, for timing) or teacher (labels of a "
        "fixed random linear teacher, a fresh batch every iteration, and the test accuracy on --test-samples "
        "held-out samples at the end: an accuracy check, issue 38)",
    )
    g.add_argument("--test-samples", type=int, default=4096, help="with --task teacher: the held-out set")
    g = p.add_argument_group("convnet (resnet18's layout: 2 basic blocks per stage)")
    g.add_argument("--image", type=int, default=64, help="side of the synthetic square RGB images")
    g.add_argument("--channels", default="64,128,256,512", help="width of each stage")
    g = p.add_argument_group("transformer (pre-norm decoder, causal self-attention)")
    g.add_argument("--vocab", type=int, default=16384)
    g.add_argument("--d-model", type=int, default=512)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--seq", type=int, default=64, help="tokens per sequence")
    g = p.add_argument_group("embbag (nn.EmbeddingBag, sum of each sample's rows, then a small MLP)")
    g.add_argument("--rows", type=int, default=1_000_000, help="rows of the table")
    g.add_argument("--dim", type=int, default=64, help="the table's columns")
    g.add_argument("--touch", type=float, default=0.026, help="share of the rows one worker's batch reads")


def check_arguments(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """p.error() on sizes no model can be built with."""
    if a.batch is None:
        a.batch = {"mlp": 16, "convnet": 8, "transformer": 4, "embbag": 16}[a.model]
    try:
        a.stage_channels = [int(c) for c in a.channels.split(",")]
    except ValueError:
        p.error(f"--channels {a.channels!r}: a comma list of integers, e.g. 64,128,256,512")
    sizes = {"--batch": a.batch, "--width": a.width, "--inputs": a.inputs, "--classes": a.classes}
    sizes.update({"--image": a.image, "--vocab": a.vocab, "--d-model": a.d_model, "--seq": a.seq})
    sizes.update({"--heads": a.heads, "--channels": min(a.stage_channels, default=0)})
    sizes.update({"--depth": a.depth + 1, "--layers": a.layers, "--rows": a.rows, "--dim": a.dim})
    bad = [f"{k} {v}" for k, v in sizes.items() if v < 1]
    if bad:
        p.error(f"must be at least 1: {', '.join(bad)}")
    if not 0 < a.touch <= 1 or a.touch * a.rows < a.batch:
        p.error(f"--touch {a.touch}: a share in (0, 1] of --rows {a.rows} holding a row per sample")
    if a.task == "teacher" and (a.model != "mlp" or a.test_samples < 1):
        p.error("--task teacher needs --model mlp and --test-samples of at least 1")
    if a.d_model % a.heads:
        p.error(f"--d-model {a.d_model} is not a multiple of --heads {a.heads}")
    if a.image < 2 ** (len(a.stage_channels) + 1):
        stages = len(a.stage_channels)
        p.error(f"--image {a.image} is too small for {stages} stages (a stride-2 stem, then /2 each)")


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))


class ResNet(nn.Module):
    """resnet18's layout (torchvision is not a dependency): a 3x3 stride-2 stem for small images, then
    two basic blocks per stage, each stage after the first halving the side."""

    def __init__(self, channels: list[int], classes: int):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels[0], 3, 2, 1, bias=False), nn.BatchNorm2d(channels[0]), nn.ReLU()
        )
        blocks, cin = [], channels[0]
        for i, c in enumerate(channels):
            blocks += [BasicBlock(cin, c, 1 if i == 0 else 2), BasicBlock(c, c, 1)]
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class TinyLM(nn.Module):
    """A decoder-only language model: token and position embeddings, pre-norm transformer layers with
    a causal mask, the output head tied to the token embedding."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        nn.init.normal_(self.tok.weight, std=0.02)  # the tied head's logits start near zero
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

    def forward(self, x):
        h = self.body(self.tok(x) + self.pos[: x.shape[1]], mask=self.mask, is_causal=True)
        return self.norm(h) @ self.tok.weight.t()


class EmbeddingBagNet(nn.Module):
    """A recommender's shape: a table of rows summed per sample (nn.EmbeddingBag), then an MLP. The
    table's gradient is dense (bench/torch_iteration.py's "+coo" configurations make it a sparse COO
    tensor of the rows read)."""

    def __init__(self, rows: int, dim: int, classes: int):
        super().__init__()
        self.table = nn.EmbeddingBag(rows, dim, mode="sum")
        self.head = nn.Sequential(nn.Linear(dim, 256), nn.ReLU(), nn.Linear(256, classes))

    def forward(self, x):
        return self.head(self.table(x))


def make_model(a: argparse.Namespace) -> nn.Module:
    """The model of --model with its sizes, from torch's current seed."""
    if a.model == "embbag":
        return EmbeddingBagNet(a.rows, a.dim, a.classes)
    if a.model == "convnet":
        return ResNet(a.stage_channels, a.classes)
    if a.model == "transformer":
        return TinyLM(a.vocab, a.d_model, a.layers, a.heads, a.seq)
    layers, d = [], a.inputs
    for _ in range(a.depth):
        layers += [nn.Linear(d, a.width), nn.ReLU()]
        d = a.width
    layers.append(nn.Linear(d, a.classes))
    return nn.Sequential(*layers)


def make_batch(a: argparse.Namespace, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one worker's batch, from its generator."""
    if a.model == "convnet":
        x = torch.randn(a.batch, 3, a.image, a.image, generator=g)
        return x, torch.randint(0, a.classes, (a.batch,), generator=g)
    if a.model == "transformer":
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]
    if a.model == "embbag":  # --touch of the rows, distinct, in bags of equal size
        bag = int(a.touch * a.rows) // a.batch
        rows = torch.randperm(a.rows, generator=g)[: a.batch * bag]
        return rows.view(a.batch, bag), torch.randint(0, a.classes, (a.batch,), generator=g)
    x = torch.randn(a.batch, a.inputs, generator=g)
    if getattr(a, "task", "random") == "teacher":
        return x, teacher_labels(a, x)
    return x, torch.randint(0, a.classes, (a.batch,), generator=g)


# --task teacher's seeds: the teacher and the held-out inputs are the same for every rank and run, and
# apart from the ranks' training generators (bench/torch_iteration.py seeds those 1000 + rank).
TEACHER_SEED, TEST_SEED = 4242, 4343


def teacher_labels(a: argparse.Namespace, x: torch.Tensor) -> torch.Tensor:
    """The class a fixed random linear map of the inputs ranks highest: learnable by the MLP."""
    w = torch.randn(a.inputs, a.classes, generator=torch.Generator().manual_seed(TEACHER_SEED))
    return (x @ w).argmax(dim=1)


def test_accuracy(a: argparse.Namespace, model: nn.Module) -> float:
    """--task teacher: the model's accuracy (percent) on --test-samples held-out inputs."""
    x = torch.randn(a.test_samples, a.inputs, generator=torch.Generator().manual_seed(TEST_SEED))
    with torch.no_grad():
        return (model(x).argmax(dim=1) == teacher_labels(a, x)).float().mean().item() * 100


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the classes (the LM's: over the vocabulary at every position)."""
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def describe(a: argparse.Namespace, nparams: int) -> str:
    size = f"{nparams / 1e6:.1f} M parameters ({nparams * 4 / 2**20:.0f} MiB of fp32 gradients)"
    if a.model == "convnet":
        what = f"ResNet-style convnet {a.channels} x2 blocks on {a.image}x{a.image} images"
    elif a.model == "embbag":
        what = f"EmbeddingBag {a.rows} x {a.dim} + MLP {a.dim}-256-{a.classes}, {a.touch:.1%} of rows/worker"
    elif a.model == "transformer":
        what = f"transformer LM, {a.layers} layers, d {a.d_model}, vocab {a.vocab}, {a.seq} tokens"
    else:
        what = f"MLP {a.inputs}-{'-'.join([str(a.width)] * a.depth)}-{a.classes}"
    return f"{what}: {size}, batch {a.batch}/worker"


def wire_s(grad_bytes: int, rate_bps: float, mtu: int, workers: int, system: str) -> float:
    """Seconds the busiest link direction needs for one iteration's gradients, headers included: through
    the switch each worker sends and receives M once; gloo's ring moves 2(N-1)/N M each way per link."""
    if system == "gloo":
        payload, factor = mtu - TCP_HEADERS, 2 * (workers - 1) / workers
    else:
        payload, factor = (mtu - GS_HEADERS) // 4 * 4, 1.0
    return grad_bytes * factor * (mtu + ETHERNET) / payload * 8 / rate_bps


def bound_s(local: dict, wire: float) -> float:
    """forward + max(backward, first gradient + wire time) + optimizer step (issue 42): the iteration
    whose communication streams from the first gradient and hides behind the rest of the backward."""
    return local["forward_s"] + max(local["backward_comm_s"], local["first_grad_s"] + wire) + local["step_s"]
