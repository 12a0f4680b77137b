"""The GPU's two-stage reductions give numpy's values: columns split with the parts outermost, rows kept whole, a
weight gradient split to fill the GPU (schedule/__init__.py, `_gpu_parts`, `_gpu_fill_parts`). On CUDA only (skipped
without a GPU): on the CPU these reductions are one kernel, which the op suite checks."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor
from glassgrad.device import Device


def _cuda_or_skip() -> None:
    try:
        Device["CUDA"]
    except Exception as e:  # no driver, no GPU
        pytest.skip(f"no CUDA device: {e}")


@pytest.mark.parametrize("shape, axis", [((8, 1024, 768), (0, 1)), ((16, 256, 512), (0, 1)), ((100000, 3), (0,)),
                                         ((8192, 513), (0,)), ((64, 128, 56, 56), (0, 2, 3)), ((4096, 50304), (1,))])
def test_split_sums_match_numpy(shape: tuple[int, ...], axis: tuple[int, ...]) -> None:
    _cuda_or_skip()
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    out = Tensor(x, device="CUDA").sum(axis).numpy()
    np.testing.assert_allclose(out, x.astype(np.float64).sum(axis), rtol=1e-4, atol=1e-3 * np.sqrt(x.size / out.size))


def test_split_weight_gradient_matches_numpy() -> None:
    _cuda_or_skip()
    rng = np.random.default_rng(1)
    g, x = rng.standard_normal((16, 256, 1536), np.float32), rng.standard_normal((16, 256, 512), np.float32)
    out = (Tensor(g, device="CUDA").reshape(16, 256, 1536, 1) * Tensor(x, device="CUDA").reshape(16, 256, 1, 512))
    ref = np.einsum("bto,bti->oi", g.astype(np.float64), x.astype(np.float64))
    np.testing.assert_allclose(out.sum((0, 1)).numpy(), ref, rtol=1e-4, atol=2e-3)
