"""Optimisers: SGD (momentum, Nesterov, weight decay), LARS, Muon, Adam, AdamW and LAMB, plus `OptimizerGroup`.

In: a list of parameter tensors (float, usually `requires_grad=True`) whose `.grad` was filled by `loss.backward()`.
Out: `step()` writes each parameter's new value into the parameter's own buffer (`Tensor.assign`), together with
the optimiser's state (momentum buffers, Adam moments, the step count), in ONE `Tensor.realize_all` run inside
`no_grad()`. So one step is one schedule, buffers keep their identity (the JIT relies on that), and after a step
every parameter is a plain buffer again: a loop of 10,000 steps keeps a constant graph size and constant memory.

    opt = Adam([w1, b1, w2], lr=1e-3)
    with Tensor.train():
        for x, y in batches:
            opt.zero_grad()
            loss = model(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()

Behaviour (tinygrad's, where tinygrad has one):
- a param whose `requires_grad` is None gets `requires_grad=True`; a param with `requires_grad=False` is a *buffer*:
  realized with each step but never updated (e.g. batch-norm running statistics);
- a non-float param that would be trained raises `TypeError` (gradients only exist for floats);
- `step()` needs `Tensor.training` on (`with Tensor.train():`), as in tinygrad, so a forgotten train mode
  (dropout off) does not go unnoticed;
- a trained param without a gradient at `step()` raises `RuntimeError` naming it (tinygrad asserts too): silently
  skipping it would hide a param the loss does not use, or a `zero_grad()` called between `backward()` and `step()`.
  One frozen since (`p.requires_grad = False`, PyTorch's fine-tuning habit) and without a gradient is skipped, as
  PyTorch skips it: it and its own state (momentum, moments) keep their values; Adam's step count is shared;
- the learning rate is a one-element tensor (`opt.lr`), a buffer read by the kernels: schedules (`glassgrad.nn.lr`)
  write new values into it with `assign`, and no kernel is recompiled. A tensor may be passed as `lr` to share it.
  Setting `opt.lr = 0.01` (or a one-element tensor) writes that value into the same buffer, so a hand-written
  warmup works eagerly and under TinyJit alike (rebinding it would leave a capture reading the old buffer);
- the step count of Adam/AdamW/LAMB is an int32 tensor updated with `assign`, so bias correction does not bake the
  step number into kernels either.
- `schedule_step(skip=t)` with a bool scalar tensor `t`: where `t` is true the step writes every param and every piece
  of state back unchanged (`where(t, old, new)`), decided on the device with no host sync. `glassgrad.amp.GradScaler`
  uses it to skip a step whose gradients hold an inf or NaN.

SGD, Adam and AdamW follow PyTorch's update rules exactly (tests compare against `torch.optim`; PyTorch's keyword
`betas=(b1, b2)` works for the Adam family, in place of tinygrad's `b1`, `b2`, and so does `amsgrad=True`); LAMB, LARS
and Muon follow tinygrad. tinygrad's `device=` and `fused=` are accepted: `device` must be the params' own (state
lives with its param) and `fused` changes nothing (a step is one schedule either way; Muon refuses it, as tinygrad).
Each param gets its own buffer: one that is still lazy (say `Tensor.zeros(8)`, which hash-conses with every other
`Tensor.zeros(8)`) or a view of another buffer is first copied into a fresh buffer of its own; two params that
share one buffer raise `ValueError`.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from glassgrad.device import canonical_devices
from glassgrad.dtype import DType, dtypes, least_upper_dtype
from glassgrad.tensor import Tensor, no_grad
from glassgrad.uop.ops import Ops

__all__ = ["Optimizer", "OptimizerGroup", "SGD", "LARS", "Muon", "Adam", "AdamW", "LAMB"]


# ---------------------------------------------------------------------- buffers of their own
def _ensure_own_buffers(tensors: Sequence[Tensor], what: str) -> None:
    """Give every tensor a buffer it writes in place; refuse two tensors that share one buffer (views of one)."""
    with no_grad():
        for t in tensors:
            t._take_own_buffer()
    owner: dict[int, int] = {}
    for i, t in enumerate(tensors):
        key = id(t.uop.src[0].base.arg[0] if t.uop.op is Ops.MULTI else t.uop.base.arg[0])  # (several devices)
        if key in owner:
            raise ValueError(f"{what} {owner[key]} and {i} (shape {t.shape}) share one buffer, so an in-place "
                             "update of one would change the other; pass the tensor once, or give each a copy")
        owner[key] = i


def new_state(shape: tuple[int, ...], dtype: DType, device: str, value: float = 0.0,
              like: Tensor | None = None) -> Tensor:
    """A fresh buffer filled with `value`, for optimiser state (never shared with another tensor). With `like` (a
    param), the state is laid out as it is: on several devices, split along the same axis. It is marked
    `requires_grad=False`: no gradient ever flows into state, so its writes record no lineage (see
    Tensor._record_realized), which would keep each step's update graph alive and be substituted into later graphs."""
    with no_grad():
        empty = Tensor.empty(*shape, dtype=dtype, device=device) if like is None else like.empty_like(dtype=dtype)
        empty.requires_grad = False
        return empty.assign(value).realize()


def state_dtype(param_dtype: DType) -> DType:
    """Optimiser state is kept in at least float32, so half-precision params do not lose their moments."""
    return least_upper_dtype(param_dtype, dtypes.float32)


def _dedup(tensors: Iterable[Tensor]) -> list[Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


# ---------------------------------------------------------------------- the base class
class Optimizer:
    """Base class: keeps `params`, `buffers` and `lr`; subclasses say how a param's new value is computed."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor, device: str | None = None,
                 fused: bool = False) -> None:
        params = _dedup(params)
        if not params:
            raise ValueError("an optimizer needs at least one param")
        _check_param_dtypes(params)
        for p in params:
            if p._requires_grad is None:  # (its own flag: a lazy param may share its node with one set already)
                p.requires_grad_(True)
        self.params: list[Tensor] = [p for p in params if p.requires_grad]
        self.buffers: list[Tensor] = [p for p in params if not p.requires_grad]
        if not self.params:
            raise ValueError("an optimizer needs at least one param with requires_grad=True; all "
                             f"{len(params)} given have requires_grad=False")
        _ensure_own_buffers(self.params + self.buffers, "optimizer params")
        self.device: str = self.params[0].device
        _check_device(device, self.device)
        self.fused = fused  # tinygrad's flag: a step is one schedule here anyway, so it changes nothing
        self.lr: Tensor = _lr_tensor(lr, self.device)
        # the lr as given, when a number (schedules start from it exactly, not from its float32 rounding)
        self.initial_lr: float | None = None if isinstance(lr, Tensor) else float(lr)
        self._skip: Tensor | None = None  # set during schedule_step(skip=...)
        self._frozen: set[int] = set()  # during schedule_step: ids of the frozen params and their own state
        self._hypers: dict[str, Tensor] = {}  # hyper-parameters a schedule rewrites (`set_hyper`)

    def __setattr__(self, name: str, value: Any) -> None:
        """`opt.lr = value` once the lr tensor exists writes `value` into it (see the module docstring)."""
        if name == "lr" and isinstance(self.__dict__.get("lr"), Tensor):
            write_lr(self.__dict__["lr"], value)
        else:
            super().__setattr__(name, value)

    def set_hyper(self, name: str, value: float) -> None:
        """Set hyper-parameter `name` (SGD's `momentum`, Adam's `b1`) to `value` between steps, as a schedule does
        (OneCycleLR's momentum cycle). The first call moves it into a one-element buffer that the update kernels read
        (like `lr`), so a new value never means a new kernel; the float attribute follows it."""
        if not isinstance(getattr(self, name, None), float):
            raise AttributeError(f"{type(self).__name__} has no hyper-parameter {name!r}")
        setattr(self, name, float(value))
        if name not in self._hypers:
            self._hypers[name] = new_state((1,), self.lr.dtype, self.device, float(value))
        else:
            with no_grad():
                self._hypers[name].assign(Tensor([float(value)], device=self.device).cast(self.lr.dtype)).realize()

    def _hyper(self, name: str) -> float | Tensor:
        """Hyper-parameter `name` for the update math: its buffer (0-d) once a schedule set it, else the float."""
        t = self._hypers.get(name)
        return getattr(self, name) if t is None else t.reshape(())

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the gradients (`.grad = None`), so the next `backward()` does not add to them; with
        `set_to_none=False` (PyTorch's keyword) an existing gradient becomes zeros instead."""
        for p in self.params:
            p.grad = None if set_to_none or p.grad is None else Tensor.zeros_like(p.grad)

    def step(self) -> None:
        """Update every param in place, with the optimiser state, in one schedule."""
        with no_grad():
            Tensor.realize_all(*self.schedule_step())

    @property
    def lr_scalar(self) -> Tensor:
        """`lr` as a 0-d tensor for the update math (`lr` itself has tinygrad's shape (1,), which schedulers written
        for tinygrad read with `opt.lr.numpy()[0]` and write with a (1,) tensor; a 0-d param keeps its shape)."""
        return self.lr.reshape(())

    def schedule_step(self, skip: Tensor | None = None) -> list[Tensor]:
        """Queue the in-place updates (lazily) and return every tensor that must be realized to apply them. With
        `skip` (a bool tensor of one element), every param and state tensor keeps its value where it is true."""
        if not Tensor.training:
            raise RuntimeError("Optimizer.step() needs Tensor.training=True (as in tinygrad): run the training loop "
                               "inside `with Tensor.train():` or `with Context(TRAINING=1):`, or set "
                               "Tensor.training = True")
        self._skip = _check_skip(skip, self.device)
        frozen = [i for i, p in enumerate(self.params) if p.grad is None and p.requires_grad is False]
        self._frozen = {id(t) for i in frozen for t in (self.params[i], *self._param_state(i))}
        try:
            grads = self._grads(set(frozen))
            new_values = self._new_values(grads)
            for p, value in zip(self.params, new_values):
                self._update(p, value)
        finally:
            self._skip, self._frozen = None, set()
        return [*self.params, *self.buffers, *self.state(), self.lr, *self._hypers.values()]

    def _update(self, target: Tensor, value: Tensor) -> Tensor:
        """target.assign(value), or of `where(skip, target, value)` inside a skippable step; returns target. A frozen
        param and its own state are left as they are."""
        if id(target) in self._frozen:
            return target
        return target.assign(value if self._skip is None else self._skip.where(target, value))

    def _param_state(self, i: int) -> list[Tensor]:
        """The state tensors that belong to param i alone (its momentum buffer, its moments)."""
        return []

    def state(self) -> list[Tensor]:
        """The optimiser's own tensors that a step updates (momentum buffers, moments, step count)."""
        return []

    def _new_values(self, grads: list[Tensor]) -> list[Tensor]:
        raise NotImplementedError

    def _grads(self, frozen: set[int]) -> list[Tensor]:
        """Each param's gradient; a frozen one (index in `frozen`) gets zeros, which no update writes anywhere."""
        grads = []
        for i, p in enumerate(self.params):
            if i in frozen:
                grads.append(p.zeros_like())
                continue
            if p.grad is None:
                raise RuntimeError(f"optimizer param {i} (shape {p.shape}, {p.dtype}) has no gradient: call "
                                   "loss.backward() before step(); if the loss does not use this param, leave it out "
                                   "of the optimizer or set its requires_grad=False (a frozen param is skipped)")
            if p.grad.shape != p.shape:
                raise RuntimeError(f"optimizer param {i} has shape {p.shape} but its gradient has shape "
                                   f"{p.grad.shape}")
            grads.append(p.grad)
        return grads


def _check_device(device: str | None, params_device: str) -> None:
    """tinygrad's `device=` puts the optimiser state there; here state lives with its param, so only the params'
    own device (or None) is accepted."""
    if device is None:
        return
    if canonical_devices(device) != params_device:
        raise ValueError(f"optimizer device={device!r}: the params are on {params_device}, and glassgrad keeps each "
                         "param's optimizer state on the param's device; leave device out or move the params")


def _check_skip(skip: Tensor | None, device: str) -> Tensor | None:
    """A step's skip flag as a bool scalar on the optimiser's device (None: never skip)."""
    if skip is None:
        return None
    if not isinstance(skip, Tensor) or skip.numel() != 1 or skip.device != device:
        raise ValueError(f"skip must be a one-element Tensor on {device}, got "
                         f"{skip.shape if isinstance(skip, Tensor) else type(skip).__name__}")
    return skip.reshape(()).cast(dtypes.bool)


def _check_param_dtypes(params: Sequence[Tensor]) -> None:
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"optimizer param {i} is a {type(p).__name__}, not a Tensor")
        if not p.dtype.is_float and p.requires_grad is not False:
            raise TypeError(f"optimizer param {i} (shape {p.shape}) has dtype {p.dtype}: only floating-point tensors "
                            "can be trained (set requires_grad=False to keep it as a buffer that is not updated)")


def _lr_tensor(lr: float | Tensor, device: str) -> Tensor:
    """The learning rate as a one-element tensor in its own buffer (a float becomes float32 or wider, of shape (1,)
    as in tinygrad; a tensor given keeps its shape)."""
    if isinstance(lr, Tensor):
        if lr.numel() != 1 or not lr.dtype.is_float:
            raise ValueError(f"lr tensor must be a float tensor with one element, got shape {lr.shape} {lr.dtype}")
        if lr.device != device:
            raise ValueError(f"lr tensor is on {lr.device}, the params are on {device}")
        _ensure_own_buffers([lr], "lr")
        return lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr >= 0:
        raise ValueError(f"lr must be a number >= 0 or a Tensor, got {lr!r}")
    return new_state((1,), least_upper_dtype(dtypes.default_float, dtypes.float32), device, float(lr))  # tinygrad's


def write_lr(lr: Tensor, value: float | Tensor) -> None:
    """Write a new learning rate (a number or a one-element float tensor) into the lr tensor's buffer. Any number
    is taken, as PyTorch's `param_groups` take it (a schedule's linear phase may dip just below 0)."""
    if isinstance(value, Tensor):
        if value.numel() != 1 or not value.dtype.is_float:
            raise ValueError(f"lr tensor must be a float tensor with one element, got shape {value.shape} "
                             f"{value.dtype}")
        new = value.detach().reshape(lr.shape).cast(lr.dtype).to(lr.device)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"lr must be a number or a one-element Tensor, got {value!r}")
    else:
        host = np.full(lr.shape, float(value), dtype=np.float64 if lr.dtype == dtypes.float64 else np.float32)
        new = Tensor(host, device=lr.device).cast(lr.dtype)  # uploaded as data: a new value is no new kernel
    with no_grad():
        lr.assign(new).realize()


def _check_hyper(name: str, value: float, low: float = 0.0, high: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= low or \
            (high is not None and not value < high):
        bounds = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be a number {bounds}, got {value!r}")


# ---------------------------------------------------------------------- SGD
class SGD(Optimizer):
    """PyTorch's SGD: g += weight_decay*p; b = momentum*b + g; g = g + momentum*b (Nesterov) or b; p -= lr*g.

    The momentum buffer starts at zero, so the first step gives b = momentum*0 + g = g exactly, which is PyTorch's
    first-step initialisation (b = g) with dampening 0. With `classic=True` (tinygrad's flag) the learning rate
    scales the gradient before the momentum: b = momentum*b + lr*g and p -= b (or lr*g + momentum*b), the same
    steps for a constant lr and a different response to a changed one."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, classic: bool = False, device: str | None = None,
                 fused: bool = False) -> None:
        _check_hyper("momentum", momentum)
        _check_hyper("weight_decay", weight_decay)
        if nesterov and momentum == 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        super().__init__(params, lr, device, fused)
        self.momentum, self.weight_decay, self.nesterov = float(momentum), float(weight_decay), nesterov
        self.classic = classic
        self.b: list[Tensor] = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p) for p in self.params] \
            if self.momentum else []

    def state(self) -> list[Tensor]:
        return list(self.b)

    def _param_state(self, i: int) -> list[Tensor]:
        return [self.b[i]] if self.b else []

    def set_hyper(self, name: str, value: float) -> None:
        """As Optimizer's; a momentum made nonzero (PyTorch's OneCycleLR does that to SGD(momentum=0)) gets its
        buffers, starting at zero."""
        super().set_hyper(name, value)
        if name == "momentum" and value and not self.b:
            self.b = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p) for p in self.params]

    def _new_values(self, grads: list[Tensor]) -> list[Tensor]:
        steps = [self._direction(i, p, g) for i, (p, g) in enumerate(zip(self.params, grads))]
        return [p - (step if self.classic else self.lr_scalar * step) for p, step in zip(self.params, steps)]

    def _direction(self, i: int, p: Tensor, g: Tensor) -> Tensor:
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.classic:
            g = g * self.lr_scalar
        if not self.momentum:
            return g
        momentum = self._hyper("momentum")
        b = self._update(self.b[i], momentum * self.b[i] + g)
        return g + momentum * b if self.nesterov else b


# ---------------------------------------------------------------------- LARS and Muon
class LARS(Optimizer):
    """tinygrad's LARS (layer-wise adaptive rate scaling), whose flags also make its SGD and Muon. Per param, with
    the trust ratio r = tcoef*||p|| / (||g|| + weight_decay*||p||) (1 where either norm is 0, and r = 1 for
    tcoef=0):
    - pre_wd: g += weight_decay*p;  classic: g *= r*lr (before the momentum);
    - momentum: b = momentum*b + g; g = g + momentum*b (nesterov) or b;
    - ns_coefficients: g = newton_schulz(g as (rows, -1), ns_steps, ns_coefficients) (Muon's orthogonalisation);
    - not classic: g *= r*lr;  not pre_wd: g += weight_decay*lr*p (Muon's decay after the momentum);
    then p -= g."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, momentum: float = 0.9,
                 weight_decay: float = 1e-4, ns_steps: int = 0, ns_coefficients: Sequence[float] | None = None,
                 nesterov: bool = False, classic: bool = True, pre_wd: bool = True, tcoef: float = 0.001,
                 device: str | None = None, fused: bool = False) -> None:
        _check_hyper("momentum", momentum)
        _check_hyper("weight_decay", weight_decay)
        _check_hyper("tcoef", tcoef)
        if ns_coefficients is not None and (isinstance(ns_steps, bool) or not isinstance(ns_steps, int)
                                            or ns_steps < 0):
            raise ValueError(f"ns_steps must be an int >= 0, got {ns_steps!r}")
        super().__init__(params, lr, device, fused)
        if ns_coefficients:
            _check_matrices(self.params)
        self.momentum, self.weight_decay, self.tcoef = float(momentum), float(weight_decay), float(tcoef)
        self.ns_steps, self.ns_coefficients = ns_steps, tuple(ns_coefficients) if ns_coefficients else None
        self.nesterov, self.classic, self.pre_wd = nesterov, classic, pre_wd
        self.b: list[Tensor] = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p) for p in self.params] \
            if self.momentum else []

    def state(self) -> list[Tensor]:
        return list(self.b)

    def _param_state(self, i: int) -> list[Tensor]:
        return [self.b[i]] if self.b else []

    def set_hyper(self, name: str, value: float) -> None:
        """As Optimizer's; a momentum made nonzero (PyTorch's OneCycleLR does that to SGD(momentum=0)) gets its
        buffers, starting at zero."""
        super().set_hyper(name, value)
        if name == "momentum" and value and not self.b:
            self.b = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p) for p in self.params]

    def _new_values(self, grads: list[Tensor]) -> list[Tensor]:
        return [p - self._step_of(i, p, g).cast(p.dtype) for i, (p, g) in enumerate(zip(self.params, grads))]

    def _step_of(self, i: int, p: Tensor, g: Tensor) -> Tensor:
        scale = self._trust_ratio(p, g) * self.lr_scalar
        if self.pre_wd and self.weight_decay:
            g = g + self.weight_decay * p
        if self.classic:
            g = g * scale
        if self.momentum:
            momentum = self._hyper("momentum")
            b = self._update(self.b[i], momentum * self.b[i] + g)
            g = g + momentum * b if self.nesterov else b
        if self.ns_coefficients:
            g = g.reshape(g.shape[0], -1).newton_schulz(self.ns_steps, self.ns_coefficients).reshape(g.shape)
        if not self.classic:
            g = g * scale
        if not self.pre_wd and self.weight_decay:
            g = g + self.weight_decay * self.lr_scalar * p
        return g

    def _trust_ratio(self, p: Tensor, g: Tensor) -> Tensor | float:
        if self.tcoef == 0:
            return 1.0
        w_norm, g_norm = p.square().sum().sqrt(), g.square().sum().sqrt()
        ratio = self.tcoef * w_norm / (g_norm + self.weight_decay * w_norm)
        return ((w_norm > 0) & (g_norm > 0)).where(ratio, 1.0)


def _check_matrices(params: Sequence[Tensor]) -> None:
    """Muon orthogonalises each update as a (rows, -1) matrix: a 0-d param has no rows."""
    for i, p in enumerate(params):
        if p.ndim == 0:
            raise ValueError(f"optimizer param {i} is 0-d: Newton-Schulz orthogonalisation (Muon) needs params "
                             "with at least one dim; give 0-d params to another optimizer (OptimizerGroup)")


class Muon(LARS):
    """tinygrad's Muon: SGD with Nesterov momentum whose update is orthogonalised by `ns_steps` Newton-Schulz
    iterations (each param's update as a (rows, -1) matrix), then scaled by lr, with the weight decay added after
    the momentum: b = momentum*b + g; u = newton_schulz(g + momentum*b); p -= lr*u + weight_decay*lr*p.
    https://kellerjordan.github.io/posts/muon/ . (Keller Jordan's reference also rescales u by
    sqrt(max(1, rows/cols)); tinygrad's and this one do not.)"""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, momentum: float = 0.95,
                 weight_decay: float = 0.1, ns_steps: int = 5,
                 ns_coefficients: Sequence[float] = (3.4445, -4.775, 2.0315), nesterov: bool = True,
                 device: str | None = None, fused: bool = False) -> None:
        if fused:
            raise ValueError("Muon orthogonalises each param's update on its own: fused=True is refused (as tinygrad)")
        super().__init__(params, lr, momentum, weight_decay, ns_steps, ns_coefficients, nesterov, classic=False,
                         pre_wd=False, tcoef=0.0, device=device)


# ---------------------------------------------------------------------- Adam family
class _Moments(Optimizer):
    """Shared state of Adam, AdamW and LAMB: first and second moments per param and the step count `t`."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor, b1: float, b2: float, eps: float,
                 weight_decay: float, device: str | None = None, fused: bool = False) -> None:
        _check_hyper("b1", b1, 0.0, 1.0)
        _check_hyper("b2", b2, 0.0, 1.0)
        _check_hyper("eps", eps)
        _check_hyper("weight_decay", weight_decay)
        super().__init__(params, lr, device, fused)
        self.b1, self.b2, self.eps, self.weight_decay = float(b1), float(b2), float(eps), float(weight_decay)
        self.m = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p) for p in self.params]
        self.v = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p) for p in self.params]
        self.t = new_state((), dtypes.int32, self.device)

    def state(self) -> list[Tensor]:
        return [self.t, *self.m, *self.v]

    def _param_state(self, i: int) -> list[Tensor]:
        return [self.m[i], self.v[i]]

    def _count_step(self) -> tuple[Tensor, Tensor]:
        """Advance `t` and return the bias corrections (1 - b1**t, 1 - b2**t) as float tensors."""
        t = self._update(self.t, self.t + 1).cast(dtypes.float32)
        return _bias_correction(self._hyper("b1"), t), _bias_correction(self.b2, t)


def _bias_correction(beta: float | Tensor, t: Tensor) -> Tensor:
    """1 - beta**t as -expm1(t * log(beta)), log(beta) taken in double. Computed as written, in float32, it cancels:
    b2 = 0.999 rounds to 0.99900001, so 1 - b2 is 1.3e-5 off, and every Adam step was 6e-6 too short (PyTorch
    takes the power in double); this way it is float32-exact (beta 0: log is -inf, and the correction 1)."""
    log_beta = beta.log() if isinstance(beta, Tensor) else math.log(beta) if beta > 0 else -math.inf
    return -(t * log_beta).expm1()


class Adam(_Moments):
    """PyTorch's Adam (L2 weight decay added to the gradient): m = lerp(m, g, 1-b1), v = b2*v + (1-b2)*g*g,
    p -= lr/(1-b1**t) * m / (sqrt(v)/sqrt(1-b2**t) + eps). With PyTorch's `amsgrad=True` the denominator uses
    v_max = max(v_max, v), the largest second moment so far (one more state buffer per param)."""
    decoupled: bool = False

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0, device: str | None = None, fused: bool = False, *,
                 betas: tuple[float, float] | None = None, amsgrad: bool = False) -> None:
        super().__init__(params, lr, *(betas or (b1, b2)), eps, weight_decay, device, fused)
        self.amsgrad = amsgrad
        self.v_max: list[Tensor] = [new_state(p.shape, state_dtype(p.dtype), p.device, like=p)
                                    for p in self.params] if amsgrad else []

    def state(self) -> list[Tensor]:
        return [*super().state(), *self.v_max]

    def _param_state(self, i: int) -> list[Tensor]:
        return [*super()._param_state(i), *self.v_max[i:i + 1]]

    def _new_values(self, grads: list[Tensor]) -> list[Tensor]:
        bc1, bc2 = self._count_step()
        step_size, bc2_sqrt = self.lr_scalar / bc1, bc2.sqrt()
        out = []
        for i, (p, g) in enumerate(zip(self.params, grads)):
            if self.weight_decay and not self.decoupled:
                g = g + self.weight_decay * p
            m = self._update(self.m[i], self.m[i] + (1.0 - self._hyper("b1")) * (g - self.m[i]))
            v = self._update(self.v[i], self.v[i] * self.b2 + (1.0 - self.b2) * g * g)
            if self.amsgrad:
                v = self._update(self.v_max[i], self.v_max[i].maximum(v))
            base = p * (1.0 - self.lr_scalar * self.weight_decay) if self.weight_decay and self.decoupled else p
            out.append(base - step_size * (m / (v.sqrt() / bc2_sqrt + self.eps)))
        return out


class AdamW(Adam):
    """PyTorch's AdamW: Adam with decoupled weight decay, p *= 1 - lr*weight_decay before the Adam update."""
    decoupled = True

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01, device: str | None = None, fused: bool = False, *,
                 betas: tuple[float, float] | None = None, amsgrad: bool = False) -> None:
        super().__init__(params, lr, b1, b2, eps, weight_decay, device, fused, betas=betas, amsgrad=amsgrad)


class LAMB(_Moments):
    """tinygrad's LAMB: m = b1*m + (1-b1)*g, v = b2*v + (1-b2)*g*g, up = m_hat/(sqrt(v_hat)+eps) + wd*p with the
    bias-corrected moments, and p -= lr * r * up, where the trust ratio r = ||p|| / ||up|| (1.0 when either norm is
    0). With `adam=True`, r = 1 (which is tinygrad's Adam/AdamW)."""

    def __init__(self, params: Sequence[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0, adam: bool = False, device: str | None = None,
                 fused: bool = False, *, betas: tuple[float, float] | None = None) -> None:
        super().__init__(params, lr, *(betas or (b1, b2)), eps, weight_decay, device, fused)
        self.adam = adam

    def _new_values(self, grads: list[Tensor]) -> list[Tensor]:
        bc1, bc2 = self._count_step()
        out = []
        for i, (p, g) in enumerate(zip(self.params, grads)):
            b1 = self._hyper("b1")
            m = self._update(self.m[i], b1 * self.m[i] + (1.0 - b1) * g)
            v = self._update(self.v[i], self.b2 * self.v[i] + (1.0 - self.b2) * (g * g))
            up = (m / bc1) / ((v / bc2).sqrt() + self.eps) + self.weight_decay * p
            out.append(p - self.lr_scalar * self._trust_ratio(p, up) * up)
        return out

    def _trust_ratio(self, p: Tensor, up: Tensor) -> Tensor | float:
        if self.adam:
            return 1.0
        w_norm, up_norm = p.square().sum().sqrt(), up.square().sum().sqrt()
        return ((w_norm > 0) & (up_norm > 0)).where(w_norm / up_norm, 1.0)


# ---------------------------------------------------------------------- several at once
class OptimizerGroup:
    """Several optimisers stepped as one (one schedule): e.g. Adam for the body and SGD for the head."""

    def __init__(self, *optimizers: Optimizer) -> None:
        if not optimizers:
            raise ValueError("OptimizerGroup needs at least one optimizer")
        self.optimizers: tuple[Optimizer, ...] = optimizers
        self.params: list[Tensor] = [p for o in optimizers for p in o.params]
        self.buffers: list[Tensor] = [b for o in optimizers for b in o.buffers]

    def __getitem__(self, i: int) -> Optimizer:
        return self.optimizers[i]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none)

    def schedule_step(self, skip: Tensor | None = None) -> list[Tensor]:
        return [t for o in self.optimizers for t in o.schedule_step(skip)]

    def step(self) -> None:
        with no_grad():
            Tensor.realize_all(*self.schedule_step())
