"""A safety net for tests that use PyTorch's max pools as a reference: a window with no tap inside its input raises.

In: `install()` (tests/conftest.py calls it for every test once `torch.nn.functional` is imported). Out:
`torch.nn.functional.max_pool1d/2d/3d` (and so `nn.MaxPool*d`) check their windows before they run, and raise
`ValueError` naming the shape and parameters where a window lies wholly in the padding.

Why: for such a window (height 1, dilation 2, padding 1: taps at -1 and 1) PyTorch's CPU max pool gives -inf and,
as its index, a position outside the input, and its backward writes the gradient there: past the end of the
gradient's buffer. That corrupts the heap of the test process, silently or with a glibc abort much later (a fuzz
hunt died with `free(): invalid next size (fast)`). A reference that needs such a case pads explicitly instead
(tests/test_shape_fuzz.py: `_padded_torch_max_pool`).
"""
from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any


def pool_outputs(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """PyTorch's count of pooling windows along one dim (a ceil_mode window must start inside the input or the
    left padding)."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def windows_touch_input(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> bool:
    """Whether every pooling window along one dim has a tap inside the input (PyTorch's CPU pools assume so)."""
    return all(any(0 <= o * s - p + i * d < size for i in range(k)) for o in range(pool_outputs(size, k, s, p, d,
                                                                                                  ceil_mode)))


def _per_dim(value: int | Sequence[int] | None, dims: int, default: Sequence[int]) -> tuple[int, ...]:
    if value is None or (not isinstance(value, int) and len(value) == 0):
        return tuple(default)
    return (value,) * dims if isinstance(value, int) else tuple(value) * (dims if len(value) == 1 else 1)


def _checked(pool: Callable[..., Any], dims: int) -> Callable[..., Any]:
    @functools.wraps(pool)
    def run(input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
            ceil_mode: bool = False, return_indices: bool = False) -> Any:
        k = _per_dim(kernel_size, dims, ())
        s, p, d = _per_dim(stride, dims, k), _per_dim(padding, dims, ()), _per_dim(dilation, dims, ())
        for axis, size in enumerate(tuple(input.shape)[-dims:]):
            if not windows_touch_input(size, k[axis], s[axis], p[axis], d[axis], ceil_mode):
                raise ValueError(f"max_pool{dims}d of shape {tuple(input.shape)} (kernel {k}, stride {s}, padding "
                                 f"{p}, dilation {d}, ceil_mode={ceil_mode}) has a window with no tap inside its "
                                 "input: PyTorch's backward would write past the end of the gradient (see "
                                 "tests/torch_pool_net.py); pad explicitly with -inf instead")
        return pool(input, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    run.gg_checked = True  # type: ignore[attr-defined]
    return run


def install() -> None:
    """Wrap torch.nn.functional's max pools (once; nothing if PyTorch is not imported)."""
    functional = sys.modules.get("torch.nn.functional")
    if functional is None:
        return
    for dims in (1, 2, 3):
        name = f"max_pool{dims}d"
        pool = getattr(functional, name)
        if not getattr(pool, "gg_checked", False):
            setattr(functional, name, _checked(pool, dims))
