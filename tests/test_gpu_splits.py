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


@pytest.mark.parametrize("m, k, n", [(768, 8192, 3072), (512, 4096, 2048), (768, 8192, 768)])
def test_split_weight_gradient_parts_outermost(m: int, k: int, n: int) -> None:
    """Rendered for CUDA (no GPU needed): a long-k product with too few tiles for the GPU is split into parts that
    are the first stage's outermost (batch) axis, so each tile stores its partial sums contiguously; the second
    stage sums the parts."""
    import glassgrad
    from glassgrad import dtypes
    a, b = Tensor.empty(k, m, dtype=dtypes.bfloat16), Tensor.empty(k, n, dtype=dtypes.bfloat16)
    names = [kernel.name for kernel in glassgrad.kernels(a.T @ b, device="CUDA")]
    assert len(names) == 2, names
    first, second = names
    parts = int(first.split("_")[1])
    assert parts > 1 and first.startswith(f"r_{parts}_{m}_{n}_"), names
    assert second == f"r_{m}_{n}_{parts}", names


def test_a_bf16_factor_read_by_two_matmuls_is_stored_once() -> None:
    """Rendered for CUDA (no GPU needed): a LayerNorm's output cast to bfloat16 feeds a matmul forward and, through
    other views, its weight gradient. The forward's walk stores it as the reshape its tile copies read, the weight
    gradient's as the cast itself; a reshape of a stored buffer is a view of it, so only one kernel computes and
    stores the normalised values (two did)."""
    import glassgrad
    from glassgrad import dtypes
    x = Tensor.empty(8, 64, 96, requires_grad=True)
    w, b = Tensor.empty(96, requires_grad=True), Tensor.empty(96, requires_grad=True)
    weight = Tensor.empty(96, 256, requires_grad=True)
    out = (x.layernorm() * w + b).cast(dtypes.bfloat16) @ weight.cast(dtypes.bfloat16)
    loss = (out.float() * Tensor.empty(8, 64, 256)).sum()
    programs = glassgrad.kernels(loss, *loss.gradient(x, w, b, weight), device="CUDA")
    stores = [p.name for p in programs if p.name == "E_8_64_96" and "__nv_bfloat16* __restrict__ data0" in p.source]
    assert len(stores) == 1, [p.name for p in programs]


@pytest.mark.parametrize("n", [2**31 + 77, 1_000_003, 2 * 999_983, 17 * 65_537])
def test_lengths_without_a_good_divisor_split_into_full_parts(n: int) -> None:
    """Rendered for CUDA (no GPU needed): the sum of a length with no divisor in 64..256 is split into 256 parts,
    the reduction padded with zeros to a multiple. The parts had to divide it: 2**31 + 77 = 25 x 85899349 gave 25
    work-groups whose threads each summed 335,000 values in float32 (the mean of 2**31 uint8 values of ~125 came
    out 124.72 on an H200), a prime length one work-group (one multiprocessor of 132)."""
    import glassgrad
    from glassgrad import dtypes
    x = Tensor.empty(n, dtype=dtypes.uint8)
    programs = glassgrad.kernels(x.float().mean(), device="CUDA")
    assert [p.global_size[0] for p in programs] == [256, 1], [(p.name, p.global_size) for p in programs]


PADDED = {  # each needs the padding to be its reduction's identity
    "sum": (lambda t: t.sum(), lambda a: a.astype(np.float64).sum()),
    "max of negatives": (lambda t: (-t.abs() - 1).max(), lambda a: (-np.abs(a) - 1).max()),
    "min of positives": (lambda t: (t.abs() + 1).min(), lambda a: (np.abs(a) + 1).min()),
    "prod of signs": (lambda t: t.sign().prod(), lambda a: np.prod(np.sign(a))),  # (exact: a 0 in the padding shows)
    "argmax": (lambda t: t.argmax(), lambda a: a.argmax()),
    "all": (lambda t: (t > -10).all(), lambda a: (a > -10).all()),
    "int max of negatives": (lambda t: (-(t.abs() * 100).int() - 1).max(),
                             lambda a: (-(np.abs(a) * 100).astype(np.int32) - 1).max()),
}


@pytest.mark.parametrize("name", list(PADDED))
def test_padded_split_reductions_match_numpy(name: str) -> None:
    """A prime length (1,000,003) is split with padding (on every device: the CPU splits such reductions for its
    threads); sum, max, min, prod, argmax, all and an int max each see only their own identity in the padding."""
    a = np.random.default_rng(0).standard_normal(1_000_003).astype(np.float32)
    got, want = PADDED[name][0](Tensor(a)).numpy(), PADDED[name][1](a)
    np.testing.assert_allclose(got, want, rtol=1e-4)
