"""Shape fuzzing: ops on shapes nobody tuned for, compared with numpy (float64) and, for gradients, with PyTorch.

Hypothesis draws an op family (reductions over negative/tuple axes with keepdim, softmax, cumsum, layernorm-like
chains, matmul/einsum with batch broadcasting, conv2d/conv_transpose2d/pools with odd strides, padding, dilation
and groups), a shape from odd sizes (0, 1, 3, 7, 17..31, 77, 100, 257, 1000, 1021) and a view that presents the
input non-contiguously (permuted, flipped, strided with positive or negative steps, padded, expanded, shrunk).
`derandomize=True` keeps CI reproducible; FUZZ_EXAMPLES=<n> runs more examples when hunting
(`FUZZ_EXAMPLES=300 CC=clang pytest tests/test_shape_fuzz.py`). Every bug the fuzz found has an explicit
regression test at the end of the file.

In: nothing (random inputs from a drawn seed). Out: pass/fail per op family.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch_optional import F, torch
from torch_pool_net import pool_outputs, windows_touch_input

from glassgrad import Device, Tensor, dtypes

DEVICE = Device.DEFAULT
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))
GRAD_ALWAYS = bool(os.environ.get("FUZZ_GRAD"))  # hunting: check every float32 reduction's gradient too
SIZES = (1, 2, 3, 5, 7, 17, 19, 23, 24, 29, 31, 77, 100, 257, 1000, 1021)
Shape = tuple[int, ...]


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings: `examples` (or FUZZ_EXAMPLES) examples, no deadline, derandomized for CI."""
    return settings(deadline=None, max_examples=EXAMPLES or examples, derandomize=not EXAMPLES,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much], print_blob=True)


# ---------------------------------------------------------------------- shapes and views
@st.composite
def shapes(draw: st.DrawFn, min_ndim: int = 0, max_ndim: int = 4, limit: int = 60_000, empty: bool = True) -> Shape:
    """A shape of odd sizes whose element count stays under `limit` (0-sized dims when `empty`)."""
    ndim = draw(st.integers(min_ndim, max_ndim))
    out: list[int] = []
    for _ in range(ndim):
        room = limit // max(1, math.prod(out))
        choices = [s for s in SIZES if s <= room] + ([0] if empty else [])
        out.append(draw(st.sampled_from(choices)))
    return tuple(out)


@dataclass(frozen=True)
class View:
    """One view applied to a base array/tensor: kind and its parameters. np_view, gg_view and torch_view give the
    same values from numpy arrays, glassgrad tensors and torch tensors (torch has no negative steps: flip+slice)."""
    kind: str
    arg: Any

    def np_view(self, a: np.ndarray) -> np.ndarray:
        if self.kind == "permute":
            return np.transpose(a, self.arg)
        if self.kind == "flip":
            return np.flip(a, self.arg)
        if self.kind in ("slice", "shrink"):
            return a[self._slices()]
        if self.kind == "pad":
            return np.pad(a, self.arg)
        if self.kind == "expand":
            return np.broadcast_to(a, self.arg)
        raise AssertionError(self.kind)

    def gg_view(self, t: Tensor) -> Tensor:
        if self.kind == "permute":
            return t.permute(self.arg)
        if self.kind == "flip":
            return t.flip(self.arg)
        if self.kind == "slice":
            return t[self._slices()]
        if self.kind == "shrink":
            return t.shrink(tuple((sl.start, sl.stop) for sl in self._slices()))
        if self.kind == "pad":
            return t.pad(self.arg)
        if self.kind == "expand":
            return t.expand(self.arg)
        raise AssertionError(self.kind)

    def torch_view(self, t: Any) -> Any:
        if self.kind == "permute":
            return t.permute(self.arg)
        if self.kind == "flip":
            return t.flip(self.arg) if self.arg else t
        if self.kind in ("slice", "shrink"):
            neg = tuple(i for i, (_, _, step) in enumerate(self.arg) if step < 0)
            if neg:  # a negative step: flip the axis and slice forwards from the mirrored start
                t = t.flip(neg)
            sl = []
            for i, (start, stop, step) in enumerate(self.arg):
                n = t.shape[i]
                if step < 0:
                    start, stop, step = n - 1 - start, (n - 1 - stop if stop is not None and stop >= 0 else None), -step
                sl.append(slice(start, stop, step))
            return t[tuple(sl)]
        if self.kind == "pad":
            return F.pad(t, [x for b, a in reversed(self.arg) for x in (b, a)])
        if self.kind == "expand":
            return t.expand(self.arg)
        raise AssertionError(self.kind)

    def _slices(self) -> tuple[slice, ...]:
        return tuple(slice(start, stop, step) for start, stop, step in self.arg)


@st.composite
def viewed(draw: st.DrawFn, shape: Shape, max_views: int = 2) -> tuple[Shape, list[View]]:
    """A base shape and views that turn a base of it into a tensor of `shape` (views applied in order)."""
    views: list[View] = []
    target = shape
    for _ in range(draw(st.integers(0, max_views))):
        kind = draw(st.sampled_from(["permute", "flip", "slice", "shrink", "pad", "expand"]))
        nd = len(target)
        if nd == 0:
            break
        if kind == "permute":  # base is target permuted by p; view permutes back
            p = draw(st.permutations(range(nd)))
            inverse = tuple(int(i) for i in np.argsort(p))
            views.insert(0, View("permute", inverse))
            target = tuple(target[i] for i in p)
        elif kind == "flip":
            axes = tuple(draw(st.lists(st.integers(-nd, nd - 1), max_size=nd, unique_by=lambda a, n=nd: a % n)))
            views.insert(0, View("flip", axes))
        elif kind in ("slice", "shrink"):  # every step-th element, from an offset, of a bigger base
            base, arg = [], []
            for s in target:
                step = draw(st.sampled_from([1, 2, 3] if kind == "slice" else [1]))
                off = draw(st.integers(0, 2))
                extra = draw(st.integers(0, 2))
                n = off + step * max(s - 1, 0) + (1 if s else 0) + extra
                backwards = kind == "slice" and s > 0 and draw(st.booleans())
                if backwards:  # a[start::-step] reads off+step*(s-1) .. off downwards
                    start = off + step * (s - 1)
                    stop = off - 1 if off - 1 >= 0 else None
                    arg.append((start, stop, -step))
                else:
                    arg.append((off, off + step * s, step))
                base.append(n)
            views.insert(0, View(kind, tuple(arg)))
            target = tuple(base)
        elif kind == "pad":  # the base is the inside; the border is zeros
            pads = []
            for s in target:
                p0 = draw(st.integers(0, min(2, s)))
                p1 = draw(st.integers(0, min(2, s - p0)))
                pads.append((p0, p1))
            views.insert(0, View("pad", tuple(pads)))
            target = tuple(s - a - b for s, (a, b) in zip(target, pads, strict=True))
        elif kind == "expand":  # some dims of size 1 in the base, broadcast to the target's size
            ones = draw(st.lists(st.booleans(), min_size=nd, max_size=nd))
            if not any(ones):
                continue
            views.insert(0, View("expand", target))
            target = tuple(1 if o else s for o, s in zip(ones, target, strict=True))
    return target, views


def apply_np(a: np.ndarray, views: Sequence[View]) -> np.ndarray:
    for v in views:
        a = v.np_view(a)
    return a


def apply_gg(t: Tensor, views: Sequence[View]) -> Tensor:
    for v in views:
        t = v.gg_view(t)
    return t


def apply_torch(t: Any, views: Sequence[View]) -> Any:
    for v in views:
        t = v.torch_view(t)
    return t


def random_array(shape: Shape, dtype: Any, seed: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(low), int(high) + 1, shape).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


@dataclass
class Input:
    """A drawn input: its base array, the views, and the viewed array (what the op sees)."""
    base: np.ndarray
    views: list[View]

    @property
    def value(self) -> np.ndarray:
        return np.array(apply_np(self.base, self.views))

    def gg(self, requires_grad: bool = False) -> tuple[Tensor, Tensor]:
        leaf = Tensor(self.base, device=DEVICE, requires_grad=requires_grad or None)
        return leaf, apply_gg(leaf, self.views)

    def torch(self, requires_grad: bool = False) -> tuple[Any, Any]:
        leaf = torch.from_numpy(np.array(self.base))
        if requires_grad:
            leaf.requires_grad_(True)
        return leaf, apply_torch(leaf, self.views)


@st.composite
def inputs(draw: st.DrawFn, shape: Shape, dtype: Any = np.float32, low: float = -2.0, high: float = 2.0,
           max_views: int = 2) -> Input:
    base_shape, views = draw(viewed(shape, max_views))
    seed = draw(st.integers(0, 2**16))
    return Input(random_array(base_shape, dtype, seed, low, high), views)


def assert_close(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float, what: str) -> None:
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind in "biu" and actual.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, expected, err_msg=what)
    else:
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), atol=atol, rtol=rtol,
                                   equal_nan=True, err_msg=what)


def check_grad(gg_fn: Callable[..., Tensor], torch_fn: Callable[..., Any], ins: Sequence[Input], out_shape: Shape,
               atol: float = 1e-3, rtol: float = 1e-3) -> None:
    """The gradient of sum(fn(views) * w) w.r.t. each base, glassgrad against PyTorch (skipped without it)."""
    if torch is None:
        return
    w = random_array(out_shape, np.float32, 7)
    leaves, views = zip(*(i.gg(True) for i in ins), strict=True)
    (gg_fn(*views).float() * Tensor(w, device=DEVICE)).sum().backward()
    t_leaves, t_views = zip(*(i.torch(True) for i in ins), strict=True)
    (torch_fn(*t_views).float() * torch.from_numpy(w)).sum().backward()
    for k, (leaf, t_leaf) in enumerate(zip(leaves, t_leaves, strict=True)):
        got = leaf.grad.numpy() if leaf.grad is not None else np.zeros(leaf.shape, np.float32)
        want = t_leaf.grad.numpy() if t_leaf.grad is not None else np.zeros(leaf.shape, np.float32)
        assert_close(got, want, atol, rtol, f"grad of input {k} vs torch")


# ---------------------------------------------------------------------- reductions and friends
REDUCE_OPS = ("sum", "max", "min", "mean", "prod", "argmax", "argmin", "std", "var", "softmax", "log_softmax",
              "cumsum", "layernorm", "chain", "logsumexp")
INT_OPS = ("sum", "max", "min", "prod", "argmax", "argmin", "cumsum")
HALF_OPS = ("sum", "max", "min", "mean", "softmax", "log_softmax", "cumsum", "argmax", "std")
SINGLE_AXIS = ("argmax", "argmin", "softmax", "log_softmax", "cumsum")


@st.composite
def axis_args(draw: st.DrawFn, ndim: int, op: str) -> Any:
    """None, one axis (negative too) or a tuple of distinct axes; single-axis ops get one int."""
    if op in SINGLE_AXIS or op == "layernorm":
        if ndim == 0:
            return None if op in ("argmax", "argmin") else 0
        axis = draw(st.integers(-ndim, ndim - 1))
        return draw(st.sampled_from([None, axis])) if op in ("argmax", "argmin") else axis
    choice = draw(st.integers(0, 2))
    if choice == 0 or ndim == 0:
        return None
    if choice == 1:
        return draw(st.integers(-ndim, ndim - 1))
    axes = draw(st.lists(st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim, unique_by=lambda a: a % ndim))
    return tuple(axes)


def _np_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))) if ndim else ()


def np_reduce(op: str, x: np.ndarray, axis: Any, keepdim: bool, correction: int) -> np.ndarray:
    """The numpy (float64 for floats) reference of a REDUCE_OPS entry."""
    if op in ("sum", "max", "min", "mean", "prod"):
        fn = {"sum": np.sum, "max": np.max, "min": np.min, "mean": np.mean, "prod": np.prod}[op]
        kw: dict[str, Any] = {"dtype": np.int64} if op in ("sum", "prod") and x.dtype.kind in "iu" else {}
        return np.asarray(fn(x, axis=axis, keepdims=keepdim, **kw))
    if op in ("std", "var"):
        n = math.prod(x.shape[a] for a in _np_axes(axis, x.ndim))
        with np.errstate(all="ignore"):
            squares = np.sum((x - x.mean(axis=axis, keepdims=True)) ** 2, axis=axis, keepdims=keepdim)
            v = squares / max(0, n - correction)
            return np.asarray(np.sqrt(v) if op == "std" else v)
    if op in ("argmax", "argmin"):
        fn = np.argmax if op == "argmax" else np.argmin
        return np.asarray(fn(x, axis=axis, keepdims=keepdim))
    if op == "logsumexp":
        m = np.max(x, axis=axis, keepdims=True) if x.size else 0
        with np.errstate(divide="ignore"):
            return np.asarray(np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m).sum(
                axis=axis if not keepdim else (), keepdims=keepdim)
    if op in ("softmax", "log_softmax"):
        if x.ndim == 0:
            return np.asarray({"softmax": 1.0, "log_softmax": 0.0}[op])
        m = np.max(x, axis=axis, keepdims=True) if x.shape[axis] else 0
        e = np.exp(x - m)
        s = e.sum(axis=axis, keepdims=True)
        return e / s if op == "softmax" else x - m - np.log(s)
    if op == "cumsum":
        if x.ndim == 0:
            return x
        return np.cumsum(x, axis=axis, dtype=np.int64 if x.dtype.kind in "iu" else None)
    if op == "layernorm":
        if x.ndim == 0:
            return np.asarray(np.nan)
        mu = x.mean(axis=axis, keepdims=True)
        with np.errstate(all="ignore"):
            return (x - mu) / np.sqrt(np.sum((x - mu) ** 2, axis=axis, keepdims=True) / max(0, x.shape[axis] - 1))
    if op == "chain":  # elementwise work before and after a reduction, and a broadcast back
        y = np.tanh(x * 1.5 - 0.25) + np.sqrt(np.abs(x))
        r = np.max(y, axis=axis, keepdims=True)  # of nothing: ValueError, as glassgrad's
        return np.sum(np.exp(y - r) * 0.5 + y, axis=axis, keepdims=keepdim)
    raise AssertionError(op)


def gg_reduce(op: str, x: Any, axis: Any, keepdim: bool, correction: int) -> Any:
    """The same op on a glassgrad or torch tensor (their APIs agree where this uses them)."""
    is_torch = torch is not None and isinstance(x, torch.Tensor)
    if op in ("sum", "max", "min", "mean", "prod"):
        if is_torch:
            if axis is None:
                axis = tuple(range(x.ndim))
            if op == "prod":
                axes = sorted(_np_axes(axis, x.ndim), reverse=True) if x.ndim else []
                for a in axes:
                    x = x.prod(a, keepdim=True)
                return x if keepdim or not axes else x.squeeze(tuple(axes))
            fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "mean": torch.mean}[op]
            return fn(x, dim=axis, keepdim=keepdim)
        return getattr(x, op)(axis, keepdim)
    if op in ("std", "var"):
        if is_torch:
            return getattr(x, op)(dim=axis, keepdim=keepdim, correction=correction)
        return getattr(x, op)(axis, keepdim, correction)
    if op in ("argmax", "argmin"):
        return getattr(x, op)(axis, keepdim=keepdim) if axis is not None or not is_torch else getattr(x, op)()
    if op in ("softmax", "log_softmax"):
        return getattr(x, op)(axis)
    if op == "logsumexp":
        if is_torch:
            return x.logsumexp(tuple(range(x.ndim)) if axis is None else axis, keepdim=keepdim)
        return x.logsumexp(axis, keepdim=keepdim)
    if op == "cumsum":
        return x.cumsum(axis)
    if op == "layernorm":
        return (x - x.mean(axis, keepdim=True)) / x.std(axis, keepdim=True)
    if op == "chain":
        y = (x * 1.5 - 0.25).tanh() + x.abs().sqrt()
        r = y.amax(axis if axis is not None else tuple(range(y.ndim)), keepdim=True) if is_torch else \
            y.max(axis, keepdim=True)
        s = (y - r).exp() * 0.5 + y
        if is_torch:
            return s.sum(dim=axis if axis is not None else tuple(range(s.ndim)), keepdim=keepdim)
        return s.sum(axis, keepdim)
    raise AssertionError(op)


def reduce_count(shape: Shape, op: str, axis: Any) -> int:
    return math.prod(shape[a] for a in _np_axes(axis, len(shape))) if op != "cumsum" else \
        (shape[axis] if shape else 1)


def run_reduce(op: str, dtype: Any, inp: Input, axis: Any, keepdim: bool, correction: int, grad: bool) -> None:
    """Run one reduction case against numpy (and its gradient against torch when `grad`)."""
    x = inp.value
    ref_in = x.astype(np.float64) if x.dtype.kind == "f" else x
    try:
        with np.errstate(all="ignore"):
            want = np_reduce(op, ref_in, axis, keepdim, correction)
    except ValueError:  # numpy refuses (max/argmax of nothing): not compared
        assume(False)
    _, t = inp.gg()
    got = gg_reduce(op, t, axis, keepdim, correction).numpy()
    if op == "layernorm" and x.size:  # rows of one repeated value (expanded): 0/0 in float64, rounding in float32
        flat = np.ptp(ref_in, axis=axis, keepdims=True) == 0
        want, got = np.where(flat, np.nan, want), np.where(flat, np.nan, got)
    n = max(1, reduce_count(x.shape, op, axis))
    if dtype == np.float16:
        atol, rtol = 2e-3 * math.sqrt(n) + 2e-3, 4e-3
    else:
        atol, rtol = 2e-6 * math.sqrt(n) + 1e-5, 1e-4
    if op == "prod":
        rtol = 1e-4 + 1e-6 * n
    if op in ("std", "var", "layernorm") and dtype == np.float32:
        atol, rtol = atol * 10, 1e-3
    assert_close(got, want, atol, rtol, f"{op}{x.shape} axis={axis} keepdim={keepdim} views={inp.views}")
    if (grad or GRAD_ALWAYS) and dtype == np.float32 and op not in ("argmax", "argmin") and x.size and n > 0:
        out_shape = np.asarray(want).shape
        check_grad(lambda v: gg_reduce(op, v, axis, keepdim, correction),
                   lambda v: gg_reduce(op, v, axis, keepdim, correction), [inp], out_shape,
                   atol=5e-3 if op in ("std", "var", "layernorm") else 1e-3, rtol=5e-3)


@st.composite
def reduce_cases(draw: st.DrawFn, dtype: Any) -> tuple[str, Input, Any, bool, int]:
    ops = INT_OPS if np.dtype(dtype).kind in "iu" else HALF_OPS if dtype == np.float16 else REDUCE_OPS
    op = draw(st.sampled_from(ops))
    limit = 4_000 if op == "cumsum" else 60_000
    shape = draw(shapes(min_ndim=1 if op == "layernorm" else 0, limit=limit))
    low, high = (-2.0, 2.0)
    if op == "prod":
        low, high = (-1, 2) if np.dtype(dtype).kind in "iu" else (0.9, 1.1)
        if np.dtype(dtype).kind in "iu":  # no int overflow (undefined in C): a product of at most 20 values
            assume(math.prod(shape) <= 20)
        else:  # float32's range: 17,000 factors in [0.9, 1.1] overflow or underflow in some order of products
            assume(math.prod(shape) <= 300)
    if np.dtype(dtype).kind in "iu" and op != "prod":
        low, high = -50, 50
    inp = draw(inputs(shape, dtype, low, high))
    axis = draw(axis_args(len(shape), op))
    keepdim = draw(st.booleans()) if op not in ("softmax", "log_softmax", "cumsum", "layernorm") else False
    correction = draw(st.sampled_from([0, 1]))
    return op, inp, axis, keepdim, correction


@given(reduce_cases(np.float32), st.booleans())
@fuzz_settings(60)
def test_fuzz_reduce_float32(case: tuple[str, Input, Any, bool, int], grad: bool) -> None:
    run_reduce(case[0], np.float32, *case[1:], grad=grad)


@given(reduce_cases(np.int32))
@fuzz_settings(25)
def test_fuzz_reduce_int32(case: tuple[str, Input, Any, bool, int]) -> None:
    run_reduce(case[0], np.int32, *case[1:], grad=False)


@given(reduce_cases(np.float16))
@fuzz_settings(20)
def test_fuzz_reduce_float16(case: tuple[str, Input, Any, bool, int]) -> None:
    run_reduce(case[0], np.float16, *case[1:], grad=False)


# ---------------------------------------------------------------------- matmul and einsum
@st.composite
def matmul_cases(draw: st.DrawFn) -> tuple[Input, Input]:
    """Two operands of odd sizes, 1-D to 4-D, with broadcast batch dims (either side may lack or have 1s)."""
    small = (1, 2, 3, 5, 7, 17, 24, 31, 77, 100)
    m, k, n = (draw(st.sampled_from(small + (257,))) for _ in range(3))
    assume(m * k * n <= 300_000)
    batch = tuple(draw(st.lists(st.sampled_from((1, 2, 3, 5)), max_size=2)))
    a_batch = tuple(b if draw(st.booleans()) else 1 for b in batch)[draw(st.integers(0, len(batch))):]
    b_batch = tuple(b if draw(st.booleans()) else 1 for b in batch)[draw(st.integers(0, len(batch))):]
    a_shape = (k,) if draw(st.integers(0, 5)) == 0 else a_batch + (m, k)
    b_shape = (k,) if draw(st.integers(0, 5)) == 0 else b_batch + (k, n)
    return draw(inputs(a_shape)), draw(inputs(b_shape))


@given(matmul_cases(), st.booleans())
@fuzz_settings(40)
def test_fuzz_matmul(case: tuple[Input, Input], grad: bool) -> None:
    a, b = case
    want = np.matmul(a.value.astype(np.float64), b.value.astype(np.float64))
    got = (a.gg()[1] @ b.gg()[1]).numpy()
    k = a.value.shape[-1]
    assert_close(got, want, 1e-5 * math.sqrt(k) * 4 + 1e-5, 1e-4, f"matmul {a.value.shape} @ {b.value.shape}")
    if grad:
        check_grad(lambda x, y: x @ y, lambda x, y: x @ y, [a, b], want.shape, atol=1e-3 * math.sqrt(k))


EINSUMS = [("ij,jk->ik", 2, 2), ("bij,bjk->bik", 3, 3), ("ij,ij->i", 2, 2), ("ij->ji", 2, 0), ("ii->i", 2, 0),
           ("i,j->ij", 1, 1), ("bhqd,bhkd->bhqk", 4, 4), ("...ij,...jk->...ik", 3, 3), ("ijk->", 3, 0),
           ("ij,kj->ik", 2, 2)]


@st.composite
def einsum_cases(draw: st.DrawFn) -> tuple[str, list[Input]]:
    formula, _, _ = draw(st.sampled_from(EINSUMS))
    sizes: dict[str, int] = {}
    small = (1, 2, 3, 7, 17, 24, 31)
    lhs = formula.split("->")[0].replace("...", "z")
    for letter in sorted(set(lhs) - {","}):
        sizes[letter] = draw(st.sampled_from(small))
    ops = [draw(inputs(tuple(sizes[c] for c in term))) for term in lhs.split(",")]
    return formula, ops


@given(einsum_cases())
@fuzz_settings(20)
def test_fuzz_einsum(case: tuple[str, list[Input]]) -> None:
    formula, ops = case
    want = np.einsum(formula, *[o.value.astype(np.float64) for o in ops])
    got = Tensor.einsum(formula, *[o.gg()[1] for o in ops]).numpy()
    assert_close(got, want, 1e-4, 1e-4, f"einsum {formula} {[o.value.shape for o in ops]}")


# ---------------------------------------------------------------------- convolutions and pools
def np_conv2d(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], padding: tuple[int, int],
              dilation: tuple[int, int], groups: int) -> np.ndarray:
    """Direct 2-D convolution (cross-correlation, as PyTorch) in float64: x (N, Cin, H, W), w (Cout, Cin/g, kh, kw)."""
    n, cin, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    oh = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, cout, oh, ow))
    og = cout // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og]
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilation[0], j * dilation[1]
                patch = xs[:, :, r0:r0 + stride[0] * (oh - 1) + 1:stride[0], c0:c0 + stride[1] * (ow - 1) + 1:stride[1]]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def np_conv_transpose2d(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], padding: tuple[int, int],
                        dilation: tuple[int, int], groups: int, output_padding: tuple[int, int]) -> np.ndarray:
    """Transposed convolution in float64: x (N, Cin, H, W), w (Cin, Cout/g, kh, kw), scattered then cropped."""
    n, cin, h, wd = x.shape
    _, og, kh, kw = w.shape
    full_h = (h - 1) * stride[0] + dilation[0] * (kh - 1) + 1 + output_padding[0]
    full_w = (wd - 1) * stride[1] + dilation[1] * (kw - 1) + 1 + output_padding[1]
    out = np.zeros((n, og * groups, full_h, full_w))
    cg = cin // groups
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilation[0], j * dilation[1]
                contrib = np.einsum("nchw,co->nohw", x[:, g * cg:(g + 1) * cg], w[g * cg:(g + 1) * cg, :, i, j])
                out[:, g * og:(g + 1) * og, r0:r0 + stride[0] * (h - 1) + 1:stride[0],
                    c0:c0 + stride[1] * (wd - 1) + 1:stride[1]] += contrib
    return out[:, :, padding[0]:full_h - padding[0] if padding[0] else full_h,
               padding[1]:full_w - padding[1] if padding[1] else full_w]


_pool_geometry = pool_outputs


def np_pool2d(x: np.ndarray, kind: str, k: tuple[int, int], s: tuple[int, int], p: tuple[int, int],
              d: tuple[int, int], ceil_mode: bool, count_include_pad: bool) -> np.ndarray:
    """max/avg pool of the last 2 dims in float64, PyTorch's rules (padding never wins a max; avg divides by the
    positions in the input, plus in the symmetric padding when count_include_pad, never the ceil_mode overhang)."""
    h, w = x.shape[-2:]
    oh, ow = _pool_geometry(h, k[0], s[0], p[0], d[0], ceil_mode), _pool_geometry(w, k[1], s[1], p[1], d[1], ceil_mode)
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for r in range(oh):
        for c in range(ow):
            rows = [r * s[0] - p[0] + i * d[0] for i in range(k[0])]
            cols = [c * s[1] - p[1] + j * d[1] for j in range(k[1])]
            inside = [(i, j) for i in rows for j in cols if 0 <= i < h and 0 <= j < w]
            vals = np.stack([x[..., i, j] for i, j in inside], -1) if inside else np.zeros(x.shape[:-2] + (0,))
            if kind == "max":
                out[..., r, c] = vals.max(-1) if inside else -np.inf
            else:
                if count_include_pad:
                    count = sum(1 for i in rows for j in cols if -p[0] <= i < h + p[0] and -p[1] <= j < w + p[1])
                else:
                    count = len(inside)
                out[..., r, c] = vals.sum(-1) / count
    return out


@st.composite
def conv_cases(draw: st.DrawFn) -> dict[str, Any]:
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cin = groups * draw(st.sampled_from([1, 2, 3]))
    cout = groups * draw(st.sampled_from([1, 2, 5]))
    kh, kw = draw(st.sampled_from([1, 2, 3, 5])), draw(st.sampled_from([1, 2, 3]))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dilation = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    padding = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
    h, w = draw(st.sampled_from([1, 3, 7, 17, 24, 31])), draw(st.sampled_from([1, 2, 5, 17, 29]))
    batch = draw(st.sampled_from([1, 2, 3]))
    transpose = draw(st.booleans())
    if not transpose:
        assume(h + 2 * padding[0] >= dilation[0] * (kh - 1) + 1 and w + 2 * padding[1] >= dilation[1] * (kw - 1) + 1)
    x = draw(inputs((batch, cin, h, w)))
    wshape = (cin, cout // groups, kh, kw) if transpose else (cout, cin // groups, kh, kw)
    weight = draw(inputs(wshape, max_views=1))
    out_pad = (draw(st.integers(0, stride[0] - 1)), draw(st.integers(0, stride[1] - 1))) if transpose else (0, 0)
    if transpose:  # PyTorch: output padding below stride or dilation; output size positive
        assume(all(op < max(s, d) for op, s, d in zip(out_pad, stride, dilation, strict=True)))
        assume((h - 1) * stride[0] - 2 * padding[0] + dilation[0] * (kh - 1) + out_pad[0] + 1 > 0)
        assume((w - 1) * stride[1] - 2 * padding[1] + dilation[1] * (kw - 1) + out_pad[1] + 1 > 0)
    bias = draw(inputs((cout,), max_views=0)) if draw(st.booleans()) else None
    return {"x": x, "w": weight, "bias": bias, "groups": groups, "stride": stride, "dilation": dilation,
            "padding": padding, "transpose": transpose, "output_padding": out_pad}


@given(conv_cases(), st.booleans())
@fuzz_settings(30)
def test_fuzz_conv2d(c: dict[str, Any], grad: bool) -> None:
    x, w, b = c["x"], c["w"], c["bias"]
    xv, wv = x.value.astype(np.float64), w.value.astype(np.float64)
    if c["transpose"]:
        want = np_conv_transpose2d(xv, wv, c["stride"], c["padding"], c["dilation"], c["groups"], c["output_padding"])
    else:
        want = np_conv2d(xv, wv, c["stride"], c["padding"], c["dilation"], c["groups"])
    if b is not None:
        want = want + b.value.astype(np.float64).reshape(1, -1, 1, 1)
    kw = {"groups": c["groups"], "stride": c["stride"], "dilation": c["dilation"], "padding": c["padding"]}
    if c["transpose"]:
        kw["output_padding"] = c["output_padding"]

    def gg_fn(*ts: Tensor) -> Tensor:
        bias = ts[2] if len(ts) > 2 else None
        return ts[0].conv_transpose2d(ts[1], bias, **kw) if c["transpose"] else ts[0].conv2d(ts[1], bias, **kw)

    def torch_fn(*ts: Any) -> Any:
        bias = ts[2] if len(ts) > 2 else None
        return F.conv_transpose2d(ts[0], ts[1], bias, **{**kw, "output_padding": c["output_padding"]}) \
            if c["transpose"] else F.conv2d(ts[0], ts[1], bias, **kw)

    ins = [x, w] + ([b] if b is not None else [])
    got = gg_fn(*[i.gg()[1] for i in ins]).numpy()
    assert_close(got, want, 1e-4, 1e-4, f"conv {c}")
    if grad:
        check_grad(gg_fn, torch_fn, ins, want.shape, atol=2e-3)


@st.composite
def pool_cases(draw: st.DrawFn) -> dict[str, Any]:
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 3)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    h, w = draw(st.sampled_from([1, 3, 7, 17, 24, 31])), draw(st.sampled_from([2, 5, 17, 29]))
    assume(h + 2 * p[0] >= d[0] * (k[0] - 1) + 1 and w + 2 * p[1] >= d[1] * (k[1] - 1) + 1)
    lead = draw(st.sampled_from([(1, 1), (2, 3), (1,), (3, 1)]))
    kind = draw(st.sampled_from(["max", "avg"]))
    ceil_mode = draw(st.booleans())
    count_include_pad = draw(st.booleans())
    if kind == "max" or count_include_pad:
        assume(d == (1, 1) or kind == "max")  # PyTorch's avg_pool2d has no dilation
    if kind == "avg":
        d = (1, 1)
    return {"x": draw(inputs(lead + (h, w))), "kind": kind, "k": k, "s": s, "p": p, "d": d, "ceil_mode": ceil_mode,
            "count_include_pad": count_include_pad}


@given(pool_cases(), st.booleans())
@fuzz_settings(30)
def test_fuzz_pool2d(c: dict[str, Any], grad: bool) -> None:
    x = c["x"]
    want = np_pool2d(x.value.astype(np.float64), c["kind"], c["k"], c["s"], c["p"], c["d"], c["ceil_mode"],
                     c["count_include_pad"])

    def fn(t: Any) -> Any:
        is_torch = torch is not None and isinstance(t, torch.Tensor)
        if c["kind"] == "max":
            return (F.max_pool2d if is_torch else Tensor.max_pool2d)(t, c["k"], c["s"], padding=c["p"],
                                                                      dilation=c["d"], ceil_mode=c["ceil_mode"])
        return (F.avg_pool2d if is_torch else Tensor.avg_pool2d)(t, c["k"], c["s"], padding=c["p"],
                                                                  ceil_mode=c["ceil_mode"],
                                                                  count_include_pad=c["count_include_pad"])

    got = fn(x.gg()[1]).numpy()
    assert_close(got, want, 1e-5, 1e-5, f"pool {c}")
    if grad:
        check_grad(fn, fn if pool_windows_touch_input(c) else _padded_torch_max_pool(c, want.shape), [x], want.shape)


def pool_windows_touch_input(c: dict[str, Any]) -> bool:
    """Whether every window of pool case `c` has a tap inside its input. Not so (height 1, dilation 2, padding 1:
    taps at -1 and 1) PyTorch's CPU max_pool2d gives -inf and, as that window's index, a position outside the
    input; its backward writes the gradient there, past the end of the gradient's buffer: heap corruption (glibc
    aborted a fuzz hunt with `free(): invalid next size (fast)`). Only dilated max pools have such windows."""
    return all(windows_touch_input(size, k, s, p, d, c["ceil_mode"]) for size, k, s, p, d in
               zip(c["x"].value.shape[-2:], c["k"], c["s"], c["p"], c["d"], strict=True))


def _padded_torch_max_pool(c: dict[str, Any], out_shape: Shape) -> Callable[[Any], Any]:
    """PyTorch's max pool of case `c` for inputs with windows wholly in the padding, memory-safe: the padding is
    made explicit (-inf, which never wins a max over an input value), so every window's index is inside the padded
    tensor and an empty window's gradient lands in the padding, which the pad's backward drops. (Explicit padding
    can add a last ceil_mode window: the output is cut to `out_shape`.)"""
    assert c["kind"] == "max", "average pools (no dilation) always have an input tap in each window"
    (ph, pw), (oh, ow) = c["p"], out_shape[-2:]
    return lambda t: F.max_pool2d(F.pad(t, (pw, pw, ph, ph), value=-math.inf), c["k"], c["s"], dilation=c["d"],
                                  ceil_mode=c["ceil_mode"])[..., :oh, :ow]


# ---------------------------------------------------------------------- elementwise chains over views
@st.composite
def elementwise_cases(draw: st.DrawFn) -> tuple[Input, Input, int]:
    shape = draw(shapes(limit=100_000))
    a = draw(inputs(shape))
    nd = len(shape)
    b_shape = tuple(s if draw(st.booleans()) else 1 for s in shape)[draw(st.integers(0, nd)):]  # broadcast
    return a, draw(inputs(b_shape)), draw(st.integers(0, 3))


def elementwise(which: int, a: Any, b: Any) -> Any:
    """Four chains whose numpy, glassgrad and torch spellings agree."""
    if which == 0:
        return (a * b + 1.5).relu() - (a - b).abs() * 0.25
    if which == 1:
        return (a * 0.5).exp() / (b * b + 1.0) + a.sigmoid()
    if which == 2:
        return (a > b).where(a, b * 2.0) + (a * b).tanh()
    return a.maximum(b) - a.minimum(b * 0.5) + (a + 3.0).sqrt()


def np_elementwise(which: int, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if which == 0:
        return np.maximum(a * b + 1.5, 0) - np.abs(a - b) * 0.25
    if which == 1:
        return np.exp(a * 0.5) / (b * b + 1.0) + 1 / (1 + np.exp(-a))
    if which == 2:
        return np.where(a > b, a, b * 2.0) + np.tanh(a * b)
    return np.maximum(a, b) - np.minimum(a, b * 0.5) + np.sqrt(a + 3.0)


@given(elementwise_cases(), st.booleans())
@fuzz_settings(30)
def test_fuzz_elementwise(case: tuple[Input, Input, int], grad: bool) -> None:
    a, b, which = case
    want = np_elementwise(which, a.value.astype(np.float64), b.value.astype(np.float64))
    got = elementwise(which, a.gg()[1], b.gg()[1]).numpy()
    assert_close(got, want, 1e-5, 1e-5, f"elementwise {which} {a.value.shape} {b.value.shape}")
    if grad and which != 2:  # where's gradient at a == b ties is a convention
        check_grad(lambda x, y: elementwise(which, x, y), lambda x, y: elementwise(which, x, y), [a, b], want.shape)


def test_views_agree_with_numpy_and_torch() -> None:
    """The view helpers themselves: a negative-step slice, pad and expand give numpy's values on both frameworks."""
    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    views = [View("slice", ((1, None, -1), (0, 3, 2), (3, 0, -2))), View("pad", ((1, 0), (0, 2), (1, 1))),
             View("expand", (3, 2, 4, 4))]
    views = [views[0], views[1]]
    want = apply_np(base, views)
    np.testing.assert_array_equal(apply_gg(Tensor(base), views).numpy(), want)
    if torch is not None:
        np.testing.assert_array_equal(apply_torch(torch.from_numpy(base), views).numpy(), want)
    e = View("expand", (3, 2, 1, 4))
    np.testing.assert_array_equal(e.gg_view(Tensor(base[:, :1])).numpy(), e.np_view(base[:, :1]))


# ---------------------------------------------------------------------- regressions the fuzz found
def _padded_tanh(t: Any) -> Any:
    """tanh and sqrt (libm exp2f inside) of a tensor padded with zero rows: the fuzz's shape of the max bugs."""
    p = F.pad(t, (1, 0, 0, 2, 2, 0)) if torch is not None and isinstance(t, torch.Tensor) else \
        t.pad(((2, 0), (0, 2), (1, 0)))
    return (p * 1.5 - 0.25).tanh() + p.abs().sqrt()


def test_max_gradient_of_libm_expression() -> None:
    """The gradient of a max over tanh(x) + sqrt|x| (a padded column, max over axis 0) went to no element in some
    columns: the max's kernel computed exp2f in a SIMD loop (glibc's libmvec), the gradient's mask `y == max(y)`
    recomputed it with the scalar exp2f, 1 ulp away, so no element equalled the max. Now the input of a max that
    needs a gradient is stored once when it holds a libm call."""
    base = np.random.default_rng(0).uniform(-2, 2, (1, 98, 23)).astype(np.float32)
    x = Tensor(base, device=DEVICE, requires_grad=True)
    _padded_tanh(x).max(0, keepdim=True).sum().backward()
    assert x.grad is not None
    g = x.grad.numpy()
    v = np.pad(base.astype(np.float64), ((2, 0), (0, 2), (1, 0)))
    y = np.tanh(v * 1.5 - 0.25) + np.sqrt(np.abs(v))
    hit = (y == y.max(0, keepdims=True))[2:, :98, 1:]  # the base's share of each column's maximum (no ties here)
    slope = (1.5 * (1 - np.tanh(base * 1.5 - 0.25) ** 2) + np.sign(base) / (2 * np.sqrt(np.abs(base))))
    np.testing.assert_allclose(g, np.where(hit, slope, 0.0), rtol=1e-4, atol=1e-5)
    if torch is not None:
        t = torch.from_numpy(base).requires_grad_(True)
        _padded_tanh(t).amax(0, keepdim=True).sum().backward()
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape, axis", [((3, 1021), 1), ((257, 31), 0), ((5, 98, 23), 0), ((2, 77, 24), -1)])
def test_argmax_of_libm_expression(shape: Shape, axis: int) -> None:
    """argmax compares its input with the input's max: an input with a libm call (exp of tanh) is stored once, so
    a SIMD and a scalar exp2f cannot make every comparison false (an index one past the end)."""
    a = np.random.default_rng(1).uniform(-2, 2, shape).astype(np.float32)
    got = ((Tensor(a, device=DEVICE) * 1.5 - 0.25).tanh() * 3).exp().argmax(axis).numpy()
    want = np.argmax(np.exp(np.tanh(a.astype(np.float64) * 1.5 - 0.25) * 3), axis)
    assert got.max() < shape[axis]
    np.testing.assert_array_equal(got, want)


@pytest.mark.usefixtures("literal_constants")
def test_max_reduction_names_its_value_once() -> None:
    """The C renderer's max accumulation `(v > acc || v != v) ? v : acc` names an expression v once instead of
    writing it out three times (gcc 12 made NaN flags from such a repeated select); the values stay numpy's."""
    from glassgrad.renderer.cstyle import CStyleLanguage
    a = np.random.default_rng(2).integers(-9, 9, (5, 7)).astype(np.int32)
    t = Tensor(a, device=DEVICE)
    np.testing.assert_array_equal((t * 3 + 1).max(1).numpy(), (a * 3 + 1).max(1))
    x = np.random.default_rng(3).uniform(-2, 2, (57, 33)).astype(np.float32)
    np.testing.assert_allclose(((Tensor(x, device=DEVICE) * 2 + 1).exp()).max(0).numpy(),
                               np.exp(x.astype(np.float64) * 2 + 1).max(0), rtol=1e-5)
    from glassgrad.codegen import get_program
    from glassgrad.renderer.cuda import CUDARenderer
    from glassgrad.renderer.metal import MetalRenderer
    from glassgrad.schedule import create_schedule
    renderers: list[CStyleLanguage] = [Device["CPU"].renderer, CUDARenderer(), MetalRenderer()]
    for dtype in (dtypes.int32, dtypes.float32):
        u = (Tensor.empty(5, 7, dtype=dtype, device="CPU") * 3 + 1).max(1).uop
        ast = create_schedule([u])[0][-1].ast
        for renderer in renderers:
            source = get_program(ast, renderer, opts=[]).source
            assert "* 3" in source and source.count("* 3") == 1, (type(renderer).__name__, source)


def test_max_pool_indices_of_libm_expression() -> None:
    """max_pool2d(return_indices=True) compares each window with its max: an input holding a libm call (sigmoid's
    exp2f) is stored once, so every window finds its maximum (an index of -1 or past the end otherwise)."""
    a = np.random.default_rng(4).uniform(-3, 3, (2, 3, 17, 29)).astype(np.float32)
    out, idx = Tensor(a, device=DEVICE).sigmoid().max_pool2d(3, 2, padding=1, return_indices=True)
    s = 1 / (1 + np.exp(-a.astype(np.float64)))
    want = np_pool2d(s, "max", (3, 3), (2, 2), (1, 1), (1, 1), False, True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    flat = s.reshape(2, 3, -1)
    picked = np.take_along_axis(flat, idx.numpy().reshape(2, 3, -1).astype(np.int64), -1).reshape(want.shape)
    np.testing.assert_allclose(picked, want, rtol=1e-6)


# height 1, dilation 2, padding 1: the window's taps are at -1 and 1, neither inside the input
EMPTY_WINDOW_POOL = {"kind": "max", "k": (2, 1), "s": (2, 2), "p": (1, 0), "d": (2, 2), "ceil_mode": False,
                     "count_include_pad": True}


def test_pool_window_without_input_tap_is_not_handed_to_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A max pool whose window lies wholly in the padding keeps its checks (forward -inf, no gradient through that
    window) but never reaches PyTorch's max_pool2d as such: torch's backward writes its gradient past the end of
    the buffer (`pool_windows_touch_input`), which aborted a fuzz hunt with heap corruption."""
    if torch is None:
        pytest.skip("the gradient reference is PyTorch's")
    real = F.max_pool2d
    seen: list[tuple[int, ...]] = []

    def checked(t: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
                ceil_mode: bool = False, **kw: Any) -> Any:
        two = [(v, v) if isinstance(v, int) else tuple(v) for v in (kernel_size, stride or kernel_size, padding,
                                                                   dilation)]
        for axis in range(2):
            assert windows_touch_input(t.shape[axis - 2], *(v[axis] for v in two), ceil_mode), \
                f"torch's max_pool2d was handed a window outside its input: {tuple(t.shape)} {two}"
        seen.append(tuple(t.shape))
        return real(t, kernel_size, stride, padding, dilation, ceil_mode, **kw)

    monkeypatch.setattr(F, "max_pool2d", checked)
    case = {"x": Input(np.array([[[[1.5, -2.0]]]], np.float32), []), **EMPTY_WINDOW_POOL}
    assert not pool_windows_touch_input(case)
    test_fuzz_pool2d.hypothesis.inner_test(case, True)  # type: ignore[attr-defined]
    assert seen, "the gradient was checked against torch"


def test_pool_fuzz_case_with_empty_window_leaves_the_heap_whole() -> None:
    """The same case end to end in a subprocess, with glibc's checking allocator (which aborts on a write past a
    block's end at its free): before the fix, torch's max_pool2d backward aborted it (`free(): invalid pointer`)."""
    import ctypes.util
    import subprocess
    import sys
    import textwrap
    debug = ctypes.util.find_library("c_malloc_debug")
    if torch is None or debug is None:
        pytest.skip("needs PyTorch and glibc's libc_malloc_debug")
    code = textwrap.dedent("""
        import numpy as np
        import test_shape_fuzz as f
        case = {"x": f.Input(np.array([[[[1.5, -2.0]]]], np.float32), []), **f.EMPTY_WINDOW_POOL}
        for _ in range(3):
            f.test_fuzz_pool2d.hypothesis.inner_test(case, True)
        print("whole")
    """)
    env = {**os.environ, "LD_PRELOAD": debug, "MALLOC_CHECK_": "3",
           "PYTHONPATH": os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "whole" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


def test_torch_max_pools_refuse_windows_without_input_taps() -> None:
    """The suite's safety net (tests/torch_pool_net.py, installed by conftest): F.max_pool1d/2d/3d and
    nn.MaxPool2d raise for a window wholly in the padding, and run, with PyTorch's output size, otherwise."""
    if torch is None:
        pytest.skip("a net around PyTorch")
    x = torch.zeros(1, 1, 1, 2, requires_grad=True)
    with pytest.raises(ValueError, match="no tap inside its input"):
        F.max_pool2d(x, (2, 1), (2, 2), (1, 0), (2, 2))
    with pytest.raises(ValueError, match="no tap inside its input"):
        torch.nn.MaxPool2d((2, 1), (2, 2), (1, 0), (2, 2))(x)
    with pytest.raises(ValueError, match="no tap inside its input"):
        F.max_pool1d(torch.zeros(1, 1, 1), 2, padding=1, dilation=2)
    rng = np.random.default_rng(0)
    for _ in range(200):
        size, k, s, d = (int(v) for v in rng.integers((1, 1, 1, 1), (12, 5, 4, 3)))
        p, ceil_mode = int(rng.integers(0, k // 2 + 1)), bool(rng.integers(0, 2))
        if size + 2 * p < d * (k - 1) + 1:
            continue
        t = torch.zeros(1, 1, size)
        if windows_touch_input(size, k, s, p, d, ceil_mode):
            assert F.max_pool1d(t, k, s, p, d, ceil_mode).shape[-1] == pool_outputs(size, k, s, p, d, ceil_mode)
        else:
            with pytest.raises(ValueError):
                F.max_pool1d(t, k, s, p, d, ceil_mode)
