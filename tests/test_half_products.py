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


@pytest.mark.parametrize("dtype, bound", [("float16", 2e-3), ("bfloat16", 8e-3)])
@pytest.mark.parametrize("stride", [1, 2])
def test_padded_conv_input_gradient_of_small_halves(dtype: str, bound: float, stride: int) -> None:
    """The input gradient of a padded half convolution sums gated products `where(in_bounds, half(dO * w), 0)` over
    the taps and output channels. Each product was rounded to half: with a small output gradient (a mean loss over
    a large output, no loss scaling) the products fell below half's normal range, and the gradient was 4x PyTorch's
    error (5e-3 against 1.3e-3 relative, float16). Against the float64 sum of the same half values."""
    (x, _), (w, w64) = halves((2, 6, 10, 10), dtype, 1.0, 8), halves((8, 6, 3, 3), dtype, 0.1, 9)
    x.requires_grad = True
    out = x.conv2d(w, padding=1, stride=stride)
    g, g64 = halves(out.shape, dtype, 1e-5, 10)
    out.backward(g)
    assert x.grad is not None
    want = np.zeros((2, 6, 12, 12))  # the padded input's gradient: each output position adds dO * w to its window
    for ky in range(3):
        for kx in range(3):
            want[:, :, ky:ky + 10:stride, kx:kx + 10:stride] += np.einsum("noij,oc->ncij", g64, w64[:, :, ky, kx])
    assert relative(x.grad.float().numpy(), want[:, :, 1:11, 1:11]) < bound


def test_elementwise_half_products_still_round() -> None:
    """Only a sum's products are exact: `x * y` of halves is a half, rounded as PyTorch rounds it."""
    (a, a64), (b, b64) = halves((1000,), "float16", 1e-3, 4), halves((1000,), "float16", 1e-3, 5)
    np.testing.assert_array_equal((a * b).numpy(), (a64 * b64).astype(np.float16))


INT_PRODUCTS = {
    "matmul": (lambda a, b, dt: a.matmul(b, dtype=dt), lambda a, b: a @ b),
    "dot": (lambda a, b, dt: a.dot(b, dtype=dt), lambda a, b: a @ b),
    "linear": (lambda a, b, dt: a.linear(b, dtype=dt), lambda a, b: a @ b),
    "einsum": (lambda a, b, dt: Tensor.einsum("ij,jk->ik", a, b, dtype=dt), lambda a, b: a @ b),
    "conv2d": (lambda a, b, dt: a.reshape(1, 1, *a.shape).conv2d(b.T.reshape(b.shape[1], 1, 1, b.shape[0]), dtype=dt)
               .reshape(b.shape[1], a.shape[0]).T, lambda a, b: a @ b),
}


@pytest.mark.parametrize("acc", ["int32", "int64", "float32"])
@pytest.mark.parametrize("src", ["int8", "uint8", "int16"])
@pytest.mark.parametrize("op", list(INT_PRODUCTS))
def test_int_products_are_exact_in_the_accumulation_dtype(op: str, src: str, acc: str) -> None:
    """int8 @ int8 accumulated in int32 (a quantized layer) sums the exact products, as numpy's matmul(dtype=): each
    product was computed (and wrapped, mod 256) in int8 before the int32 sum, so products of ~100s were garbage."""
    rng = np.random.default_rng(0)
    lo, hi = (0, 255) if src == "uint8" else (-120, 120) if src == "int8" else (-300, 300)  # (sums exact in float32)
    a, b = rng.integers(lo, hi, (9, 40)).astype(src), rng.integers(lo, hi, (40, 5)).astype(src)
    fn, ref = INT_PRODUCTS[op]
    out = fn(Tensor(a), Tensor(b), getattr(dtypes, acc))
    assert out.dtype == getattr(dtypes, acc)
    want = ref(a.astype(np.int64), b.astype(np.int64))
    np.testing.assert_array_equal(out.numpy(), want.astype(acc))


def test_int_products_without_a_dtype_still_wrap_in_theirs() -> None:
    """Without `dtype`, int8 @ int8 stays int8 and wraps (PyTorch's and tinygrad's result dtype)."""
    a = np.full((2, 3), 100, np.int8)
    out = Tensor(a) @ Tensor(a.T.copy())
    assert out.dtype == dtypes.int8
    np.testing.assert_array_equal(out.numpy(), (a.astype(np.int64) @ a.T.astype(np.int64)).astype(np.int8))
