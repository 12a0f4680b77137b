"""PyTorch's `torch.nn.utils` gradient clipping: `clip_grad_norm_` and `clip_grad_value_`.

In: the parameters (a list, any iterable, or one tensor) after `loss.backward()`. Out: each `.grad` is rebound to
its clipped value (lazy, so clipping fuses into the optimiser step and works under TinyJit); `clip_grad_norm_`
returns the total norm as a lazy 0-d tensor, read it with `.item()` as in PyTorch. Params without a gradient are
skipped.

    loss.backward()
    norm = nn.utils.clip_grad_norm_(get_parameters(model), max_norm=1.0)
    opt.step()
"""
from __future__ import annotations

import math
from collections.abc import Iterable

from glassgrad.dtype import dtypes
from glassgrad.tensor import Tensor, no_grad

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def _with_grads(parameters: Tensor | Iterable[Tensor]) -> list[Tensor]:
    params = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    for i, p in enumerate(params):
        if not isinstance(p, Tensor):
            raise TypeError(f"gradient clipping needs Tensors, got {type(p).__name__} at position {i}")
    return [p for p in params if p.grad is not None]


def _grad_norm(grads: list[Tensor], norm_type: float) -> Tensor:
    """The norm of all gradients together, in float32: (sum |g|^p)^(1/p), max |g| for p = inf."""
    floats = [g.cast(dtypes.float32) for g in grads]
    if norm_type == math.inf:
        return Tensor.stack(*[g.abs().max() for g in floats]).max()
    if norm_type == 2.0:
        return Tensor.stack(*[g.square().sum() for g in floats]).sum().sqrt()
    return Tensor.stack(*[(g.abs() ** norm_type).sum() for g in floats]).sum() ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Tensor | Iterable[Tensor], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> Tensor:
    """Scale every gradient by min(1, max_norm / (total_norm + 1e-6)) (PyTorch's rule, the scale applied even when
    it is 1) and return total_norm, the `norm_type`-norm of all gradients as one vector. `error_if_nonfinite=True`
    reads the norm on the host and raises RuntimeError when it is inf or NaN (a sync, as in PyTorch)."""
    norm_type = float(norm_type)
    if not norm_type > 0:
        raise ValueError(f"clip_grad_norm_: norm_type must be > 0 (or inf), got {norm_type}")
    params = _with_grads(parameters)
    if not params:
        return Tensor(0.0)
    with no_grad():
        total = _grad_norm([p.grad for p in params if p.grad is not None], norm_type)
        if error_if_nonfinite and not math.isfinite(total.item()):
            raise RuntimeError(f"clip_grad_norm_: the total {norm_type}-norm of the gradients is {total.item()}; "
                               "pass error_if_nonfinite=False to clip anyway")
        coef = (float(max_norm) / (total + 1e-6)).clamp(max_=1.0)
        for p in params:
            assert p.grad is not None
            p.grad = (p.grad * coef).cast(p.grad.dtype)
    return total


def clip_grad_value_(parameters: Tensor | Iterable[Tensor], clip_value: float) -> None:
    """Clamp every gradient to [-clip_value, clip_value]."""
    with no_grad():
        for p in _with_grads(parameters):
            assert p.grad is not None
            p.grad = p.grad.clamp(-float(clip_value), float(clip_value))
