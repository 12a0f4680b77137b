"""Behaviours that tinygrad's op tests (test/backend/test_ops.py) check, held by glassgrad.

Each test compares with numpy (always) or with values PyTorch gives (written out, so they are checked without
PyTorch too), and with PyTorch itself when it is importable. Exception tests check both the type a tinygrad or
PyTorch program catches (mostly RuntimeError) and the type glassgrad's own contract names (ValueError, TypeError).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from test_ops import DEVICE, T, check, rand, torch

from glassgrad import Tensor, dtypes
from glassgrad.dtype import to_dtype


def grads(fn: Any, *arrays: np.ndarray) -> list[np.ndarray]:
    """Gradients of fn(*inputs).sum() with respect to every input."""
    leaves = [T(a, requires_grad=True) for a in arrays]
    return [g.numpy() for g in fn(*leaves).sum().gradient(*leaves)]


def torch_grads(fn: Any, *arrays: np.ndarray) -> list[np.ndarray]:
    leaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    fn(*leaves).sum().backward()
    return [t.grad.numpy() for t in leaves]


# ---------------------------------------------------------------------- exception types
ERRORS: list[tuple[str, Any, tuple[type[Exception], ...]]] = [
    ("matmul 0-d", lambda: T(3.14) @ Tensor.ones(3, 3, device=DEVICE), (RuntimeError, ValueError)),
    ("matmul inner", lambda: Tensor.ones(2, 4, device=DEVICE) @ Tensor.ones(1, 3, device=DEVICE),
     (RuntimeError, ValueError)),
    ("dot 1-d", lambda: Tensor.ones(4, device=DEVICE).dot(Tensor.ones(1, 2, device=DEVICE)),
     (RuntimeError, ValueError)),
    ("permute too few", lambda: Tensor.ones(3, 4, 5, device=DEVICE).permute(0, 2), (RuntimeError, ValueError)),
    ("permute repeated", lambda: Tensor.ones(3, 4, device=DEVICE).permute(0, 0), (RuntimeError, ValueError)),
    ("flip repeated", lambda: Tensor.ones(3, 4, device=DEVICE).flip((1, -1)), (RuntimeError, ValueError)),
    ("reshape two -1", lambda: Tensor.ones(3, 4, device=DEVICE).reshape(-1, -1, 2), (RuntimeError, ValueError)),
    ("clip no bound", lambda: Tensor.ones(3, device=DEVICE).clip(None, None), (RuntimeError, ValueError)),
    ("div rounding typo", lambda: T([5]).div(T([2]), rounding_mode="typo"), (RuntimeError, ValueError)),
    ("float lshift", lambda: T([1.0]) << 2, (RuntimeError, TypeError)),
    ("lshift by float", lambda: T([1], dtype=dtypes.uint32) << 1.0, (RuntimeError, TypeError)),
    ("rshift by float tensor", lambda: T([1]) >> T([1.0]), (RuntimeError, TypeError)),
    ("int to negative power", lambda: T([-2, 0, 2]) ** -2, (RuntimeError, ValueError)),
    ("gather index rank", lambda: Tensor.ones(4, 5, 6, device=DEVICE).gather(0, T([1])), (RuntimeError, ValueError)),
    ("gather index too big", lambda: Tensor.ones(2, 1, 1, device=DEVICE).gather(0, Tensor.zeros(3, 4, 5,
                                                                                               dtype=dtypes.int32)),
     (RuntimeError, ValueError)),
    ("scatter src too small", lambda: Tensor.ones(10, 3, 10, device=DEVICE).scatter(
        1, Tensor.zeros(3, 4, 5, dtype=dtypes.int32, device=DEVICE), Tensor.ones(10, 3, 10, device=DEVICE)),
     (RuntimeError, ValueError)),
    ("scatter self too small", lambda: Tensor.ones(2, 3, 10, device=DEVICE).scatter(
        1, Tensor.zeros(3, 4, 5, dtype=dtypes.int32, device=DEVICE), Tensor.ones(10, 10, 10, device=DEVICE)),
     (RuntimeError, ValueError)),
    ("scatter src dtype", lambda: Tensor.ones(3, 4, device=DEVICE).half().scatter(
        1, Tensor.zeros(3, 4, dtype=dtypes.int32, device=DEVICE), Tensor.ones(3, 4, device=DEVICE)),
     (RuntimeError, TypeError)),
    ("scatter reduce typo", lambda: Tensor.ones(3, device=DEVICE).scatter(0, T([0]), 1.0, reduce="max"),
     (TypeError, ValueError)),
    ("linspace bool", lambda: Tensor.linspace(5, 10, 3, dtype="bool"), (RuntimeError, ValueError)),
    ("one_hot float", lambda: T([1.0]).one_hot(3), (RuntimeError, TypeError)),
    ("cross_entropy shapes", lambda: Tensor.ones(32, 10, device=DEVICE).cross_entropy(Tensor.ones(32, 1,
                                                                                                  device=DEVICE)),
     (RuntimeError, ValueError)),
    ("unknown dtype name", lambda: T([1.0, 2.0]).sum(dtype=""), (AttributeError, TypeError)),
    ("unknown dtype name prod", lambda: T([1.0, 2.0]).prod(dtype="float3"), (AttributeError, TypeError)),
    ("conv kernel over input", lambda: Tensor.ones(1, 1, 6, 7, device=DEVICE).conv2d(
        Tensor.ones(6, 1, 3, 3, device=DEVICE), dilation=3), (RuntimeError, ValueError)),
]


@pytest.mark.parametrize("case", ERRORS, ids=[c[0] for c in ERRORS])
def test_exception_types(case: tuple[str, Any, tuple[type[Exception], ...]]) -> None:
    """The exception is an instance of every listed type: tinygrad's/PyTorch's and glassgrad's own."""
    _, fn, types = case
    with pytest.raises(types[0]) as info:
        fn()
    for kind in types[1:]:
        assert isinstance(info.value, kind), f"{type(info.value).__name__} is not a {kind.__name__}"


def test_to_dtype_unknown_name_is_attribute_error() -> None:
    with pytest.raises(AttributeError, match="float3"):
        to_dtype("float3")


@pytest.mark.parametrize("args", [(2**33,), (129,), (-129, 128), (128, 0, -1), (127, -130, -1)])
def test_arange_overflow(args: tuple[int, ...]) -> None:
    """An int arange whose first or last value does not fit its dtype raises (numpy and PyTorch wrap silently)."""
    dtype = dtypes.int32 if args == (2**33,) else dtypes.int8
    with pytest.raises(OverflowError):
        Tensor.arange(*args, dtype=dtype)


def test_arange_int8_edges() -> None:
    np.testing.assert_array_equal(Tensor.arange(-128, 128, dtype=dtypes.int8, device=DEVICE).numpy(),
                                  np.arange(-128, 128, dtype=np.int8))
    np.testing.assert_array_equal(Tensor.arange(127, -129, -1, dtype=dtypes.int8, device=DEVICE).numpy(),
                                  np.arange(127, -129, -1, dtype=np.int8))


# ---------------------------------------------------------------------- scatter
def _np_scatter_last(x: np.ndarray, dim: int, idx: np.ndarray, src: np.ndarray) -> np.ndarray:
    """Sequential scatter in index order: a later write to the same position replaces an earlier one."""
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[dim] = idx[pos]
        out[tuple(target)] = src[pos]
    return out


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_scatter_repeated_indices(dim: int) -> None:
    """tinygrad's test: index (3, 4, 5) in [0, 3) into (4, 5, 6), many positions named several times."""
    idx = rand((3, 4, 5), 0, 3, np.int32, seed=1)
    x, src = rand((4, 5, 6), seed=2), rand((4, 5, 6), seed=3)
    check(lambda a, s: a.scatter(dim, T(idx), s), lambda a, s: _np_scatter_last(a, dim % 3, idx, s), inputs=[x, src],
          torch_fn=lambda a, s: a.scatter(dim, torch.from_numpy(idx.astype(np.int64)), s))


def test_scatter_repeated_gradient() -> None:
    """The gradient reaches only the value that stayed (and self where nothing was written). PyTorch gives every
    value scattered to a position that position's gradient (its backward is a gather); tinygrad, like glassgrad,
    differentiates the value that stayed."""
    x, src = rand((4,), seed=4), np.array([1.0, 0.0], np.float32)
    gx, gs = grads(lambda a, s: a.scatter(0, T([0, 0]), s) * T(np.arange(1, 5, dtype=np.float32)), x, src)
    np.testing.assert_array_equal(gx, [0, 2, 3, 4])
    np.testing.assert_array_equal(gs, [0, 1])
    if torch is not None:
        t = torch_grads(lambda a, s: a.scatter(0, torch.tensor([0, 0]), s) * torch.arange(1, 5), x, src)
        np.testing.assert_array_equal(gx, t[0])


def test_scatter_larger_src_and_scalar() -> None:
    idx = rand((3, 4, 5), 0, 3, np.int32, seed=5)
    x, src = rand((10, 3, 10), seed=6), rand((10, 10, 10), seed=7)
    out = T(x).scatter(1, T(idx), T(src)).numpy()
    np.testing.assert_array_equal(out, _np_scatter_last(x, 1, idx, src[:3, :4, :5]))
    out = T(x).scatter(1, T(idx), math.inf).numpy()
    np.testing.assert_array_equal(out, _np_scatter_last(x, 1, idx, np.full(idx.shape, np.inf, np.float32)))


# ---------------------------------------------------------------------- pow
def test_pow_zero_base_gradient() -> None:
    """d/dy 0**y is -inf for y < 0 and 0 for y >= 0; d/dx x**y at x = 0 follows y * x**(y-1) (PyTorch's values)."""
    y = np.array([-2.0, -1, 0, 1, 2, 3], np.float32)
    (g,) = grads(lambda t: 0 ** t, y)
    np.testing.assert_array_equal(g, [-np.inf, -np.inf, 0, 0, 0, 0])
    base, expo = np.zeros(5, np.float32), np.array([0.0, 0.3, -0.3, 2.0, -2.0], np.float32)
    ga, gb = grads(lambda a, b: a ** b, base, expo)
    np.testing.assert_array_equal(ga, [0, np.inf, -np.inf, 0, -np.inf])
    np.testing.assert_array_equal(gb, [0, 0, -np.inf, 0, -np.inf])
    if torch is not None:
        np.testing.assert_array_equal(g, torch_grads(lambda t: 0 ** t, y)[0])
        for mine, theirs in zip((ga, gb), torch_grads(lambda a, b: a ** b, base, expo)):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("exponent", [0.5, 1.5, 2.0, -1.0, 0.0])
def test_int_to_float_power_is_float(exponent: float) -> None:
    out = T(np.array([1, 2, 3, 4], np.int32)) ** exponent
    assert out.dtype == dtypes.float32
    np.testing.assert_allclose(out.numpy(), np.array([1, 2, 3, 4], np.float32) ** np.float32(exponent), rtol=1e-6)


def test_int_to_int_power_stays_int() -> None:
    out = T(np.array([-2, 0, 2], np.int32)) ** 2
    assert out.dtype == dtypes.int32
    np.testing.assert_array_equal(out.numpy(), [4, 0, 4])
