"""The op test suite: every Tensor op, forward and backward, against numpy (always) and PyTorch (when importable).

Written once, run per device: every tensor is made on `DEVICE` (glassgrad's `Device.DEFAULT`, which `DEV=...`
selects), so `DEV=CUDA pytest tests/test_ops.py` proves a backend on everything at once.

`check(fn, np_fn, shapes, ...)` is the workhorse: it builds random inputs, runs `fn` on glassgrad tensors and on
torch tensors (the same lambda serves both where the APIs agree; `torch_fn=` where they do not), runs `np_fn` on
numpy arrays, and compares values, shapes and dtypes. With `grad=True` it also compares the gradients of
`sum(fn(inputs) * w)` (w random) with PyTorch's, when PyTorch is importable, and always with central finite
differences of `np_fn` in float64, so the backward pass is checked with or without PyTorch.
`layout=` feeds the op non-contiguous views (transposed, strided, flipped) instead of fresh tensors.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from torch_optional import F, torch

from glassgrad import Device, Tensor, dtypes
from glassgrad.dtype import DType

DEVICE = Device.DEFAULT
SAME = object()  # torch_fn default: run the glassgrad lambda on torch tensors too
Shape = tuple[int, ...]


# ---------------------------------------------------------------------- helpers
def T(data: Any, **kwargs: Any) -> Tensor:
    """A glassgrad tensor on the device under test."""
    return Tensor(data, device=DEVICE, **kwargs)


def rand(shape: Shape, low: float = -2.0, high: float = 2.0, dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(low), int(high), shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(low, high, shape).astype(dtype)


class Layout:
    """How an input is presented to the op: as a fresh tensor or as a non-contiguous view of a bigger/other base.

    base(a) is the numpy array the leaf tensor is made from, view(t) turns that leaf (glassgrad or torch) into a
    tensor equal to `a`, and base_grad(g) maps a gradient w.r.t. the view back onto the base."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def base(self, a: np.ndarray) -> np.ndarray:
        if a.ndim == 0 or self.name == "contiguous":
            return a
        if self.name == "transposed":
            return np.ascontiguousarray(np.transpose(a))
        if self.name == "flipped":
            return np.ascontiguousarray(np.flip(a))
        big = rand(tuple(2 * s + 1 for s in a.shape), dtype=a.dtype, seed=99)  # junk between the picked elements
        big[(slice(1, None, 2),) * a.ndim] = a
        return big

    def view(self, t: Any, ndim: int) -> Any:
        if ndim == 0 or self.name == "contiguous":
            return t
        if self.name == "transposed":
            return t.permute(tuple(range(ndim))[::-1])
        if self.name == "flipped":
            return t.flip(tuple(range(ndim)))
        return t[(slice(1, None, 2),) * ndim]

    def base_grad(self, g: np.ndarray, base_shape: Shape) -> np.ndarray:
        if g.ndim == 0 or self.name == "contiguous":
            return g
        if self.name == "transposed":
            return np.transpose(g)
        if self.name == "flipped":
            return np.flip(g)
        out = np.zeros(base_shape, dtype=g.dtype)
        out[(slice(1, None, 2),) * g.ndim] = g
        return out


CONTIGUOUS = Layout("contiguous")
LAYOUTS = [Layout("contiguous"), Layout("transposed"), Layout("strided"), Layout("flipped")]


def _as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _to_torch(a: np.ndarray, requires_grad: bool = False) -> Any:
    t = torch.from_numpy(np.array(a))
    return t.requires_grad_(True) if requires_grad else t


def _torch_numpy(t: Any) -> np.ndarray:
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()


def _assert_close(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float, what: str) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != expected {expected.shape}"
    if expected.dtype == np.bool_ or actual.dtype == np.bool_:
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    elif np.issubdtype(expected.dtype, np.integer) and np.issubdtype(actual.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), atol=atol, rtol=rtol,
                                   err_msg=what, equal_nan=True)


def numerical_grads(np_fn: Callable[..., Any], arrays: list[np.ndarray], wrt: list[int], weights: list[np.ndarray],
                    eps: float = 1e-6) -> list[np.ndarray]:
    """Central finite differences of sum(np_fn(arrays) * weights) in float64, for the inputs listed in `wrt`."""
    xs = [a.astype(np.float64) if i in wrt else a for i, a in enumerate(arrays)]

    def loss() -> float:
        outs = _as_tuple(np_fn(*xs))
        return float(sum(np.sum(np.asarray(o, dtype=np.float64) * w) for o, w in zip(outs, weights, strict=True)))

    grads = []
    for i in wrt:
        g = np.zeros_like(xs[i])
        flat, gflat = xs[i].reshape(-1), g.reshape(-1)
        for j in range(flat.size):
            keep = flat[j]
            flat[j] = keep + eps
            up = loss()
            flat[j] = keep - eps
            down = loss()
            flat[j] = keep
            gflat[j] = (up - down) / (2 * eps)
        grads.append(g)
    return grads


def check(fn: Callable[..., Any], np_fn: Callable[..., Any], shapes: Sequence[Shape] = (), *,
          inputs: Sequence[np.ndarray] | None = None, torch_fn: Any = SAME, low: float = -2.0, high: float = 2.0,
          dtype: Any = np.float32, grad: bool = False, atol: float = 1e-5, rtol: float = 1e-4,
          grad_atol: float = 1e-3, grad_rtol: float = 1e-3, out_dtype: DType | None = None,
          layout: Layout = CONTIGUOUS) -> None:
    """Compare fn on glassgrad tensors with np_fn on numpy arrays (and fn or torch_fn on torch tensors).

    Inputs are `inputs` if given, else random arrays of `shapes` in [low, high). With grad=True the float inputs
    are differentiated (see the module docstring). out_dtype, when given, is the dtype glassgrad must return;
    by default float32 inputs must give float32 (or bool) results whenever numpy's result is float32 (or bool)."""
    arrays = [np.asarray(a) for a in inputs] if inputs is not None else \
        [rand(s, low, high, dtype, seed=i) for i, s in enumerate(shapes)]
    bases = [layout.base(a) for a in arrays]
    wrt = [i for i, a in enumerate(arrays) if grad and a.dtype.kind == "f"]
    leaves = [T(b, requires_grad=i in wrt or None) for i, b in enumerate(bases)]
    outs = _as_tuple(fn(*[layout.view(t, a.ndim) for t, a in zip(leaves, arrays, strict=True)]))
    expected = _as_tuple(np_fn(*arrays))
    assert len(outs) == len(expected), f"{len(outs)} outputs, numpy gave {len(expected)}"
    for k, (o, e) in enumerate(zip(outs, expected, strict=True)):
        e = np.asarray(e)
        _assert_close(o.numpy(), e, atol, rtol, f"output {k} vs numpy")
        want = out_dtype
        if want is None and all(a.dtype == np.float32 for a in arrays) and e.dtype in (np.float32, np.bool_):
            want = dtypes.from_np(e.dtype)
        if want is not None:
            assert o.dtype == want, f"output {k}: dtype {o.dtype}, expected {want}"
    if torch is not None and torch_fn is not None:
        t_leaves = [_to_torch(b, i in wrt) for i, b in enumerate(bases)]
        t_fn = fn if torch_fn is SAME else torch_fn
        t_outs = _as_tuple(t_fn(*[layout.view(t, a.ndim) for t, a in zip(t_leaves, arrays, strict=True)]))
        for k, (o, t) in enumerate(zip(outs, t_outs, strict=True)):
            _assert_close(o.numpy(), _torch_numpy(t), atol, rtol, f"output {k} vs torch")
    if not wrt:
        return
    weights = [rand(np.asarray(e).shape, seed=50 + k).astype(np.float64) for k, e in enumerate(expected)]
    loss = sum((o.float() * T(w.astype(np.float32))).sum() for o, w in zip(outs, weights, strict=True))
    loss.backward()
    got = [leaves[i].grad.numpy() if leaves[i].grad is not None else np.zeros(bases[i].shape) for i in wrt]
    for i, g in zip(wrt, got, strict=True):
        assert g.shape == bases[i].shape, f"grad of input {i}: shape {g.shape} != {bases[i].shape}"
    numeric = numerical_grads(np_fn, arrays, wrt, weights)
    for i, g, n in zip(wrt, got, numeric, strict=True):
        _assert_close(g, layout.base_grad(n, bases[i].shape), grad_atol, grad_rtol, f"grad of input {i} vs finite "
                      "differences")
    if torch is not None and torch_fn is not None:
        t_loss = sum((o.float() * _to_torch(w.astype(np.float32))).sum()
                     for o, w in zip(t_outs, weights, strict=True))
        t_loss.backward()
        for i, g in zip(wrt, got, strict=True):
            tg = t_leaves[i].grad
            expect = np.zeros(bases[i].shape) if tg is None else _torch_numpy(tg)
            _assert_close(g, expect, grad_atol, grad_rtol, f"grad of input {i} vs torch")


# ---------------------------------------------------------------------- creation
NP_DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16,
             np.float32, np.float64]


@pytest.mark.parametrize("np_dtype", NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_from_numpy_keeps_dtype(np_dtype: Any) -> None:
    a = rand((2, 3), 0, 100, np_dtype, seed=3)
    t = T(a)
    assert t.dtype == dtypes.from_np(np.dtype(np_dtype)) and t.shape == (2, 3)
    out = t.numpy()
    assert out.dtype == np.dtype(np_dtype)
    np.testing.assert_array_equal(out, a)


@pytest.mark.parametrize("data, dtype", [
    ([1.0, 2.5], dtypes.float32), ([1, 2, 3], dtypes.int32), ([True, False], dtypes.bool), ((1, 2.0), dtypes.float32),
    ([[1, 2], [3, 4]], dtypes.int32), ([[True], [False]], dtypes.bool), (((1.5,), (2.5,)), dtypes.float32),
    (3, dtypes.int32), (2.5, dtypes.float32), (True, dtypes.bool), ([], dtypes.float32), ([[]], dtypes.float32),
])
def test_from_python(data: Any, dtype: DType) -> None:
    t = T(data)
    expected = np.array(data, dtype=dtype.np)
    assert t.dtype == dtype and t.shape == expected.shape
    np.testing.assert_array_equal(t.numpy(), expected)
    if torch is not None and data != [[]]:
        assert t.shape == tuple(torch.tensor(data).shape)


def test_from_python_with_dtype() -> None:
    t = T([1, 2, 3], dtype=dtypes.float16)
    assert t.dtype == dtypes.float16
    np.testing.assert_array_equal(t.numpy(), np.array([1, 2, 3], np.float16))
    b = T([1.0, 2.5, -3.25], dtype="bfloat16")
    assert b.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(b.numpy(), np.array([1.0, 2.5, -3.25], np.float32))
    assert T(np.array([1.5, 2.0], np.float32), dtype=dtypes.int32).tolist() == [1, 2]


def test_big_python_ints_get_int64() -> None:
    """Python ints that do not fit int32 make int64 tensors (never silently wrapped values); torch uses int64 always."""
    big = 2**40
    for t in (T(big), T([big, 1]), Tensor.full((2,), big, device=DEVICE), Tensor.arange(big, big + 3, device=DEVICE)):
        assert t.dtype == dtypes.int64
    assert T(big).item() == big and T([[big], [-big]]).tolist() == [[big], [-big]]
    np.testing.assert_array_equal(Tensor.arange(big, big + 3, device=DEVICE).numpy(), np.arange(big, big + 3))
    assert T(5).dtype == dtypes.int32 and T([1, -2]).dtype == dtypes.int32
    assert (T([1], dtype=dtypes.int8) + 300).tolist() == [45]  # a scalar takes the tensor's dtype and wraps (torch too)


def test_from_list_of_numpy_values() -> None:
    """Lists of numpy scalars or arrays keep numpy's dtype for them (a list of Python floats is float32)."""
    for data, dtype in [([np.float32(1.0), np.float32(2.5)], dtypes.float32), ([np.int64(3), 4], dtypes.int64),
                        ([np.array([1, 2], np.int16), np.array([3, 4], np.int16)], dtypes.int16),
                        ([np.bool_(True), np.bool_(False)], dtypes.bool), ([np.float64(1.5)], dtypes.float32)]:
        t = T(data)
        assert t.dtype == dtype, (data, t.dtype)
        np.testing.assert_array_equal(t.numpy(), np.array(data).astype(dtype.np))


def test_from_numpy_views_and_byte_order() -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(T(a[:, ::-2].T).numpy(), a[:, ::-2].T)  # a non-contiguous numpy view
    big_endian = np.array([[1, -2], [300, 4]], dtype=">i4")
    t = T(big_endian)
    assert t.dtype == dtypes.int32 and t.tolist() == [[1, -2], [300, 4]]
    assert T(np.array([1.5], dtype=">f8")).item() == 1.5


def test_numpy_scalar_input() -> None:
    t = T(np.float64(2.5))
    assert t.shape == () and t.dtype == dtypes.float64 and t.item() == 2.5


@pytest.mark.parametrize("scalar", [np.float64(8.0), np.float32(8.0), np.float16(8.0), np.int64(8)],
                         ids=lambda v: type(v).__name__)
def test_numpy_scalars_combine_as_python_scalars(scalar: Any) -> None:
    """`x / np.sqrt(d)` keeps x's dtype, as a Python scalar does (PyTorch; tinygrad for np.float64): a numpy scalar
    became a tensor of its own dtype, so attention scores divided by np.sqrt(64) made the whole graph float64."""
    a = rand((2, 3))
    for dt in (dtypes.float32, dtypes.float16):
        x = T(a, dtype=dt)
        for out in (x / scalar, scalar * x, x - scalar, x.maximum(scalar), (x > 0).where(scalar, x), x < scalar):
            assert out.dtype is (dtypes.bool if out.dtype is dtypes.bool else dt)
    np.testing.assert_allclose((T(a) / scalar).numpy(), a / np.float32(scalar), rtol=1e-6)
    ints = T(np.array([1, 2, 3], np.int32))
    assert (ints * np.int64(2)).dtype is dtypes.int32 and (ints * np.float64(0.5)).dtype is dtypes.float32
    assert (T([True]).where(np.float64(1.0), 0.0)).dtype is dtypes.float32
    assert (T(a) * np.array(8.0)).dtype is dtypes.float64  # an array, 0-d too, is a tensor of its dtype (PyTorch too)
    if torch is not None:
        assert (torch.tensor(a) / scalar).dtype is torch.float32
        assert (torch.tensor([1, 2, 3], dtype=torch.int32) * np.int64(2)).dtype is torch.int32


def test_numpy_on_the_left_gives_a_tensor() -> None:
    """`np_array * t` and `np.float32(2) * t` are Tensors in the graph (numpy defers to Tensor's reflected
    operators, as with PyTorch's tensors); numpy made an object array of 0-d Tensors."""
    a, b = rand((2, 3)), rand((3, 2), seed=1)
    w = T(a, requires_grad=True)
    for out, expected in [(b.T * w, b.T * a), (np.float32(2.0) * w, 2 * a), (np.float64(1.0) - w, 1 - a),
                          (b @ w, b @ a), (b.T < w, b.T < a)]:
        assert isinstance(out, Tensor), type(out)
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    (np.float32(3.0) * w).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 3), 3.0, np.float32))


def test_numpy_reads_a_tensor_as_its_values() -> None:
    """np.asarray(t) (and everything built on it: np.median, plt.plot) is the tensor's values, as with PyTorch's
    tensors; it was an object array of 0-d Tensors."""
    a = rand((3, 4))
    t = T(a)[:, ::2]
    out = np.asarray(t)
    assert out.dtype == np.float32 and out.shape == (3, 2)
    np.testing.assert_array_equal(out, a[:, ::2])
    assert np.asarray(T([1, 2]), dtype=np.float64).dtype == np.float64
    np.testing.assert_array_equal(np.array(T([1.5, 2.5], dtype=dtypes.bfloat16)), [1.5, 2.5])
    assert np.median(T(a)) == np.median(a)


def test_one_element_tensor_conversions() -> None:
    """PyTorch's float(loss), int(n), lst[t.argmax()] and f"{loss:.3f}"; a tensor of several elements (or a float
    index) raises TypeError naming the problem."""
    assert float(T([2.5])) == 2.5 and int(T([[3.7]])) == 3 and int(T(-3.7)) == -3
    assert ["a", "b", "c"][T([0.1, 0.9, 0.5]).argmax()] == "b" and ["a", "b"][T(True)] == "b"
    assert f"{T(2.5):.2f}" == "2.50" and f"{T([3]):d}" == "3" and f"{T([1, 2])}" == repr(T([1, 2]))
    with pytest.raises(TypeError, match="one element"):
        float(T([1.0, 2.0]))
    with pytest.raises(TypeError, match="one element"):
        f"{T([1.0, 2.0]):.2f}"
    with pytest.raises(TypeError, match="integer"):
        [1, 2][T(0.0)]
    if torch is not None:
        assert float(torch.tensor([2.5])) == 2.5 and ["a", "b", "c"][torch.tensor([0.1, 0.9, 0.5]).argmax()] == "b"


def test_reflected_shifts_and_tensor_from_range() -> None:
    """`1 << t` and `64 >> t` (tinygrad's __rlshift__/__rrshift__, PyTorch too) and Tensor(range(n)) (torch.tensor)."""
    s = np.array([1, 2, 3], np.int32)
    np.testing.assert_array_equal((1 << T(s)).numpy(), 1 << s)
    np.testing.assert_array_equal((64 >> T(s)).numpy(), 64 >> s)
    assert (1 << T(s)).dtype is dtypes.int32
    np.testing.assert_array_equal(T(range(5)).numpy(), np.arange(5, dtype=np.int32))
    assert T(range(5)).dtype is dtypes.int32 and T(range(0)).shape == (0,)
    assert T(range(1, 7, 2), dtype=dtypes.float32).tolist() == [1.0, 3.0, 5.0]
    if torch is not None:
        assert (1 << torch.tensor(s)).tolist() == [2, 4, 8] and torch.tensor(range(3)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("maker, np_value", [
    (lambda: Tensor.zeros(2, 3, device=DEVICE), np.zeros((2, 3), np.float32)),
    (lambda: Tensor.zeros((2, 3), device=DEVICE), np.zeros((2, 3), np.float32)),
    (lambda: Tensor.ones(4, device=DEVICE), np.ones(4, np.float32)),
    (lambda: Tensor.ones(2, 0, device=DEVICE), np.ones((2, 0), np.float32)),
    (lambda: Tensor.zeros(3, dtype=dtypes.int32, device=DEVICE), np.zeros(3, np.int32)),
    (lambda: Tensor.full((2, 2), 7, device=DEVICE), np.full((2, 2), 7, np.int32)),
    (lambda: Tensor.full((2,), 1.5, device=DEVICE), np.full((2,), 1.5, np.float32)),
    (lambda: Tensor.full((), True, device=DEVICE), np.array(True)),
    (lambda: Tensor.full(3, -2.0, dtype=dtypes.float64, device=DEVICE), np.full(3, -2.0)),
    (lambda: Tensor.arange(5, device=DEVICE), np.arange(5, dtype=np.int32)),
    (lambda: Tensor.arange(2, 11, 3, device=DEVICE), np.arange(2, 11, 3, dtype=np.int32)),
    (lambda: Tensor.arange(10, 2, -2, device=DEVICE), np.arange(10, 2, -2, dtype=np.int32)),
    (lambda: Tensor.arange(0, 1, 0.25, device=DEVICE), np.arange(0, 1, 0.25, dtype=np.float32)),
    (lambda: Tensor.arange(-1.5, 1.0, 0.5, device=DEVICE), np.arange(-1.5, 1.0, 0.5, dtype=np.float32)),
    (lambda: Tensor.arange(3, 3, device=DEVICE), np.arange(3, 3, dtype=np.int32)),
    (lambda: Tensor.arange(5, dtype=dtypes.float32, device=DEVICE), np.arange(5, dtype=np.float32)),
    (lambda: Tensor.linspace(0, 1, 5, device=DEVICE), np.linspace(0, 1, 5, dtype=np.float32)),
    (lambda: Tensor.linspace(-3, 7, 11, device=DEVICE), np.linspace(-3, 7, 11, dtype=np.float32)),
    (lambda: Tensor.linspace(2, 4, 1, device=DEVICE), np.linspace(2, 4, 1, dtype=np.float32)),
    (lambda: Tensor.linspace(2, 4, 0, device=DEVICE), np.linspace(2, 4, 0, dtype=np.float32)),
    (lambda: Tensor.eye(3, device=DEVICE), np.eye(3, dtype=np.float32)),
    (lambda: Tensor.eye(2, 4, device=DEVICE), np.eye(2, 4, dtype=np.float32)),
    (lambda: Tensor.eye(3, dtype=dtypes.int32, device=DEVICE), np.eye(3, dtype=np.int32)),
])
def test_creation(maker: Callable[[], Tensor], np_value: np.ndarray) -> None:
    t = maker()
    assert t.dtype == dtypes.from_np(np_value.dtype), (t.dtype, np_value.dtype)
    _assert_close(t.numpy(), np_value, 1e-6, 1e-6, "creation")


@pytest.mark.parametrize("maker, np_ref, torch_ref", [
    (lambda: Tensor.arange(0, 1, 0.1, device=DEVICE), lambda: np.arange(10, dtype=np.float32) * np.float32(0.1),
     lambda: torch.arange(0, 1, 0.1)),
    (lambda: Tensor.arange(7, 0, -3, device=DEVICE), lambda: np.arange(7, 0, -3, dtype=np.int32),
     lambda: torch.arange(7, 0, -3, dtype=torch.int32)),
    (lambda: Tensor.linspace(-1, 1, 7, device=DEVICE), lambda: np.linspace(-1, 1, 7, dtype=np.float32),
     lambda: torch.linspace(-1, 1, 7)),
    (lambda: Tensor.linspace(0, 10, 5, dtype=dtypes.int32, device=DEVICE), lambda: np.array([0, 2, 5, 7, 10], np.int32),
     lambda: torch.linspace(0, 10, 5, dtype=torch.int32)),
    (lambda: Tensor.eye(3, 2, device=DEVICE), lambda: np.eye(3, 2, dtype=np.float32), lambda: torch.eye(3, 2)),
], ids=["arange_float", "arange_negative_step", "linspace", "linspace_int", "eye_rect"])
def test_creation_vs_torch(maker: Callable[[], Tensor], np_ref: Callable[[], np.ndarray], torch_ref: Any) -> None:
    ours = maker().numpy()
    _assert_close(ours, np_ref(), 1e-6, 1e-6, "vs numpy")
    if torch is not None:
        _assert_close(ours, torch_ref().numpy(), 1e-6, 1e-6, "vs torch")


def test_empty() -> None:
    t = Tensor.empty(2, 3, device=DEVICE)
    assert t.shape == (2, 3) and t.dtype == dtypes.float32 and t.numpy().shape == (2, 3)
    assert Tensor.empty(4, dtype=dtypes.int8, device=DEVICE).dtype == dtypes.int8


@pytest.mark.parametrize("maker, low, high, dtype", [
    (lambda: Tensor.rand(200, 50, device=DEVICE), 0.0, 1.0, dtypes.float32),
    (lambda: Tensor.uniform(200, 50, low=-3.0, high=-1.0, device=DEVICE), -3.0, -1.0, dtypes.float32),
    (lambda: Tensor.rand(100, 100, dtype=dtypes.float16, device=DEVICE), 0.0, 1.0, dtypes.float16),
    (lambda: Tensor.randint(100, 100, low=-4, high=5, device=DEVICE), -4, 4, dtypes.int32),
    (lambda: Tensor.randint(100, 100, high=3, dtype=dtypes.int64, device=DEVICE), 0, 2, dtypes.int64),
])
def test_random_ranges(maker: Callable[[], Tensor], low: float, high: float, dtype: DType) -> None:
    t = maker()
    v = t.numpy().astype(np.float64)
    assert t.dtype == dtype and v.min() >= low and v.max() <= high
    span = high - low
    assert v.min() < low + 0.05 * span and v.max() > high - 0.05 * span, "values do not cover the range"
    if dtype.is_int:
        assert set(np.unique(v)) == set(range(int(low), int(high) + 1))


@pytest.mark.parametrize("maker, mean, std", [
    (lambda: Tensor.randn(200, 100, device=DEVICE), 0.0, 1.0),
    (lambda: Tensor.normal(200, 100, mean=3.0, std=0.5, device=DEVICE), 3.0, 0.5),
])
def test_random_normal(maker: Callable[[], Tensor], mean: float, std: float) -> None:
    v = maker().numpy()
    assert abs(v.mean() - mean) < 0.05 * max(std, 1) and abs(v.std() - std) < 0.05 * std


def test_manual_seed_repeats() -> None:
    draws = []
    for seed in (5, 5, 6):
        Tensor.manual_seed(seed)
        draws.append(np.concatenate([Tensor.rand(10, device=DEVICE).numpy(), Tensor.randn(10, device=DEVICE).numpy(),
                                     Tensor.randint(10, high=1000, device=DEVICE).numpy().astype(np.float32)]))
    np.testing.assert_array_equal(draws[0], draws[1])
    assert not np.array_equal(draws[0], draws[2])
    Tensor.manual_seed(7)
    a = Tensor.rand(5, device=DEVICE).numpy()
    b = Tensor.rand(5, device=DEVICE).numpy()
    assert not np.array_equal(a, b), "consecutive draws must differ"


def test_like_constructors() -> None:
    x = T(rand((2, 3), dtype=np.float64))
    for t, value in [(x.zeros_like(), 0.0), (x.ones_like(), 1.0), (x.full_like(2.5), 2.5)]:
        assert t.shape == (2, 3) and t.dtype == dtypes.float64
        np.testing.assert_array_equal(t.numpy(), np.full((2, 3), value))
    assert x.ones_like(dtype=dtypes.int32).dtype == dtypes.int32
    r, n = x.rand_like(), x.randn_like()
    assert r.shape == n.shape == (2, 3) and r.dtype == n.dtype == dtypes.float64
    assert 0 <= r.numpy().min() and r.numpy().max() < 1
    i = T(np.array([1, 2], np.int16))
    assert i.zeros_like().dtype == dtypes.int16 and i.full_like(3).tolist() == [3, 3]


def test_host_conversions() -> None:
    a = rand((2, 3))
    t = T(a)
    assert t.tolist() == a.tolist()
    assert T(3.5).item() == 3.5 and isinstance(T(3).item(), int) and T(True).item() is True
    assert T([[4]]).item() == 4
    fresh = T(a) + 0
    assert fresh.realize() is fresh and np.array_equal(fresh.numpy(), a)
    s = T(a).T.contiguous()
    np.testing.assert_array_equal(s.numpy(), a.T)
    d = T(a, requires_grad=True)
    assert np.array_equal(d.detach().numpy(), a)
    assert T(a).to(DEVICE).device == Device.canonicalize(DEVICE)
    assert len(T(a)) == 2 and t.numel() == 6 and t.ndim == 2 and t.size() == (2, 3) and t.size(-1) == 3


def test_detach_blocks_gradient() -> None:
    x = T(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = (x * x.detach()).sum()
    (g,) = y.gradient(x)
    np.testing.assert_allclose(g.numpy(), [1.0, 2.0])


@pytest.mark.parametrize("src, dst", [
    (np.float32, np.int32), (np.float32, np.bool_), (np.float32, np.float16), (np.float32, np.float64),
    (np.int32, np.float32), (np.int32, np.int8), (np.int32, np.uint8), (np.bool_, np.float32), (np.bool_, np.int32),
    (np.float64, np.float32), (np.float16, np.float32), (np.int64, np.int32), (np.uint8, np.int32),
], ids=lambda d: np.dtype(d).name)
def test_cast(src: Any, dst: Any) -> None:
    a = rand((3, 4), -100, 100, src, seed=4) if np.dtype(src).kind != "b" else rand((3, 4), dtype=np.bool_)
    if np.dtype(src).kind == "f":
        a[0, :3] = [0.0, -0.0, 0.5]  # exact zeros and a fraction (int casts truncate toward zero, as numpy)
    if np.dtype(dst) == np.uint8:
        a = np.abs(a)
    out = T(a).cast(dtypes.from_np(np.dtype(dst)))
    assert out.dtype == dtypes.from_np(np.dtype(dst))
    _assert_close(out.numpy(), a.astype(dst), 1e-3, 1e-3, "cast")


def test_cast_shortcuts_and_bfloat16() -> None:
    a = np.array([1.5, -2.25, 3.0], np.float32)
    t = T(a)
    for fn, dt in [(t.float, dtypes.float32), (t.half, dtypes.float16), (t.int, dtypes.int32),
                   (t.long, dtypes.int64), (t.bool, dtypes.bool), (t.double, dtypes.float64)]:
        assert fn().dtype == dt
    np.testing.assert_array_equal(t.int().numpy(), [1, -2, 3])
    b = t.cast("bfloat16")
    assert b.dtype == dtypes.bfloat16
    np.testing.assert_array_equal(b.numpy(), a)
    np.testing.assert_array_equal(b.cast(dtypes.float32).numpy(), a)
    np.testing.assert_array_equal(T(np.float32(1 / 3)).cast(dtypes.bfloat16).numpy(), np.float32(0.333984375))


# ---------------------------------------------------------------------- elementwise
def _np_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _tf(name: str, **kwargs: Any) -> Callable[[Any], Any]:
    """A torch.nn.functional op (resolved lazily, so this module imports without torch)."""
    return lambda x: getattr(F, name)(x, **kwargs)


# name, glassgrad/torch fn, numpy fn, torch fn (SAME: the first), input range
UNARY: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], Any, tuple[float, float]]] = [
    ("neg", lambda x: -x, np.negative, SAME, (-2, 2)),
    ("neg_method", lambda x: x.neg(), np.negative, SAME, (-2, 2)),
    ("reciprocal", lambda x: x.reciprocal(), np.reciprocal, SAME, (0.5, 2)),
    ("reciprocal_neg", lambda x: x.reciprocal(), np.reciprocal, SAME, (-2, -0.5)),
    ("sqrt", lambda x: x.sqrt(), np.sqrt, SAME, (0.1, 3)),
    ("rsqrt", lambda x: x.rsqrt(), lambda x: 1 / np.sqrt(x), SAME, (0.1, 3)),
    ("exp", lambda x: x.exp(), np.exp, SAME, (-3, 3)),
    ("exp2", lambda x: x.exp2(), np.exp2, SAME, (-3, 3)),
    ("log", lambda x: x.log(), np.log, SAME, (0.1, 4)),
    ("log2", lambda x: x.log2(), np.log2, SAME, (0.1, 4)),
    ("sin", lambda x: x.sin(), np.sin, SAME, (-4, 4)),
    ("cos", lambda x: x.cos(), np.cos, SAME, (-4, 4)),
    ("tan", lambda x: x.tan(), np.tan, SAME, (-1.2, 1.2)),
    ("abs", lambda x: x.abs(), np.abs, SAME, (-2, 2)),
    ("abs_op", lambda x: abs(x), np.abs, SAME, (-2, 2)),
    ("sign", lambda x: x.sign(), np.sign, SAME, (-2, 2)),
    ("trunc", lambda x: x.trunc(), np.trunc, SAME, (-3, 3)),
    ("floor", lambda x: x.floor(), np.floor, SAME, (-3, 3)),
    ("ceil", lambda x: x.ceil(), np.ceil, SAME, (-3, 3)),
    ("round", lambda x: x.round(), np.round, SAME, (-3, 3)),
    ("relu", lambda x: x.relu(), lambda x: np.maximum(x, 0), SAME, (-2, 2)),
    ("leaky_relu", lambda x: x.leaky_relu(), lambda x: np.where(x > 0, x, 0.01 * x), _tf("leaky_relu"), (-2, 2)),
    ("leaky_relu_0.2", lambda x: x.leaky_relu(0.2), lambda x: np.where(x > 0, x, 0.2 * x),
     _tf("leaky_relu", negative_slope=0.2), (-2, 2)),
    ("elu", lambda x: x.elu(), lambda x: np.where(x > 0, x, np.expm1(x)), _tf("elu"), (-2, 2)),
    ("elu_alpha", lambda x: x.elu(0.5), lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)), _tf("elu", alpha=0.5),
     (-2, 2)),
    ("gelu", lambda x: x.gelu(), _np_gelu, _tf("gelu", approximate="tanh"), (-3, 3)),
    ("silu", lambda x: x.silu(), lambda x: x * _np_sigmoid(x), _tf("silu"), (-4, 4)),
    ("swish", lambda x: x.swish(), lambda x: x * _np_sigmoid(x), _tf("silu"), (-4, 4)),
    ("sigmoid", lambda x: x.sigmoid(), _np_sigmoid, SAME, (-5, 5)),
    ("tanh", lambda x: x.tanh(), np.tanh, SAME, (-3, 3)),
    ("softplus", lambda x: x.softplus(), lambda x: np.log1p(np.exp(x)), _tf("softplus"), (-5, 5)),
    ("softplus_beta", lambda x: x.softplus(beta=2.0), lambda x: np.log1p(np.exp(2 * x)) / 2,
     _tf("softplus", beta=2.0), (-5, 5)),
    ("square", lambda x: x.square(), np.square, SAME, (-2, 2)),
    ("relu6", lambda x: x.relu6(), lambda x: np.clip(x, 0, 6), _tf("relu6"), (-3, 9)),
]


@pytest.mark.parametrize("name, fn, np_fn, torch_fn, domain", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name: str, fn: Callable[[Any], Any], np_fn: Callable[[Any], Any], torch_fn: Any,
               domain: tuple[float, float]) -> None:
    check(fn, np_fn, [(3, 5)], torch_fn=torch_fn, low=domain[0], high=domain[1], grad=True, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name, fn, np_fn, torch_fn, domain", [u for u in UNARY if u[0] in ("exp", "sqrt", "relu",
                                                                                                  "sigmoid", "sin")],
                         ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)], ids=str)
def test_unary_0d_and_empty(name: str, fn: Callable[[Any], Any], np_fn: Callable[[Any], Any], torch_fn: Any,
                            domain: tuple[float, float], shape: Shape) -> None:
    check(fn, np_fn, [shape], torch_fn=torch_fn, low=domain[0], high=domain[1], grad=True)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
@pytest.mark.parametrize("name, fn, np_fn, torch_fn, domain", [u for u in UNARY if u[0] in ("exp", "gelu", "abs")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_unary_noncontiguous(name: str, fn: Callable[[Any], Any], np_fn: Callable[[Any], Any], torch_fn: Any,
                             domain: tuple[float, float], layout: Layout) -> None:
    check(fn, np_fn, [(3, 4)], torch_fn=torch_fn, low=domain[0], high=domain[1], grad=True, layout=layout)


def test_unary_special_values() -> None:
    a = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30, -2.5, 2.5, 0.5, -0.5, 1.5], np.float32)
    with np.errstate(all="ignore"):
        for fn, np_fn in [(lambda x: x.exp(), np.exp), (lambda x: x.sqrt(), np.sqrt), (lambda x: x.log(), np.log),
                          (lambda x: x.abs(), np.abs), (lambda x: x.sign(), np.sign),
                          (lambda x: x.relu(), lambda x: np.maximum(x, 0)), (lambda x: x.floor(), np.floor),
                          (lambda x: x.ceil(), np.ceil), (lambda x: x.round(), np.round),
                          (lambda x: x.trunc(), np.trunc), (lambda x: x.sigmoid(), _np_sigmoid),
                          (lambda x: x.reciprocal(), np.reciprocal), (lambda x: x.tanh(), np.tanh)]:
            _assert_close(fn(T(a)).numpy(), np_fn(a), 1e-6, 1e-5, f"special values {np_fn}")


def test_int_unary() -> None:
    a = np.array([-3, -1, 0, 2, 5], np.int32)
    np.testing.assert_array_equal((-T(a)).numpy(), -a)
    np.testing.assert_array_equal(T(a).abs().numpy(), np.abs(a))
    np.testing.assert_array_equal(T(a).sign().numpy(), np.sign(a))
    assert T(a).abs().dtype == dtypes.int32 and T(a).sign().dtype == dtypes.int32
    assert T(a).relu().tolist() == [0, 0, 0, 2, 5] and T(a).relu().dtype == dtypes.int32
    for op in ("floor", "ceil", "round", "trunc"):
        out = getattr(T(a), op)()
        assert out.dtype == dtypes.int32 and out.tolist() == a.tolist()
    assert T(a).sqrt().dtype == dtypes.float32
    np.testing.assert_allclose(T(np.abs(a)).sqrt().numpy(), np.sqrt(np.abs(a)), rtol=1e-6)
    np.testing.assert_allclose(T(a).exp().numpy(), np.exp(a).astype(np.float32), rtol=1e-5)


def test_round_half_to_even() -> None:
    a = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 0.49999997, -0.49999997, 1e7 + 0.5], np.float32)
    np.testing.assert_array_equal(T(a).round().numpy(), np.round(a))


BINARY: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any], tuple[float, float], bool]] = [
    # name, fn, numpy fn, input range, differentiable
    ("add", lambda a, b: a + b, np.add, (-2, 2), True),
    ("sub", lambda a, b: a - b, np.subtract, (-2, 2), True),
    ("mul", lambda a, b: a * b, np.multiply, (-2, 2), True),
    ("div", lambda a, b: a / b, np.divide, (0.5, 2), True),
    ("pow", lambda a, b: a ** b, np.power, (0.5, 2), True),
    ("maximum", lambda a, b: a.maximum(b), np.maximum, (-2, 2), True),
    ("minimum", lambda a, b: a.minimum(b), np.minimum, (-2, 2), True),
    ("mod", lambda a, b: a % b, np.mod, (-3, 3), True),
    ("floordiv", lambda a, b: a // b, np.floor_divide, (-3, 3), False),
]
BROADCAST_SHAPES = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((4,), (2, 3, 4)), ((5,), ()),
                    ((), ()), ((0, 3), (1, 3)), ((2, 1, 3), (4, 1))]


@pytest.mark.parametrize("shapes", BROADCAST_SHAPES, ids=str)
@pytest.mark.parametrize("name, fn, np_fn, domain, diff", BINARY, ids=[b[0] for b in BINARY])
def test_binary(name: str, fn: Callable[[Any, Any], Any], np_fn: Callable[[Any, Any], Any],
                domain: tuple[float, float], diff: bool, shapes: tuple[Shape, Shape]) -> None:
    inputs = [rand(shapes[0], *domain, seed=1), rand(shapes[1], *domain, seed=2)]
    if name in ("mod", "floordiv"):
        inputs[1] = np.where(np.abs(inputs[1]) < 0.3, 0.7, inputs[1]).astype(np.float32)  # stay away from 0
    check(fn, np_fn, inputs=inputs, grad=diff, atol=1e-5, rtol=1e-5)


def test_binary_method_names() -> None:
    shapes = [(3, 1), (1, 4)]
    check(lambda a, b: a.add(b), np.add, shapes, grad=True)
    check(lambda a, b: a.sub(b), np.subtract, shapes, grad=True)
    check(lambda a, b: a.mul(b), np.multiply, shapes, grad=True)
    check(lambda a, b: a.div(b), np.divide, shapes, low=0.5, high=2, grad=True)
    check(lambda a, b: a.pow(b), np.power, shapes, low=0.5, high=2, grad=True)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
@pytest.mark.parametrize("name, fn, np_fn, domain, diff", [b for b in BINARY if b[0] in ("mul", "div", "maximum")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_binary_noncontiguous(name: str, fn: Callable[[Any, Any], Any], np_fn: Callable[[Any, Any], Any],
                              domain: tuple[float, float], diff: bool, layout: Layout) -> None:
    check(fn, np_fn, [(3, 4), (3, 4)], low=domain[0], high=domain[1], grad=diff, layout=layout)


def test_noncontiguous_mixed_views() -> None:
    a = rand((3, 4), seed=1)
    b = rand((4, 3), seed=2)
    check(lambda x, y: x * y.T + x.flip(0) - y[::-1].T[:, ::2].repeat(1, 2),
          lambda x, y: x * y.T + np.flip(x, 0) - np.tile(y[::-1].T[:, ::2], (1, 2)), inputs=[a, b], grad=True,
          torch_fn=lambda x, y: x * y.T + x.flip(0) - y.flip(0).T[:, ::2].repeat(1, 2))


@pytest.mark.parametrize("shape,axes", [((1, 4, 2, 1), (0, 1, 2)), ((4, 2), (0, 1)), ((3, 5, 2), (1, 2)),
                                        ((8, 3), (0,)), ((2, 16), (1,)), ((1024, 4, 2), (1, 2))])
def test_sum_of_flipped_block(shape: tuple[int, ...], axes: tuple[int, ...]) -> None:
    """A reduction reading backwards: gcc 12.2's outer-loop vectoriser summed the flipped (1, 4, 2, 1) block to 38
    instead of 28 until such kernels were compiled without it (renderer/cstyle.py). Tiny kernels are compiled
    without optimisation anyway, so (1024, 4, 2) checks the workaround at -O2 (without it: 34, not 28)."""
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    check(lambda t: t.flip(axes).sum(axes), lambda a: np.flip(a, axes).sum(axes), inputs=[x])
    check(lambda t: t.flip(axes).max(axes), lambda a: np.flip(a, axes).max(axes), inputs=[x],
          torch_fn=lambda t: t.flip(axes).amax(axes))


INT_BINARY: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = [
    ("add", lambda a, b: a + b, np.add), ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply), ("floordiv", lambda a, b: a // b, np.floor_divide),
    ("mod", lambda a, b: a % b, np.mod), ("maximum", lambda a, b: a.maximum(b), np.maximum),
    ("minimum", lambda a, b: a.minimum(b), np.minimum), ("and", lambda a, b: a & b, np.bitwise_and),
    ("or", lambda a, b: a | b, np.bitwise_or), ("xor", lambda a, b: a ^ b, np.bitwise_xor),
    ("lt", lambda a, b: a < b, np.less), ("le", lambda a, b: a <= b, np.less_equal),
    ("gt", lambda a, b: a > b, np.greater), ("ge", lambda a, b: a >= b, np.greater_equal),
    ("eq", lambda a, b: a == b, np.equal), ("ne", lambda a, b: a != b, np.not_equal),
]


@pytest.mark.parametrize("np_dtype", [np.int32, np.int8, np.int64, np.uint8], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name, fn, np_fn", INT_BINARY, ids=[b[0] for b in INT_BINARY])
def test_int_binary(name: str, fn: Callable[[Any, Any], Any], np_fn: Callable[[Any, Any], Any], np_dtype: Any) -> None:
    low = 0 if np.dtype(np_dtype).kind == "u" else -9
    a = rand((4, 5), low, 10, np_dtype, seed=1)
    b = rand((5,), low, 10, np_dtype, seed=2)
    b[b == 0] = 3  # no division by zero
    out_dtype = dtypes.bool if name in ("lt", "le", "gt", "ge", "eq", "ne") else dtypes.from_np(np.dtype(np_dtype))
    check(fn, np_fn, inputs=[a, b], out_dtype=out_dtype)


def test_int_division_and_pow() -> None:
    a = np.array([-7, -6, -1, 0, 1, 6, 7], np.int32)
    b = np.array([2, -2, 3, -3, 4, 5, -5], np.int32)
    check(lambda x, y: x / y, np.divide, inputs=[a, b], out_dtype=dtypes.float32, torch_fn=lambda x, y: x / y)
    check(lambda x, y: x.div(y, rounding_mode="trunc"), lambda x, y: np.trunc(x / y).astype(np.int32),
          inputs=[a, b], out_dtype=dtypes.int32)
    check(lambda x, y: x.div(y, rounding_mode="floor"), np.floor_divide, inputs=[a, b], out_dtype=dtypes.int32)
    e = np.array([0, 1, 2, 3, 4, 5, 6], np.int32)
    check(lambda x, y: x ** y, np.power, inputs=[a, e], out_dtype=dtypes.int32)
    check(lambda x: x ** 3, lambda x: x ** 3, inputs=[a], out_dtype=dtypes.int32)
    check(lambda x: 2 ** x, lambda x: 2 ** x, inputs=[e], out_dtype=dtypes.int32)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_float_floordiv_near_multiples() -> None:
    """1.0 // 0.1 is 9.0 (0.1 is a bit more than a tenth); floor(1.0 / 0.1) would round to 10."""
    a = np.round(np.random.default_rng(0).uniform(-10, 10, 400), 1).astype(np.float32)
    check(lambda x: x // 0.1, lambda x: x // np.float32(0.1), inputs=[a])
    check(lambda x: x.div(0.1, rounding_mode="floor"), lambda x: x // np.float32(0.1), inputs=[a],
          torch_fn=lambda x: x.div(0.1, rounding_mode="floor"))
    edges_a = np.array([1.0, -0.3, 5.0, 0.0, np.inf, 3.0, -3.5, 3.5, -5.0], np.float32)
    edges_b = np.array([0.1, 0.1, 0.0, 0.0, 2.0, np.inf, 2.0, -2.0, 0.0], np.float32)
    check(lambda x, y: x // y, np.floor_divide, inputs=[edges_a, edges_b])


def test_float_pow_negative_base() -> None:
    a = np.array([-2.0, -1.5, -0.5, 0.0, 0.5, 2.0], np.float32)
    check(lambda x: x ** 3.0, lambda x: x ** np.float32(3.0), inputs=[a])
    check(lambda x: x ** 2, lambda x: x ** 2, inputs=[a], grad=True)
    check(lambda x: x ** -1.0, lambda x: np.power(x, np.float32(-1.0)), inputs=[a[a != 0]], grad=True)
    with np.errstate(all="ignore"):
        check(lambda x: x ** 0.5, lambda x: np.power(x, np.float32(0.5)), inputs=[a])
        check(lambda x: x ** 0.0, lambda x: np.power(x, np.float32(0.0)), inputs=[a])


SCALAR_OPS: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], Any]] = [
    # name, glassgrad/torch fn, numpy fn, torch fn where it differs
    ("x+2", lambda x: x + 2, lambda x: x + 2, SAME), ("2+x", lambda x: 2 + x, lambda x: 2 + x, SAME),
    ("x-1.5", lambda x: x - 1.5, lambda x: x - 1.5, SAME), ("1.5-x", lambda x: 1.5 - x, lambda x: 1.5 - x, SAME),
    ("x*3", lambda x: x * 3, lambda x: x * 3, SAME), ("3*x", lambda x: 3 * x, lambda x: 3 * x, SAME),
    ("x/2", lambda x: x / 2, lambda x: x / 2, SAME), ("2/x", lambda x: 2 / x, lambda x: 2 / x, SAME),
    ("x**2", lambda x: x ** 2, lambda x: x ** 2, SAME), ("x**3", lambda x: x ** 3, lambda x: x ** 3, SAME),
    ("x**0.5", lambda x: x ** 0.5, lambda x: x ** 0.5, SAME), ("2**x", lambda x: 2 ** x, lambda x: 2 ** x, SAME),
    ("1.5**x", lambda x: 1.5 ** x, lambda x: np.float32(1.5) ** x, SAME),
    ("x//0.7", lambda x: x // 0.7, lambda x: x // 0.7, SAME), ("3//x", lambda x: 3 // x, lambda x: 3 // x, SAME),
    ("x%0.7", lambda x: x % 0.7, lambda x: x % 0.7, SAME),
    ("3%x", lambda x: 3 % x, lambda x: 3 % x, lambda x: torch.remainder(torch.full_like(x, 3), x)),
    ("x<1", lambda x: x < 1, lambda x: x < 1, SAME), ("1<x", lambda x: 1 < x, lambda x: 1 < x, SAME),
    ("x>=1", lambda x: x >= 1, lambda x: x >= 1, SAME), ("x==1", lambda x: x == 1, lambda x: x == 1, SAME),
    ("x!=1", lambda x: x != 1, lambda x: x != 1, SAME),
    ("max(x,1)", lambda x: x.maximum(1), lambda x: np.maximum(x, 1), lambda x: x.clamp(min=1)),
    ("min(x,1)", lambda x: x.minimum(1.0), lambda x: np.minimum(x, 1.0), lambda x: x.clamp(max=1.0)),
]


@pytest.mark.parametrize("name, fn, np_fn, torch_fn", SCALAR_OPS, ids=[s[0] for s in SCALAR_OPS])
def test_python_scalars(name: str, fn: Callable[[Any], Any], np_fn: Callable[[Any], Any], torch_fn: Any) -> None:
    differentiable = not any(c in name for c in "<>=!") and "//" not in name
    check(fn, np_fn, [(2, 3)], low=0.5, high=2.5, grad=differentiable, torch_fn=torch_fn)


@pytest.mark.parametrize("lo, hi", [(-0.5, 0.5), (None, 0.3), (-0.3, None), (0.0, 0.0)], ids=str)
def test_clip(lo: float | None, hi: float | None) -> None:
    check(lambda x: x.clip(lo, hi), lambda x: np.clip(x, lo, hi), [(4, 5)], grad=True,
          torch_fn=lambda x: x.clamp(lo, hi)) if (lo, hi) != (0.0, 0.0) else \
        check(lambda x: x.clamp(lo, hi), lambda x: np.clip(x, lo, hi), [(4, 5)])


def test_clip_tensor_bounds() -> None:
    check(lambda x, lo, hi: x.clip(lo, hi), lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
          inputs=[rand((3, 4), seed=1), rand((4,), -2, -0.5, seed=2), rand((3, 1), 0.5, 2, seed=3)], grad=True,
          torch_fn=lambda x, lo, hi: x.clamp(lo, hi))


@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (1, 4), (4,)), ((4,), (3, 1), ()),
                                    ((), (2, 3), (2, 3)), ((0, 2), (1, 2), (0, 1))], ids=str)
def test_where(shapes: tuple[Shape, Shape, Shape]) -> None:
    cond = rand(shapes[0], dtype=np.bool_, seed=7)
    x, y = rand(shapes[1], seed=1), rand(shapes[2], seed=2)
    check(lambda c, a, b: c.where(a, b), np.where, inputs=[cond, x, y], grad=True,
          torch_fn=lambda c, a, b: torch.where(c, a, b))


def test_where_scalars() -> None:
    cond = rand((3, 4), dtype=np.bool_, seed=7)
    x = rand((3, 4))
    check(lambda c, a: c.where(a, 1.5), lambda c, a: np.where(c, a, np.float32(1.5)), inputs=[cond, x], grad=True,
          torch_fn=lambda c, a: torch.where(c, a, 1.5))
    check(lambda c, a: c.where(0, a), lambda c, a: np.where(c, np.float32(0), a), inputs=[cond, x], grad=True,
          torch_fn=lambda c, a: torch.where(c, 0.0, a))
    check(lambda c: c.where(1, 0), lambda c: np.where(c, 1, 0).astype(np.int32), inputs=[cond],
          out_dtype=dtypes.int32, torch_fn=None)
    check(lambda c: c.where(2.5, -1.0), lambda c: np.where(c, 2.5, -1.0).astype(np.float32), inputs=[cond],
          out_dtype=dtypes.float32, torch_fn=None)
    f = rand((3, 4), seed=3)
    check(lambda c, a: c.where(a, 0), lambda c, a: np.where(c != 0, a, 0), inputs=[f, x], torch_fn=None)


@pytest.mark.parametrize("name, fn, np_fn", [
    ("and", lambda a, b: a & b, np.logical_and), ("or", lambda a, b: a | b, np.logical_or),
    ("xor", lambda a, b: a ^ b, np.logical_xor), ("eq", lambda a, b: a == b, np.equal),
    ("ne", lambda a, b: a != b, np.not_equal), ("logical_and", lambda a, b: a.logical_and(b), np.logical_and),
    ("logical_or", lambda a, b: a.logical_or(b), np.logical_or), ("maximum", lambda a, b: a.maximum(b), np.maximum),
    ("minimum", lambda a, b: a.minimum(b), np.minimum), ("lt", lambda a, b: a < b, np.less),
])
def test_bool_binary(name: str, fn: Callable[[Any, Any], Any], np_fn: Callable[[Any, Any], Any]) -> None:
    check(fn, np_fn, inputs=[rand((3, 4), dtype=np.bool_, seed=1), rand((4,), dtype=np.bool_, seed=2)],
          out_dtype=dtypes.bool)


def test_bool_unary_and_arith() -> None:
    a = rand((3, 4), dtype=np.bool_, seed=1)
    b = rand((3, 4), dtype=np.bool_, seed=2)
    check(lambda x: ~x, np.logical_not, inputs=[a], out_dtype=dtypes.bool)
    check(lambda x: x.logical_not(), np.logical_not, inputs=[a], out_dtype=dtypes.bool)
    check(lambda x, y: x + y, lambda x, y: x | y, inputs=[a, b], out_dtype=dtypes.bool)
    check(lambda x, y: x * y, lambda x, y: x & y, inputs=[a, b], out_dtype=dtypes.bool)
    check(lambda x: x + 1, lambda x: x.astype(np.int32) + 1, inputs=[a], out_dtype=dtypes.int32, torch_fn=None)
    check(lambda x: x * 2.5, lambda x: x * np.float32(2.5), inputs=[a], out_dtype=dtypes.float32)
    check(lambda x: x.sum(), lambda x: np.int32(x.sum()), inputs=[a], out_dtype=dtypes.int32, torch_fn=None)


@pytest.mark.parametrize("np_dtype", [np.int32, np.uint8, np.int64], ids=lambda d: np.dtype(d).name)
def test_bitwise_unary_and_shifts(np_dtype: Any) -> None:
    a = rand((3, 4), 0, 100, np_dtype, seed=1)
    s = rand((3, 4), 0, 4, np_dtype, seed=2)
    out = np.dtype(np_dtype)
    check(lambda x: ~x, np.invert, inputs=[a], out_dtype=dtypes.from_np(out))
    check(lambda x: x.bitwise_not(), np.invert, inputs=[a], out_dtype=dtypes.from_np(out))
    check(lambda x, y: x << y, np.left_shift, inputs=[a, s], out_dtype=dtypes.from_np(out))
    check(lambda x, y: x >> y, np.right_shift, inputs=[a, s], out_dtype=dtypes.from_np(out))
    check(lambda x: x << 2, lambda x: x << 2, inputs=[a], out_dtype=dtypes.from_np(out))
    check(lambda x: x >> 1, lambda x: x >> 1, inputs=[a], out_dtype=dtypes.from_np(out))
    check(lambda x: x.logical_not(), np.logical_not, inputs=[a], out_dtype=dtypes.bool)
    check(lambda x, y: x.bitwise_and(y), np.bitwise_and, inputs=[a, s], out_dtype=dtypes.from_np(out))
    check(lambda x, y: x.bitwise_or(y), np.bitwise_or, inputs=[a, s], out_dtype=dtypes.from_np(out))
    check(lambda x, y: x.bitwise_xor(y), np.bitwise_xor, inputs=[a, s], out_dtype=dtypes.from_np(out))
    check(lambda x: 0x0F & x, lambda x: 0x0F & x, inputs=[a], out_dtype=dtypes.from_np(out))
    check(lambda x: 5 | x, lambda x: 5 | x, inputs=[a], out_dtype=dtypes.from_np(out))


def test_negative_shift_values_int() -> None:
    a = np.array([-8, -1, 5], np.int32)
    check(lambda x: x >> 1, lambda x: x >> 1, inputs=[a], out_dtype=dtypes.int32)
    check(lambda x: ~x, np.invert, inputs=[a], out_dtype=dtypes.int32)


# (dtype a, dtype b) -> result; these are PyTorch's (and tinygrad's) promotion rules, checked against torch too
PROMOTIONS: list[tuple[DType, DType, DType]] = [
    (dtypes.int32, dtypes.float32, dtypes.float32), (dtypes.int8, dtypes.uint8, dtypes.int16),
    (dtypes.bool, dtypes.int32, dtypes.int32), (dtypes.float16, dtypes.float32, dtypes.float32),
    (dtypes.float16, dtypes.bfloat16, dtypes.float32), (dtypes.int64, dtypes.float16, dtypes.float16),
    (dtypes.uint8, dtypes.int32, dtypes.int32), (dtypes.int32, dtypes.int64, dtypes.int64),
    (dtypes.bool, dtypes.float16, dtypes.float16), (dtypes.float32, dtypes.float64, dtypes.float64),
    (dtypes.uint8, dtypes.int8, dtypes.int16), (dtypes.bfloat16, dtypes.float32, dtypes.float32),
    (dtypes.int16, dtypes.uint8, dtypes.int16), (dtypes.bool, dtypes.bool, dtypes.bool),
]


@pytest.mark.parametrize("a, b, result", PROMOTIONS, ids=lambda d: d.name)
def test_dtype_promotion(a: DType, b: DType, result: DType) -> None:
    x = T(np.array([1, 0, 1], np.float32), dtype=a)
    y = T(np.array([1, 1, 0], np.float32), dtype=b)
    for out in (x + y, y + x, x * y, x.maximum(y)):
        assert out.dtype == result, (a, b, out.dtype)
    expect = (np.array([1, 0, 1]) | np.array([1, 1, 0])) if result == dtypes.bool else np.array([2, 1, 1])
    np.testing.assert_array_equal((x + y).numpy().astype(np.float64), expect.astype(np.float64))
    if torch is not None:
        tname = {"bfloat16": "bfloat16", "bool": "bool"}.get(a.name, a.name)
        ta, tb = torch.ones(1, dtype=getattr(torch, tname)), torch.ones(1, dtype=getattr(torch, b.name))
        assert str((ta + tb).dtype) == f"torch.{result.name}"


@pytest.mark.parametrize("dtype, scalar, result", [
    (dtypes.int32, 2.5, dtypes.float32), (dtypes.float16, 2.5, dtypes.float16), (dtypes.int8, 3, dtypes.int8),
    (dtypes.bool, 1.5, dtypes.float32), (dtypes.bfloat16, 2, dtypes.bfloat16), (dtypes.float64, 1, dtypes.float64),
    (dtypes.uint8, 2, dtypes.uint8), (dtypes.bool, True, dtypes.bool), (dtypes.int64, 2, dtypes.int64),
], ids=str)
def test_scalar_promotion(dtype: DType, scalar: Any, result: DType) -> None:
    x = T(np.array([1, 0, 1], np.float32), dtype=dtype)
    assert (x + scalar).dtype == result and (scalar + x).dtype == result and (x * scalar).dtype == result
    if torch is not None:
        tx = torch.ones(1, dtype=getattr(torch, dtype.name))
        assert str((tx + scalar).dtype) == f"torch.{result.name}"


@pytest.mark.parametrize("dtype, scalar", [(dtypes.float32, 0.5), (dtypes.float32, 3), (dtypes.int32, 3),
                                           (dtypes.int32, 2.5), (dtypes.bool, True), (dtypes.float16, -0.0)], ids=str)
def test_scalar_operand_builds_the_graph_of_a_full_tensor(dtype: DType, scalar: Any) -> None:
    """`x op scalar` (which skips the general broadcast path when no cast is needed) makes the node that `x op
    full_like(x, scalar)` makes, on either side of the op."""
    x = T(np.array([[1, 0, 2], [3, 1, 0]], np.float32), dtype=dtype).realize()
    full = x.full_like(scalar, dtype=(x + scalar).dtype)
    assert (x * scalar).uop is (x * full).uop and (scalar * x).uop is (full * x).uop
    assert (x < scalar).uop is (x < full).uop and (x.maximum(scalar)).uop is (x.maximum(full)).uop


def test_bool_plus_int_scalar_is_int32() -> None:
    """tinygrad's rule (torch gives int64): bool tensor + python int -> default int (int32)."""
    out = T([True, False]) + 1
    assert out.dtype == dtypes.int32 and out.tolist() == [2, 1]


def test_int_overflow_wraps() -> None:
    a = np.array([120, -120], np.int8)
    check(lambda x: x + 10, lambda x: x + np.int8(10), inputs=[a], out_dtype=dtypes.int8)
    check(lambda x: x + 300, lambda x: (x.astype(np.int32) + 300).astype(np.int8), inputs=[a], out_dtype=dtypes.int8)


LOW_PRECISION = [("float16", np.float16, 2e-3), ("bfloat16", None, 1.6e-2), ("float64", np.float64, 1e-12)]


@pytest.mark.parametrize("dtype_name, np_dtype, tol", LOW_PRECISION, ids=[d[0] for d in LOW_PRECISION])
@pytest.mark.parametrize("name, fn, np_fn", [
    ("add", lambda a, b: a + b, np.add), ("mul", lambda a, b: a * b, np.multiply),
    ("div", lambda a, b: a / b, np.divide), ("max", lambda a, b: a.maximum(b), np.maximum),
    ("exp", lambda a, b: a.exp(), lambda a, b: np.exp(a)), ("sqrt", lambda a, b: b.sqrt(), lambda a, b: np.sqrt(b)),
    ("log", lambda a, b: b.log(), lambda a, b: np.log(b)), ("sin", lambda a, b: a.sin(), lambda a, b: np.sin(a)),
    ("sigmoid", lambda a, b: a.sigmoid(), lambda a, b: _np_sigmoid(a)),
    ("lt", lambda a, b: a < b, np.less), ("sum", lambda a, b: a.sum(1), lambda a, b: a.sum(1)),
    ("where", lambda a, b: (a > 0).where(a, b), lambda a, b: np.where(a > 0, a, b)),
    ("max_red", lambda a, b: a.max(0), lambda a, b: a.max(0)),
    ("matmul", lambda a, b: a @ b.T, lambda a, b: a @ b.T), ("neg_floor", lambda a, b: (-a).floor(),
                                                            lambda a, b: np.floor(-a)),
    ("tanh", lambda a, b: a.tanh(), lambda a, b: np.tanh(a)), ("gelu", lambda a, b: a.gelu(), lambda a, b: _np_gelu(a)),
    ("softmax", lambda a, b: a.softmax(1), lambda a, b: _np_softmax(a, 1)),
    ("log_softmax", lambda a, b: a.log_softmax(1), lambda a, b: _np_log_softmax(a, 1)),
    ("layernorm", lambda a, b: a.layernorm(), lambda a, b: (a - a.mean(1, keepdims=True)) /
     np.sqrt(a.var(1, keepdims=True) + 1e-5)),
    ("var", lambda a, b: a.var(0), lambda a, b: a.var(0, ddof=1)),
    ("mean", lambda a, b: a.mean(), lambda a, b: np.mean(a)),
    ("cumsum", lambda a, b: a.cumsum(1), lambda a, b: np.cumsum(a, 1)),
    ("logsumexp", lambda a, b: a.logsumexp(1), lambda a, b: _np_logsumexp(a, 1)),
])
def test_float_dtypes(name: str, fn: Callable[[Any, Any], Any], np_fn: Callable[[Any, Any], Any], dtype_name: str,
                      np_dtype: Any, tol: float) -> None:
    a = rand((3, 4), -2, 2, seed=1)
    b = rand((3, 4), 0.5, 2, seed=2)
    dt = getattr(dtypes, dtype_name)
    x, y = T(a).cast(dt), T(b).cast(dt)
    stored_a, stored_b = x.numpy().astype(np.float64), y.numpy().astype(np.float64)  # the rounded inputs
    out = fn(x, y)
    expected = np.asarray(np_fn(stored_a, stored_b))
    assert out.dtype == (dtypes.bool if expected.dtype == np.bool_ else dt)
    _assert_close(out.numpy().astype(np.float64) if out.dtype != dtypes.bool else out.numpy(), expected, tol,
                  tol * 2, dtype_name)
    if torch is not None:
        tdt = getattr(torch, dtype_name)
        t_fn = {"where": lambda p, q: torch.where(p > 0, p, q), "max_red": lambda p, q: p.amax(0),
                "gelu": lambda p, q: F.gelu(p, approximate="tanh"),
                "layernorm": lambda p, q: F.layer_norm(p, (4,))}.get(name, fn)
        t_out = t_fn(torch.from_numpy(a).to(tdt), torch.from_numpy(b).to(tdt))
        assert str(t_out.dtype).endswith(out.dtype.name)


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float64"])
def test_float_dtypes_backward(dtype_name: str) -> None:
    dt = getattr(dtypes, dtype_name)
    a = rand((3, 4), 0.5, 2, seed=1)
    x = T(a).cast(dt).detach().requires_grad_()
    loss = (x * x.exp() + x.sqrt()).sum()
    loss.backward()
    assert x.grad is not None and x.grad.dtype == dt
    stored = x.numpy().astype(np.float64)
    tol = {"float16": 1e-2, "bfloat16": 6e-2, "float64": 1e-12}[dtype_name]
    _assert_close(x.grad.numpy().astype(np.float64), np.exp(stored) * (1 + stored) + 0.5 / np.sqrt(stored), tol,
                  tol, "grad")


# ---------------------------------------------------------------------- reductions
def _np_var(x: np.ndarray, axis: Any = None, keepdims: bool = False, ddof: int = 1) -> np.ndarray:
    return np.var(x, axis=axis, keepdims=keepdims, ddof=ddof)


def _np_logsumexp(x: np.ndarray, axis: Any = None, keepdims: bool = False) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis) if axis is not None else out.reshape(())


REDUCE_AXES: list[tuple[Any, bool]] = [(None, False), (0, False), (1, True), (-1, False), ((0, 2), False),
                                       ((-1, 0), True), (None, True), ((), False)]
REDUCTIONS: list[tuple[str, Callable[..., Any], Callable[..., Any], Any, tuple[float, float]]] = [
    # name, glassgrad fn(x, axis, keepdim), numpy fn(x, axis, keepdims), torch fn(x, axis, keepdim) or SAME, domain
    ("sum", lambda x, a, k: x.sum(a, keepdim=k), lambda x, a, k: np.sum(x, a, keepdims=k), SAME, (-2, 2)),
    ("mean", lambda x, a, k: x.mean(a, keepdim=k), lambda x, a, k: np.mean(x, a, keepdims=k), SAME, (-2, 2)),
    ("prod", lambda x, a, k: x.prod(a, keepdim=k), lambda x, a, k: np.prod(x, a, keepdims=k), None, (0.5, 1.5)),
    ("max", lambda x, a, k: x.max(a, keepdim=k), lambda x, a, k: np.max(x, a, keepdims=k),
     lambda x, a, k: x.amax(a if a is not None else tuple(range(x.ndim)), keepdim=k), (-2, 2)),
    ("min", lambda x, a, k: x.min(a, keepdim=k), lambda x, a, k: np.min(x, a, keepdims=k),
     lambda x, a, k: x.amin(a if a is not None else tuple(range(x.ndim)), keepdim=k), (-2, 2)),
    ("var", lambda x, a, k: x.var(a, keepdim=k), lambda x, a, k: _np_var(x, a, k), SAME, (-2, 2)),
    ("var0", lambda x, a, k: x.var(a, keepdim=k, correction=0), lambda x, a, k: _np_var(x, a, k, 0),
     lambda x, a, k: x.var(a, keepdim=k, correction=0), (-2, 2)),
    ("std", lambda x, a, k: x.std(a, keepdim=k), lambda x, a, k: np.std(x, a, keepdims=k, ddof=1), SAME, (-2, 2)),
    ("logsumexp", lambda x, a, k: x.logsumexp(a, keepdim=k), lambda x, a, k: _np_logsumexp(x, a, k),
     lambda x, a, k: x.logsumexp(a if a is not None else tuple(range(x.ndim)), keepdim=k), (-3, 3)),
]


def _torch_reduce(name: str, torch_fn: Any, axis: Any, keepdim: bool) -> Any:
    if torch_fn is None:
        return None
    if torch_fn is SAME:
        if axis is None and keepdim:
            return lambda x: getattr(x, name.rstrip("0"))(tuple(range(x.ndim)), keepdim=True)
        return lambda x: getattr(x, name.rstrip("0"))(axis, keepdim=keepdim) if axis is not None else \
            getattr(x, name.rstrip("0"))()
    return lambda x: torch_fn(x, axis, keepdim)


@pytest.mark.parametrize("axis, keepdim", REDUCE_AXES, ids=str)
@pytest.mark.parametrize("name, fn, np_fn, torch_fn, domain", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduce(name: str, fn: Callable[..., Any], np_fn: Callable[..., Any], torch_fn: Any,
                domain: tuple[float, float], axis: Any, keepdim: bool) -> None:
    if axis == () and name in ("var", "var0", "std", "logsumexp", "prod", "max", "min"):
        axis = (1,)  # the empty axis tuple is checked for sum and mean (numpy/torch disagree on it for the others)
    t_fn = _torch_reduce(name, torch_fn, axis, keepdim)
    if axis == ():
        t_fn = None  # torch reads dim=() as "all dims"; numpy (and glassgrad) reduce nothing
    check(lambda x: fn(x, axis, keepdim), lambda x: np_fn(x, axis, keepdim), [(2, 3, 4)], low=domain[0],
          high=domain[1], grad=True, torch_fn=t_fn, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
@pytest.mark.parametrize("name, fn, np_fn, torch_fn, domain", [r for r in REDUCTIONS if r[0] in ("sum", "max", "var")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_reduce_noncontiguous(name: str, fn: Callable[..., Any], np_fn: Callable[..., Any], torch_fn: Any,
                              domain: tuple[float, float], layout: Layout) -> None:
    for axis in (0, -1, None):
        check(lambda x, a=axis: fn(x, a, False), lambda x, a=axis: np_fn(x, a, False), [(3, 4)], grad=True,
              torch_fn=_torch_reduce(name, torch_fn, axis, False), layout=layout)


@pytest.mark.parametrize("name, fn, np_fn, torch_fn, domain", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reduce_0d(name: str, fn: Callable[..., Any], np_fn: Callable[..., Any], torch_fn: Any,
                   domain: tuple[float, float]) -> None:
    if name in ("var", "std"):
        return  # one element with correction=1: 0/0; checked in test_var_single_element
    check(lambda x: fn(x, None, False), lambda x: np_fn(x, None, False), [()], low=domain[0], high=domain[1],
          grad=True, torch_fn=_torch_reduce(name, torch_fn, None, False))


@pytest.mark.filterwarnings("ignore:.*(degrees of freedom|Degrees of freedom).*")
def test_var_single_element() -> None:
    with np.errstate(all="ignore"):
        check(lambda x: x.var(), lambda x: np.var(x, ddof=1), [(1,)], torch_fn=lambda x: x.var())
        check(lambda x: x.std(0), lambda x: np.std(x, axis=0, ddof=1), [(1, 3)], torch_fn=lambda x: x.std(0))


@pytest.mark.filterwarnings("ignore:Mean of empty slice")
@pytest.mark.parametrize("shape, axis", [((0,), None), ((2, 0), 1), ((2, 0), 0), ((0, 3), (0, 1))], ids=str)
def test_reduce_empty(shape: Shape, axis: Any) -> None:
    check(lambda x: x.sum(axis), lambda x: np.sum(x, axis), [shape], grad=True,
          torch_fn=lambda x: x.sum(axis) if axis is not None else x.sum())
    check(lambda x: x.prod(axis), lambda x: np.prod(x, axis), [shape], torch_fn=None)
    check(lambda x: x.any(axis), lambda x: np.any(x, axis), [shape], torch_fn=None)
    check(lambda x: x.all(axis), lambda x: np.all(x, axis), [shape], torch_fn=None)
    with np.errstate(all="ignore"):
        check(lambda x: x.mean(axis), lambda x: np.mean(x, axis), [shape], torch_fn=None)


def test_reduce_max_over_nonempty_axis_of_empty_tensor() -> None:
    check(lambda x: x.max(0), lambda x: np.max(x, 0), [(3, 0)], torch_fn=lambda x: x.amax(0))
    check(lambda x: x.argmax(0), lambda x: np.argmax(x, 0).astype(np.int32), [(3, 0)], torch_fn=None)


@pytest.mark.parametrize("np_dtype, sum_dtype", [
    (np.int32, dtypes.int32), (np.int8, dtypes.int32), (np.uint8, dtypes.uint32), (np.bool_, dtypes.int32),
    (np.int64, dtypes.int64), (np.int16, dtypes.int32), (np.float16, dtypes.float16), (np.float64, dtypes.float64),
], ids=lambda d: getattr(d, "name", None) or np.dtype(d).name)
def test_sum_dtypes(np_dtype: Any, sum_dtype: DType) -> None:
    """tinygrad's rule: ints sum in at least (u)int32, float16 sums in float32 and returns float16."""
    a = rand((4, 50), -50 if np.dtype(np_dtype).kind == "i" else 0, 60, np_dtype, seed=5) \
        if np.dtype(np_dtype).kind != "b" else rand((4, 50), dtype=np.bool_)
    for axis in (None, 1):
        out = T(a).sum(axis)
        assert out.dtype == sum_dtype
        expected = np.sum(a.astype(np.float64), axis=axis)
        _assert_close(out.numpy().astype(np.float64), expected, 0.5 if np_dtype == np.float16 else 1e-9, 1e-3,
                      "sum")
    assert T(a).sum(dtype=dtypes.float64).dtype == dtypes.float64


def test_sum_float16_accumulates_in_float32() -> None:
    a = np.full(4096, 1.0, np.float16)  # 4096 is beyond float16's exact integers when accumulated in float16 (2048)
    assert T(a).sum().item() == 4096.0


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_prod_of_half_types_keeps_the_dtype(dtype: DType) -> None:
    """prod of float16/bfloat16 accumulates in float32 and returns the input's dtype, as sum does (and PyTorch);
    it returned float32."""
    a = np.array([[1.5, 2.0, -3.0], [0.5, 4.0, 2.0]], np.float32)
    out = T(a, dtype=dtype).prod(1)
    assert out.dtype is dtype and T(a, dtype=dtype).prod().dtype is dtype
    np.testing.assert_allclose(out.float().numpy(), [-9.0, 4.0])
    assert T(a, dtype=dtype).prod(dtype=dtypes.float32).dtype is dtypes.float32
    if torch is not None:
        tdt = torch.float16 if dtype is dtypes.float16 else torch.bfloat16
        assert torch.tensor(a, dtype=tdt).prod(1).dtype is tdt


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16], ids=lambda d: d.name)
def test_mean_and_var_of_half_types_past_their_range(dtype: DType) -> None:
    """mean, var and std of float16/bfloat16 sum and divide in float32 and return the input's dtype (tinygrad and
    PyTorch): the mean of 70,000 float16 values was the half sum (inf) over the count cast to half (inf): NaN."""
    a = np.full((2, 70000), 1.5, np.float32)
    a[1, ::2] = 0.5
    t = T(a, dtype=dtype)
    mean, var, std = t.mean(1), t.var(1), t.std(1)
    assert mean.dtype is dtype and var.dtype is dtype and std.dtype is dtype
    np.testing.assert_allclose(mean.float().numpy(), [1.5, 1.0])
    np.testing.assert_allclose(var.float().numpy(), a.var(1, ddof=1), rtol=1e-2)
    np.testing.assert_allclose(std.float().numpy(), a.std(1, ddof=1), rtol=1e-2)
    assert t.mean().float().item() == 1.25
    if torch is not None:
        tt = torch.tensor(a).to(torch.float16 if dtype is dtypes.float16 else torch.bfloat16)
        np.testing.assert_allclose(mean.float().numpy(), tt.mean(1).float().numpy())
    x = T(np.array([1.0, 2.0, 4.0], np.float32), dtype=dtype, requires_grad=True)
    x.var().backward()
    assert x.grad is not None and x.grad.dtype is dtype
    np.testing.assert_allclose(x.grad.float().numpy(), [-4 / 3, -1 / 3, 5 / 3], rtol=1e-2)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64],
                         ids=lambda d: d.name)
def test_abs_of_signed_zeros_is_plus_zero(dtype: DType) -> None:
    """abs(+0) and abs(-0) are +0 (numpy, PyTorch): float16/bfloat16 compute in float32, which hid max(x, -x) from
    the renderer's fabs, and its select gave -0 for +0 (1 / abs(0) was -inf)."""
    out = T([0.0, -0.0, -1.5, float("nan"), -float("inf")], dtype=dtype).abs().float().numpy()
    np.testing.assert_array_equal(np.signbit(out), [False] * 5)
    np.testing.assert_array_equal(out, [0.0, 0.0, 1.5, np.nan, np.inf])
    assert (1 / T([0.0], dtype=dtype).abs()).float().item() == float("inf")


def test_prod_and_mean_dtypes() -> None:
    a = np.array([[1, -2, 3], [4, 5, -6]], np.int32)
    check(lambda x: x.prod(1), lambda x: np.prod(x, 1).astype(np.int32), inputs=[a], out_dtype=dtypes.int32)
    check(lambda x: x.mean(0), lambda x: np.mean(x, 0).astype(np.float32), inputs=[a], out_dtype=dtypes.float32,
          torch_fn=lambda x: x.float().mean(0))
    check(lambda x: x.max(1), lambda x: np.max(x, 1), inputs=[a], out_dtype=dtypes.int32,
          torch_fn=lambda x: x.amax(1))
    check(lambda x: x.min(), lambda x: np.min(x), inputs=[a], out_dtype=dtypes.int32)
    u = np.array([[3, 0, 255], [7, 9, 1]], np.uint8)
    check(lambda x: x.min(1), lambda x: np.min(x, 1), inputs=[u], out_dtype=dtypes.uint8, torch_fn=lambda x: x.amin(1))
    check(lambda x: x.max(0), lambda x: np.max(x, 0), inputs=[u], out_dtype=dtypes.uint8, torch_fn=lambda x: x.amax(0))
    b = np.array([[True, False], [True, True]])
    check(lambda x: x.max(1), lambda x: np.max(x, 1), inputs=[b], out_dtype=dtypes.bool, torch_fn=lambda x: x.amax(1))
    check(lambda x: x.min(1), lambda x: np.min(x, 1), inputs=[b], out_dtype=dtypes.bool, torch_fn=lambda x: x.amin(1))


def test_max_with_inf_and_ties_gradient() -> None:
    a = np.array([[1.0, 3.0, 3.0], [-np.inf, -np.inf, -5.0]], np.float32)
    out = T(a).max(1)
    np.testing.assert_array_equal(out.numpy(), [3.0, -5.0])
    x = T(np.array([1.0, 3.0, 3.0, 2.0], np.float32), requires_grad=True)
    x.max().backward()
    # ties share the gradient equally (what PyTorch does for max() without a dim)
    np.testing.assert_allclose(x.grad.numpy(), [0.0, 0.5, 0.5, 0.0])
    if torch is not None:
        tx = torch.tensor([1.0, 3.0, 3.0, 2.0], requires_grad=True)
        tx.max().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


@pytest.mark.parametrize("axis, keepdim", [(None, False), (None, True), (0, False), (1, True), (-1, False), (2, True)],
                         ids=str)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argmax_argmin(op: str, axis: int | None, keepdim: bool) -> None:
    a = rand((3, 4, 5), -3, 3, np.int32, seed=2).astype(np.float32)  # many ties: the first index must win
    np_fn = getattr(np, op)
    check(lambda x: getattr(x, op)(axis, keepdim), lambda x: np_fn(x, axis, keepdims=keepdim).astype(np.int32),
          inputs=[a], out_dtype=dtypes.int32, torch_fn=None)
    if torch is not None:
        t = getattr(torch.from_numpy(a), op)(axis, keepdim)
        np.testing.assert_array_equal(getattr(T(a), op)(axis, keepdim).numpy(), t.numpy())


@pytest.mark.parametrize("np_dtype", [np.int32, np.uint8, np.bool_, np.float16], ids=lambda d: np.dtype(d).name)
def test_argmax_dtypes(np_dtype: Any) -> None:
    a = rand((4, 6), 0, 5, np_dtype, seed=3) if np_dtype != np.float16 else rand((4, 6), dtype=np.float16)
    for axis in (0, 1, None):
        np.testing.assert_array_equal(T(a).argmax(axis).numpy(), np.argmax(a, axis))
        np.testing.assert_array_equal(T(a).argmin(axis).numpy(), np.argmin(a, axis))


def test_argmax_noncontiguous_and_special() -> None:
    for layout in LAYOUTS[1:]:
        check(lambda x: x.argmax(1), lambda x: np.argmax(x, 1).astype(np.int32), [(3, 5)], layout=layout,
              out_dtype=dtypes.int32)
    a = np.array([[-np.inf, -np.inf], [1.0, np.inf], [0.0, -0.0]], np.float32)
    np.testing.assert_array_equal(T(a).argmax(1).numpy(), np.argmax(a, 1))
    np.testing.assert_array_equal(T(a).argmin(1).numpy(), np.argmin(a, 1))
    assert T(np.float32(3.0)).argmax().item() == 0


@pytest.mark.parametrize("width", [2, 77, 1023, 1024])
@pytest.mark.parametrize("np_dtype", [np.float32, np.float64])
def test_max_and_argmax_of_rows_of_infinities(width: int, np_dtype: type) -> None:
    """Rows of -inf, of +inf, with one NaN, with one finite value, at widths no SIMD lane count divides (77, 1023):
    the CPU's `omp simd reduction(max:)` must not turn a row of -inf into -FLT_MAX (clang's identity), which argmax
    then fails to find (it returned the width, an index out of range)."""
    if np_dtype == np.float64 and DEVICE.startswith("METAL"):
        pytest.skip("Metal has no float64")
    a = np.full((5, width), -np.inf, np_dtype)
    a[1] = np.inf
    a[2, width // 2] = np.nan
    a[3, width - 1] = 1.0
    a[4, 0] = -1e30
    for op in ("max", "argmax", "min", "argmin"):
        got = getattr(T(a), op)(1).numpy()
        want = getattr(np, op)(a, 1)
        np.testing.assert_array_equal(got, want, err_msg=f"{op}, width {width}")


@pytest.mark.parametrize("axis, keepdim", [(None, False), (0, True), (-1, False), ((0, 1), False)], ids=str)
@pytest.mark.parametrize("op", ["any", "all"])
@pytest.mark.parametrize("np_dtype", [np.bool_, np.int32, np.float32], ids=lambda d: np.dtype(d).name)
def test_any_all(op: str, axis: Any, keepdim: bool, np_dtype: Any) -> None:
    a = (rand((3, 4), 0, 3, np.int32, seed=4) * (rand((3, 4), dtype=np.bool_, seed=5))).astype(np_dtype)
    a[0] = 1  # one row all true
    a[:, 0] = 0  # one column all false
    t_fn = (lambda x: getattr(x, op)(axis, keepdim=keepdim) if axis is not None else getattr(x, op)()) \
        if not isinstance(axis, tuple) else None
    check(lambda x: getattr(x, op)(axis, keepdim), lambda x: getattr(np, op)(x, axis, keepdims=keepdim),
          inputs=[a], out_dtype=dtypes.bool, torch_fn=t_fn)


@pytest.mark.parametrize("shape, axis", [((5,), 0), ((3, 4), 1), ((3, 4), 0), ((2, 3, 4), -2), ((), 0), ((0, 3), 1),
                                         ((3, 0), 1)], ids=str)
def test_cumsum(shape: Shape, axis: int) -> None:
    check(lambda x: x.cumsum(axis), lambda x: np.cumsum(x, axis) if x.ndim else x, [shape], grad=True,
          torch_fn=lambda x: x.cumsum(axis))


def test_cumsum_ints_and_views() -> None:
    a = rand((3, 5), -5, 5, np.int32)
    check(lambda x: x.cumsum(1), lambda x: np.cumsum(x, 1).astype(np.int32), inputs=[a], out_dtype=dtypes.int32,
          torch_fn=None)
    for layout in LAYOUTS[1:]:
        check(lambda x: x.cumsum(0), lambda x: np.cumsum(x, 0), [(4, 3)], grad=True, layout=layout)


def test_logsumexp_large_and_infinite() -> None:
    a = np.array([[1000.0, 1000.0], [-1000.0, -1e30], [-np.inf, -np.inf], [np.inf, 1.0]], np.float32)
    expected = np.array([1000.0 + np.log(2), -1000.0, -np.inf, np.inf], np.float32)
    np.testing.assert_allclose(T(a).logsumexp(1).numpy(), expected, rtol=1e-6)
    if torch is not None:
        np.testing.assert_allclose(T(a).logsumexp(1).numpy(), torch.from_numpy(a).logsumexp(1).numpy(), rtol=1e-6)


def test_reduce_large_sum_precision() -> None:
    a = rand((1000, 37), 0, 1, seed=8)
    check(lambda x: x.sum(0), lambda x: x.astype(np.float64).sum(0), inputs=[a], out_dtype=dtypes.float32,
          atol=1e-3, rtol=1e-5)
    check(lambda x: x.mean(), lambda x: x.astype(np.float64).mean(), inputs=[a], out_dtype=dtypes.float32,
          atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------- movement
MOVEMENT: list[tuple[str, Shape, Callable[[Any], Any], Callable[[Any], Any], Any]] = [
    # name, input shape, glassgrad fn, numpy fn, torch fn (SAME: the glassgrad one)
    ("reshape", (2, 3, 4), lambda x: x.reshape(4, 6), lambda x: x.reshape(4, 6), SAME),
    ("reshape_tuple", (2, 3, 4), lambda x: x.reshape((3, 8)), lambda x: x.reshape((3, 8)), SAME),
    ("reshape_-1", (2, 3, 4), lambda x: x.reshape(-1), lambda x: x.reshape(-1), SAME),
    ("reshape_-1_mid", (2, 3, 4), lambda x: x.reshape(2, -1, 2), lambda x: x.reshape(2, -1, 2), SAME),
    ("reshape_0d", (1, 1), lambda x: x.reshape(()), lambda x: x.reshape(()), SAME),
    ("reshape_from_0d", (), lambda x: x.reshape(1, 1, 1), lambda x: x.reshape(1, 1, 1), SAME),
    ("reshape_empty", (0, 4), lambda x: x.reshape(2, 0, 8), lambda x: x.reshape(2, 0, 8), SAME),
    ("view", (2, 6), lambda x: x.view(3, 4), lambda x: x.reshape(3, 4), SAME),
    # tinygrad's signatures are f(shape, *args): the keyword forms of its examples (minrf's reshape(shape=...))
    ("reshape_kw", (2, 3, 4), lambda x: x.reshape(shape=(4, 6)), lambda x: x.reshape(4, 6), SAME),
    ("view_kw", (2, 6), lambda x: x.view(shape=[3, 4]), lambda x: x.reshape(3, 4), None),
    ("expand_kw", (3, 1), lambda x: x.expand(shape=(3, 4)), lambda x: np.broadcast_to(x, (3, 4)), None),
    ("permute_kw", (2, 3, 4), lambda x: x.permute(order=(2, 0, 1)), lambda x: np.transpose(x, (2, 0, 1)), None),
    ("repeat_kw", (2, 3), lambda x: x.repeat(repeats=(2, 1)), lambda x: np.tile(x, (2, 1)), None),
    ("flip_varargs", (2, 3, 4), lambda x: x.flip(0, 2), lambda x: np.flip(x, (0, 2)), None),
    ("expand", (3, 1), lambda x: x.expand(2, 3, 4), lambda x: np.broadcast_to(x, (2, 3, 4)), SAME),
    ("expand_-1", (3, 1), lambda x: x.expand(-1, 5), lambda x: np.broadcast_to(x, (3, 5)), SAME),
    ("expand_0d", (), lambda x: x.expand(2, 2), lambda x: np.broadcast_to(x, (2, 2)), SAME),
    ("permute", (2, 3, 4), lambda x: x.permute(2, 0, 1), lambda x: np.transpose(x, (2, 0, 1)), SAME),
    ("permute_tuple_neg", (2, 3, 4), lambda x: x.permute((-1, 1, 0)), lambda x: np.transpose(x, (2, 1, 0)), SAME),
    ("transpose", (2, 3, 4), lambda x: x.transpose(0, 2), lambda x: np.swapaxes(x, 0, 2), SAME),
    ("transpose_neg", (2, 3, 4), lambda x: x.transpose(-1, -2), lambda x: np.swapaxes(x, -1, -2), SAME),
    ("transpose_default", (3, 4), lambda x: x.transpose(), lambda x: x.T, lambda x: x.transpose(0, 1)),
    ("T", (3, 4), lambda x: x.T, lambda x: x.T, SAME),
    ("T_1d", (4,), lambda x: x.T, lambda x: x.T, lambda x: x),
    ("flip", (2, 3, 4), lambda x: x.flip(1), lambda x: np.flip(x, 1), lambda x: x.flip(1)),
    ("flip_multi", (2, 3, 4), lambda x: x.flip((0, -1)), lambda x: np.flip(x, (0, -1)), SAME),
    ("flip_all", (2, 3), lambda x: x.flip(), lambda x: np.flip(x), lambda x: x.flip((0, 1))),
    ("pad", (2, 3), lambda x: x.pad(((1, 2), (0, 1))), lambda x: np.pad(x, ((1, 2), (0, 1))),
     lambda x: F.pad(x, (0, 1, 1, 2))),
    ("pad_value", (2, 3), lambda x: x.pad(((1, 0), (2, 1)), value=-1.5),
     lambda x: np.pad(x, ((1, 0), (2, 1)), constant_values=-1.5), lambda x: F.pad(x, (2, 1, 1, 0), value=-1.5)),
    ("pad_flat", (2, 3, 4), lambda x: x.pad((1, 1, 0, 2)), lambda x: np.pad(x, ((0, 0), (0, 2), (1, 1))),
     lambda x: F.pad(x, (1, 1, 0, 2))),
    ("pad_negative", (4, 5), lambda x: x.pad(((-1, 2), (1, -2))), lambda x: np.pad(x[1:, :-2], ((0, 2), (1, 0))),
     lambda x: F.pad(x, (1, -2, -1, 2))),
    ("pad_none", (3, 4), lambda x: x.pad((None, (1, 1))), lambda x: np.pad(x, ((0, 0), (1, 1))),
     lambda x: F.pad(x, (1, 1))),
    ("shrink", (4, 5), lambda x: x.shrink(((1, 3), (0, 4))), lambda x: x[1:3, 0:4], lambda x: x[1:3, 0:4]),
    ("shrink_none", (4, 5), lambda x: x.shrink((None, (2, 5))), lambda x: x[:, 2:5], lambda x: x[:, 2:5]),
    ("shrink_empty", (4, 5), lambda x: x.shrink(((2, 2), None)), lambda x: x[2:2], lambda x: x[2:2]),
    ("flatten", (2, 3, 4), lambda x: x.flatten(), lambda x: x.reshape(-1), SAME),
    ("flatten_range", (2, 3, 4, 5), lambda x: x.flatten(1, 2), lambda x: x.reshape(2, 12, 5), SAME),
    ("flatten_neg", (2, 3, 4), lambda x: x.flatten(-2), lambda x: x.reshape(2, 12), SAME),
    ("flatten_0d", (), lambda x: x.flatten(), lambda x: x.reshape(1), SAME),
    ("unflatten", (2, 12), lambda x: x.unflatten(1, (3, 4)), lambda x: x.reshape(2, 3, 4), SAME),
    ("unflatten_neg", (2, 12), lambda x: x.unflatten(-1, (2, 6)), lambda x: x.reshape(2, 2, 6), SAME),
    ("squeeze", (1, 3, 1, 4), lambda x: x.squeeze(), lambda x: np.squeeze(x), SAME),
    ("squeeze_dim", (1, 3, 1, 4), lambda x: x.squeeze(2), lambda x: np.squeeze(x, 2), SAME),
    ("squeeze_neg", (3, 1), lambda x: x.squeeze(-1), lambda x: np.squeeze(x, -1), SAME),
    ("squeeze_noop", (3, 4), lambda x: x.squeeze(0), lambda x: x, SAME),
    ("squeeze_0d", (), lambda x: x.squeeze(), lambda x: x, SAME),
    ("unsqueeze", (3, 4), lambda x: x.unsqueeze(0), lambda x: x[None], SAME),
    ("unsqueeze_mid", (3, 4), lambda x: x.unsqueeze(1), lambda x: x[:, None], SAME),
    ("unsqueeze_neg", (3, 4), lambda x: x.unsqueeze(-1), lambda x: x[..., None], SAME),
    ("unsqueeze_0d", (), lambda x: x.unsqueeze(0), lambda x: x.reshape(1), SAME),
    ("repeat", (2, 3), lambda x: x.repeat(2, 3), lambda x: np.tile(x, (2, 3)), SAME),
    ("repeat_new_dims", (2, 3), lambda x: x.repeat((2, 1, 2)), lambda x: np.tile(x, (2, 1, 2)), SAME),
    ("repeat_0d", (), lambda x: x.repeat(3), lambda x: np.tile(x, 3), SAME),
    ("repeat_zero", (2, 3), lambda x: x.repeat(0, 1), lambda x: np.tile(x, (0, 1)), SAME),
]


@pytest.mark.parametrize("name, shape, fn, np_fn, torch_fn", MOVEMENT, ids=[m[0] for m in MOVEMENT])
def test_movement(name: str, shape: Shape, fn: Callable[[Any], Any], np_fn: Callable[[Any], Any],
                  torch_fn: Any) -> None:
    check(fn, np_fn, [shape], grad=True, torch_fn=torch_fn)


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
@pytest.mark.parametrize("name, shape, fn, np_fn, torch_fn",
                         [m for m in MOVEMENT
                          if m[0] in ("reshape", "permute", "pad_value", "repeat", "flatten_range")],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_movement_noncontiguous(name: str, shape: Shape, fn: Callable[[Any], Any], np_fn: Callable[[Any], Any],
                                torch_fn: Any, layout: Layout) -> None:
    check(fn, np_fn, [shape], grad=True, torch_fn=torch_fn, layout=layout)


def test_movement_ints_and_bools() -> None:
    a = rand((2, 3), -5, 5, np.int32)
    b = rand((2, 3), dtype=np.bool_)
    for x in (a, b):
        dt = dtypes.from_np(x.dtype)
        check(lambda t: t.T.reshape(-1).flip(0), lambda t: np.flip(t.T.reshape(-1), 0), inputs=[x], out_dtype=dt)
        check(lambda t: t.pad(((1, 1), (0, 2))), lambda t: np.pad(t, ((1, 1), (0, 2))), inputs=[x], out_dtype=dt,
              torch_fn=lambda t: F.pad(t.int(), (0, 2, 1, 1)).to(t.dtype))
        check(lambda t: t.expand(2, 2, 3).repeat(1, 2, 1), lambda t: np.tile(np.broadcast_to(t, (2, 2, 3)), (1, 2, 1)),
              inputs=[x], out_dtype=dt)
    check(lambda t: t.pad(((1, 0), (0, 1)), value=7), lambda t: np.pad(t, ((1, 0), (0, 1)), constant_values=7),
          inputs=[a], out_dtype=dtypes.int32, torch_fn=lambda t: F.pad(t, (0, 1, 1, 0), value=7))
    check(lambda t: t.pad(((1, 0), (0, 1)), value=True), lambda t: np.pad(t, ((1, 0), (0, 1)), constant_values=True),
          inputs=[b], out_dtype=dtypes.bool, torch_fn=None)


CAT_CASES: list[tuple[str, list[Shape], int]] = [
    ("dim0", [(2, 3), (4, 3)], 0), ("dim1", [(2, 3), (2, 1), (2, 2)], 1), ("neg", [(2, 3, 4), (2, 3, 1)], -1),
    ("empty_piece", [(2, 3), (0, 3), (1, 3)], 0), ("1d", [(3,), (2,)], 0), ("single", [(2, 2)], 1),
]


@pytest.mark.parametrize("name, shapes, dim", CAT_CASES, ids=[c[0] for c in CAT_CASES])
def test_cat(name: str, shapes: list[Shape], dim: int) -> None:
    check(lambda *xs: xs[0].cat(*xs[1:], dim=dim), lambda *xs: np.concatenate(xs, dim), shapes, grad=True,
          torch_fn=lambda *xs: torch.cat(xs, dim))


def test_cat_dtypes_and_views() -> None:
    a = rand((2, 3), -5, 5, np.int32)
    b = rand((2, 3))
    check(lambda x, y: x.cat(y, dim=0), lambda x, y: np.concatenate([x.astype(np.float32), y]), inputs=[a, b],
          out_dtype=dtypes.float32, torch_fn=lambda x, y: torch.cat([x, y]))
    for layout in LAYOUTS[1:]:
        check(lambda x, y: x.cat(y, dim=1), lambda x, y: np.concatenate([x, y], 1), [(3, 2), (3, 4)], grad=True,
              layout=layout, torch_fn=lambda x, y: torch.cat([x, y], 1))


@pytest.mark.parametrize("shapes, dim", [([(2, 3), (2, 3)], 0), ([(2, 3), (2, 3), (2, 3)], 1), ([(3,), (3,)], -1),
                                         ([(), ()], 0), ([(2, 3)], 2)], ids=str)
def test_stack(shapes: list[Shape], dim: int) -> None:
    check(lambda *xs: Tensor.stack(*xs, dim=dim), lambda *xs: np.stack(xs, dim), shapes, grad=True,
          torch_fn=lambda *xs: torch.stack(xs, dim))
    check(lambda *xs: Tensor.stack(list(xs), dim=dim), lambda *xs: np.stack(xs, dim), shapes, torch_fn=None)


@pytest.mark.parametrize("shape, sizes, dim", [((6, 2), 2, 0), ((7, 2), 3, 0), ((2, 7), [2, 5], 1),
                                               ((2, 6), [1, 0, 5], -1),
                                               ((4, 3), 4, 0), ((4, 3), 10, 0)], ids=str)
def test_split(shape: Shape, sizes: int | list[int], dim: int) -> None:
    bounds = np.cumsum(sizes)[:-1] if isinstance(sizes, list) else list(range(sizes, shape[dim], sizes))
    check(lambda x: x.split(sizes, dim), lambda x: tuple(np.split(x, bounds, dim)), [shape], grad=True,
          torch_fn=lambda x: x.split(sizes, dim))


@pytest.mark.parametrize("shape, chunks, dim", [((6, 2), 3, 0), ((7, 2), 3, 0), ((2, 5), 2, 1), ((3, 4), 5, 0),
                                                ((3, 4), 1, -1)], ids=str)
def test_chunk(shape: Shape, chunks: int, dim: int) -> None:
    def np_chunk(x: np.ndarray) -> tuple[np.ndarray, ...]:
        n = x.shape[dim]
        size = math.ceil(n / chunks)
        return tuple(np.split(x, list(range(size, n, size)), dim))
    check(lambda x: x.chunk(chunks, dim), np_chunk, [shape], grad=True, torch_fn=lambda x: x.chunk(chunks, dim))


def test_gradient_through_realized_view() -> None:
    """A realized movement-only result (a flip of a leaf) must still carry gradient back to the leaf."""
    x = T(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    y = x.flip(0)
    y.realize()
    (y * T(np.array([1.0, 10.0, 100.0], np.float32))).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [100.0, 10.0, 1.0])


# ---------------------------------------------------------------------- indexing
def _idx(i: Any) -> str:
    return repr(i).replace("slice(None, None, None)", ":").replace("Ellipsis", "...")


GETITEM_BASIC: list[Any] = [
    1, -1, (0, 1), (-2, -1, -3), (1, 2, 3, 4), slice(None), slice(1, None), slice(None, -1), slice(None, None, -1),
    (slice(1, None, 2), slice(None, None, -2)), (slice(None, None, 3), slice(3, 0, -2), slice(None, None, -3)),
    slice(5, 1), slice(-100, 100), (slice(None), slice(4, 1, -1)), (Ellipsis, 1), (1, Ellipsis), (0, Ellipsis, 0),
    (Ellipsis,), None, (None, 0, None), (slice(None), None, 1, None), (Ellipsis, None), (),
    (1, slice(None, None, 2), -1),
    (slice(None, None, -1), slice(None, None, -1), slice(None, None, -1), slice(None, None, -1)),
    (slice(1, 2), slice(2, 3), slice(3, 4), slice(4, 5)), (slice(0, 0), 1), (slice(None, None, 7),),
    (slice(-1, -4, -1), Ellipsis, slice(-2, None)),
]
GETITEM_ADVANCED: list[Any] = [
    [1, 0], [-1, 0, 1], ([0, 1], [2, 0]), (slice(None), [0, 2, 2]), (0, slice(None), [1, 2]),
    ([0, 1], None, [0, 1]), (slice(None), [0, 1], [1, 2]), (slice(None), [0, 1], 1),
    (slice(None), [0, 1], slice(None), 1), (0, [0, 1]), (None, [0, 1], [1, 2]), ([0, 1], Ellipsis, [1, 2]),
    (slice(None), [[0], [1]], None, [1, 2]), ([[0, 1], [1, 0]],), (Ellipsis, [4, -5, 0]), ([1], [2], [3], [4]),
    (slice(None, None, -1), [2, 0], slice(1, None, 2)), ([], slice(None)), (np.array([1, 0]), 2),
    (slice(None), np.array([[-1]], dtype=np.int64)), ([0, 1], [[0], [2]], slice(None), [[4, 3]]),
]


# glassgrad places the broadcast dims as PyTorch and tinygrad do: ints are not advanced indices (they select first).
# numpy counts them as advanced, so where an int separates index arrays it puts the broadcast dims first
NUMPY_PLACES_DIFFERENTLY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    _idx((0, slice(None), [1, 2])): lambda x: x[0][:, [1, 2]],
    _idx((slice(None), [0, 1], slice(None), 1)): lambda x: x[:, :, :, 1][:, [0, 1]],
}


@pytest.mark.parametrize("index", GETITEM_BASIC + GETITEM_ADVANCED, ids=_idx)
def test_getitem(index: Any) -> None:
    torch_fn: Any = _torch_getitem(index) if _has_negative_step(index) else SAME
    np_fn = NUMPY_PLACES_DIFFERENTLY.get(_idx(index), lambda x: x[index])
    check(lambda x: x[index], np_fn, [(2, 3, 4, 5)], grad=True, torch_fn=torch_fn)


def _prime_allocator(nbytes: int, value: float = 7.0) -> None:
    """Leave a freed block of `nbytes` holding `value` in the allocator, so an unwritten output shows up as 7s."""
    block = Tensor.full((nbytes // 4,), value, device=DEVICE).contiguous().realize()
    del block


def test_pad_of_empty_input_buffer() -> None:
    """Regression: a kernel none of whose loads from an input survive simplification must still take (and skip)
    that buffer's parameter; once it did not, the launch arguments shifted and the output was never written."""
    ones = T(np.ones((2, 3), np.float32))
    empty = T(np.zeros((0, 3), np.float32))
    _prime_allocator(2 * 3 * 4)
    out = empty.pad(((0, 2), (0, 0))) + ones
    np.testing.assert_array_equal(out.numpy(), np.ones((2, 3), np.float32))


def test_empty_slice_gradient() -> None:
    """The gradient of x[5:1] pads an empty gradient: the same regression, through autograd."""
    x = T(rand((2, 3)), requires_grad=True)
    loss = (x[5:1] * T(np.zeros((0, 3), np.float32))).sum()
    _prime_allocator(2 * 3 * 4)
    (g,) = loss.gradient(x)
    np.testing.assert_array_equal(g.numpy(), np.zeros((2, 3), np.float32))


def _has_negative_step(index: Any) -> bool:
    return any(isinstance(i, slice) and i.step is not None and i.step < 0 for i in _as_tuple(index))


def _torch_getitem(index: Any) -> Callable[[Any], Any]:
    """PyTorch has no negative slice steps: flip the dim, then slice with the mirrored positive slice."""
    def fn(x: Any) -> Any:
        items, dim, out_index = list(_as_tuple(index)), 0, []
        consumed = sum(1 for i in items if i is not None and i is not Ellipsis)
        for i in items:
            if i is Ellipsis:
                out_index.append(i)
                dim += x.ndim - consumed
                continue
            if isinstance(i, slice) and i.step is not None and i.step < 0:
                start, stop, step = i.indices(x.shape[dim])
                n = x.shape[dim]
                x = x.flip(dim)
                i = slice(n - 1 - start, n - 1 - stop if stop >= 0 else None, -step)
            out_index.append(i)
            dim += i is not None
        return x[tuple(out_index)]
    return fn


@pytest.mark.parametrize("index", [(slice(None), slice(1, None, 2)), (Ellipsis, [2, 0]), ([1, 0], slice(None, 2))],
                         ids=_idx)
@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=repr)
def test_getitem_noncontiguous(index: Any, layout: Layout) -> None:
    check(lambda x: x[index], lambda x: x[index], [(3, 4)], grad=True, layout=layout)


def test_getitem_tensor_indices() -> None:
    a = rand((4, 5))
    i = np.array([[3, -1], [0, 2]], np.int32)
    j = np.array([4, 0], np.int64)
    check(lambda x, ii: x[ii], lambda x, ii: x[ii], inputs=[a, i], grad=True)
    check(lambda x, ii, jj: x[ii, jj], lambda x, ii, jj: x[ii, jj], inputs=[a, i, j], grad=True)
    check(lambda x, jj: x[1:, jj], lambda x, jj: x[1:, jj], inputs=[a, j], grad=True)
    check(lambda x, ii: x[ii, ii], lambda x, ii: x[ii, ii], inputs=[a[:, :4], i], grad=True)
    u = np.array([3, 0, 1], np.uint8)
    check(lambda x, uu: x[uu], lambda x, uu: x[uu], inputs=[a, u], grad=True, torch_fn=lambda x, uu: x[uu.long()])
    check(lambda x: x[T(2)], lambda x: x[2], inputs=[a], grad=True, torch_fn=None)
    check(lambda x: x[T(np.array([1, 3], np.int16)), T(np.array(-1, np.int32))], lambda x: x[[1, 3], -1],
          inputs=[a], grad=True, torch_fn=None)


def test_getitem_index_is_a_computed_tensor() -> None:
    a = rand((6, 3))
    idx = (Tensor.arange(3, device=DEVICE) * 2 - 1)  # [-1, 1, 3]: negative entries wrap
    np.testing.assert_array_equal(T(a)[idx].numpy(), a[[-1, 1, 3]])
    b = rand((2, 5))
    np.testing.assert_array_equal(T(b)[:, idx.flip(0)[:2]].numpy(), b[:, [3, 1]])


@pytest.mark.parametrize("np_dtype", [np.int32, np.bool_, np.float16, np.float64, np.uint8, np.int64],
                         ids=lambda d: np.dtype(d).name)
def test_getitem_dtypes(np_dtype: Any) -> None:
    a = rand((3, 4), -50, 50, np_dtype, seed=2)
    for index in [(1, slice(None, None, -2)), ([2, 0, 2], slice(1, 3)), (slice(None), [[3], [-4]]), (Ellipsis, None)]:
        out = T(a)[index]
        assert out.dtype == dtypes.from_np(np.dtype(np_dtype))
        np.testing.assert_array_equal(out.numpy(), a[index])


def test_getitem_0d_and_empty() -> None:
    s = np.float32(2.5)
    for index in [(), Ellipsis, None, (None, None), (Ellipsis, None)]:
        check(lambda x, i=index: x[i], lambda x, i=index: x[i], inputs=[np.array(s)], grad=True)
    e = np.zeros((0, 3), np.float32)
    for index in [slice(None), (slice(None), 1), (Ellipsis, [0, 2]), ([], slice(None))]:
        check(lambda x, i=index: x[i], lambda x, i=index: x[i], inputs=[e])
    z = rand((3, 0))
    check(lambda x: x[[0, 2]], lambda x: x[[0, 2]], inputs=[z])


def test_getitem_chained_and_with_ops() -> None:
    check(lambda x: (x[1:, ::-1] * 2)[0, [1, 0]] + x[-1, :2], lambda x: (x[1:, ::-1] * 2)[0, [1, 0]] + x[-1, :2],
          [(3, 4)], grad=True, torch_fn=lambda x: (x[1:].flip(1) * 2)[0, [1, 0]] + x[-1, :2])
    check(lambda x: x[::2].sum(0) + x[1::2].max(0), lambda x: x[::2].sum(0) + x[1::2].max(0), [(6, 3)], grad=True,
          torch_fn=lambda x: x[::2].sum(0) + x[1::2].amax(0))


def test_getitem_one_kernel() -> None:
    """The one-hot gather of advanced indexing fuses into a single reduction kernel."""
    from glassgrad import kernels
    x = T(rand((8, 6)))
    assert len(kernels(x[[1, 5, 2], 1:4])) == 1
    assert len(kernels(x[::-2, [0, 0, 3]])) == 1


@pytest.mark.parametrize("dim, index_shape", [(0, (2, 4)), (1, (3, 2)), (-1, (3, 7)), (0, (1, 1)), (1, (3, 0))],
                         ids=str)
def test_gather(dim: int, index_shape: Shape) -> None:
    a = rand((3, 4))
    size = a.shape[dim]
    idx = rand(index_shape, 0, size, np.int64, seed=3)
    check(lambda x, i: x.gather(dim, i), lambda x, i: np.take_along_axis(x[tuple(slice(0, s) if k != dim % 2 else
                                                                                  slice(None) for k, s in
                                                                                  enumerate(i.shape))], i, dim),
          inputs=[a, idx], grad=True, torch_fn=lambda x, i: x.gather(dim, i))


def test_gather_3d_and_views() -> None:
    a = rand((2, 3, 4))
    idx = rand((2, 3, 4), 0, 3, np.int32, seed=6)
    check(lambda x, i: x.gather(1, i), lambda x, i: np.take_along_axis(x, i, 1), inputs=[a, idx], grad=True,
          torch_fn=lambda x, i: x.gather(1, i.long()))
    for layout in LAYOUTS[1:]:
        check(lambda x: x.gather(0, T(np.array([[2, 0, 1], [1, 1, 0]], np.int32))),
              lambda x: np.take_along_axis(x, np.array([[2, 0, 1], [1, 1, 0]]), 0), [(3, 3)], grad=True,
              layout=layout, torch_fn=lambda x: x.gather(0, torch.tensor([[2, 0, 1], [1, 1, 0]])))


def _np_scatter(x: np.ndarray, dim: int, idx: np.ndarray, src: np.ndarray, reduce: str | None = None) -> np.ndarray:
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        target = list(pos)
        target[dim] = idx[pos]
        value = src[pos] if isinstance(src, np.ndarray) else src
        if reduce == "add":
            out[tuple(target)] += value
        elif reduce == "multiply":
            out[tuple(target)] *= value
        else:
            out[tuple(target)] = value
    return out


@pytest.mark.parametrize("reduce", [None, "add", "multiply"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter(dim: int, reduce: str | None) -> None:
    a = rand((3, 5))
    n = a.shape[dim]
    shape = (2, 3) if dim == 0 else (2, 4)
    if reduce is None:  # distinct targets along `dim`, so the result does not depend on write order
        lines = [np.random.default_rng(k).permutation(n)[:shape[dim]] for k in range(shape[1 - dim % 2])]
        idx = np.stack(lines, axis=1 - dim % 2).astype(np.int64)
    else:
        idx = rand(shape, 0, n, np.int64, seed=4)
    src = rand(idx.shape, seed=5)

    def np_fn(x: np.ndarray, s: np.ndarray) -> np.ndarray:
        return _np_scatter(x, dim % 2, idx, s, reduce)

    def t_fn(x: Any, s: Any) -> Any:
        i = torch.from_numpy(idx)
        if reduce is None:
            return x.scatter(dim, i, s)
        return x.scatter_reduce(dim, i, s, {"add": "sum", "multiply": "prod"}[reduce])

    check(lambda x, s: x.scatter(dim, T(idx), s, reduce=reduce), np_fn, inputs=[a, src],
          grad=reduce != "multiply", torch_fn=t_fn)


def test_scatter_repeated_targets_last_wins() -> None:
    """Without reduce, the last value scattered to a position along dim stays there (PyTorch's and tinygrad's CPU
    loops; PyTorch documents the order as unspecified)."""
    out = T(np.full(3, 5.0, np.float32)).scatter(0, T([0, 0, 2]), T([1.0, 2.0, 3.0]))
    np.testing.assert_array_equal(out.numpy(), [2.0, 5.0, 3.0])


def test_scatter_scalar_and_ints() -> None:
    a = rand((3, 4), -5, 5, np.int32)
    idx = np.array([[2, 0, 1, 1]], np.int64)
    check(lambda x: x.scatter(0, T(idx), 9), lambda x: _np_scatter(x, 0, idx, np.int32(9)), inputs=[a],
          out_dtype=dtypes.int32, torch_fn=lambda x: x.scatter(0, torch.from_numpy(idx), 9))
    check(lambda x: x.scatter(1, T(np.array([[3], [0]])), 1.5), lambda x: _np_scatter(x, 1, np.array([[3], [0]]), 1.5),
          [(2, 4)], grad=True, torch_fn=lambda x: x.scatter(1, torch.tensor([[3], [0]]), 1.5))


# ---------------------------------------------------------------------- functional
MATMUL_SHAPES: list[tuple[Shape, Shape]] = [
    ((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 2)), ((2, 3, 4), (2, 4, 5)), ((4,), (2, 4, 3)), ((2, 3, 4), (4,)), ((1, 1), (1, 1)),
    ((0, 4), (4, 3)), ((3, 0), (0, 2)), ((3, 4), (4, 0)),
]


@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes: tuple[Shape, Shape]) -> None:
    check(lambda a, b: a @ b, np.matmul, shapes, grad=True, atol=1e-5, rtol=1e-5)


def test_matmul_aliases_and_views() -> None:
    check(lambda a, b: a.matmul(b), np.matmul, [(3, 4), (4, 2)], grad=True)
    check(lambda a, b: a.dot(b), np.matmul, [(3, 4), (4, 2)], grad=True, torch_fn=lambda a, b: a @ b)
    check(lambda a, b: a.dot(b), np.dot, [(4,), (4,)], grad=True)
    for layout in LAYOUTS[1:]:
        check(lambda a, b: a @ b, np.matmul, [(3, 4), (4, 3)], grad=True, layout=layout)


@pytest.mark.parametrize("np_dtype, out", [(np.int32, dtypes.int32), (np.float16, dtypes.float16),
                                            (np.float64, dtypes.float64)], ids=lambda d: str(d))
def test_matmul_dtypes(np_dtype: Any, out: DType) -> None:
    a = rand((3, 5), -4, 4, np_dtype, seed=1)
    b = rand((5, 2), -4, 4, np_dtype, seed=2)
    got = T(a) @ T(b)
    assert got.dtype == out
    tol = 2e-2 if np_dtype == np.float16 else 1e-9
    _assert_close(got.numpy().astype(np.float64), a.astype(np.float64) @ b.astype(np.float64), tol, tol, "matmul")


def test_matmul_larger() -> None:
    check(lambda a, b: a @ b, np.matmul, [(33, 65), (65, 17)], atol=1e-4, rtol=1e-4)


def _np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    if x.size == 0:
        return x
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def _np_log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    if x.size == 0:
        return x
    s = x - x.max(axis, keepdims=True)
    return s - np.log(np.exp(s).sum(axis, keepdims=True))


@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((3, 5), 0), ((2, 3, 4), 1), ((5,), 0), ((), 0), ((2, 0), 1)],
                         ids=str)
def test_softmax_log_softmax(shape: Shape, axis: int) -> None:
    check(lambda x: x.softmax(axis), lambda x: _np_softmax(x, axis) if x.ndim else np.ones_like(x), [shape], grad=True,
          low=-4, high=4)
    check(lambda x: x.log_softmax(axis), lambda x: _np_log_softmax(x, axis) if x.ndim else np.zeros_like(x), [shape],
          grad=True, low=-4, high=4)


def test_softmax_extremes_and_views() -> None:
    a = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0], [5.0, 5.0, 5.0]], np.float32)
    check(lambda x: x.softmax(), _np_softmax, inputs=[a], torch_fn=lambda x: x.softmax(-1))
    check(lambda x: x.log_softmax(), _np_log_softmax, inputs=[a[[0, 2]]], torch_fn=lambda x: x.log_softmax(-1))
    for layout in LAYOUTS[1:]:
        check(lambda x: x.softmax(0), lambda x: _np_softmax(x, 0), [(4, 3)], grad=True, layout=layout)
    check(lambda x: x.softmax(), _np_softmax, inputs=[np.array([1, 2, 3], np.int32)], out_dtype=dtypes.float32,
          torch_fn=lambda x: x.float().softmax(-1))


def _np_cross_entropy(logits: np.ndarray, target: np.ndarray, reduction: str = "mean",
                      smoothing: float = 0.0) -> np.ndarray:
    """PyTorch's cross_entropy: (N, C, ...) logits with (N, ...) int targets or (N, C, ...) probabilities."""
    axis = 1 if logits.ndim > 1 else 0
    logp = _np_log_softmax(logits, axis)
    classes = logits.shape[axis]
    if target.dtype.kind in "iu":
        onehot = np.moveaxis(np.eye(classes, dtype=logits.dtype)[target], -1, axis)
    else:
        onehot = target
    onehot = onehot * (1 - smoothing) + smoothing / classes
    loss = -(logp * onehot).sum(axis)
    return {"mean": lambda v: v.mean(), "sum": lambda v: v.sum(), "none": lambda v: v}[reduction](loss)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("logit_shape, smoothing", [((4, 5), 0.0), ((4, 5), 0.1), ((2, 3, 4), 0.0), ((5,), 0.0)],
                         ids=str)
def test_cross_entropy_class_indices(logit_shape: Shape, smoothing: float, reduction: str) -> None:
    target_shape = logit_shape[:1] + logit_shape[2:] if len(logit_shape) > 1 else ()
    classes = logit_shape[1] if len(logit_shape) > 1 else logit_shape[0]
    y = rand(target_shape, 0, classes, np.int64, seed=9)
    check(lambda x, t: x.cross_entropy(t, reduction=reduction, label_smoothing=smoothing),
          lambda x, t: _np_cross_entropy(x, t, reduction, smoothing), inputs=[rand(logit_shape, -3, 3), y], grad=True,
          torch_fn=lambda x, t: F.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing))


def test_cross_entropy_probabilities() -> None:
    probs = _np_softmax(rand((4, 5), seed=3)).astype(np.float32)
    check(lambda x, p: x.cross_entropy(p), lambda x, p: _np_cross_entropy(x, p), inputs=[rand((4, 5)), probs],
          grad=True, torch_fn=lambda x, p: F.cross_entropy(x, p))
    check(lambda x, p: x.cross_entropy(p, reduction="none", label_smoothing=0.2),
          lambda x, p: _np_cross_entropy(x, p, "none", 0.2), inputs=[rand((4, 5)), probs], grad=True,
          torch_fn=lambda x, p: F.cross_entropy(x, p, reduction="none", label_smoothing=0.2))


def _np_sparse_ce(logits: np.ndarray, y: np.ndarray, ignore_index: int = -1, smoothing: float = 0.0,
                  reduction: str = "mean") -> np.ndarray:
    logp = _np_log_softmax(logits, -1)
    keep = y != ignore_index
    picked = np.take_along_axis(logp, np.where(keep, y, 0)[..., None], -1)[..., 0]
    loss = -((1 - smoothing) * picked + smoothing * logp.mean(-1)) * keep
    if reduction == "mean":
        return loss.sum() / max(keep.sum(), 1)
    return loss.sum() if reduction == "sum" else loss


@pytest.mark.parametrize("shape, ignore_index, smoothing, reduction", [
    ((4, 5), -1, 0.0, "mean"), ((4, 5), 2, 0.0, "mean"), ((2, 3, 4), -1, 0.1, "sum"), ((4, 5), -1, 0.0, "none"),
    ((4, 5), 1, 0.2, "mean"),
], ids=str)
def test_sparse_categorical_crossentropy(shape: Shape, ignore_index: int, smoothing: float, reduction: str) -> None:
    y = rand(shape[:-1], 0, shape[-1], np.int32, seed=4)
    y.reshape(-1)[0] = ignore_index if ignore_index >= 0 else y.reshape(-1)[0]

    def t_fn(x: Any, t: Any) -> Any:
        flat = F.cross_entropy(x.reshape(-1, shape[-1]), t.reshape(-1).long(), ignore_index=ignore_index,
                               reduction="none", label_smoothing=smoothing)
        return flat.reshape(t.shape) if reduction == "none" else flat.sum() if reduction == "sum" else \
            flat.sum() / (t != ignore_index).sum()

    check(lambda x, t: x.sparse_categorical_crossentropy(t, ignore_index, smoothing, reduction),
          lambda x, t: _np_sparse_ce(x, t, ignore_index, smoothing, reduction), inputs=[rand(shape, -3, 3), y],
          grad=True, torch_fn=t_fn)


@pytest.mark.parametrize("loss", ["sparse", "indices", "indices, weight", "indices, ignore_index"])
def test_cross_entropy_with_masked_classes_is_finite(loss: str) -> None:
    """Logits of -inf for classes that are not the target (a vocabulary mask) give PyTorch's finite loss and
    gradient. The one-hot was multiplied into the log-probabilities and the smoothing term was taken times 0:
    0 * -inf made both NaN."""
    logits = rand((4, 6), -3, 3, seed=11)
    labels = np.array([0, 5, 2, 2], np.int32)
    logits[0, 3] = logits[1, 0] = logits[3, [0, 1, 4]] = -np.inf
    weight = np.array([1, 2, 0.5, 1, 3, 1], np.float32)
    x = T(logits, requires_grad=True)
    out = {"sparse": lambda: x.sparse_categorical_crossentropy(T(labels)),
           "indices": lambda: x.cross_entropy(T(labels)),
           "indices, weight": lambda: x.cross_entropy(T(labels), weight=T(weight)),
           "indices, ignore_index": lambda: x.cross_entropy(T(labels), ignore_index=5)}[loss]()
    out.backward()
    w = weight[labels] if loss == "indices, weight" else (labels != 5).astype(np.float32) \
        if loss == "indices, ignore_index" else np.ones(4, np.float32)
    logp = _np_log_softmax(logits.astype(np.float64), -1)
    want_loss = -(logp[np.arange(4), labels] * w).sum() / w.sum()
    onehot = np.eye(6)[labels]
    want_grad = (np.exp(logp) - onehot) * w[:, None] / w.sum()
    np.testing.assert_allclose(out.numpy(), want_loss, rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), want_grad, atol=1e-6)
    if torch is not None:
        kw = {"weight": torch.tensor(weight)} if loss == "indices, weight" else \
            {"ignore_index": 5} if loss == "indices, ignore_index" else {}
        np.testing.assert_allclose(out.numpy(), F.cross_entropy(torch.tensor(logits), torch.tensor(labels).long(),
                                                                **kw).item(), rtol=1e-5)


def test_an_ignored_target_with_a_minus_inf_logit_is_skipped() -> None:
    """ignore_index names a class whose logit is -inf in an ignored row: the row is skipped (PyTorch), not 0 * inf."""
    logits = np.array([[0.5, -np.inf, 1.0], [2.0, 0.1, -np.inf]], np.float32)
    labels = np.array([0, 2], np.int32)
    want = -_np_log_softmax(logits[:1].astype(np.float64), -1)[0, 0]
    for loss in (lambda x: x.cross_entropy(T(labels), ignore_index=2),
                 lambda x: x.sparse_categorical_crossentropy(T(labels), ignore_index=2)):
        x = T(logits, requires_grad=True)
        out = loss(x)
        out.backward()
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
        assert np.isfinite(x.grad.numpy()).all() and not x.grad.numpy()[1].any()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_binary_crossentropy(reduction: str) -> None:
    def np_bce(p: np.ndarray, y: np.ndarray) -> np.ndarray:
        loss = -(y * np.maximum(np.log(p), -100) + (1 - y) * np.maximum(np.log(1 - p), -100))
        return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]

    def np_bce_logits(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        loss = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
        return {"mean": loss.mean(), "sum": loss.sum(), "none": loss}[reduction]

    y = rand((3, 4), 0, 1, seed=6)
    check(lambda p, t: p.binary_crossentropy(t, reduction), np_bce, inputs=[rand((3, 4), 0.05, 0.95), y], grad=True,
          torch_fn=lambda p, t: F.binary_cross_entropy(p, t, reduction=reduction))
    check(lambda x, t: x.binary_crossentropy_logits(t, reduction), np_bce_logits, inputs=[rand((3, 4), -4, 4), y],
          grad=True, torch_fn=lambda x, t: F.binary_cross_entropy_with_logits(x, t, reduction=reduction))


def test_binary_crossentropy_saturated() -> None:
    p = np.array([0.0, 1.0, 0.5], np.float32)
    y = np.array([1.0, 0.0, 1.0], np.float32)
    got = T(p).binary_crossentropy(T(y), "none").numpy()
    np.testing.assert_allclose(got, [100.0, 100.0, -np.log(0.5)], rtol=1e-6)
    x = np.array([100.0, -100.0, 0.0], np.float32)
    np.testing.assert_allclose(T(x).binary_crossentropy_logits(T(y), "none").numpy(),
                               [0.0, 0.0, np.log(2)], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(T(-x).binary_crossentropy_logits(T(y), "none").numpy(),
                               [100.0, 100.0, np.log(2)], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_classes", [-1, 4, 6])
def test_one_hot(num_classes: int) -> None:
    y = np.array([[0, 3], [1, 2], [3, 3]], np.int32)
    n = 4 if num_classes == -1 else num_classes
    check(lambda t: t.one_hot(num_classes), lambda t: np.eye(n, dtype=np.int32)[t], inputs=[y], out_dtype=dtypes.int32,
          torch_fn=lambda t: F.one_hot(t.long(), num_classes).int())


def test_one_hot_0d_and_empty() -> None:
    np.testing.assert_array_equal(T(2).one_hot(3).numpy(), [0, 0, 1])
    assert T(np.zeros((0,), np.int32)).one_hot(3).shape == (0, 3)


@pytest.mark.parametrize("shape, axis", [((3, 5), -1), ((2, 3, 4), (1, 2)), ((4,), 0), ((2, 3), None)], ids=str)
def test_layernorm(shape: Shape, axis: Any) -> None:
    def np_ln(x: np.ndarray) -> np.ndarray:
        mean = x.mean(axis, keepdims=True)
        var = ((x - mean) ** 2).mean(axis, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-5)
    normalized = shape[-1:] if axis in (-1, 0) else shape[1:] if axis == (1, 2) else shape
    check(lambda x: x.layernorm(axis), np_ln, [shape], grad=True, atol=1e-4, rtol=1e-4,
          torch_fn=lambda x: F.layer_norm(x, normalized, eps=1e-5))
    check(lambda x: x.layernorm(axis, eps=0.5), lambda x: (x - x.mean(axis, keepdims=True)) /
          np.sqrt(x.var(axis, keepdims=True) + 0.5), [shape], grad=True, atol=1e-4, rtol=1e-4,
          torch_fn=lambda x: F.layer_norm(x, normalized, eps=0.5))


def test_dropout() -> None:
    x = T(np.ones((100, 100), np.float32))
    np.testing.assert_array_equal(x.dropout(0.5).numpy(), np.ones((100, 100)))  # not training: identity
    with Tensor.train():
        out = x.dropout(0.25).numpy()
        assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
        kept = (out != 0).mean()
        assert 0.72 < kept < 0.78, kept
        np.testing.assert_array_equal(x.dropout(0.0).numpy(), np.ones((100, 100)))
        np.testing.assert_array_equal(x.dropout(1.0).numpy(), np.zeros((100, 100)))
        Tensor.manual_seed(3)
        a = x.dropout(0.5).numpy()
        Tensor.manual_seed(3)
        np.testing.assert_array_equal(a, x.dropout(0.5).numpy())
        w = T(rand((4, 5)), requires_grad=True)
        Tensor.manual_seed(4)
        y = w.dropout(0.5)
        y.sum().backward()
        mask = y.numpy() != 0
        np.testing.assert_allclose(w.grad.numpy(), mask * 2.0)
    assert not Tensor.training


def test_sequential() -> None:
    w1, w2 = rand((4, 3), seed=1), rand((3, 2), seed=2)
    layers = [lambda t: t @ T(w1), Tensor.relu, lambda t: t @ T(w2), lambda t: t.softmax()]
    check(lambda x: x.sequential(layers), lambda x: _np_softmax(np.maximum(x @ w1, 0) @ w2), [(5, 4)], grad=True,
          torch_fn=None)
    assert T(w1).sequential([]).shape == (4, 3)


def test_linear_and_training_step() -> None:
    """A tiny MLP: forward, backward, SGD step; loss goes down and gradients match PyTorch."""
    x, y = rand((8, 4), seed=1), rand((8,), 0, 3, np.int32, seed=2)
    w1, b1, w2 = rand((4, 6), -0.5, 0.5, seed=3), rand((6,), seed=4), rand((6, 3), -0.5, 0.5, seed=5)

    def model(xx: Any, a: Any, b: Any, c: Any) -> Any:
        return (xx @ a + b).relu() @ c

    params = [T(p, requires_grad=True) for p in (w1, b1, w2)]
    losses = []
    for _ in range(3):
        loss = model(T(x), *params).sparse_categorical_crossentropy(T(y))
        loss.backward()
        losses.append(loss.item())
        params = [T((p - 0.5 * p.grad).numpy(), requires_grad=True) for p in params]
    assert losses[2] < losses[0]
    if torch is not None:
        tp = [torch.tensor(p, requires_grad=True) for p in (w1, b1, w2)]
        t_loss = F.cross_entropy(model(torch.from_numpy(x), *tp), torch.from_numpy(y).long())
        t_loss.backward()
        assert abs(t_loss.item() - losses[0]) < 1e-5
        ps = [T(p, requires_grad=True) for p in (w1, b1, w2)]
        model(T(x), *ps).sparse_categorical_crossentropy(T(y)).backward()
        for ours, theirs in zip(ps, tp, strict=True):
            np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------------- extremes: integer limits, NaN, inf
I64 = np.array([2**40, -2**40, 2**62, 3], np.int64)
U32 = np.array([2**32 - 1, 2**31, 5, 0], np.uint32)
U64 = np.array([2**64 - 1, 2**63, 5], np.uint64)
I8 = np.array([-128, 127, -1, 0], np.int8)
I8_DIV = np.array([3, -3, 2, 5], np.int8)
U8 = np.array([0, 255, 128, 7], np.uint8)
I32_EXT = np.array([-2**31, 2**31 - 1, 0, -5], np.int32)
EXTREMES: list[tuple[str, Callable[[], Tensor], Callable[[], np.ndarray]]] = [
    ("i64 add", lambda: T(I64) + 1, lambda: I64 + 1),
    ("i64 mul", lambda: T(I64) * 3, lambda: I64 * 3),
    ("i64 sum", lambda: T(I64).sum(), lambda: I64.sum()),
    ("i64 max", lambda: T(I64).max(), lambda: I64.max()),
    ("i64 min", lambda: T(I64).min(), lambda: I64.min()),
    ("i64 argmax", lambda: T(I64).argmax(), lambda: np.int32(I64.argmax())),
    ("i64 floordiv", lambda: T(I64) // 7, lambda: I64 // 7),
    ("i64 mod", lambda: T(I64) % 7, lambda: I64 % 7),
    ("i64 compare", lambda: T(I64) > 2**41, lambda: I64 > 2**41),
    ("i64 shift", lambda: T(I64) >> 3, lambda: I64 >> 3),
    ("i64 cumsum", lambda: T(I64).cumsum(), lambda: np.cumsum(I64)),
    ("i64 to float64", lambda: T(I64).double(), lambda: I64.astype(np.float64)),
    ("u32 max", lambda: T(U32).max(), lambda: U32.max()),
    ("u32 min", lambda: T(U32).min(), lambda: U32.min()),
    ("u32 argmax", lambda: T(U32).argmax(), lambda: np.int32(U32.argmax())),
    ("u32 argmin", lambda: T(U32).argmin(), lambda: np.int32(U32.argmin())),
    ("u32 compare", lambda: T(U32) > 7, lambda: U32 > 7),
    ("u32 floordiv", lambda: T(U32) // 3, lambda: U32 // 3),
    ("u32 mod", lambda: T(U32) % 3, lambda: U32 % 3),
    ("u32 wraps", lambda: T(U32) + 1, lambda: U32 + np.uint32(1)),
    ("u32 sum wraps", lambda: T(U32).sum(), lambda: U32.sum().astype(np.uint32)),
    ("u32 shift", lambda: T(U32) >> 1, lambda: U32 >> 1),
    ("u32 to float", lambda: T(U32).float(), lambda: U32.astype(np.float32)),
    ("u64 max", lambda: T(U64).max(), lambda: U64.max()),
    ("u64 compare", lambda: T(U64) > T(np.full(3, 5, np.uint64)), lambda: U64 > 5),
    ("u64 floordiv", lambda: T(U64) // T(np.full(3, 3, np.uint64)), lambda: U64 // np.uint64(3)),
    ("u64 to float64", lambda: T(U64).double(), lambda: U64.astype(np.float64)),
    ("i32 min with INT_MIN", lambda: T(I32_EXT).min(), lambda: I32_EXT.min()),
    ("i32 max with INT_MAX", lambda: T(I32_EXT).max(), lambda: I32_EXT.max()),
    ("i32 argmin with INT_MIN", lambda: T(I32_EXT).argmin(), lambda: np.int32(I32_EXT.argmin())),
    ("i32 minimum with INT_MIN", lambda: T(I32_EXT).minimum(T(I32_EXT[::-1].copy())),
     lambda: np.minimum(I32_EXT, I32_EXT[::-1])),
    ("i32 min axis", lambda: T(I32_EXT.reshape(2, 2)).min(0), lambda: I32_EXT.reshape(2, 2).min(0)),
    ("i32 clip", lambda: T(I32_EXT).clip(-10, 10), lambda: np.clip(I32_EXT, -10, 10)),
    ("i8 invert", lambda: ~T(I8), lambda: ~I8),
    ("i8 neg wraps", lambda: -T(I8), lambda: -I8),
    ("i8 abs", lambda: T(I8).abs(), lambda: np.abs(I8)),
    ("i8 min", lambda: T(I8).min(), lambda: I8.min()),
    ("i8 shift right", lambda: T(I8) >> 2, lambda: I8 >> 2),
    ("i8 sum in int32", lambda: T(I8).sum(), lambda: np.int32(I8.astype(np.int32).sum())),
    ("i8 floordiv", lambda: T(I8) // T(I8_DIV), lambda: I8 // I8_DIV),
    ("i8 mod", lambda: T(I8) % T(I8_DIV), lambda: I8 % I8_DIV),
    ("u8 wraps below 0", lambda: T(U8) - 1, lambda: U8 - np.uint8(1)),
    ("u8 invert", lambda: ~T(U8), lambda: ~U8),
    ("u8 sum in uint32", lambda: T(U8).sum(), lambda: np.uint32(U8.astype(np.uint32).sum())),
    ("int pow negative exponent", lambda: T([2, -2, 1, -1, 0]) ** T([-1, -1, -3, -3, 2]),
     lambda: np.array([0, 0, 1, -1, 0], np.int32)),
]
NAN, INF = float("nan"), float("inf")
SPECIAL = np.array([NAN, INF, -INF, 0.0, -0.0, 1e-45, 70000.0, -1.5], np.float32)
TINY = np.array([1e-6, -3e-5, 1e-3, 0.2, 0.26, -1e-8, 2e-3, 0.0], np.float32)
FLOAT_EXTREMES: list[tuple[str, Callable[[], Tensor], Callable[[], np.ndarray]]] = [
    ("to bool", lambda: T(SPECIAL).bool(), lambda: SPECIAL.astype(bool)),
    ("to float16", lambda: T(SPECIAL).half(), lambda: SPECIAL.astype(np.float16)),
    ("to bfloat16", lambda: T(SPECIAL).cast(dtypes.bfloat16),
     lambda: np.array([NAN, INF, -INF, 0, -0.0, 0, 70144.0, -1.5], np.float32)),
    ("max with nan", lambda: T([1.0, NAN, 2.0]).max(), lambda: np.float32(NAN)),
    ("min with nan", lambda: T([1.0, NAN, 2.0]).min(), lambda: np.float32(NAN)),
    ("maximum with nan", lambda: T([1.0, NAN, NAN]).maximum(T([NAN, 1.0, NAN])),
     lambda: np.array([NAN, NAN, NAN], np.float32)),
    ("argmax with nan", lambda: T([1.0, NAN, 5.0, NAN]).argmax(), lambda: np.int32(1)),
    ("argmin with nan", lambda: T([[1.0, NAN, 0.0], [3.0, 2.0, 1.0]]).argmin(1), lambda: np.array([1, 2], np.int32)),
    ("relu nan", lambda: T([NAN, -1.0]).relu(), lambda: np.array([NAN, 0.0], np.float32)),
    ("clip nan", lambda: T([NAN, 5.0]).clip(0, 1), lambda: np.array([NAN, 1.0], np.float32)),
    ("sum with inf", lambda: T([INF, 1.0, -2.0]).sum(), lambda: np.float32(INF)),
    ("inf - inf", lambda: T([INF]).sum() - T([INF]).sum(), lambda: np.float32(NAN)),
    ("nan compare", lambda: T([NAN, 1.0]) == T([NAN, 1.0]), lambda: np.array([False, True])),
    ("nan ne", lambda: T([NAN, 1.0]) != T([NAN, 1.0]), lambda: np.array([True, False])),
    ("nan le", lambda: T([NAN, 1.0]) <= 1.0, lambda: np.array([False, True])),
    ("mod by zero", lambda: T([1.0]) % T([0.0]), lambda: np.array([NAN], np.float32)),
    ("floordiv by zero", lambda: T([1.0, -1.0]) // T([0.0, 0.0]), lambda: np.array([INF, -INF], np.float32)),
    ("float mod signs", lambda: T([-3.5, 3.5, -3.5, 3.5]) % T([2.0, -2.0, -2.0, 2.0]),
     lambda: np.array([0.5, -0.5, -1.5, 1.5], np.float32)),
    ("float pow edge", lambda: T([-2.0, 0.0, 0.0, 1.0]) ** T([0.5, 0.0, -1.0, INF]),
     lambda: np.array([NAN, 1.0, INF, 1.0], np.float32)),
    ("round huge", lambda: T(np.array([2.5e9, -1e20, 0.5], np.float32)).round(),
     lambda: np.array([2.5e9, -1e20, 0.0], np.float32)),
    ("floor huge", lambda: T(np.array([2.5e9, -1e20, -0.5], np.float32)).floor(),
     lambda: np.array([2.5e9, -1e20, -1.0], np.float32)),
    ("trunc/ceil of inf", lambda: T([INF, -INF, NAN]).ceil() + T([INF, -INF, NAN]).trunc(),
     lambda: np.array([INF, -INF, NAN], np.float32)),
    ("sigmoid saturates", lambda: T([100.0, -80.0, -1000.0]).sigmoid(),
     lambda: np.array([1.0, np.exp(-80.0), 0.0], np.float32)),  # e^-80 is tiny but a normal float32: kept
    ("tanh saturates", lambda: T([100.0, -100.0, 50.0]).tanh(), lambda: np.array([1.0, -1.0, 1.0], np.float32)),
    ("tanh near 0", lambda: T(TINY).tanh(), lambda: np.tanh(TINY.astype(np.float64)).astype(np.float32)),
    ("tanh near 0 float64", lambda: T(TINY.astype(np.float64)).tanh(), lambda: np.tanh(TINY.astype(np.float64))),
    ("softplus threshold", lambda: T([100.0, -100.0]).softplus(), lambda: np.array([100.0, 0.0], np.float32)),
    ("gelu saturates", lambda: T([-100.0, 100.0]).gelu(), lambda: np.array([0.0, 100.0], np.float32)),
    ("elu saturates", lambda: T([-100.0]).elu(), lambda: np.array([-1.0], np.float32)),
    ("rsqrt of 0", lambda: T([0.0]).rsqrt(), lambda: np.array([INF], np.float32)),
    ("log of 0 and -1", lambda: T([0.0, -1.0]).log(), lambda: np.array([-INF, NAN], np.float32)),
    ("log_softmax far apart", lambda: T([0.0, -200.0]).log_softmax(), lambda: np.array([0.0, -200.0], np.float32)),
    ("bce logits saturated", lambda: T([-100.0]).binary_crossentropy_logits(T([1.0]), "none"),
     lambda: np.array([100.0], np.float32)),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("name, fn, expected", EXTREMES + FLOAT_EXTREMES, ids=[e[0] for e in EXTREMES + FLOAT_EXTREMES])
def test_extremes(name: str, fn: Callable[[], Tensor], expected: Callable[[], np.ndarray]) -> None:
    out, want = fn(), np.asarray(expected())
    got = out.numpy()
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind in "iub":
        assert out.dtype == dtypes.from_np(want.dtype), (out.dtype, want.dtype)
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=1e-6, atol=0, equal_nan=True)


# ---------------------------------------------------------------------- autograd behaviour
def test_backward_accumulates_and_repeats() -> None:
    a = np.array([1.0, -2.0, 3.0], np.float32)
    x = T(a, requires_grad=True)
    (x * x).sum().backward()
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * a + 3)
    y = T(a, requires_grad=True)
    loss = y.sum()
    loss.backward()
    loss.backward()
    np.testing.assert_allclose(y.grad.numpy(), np.full(3, 2.0))


def test_backward_with_explicit_gradient_and_nonleaf() -> None:
    a = np.array([1.0, -2.0, 3.0], np.float32)
    x = T(a, requires_grad=True)
    (x * x).backward(T(np.array([1.0, 0.5, 0.0], np.float32)))
    np.testing.assert_allclose(x.grad.numpy(), 2 * a * np.array([1.0, 0.5, 0.0]))
    x = T(a, requires_grad=True)
    y = (x * 2).requires_grad_()
    (y * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), 4 * a)
    np.testing.assert_allclose(x.grad.numpy(), 8 * a)


def test_gradient_through_realized_intermediates() -> None:
    a = np.array([1.0, -2.0, 3.0], np.float32)
    x = T(a, requires_grad=True)
    y = (x * 2).realize()
    s = (x * 2).sum().realize()
    z = x + 0
    z.realize()
    ((y * y).sum() + s * z.sum()).backward()
    np.testing.assert_allclose(x.grad.numpy(), 8 * a + 2 * a.sum() + 2 * a.sum())


def test_no_grad_and_detach() -> None:
    from glassgrad import no_grad
    a = np.array([1.0, -2.0, 3.0], np.float32)
    x = T(a, requires_grad=True)
    with no_grad():
        w = (x * 5).realize()
    (w * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), 5 * a)


def test_pytorch_in_place_methods() -> None:
    """PyTorch's add_/sub_/mul_/div_/zero_/fill_/clamp_/copy_ and dim() (a training loop's `p.grad.zero_()`,
    `w.clamp_(-1, 1)`): they raised AttributeError. Each writes the tensor's buffer, through views too."""
    a = rand((2, 3))
    x = T(a).contiguous().realize()
    assert x.add_(1.0, alpha=2) is x
    np.testing.assert_allclose(x.numpy(), a + 2, rtol=1e-6)
    x.sub_(T(np.ones(3, np.float32)), alpha=0.5).mul_(3).div_(2)
    expected = (a + 2 - 0.5) * 3 / 2
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)
    x.clamp_(-1.0, 1.0)
    np.testing.assert_allclose(x.numpy(), np.clip(expected, -1, 1))
    x[0].fill_(7.0)
    x[:, 2].zero_()
    expected = np.clip(expected, -1, 1)
    expected[0], expected[:, 2] = 7.0, 0.0
    np.testing.assert_allclose(x.numpy(), expected)
    ints = T(np.zeros((2, 2), np.int32)).contiguous().realize()
    ints.copy_(T([1.7, -2.2]))
    assert ints.dtype is dtypes.int32 and ints.tolist() == [[1, -2], [1, -2]]
    assert x.dim() == 2 and T(1.0).dim() == 0
    if torch is not None:
        t = torch.tensor(a)
        t.add_(1.0, alpha=2).sub_(torch.ones(3), alpha=0.5).mul_(3).div_(2).clamp_(-1.0, 1.0)
        t[0].fill_(7.0)
        t[:, 2].zero_()
        np.testing.assert_allclose(x.numpy(), t.numpy(), rtol=1e-6)


def test_cat_and_stack_of_many_tensors() -> None:
    """cat/stack of many tensors (a list collected in a loop): 2,000 made one kernel of 2,001 buffers (a ctypes
    ArgumentError on the CPU; Metal allows 31), and every output element evaluated a gated load per input (a stack
    of 1,100 tensors summed took 12 minutes). They are joined in groups now; values and gradients as before."""
    n = 2000
    np.testing.assert_array_equal(Tensor.cat(*[T([float(i)]) for i in range(n)]).numpy(), np.arange(n))
    rows = [rand((3,), seed=i) for i in range(40)]
    ws = [T(r, requires_grad=True) for r in rows]
    out = Tensor.stack(*ws, dim=1)
    np.testing.assert_array_equal(out.numpy(), np.stack(rows, 1))
    (out * T(np.arange(40, dtype=np.float32))).sum().backward()
    for i, w in enumerate(ws):
        np.testing.assert_array_equal(w.grad.numpy(), np.full(3, float(i)))
    mixed = Tensor.cat(*[T([1, 2]) for _ in range(20)], T([1.5]))
    assert mixed.dtype is dtypes.float32 and mixed.numpy()[-3:].tolist() == [1.0, 2.0, 1.5]
    with pytest.raises(ValueError, match="zero-dimensional"):
        Tensor.cat(T(1.0), T(2.0))


def test_no_grad_results_left_lazy_carry_no_gradient() -> None:
    """A result made under no_grad() and not realized there (a target, a scale, a view) is cut from autograd as in
    PyTorch: it carried the gradient to the tensors it was computed from once backward() ran outside the block
    (w.grad came out 2y where PyTorch gives y)."""
    from glassgrad import no_grad
    a = rand((3, 4))

    def run(make: Callable[..., Any], ctx: Any) -> tuple[np.ndarray, ...]:
        w = make(a, requires_grad=True)
        with ctx():
            y, scale, view, nested = w * 2, w.abs().max(), w.T, (w * 3).exp().log()
        y_again = w * 2  # the same graph as y, made with gradients on: the gradient flows through this one
        loss = (y * y_again).sum() + (w / scale).sum() + (view.T * w).sum() + (nested * w).sum()
        loss.backward()
        return w.grad.numpy(), y.detach().numpy(), view.detach().numpy()
    ours = run(T, no_grad)
    expected = 2 * 2 * a + 1 / np.abs(a).max() + a + 3 * a  # y * 2 + 1/scale + view.T + nested
    np.testing.assert_allclose(ours[0], expected, rtol=1e-5)
    np.testing.assert_allclose(ours[1], 2 * a)
    np.testing.assert_allclose(ours[2], a.T)
    if torch is not None:
        np.testing.assert_allclose(ours[0], run(torch.tensor, torch.no_grad)[0], rtol=1e-5)
    # a view made under no_grad still writes the tensor it shows
    base = T(np.arange(3, dtype=np.float32)).contiguous().realize()
    with no_grad():
        part = base[1:]
    part[0] = 10.0
    assert base.tolist() == [0.0, 10.0, 2.0] and part.tolist() == [10.0, 2.0]


def test_second_order_gradient() -> None:
    a = np.array([1.0, -2.0, 3.0], np.float32)
    x = T(a, requires_grad=True)
    (g,) = (x * x * x).sum().gradient(x)
    (g2,) = g.sum().gradient(x)
    np.testing.assert_allclose(g.numpy(), 3 * a * a)
    np.testing.assert_allclose(g2.numpy(), 6 * a)


def test_sgd_loop_and_inplace_ops() -> None:
    a = np.array([1.0, -2.0, 3.0], np.float32)
    w = T(a, requires_grad=True)
    for _ in range(3):
        (w * w).sum().backward()
        w = (w - 0.1 * w.grad).detach().requires_grad_().realize()
    np.testing.assert_allclose(w.numpy(), a * 0.8 ** 3, rtol=1e-6)
    x = T(a.copy())
    x += 1
    x *= 2
    x -= 1
    x /= 4
    np.testing.assert_allclose(x.numpy(), ((a + 1) * 2 - 1) / 4)


def test_unused_target_gets_zero_gradient() -> None:
    x = T(np.ones(3, np.float32), requires_grad=True)
    y = T(np.ones(2, np.float32), requires_grad=True)
    gx, gy = (x * 2).sum().gradient(x, y)
    np.testing.assert_array_equal(gx.numpy(), [2.0, 2.0, 2.0])
    np.testing.assert_array_equal(gy.numpy(), [0.0, 0.0])


# ---------------------------------------------------------------------- sizes: threads, long graphs
def test_large_tensors() -> None:
    """Big enough to split kernels over threads (and to catch index arithmetic that only works for small sizes)."""
    a, b = rand((513, 301), seed=1), rand((301, 129), seed=2)
    check(lambda x: x * 2 + 1, lambda x: x * 2 + 1, inputs=[a], torch_fn=None)
    check(lambda x: (x.sum(0), x.sum(1), x.max(0), x.argmax(1)),
          lambda x: (x.sum(0), x.sum(1), x.max(0), x.argmax(1).astype(np.int32)), inputs=[a], atol=1e-3, rtol=1e-4,
          torch_fn=None)
    check(lambda x: x.T.contiguous(), lambda x: x.T, inputs=[a], torch_fn=None)
    check(lambda x: x[::-3, 5:200:7], lambda x: x[::-3, 5:200:7], inputs=[a], torch_fn=None)
    check(lambda x, y: x @ y, np.matmul, inputs=[a, b], atol=1e-3, rtol=1e-4)
    check(lambda x: x.softmax(0), lambda x: _np_softmax(x, 0), inputs=[a], atol=1e-6, rtol=1e-4,
          torch_fn=lambda x: x.softmax(0))
    idx = np.random.default_rng(3).integers(0, 513, 100)
    check(lambda x: x[idx], lambda x: x[idx], inputs=[a], torch_fn=None)
    c = rand((64, 3, 32, 32), seed=4)
    check(lambda x: (x.mean((0, 2, 3)), x.var((0, 2, 3))), lambda x: (x.mean((0, 2, 3)), x.var((0, 2, 3), ddof=1)),
          inputs=[c], atol=1e-4, rtol=1e-4, torch_fn=None)


def test_large_backward() -> None:
    a, b = rand((200, 150), seed=1), rand((150, 60), seed=2)
    x = T(a, requires_grad=True)
    (x.relu() @ T(b)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), (a > 0) * b.sum(1)[None, :], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("steps,scale,rtol", [(100, 1e-3, 1e-5), (1000, 1e-4, 1e-4)])
def test_deep_graph(steps: int, scale: float, rtol: float) -> None:
    """Up to 2000 ops fused into one kernel: lowering, simplifying and rendering must not recurse per graph level."""
    d = T(np.ones(3, np.float32))
    expected = np.ones(3, np.float64)
    for _ in range(steps):
        d = d * (1 + scale) + scale
        expected = expected * (1 + scale) + scale
    np.testing.assert_allclose(d.numpy(), expected, rtol=rtol)


# (name, fn, torch fn or SAME, input, expected gradient of fn(x).sum()): kinks, zeros and saturation, where a naive
# composite gives NaN (0 * inf) or splits a gradient that PyTorch gives whole
GRAD_EDGES: list[tuple[str, Callable[[Any], Any], Any, list[float], list[float]]] = [
    ("prod with one zero", lambda x: x.prod(), SAME, [0.0, 2.0, 3.0], [6.0, 0.0, 0.0]),
    ("prod with two zeros", lambda x: x.prod(), SAME, [0.0, 0.0, 3.0], [0.0, 0.0, 0.0]),
    ("prod rows with zeros", lambda x: x.reshape(2, 3).prod(1), SAME, [0.0, 2.0, 3.0, 0.0, 0.0, 5.0],
     [6.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
    ("pow 0 at 0", lambda x: x ** 0.0, SAME, [0.0, 2.0], [0.0, 0.0]),
    ("clip at bounds", lambda x: x.clip(0.0, 1.0), lambda x: x.clamp(0.0, 1.0), [0.0, 1.0, 0.5, -1.0, 2.0],
     [1.0, 1.0, 1.0, 0.0, 0.0]),
    ("clip min > max", lambda x: x.clip(1.0, 0.0), lambda x: x.clamp(1.0, 0.0), [0.0, 2.0], [0.0, 0.0]),
    ("std of constant", lambda x: x.std(), SAME, [1.0, 1.0], [0.0, 0.0]),
    ("sigmoid saturated", lambda x: x.sigmoid(), SAME, [100.0, -100.0, 0.0, -1000.0, 1000.0],
     [0.0, 0.0, 0.25, 0.0, 0.0]),
    ("tanh saturated", lambda x: x.tanh(), SAME, [100.0, -100.0, 0.0, 1e5, -1e5], [0.0, 0.0, 1.0, 0.0, 0.0]),
    ("gelu saturated", lambda x: x.gelu(), lambda x: F.gelu(x, approximate="tanh"), [100.0, -100.0, 1e5, 0.0],
     [1.0, 0.0, 1.0, 0.5]),
    ("silu saturated", lambda x: x.silu(), _tf("silu"), [100.0, -100.0, -1e5], [1.0, 0.0, 0.0]),
    ("softplus saturated", lambda x: x.softplus(), _tf("softplus"), [100.0, -100.0, -1e5], [1.0, 0.0, 0.0]),
    ("softplus at its threshold", lambda x: x.softplus(), _tf("softplus"), [20.0, 19.5], [1.0, 1.0]),
    ("softplus beta at its threshold", lambda x: x.softplus(beta=2.0, threshold=6.0),
     lambda x: F.softplus(x, beta=2.0, threshold=6.0), [3.0], [0.9975274]),
    ("logsigmoid at -threshold", lambda x: x.logsigmoid(), _tf("logsigmoid"), [-20.0], [1.0]),
    ("elu at 0 and saturated", lambda x: x.elu(), _tf("elu"), [100.0, -100.0, 0.0, 1e5], [1.0, 0.0, 1.0, 1.0]),
    ("relu/abs at 0", lambda x: x.relu() + x.abs(), SAME, [0.0], [0.0]),
    ("relu6 at its kinks", lambda x: x.relu6(), _tf("relu6"), [0.0, 6.0, 3.0, 7.0], [0.0, 0.0, 1.0, 0.0]),
    ("max ties", lambda x: x.max(), SAME, [1.0, 1.0, 0.0], [0.5, 0.5, 0.0]),
    ("maximum tie", lambda x: x.maximum(T(np.float32(1.0)) if isinstance(x, Tensor) else torch.tensor(1.0)), SAME,
     [1.0, 2.0], [0.5, 1.0]),
    ("log_softmax with -inf", lambda x: x.log_softmax(0), lambda x: x.log_softmax(0), [0.0, -INF, 1.0],
     [1 - 3 * 0.2689414, 1.0, 1 - 3 * 0.7310586]),
    ("bce logits saturated", lambda x: x.binary_crossentropy_logits(T([1.0, 0.0, 1.0]), "none"),
     lambda x: F.binary_cross_entropy_with_logits(x, torch.tensor([1.0, 0.0, 1.0]), reduction="none"),
     [0.0, 100.0, -100.0], [-0.5, 1.0, -1.0]),
]


@pytest.mark.parametrize("name, fn, torch_fn, values, expected", GRAD_EDGES, ids=[e[0] for e in GRAD_EDGES])
def test_gradient_edge_cases(name: str, fn: Callable[[Any], Any], torch_fn: Any, values: list[float],
                             expected: list[float]) -> None:
    x = T(np.array(values, np.float32), requires_grad=True)
    fn(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-5, atol=1e-6)
    if torch is not None:
        tx = torch.tensor(values, requires_grad=True)
        (fn if torch_fn is SAME else torch_fn)(tx).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_bce_of_saturated_probabilities_has_finite_gradient() -> None:
    """p exactly 0 or 1: the loss is the clamped 100; the gradient is finite (PyTorch gives +-1e12, we give 0)."""
    p = T(np.array([0.0, 1.0, 0.5], np.float32), requires_grad=True)
    loss = p.binary_crossentropy(T([1.0, 0.0, 1.0]), "none")
    np.testing.assert_allclose(loss.numpy(), [100.0, 100.0, np.log(2)], rtol=1e-6)
    loss.sum().backward()
    assert np.all(np.isfinite(p.grad.numpy()))
    np.testing.assert_allclose(p.grad.numpy()[2], -2.0, rtol=1e-6)


@pytest.mark.parametrize("np_dtype, op", [(np.int8, "mul_cast"), (np.int8, "mul_compare"), (np.int8, "mul_sum"),
                                          (np.uint8, "add_floordiv"), (np.int16, "mul_cast")],
                         ids=lambda v: np.dtype(v).name if isinstance(v, type) else v)
def test_narrow_int_arithmetic_wraps_inside_kernels(np_dtype: Any, op: str) -> None:
    a = np.array([100, -100, 7], np_dtype) if np.dtype(np_dtype).kind == "i" else np.array([200, 100, 7], np_dtype)
    if np_dtype == np.int16:
        a = a * np.int16(3)  # 300*300 overflows int16
    fns: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
        "mul_cast": (lambda x: (x * x).cast(dtypes.int32), lambda x: (x * x).astype(np.int32)),
        "mul_compare": (lambda x: (x * x) > 50, lambda x: (x * x) > 50),
        "mul_sum": (lambda x: (x * x).sum(), lambda x: np.int32((x * x).astype(np.int32).sum())),
        "add_floordiv": (lambda x: (x + x) // 2, lambda x: (x + x) // 2),
    }
    fn, np_fn = fns[op]
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(fn(T(a)).numpy(), np_fn(a))


COMPOSITIONS: list[tuple[str, list[Shape], Callable[..., Any], Callable[..., Any], Any]] = [
    # movement ops stacked on each other and on reductions: each becomes index arithmetic inside one kernel
    ("reshape of transpose", [(4, 6)], lambda x: x.T.reshape(4, 6), lambda x: x.T.reshape(4, 6), SAME),
    ("reshape of flip", [(4, 6)], lambda x: x.flip(1).reshape(2, 12), lambda x: np.flip(x, 1).reshape(2, 12), SAME),
    ("reshape of pad", [(4, 6)], lambda x: x.pad(((0, 0), (1, 1))).reshape(8, 4).sum(1),
     lambda x: np.pad(x, ((0, 0), (1, 1))).reshape(8, 4).sum(1), lambda x: F.pad(x, (1, 1)).reshape(8, 4).sum(1)),
    ("reshape of strided", [(4, 6)], lambda x: x[:, ::2].reshape(3, 4), lambda x: x[:, ::2].reshape(3, 4), SAME),
    ("reshape of expand", [(4, 1)], lambda x: x.expand(4, 6).reshape(3, 8),
     lambda x: np.broadcast_to(x, (4, 6)).reshape(3, 8), SAME),
    ("pad flip stride", [(4, 6)], lambda x: x.pad(((1, 2), (3, 0))).flip(0)[::2, 1:],
     lambda x: np.flip(np.pad(x, ((1, 2), (3, 0))), 0)[::2, 1:], None),
    ("permute reshape permute", [(2, 3, 4, 4)], lambda x: x.permute(0, 2, 3, 1).reshape(2, 16, 3).permute(2, 0, 1),
     lambda x: x.transpose(0, 2, 3, 1).reshape(2, 16, 3).transpose(2, 0, 1), SAME),
    ("avg and max pool", [(2, 3, 4, 4)],
     lambda x: (x.reshape(2, 3, 2, 2, 2, 2).mean((3, 5)), x.reshape(2, 3, 2, 2, 2, 2).max((3, 5))),
     lambda x: (x.reshape(2, 3, 2, 2, 2, 2).mean((3, 5)), x.reshape(2, 3, 2, 2, 2, 2).max((3, 5))),
     lambda x: (x.reshape(2, 3, 2, 2, 2, 2).mean((3, 5)), x.reshape(2, 3, 2, 2, 2, 2).amax((3, 5)))),
    ("conv1d by windows", [(10,), (3,)],
     lambda x, w: Tensor.stack(*[x.pad(((1, 1),))[i:i + 10] for i in range(3)], dim=1) @ w,
     lambda x, w: np.stack([np.pad(x, 1)[i:i + 10] for i in range(3)], 1) @ w,
     lambda x, w: torch.stack([F.pad(x, (1, 1))[i:i + 10] for i in range(3)], 1) @ w),
    ("normalise rows", [(4, 6)], lambda x: x / (x * x).sum(1, keepdim=True).sqrt(),
     lambda x: x / np.sqrt((x * x).sum(1, keepdims=True)), SAME),
    ("outer product of reductions", [(4, 6)], lambda x: x.sum(0).reshape(1, 6) * x.max(1).reshape(4, 1),
     lambda x: x.sum(0)[None] * x.max(1)[:, None], lambda x: x.sum(0).reshape(1, 6) * x.amax(1).reshape(4, 1)),
    ("softmax of transpose @", [(4, 6), (4, 5)], lambda x, y: x.T.softmax(0) @ y,
     lambda x, y: _np_softmax(x.T, 0) @ y, SAME),
    ("cat of reductions", [(4, 6)], lambda x: x.sum(0).cat(x.max(0)), lambda x: np.concatenate([x.sum(0), x.max(0)]),
     lambda x: torch.cat([x.sum(0), x.amax(0)])),
    ("var of padded", [(4, 6)], lambda x: x.pad(((0, 0), (2, 2)), value=1.0).var(1),
     lambda x: np.pad(x, ((0, 0), (2, 2)), constant_values=1.0).var(1, ddof=1),
     lambda x: F.pad(x, (2, 2), value=1.0).var(1)),
    ("gather of softmax", [(4, 6)], lambda x: x.softmax(1).gather(1, T(np.array([[0], [5], [2], [1]]))),
     lambda x: np.take_along_axis(_np_softmax(x, 1), np.array([[0], [5], [2], [1]]), 1),
     lambda x: x.softmax(1).gather(1, torch.tensor([[0], [5], [2], [1]]))),
    ("index of matmul", [(4, 6)], lambda x: (x @ x.T)[[0, 3], 1:], lambda x: (x @ x.T)[[0, 3], 1:], SAME),
]


@pytest.mark.parametrize("name, shapes, fn, np_fn, torch_fn", COMPOSITIONS, ids=[c[0] for c in COMPOSITIONS])
def test_compositions(name: str, shapes: list[Shape], fn: Callable[..., Any], np_fn: Callable[..., Any],
                      torch_fn: Any) -> None:
    check(fn, np_fn, shapes, grad=True, torch_fn=torch_fn, atol=1e-5, rtol=1e-4)
