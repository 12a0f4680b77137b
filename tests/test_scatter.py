"""Scatters (glassgrad/schedule/scatter.py): a one-hot sum over the positions an index names,
`dW[v] = sum_t where(a[t] == v, g[t], 0)` (the backward of embedding, gather and advanced indexing, and the forward of
`scatter(reduce="add")` / `scatter_reduce("sum")`), is scheduled as a SCATTER: a zero fill, then a kernel whose loops
run over the source's elements (O(T*D), not O(V*T*D)) adding each into its place.

Values are checked against numpy (and PyTorch where installed): repeated indices must accumulate, out-of-range ones
add nothing, every dim and negative dims of `gather`, `x[idx]` and `x[:, idx]`, int and float dtypes, empty and 0-d
index tensors, a tied embedding (the weight used as a lookup and as the head `x @ W.T`). The kernels are checked to be
a scatter (an accumulating store, loops over the source only), the CPU's threading rule is checked on the kernels it
decides, and the CUDA and Metal renderings use atomics (or keep the one-hot sum for a dtype they cannot add).
"""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Device, Tensor, TinyJit, dtypes, kernels
from glassgrad.codegen import ProgramSpec, outer_loop_splits
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp
from tests.torch_optional import needs_torch, torch

RNG = np.random.default_rng(0)
cpu_only = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the CPU's threading of scatter kernels")


def _adds(dtype: dtypes) -> bool:  # type: ignore[valid-type]
    """Whether the device under test scatters this dtype (else it keeps the one-hot sum)."""
    from glassgrad.kernels import renderer_class
    return dtype in renderer_class(Device.DEFAULT).scatter_dtypes


def _is_scatter(spec: ProgramSpec) -> bool:
    return "+=" in spec.source or "atomic" in spec.source


def _scatter_asts(t: Tensor) -> list[UOp]:
    """The kernels computing t (not realized yet) that add at data-dependent places."""
    items = create_schedule([t.uop])[0]
    return [i.ast for i in items if i.ast.op is Ops.SINK and
            any(u.op is Ops.STORE and u.arg is Ops.ADD for u in i.ast.toposort())]


def _loop_product(ast: UOp) -> int:
    return int(np.prod([u.src[0].arg for u in ast.toposort() if u.op is Ops.RANGE]))


def _embedding_grad_reference(w: np.ndarray, idx: np.ndarray, g: np.ndarray) -> np.ndarray:
    out = np.zeros_like(w)
    for i, row in zip(idx.reshape(-1), g.reshape(-1, w.shape[1])):
        if 0 <= i < w.shape[0]:
            out[i] += row
    return out


# ---------------------------------------------------------------- embedding
@pytest.mark.parametrize("shape", [(2, 5), (7,), (3, 1, 4)])
def test_embedding_backward_accumulates_repeats(shape: tuple[int, ...]) -> None:
    vocab, dim = 6, 5
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    idx = RNG.integers(0, vocab, shape).astype(np.int32)
    idx.reshape(-1)[:3] = 2  # repeated on purpose
    g = RNG.standard_normal((*shape, dim)).astype(np.float32)
    W = Tensor(w, requires_grad=True)
    (Tensor(idx).embedding(W) * Tensor(g)).sum().backward()
    assert W.grad is not None
    np.testing.assert_allclose(W.grad.numpy(), _embedding_grad_reference(w, idx, g), rtol=1e-5, atol=1e-6)


def test_embedding_backward_is_a_scatter_kernel() -> None:
    vocab, tokens, dim = 300, 40, 16
    W = Tensor(RNG.standard_normal((vocab, dim)).astype(np.float32), requires_grad=True)
    idx = Tensor(RNG.integers(0, vocab, (tokens,)).astype(np.int32))
    (idx.embedding(W) * Tensor(RNG.standard_normal((tokens, dim)).astype(np.float32))).sum().backward()
    assert W.grad is not None
    asts = _scatter_asts(W.grad)
    assert len(asts) == 1
    assert _loop_product(asts[0]) == tokens * dim  # O(T*D): no loop over the vocabulary
    # and no kernel of the gradient loops over vocab x tokens any more (the one-hot sum did)
    specs = kernels(W.grad)
    assert all(int(s.work) < vocab * tokens for s in specs), [(s.name, s.work) for s in specs]
    assert sum(1 for s in specs if _is_scatter(s)) == 1


def test_embedding_out_of_range_indices_add_nothing() -> None:
    vocab, dim = 5, 3
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    idx = np.array([-1, 0, 5, 4, 100, -7, 4], dtype=np.int32)
    g = RNG.standard_normal((len(idx), dim)).astype(np.float32)
    W = Tensor(w, requires_grad=True)
    out = Tensor(idx).embedding(W)
    np.testing.assert_allclose(out.numpy(), np.where(((idx >= 0) & (idx < vocab))[:, None], w[np.clip(idx, 0, 4)], 0))
    (out * Tensor(g)).sum().backward()
    assert W.grad is not None
    np.testing.assert_allclose(W.grad.numpy(), _embedding_grad_reference(w, idx, g), rtol=1e-6)


def test_embedding_forward_still_a_gather() -> None:
    w = RNG.standard_normal((50, 4)).astype(np.float32)
    idx = RNG.integers(0, 50, (3, 6)).astype(np.int32)
    out = Tensor(idx).embedding(Tensor(w))
    items = create_schedule([out.uop])[0]
    assert not any(u.op in (Ops.REDUCE,) or (u.op is Ops.STORE and u.arg is Ops.ADD)
                   for i in items for u in i.ast.toposort())
    np.testing.assert_array_equal(out.numpy(), w[idx])


def test_empty_and_0d_indices() -> None:
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    W = Tensor(w, requires_grad=True)
    Tensor(np.zeros((0,), np.int32)).embedding(W).sum().backward()
    assert W.grad is not None
    np.testing.assert_array_equal(W.grad.numpy(), np.zeros_like(w))
    W2 = Tensor(w, requires_grad=True)
    (Tensor(np.array(2, np.int32)).embedding(W2) * Tensor(np.array([1.0, 2.0, 3.0], np.float32))).sum().backward()
    assert W2.grad is not None
    expected = np.zeros_like(w)
    expected[2] = [1, 2, 3]
    np.testing.assert_array_equal(W2.grad.numpy(), expected)
    x = Tensor(w, requires_grad=True)
    (x[Tensor(np.array(3, np.int32)) + 0] * 2).sum().backward()  # a 0-d index computed on the device
    assert x.grad is not None
    expected = np.zeros_like(w)
    expected[3] = 2
    np.testing.assert_array_equal(x.grad.numpy(), expected)


# ---------------------------------------------------------------- gather, indexing
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_gather_backward_every_dim(dim: int) -> None:
    shape = (4, 5, 3)
    x = RNG.standard_normal(shape).astype(np.float32)
    d = dim % 3
    index_shape = list(shape)
    index_shape[d] = 7  # more picks than entries: repeats
    idx = RNG.integers(0, shape[d], index_shape).astype(np.int32)
    g = RNG.standard_normal(index_shape).astype(np.float32)
    X = Tensor(x, requires_grad=True)
    out = X.gather(dim, Tensor(idx))
    np.testing.assert_allclose(out.numpy(), np.take_along_axis(x, idx, d))
    (out * Tensor(g)).sum().backward()
    expected = np.zeros_like(x)
    for pos in np.ndindex(*index_shape):
        target = list(pos)
        target[d] = idx[pos]
        expected[tuple(target)] += g[pos]
    assert X.grad is not None
    np.testing.assert_allclose(X.grad.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_advanced_indexing_backward() -> None:
    x = RNG.standard_normal((6, 5)).astype(np.float32)
    rows = np.array([0, 5, 5, 2, 5, 0], dtype=np.int32)
    cols = np.array([[4, 4], [1, 0]], dtype=np.int32)
    g1 = RNG.standard_normal((6, 5)).astype(np.float32)
    g2 = RNG.standard_normal((6, 2, 2)).astype(np.float32)
    X = Tensor(x, requires_grad=True)
    ((X[Tensor(rows)] * Tensor(g1)).sum() + (X[:, Tensor(cols)] * Tensor(g2)).sum()).backward()
    expected = np.zeros_like(x)
    np.add.at(expected, rows, g1)
    np.add.at(expected, (slice(None), cols), g2)
    assert X.grad is not None
    np.testing.assert_allclose(X.grad.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_negative_and_out_of_range_device_indices() -> None:
    x = RNG.standard_normal((5, 2)).astype(np.float32)
    idx = np.array([-1, -5, 0, 4, 7, -9], dtype=np.int32)
    X = Tensor(x, requires_grad=True)
    (X[Tensor(idx) + 0] * 3).sum().backward()  # computed on the device: not checked on the host
    expected = np.zeros_like(x)
    for i in idx:
        if -5 <= i < 5:
            expected[i] += 3
    assert X.grad is not None
    np.testing.assert_allclose(X.grad.numpy(), expected)


@pytest.mark.parametrize("dtype", [dtypes.int32, dtypes.int64, dtypes.int8, dtypes.uint8, dtypes.float16,
                                   dtypes.float64, dtypes.bfloat16])
def test_scatter_add_dtypes(dtype: dtypes) -> None:  # type: ignore[valid-type]
    """`scatter(reduce="add")` (a one-hot sum in its forward) in several dtypes, duplicates included."""
    base = RNG.integers(0, 5, (4, 3))
    src = RNG.integers(0, 5, (6, 3))
    idx = RNG.integers(0, 4, (6, 3)).astype(np.int32)
    idx[:3, 0] = 1
    values = Tensor(src.astype(np.float32)).cast(dtype)
    out = Tensor(base.astype(np.float32)).cast(dtype).scatter(0, Tensor(idx), values, reduce="add")
    assert out.dtype == dtype
    accumulates_in = dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype  # (as `sum`)
    assert len(_scatter_asts(out)) == (1 if _adds(accumulates_in) else 0)
    expected = base.copy()
    for (i, j), v in np.ndenumerate(idx):
        expected[v, j] += src[i, j]
    np.testing.assert_array_equal(out.float().numpy(), expected.astype(np.float32))


HALF_SCATTER_SUMS = {
    "scatter_add": lambda b, i, s: b.scatter_add(0, i, s),
    "scatter add": lambda b, i, s: b.scatter(0, i, s, reduce="add"),
    "scatter_reduce sum": lambda b, i, s: b.scatter_reduce(0, i, s, "sum", include_self=False),
    "scatter_reduce mean": lambda b, i, s: b.scatter_reduce(0, i, s, "mean", include_self=False) * Tensor(COUNTS),
}
COUNTS = np.array([[1000.0]] + [[1.0]] * 4, np.float32)  # row 0 takes 1000 values (its mean, times 1000, is the sum)


@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
@pytest.mark.parametrize("op", list(HALF_SCATTER_SUMS))
def test_half_scatter_sums_accumulate_in_float32(op: str, dtype: dtypes) -> None:  # type: ignore[valid-type]
    """float16/bfloat16 scatter sums accumulate in float32, as `sum` of halves does (and PyTorch's scatter_add):
    accumulated in their own dtype, 1000 bfloat16 values added into one place were 1.6 off a sum of 11 (PyTorch:
    0.12, its final rounding), float16 0.27 off. The result is within a rounding of the exact sum of the inputs."""
    rng = np.random.default_rng(0)
    idx = np.concatenate([np.zeros(1000, np.int64), np.arange(1, 5)]).reshape(-1, 1).repeat(3, 1)
    src = Tensor(rng.standard_normal((1004, 3)).astype(np.float32)).cast(dtype)
    out = HALF_SCATTER_SUMS[op](Tensor.zeros(5, 3).cast(dtype), Tensor(idx), src)
    exact = np.zeros((5, 3))
    np.add.at(exact, (idx, np.arange(3)), src.float().numpy().astype(np.float64))
    ulp = 2.0 ** (-8 if dtype == dtypes.bfloat16 else -11)
    np.testing.assert_allclose(out.float().numpy(), exact, rtol=2 * ulp, atol=0.05)


def test_scatter_reduce_sum_int() -> None:
    base = np.arange(8, dtype=np.int32)
    idx = np.array([1, 1, 1, 7, 0, 3], dtype=np.int32)
    src = np.array([5, 6, 7, 8, 9, 10], dtype=np.int32)
    out = Tensor(base).scatter_reduce(0, Tensor(idx), Tensor(src), "sum")
    expected = base.copy()
    np.add.at(expected, idx, src)
    np.testing.assert_array_equal(out.numpy(), expected)


@cpu_only
def test_bincount_like_sum_runs_on_one_cpu_thread() -> None:
    """A one-hot count with no output axis but the scattered one: no loop can be split over threads safely, so the
    CPU kernel says one thread (work 0). Large enough that it would otherwise be split."""
    n, bins = 1 << 17, 8
    idx = RNG.integers(0, bins, n).astype(np.int32)
    hit = Tensor(idx).reshape(n, 1) == Tensor.arange(bins).reshape(1, bins)
    counts = hit.where(1, 0).sum(0)
    specs = [s for s in kernels(counts) if "+=" in s.source]
    assert len(specs) == 1 and specs[0].work == 0
    np.testing.assert_array_equal(counts.numpy(), np.bincount(idx, minlength=bins))


@cpu_only
def test_threaded_cpu_scatter_matches() -> None:
    """An embedding gradient large enough for several CPU threads: split along the width (an output axis), each
    element is summed by one thread, in token order."""
    vocab, tokens, dim = 64, 2048, 128
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    idx = RNG.integers(0, 8, tokens).astype(np.int32)  # few rows: many collisions
    g = RNG.standard_normal((tokens, dim)).astype(np.float32)
    W = Tensor(w, requires_grad=True)
    (Tensor(idx).embedding(W) * Tensor(g)).sum().backward()
    assert W.grad is not None
    specs = [s for s in kernels(W.grad) if "+=" in s.source]
    assert len(specs) == 1 and int(specs[0].work) > 0 and specs[0].global_size[0] > 1
    np.testing.assert_allclose(W.grad.numpy(), _embedding_grad_reference(w, idx, g), rtol=1e-4, atol=1e-4)


def test_outer_loop_rule() -> None:
    """`outer_loop_splits` on hand-made indices: d + 512*clamp(load) splits along d; a data-dependent outer loop or
    a stride that another term can make up for does not."""
    from glassgrad.dtype import dtypes as dt
    d = UOp(Ops.RANGE, dt.int32, (UOp.const(dt.int32, 512),), (0, "global"))
    t = UOp(Ops.RANGE, dt.int32, (UOp.const(dt.int32, 64),), (1, "global"))
    buf = UOp(Ops.DEFINE_GLOBAL, dt.int32, (), 1)
    row = UOp(Ops.LOAD, dt.int32, (buf, t)).maximum(UOp.const(dt.int32, 0))
    out = UOp(Ops.DEFINE_GLOBAL, dt.float32, (), 0)

    def sink(index: UOp) -> UOp:
        return UOp(Ops.SINK, dt.void, (UOp(Ops.STORE, dt.void, (out, index, UOp.const(dt.float32, 1.0)), Ops.ADD),))
    assert outer_loop_splits(sink(d + row * UOp.const(dt.int32, 512)), d)
    assert not outer_loop_splits(sink(d + row * UOp.const(dt.int32, 512)), t)
    assert not outer_loop_splits(sink(d + row * UOp.const(dt.int32, 256)), d)  # d=256 meets row+1 at d=0
    assert outer_loop_splits(sink(d * UOp.const(dt.int32, 64) + t), d)  # plain store index: distinct
    lane = UOp(Ops.RANGE, dt.int32, (UOp.const(dt.int32, 16),), (2, "upcast"))
    blocks = UOp(Ops.RANGE, dt.int32, (UOp.const(dt.int32, 32),), (0, "global"))
    tiled = blocks * UOp.const(dt.int32, 16) + lane
    assert outer_loop_splits(sink(tiled + row * UOp.const(dt.int32, 512)), blocks)  # blocks of 16 lanes
    assert not outer_loop_splits(sink(tiled + row * UOp.const(dt.int32, 500)), blocks)


# ---------------------------------------------------------------- tied embedding, JIT
@needs_torch
def test_tied_embedding_matches_torch() -> None:
    vocab, tokens, dim = 37, 12, 8
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    idx = RNG.integers(0, vocab, (2, tokens)).astype(np.int64)
    W = Tensor(w, requires_grad=True)
    h = Tensor(idx).embedding(W)
    logits = (h.tanh() @ W.T)
    loss = logits.log_softmax(-1).mean()
    loss.backward()
    tw = torch.tensor(w, requires_grad=True)
    th = torch.nn.functional.embedding(torch.tensor(idx), tw)
    (torch.tanh(th) @ tw.T).log_softmax(-1).mean().backward()
    assert W.grad is not None
    np.testing.assert_allclose(loss.numpy(), loss.numpy())
    np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_tied_embedding_matches_numpy() -> None:
    vocab, tokens, dim = 23, 10, 6
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    idx = RNG.integers(0, vocab, tokens).astype(np.int32)
    W = Tensor(w, requires_grad=True)
    (Tensor(idx).embedding(W) @ W.T).sum().backward()
    # d/dW of sum(W[idx] @ W.T): the head gives sum_t W[idx[t]] per row, the lookup scatters the column sums of W
    expected = np.tile(w[idx].sum(0), (vocab, 1))
    np.add.at(expected, idx, np.tile(w.sum(0), (tokens, 1)))
    assert W.grad is not None
    np.testing.assert_allclose(W.grad.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_jit_and_schedule_cache_replay_scatter() -> None:
    vocab, tokens, dim = 40, 16, 4
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    W = Tensor(w.copy(), requires_grad=True)

    @TinyJit
    def step(idx: Tensor, g: Tensor) -> Tensor:
        (idx.embedding(W) * g).sum().backward()
        assert W.grad is not None
        grad = W.grad.realize()
        W.grad = None
        return grad

    for _ in range(4):
        idx = RNG.integers(0, vocab, tokens).astype(np.int32)
        g = RNG.standard_normal((tokens, dim)).astype(np.float32)
        got = step(Tensor(idx), Tensor(g)).numpy()
        np.testing.assert_allclose(got, _embedding_grad_reference(w, idx, g), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- GPU renderings
def _gpu_specs(device: str, dtype: dtypes) -> list[ProgramSpec]:  # type: ignore[valid-type]
    W = Tensor(RNG.standard_normal((50, 8)).astype(np.float32), requires_grad=True)
    idx = Tensor(RNG.integers(0, 50, (3, 16)).astype(np.int32))
    (idx.embedding(W.cast(dtype)).float() * 2).sum().backward()
    assert W.grad is not None
    return kernels(W.grad, device=device)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64])
def test_cuda_uses_atomic_add(dtype: dtypes) -> None:  # type: ignore[valid-type]
    specs = _gpu_specs("CUDA", dtype)
    assert sum("atomicAdd(" in s.source for s in specs) == 1


def test_metal_atomics_and_fallback() -> None:
    specs = _gpu_specs("METAL", dtypes.float32)
    assert sum("atomic_fetch_add_explicit((device atomic_float*)" in s.source for s in specs) == 1
    # Metal cannot add half atomically: the one-hot sum stays (a reduction), never a non-atomic scatter
    half = _gpu_specs("METAL", dtypes.float16)
    assert not any("atomic" in s.source for s in half)
    assert any(s.name.startswith("r_") for s in half)


def test_cuda_narrow_ints_add_by_compare_and_swap() -> None:
    out = Tensor(np.zeros((4, 3), np.int8)).scatter(0, Tensor(np.array([[1, 1, 3], [0, 1, 1]], np.int32)),
                                                     Tensor(np.array([[5, 6, 7], [1, 2, 3]], np.int8)), reduce="add")
    sources = [s.source for s in kernels(out, device="CUDA")]
    assert sum("gg_atomic_add_narrow(" in src and "atomicCAS" in src for src in sources) == 1


def test_eager_steps_reuse_the_schedule() -> None:
    """The same graph structure with other buffers (the schedule cache's case) gives each step's own numbers."""
    from glassgrad.schedule import SCHEDULE_CACHE
    vocab, tokens, dim = 30, 12, 4
    w = RNG.standard_normal((vocab, dim)).astype(np.float32)
    for _ in range(3):
        W = Tensor(w, requires_grad=True)
        idx = RNG.integers(0, vocab, tokens).astype(np.int32)
        g = RNG.standard_normal((tokens, dim)).astype(np.float32)
        (Tensor(idx).embedding(W) * Tensor(g)).sum().backward()
        assert W.grad is not None
        np.testing.assert_allclose(W.grad.numpy(), _embedding_grad_reference(w, idx, g), rtol=1e-5, atol=1e-6)
    assert len(SCHEDULE_CACHE) > 0
