"""The "gradswitch" process group gives gloo's numbers: a matrix of dtype x op x layout x call form.

Two spawned ranks hold both a gradswitch group (a real gradswitchd on loopback) and a gloo group. Every
case builds the same inputs twice, reduces one copy through each group and compares them element by
element (bitwise: with two ranks every float sum, product and average has one rounding order). Where
gloo refuses a case, gradswitch must refuse it too, except integer AVG, which gloo refuses and
gradswitch defines as the SUM divided by the world size rounded toward zero (NCCL's integer average,
what Lightning computes on gloo): there the reference is gloo's SUM so divided.

Dtypes: float32, float64, float16, bfloat16, complex64, int32, int64, uint8, int8, bool, int16. Ops:
SUM, AVG, MAX, MIN, PRODUCT, BAND, BOR, BXOR. Layouts: contiguous, strided (a column slice), transposed,
expanded (stride 0), empty, 0-dim. Call forms: all_reduce, all_reduce(async_op=True) completed through
the Work's future, and all_reduce_coalesced of three tensors. Plus sparse SUM, a float64 wire, and the
legacy multi-tensor ProcessGroup.allreduce. One process-group set-up; every case runs in one loop and
the report names each case that differs.
"""

from __future__ import annotations

import itertools
import warnings
import zlib

import pytest
from test_torch import _binary, _init, run_workers

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the gradswitch.torch tests need it")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")

DTYPES = (
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "complex64",
    "int32",
    "int64",
    "uint8",
    "int8",
    "bool",
    "int16",
)
OPS = ("SUM", "AVG", "MAX", "MIN", "PRODUCT", "BAND", "BOR", "BXOR")
LAYOUTS = ("contiguous", "strided", "transposed", "expanded", "empty", "0-dim")
FORMS = ("sync", "async", "coalesced")


@pytest.fixture
def switch(switch_factory):
    return switch_factory(binary=_binary(), threads=1)


def _values(dtype: torch.dtype, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    """Random values over the dtype's whole range for integers (sums and products wrap), and floats
    whose sums and products stay finite."""
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)).to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 8).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=torch.int64).to(dtype)


def _make(dtype: torch.dtype, layout: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if layout == "contiguous":
        return _values(dtype, (5, 7), gen)
    if layout == "strided":
        return _values(dtype, (6, 10), gen)[:, 1::3]
    if layout == "transposed":
        return _values(dtype, (4, 9), gen).t()
    if layout == "expanded":
        return _values(dtype, (5, 1), gen).expand(5, 4)
    if layout == "empty":
        return _values(dtype, (0, 3), gen)
    return _values(dtype, (), gen)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        return bool(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()))
    return bool(torch.equal(a, b))


def _run(fn):
    """("ok", None) or ("error", message): the call and its wait, refusals included."""
    try:
        fn()
        return "ok", None
    except Exception as e:  # noqa: BLE001 - compared with gloo's refusal
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def _inputs(dtype, layout, form, seed):
    if form == "coalesced":
        return [
            _make(dtype, layout, seed),
            _make(dtype, "contiguous", seed + 7),
            _make(dtype, layout, seed + 13),
        ]
    return [_make(dtype, layout, seed)]


def _reference(ref, op, layout, int_avg, world, gloo):
    """gloo's answer, in place in `ref` (whose non-dense tensors it replaces by contiguous copies)."""
    for i, t in enumerate(ref):
        if layout in ("strided", "expanded"):
            # gloo reduces a non-dense tensor's memory as if it were dense: wrong numbers for a strided
            # slice, reads and writes past an expanded tensor's storage (a crash). Its answer for these
            # elements is its answer for a contiguous copy.
            ref[i] = t = t.contiguous()
        dist.all_reduce(t, op=dist.ReduceOp.SUM if int_avg else op, group=gloo)
        if int_avg:
            t.copy_(torch.div(t, world, rounding_mode="trunc"))


def _through_gradswitch(mine, op, form, gs):
    if form == "coalesced":
        dist.all_reduce_coalesced(mine, op=op, group=gs)
    elif form == "async":
        work = dist.all_reduce(mine[0], op=op, group=gs, async_op=True)
        try:
            got = work.get_future().wait()
        finally:
            work.wait()  # a Work never waited is waited (its error raised) by the next barrier
        # torch hands a complex tensor to the backend as its float view (view_as_real)
        want = torch.view_as_real(mine[0]) if mine[0].is_complex() else mine[0]
        assert len(got) == 1 and _same(got[0], want), "the future's value is not the tensor"
    else:
        dist.all_reduce(mine[0], op=op, group=gs)


def _case(dname, opname, layout, form, rank, world, gs, gloo):
    """(status, mismatches, ran on the switch) of one case."""
    dtype, op = getattr(torch, dname), getattr(dist.ReduceOp, opname)
    case = f"{dname} {opname} {layout} {form}"
    seed = zlib.crc32(case.encode()) * world + rank
    int_avg = opname == "AVG" and not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    ref, mine = _inputs(dtype, layout, form, seed), _inputs(dtype, layout, form, seed)
    strides = [t.stride() for t in mine]
    before = pg_ops(gs)
    ref_status, ref_msg = _run(lambda: _reference(ref, op, layout, int_avg, world, gloo))
    status, msg = _run(lambda: _through_gradswitch(mine, op, form, gs))
    out = []
    if ref_status != status:
        out.append(f"{case}: gloo {ref_status} ({ref_msg}), gradswitch {status} ({msg})")
    elif status == "ok":
        if [t.stride() for t in mine] != strides:
            out.append(f"{case}: the tensors' strides changed")
        for i, (a, b) in enumerate(zip(ref, mine, strict=True)):
            if not _same(a, b):
                diff = (
                    (a.double() - b.double()).abs().max().item() if a.numel() and not a.is_complex() else "?"
                )
                out.append(
                    f"{case}: tensor {i} differs from gloo's (max |diff| {diff}):\n"
                    f"  gloo {a.flatten()[:8].tolist()}\n  mine {b.flatten()[:8].tolist()}"
                )
    return status, out, pg_ops(gs) > before


def _parity_worker(rank, world, switch_addr):
    warnings.filterwarnings("ignore")  # all_reduce_coalesced is deprecated; the tests still call it
    _init(switch_addr)
    gs = dist.distributed_c10d._get_default_group()
    gloo = dist.new_group(backend="gloo")
    mismatches, cases, on_switch, statuses = [], 0, 0, []
    for dname, opname, layout, form in itertools.product(DTYPES, OPS, LAYOUTS, FORMS):
        status, out, switched = _case(dname, opname, layout, form, rank, world, gs, gloo)
        mismatches += out
        statuses.append(status)
        on_switch += switched
        cases += 1

    # Both ranks made the same calls: a refusal at one rank only would have desynchronised the cases
    # after it (and they would differ). Not a gloo barrier: it waits gloo's earlier works and so
    # re-raises their errors, which this loop provokes on purpose.
    every = [None] * world
    dist.all_gather_object(every, statuses, group=gloo)
    if any(s != statuses for s in every):
        mismatches.append("the ranks disagree on which cases succeeded")

    # sparse tensors (an nn.Embedding(sparse=True) gradient): gloo sums them
    def sparse():
        i = torch.tensor([[0, 2, rank + 3]])
        return torch.sparse_coo_tensor(i, torch.tensor([1.5, -2.0, 4.0 + rank]), (6,))

    a, b = sparse(), sparse()
    dist.all_reduce(a, group=gloo)
    status, msg = _run(lambda: dist.all_reduce(b, group=gs))
    cases += 1
    if status != "ok":
        mismatches.append(f"sparse SUM: gloo ok, gradswitch error ({msg})")
    elif not torch.equal(a.to_dense(), b.to_dense()):
        mismatches.append(f"sparse SUM: gloo {a.to_dense().tolist()}, gradswitch {b.to_dense().tolist()}")

    # the legacy multi-tensor form reduces the list's tensors together (gloo's meaning)
    a = [torch.full((3,), 1.0 + rank), torch.full((3,), 10.0 * (rank + 1))]
    b = [x.clone() for x in a]
    gloo.allreduce(a).wait()
    gs.allreduce(b).wait()
    cases += 1
    if not all(torch.equal(x, y) for x, y in zip(a, b, strict=True)):
        mismatches.append(f"ProcessGroup.allreduce([a, b]): gloo {a}, gradswitch {b}")

    # float64 runs on the switch, in double precision, with wire="float64"
    g64 = dist.new_group(backend="gradswitch", pg_options={"switch": switch_addr, "wire": "float64"})
    x = torch.tensor([1.0 + 2**-40 * (rank + 1), 3.0], dtype=torch.float64)
    y = x.clone()
    before = pg_ops(g64)
    dist.all_reduce(x, group=gloo)
    dist.all_reduce(y, group=g64)
    cases += 1
    if not torch.equal(x, y) or pg_ops(g64) == before:
        mismatches.append(
            f"float64 wire: gloo {x.tolist()}, gradswitch {y.tolist()} (switch ops {pg_ops(g64)})"
        )
    return {"cases": cases, "mismatches": mismatches, "on_switch": on_switch}


def pg_ops(pg) -> int:
    """How many operations this gradswitch group's channel sent to the switch."""
    return pg.channel.stats()["ops"]


def test_allreduce_matches_gloo_for_every_dtype_op_layout_and_form(switch):
    out = run_workers(_parity_worker, switch.address, timeout=240)
    for rank, r in enumerate(out):
        assert r["cases"] == len(DTYPES) * len(OPS) * len(LAYOUTS) * len(FORMS) + 3
        assert not r["mismatches"], (
            f"rank {rank}: {len(r['mismatches'])} case(s) differ from gloo:\n"
            + "\n".join(r["mismatches"][:40])
        )
    # SUM/AVG of the dtypes the switch carries did run on the switch (not all through gloo)
    switch_dtypes = ("float32", "float16", "bfloat16", "complex64", "int32", "uint8", "int8", "bool")
    non_empty = len(LAYOUTS) - 1
    assert out[0]["on_switch"] >= len(switch_dtypes) * non_empty * len(FORMS), out[0]["on_switch"]
