"""Elementwise math on `Tensor` (a mixin): inverse and hyperbolic trigonometry, erf, the remaining activations
(celu, selu, mish, softsign, logsigmoid), comparisons by name (eq, ne), float predicates (isnan, isinf, isfinite,
isclose, allclose) and small binary ops (copysign, fmod, lerp, logaddexp).

In: tensors of any shape and dtype (ints and bools become the default float where the result is a float, as in
tinygrad). Out: lazy tensors built from Tensor's primitives (exp2, log2, sqrt, sin, where, comparisons), so they fuse
into the kernels around them and differentiate through the ordinary rules.

Accuracy: where a textbook formula cancels near 0 (asin, asinh, atanh, sinh, erf) the op switches to its Taylor
series below a small |x|, as `Tensor.tanh` does, so results stay within a few float32 ulps *relative* to the exact
value (the formulas alone lose most digits there). The series only ever sees the small inputs (`_small`), so a large
x cannot overflow it and poison the gradient of the branch `where` did not pick with inf * 0 = NaN.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from glassgrad.dtype import dtypes

if TYPE_CHECKING:
    from glassgrad.tensor import Scalar, Tensor

_Activation = TypeVar("_Activation", bound=Callable[..., Any])


_NO_DIM = object()


def accepts_dim(fn: _Activation) -> _Activation:
    """PyTorch's `dim=` keyword for tinygrad's `axis` (`x.sum(dim=1)`, `logits.argmax(dim=-1)`, `x.softmax(dim=-1)`):
    the same argument under its other name (giving both is an error). It raised TypeError."""
    @functools.wraps(fn)
    def with_dim(self: Tensor, *args: Any, dim: Any = _NO_DIM, **kwargs: Any) -> Any:
        if dim is not _NO_DIM:
            if args or "axis" in kwargs:
                raise TypeError(f"{fn.__name__}: give the axis once, as axis= (tinygrad) or dim= (PyTorch)")
            kwargs["axis"] = dim
        return fn(self, *args, **kwargs)
    return cast(_Activation, with_dim)


def computed_in_float32(fn: _Activation) -> _Activation:
    """For an activation built from several ops: on a float16/bfloat16 tensor it is computed in float32 and rounded
    once, as PyTorch's half kernels compute it (in their float "opmath"). Rounded after every op instead, the ~20
    intermediates of a GELU drift by several ulps, and on a GPU each rounding is a conversion instruction: the bf16
    GPT-2 step's GELU kernels were bound by them. Other dtypes are computed as they are."""
    @functools.wraps(fn)
    def in_float32(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if self.dtype in (dtypes.float16, dtypes.bfloat16):
            return cast("Tensor", fn(self.cast(dtypes.float32), *args, **kwargs)).cast(self.dtype)
        return cast("Tensor", fn(self, *args, **kwargs))
    return cast(_Activation, in_float32)


def _horner(x: Tensor, coefficients: Sequence[float]) -> Tensor:
    """c[0]*x^(n-1) + ... + c[n-1], highest power first."""
    out = x * coefficients[0] + coefficients[1]
    for c in coefficients[2:]:
        out = out * x + c
    return out


def _odd_series(x: Tensor, coefficients: Sequence[float]) -> Tensor:
    """x * (c[0] + c[1] x^2 + c[2] x^4 + ...), lowest power first."""
    return x * _horner(x * x, list(reversed(coefficients)))


def _huge(x: Tensor, safe: float = 0.0) -> tuple[Tensor, Tensor]:
    """(x > 2^32, x where it is not and `safe` where it is): beyond 2^32 sqrt(x^2 +- 1) is x in float32 and x^2 may
    overflow, so asinh and acosh are log(2x) there; the other branch sees `safe` (no inf, no NaN in its gradient)."""
    big = x > 2.0 ** 32
    return big, big.where(safe, x)


def _small(x: Tensor, switch: float) -> tuple[Tensor, Tensor]:
    """(|x| < switch, x where that holds and 0 elsewhere): the input a near-zero series may safely see."""
    near = x.abs() < switch
    return near, near.where(x, 0.0)


_LN2 = math.log(2)
# Taylor coefficients (odd powers, lowest first) used below the switch points
_ASIN_SERIES = [math.comb(2 * n, n) / (4 ** n * (2 * n + 1)) for n in range(10)]
_ASINH_SERIES = [(-1) ** n * math.comb(2 * n, n) / (4 ** n * (2 * n + 1)) for n in range(10)]
_ATANH_SERIES = [1 / (2 * n + 1) for n in range(11)]
_SINH_SERIES = [1 / math.factorial(2 * n + 1) for n in range(7)]
# erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1)); 14 terms reach float64 rounding for |x| < 1
_ERF_SERIES = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(14)]
# Numerical Recipes' erfc(z) ~ t exp(-z^2 + P(t)), t = 1/(1 + z/2): relative error below 1.2e-7 for every z >= 0
_ERFC_POLY = [0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806, 0.09678418, 0.37409196,
              1.00002368, -1.26551223]
# Abramowitz & Stegun 4.4.46: asin(x) = pi/2 - sqrt(1-x) P(x) on [0, 1], absolute error below 2e-8
_ASIN_POLY = [-0.0012624911, 0.0066700901, -0.0170881256, 0.0308918810, -0.0501743046, 0.0889789874, -0.2145988016,
              1.5707963050]


class MathOps:
    """Mixed into Tensor. Methods use only the public Tensor API."""
    __slots__ = ()

    @property
    def _m(self) -> Tensor:
        """This object as the Tensor it is (for the type checker: the mixin is only ever part of a Tensor)."""
        return cast("Tensor", self)

    # ------------------------------------------------------------------ comparisons by name
    def eq(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise `==` (a bool tensor), as a method: `a.eq(b)`."""
        return self._m == x

    def ne(self, x: Tensor | Scalar) -> Tensor:
        """Elementwise `!=` (a bool tensor), as a method: `a.ne(b)`."""
        return self._m != x

    def isnan(self) -> Tensor:
        return self._m != self._m

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        t = self._m
        if not t.dtype.is_float:
            return t.full_like(False, dtypes.bool)
        pos = (t == math.inf) if detect_positive else t.full_like(False, dtypes.bool)
        return pos | (t == -math.inf) if detect_negative else pos

    def isfinite(self) -> Tensor:
        t = self._m
        return (t.isinf() | t.isnan()).logical_not()

    def isclose(self, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08,
                equal_nan: bool = False) -> Tensor:
        """|self - other| <= atol + rtol*|other| for finite values; infinities are close to themselves only; NaNs
        are close to each other only with equal_nan (numpy's and PyTorch's definition)."""
        a, b = self._m._broadcasted(other)
        close = a.isfinite() & b.isfinite() & ((a - b).abs() <= atol + rtol * b.abs())
        close = close | ((a.isinf() | b.isinf()) & (a == b))
        return close | (a.isnan() & b.isnan()) if equal_nan else close

    def allclose(self, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08,
                 equal_nan: bool = False) -> Tensor:
        """`isclose(...).all()`: a 0-d bool tensor (as in tinygrad; `bool(t)` or `.item()` gives the Python bool)."""
        return self._m.isclose(other, rtol, atol, equal_nan).all()

    # ------------------------------------------------------------------ binary
    def copysign(self, other: Tensor | Scalar) -> Tensor:
        """|self| with the sign of `other` (-0.0 counts as negative). dtypes follow broadcasting, as in tinygrad."""
        a, b = self._m._broadcasted(other)
        negative = (b < 0) | (b.reciprocal() < 0) if b.dtype.is_float else b < 0
        magnitude = a.abs()
        return negative.where(-magnitude, magnitude)

    def fmod(self, x: Tensor | Scalar) -> Tensor:
        """C's remainder: the sign follows the dividend (`%` follows the divisor). Exact, for ints and floats."""
        from glassgrad.uop.ops import Ops
        a, b = self._m._broadcasted(x)
        if a.dtype.is_bool:
            a, b = a.cast(dtypes.int32), b.cast(dtypes.int32)
        return a._wrap(a.uop.alu(Ops.MOD, b.uop))

    def lerp(self, end: Tensor, weight: Tensor | Scalar) -> Tensor:
        """self + weight * (end - self) for |weight| < 0.5, else end - (end - self) * (1 - weight): PyTorch's
        formula (tinygrad has only the first), exact at both ends (weight 1 gives `end`, which self + (end - self)
        need not round to) and finite where it can be (lerp(inf, 0, 0.5) is inf, not inf - inf). Ints: the first."""
        t = self._m
        diff = end - t
        if not diff.dtype.is_float:
            return t + diff * weight
        if isinstance(weight, (int, float)):
            return t + weight * diff if abs(weight) < 0.5 else end - diff * (1 - weight)
        return (weight.abs() < 0.5).where(t + weight * diff, end - diff * (1 - weight))

    def logaddexp(self, other: Tensor | Scalar) -> Tensor:
        """log(exp(self) + exp(other)) without overflow: shifted by the (detached) larger of the two; -inf with
        -inf gives -inf."""
        a, b = self._m._float()._broadcasted(other)
        m = a.maximum(b).detach()
        m = m.isinf().where(0.0, m)
        return ((a - m).exp() + (b - m).exp()).log() + m

    # ------------------------------------------------------------------ logarithms and hyperbolic functions
    def log10(self) -> Tensor:
        return self._m.log2() * math.log10(2)

    @computed_in_float32
    def sinh(self) -> Tensor:
        """The series below |x| = 0.5, else e^(x - ln 2) - e^(-x - ln 2) (as cosh: no overflow before sinh's)."""
        x = self._m._float()
        near, small = _small(x, 0.5)
        return near.where(_odd_series(small, _SINH_SERIES), (x - _LN2).exp() - (-x - _LN2).exp())

    @computed_in_float32
    def cosh(self) -> Tensor:
        """e^(x - ln 2) + e^(-x - ln 2): e^x / 2 without e^x, which overflows float32 from 88.7 (cosh from 89.4)."""
        x = self._m._float()
        return (x - _LN2).exp() + (-x - _LN2).exp()

    @computed_in_float32
    def asinh(self) -> Tensor:
        """sign(x) log(|x| + sqrt(x^2 + 1)) (odd by construction), the series below |x| = 0.3, and log(2|x|) above
        2^32 (where sqrt(x^2 + 1) is |x| and x^2 would overflow: asinh(1e20) was inf)."""
        x = self._m._float()
        near, small = _small(x, 0.3)
        magnitude = x.abs()
        big, moderate = _huge(magnitude)
        far = x.sign() * (big.where(magnitude, moderate + (moderate * moderate + 1).sqrt()).log()
                          + big.where(math.log(2), 0.0))
        return near.where(_odd_series(small, _ASINH_SERIES), far)

    @computed_in_float32
    def acosh(self) -> Tensor:
        """log(x + sqrt(x - 1) sqrt(x + 1)): NaN below 1 (through the square root: x + sqrt(x^2 - 1) gave -inf or
        inf for some x <= -1), exact near 1 (x - 1 has no rounding there), and log(2x) above 2^32 (no overflow)."""
        x = self._m._float()
        big, moderate = _huge(x, 2.0)
        inside = moderate + (moderate - 1).sqrt() * (moderate + 1).sqrt()
        return big.where(x, inside).log() + big.where(math.log(2), 0.0)

    def atanh(self) -> Tensor:
        x = self._m._float()
        near, small = _small(x, 0.3)
        return near.where(_odd_series(small, _ATANH_SERIES), ((1 + x) / (1 - x)).log() * 0.5)

    # ------------------------------------------------------------------ inverse trigonometry
    def asin(self) -> Tensor:
        """A&S 4.4.46 (absolute error 2e-8) and the Taylor series below |x| = 0.25, where the formula cancels."""
        x = self._m._float()
        near, small = _small(x, 0.25)
        magnitude = x.abs()
        far = x.sign() * (math.pi / 2 - (1.0 - magnitude).sqrt() * _horner(magnitude, _ASIN_POLY))
        return near.where(_odd_series(small, _ASIN_SERIES), far)

    def acos(self) -> Tensor:
        return math.pi / 2 - self._m.asin()

    def atan(self) -> Tensor:
        """asin(x / sqrt(1 + x^2)) for |x| <= 1; beyond, pi/2 sign(x) - atan(1/x) (x^2 would overflow). The
        reciprocal is taken of 1 where it is not used: 1/0's infinite derivative made the gradient at 0 NaN."""
        x = self._m._float()
        inside = x.abs() <= 1
        y = inside.where(x, inside.where(1.0, x).reciprocal())  # |y| <= 1
        base = (y / (1 + y * y).sqrt()).asin()
        return inside.where(base, x.sign() * (math.pi / 2) - base)

    # ------------------------------------------------------------------ erf
    @computed_in_float32
    def erf(self) -> Tensor:
        """The error function, within ~1e-7 relative of math.erf in float32: the Taylor series below |x| = 1 and
        1 - erfc(|x|) above it (Numerical Recipes' erfc, relative error < 1.2e-7), with the sign of x."""
        x = self._m._float()
        near, small = _small(x, 1.0)
        z = x.abs()
        t = (1 + 0.5 * z).reciprocal()
        erfc = t * (_horner(t, _ERFC_POLY) - z * z).exp()
        return near.where(_odd_series(small, _ERF_SERIES), x.sign() * (1 - erfc))

    # ------------------------------------------------------------------ activations
    @computed_in_float32
    def celu(self, alpha: float = 1.0) -> Tensor:
        x = self._m._float()
        return x.maximum(0) + (alpha * ((x / alpha).minimum(0).exp() - 1))

    @computed_in_float32
    def selu(self, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
        """gamma * (x if x >= 0 else alpha*(e^x - 1)); tinygrad's rounded default constants (PyTorch carries more
        digits: the results differ by ~2e-6 relative)."""
        x = self._m._float()
        positive = x >= 0
        return gamma * positive.where(x, alpha * (positive.where(0.0, x).exp() - 1))

    @computed_in_float32
    def softsign(self) -> Tensor:
        x = self._m._float()
        return x / (1 + x.abs())

    @computed_in_float32
    def logsigmoid(self) -> Tensor:
        """log(sigmoid(x)) = -softplus(-x): finite for every finite x."""
        return -((-self._m._float()).softplus())

    @computed_in_float32
    def mish(self) -> Tensor:
        x = self._m._float()
        return x * x.softplus().tanh()
