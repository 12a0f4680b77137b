"""The tiled launch shape for matmul-shaped reductions (shared-memory tiles, one barrier per k step, double
buffering) computes the right numbers: run on the EMULATED Metal device, whose threads are real threads and whose
barriers are real barriers, so a missing barrier or a tile overwritten too early shows as wrong results in CI.
"""
from __future__ import annotations

import metal_emulator
import numpy as np
import pytest

from glassgrad import Tensor
from glassgrad.device import Compiled
from glassgrad.kernels import kernels
from glassgrad.uop.ops import Ops

pytestmark = metal_emulator.needs_cxx


@pytest.mark.parametrize("m,k,n", [(130, 70, 129), (64, 8, 64), (200, 33, 65), (130, 24, 64), (64, 24, 32)])
def test_tiled_matmul(emulated: Compiled, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m + k + n)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    out = Tensor(a, device="METAL") @ Tensor(b, device="METAL")
    assert any(u.op is Ops.BARRIER for u in kernels(out)[-1].uops)  # the tiled shape, not the flat one
    np.testing.assert_allclose(out.numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_tiled_conv_and_batched_matmul(emulated: Compiled) -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 5, 12, 12), dtype=np.float32), rng.standard_normal((70, 5, 3, 3), dtype=np.float32)
    conv = Tensor(x, device="METAL").conv2d(Tensor(w, device="METAL"), padding=1).numpy()
    np.testing.assert_allclose(conv, Tensor(x).conv2d(Tensor(w), padding=1).numpy(), rtol=1e-4, atol=1e-4)
    a, b = rng.standard_normal((3, 70, 20), dtype=np.float32), rng.standard_normal((3, 20, 90), dtype=np.float32)
    np.testing.assert_allclose((Tensor(a, device="METAL") @ Tensor(b, device="METAL")).numpy(), a @ b, rtol=1e-4,
                               atol=1e-4)
