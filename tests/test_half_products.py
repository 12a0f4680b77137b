"""Sums of float16/bfloat16 products (matmuls, convolutions, einsum) take each product exactly, as numpy, PyTorch
and cuBLAS do (`symbolic._exact_half_products`): a product of two halves is exact in float32, so the kernel does
not round it to half before accumulating. Rounded, products of small values (a gradient from a small loss, weights
near 1e-3) lost most of their bits: a float16 matmul of values ~1e-3 was 1.8% off the exact result where PyTorch's
is 0.05% off. Checked against the float64 product of the same half inputs: the error is PyTorch's (float32
accumulation) and far below the rounded products'."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor, dtypes

NP_HALF = {"float16": np.float16}


def halves(shape: tuple[int, ...], dtype: str, scale: float, seed: int) -> tuple[Tensor, np.ndarray]:
    """A half tensor and its exact values as float64."""
    rng = np.random.default_rng(seed)
    t = Tensor((rng.standard_normal(shape) * scale).astype(np.float32)).cast(getattr(dtypes, dtype)).realize()
    return t, t.float().numpy().astype(np.float64)


def relative(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


@pytest.mark.parametrize("dtype, bound", [("float16", 2e-3), ("bfloat16", 8e-3)])
@pytest.mark.parametrize("scale", [1e-3, 1.0])
def test_matmul_of_halves_takes_exact_products(dtype: str, bound: float, scale: float) -> None:
    (a, a64), (b, b64) = halves((64, 300), dtype, scale, 0), halves((300, 50), dtype, scale, 1)
    assert relative((a @ b).float().numpy(), a64 @ b64) < bound  # rounding of the half result only


@pytest.mark.parametrize("dtype, bound", [("float16", 2e-3), ("bfloat16", 8e-3)])
def test_conv_and_einsum_of_small_halves(dtype: str, bound: float) -> None:
    (x, x64), (w, w64) = halves((2, 8, 9, 9), dtype, 1e-3, 2), halves((4, 8, 3, 3), dtype, 1e-3, 3)
    got = x.conv2d(w).float().numpy()
    windows = np.lib.stride_tricks.sliding_window_view(x64, (3, 3), axis=(2, 3))  # (2, 8, 7, 7, 3, 3)
    assert relative(got, np.einsum("ncijkl,ockl->noij", windows, w64)) < bound
    (c, c64), (d, d64) = halves((16, 81), dtype, 1e-3, 6), halves((81, 4), dtype, 1e-3, 7)
    assert relative(Tensor.einsum("ij,jk->ik", c, d).float().numpy(), c64 @ d64) < bound


def test_elementwise_half_products_still_round() -> None:
    """Only a sum's products are exact: `x * y` of halves is a half, rounded as PyTorch rounds it."""
    (a, a64), (b, b64) = halves((1000,), "float16", 1e-3, 4), halves((1000,), "float16", 1e-3, 5)
    np.testing.assert_array_equal((a * b).numpy(), (a64 * b64).astype(np.float16))
