"""The tinygrad-parity ops of glassgrad/tensor_math.py and tensor_shape.py: elementwise math, predicates, movement,
cumulative, selection and loss ops.

Every op is checked forward against numpy (always) and PyTorch (when importable). Gradients are checked against
PyTorch when it is importable and otherwise against central finite differences of glassgrad's own float64 forward
pass, so CI without PyTorch still checks every gradient. Edge cases: 0-d and empty tensors, negative axes,
broadcasting, non-contiguous (transposed) inputs, and bad input raising a clear exception.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from torch_optional import F, torch

from glassgrad import Tensor, dtypes

RNG = np.random.default_rng(7)


def rand(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def check_grad(fn: Callable[..., Tensor], torch_fn: Callable[..., Any] | None, *arrays: np.ndarray,
               atol: float = 1e-4, rtol: float = 1e-3) -> None:
    """d(sum(fn(*xs) * w))/dx for every x: against PyTorch when importable, else finite differences of fn in
    float64 (glassgrad's own forward pass)."""
    out_shape = fn(*[Tensor(a) for a in arrays]).shape
    weights = RNG.uniform(0.5, 1.5, out_shape).astype(np.float32)
    xs = [Tensor(a, requires_grad=True) for a in arrays]
    (fn(*xs) * Tensor(weights)).sum().backward()
    got = [x.grad.numpy() if x.grad is not None else np.zeros_like(a) for x, a in zip(xs, arrays)]
    if torch is not None and torch_fn is not None:
        ts = [torch.tensor(a, requires_grad=True) for a in arrays]
        (torch_fn(*ts) * torch.tensor(weights)).sum().backward()
        for g, t in zip(got, ts):
            np.testing.assert_allclose(g, t.grad.numpy(), atol=atol, rtol=rtol)
        return
    for k, a in enumerate(arrays):  # central differences in float64
        expected = np.zeros(a.shape)
        for idx in np.ndindex(*a.shape):
            values = []
            for step in (1e-6, -1e-6):
                moved = [b.astype(np.float64) for b in arrays]
                moved[k][idx] += step
                values.append(float((fn(*[Tensor(m) for m in moved]).numpy() * weights).sum()))
            expected[idx] = (values[0] - values[1]) / 2e-6
        np.testing.assert_allclose(got[k], expected, atol=atol * 10, rtol=rtol * 10)


def torch_or_none(name: str) -> Callable[..., Any] | None:
    if torch is None:
        return None
    return getattr(torch, name)


# ---------------------------------------------------------------------- elementwise math
def np_erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


SELU = (1.67326, 1.0507)  # tinygrad's defaults
UNARY: dict[str, tuple[Callable[[np.ndarray], np.ndarray], tuple[float, float], Callable[..., Any] | None]] = {
    "asin": (np.arcsin, (-0.99, 0.99), lambda t: t.asin()),
    "acos": (np.arccos, (-0.99, 0.99), lambda t: t.acos()),
    "atan": (np.arctan, (-6.0, 6.0), lambda t: t.atan()),
    "sinh": (np.sinh, (-3.0, 3.0), lambda t: t.sinh()),
    "cosh": (np.cosh, (-3.0, 3.0), lambda t: t.cosh()),
    "asinh": (np.arcsinh, (-5.0, 5.0), lambda t: t.asinh()),
    "acosh": (np.arccosh, (1.05, 5.0), lambda t: t.acosh()),
    "atanh": (np.arctanh, (-0.95, 0.95), lambda t: t.atanh()),
    "erf": (np_erf, (-4.0, 4.0), lambda t: t.erf()),
    "log10": (np.log10, (0.1, 10.0), lambda t: t.log10()),
    "celu": (lambda x: np.maximum(x, 0) + np.minimum(0, np.expm1(x)), (-3.0, 3.0), lambda t: F.celu(t)),
    "selu": (lambda x: SELU[1] * np.where(x >= 0, x, SELU[0] * np.expm1(x)), (-3.0, 3.0),
             lambda t: SELU[1] * torch.where(t >= 0, t, SELU[0] * torch.expm1(t))),
    "softsign": (lambda x: x / (1 + np.abs(x)), (-3.0, 3.0), lambda t: F.softsign(t)),
    "logsigmoid": (lambda x: -np.logaddexp(0, -x), (-5.0, 5.0), lambda t: F.logsigmoid(t)),
    "mish": (lambda x: x * np.tanh(np.logaddexp(0, x)), (-5.0, 5.0), lambda t: F.mish(t)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_forward(name: str) -> None:
    ref, (lo, hi), torch_fn = UNARY[name]
    x = rand(3, 5, low=lo, high=hi)
    got = getattr(Tensor(x), name)().numpy()
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), atol=2e-6, rtol=2e-6)
    if torch is not None and torch_fn is not None:
        np.testing.assert_allclose(got, torch_fn(torch.tensor(x)).numpy(), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_grad(name: str) -> None:
    ref, (lo, hi), torch_fn = UNARY[name]
    check_grad(lambda t: getattr(t, name)(), torch_fn, rand(2, 3, low=lo, high=hi))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_edge_shapes_and_dtypes(name: str) -> None:
    ref, (lo, hi), _ = UNARY[name]
    scalar = Tensor(np.float32((lo + hi) / 2 + 0.01))
    assert getattr(scalar, name)().shape == ()
    np.testing.assert_allclose(getattr(scalar, name)().numpy(), ref(np.float64(scalar.numpy())), rtol=2e-6,
                               atol=2e-6)
    empty = getattr(Tensor.zeros(0, 3), name)()
    assert empty.shape == (0, 3) and empty.numpy().shape == (0, 3)
    x = rand(4, 3, low=lo, high=hi)
    transposed = getattr(Tensor(x).T, name)().numpy()  # a non-contiguous input
    np.testing.assert_allclose(transposed, ref(x.T.astype(np.float64)), atol=2e-6, rtol=2e-6)
    assert getattr(Tensor([1, 2]), name)().dtype == dtypes.float32  # ints become the default float


@pytest.mark.parametrize("name,switch", [("asin", 0.25), ("asinh", 0.3), ("atanh", 0.3), ("sinh", 0.5),
                                         ("erf", 1.0), ("atan", 0.25)])
def test_small_inputs_keep_relative_accuracy(name: str, switch: float) -> None:
    """Near 0 the textbook formulas cancel; the series keeps every result within a few ulps relative."""
    ref = UNARY[name][0]
    x = np.concatenate([np.geomspace(1e-30, switch * 2, 200), -np.geomspace(1e-20, switch * 2, 50)]).astype(
        np.float32)
    got = getattr(Tensor(x), name)().numpy().astype(np.float64)
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=1e-6, atol=0)


def test_erf_is_accurate_everywhere() -> None:
    """Exact GELU relies on erf: ~1e-6 relative to math.erf in float32 over the whole line."""
    x = np.concatenate([np.linspace(-10, 10, 20001), np.geomspace(1e-38, 1, 400), [0.0, -0.0]]).astype(np.float32)
    got = Tensor(x).erf().numpy().astype(np.float64)
    exact = np_erf(x)
    assert np.max(np.abs(got - exact) / np.maximum(np.abs(exact), 1e-300)) < 1e-6
    assert Tensor([math.inf, -math.inf]).erf().tolist() == [1.0, -1.0]


def test_large_and_infinite_inputs() -> None:
    assert np.allclose(Tensor([1e30, -1e30, math.inf, -math.inf]).atan().numpy(), [math.pi / 2, -math.pi / 2] * 2)
    assert np.allclose(Tensor([-200.0, 200.0]).logsigmoid().numpy(), [-200.0, 0.0])
    assert np.isnan(Tensor([1.5, -1.5]).asin().numpy()).all()  # outside the domain: NaN, as numpy
    assert np.allclose(Tensor([-1.0, 1.0]).asin().numpy(), [-math.pi / 2, math.pi / 2])


# ---------------------------------------------------------------------- binary ops and predicates
def test_eq_ne_methods() -> None:
    a, b = Tensor([1, 2, 3]), Tensor([[1], [3]])
    assert a.eq(b).tolist() == [[True, False, False], [False, False, True]]
    assert a.ne(2).tolist() == [True, False, True]
    assert a.eq(b).dtype == dtypes.bool and Tensor.eq(a, 1).tolist() == [True, False, False]


def test_copysign() -> None:
    x, y = rand(3, 4), np.array([1.0, -1.0, 0.0, -0.0], dtype=np.float32)
    got = Tensor(x).copysign(Tensor(y)).numpy()
    np.testing.assert_array_equal(got, np.copysign(x, y))
    assert Tensor([1.0, -2.0]).copysign(-3).tolist() == [-1.0, -2.0]
    check_grad(lambda a, b: a.copysign(b), torch_or_none("copysign"), rand(2, 3), rand(2, 3))


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_fmod(dtype: Any) -> None:
    a = np.array([-7, -5, 5, 7, 3, -3], dtype=dtype)
    b = np.array([2, -3, 3, -2, 5, 5], dtype=dtype)
    got = Tensor(a).fmod(Tensor(b))
    np.testing.assert_array_equal(got.numpy(), np.fmod(a, b))
    assert got.dtype == Tensor(a).dtype
    np.testing.assert_allclose(Tensor(a).fmod(2.5).numpy(), np.fmod(a, 2.5), rtol=1e-6)
    if dtype == np.float32:
        check_grad(lambda x, y: x.fmod(y), torch_or_none("fmod"), rand(2, 3, low=1, high=5), rand(2, 3, low=1, high=2))


def test_lerp() -> None:
    a, b, w = rand(2, 3), rand(3), rand(2, 1, low=0, high=1)
    np.testing.assert_allclose(Tensor(a).lerp(Tensor(b), Tensor(w)).numpy(), a + (b - a) * w, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(Tensor(a).lerp(Tensor(b), 0.25).numpy(), a + (b - a) * 0.25, rtol=1e-6, atol=1e-6)
    check_grad(lambda x, y, z: x.lerp(y, z), torch_or_none("lerp"), rand(2, 3), rand(2, 3), rand(2, 3))


def test_logaddexp() -> None:
    a, b = rand(3, 4, low=-50, high=50), rand(4, low=-50, high=50)
    np.testing.assert_allclose(Tensor(a).logaddexp(Tensor(b)).numpy(), np.logaddexp(a, b), rtol=1e-6, atol=1e-5)
    assert Tensor([-math.inf, 1000.0]).logaddexp(Tensor([-math.inf, 1000.0])).tolist() == \
        [-math.inf, pytest.approx(1000 + math.log(2))]
    check_grad(lambda x, y: x.logaddexp(y), torch_or_none("logaddexp"), rand(2, 3), rand(2, 3))


def test_float_predicates() -> None:
    x = Tensor([1.0, math.inf, -math.inf, math.nan, 0.0])
    assert x.isnan().tolist() == [False, False, False, True, False]
    assert x.isinf().tolist() == [False, True, True, False, False]
    assert x.isinf(detect_negative=False).tolist() == [False, True, False, False, False]
    assert x.isinf(detect_positive=False).tolist() == [False, False, True, False, False]
    assert x.isfinite().tolist() == [True, False, False, False, True]
    assert Tensor([1, 2]).isinf().tolist() == [False, False] and Tensor([1, 2]).isfinite().dtype == dtypes.bool


def test_isclose_allclose() -> None:
    a = np.array([1.0, 1e-9, math.inf, math.nan, 2.0, -math.inf], dtype=np.float32)
    b = np.array([1.0 + 1e-6, 0.0, math.inf, math.nan, 2.1, math.inf], dtype=np.float32)
    for equal_nan in (False, True):
        np.testing.assert_array_equal(Tensor(a).isclose(Tensor(b), equal_nan=equal_nan).numpy(),
                                      np.isclose(a, b, equal_nan=equal_nan))
    np.testing.assert_array_equal(Tensor(a).isclose(Tensor(b), rtol=0.1).numpy(), np.isclose(a, b, rtol=0.1))
    assert Tensor(a[:2]).allclose(Tensor(b[:2])).item() is True
    assert Tensor(a[:3]).allclose(Tensor(b[:3]), atol=0, rtol=1e-9).item() is False
    assert Tensor([1.0, 2.0]).isclose(1.0).tolist() == [True, False]  # a scalar broadcasts


# ---------------------------------------------------------------------- views
def test_pad_to_and_shrink_to() -> None:
    x = rand(2, 3)
    assert Tensor(x).pad_to(4, 5).numpy().tolist() == np.pad(x, ((0, 2), (0, 2))).tolist()
    assert Tensor(x).pad_to((None, 4), value=7).numpy()[:, 3].tolist() == [7, 7]
    np.testing.assert_array_equal(Tensor(x).shrink_to(1, None).numpy(), x[:1])
    np.testing.assert_array_equal(Tensor(x).shrink_to((2, 2)).numpy(), x[:, :2])
    with pytest.raises(ValueError, match="smaller"):
        Tensor(x).pad_to(1, 3)
    with pytest.raises(ValueError, match="one entry per dim"):
        Tensor(x).shrink_to(1)


def test_diag() -> None:
    v = rand(4)
    np.testing.assert_array_equal(Tensor(v).diag().numpy(), np.diag(v))
    assert Tensor.zeros(0).diag().shape == (0, 0)
    with pytest.raises(ValueError, match="1-D"):
        Tensor(rand(2, 2)).diag()
    check_grad(lambda t: t.diag(), torch_or_none("diag"), rand(3))


@pytest.mark.parametrize("offset,dim1,dim2", [(0, 0, 1), (1, 0, 1), (-1, 0, 1), (2, -1, -2), (0, 0, 2), (5, 0, 1),
                                              (-1, 2, 1)])
def test_diagonal(offset: int, dim1: int, dim2: int) -> None:
    x = rand(3, 4, 5)
    got = Tensor(x).diagonal(offset, dim1, dim2)
    np.testing.assert_array_equal(got.numpy(), np.diagonal(x, offset, dim1, dim2))
    if torch is not None and got.numel():
        check_grad(lambda t: t.diagonal(offset, dim1, dim2), lambda t: torch.diagonal(t, offset, dim1, dim2), x)


def test_diagonal_bad_dims() -> None:
    with pytest.raises(ValueError, match="must differ"):
        Tensor(rand(2, 2)).diagonal(0, 1, -1)
    with pytest.raises(IndexError):
        Tensor(rand(2, 2)).diagonal(0, 0, 2)


@pytest.mark.parametrize("diagonal", [0, 1, -1, 3, -4])
def test_tril_triu(diagonal: int) -> None:
    x = rand(2, 3, 4)
    np.testing.assert_array_equal(Tensor(x).tril(diagonal).numpy(), np.tril(x, diagonal))
    np.testing.assert_array_equal(Tensor(x).triu(diagonal).numpy(), np.triu(x, diagonal))
    xt = rand(4, 3)
    np.testing.assert_array_equal(Tensor(xt).T.triu(diagonal).numpy(), np.triu(xt.T, diagonal))
    assert Tensor([[1, 2], [3, 4]]).tril().dtype == dtypes.int32
    check_grad(lambda t: t.tril(diagonal), lambda t: torch.tril(t, diagonal), rand(3, 3))
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor([1.0, 2.0]).triu()


@pytest.mark.parametrize("shifts,dims", [(1, 0), (-2, 1), ((1, 2), (0, 1)), (7, -1), (3, None), (0, 0)])
def test_roll(shifts: Any, dims: Any) -> None:
    x = rand(3, 4)
    np.testing.assert_array_equal(Tensor(x).roll(shifts, dims).numpy(), np.roll(x, shifts, dims))
    check_grad(lambda t: t.roll(shifts, dims), lambda t: torch.roll(t, shifts, dims), x)
    with pytest.raises(ValueError, match="shifts"):
        Tensor(x).roll((1, 2), 0)


@pytest.mark.parametrize("dim,size,step", [(0, 2, 1), (1, 3, 2), (-1, 5, 1), (1, 1, 3), (0, 0, 1)])
def test_unfold(dim: int, size: int, step: int) -> None:
    x = rand(3, 5)
    got = Tensor(x).unfold(dim, size, step)
    moved = np.moveaxis(x, dim, -1)
    starts = range(0, moved.shape[-1] - size + 1, step)
    ref = np.stack([moved[..., s:s + size] for s in starts], axis=-2)  # (..., windows, size)
    ref = np.moveaxis(ref, -2, dim if dim >= 0 else x.ndim + dim)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got.numpy(), ref)
    if torch is not None:
        np.testing.assert_array_equal(got.numpy(), torch.tensor(x).unfold(dim, size, step).numpy())
        if size:
            check_grad(lambda t: t.unfold(dim, size, step), lambda t: t.unfold(dim, size, step), x)
    with pytest.raises(ValueError, match="larger"):
        Tensor(x).unfold(0, 4, 1)
    with pytest.raises(ValueError, match="step"):
        Tensor(x).unfold(0, 1, 0)


@pytest.mark.parametrize("dim", [None, 0, 1, -1])
def test_repeat_interleave(dim: int | None) -> None:
    x = rand(2, 3)
    np.testing.assert_array_equal(Tensor(x).repeat_interleave(3, dim).numpy(), np.repeat(x, 3, dim))
    check_grad(lambda t: t.repeat_interleave(2, dim), lambda t: t.repeat_interleave(2, dim), x)
    assert Tensor(x).repeat_interleave(0, 1).shape == (2, 0)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid(indexing: str) -> None:
    a, b, c = rand(2), rand(3), rand(4)
    got = Tensor(a).meshgrid(Tensor(b), Tensor(c), indexing=indexing)
    for g, r in zip(got, np.meshgrid(a, b, c, indexing=indexing)):
        np.testing.assert_array_equal(g.numpy(), r)
    static = Tensor.meshgrid(Tensor(a), Tensor(b), indexing=indexing)
    for g, r in zip(static, np.meshgrid(a, b, indexing=indexing)):
        np.testing.assert_array_equal(g.numpy(), r)
    assert [t.shape for t in Tensor(3.0).meshgrid(Tensor(b))] == [(1, 3), (1, 3)]
    with pytest.raises(ValueError, match="indexing"):
        Tensor(a).meshgrid(Tensor(b), indexing="ji")


REARRANGE = [
    ("a b c -> c a b", {}, lambda x: x.transpose(2, 0, 1)),
    ("a b c -> a (b c)", {}, lambda x: x.reshape(2, 12)),
    ("a (b c) d -> a b c d", {"b": 1}, None),
    ("a b c -> (c a) b", {}, lambda x: x.transpose(2, 0, 1).reshape(8, 3)),
    ("... c -> c ...", {}, lambda x: np.moveaxis(x, -1, 0)),
    ("a ... -> (...) a", {}, lambda x: x.reshape(2, 12).T),
    ("a b c -> a 1 b c", {}, lambda x: x[:, None]),
    ("a b c -> a b c ()", {}, lambda x: x[..., None]),
    ("a (b1 b2) c -> a b2 b1 c", {"b1": 3}, lambda x: x.reshape(2, 3, 1, 4).transpose(0, 2, 1, 3)),
]


@pytest.mark.parametrize("formula,sizes,ref", REARRANGE)
def test_rearrange(formula: str, sizes: dict[str, int], ref: Callable[[np.ndarray], np.ndarray] | None) -> None:
    x = rand(2, 3, 4)
    got = Tensor(x).rearrange(formula, **sizes)
    if ref is not None:
        np.testing.assert_array_equal(got.numpy(), ref(x))
    else:
        assert got.shape == (2, 1, 3, 4)


@pytest.mark.parametrize("formula,sizes,match", [("a b -> a", {}, "same distinct axes"),
                                                 ("a b c -> a b c -> a", {}, "exactly one"),
                                                 ("a (b c) d -> a b c d", {}, "all but one"),
                                                 ("a b c d -> a b c d", {}, "names 4 dims"),
                                                 ("a b c -> a b c", {"z": 2}, "does not use"),
                                                 ("a (b c d -> a b c d", {}, "unbalanced"),
                                                 ("a (b c) d -> a b c d", {"b": 5}, "do not fit")])
def test_rearrange_errors(formula: str, sizes: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Tensor(rand(2, 3, 4)).rearrange(formula, **sizes)


# ---------------------------------------------------------------------- masks and data-dependent shapes
def test_masked_fill() -> None:
    x, mask = rand(2, 3), np.array([True, False, True])
    np.testing.assert_array_equal(Tensor(x).masked_fill(Tensor(mask), -5.0).numpy(), np.where(mask, -5.0, x))
    ints = Tensor([1, 2, 3]).masked_fill(Tensor([False, True, False]), Tensor([9, 9, 9]))
    assert ints.tolist() == [1, 9, 3] and ints.dtype == dtypes.int32
    check_grad(lambda t: t.masked_fill(Tensor(mask), 0.0), lambda t: t.masked_fill(torch.tensor(mask), 0.0), x)
    with pytest.raises(TypeError, match="bool mask"):
        Tensor(x).masked_fill(Tensor([1, 0, 1]), 0.0)


def test_masked_select() -> None:
    x = rand(3, 4)
    mask = x > 0
    got = Tensor(x).masked_select(Tensor(mask))
    np.testing.assert_array_equal(got.numpy(), x[mask])
    assert got.shape == (int(mask.sum()),)
    row_mask = np.array([True, False, False, True])  # broadcast over rows
    np.testing.assert_array_equal(Tensor(x).masked_select(Tensor(row_mask)).numpy(), x[np.broadcast_to(row_mask,
                                                                                                        x.shape)])
    sized = Tensor(x).masked_select(Tensor(mask), size=20, fill_value=-1.0).numpy()
    np.testing.assert_array_equal(sized, np.concatenate([x[mask], -np.ones(20 - mask.sum(), np.float32)]))
    # (x comes from the module's generator, so how many are kept depends on the tests run before: fewer than 2 kept
    # are padded with the default fill_value 0)
    np.testing.assert_array_equal(Tensor(x).masked_select(Tensor(mask), size=2).numpy(),
                                  np.concatenate([x[mask], np.zeros(2, np.float32)])[:2])
    assert Tensor(x).masked_select(Tensor(np.zeros_like(mask))).shape == (0,)
    check_grad(lambda t: t.masked_select(Tensor(mask)), lambda t: t.masked_select(torch.tensor(mask)), x)


@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 2), (), (0, 3)])
def test_nonzero(shape: tuple[int, ...]) -> None:
    x = RNG.integers(-1, 2, shape).astype(np.int32) * (RNG.random(shape) > 0.3)
    got = Tensor(x).nonzero()
    ref = np.argwhere(x)
    assert got.shape == ref.shape and got.dtype == dtypes.int32
    np.testing.assert_array_equal(got.numpy(), ref)
    if len(shape) and 0 not in shape:
        sized = Tensor(x).nonzero(size=x.size + 1, fill_value=-1).numpy()
        np.testing.assert_array_equal(sized[:len(ref)], ref)
        assert (sized[len(ref):] == -1).all()


# ---------------------------------------------------------------------- cumulative ops
def _np_cumulative_index(x: np.ndarray, axis: int, better: Callable[[Any, Any], bool]) -> tuple[np.ndarray, ...]:
    """Running best along axis and the latest index holding it (PyTorch's tie rule), by loops."""
    moved = np.moveaxis(x, axis, -1)
    values, idx = np.empty_like(moved), np.zeros(moved.shape, np.int32)
    for pos in np.ndindex(*moved.shape[:-1]):
        best, at = moved[pos][0], 0
        for j, v in enumerate(moved[pos]):
            if better(v, best) or v == best:
                best, at = v, j
            values[pos][j], idx[pos][j] = best, at
    return np.moveaxis(values, -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumprod(axis: int) -> None:
    x = rand(3, 4, low=0.5, high=1.5)
    np.testing.assert_allclose(Tensor(x).cumprod(axis).numpy(), np.cumprod(x, axis), rtol=1e-6)
    np.testing.assert_array_equal(Tensor([[1, 2, 3], [0, 4, 5]]).cumprod(1).numpy(), [[1, 2, 6], [0, 0, 0]])
    check_grad(lambda t: t.cumprod(axis), lambda t: torch.cumprod(t, axis), rand(2, 3))
    check_grad(lambda t: t.cumprod(0), lambda t: torch.cumprod(t, 0), np.array([2.0, 0.0, 3.0, 0.5], np.float32))


@pytest.mark.parametrize("name", ["cummax", "cummin"])
def test_cummax_cummin(name: str) -> None:
    x = RNG.integers(0, 4, (3, 6)).astype(np.float32)  # many ties
    better = (lambda a, b: a > b) if name == "cummax" else (lambda a, b: a < b)
    for axis in (0, 1, -1):
        values, idx = getattr(Tensor(x), name)(axis)
        ref_v, ref_i = _np_cumulative_index(x, axis, better)
        np.testing.assert_array_equal(values.numpy(), ref_v)
        np.testing.assert_array_equal(idx.numpy(), ref_i)
        assert idx.dtype == dtypes.int32
        if torch is not None:
            tv, ti = getattr(torch, name)(torch.tensor(x), axis)
            np.testing.assert_array_equal(idx.numpy(), ti.numpy())
    ints = getattr(Tensor([3, -1, 5, 5, 2]), name)(0)
    assert ints[0].dtype == dtypes.int32
    np.testing.assert_array_equal(ints[0].numpy(), (np.maximum if name == "cummax" else np.minimum).accumulate(
        [3, -1, 5, 5, 2]))
    check_grad(lambda t: getattr(t, name)(1)[0], lambda t: getattr(torch, name)(t, 1)[0], rand(2, 5))
    assert getattr(Tensor(2.0), name)(0)[0].item() == 2.0


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_logcumsumexp(axis: int) -> None:
    x = rand(3, 4, low=-30, high=30)
    np.testing.assert_allclose(Tensor(x).logcumsumexp(axis).numpy(), np.logaddexp.accumulate(x, axis), rtol=1e-5,
                               atol=1e-5)
    big = Tensor([1000.0, 1000.0, -math.inf]).logcumsumexp().numpy()
    np.testing.assert_allclose(big, [1000.0, 1000 + math.log(2), 1000 + math.log(2)], rtol=1e-6)
    check_grad(lambda t: t.logcumsumexp(axis), lambda t: torch.logcumsumexp(t, axis), rand(2, 3))
    assert Tensor(1.5).logcumsumexp().item() == 1.5


def test_cumulative_bad_axis() -> None:
    for name in ("cumprod", "cummax", "cummin", "logcumsumexp"):
        with pytest.raises(IndexError, match="out of range"):
            getattr(Tensor(rand(2, 3)), name)(2)


# ---------------------------------------------------------------------- reductions
@pytest.mark.parametrize("axis,keepdim,correction", [(None, False, 1), (0, True, 0), ((0, -1), False, 1)])
def test_var_mean_std_mean(axis: Any, keepdim: bool, correction: int) -> None:
    x = rand(3, 4, 2)
    v, m = Tensor(x).var_mean(axis, keepdim, correction)
    s, m2 = Tensor(x).std_mean(axis, keepdim, correction)
    np.testing.assert_allclose(v.numpy(), np.var(x, axis, ddof=correction, keepdims=keepdim), rtol=1e-5)
    np.testing.assert_allclose(s.numpy(), np.std(x, axis, ddof=correction, keepdims=keepdim), rtol=1e-5)
    np.testing.assert_allclose(m.numpy(), np.mean(x, axis, keepdims=keepdim), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(m.numpy(), m2.numpy())


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmin(axis: int) -> None:
    x = rand(3, 4)
    e = np.exp(-(x - x.min(axis, keepdims=True)))
    np.testing.assert_allclose(Tensor(x).softmin(axis).numpy(), e / e.sum(axis, keepdims=True), rtol=1e-5)
    check_grad(lambda t: t.softmin(axis), lambda t: F.softmin(t, axis), x)
    assert Tensor([1, 2]).softmin().dtype == dtypes.float32


@pytest.mark.parametrize("p,dim", [(2.0, 1), (1.0, 0), (3.0, -1), (0.0, 1)])
def test_normalize(p: float, dim: int) -> None:
    x = rand(3, 4)
    x[1] = 0.0  # a zero row stays zero, with a finite gradient
    norm = np.sum(x != 0, dim, keepdims=True) if p == 0 else np.sum(np.abs(x) ** p, dim, keepdims=True) ** (1 / p)
    np.testing.assert_allclose(Tensor(x).normalize(p, dim).numpy(), x / np.maximum(norm, 1e-12), rtol=1e-5,
                               atol=1e-6)
    if p == 2.0:
        # at the zero row the gradient is 1/eps (PyTorch's): finite, but no finite difference can see it, so the
        # comparison (with finite differences where torch is missing) uses rows away from zero
        t = Tensor(x, requires_grad=True)
        t.normalize(p, dim).sum().backward()
        assert t.grad is not None and np.isfinite(t.grad.numpy()).all()
        away = x.copy()
        away[1] = rand(4) + 0.5
        check_grad(lambda t: t.normalize(p, dim), lambda t: F.normalize(t, p, dim), away)


# ---------------------------------------------------------------------- scatter, unpool, losses
def np_scatter_reduce(x: np.ndarray, dim: int, index: np.ndarray, src: np.ndarray, reduce: str,
                      include_self: bool) -> np.ndarray:
    out, groups = x.copy(), {}
    for pos in np.ndindex(*index.shape):
        target = list(pos)
        target[dim] = index[pos]
        groups.setdefault(tuple(target), []).append(src[pos])
    combine = {"sum": np.sum, "prod": np.prod, "amax": np.max, "amin": np.min, "mean": np.mean}[reduce]
    for target, values in groups.items():
        out[target] = combine(([x[target]] if include_self else []) + values)
    return out


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_reduce(reduce: str, include_self: bool, dim: int) -> None:
    x, src = rand(3, 4), rand(3, 4)
    index = RNG.integers(0, x.shape[dim], (2, 3)).astype(np.int32)
    got = Tensor(x).scatter_reduce(dim, Tensor(index), Tensor(src), reduce, include_self).numpy()
    ref = np_scatter_reduce(x, dim % 2, index, src, reduce, include_self)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    if torch is not None:
        tref = torch.tensor(x).scatter_reduce(dim, torch.tensor(index, dtype=torch.int64), torch.tensor(src), reduce,
                                              include_self=include_self)
        np.testing.assert_allclose(got, tref.numpy(), rtol=1e-5, atol=1e-6)
        if reduce in ("sum", "mean", "prod"):  # (PyTorch's backward needs src shaped like index)
            tidx = torch.tensor(index, dtype=torch.int64)
            check_grad(lambda a, b: a.scatter_reduce(dim, Tensor(index), b, reduce, include_self),
                       lambda a, b: a.scatter_reduce(dim, tidx, b, reduce, include_self=include_self), x, src[:2, :3])


def test_scatter_reduce_errors() -> None:
    x = Tensor(rand(3, 4))
    with pytest.raises(ValueError, match="reduce must be one of"):
        x.scatter_reduce(0, Tensor([[0]]), Tensor(rand(1, 1)), "max")
    with pytest.raises(TypeError, match="float32"):
        x.scatter_reduce(0, Tensor([[0]]), Tensor([[1]]), "sum")
    with pytest.raises(ValueError, match="no larger"):
        x.scatter_reduce(0, Tensor(np.zeros((4, 5), np.int32)), Tensor(rand(4, 5)), "sum")
    assert Tensor([[1, 2]]).scatter_reduce(1, Tensor([[0, 0]]), Tensor([[3, 4]]), "mean").dtype == dtypes.int32


def np_max_pool_with_indices(x: np.ndarray, k: int, s: int) -> tuple[np.ndarray, np.ndarray]:
    n, c, h, w = x.shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    values, idx = np.zeros((n, c, oh, ow), x.dtype), np.zeros((n, c, oh, ow), np.int32)
    for b, ch, i, j in np.ndindex(n, c, oh, ow):
        window = x[b, ch, i * s:i * s + k, j * s:j * s + k]
        a, bb = np.unravel_index(np.argmax(window), window.shape)
        values[b, ch, i, j], idx[b, ch, i, j] = window[a, bb], (i * s + a) * w + j * s + bb
    return values, idx


@pytest.mark.parametrize("k,s,size", [(2, 2, 6), (3, 1, 7), (2, 3, 8)])
def test_max_unpool2d(k: int, s: int, size: int) -> None:
    x = rand(2, 3, size, size)  # sizes the windows cover exactly, so the default output size is the input's
    pooled, idx = np_max_pool_with_indices(x, k, s)
    got = Tensor(pooled).max_unpool2d(Tensor(idx), kernel_size=k, stride=s)
    out_h = (pooled.shape[2] - 1) * s + k
    assert out_h == size
    ref = np.zeros((2, 3, out_h * out_h), np.float32)
    for b, ch in np.ndindex(2, 3):
        ref[b, ch, idx[b, ch].reshape(-1)] = pooled[b, ch].reshape(-1)
    np.testing.assert_array_equal(got.numpy(), ref.reshape(2, 3, out_h, out_h))
    sized = Tensor(pooled).max_unpool2d(Tensor(idx), kernel_size=k, stride=s, output_size=(size, size))
    np.testing.assert_array_equal(sized.numpy(), got.numpy())
    if torch is not None:
        tref = F.max_unpool2d(torch.tensor(pooled), torch.tensor(idx, dtype=torch.int64), k, s,
                              output_size=(size, size))
        np.testing.assert_array_equal(sized.numpy(), tref.numpy())
        tidx = torch.tensor(idx, dtype=torch.int64)
        torch_fn = (lambda t: F.max_unpool2d(t, tidx[:1, :1], k, s, output_size=(size, size))) if k <= s else None
        check_grad(lambda t: t.max_unpool2d(Tensor(idx[:1, :1]), kernel_size=k, stride=s, output_size=(size, size)),
                   torch_fn, pooled[:1, :1])  # overlapping windows: finite differences (see max_unpool2d)
    with pytest.raises(ValueError, match="indices"):
        Tensor(pooled).max_unpool2d(Tensor(idx[:, :1]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,ignore", [(False, None), (True, None), (True, 2), (False, 0)])
def test_nll_loss(reduction: str, weighted: bool, ignore: int | None) -> None:
    logp = np.log(np.exp(rand(5, 4)) / np.exp(rand(5, 4)).sum(1, keepdims=True)).astype(np.float32)
    logp = rand(5, 4, low=-3, high=0)
    target = np.array([0, 2, 3, 2, 1], np.int32)
    weight = rand(4, low=0.5, high=2) if weighted else None
    got = Tensor(logp).nll_loss(Tensor(target), None if weight is None else Tensor(weight), ignore, reduction)
    w = (weight[target] if weight is not None else np.ones(5, np.float32)) * (target != ignore)
    per = -logp[np.arange(5), target] * w
    ref = {"mean": per.sum() / w.sum(), "sum": per.sum(), "none": per}[reduction]
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-6)
    if torch is not None:
        kwargs = {"ignore_index": ignore} if ignore is not None else {}
        tw = None if weight is None else torch.tensor(weight)
        tref = F.nll_loss(torch.tensor(logp), torch.tensor(target, dtype=torch.int64), tw, reduction=reduction,
                          **kwargs)
        np.testing.assert_allclose(got.numpy(), tref.numpy(), rtol=1e-5, atol=1e-6)
        ttarget = torch.tensor(target, dtype=torch.int64)
        check_grad(lambda t: t.nll_loss(Tensor(target), None if weight is None else Tensor(weight), ignore,
                                        reduction),
                   lambda t: F.nll_loss(t, ttarget, tw, reduction=reduction, **kwargs), logp)


def test_nll_loss_spatial_and_errors() -> None:
    logp, target = rand(2, 3, 4, low=-3, high=0), RNG.integers(0, 3, (2, 4)).astype(np.int32)
    got = Tensor(logp).nll_loss(Tensor(target)).numpy()
    ref = -np.take_along_axis(logp, target[:, None], 1).mean()
    np.testing.assert_allclose(got, ref, rtol=1e-6)
    with pytest.raises(ValueError, match="int targets"):
        Tensor(logp).nll_loss(Tensor(target.astype(np.float32)))
    with pytest.raises(ValueError, match="reduction"):
        Tensor(logp).nll_loss(Tensor(target), reduction="avg")
