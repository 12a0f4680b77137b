"""Functional NN ops on Tensor (glassgrad/tensor_nn.py): convolutions (1-D/2-D/3-D, transposed), pooling,
batchnorm, scaled dot-product attention, interpolate and embedding.

Every op is checked forward against a numpy reference written from the op's definition (always) and against
torch.nn.functional (when PyTorch is importable), and backward against PyTorch's gradients (when importable) and
always against central finite differences of the numpy reference in float64, so CI without PyTorch still checks
every gradient. The numpy references are also used by tests/test_nn.py.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from torch_optional import F, torch

from glassgrad import Device, Tensor, kernels

DEVICE = Device.DEFAULT


# ---------------------------------------------------------------------- numpy references (float32 or float64)
def _tup(v: int | Sequence[int], n: int) -> tuple[int, ...]:
    return (v,) * n if isinstance(v, int) else tuple(v)


def _pairs(padding: int | Sequence[int], n: int) -> list[tuple[int, int]]:
    """int, n ints, or 2n ints given per side with the last dim first (PyTorch's F.pad order)."""
    if isinstance(padding, int):
        return [(padding, padding)] * n
    p = list(padding)
    if len(p) == n:
        return [(v, v) for v in p]
    return [(p[2 * i], p[2 * i + 1]) for i in range(n)][::-1]


def np_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1, groups: int = 1) -> np.ndarray:
    """Cross-correlation by its definition: a sum over kernel taps of strided input slices times the tap."""
    n = w.ndim - 2
    st, dl = _tup(stride, n), _tup(dilation, n)
    x = np.pad(x, ((0, 0), (0, 0), *_pairs(padding, n)))
    batch, cout, cin_g, k = x.shape[0], w.shape[0], w.shape[1], w.shape[2:]
    out_sp = [(x.shape[2 + i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(n)]
    out = np.zeros((batch, groups, cout // groups, *out_sp), dtype=x.dtype)
    for tap in np.ndindex(*k):
        sl = tuple(slice(tap[i] * dl[i], tap[i] * dl[i] + (out_sp[i] - 1) * st[i] + 1, st[i]) for i in range(n))
        patch = x[(slice(None), slice(None), *sl)].reshape(batch, groups, cin_g, *out_sp)
        wt = w[(slice(None), slice(None), *tap)].reshape(groups, cout // groups, cin_g)
        out += np.einsum("ngc...,goc->ngo...", patch, wt)
    out = out.reshape(batch, cout, *out_sp)
    return out if b is None else out + b.reshape(1, -1, *([1] * n))


def np_conv_transpose(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, stride: Any = 1,
                      padding: Any = 0, output_padding: Any = 0, dilation: Any = 1, groups: int = 1) -> np.ndarray:
    """Transposed convolution by its definition: input element i of channel c scatters x * w[c, o, tap] to
    output position i*stride + tap*dilation - padding."""
    n = w.ndim - 2
    st, dl, op, pd = _tup(stride, n), _tup(dilation, n), _tup(output_padding, n), _tup(padding, n)
    batch, cin, sp = x.shape[0], x.shape[1], x.shape[2:]
    cout_g, k = w.shape[1], w.shape[2:]
    full_sp = [(sp[i] - 1) * st[i] + dl[i] * (k[i] - 1) + 1 + op[i] for i in range(n)]
    full = np.zeros((batch, groups, cout_g, *full_sp), dtype=x.dtype)
    xg = x.reshape(batch, groups, cin // groups, *sp)
    wg = w.reshape(groups, cin // groups, cout_g, *k)
    for tap in np.ndindex(*k):
        part = np.einsum("ngc...,gco->ngo...", xg, wg[(slice(None), slice(None), slice(None), *tap)])
        sl = tuple(slice(tap[i] * dl[i], tap[i] * dl[i] + (sp[i] - 1) * st[i] + 1, st[i]) for i in range(n))
        full[(slice(None), slice(None), slice(None), *sl)] += part
    crop = tuple(slice(pd[i], full_sp[i] - pd[i]) for i in range(n))
    out = full[(slice(None), slice(None), slice(None), *crop)].reshape(batch, groups * cout_g, *[
        full_sp[i] - 2 * pd[i] for i in range(n)])
    return out if b is None else out + b.reshape(1, -1, *([1] * n))


def _np_pool(x: np.ndarray, kernel: Any, stride: Any, padding: Any, dilation: Any, fill: float,
             reduce: Callable[..., np.ndarray]) -> np.ndarray:
    k = _tup(kernel, 2)
    st = k if stride is None else _tup(stride, 2)
    dl = _tup(dilation, 2)
    x = np.pad(x, ((0, 0), (0, 0), *_pairs(padding, 2)), constant_values=fill)
    out_sp = [(x.shape[2 + i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(2)]
    taps = [x[..., a * dl[0]:a * dl[0] + (out_sp[0] - 1) * st[0] + 1:st[0],
              c * dl[1]:c * dl[1] + (out_sp[1] - 1) * st[1] + 1:st[1]] for a in range(k[0]) for c in range(k[1])]
    return reduce(np.stack(taps), axis=0)


def np_max_pool(x: np.ndarray, kernel: Any = 2, stride: Any = None, padding: Any = 0, dilation: Any = 1) -> np.ndarray:
    return _np_pool(x, kernel, stride, padding, dilation, -np.inf, np.max)


def np_avg_pool(x: np.ndarray, kernel: Any = 2, stride: Any = None, padding: Any = 0,
                count_include_pad: bool = True) -> np.ndarray:
    total = _np_pool(x, kernel, stride, padding, 1, 0.0, np.sum)
    if count_include_pad:
        return total / math.prod(_tup(kernel, 2))
    return total / _np_pool(np.ones_like(x), kernel, stride, padding, 1, 0.0, np.sum)


def np_batchnorm(x: np.ndarray, weight: np.ndarray | None, bias: np.ndarray | None, mean: np.ndarray,
                 invstd: np.ndarray) -> np.ndarray:
    shape = (1, -1, *([1] * (x.ndim - 2)))
    out = (x - mean.reshape(shape)) * invstd.reshape(shape)
    out = out if weight is None else out * weight.reshape(shape)
    return out if bias is None else out + bias.reshape(shape)


def np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def np_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None,
                 is_causal: bool = False, scale: float | None = None) -> np.ndarray:
    scores = q @ np.swapaxes(k, -1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    if is_causal:
        mask = np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool))
    if mask is not None:
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    return np_softmax(scores) @ v


def _np_sources(size: int, out: int, mode: str, align_corners: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PyTorch's source indices (i0, i1) and weight of i1 for each output position, in float32 like PyTorch."""
    o = np.arange(out, dtype=np.float32)
    scale = np.float32(size / out)
    if mode == "nearest":
        i0 = np.minimum(np.floor(o * scale), size - 1).astype(np.int64)
        return i0, i0, np.zeros(out, np.float32)
    if mode == "nearest-exact":
        i0 = np.minimum(np.floor((o + np.float32(0.5)) * scale), size - 1).astype(np.int64)
        return i0, i0, np.zeros(out, np.float32)
    if align_corners:
        src = o * np.float32((size - 1) / (out - 1)) if out > 1 else np.zeros(out, np.float32)
    else:
        src = np.maximum((o + np.float32(0.5)) * scale - np.float32(0.5), np.float32(0))
    i0 = np.minimum(np.floor(src), size - 1).astype(np.int64)
    lam = np.clip(src - i0, 0, 1).astype(np.float32)
    return i0, np.minimum(i0 + 1, size - 1), lam


def np_interpolate(x: np.ndarray, size: Sequence[int], mode: str = "linear",
                   align_corners: bool = False) -> np.ndarray:
    """Resize the last len(size) dims one after another (linear interpolation is separable)."""
    for axis in range(x.ndim - len(size), x.ndim):
        out = size[axis - (x.ndim - len(size))]
        if out == x.shape[axis]:
            continue
        i0, i1, lam = _np_sources(x.shape[axis], out, mode, align_corners)
        shape = [1] * x.ndim
        shape[axis] = out
        lam_b = lam.reshape(shape).astype(x.dtype)
        x = np.take(x, i0, axis) * (1 - lam_b) + np.take(x, i1, axis) * lam_b if mode == "linear" else \
            np.take(x, i0, axis)
    return x


# ---------------------------------------------------------------------- the checker
def _rand(shape: Sequence[int], seed: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def numerical_grads(np_fn: Callable[..., np.ndarray], arrays: list[np.ndarray], wrt: Sequence[int],
                    weight: np.ndarray, eps: float = 1e-6) -> list[np.ndarray]:
    """Central finite differences of sum(np_fn(*arrays) * weight) in float64, for the arrays listed in `wrt`."""
    xs = [a.astype(np.float64) if i in wrt else a for i, a in enumerate(arrays)]
    grads = []
    for i in wrt:
        flat, g = xs[i].reshape(-1), np.zeros(xs[i].size)
        for j in range(flat.size):
            keep = flat[j]
            flat[j] = keep + eps
            up = float(np.sum(np_fn(*xs) * weight))
            flat[j] = keep - eps
            down = float(np.sum(np_fn(*xs) * weight))
            flat[j] = keep
            g[j] = (up - down) / (2 * eps)
        grads.append(g.reshape(xs[i].shape))
    return grads


def check(fn: Callable[..., Tensor], np_fn: Callable[..., np.ndarray], torch_fn: Callable[..., Any] | None,
          arrays: Sequence[np.ndarray], wrt: Sequence[int] | None = None, atol: float = 1e-5, rtol: float = 1e-4,
          grad_atol: float = 1e-4, grad_rtol: float = 1e-3, fd: bool = True) -> None:
    """fn on glassgrad tensors against np_fn on the arrays and torch_fn on torch tensors (when importable);
    then the gradients of sum(out * w) for the float arrays in `wrt` (default: all float arrays) against
    PyTorch's and against finite differences of np_fn in float64 (fd=False skips them for large inputs)."""
    arrays = [np.asarray(a) for a in arrays]
    if wrt is None:
        wrt = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"]
    leaves = [Tensor(a, device=DEVICE, requires_grad=True if i in wrt else None) for i, a in enumerate(arrays)]
    out = fn(*leaves)
    expected = np.asarray(np_fn(*arrays))
    got = out.numpy()
    assert got.shape == expected.shape, f"shape {got.shape} != numpy's {expected.shape}"
    np.testing.assert_allclose(got, expected, atol=atol, rtol=rtol, err_msg="forward vs numpy")
    weight = _rand(expected.shape, seed=77)
    t_leaves: list[Any] = []
    if torch is not None and torch_fn is not None:
        t_leaves = [torch.tensor(a, requires_grad=i in wrt) for i, a in enumerate(arrays)]
        t_out = torch_fn(*t_leaves)
        np.testing.assert_allclose(got, t_out.detach().numpy(), atol=atol, rtol=rtol, err_msg="forward vs torch")
        if wrt:
            (t_out * torch.tensor(weight)).sum().backward()
    if not wrt:
        return
    (out * Tensor(weight, device=DEVICE)).sum().backward()
    grads = [leaves[i].grad.numpy() if leaves[i].grad is not None else np.zeros(arrays[i].shape) for i in wrt]
    for i, g in zip(wrt, grads):
        assert g.shape == arrays[i].shape, f"grad of input {i}: shape {g.shape} != {arrays[i].shape}"
        if t_leaves:
            np.testing.assert_allclose(g, t_leaves[i].grad.numpy(), atol=grad_atol, rtol=grad_rtol,
                                       err_msg=f"grad of input {i} vs torch")
    if fd:
        for i, g, n in zip(wrt, grads, numerical_grads(np_fn, list(arrays), wrt, weight.astype(np.float64))):
            np.testing.assert_allclose(g, n, atol=grad_atol * 10, rtol=grad_rtol * 10,
                                       err_msg=f"grad of input {i} vs finite differences")


def _torch(name: str, **kwargs: Any) -> Callable[..., Any] | None:
    """F.<name>(*args, **kwargs), or None without PyTorch."""
    if F is None:
        return None
    fn = getattr(F, name)
    return lambda *args: fn(*args, **kwargs)


# ---------------------------------------------------------------------- convolutions
CONV2D_CASES = [
    # (x shape, w shape, bias, kwargs)
    ((2, 3, 7, 7), (4, 3, 3, 3), True, {}),
    ((1, 4, 8, 7), (6, 2, 3, 2), True, dict(stride=2, padding=1, groups=2)),
    ((2, 2, 9, 8), (3, 2, 3, 3), False, dict(dilation=2, padding=(2, 1))),
    ((1, 3, 6, 6), (3, 1, 2, 2), True, dict(stride=(1, 2), groups=3)),
    ((1, 2, 5, 6), (2, 2, 3, 3), True, dict(padding=(1, 0, 2, 1))),  # per side, last dim first
    ((2, 1, 5, 5), (2, 1, 1, 1), False, {}),
]


@pytest.mark.parametrize("xs, ws, bias, kw", CONV2D_CASES)
def test_conv2d(xs: tuple[int, ...], ws: tuple[int, ...], bias: bool, kw: dict[str, Any]) -> None:
    arrays = [_rand(xs, 0), _rand(ws, 1)] + ([_rand((ws[0],), 2)] if bias else [])
    pad = kw.get("padding", 0)
    if isinstance(pad, tuple) and len(pad) == 4:  # torch's conv2d takes no per-side padding: pad first
        torch_fn: Callable[..., Any] | None = None if F is None else \
            lambda x, w, *b: F.conv2d(F.pad(x, pad), w, *b, **{k: v for k, v in kw.items() if k != "padding"})
    else:
        torch_fn = None if F is None else lambda x, w, *b: F.conv2d(x, w, *b, **kw)
    check(lambda x, w, *b: x.conv2d(w, *b, **kw), lambda x, w, *b: np_conv(x, w, *b, **kw), torch_fn, arrays)


@pytest.mark.parametrize("kw", [{}, dict(stride=2, padding=1), dict(dilation=2, groups=2, padding=2)])
def test_conv1d_by_weight_rank(kw: dict[str, Any]) -> None:
    arrays = [_rand((2, 4, 11), 0), _rand((6, 4 // kw.get("groups", 1), 3), 1), _rand((6,), 2)]
    check(lambda x, w, b: x.conv2d(w, b, **kw), lambda x, w, b: np_conv(x, w, b, **kw), _torch("conv1d", **kw),
          arrays)


def test_conv3d_by_weight_rank() -> None:
    arrays = [_rand((1, 2, 4, 5, 4), 0), _rand((3, 2, 2, 3, 2), 1)]
    kw: dict[str, Any] = dict(padding=1, stride=(1, 2, 1))
    check(lambda x, w: x.conv2d(w, **kw), lambda x, w: np_conv(x, w, **kw), _torch("conv3d", **kw), arrays)


CONV_T_CASES = [
    # (x shape, w shape, kwargs) with w (Cin, Cout/groups, *k)
    ((2, 3, 4, 5), (3, 2, 3, 3), {}),
    ((1, 4, 4, 4), (4, 3, 3, 3), dict(stride=2, padding=1, output_padding=1)),
    ((1, 4, 3, 5), (4, 1, 3, 2), dict(stride=(2, 3), groups=2, dilation=(1, 2))),
    ((2, 2, 5, 4), (2, 2, 3, 3), dict(stride=2, padding=2, dilation=2, output_padding=(0, 1))),
    ((1, 2, 3, 3), (2, 3, 4, 4), dict(stride=3, padding=(1, 2))),
]


@pytest.mark.parametrize("xs, ws, kw", CONV_T_CASES)
@pytest.mark.parametrize("bias", [False, True])
def test_conv_transpose2d(xs: tuple[int, ...], ws: tuple[int, ...], kw: dict[str, Any], bias: bool) -> None:
    cout = ws[1] * kw.get("groups", 1)
    arrays = [_rand(xs, 0), _rand(ws, 1)] + ([_rand((cout,), 2)] if bias else [])
    check(lambda x, w, *b: x.conv_transpose2d(w, *b, **kw), lambda x, w, *b: np_conv_transpose(x, w, *b, **kw),
          None if F is None else lambda x, w, *b: F.conv_transpose2d(x, w, *b, **kw), arrays)


def test_conv_transpose1d_by_weight_rank() -> None:
    kw = dict(stride=2, padding=1, output_padding=1)
    arrays = [_rand((2, 3, 6), 0), _rand((3, 2, 3), 1), _rand((2,), 2)]
    check(lambda x, w, b: x.conv_transpose2d(w, b, **kw), lambda x, w, b: np_conv_transpose(x, w, b, **kw),
          _torch("conv_transpose1d", **kw), arrays)


def test_conv_and_conv_transpose_are_one_kernel_with_bias() -> None:
    x, w, b = Tensor(_rand((2, 3, 8, 8), 0)), Tensor(_rand((4, 3, 3, 3), 1)), Tensor(_rand((4,), 2))
    assert len(kernels(x.conv2d(w, b, padding=1, stride=2))) == 1
    wt = Tensor(_rand((3, 4, 3, 3), 1))
    assert len(kernels(x.conv_transpose2d(wt, b, stride=2, padding=1, output_padding=1))) == 1


@pytest.mark.parametrize("ws, kw", [((3, 2, 4, 2), dict(padding="same")),
                                     ((3, 2, 3, 4), dict(padding="same", dilation=2)),
                                     ((3, 2, 3, 3), dict(padding="valid", stride=2))])
def test_conv2d_takes_same_and_valid_padding(ws: tuple[int, ...], kw: dict[str, Any]) -> None:
    """F.conv2d's padding='same' (the odd pixel at the end) and 'valid': Tensor.conv2d crashed with "invalid literal
    for int()" (only nn.Conv2d took them)."""
    d = kw.get("dilation", 1)
    ref_pad = 0 if kw["padding"] == "valid" else \
        [p for k in reversed(ws[2:]) for p in (d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2)]
    ref_kw = {**kw, "padding": ref_pad}
    arrays = [_rand((1, 2, 6, 7), 0), _rand(ws, 1)]
    check(lambda x, w: x.conv2d(w, **kw), lambda x, w: np_conv(x, w, **ref_kw),
          None if F is None else lambda x, w: F.conv2d(x, w, **kw), arrays)
    if kw["padding"] == "same":
        assert Tensor(arrays[0]).conv2d(Tensor(arrays[1]), **kw).shape == (1, 3, 6, 7)


def test_conv_errors() -> None:
    x = Tensor(_rand((1, 4, 5, 5), 0))
    with pytest.raises(ValueError, match="channels"):
        x.conv2d(Tensor(_rand((2, 3, 3, 3), 1)))
    with pytest.raises(ValueError, match="output_padding"):
        x.conv_transpose2d(Tensor(_rand((4, 2, 3, 3), 1)), stride=2, output_padding=2)
    with pytest.raises(ValueError, match="channels"):
        x.conv_transpose2d(Tensor(_rand((3, 2, 3, 3), 1)))
    with pytest.raises(ValueError, match="stride"):
        x.conv2d(Tensor(_rand((2, 4, 3, 3), 1)), stride=0)
    with pytest.raises(ValueError, match="'same' needs stride 1"):
        x.conv2d(Tensor(_rand((2, 4, 3, 3), 1)), stride=2, padding="same")
    with pytest.raises(ValueError, match="'same' or 'valid'"):
        x.conv2d(Tensor(_rand((2, 4, 3, 3), 1)), padding="full")


# ---------------------------------------------------------------------- pooling
POOL_CASES = [
    dict(kernel=2), dict(kernel=3, stride=1), dict(kernel=3, stride=2, padding=1), dict(kernel=(2, 3), stride=(1, 2)),
    dict(kernel=(3, 2), stride=2, padding=(1, 0)), dict(kernel=2, stride=1, dilation=2),
    dict(kernel=3, stride=(2, 1), padding=1, dilation=(1, 2)),
    dict(kernel=2, stride=3), dict(kernel=(2, 3), stride=3, padding=1),  # windows that do not overlap, with gaps
]


@pytest.mark.parametrize("kw", POOL_CASES)
def test_max_pool2d(kw: dict[str, Any]) -> None:
    a = dict(kw)
    k = a.pop("kernel")
    check(lambda x: x.max_pool2d(k, **a), lambda x: np_max_pool(x, k, **a), _torch("max_pool2d", kernel_size=k, **a),
          [_rand((2, 3, 7, 8), 0)])


@pytest.mark.parametrize("kw", [c for c in POOL_CASES if "dilation" not in c])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(kw: dict[str, Any], count_include_pad: bool) -> None:
    a = dict(kw)
    k = a.pop("kernel")
    check(lambda x: x.avg_pool2d(k, count_include_pad=count_include_pad, **a),
          lambda x: np_avg_pool(x, k, count_include_pad=count_include_pad, **a),
          _torch("avg_pool2d", kernel_size=k, count_include_pad=count_include_pad, **a), [_rand((2, 3, 7, 8), 0)])


def test_gradient_of_a_pool_without_overlap_is_elementwise() -> None:
    """Windows that do not overlap are reshapes of the input, so the gradient needs no sum over the windows: an
    elementwise kernel that reads the max and its count per window."""
    x = Tensor(_rand((2, 3, 8, 8), 0), requires_grad=True)
    x.max_pool2d(2).sum().backward()
    assert x.grad is not None
    names = [k.name for k in kernels(x.grad)]
    assert names[-1].startswith("E_"), names


def test_pools_are_one_kernel() -> None:
    x = Tensor(_rand((2, 3, 8, 8), 0))
    assert len(kernels(x.max_pool2d(3, stride=2, padding=1))) == 1
    assert len(kernels(x.avg_pool2d(2))) == 1


# ---------------------------------------------------------------------- batchnorm
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 5), (2, 3, 4, 4)])
def test_batchnorm_functional(affine: bool, shape: tuple[int, ...]) -> None:
    c = shape[1]
    arrays = [_rand(shape, 0), _rand((c,), 1), _rand((c,), 2, 0.5, 2.0)]
    if affine:
        arrays += [_rand((c,), 3), _rand((c,), 4)]

    def gg(x: Tensor, mean: Tensor, invstd: Tensor, *wb: Tensor) -> Tensor:
        return x.batchnorm(*(wb or (None, None)), mean, invstd)

    def ref(x: np.ndarray, mean: np.ndarray, invstd: np.ndarray, *wb: np.ndarray) -> np.ndarray:
        return np_batchnorm(x, *(wb or (None, None)), mean, invstd)

    def tf(x: Any, mean: Any, invstd: Any, *wb: Any) -> Any:  # F.batch_norm cannot differentiate mean/var
        shape = (1, -1, *([1] * (x.ndim - 2)))
        out = (x - mean.reshape(shape)) * invstd.reshape(shape)
        return out * wb[0].reshape(shape) + wb[1].reshape(shape) if wb else out

    check(gg, ref, tf if F is not None else None, arrays, grad_atol=1e-3)


def test_batchnorm_functional_other_axis_and_errors() -> None:
    x, m, s = _rand((5, 4), 0), _rand((4,), 1), _rand((4,), 2, 0.5, 2)
    got = Tensor(x.T).batchnorm(None, None, Tensor(m), Tensor(s), axis=0).numpy()
    np.testing.assert_allclose(got, ((x - m) * s).T, rtol=1e-6)
    with pytest.raises(ValueError, match="mean"):
        Tensor(x).batchnorm(None, None, Tensor(_rand((3,), 1)), Tensor(s))


# ---------------------------------------------------------------------- attention
def _mask_case(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(glassgrad kwargs, numpy kwargs) for one masking case; torch takes the numpy kwargs as tensors."""
    if name == "bool":
        m = np.random.default_rng(5).random((4, 5)) > 0.4
        m[:, 0] = True  # no row fully masked
        return {"attn_mask": Tensor(m)}, {"mask": m}
    if name == "float":
        m = _rand((3, 4, 5), 5)
        return {"attn_mask": Tensor(m)}, {"mask": m}
    if name == "causal":
        return {"is_causal": True}, {"is_causal": True}
    if name == "scale":
        return {"scale": 0.3}, {"scale": 0.3}
    return {}, {}


@pytest.mark.parametrize("case", ["none", "bool", "float", "causal", "scale"])
def test_scaled_dot_product_attention(case: str) -> None:
    kw, np_kw = _mask_case(case)
    t_kw = {("attn_mask" if k == "mask" else k): (torch.tensor(v) if isinstance(v, np.ndarray) else v)
            for k, v in np_kw.items()} if torch is not None else {}
    arrays = [_rand((2, 3, 4, 6), 0), _rand((2, 3, 5, 6), 1), _rand((2, 3, 5, 7), 2)]
    check(lambda q, k, v: q.scaled_dot_product_attention(k, v, **kw), lambda q, k, v: np_attention(q, k, v, **np_kw),
          None if F is None else lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **t_kw), arrays)


def test_attention_dropout_follows_training() -> None:
    q, k, v = (Tensor(_rand((2, 4, 6), i)) for i in range(3))
    plain = q.scaled_dot_product_attention(k, v).numpy()
    np.testing.assert_allclose(q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy(), plain, rtol=1e-6)
    with Tensor.train():
        np.testing.assert_array_equal(q.scaled_dot_product_attention(k, v, dropout_p=1.0).numpy(), 0)
        dropped = q.scaled_dot_product_attention(k, v, dropout_p=0.5).numpy()
    assert np.isfinite(dropped).all() and not np.allclose(dropped, plain)


def test_attention_errors() -> None:
    q, k = Tensor(_rand((2, 4, 6), 0)), Tensor(_rand((2, 5, 6), 1))
    with pytest.raises(ValueError, match="key"):
        q.scaled_dot_product_attention(Tensor(_rand((2, 5, 3), 1)), k)
    with pytest.raises(ValueError, match="not both"):
        q.scaled_dot_product_attention(k, k, attn_mask=Tensor(np.ones((4, 5), bool)), is_causal=True)


# ---------------------------------------------------------------------- interpolate
INTERP_CASES = [((2, 2, 5, 7), size) for size in [(10, 14), (3, 4), (8, 9), (5, 20), (1, 1), (7, 3)]]


def _torch_interp(size: tuple[int, ...], mode: str, align_corners: bool) -> Callable[..., Any] | None:
    if F is None:
        return None
    tmode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(size)] if mode == "linear" else mode
    extra = {"align_corners": align_corners} if mode == "linear" else {}
    return lambda x: F.interpolate(x, size=size, mode=tmode, **extra)


@pytest.mark.parametrize("shape, size", INTERP_CASES)
@pytest.mark.parametrize("mode, align_corners", [("nearest", False), ("nearest-exact", False), ("linear", False),
                                                 ("linear", True)])
def test_interpolate_2d(shape: tuple[int, ...], size: tuple[int, ...], mode: str, align_corners: bool) -> None:
    check(lambda x: x.interpolate(size, mode, align_corners), lambda x: np_interpolate(x, size, mode, align_corners),
          _torch_interp(size, mode, align_corners), [_rand(shape, 0)], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("shape, size", [((2, 3, 6), (13,)), ((1, 2, 9), (4,)), ((1, 1, 3, 4, 5), (5, 2, 7))])
@pytest.mark.parametrize("mode, align_corners", [("nearest", False), ("linear", False), ("linear", True)])
def test_interpolate_1d_3d(shape: tuple[int, ...], size: tuple[int, ...], mode: str, align_corners: bool) -> None:
    check(lambda x: x.interpolate(size, mode, align_corners), lambda x: np_interpolate(x, size, mode, align_corners),
          _torch_interp(size, mode, align_corners), [_rand(shape, 0)], atol=1e-6, rtol=1e-5)


def test_interpolate_nearest_by_integer_factor_is_a_view_and_ints_work() -> None:
    x = np.arange(12, dtype=np.int32).reshape(1, 1, 3, 4)
    out = Tensor(x).interpolate((6, 12), mode="nearest")
    assert len(kernels(out)) == 1  # the copy that materialises the view: no reduce
    np.testing.assert_array_equal(out.numpy(), x.repeat(2, 2).repeat(3, 3))
    assert out.dtype == Tensor(x).dtype
    np.testing.assert_array_equal(Tensor(x).interpolate((2, 3), mode="nearest").numpy(),
                                  np_interpolate(x, (2, 3), "nearest"))


def test_interpolate_keeps_inf_local() -> None:
    x = np.zeros((1, 1, 1, 6), np.float32)
    x[..., 0] = np.inf
    got = Tensor(x).interpolate((1, 12)).numpy()
    np.testing.assert_array_equal(np.isinf(got), np.isinf(np_interpolate(x, (1, 12))))
    assert np.isfinite(got[..., 3:]).all()


def test_interpolate_errors() -> None:
    x = Tensor(_rand((1, 1, 4, 4), 0))
    with pytest.raises(ValueError, match="mode"):
        x.interpolate((2, 2), mode="cubic")
    with pytest.raises(ValueError, match="size"):
        x.interpolate((0, 2))
    with pytest.raises(ValueError, match="align_corners"):
        x.interpolate((8, 8), mode="nearest", align_corners=True)


# ---------------------------------------------------------------------- embedding
def test_embedding_forward_and_backward() -> None:
    idx = np.random.default_rng(0).integers(0, 10, (3, 4)).astype(np.int32)
    check(lambda w: Tensor(idx).embedding(w), lambda w: w[idx],
          None if F is None else lambda w: F.embedding(torch.tensor(idx, dtype=torch.int64), w), [_rand((10, 5), 1)])


def test_embedding_is_one_kernel_and_out_of_range_is_zero() -> None:
    w = Tensor(_rand((6, 3), 0))
    idx = Tensor(np.array([[0, 5], [6, -1]], np.int32))
    out = idx.embedding(w)
    assert len(kernels(out)) == 1
    got = out.numpy()
    np.testing.assert_array_equal(got[0], w.numpy()[[0, 5]])
    np.testing.assert_array_equal(got[1], 0)


def test_embedding_errors() -> None:
    with pytest.raises(TypeError, match="ints"):
        Tensor(_rand((3,), 0)).embedding(Tensor(_rand((4, 2), 1)))
    with pytest.raises(ValueError, match="vocab"):
        Tensor(np.array([1], np.int32)).embedding(Tensor(_rand((4,), 1)))


@pytest.mark.parametrize("a, b", list(itertools.combinations([1, 2, 3], 2)))
def test_pairs_helper_matches_conv2d_padding_forms(a: int, b: int) -> None:
    """The per-side padding form of the reference is the one Tensor.pad and conv2d use (left, right, top, bottom)."""
    x = _rand((1, 1, 4, 5), 0)
    w = _rand((1, 1, 1, 1), 1)
    got = Tensor(x).conv2d(Tensor(w), padding=(a, b, b, a)).numpy()
    np.testing.assert_allclose(got, np_conv(x, w, padding=(a, b, b, a)), rtol=1e-6)
    assert got.shape == (1, 1, 4 + b + a, 5 + a + b)
