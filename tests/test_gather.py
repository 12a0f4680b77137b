"""Gathers (glassgrad/schedule/gather.py): a one-hot reduction, `sum_k where(a == k, x[k], 0)`, is scheduled as a
GATHER node and lowered as a data-dependent load.

Values are checked against numpy for advanced indexing (`x[idx]`, several index tensors, negative and out-of-range
entries, several dtypes, non-contiguous views, broadcast indices), `gather(dim)` along every dim and `embedding`
(forward and backward); the kernels are checked to have no loop over the indexed axis; a hypothesis property test
compares random shapes and index values with numpy.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgrad import Tensor, dtypes, kernels
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

RNG = np.random.default_rng(0)


def _asts(t: Tensor) -> list[UOp]:
    return [item.ast for item in create_schedule([t.uop])[0] if item.ast.op is Ops.SINK]


def _has_reduce(t: Tensor) -> bool:
    """Whether a kernel computing t (not realized yet) has a reduction."""
    assert t.uop.base.op is not Ops.BUFFER, "ask before realizing the tensor"
    return any(u.op is Ops.REDUCE for ast in _asts(t) for u in ast.toposort())


def _lazy(idx: np.ndarray) -> Tensor:
    """An index tensor whose entries the indexing code cannot check on the host (computed on the device)."""
    return Tensor(idx) + 0


def _expected_take(x: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    """numpy's take along `axis`, with glassgrad's rule for lazy index tensors: an entry in [-n, 0) counts from the
    end, anything else outside [0, n) selects nothing (0)."""
    n = x.shape[axis]
    wrapped = np.where(idx < 0, idx + n, idx)
    valid = (wrapped >= 0) & (wrapped < n)
    out = np.take(x, np.where(valid, wrapped, 0), axis=axis)
    mask = valid.reshape((1,) * axis + idx.shape + (1,) * (x.ndim - axis - 1))
    return np.where(mask, out, np.zeros((), x.dtype))


# ---------------------------------------------------------------------- values
def test_one_index_tensor_selects_rows() -> None:
    x = RNG.standard_normal((7, 5)).astype(np.float32)
    idx = np.array([3, 0, 6, 6, 1], np.int32)
    out = Tensor(x)[Tensor(idx)]
    assert not _has_reduce(out)
    np.testing.assert_array_equal(out.numpy(), x[idx])


def test_negative_and_out_of_range_entries() -> None:
    x = RNG.standard_normal((6, 3)).astype(np.float32)
    idx = np.array([[-1, -6, 5], [6, -7, 100]], np.int64)
    out = Tensor(x)[_lazy(idx)]
    np.testing.assert_array_equal(out.numpy(), _expected_take(x, idx, 0))
    assert out.numpy()[1].tolist() == [[0.0] * 3] * 3  # 6, -7 and 100 select nothing, as the one-hot sum did


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.float16, np.int64, np.int8, np.float64])
def test_data_dtypes(dtype: Any) -> None:
    x = (RNG.standard_normal((5, 4)) * 50).astype(dtype)
    idx = np.array([4, -1, 0, 7, 2], np.int32)
    out = Tensor(x)[:, _lazy(idx[:4] % 4)]
    np.testing.assert_array_equal(out.numpy(), x[:, idx[:4] % 4])
    rows = Tensor(x)[_lazy(idx)]
    assert rows.dtype == Tensor(x).dtype and not _has_reduce(rows)
    np.testing.assert_array_equal(rows.numpy(), _expected_take(x, idx, 0))


@pytest.mark.parametrize("index_dtype", [np.uint8, np.int16, np.int32, np.uint32, np.int64])
def test_index_dtypes(index_dtype: Any) -> None:
    x = RNG.standard_normal((300, 2)).astype(np.float32)
    idx = np.array([0, 7, 255, 3], index_dtype)
    out = Tensor(x)[Tensor(idx)]
    assert not _has_reduce(out)
    np.testing.assert_array_equal(out.numpy(), x[idx])


def test_two_index_tensors_adjacent_and_apart() -> None:
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    i = np.array([[0, 3], [-1, 2]], np.int32)
    j = np.array([4, -5], np.int32)
    adjacent = Tensor(x)[Tensor(i), Tensor(j)]
    apart = Tensor(x)[Tensor(i), :, Tensor(j % 6)]
    assert not _has_reduce(adjacent) and not _has_reduce(apart)
    np.testing.assert_array_equal(adjacent.numpy(), x[i, j])
    np.testing.assert_array_equal(apart.numpy(), x[i, :, j % 6])


def test_two_lazy_indices_out_of_range_in_either_gives_zero() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32) + 10
    i = np.array([0, 3, 2, 1], np.int32)
    j = np.array([1, 1, 9, -2], np.int32)
    got = Tensor(x)[_lazy(i), _lazy(j)].numpy()
    np.testing.assert_array_equal(got, [x[0, 1], 0, 0, x[1, 2]])


def test_index_with_slices_ints_and_none() -> None:
    x = RNG.standard_normal((5, 6, 7)).astype(np.float32)
    idx = np.array([[1, -2], [0, 4]], np.int32)
    for index in [(1, Tensor(idx)), (slice(None, None, 2), None, Tensor(idx)), (Ellipsis, Tensor(idx % 7))]:
        numpy_index = tuple(i.numpy() if isinstance(i, Tensor) else i for i in index)
        np.testing.assert_array_equal(Tensor(x)[index].numpy(), x[numpy_index])


@pytest.mark.parametrize("view", ["transpose", "flip", "step", "expand"])
def test_non_contiguous_data(view: str) -> None:
    base = RNG.standard_normal((6, 8)).astype(np.float32)
    views = {"transpose": (lambda t: t.T, lambda a: a.T), "flip": (lambda t: t.flip(0), lambda a: a[::-1]),
             "step": (lambda t: t[::2, 1::3], lambda a: a[::2, 1::3]),
             "expand": (lambda t: t[:1].expand(5, 8), lambda a: np.broadcast_to(a[:1], (5, 8)))}
    tview, aview = views[view]
    idx = np.array([0, 2, -1, 1], np.int32)
    out = tview(Tensor(base))[Tensor(idx)]
    np.testing.assert_array_equal(out.numpy(), aview(base)[idx])


def test_non_contiguous_and_broadcast_indices() -> None:
    x = RNG.standard_normal((5, 6)).astype(np.float32)
    i = np.array([[0, 4, 1], [2, 2, 3]], np.int32)
    j = np.array([5, 0, 1], np.int32)
    got = Tensor(x)[Tensor(i).T, Tensor(j)[None, :2].expand(3, 2)]  # a transposed and an expanded index
    np.testing.assert_array_equal(got.numpy(), x[i.T, np.broadcast_to(j[None, :2], (3, 2))])
    got = Tensor(x)[Tensor(i[:, :1]), Tensor(j)]  # (2, 1) with (3,) -> (2, 3)
    np.testing.assert_array_equal(got.numpy(), x[i[:, :1], j])


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_every_dim(dim: int) -> None:
    x = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    shape = list(x.shape)
    shape[dim] = 7
    shape[(dim + 1) % 3] -= 1  # smaller than x outside dim: gather reads the leading part
    idx = RNG.integers(0, x.shape[dim], shape).astype(np.int32)
    out = Tensor(x).gather(dim, Tensor(idx))
    assert not _has_reduce(out)
    want = np.take_along_axis(x[tuple(slice(0, s) if d != dim % 3 else slice(None) for d, s in enumerate(shape))],
                              idx, axis=dim)
    np.testing.assert_array_equal(out.numpy(), want)


def test_embedding_forward_backward_and_kernels() -> None:
    w = RNG.standard_normal((11, 4)).astype(np.float32)
    idx = np.array([[0, 10, 3], [3, 3, 7]], np.int32)
    weight = Tensor(w, requires_grad=True)
    out = Tensor(idx).embedding(weight)
    assert not _has_reduce(out) and len(kernels(out)) == 1
    np.testing.assert_array_equal(out.numpy(), w[idx])
    upstream = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    (out * Tensor(upstream)).sum().backward()
    want = np.zeros_like(w)
    np.add.at(want, idx, upstream)
    assert weight.grad is not None
    np.testing.assert_allclose(weight.grad.numpy(), want, rtol=1e-6)


def test_gather_backward_is_a_scatter_add() -> None:
    x = RNG.standard_normal((3, 5)).astype(np.float32)
    idx = np.array([[0, 0, 4], [1, 2, 1], [4, 3, 3]], np.int32)
    t = Tensor(x, requires_grad=True)
    t.gather(1, Tensor(idx)).square().sum().backward()
    want = np.zeros_like(x)
    np.add.at(want, (np.arange(3)[:, None], idx), 2 * np.take_along_axis(x, idx, 1))
    assert t.grad is not None
    np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-6)


# ---------------------------------------------------------------------- kernels
def test_the_indexed_axis_is_not_a_loop() -> None:
    x = Tensor(RNG.integers(0, 255, (1000, 1, 4, 4), dtype=np.uint8))
    samples = Tensor(RNG.integers(0, 1000, 16).astype(np.int32))
    out = x[samples].float() / 255
    (program,) = kernels(out)  # the gather fuses with the cast and the division
    sizes = [u.src[0].arg for u in program.uops if u.op is Ops.RANGE]
    assert 1000 not in sizes and not any(u.op is Ops.DEFINE_ACC for u in program.uops), program.source
    np.testing.assert_allclose(out.numpy(), x.numpy()[samples.numpy()].astype(np.float32) / 255)


def test_a_lookup_into_a_long_axis_is_not_split() -> None:
    """One token of a 70000-row table: 4 outputs, each a one-hot sum over 70000, used to be split in two stages."""
    w = RNG.standard_normal((70000, 4)).astype(np.float32)
    out = Tensor(np.array([69999], np.int32)).embedding(Tensor(w))
    assert len(kernels(out)) == 1 and not _has_reduce(out)
    np.testing.assert_array_equal(out.numpy(), w[[69999]])


def test_token_and_position_embeddings_are_one_kernel() -> None:
    tok, pos = RNG.standard_normal((50, 8)).astype(np.float32), RNG.standard_normal((16, 8)).astype(np.float32)
    idx = RNG.integers(0, 50, (2, 16)).astype(np.int32)
    out = Tensor(idx).embedding(Tensor(tok)) + Tensor.arange(16).reshape(1, 16).embedding(Tensor(pos))
    assert len(kernels(out)) == 1
    np.testing.assert_allclose(out.numpy(), tok[idx] + pos[None], rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_gather_feeds_a_matmul(dtype: Any) -> None:
    """Rows picked by an index, multiplied by a matrix: the lookup is a load of the matmul's left operand."""
    table = RNG.standard_normal((100, 64)).astype(dtype)
    w = RNG.standard_normal((64, 48)).astype(dtype)
    idx = RNG.integers(-100, 100, 128).astype(np.int32)
    out = Tensor(table)[Tensor(idx)] @ Tensor(w)
    want = table.astype(np.float32)[idx] @ w.astype(np.float32)
    np.testing.assert_allclose(out.numpy().astype(np.float32), want, rtol=2e-2 if dtype == np.float16 else 1e-4,
                               atol=2e-1 if dtype == np.float16 else 1e-4)


def test_picked_log_probabilities_keep_the_batch_reduction() -> None:
    """A cross-entropy sums the picked log-probabilities over the batch: the class axis becomes a lookup, the batch
    axis stays a reduction."""
    logits = RNG.standard_normal((8, 10)).astype(np.float32)
    labels = np.array([0, 9, 3, 3, 1, 2, 8, 5], np.int32)
    hit = Tensor(labels).unsqueeze(-1) == Tensor.arange(10)
    picked = hit.where(Tensor(logits), 0).sum()
    ranges = [u for ast in _asts(picked) for u in ast.toposort() if u.op is Ops.RANGE]
    assert 10 not in [r.src[0].arg for r in ranges]
    np.testing.assert_allclose(picked.numpy(), logits[np.arange(8), labels].sum(), rtol=1e-5)


def test_a_sum_over_an_arange_that_is_not_a_selection_stays_a_reduction() -> None:
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    not_one_hot = (Tensor.arange(6) < 3).where(Tensor(x), 0).sum(1)  # a comparison other than ==
    assert _has_reduce(not_one_hot)
    np.testing.assert_allclose(not_one_hot.numpy(), x[:, :3].sum(1), rtol=1e-6)
    along_itself = (Tensor.arange(6).reshape(1, 6) == Tensor.arange(6).reshape(1, 6) * 0 + Tensor.arange(4)
                    .reshape(4, 1)).where(Tensor(x), 0).sum(1)  # the index varies along the reduced axis
    np.testing.assert_allclose(along_itself.numpy(), x[np.arange(4), np.arange(4)], rtol=1e-6)


def test_symbolic_shapes_are_left_alone() -> None:
    from glassgrad import Variable
    x = RNG.standard_normal((8, 5)).astype(np.float32)
    v = Variable("n", 1, 8).bind(6)
    idx = np.array([4, 0, 2], np.int32)
    got = Tensor(x)[:v][:, Tensor(idx)]
    np.testing.assert_array_equal(got.numpy(), x[:6][:, idx])


def test_cuda_and_metal_sources_index_with_the_loaded_value() -> None:
    x = Tensor(RNG.standard_normal((9, 3)).astype(np.float32))
    out = x[Tensor(np.array([[1, -1], [8, 0]], np.int64))] * 2
    for device in ("CUDA", "METAL"):
        (program,) = kernels(out, device=device)
        assert "acc" not in program.source and not any(u.op is Ops.DEFINE_ACC for u in program.uops)


# ---------------------------------------------------------------------- property
@st.composite
def problems(draw: Any) -> tuple[np.ndarray, np.ndarray, int]:
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    axis = draw(st.integers(0, ndim - 1))
    n = shape[axis]
    index_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    values = draw(st.lists(st.integers(-n - 2, n + 1), min_size=int(np.prod(index_shape)),
                           max_size=int(np.prod(index_shape))))
    dtype = draw(st.sampled_from([np.float32, np.int32, np.uint8, np.bool_]))
    x = (np.arange(int(np.prod(shape))).reshape(shape) * 7 % 23 - 5).astype(dtype)
    return x, np.array(values, np.int32).reshape(index_shape), axis


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_take_along_any_axis_matches_numpy(problem: tuple[np.ndarray, np.ndarray, int]) -> None:
    x, idx, axis = problem
    out = Tensor(x)[(slice(None),) * axis + (_lazy(idx),)]
    assert out.dtype == (dtypes.bool if x.dtype == np.bool_ else Tensor(x).dtype)
    np.testing.assert_array_equal(out.numpy(), _expected_take(x, idx, axis))


def test_gather_past_int32_positions() -> None:
    """tinygrad's test_tensor_index_overflow: positions over 2**31 are compared as int64 (the index's arange was
    int32 and wrapped, so the last element silently read 0)."""
    big = Tensor([1]).expand(2**31 + 3)
    np.testing.assert_array_equal(big[Tensor([0, 2**31 + 2])].numpy(), np.array([1, 1]))


@pytest.mark.parametrize("smoothing, ignore", [(0.0, -1), (0.1, -1), (0.0, 3)])
def test_cross_entropy_backward_has_no_loop_over_the_classes(smoothing: float, ignore: int) -> None:
    """The gradient of a sparse cross-entropy sums its one-hot's gradient over the classes, as `-(c + one_hot)` with
    c constant along them: that sum is n c plus a lookup, so no kernel holds a loop over the classes nested in another
    one (a GPU thread per row looped over all of GPT-2's 50304). Gradients against numpy's closed form."""
    n, classes = 16, 1000
    logits = RNG.standard_normal((n, classes)).astype(np.float32)
    labels = RNG.integers(0, classes, n).astype(np.int32)
    labels[[2, 5]] = ignore if ignore >= 0 else labels[[2, 5]]
    x = Tensor(logits, requires_grad=True)
    loss = x.sparse_categorical_crossentropy(Tensor(labels), ignore_index=ignore, label_smoothing=smoothing)
    (grad,) = loss.gradient(x)
    for program in kernels(grad):  # (sibling loops over the classes, a fused softmax's max and sum, are fine)
        open_loops: list[int] = []
        for u in program.uops:
            if u.op is Ops.RANGE:
                assert not (u.src[0].arg == classes and classes in open_loops), (program.name, open_loops)
                open_loops.append(u.src[0].arg)
            elif u.op is Ops.ENDRANGE:
                open_loops.pop()
    keep = labels != ignore
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    target = np.eye(classes, dtype=np.float64)[labels] * (1 - smoothing) + smoothing / classes
    want = (p - target) * keep[:, None] / keep.sum()
    np.testing.assert_allclose(grad.numpy(), want, atol=1e-6)


def test_argmax_past_int32_positions() -> None:
    """argmax over more than 2**31 positions returns int64 indices: cast to int32 (tinygrad's dtype) the index
    2**31 + 3 of a 2**31 + 10 element tensor came back as -2147483645. (A lazy comparison with an arange: no
    memory, one pass over the positions.)"""
    n = 2**31 + 10
    hit = Tensor.arange(n) == 2**31 + 3
    out = hit.argmax()
    assert out.dtype == dtypes.int64 and out.item() == 2**31 + 3
    assert hit.argmin().dtype == hit.max(dim=0).indices.dtype == dtypes.int64
    assert Tensor.arange(2**31).argmax().dtype == dtypes.int32  # every index fits
