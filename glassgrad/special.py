"""Special functions built from Tensor ops, for the ops that need them (exact gelu needs erf).

In: a tensor. Out: a lazy tensor of the same shape, composed of elementwise ops only (one fused kernel, and autograd
differentiates it like anything else).

`_erf` is private on purpose: the public `Tensor.erf` is added elsewhere; once it is in, `gelu` can call it instead.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor

_SERIES_LIMIT = 0.5
# erfc(z) = t * exp(-z^2 + P(t)), t = 1 / (1 + z/2), z >= 0: the Chebyshev fit of Numerical Recipes' `erfcc`, whose
# relative error is below 1.2e-7 for every z (so erfc keeps its precision far into the tail, where it underflows)
_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
                -0.82215223, 0.17087277)


def _erf(x: Tensor) -> Tensor:
    """erf(x), to float32 precision (absolute error below 2e-7; float64 inputs get the same, not float64's).

    |x| < 0.5: its Taylor series to x^11 (relative error below 1e-8, so tiny inputs keep their precision);
    otherwise sign(x) * (1 - erfc(|x|)) from the fit above. Each branch only ever sees inputs in its own range, so
    neither overflows and the gradient is finite everywhere (0 far out in the tails, as it should be)."""
    x = x._float()
    small = x.abs() < _SERIES_LIMIT
    s = small.where(x, 0.0)
    s2 = s * s
    series = s * (2 / math.sqrt(math.pi)) * (1 + s2 * (-1 / 3 + s2 * (1 / 10 + s2 * (-1 / 42 + s2 * (
        1 / 216 + s2 * (-1 / 1320))))))
    z = small.where(1.0, x.abs())
    t = (1 + 0.5 * z).reciprocal()
    poly = t * 0.0 + _ERFC_COEFFS[-1]
    for c in reversed(_ERFC_COEFFS[:-1]):
        poly = poly * t + c
    erfc = t * (poly - z * z).exp()
    return small.where(series, (x > 0).where(1 - erfc, erfc - 1))
