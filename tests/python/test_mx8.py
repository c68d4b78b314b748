"""The mx8 wire end to end (docs/protocol.md 2.2): allreduces through a real gradswitchd on loopback,
bit for bit against the spec's rounding; the options it refuses before anything is sent; and error
feedback in the DDP comm hook and the process group, which moves what mx8 rounds away.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the mx8 reference uses it")

import gradswitch  # noqa: E402
from gradswitch.torch.error_feedback import ErrorFeedback, wire_round  # noqa: E402

# Sizes around the block (32) and the chunk (1376 elements with the default 1440-byte payload).
SIZES = [1, 31, 32, 33, 1375, 1376, 1377, 4097, 200_003]


def _input(rank: int, size: int, dtype=np.float32) -> np.ndarray:
    """Normal values whose scale changes every 100 elements (blocks of very different magnitudes)."""
    rng = np.random.default_rng(77 + rank)
    scale = np.exp2((np.arange(size) // 100) % 40 - 20.0)
    return (rng.standard_normal(size) * scale).astype(dtype)


def _q(x: np.ndarray) -> np.ndarray:
    return wire_round(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), "mx8").numpy()


def expected(world_inputs: list[np.ndarray]) -> np.ndarray:
    """What the spec makes the switch return for two ranks: each input encoded, the decoded values
    summed in fp32 (two addends: order-free), the sum encoded once."""
    a, b = (_q(x) for x in world_inputs)
    return _q((a + b).astype(np.float32))


def _mx8_worker(q, rank, world, address):
    import traceback

    out = {"results": []}
    try:
        with gradswitch.connect(address, job="mx8", rank=rank, world_size=world, wire="mx8", timeout=10) as g:
            for size in SIZES:
                x = _input(rank, size)
                g.allreduce(x)
                want = expected([_input(r, size) for r in range(world)])
                same = np.array_equal(x.view(np.uint32), want.view(np.uint32))
                out["results"].append(("float32", size, same, float(np.abs(x - want).max())))
            # A float64 tensor is rounded to float32 first, then travels as a float32 one.
            d = _input(rank, 5000).astype(np.float64) / 3
            g.allreduce(d)
            want = expected(
                [(_input(r, 5000).astype(np.float64) / 3).astype(np.float32) for r in range(world)]
            )
            out["results"].append(("float64", 5000, np.array_equal(d, want.astype(np.float64)), 0.0))
            # Integer tensors travel as int32 whatever the float wire: exact.
            n = np.arange(3000, dtype=np.int32) * (rank + 1)
            g.allreduce(n)
            out["results"].append(("int32", 3000, np.array_equal(n, np.arange(3000) * 3), 0.0))
    except Exception:
        out["error"] = traceback.format_exc()
    q.put((rank, out))


def test_mx8_allreduce_is_the_spec_bit_for_bit(start_switch):
    from test_allreduce import run_workers

    sw = start_switch()
    reports = run_workers(_mx8_worker, [(r, 2, sw.address) for r in range(2)], deadline_s=120)
    for rank, rep in reports.items():
        assert "error" not in rep, f"rank {rank}:\n{rep['error']}"
        bad = [r for r in rep["results"] if not r[2]]
        assert not bad, f"rank {rank}: results differ from the spec's rounding: {bad}"
    assert sw.stats()["completed"] > 0


def test_mx8_round_matches_an_independent_e4m3_search():
    """The torch replica (used by error feedback) against the E4M3 code table, element by element."""
    codes = []
    for b in range(0x7F):  # finite non-negative codes
        e, m = b >> 3, b & 7
        codes.append(m * 2.0**-9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    codes = np.array(codes)
    x = _input(3, 4096)
    y = _q(x)
    for blk in range(0, x.size, 32):
        xb = x[blk : blk + 32].astype(np.float64)
        amax = np.abs(xb).max()
        s = max(int(np.floor(np.log2(amax))) - 8, -127)
        v = np.abs(xb) / 2.0**s
        dist_ = np.abs(v[:, None] - codes[None, :])
        near = dist_ == dist_.min(axis=1, keepdims=True)
        # the nearest code; of two equally near, the even one
        pick = np.array(
            [next(c for c in np.flatnonzero(row) if row.sum() == 1 or c % 2 == 0) for row in near]
        )
        want = np.sign(xb) * codes[pick] * 2.0**s
        np.testing.assert_array_equal(y[blk : blk + 32].astype(np.float64), want)


def test_mx8_refuses_what_it_cannot_serve_before_anything_is_sent():
    # The ring carries 32- and 16-bit wires only: refused at connect, no switch contacted.
    with pytest.raises(ValueError, match="mx8.*switch only"):
        gradswitch.connect(
            None, wire="mx8", algorithm="ring", peers=["127.0.0.1:1", "127.0.0.1:2"], world_size=2, token="t"
        )
    with pytest.raises(ValueError, match="mx8.*switch only"):
        gradswitch.connect("127.0.0.1:1", wire="mx8", algorithm="auto")
    # Optimization in the switch holds fp32 parameters: refused, as for every wire but float32.
    with pytest.raises(ValueError, match="wire='float32'"):
        gradswitch.connect("127.0.0.1:1", wire="mx8", optimizer={"algo": "sgd", "lr": 0.1}, params=4)
    # Error feedback needs a wire a rank rounds alone.
    with pytest.raises(ValueError, match="error feedback"):
        ErrorFeedback("fixed32")
    with pytest.raises(TypeError, match="float32 residuals"):
        ErrorFeedback("mx8").apply(0, torch.zeros(4, dtype=torch.float64))


def test_error_feedback_sends_what_rounding_dropped():
    """Over many steps the sum of what a rank sends follows the sum of its true gradients to within
    one step's rounding; without feedback the gap grows with every step."""
    g = torch.zeros(32)
    g[0] = 300.0  # sets the block's scale to 2^0: elements under 2^-10 round to zero
    g[1:] = 0.0009
    ef = ErrorFeedback("mx8")
    sent_sum, plain_sum = torch.zeros(32), torch.zeros(32)
    for _ in range(100):
        b = g.clone()
        ef.apply(0, b)
        sent_sum += wire_round(b, "mx8")
        plain_sum += wire_round(g, "mx8")
    true = g * 100
    assert (plain_sum[1:] == 0).all()  # mx8 alone never sends them
    # What was sent trails the truth by the last step's residual: half a step (2^-10) at most.
    assert (sent_sum[1:] - true[1:]).abs().max() <= 2.0**-10


def _feedback_reference(grad: torch.Tensor, residual: torch.Tensor | None, wire: str):
    """Error feedback's step in torch operations alone (error_feedback.py's device-independent path)."""
    g = grad.clone() if residual is None else grad + residual
    return g, torch.nan_to_num(g - wire_round(g, wire), nan=0.0, posinf=0.0, neginf=0.0)


@pytest.mark.parametrize("wire", ["mx8", "float16", "bfloat16"])
def test_native_feedback_pass_matches_the_torch_reference_bit_for_bit(wire):
    """The CPU's one-pass kernel (src/common/feedback_round.h) against the torch operations, over odd
    lengths, blocks of every magnitude, and NaN, infinity, zeros and -0.0; two steps, so the residual's
    add is checked too."""
    gen = torch.Generator().manual_seed(5)
    for n in (1, 31, 33, 4095, 4097, 8193 + 17, 100_003):
        x = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-60, 60, (n,), generator=gen).float())
        x[:: max(n // 7, 1)] = 0.0
        if n > 40:
            x[3], x[17], x[35], x[36] = float("nan"), float("inf"), -0.0, 1e-42
        ef = ErrorFeedback(wire)
        want_r = None
        for step in range(2):
            g = x * (step + 1)
            want_g, want_r = _feedback_reference(g, want_r, wire)
            ef.apply("t", g)  # contiguous CPU float32: the native pass
            got_r = ef._residuals["t"]
            assert torch.equal(g.view(torch.int32)[~g.isnan()], want_g.view(torch.int32)[~want_g.isnan()])
            assert torch.equal(g.isnan(), want_g.isnan())
            assert torch.equal(got_r.view(torch.int32), want_r.view(torch.int32)), (wire, n, step)


def test_native_feedback_pass_refuses_bad_arrays():
    from gradswitch import _core

    g = torch.zeros(64)
    with pytest.raises(TypeError, match="float32"):
        _core.feedback_round(g.double(), g.double(), False, "mx8")
    with pytest.raises(ValueError, match="residual has 63 elements"):
        _core.feedback_round(g, torch.zeros(63), False, "mx8")
    with pytest.raises(ValueError, match="needs a wire of the worker's"):
        _core.feedback_round(g, torch.zeros(64), False, "int32")
    # float32 and fixed32 lose nothing a rank can keep: the residual is added and then 0 (what a
    # deadline job's sums lack fills it: test_straggler.py's unsummed).
    for wire in ("float32", "fixed32"):
        grad, res = torch.full((64,), 1.5), torch.full((64,), 0.25)
        _core.feedback_round(grad, res, True, wire)
        assert (grad == 1.75).all() and (res == 0).all(), wire
    with pytest.raises(ValueError, match="unknown wire"):
        _core.feedback_round(g, torch.zeros(64), False, "fp4")
    with pytest.raises(ValueError, match="C-contiguous"):
        _core.feedback_round(torch.zeros(8, 8).t(), torch.zeros(64), False, "mx8")
    # A non-contiguous gradient still gets feedback, through the torch path.
    t = torch.full((8, 8), 0.0009).t()
    t[0, 0] = 300.0
    ErrorFeedback("mx8").apply(0, t)


def _small_beside_large() -> torch.Tensor:
    """A block whose large element sets a scale under which mx8 rounds the others to zero."""
    g = torch.full((32,), 0.0009)
    g[0] = 300.0
    return g


class _Linear(torch.nn.Module):  # loss = p . g: its gradient is g, every step
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.zeros(32))

    def forward(self, g):
        return (self.p * g).sum()


def _sgd_40_steps(ddp, model, g) -> torch.Tensor:
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    for _ in range(40):
        opt.zero_grad()
        ddp(g).backward()
        opt.step()
    return model.p.detach().clone()


def _ddp_feedback_worker(rank, world, switch_addr):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradswitch.torch as gst

    dist.init_process_group("gloo")
    g = _small_beside_large()
    out = {}
    for name, feedback in (("plain", False), ("feedback", True)):
        state = gst.GradswitchState(switch_addr, wire="mx8", error_feedback=feedback)
        m = _Linear()
        d = DDP(m)
        d.register_comm_hook(state, gst.mx8_hook)
        out[name] = _sgd_40_steps(d, m, g)
        state.close()
    try:
        bad = gst.GradswitchState(switch_addr, wire="float32", error_feedback=True)
        m = _Linear()
        d = DDP(m)
        d.register_comm_hook(bad, gst.allreduce_hook)
        d(g).backward()
        out["refused"] = ""
    except Exception as e:  # noqa: BLE001 - the message is the result
        out["refused"] = str(e)
    return out


def test_ddp_mx8_hook_error_feedback_moves_small_gradients(start_switch):
    from test_torch import run_workers

    sw = start_switch(threads=1)
    results = run_workers(_ddp_feedback_worker, sw.address, timeout=120)
    for rank, out in enumerate(results):
        # Without feedback the small elements round to zero every step and never move.
        assert (out["plain"][1:] == 0).all(), f"rank {rank}: {out['plain'][:4]}"
        # With it they follow SGD's -lr * steps * g to within one step's rounding.
        err = (out["feedback"][1:] + 40 * 0.0009).abs().max().item()
        assert err <= 2.0**-10, f"rank {rank}: error feedback left {err}"
        assert "error_feedback=True needs a lossy wire" in out["refused"]
        assert torch.equal(out["feedback"], results[0]["feedback"])


# ---------------------------------------------------------------------------- the process group's


def _backend_feedback_worker(rank, world, switch_addr):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import gradswitch.torch as gst

    dist.init_process_group("gloo")
    groups = {
        fb: dist.new_group(
            backend="gradswitch",
            pg_options=gst.Options(switch=switch_addr, wire="mx8", timeout=20, error_feedback=fb),
        )
        for fb in (False, True)
    }
    g, large = _small_beside_large(), torch.zeros(32)
    large[0] = 256.0  # exact in mx8: no residual of its own
    out = {}
    for fb, pg in groups.items():
        t, other = torch.zeros(32), torch.zeros(32)
        acc, other_acc, fresh_acc = torch.zeros(32), torch.zeros(32), torch.zeros(32)
        for _ in range(40):
            t.copy_(g)  # the same tensor every step, as DDP's buckets
            dist.all_reduce(t, op=dist.ReduceOp.AVG, group=pg)
            acc += t
            other.copy_(large)  # a second tensor between them: must not take t's residual
            dist.all_reduce(other, op=dist.ReduceOp.AVG, group=pg)
            other_acc += other
            fresh = g.clone()  # a new tensor each step (often at the last one's address): no residual
            dist.all_reduce(fresh, op=dist.ReduceOp.AVG, group=pg)
            fresh_acc += fresh
            del fresh  # its memory free for the next step's clone
        out[fb] = (acc, other_acc, fresh_acc)
    pg = groups[True]
    ints = torch.arange(64, dtype=torch.int32)
    dist.all_reduce(ints, group=pg)  # exact: integers pass untouched
    out["ints"] = torch.equal(ints, torch.arange(64, dtype=torch.int32) * world)
    refused = {}
    try:
        dist.all_reduce(torch.ones(64, dtype=torch.bfloat16), group=pg)
        refused["bfloat16"] = ""
    except Exception as e:  # noqa: BLE001 - the message is the result
        refused["bfloat16"] = f"{type(e).__name__}: {e}"
    rows_pg = dist.new_group(
        backend="gradswitch",
        pg_options=gst.Options(switch=switch_addr, wire="mx8", timeout=20, error_feedback=True, sparse="on"),
    )
    coo = torch.sparse_coo_tensor(torch.tensor([[1, 3]]), torch.ones(2, 32), (8, 32))
    kept = g.clone()
    try:  # a coalesced pair: the dense tensor must not be touched (nothing sent, no residual taken)
        dist.all_reduce_coalesced([kept, coo], group=rows_pg)
        refused["rows"] = ""
    except Exception as e:  # noqa: BLE001
        refused["rows"] = f"{type(e).__name__}: {e}"
    out["kept"] = torch.equal(kept, g)
    dense = g.clone()
    dist.all_reduce(dense, op=dist.ReduceOp.AVG, group=rows_pg)  # dense block skipping: served
    out["sparse_dense"] = dense
    out["refused"] = refused
    # DDP over the process group: its buckets must find their residuals step after step.
    for fb, pg in groups.items():
        m = _Linear()
        out[("ddp", fb)] = _sgd_40_steps(DDP(m, process_group=pg), m, g)
    dist.destroy_process_group()
    return out


def test_process_group_error_feedback_follows_the_true_mean(start_switch):
    from test_torch import run_workers

    sw = start_switch(threads=1)
    results = run_workers(_backend_feedback_worker, sw.address, timeout=120)
    g = _small_beside_large()
    for rank, out in enumerate(results):
        plain, plain_other, plain_fresh = out[False]
        acc, other, fresh = out[True]
        # Without feedback the small elements' mean is zero at every step.
        assert (plain[1:] == 0).all(), f"rank {rank}: {plain[:4]}"
        # With it, the sum of 40 means trails 40 x the true mean by one step's rounding at most.
        err = (acc[1:] - 40 * g[1:]).abs().max().item()
        assert err <= 2.0**-10, f"rank {rank}: error feedback left {err}"
        # Residuals are the tensor's own: the other tensor and the fresh ones get none of t's.
        assert torch.equal(other, plain_other) and other[1:].eq(0).all(), f"rank {rank}: {other[:4]}"
        assert torch.equal(fresh, plain_fresh), f"rank {rank}: a fresh tensor got a residual {fresh[:4]}"
        assert out["ints"], f"rank {rank}: integers changed under error feedback"
        assert "float32 residuals" in out["refused"]["bfloat16"], out["refused"]
        assert out["kept"], f"rank {rank}: a refused call touched its float32 tensor"
        assert "sparse COO tensor's rows" in out["refused"]["rows"], out["refused"]
        assert torch.equal(out["sparse_dense"], wire_round(g, "mx8")), out["sparse_dense"][:4]
        assert torch.equal(acc, results[0][True][0])
        # DDP: as through the hook (test_ddp_mx8_hook_error_feedback_moves_small_gradients).
        assert (out[("ddp", False)][1:] == 0).all(), out[("ddp", False)][:4]
        err = (out[("ddp", True)][1:] + 40 * g[1:]).abs().max().item()
        assert err <= 2.0**-10, f"rank {rank}: error feedback through DDP's buckets left {err}"


def test_process_group_error_feedback_refuses_before_contacting_anything():
    import torch.distributed as dist

    from gradswitch.torch._backend import Options, ProcessGroupGradswitch

    store = dist.HashStore()  # nothing is written to it: the refusals come first
    for opts, match in (
        (dict(wire="float32"), "needs a lossy wire"),
        (dict(wire="fixed32"), "needs a lossy wire"),
        (dict(wire="mx8", algorithm="ring"), "algorithm='switch'"),
        (dict(wire="float16", algorithm="auto"), "algorithm='switch'"),
    ):
        with pytest.raises(ValueError, match=match):
            options = Options(switch="127.0.0.1:1", error_feedback=True, **opts)
            ProcessGroupGradswitch(store, 0, 1, options=options)
    assert not store.check(["gradswitch/job"])
