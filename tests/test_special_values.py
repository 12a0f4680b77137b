"""Special values and dtype edges: +-0, +-inf, NaN, denormals, overflow and underflow edges through the elementwise
ops and reductions, against numpy (always) and PyTorch (when importable).

Each op runs once over a vector of special inputs (one kernel), so the whole file is a few seconds. The reference is
numpy in float64 on the inputs as the dtype holds them; values must be NaN where the reference is, the same infinity
where it is infinite, and close elsewhere. Where numpy and PyTorch disagree (the sign of NaN, pow(-inf, 0.5), fmod
by a denormal) glassgrad follows numpy and C; docs/ARCHITECTURE.md, *Semantics worth knowing*, lists those.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from torch_optional import F, torch

from glassgrad import Device, Tensor, dtypes
from glassgrad.dtype import DType

DEVICE = Device.DEFAULT
INF, NAN = math.inf, math.nan
SPECIALS = [0.0, -0.0, INF, -INF, NAN, 1e-45, -1e-45, 1e-40, -1e-40, 1e-38, -1e-38, 1e38, -1e38, 3.4e38, 88.7,
            89.0, -104.0, -87.5, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -3.0, 0.1, 20.0, -20.0, 1e4, -1e4, 1e-8,
            710.0, 1e20, -1e20, 65504.0, 70000.0]
# relative tolerance (and absolute, near 0) per dtype: float32 allows exp2-based exp/log (~3e-6 at 88), the halves
# about one unit in the last place after computing in float32
TOL = {dtypes.float32: (1e-5, 1e-6), dtypes.float16: (1e-3, 1e-3), dtypes.bfloat16: (8e-3, 8e-3)}
DENORMAL = 2.0 ** -149  # float32's smallest step: results in the denormal range have few digits
TORCH_DTYPE = {dtypes.float32: "float32", dtypes.float16: "float16", dtypes.bfloat16: "bfloat16"}


def as_dtype(values: list[float], dtype: DType) -> tuple[Tensor, np.ndarray]:
    """The values as a glassgrad tensor of `dtype` (rounded: 1e38 is inf in float16), and what it holds, in float64."""
    t = Tensor(np.array(values, dtype=np.float32), device=DEVICE).cast(dtype)
    return t, t.float().numpy().astype(np.float64)


def round_to(ref: np.ndarray, dtype: DType) -> np.ndarray:
    """A float64 reference rounded to `dtype` (overflow to inf, underflow to denormals and 0), back in float64."""
    f32 = np.asarray(ref, dtype=np.float64).astype(np.float32)
    if dtype == dtypes.float16:
        return f32.astype(np.float16).astype(np.float64)
    if dtype == dtypes.bfloat16:  # round to nearest even on the top 16 bits (NaNs stay NaN)
        bits = f32.view(np.uint32).astype(np.uint64)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return np.where(np.isnan(f32), np.nan, bits.view(np.float32)).astype(np.float64)
    return f32.astype(np.float64)


def assert_special_close(out: np.ndarray, ref: np.ndarray, rtol: float, atol: float, inputs: Any = None) -> None:
    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    with np.errstate(invalid="ignore"):
        ok = (np.isnan(out) & np.isnan(ref)) | (out == ref) | \
             (np.isfinite(out) & np.isfinite(ref) & (np.abs(out - ref) <= atol + rtol * np.abs(ref)))
    bad = np.flatnonzero(~ok)
    where = [(None if inputs is None else np.asarray(inputs).reshape(-1)[i], out.reshape(-1)[i], ref.reshape(-1)[i])
             for i in bad[:8]]
    assert not len(bad), f"{len(bad)} wrong (input, got, expected): {where}"


def np_hardsigmoid(x: np.ndarray) -> np.ndarray: return np.clip(x / 6 + 0.5, 0, 1)  # noqa: E704


def np_hardswish(x: np.ndarray) -> np.ndarray: return x * (np.clip(x + 3, 0, 6) / 6)  # noqa: E704  (-inf: NaN)


def np_sinc(x: np.ndarray) -> np.ndarray:
    """sin(pi x) / (pi x) with pi x in float32, as glassgrad and PyTorch compute it (NaN at 3.4e38: pi x is inf)."""
    px = (np.float32(np.pi) * x.astype(np.float32)).astype(np.float64)
    return np.where(x == 0, 1.0, np.sin(px) / px)


# name -> (glassgrad op, numpy reference in float64, torch op or None)
UNARY: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray], Callable[[Any], Any] | None]] = {
    "cos": (lambda t: t.cos(), np.cos, lambda t: t.cos()),
    "tan": (lambda t: t.tan(), np.tan, lambda t: t.tan()),
    "sin": (lambda t: t.sin(), np.sin, lambda t: t.sin()),
    "exp": (lambda t: t.exp(), np.exp, lambda t: t.exp()),
    "log": (lambda t: t.log(), np.log, lambda t: t.log()),
    "sinh": (lambda t: t.sinh(), np.sinh, None),  # (PyTorch's float32 sinh and cosh overflow from 88.7: e^x)
    "cosh": (lambda t: t.cosh(), np.cosh, None),
    "asinh": (lambda t: t.asinh(), np.arcsinh, lambda t: t.asinh()),
    "acosh": (lambda t: t.acosh(), np.arccosh, lambda t: t.acosh()),
    "log1p": (lambda t: t.log1p(), np.log1p, lambda t: t.log1p()),
    "hardsigmoid": (lambda t: t.hardsigmoid(), np_hardsigmoid, lambda t: F.hardsigmoid(t)),
    "hardswish": (lambda t: t.hardswish(), np_hardswish, None),  # (PyTorch's x * 6 overflows: 1e38 gives inf)
    "sinc": (lambda t: t.sinc(), np_sinc, lambda t: t.sinc()),
    "sqrt": (lambda t: t.sqrt(), np.sqrt, lambda t: t.sqrt()),
    "reciprocal": (lambda t: t.reciprocal(), lambda x: 1 / x, lambda t: t.reciprocal()),
    "tanh": (lambda t: t.tanh(), np.tanh, lambda t: t.tanh()),
    "atan": (lambda t: t.atan(), np.arctan, lambda t: t.atan()),
    "asin": (lambda t: t.asin(), np.arcsin, lambda t: t.asin()),
    "expm1": (lambda t: t.expm1(), np.expm1, lambda t: t.expm1()),
    "floor": (lambda t: t.floor(), np.floor, lambda t: t.floor()),
    "ceil": (lambda t: t.ceil(), np.ceil, lambda t: t.ceil()),
    "round": (lambda t: t.round(), np.round, lambda t: t.round()),
    "trunc": (lambda t: t.trunc(), np.trunc, lambda t: t.trunc()),
    "abs": (lambda t: t.abs(), np.abs, lambda t: t.abs()),
}


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16], ids=str)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_special_values(name: str, dtype: DType) -> None:
    """cos/tan lost the phase of a large x (cos(1e4) 1.5e-4 off); asinh/acosh overflowed to inf beyond 1.8e19 and
    acosh(-1e4) was -inf; log1p(inf) was NaN; hardsigmoid(1e38) was 0; halves: exp, cos and sinc rounded their
    intermediates to the half dtype (bfloat16 exp(20) 1.7% off), hardswish(65504) and asinh(300) overflowed."""
    op, np_op, torch_op = UNARY[name]
    t, x = as_dtype(SPECIALS, dtype)
    out = op(t)
    assert out.dtype == dtype
    with np.errstate(all="ignore"):
        ref = round_to(np_op(x), dtype)
    rtol, atol = TOL[dtype]
    got = out.float().numpy()
    assert_special_close(got, ref, rtol, atol, x)
    if torch is not None and torch_op is not None:
        tt = torch.tensor(np.array(SPECIALS, dtype=np.float32)).to(getattr(torch, TORCH_DTYPE[dtype]))
        assert_special_close(got, torch_op(tt).float().numpy(), 2 * rtol, 2 * atol, x)


def test_nan_to_num_bfloat16_largest() -> None:
    """+-inf become the dtype's largest finite value: bfloat16's is 3.39e38 (float32's rounded to inf)."""
    for dtype, largest in [(dtypes.bfloat16, 3.3895313892515355e38), (dtypes.float16, 65504.0),
                           (dtypes.float32, float(np.finfo(np.float32).max))]:
        t, _ = as_dtype([INF, -INF, NAN, 1.0], dtype)
        np.testing.assert_array_equal(t.nan_to_num().float().numpy(), [largest, -largest, 0.0, 1.0])


def test_sin_gradient_at_large_x() -> None:
    """d sin / dx = cos x, with cos's half-angle form: the gradient at x = 1e4 was 1.5e-4 off."""
    x = np.array([1e4, -1e4, 65504.0, 3.0, 1e20], dtype=np.float32)
    t = Tensor(x, device=DEVICE, requires_grad=True)
    t.sin().sum().backward()
    assert t.grad is not None
    assert_special_close(t.grad.numpy(), np.cos(x.astype(np.float64)), 1e-5, 1e-6, x)
    c = Tensor(x, device=DEVICE, requires_grad=True)
    c.cos().sum().backward()
    assert c.grad is not None
    assert_special_close(c.grad.numpy(), -np.sin(x.astype(np.float64)), 1e-5, 1e-6, x)


SMOOTH_UNARY = ["atan", "asinh", "sinh", "cosh", "tanh", "erf", "sinc", "sigmoid", "softplus", "silu", "gelu", "mish",
                "expm1", "sin", "cos", "tan", "softsign", "logsigmoid", "atanh", "asin", "log1p"]


@pytest.mark.parametrize("name", SMOOTH_UNARY)
def test_gradients_of_smooth_ops_at_and_near_zero(name: str) -> None:
    """Ops built from two branches picked with `where` computed the unused branch at every point: atan's 1/x at 0
    (gradient 0 * inf = NaN at 0 and at 1e-30, so atan2 on an axis had a NaN gradient too), sinc's quotient rule
    near 0 (-7e13 at 1e-20). The gradient must match a central difference in float64 wherever the op is smooth."""
    x = np.array([0.0, -0.0, 1e-30, 1e-20, 1e-8, 1e-4, 0.2, -0.45, 0.9, 1.7, -2.5, 4.0], np.float64)
    if name in ("atanh", "asin", "log1p"):
        x = x[np.abs(x) < 0.95]
    t = Tensor(x, device=DEVICE, dtype=dtypes.float64, requires_grad=True)
    getattr(t, name)().sum().backward()
    assert t.grad is not None
    h = 1e-6
    numeric = (getattr(Tensor(x + h, dtype=dtypes.float64), name)().numpy() -
               getattr(Tensor(x - h, dtype=dtypes.float64), name)().numpy()) / (2 * h)
    np.testing.assert_allclose(t.grad.numpy(), numeric, rtol=1e-5, atol=1e-7)


def test_sinc_gradient_near_zero_in_float32() -> None:
    """sinc's quotient-rule gradient cancels in float32 near 0: -7e13 at 1e-20, 2x off at 1e-4."""
    x = np.array([0.0, 1e-30, 1e-20, 1e-6, 1e-4, 1e-2, 0.3, 0.35, 2.5], np.float32)
    t = Tensor(x, device=DEVICE, requires_grad=True)
    t.sinc().sum().backward()
    assert t.grad is not None
    px = np.pi * x.astype(np.float64)
    safe = np.where(px == 0, 1, px)
    exact = np.where(px < 1e-3, -np.pi * px / 3, np.pi * (np.cos(safe) * safe - np.sin(safe)) / safe ** 2)
    np.testing.assert_allclose(t.grad.numpy(), exact, rtol=2e-5, atol=1e-30)


def test_xlogy_gradient_where_self_is_zero() -> None:
    """d xlogy(x, y) / dx = log(y), at x = 0 too (PyTorch's; 0 where y <= 0): the entropy term p.xlogy(p) of a
    probability that is exactly 0 had gradient 0 instead of -inf, and xlogy(0, 2) had 0 instead of log 2."""
    x = np.array([0.0, 0.0, 0.0, -0.0, 0.5, 2.0], np.float32)
    y = np.array([2.0, 0.5, 0.0, 3.0, 0.25, 1.0], np.float32)
    tx = Tensor(x, device=DEVICE, requires_grad=True)
    ty = Tensor(y, device=DEVICE, requires_grad=True)
    out = tx.xlogy(ty)
    out.sum().backward()
    assert tx.grad is not None and ty.grad is not None
    np.testing.assert_allclose(out.numpy(), np.where(x == 0, 0, x * np.log(np.where(y > 0, y, 1))), rtol=1e-6)
    np.testing.assert_allclose(tx.grad.numpy(), np.where(y > 0, np.log(np.where(y > 0, y, 1)), 0), rtol=1e-6)
    np.testing.assert_allclose(ty.grad.numpy()[[0, 1, 3, 4, 5]], (x / np.where(y > 0, y, 1))[[0, 1, 3, 4, 5]])
    np.testing.assert_array_equal(Tensor([0.0, 0.0, 1.0]).xlogy(Tensor([math.inf, math.nan, -1.0])).numpy(),
                                  [0.0, np.nan, np.nan])


def test_atan2_gradient_on_the_axes_and_at_the_origin() -> None:
    """d atan2(y, x) = (x dy - y dx) / (x^2 + y^2): on an axis the ratio inside is 0, where atan's gradient was
    NaN; at the origin PyTorch's gradient 0."""
    y = np.array([0.0, 1.0, -2.0, 0.0, 0.0, 3.0, 1e-30], np.float32)
    x = np.array([2.0, 0.0, 0.0, -1.5, 0.0, 4.0, 1.0], np.float32)
    ty = Tensor(y, device=DEVICE, requires_grad=True)
    tx = Tensor(x, device=DEVICE, requires_grad=True)
    ty.atan2(tx).sum().backward()
    assert ty.grad is not None and tx.grad is not None
    r2 = x.astype(np.float64) ** 2 + y.astype(np.float64) ** 2
    safe = np.where(r2 == 0, 1, r2)
    np.testing.assert_allclose(ty.grad.numpy(), np.where(r2 == 0, 0, x / safe), rtol=1e-6)
    np.testing.assert_allclose(tx.grad.numpy(), np.where(r2 == 0, 0, -y / safe), rtol=1e-6)


# ---------------------------------------------------------------------- binary
PAIR_VALUES = [0.0, -0.0, INF, -INF, NAN, 1e-40, -1e-40, 1e38, -1e38, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0,
               2.5, -2.5, 7.0, 1e-20]
BINARY: dict[str, tuple[Callable[[Any, Any], Any], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add": (lambda a, b: a + b, np.add), "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply), "div": (lambda a, b: a / b, np.divide),
    "pow": (lambda a, b: a ** b, np.power), "maximum": (lambda a, b: a.maximum(b), np.maximum),
    "minimum": (lambda a, b: a.minimum(b), np.minimum), "atan2": (lambda a, b: a.atan2(b), np.arctan2),
    "hypot": (lambda a, b: a.hypot(b), np.hypot), "fmod": (lambda a, b: a.fmod(b), np.fmod),
    "mod": (lambda a, b: a % b, np.mod), "floordiv": (lambda a, b: a // b, np.floor_divide),
    "copysign": (lambda a, b: a.copysign(b), np.copysign),
    "lt": (lambda a, b: a < b, np.less), "le": (lambda a, b: a <= b, np.less_equal),
    "eq": (lambda a, b: a == b, np.equal), "ne": (lambda a, b: a != b, np.not_equal),
}


@pytest.mark.parametrize("name", list(BINARY))
def test_binary_special_values(name: str) -> None:
    """Every pair of special float32 values. atan2 of two infinities was NaN (numpy, C and PyTorch: the diagonals,
    atan2(inf, -inf) = 3 pi / 4)."""
    op, np_op = BINARY[name]
    a = np.array([p for p in PAIR_VALUES for _ in PAIR_VALUES], dtype=np.float32)
    b = np.array([q for _ in PAIR_VALUES for q in PAIR_VALUES], dtype=np.float32)
    out = op(Tensor(a, device=DEVICE), Tensor(b, device=DEVICE)).numpy()
    with np.errstate(all="ignore"):
        ref = round_to(np_op(a.astype(np.float64), b.astype(np.float64)), dtypes.float32)
    assert_special_close(out, ref, 1e-6, DENORMAL, np.stack([a, b], -1).tolist())


def test_atan2_infinities() -> None:
    y = np.array([INF, INF, -INF, -INF, INF, -INF, 1.0, -1.0], dtype=np.float32)
    x = np.array([INF, -INF, INF, -INF, 1.0, -1.0, -INF, -INF], dtype=np.float32)
    for dtype in (dtypes.float32, dtypes.float16, dtypes.bfloat16):
        out = Tensor(y, device=DEVICE).cast(dtype).atan2(Tensor(x, device=DEVICE).cast(dtype)).float().numpy()
        assert_special_close(out, np.arctan2(y, x), TOL[dtype][0], 0.0)
        if torch is not None:
            ref = torch.atan2(torch.tensor(y), torch.tensor(x)).numpy()
            assert_special_close(out, ref, TOL[dtype][0], 0.0)


@pytest.mark.parametrize("weight", [0.0, 0.25, 0.5, 1.0, "tensor"])
def test_lerp_ends_and_infinities(weight: float | str) -> None:
    """PyTorch's two-sided formula: weight 1 gives `end` exactly (1e8 + (1 - 1e8) rounded to 0), an infinite start
    with a finite end stays infinite at weight 0.5 (inf + (0 - inf) * 0.5 was NaN)."""
    a = np.array([1e8, INF, -INF, 1.0, 0.0, NAN], dtype=np.float32)
    b = np.array([1.0, 0.0, 5.0, 1e8, INF, 1.0], dtype=np.float32)
    w: Any = weight if weight != "tensor" else np.array([1.0, 0.5, 0.5, 0.25, 0.0, 0.5], dtype=np.float32)
    ww = np.asarray(w, dtype=np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        ref = np.where(np.abs(ww) < 0.5, a64 + ww * (b64 - a64), b64 - (b64 - a64) * (1 - ww))
    out = Tensor(a, device=DEVICE).lerp(Tensor(b, device=DEVICE),
                                        Tensor(w, device=DEVICE) if weight == "tensor" else w).numpy()
    assert_special_close(out, ref, 1e-6, 0.0, np.stack([a, b], -1).tolist())
    if torch is not None:
        tw = torch.tensor(w) if weight == "tensor" else w
        assert_special_close(out, torch.lerp(torch.tensor(a), torch.tensor(b), tw).numpy(), 1e-6, 0.0)


# ---------------------------------------------------------------------- integers
INT_DTYPES = [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64]


def int_pairs(dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    info = np.iinfo(dtype)
    vals = sorted({v for v in (0, 1, -1, 2, -2, 3, -3, 7, -7, 100, -100, info.max, info.min, info.max - 1)
                   if info.min <= v <= info.max})
    return (np.array([a for a in vals for _ in vals], dtype=dtype),
            np.array([b for _ in vals for b in vals], dtype=dtype))


INT_OPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "add": (lambda a, b: a + b, np.add), "sub": (lambda a, b: a - b, np.subtract),
    "mul": (lambda a, b: a * b, np.multiply), "floordiv": (lambda a, b: a // b, np.floor_divide),
    "mod": (lambda a, b: a % b, np.mod), "fmod": (lambda a, b: a.fmod(b), np.fmod),
    "maximum": (lambda a, b: a.maximum(b), np.maximum), "minimum": (lambda a, b: a.minimum(b), np.minimum),
    "lt": (lambda a, b: a < b, np.less),
}


@pytest.mark.parametrize("name", list(INT_OPS))
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=lambda d: np.dtype(d).name)
def test_integer_edges(name: str, dtype: Any) -> None:
    """Wraparound like numpy (-fwrapv), floor division and modulo with the divisor's sign, INT_MIN // -1 wraps, and
    division by zero gives 0 (numpy's value, with its warning; C would trap and kill the process)."""
    op, np_op = INT_OPS[name]
    a, b = int_pairs(dtype)
    out = op(Tensor(a, device=DEVICE), Tensor(b, device=DEVICE)).numpy()
    with np.errstate(all="ignore"):
        ref = np_op(a, b)
    if name in ("floordiv", "mod", "fmod"):
        ref = np.where(b == 0, 0, ref).astype(ref.dtype)
    np.testing.assert_array_equal(out, ref)


# ---------------------------------------------------------------------- reductions
ROWS = {"nan": [1.0, NAN, 3.0, -2.0], "inf": [1.0, INF, 3.0, -2.0], "ninf": [1.0, -INF, 3.0],
        "both_inf": [INF, -INF, 1.0], "all_ninf": [-INF, -INF, -INF], "nan_first": [NAN, 5.0, 1.0],
        "inf_nan": [INF, NAN, -INF], "ties": [2.0, 5.0, 5.0, 1.0], "denormal": [1e-45, 1e-40, -1e-45]}
REDUCTIONS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], Any]]] = {
    "sum": (lambda t: t.sum(), np.sum), "max": (lambda t: t.max(), np.max), "min": (lambda t: t.min(), np.min),
    "argmax": (lambda t: t.argmax(), np.argmax), "argmin": (lambda t: t.argmin(), np.argmin),
    "mean": (lambda t: t.mean(), np.mean), "prod": (lambda t: t.prod(), np.prod),
    "var": (lambda t: t.var(), lambda x: np.var(x, ddof=1)),
    "logsumexp": (lambda t: t.logsumexp(0), lambda x: np.logaddexp.reduce(x)),
    "softmax": (lambda t: t.softmax(0), lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum()),
}


@pytest.mark.parametrize("row", list(ROWS))
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_reductions_with_special_values(name: str, row: str) -> None:
    op, np_op = REDUCTIONS[name]
    x = np.array(ROWS[row], dtype=np.float32)
    with np.errstate(all="ignore"):
        ref = round_to(np.asarray(np_op(x.astype(np.float64))), dtypes.float32)
    assert_special_close(op(Tensor(x, device=DEVICE)).numpy(), ref, 1e-6, DENORMAL, x)


@pytest.mark.parametrize("where", [(1, 5), (0, 0), (8, 999), (4, 500)])
def test_whole_max_keeps_an_earlier_rows_nan(where: tuple[int, int]) -> None:
    """max()/min() of a (9, 1000) matrix with one NaN is NaN. The CPU kernel loops over the rows with an OpenMP simd
    max of each row inside; the NaN flag of a row was reset for the next row and the NaN already in the accumulator
    was lost (`v > NaN` is false, OpenMP's max combine drops it): 3.26 came back, or inf with an inf in a later row."""
    x = np.random.default_rng(0).standard_normal((9, 1000)).astype(np.float32)
    x[where] = NAN
    x[6, 7] = INF
    t = Tensor(x, device=DEVICE)
    assert np.isnan(t.max().numpy()) and np.isnan(t.min().numpy())
    assert np.isnan(t.permute(1, 0).max().numpy())
    assert np.isnan(t.max(0).numpy()[where[1]])


def test_empty_reductions() -> None:
    """sum and prod of nothing are their identities, mean NaN, logsumexp -inf (log 0, as PyTorch; it raised from
    its max); max, min and argmax of nothing raise (no identity), as in numpy and PyTorch."""
    e = Tensor(np.zeros((3, 0), dtype=np.float32), device=DEVICE)
    np.testing.assert_array_equal(e.sum(1).numpy(), [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(e.prod(1).numpy(), [1.0, 1.0, 1.0])
    assert np.isnan(e.mean(1).numpy()).all()
    np.testing.assert_array_equal(e.logsumexp(1).numpy(), [-INF, -INF, -INF])
    assert e.logsumexp(1, keepdim=True).shape == (3, 1) and e.logsumexp(0).shape == (0,)
    assert e.logsumexp().numpy() == -INF
    if torch is not None:
        np.testing.assert_array_equal(torch.logsumexp(torch.zeros(3, 0), 1).numpy(), e.logsumexp(1).numpy())
    for fn in (lambda t: t.max(1), lambda t: t.min(1), lambda t: t.argmax(1)):
        with pytest.raises(ValueError):
            fn(e).numpy()


# ---------------------------------------------------------------------- unique
UNIQUE_INPUTS = {
    "floats_with_nan": np.array([[3.0, NAN, 1.0], [NAN, 3.0, -2.5]], dtype=np.float32),
    "ints": np.array([5, -1, 5, 7, -1, 0], dtype=np.int32),
    "bools": np.array([True, False, True]),
    "empty": np.zeros((0,), dtype=np.float32),
    "single": np.array(4.0, dtype=np.float32),
}


def np_unique(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy's unique with PyTorch's NaNs: each a value of its own, at the end."""
    flat = x.reshape(-1)
    nan = np.isnan(flat) if flat.dtype.kind == "f" else np.zeros(flat.shape, dtype=bool)
    vals, inv, counts = np.unique(flat[~nan], return_inverse=True, return_counts=True)
    full_inv = np.zeros(flat.shape, dtype=np.int64)
    full_inv[~nan] = inv.reshape(-1)
    full_inv[nan] = len(vals) + np.arange(nan.sum())
    return np.concatenate([vals, flat[nan]]), full_inv.reshape(x.shape), np.concatenate([counts, np.ones(nan.sum())])


@pytest.mark.parametrize("case", list(UNIQUE_INPUTS))
def test_unique(case: str) -> None:
    x = UNIQUE_INPUTS[case]
    t = Tensor(x, device=DEVICE)
    values, inverse, counts = np_unique(x)
    out = t.unique()
    assert isinstance(out, Tensor) and out.dtype == t.dtype
    np.testing.assert_array_equal(out.numpy(), values)
    v, i, c = t.unique(sorted=False, return_inverse=True, return_counts=True)
    np.testing.assert_array_equal(v.numpy(), values)
    assert i.dtype == dtypes.int64 and c.dtype == dtypes.int64 and i.shape == t.shape
    np.testing.assert_array_equal(i.numpy(), inverse)
    np.testing.assert_array_equal(c.numpy(), counts)
    np.testing.assert_array_equal(v.numpy()[i.numpy()], x)  # (NaN == NaN for assert_array_equal)
    if torch is not None:
        tv, ti, tc = torch.unique(torch.tensor(x), return_inverse=True, return_counts=True)
        np.testing.assert_array_equal(v.numpy(), tv.numpy())
        np.testing.assert_array_equal(i.numpy(), ti.numpy())
        np.testing.assert_array_equal(c.numpy(), tc.numpy())


def test_unique_rejects_dim() -> None:
    with pytest.raises(ValueError, match="dim"):
        Tensor([1, 2, 2], device=DEVICE).unique(dim=0)
