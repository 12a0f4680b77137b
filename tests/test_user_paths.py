"""PyTorch users' habits that must give PyTorch's answers: gradients of detached leaves, `requires_grad` of results,
torch-style shape calls, and the torch names added for them. Values against numpy (always) and PyTorch (when
installed); gradients against PyTorch or central finite differences."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from test_ops import LAYOUTS, check
from torch_optional import torch

from glassgrad import Tensor, dtypes, no_grad
from glassgrad.nn import Linear


# ---------------------------------------------------------------------- detach() and .grad
def test_leaf_reached_only_through_detach_keeps_grad_none() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = Tensor([4.0, 5.0, 6.0], requires_grad=True)
    ((x.detach() * 2).sum() + (w * 3).sum()).backward()
    assert x.grad is None
    assert w.grad is not None and w.grad.tolist() == [3.0, 3.0, 3.0]


def test_leaf_behind_a_comparison_keeps_grad_none() -> None:
    x = Tensor([1.0, -2.0, 3.0], requires_grad=True)
    w = Tensor([4.0, 5.0, 6.0], requires_grad=True)
    ((x > 0).float().sum() + (w * x.detach()).sum()).backward()
    assert x.grad is None
    assert w.grad is not None and w.grad.tolist() == [1.0, -2.0, 3.0]


def test_leaf_used_with_a_zero_gradient_gets_zeros() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * 0).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [0.0, 0.0, 0.0]


def test_leaf_used_both_ways_gets_the_attached_gradient() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x.detach()).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 2.0, 3.0]  # d/dx of x*c is c, not 2x


def test_backward_with_only_detached_leaves_raises_as_torch() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="detach"):
        (x.detach() * 2).sum().backward()
    assert x.grad is None
    if torch is not None:
        tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with pytest.raises(RuntimeError):
            (tx.detach() * 2).sum().backward()


def test_tinygrad_style_backward_still_fills_every_tensor() -> None:
    t = Tensor([1.0, 2.0])
    (t.detach() * t).sum().backward()  # no requires_grad anywhere: tinygrad's rule
    assert t.grad is not None and t.grad.tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------- squeeze / unsqueeze, torch-style
@pytest.mark.parametrize("dim", [(0, 2), (0, 1), [-4, -2], (2,), -2, 0, (), (1, 3)])
def test_squeeze_tuple_and_negative_dims(dim: Any) -> None:
    a = np.arange(6, dtype=np.float32).reshape(1, 3, 1, 2)
    axes = tuple(d for d in ((dim,) if isinstance(dim, int) else dim) if a.shape[d] == 1)
    check(lambda t: t.squeeze(dim), lambda x: np.squeeze(x, axes), inputs=[a], grad=True,
          torch_fn=lambda t: t.squeeze(tuple(dim) if isinstance(dim, list) else dim))
    assert Tensor(a).squeeze(dim=dim).shape == np.squeeze(a, axes).shape


def test_squeeze_edge_cases() -> None:
    assert Tensor(3.0).squeeze(0).shape == () and Tensor(3.0).squeeze((-1,)).shape == ()
    assert Tensor.zeros(0, 1).squeeze((0, 1)).shape == (0,)
    with pytest.raises(ValueError, match="more than once"):
        Tensor.zeros(1, 2).squeeze((0, -2))
    with pytest.raises(Exception, match="range|axis|dim"):
        Tensor.zeros(1, 2).squeeze((0, 2))


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_unsqueeze_negative_dims(dim: int) -> None:
    check(lambda t: t.unsqueeze(dim), lambda x: np.expand_dims(x, dim), [(2, 3)], grad=True)
    check(lambda t: t.unsqueeze(dim=dim), lambda x: np.expand_dims(x, dim), [(2, 3)])


# ---------------------------------------------------------------------- torch names
def _np_expm1(x: np.ndarray) -> np.ndarray:
    return np.expm1(x)


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_expm1(layout: Any) -> None:
    check(lambda t: t.expm1(), _np_expm1, [(3, 4)], low=-3, high=3, grad=True, layout=layout)


def test_expm1_small_large_and_edge() -> None:
    x = np.array([1e-7, -1e-7, 1e-4, 0.0, -0.49, 0.5, 20.0, 100.0, -100.0, np.inf, -np.inf], np.float32)
    with np.errstate(over="ignore"):
        np.testing.assert_allclose(Tensor(x).expm1().numpy(), np.expm1(x), rtol=2e-6)
    assert Tensor(0.5).expm1().shape == () and Tensor.zeros(0).expm1().shape == (0,)
    assert Tensor([0, 1]).expm1().dtype == Tensor([0.0]).dtype  # ints become floats, as in torch
    h = Tensor(np.array([1e-3, 0.25, 2.0], np.float16)).expm1()
    assert h.dtype == Tensor([0.0]).half().dtype
    np.testing.assert_allclose(h.numpy(), np.expm1(np.array([1e-3, 0.25, 2.0], np.float16)), rtol=2e-3)
    t = Tensor(np.array([1e-6, 60.0, -60.0], np.float32), requires_grad=True)
    t.expm1().sum().backward()
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), np.exp(np.array([1e-6, 60.0, -60.0], np.float32)), rtol=1e-5)


@pytest.mark.parametrize("shapes", [[(3, 4), (3, 4)], [(3, 1), (1, 4)], [(), (5,)]], ids=str)
@pytest.mark.parametrize("name, np_fn", [("atan2", np.arctan2), ("hypot", np.hypot)])
def test_binary_math(name: str, np_fn: Any, shapes: list[tuple[int, ...]]) -> None:
    check(lambda a, b: getattr(a, name)(b), np_fn, shapes, grad=True, low=-3, high=3)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
def test_atan2_noncontiguous(layout: Any) -> None:
    check(lambda a, b: a.atan2(b), np.arctan2, [(3, 4), (3, 4)], grad=True, layout=layout)


def test_atan2_quadrants_and_signed_zeros() -> None:
    v = np.array([-2.0, -0.0, 0.0, 1.5, 3.0, np.inf, -np.inf], np.float32)
    y, x = np.meshgrid(v, v[:5])
    np.testing.assert_allclose(Tensor(y).atan2(Tensor(x)).numpy(), np.arctan2(y, x), rtol=1e-6, atol=1e-7)
    assert np.array_equal(np.signbit(Tensor(y).atan2(Tensor(x)).numpy()), np.signbit(np.arctan2(y, x)))
    np.testing.assert_allclose(Tensor([1.0, -1.0]).atan2(0.0).numpy(), [math.pi / 2, -math.pi / 2])
    np.testing.assert_allclose(Tensor([1, -1]).arctan2(Tensor([-1, -1])).numpy(), np.arctan2([1, -1], [-1, -1]),
                               rtol=1e-6)


def test_hypot_no_overflow_and_inf() -> None:
    h = Tensor(np.array([300.0, 3e4], np.float16)).hypot(Tensor(np.array([400.0, 4e4], np.float16)))
    np.testing.assert_allclose(h.numpy().astype(np.float32), [500.0, np.float16(5e4)], rtol=1e-3)
    assert Tensor([np.inf, 0.0]).hypot(Tensor([np.nan, 0.0])).tolist() == [math.inf, 0.0]


def test_new_constructors() -> None:
    base = Tensor(np.ones((2, 2), np.float16))
    z = base.new_zeros(3, 4)
    assert z.shape == (3, 4) and z.dtype == base.dtype and z.device == base.device and not z.numpy().any()
    assert base.new_zeros((3,)).shape == (3,) and base.new_zeros([]).shape == ()
    o = base.new_ones(2, dtype=dtypes.int32)
    assert o.dtype == dtypes.int32 and o.tolist() == [1, 1]
    f = base.new_full((2, 3), 7)
    assert f.dtype == base.dtype and f.numpy().tolist() == [[7.0] * 3] * 2
    assert base.new_full(2, 1.5).tolist() == [1.5, 1.5]
    e = base.new_empty(0, 5)
    assert e.shape == (0, 5) and e.dtype == base.dtype
    nt = base.new_tensor([[1, 2], [3, 4]])
    assert nt.dtype == base.dtype and nt.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    copied = base.new_tensor(Tensor([5.0, 6.0], requires_grad=True))
    assert copied.tolist() == [5.0, 6.0] and not copied.requires_grad
    assert base.new_ones(2, requires_grad=True).requires_grad is True
    if torch is not None:
        tb = torch.ones(2, 2, dtype=torch.float16)
        for fn in (lambda b: b.new_zeros(3, 4), lambda b: b.new_full((2, 3), 7), lambda b: b.new_tensor([[1, 2]])):
            np.testing.assert_array_equal(fn(base).numpy(), fn(tb).numpy())


def _np_det(a: np.ndarray) -> np.ndarray:
    return np.linalg.det(a).astype(a.dtype)  # (float64 for the finite differences)


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (5, 5), (2, 3, 4, 4), (0, 3, 3)], ids=str)
def test_det(shape: tuple[int, ...]) -> None:
    check(lambda t: t.det(), _np_det, [shape], grad=True, atol=1e-4, rtol=1e-4, grad_atol=2e-3,
          torch_fn=lambda t: torch.linalg.det(t))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
def test_det_noncontiguous(layout: Any) -> None:
    check(lambda t: t.det(), _np_det, [(4, 4)], grad=True, atol=1e-4, layout=layout,
          torch_fn=lambda t: torch.linalg.det(t))


def test_det_pivots_singular_and_slogdet() -> None:
    needs_pivot = np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 3.0], [4.0, -3.0, 8.0]], np.float32)
    np.testing.assert_allclose(Tensor(needs_pivot).det().numpy(), np.linalg.det(needs_pivot), rtol=1e-5)
    singular = np.array([[1.0, 2.0], [2.0, 4.0]], np.float32)
    assert Tensor(singular).det().item() == 0.0 and Tensor(np.zeros((3, 3), np.float32)).det().item() == 0.0
    assert Tensor(np.eye(0, dtype=np.float32)).det().item() == 1.0
    batch = np.random.default_rng(3).standard_normal((4, 3, 3)).astype(np.float32)
    sign, logabs = Tensor(batch).slogdet()
    want_sign, want_log = np.linalg.slogdet(batch)
    np.testing.assert_array_equal(sign.numpy(), want_sign)
    np.testing.assert_allclose(logabs.numpy(), want_log, rtol=1e-5, atol=1e-5)
    logdet = Tensor(batch).logdet().numpy()
    np.testing.assert_allclose(logdet[want_sign > 0], want_log[want_sign > 0], rtol=1e-5, atol=1e-5)
    assert np.isnan(logdet[want_sign < 0]).all()
    assert Tensor([[1, 2], [3, 4]]).det().item() == pytest.approx(-2.0)  # ints: a float det
    with pytest.raises(Exception, match="square"):
        Tensor.zeros(2, 3).det()


@pytest.mark.parametrize("name, np_fn, domain", [
    ("frac", lambda x: x - np.trunc(x), (-3, 3)),
    ("deg2rad", np.deg2rad, (-360, 360)),
    ("rad2deg", np.rad2deg, (-3, 3)),
    ("sinc", np.sinc, (-3, 3)),
    ("logit", lambda x: np.log(x / (1 - x)), (0.05, 0.95)),
    ("erfc", None, (-2, 2)),
    ("absolute", np.abs, (-2, 2)),
    ("negative", np.negative, (-2, 2)),
    ("arctan", np.arctan, (-2, 2)),
    ("ravel", np.ravel, (-2, 2)),
    ("fliplr", np.fliplr, (-2, 2)),
    ("flipud", np.flipud, (-2, 2)),
])
def test_unary_torch_names(name: str, np_fn: Any, domain: tuple[float, float]) -> None:
    if np_fn is None:
        np_fn = lambda x: np.vectorize(math.erfc)(x).astype(x.dtype)  # noqa: E731
    check(lambda t: getattr(t, name)(), np_fn, [(3, 4)], low=domain[0], high=domain[1], grad=name != "frac",
          layout=LAYOUTS[1])


@pytest.mark.parametrize("name, np_fn", [
    ("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
    ("greater", np.greater), ("less_equal", np.less_equal), ("fmax", np.fmax), ("fmin", np.fmin),
    ("remainder", np.mod), ("floor_divide", np.floor_divide), ("true_divide", np.true_divide),
    ("xlogy", lambda a, b: a * np.log(b)),
])
def test_binary_torch_names(name: str, np_fn: Any) -> None:
    check(lambda a, b: getattr(a, name)(b), np_fn, [(3, 4), (4,)], low=0.5, high=3.0)


def test_torch_name_specials() -> None:
    nan = math.nan
    a, b = np.array([1.0, nan, nan, -2.0], np.float32), np.array([nan, 2.0, nan, 3.0], np.float32)
    np.testing.assert_array_equal(Tensor(a).fmax(Tensor(b)).numpy(), np.fmax(a, b))
    np.testing.assert_array_equal(Tensor(a).fmin(Tensor(b)).numpy(), np.fmin(a, b))
    x = np.array([0.0, 0.0, 1.0, nan], np.float32)
    y = np.array([0.0, 2.0, 0.0, 1.0], np.float32)
    np.testing.assert_array_equal(Tensor(x).xlogy(Tensor(y)).numpy(), [0.0, 0.0, -math.inf, nan])
    assert Tensor([-0.0, 0.0, -1.0, 2.0]).signbit().tolist() == [True, False, True, False]
    assert Tensor([-3, 4]).signbit().tolist() == [True, False]
    m = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(Tensor(m).mT.numpy(), np.swapaxes(m, -1, -2))
    np.testing.assert_array_equal(Tensor(m).tile(2).numpy(), np.tile(m, 2))
    np.testing.assert_array_equal(Tensor(m).tile((2, 1, 1, 1)).numpy(), np.tile(m, (2, 1, 1, 1)))
    np.testing.assert_array_equal(Tensor(m[0]).trace().numpy(), np.trace(m[0]))
    np.testing.assert_array_equal(Tensor(m).diff().numpy(), np.diff(m))
    np.testing.assert_array_equal(Tensor(m).diff(2, dim=1).numpy(), np.diff(m, 2, axis=1))
    np.testing.assert_array_equal(Tensor(m).inner(Tensor(m[0])).numpy(), np.inner(m, m[0]))
    np.testing.assert_array_equal(Tensor(m).clamp_min(5).numpy(), np.maximum(m, 5))
    np.testing.assert_array_equal(Tensor(m).clamp_max(5).numpy(), np.minimum(m, 5))
    np.testing.assert_array_equal(Tensor(m).broadcast_to(2, 2, 3, 4).numpy(), np.broadcast_to(m, (2, 2, 3, 4)))
    assert Tensor(m).nelement() == 24 and Tensor(m).ndimension() == 3
    assert Tensor([True, False]).logical_xor(Tensor([True, True])).tolist() == [False, True]
    c, t1, t2 = (np.random.default_rng(i).standard_normal((3, 3)).astype(np.float32) for i in range(3))
    np.testing.assert_allclose(Tensor(c).addcmul(Tensor(t1), Tensor(t2), value=0.5).numpy(), c + 0.5 * t1 * t2,
                               rtol=1e-6)
    np.testing.assert_allclose(Tensor(c).addmm(Tensor(t1), Tensor(t2), beta=2, alpha=3).numpy(), 2 * c + 3 * t1 @ t2,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_more_torch_linear_algebra_names(layout: Any) -> None:
    """mv, kron, cross, baddbmm, dist, scatter_add: PyTorch methods a ported program calls (they were missing),
    against numpy and (with grad) PyTorch, on contiguous and strided inputs."""
    check(lambda m, v: m.mv(v), lambda m, v: m @ v, [(3, 4), (4,)], grad=True, layout=layout,
          torch_fn=lambda m, v: m.mv(v))
    kron = torch and (lambda a, b: torch.kron(a.contiguous(), b.contiguous()))  # (torch's kron refuses views)
    check(lambda a, b: a.kron(b), np.kron, [(3, 4), (2, 5)], grad=True, layout=layout, torch_fn=kron)
    check(lambda a, b: a.kron(b), np.kron, [(4,), (2, 3)], grad=True, layout=layout, torch_fn=kron)
    check(lambda a, b: a.cross(b, dim=1), lambda a, b: np.cross(a, b, axis=1), [(4, 3, 5), (1, 3, 5)], grad=True,
          layout=layout, torch_fn=torch and (lambda a, b: torch.cross(a, b.expand(4, 3, 5), dim=1)))
    check(lambda a, b: a.cross(b), lambda a, b: np.cross(a, b, axis=0), [(3, 2), (3, 2)], grad=True, layout=layout,
          torch_fn=torch and (lambda a, b: torch.linalg.cross(a, b, dim=0)))
    check(lambda m, b1, b2: m.baddbmm(b1, b2, beta=0.5, alpha=2.0), lambda m, b1, b2: 0.5 * m + 2 * (b1 @ b2),
          [(2, 3, 5), (2, 3, 4), (2, 4, 5)], grad=True, layout=layout,
          torch_fn=torch and (lambda m, b1, b2: torch.baddbmm(m, b1, b2, beta=0.5, alpha=2.0)))
    check(lambda a, b: a.dist(b), lambda a, b: np.linalg.norm((a - b).ravel()), [(3, 4), (4,)], grad=True,
          layout=layout, torch_fn=torch and torch.dist)
    check(lambda a, b: a.dist(b, 1), lambda a, b: np.abs(a - b).sum(), [(3, 4), (3, 4)], grad=True, layout=layout,
          torch_fn=torch and (lambda a, b: torch.dist(a, b, 1)))


def test_scatter_add_type_and_cuda_names() -> None:
    index = np.array([[0, 1, 2, 0], [1, 1, 0, 2]])
    src = np.arange(8, dtype=np.float32).reshape(2, 4) + 1
    expected = np.zeros((3, 4), np.float32)
    np.add.at(expected, (index, np.arange(4)[None, :].repeat(2, 0)), src)  # repeated positions add up
    np.testing.assert_array_equal(Tensor.zeros(3, 4).scatter_add(0, Tensor(index), Tensor(src)).numpy(), expected)
    m = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(Tensor(m).baddbmm(Tensor(src.reshape(1, 2, 4)), Tensor(src.reshape(1, 4, 2)),
                                                    beta=0).numpy()[0][:2, :2], src @ src.reshape(4, 2))
    assert Tensor([1.5, 2.5]).type(dtypes.int32).tolist() == [1, 2] and Tensor([1]).type() == "dtypes.int32"
    with pytest.raises(ValueError, match="cuda"):
        Tensor([1.0]).cuda("cpu")
    with pytest.raises(Exception, match="cross: dim 0"):
        Tensor.ones(2, 4).cross(Tensor.ones(2, 4), dim=0)
    with pytest.raises(Exception, match="mv: needs a matrix and a vector"):
        Tensor.ones(2, 4).mv(Tensor.ones(2, 4))


# ---------------------------------------------------------------------- requires_grad of results
def test_results_of_requires_grad_inputs_require_grad() -> None:
    x = Tensor([1.0, 2.0], requires_grad=True)
    c = Tensor([3.0, 4.0])
    assert (x * 2).requires_grad is True and (c + x).sum().requires_grad is True
    assert (x * 2).realize().requires_grad is True  # (a realized result keeps its lineage)
    assert not (c * 2).requires_grad and not x.detach().requires_grad and not (x.detach() * c).requires_grad
    assert (c * 2).requires_grad is None  # tinygrad's "undecided", as before: a tinygrad program sees no change
    with no_grad():
        y = x * 2
        assert not y.requires_grad
    assert not y.requires_grad
    layer = Linear(2, 3)
    assert layer(c.reshape(1, 2)).requires_grad is True  # as a torch layer's output
    if torch is not None:
        tx = torch.tensor([1.0, 2.0], requires_grad=True)
        assert (tx * 2).requires_grad and not (tx.detach() * 2).requires_grad


def test_setting_requires_grad_on_a_result_still_works() -> None:
    x = Tensor([1.0, 2.0], requires_grad=True)
    y = x * 3
    y.requires_grad = False  # (only the stored flag: y is still a result of x)
    assert y.requires_grad is False


# ---------------------------------------------------------------------- torch-style keywords
def test_to_dtype_and_unbiased_keyword() -> None:
    a = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    t = Tensor(a)
    assert t.to(dtypes.float16).dtype == dtypes.float16 and t.to(t.device, dtypes.int32).dtype == dtypes.int32
    assert t.to("cpu").device == "CPU" and t.to(t.device).device == t.device
    for unbiased, ddof in ((False, 0), (True, 1)):
        np.testing.assert_allclose(t.var(1, unbiased=unbiased).numpy(), a.var(1, ddof=ddof), rtol=1e-5)
        np.testing.assert_allclose(t.std(dim=0, unbiased=unbiased).numpy(), a.std(0, ddof=ddof), rtol=1e-5)


def test_boolean_mask_indexing_as_numpy() -> None:
    """x[mask] (PyTorch's and numpy's): the elements where a bool mask covering the leading, middle or trailing dims is
    True, from a Tensor, numpy array or list mask; an empty selection; its gradient; x[mask] = v; a mask whose shape
    is not the covered dims' raises instead of selecting a part."""
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 10
    t = Tensor(x)
    rows = np.array([[True, False, True], [False, False, True]])
    last = np.array([True, False, True, True])
    cases = [(t > 0, x > 0), (rows, rows), (Tensor(rows), rows), ([True, False], np.array([True, False]))]
    for index, np_index in cases:
        np.testing.assert_array_equal(t[index].numpy(), x[np_index])
    np.testing.assert_array_equal(t[:, :, last].numpy(), x[:, :, last])
    np.testing.assert_array_equal(t[..., last].numpy(), x[..., last])
    np.testing.assert_array_equal(t[1, [True, False, True]].numpy(), x[1, [True, False, True]])
    assert t[np.zeros((2, 3), bool)].shape == (0, 4)
    w = Tensor(x, requires_grad=True)
    w[w > 0].sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), (x > 0).astype(np.float32))
    y, z = Tensor(x.copy()), x.copy()
    y[Tensor(x[:, 0, 0] > -5)] = 7.0
    z[x[:, 0, 0] > -5] = 7.0
    np.testing.assert_array_equal(y.numpy(), z)
    with pytest.raises(IndexError, match="does not match"):
        t[np.ones((3, 2), bool)]
    if torch is not None:
        tt = torch.tensor(x)
        np.testing.assert_array_equal(t[t > 0].numpy(), tt[tt > 0].numpy())
