"""The last of tinygrad's Tensor names (glassgrad/tensor_extra.py): values against numpy (and PyTorch when installed),
gradients of the activations by finite differences, and the distributions of the initialisers and samplers."""
from __future__ import annotations

import math

import numpy as np
import pytest

from glassgrad import Tensor, dtypes
from glassgrad.errors import ArgumentError

X = np.linspace(-5, 5, 41).astype(np.float32)


@pytest.mark.parametrize("name, ref", [
    ("hardtanh", lambda x: np.clip(x, -1, 1)),
    ("hardsigmoid", lambda x: np.clip(x / 6 + 0.5, 0, 1)),
    ("hardswish", lambda x: x * np.clip(x + 3, 0, 6) / 6),
])
def test_hard_activations(name: str, ref: object) -> None:
    np.testing.assert_allclose(getattr(Tensor(X), name)().numpy(), ref(X), rtol=1e-6, atol=1e-7)  # type: ignore[operator]
    torch = pytest.importorskip("torch")
    np.testing.assert_allclose(getattr(Tensor(X), name)().numpy(),
                               getattr(torch.nn.functional, name)(torch.tensor(X)).numpy(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["hardtanh", "hardsigmoid", "hardswish"])
def test_hard_activation_gradients(name: str) -> None:
    x = np.array([-4.2, -2.1, -0.7, 0.3, 0.9, 2.4, 3.7], np.float64)
    t = Tensor(x, requires_grad=True)
    getattr(t, name)().sum().backward()
    assert t.grad is not None
    h = 1e-6
    numeric = (getattr(Tensor(x + h), name)().numpy() - getattr(Tensor(x - h), name)().numpy()) / (2 * h)
    np.testing.assert_allclose(t.grad.numpy(), numeric, atol=1e-5)


def test_casts_and_like_creation() -> None:
    t = Tensor([[1.5, -2.5]])
    assert t.short().dtype == dtypes.int16 and t.short().tolist() == [[1, -2]]
    assert t.bfloat16().dtype == dtypes.bfloat16
    assert t.is_floating_point() and not t.int().is_floating_point()
    assert t.const_like(7).tolist() == [[7.0, 7.0]] and t.const_like(7).dtype == t.dtype
    e = t.empty_like(dtype=dtypes.int32)
    assert e.shape == (1, 2) and e.dtype == dtypes.int32


@pytest.mark.parametrize("init, std", [
    (lambda: Tensor.kaiming_uniform(64, 32, 3, 3, a=0.0), math.sqrt(2 / (32 * 9))),
    (lambda: Tensor.kaiming_normal(64, 32, 3, 3, a=0.0), math.sqrt(2 / (32 * 9))),
    (lambda: Tensor.glorot_uniform(128, 64), math.sqrt(2 / (128 + 64))),
    (lambda: Tensor.scaled_uniform(128, 64), math.sqrt(1 / 3) * (128 * 64) ** -0.5),
])
def test_initialisers_have_their_spread(init: object, std: float) -> None:
    Tensor.manual_seed(0)
    w = init().numpy()  # type: ignore[operator]
    assert abs(w.mean()) < 0.1 * std and abs(w.std() - std) < 0.05 * std


def test_randperm_and_random_bits() -> None:
    Tensor.manual_seed(1)
    p = Tensor.randperm(50).numpy()
    assert sorted(p.tolist()) == list(range(50)) and p.tolist() != list(range(50))
    bits = Tensor.random_bits(4, 5)
    assert bits.dtype == dtypes.uint32 and bits.shape == (4, 5)
    with pytest.raises(ValueError, match="randperm"):
        Tensor.randperm(-1)


def test_multinomial_follows_the_weights() -> None:
    Tensor.manual_seed(2)
    w = Tensor([1.0, 0.0, 3.0])
    s = w.multinomial(20_000, replacement=True).numpy()
    assert s.shape == (20_000,) and set(np.unique(s)) <= {0, 2}
    assert abs((s == 2).mean() - 0.75) < 0.02
    rows = Tensor([[0.0, 1.0], [1.0, 0.0]]).multinomial()
    assert rows.numpy().tolist() == [[1], [0]]
    with pytest.raises(NotImplementedError):
        w.multinomial(2)


def _np_newton_schulz(m: np.ndarray, steps: int, params: tuple[float, ...], eps: float = 1e-7) -> np.ndarray:
    """tinygrad's rule in float64: per matrix of the last two dims, X <- sum_i p_i (X X^T)^i X after dividing by the
    Frobenius norm; tall matrices iterated transposed."""
    x = m.astype(np.float64)
    tall = x.shape[-2] > x.shape[-1]
    x = np.swapaxes(x, -2, -1) if tall else x
    x = x / (np.sqrt((x * x).sum((-2, -1), keepdims=True)) + eps)
    for _ in range(steps):
        gram, term, new = x @ np.swapaxes(x, -2, -1), x, 0.0
        for p in params:
            new, term = new + p * term, gram @ term
        x = new
    return np.swapaxes(x, -2, -1) if tall else x


@pytest.mark.parametrize("shape, params", [((6, 4), (3.4445, -4.775, 2.0315)), ((3, 4, 6), (3.4445, -4.775, 2.0315)),
                                           ((2, 2, 7, 3), (2.0, -1.5, 0.5)), ((5, 5), (1.5, -0.5)), ((4, 6), (0.9,))])
def test_newton_schulz_batches_and_any_odd_polynomial(shape: tuple[int, ...], params: tuple[float, ...]) -> None:
    """tinygrad 0.14's newton_schulz takes a batch of matrices and any number of coefficients; here it took one
    2-d matrix and exactly three."""
    m = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = Tensor(m).newton_schulz(5, params).numpy()
    np.testing.assert_allclose(got, _np_newton_schulz(m, 5, params), atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match=r"2 or more dims.*\(4,\)"):
        Tensor(m.reshape(-1)[:4]).newton_schulz()


def test_newton_schulz_orthogonalises() -> None:
    rng = np.random.default_rng(0)
    m = rng.standard_normal((8, 16)).astype(np.float32)
    o = Tensor(m).newton_schulz(steps=10).numpy()
    s = np.linalg.svd(o, compute_uv=False)
    assert s.min() > 0.5 and s.max() < 1.5  # Muon's quintic iteration pushes singular values into about [0.7, 1.2]
    assert Tensor(m.T).newton_schulz().shape == (16, 8)


IN_PLACE = {  # PyTorch's in-place method: (call, the numpy result for x = [0.5, 1, 2])
    "add_": (lambda t: t.add_(1), [1.5, 2, 3]),
    "add_ alpha": (lambda t: t.add_(Tensor([1.0, 1.0, 1.0]), alpha=2), [2.5, 3, 4]),
    "sub_ alpha": (lambda t: t.sub_(1, alpha=0.5), [0, 0.5, 1.5]),
    "mul_": (lambda t: t.mul_(2), [1, 2, 4]),
    "div_": (lambda t: t.div_(2), [0.25, 0.5, 1]),
    "pow_": (lambda t: t.pow_(2), [0.25, 1, 4]),
    "neg_": (lambda t: t.neg_(), [-0.5, -1, -2]),
    "exp_": (lambda t: t.exp_(), list(np.exp([0.5, 1, 2]))),
    "sqrt_": (lambda t: t.sqrt_(), list(np.sqrt([0.5, 1, 2]))),
    "zero_": (lambda t: t.zero_(), [0, 0, 0]),
    "fill_": (lambda t: t.fill_(3), [3, 3, 3]),
    "copy_": (lambda t: t.copy_(Tensor([9.0, 8.0, 7.0])), [9, 8, 7]),
    "copy_ broadcast": (lambda t: t.copy_(Tensor([7.0])), [7, 7, 7]),
    "clamp_": (lambda t: t.clamp_(0.6, 1.5), [0.6, 1, 1.5]),
    "clamp_ min only": (lambda t: t.clamp_(min=1.0), [1, 1, 2]),
    "masked_fill_": (lambda t: t.masked_fill_(t > 1, 0.0), [0.5, 1, 0]),
}


@pytest.mark.parametrize("name", IN_PLACE)
def test_pytorch_in_place_methods(name: str) -> None:
    """`x.op_(...)` writes x in place and returns x; a tensor built from x's old value keeps it (they are
    `assign`s). They raised AttributeError (PyTorch habits: `b.zero_()`, `w.normal_(0, 0.02)`, `p.sub_(lr * g)`)."""
    call, expected = IN_PLACE[name]
    x = Tensor([0.5, 1.0, 2.0])
    before = x * 1
    assert call(x) is x
    np.testing.assert_allclose(x.numpy(), np.array(expected, np.float32), rtol=1e-6)
    np.testing.assert_array_equal(before.numpy(), [0.5, 1.0, 2.0])


def test_in_place_methods_on_views_random_fills_and_clamp_keywords() -> None:
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    x[0].add_(10)  # through a view: the row of its base
    assert x.tolist() == [[11.0, 12.0], [3.0, 4.0]]
    Tensor.manual_seed(3)
    w = Tensor.empty(2000).uniform_(-2, 3)
    values = w.numpy()
    assert values.min() >= -2 and values.max() < 3 and abs(values.mean() - 0.5) < 0.1
    n = Tensor.empty(4000).normal_(1.0, 0.5).numpy()
    assert abs(n.mean() - 1.0) < 0.05 and abs(n.std() - 0.5) < 0.05
    t = Tensor([0.5, 1.0, 2.0])
    assert t.clamp(min=0.75).tolist() == [0.75, 1.0, 2.0] and t.clip(max=1.0).tolist() == [0.5, 1.0, 1.0]
    with pytest.raises(ArgumentError, match="not both"):
        t.clip(0.0, min=1.0)
    with pytest.raises(ValueError):
        Tensor([1.0, 2.0]).add_(Tensor([[1.0, 2.0], [3.0, 4.0]]))  # a bigger value cannot be written into x


DIM_OPS = ["sum", "mean", "prod", "std", "var", "argmax", "argmin", "softmax", "log_softmax", "cumsum", "logsumexp",
           "any", "all", "cumprod", "logcumsumexp"]


@pytest.mark.parametrize("name", DIM_OPS)
def test_reductions_take_pytorchs_dim_keyword(name: str) -> None:
    """`x.sum(dim=1)` is `x.sum(axis=1)` (PyTorch's keyword raised TypeError); giving both is a TypeError."""
    x = Tensor([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]])
    if name in ("any", "all"):
        x = x > 2
    np.testing.assert_allclose(getattr(x, name)(dim=1).numpy(), getattr(x, name)(axis=1).numpy())
    np.testing.assert_allclose(getattr(x, name)(dim=-1).numpy(), getattr(x, name)(1).numpy())
    with pytest.raises(TypeError, match="once"):
        getattr(x, name)(1, dim=1)


def test_max_and_min_with_dim_return_values_and_indices() -> None:
    """PyTorch's `values, indices = x.max(dim=1)`: with `dim=` the result is the pair (a tensor would unpack along
    its first axis, silently wrong for 2 rows); tinygrad's `x.max(1)` / `x.max(axis=1)` stays the values."""
    data = np.array([[1.0, 5.0, 3.0], [4.0, 2.0, 6.0]], np.float32)
    x = Tensor(data)
    values, indices = x.max(dim=1)
    assert values.tolist() == [5.0, 6.0] and indices.tolist() == [1, 2]
    low = x.min(dim=0, keepdim=True)
    assert low.values.tolist() == [[1.0, 2.0, 3.0]] and low.indices.tolist() == [[0, 1, 0]]
    assert x.max(1).tolist() == [5.0, 6.0] and x.max(axis=1).tolist() == [5.0, 6.0]
    assert x.t().shape == (3, 2) and Tensor([1.0, 2.0]).t().shape == (2,)
    assert x.type_as(Tensor([1])).dtype == dtypes.int32


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_with_dim_sends_a_tied_gradient_to_the_returned_index(name: str, keepdim: bool) -> None:
    """`x.max(dim=1).values` split the gradient among tied entries (amax's rule); PyTorch's goes to the entry at
    the returned index only, so a loss on `max(dim=...)` trained other weights than PyTorch's."""
    data = np.array([[3.0, 3.0, 0.0], [1.0, 1.0, 1.0], [-2.0, 5.0, 5.0]], np.float32)
    sign = 1 if name == "max" else -1
    x = Tensor(sign * data, requires_grad=True)
    values, indices = getattr(x, name)(dim=1, keepdim=keepdim)
    (values.reshape(3) * Tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(indices.reshape(3).numpy(), [0, 0, 1])
    np.testing.assert_array_equal(values.reshape(3).numpy(), sign * np.array([3.0, 1.0, 5.0]))
    np.testing.assert_array_equal(x.grad.numpy(), [[1, 0, 0], [2, 0, 0], [0, 3, 0]])
    assert values.shape == ((3, 1) if keepdim else (3,))


def test_argmax_and_max_with_dim_of_a_scalar() -> None:
    """A 0-d tensor takes dim 0 or -1 (PyTorch): argmax raised IndexError, so did `max(dim=0)`."""
    s = Tensor(3.0, requires_grad=True)
    assert s.argmax(0).item() == 0 and s.argmin(-1, keepdim=True).shape == ()
    values, indices = s.max(dim=0)
    assert values.shape == () and indices.item() == 0 and values.item() == 3.0
    values.backward()
    assert s.grad is not None and s.grad.item() == 1.0
    assert Tensor(7).min(dim=-1).values.item() == 7


def test_pytorch_only_methods_match_torch_or_numpy() -> None:
    """amax, amin, log1p, norm, unbind, index_select, nan_to_num, outer, mm, bmm, view_as, expand_as, swapaxes,
    narrow, movedim and count_nonzero: PyTorch's names tinygrad lacks (AttributeError before)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    x = Tensor(a)
    np.testing.assert_allclose(x.amax(1).numpy(), a.max(1))
    np.testing.assert_allclose(x.amin(dim=0, keepdim=True).numpy(), a.min(0, keepdims=True))
    small = np.array([1e-8, -1e-7, 0.5, 3.0, -0.5, 0.0], np.float32)
    np.testing.assert_allclose(Tensor(small).log1p().numpy(), np.log1p(small.astype(np.float64)), rtol=2e-7)
    np.testing.assert_allclose(x.norm().numpy(), np.linalg.norm(a), rtol=1e-6)
    np.testing.assert_allclose(x.norm(1, dim=1).numpy(), np.abs(a).sum(1), rtol=1e-6)
    np.testing.assert_allclose(x.norm(3, dim=0).numpy(), (np.abs(a) ** 3).sum(0) ** (1 / 3), rtol=1e-5)
    np.testing.assert_allclose(x.norm(math.inf).numpy(), np.abs(a).max())
    parts = x.unbind(1)
    assert len(parts) == 4 and all(np.array_equal(p.numpy(), a[:, i]) for i, p in enumerate(parts))
    np.testing.assert_array_equal(x.index_select(1, Tensor([3, 0, 3])).numpy(), a[:, [3, 0, 3]])
    with pytest.raises(ValueError, match="1-d integer"):
        x.index_select(0, Tensor([[0]]))
    odd = Tensor([np.nan, np.inf, -np.inf, 1.0]).nan_to_num(posinf=9.0).numpy()
    assert odd.tolist()[:2] == [0.0, 9.0] and odd[2] == np.finfo(np.float32).min and odd[3] == 1.0
    np.testing.assert_allclose(Tensor([1.0, 2.0]).outer(Tensor([3.0, 4.0, 5.0])).numpy(), np.outer([1, 2], [3, 4, 5]))
    b = rng.standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_allclose(x.mm(Tensor(b)).numpy(), a @ b, rtol=1e-5)
    np.testing.assert_allclose(Tensor(a[None]).bmm(Tensor(b[None])).numpy(), (a @ b)[None], rtol=1e-5)
    assert x.view_as(Tensor.empty(4, 3)).shape == (4, 3) and x[:1].expand_as(x).shape == (3, 4)
    np.testing.assert_array_equal(x.swapaxes(0, 1).numpy(), a.T)
    np.testing.assert_array_equal(x.narrow(1, 1, 2).numpy(), a[:, 1:3])
    c = rng.standard_normal((2, 3, 4)).astype(np.float32)
    np.testing.assert_array_equal(Tensor(c).movedim(0, -1).numpy(), np.moveaxis(c, 0, -1))
    assert Tensor([[0, 1], [2, 0]]).count_nonzero().item() == 2
    w = Tensor(small, requires_grad=True)
    w.log1p().sum().backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), 1 / (1 + small.astype(np.float64)), rtol=1e-6)


@pytest.mark.parametrize("p", [2.0, 3.0, 0.5, 1.0, math.inf, -math.inf])
@pytest.mark.parametrize("dim", [None, 1])
def test_norm_of_a_zero_vector_has_a_zero_gradient(p: float, dim: int | None) -> None:
    """`x.norm()` of a zero row (a penalty on a zero-initialised bias) had gradient 0 * inf = NaN, and p = 0 raised
    ZeroDivisionError. PyTorch's gradient is 0 there; other rows get |x|^(p-1) sign(x) / ||x||^(p-1)."""
    x = np.array([[0, 0, 0, 0], [1, -2, 0, 3], [0, 0.5, 0, 0]], np.float32)
    t = Tensor(x, requires_grad=True)
    out = t.norm(p) if dim is None else t.norm(p, dim)
    out.sum().backward()
    assert t.grad is not None
    a = np.abs(x).astype(np.float64)
    if math.isinf(p):
        ref = a.max(dim) if p > 0 else a.min(dim)
    else:
        ref = (a ** p).sum(dim) ** (1 / p)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-6)
    grad = t.grad.numpy()
    assert np.isfinite(grad).all()
    if dim == 1 and not math.isinf(p):
        np.testing.assert_array_equal(grad[0], 0)  # the zero row
        np.testing.assert_array_equal(grad[x == 0], 0)  # PyTorch's subgradient at a zero entry
        rows = ref[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):  # 0 ** (p - 1) for p < 1, masked out
            expected = np.where(x != 0, np.sign(x) * a ** (p - 1) / np.where(rows > 0, rows, 1) ** (p - 1), 0)
        np.testing.assert_allclose(grad[1:], expected[1:], rtol=1e-5)
    np.testing.assert_array_equal(Tensor(x).norm(0, 1).numpy(), [0, 3, 1])
