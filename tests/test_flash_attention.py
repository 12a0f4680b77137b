"""Flash attention: `scaled_dot_product_attention` (and autocast's `amp.attention`) without a T x T buffer.

Where it applies (FLASH_ATTENTION, `schedule.flash_attention`) the weights are spelled exp(s - logsumexp(s)) and the
scheduler recomputes the scores inside every kernel that reduces over them (`schedule._chained`); on a GPU those
kernels are chained tensor-core kernels (codegen/chained.py).

Checked here, everywhere: values and q/k/v gradients against a float64 numpy reference (causal, boolean and additive
masks, cross attention with more keys than queries), with FLASH_ATTENTION=1 forcing the form on the CPU; that no
buffer of T x T elements is scheduled and the kernel count; that CUDA renders the chained kernels by default for
bfloat16/float16 and that NVRTC compiles them (when installed); that the default leaves the CPU and float32 CUDA
alone. With a GPU (skipped otherwise): the values and gradients of the chained kernels.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from glassgrad import Tensor, amp, dtypes, kernels
from glassgrad.helpers import Context
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, dout: np.ndarray, mask: np.ndarray | None
              ) -> tuple[np.ndarray, ...]:
    """float64 attention and its q, k, v gradients for the loss sum(out * dout); `mask` is additive (-inf: hidden)."""
    q, k, v, dout = (x.astype(np.float64) for x in (q, k, v, dout))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ np.swapaxes(k, -1, -2) * scale + (0 if mask is None else mask)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    out = p @ v
    dv = np.swapaxes(p, -1, -2) @ dout
    dp = dout @ np.swapaxes(v, -1, -2)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    return out, ds @ k * scale, np.swapaxes(ds, -1, -2) @ q * scale, dv


def causal(rows: int, keys: int) -> np.ndarray:
    return np.where(np.arange(rows)[:, None] >= np.arange(keys)[None, :], 0.0, -np.inf)


def inputs(shape_q: tuple[int, ...], shape_kv: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in (shape_q, shape_kv, shape_kv, shape_q)]


def run(arrays: list[np.ndarray], mask: str, dtype: Any = dtypes.float32, device: str | None = None,
        autocast: bool = False) -> list[np.ndarray]:
    q, k, v = (Tensor(a, device=device).cast(dtype).detach() for a in arrays[:3])
    for t in (q, k, v):
        t.requires_grad = True
    dout = Tensor(arrays[3], device=device)
    rows, keys = arrays[0].shape[-2], arrays[1].shape[-2]
    kw: dict[str, Any] = {"is_causal": True} if mask == "causal" else {}
    if mask == "bool":
        kw["attn_mask"] = Tensor(causal(rows, keys) == 0, device=device)
    elif mask == "additive":
        kw["attn_mask"] = Tensor(np.where(causal(rows, keys) == 0, 0.25, -math.inf).astype(np.float32), device=device)
    if autocast:
        with amp.autocast(dtype):
            out = amp.attention(q, k, v, **kw)
    else:
        out = q.scaled_dot_product_attention(k, v, **kw)
    (out.float() * dout).sum().backward()
    return [t.float().numpy() for t in (out, q.grad, k.grad, v.grad)]  # type: ignore[union-attr]


def expected(arrays: list[np.ndarray], mask: str) -> tuple[np.ndarray, ...]:
    rows, keys = arrays[0].shape[-2], arrays[1].shape[-2]
    additive = None if mask == "none" else causal(rows, keys) + (0.25 if mask == "additive" else 0.0)
    return reference(*arrays, additive)


@pytest.mark.parametrize("mask", ["none", "causal", "bool", "additive"])
def test_forced_on_cpu_matches_reference(mask: str) -> None:
    arrays = inputs((2, 3, 128, 32), (2, 3, 128, 32))
    with Context(FLASH_ATTENTION=1):
        got = run(arrays, mask)
    for g, e, name in zip(got, expected(arrays, mask), ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5, err_msg=name)


def test_cross_attention_more_keys_than_queries() -> None:
    arrays = inputs((1, 2, 64, 16), (1, 2, 192, 16), seed=1)
    with Context(FLASH_ATTENTION=1):
        got = run(arrays, "none")
    for g, e, name in zip(got, expected(arrays, "none"), ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5, err_msg=name)


def _graph(rows: int, dim: int, dtype: Any, autocast: bool, backward: bool = True, device: str | None = None
           ) -> list[UOp]:
    q, k, v = (Tensor.empty(2, 3, rows, dim, dtype=dtype, device=device, requires_grad=True) for _ in range(3))
    if autocast:
        with amp.autocast(dtypes.bfloat16):
            out = amp.attention(q, k, v, is_causal=True)
    else:
        out = q.scaled_dot_product_attention(k, v, is_causal=True)
    if not backward:
        return [out.uop]
    (out.float() * out.float()).sum().backward()
    return [t.uop for t in (out, q.grad, k.grad, v.grad)]  # type: ignore[union-attr]


def _largest_buffer(uops: list[UOp]) -> tuple[int, int]:
    """(kernels, elements of the largest buffer any of them touches) of the schedule realizing `uops`."""
    schedule, _ = create_schedule(uops)
    return len(schedule), max(b.size for item in schedule for b in item.bufs)


def test_no_scores_buffer_when_forced() -> None:
    rows, dim = 256, 64
    with Context(FLASH_ATTENTION=1):  # (on the CPU: a GPU stores a computed tile factor or two more)
        forward, largest = _largest_buffer(_graph(rows, dim, dtypes.float32, False, backward=False, device="CPU"))
        # the rows' max, their sum of exp, their log-sum-exp (stored: schedule.COSTLY_IN_CHAIN), the product, the
        # output (plus the zero that carries lse's gradient)
        assert largest <= 2 * 3 * rows * dim and forward == 5
        count, largest = _largest_buffer(_graph(rows, dim, dtypes.float32, False, device="CPU"))
        assert largest <= 2 * 3 * rows * dim and count <= 12
    with Context(FLASH_ATTENTION=0):
        _, largest = _largest_buffer(_graph(rows, dim, dtypes.float32, False, device="CPU"))
        assert largest >= 2 * 3 * rows * rows  # the default on the CPU: the softmax's T x T buffers


@pytest.mark.parametrize("autocast", [False, True])
def test_default_on_cuda_for_halves_only(autocast: bool) -> None:
    """Built for CUDA (scheduled, not run: no GPU needed): bfloat16 attention is flash by default; float32 attention
    on CUDA and any attention on the CPU keep the softmax's T x T buffers."""
    rows = 256
    with Context(FLASH_ATTENTION=-1):
        _, largest = _largest_buffer(_graph(rows, 64, dtypes.bfloat16, autocast, device="CUDA"))
        assert largest <= 2 * 3 * rows * 64
        _, largest = _largest_buffer(_graph(rows, 64, dtypes.bfloat16, autocast, device="CPU"))
        assert largest >= 2 * 3 * rows * rows
        if not autocast:
            _, largest = _largest_buffer(_graph(rows, 64, dtypes.float32, False, device="CUDA"))
            assert largest >= 2 * 3 * rows * rows


def test_where_flash_applies_by_default() -> None:
    from glassgrad.schedule import flash_attention
    with Context(FLASH_ATTENTION=-1):
        assert flash_attention("CUDA", 1024, 1024, 64, dtypes.bfloat16)
        assert flash_attention("CUDA:1", 256, 512, 32, dtypes.float16)
        assert not flash_attention("CUDA", 1024, 1024, 64, dtypes.float32)
        assert not flash_attention("CPU", 1024, 1024, 64, dtypes.bfloat16)
        assert not flash_attention("CUDA", 1000, 1024, 64, dtypes.bfloat16)  # not whole tiles
        assert not flash_attention("CUDA", 1024, 1024, 128, dtypes.bfloat16)  # heads over 64: shared memory
        assert not flash_attention("CUDA", 1, 1024, 64, dtypes.bfloat16)  # one query (generation)
    with Context(FLASH_ATTENTION=1):
        assert flash_attention("CPU", 1024, 1024, 64, dtypes.float32)
        assert not flash_attention("CPU", 64, 1024, 64, dtypes.float32)  # scores no larger than the factors
    with Context(FLASH_ATTENTION=0):
        assert not flash_attention("CUDA", 1024, 1024, 64, dtypes.bfloat16)


def _cuda_flash_kernels(dtype: Any, autocast: bool) -> list[Any]:
    return kernels(*[Tensor(u) for u in _graph(256, 64, dtype, autocast, device="CUDA")])


@pytest.mark.parametrize("autocast", [False, True])
def test_cuda_renders_chained_kernels(autocast: bool) -> None:
    specs = _cuda_flash_kernels(dtypes.bfloat16, autocast)
    chained = [s for s in specs if "gg_mma_bf16" in s.source]
    assert len(chained) == 6  # max, sum, output; dq, dk, dv (D = sum(dO * out) is elementwise work)
    assert all(s.local_size == (128, 1, 1) for s in chained)
    assert sum("gg_pack_bf16" in s.source for s in chained) == 4  # the second products: out, dq, dk, dv
    assert sum("__shfl_xor_sync" in s.source for s in chained) == 2  # the row reductions: max, sum
    # the per-query log-sum-exp (and the backward's per-row factor) are stored once, not recomputed per score: no
    # chained kernel takes a log (dk's did, per element: its rows are the keys, the queries' statistics vary)
    assert not any("log2f" in s.source for s in chained)


def test_cuda_first_copies_run_once_before_the_key_loop() -> None:
    """Realized half q, k, v (as a model's projections are) are copied by cp.async. A chained kernel issues its rows'
    factors and the first step's keys once, before its loop over the keys; inside the loop it only fetches the next
    step's keys (gated by `step + 1 < count`). The row-reduction kernels (max, sum) issued the first copies again on
    every step, into the stage the previous step had filled with the keys of this one: from the third step on they
    reduced over the first keys again (wrong softmax statistics for T > 128, found on the H200; the GPU tests had
    only used lazily cast inputs, whose factors go through registers)."""
    import re
    specs = _cuda_flash_kernels(dtypes.bfloat16, False)
    chained = [s for s in specs if "gg_mma_bf16" in s.source]
    assert len(chained) == 6
    for spec in chained:
        body = spec.source.split("extern \"C\"", 1)[1]
        before, loop = re.split(r"for \(int ridx\d+ = 0;", body, maxsplit=1)
        assert "gg_cp_async" in before and "cp.async.commit_group" in before, spec.name
        copies = [line.strip() for line in loop.splitlines() if "gg_cp_async(" in line]
        assert copies and all(line.startswith("if (") for line in copies), (spec.name, copies[:3])


def test_cuda_chained_kernels_compile(nvrtc: Any) -> None:
    for dtype in (dtypes.bfloat16, dtypes.float16):
        for spec in _cuda_flash_kernels(dtype, False):
            assert nvrtc.compile(spec.source), spec.name


# ---------------------------------------------------------------------- on a GPU
@pytest.mark.parametrize("mask", ["none", "causal", "bool", "additive"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_values(cuda: str, mask: str, dtype: str) -> None:
    arrays = inputs((2, 3, 256, 64), (2, 3, 256, 64), seed=2)
    dt = getattr(dtypes, dtype)
    rounded = [Tensor(a).cast(dt).float().numpy() for a in arrays[:3]] + [arrays[3]]
    with Context(FLASH_ATTENTION=-1):
        got = run(arrays, mask, dt, cuda)
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    for g, e, name in zip(got, expected(rounded, mask), ("out", "dq", "dk", "dv")):
        scale = np.abs(e).max()
        assert np.abs(g - e).max() <= tol * scale, f"{name}: {np.abs(g - e).max()} vs {tol * scale}"


@pytest.mark.parametrize("mask", ["none", "causal"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_values_realized_inputs(cuda: str, mask: str, dtype: str) -> None:
    """Realized half q, k, v (cp.async copies; `run` casts lazily, whose factors go through registers) over more
    than two steps of keys: the softmax statistics were those of the first keys again from the third step on."""
    arrays = inputs((1, 4, 512, 64), (1, 4, 512, 64), seed=5)
    dt = getattr(dtypes, dtype)
    rounded = [Tensor(a).cast(dt).float().numpy() for a in arrays[:3]]
    q, k, v = (Tensor(a, device=cuda).cast(dt).contiguous().realize() for a in rounded)
    for t in (q, k, v):
        t.requires_grad = True
    with Context(FLASH_ATTENTION=-1):
        out = q.scaled_dot_product_attention(k, v, is_causal=mask == "causal")
        (out.float() * Tensor(arrays[3], device=cuda)).sum().backward()
    got = [t.float().numpy() for t in (out, q.grad, k.grad, v.grad)]  # type: ignore[union-attr]
    tol = 3e-2 if dtype == "bfloat16" else 5e-3
    for g, e, name in zip(got, expected(rounded + [arrays[3]], mask), ("out", "dq", "dk", "dv")):
        assert np.abs(g - e).max() <= tol * np.abs(e).max(), f"{name}: {np.abs(g - e).max()}"


def test_cuda_projected_heads_match_unfused(cuda: str) -> None:
    """GPT-2's attention as a model computes it: q, k, v are heads of one realized bf16 projection (strided views of
    a (B, T, 3C) buffer), T = 512 (8 key steps). Output and the gradients of the input and the projection's weight,
    flash kernels against the materialised softmax."""
    rng = np.random.default_rng(7)
    x_np = rng.standard_normal((2, 512, 256)).astype(np.float32)
    w_np = (rng.standard_normal((256, 768)) * 0.06).astype(np.float32)
    results = []
    for flash in (-1, 0):
        x = Tensor(x_np, device=cuda).cast(dtypes.bfloat16).contiguous().realize()
        w = Tensor(w_np, device=cuda).cast(dtypes.bfloat16).contiguous().realize()
        x.requires_grad = w.requires_grad = True
        with Context(FLASH_ATTENTION=flash):
            qkv = x @ w
            q, k, v = (t.reshape(2, 512, 4, 64).transpose(1, 2) for t in qkv.split(256, dim=-1))
            out = q.scaled_dot_product_attention(k, v, is_causal=True)
            (out.float() * out.float()).mean().backward()
        results.append([t.float().numpy() for t in (out, x.grad, w.grad)])  # type: ignore[union-attr]
    for f, p, name in zip(*results, ("out", "dx", "dw")):
        assert np.abs(f - p).max() <= 3e-2 * np.abs(p).max(), name


def test_cuda_autocast_matches_unfused(cuda: str) -> None:
    """The bf16 flash kernels against the same attention with flash off (materialised softmax), on the GPU."""
    arrays = inputs((2, 4, 512, 64), (2, 4, 512, 64), seed=3)
    with Context(FLASH_ATTENTION=1):
        flash = run(arrays, "causal", dtypes.bfloat16, cuda, autocast=True)
    with Context(FLASH_ATTENTION=0):
        plain = run(arrays, "causal", dtypes.bfloat16, cuda, autocast=True)
    for f, p, name in zip(flash, plain, ("out", "dq", "dk", "dv")):
        assert np.abs(f - p).max() <= 2e-2 * np.abs(p).max(), name


def _key_loop_bounds(specs: list[Any]) -> list[str]:
    """The trip count of each chained kernel's loop over the keys (its first reduce loop), as rendered."""
    import re
    bounds = []
    for spec in specs:
        if "gg_mma" in spec.source:
            found = re.search(r"for \(int ridx\d+ = 0; ridx\d+ < ([^;]+);", spec.source)
            assert found is not None, spec.name
            bounds.append(found.group(1))
    return bounds


def test_causal_tiles_are_skipped_only_where_the_weight_is_the_identity() -> None:
    """Causal flash attention's chained kernels loop over the keys a block's rows see (a bound computed from the
    block), and a mask whose hidden value is not the reduction's identity (-1e9 instead of -inf: exp gives a
    tiny number, not provably 0) keeps every tile."""
    causal = _cuda_flash_kernels(dtypes.bfloat16, False)
    assert all(not b.isdigit() for b in _key_loop_bounds(causal)) and len(_key_loop_bounds(causal)) == 6
    q, k, v = (Tensor.empty(2, 3, 256, 64, dtype=dtypes.bfloat16, device="CUDA") for _ in range(3))
    rows = Tensor.arange(256, device="CUDA").reshape(-1, 1) >= Tensor.arange(256, device="CUDA").reshape(1, -1)
    scores = (q @ k.transpose(-1, -2)).float() * 0.125
    out = rows.where(scores, -1e9).softmax(-1).cast(dtypes.bfloat16) @ v
    bounds = _key_loop_bounds(kernels(out))
    assert bounds and all(b.isdigit() for b in bounds)


@pytest.mark.parametrize("width", [16, 32, 48, 64, 80, 96, 112, 128])
def test_shared_tile_layout_is_a_permutation_within_the_tile(width: int) -> None:
    """Every (row, column) of a chained kernel's swizzled shared tile has its own slot inside the tile, for every
    head width the default allows or a forced run takes (a 48-wide row's XOR once reached past its row)."""
    from glassgrad.codegen.chained import ROWS, _at, _evaluate
    from glassgrad.dtype import dtypes as dt
    pos, kk = (UOp(Ops.RANGE, dt.int32, (UOp.const(dt.int32, n),), (i, "global")) for i, n in enumerate((ROWS, width)))
    index = _evaluate(_at(100, width, pos, kk), {pos: np.arange(ROWS)[:, None], kk: np.arange(width)[None, :]})
    assert sorted(index.ravel().tolist()) == list(range(100, 100 + ROWS * width))


def test_cuda_backward_stores_fewer_copies() -> None:
    """Rendered for CUDA (no GPU needed), bf16 causal attention's gradients as bench/gpt.py asks for them,
    `(out * dout).sum().gradient(q, k, v)`, are 11 kernels: the chained six, `D = sum(dO * out)`, two per-row ones,
    and two copies: dO (`1 * dout`, the seed gradient times dout) and dV (computed as (dO^T P)^T, then transposed).
    dK was a third copy, through two transposes that cancel (`UOp.permute` composes them)."""
    q, k, v, dout = (Tensor.empty(2, 4, 256, 64, dtype=dtypes.bfloat16, device="CUDA") for _ in range(4))
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    specs = kernels(*(out * dout).sum().gradient(q, k, v))
    assert len(specs) == 11, [s.name for s in specs]
    assert sum(s.name.startswith("E_") for s in specs) == 4, [s.name for s in specs]  # lse, row factor, 2 copies
