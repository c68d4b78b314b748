"""Optimization in the switch, end to end: every algorithm over 100+ steps through a real gradswitchd
against an independent numpy implementation of paper 004's algorithms (and torch.optim where it
has the algorithm), exactly-once updates under packet loss, and checkpoint/restore.

The first half drives the daemon with minimal raw-socket ranks (protocol §4 with one chunk in
flight, resending on a timer), so that those tests depend only on the daemon and the protocol
document. The second half runs the same checks through the real worker API (gradswitch.connect with
optimizer=, Group.set_lr / state_get / state_set) and gradswitch.torch.SwitchOptimizer.
"""

from __future__ import annotations

import io
import json
import select
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _ranks import in_threads
from test_switch_daemon import (
    HEADER,
    MAGIC,
    MSG_DATA,
    MSG_HELD,
    MSG_RESULT,
    VERSION,
    Daemon,
    parse_ok,
    udp_socket,
)

FLOAT32, FLAG_RETX = 2, 2
CHUNK = 360
STEPS = 100
N = 1000  # three chunks, the last one short
f32 = np.float32


# ---------------------------------------------------------------------------------------------
# Reference: paper 004 Algorithms 1-4 (+ torch.optim's options), numpy float32, whole tensor.


class Reference:
    def __init__(
        self,
        algo,
        p0,
        lr,
        momentum=0.0,
        dampening=0.0,
        nesterov=False,
        weight_decay=0.0,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        eps_mode="paper",
        lr_decay=0.0,
        initial_accumulator=0.0,
    ):
        self.algo, self.p = algo, p0.astype(f32).copy()
        self.lr, self.mom, self.damp, self.nesterov, self.wd = (
            f32(lr),
            f32(momentum),
            f32(dampening),
            nesterov,
            f32(weight_decay),
        )
        self.b1, self.b2, self.eps, self.torch_eps = f32(beta1), f32(beta2), f32(eps), eps_mode == "torch"
        self.lr_decay = f32(lr_decay)
        z = np.zeros_like(self.p)
        self.t = 0
        self.buf = z.copy()  # SGD momentum
        self.h = np.full_like(self.p, f32(initial_accumulator))  # AdaGrad
        self.m, self.v = z.copy(), z.copy()  # Adam, SMORMS3
        self.s = np.ones_like(self.p)  # SMORMS3 (s_0 = 1)

    def step(self, g):
        g = g.astype(f32)
        self.t += 1
        t, p = self.t, self.p
        if self.algo != "adamw":
            g = g + self.wd * p
        if self.algo == "sgd":  # Algorithm 1
            if self.mom == 0:
                p -= self.lr * g
            else:
                self.buf = g.copy() if t == 1 else self.mom * self.buf + (f32(1) - self.damp) * g
                d = g + self.mom * self.buf if self.nesterov else self.buf
                p -= self.lr * d
        elif self.algo == "adagrad":  # Algorithm 2
            self.h = self.h + g * g
            lr_t = self.lr / (f32(1) + f32(t - 1) * self.lr_decay)
            denom = np.sqrt(self.h) + self.eps if self.torch_eps else np.sqrt(self.h + self.eps)
            p -= lr_t * g / denom
        elif self.algo in ("adam", "adamw"):  # Algorithm 3 (+ AdamW)
            if self.algo == "adamw":
                p *= f32(1) - self.lr * self.wd
            self.m = self.b1 * self.m + (f32(1) - self.b1) * g
            self.v = self.b2 * self.v + (f32(1) - self.b2) * g * g
            bc1, bc2 = f32(1) - self.b1 ** f32(t), f32(1) - self.b2 ** f32(t)
            if self.torch_eps:
                p -= (self.lr / bc1) * self.m / (np.sqrt(self.v) / np.sqrt(bc2) + self.eps)
            else:
                m_hat, v_hat = self.m / bc1, self.v / bc2
                p -= self.lr * m_hat / np.sqrt(v_hat + self.eps)
        elif self.algo == "smorms3":  # Algorithm 4
            x_prev = self.m * self.m / (self.v + self.eps)
            self.s = f32(1) + (f32(1) - x_prev) * self.s
            rho = f32(1) / (self.s + f32(1))
            self.m = (f32(1) - rho) * self.m + rho * g
            self.v = (f32(1) - rho) * self.v + rho * g * g
            x = self.m * self.m / (self.v + self.eps)
            p -= np.minimum(self.lr, x) / np.sqrt(self.v + self.eps) * g
        return p.copy()


# ---------------------------------------------------------------------------------------------
# Minimal raw-socket workers.


class Ranks:
    """`world` ranks of one optimizer job in this process."""

    def __init__(self, daemon: Daemon, name: str, keys: str, world: int = 2, n: int = N):
        self.daemon, self.world, self.n = daemon, world, n
        self.udp = [udp_socket() for _ in range(world)]
        self.ctl = [
            socket.create_connection(("127.0.0.1", daemon.control_port), timeout=10) for _ in range(world)
        ]
        self.rbuf = [b""] * world
        for r in range(world):
            port = self.udp[r].getsockname()[1]
            self.ctl[r].sendall(
                f"JOIN job={name} world={world} rank={r} wire=float32 token=t port={port} "
                f"params={n} {keys}\n".encode()
            )
        rep = [parse_ok(self.readline(r)) for r in range(world)]
        self.job_id, self.key = int(rep[0]["job_id"]), int(rep[0]["key"])
        self.slots = int(rep[0]["slots"])
        self.version = [0] * self.slots
        self.seq = 0
        self.retransmissions = 0

    def readline(self, r: int) -> str:
        while b"\n" not in self.rbuf[r]:
            chunk = self.ctl[r].recv(1 << 20)
            assert chunk, "control connection closed"
            self.rbuf[r] += chunk
        line, self.rbuf[r] = self.rbuf[r].split(b"\n", 1)
        return line.decode()

    def read(self, r: int, n: int) -> bytes:
        while len(self.rbuf[r]) < n:
            chunk = self.ctl[r].recv(1 << 20)
            assert chunk, "control connection closed"
            self.rbuf[r] += chunk
        out, self.rbuf[r] = self.rbuf[r][:n], self.rbuf[r][n:]
        return out

    def request(self, r: int, line: str, payload: bytes = b"") -> str:
        self.ctl[r].sendall(line.encode() + b"\n" + payload)
        return self.readline(r)

    def upload(self, p0: np.ndarray):
        assert self.request(0, f"PARAMS offset=0 count={self.n}", p0.astype("<f4").tobytes()) == "OK"

    def state_get(self, r: int = 0) -> bytes:
        kv = parse_ok(self.request(r, "STATE_GET"))
        return self.read(r, int(kv["bytes"]))

    def step(self, grads: list[np.ndarray]) -> np.ndarray:
        """Allreduce of the gradients; returns the parameters every rank received (all equal)."""
        out = [np.zeros(self.n, f32) for _ in range(self.world)]
        for c in range((self.n + CHUNK - 1) // CHUNK):
            off, slot = c * CHUNK, c % self.slots
            v = self.version[slot]
            self.version[slot] ^= 1
            dest = ("127.0.0.1", self.daemon.data_port + slot % self.daemon.threads)

            def pkt(r, flags=0, off=off, slot=slot, v=v):
                vals = grads[r][off : off + CHUNK].astype("<f4")
                return (
                    HEADER.pack(
                        MAGIC,
                        VERSION,
                        MSG_DATA,
                        self.job_id,
                        self.key,
                        r,
                        slot,
                        v | flags,
                        FLOAT32,
                        len(vals),
                        self.seq,
                        off,
                        -128,
                        0,
                        0,
                    )
                    + vals.tobytes()
                )

            for r in range(self.world):
                self.udp[r].sendto(pkt(r), dest)
            waiting = set(range(self.world))
            for _ in range(500):
                ready, _, _ = select.select([self.udp[r] for r in waiting], [], [], 0.02)
                if not ready:  # timer: every rank still waiting resends (RETX)
                    for r in waiting:
                        self.retransmissions += 1
                        self.udp[r].sendto(pkt(r, FLAG_RETX), dest)
                    continue
                for sock in ready:
                    r = self.udp.index(sock)
                    res = sock.recv(65536)
                    h = HEADER.unpack(res[:32])
                    if h[2] == MSG_HELD:  # the resend found the round still open: keep waiting
                        continue
                    assert h[2] == MSG_RESULT, h
                    if h[10] == self.seq and h[11] == off and h[6] == slot and r in waiting:
                        out[r][off : off + h[9]] = np.frombuffer(res[32:], "<f4")
                        waiting.discard(r)
                    # else: a late duplicate of an earlier round (an answer to an earlier resend)
                if not waiting:
                    break
            else:
                raise AssertionError(f"ranks {sorted(waiting)}: no result for chunk {c} of step {self.seq}")
        self.seq += 1
        for r in range(1, self.world):
            assert out[r].tobytes() == out[0].tobytes()
        return out[0]

    def close(self):
        for s in self.ctl + self.udp:
            s.close()


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, "--join-timeout", "5", "--slots", "8")
    yield d
    assert d.stop() == 0


def quadratic_grads(p, targets, scale):
    """Each rank's gradient of 0.5 * scale * |p - target_r|^2: the trajectory contracts."""
    return [(scale * (p - t)).astype(f32) for t in targets]


def run_switch(daemon, name, keys, p0, targets, scale, steps=STEPS, setlr=None):
    ranks = Ranks(daemon, name, keys)
    ranks.upload(p0)
    p, traj = p0.copy(), []
    for k in range(steps):
        if setlr and k in setlr:
            assert ranks.request(0, f"SETLR lr={setlr[k]}").startswith("OK")
        p = ranks.step(quadratic_grads(p, targets, scale))
        traj.append(p)
    ranks.close()
    return traj


def run_reference(algo, ref_kwargs, p0, targets, scale, steps=STEPS, setlr=None):
    ref = Reference(algo, p0, **ref_kwargs)
    p, traj = p0.copy(), []
    for k in range(steps):
        if setlr and k in setlr:
            ref.lr = f32(setlr[k])
        gs = quadratic_grads(p, targets, scale)
        g = (gs[0] + gs[1]) * f32(0.5)  # the switch's average: fp32 sum, times 1/world
        p = ref.step(g)
        traj.append(p)
    return traj


def run_torch(make, p0, targets, scale, steps=STEPS):
    torch = pytest.importorskip("torch")
    w = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt = make([w])
    traj = []
    for _ in range(steps):
        p = w.detach().numpy().copy()
        gs = quadratic_grads(p, targets, scale)
        w.grad = torch.from_numpy((gs[0] + gs[1]) * f32(0.5))
        opt.step()
        traj.append(w.detach().numpy().copy())
    return traj


CASES = {
    # name: (algo, JOIN keys (besides params), reference kwargs, torch factory or None, lr schedule)
    "sgd": ("sgd", "optimizer=sgd lr=0.1", dict(lr=0.1), lambda t: lambda p: t.optim.SGD(p, lr=0.1), None),
    "sgd_momentum_wd": (
        "sgd",
        "optimizer=sgd lr=0.05 momentum=0.9 dampening=0.1 weight_decay=0.01",
        dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
        lambda t: lambda p: t.optim.SGD(p, lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
        None,
    ),
    "sgd_nesterov": (
        "sgd",
        "optimizer=sgd lr=0.05 momentum=0.9 nesterov=1",
        dict(lr=0.05, momentum=0.9, nesterov=True),
        lambda t: lambda p: t.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
        None,
    ),
    "adagrad_paper": ("adagrad", "optimizer=adagrad lr=0.1 eps=1e-8", dict(lr=0.1, eps=1e-8), None, None),
    "adagrad_torch": (
        "adagrad",
        "optimizer=adagrad lr=0.1 eps=1e-10 eps_mode=torch lr_decay=0.01 initial_accumulator=0.1",
        dict(lr=0.1, eps=1e-10, eps_mode="torch", lr_decay=0.01, initial_accumulator=0.1),
        lambda t: (
            lambda p: t.optim.Adagrad(p, lr=0.1, eps=1e-10, lr_decay=0.01, initial_accumulator_value=0.1)
        ),
        None,
    ),
    "adam_paper": ("adam", "optimizer=adam lr=0.01", dict(lr=0.01), None, {50: 0.005}),
    "adam_torch": (
        "adam",
        "optimizer=adam lr=0.01 beta1=0.8 beta2=0.99 eps_mode=torch weight_decay=0.001",
        dict(lr=0.01, beta1=0.8, beta2=0.99, eps_mode="torch", weight_decay=0.001),
        lambda t: lambda p: t.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), weight_decay=0.001),
        None,
    ),
    "adamw_torch": (
        "adamw",
        "optimizer=adamw lr=0.01 weight_decay=0.05 eps_mode=torch",
        dict(lr=0.01, weight_decay=0.05, eps_mode="torch"),
        lambda t: lambda p: t.optim.AdamW(p, lr=0.01, weight_decay=0.05),
        None,
    ),
    "smorms3": ("smorms3", "optimizer=smorms3 lr=0.01 eps=1e-16", dict(lr=0.01, eps=1e-16), None, None),
}


def problem(seed=0):
    rng = np.random.default_rng(seed)
    p0 = rng.standard_normal(N).astype(f32)
    targets = [rng.standard_normal(N).astype(f32) for _ in range(2)]
    return p0, targets, f32(0.5)


@pytest.mark.parametrize("case", list(CASES))
def test_algorithm_matches_reference_over_100_steps(daemon, case):
    algo, keys, ref_kwargs, torch_make, setlr = CASES[case]
    p0, targets, scale = problem()
    got = run_switch(daemon, case, keys, p0, targets, scale, setlr=setlr)
    want = run_reference(algo, ref_kwargs, p0, targets, scale, setlr=setlr)
    assert len(got) >= 100
    moved = np.abs(want[-1] - p0).max()
    assert moved > 0.05, f"the test problem barely moves ({moved})"
    if algo == "smorms3":
        # SMORMS3's min(lr, x) and its s recursion make last-bit differences (FMA contraction in the
        # switch's SIMD kernel) grow along a trajectory: check each of the 100 steps from the
        # switch's own state instead (test_smorms3_every_step_from_the_switch_state), and the
        # trajectory loosely.
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_allclose(a, b, rtol=0.05, atol=0.05, err_msg=f"{case}: step {k + 1} vs numpy")
    else:
        for k, (a, b) in enumerate(zip(got, want, strict=True)):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5, err_msg=f"{case}: step {k + 1} vs numpy")
    if torch_make is not None:
        torch = pytest.importorskip("torch")
        ref_t = run_torch(torch_make(torch), p0, targets, scale)
        for k, (a, b) in enumerate(zip(got, ref_t, strict=True)):
            np.testing.assert_allclose(
                a, b, rtol=2e-5, atol=2e-5, err_msg=f"{case}: step {k + 1} vs torch.optim"
            )


def test_smorms3_every_step_from_the_switch_state(daemon):
    algo, keys, ref_kwargs, _, _ = CASES["smorms3"]
    p0, targets, scale = problem()
    ranks = Ranks(daemon, "smorms3-steps", keys)
    ranks.upload(p0)
    p = p0.copy()
    for k in range(STEPS):
        blob = ranks.state_get()
        arrays = np.frombuffer(blob[32 : 32 + 4 * N * 4], "<f4").reshape(4, N)
        ref = Reference(algo, arrays[0], **ref_kwargs)
        ref.s, ref.m, ref.v = arrays[1].copy(), arrays[2].copy(), arrays[3].copy()
        gs = quadratic_grads(p, targets, scale)
        want = ref.step((gs[0] + gs[1]) * f32(0.5))
        p = ranks.step(gs)
        np.testing.assert_allclose(p, want, rtol=2e-5, atol=2e-6, err_msg=f"smorms3: step {k + 1}")
    ranks.close()


@pytest.mark.parametrize("case", ["adam_torch", "smorms3", "sgd_momentum_wd"])
def test_loss_never_applies_an_update_twice(tmp_path, case):
    algo, keys, _, _, _ = CASES[case]
    p0, targets, scale = problem(1)
    clean = Daemon(tmp_path, "--join-timeout", "5", "--slots", "8")
    try:
        want = run_switch(clean, "clean", keys, p0, targets, scale, steps=40)
    finally:
        assert clean.stop() == 0
    lossy = Daemon(tmp_path, "--join-timeout", "5", "--slots", "8", "--drop-rate", "0.1", "--seed", "7")
    try:
        ranks = Ranks(lossy, "lossy", keys)
        ranks.upload(p0)
        p = p0.copy()
        for k in range(40):
            p = ranks.step(quadratic_grads(p, targets, scale))
            assert p.tobytes() == want[k].tobytes(), f"step {k + 1} differs from the loss-free run"
        blob = ranks.state_get()
        steps = np.frombuffer(blob[-4 * 3 :], "<u4")
        assert list(steps) == [40, 40, 40]  # one update per chunk and step, whatever was resent
        assert ranks.retransmissions > 0
        stats = parse_ok(ranks.request(0, "STATS"))
        assert int(stats["udp.injected_drops"]) > 0
        ranks.close()
    finally:
        assert lossy.stop() == 0


def test_checkpoint_then_restore_continues_bit_for_bit(daemon):
    algo, keys, _, _, _ = CASES["adam_torch"]
    p0, targets, scale = problem(2)
    a = Ranks(daemon, "a", keys)
    a.upload(p0)
    p = p0.copy()
    for _ in range(30):
        p = a.step(quadratic_grads(p, targets, scale))
    blob, p_ckpt = a.state_get(1), p.copy()
    cont = []
    for _ in range(30):
        p = a.step(quadratic_grads(p, targets, scale))
        cont.append(p)
    a.close()
    b = Ranks(daemon, "b", keys)
    assert b.request(0, f"STATE_SET bytes={len(blob)}", blob) == "OK"
    p = p_ckpt
    for k in range(30):
        p = b.step(quadratic_grads(p, targets, scale))
        assert p.tobytes() == cont[k].tobytes(), f"step {k + 1} after the restore differs"
    b.close()


# ---------------------------------------------------------------------------------------------
# The worker API: gradswitch.connect(optimizer=..., params=...) and Group's optimizer calls.


def keys_to_dict(keys: str) -> dict:
    """The JOIN keys of CASES as connect()'s optimizer= dict (floats as Python floats)."""
    out = {}
    for kv in keys.split():
        k, v = kv.split("=")
        if k == "optimizer":
            out["algo"] = v
        elif k in ("nesterov", "average"):
            out[k] = v == "1"
        elif k == "eps_mode":
            out[k] = v
        else:
            out[k] = float(v)
    return out


def run_group(sw, name, optimizer, p0, targets, scale, steps=STEPS, setlr=None, drop_rate=0.0, ckpt_at=None):
    """Two ranks (threads) of an optimizer job through gradswitch.connect; returns rank 0's
    trajectory (checked equal to rank 1's), the final blob, and rank 0's stats.
    ckpt_at: a step after which rank 1 takes a checkpoint (returned in extra["ckpt"])."""
    import gradswitch

    trajs, extra = [[], []], {}

    def rank(r):
        with gradswitch.connect(
            sw.address,
            name,
            r,
            2,
            optimizer=optimizer,
            params=p0 if r == 0 else len(p0),
            drop_rate=drop_rate,
            seed=11,
            timeout=20,
        ) as g:
            p = p0.copy()
            for k in range(steps):
                if r == 0 and setlr and k in setlr:
                    assert g.set_lr(setlr[k]) == float(np.float32(setlr[k]))
                x = (scale * (p - targets[r])).astype(f32)
                g.allreduce(x)
                p = x
                trajs[r].append(p.copy())
                if r == 1 and ckpt_at == k + 1:
                    extra["ckpt"] = g.state_get()
            if r == 0:
                extra["blob"] = g.state_get()
                extra["stats"] = g.stats()

    in_threads(rank, 2, 120)
    for a, b in zip(*trajs, strict=True):
        assert a.tobytes() == b.tobytes(), "the ranks received different parameters"
    return trajs[0], extra


def check_against_references(case, got, p0, targets, scale, setlr):
    algo, _, ref_kwargs, torch_make, _ = CASES[case]
    want = run_reference(algo, ref_kwargs, p0, targets, scale, setlr=setlr)
    assert len(got) == len(want) >= 100
    tol = dict(rtol=0.05, atol=0.05) if algo == "smorms3" else dict(rtol=2e-5, atol=2e-5)  # see above
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        np.testing.assert_allclose(a, b, **tol, err_msg=f"{case}: step {k + 1} vs numpy")
    if torch_make is not None:
        torch = pytest.importorskip("torch")
        for k, (a, b) in enumerate(zip(got, run_torch(torch_make(torch), p0, targets, scale), strict=True)):
            np.testing.assert_allclose(
                a, b, rtol=2e-5, atol=2e-5, err_msg=f"{case}: step {k + 1} vs torch.optim"
            )


@pytest.mark.parametrize("case", list(CASES))
def test_group_api_matches_reference_over_100_steps(switch_factory, case):
    _, keys, _, _, setlr = CASES[case]
    p0, targets, scale = problem()
    got, _ = run_group(switch_factory(slots=8), case, keys_to_dict(keys), p0, targets, scale, setlr=setlr)
    check_against_references(case, got, p0, targets, scale, setlr)


def test_group_api_is_the_raw_protocol(switch_factory, daemon):
    """The worker library and the raw-socket ranks of the protocol give the same bits."""
    _, keys, _, _, setlr = CASES["adam_paper"]
    p0, targets, scale = problem(3)
    via_group, _ = run_group(switch_factory(slots=8), "g", keys_to_dict(keys), p0, targets, scale, 60, setlr)
    raw = run_switch(daemon, "raw", keys, p0, targets, scale, 60, setlr)
    for k, (a, b) in enumerate(zip(via_group, raw, strict=True)):
        assert a.tobytes() == b.tobytes(), f"step {k + 1}"


@pytest.mark.parametrize("case", ["adam_torch", "sgd_momentum_wd", "adagrad_torch"])
def test_group_api_loss_never_applies_an_update_twice(switch_factory, case):
    _, keys, _, _, _ = CASES[case]
    p0, targets, scale = problem(4)
    opt = keys_to_dict(keys)
    want, _ = run_group(switch_factory(slots=8), "clean", opt, p0, targets, scale, steps=40)
    lossy = switch_factory(slots=8, drop_rate=0.05, seed=5)
    got, extra = run_group(lossy, "lossy", opt, p0, targets, scale, steps=40, drop_rate=0.05)
    for k in range(40):
        assert got[k].tobytes() == want[k].tobytes(), f"step {k + 1} differs from the loss-free run"
    import gradswitch

    st = gradswitch.decode_state(extra["blob"])
    assert list(st["steps"]) == [40, 40, 40]  # one update per chunk and step, whatever was resent
    assert extra["stats"]["retransmissions"] > 0 and extra["stats"]["injected_drops"] > 0
    assert lossy.stats()["udp.injected_drops"] > 0


def test_group_api_checkpoint_then_restore_continues_bit_for_bit(switch_factory):
    import gradswitch

    _, keys, _, _, _ = CASES["adamw_torch"]
    opt = keys_to_dict(keys)
    p0, targets, scale = problem(5)
    sw = switch_factory(slots=8)
    traj, extra = run_group(sw, "a", opt, p0, targets, scale, steps=60, ckpt_at=30, setlr={20: 0.004})
    blob = extra["ckpt"]
    st = gradswitch.decode_state(blob)
    assert st["algo"] == "adamw" and list(st["steps"]) == [30, 30, 30]
    assert st["lr"] == float(np.float32(0.004))
    assert st["params"].tobytes() == traj[29].tobytes()
    # A new job: rank 0 restores instead of uploading parameters; the lr comes with the checkpoint.
    p_ckpt, out = traj[29].copy(), [[], []]

    def rank(r):
        with gradswitch.connect(sw.address, "b", r, 2, optimizer=opt, params=len(p0)) as g:
            assert g.state_bytes == len(blob)
            if r == 0:
                g.state_set(blob)
            p = p_ckpt.copy()
            for _ in range(30):
                x = (scale * (p - targets[r])).astype(f32)
                g.allreduce(x)
                p = x
                out[r].append(p.copy())

    in_threads(rank, 2, 60)
    for k in range(30):
        assert out[0][k].tobytes() == traj[30 + k].tobytes(), f"step {k + 1} after the restore differs"
        assert out[1][k].tobytes() == traj[30 + k].tobytes()


def test_connect_optimizer_errors(switch):
    import gradswitch

    p = np.zeros(10, f32)
    bad = [
        (dict(lr=0.1), ValueError, "algo"),
        (dict(algo="rmsprop", lr=0.1), ValueError, "algo"),
        (dict(algo="adam"), ValueError, "needs 'lr'"),
        (dict(algo="adam", lr=0.1, momentum=0.9), ValueError, "momentum"),
        (dict(algo="sgd", lr=0.1, nesterov=True), ValueError, "nesterov"),
        (dict(algo="adam", lr=float("nan")), ValueError, "finite"),
        (dict(algo="adam", lr=1e39), ValueError, "float32"),
        (dict(algo="adam", lr=-1.0), ValueError, ">= 0"),
        (dict(algo="adam", lr=0.1, betas=(0.9, 1.0)), ValueError, "beta2"),
        (dict(algo="adam", lr=0.1, eps_mode="numpy"), ValueError, "eps_mode"),
        (dict(algo="adam", lr="0.1"), TypeError, "number"),
        ("adam", TypeError, "dict"),
    ]
    for optimizer, exc, text in bad:
        with pytest.raises(exc, match=text):
            gradswitch.connect(switch.address, "e", 0, 1, optimizer=optimizer, params=p)
    with pytest.raises(ValueError, match="float32"):
        gradswitch.connect(
            switch.address, "e", 0, 1, wire="fixed32", optimizer=dict(algo="sgd", lr=0.1), params=p
        )
    with pytest.raises(ValueError, match="needs params"):
        gradswitch.connect(switch.address, "e", 0, 1, optimizer=dict(algo="sgd", lr=0.1))
    with pytest.raises(ValueError, match="needs optimizer"):
        gradswitch.connect(switch.address, "e", 0, 1, params=p)
    with gradswitch.connect(switch.address, "e", 0, 1, optimizer=dict(algo="sgd", lr=0.5), params=p) as g:
        assert (g.optimizer, g.params) == ("sgd", 10)
        with pytest.raises(ValueError, match="params=10"):
            g.allreduce(np.ones(11, f32))
        x = np.ones(10, f32)
        g.allreduce(x)
        np.testing.assert_array_equal(x, np.full(10, -0.5, f32))
        with pytest.raises(ValueError, match="before the first allreduce"):
            g.upload_params(p)
        with pytest.raises(ValueError, match="state_bytes"):
            g.state_set(b"GSOPTST1")
        with pytest.raises(ValueError, match="finite"):
            g.set_lr(float("inf"))
    with gradswitch.connect(switch.address, "plain", 0, 1) as g:
        assert g.optimizer is None
        with pytest.raises(ValueError, match="optimizer job"):
            g.set_lr(0.1)


# ---------------------------------------------------------------------------------------------
# gradswitch.torch.SwitchOptimizer


def _two_ranks(fn):
    return in_threads(fn)


def test_switch_optimizer_is_torch_optim_with_scheduler_and_checkpoint(switch):
    torch = pytest.importorskip("torch")
    import gradswitch.torch as gt

    xs = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    ys = torch.randn(8, 3, generator=torch.Generator().manual_seed(1))

    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))

    def loss(m, x, y):
        return torch.nn.functional.mse_loss(m(x), y)

    # torch.optim.AdamW on the whole batch, with a StepLR schedule.
    ref = net()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=0.02, weight_decay=0.01)
    ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, 10, 0.5)
    for _ in range(40):
        ref_opt.zero_grad()
        loss(ref, xs, ys).backward()
        ref_opt.step()
        ref_sched.step()

    models = [net(), net()]  # here, not in the threads: torch's global RNG is shared between threads

    def rank(r):
        m = models[r]
        opt = gt.SwitchOptimizer(
            m.parameters(),
            algo="adamw",
            lr=0.02,
            weight_decay=0.01,
            switch=switch.address,
            job="t",
            rank=r,
            world_size=2,
        )
        assert isinstance(opt, torch.optim.Optimizer)
        sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.5)
        half = slice(4 * r, 4 * r + 4)
        for k in range(40):
            opt.zero_grad()
            loss(m, xs[half], ys[half]).backward()
            opt.step()
            sched.step()
            if k == 19:
                buf = io.BytesIO()
                torch.save(opt.state_dict(), buf)
                ckpt, params_at_20 = buf.getvalue(), [p.detach().clone() for p in m.parameters()]
        final = [p.detach().clone() for p in m.parameters()]
        # Restore step 20 and redo 20 steps: bit for bit the same.
        opt.load_state_dict(torch.load(io.BytesIO(ckpt), weights_only=False))
        assert all(torch.equal(a, b) for a, b in zip(m.parameters(), params_at_20, strict=True))
        sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.5, last_epoch=-1)
        for g in opt.param_groups:
            g["lr"] = 0.02 * 0.5**2  # the schedule's value after 20 steps
        for k in range(20, 40):
            opt.zero_grad()
            loss(m, xs[half], ys[half]).backward()
            opt.step()
            if (k + 1) % 10 == 0:
                for g in opt.param_groups:
                    g["lr"] *= 0.5
        again = [p.detach().clone() for p in m.parameters()]
        opt.close()
        return final, again

    (f0, a0), (f1, a1) = _two_ranks(rank)
    for a, b, c, d, want in zip(f0, f1, a0, a1, ref.parameters(), strict=True):
        assert torch.equal(a, b) and torch.equal(c, d)
        assert torch.equal(a, c), "restoring the checkpoint did not continue bit for bit"
        torch.testing.assert_close(a, want.detach(), rtol=1e-4, atol=1e-5)


def test_switch_optimizer_errors(switch):
    torch = pytest.importorskip("torch")
    import gradswitch.torch as gt

    m = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="momentum"):
        gt.SwitchOptimizer(m.parameters(), algo="adam", momentum=0.9, switch=switch.address)
    with pytest.raises(ValueError, match="algo"):
        gt.SwitchOptimizer(m.parameters(), algo="lion", switch=switch.address)
    with pytest.raises(TypeError, match="float32"):
        gt.SwitchOptimizer(torch.nn.Linear(3, 2).double().parameters(), switch=switch.address)
    with pytest.raises(ValueError, match="same hyperparameters"):
        gt.SwitchOptimizer(
            [{"params": [m.weight]}, {"params": [m.bias], "lr": 0.1}], lr=0.01, switch=switch.address
        )
    opt = gt.SwitchOptimizer(m.parameters(), algo="sgd", lr=0.1, momentum=0.9, switch=switch.address, job="e")
    opt.param_groups[0]["momentum"] = 0.5
    with pytest.raises(ValueError, match="cannot change momentum"):
        opt.step()
    opt.close()


def test_switch_optimizer_trains_digits_like_torch_adam(switch):
    """Two worker processes train an MLP on sklearn's digits with SwitchOptimizer(adam); the same run
    with torch.optim.Adam (one process, whole batches) reaches the same test accuracy within 1 point."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    script = str(Path(__file__).with_name("_switch_optimizer_mlp.py"))
    procs = [
        subprocess.Popen(
            [sys.executable, script, "switch", switch.address, "digits", str(r), "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    ref = subprocess.run([sys.executable, script, "reference"], capture_output=True, text=True, timeout=120)
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1])["accuracy"])
    assert ref.returncode == 0, ref.stderr
    want = json.loads(ref.stdout.strip().splitlines()[-1])["accuracy"]
    assert results[0] == results[1]
    assert want > 90
    assert abs(results[0] - want) <= 1.0, (results, want)
