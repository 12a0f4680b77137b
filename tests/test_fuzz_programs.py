"""Program fuzzing: random tensor programs of 3-12 ops, run by glassgrad and by numpy, gradients against PyTorch.

Where tests/test_shape_fuzz.py checks one op on odd shapes, this draws whole programs, so the scheduler fuses, splits
and realizes chains of ops nobody tuned for: elementwise unary/binary ops with broadcasting, reductions (several and
negative axes, keepdim), movement ops (reshape, permute, expand, pad, slicing with positive and negative steps, flip,
cat, stack, repeat), matmul/einsum, comparisons and where, casts between float32/float16/int32/int8/uint8/bool,
contiguous/realize at random points, setitem and assign into realized buffers, getitem with tensor indices, cumsum,
softmax/log_softmax and conv2d. Inputs are leaves of odd shapes (0-d, empty dims, 1s), often seen through views.

The numpy reference runs while the program is drawn, so a step is only kept when its answer is well defined: no int
overflow (undefined in C), no float->int cast or comparison or argmax within the rounding error of a boundary. Each
value carries an absolute error bound (0 for values both sides compute exactly); glassgrad must be within twice it.
At the end the program realizes its last value, all its values at once, or each value in turn, and every realized
value is compared. Float32 programs without in-place writes also compare the gradient of sum(out * w) with PyTorch.

`derandomize=True` keeps CI reproducible; FUZZ_EXAMPLES=<n> runs n random (not derandomized) programs when hunting:
`FUZZ_EXAMPLES=2000 python -m pytest tests/test_fuzz_programs.py -x`. A failure prints the program (hypothesis
`note`s). Every bug this fuzz found has a plain regression test at the end of the file.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st
from test_shape_fuzz import View, apply_gg, apply_np, apply_torch, np_conv2d, viewed
from torch_optional import F, torch

from glassgrad import Device, Tensor

DEVICE = Device.DEFAULT
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "0"))
SIZES = (1, 1, 2, 3, 5, 7, 17, 31, 77, 257, 1000)
EPS = {"float32": 2.4e-7, "float16": 2e-3}
MAX_ABS = {"float32": 1e6, "float16": 1e4, "int32": 2**24, "int8": 2**7, "uint8": 2**8, "bool": 2}
INT_DTYPES = ("int32", "int8", "uint8")
Shape = tuple[int, ...]


def is_float(dtype: str) -> bool:
    return dtype in EPS


# ---------------------------------------------------------------------- values and programs
@dataclass
class Val:
    """One value of a program: its numpy reference, dtype name and absolute error bound (0: exact both sides)."""
    ref: np.ndarray
    dtype: str
    err: float
    alive: bool = True  # False once an assign overwrote the buffer it names (later reads see the new value)

    @property
    def shape(self) -> Shape:
        return tuple(self.ref.shape)

    @property
    def mx(self) -> float:
        return float(np.abs(self.ref.astype(np.float64)).max()) if self.ref.size else 0.0


@dataclass
class Step:
    """`op` applied to pool values `args` with parameters `kw`; an op that writes in place names its target."""
    op: str
    args: tuple[int, ...]
    kw: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        kw = ", ".join(f"{k}={v!r}" for k, v in self.kw.items() if k not in ("base",))
        if "base" in self.kw:
            kw = f"base={self.kw['base'].dtype}{self.kw['base'].shape}, " + kw
        return f"{self.op}({', '.join(f'v{a}' for a in self.args)}{', ' if self.args and kw else ''}{kw})"


class Reject(Exception):
    """The drawn step has no well-defined answer here (overflow, a rounding boundary): draw another."""


def exact_repr(a: np.ndarray, dtype: str) -> bool:
    """All of `a` are multiples of 1/256 small enough that `dtype` and every partial sum of them hold them exactly."""
    if not a.size:
        return True
    mant = 11 if dtype == "float16" else 24
    a64 = a.astype(np.float64) * 256
    return bool(np.all(a64 == np.round(a64)) and np.abs(a64).max() < 2 ** (mant - 1))


def sum_rounding(x: np.ndarray, axis: Any, n: int, out_max: float, eps: float) -> float:
    """A bound on the rounding error of summing n terms of x along `axis` in any order: each addition rounds a
    partial sum (at most about the result, which a run of same-signed terms approaches: n * eps * |out|), and terms
    of mixed signs add their roundings like a random walk (sqrt(n) * eps * sum |x|)."""
    a = np.abs(x.astype(np.float64))
    total = float(a.sum(axis=axis).max()) if a.size else 0.0
    return eps * (n * out_max + math.sqrt(max(n, 1)) * total) + eps * out_max


def np_dtype(dtype: str) -> Any:
    return np.dtype(dtype if dtype != "bool" else np.bool_)


def sum_dtype(dtype: str) -> str:
    return "uint32" if dtype == "uint8" else "int32" if dtype in ("int8", "int32", "bool") else dtype


def check_value(a: np.ndarray, dtype: str) -> None:
    """Reject a float value that is not finite or too big to bound its error, and an int value that overflowed."""
    if not a.size:
        return
    if is_float(dtype):
        if not np.all(np.isfinite(a)) or np.abs(a.astype(np.float64)).max() > MAX_ABS[dtype]:
            raise Reject("float range")


def boundary_ok(x: Val, points: np.ndarray, err: float) -> None:
    """x (inexact) must stay farther than its error bound from every rounding boundary `points` (same shape)."""
    if x.err == 0 or not x.ref.size:
        return
    if np.min(np.abs(x.ref.astype(np.float64) - points)) <= 4 * err + 1e-6 * max(1.0, x.mx):
        raise Reject("too close to a rounding boundary")


# ---------------------------------------------------------------------- ops: numpy reference, error bound, tensors
def _axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    return tuple(sorted(a % ndim for a in (axis if isinstance(axis, tuple) else (axis,))))


def _count(shape: Shape, axis: Any) -> int:
    return math.prod(shape[a] for a in _axes(axis, len(shape)))


UNARY_F = ("neg", "abs", "exp", "tanh", "sigmoid", "sin", "relu", "sqrt", "log", "recip", "square", "floor", "ceil",
           "round", "trunc")
UNARY_I = ("neg", "abs", "square", "invert")
LIP = {"neg": 1, "abs": 1, "exp": 21, "tanh": 1, "sigmoid": 0.25, "sin": 1, "relu": 1, "sqrt": 1, "log": 1, "recip": 1}


def np_unary(op: str, x: np.ndarray) -> np.ndarray:
    f: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "neg": np.negative, "abs": np.abs, "exp": lambda v: np.exp(np.clip(v, -3, 3)), "tanh": np.tanh,
        "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "sin": np.sin, "relu": lambda v: np.maximum(v, 0),
        "sqrt": lambda v: np.sqrt(np.abs(v) + 0.25), "log": lambda v: np.log(np.abs(v) + 1),
        "recip": lambda v: 1 / (np.abs(v) + 1), "square": np.square, "floor": np.floor, "ceil": np.ceil,
        "round": np.round, "trunc": np.trunc, "invert": np.invert}
    with np.errstate(all="ignore"):
        out = f[op](x)
    return out.astype(x.dtype) if x.dtype != np.bool_ else out


def t_unary(op: str, x: Any) -> Any:
    if op == "exp":
        return x.clip(-3, 3).exp()
    if op == "sqrt":
        return (x.abs() + 0.25).sqrt()
    if op == "log":
        return (x.abs() + 1).log()
    if op == "recip":
        return 1 / (x.abs() + 1)
    if op == "invert":
        return ~x
    if op == "neg":
        return -x
    return getattr(x, op)()


BINARY_F = ("add", "sub", "mul", "maximum", "minimum", "div")
BINARY_I = ("add", "sub", "mul", "maximum", "minimum", "floordiv", "mod")
BINARY_B = ("and", "or", "xor")
COMPARE = ("lt", "eq", "ne", "ge")


def np_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op == "div":
            return a / (np.abs(b) + np.asarray(1, b.dtype))
        if op in ("floordiv", "mod"):
            d = np.abs(b) + np.asarray(1, b.dtype)
            if np.any(d <= 0):
                raise Reject("divisor")
            return a // d if op == "floordiv" else a % d
        f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
             "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "lt": np.less, "eq": np.equal,
             "ne": np.not_equal, "ge": np.greater_equal}[op]
        return np.asarray(f(a, b))


def t_binary(op: str, a: Any, b: Any) -> Any:
    if op == "div":
        return a / (b.abs() + 1)
    if op == "floordiv":
        d = b.abs() + 1
        return torch.div(a, d, rounding_mode="floor") if torch is not None and isinstance(a, torch.Tensor) else a // d
    if op == "mod":
        return a % (b.abs() + 1)
    if op in ("maximum", "minimum"):
        return getattr(a, op)(b)
    return {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b, "and": lambda: a & b,
            "or": lambda: a | b, "xor": lambda: a ^ b, "lt": lambda: a < b, "eq": lambda: a == b,
            "ne": lambda: a != b, "ge": lambda: a >= b}[op]()


def _is_torch(x: Any) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_int(x: Any, dtype: str) -> Any:
    """torch returns int64 where glassgrad returns int32 (sums, argmax): back to glassgrad's dtype."""
    return x.to(getattr(torch, dtype)) if _is_torch(x) and x.dtype == torch.int64 and dtype != "int64" else x


def t_reduce(op: str, x: Any, axis: Any, keepdim: bool) -> Any:
    if _is_torch(x):
        dims = _axes(axis, x.ndim)
        if x.dtype == torch.bool and op in ("argmax", "argmin", "max", "min"):  # (torch: no bool argmax)
            r = t_reduce(op, x.to(torch.int32), axis, keepdim)
            return r if op in ("argmax", "argmin") else r.to(torch.bool)
        if op == "mean" and not x.is_floating_point():  # (torch: no mean of ints; glassgrad's is float32)
            x = x.to(torch.float32)
        if op in ("argmax", "argmin"):
            r = getattr(x, op)(dim=axis, keepdim=keepdim) if axis is not None else getattr(x, op)()
            return r.to(torch.int32)
        if op == "prod":
            for a in sorted(dims, reverse=True):
                x = x.prod(a, keepdim=True)
            return x if keepdim or not dims else x.squeeze(dims)
        fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin, "mean": torch.mean}[op]
        if not dims:
            return x
        return _torch_int(fn(x, dim=dims, keepdim=keepdim), "int32")
    if op in ("argmax", "argmin"):
        return getattr(x, op)(axis, keepdim=keepdim)
    return getattr(x, op)(axis, keepdim)


def np_reduce(op: str, x: np.ndarray, axis: Any, keepdim: bool, dtype: str) -> np.ndarray:
    if op in ("argmax", "argmin"):
        if not x.size:
            raise Reject("argmax of nothing")
        return np.asarray(getattr(np, op)(x, axis=axis, keepdims=keepdim)).astype(np.int32)
    if op in ("max", "min") and _count(x.shape, axis) == 0 and x.size == 0 and x.ndim and \
            any(x.shape[a] == 0 for a in _axes(axis, x.ndim)):
        raise Reject("max of nothing")
    axes = _axes(axis, x.ndim)
    with np.errstate(all="ignore"):
        if op in ("sum", "prod"):
            out_dt = np_dtype(sum_dtype(dtype))
            wide = getattr(np, op)(x.astype(np.int64 if out_dt.kind in "iu" else np.float64), axis=axes,
                                   keepdims=keepdim)
            if out_dt.kind in "iu" and np.any(np.abs(wide) >= 2**24):
                raise Reject("int overflow")
            return np.asarray(getattr(np, op)(x, axis=axes, keepdims=keepdim, dtype=out_dt))
        if op == "mean":
            out_dt = np.float16 if dtype == "float16" else np.float32
            if _count(x.shape, axis) == 0:
                raise Reject("mean of nothing")
            return np.asarray(np.mean(x.astype(np.float64), axis=axes, keepdims=keepdim)).astype(out_dt)
        return np.asarray(getattr(np, "amax" if op == "max" else "amin")(x, axis=axes, keepdims=keepdim))


def np_cast(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    if is_float(src) and dst in INT_DTYPES:
        lo, hi = {"int32": (-2**31, 2**31), "int8": (-128, 128), "uint8": (0, 256)}[dst]
        if x.size and (np.trunc(x).min() < lo or np.trunc(x).max() >= hi):
            raise Reject("float->int out of range (undefined in C)")
    with np.errstate(all="ignore"):
        return x.astype(np_dtype(dst))


# ---------------------------------------------------------------------- the generator
@st.composite
def shapes(draw: st.DrawFn, max_ndim: int = 4, limit: int = 6000) -> Shape:
    ndim = draw(st.integers(0, max_ndim))
    out: list[int] = []
    for _ in range(ndim):
        room = limit // max(1, math.prod(out))
        choices = [s for s in SIZES if s <= room]
        out.append(0 if draw(st.integers(0, 15)) == 0 else draw(st.sampled_from(choices)))
    return tuple(out)


class Builder:
    """Draws a program step by step, running the numpy reference as it goes."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw
        self.vals: list[Val] = []
        self.steps: list[Step] = []
        self.inplace = False

    def add(self, step: Step, val: Val) -> int:
        check_value(val.ref, val.dtype)
        self.steps.append(step)
        self.vals.append(val)
        return len(self.vals) - 1

    def alive(self, pred: Callable[[Val], bool] = lambda v: True) -> list[int]:
        return [i for i, v in enumerate(self.vals) if v.alive and pred(v)]

    def pick(self, pred: Callable[[Val], bool] = lambda v: True) -> int | None:
        c = self.alive(pred)
        return self.draw(st.sampled_from(c)) if c else None

    # -------------------------------------------------------------- leaves
    def leaf(self, shape: Shape | None = None, dtype: str | None = None) -> int:
        draw = self.draw
        if shape is None:
            shape = draw(shapes())
        if dtype is None:
            dtype = draw(st.sampled_from(["float32"] * 4 + ["float16", "int32", "int8", "uint8", "bool"]))
        base_shape, views = draw(viewed(shape, 2))
        if math.prod(base_shape) > 200_000:  # (strided views of a big value: a base too big to draw)
            base_shape, views = shape, []
        seed = draw(st.integers(0, 2**16))
        rng = np.random.default_rng(seed)
        grid = draw(st.booleans())
        if dtype == "bool":
            base = rng.integers(0, 2, base_shape).astype(np.bool_)
        elif dtype in INT_DTYPES:
            lo, hi = {"int32": (-60, 60), "int8": (-128, 127), "uint8": (0, 255)}[dtype]
            lo, hi = (lo, hi) if draw(st.booleans()) else (max(lo, -5), min(hi, 5))
            base = rng.integers(lo, hi + 1, base_shape).astype(np_dtype(dtype))
        elif grid:  # multiples of 1/4: exact in both dtypes, so comparisons and casts of them are exact too
            base = (rng.integers(-12, 13, base_shape) / 4).astype(np_dtype(dtype))
        else:
            base = rng.uniform(-2.5, 2.5, base_shape).astype(np_dtype(dtype))
        ref = np.array(apply_np(base, views))
        return self.add(Step("leaf", (), {"base": base, "views": views}), Val(ref, dtype, 0.0))

    # -------------------------------------------------------------- one step
    def step(self) -> None:
        kinds = ["unary", "binary", "binary", "compare", "where", "reduce", "reduce", "movement", "movement",
                 "movement", "cast", "matmul", "softmax", "cumsum", "realize", "setitem", "assign", "gather", "conv",
                 "cat", "leaf"]
        kind = self.draw(st.sampled_from(kinds))
        getattr(self, "op_" + kind)()

    def op_leaf(self) -> None:
        self.leaf()

    def op_unary(self) -> None:
        i = self.pick(lambda v: v.dtype != "bool")
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        op = self.draw(st.sampled_from(UNARY_F if is_float(x.dtype) else UNARY_I))
        if op in ("floor", "ceil", "round", "trunc"):
            pts = np.floor(x.ref.astype(np.float64))
            if op == "round":
                pts = pts + 0.5
            boundary_ok(x, pts, x.err)
            boundary_ok(x, pts + 1, x.err)
            err = 0.0
        else:
            out = np_unary(op, x.ref)
            if op == "square":
                err = 2 * x.mx * x.err + x.err ** 2
            else:
                err = LIP.get(op, 1) * x.err
            if is_float(x.dtype) and op not in ("neg", "abs", "relu"):
                err += 2 * EPS[x.dtype] * (float(np.abs(out.astype(np.float64)).max()) if out.size else 0)
        out = np_unary(op, x.ref)
        if x.dtype in INT_DTYPES:
            self._int_overflow(out, np_unary(op, x.ref.astype(np.int64)) if op != "invert" else out, x.dtype)
        self.add(Step("unary", (i,), {"op": op}), Val(out, x.dtype, err if is_float(x.dtype) else 0.0))

    def _int_overflow(self, out: np.ndarray, wide: np.ndarray, dtype: str) -> None:
        """int32 must not overflow (undefined behaviour in C); int8/uint8 wrap (defined: they are stored narrow)."""
        if dtype == "int32" and np.any(out.astype(np.int64) != wide):
            raise Reject("int32 overflow")

    def _partner(self, a: int, dtype: str) -> int:
        """A value that broadcasts with `a` (of `dtype`): an alive one, a reduction of `a`, or a new leaf."""
        sa = self.vals[a].shape
        choice = self.draw(st.integers(0, 3))
        if choice == 0:
            c = self.alive(lambda v: v.dtype == dtype and _broadcasts(v.shape, sa))
            if c:
                return self.draw(st.sampled_from(c))
        if choice == 1:  # a broadcastable new leaf: a suffix of a's shape with some dims 1
            k = self.draw(st.integers(0, len(sa)))
            shape = tuple(1 if self.draw(st.booleans()) else s for s in sa[len(sa) - k:])
            return self.leaf(shape, dtype)
        return self.leaf(sa, dtype)

    def op_binary(self) -> None:
        a = self.pick(lambda v: True)
        if a is None:
            raise Reject("no operand")
        dt = self.vals[a].dtype
        b = self._partner(a, dt)
        x, y = self.vals[a], self.vals[b]
        op = self.draw(st.sampled_from(BINARY_F if is_float(dt) else BINARY_B if dt == "bool" else BINARY_I))
        out = np_binary(op, x.ref, y.ref)
        if dt in INT_DTYPES:
            self._int_overflow(out, np_binary(op, x.ref.astype(np.int64), y.ref.astype(np.int64)), dt)
            if op in ("floordiv", "mod") and dt != "int32":  # |b|+1 wraps narrow; numpy's and C's agree
                pass
        err = 0.0
        if is_float(dt):
            ex, ey = x.err, y.err
            err = {"add": ex + ey, "sub": ex + ey, "maximum": max(ex, ey), "minimum": max(ex, ey),
                   "mul": x.mx * ey + y.mx * ex + ex * ey, "div": ex + x.mx * ey}[op]
            if op in ("add", "sub", "mul", "div") and not (err == 0 and exact_repr(out, dt)):
                err += 2 * EPS[dt] * (float(np.abs(out.astype(np.float64)).max()) if out.size else 0)
        self.add(Step("binary", (a, b), {"op": op}), Val(out.astype(np_dtype(dt)), dt, err))

    def op_compare(self) -> None:
        a = self.pick(lambda v: v.dtype != "bool")
        if a is None:
            raise Reject("no operand")
        dt = self.vals[a].dtype
        b = self._partner(a, dt)
        x, y = self.vals[a], self.vals[b]
        if x.err or y.err:
            xb, yb = np.broadcast_arrays(x.ref.astype(np.float64), y.ref.astype(np.float64))
            if xb.size and np.min(np.abs(xb - yb)) <= 4 * (x.err + y.err) + 1e-6 * max(1, x.mx, y.mx):
                raise Reject("comparison within rounding error")
        op = self.draw(st.sampled_from(COMPARE))
        self.add(Step("binary", (a, b), {"op": op}), Val(np_binary(op, x.ref, y.ref), "bool", 0.0))

    def op_where(self) -> None:
        c = self.pick(lambda v: v.dtype == "bool")
        if c is None:
            raise Reject("no condition")
        a = self.pick(lambda v: v.dtype != "bool" and _broadcasts(v.shape, self.vals[c].shape))
        if a is None:
            raise Reject("no operand")
        dt = self.vals[a].dtype
        b = self._partner(a, dt)
        x, y, cond = self.vals[a], self.vals[b], self.vals[c]
        out = np.where(cond.ref, x.ref, y.ref).astype(np_dtype(dt))
        self.add(Step("where", (c, a, b)), Val(out, dt, max(x.err, y.err)))

    def _axis(self, ndim: int, single: bool = False) -> Any:
        if ndim == 0:
            return None
        choice = self.draw(st.integers(0, 1 if single else 2))
        if choice == 0 and not single:
            return None
        if choice <= 1:
            return self.draw(st.integers(-ndim, ndim - 1))
        return tuple(self.draw(st.lists(st.integers(-ndim, ndim - 1), min_size=1, max_size=ndim,
                                        unique_by=lambda a: a % ndim)))

    def op_reduce(self) -> None:
        i = self.pick()
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        op = self.draw(st.sampled_from(["sum", "sum", "max", "min", "mean", "prod", "argmax", "argmin"]))
        if x.dtype == "bool" and op in ("mean", "prod"):
            raise Reject("bool")
        axis = self._axis(x.ref.ndim, single=op in ("argmax", "argmin") and self.draw(st.booleans()))
        if op in ("argmax", "argmin") and isinstance(axis, tuple):
            axis = axis[0]
        keepdim = self.draw(st.booleans())
        n = _count(x.shape, axis)
        if op == "prod" and n > 12:
            raise Reject("long product")
        out = np_reduce(op, x.ref, axis, keepdim, x.dtype)
        dt = "int32" if op in ("argmax", "argmin") else sum_dtype(x.dtype) if op in ("sum", "prod") else \
            ("float16" if x.dtype == "float16" else "float32") if op == "mean" else x.dtype
        err = 0.0
        if op in ("argmax", "argmin") and x.err and x.ref.size:
            _gap_ok(x, axis, op)
        if is_float(dt):
            e = EPS[dt]
            omx = float(np.abs(out.astype(np.float64)).max()) if out.size else 0.0
            if op == "sum":
                err = n * x.err + (0 if x.err == 0 and exact_repr(np.asarray(n * x.mx), dt) and
                                   exact_repr(x.ref, dt) else sum_rounding(x.ref, axis, n, omx, e))
            elif op == "mean":
                err = x.err + sum_rounding(x.ref, axis, n, omx * n, e) / max(n, 1) + 2 * e * omx
            elif op == "prod":
                err = n * x.err * max(1.0, x.mx) ** max(n - 1, 0) + 2 * e * n * omx
                if x.err == 0 and exact_repr(out, dt):
                    err = 0.0
                elif x.mx ** n * 256 > MAX_ABS[dt]:
                    raise Reject("product range")
            else:
                err = x.err
        self.add(Step("reduce", (i,), {"op": op, "axis": axis, "keepdim": keepdim}), Val(out, dt, err))

    def op_softmax(self) -> None:
        i = self.pick(lambda v: is_float(v.dtype) and v.ref.ndim > 0)
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        axis = self.draw(st.integers(-x.ref.ndim, x.ref.ndim - 1))
        op = self.draw(st.sampled_from(["softmax", "log_softmax"]))
        r = x.ref.astype(np.float64)
        m = np.max(r, axis=axis, keepdims=True) if r.shape[axis] else 0
        s = np.exp(r - m).sum(axis=axis, keepdims=True)
        out64 = np.exp(r - m) / s if op == "softmax" else r - m - np.log(s)
        out = out64.astype(np_dtype(x.dtype))
        e = EPS[x.dtype]
        err = 2 * x.err + 4 * e * max(1.0, float(np.abs(out64).max()) if out.size else 0) * \
            (1 + math.log2(max(2, x.shape[axis])))
        self.add(Step("softmax", (i,), {"op": op, "axis": axis}), Val(out, x.dtype, err))

    def op_cumsum(self) -> None:
        i = self.pick(lambda v: v.ref.ndim > 0)
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        axis = self.draw(st.integers(-x.ref.ndim, x.ref.ndim - 1))
        dt = sum_dtype(x.dtype)
        if dt in ("int32", "uint32"):
            wide = np.cumsum(x.ref.astype(np.int64), axis=axis)
            if wide.size and np.abs(wide).max() >= 2**24:
                raise Reject("overflow")
        out = np.cumsum(x.ref, axis=axis, dtype=np_dtype(dt))
        n = x.shape[axis]
        err = 0.0
        if is_float(dt):
            omx = float(np.abs(out.astype(np.float64)).max()) if out.size else 0.0
            err = n * x.err + (0 if x.err == 0 and exact_repr(np.asarray(n * x.mx), dt) and exact_repr(x.ref, dt)
                               else sum_rounding(x.ref, axis, n, omx, EPS[dt]))
        self.add(Step("cumsum", (i,), {"axis": axis}), Val(out, dt, err))

    def op_cast(self) -> None:
        i = self.pick()
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        dst = self.draw(st.sampled_from([d for d in ("float32", "float16", "int32", "int8", "uint8", "bool")
                                         if d != x.dtype]))
        if is_float(x.dtype) and dst in INT_DTYPES:
            boundary_ok(x, np.trunc(x.ref.astype(np.float64)), x.err)
            boundary_ok(x, np.trunc(x.ref.astype(np.float64)) + np.sign(x.ref), x.err)
        if is_float(x.dtype) and dst == "bool" and x.err:
            boundary_ok(x, np.zeros(x.shape), x.err)
        out = np_cast(x.ref, x.dtype, dst)
        err = 0.0
        if is_float(dst):
            err = x.err if is_float(x.dtype) else 0.0
            if not (err == 0 and exact_repr(out, dst)):
                err += EPS[dst] * Val(out, dst, 0).mx + x.err
        self.add(Step("cast", (i,), {"dtype": dst}), Val(out, dst, err if is_float(dst) else 0.0))

    def op_realize(self) -> None:
        i = self.pick()
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        op = self.draw(st.sampled_from(["contiguous", "realize", "clone"]))
        self.add(Step(op, (i,)), Val(x.ref, x.dtype, x.err))

    def op_movement(self) -> None:
        i = self.pick()
        if i is None:
            raise Reject("no operand")
        x = self.vals[i]
        nd = x.ref.ndim
        op = self.draw(st.sampled_from(["reshape", "permute", "expand", "pad", "slice", "flip", "transpose",
                                        "repeat", "index"]))
        kw: dict[str, Any]
        if op == "reshape":
            kw = {"shape": self._reshape_target(x.shape)}
            out = x.ref.reshape(kw["shape"])
        elif op == "permute":
            kw = {"order": tuple(self.draw(st.permutations(range(nd))))}
            out = np.transpose(x.ref, kw["order"])
        elif op == "transpose":
            if nd < 2:
                raise Reject("rank")
            d0, d1 = (self.draw(st.integers(-nd, nd - 1)) for _ in range(2))
            kw = {"d0": d0, "d1": d1}
            out = np.swapaxes(x.ref, d0, d1)
        elif op == "expand":
            lead = tuple(self.draw(st.lists(st.sampled_from((1, 2, 3, 5)), max_size=2)))
            shape = lead + tuple(self.draw(st.sampled_from((2, 3, 7))) if s == 1 and self.draw(st.booleans()) else s
                                 for s in x.shape)
            if math.prod(shape) > 20000:
                raise Reject("size")
            kw = {"shape": shape}
            out = np.broadcast_to(x.ref, shape)
        elif op == "pad":
            if nd == 0:
                raise Reject("rank")
            pads = tuple((self.draw(st.integers(0, 3)), self.draw(st.integers(0, 3))) for _ in range(nd))
            value = self.draw(st.sampled_from([0, 0, 1, -2]))
            kw = {"pads": pads, "value": value}
            out = np.pad(x.ref, pads, constant_values=value)
        elif op == "slice":
            sl = []
            for s in x.shape:
                step = self.draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
                start = self.draw(st.one_of(st.none(), st.integers(-s - 1, s + 1)))
                stop = self.draw(st.one_of(st.none(), st.integers(-s - 1, s + 1)))
                sl.append((start, stop, step))
            kw = {"slices": tuple(sl)}
            out = x.ref[tuple(slice(*s) for s in sl)]
        elif op == "flip":
            kw = {"axes": tuple(self.draw(st.lists(st.integers(-nd, nd - 1), max_size=nd,
                                                   unique_by=lambda a: a % nd))) if nd else ()}
            out = np.flip(x.ref, kw["axes"]) if kw["axes"] else x.ref
        elif op == "repeat":
            reps = tuple(self.draw(st.integers(0 if self.draw(st.integers(0, 9)) == 0 else 1, 3))
                         for _ in range(nd + self.draw(st.integers(0, 1))))
            if math.prod(reps) * x.ref.size > 20000 or not reps:
                raise Reject("size")
            kw = {"reps": reps}
            out = np.tile(x.ref, reps)
        else:  # index: an int (negative too) into one dim, a None, an Ellipsis
            if nd == 0:
                raise Reject("rank")
            d = self.draw(st.integers(0, nd - 1))
            if x.shape[d] == 0:
                raise Reject("empty")
            k = self.draw(st.integers(-x.shape[d], x.shape[d] - 1))
            idx = (slice(None),) * d + (k, None) if self.draw(st.booleans()) else (Ellipsis, None) if d == 0 else \
                (slice(None),) * d + (k,)
            kw = {"index": idx}
            out = x.ref[idx]
        self.add(Step(op, (i,), kw), Val(np.array(out), x.dtype, x.err))

    def _reshape_target(self, shape: Shape) -> Shape:
        n = math.prod(shape)
        s = list(shape)
        choice = self.draw(st.integers(0, 4))
        if choice == 0:
            return (n,) if self.draw(st.booleans()) or n == 0 else (-1,)
        if choice == 1 and len(s) >= 2:
            k = self.draw(st.integers(0, len(s) - 2))
            return tuple(s[:k] + [s[k] * s[k + 1]] + s[k + 2:])
        if choice == 2 and s:
            k = self.draw(st.integers(0, len(s) - 1))
            divs = [f for f in range(1, s[k] + 1) if s[k] % f == 0] if s[k] else [1]
            f = self.draw(st.sampled_from(divs))
            return tuple(s[:k] + [f, s[k] // f if f else 0] + s[k + 1:])
        if choice == 3:
            k = self.draw(st.integers(0, len(s)))
            return tuple(s[:k] + [1] + s[k:])
        return tuple(x for x in s if x != 1) if n else tuple(s)

    def op_cat(self) -> None:
        a = self.pick(lambda v: v.ref.ndim > 0)
        if a is None:
            raise Reject("no operand")
        x = self.vals[a]
        nd = x.ref.ndim
        stack = self.draw(st.booleans())
        d = self.draw(st.integers(-nd - (1 if stack else 0), nd - (0 if stack else 1)))
        if stack:
            others = self.alive(lambda v: v.dtype == x.dtype and v.shape == x.shape)
        else:
            dd = d % nd
            others = self.alive(lambda v: v.dtype == x.dtype and v.ref.ndim == nd and
                                all(v.shape[k] == x.shape[k] for k in range(nd) if k != dd))
        b = self.draw(st.sampled_from(others))
        c = self.draw(st.sampled_from(others))
        refs = [self.vals[k].ref for k in (a, b, c)]
        out = np.stack(refs, d) if stack else np.concatenate(refs, d)
        if out.size > 30000:
            raise Reject("size")
        err = max(self.vals[k].err for k in (a, b, c))
        self.add(Step("stack" if stack else "cat", (a, b, c), {"dim": d}), Val(out, x.dtype, err))

    def op_matmul(self) -> None:
        a = self.pick(lambda v: v.dtype in ("float32", "float16", "int32") and v.ref.ndim >= 1)
        if a is None:
            raise Reject("no operand")
        x = self.vals[a]
        k = x.shape[-1]
        form = self.draw(st.sampled_from(["matmul", "einsum_outer", "einsum_rowdot", "einsum_trace"]))
        if form == "einsum_trace":
            if x.ref.ndim != 2 or x.shape[0] != x.shape[1]:
                raise Reject("square")
            out = np.einsum("ii->i", x.ref)
            self.add(Step("einsum", (a,), {"formula": "ii->i"}), Val(out, x.dtype, x.err))
            return
        if form == "einsum_rowdot":
            if x.ref.ndim != 2:
                raise Reject("rank")
            b = self.leaf(x.shape, x.dtype) if self.draw(st.booleans()) else self._same_shape(a)
            y = self.vals[b]
            out = np.einsum("ij,ij->i", x.ref, y.ref)
            self._add_contraction(Step("einsum", (a, b), {"formula": "ij,ij->i"}), x, y, out, x.shape[1])
            return
        if form == "einsum_outer":
            if x.ref.ndim != 1:
                raise Reject("rank")
            b = self.pick(lambda v: v.dtype == x.dtype and v.ref.ndim == 1 and v.ref.size * x.ref.size <= 20000)
            if b is None:
                raise Reject("no operand")
            y = self.vals[b]
            out = np.einsum("i,j->ij", x.ref, y.ref)
            self._add_contraction(Step("einsum", (a, b), {"formula": "i,j->ij"}), x, y, out, 1)
            return
        n = self.draw(st.sampled_from((1, 3, 7, 17)))
        shape = (k,) if self.draw(st.integers(0, 4)) == 0 else (k, n)
        if self.draw(st.booleans()) and x.ref.ndim >= 3 and len(shape) == 2:
            shape = x.shape[:-2] + shape
        b = self.leaf(shape, x.dtype)
        y = self.vals[b]
        out = np.matmul(x.ref, y.ref)
        if out.size > 30000:
            raise Reject("size")
        self._add_contraction(Step("matmul", (a, b)), x, y, out, k)

    def _same_shape(self, a: int) -> int:
        return self.draw(st.sampled_from(self.alive(lambda v: v.dtype == self.vals[a].dtype and
                                                    v.shape == self.vals[a].shape)))

    def _add_contraction(self, step: Step, x: Val, y: Val, out: np.ndarray, k: int) -> None:
        dt = x.dtype
        if dt == "int32":
            wide = np.matmul(x.ref.astype(np.int64), y.ref.astype(np.int64)) if step.op == "matmul" else out
            if wide.size and np.abs(wide).max() >= 2**24:
                raise Reject("overflow")
            self.add(step, Val(out, dt, 0.0))
            return
        err = k * (x.err * y.mx + y.err * x.mx)
        if not (err == 0 and exact_repr(np.asarray(k * x.mx * y.mx), dt) and exact_repr(x.ref, dt) and
                exact_repr(y.ref, dt)):
            omx = Val(out, dt, 0).mx
            err += EPS[dt] * (k * omx + math.sqrt(k) * k * x.mx * y.mx) + 2 * EPS[dt] * omx
        self.add(step, Val(out.astype(np_dtype(dt)), dt, err))

    def op_conv(self) -> None:
        draw = self.draw
        groups = draw(st.sampled_from([1, 1, 2, 3]))
        cin, cout = groups * draw(st.sampled_from([1, 2])), groups * draw(st.sampled_from([1, 2, 3]))
        kh, kw = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 3]))
        stride, dil, pad = (draw(st.integers(1, 3)), draw(st.integers(1, 3))), \
            (draw(st.integers(1, 2)), draw(st.integers(1, 2))), (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
        h, w = draw(st.sampled_from([1, 3, 7, 17])), draw(st.sampled_from([1, 2, 5, 9]))
        if h + 2 * pad[0] < dil[0] * (kh - 1) + 1 or w + 2 * pad[1] < dil[1] * (kw - 1) + 1:
            raise Reject("window")
        batch = draw(st.sampled_from([1, 2]))
        src = self.pick(lambda v: v.dtype == "float32" and v.ref.size == batch * cin * h * w)
        if src is not None and draw(st.booleans()):
            x = self.add(Step("reshape", (src,), {"shape": (batch, cin, h, w)}),
                         Val(self.vals[src].ref.reshape(batch, cin, h, w), "float32", self.vals[src].err))
        else:
            x = self.leaf((batch, cin, h, w), "float32")
        wt = self.leaf((cout, cin // groups, kh, kw), "float32")
        xv, wv = self.vals[x], self.vals[wt]
        out = np_conv2d(xv.ref.astype(np.float64), wv.ref.astype(np.float64), stride, pad, dil, groups)
        k = cin // groups * kh * kw
        omx = float(np.abs(out).max()) if out.size else 0.0
        err = k * (xv.err * wv.mx + wv.err * xv.mx) + EPS["float32"] * (k * omx + math.sqrt(k) * k * xv.mx * wv.mx) \
            + 2 * EPS["float32"] * omx
        self.add(Step("conv2d", (x, wt), {"groups": groups, "stride": stride, "dilation": dil, "padding": pad}),
                 Val(out.astype(np.float32), "float32", err))

    def op_setitem(self) -> None:
        """c = a.contiguous().realize(); c[slices] = b (a value broadcast into the slice, or a scalar)."""
        a = self.pick(lambda v: v.ref.ndim > 0)
        if a is None:
            raise Reject("no operand")
        x = self.vals[a]
        sl = []
        for s in x.shape:
            start = self.draw(st.integers(0, max(s - 1, 0)))
            stop = self.draw(st.integers(start, s))
            sl.append((start, stop, self.draw(st.sampled_from([1, 1, 2]))))
        idx = tuple(slice(*s) for s in sl)
        target = x.ref.copy()
        region = target[idx].shape
        if self.draw(st.booleans()):
            b = self.leaf(tuple(1 if self.draw(st.booleans()) else r for r in region), x.dtype)
            target[idx] = self.vals[b].ref
            err = max(x.err, self.vals[b].err)
            args: tuple[int, ...] = (a, b)
        else:
            target[idx] = 3
            err, args = x.err, (a,)
        self.inplace = True
        self.add(Step("setitem", args, {"slices": tuple(sl)}), Val(target, x.dtype, err))

    def _owner(self, i: int) -> int:
        """The pool value whose tensor object value i is (realize returns the tensor it realized; assign too)."""
        while self.steps[i].op in ("realize", "assign"):
            i = self.steps[i].args[0]
        return i

    def op_assign(self) -> None:
        """x.assign(x + b) (or b) on a tensor that is not a view (a view writes into its parent): later reads see
        the new value, values built before it keep the old one (glassgrad's value semantics)."""
        views = ("reshape", "permute", "transpose", "expand", "pad", "slice", "flip", "repeat", "index", "gather",
                 "cat", "stack")
        c = [i for i in self.alive() if self.steps[self._owner(i)].op not in views and
             not (self.steps[self._owner(i)].op == "leaf" and self.steps[self._owner(i)].kw["views"])]
        if not c:
            raise Reject("no target")
        a = self.draw(st.sampled_from(c))
        x = self.vals[a]
        b = self._partner(a, x.dtype)
        y = self.vals[b]
        add = self.draw(st.booleans()) and x.dtype != "bool"
        if not _broadcasts_into(y.shape, x.shape):
            raise Reject("shape")
        new = np_binary("add", x.ref, y.ref) if add else np.broadcast_to(y.ref, x.shape)
        if x.dtype in INT_DTYPES:
            self._int_overflow(new, np_binary("add", x.ref.astype(np.int64), y.ref.astype(np.int64)) if add
                               else new, x.dtype)
        err = x.err + y.err + (2 * EPS[x.dtype] * Val(new, x.dtype, 0).mx if is_float(x.dtype) and add else 0)
        self.inplace = True
        owner = self._owner(a)
        for j in range(len(self.vals)):
            if self._owner(j) == owner:
                self.vals[j].alive = False
        self.add(Step("assign", (a, b), {"add": add}), Val(np.array(new, np_dtype(x.dtype)), x.dtype, err))

    def op_gather(self) -> None:
        """x[idx] or x[:, idx] with an int32 index tensor (negative indices too): a leaf or an argmax."""
        a = self.pick(lambda v: v.ref.ndim > 0)
        if a is None:
            raise Reject("no operand")
        x = self.vals[a]
        dim = self.draw(st.integers(0, min(1, x.ref.ndim - 1)))
        n = x.shape[dim]
        if n == 0:
            raise Reject("empty")
        ishape = self.draw(shapes(max_ndim=2, limit=40))
        rng = np.random.default_rng(self.draw(st.integers(0, 2**16)))
        idx = rng.integers(-n if self.draw(st.booleans()) else 0, n, ishape).astype(np.int32)
        i = self.add(Step("leaf", (), {"base": idx, "views": []}), Val(idx, "int32", 0.0))
        out = x.ref[(slice(None),) * dim + (idx,)]
        if out.size > 30000:
            raise Reject("size")
        self.add(Step("gather", (a, i), {"dim": dim}), Val(np.array(out), x.dtype, x.err))


def _gap_ok(x: Val, axis: Any, op: str) -> None:
    """argmax/argmin of an inexact value: the winner must lead the runner-up by more than the error bound."""
    r = x.ref.astype(np.float64)
    if op == "argmin":
        r = -r
    r = r.reshape(-1) if axis is None else np.moveaxis(r, axis, -1)
    if r.shape[-1] < 2:
        return
    top = np.sort(r, axis=-1)
    if np.min(top[..., -1] - top[..., -2]) <= 4 * x.err + 1e-6 * max(1.0, x.mx):
        raise Reject("argmax near-tie")


def _broadcasts(a: Shape, b: Shape) -> bool:
    """a and b broadcast together, to at most 30,000 elements."""
    if not all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b), strict=False)):
        return False
    return math.prod(np.broadcast_shapes(a, b)) <= 30000


def _broadcasts_into(a: Shape, b: Shape) -> bool:
    return len(a) <= len(b) and all(x == y or x == 1 for x, y in zip(reversed(a), reversed(b), strict=False))


@st.composite
def programs(draw: st.DrawFn) -> Builder:
    """A program of 3-12 ops (leaves drawn on demand), its numpy reference computed as it was drawn."""
    b = Builder(draw)
    b.leaf()
    n_ops = draw(st.integers(3, 12))
    done = tries = 0
    while done < n_ops and tries < 60:
        tries += 1
        try:
            b.step()
            done += 1
        except (Reject, ValueError):  # ValueError: numpy refuses (shapes that do not broadcast)
            continue
    return b


# ---------------------------------------------------------------------- interpreters
def run_tensor(steps: list[Step], lib: str, grads: bool = False) -> tuple[list[Any], list[Any]]:
    """Run `steps` on glassgrad ("gg") or torch ("torch"); returns the values and the leaves."""
    vals: list[Any] = []
    leaves: list[Any] = []
    for s in steps:
        a = [vals[i] for i in s.args]
        vals.append(_run_step(s, a, lib, grads, leaves))
    return vals, leaves


def _run_step(s: Step, a: list[Any], lib: str, grads: bool, leaves: list[Any]) -> Any:
    kw = s.kw
    tt = lib == "torch"
    if s.op == "leaf":
        if tt:
            leaf = torch.from_numpy(np.array(kw["base"]))
            if grads and leaf.dtype == torch.float32:
                leaf.requires_grad_(True)
            leaves.append(leaf)
            return apply_torch(leaf, kw["views"])
        leaf = Tensor(kw["base"], device=DEVICE, requires_grad=True if grads and kw["base"].dtype == np.float32
                      else None)
        leaves.append(leaf)
        return apply_gg(leaf, kw["views"])
    x = a[0] if a else None
    if s.op == "unary":
        return t_unary(kw["op"], x)
    if s.op == "binary":
        return t_binary(kw["op"], x, a[1])
    if s.op == "where":
        return (torch.where if tt else Tensor.where)(a[0], a[1], a[2])
    if s.op == "reduce":
        r = t_reduce(kw["op"], x, kw["axis"], kw["keepdim"])
        return _torch_int(r, "int32") if tt else r
    if s.op == "softmax":
        return getattr(x, kw["op"])(kw["axis"])
    if s.op == "cumsum":
        return _torch_int(x.cumsum(kw["axis"]), "int32") if tt else x.cumsum(kw["axis"])
    if s.op == "cast":
        return x.to(getattr(torch, kw["dtype"])) if tt else x.cast(kw["dtype"])
    if s.op == "contiguous":
        return x.contiguous()
    if s.op == "realize":
        return x.clone() if tt else x.realize()
    if s.op == "clone":
        return x.clone()
    if s.op == "reshape":
        return x.reshape(kw["shape"])
    if s.op == "permute":
        return x.permute(kw["order"])
    if s.op == "transpose":
        return x.transpose(kw["d0"], kw["d1"])
    if s.op == "expand":
        return x.expand(kw["shape"])
    if s.op == "pad":
        if tt:
            return F.pad(x, [p for b, e in reversed(kw["pads"]) for p in (b, e)], value=kw["value"])
        return x.pad(kw["pads"], value=kw["value"])
    if s.op == "slice":
        if tt:
            return _torch_slice(x, kw["slices"])
        return x[tuple(slice(*t) for t in kw["slices"])]
    if s.op == "flip":
        return x.flip(kw["axes"]) if kw["axes"] or not tt else x
    if s.op == "repeat":
        return x.repeat(kw["reps"])
    if s.op == "index":
        return x[kw["index"]]
    if s.op in ("cat", "stack"):
        return getattr(torch if tt else Tensor, s.op)(a, dim=kw["dim"])
    if s.op == "matmul":
        return x @ a[1]
    if s.op == "einsum":
        return (torch.einsum if tt else Tensor.einsum)(kw["formula"], *a)
    if s.op == "conv2d":
        c = {k: kw[k] for k in ("groups", "stride", "dilation", "padding")}
        return F.conv2d(x, a[1], **c) if tt else x.conv2d(a[1], **c)
    if s.op == "setitem":
        c = x.clone() if tt else x.contiguous().realize()
        c[tuple(slice(*t) for t in kw["slices"])] = a[1] if len(a) > 1 else 3
        return c
    if s.op == "assign":
        new = x + a[1] if kw["add"] else a[1]
        if tt:
            x.copy_(new.expand(x.shape))
            return x
        return x.assign(new.expand(x.shape) if isinstance(new, Tensor) else new)
    if s.op == "gather":
        return x[(slice(None),) * kw["dim"] + (a[1].long() if tt else a[1],)]
    raise AssertionError(s.op)


def _torch_slice(x: Any, slices: tuple[tuple[Any, Any, int], ...]) -> Any:
    for d, (start, stop, step) in enumerate(slices):
        idx = list(range(*slice(start, stop, step).indices(x.shape[d])))
        x = x.index_select(d, torch.tensor(idx, dtype=torch.long))
    return x


# ---------------------------------------------------------------------- the check
def compare(got: np.ndarray, v: Val, what: str) -> None:
    assert got.shape == v.shape, f"{what}: shape {got.shape} != {v.shape}"
    want = v.ref
    if not is_float(v.dtype):
        assert got.dtype.kind == want.dtype.kind or (got.dtype.kind in "iu" and want.dtype.kind in "iu"), \
            f"{what}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=2 * v.err + 1e-30, rtol=0,
                               err_msg=f"{what} (error bound {v.err:.3g})")


def check_program(b: Builder, mode: str) -> None:
    """Run the drawn program on glassgrad, realize per `mode`, compare every realized value with numpy."""
    for k, s in enumerate(b.steps):
        note(f"v{k} = {s!r}  # {b.vals[k].dtype}{b.vals[k].shape} err={b.vals[k].err:.3g}")
    note(f"mode={mode}")
    vals, _ = run_tensor(b.steps, "gg")
    alive = [i for i, v in enumerate(b.vals) if v.alive]
    if mode == "last":
        check = [alive[-1]]
    elif mode == "all":
        check = alive
        Tensor.realize(*(vals[i] for i in alive))
    else:
        check = alive[::-1] if mode == "each_reversed" else alive
    for i in check:
        compare(vals[i].numpy(), b.vals[i], f"v{i} = {b.steps[i]!r}")
    if torch is not None and not b.inplace and all(v.dtype in ("float32", "int32", "bool") for v in b.vals):
        check_grads(b)


def check_grads(b: Builder) -> None:
    """The gradient of sum(last * w) w.r.t. every float32 leaf, glassgrad against PyTorch."""
    last = len(b.vals) - 1
    if b.vals[last].dtype != "float32" or not b.vals[last].ref.size:
        return
    w = np.random.default_rng(7).uniform(-1, 1, b.vals[last].shape).astype(np.float32)
    gvals, gleaves = run_tensor(b.steps, "gg", grads=True)
    tvals, tleaves = run_tensor(b.steps, "torch", grads=True)
    if not any(t.requires_grad for t in tleaves) or not tvals[last].requires_grad:
        return
    (tvals[last] * torch.from_numpy(w)).sum().backward()
    (gvals[last] * Tensor(w, device=DEVICE)).sum().backward()
    for k, (g, t) in enumerate(zip(gleaves, tleaves, strict=True)):
        if t.dtype != torch.float32:
            continue
        want = t.grad.numpy() if t.grad is not None else np.zeros(t.shape, np.float32)
        got = g.grad.numpy() if g.grad is not None else np.zeros(t.shape, np.float32)
        scale = max(1.0, float(np.abs(want).max()) if want.size else 0.0)
        np.testing.assert_allclose(got, want, atol=2e-3 * scale, rtol=2e-3, err_msg=f"grad of leaf {k}")


def fuzz_settings(examples: int) -> settings:
    return settings(deadline=None, max_examples=EXAMPLES or examples, derandomize=not EXAMPLES,
                    suppress_health_check=list(HealthCheck), print_blob=True)


@given(programs(), st.sampled_from(["last", "all", "each", "each_reversed"]))
@fuzz_settings(40)
def test_fuzz_programs(b: Builder, mode: str) -> None:
    check_program(b, mode)


# ---------------------------------------------------------------------- regression tests (bugs the fuzz found)
@pytest.mark.parametrize("dummy", [0])
def test_program_fuzz_smoke(dummy: int) -> None:
    """A fixed tiny program through the interpreters: leaf -> sum -> compare (the harness itself works)."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    steps = [Step("leaf", (), {"base": x, "views": [View("flip", (1,))]}),
             Step("reduce", (0,), {"op": "sum", "axis": -1, "keepdim": True})]
    vals, _ = run_tensor(steps, "gg")
    np.testing.assert_array_equal(vals[1].numpy(), np.flip(x, 1).sum(-1, keepdims=True))


@pytest.mark.parametrize("dtype, value, want", [(np.bool_, 1, [True, True, False, True]),
                                                (np.int32, 1.5, [1, 1, 2, 1]),
                                                (np.uint8, 7, [7, 1, 2, 7]),
                                                (np.float16, -2, [-2, 1, 2, -2])])
def test_pad_value_keeps_the_dtype(dtype: Any, value: Any, want: list[Any]) -> None:
    """A constant pad's fill takes the tensor's dtype, as PyTorch's F.pad: a bool tensor padded with 1 was int32, an
    int tensor padded with 1.5 float32 (program fuzz: `pad(bool, value=1)` came back int32)."""
    base = np.array([1, 0], dtype) if dtype == np.bool_ else np.array([1, 2], dtype)
    got = Tensor(base).pad(((1, 1),), value=value)
    assert got.dtype.np == np.dtype(dtype)
    np.testing.assert_array_equal(got.numpy(), np.array(want, dtype))


@pytest.mark.parametrize("device", ["CUDA", "METAL", None])
@pytest.mark.parametrize("n", [1, 300])
def test_a_kernel_loads_what_it_overwrites_before_storing_it(device: str | None, n: int) -> None:
    """The source of `b = -x` fused with `x.assign(x - x)` (ints: the value folds to 0) loads x before it stores
    x's 0, on every renderer (tests/test_assign.py runs it; this reads the CUDA and Metal sources, no GPU)."""
    from glassgrad import kernels
    x = Tensor(np.full((n,), 4, np.int32))
    b = -x
    x.assign(x - x)
    (spec,) = kernels(b, x, device=device)
    lines = [ln.strip() for ln in spec.source.splitlines()]
    load = next(i for i, ln in enumerate(lines) if "= data0[" in ln)
    store = next(i for i, ln in enumerate(lines) if ln.startswith("data0[") and ln.endswith("= 0;"))
    assert load < store, spec.source
