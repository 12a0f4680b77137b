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
from test_ops import DEVICE, F, T, check, rand, torch

from glassgrad import Context, Tensor, dtypes
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
    # tinygrad's test_ops (master) expects RuntimeError, as PyTorch raises, for these
    ("unfold size over dim", lambda: Tensor.ones(8, device=DEVICE).unfold(0, 9, 3), (RuntimeError, ValueError)),
    ("unfold negative step", lambda: Tensor.ones(8, device=DEVICE).unfold(0, 1, -1), (RuntimeError, ValueError)),
    ("meshgrid bad indexing", lambda: T([1.0, 2.0]).meshgrid(indexing="bad"), (RuntimeError, ValueError)),
    ("diagonal same dims", lambda: Tensor.ones(3, 3, device=DEVICE).diagonal(dim1=0, dim2=0),
     (RuntimeError, ValueError)),
    ("roll two shifts no dims", lambda: Tensor.ones(2, 4, device=DEVICE).roll((1, 2)), (RuntimeError, ValueError)),
    ("einsum two ellipses", lambda: Tensor.einsum("...ik..., ...jk ->", Tensor.ones(2, 3, 4, device=DEVICE),
                                                  Tensor.ones(2, 3, 4, device=DEVICE)), (RuntimeError, ValueError)),
    ("einsum letter sizes", lambda: Tensor.einsum("pqrs,tuqvr->pstuv", Tensor.ones(3, 8, 10, 5, device=DEVICE),
                                                  Tensor.ones(11, 5, 13, 16, 8, device=DEVICE)),
     (RuntimeError, ValueError)),
    ("scatter_reduce typo", lambda: Tensor.ones(3, device=DEVICE).scatter_reduce(0, T([0]), T([1.0]), "INVALID"),
     (RuntimeError, ValueError)),
    ("scatter_reduce dtypes", lambda: Tensor.ones(3, device=DEVICE).half().scatter_reduce(0, T([0]), T([1.0]), "sum"),
     (RuntimeError, TypeError)),
    ("cat shapes", lambda: Tensor.ones(2, 3, device=DEVICE).cat(Tensor.ones(2, 4, device=DEVICE)),
     (RuntimeError, ValueError)),
    ("stack sequence and tensor", lambda: Tensor.stack((T([1, 2]), T([3, 4])), T([5, 6])), (ValueError,)),
    ("glorot_uniform negative", lambda: Tensor.glorot_uniform((2, -3, 0)), (ValueError,)),
    ("scaled_uniform negative", lambda: Tensor.scaled_uniform(-3, 2), (ValueError,)),
]


def test_dtype_min_max_are_values() -> None:
    """tinygrad's `dtypes.int.max` is a value (a property), so `Tensor.maximum(x, dtypes.int.max)` works."""
    assert (dtypes.int32.min, dtypes.int32.max) == (-2**31, 2**31 - 1)
    assert (dtypes.uint8.min, dtypes.uint8.max, dtypes.bool.max, dtypes.float32.min) == (0, 255, True, -math.inf)
    x = T([-1234, 0, 1234, dtypes.int.max, dtypes.int.min], dtype=dtypes.int32)
    np.testing.assert_array_equal(x.maximum(dtypes.int.min).numpy(), x.numpy())
    np.testing.assert_array_equal(x.minimum(dtypes.int.max).numpy(), x.numpy())


def test_roll_one_shift_in_a_sequence() -> None:
    """torch.roll(x, (1,)) without dims rolls the flattened tensor, as roll(x, 1)."""
    x = rand((2, 4), seed=11)
    check(lambda a: a.roll((1,)), lambda a: np.roll(a, 1), inputs=[x], torch_fn=lambda a: a.roll((1,)))


def test_cat_takes_a_list_as_torch_cat() -> None:
    x, y = rand((2, 3), seed=12), rand((1, 3), seed=13)
    check(lambda a, b: Tensor.cat([a, b]), lambda a, b: np.concatenate([a, b]), inputs=[x, y],
          torch_fn=lambda a, b: torch.cat([a, b]))
    check(lambda a, b: Tensor.cat((a, b), dim=0), lambda a, b: np.concatenate([a, b]), inputs=[x, y],
          torch_fn=lambda a, b: torch.cat((a, b), dim=0))


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


# ---------------------------------------------------------------------- pooling
def _np_pool(x: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...], pad: tuple[int, ...],
             dilation: tuple[int, ...], ceil_mode: bool, op: str, count_include_pad: bool = True) -> np.ndarray:
    """PyTorch's pooling rules, one window at a time: ceil_mode keeps a last window that starts inside the input or
    its left padding; a mean divides by the window's positions inside the input (and, with count_include_pad,
    inside the padding; never past it). 'argmax' gives the first maximum's flat index into the pooled dims."""
    n = len(kernel)
    spatial = x.shape[-n:]
    outs = []
    for size, k, s, p, d in zip(spatial, kernel, stride, pad, dilation):
        span = size + 2 * p - d * (k - 1) - 1
        o = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (o - 1) * s >= size + p:
            o -= 1
        outs.append(o)
    out = np.zeros(x.shape[:-n] + tuple(outs), np.int32 if op == "argmax" else x.dtype)
    for lead in np.ndindex(*x.shape[:-n]):
        for pos in np.ndindex(*outs):
            taps = [[o * s - p + i * d for i in range(k)] for o, s, p, d, k in zip(pos, stride, pad, dilation, kernel)]
            inside = [[t for t in tap if 0 <= t < size] for tap, size in zip(taps, spatial)]
            values = x[lead][np.ix_(*inside)] if all(inside) else np.zeros(0, x.dtype)
            if op == "max":
                out[lead + pos] = values.max()
            elif op == "argmax":
                coords = [c.reshape(-1) for c in np.meshgrid(*inside, indexing="ij")]
                flat = np.ravel_multi_index(coords, spatial)
                out[lead + pos] = flat[np.argmax(values.reshape(-1))]
            else:
                padded = [[t for t in tap if -p <= t < size + p] for tap, size, p in zip(taps, spatial, pad)]
                count = math.prod(len(t) for t in (padded if count_include_pad else inside))
                out[lead + pos] = values.sum() / count
    return out


POOLS = [  # (input shape, kernel, stride, padding, dilation)
    ((1, 1, 6, 6), (3, 3), (3, 3), (1, 1), (1, 1)),
    ((1, 1, 6, 6), (3, 2), (3, 3), (1, 1), (1, 1)),
    ((1, 1, 6, 6), (4, 4), (3, 3), (1, 1), (1, 1)),
    ((1, 1, 5, 5), (3, 3), (3, 3), (1, 1), (1, 1)),
    ((2, 3, 7, 7), (2, 2), (2, 2), (0, 0), (1, 1)),
    ((1, 2, 9, 8), (3, 2), (2, 3), (1, 0), (2, 1)),
]


@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", POOLS)
def test_max_pool_ceil_mode(shape: tuple[int, ...], kernel: tuple[int, int], stride: tuple[int, int],
                            padding: tuple[int, int], dilation: tuple[int, int]) -> None:
    kw = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=True)
    check(lambda x: x.max_pool2d(**kw), lambda x: _np_pool(x, kernel, stride, padding, dilation, True, "max"),
          [shape], grad=True, torch_fn=lambda x: F.max_pool2d(x, **kw))


@pytest.mark.parametrize("count_include_pad", [True, False])
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", [p for p in POOLS if p[4] == (1, 1)])
def test_avg_pool_ceil_mode(shape: tuple[int, ...], kernel: tuple[int, int], stride: tuple[int, int],
                            padding: tuple[int, int], dilation: tuple[int, int], count_include_pad: bool) -> None:
    kw = dict(kernel_size=kernel, stride=stride, padding=padding, ceil_mode=True, count_include_pad=count_include_pad)
    check(lambda x: x.avg_pool2d(**kw),
          lambda x: _np_pool(x, kernel, stride, padding, dilation, True, "avg", count_include_pad),
          [shape], grad=True, torch_fn=lambda x: F.avg_pool2d(x, **kw))


def test_avg_pool_dilation_is_the_third_argument() -> None:
    """tinygrad's order: (kernel_size, stride, dilation, padding, ...)."""
    x = rand((1, 1, 7, 7))
    out = T(x).avg_pool2d((2, 2), 1, 2).numpy()
    np.testing.assert_allclose(out, _np_pool(x, (2, 2), (1, 1), (0, 0), (2, 2), False, "avg"), rtol=1e-6)


def test_pools_3d_and_1d() -> None:
    """The pooled dims are the last len(kernel_size) ones."""
    x = rand((1, 2, 9, 8, 7))
    kw = dict(kernel_size=(3, 3, 3), stride=2, padding=1)
    check(lambda t: t.avg_pool2d(count_include_pad=False, **kw),
          lambda t: _np_pool(t, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), False, "avg", False),
          inputs=[x], torch_fn=lambda t: F.avg_pool3d(t, count_include_pad=False, **kw))
    check(lambda t: t.max_pool2d(**kw), lambda t: _np_pool(t, (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), False, "max"),
          inputs=[x], torch_fn=lambda t: F.max_pool3d(t, **kw))
    y = rand((2, 3, 10))
    check(lambda t: t.max_pool2d((3,), 2), lambda t: _np_pool(t, (3,), (2,), (0,), (1,), False, "max"), inputs=[y],
          torch_fn=lambda t: F.max_pool1d(t, 3, 2))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.int64])
def test_max_pool_of_ints_stays_int(dtype: Any) -> None:
    x = rand((2, 2, 6, 9), 0, 100, dtype)
    out = T(x).max_pool2d((2, 2), padding=1)
    assert out.dtype == dtypes.from_np(np.dtype(dtype))
    np.testing.assert_array_equal(out.numpy(), _np_pool(x, (2, 2), (2, 2), (1, 1), (1, 1), False, "max"))


INDEX_POOLS = [  # (input, kernel, stride, padding, dilation, ceil_mode)
    (rand((2, 3, 6, 6)), (2, 2), (2, 2), (0, 0), (1, 1), False),
    (rand((1, 1, 10, 10)), (3, 2), (3, 2), (0, 0), (2, 3), False),
    (rand((1, 1, 5, 5)), (3, 3), (3, 3), (1, 1), (1, 1), False),
    (rand((1, 1, 7, 7)), (2, 2), (2, 2), (0, 0), (1, 1), True),
    (rand((1, 1, 12, 13)), (12, 13), (12, 13), (0, 0), (1, 1), False),
    (np.ones((1, 1, 6, 6), np.float32), (3, 3), (1, 1), (0, 0), (1, 1), False),
    (np.tile(np.array([1, 2], np.float32), (1, 1, 6, 3)), (2, 2), (1, 1), (0, 0), (1, 1), False),
]


@pytest.mark.parametrize("case", range(len(INDEX_POOLS)))
def test_max_pool_return_indices(case: int) -> None:
    x, kernel, stride, padding, dilation, ceil_mode = INDEX_POOLS[case]
    kw = dict(kernel_size=kernel, stride=stride, padding=padding, dilation=dilation, ceil_mode=ceil_mode)
    values, indices = T(x).max_pool2d(return_indices=True, **kw)
    assert indices.dtype == dtypes.int32
    np.testing.assert_array_equal(values.numpy(), _np_pool(x, kernel, stride, padding, dilation, ceil_mode, "max"))
    np.testing.assert_array_equal(indices.numpy(), _np_pool(x, kernel, stride, padding, dilation, ceil_mode, "argmax"))
    if torch is not None:
        t_values, t_indices = F.max_pool2d(torch.from_numpy(x), return_indices=True, **kw)
        np.testing.assert_array_equal(indices.numpy(), t_indices.numpy())


# ---------------------------------------------------------------------- attention, gelu, pad modes
def _np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    scores = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return (weights / weights.sum(-1, keepdims=True)) @ v


def test_attention_grouped_query() -> None:
    """enable_gqa: 8 query heads over 2 key/value heads, each serving 4 query heads in a row."""
    q, k, v = rand((2, 8, 5, 4), seed=1), rand((2, 2, 5, 4), seed=2), rand((2, 2, 5, 3), seed=3)
    check(lambda a, b, c: a.scaled_dot_product_attention(b, c, enable_gqa=True),
          lambda a, b, c: _np_attention(a, np.repeat(b, 4, axis=1), np.repeat(c, 4, axis=1)), inputs=[q, k, v],
          grad=True, torch_fn=lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True))


def test_attention_grouped_query_errors() -> None:
    q, k = Tensor.ones(2, 7, 5, 4, device=DEVICE), Tensor.ones(2, 2, 5, 4, device=DEVICE)
    with pytest.raises(ValueError, match="enable_gqa"):
        q.scaled_dot_product_attention(k, k, enable_gqa=True)
    with pytest.raises(RuntimeError, match="not both"):
        k.scaled_dot_product_attention(k, k, attn_mask=Tensor.ones(5, 5, device=DEVICE), is_causal=True)


@pytest.mark.parametrize("low,high", [(-3.0, 3.0), (300.0, 400.0), (-400.0, -300.0), (-1e-3, 1e-3)])
def test_gelu_exact(low: float, high: float) -> None:
    """approximate="none": x * Phi(x), with erf from its series near 0 and an erfc fit elsewhere."""
    erf = np.vectorize(math.erf)

    def np_gelu(x: np.ndarray) -> np.ndarray:
        return (0.5 * x * (1 + erf(x / math.sqrt(2)))).astype(x.dtype)

    check(lambda x: x.gelu(approximate="none"), np_gelu, [(7, 9)], low=low, high=high, grad=True, atol=2e-6,
          rtol=1e-5, torch_fn=lambda x: F.gelu(x, approximate="none"))


def test_gelu_tanh_is_default() -> None:
    x = rand((3, 4))
    np.testing.assert_array_equal(T(x).gelu().numpy(), T(x).gelu(approximate="tanh").numpy())
    with pytest.raises(ValueError, match="approximate"):
        T(x).gelu(approximate="erf")


def _np_pad_mode(x: np.ndarray, flat: tuple[int, ...], mode: str) -> np.ndarray:
    """PyTorch's F.pad for reflect/replicate/circular with numpy: reflect and replicate pad first and then crop
    negative amounts; circular crops first and wraps around what is left."""
    pairs = [(0, 0)] * (x.ndim - len(flat) // 2) + [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][::-1]
    crop = tuple(slice(max(-b, 0), x.shape[d] + max(b, 0) + max(a, 0) - max(-a, 0)) for d, (b, a) in enumerate(pairs))
    grow = [(max(b, 0), max(a, 0)) for b, a in pairs]
    np_mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
    if mode == "circular":
        cut = tuple(slice(max(-b, 0), x.shape[d] - max(-a, 0)) for d, (b, a) in enumerate(pairs))
        return np.pad(x[cut], grow, mode=np_mode)
    return np.pad(x, grow, mode=np_mode)[crop]


PADS = [((1, 1, 5, 5), (0, 2, 3, 2)), ((5, 5, 5), (0, 2)), ((1, 1, 5, 5, 5), (1, 2, 3, 4, 1, 2)),
        ((3, 3, 3, 3), (-1, 2, 2, -1)), ((1, 1, 5, 5), (3, -3, 0, -3)), ((1, 1, 5, 5), (3, -5, 1, -5)),
        ((1, 1, 5, 5), (4, 4, 0, 4)), ((1, 1, 5, 5), (1, -2, 2, -1))]


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("shape,flat", PADS)
def test_pad_modes(mode: str, shape: tuple[int, ...], flat: tuple[int, ...]) -> None:
    pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][::-1]
    left = [size - max(-b, 0) - max(-a, 0) for size, (b, a) in zip(shape[len(shape) - len(pairs):], pairs)]
    if mode == "circular" and any(max(b, a) > n for n, (b, a) in zip(left, pairs)):
        pytest.skip("wraps around more than once: an error, tested below")
    check(lambda x: x.pad(flat, mode=mode), lambda x: _np_pad_mode(x, flat, mode), [shape], grad=True,
          torch_fn=lambda x: F.pad(x, flat, mode=mode))


def test_pad_mode_errors() -> None:
    x = Tensor.ones(1, 1, 5, 5, device=DEVICE)
    with pytest.raises(RuntimeError, match="reflect"):
        x.pad((3, 5, 0, 0), mode="reflect")
    with pytest.raises(ValueError, match="circular"):
        x.pad((3, 6, 0, 0), mode="circular")
    with pytest.raises(NotImplementedError, match="typo"):
        x.pad((3, 0), mode="typo")
    np.testing.assert_array_equal(x.pad((1, 1), value=2.0).numpy()[0, 0, 0], [2, 1, 1, 1, 1, 1, 2])


# ---------------------------------------------------------------------- interpolate of uint8
U8 = np.array([[[[0, 255, 17, 200, 3], [90, 91, 250, 1, 128], [7, 77, 177, 255, 0]]]], np.uint8)
U8_BILINEAR_4x7 = [[0, 146, 187, 17, 148, 116, 3], [56, 112, 155, 163, 101, 78, 81], [59, 75, 125, 223, 132, 89, 80],
                   [7, 47, 106, 177, 233, 146, 0]]  # PyTorch 2.13's F.interpolate(U8, (4, 7), mode="bilinear")


def test_interpolate_uint8_is_pytorchs_fixed_point() -> None:
    """uint8 stays uint8, with PyTorch's own rounding (fixed-point weights, the last dim first)."""
    out = T(U8).interpolate((4, 7), mode="linear")
    assert out.dtype == dtypes.uint8
    np.testing.assert_array_equal(out.numpy()[0, 0], U8_BILINEAR_4x7)
    corners = T(U8).interpolate((2, 3), mode="linear", align_corners=True).numpy()
    np.testing.assert_array_equal(corners[0, 0], [[0, 17, 3], [7, 177, 0]])


@pytest.mark.parametrize("shape,size", [((2, 3, 64, 64), (10, 10)), ((1, 2, 7, 9), (13, 20)),
                                        ((1, 1, 12, 20), (9, 31)), ((1, 1, 31, 9), (20, 12))])
@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolate_uint8(shape: tuple[int, ...], size: tuple[int, int], align_corners: bool) -> None:
    x = rand(shape, 0, 256, np.uint8, seed=9)
    out = T(x).interpolate(size, mode="linear", align_corners=align_corners).numpy()
    as_float = T(x.astype(np.float32)).interpolate(size, mode="linear", align_corners=align_corners).numpy()
    assert np.abs(out.astype(np.float32) - as_float).max() <= 1.0
    if torch is not None:
        t = F.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=align_corners)
        np.testing.assert_array_equal(out, t.numpy())


# ---------------------------------------------------------------------- indexing
def _torch_rule(x: np.ndarray, index: tuple[Any, ...]) -> np.ndarray:
    """numpy indexing with PyTorch's placement: ints select first (numpy counts them as advanced indices, which
    moves the broadcast dims to the front when an int separates index arrays)."""
    ints = [(i, v) for i, v in enumerate(index) if isinstance(v, int)]
    skipped = 0
    for i, v in ints:
        x = x[(slice(None),) * (i - skipped) + (v,)]
        skipped += 1
    return x[tuple(v for v in index if not isinstance(v, int))]


FANCY = [(1, slice(None), slice(3, 11, 2), "d", slice(0, 2)), (1, "b", "c", "d", "e"), ("a", "b", 3, "d", "e"),
         (1, "b", 2, "d", 2), ("a", 2, 2, 2, "e"), ("a", slice(None), "c")]


@pytest.mark.parametrize("index", FANCY, ids=str)
def test_fancy_index_placement(index: tuple[Any, ...]) -> None:
    """tinygrad's test_slice_fancy_indexing_dim_collapse_int, against numpy with PyTorch's placement rule."""
    rng = np.random.default_rng(3)
    arrays = {"a": rng.integers(-1, 1, (2, 1, 1, 1, 1, 1)), "b": rng.integers(0, 1, (1, 3, 1, 1, 1, 1)),
              "c": rng.integers(-5, 5, (1, 1, 4, 1, 1, 1)), "d": rng.integers(0, 4, (2, 1, 1, 5, 1, 1)),
              "e": rng.integers(0, 1, (1, 1, 1, 1, 6, 1))}
    np_index = tuple(arrays[v] if isinstance(v, str) else v for v in index)
    index_fn = (lambda i: i if not isinstance(i, np.ndarray) else T(i.astype(np.int32)))
    t_fn = None if torch is None else (
        lambda x: x[tuple(torch.from_numpy(i) if isinstance(i, np.ndarray) else i for i in np_index)])
    check(lambda x: x[tuple(index_fn(i) for i in np_index)], lambda x: _torch_rule(x, np_index), [(2, 5, 6, 5, 3, 4)],
          grad=True, torch_fn=t_fn)


@pytest.mark.parametrize("index", [lambda: T(1.1), lambda: [1.1], lambda: T([True, False]), lambda: [True, False]],
                         ids=["float tensor", "float list", "bool tensor", "bool list"])
def test_index_kind_errors(index: Any) -> None:
    """Indices that are neither ints nor int arrays raise IndexError, as in tinygrad (also a TypeError for bools)."""
    with pytest.raises(IndexError):
        Tensor.ones(10, 11, 12, device=DEVICE)[index()]


def test_mixed_bool_int_list_is_an_int_index() -> None:
    x = rand((5, 6))
    np.testing.assert_array_equal(T(x)[[True, False, 2]].numpy(), x[[1, 0, 2]])


# ---------------------------------------------------------------------- Context flags
def test_context_accepts_ignore_beam_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygrad's `with Context(BEAM=2, IGNORE_BEAM_CACHE=1)`: the search runs again instead of reading its cache."""
    from test_opt import CPU, last_kernel, matmul

    from glassgrad.codegen.opt.search import beam_search
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    ast = last_kernel(matmul(16, 16, 16)).ast
    opts = beam_search(ast, "CPU", 2)
    compiled: list[str] = []
    original = CPU.compiler.compile
    monkeypatch.setattr(CPU.compiler, "compile", lambda src: compiled.append(src) or original(src))
    assert beam_search(ast, "CPU", 2) == opts and not compiled  # a cache hit
    with Context(BEAM=2, IGNORE_BEAM_CACHE=1):
        beam_search(ast, "CPU", 2)
    assert compiled


def test_context_tinygrad_aliases_and_errors() -> None:
    from glassgrad.helpers import MEMPLAN
    with Context(NO_MEMORY_PLANNER=1):
        assert not MEMPLAN
    assert MEMPLAN
    with pytest.raises(KeyError, match="'TRANSCENDENTAL' is one of tinygrad's"):
        with Context(TRANSCENDENTAL=2):
            pass
    from glassgrad.helpers import DEBUG
    before = DEBUG.value
    with pytest.raises(KeyError, match="unknown flag 'NOT_A_FLAG'"):
        with Context(DEBUG=before + 3, NOT_A_FLAG=1):
            pass
    assert DEBUG.value == before  # a Context with a bad flag sets none of its flags


# ---------------------------------------------------------------------- symbolic shapes
def test_int_slice_of_bound_symbolic_dim() -> None:
    """tinygrad's `ones[:i.bind(2)] + 1` then `[:2]`: int bounds that fit the bound value are allowed."""
    from glassgrad import Variable
    i = Variable("i", 1, 10)
    ret = (Tensor.ones(10, device=DEVICE).contiguous()[:i.bind(2)] + 1).contiguous()
    np.testing.assert_array_equal(ret[:2].numpy(), [2.0, 2.0])
    np.testing.assert_array_equal(ret[1:2].numpy(), [2.0])
    assert ret[1].item() == 2.0
    with pytest.raises(ValueError, match="bound size 2"):
        ret[:3]
    with pytest.raises(IndexError, match="bound to"):
        ret[2]


# ---------------------------------------------------------------------- tinygrad's keyword arguments
def test_bce_logits_pos_weight() -> None:
    pos_weight = np.array([0.25, 0.5, 0.75, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], np.float32)
    y = rand((32, 10), 0, 1, seed=8)

    def np_loss(x: np.ndarray) -> np.ndarray:
        log_sig, log_sig_neg = -np.logaddexp(0, -x), -np.logaddexp(0, x)
        return np.mean(-(pos_weight * y * log_sig + (1 - y) * log_sig_neg))

    check(lambda x: x.binary_crossentropy_logits(T(y), pos_weight=T(pos_weight)), np_loss, [(32, 10)], grad=True,
          torch_fn=lambda x: F.binary_cross_entropy_with_logits(x, torch.from_numpy(y),
                                                                 pos_weight=torch.from_numpy(pos_weight)))


def test_matmul_softmax_conv_dtype_and_reverse_keywords() -> None:
    a, b = rand((3, 4), seed=1), rand((4, 5), seed=2)
    out = T(a).matmul(T(b), dtype=dtypes.float64)
    assert out.dtype == dtypes.float64
    np.testing.assert_allclose(out.numpy(), a.astype(np.float64) @ b, rtol=1e-6)
    np.testing.assert_allclose(T(b).matmul(T(a), reverse=True).numpy(), a @ b, rtol=1e-5)
    assert T(a).dot(T(b), dtype="float64").dtype == dtypes.float64
    soft = T(a).softmax(-1, dtype=dtypes.float64)
    assert soft.dtype == dtypes.float64 and T(a).log_softmax(0, dtype="float64").dtype == dtypes.float64
    np.testing.assert_allclose(soft.numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-6)
    x, w = rand((1, 2, 5, 5), seed=3), rand((3, 2, 3, 3), seed=4)
    assert T(x).conv2d(T(w), dtype=dtypes.float64).dtype == dtypes.float64
    np.testing.assert_array_equal(T([1, 2]).lshift(2, reverse=True).numpy(), [4, 8])
    np.testing.assert_array_equal(T([1, 2]).rshift(64, reverse=True).numpy(), [32, 16])
