"""PyTorch integration (gradswitch.torch): the "gradswitch" process group, DDP, comm hooks, chunked overlap,
DistributedOptimizer, CUDA staging, and the training example under torchrun.

Worker processes are started with the spawn context (or torchrun for the example) against a real
gradswitchd on loopback; every wait is bounded. World sizes are 2 to keep the suite small.
"""

from __future__ import annotations

import faulthandler
import io
import json
import multiprocessing as mp
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
from _daemon import daemon_binary
from _ranks import join_or_kill

torch = pytest.importorskip("torch", reason="PyTorch is not importable: the gradswitch.torch tests need it")
dist = pytest.importorskip("torch.distributed", reason="this PyTorch has no torch.distributed")

import gradswitch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
WORLD = 2


def _binary() -> str:
    return daemon_binary()


@pytest.fixture
def switch(switch_factory):
    return switch_factory(binary=_binary(), threads=1)


def _free_port() -> int:
    """A free TCP port below the kernel's ephemeral range, for rank 0's TCPStore.

    A port the kernel picked for us (bind to 0) is free now, but between our close and rank 0's listen
    (seconds: spawning and importing torch) any socket that binds or connects may be given the same
    ephemeral port (seen in CI: EADDRINUSE). Ports below the ephemeral range are never handed out that way.
    """
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10_000, max(low, 10_001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port found in 10000..{low - 1}")


# ---------------------------------------------------------------------------- process runner


def _entry(fn, rank, world, port, env, args, q):
    os.environ.update(env)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # run_workers asks for stacks on a timeout
    try:
        buf = io.BytesIO()  # tensors through a queue would be shared-memory handles of a dying process
        torch.save(fn(rank, world, *args), buf)
        q.put((rank, "ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent
        q.put((rank, "error", traceback.format_exc()))


def run_workers(fn, *args, world=WORLD, env=None, timeout=90.0):
    """Runs fn(rank, world, *args) in `world` spawned processes; returns their results by rank."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = _free_port()
    env = {k: str(v) for k, v in (env or {}).items()}
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, port, env, args, q), daemon=True) for r in range(world)
    ]
    for p in procs:
        p.start()
    results, errors = {}, {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                for p in procs:  # say where they are stuck: every thread's Python stack, on stderr
                    if p.is_alive():
                        os.kill(p.pid, signal.SIGUSR1)
                time.sleep(1.0)
                pytest.fail(
                    f"workers did not finish within {timeout}s (done: {sorted(results)}; errors: {errors}); "
                    "the stacks of the workers still running are in the captured stderr"
                )
            try:
                rank, status, value = q.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead and len(results) + len(errors) < world and not q.qsize():
                    time.sleep(1.0)
                    if q.empty():
                        pytest.fail(
                            f"a worker died (exit codes {[p.exitcode for p in procs]}); errors: {errors}"
                        )
                continue
            if status == "ok":
                results[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                errors[rank] = value
    finally:
        join_or_kill(procs, 10)
    if errors:
        pytest.fail("worker error(s):\n" + "\n".join(f"[rank {r}] {tb}" for r, tb in sorted(errors.items())))
    return [results[r] for r in range(world)]


def _init(switch_addr, **options):
    import gradswitch.torch as gst

    dist.init_process_group("gradswitch", pg_options=gst.Options(switch=switch_addr, timeout=20, **options))
    return gst


# ---------------------------------------------------------------------------- collectives


def _collectives_worker(rank, world, switch_addr):
    gst = _init(switch_addr)
    assert dist.get_backend() == "gradswitch"
    pg = gst.gradswitch_group()
    assert pg is not None and pg.group.world_size == world

    def check(t, expect, tol=0.0):
        assert torch.allclose(t.double(), expect.double(), atol=tol, rtol=0), (t, expect)

    base = torch.arange(1000, dtype=torch.float32)
    total = sum(base * (r + 1) for r in range(world))
    t = base * (rank + 1)
    dist.all_reduce(t)
    check(t, total)
    t = base * (rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check(t, total / world, 1e-4)
    for dtype in (torch.float64, torch.bfloat16, torch.float16, torch.int32):
        t = (base[:64] * (rank + 1)).to(dtype)  # small integers: exact in every dtype
        dist.all_reduce(t)
        assert t.dtype == dtype
        check(t, total[:64])
    t = torch.full((7,), 2**40 + rank, dtype=torch.int64)  # int64: exact, through the internal gloo group
    dist.all_reduce(t)
    assert t.tolist() == [2 * 2**40 + 1] * 7
    m = (base[:600].view(20, 30) * (rank + 1)).t()  # not contiguous
    dist.all_reduce(m)
    check(m, total[:600].view(20, 30).t())
    # asynchronous works with futures; several in flight at once
    ts = [torch.full((50_000,), float(rank + i)) for i in range(4)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    futs = [w.get_future() for w in works]
    for i, (w, f) in enumerate(zip(works, futs, strict=True)):
        assert w.wait()
        assert torch.equal(f.value()[0], ts[i])
        check(ts[i], torch.full((50_000,), float(sum(r + i for r in range(world)))))
    # everything else: internal gloo group
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=1)
    check(b, torch.full((5,), 1.0))
    out = [torch.zeros(3) for _ in range(world)]
    dist.all_gather(out, torch.full((3,), float(rank)))
    assert [o[0].item() for o in out] == list(range(world))
    big = torch.zeros(3 * world)
    dist.all_gather_into_tensor(big, torch.full((3,), float(rank)))
    assert big.tolist() == [float(r) for r in range(world) for _ in range(3)]
    rs = torch.zeros(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * world, dtype=torch.float32))
    check(rs, torch.arange(2 * world, dtype=torch.float32)[2 * rank : 2 * rank + 2] * world)
    objs = [{"rank": rank}]
    dist.broadcast_object_list(objs, src=0)
    assert objs[0] == {"rank": 0}
    dist.barrier()
    # a second gradswitch group (its own job at the switch)
    g2 = dist.new_group(backend="gradswitch", pg_options=gst.Options(switch=switch_addr))
    t = torch.ones(10)
    dist.all_reduce(t, group=g2)
    check(t, torch.full((10,), float(world)))
    # ops the switch does not compute run on gloo by default (a metrics MAX must not break)...
    m = torch.tensor([float(rank), -float(rank)])
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    check(m, torch.tensor([float(world - 1), 0.0]))
    m = torch.full((3,), float(rank + 1))
    dist.all_reduce(m, op=dist.ReduceOp.MIN)
    check(m, torch.ones(3))
    m = torch.full((2,), 2.0)
    dist.all_reduce(m, op=dist.ReduceOp.PRODUCT)
    check(m, torch.full((2,), 2.0**world))
    # ... and are refused with other_ops="error"
    strict_opts = gst.Options(switch=switch_addr, other_ops="error")
    strict = dist.new_group(backend="gradswitch", pg_options=strict_opts)
    # clear errors
    errors = {}
    for name, call in {
        "max": lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.MAX, group=strict),
        "avg_bool": lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG),
        "overlap": lambda: dist.all_reduce(torch.ones(6).as_strided((2, 3), (1, 1))),
    }.items():
        try:
            call()
            errors[name] = None
        except Exception as e:  # noqa: BLE001
            errors[name] = f"{type(e).__name__}: {e}"
    # 8-bit and bool SUM, integer AVG (the SUM divided by the world size, toward zero): as gloo, and
    # tests/python/test_torch_parity.py compares every dtype and op with gloo
    u = torch.full((4,), 200, dtype=torch.uint8)
    dist.all_reduce(u)
    assert u.tolist() == [(200 * world) % 256] * 4
    a = torch.full((3,), 2 * rank + 1, dtype=torch.int64)  # Lightning's batch-size counter
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    assert a.tolist() == [sum(2 * r + 1 for r in range(world)) // world] * 3
    # the group still works after refused calls
    t = torch.ones(3)
    dist.all_reduce(t)
    check(t, torch.full((3,), float(world)))
    stats = pg.channel.stats()
    dist.destroy_process_group()
    return {"errors": errors, "ops": stats["ops"]}


def test_process_group_collectives(switch):
    results = run_workers(_collectives_worker, switch.address)
    errors = results[0]["errors"]
    assert (
        "ReduceOp.MAX" in errors["max"]
        and "ReduceOp.SUM" in errors["max"]
        and "ReduceOp.AVG" in errors["max"]
        and "other_ops='error'" in errors["max"]
    )
    assert "AVG" in errors["avg_bool"] and "bool" in errors["avg_bool"]
    assert "share memory" in errors["overlap"]
    assert results[0]["ops"] >= 10


def _sharded_worker(rank, world, switch_addr):
    os.environ["GRADSWITCH_SWITCH"] = switch_addr  # "a:port,b:port": the job is sharded over both
    import gradswitch.torch as gst

    dist.init_process_group("gradswitch", pg_options=gst.Options(timeout=20))
    x = torch.arange(100_003, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(x)
    y = torch.full((5,), float(rank), dtype=torch.float32)
    dist.all_reduce(y, op=dist.ReduceOp.AVG)
    dist.destroy_process_group()
    return {"sum": x, "avg": y}


def test_process_group_over_sharded_switches(switch_factory):
    a, b = (switch_factory(binary=_binary(), threads=1) for _ in range(2))
    results = run_workers(_sharded_worker, f"{a.address},{b.address}")
    want = torch.arange(100_003, dtype=torch.float32) * 3  # ranks 1x and 2x
    for r in results:
        assert torch.equal(r["sum"], want) and torch.equal(r["avg"], torch.full((5,), 0.5))
    assert a.stats()["completed"] > 0 and b.stats()["completed"] > 0


# ---------------------------------------------------------------------------- errors at start


def _switch_down_worker(rank, world, dead_addr):
    import gradswitch.torch as gst

    store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, rank == 0)
    out = {}
    for name, opts in {
        "down": gst.Options(switch=dead_addr, connect_timeout=2.0),
        "none": gst.Options(),
    }.items():
        os.environ.pop("GRADSWITCH_SWITCH", None)
        t0 = time.monotonic()
        try:
            dist.init_process_group(
                "gradswitch",
                store=dist.PrefixStore(name, store),
                rank=rank,
                world_size=world,
                pg_options=opts,
            )
            out[name] = ("no error", time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001
            out[name] = (f"{type(e).__name__}: {e}", time.monotonic() - t0)
    store.add("finished", 1)  # rank 0 hosts the store: it leaves last
    deadline = time.monotonic() + 20
    while rank == 0 and store.add("finished", 0) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    return out


def test_switch_down_gives_clear_error():
    dead = f"127.0.0.1:{_free_port()}"  # nothing listens there
    results = run_workers(_switch_down_worker, dead, timeout=60)
    for r in results:
        msg, took = r["down"]
        assert "could not join" in msg and dead in msg, msg
        assert took < 20, took
        msg, took = r["none"]
        assert "no switch address" in msg and "GRADSWITCH_SWITCH" in msg, msg
        assert took < 20, took


# ---------------------------------------------------------------------------- hooks, overlap, optimizer


def _toy_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 3),
    )


def _batches(steps, world):
    g = torch.Generator().manual_seed(123)
    return [
        (torch.randn(8 * world, 20, generator=g), torch.randint(0, 3, (8 * world,), generator=g))
        for _ in range(steps)
    ]


def _train(model, opt, batches, rank, world, wrap=None, after_backward=None):
    net = wrap(model) if wrap else model
    for x, y in batches:
        xs, ys = x[8 * rank : 8 * (rank + 1)], y[8 * rank : 8 * (rank + 1)]
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(net(xs), ys).backward()
        if after_backward:
            after_backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _paths_worker(rank, world, switch_addr):
    from torch.nn.parallel import DistributedDataParallel as DDP

    gst = _init(switch_addr)
    steps = 4
    batches = _batches(steps, world)
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)  # noqa: E731
    out = {}
    # reference: one process, the whole global batch (mean over equal halves == average of gradients)
    m = _toy_model()
    opt = sgd(m)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
    out["reference"] = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    # DDP over the gradswitch process group (the process-group path)
    m = _toy_model()
    out["ddp"] = _train(m, sgd(m), batches, rank, world, wrap=lambda mod: DDP(mod, bucket_cap_mb=0.01))
    # DDP over gloo with the gradswitch comm hooks
    gloo = dist.new_group(backend="gloo")
    state = gst.GradswitchState(switch_addr, process_group=gloo)
    for name, hook in (
        ("hook_float32", gst.allreduce_hook),
        ("hook_fixed32", gst.fixed32_hook),
        ("hook_float16", gst.float16_hook),
        ("hook_bfloat16", gst.bfloat16_hook),
    ):
        m = _toy_model()

        def wrap(mod, hook=hook):
            d = DDP(mod, process_group=gloo, bucket_cap_mb=0.01)
            d.register_comm_hook(state, hook)
            return d

        out[name] = _train(m, sgd(m), batches, rank, world, wrap=wrap)
    # uniform-chunk overlap, chunks smaller than some parameters and spanning others
    m = _toy_model()
    ov = gst.ChunkedOverlap(m, chunk_bytes=4096)
    assert len(ov.chunks) > 3
    out["overlap"] = _train(m, sgd(m), batches, rank, world)
    ov.remove()
    # DistributedOptimizer (+ the broadcasts, from a rank-dependent start)
    m = _toy_model(seed=rank)
    opt = gst.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters(), chunk_bytes=8192)
    assert isinstance(opt, torch.optim.SGD)
    gst.broadcast_parameters(m.state_dict(), root_rank=0)
    gst.broadcast_optimizer_state(opt, root_rank=0)
    out["optimizer"] = _train(m, opt, batches, rank, world)
    # DistributedOptimizer through a hook state over gloo (no gradswitch process group needed)
    m = _toy_model()
    opt = gst.DistributedOptimizer(sgd(m), named_parameters=m.named_parameters(), comm=state)
    out["optimizer_state"] = _train(m, opt, batches, rank, world)
    state.close()
    dist.destroy_process_group()
    return out


def test_hooks_overlap_and_optimizer_match_process_group(switch):
    results = run_workers(_paths_worker, switch.address, timeout=120)
    ref = results[0]["reference"]
    for rank, out in enumerate(results):
        for name, w in out.items():
            tol = 2e-2 if name in ("hook_float16", "hook_bfloat16") else 1e-5
            err = (w - ref).abs().max().item()
            assert err <= tol, f"rank {rank} {name}: max |w - reference| = {err}"
            # ranks agree (float32 sums may differ in the last bit between paths, not between ranks)
            assert torch.equal(w, results[0][name]), f"{name}: rank {rank} differs from rank 0"
        assert (out["ddp"] - out["hook_float32"]).abs().max() <= 1e-5
        assert (out["ddp"] - out["optimizer"]).abs().max() <= 1e-5


def _no_torch_dist_state_worker(rank, world, switch_addr):
    """Hooks refuse a wrong state; ChunkedOverlap without a gradswitch group explains what to do."""
    import gradswitch.torch as gst

    dist.init_process_group("gloo")
    msgs = []
    try:
        gst.ChunkedOverlap(_toy_model())
    except RuntimeError as e:
        msgs.append(str(e))
    dist.destroy_process_group()
    return msgs


def test_overlap_needs_a_gradswitch_path():
    results = run_workers(_no_torch_dist_state_worker, None)
    assert "GradswitchState" in results[0][0]


# ---------------------------------------------------------------------------- CUDA staging


def _cuda_worker(rank, world, switch_addr):
    _init(switch_addr, cuda_piece_bytes=1 << 16)
    dev = torch.device("cuda", 0)
    n = 300_001  # several pinned pieces, the last one short
    t = torch.arange(n, dtype=torch.float32, device=dev) * (rank + 1)
    dist.all_reduce(t)
    expect = torch.arange(n, dtype=torch.float32, device=dev) * sum(range(1, world + 1))
    ok = torch.equal(t, expect)
    h = torch.ones(1000, dtype=torch.float16, device=dev)
    dist.all_reduce(h, op=dist.ReduceOp.AVG)
    c = torch.ones(5)  # CPU after CUDA: ordering preserved
    dist.all_reduce(c)
    dist.destroy_process_group()
    return {"ok": ok, "half": h.float().mean().item(), "cpu": c.tolist()}


def test_cuda_tensors_staged_through_pinned_memory(switch):
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available: the pinned-memory staging path needs a GPU")
    results = run_workers(_cuda_worker, switch.address)
    for r in results:
        assert r["ok"] and r["half"] == 1.0 and r["cpu"] == [float(WORLD)] * 5


# ---------------------------------------------------------------------------- the example under torchrun


def _torchrun(args, env, out_json, save=None, timeout=150):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(WORLD),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(_free_port()),
        str(EXAMPLE),
        "--json",
        str(out_json),
        *args,
    ]
    if save:
        cmd += ["--save", str(save)]
    full_env = {**os.environ, **env, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(Path(out_json).read_text())


def test_ddp_example_follows_gloo(switch, tmp_path):
    pytest.importorskip("sklearn", reason="the example trains on scikit-learn's digits")
    env = {"GRADSWITCH_SWITCH": switch.address, "GRADSWITCHD": _binary()}
    common = ["--epochs", "4", "--seed", "1"]
    gloo = _torchrun(["--backend", "gloo", *common], env, tmp_path / "gloo.json")
    gs = _torchrun(["--backend", "gradswitch", "--wire", "float32", *common], env, tmp_path / "gs.json")
    lg = [h["loss"] for h in gloo["history"]]
    ls = [h["loss"] for h in gs["history"]]
    for a, b in zip(lg, ls, strict=True):
        assert abs(a - b) <= 1e-3 * max(1.0, abs(a)), (lg, ls)
    assert abs(gloo["history"][-1]["accuracy"] - gs["history"][-1]["accuracy"]) <= 1.0
    assert gs["history"][-1]["accuracy"] > 85.0
    assert all("comm_exposed_s" in h and "compute_s" in h for h in gs["history"])


def test_fixed32_runs_are_bitwise_identical(switch, tmp_path):
    pytest.importorskip("sklearn", reason="the example trains on scikit-learn's digits")
    env = {"GRADSWITCH_SWITCH": switch.address}
    args = ["--backend", "gradswitch", "--wire", "fixed32", "--epochs", "2", "--seed", "2"]
    _torchrun(args, env, tmp_path / "a.json", save=tmp_path / "a.pt")
    _torchrun(args, env, tmp_path / "b.json", save=tmp_path / "b.pt")
    a = torch.load(tmp_path / "a.pt")
    b = torch.load(tmp_path / "b.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs between two fixed32 runs"


def test_package_exports():
    import gradswitch.torch as gst

    assert "gradswitch" in dist.Backend.backend_list
    assert gst.SUPPORTED_OPS == ("SUM", "AVG")
    with pytest.raises(ValueError, match="unknown wire"):
        gst.Options(wire="float8")
    with pytest.raises(TypeError, match="unknown option"):
        gst.Options.coerce({"swich": "x"})
    assert gradswitch.WIRES


# ---------------------------------------------------------------------------- the ring (docs/algorithms.md)


def _ring_worker(rank, world, switch_addr, algorithm):
    import gradswitch.torch as gst

    os.environ.pop("GRADSWITCH_SWITCH", None)
    dist.init_process_group(
        "gradswitch", pg_options=gst.Options(switch=switch_addr, algorithm=algorithm, timeout=20)
    )
    pg = gst.gradswitch_group()
    model = torch.nn.Linear(64, 8)
    torch.manual_seed(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    for _ in range(3):
        ddp(torch.randn(16, 64) + rank).sum().backward()
    t = torch.arange(100_000, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    ok = torch.equal(t, torch.arange(100_000, dtype=torch.float32) * sum(range(1, world + 1)))
    grads = [p.grad.clone() for p in model.parameters()]
    out = {"ok": ok, "algorithm": pg.group.algorithm, "grads": grads, "stats": pg.group.stats()}
    dist.destroy_process_group()
    return out


def test_process_group_on_the_ring_when_the_switch_is_down():
    """algorithm="auto" with nothing at the switch address: the ring takes over at start, its
    addresses exchanged through the torch store; DDP and all_reduce give the same sums everywhere."""
    results = run_workers(_ring_worker, f"127.0.0.1:{_free_port()}", "auto")
    for r in results:
        assert r["ok"] and r["algorithm"] == "ring" and r["stats"]["ring_allreduces"] >= 4
        assert r["stats"]["fallbacks"] == 1
    for a, b in zip(results[0]["grads"], results[1]["grads"], strict=True):
        assert torch.equal(a, b)  # DDP averaged the same gradients on every rank


# ---------------------------------------------------------------------------- bounded-time rounds

LATE_S = 0.3  # rank 2 of 3 is this much slower in every step than the others


def _straggler_worker(rank, world, switch_addr):
    """DDP, unmodified, over a process group with a deadline (docs/protocol.md §3.1): rank 2 sleeps
    before each backward; the others do not wait for it."""
    gst = _init(switch_addr, deadline_us=20_000, quorum=2, straggler_report=3)
    model = _toy_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    late = (lambda: time.sleep(LATE_S)) if rank == 2 else None
    start = time.monotonic()
    for x, y in _batches(3, world):
        xs, ys = x[8 * rank : 8 * (rank + 1)], y[8 * rank : 8 * (rank + 1)]
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(ddp(xs), ys)
        if late:
            late()
        loss.backward()
        opt.step()
    took = time.monotonic() - start
    stats = gst.gradswitch_group().group.stats()
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    dist.destroy_process_group()
    del gst
    return {"took": took, "params": params, "stats": stats}


def test_process_group_with_a_deadline_does_not_wait_for_a_late_rank(switch):
    results = run_workers(_straggler_worker, switch.address, world=3)
    for r in results:  # every rank applied the same (partial, rescaled) gradients
        assert torch.equal(r["params"], results[0]["params"])
        assert r["stats"]["partial_results"] > 0 and r["stats"]["straggler_reports"] == 1, r["stats"]
    assert results[2]["took"] >= 3 * LATE_S
    # DDP's first step may sync its bucket order (a collective that waits for rank 2 once); after it
    # the others run at their own pace: without a deadline they would take 3 * LATE_S as rank 2 does.
    assert max(results[0]["took"], results[1]["took"]) < 2 * LATE_S, [r["took"] for r in results]


def _late_feedback_worker(rank, world, switch_addr):
    """A deadline job with error_feedback=True on float32: rank 2 is late for the first steps' rounds,
    which close without it; what they lacked of it goes in its later steps instead of being lost.
    The process group without rescaling (the whole of its values wait), the hook with it (its values
    less the estimate the rescaled sum held)."""
    gst = _init(switch_addr, deadline_us=20_000, quorum=2, error_feedback=True, rescale=False)
    n, steps = 5000, 4
    t = torch.zeros(n)  # the same tensor every step, as DDP's buckets: its residual follows it
    total = torch.zeros(n, dtype=torch.float64)
    for k in range(steps):
        if rank == 2 and k < steps - 1:
            time.sleep(LATE_S)
        t.copy_(torch.arange(1, n + 1) * (rank + 1) + k)  # integers: every sum exact
        dist.all_reduce(t)
        total += t.double()
    pg = gst.gradswitch_group()
    residual = pg._feedback._residuals.get(t)
    out = {
        "total": total,
        "residual": torch.zeros(n) if residual is None else residual.clone(),
        "stats": pg.group.stats(),
    }
    # The same through DDP's comm hook, rescaling: a parameter whose gradient is this rank's constant
    # vector (multiples of 3: every rescaled partial sum and its estimates are exact), SGD at lr 1.
    state = gst.GradswitchState(switch_addr, deadline_us=20_000, quorum=2, error_feedback=True)
    g = (torch.arange(1, n + 1) * 3 * (rank + 1)).float()
    p = torch.nn.Parameter(torch.zeros(n))
    model = torch.nn.parallel.DistributedDataParallel(_Dot(p, g))
    model.register_comm_hook(state, gst.allreduce_hook)
    opt = torch.optim.SGD([p], lr=1.0)
    for k in range(steps):
        opt.zero_grad()
        loss = model()
        if rank == 2 and k < steps - 1:
            time.sleep(LATE_S)
        loss.backward()
        opt.step()
    residuals = state._feedback["float32"]._residuals
    out["hook_moved"] = -p.detach().double() * world  # the sums of the gradients it applied
    out["hook_residual"] = next(iter(residuals.values())).clone() if residuals else torch.zeros(n)
    out["hook_partial"] = state.channel().group.stats()["partial_results"]
    state.close()
    dist.destroy_process_group()
    return out


class _Dot(torch.nn.Module):
    """loss = p . g: the gradient is g, a constant of the rank."""

    def __init__(self, p, g):
        super().__init__()
        self.p, self.g = p, g

    def forward(self):
        return (self.p * self.g).sum()


def test_error_feedback_in_a_deadline_job_delays_a_late_rank_instead_of_losing_it(switch):
    results = run_workers(_late_feedback_worker, switch.address, world=3)
    n, steps = 5000, 4
    # Every rank's values of every step, summed: what exact rounds would have delivered.
    want = sum((torch.arange(1, n + 1) * (r + 1) + k).double() for r in range(3) for k in range(steps))
    kept = sum(r["residual"].double() for r in results)  # what is still to go, at the end
    for r in results:
        assert torch.equal(r["total"], results[0]["total"])  # every rank applied the same sums
        assert r["stats"]["partial_results"] > 0, r["stats"]
    # Nothing rescaled and nothing lost: the sums delivered plus what waits in the residuals.
    assert torch.equal(results[0]["total"] + kept, want), (results[0]["total"] + kept - want).abs().max()
    assert (results[0]["residual"] == 0).all() and (results[1]["residual"] == 0).all()
    # The hook: what its steps applied (rescaled sums) plus what waits in rank 2's residual (its
    # gradients less their estimates) is every gradient.
    grads = sum((torch.arange(1, n + 1) * 3 * (r + 1)).double() for r in range(3)) * steps
    for r in results:
        assert torch.equal(r["hook_moved"], results[0]["hook_moved"])
    hook_kept = sum(r["hook_residual"].double() for r in results)
    gap = results[0]["hook_moved"] + hook_kept - grads
    assert torch.equal(gap, torch.zeros_like(gap)), gap.abs().max()
    assert all(r["hook_partial"] > 0 for r in results), [r["hook_partial"] for r in results]


# ---------------------------------------------------------------------------- a failed allreduce under DDP


def _aborted_ddp_worker(rank, world, switch_addr, how):
    """DDP over the process group (how="pg") or gloo with gradswitch's comm hook (how="hook"); after a
    first step, rank 0 ends the job through the switch's control plane: each rank's next backward
    must raise the switch's reason, not crash the process in DDP's C++ reducer."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gradswitch.control import ControlConnection

    gst = _init(switch_addr) if how == "pg" else None
    if how == "hook":
        import gradswitch.torch as gst

        dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(64, 64))
    if how == "hook":
        model.register_comm_hook(gst.GradswitchState(switch_addr, timeout=20), gst.allreduce_hook)
    model(torch.randn(4, 64)).sum().backward()
    dist.barrier()
    if rank == 0:
        with ControlConnection(switch_addr) as c:
            jobs = [j for j in c.request("JOBS").split("jobs=")[1].split(",") if ":running" in j]
            for j in jobs:
                assert c.request(f"ABORT job_id={j.split(':')[0]}").startswith("OK")
    dist.barrier()
    try:
        model(torch.randn(4, 64)).sum().backward()
        return "no error"
    except Exception as e:  # noqa: BLE001 - the test reads it
        return f"{type(e).__name__}: {e}"


@pytest.mark.parametrize("how", ["pg", "hook"])
def test_an_aborted_job_raises_in_ddp_backward(switch, how):
    for msg in run_workers(_aborted_ddp_worker, f"127.0.0.1:{switch.control_port}", how, timeout=90):
        assert "aborted" in msg and "control plane" in msg, msg
