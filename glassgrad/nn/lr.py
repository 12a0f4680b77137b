"""Learning-rate schedules: `StepLR`, `CosineAnnealingLR`, `OneCycleLR`, with PyTorch's values.

In: an optimiser from `glassgrad.nn.optim` (its `lr` is a one-element tensor). Out: each `step()` (call it once per
epoch or per batch, after `opt.step()`, as in PyTorch) computes the next learning rate on the host, in float64,
from a closed form, and writes it into `opt.lr` with `assign`. The kernels read `lr` from its buffer, so a new value
never means a new kernel. `get_last_lr()` returns `[lr]`, the list PyTorch's `get_last_lr()` gives for one
parameter group.

    opt = SGD(params, lr=0.1)
    sched = CosineAnnealingLR(opt, T_max=100)
    for epoch in range(100):
        train_one_epoch(opt)
        sched.step()

Creating a schedule sets the lr to its value at step 0 (PyTorch does the same: OneCycleLR starts at
max_lr / div_factor, whatever lr the optimiser had).
"""
from __future__ import annotations

import math

import numpy as np

from glassgrad.dtype import dtypes
from glassgrad.nn.optim import Optimizer
from glassgrad.tensor import Tensor, no_grad

__all__ = ["LRScheduler", "StepLR", "CosineAnnealingLR", "OneCycleLR"]


def write_lr(lr: Tensor, value: float) -> None:
    """Write `value` into the lr tensor's buffer in place (uploaded as data, so kernels never change)."""
    host = np.full(lr.shape, value, dtype=np.float64 if lr.dtype == dtypes.float64 else np.float32)
    with no_grad():
        lr.assign(Tensor(host, device=lr.device).cast(lr.dtype)).realize()


class LRScheduler:
    """Base class: `lr_at(epoch)` is the schedule; `step()` advances `last_epoch` and writes the new lr."""

    def __init__(self, optimizer: Optimizer) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"a schedule needs an Optimizer (with an lr tensor), got {type(optimizer).__name__}")
        self.optimizer = optimizer
        given = optimizer.initial_lr
        self.base_lr: float = given if given is not None else float(optimizer.lr.item())
        self.last_epoch = 0
        self._last_lr = self._apply(0)

    def lr_at(self, epoch: int) -> float:
        raise NotImplementedError

    def step(self) -> None:
        self.last_epoch += 1
        self._last_lr = self._apply(self.last_epoch)

    def get_last_lr(self) -> list[float]:
        return [self._last_lr]

    def _apply(self, epoch: int) -> float:
        value = self.lr_at(epoch)
        write_lr(self.optimizer.lr, value)
        return value


def _check_positive_int(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


class StepLR(LRScheduler):
    """lr = base_lr * gamma ** (epoch // step_size)."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1) -> None:
        _check_positive_int("step_size", step_size)
        self.step_size, self.gamma = step_size, float(gamma)
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class CosineAnnealingLR(LRScheduler):
    """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (past T_max it rises again, as in
    PyTorch)."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0) -> None:  # noqa: N803 (PyTorch's name)
        _check_positive_int("T_max", T_max)
        self.T_max, self.eta_min = T_max, float(eta_min)
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class OneCycleLR(LRScheduler):
    """PyTorch's two-phase one-cycle policy with cosine annealing: from max_lr/div_factor up to max_lr over the first
    pct_start*total_steps - 1 steps, then down to max_lr/div_factor/final_div_factor at step total_steps - 1.
    Stepping past total_steps raises ValueError. (Momentum is not cycled.)"""

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int, pct_start: float = 0.3,
                 div_factor: float = 25.0, final_div_factor: float = 1e4) -> None:
        _check_positive_int("total_steps", total_steps)
        if not 0 <= pct_start <= 1:
            raise ValueError(f"pct_start must be in [0, 1], got {pct_start!r}")
        self.max_lr, self.total_steps = float(max_lr), total_steps
        self.initial_lr = self.max_lr / div_factor
        self.min_lr = self.initial_lr / final_div_factor
        self.warmup_end = float(pct_start * total_steps) - 1
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        if epoch > self.total_steps:
            raise ValueError(f"OneCycleLR stepped {epoch} times, but total_steps is {self.total_steps}")
        if epoch <= self.warmup_end:
            return _cos_anneal(self.initial_lr, self.max_lr, _fraction(epoch, 0.0, self.warmup_end))
        return _cos_anneal(self.max_lr, self.min_lr, _fraction(epoch, self.warmup_end, self.total_steps - 1))


def _fraction(epoch: int, start: float, end: float) -> float:
    """How far `epoch` is from start to end (1.0 for a phase of zero length, where PyTorch divides by zero)."""
    return (epoch - start) / (end - start) if end != start else 1.0


def _cos_anneal(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
