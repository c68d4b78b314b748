"""SwitchOptimizer: a torch.optim.Optimizer whose update runs inside the switch (docs/optimizer.md).

    opt = gradswitch.torch.SwitchOptimizer(model.parameters(), algo="adam", lr=1e-3,
                                           switch="10.0.0.1:7700", job="mnist", rank=r, world_size=n)
    for x, y in data:
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()

step() flattens the .grad of every parameter (param_group order) into one float32 buffer and
allreduces it through an optimizer job: the switch averages the gradients, applies the optimizer and
returns the updated parameters, which step() writes into the model. The switch holds the fp32
parameters and the optimizer state; rank 0's parameters at construction are the initial ones (give
every rank the same initialisation, e.g. the same seed, or broadcast them before). Learning-rate
changes in param_groups (schedulers) are sent with SETLR before the next step; state_dict() /
load_state_dict() go through the switch's checkpoint (STATE_GET / STATE_SET).

Differences from torch.optim: a parameter whose .grad is None takes part with a zero gradient (the
switch updates the whole tensor every step, so e.g. Adam's momentum still moves it); every
param_group must have the same hyperparameters, and only lr may change after construction.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import gradswitch
from gradswitch._group import OPTIMIZERS, decode_state

_DEFAULT_EPS = {"adagrad": 1e-10, "adam": 1e-8, "adamw": 1e-8, "smorms3": 1e-16}
# The param_group keys each algorithm uses (besides lr), and their JOIN names.
_GROUP_KEYS = {
    "sgd": ("weight_decay", "momentum", "dampening", "nesterov"),
    "adagrad": ("weight_decay", "eps", "lr_decay", "initial_accumulator_value"),
    "adam": ("weight_decay", "betas", "eps"),
    "adamw": ("weight_decay", "betas", "eps"),
    "smorms3": ("weight_decay", "eps"),
}


def _f32(x: Any) -> float:
    return float(np.float32(float(x)))


class SwitchOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer that runs `algo` in the gradswitch switch.

    params: the parameters (or param_groups) as for any torch optimizer; float32, on any device
        (the gradients and parameters are staged through one CPU buffer).
    algo: "sgd", "adagrad", "adam", "adamw" or "smorms3" (paper 004's Algorithm 4).
    lr, weight_decay: all algorithms. momentum, dampening, nesterov: sgd (as torch.optim.SGD).
        betas: adam, adamw. eps: all but sgd (default as torch.optim: 1e-10 adagrad, 1e-8 adam/adamw;
        smorms3 1e-16). lr_decay, initial_accumulator_value: adagrad (as torch.optim.Adagrad).
    eps_mode: "torch" (sqrt(v) + eps, as torch.optim; the default) or "paper" (sqrt(v + eps), paper 004);
        adagrad, adam, adamw.
    average: True (default) applies the optimizer to the mean of the ranks' gradients, False to their sum.
    switch: "host:port" of the switch's control port (default $GRADSWITCH_SWITCH).
    job: the job's name at the switch; every rank must give the same, and the same hyperparameters.
    rank, world_size: default from torch.distributed when initialised, else $RANK / $WORLD_SIZE, else 0 / 1.
    timeout, join_timeout, drop_rate, seed: passed to gradswitch.connect().
    """

    def __init__(
        self,
        params: Any,
        algo: str = "adam",
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float | None = None,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        eps_mode: str = "torch",
        average: bool = True,
        lr_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        *,
        switch: str | None = None,
        job: str = "switch-optimizer",
        rank: int | None = None,
        world_size: int | None = None,
        timeout: float = 30.0,
        join_timeout: float = 120.0,
        drop_rate: float = 0.0,
        seed: int = 0,
    ) -> None:
        if algo not in OPTIMIZERS:
            raise ValueError(
                f"gradswitch: SwitchOptimizer algo must be one of {', '.join(OPTIMIZERS)}, got {algo!r}"
            )
        if eps_mode not in ("torch", "paper"):
            raise ValueError(f"gradswitch: eps_mode must be 'torch' or 'paper', got {eps_mode!r}")
        given = {
            "betas": tuple(betas) != (0.9, 0.999),
            "eps": eps is not None,
            "momentum": momentum != 0.0,
            "dampening": dampening != 0.0,
            "nesterov": bool(nesterov),
            "lr_decay": lr_decay != 0.0,
            "initial_accumulator_value": initial_accumulator_value != 0.0,
        }
        wrong = [k for k, v in given.items() if v and k not in _GROUP_KEYS[algo]]
        if wrong:
            raise ValueError(
                f"gradswitch: SwitchOptimizer argument(s) {', '.join(wrong)} do not apply to {algo} "
                f"(it takes lr, {', '.join(_GROUP_KEYS[algo])})"
            )
        if eps is None:
            eps = _DEFAULT_EPS.get(algo, 1e-8)
        all_values = {
            "weight_decay": weight_decay,
            "momentum": momentum,
            "dampening": dampening,
            "nesterov": bool(nesterov),
            "eps": eps,
            "betas": tuple(betas),
            "lr_decay": lr_decay,
            "initial_accumulator_value": initial_accumulator_value,
        }
        defaults = {"lr": lr, **{k: all_values[k] for k in _GROUP_KEYS[algo]}}
        self._gs_algo = algo
        self._gs_keys = _GROUP_KEYS[algo]
        super().__init__(params, defaults)

        # One set of hyperparameters for the whole job.
        g0 = self.param_groups[0]
        self._check_groups()
        self._gs_fixed = {k: g0[k] for k in self._gs_keys}
        spec: dict[str, Any] = {"algo": algo, "lr": float(g0["lr"]), "average": bool(average)}
        for k in self._gs_keys:
            spec[k] = g0[k]
        if algo in ("adagrad", "adam", "adamw"):
            spec["eps_mode"] = eps_mode
        self._gs_spec = spec

        self._gs_params: list[torch.Tensor] = [p for g in self.param_groups for p in g["params"]]
        for i, p in enumerate(self._gs_params):
            if p.dtype != torch.float32:
                raise TypeError(
                    f"gradswitch: SwitchOptimizer needs float32 parameters (the switch holds fp32), "
                    f"parameter {i} is {p.dtype}"
                )
        self._gs_numel = [p.numel() for p in self._gs_params]
        total = sum(self._gs_numel)
        if total == 0:
            raise ValueError("gradswitch: SwitchOptimizer got no parameter elements")
        self._gs_flat = torch.zeros(total, dtype=torch.float32)

        if rank is None or world_size is None:
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank() if rank is None else rank
                world_size = dist.get_world_size() if world_size is None else world_size
            else:
                rank = int(os.environ.get("RANK", 0)) if rank is None else rank
                world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
        switch = switch or os.environ.get("GRADSWITCH_SWITCH")
        if not switch:
            raise ValueError("gradswitch: SwitchOptimizer needs switch='host:port' (or $GRADSWITCH_SWITCH)")
        self._gs_rank = int(rank)
        if self._gs_rank == 0:
            self._gather_params()
            initial: Any = self._gs_flat
        else:
            initial = total
        self._gs_group = gradswitch.connect(
            switch,
            job,
            int(rank),
            int(world_size),
            timeout=timeout,
            join_timeout=join_timeout,
            drop_rate=drop_rate,
            seed=seed,
            optimizer=spec,
            params=initial,
        )
        self._gs_lr = _f32(g0["lr"])  # the learning rate the switch holds

    # -- helpers
    def _check_groups(self) -> None:
        g0 = self.param_groups[0]
        for i, g in enumerate(self.param_groups[1:], 1):
            for k in ("lr", *self._gs_keys):
                if g[k] != g0[k]:
                    raise ValueError(
                        f"gradswitch: SwitchOptimizer runs one optimizer in the switch: every param_group "
                        f"must have the same hyperparameters, but group {i} has {k}={g[k]!r} and group 0 "
                        f"{g0[k]!r}"
                    )

    def _check_fixed(self, why) -> None:
        """_check_groups, then ValueError(why(name, the job's value, the groups' value)) for a
        hyperparameter that the switch fixed when the job was created and param_groups now set otherwise."""
        self._check_groups()
        g0 = self.param_groups[0]
        for k, v in self._gs_fixed.items():
            if g0[k] != v:
                raise ValueError(why(k, v, g0[k]))

    def _sync_hyperparameters(self) -> None:
        self._check_fixed(
            lambda k, job, now: f"gradswitch: SwitchOptimizer cannot change {k} after construction (the "
            f"switch fixes it when the job is created; only lr can change): {job!r} -> {now!r}"
        )
        lr = _f32(self.param_groups[0]["lr"])
        if lr != self._gs_lr:
            if self._gs_rank == 0:  # rank 0 alone: its next DATA packet follows the OK (protocol §1.3)
                self._gs_group.set_lr(lr)
            self._gs_lr = lr

    @torch.no_grad()
    def _gather_params(self) -> None:
        o = 0
        for p, n in zip(self._gs_params, self._gs_numel, strict=True):
            self._gs_flat[o : o + n].copy_(p.detach().reshape(-1))
            o += n

    @torch.no_grad()
    def _scatter(self, flat: torch.Tensor) -> None:
        o = 0
        for p, n in zip(self._gs_params, self._gs_numel, strict=True):
            p.copy_(flat[o : o + n].view_as(p))
            o += n

    # -- torch.optim.Optimizer API
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if hasattr(self, "_gs_group"):
            raise NotImplementedError(
                "gradswitch: SwitchOptimizer cannot add parameters after construction (the switch's job "
                "has a fixed number of parameters)"
            )
        super().add_param_group(param_group)

    def step(self, closure: Any = None) -> Any:
        """Sends the gradients, lets the switch apply the update, writes the new parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        flat = self._gs_flat
        with torch.no_grad():
            o = 0
            for p, n in zip(self._gs_params, self._gs_numel, strict=True):
                if p.grad is None:
                    flat[o : o + n].zero_()
                else:
                    if p.grad.is_sparse:
                        raise RuntimeError("gradswitch: SwitchOptimizer does not support sparse gradients")
                    flat[o : o + n].copy_(p.grad.reshape(-1))
                o += n
        self._gs_group.allreduce(flat)  # in: gradients; out: the updated parameters
        self._scatter(flat)
        return loss

    def state_dict(self) -> dict[str, Any]:
        """param_groups as torch.optim, plus "switch_state": the switch's checkpoint (parameters,
        optimizer state, step counters, lr) as a uint8 tensor. Call it between steps (any rank)."""
        sd = super().state_dict()
        blob = self._gs_group.state_get()
        sd["switch_state"] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores param_groups and, when present, the switch's checkpoint: rank 0 sends it to the
        switch (STATE_SET, for a job with the same algorithm, parameter count and switch --mtu), and
        every rank writes its parameters into the model. Call it between steps, on every rank."""
        blob_t = state_dict.get("switch_state")
        super().load_state_dict({k: v for k, v in state_dict.items() if k != "switch_state"})
        self._check_fixed(
            lambda k, job, now: f"gradswitch: the checkpoint has {k}={now!r}, this SwitchOptimizer's job "
            f"{job!r} (only lr may differ)"
        )
        if blob_t is None:
            return
        blob = (
            bytes(blob_t.detach().cpu().contiguous().numpy().tobytes())
            if isinstance(blob_t, torch.Tensor)
            else bytes(blob_t)
        )
        decoded = decode_state(blob)
        if decoded["algo"] != self._gs_algo or decoded["params"].size != self._gs_flat.numel():
            raise ValueError(
                f"gradswitch: the checkpoint is of {decoded['algo']} with {decoded['params'].size} "
                f"parameters, this SwitchOptimizer runs {self._gs_algo} with {self._gs_flat.numel()}"
            )
        if self._gs_rank == 0:
            self._gs_group.state_set(blob)
        self._gs_lr = _f32(decoded["lr"])  # what the switch holds now; a different group lr is sent at step()
        self._scatter(torch.from_numpy(decoded["params"].copy()))

    # -- gradswitch specifics
    @property
    def group(self) -> gradswitch.Group:
        """The gradswitch.Group of the optimizer job."""
        return self._gs_group

    def close(self) -> None:
        """Leaves the job at the switch (also done when the optimizer is garbage-collected)."""
        self._gs_group.close()

    def __repr__(self) -> str:
        return f"SwitchOptimizer(algo={self._gs_algo!r}, {self._gs_spec}, params={self._gs_flat.numel()})"
