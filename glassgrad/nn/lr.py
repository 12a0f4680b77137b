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

from glassgrad.nn.optim import Optimizer, write_lr

__all__ = ["LRScheduler", "StepLR", "CosineAnnealingLR", "OneCycleLR"]


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
    """PyTorch's one-cycle policy. Two phases (three with `three_phase`): the lr goes from max_lr/div_factor up to
    max_lr over the first pct_start*total_steps - 1 steps, then down to max_lr/div_factor/final_div_factor at step
    total_steps - 1 (three_phase: back to max_lr/div_factor at 2*pct_start*total_steps - 2 first), annealed by cosine
    or linearly (`anneal_strategy`). With `cycle_momentum` (the default, as in PyTorch) the momentum moves the other
    way, from max_momentum down to base_momentum and back: SGD's and LARS's `momentum`, Adam's, AdamW's and LAMB's
    `b1` (PyTorch's betas[0]), written into a buffer the kernels read (`Optimizer.set_hyper`), so no step compiles a
    new kernel. `total_steps` may be given as `epochs` * `steps_per_epoch`. Stepping past total_steps raises
    ValueError."""

    def __init__(self, optimizer: Optimizer, max_lr: float, total_steps: int | None = None,
                 epochs: int | None = None, steps_per_epoch: int | None = None, pct_start: float = 0.3,
                 anneal_strategy: str = "cos", cycle_momentum: bool = True, base_momentum: float = 0.85,
                 max_momentum: float = 0.95, div_factor: float = 25.0, final_div_factor: float = 1e4,
                 three_phase: bool = False) -> None:
        self.total_steps = _total_steps(total_steps, epochs, steps_per_epoch)
        if not 0 <= pct_start <= 1:
            raise ValueError(f"pct_start must be in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
        self.anneal = _cos_anneal if anneal_strategy == "cos" else _linear_anneal
        self.max_lr = float(max_lr)
        self.initial_lr = self.max_lr / div_factor
        self.min_lr = self.initial_lr / final_div_factor
        self.warmup_end = float(pct_start * self.total_steps) - 1
        lo, hi = float(base_momentum), float(max_momentum)
        # (phase end step, lr from, lr to, momentum from, momentum to)
        self.phases = [(self.warmup_end, self.initial_lr, self.max_lr, hi, lo),
                       (float(self.total_steps - 1), self.max_lr, self.min_lr, lo, hi)]
        if three_phase:
            self.phases = [self.phases[0],
                           (float(2 * pct_start * self.total_steps) - 2, self.max_lr, self.initial_lr, lo, hi),
                           (float(self.total_steps - 1), self.initial_lr, self.min_lr, hi, hi)]
        self.momentum_name = _momentum_name(optimizer) if cycle_momentum and isinstance(optimizer, Optimizer) else None
        super().__init__(optimizer)

    def lr_at(self, epoch: int) -> float:
        return self._values_at(epoch)[0]

    def _apply(self, epoch: int) -> float:
        lr, momentum = self._values_at(epoch)
        write_lr(self.optimizer.lr, lr)
        if self.momentum_name is not None:
            self.optimizer.set_hyper(self.momentum_name, momentum)
        return lr

    def _values_at(self, epoch: int) -> tuple[float, float]:
        """(lr, momentum) at step `epoch`: the first phase that has not ended (the last phase, past them all)."""
        if epoch > self.total_steps:
            raise ValueError(f"OneCycleLR stepped {epoch} times, but total_steps is {self.total_steps}")
        start = 0.0
        for i, (end, lr0, lr1, m0, m1) in enumerate(self.phases):
            if epoch <= end or i == len(self.phases) - 1:
                pct = _fraction(epoch, start, end)
                return self.anneal(lr0, lr1, pct), self.anneal(m0, m1, pct)
            start = end
        raise AssertionError("unreachable: the last phase always matches")


def _total_steps(total_steps: int | None, epochs: int | None, steps_per_epoch: int | None) -> int:
    """OneCycleLR's length: `total_steps`, or `epochs * steps_per_epoch` (PyTorch's two ways to give it)."""
    if total_steps is not None:
        _check_positive_int("total_steps", total_steps)
        return total_steps
    if epochs is None or steps_per_epoch is None:
        raise ValueError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
    _check_positive_int("epochs", epochs)
    _check_positive_int("steps_per_epoch", steps_per_epoch)
    return epochs * steps_per_epoch


def _momentum_name(optimizer: Optimizer) -> str:
    """The hyper-parameter OneCycleLR cycles: `b1` (Adam's betas[0]) or `momentum` (SGD's), as PyTorch picks."""
    for name in ("b1", "momentum"):
        if isinstance(getattr(optimizer, name, None), float):
            return name
    raise ValueError(f"OneCycleLR with cycle_momentum=True needs an optimizer with a momentum or b1 (beta1); "
                     f"{type(optimizer).__name__} has neither: pass cycle_momentum=False")


def _fraction(epoch: int, start: float, end: float) -> float:
    """How far `epoch` is from start to end (1.0 for a phase of zero length, where PyTorch divides by zero)."""
    return (epoch - start) / (end - start) if end != start else 1.0


def _cos_anneal(start: float, end: float, pct: float) -> float:
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


def _linear_anneal(start: float, end: float, pct: float) -> float:
    return (end - start) * pct + start
