"""Scheduler tests: how many kernels a graph becomes (part of the contract), reuse of realized buffers, fusion of
movement ops, gated padded loads, and hypothesis property tests of random graphs against numpy.

Two kinds of checks recur:
  * `count_kernels(*tensors)` realizes the tensors and returns how many kernels ran (`GlobalCounters`);
  * `assert_loads_in_bounds(*tensors)` schedules the tensors, renders every kernel, and evaluates each LOAD's and
    STORE's index over every value of the loops it sits in: where the load's gate is true, the index must lie
    inside its buffer. This checks the code that runs, not just its results, so an out-of-bounds read that happens
    to return a harmless value is still caught.
"""
from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from glassgrad import Context, GlobalCounters, Tensor, dtypes, kernels
from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.codegen.opt import Opt, OptOps
from glassgrad.codegen.opt import kernel as kernel_module
from glassgrad.helpers import prod
from glassgrad.kernels import _retarget, renderer_for
from glassgrad.schedule import (
    REALIZED,
    ROW_FUSE_MAX,
    SPLIT_MAX_OUTPUTS,
    SPLIT_MIN_REDUCE,
    ScheduleItem,
    create_schedule,
    is_buffer_view,
    without_reshapes,
)
from glassgrad.schedule.rewrite import MERGE_MAX_OUTER
from glassgrad.uop.ops import Ops, UOp

# ---------------------------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def stable_realized() -> Iterator[None]:
    """No garbage collection inside the block: REALIZED holds its entries weakly, so a collection between two
    schedules of one graph can drop a realized node that only garbage still held (the second schedule then
    recomputes it: right, but a different schedule)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def count_kernels(*tensors: Tensor) -> int:
    """Realize `tensors` and return how many kernels that ran."""
    GlobalCounters.reset()
    Tensor.realize_all(*tensors)
    return GlobalCounters.kernel_count


def ints(*shape: int, seed: int = 0, low: int = -3, high: int = 4) -> np.ndarray:
    """Small integer values as float32: sums and products of them are exact, so results compare exactly."""
    return np.random.default_rng(seed).integers(low, high, size=shape).astype(np.float32)


def _c_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C integer division (rounds toward zero)."""
    q = np.abs(a) // np.maximum(np.abs(b), 1)
    return np.where((a < 0) != (b < 0), -q, q)


_INDEX_ALU: dict[Ops, Callable[..., np.ndarray]] = {
    Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.NEG: np.negative, Ops.MAX: np.maximum,
    Ops.IDIV: _c_div, Ops.MOD: lambda a, b: a - b * _c_div(a, b),
    Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
    Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
    Ops.WHERE: np.where,
}


def _loop_size(u: UOp) -> int:
    """A loop index runs over 0..size-1; so does a GPU id (SPECIAL): the kernel returns early past the end."""
    return u.src[0].arg if u.op is Ops.RANGE else u.arg[1]


def eval_index(u: UOp, axis_of: dict[UOp, int], ndim: int, memo: dict[UOp, np.ndarray]) -> np.ndarray:
    """The value of integer/bool expression `u` for every value of the loops in `axis_of` (one numpy axis each)."""
    if u in memo:
        return memo[u]
    if u.op is Ops.CONST:
        out = np.asarray(u.arg, dtype=np.bool_ if u.dtype.is_bool else np.int64)
    elif u.op in (Ops.RANGE, Ops.SPECIAL):
        shape = [1] * ndim
        shape[axis_of[u]] = _loop_size(u)
        out = np.arange(_loop_size(u), dtype=np.int64).reshape(shape)
    elif u.op is Ops.CAST:
        inner = eval_index(u.src[0], axis_of, ndim, memo)
        out = inner.astype(np.bool_ if u.dtype.is_bool else np.int64)
    elif u.op in _INDEX_ALU:
        out = np.asarray(_INDEX_ALU[u.op](*(eval_index(s, axis_of, ndim, memo) for s in u.src)))
    else:
        raise AssertionError(f"unexpected {u.op} in an index or gate expression")
    memo[u] = out
    return out


def check_access(access: UOp, size: int, what: str) -> None:
    """Every index `access` (a LOAD or STORE) uses where its gate holds lies in [0, size). A LOAD's gate is its
    third source, a STORE's its fourth (a GPU kernel's threads past the outputs store nothing)."""
    gate_node = access.src[2] if access.op is Ops.LOAD and len(access.src) == 3 else \
        access.src[3] if access.op is Ops.STORE and len(access.src) == 4 else None
    parts = (access.src[1],) if gate_node is None else (access.src[1], gate_node)
    ranges = sorted({n for p in parts for n in p.toposort() if n.op in (Ops.RANGE, Ops.SPECIAL)},
                    key=lambda r: (r.op is Ops.SPECIAL, str(r.arg)))
    axis_of = {r: i for i, r in enumerate(ranges)}
    memo: dict[UOp, np.ndarray] = {}
    full = tuple(_loop_size(r) for r in ranges)
    index = np.broadcast_to(eval_index(access.src[1], axis_of, len(ranges), memo), full)
    gate = np.ones(full, dtype=np.bool_)
    if gate_node is not None:
        gate = np.broadcast_to(eval_index(gate_node, axis_of, len(ranges), memo), full)
    used = index[gate]
    assert used.size == 0 or (used.min() >= 0 and used.max() < size), \
        f"{what} reads/writes outside [0, {size}): indices {used.min()}..{used.max()}"


def rendered(*tensors: Tensor) -> list[tuple[ScheduleItem, ProgramSpec]]:
    """The schedule that realizing `tensors` would run, with each kernel rendered for its device (nothing runs)."""
    schedule, _ = create_schedule([t.uop for t in tensors])
    return [(item, get_program(item.ast, renderer_for(item.bufs[0].device)))
            for item in schedule if item.ast.op is not Ops.COPY]


def assert_loads_in_bounds(*tensors: Tensor) -> None:
    """Render every kernel that realizing `tensors` would run and check that its loads and stores stay in bounds
    and that it keeps one parameter per scheduled buffer (the runtime passes all of them, in order)."""
    for item, spec in rendered(*tensors):
        assert_program_in_bounds(item, spec)


def assert_program_in_bounds(item: ScheduleItem, spec: ProgramSpec) -> None:
    """`spec` (a rendering of `item`'s kernel) keeps one parameter per buffer, and its loads and stores stay inside
    the item's buffers and its local (staging) buffers."""
    assert sum(u.op is Ops.DEFINE_GLOBAL for u in spec.uops) == len(item.bufs), f"{spec.name} lost a parameter"
    for u in spec.uops:
        if u.op in (Ops.LOAD, Ops.STORE):
            buf = u.src[0].src[0] if u.src[0].op is Ops.BARRIER else u.src[0]
            if buf.op is Ops.DEFINE_LOCAL:  # a staging buffer (codegen/stage.py) or a GPU tile: (id, size)
                check_access(u, buf.arg[1], f"{spec.name}: {u.op} of local buffer {buf.arg[0]}")
            else:
                check_access(u, item.bufs[buf.arg].size, f"{spec.name}: {u.op} of data{buf.arg}")


def loaded_buffers(t: Tensor) -> list[Any]:
    """The buffers the one kernel that realizes `t` reads (output excluded)."""
    schedule, _ = create_schedule([t.uop])
    assert len(schedule) == 1
    return list(schedule[0].bufs[1:])


# ---------------------------------------------------------------------------------------------- kernel counts


def test_elementwise_chain_is_one_kernel() -> None:
    a, b, c = ints(3, 4, seed=1), ints(3, 4, seed=2), ints(3, 4, seed=3)
    out = (Tensor(a) * Tensor(b) + Tensor(c)).relu()
    assert len(kernels(out)) == 1
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np.maximum(a * b + c, 0))


def test_full_sum_is_one_kernel() -> None:
    x = ints(4, 5)
    out = Tensor(x).sum()
    assert count_kernels(out) == 1
    assert out.item() == x.sum()


def test_product_sum_over_axis_is_one_kernel() -> None:
    x, y = ints(3, 5, seed=1), ints(3, 5, seed=2)
    out = (Tensor(x) * Tensor(y)).sum(axis=1)
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), (x * y).sum(axis=1))


def test_reduce_with_elementwise_epilogue_is_one_kernel() -> None:
    x = ints(3, 5)
    out = Tensor(x).sum(1) * 2 + 1
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), x.sum(1) * 2 + 1)


def test_reduce_keepdim_sqrt_is_one_kernel() -> None:
    x = ints(3, 5, low=0)
    out = Tensor(x).sum(1, keepdim=True).sqrt()
    assert count_kernels(out) == 1
    np.testing.assert_allclose(out.numpy(), np.sqrt(x.sum(1, keepdims=True)), rtol=1e-6)


def test_two_reduces_of_one_input_share_a_kernel() -> None:
    x = ints(4, 5)
    out = Tensor(x).sum(1) + Tensor(x).max(1)
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), x.sum(1) + x.max(1))


def gpu_kernel_count(t: Tensor) -> int:
    """Kernels of `t` scheduled for CUDA (rendered only: no GPU needed)."""
    return len(kernels(t, device="CUDA"))


def test_softmax_over_the_last_axis_is_one_kernel() -> None:
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    assert gpu_kernel_count(Tensor(x).softmax()) == 1  # max and sum are row reductions of the normalising kernel
    out = Tensor(x, device="CPU").softmax()
    assert count_kernels(out) == 1  # on a CPU too: each row's max and sum are loops before the loop over the row
    e = np.exp(x - x.max(-1, keepdims=True))
    np.testing.assert_allclose(out.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["log_softmax", "logsumexp", "layernorm", "var", "row_minus_sum"])
def test_row_reductions_fuse_into_their_gpu_row_kernel(name: str) -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 40)).astype(np.float32)
    t = Tensor(x)
    out, want = {
        "log_softmax": (lambda: t.log_softmax(), lambda: (x - x.max(-1, keepdims=True)) -
                        np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))),
        "logsumexp": (lambda: t.logsumexp(-1), lambda: np.log(np.exp(x).sum(-1))),
        "layernorm": (lambda: (t - t.mean(-1, keepdim=True)) / ((t - t.mean(-1, keepdim=True)) ** 2).mean(
            -1, keepdim=True).sqrt(), lambda: (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)),
        "var": (lambda: t.var(-1), lambda: x.var(-1, ddof=1)),
        "row_minus_sum": (lambda: t - t.sum(-1, keepdim=True), lambda: x - x.sum(-1, keepdims=True)),
    }[name]
    assert gpu_kernel_count(out()) == 1
    np.testing.assert_allclose(out().numpy(), want(), rtol=1e-4, atol=1e-5)


def test_reductions_that_cannot_fuse_per_row_stay_kernels_of_their_own() -> None:
    x = np.random.default_rng(2).standard_normal((6, 5)).astype(np.float32)
    assert gpu_kernel_count(Tensor(x).softmax(0)) == 3  # the reduced axis is not the last: not per row of the output
    transposed = (Tensor(x) - Tensor(x).max(-1, keepdim=True)).T  # the root iterates columns: max is its own kernel
    assert gpu_kernel_count(transposed) == 2
    long = Tensor.empty(2, ROW_FUSE_MAX + 1)
    assert gpu_kernel_count(long.softmax()) == 3  # a row this long is not recomputed per pass


def test_matmul_is_one_kernel() -> None:
    a, b = ints(3, 5, seed=1), ints(5, 4, seed=2)
    out = Tensor(a) @ Tensor(b)
    assert len(kernels(out)) == 1
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), a @ b)


def test_batched_matmul_with_bias_and_relu_is_one_kernel() -> None:
    a, b, bias = ints(2, 3, 5, seed=1), ints(2, 5, 4, seed=2), ints(4, seed=3)
    out = (Tensor(a) @ Tensor(b) + Tensor(bias)).relu()
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np.maximum(a @ b + bias, 0))


def test_matmul_of_transposed_views_is_one_kernel() -> None:
    a, b = ints(5, 3, seed=1), ints(4, 5, seed=2)
    out = Tensor(a).T @ Tensor(b).T
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), a.T @ b.T)


def _reductions_per_kernel(*tensors: Tensor, device: str | None = None) -> list[int]:
    """REDUCE_AXIS nodes in each kernel's AST that realizing `tensors` (rendered for `device`) would run."""
    sink = UOp(Ops.SINK, dtypes.void, tuple(t.uop for t in tensors))
    if device is not None:
        sink = _retarget(sink, device)
    items, _ = create_schedule(list(sink.src))
    return [sum(u.op is Ops.REDUCE_AXIS for u in item.ast.toposort()) for item in items]


@pytest.mark.parametrize("device", [None, "CUDA"])
def test_two_matmuls_summed_are_two_kernels_of_one_reduction(device: str | None) -> None:
    """`x @ W1 + h @ W2` (an RNN cell; the gradient of a tensor read by two matmuls): each matmul is the one
    reduction of its kernel (tiled), the sum the epilogue of the second, not two nested untiled loops."""
    a, b, c, d = ints(6, 5, seed=1), ints(5, 4, seed=2), ints(6, 3, seed=3), ints(3, 4, seed=4)
    out = Tensor(a) @ Tensor(b) + Tensor(c) @ Tensor(d)
    assert all(n <= 1 for n in _reductions_per_kernel(out, device=device))
    assert count_kernels(out) == 2
    np.testing.assert_array_equal(out.numpy(), a @ b + c @ d)


def test_a_gpu_matmul_stores_its_computed_factor() -> None:
    """On a GPU a factor computed elementwise (`(a + b) @ w`) is stored first, so the tiled kernel copies a buffer;
    a cast or a view of a buffer stays in the tile copy; a CPU packs the computed factor inside the matmul kernel."""
    a, b, w = ints(8, 16, seed=1), ints(8, 16, seed=2), ints(16, 4, seed=3)
    summed = Tensor(a) + Tensor(b)
    assert [k.name[0] for k in kernels(summed @ Tensor(w), device="CUDA")] == ["E", "r"]
    assert len(kernels(Tensor(a).cast(dtypes.float16) @ Tensor(w).cast(dtypes.float16), device="CUDA")) == 1
    padded = Tensor(a).T.pad(((0, 0), (1, 1))).T @ Tensor(w[:, :3]).pad(((0, 0), (1, 0)))
    assert len(kernels(padded, device="CUDA")) == 1
    out = (Tensor(a, device="CPU") + Tensor(b, device="CPU")) @ Tensor(w, device="CPU")
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), (a + b) @ w)



def test_a_gpu_matmul_stores_its_computed_factor_after_a_narrowing_cast() -> None:
    """Under autocast a computed factor is cast to bfloat16 right above its computation: the GPU stores the cast
    value (half the bytes for every tile that copies it; bf16 GPT-2 step on an H200 151.0 -> 148.8 ms), never a cast
    above an EXPAND (that would store the broadcast product: 29 GB in GPT-2's step)."""
    a, b, w = (Tensor.empty(*shape, device="CUDA") for shape in ((64, 32), (64, 32), (32, 16)))
    product = (a + b).cast(dtypes.bfloat16) @ w.cast(dtypes.bfloat16)
    first, second = kernels(product, device="CUDA")
    assert first.name.startswith("E_") and "__nv_bfloat16* __restrict__ data0" in first.source
    assert second.name.startswith("r_")
    expanded = ((a + b).reshape(64, 1, 32).expand(64, 16, 32).cast(dtypes.bfloat16) *
                w.T.cast(dtypes.bfloat16).reshape(1, 16, 32)).sum(2)
    assert [k.name for k in kernels(expanded, device="CUDA")] == ["E_64_32", "r_64_16_32"]  # (the sum, in float32)

def test_a_gpu_matmul_of_a_shrunk_computed_factor_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    """`(a + b)[:, 1:] @ w` on a GPU: the computed factor is stored as its shrink (the elements the matmul reads).
    The scheduler's next walk descended through that stored shrink to the sum, chose it again, mapped it to the same
    shrink, and repeated forever (`Tensor.det` hung on CUDA). The walk is bounded here so a regression fails, not
    hangs; then the values are checked on the CPU."""
    import glassgrad.schedule as schedule_module
    walks = 0
    walk = schedule_module._reduces_to_materialise

    def bounded(roots: dict[UOp, None]) -> set[UOp]:
        nonlocal walks
        walks += 1
        assert walks < 20, "the scheduler keeps choosing the same nodes to store"
        return walk(roots)

    monkeypatch.setattr(schedule_module, "_reduces_to_materialise", bounded)
    a, b, w = ints(6, 5, seed=1), ints(6, 5, seed=2), ints(4, 3, seed=3)
    for device in ("CUDA", "METAL"):
        walks = 0
        x, y, z = (Tensor.empty(*arr.shape, device=device) for arr in (a, b, w))
        assert [k.name[0] for k in kernels((x + y)[:, 1:] @ z, device=device)] == ["E", "r"]
    out = (Tensor(a) + Tensor(b))[:, 1:] @ Tensor(w)
    np.testing.assert_array_equal(out.numpy(), (a + b)[:, 1:] @ w)


def test_padded_matmul_results_summed_keep_one_reduction_per_kernel() -> None:
    """The q, k and v gradients of a fused qkv projection: three matmuls, padded into one (T, 3D) gradient."""
    qs = [(ints(4, 6, seed=i), ints(6, 2, seed=10 + i)) for i in range(3)]
    parts = [(Tensor(a) @ Tensor(b)).pad(((0, 0), (2 * i, 4 - 2 * i))) for i, (a, b) in enumerate(qs)]
    out = (parts[0] + parts[1] + parts[2]).contiguous()
    assert all(n <= 1 for n in _reductions_per_kernel(out))
    np.testing.assert_array_equal(out.numpy(), np.concatenate([a @ b for a, b in qs], axis=1))


def test_reduce_of_reduce_materialises_the_inner_one() -> None:
    x = ints(3, 4, 5)
    out = (Tensor(x).sum(2) * 2).max(1)
    assert count_kernels(out) == 2
    np.testing.assert_array_equal(out.numpy(), (x.sum(2) * 2).max(1))


def test_realizing_several_outputs_at_once() -> None:
    x = ints(3, 4)
    t = Tensor(x)
    a, b = t * 2, t.sum(0)
    assert count_kernels(a, b) == 2
    np.testing.assert_array_equal(a.numpy(), x * 2)
    np.testing.assert_array_equal(b.numpy(), x.sum(0))


def test_composite_ops_stay_within_their_kernel_budgets() -> None:
    x = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)
    softmax0 = Tensor(x).softmax(0)
    assert count_kernels(softmax0) <= 3
    e = np.exp(x - x.max(0))
    np.testing.assert_allclose(softmax0.numpy(), e / e.sum(0), rtol=1e-5, atol=1e-7)
    argmax = Tensor(x).argmax(1)
    assert count_kernels(argmax) <= 2
    np.testing.assert_array_equal(argmax.numpy(), x.argmax(1))
    cumsum = Tensor(x).cumsum(1)
    assert count_kernels(cumsum) == 1
    np.testing.assert_allclose(cumsum.numpy(), x.cumsum(1), rtol=1e-5, atol=1e-6)
    var = Tensor(x).var(0)
    assert count_kernels(var) <= 2
    np.testing.assert_allclose(var.numpy(), x.var(0, ddof=1), rtol=1e-5)


def test_backward_of_a_small_network_matches_numpy() -> None:
    x, w = ints(4, 5, seed=1), ints(5, 3, seed=2)
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    (tx @ tw).relu().sum().backward()
    active = (x @ w > 0).astype(np.float32)
    assert tx.grad is not None and tw.grad is not None
    np.testing.assert_array_equal(tw.grad.numpy(), x.T @ active)
    np.testing.assert_array_equal(tx.grad.numpy(), active @ w.T)


# ---------------------------------------------------------------------------------------------- realized tensors


def test_realized_tensor_is_loaded_not_recomputed() -> None:
    x = ints(3, 4)
    a = (Tensor(x) * 2).realize()
    out = a + 1
    assert loaded_buffers(out) == [a._buffer()]
    src = kernels(out)[0].source
    assert "data1[" in src and "data2" not in src
    float_math = [u for u in kernels(out)[0].uops if u.op in (Ops.MUL, Ops.ADD) and u.dtype.is_float]
    assert len(float_math) == 1, "the kernel should add 1 to the loaded value, not recompute a = x*2"
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), x * 2 + 1)


def test_graph_built_before_realize_reuses_the_buffer() -> None:
    x = ints(3, 4)
    a = Tensor(x) * 2
    out = (a + 1).sum(0)  # built while `a` is still lazy
    assert count_kernels(a) == 1
    assert loaded_buffers(out) == [a._buffer()]
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), (x * 2 + 1).sum(0))


def test_realizing_twice_runs_nothing_the_second_time() -> None:
    t = Tensor(ints(3, 4)) * 3 + 1
    assert count_kernels(t) == 1
    assert count_kernels(t) == 0
    assert kernels(t) == []
    GlobalCounters.reset()
    t.numpy()
    t.tolist()
    assert GlobalCounters.kernel_count == 0


def test_shared_lazy_input_is_computed_once_per_realize() -> None:
    x = ints(3, 4)
    s = Tensor(x).sum(1, keepdim=True)  # reached through an EXPAND by both outputs: materialised once
    a, b = Tensor(x) - s, Tensor(x) * s
    assert count_kernels(a, b) == 3
    np.testing.assert_array_equal(a.numpy(), x - x.sum(1, keepdims=True))
    np.testing.assert_array_equal(b.numpy(), x * x.sum(1, keepdims=True))


def test_realized_contiguous_is_not_recomputed() -> None:
    x = ints(3, 4)
    c = (Tensor(x) * 2).contiguous()
    out = c + 1  # built while c is lazy: its CONTIGUOUS node must be loaded from c's buffer once c is realized
    assert count_kernels(c) == 1
    assert loaded_buffers(out) == [c._buffer()]
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), x * 2 + 1)


def test_realized_input_with_new_reduce_on_top() -> None:
    x = ints(3, 4)
    a = (Tensor(x) + 1).realize()
    assert count_kernels(a.sum(), a.max(0)) == 2
    np.testing.assert_array_equal(a.sum().numpy(), (x + 1).sum())


def test_reshape_of_a_realized_tensor_runs_no_kernel() -> None:
    a = Tensor(ints(3, 4)).realize()
    assert count_kernels(a.reshape(12)) == 0
    assert count_kernels(a.reshape(2, 6)) == 0


def test_a_tensor_and_its_reshape_realized_together_share_one_kernel() -> None:
    x = ints(3, 4)
    a = Tensor(x) * 2
    b = a.reshape(4, 3)
    assert count_kernels(a, b) == 1
    assert a._buffer() is b._buffer()
    np.testing.assert_array_equal(b.numpy(), (x * 2).reshape(4, 3))


# ---------------------------------------------------------------------------------------------- movement fusion

MOVEMENTS: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
    "permute": (lambda t: t.permute(2, 0, 1), lambda x: x.transpose(2, 0, 1)),
    "transpose_reshape": (lambda t: t.permute(1, 0, 2).reshape(4, 15),
                          lambda x: x.transpose(1, 0, 2).reshape(4, 15)),
    "pad": (lambda t: t.pad(((1, 0), (0, 2), (2, 1))), lambda x: np.pad(x, ((1, 0), (0, 2), (2, 1)))),
    "shrink": (lambda t: t.shrink(((1, 3), None, (1, 4))), lambda x: x[1:3, :, 1:4]),
    "flip": (lambda t: t.flip((0, 2)), lambda x: x[::-1, :, ::-1]),
    "expand": (lambda t: t.reshape(3, 4, 1, 5).expand(3, 4, 2, 5),
               lambda x: np.broadcast_to(x[:, :, None], (3, 4, 2, 5))),
    "reshape_chain": (lambda t: t.reshape(12, 5).reshape(6, 10).reshape(60).reshape(5, 3, 4),
                      lambda x: x.reshape(5, 3, 4)),
    "flip_shrink_pad": (lambda t: t.flip(1).shrink((None, (1, 3), None)).pad(((0, 0), (1, 1), (0, 0))),
                        lambda x: np.pad(x[:, ::-1][:, 1:3], ((0, 0), (1, 1), (0, 0)))),
    "permute_reshape_permute": (lambda t: t.permute(2, 1, 0).reshape(5, 12).permute(1, 0),
                                lambda x: x.transpose(2, 1, 0).reshape(5, 12).transpose(1, 0)),
    "pad_reshape": (lambda t: t.pad(((0, 1), None, None)).reshape(4, 20),
                    lambda x: np.pad(x, ((0, 1), (0, 0), (0, 0))).reshape(4, 20)),
}


@pytest.mark.parametrize("name", list(MOVEMENTS))
def test_movement_ops_fuse_into_their_consumer(name: str) -> None:
    move, np_move = MOVEMENTS[name]
    x = ints(3, 4, 5)
    out = move(Tensor(x)) * 2 + 1
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np_move(x) * 2 + 1)


@pytest.mark.parametrize("name", list(MOVEMENTS))
def test_movement_ops_fuse_into_a_reduce(name: str) -> None:
    move, np_move = MOVEMENTS[name]
    x = ints(3, 4, 5)
    out = move(Tensor(x)).sum(0)
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np_move(x).sum(0))


@pytest.mark.parametrize("name", list(MOVEMENTS))
def test_movement_ops_of_a_realized_tensor(name: str) -> None:
    move, np_move = MOVEMENTS[name]
    x = ints(3, 4, 5)
    a = (Tensor(x) - 1).realize()
    out = move(a).max(-1)
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np_move(x - 1).max(-1))


def test_movement_ops_on_a_reduce_result_fuse_into_the_consumer() -> None:
    x = ints(3, 4, 5)
    out = Tensor(x).sum(2).T.flip(0).pad(((1, 1), (0, 0))) + 1
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np.pad(x.sum(2).T[::-1], ((1, 1), (0, 0))) + 1)


# ---------------------------------------------------------------------------------------------- empty tensors


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 2)])
def test_empty_tensors_run_no_kernel(shape: tuple[int, ...]) -> None:
    out = (Tensor.empty(*shape) * 2 + 1).relu()
    assert count_kernels(out) == 0
    assert out.numpy().shape == shape


def test_reduce_over_an_empty_axis_fills_the_identity() -> None:
    out = Tensor.empty(3, 0).sum(1)
    np.testing.assert_array_equal(out.numpy(), np.zeros(3, np.float32))


def test_pad_of_an_empty_tensor_is_all_padding() -> None:
    out = Tensor.empty(0, 3).pad(((1, 1), (0, 0))) + 1
    assert_loads_in_bounds(out)
    np.testing.assert_array_equal(out.numpy(), np.ones((2, 3), np.float32))


# ---------------------------------------------------------------------------------------------- padded loads

PADS: dict[str, tuple[Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = {
    "pad_then_sum": (lambda t: t.pad(((2, 1), (1, 3))).sum(0), lambda x: np.pad(x, ((2, 1), (1, 3))).sum(0)),
    "pad_then_max": (lambda t: (t - 10).pad(((1, 1), (1, 1))).max(1),
                     lambda x: np.pad(x - 10, ((1, 1), (1, 1))).max(1)),
    "pad_of_transpose": (lambda t: t.T.pad(((1, 2), (0, 1))), lambda x: np.pad(x.T, ((1, 2), (0, 1)))),
    "pad_of_transpose_sum": (lambda t: t.T.pad(((1, 2), (3, 0))).sum(1),
                             lambda x: np.pad(x.T, ((1, 2), (3, 0))).sum(1)),
    "negative_pad": (lambda t: t.pad(((-1, 2), (1, -2))), lambda x: np.pad(x[1:, :-2], ((0, 2), (1, 0)))),
    "negative_pad_all_sides": (lambda t: t.pad(((-1, -1), (-2, -1))), lambda x: x[1:-1, 2:-1]),
    "pad_with_value": (lambda t: t.pad(((1, 1), (2, 0)), value=-7.0), lambda x: np.pad(x, ((1, 1), (2, 0)),
                                                                                       constant_values=-7)),
    "pad_of_flip_reshape": (lambda t: t.flip(1).reshape(2, 10).pad(((1, 1), (3, 3))),
                            lambda x: np.pad(x[:, ::-1].reshape(2, 10), ((1, 1), (3, 3)))),
    "pad_twice": (lambda t: t.pad(((1, 0), (0, 1))).pad(((0, 2), (2, 0))),
                  lambda x: np.pad(np.pad(x, ((1, 0), (0, 1))), ((0, 2), (2, 0)))),
    "pad_shrink_into_padding": (lambda t: t.pad(((2, 2), (2, 2))).shrink(((0, 3), (5, 9))),
                                lambda x: np.pad(x, ((2, 2), (2, 2)))[0:3, 5:9]),
    "pad_of_broadcast": (lambda t: t.shrink((None, (1, 2))).expand(4, 3).pad(((1, 0), (0, 1))) + 1,
                         lambda x: np.pad(np.broadcast_to(x[:, 1:2], (4, 3)), ((1, 0), (0, 1))) + 1),
    "cat": (lambda t: t.cat(t * 2, t.flip(0), dim=1), lambda x: np.concatenate([x, x * 2, x[::-1]], axis=1)),
}


@pytest.mark.parametrize("name", list(PADS))
def test_padded_loads_stay_in_bounds(name: str) -> None:
    make, np_make = PADS[name]
    x = np.arange(1, 21, dtype=np.float32).reshape(4, 5)  # no zeros: a wrong border value shows
    out = make(Tensor(x))
    assert_loads_in_bounds(out)
    assert count_kernels(out) == 1
    np.testing.assert_array_equal(out.numpy(), np_make(x))


def test_bounds_checker_catches_an_out_of_bounds_load() -> None:
    """The checker itself: loading index r+1 for r in 0..3 from a 4-element buffer must be reported, and gating
    that load with r < 3 makes it fine."""
    r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 4),), (0, "global"))
    data = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)
    with pytest.raises(AssertionError, match="outside"):
        check_access(UOp(Ops.LOAD, dtypes.float32, (data, r + 1)), 4, "ungated")
    check_access(UOp(Ops.LOAD, dtypes.float32, (data, r + 1, r < 3)), 4, "gated")


PADDED_OPTS = [
    [Opt(OptOps.PADTO, 1, 16), Opt(OptOps.UPCAST, 1, 16)],
    [Opt(OptOps.PADTO, 1, 16), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.PADTO, 0, 8), Opt(OptOps.UPCAST, 0, 8)],
    [Opt(OptOps.PADTO, 0, 4), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PADTO, 0, 8), Opt(OptOps.UPCAST, 0, 8)],
    [Opt(OptOps.PADTO, 1, 8), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.PADTO, 1, 4), Opt(OptOps.UPCAST, 1, 4)],
    None,  # the heuristic's own (which pads both axes here)
]


@pytest.mark.parametrize("transposed", [False, True], ids=["A@B", "A.T@B"])
@pytest.mark.parametrize("opts", PADDED_OPTS)
def test_padded_kernel_accesses_stay_in_bounds(opts: list[Opt] | None, transposed: bool) -> None:
    """PADTO grows a 13x21 matmul's output loops to 16 and 32 (or 24): the padded iterations' stores are gated and
    their loads gated or clamped, so every load and store, staging buffers included, stays inside its buffer; the
    results match numpy."""
    a, b = ints(9, 13, seed=1) if transposed else ints(13, 9, seed=1), ints(9, 21, seed=2)
    out = (Tensor(a).permute(1, 0) if transposed else Tensor(a)) @ Tensor(b)
    (item,) = create_schedule([out.uop])[0]
    spec = get_program(item.ast, renderer_for("CPU"), opts)
    if opts is None:
        assert any(o.op is OptOps.PADTO for o in spec.opts)
    assert any(u.op is Ops.STORE and len(u.src) == 4 for u in spec.uops), "the store is not gated"
    assert_program_in_bounds(item, spec)
    np.testing.assert_array_equal(out.numpy(), (a.T if transposed else a) @ b)


def test_bounds_checker_catches_an_ungated_padded_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its gate, a padded kernel's store writes past the end of its output: the checker reports it."""
    out = Tensor(ints(13, 9)) @ Tensor(ints(9, 21))
    (item,) = create_schedule([out.uop])[0]
    monkeypatch.setattr(kernel_module, "_and_gate", lambda access, valid: access)
    spec = get_program(item.ast, renderer_for("CPU"), PADDED_OPTS[1])
    with pytest.raises(AssertionError, match="outside"):
        assert_program_in_bounds(item, spec)


def test_realizing_a_reshape_materialises_the_node_under_it() -> None:
    x = ints(3, 4)
    b = Tensor(x) * 2
    c = b.reshape(2, 6)
    assert count_kernels(c) == 1
    assert count_kernels(b) == 0, "b was computed for c: its buffer is reused"
    np.testing.assert_array_equal(c.numpy(), (x * 2).reshape(2, 6))
    np.testing.assert_array_equal(b.numpy(), x * 2)


# ------------------------------------------------------------------------------------ buffers whose loads fold away


def test_kernel_keeps_the_parameters_of_buffers_it_no_longer_reads() -> None:
    x, y = Tensor([1, 2, 3]), Tensor([4, 5, 6])
    out = x * 0 + y  # int x*0 folds to 0: x's load disappears, but x stays parameter data1 (y is data2)
    assert_loads_in_bounds(out)
    np.testing.assert_array_equal(out.numpy(), [4, 5, 6])


def test_a_view_that_is_all_padding() -> None:
    out = Tensor([1.0, 2.0]).pad(((2, 0),)).shrink(((0, 2),)) + 1  # only padding is left: the load folds away
    assert_loads_in_bounds(out)
    np.testing.assert_array_equal(out.numpy(), [1.0, 1.0])


# ---------------------------------------------------------------------------------------------- random graphs
#
# A random graph is grown one op at a time from small random leaves. Every op takes an existing node as its input
# (so nodes are shared by several consumers) and is mirrored on a numpy array; some steps realize a node halfway,
# so later kernels must load it instead of recomputing it. Values are small integers: int32 arithmetic wraps the
# same way in numpy and in C, and float32 sums of small integers are exact, so results are compared exactly.

MAX_DIM = 8  # pads and expands may grow a dimension past the leaves' 5, up to this


@dataclass
class Node:
    t: Tensor
    ref: np.ndarray


Draw = Callable[[st.SearchStrategy[Any]], Any]


LEAF_SEED = st.integers(0, 2**16)  # a seed for a leaf's values, not its data: small examples


def new_leaf(draw: Draw, shape: tuple[int, ...], np_dtype: type) -> Node:
    array: np.ndarray = ints(*shape, seed=draw(LEAF_SEED)).astype(np_dtype)
    return Node(Tensor(array), array)


def new_start(draw: Draw, np_dtype: type) -> Node:
    """A first node: an input buffer, a constant (no load at all) or an arange (the loop index, no load)."""
    shape = draw_shape(draw)
    kind = draw(st.sampled_from(["buffer", "const", "arange"]))
    if kind == "buffer":
        return new_leaf(draw, shape, np_dtype)
    if kind == "const":
        c = draw(st.integers(-3, 3))
        return Node(Tensor.full(shape, c, dtype=np_dtype.__name__), np.full(shape, c, dtype=np_dtype))
    n = prod(shape)
    return Node(Tensor.arange(n, dtype=np_dtype.__name__).reshape(shape), np.arange(n, dtype=np_dtype).reshape(shape))


def draw_shape(draw: Draw) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))


def prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def op_reshape(draw: Draw, x: Node) -> Node:
    ndim = draw(st.integers(1, 4))
    dims = [1] * ndim
    for f in prime_factors(x.ref.size):
        dims[draw(st.integers(0, ndim - 1))] *= f
    if max(dims) > MAX_DIM * MAX_DIM:
        return x
    return Node(x.t.reshape(tuple(dims)), x.ref.reshape(dims))


def op_permute(draw: Draw, x: Node) -> Node:
    order = draw(st.permutations(range(x.ref.ndim)))
    return Node(x.t.permute(tuple(order)), x.ref.transpose(order))


def op_expand(draw: Draw, x: Node) -> Node:
    t, ref = x.t, x.ref
    if 1 not in ref.shape:
        if ref.ndim == 4:
            return x
        axis = draw(st.integers(0, ref.ndim))
        t, ref = t.unsqueeze(axis), np.expand_dims(ref, axis)
    shape = tuple(draw(st.integers(1, 4)) if s == 1 else s for s in ref.shape)
    return Node(t.expand(shape), np.broadcast_to(ref, shape))


def op_pad(draw: Draw, x: Node) -> Node:
    pads = []
    for s in x.ref.shape:
        before, after = draw(st.integers(-1, 2)), draw(st.integers(-1, 2))
        if s + before + after < 1 or s + before + after > MAX_DIM:
            before, after = 0, 0
        pads.append((before, after))
    value = draw(st.sampled_from([0, 0, -2]))
    np_pads = [(max(b, 0), max(a, 0)) for b, a in pads]
    cropped = x.ref[tuple(slice(max(-b, 0), s - max(-a, 0)) for (b, a), s in zip(pads, x.ref.shape))]
    return Node(x.t.pad(tuple(pads), value=value), np.pad(cropped, np_pads, constant_values=value))


def op_shrink(draw: Draw, x: Node) -> Node:
    bounds = []
    for s in x.ref.shape:
        start = draw(st.integers(0, s - 1))
        bounds.append((start, draw(st.integers(start + 1, s))))
    return Node(x.t.shrink(tuple(bounds)), x.ref[tuple(slice(b, e) for b, e in bounds)])


def op_flip(draw: Draw, x: Node) -> Node:
    axes = tuple(draw(st.lists(st.integers(0, x.ref.ndim - 1), unique=True)))
    return Node(x.t.flip(axes), np.flip(x.ref, axes) if axes else x.ref)


def op_reduce(draw: Draw, x: Node) -> Node:
    axes = tuple(sorted(draw(st.lists(st.integers(0, x.ref.ndim - 1), min_size=1, unique=True))))
    keepdim = draw(st.booleans())
    if draw(st.booleans()):
        return Node(x.t.sum(axes, keepdim=keepdim), x.ref.sum(axes, keepdims=keepdim, dtype=x.ref.dtype))
    return Node(x.t.max(axes, keepdim=keepdim), x.ref.max(axes, keepdims=keepdim))


def op_unary(draw: Draw, x: Node) -> Node:
    kind = draw(st.sampled_from(["neg", "mul", "add", "relu", "max"]))
    c = draw(st.sampled_from([-1, 2, 3]))
    if kind == "neg":
        return Node(-x.t, -x.ref)
    if kind == "mul":
        return Node(x.t * c, x.ref * x.ref.dtype.type(c))
    if kind == "add":
        return Node(x.t + c, x.ref + x.ref.dtype.type(c))
    if kind == "relu":
        return Node(x.t.relu(), np.maximum(x.ref, 0))
    return Node(x.t.maximum(c), np.maximum(x.ref, x.ref.dtype.type(c)))


def broadcast_partner(draw: Draw, x: Node, pool: list[Node]) -> Node:
    """A node from the pool that broadcasts with `x` to `x`'s shape, else a new leaf that does."""
    fits = [n for n in pool if n.ref.ndim <= x.ref.ndim and n.ref.dtype == x.ref.dtype and
            all(a in (1, b) for a, b in zip(n.ref.shape[::-1], x.ref.shape[::-1]))]
    if fits and draw(st.booleans()):
        return draw(st.sampled_from(fits))
    shape = tuple(1 if draw(st.booleans()) else s for s in x.ref.shape)
    return new_leaf(draw, shape[draw(st.integers(0, len(shape) - 1)):], x.ref.dtype.type)


def op_binary(draw: Draw, x: Node, pool: list[Node]) -> Node:
    kind = draw(st.sampled_from(["add", "mul", "max", "where"]))
    # mul only by leaves (values -3..3), so magnitudes stay small and float32 stays exact
    y = new_leaf(draw, x.ref.shape, x.ref.dtype.type) if kind == "mul" else broadcast_partner(draw, x, pool)
    if kind == "add":
        return Node(x.t + y.t, x.ref + y.ref)
    if kind == "mul":
        return Node(x.t * y.t, x.ref * y.ref)
    if kind == "max":
        return Node(x.t.maximum(y.t), np.maximum(x.ref, y.ref))
    z = broadcast_partner(draw, x, pool)
    return Node((x.t < y.t).where(z.t, x.t), np.where(x.ref < y.ref, z.ref, x.ref))


def op_cast(draw: Draw, x: Node) -> Node:
    """int32 <-> float32; values are small integers, so both directions are exact."""
    to = np.float32 if x.ref.dtype == np.int32 else np.int32
    return Node(x.t.cast(to.__name__), x.ref.astype(to))


def op_contiguous(draw: Draw, x: Node) -> Node:
    return Node(x.t.contiguous(), x.ref)


def op_realize(draw: Draw, x: Node) -> Node:
    x.t.realize()
    return x


OpFn = Callable[..., Node]
MOVEMENT_OPS: list[OpFn] = [op_pad, op_permute, op_expand, op_shrink, op_flip, op_reshape]
ALL_OPS: list[OpFn] = [op_binary, op_reduce, *MOVEMENT_OPS, op_reduce, op_unary, op_binary, op_cast, op_contiguous,
                       op_realize]


def grow_graph(draw: Draw, ops: list[OpFn], np_dtype: type, steps: int) -> list[Node]:
    """A pool of nodes: a few leaves, then `steps` random ops, each on a node of the pool so far (the newest by
    preference, so that chains grow deep; hypothesis shrinks toward them)."""
    pool = [new_start(draw, np_dtype) for _ in range(draw(st.integers(1, 2)))]
    for _ in range(steps):
        x = pool[-1 - draw(st.integers(0, len(pool) - 1))]
        op = draw(st.sampled_from(ops))
        if x.ref.ndim == 0 and op not in (op_unary, op_cast, op_contiguous, op_realize):
            op = op_reshape  # a full reduction leaves a 0-d tensor: give it dimensions again
        node = op(draw, x, pool) if op is op_binary else op(draw, x)
        event(op.__name__)
        if node.ref.ndim <= 4 and max(node.ref.shape, default=1) <= MAX_DIM:
            pool.append(node)
    return pool


def unrealized_nodes(outs: list[Node]) -> list[UOp]:
    """The nodes realizing `outs` still has to compute (the walk stops at buffers and realized nodes)."""
    def done(u: UOp) -> bool:
        return is_buffer_view(u) or u in REALIZED
    sink = UOp(Ops.SINK, dtypes.void, tuple(n.t.uop for n in outs))
    return [u for u in sink.toposort(stop=done) if not done(u)]


def assert_matches(node: Node) -> None:
    got = node.t.numpy()
    assert got.shape == node.ref.shape
    assert got.dtype == node.ref.dtype
    if got.dtype == np.float32:  # exact too unless a sum passed 2**24 (float32's last exact integer)
        np.testing.assert_allclose(got, node.ref, rtol=1e-6)
    else:
        np.testing.assert_array_equal(got, node.ref)


# SCHEDULE_EXAMPLES=2000 pytest tests/test_schedule.py -k random: a longer hunt than the default run
PROPERTY = settings(max_examples=int(os.environ.get("SCHEDULE_EXAMPLES", "60")), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@PROPERTY
@given(st.data(), st.sampled_from([np.int32, np.float32]))
def test_random_graphs_match_numpy(data: st.DataObject, np_dtype: type) -> None:
    """Elementwise, movement and reduce ops with halfway realizes: values match numpy, loads stay in bounds,
    every kernel is an output, a CONTIGUOUS (or the ASSIGN into a buffer of its own that `contiguous()` of
    constants alone is), or a reduction, and realizing again runs nothing."""
    pool = grow_graph(data.draw, ALL_OPS, np_dtype, data.draw(st.integers(2, 10)))
    outs = [pool[-1], *data.draw(st.lists(st.sampled_from(pool), max_size=2))]
    assert_loads_in_bounds(*(n.t for n in outs))
    graph = unrealized_nodes(outs)
    most = len(outs) + sum(1 for u in graph if u.op in (Ops.REDUCE_AXIS, Ops.CONTIGUOUS, Ops.ASSIGN))
    ran = count_kernels(*(n.t for n in outs))
    event(f"{ran} kernels")
    assert ran <= most
    for n in outs:
        assert_matches(n)
    assert count_kernels(*(n.t for n in outs)) == 0


class Recorder:
    """A `draw` that remembers what it drew, so the same random program can run again: `replay(shift)` draws the
    same values, except that every leaf's seed moves by `shift` (the same graph on other buffers with other data)."""

    def __init__(self, draw: Draw) -> None:
        self.draw = draw
        self.values: list[Any] = []

    def __call__(self, strategy: st.SearchStrategy[Any]) -> Any:
        self.values.append(self.draw(strategy))
        return self.values[-1]

    def replay(self, shift: int) -> Draw:
        values = iter(self.values)
        return lambda strategy: next(values) + shift if strategy is LEAF_SEED else next(values)


def random_program(draw: Draw, np_dtype: type) -> list[Node]:
    pool = grow_graph(draw, ALL_OPS, np_dtype, draw(st.integers(2, 10)))
    return [pool[-1], *draw(st.lists(st.sampled_from(pool), max_size=2))]


@PROPERTY
@given(st.data(), st.sampled_from([np.int32, np.float32]))
def test_random_graphs_reuse_cached_schedules(data: st.DataObject, np_dtype: type) -> None:
    """A random program, then the same program on other buffers and data: the second graph's schedule (from the
    schedule cache when its structure matches) equals what the scheduler makes without the cache, kernel for kernel
    and buffer for buffer, and its values match numpy, as do those of a third run with the cache off."""
    from test_schedule_cache import assert_same_schedule

    from glassgrad.schedule import SCHEDULE_CACHE
    recorder = Recorder(data.draw)
    first = random_program(recorder, np_dtype)
    count_kernels(*(n.t for n in first))
    second = random_program(recorder.replay(1), np_dtype)
    uops = [n.t.uop for n in second]
    with stable_realized():  # both schedules see the same realized nodes
        with Context(SCACHE=0):
            plain, plain_views = create_schedule(uops)
        hits = SCHEDULE_CACHE.hits
        cached, cached_views = create_schedule(uops)
    event("cache hit" if SCHEDULE_CACHE.hits > hits else "cache miss")
    inputs = {id(u.arg[0]) for x in uops for u in x.toposort() if u.op is Ops.BUFFER}
    assert_same_schedule(plain, cached, inputs)
    assert list(plain_views) == list(cached_views)
    count_kernels(*(n.t for n in second))
    for n in second:
        assert_matches(n)
    with Context(SCACHE=0):
        third = random_program(recorder.replay(2), np_dtype)
        count_kernels(*(n.t for n in third))
    for n in third:
        assert_matches(n)


@PROPERTY
@given(st.data(), st.sampled_from([np.int32, np.float32]))
def test_random_graphs_walk_and_key_in_one_pass(data: st.DataObject, np_dtype: type) -> None:
    """`walk_graph` (the scheduler's walk with the cache key built along the way) lists the nodes a SINK's
    `toposort` lists when it stops at materialised nodes (without the SINK), in the same order, and its key is
    `structure_key`'s for that list."""
    from glassgrad.schedule.cache import structure_key, walk_graph
    program = random_program(data.draw, np_dtype)
    if data.draw(st.booleans()):  # some graphs with realized nodes inside
        count_kernels(program[-1].t)
    outs = [n.t.uop for n in program]
    roots = tuple(without_reshapes(o) for o in outs)
    sink = UOp(Ops.SINK, dtypes.void, roots)

    def view_of(u: UOp) -> UOp | None:
        return u if u.op is Ops.BUFFER else REALIZED.get(u)
    with stable_realized():
        nodes, leaves, key = walk_graph(roots, outs, REALIZED.get, REALIZED.id_tables())
        expected = sink.toposort(stop=lambda u: view_of(u) is not None)
        assert expected[-1] is sink
        expected = expected[:-1]  # (the walk builds no SINK: it starts from the roots)
        assert nodes == expected
        assert leaves == {u: v for u in expected if (v := view_of(u)) is not None}
        expected_key = structure_key(expected, roots, outs, view_of)
        assert (key is None) == (expected_key is None)
        if key is not None and expected_key is not None:
            assert key.graph == expected_key.graph
            assert key.buffers == expected_key.buffers
            assert key.position == expected_key.position
        assert walk_graph(roots, outs, REALIZED.get, REALIZED.id_tables(), keyed=False)[:2] == (nodes, leaves)


@PROPERTY
@given(st.data(), st.sampled_from([np.int32, np.float32]))
def test_random_elementwise_and_movement_graphs_are_one_kernel(data: st.DataObject, np_dtype: type) -> None:
    """Without reductions or CONTIGUOUS, any graph of elementwise and movement ops is one kernel (none for a mere
    reshape of an input buffer)."""
    ops: list[OpFn] = [op_binary, *MOVEMENT_OPS, op_unary]
    out = grow_graph(data.draw, ops, np_dtype, data.draw(st.integers(2, 10)))[-1]
    assert_loads_in_bounds(out.t)
    with stable_realized():  # a graph of constants can be one an earlier example realized (nodes are hash-consed)
        expected = 0 if is_buffer_view(out.t.uop) or out.t.uop in REALIZED else 1
        assert count_kernels(out.t) == expected
    assert_matches(out)


@PROPERTY
@given(st.data())
def test_random_reduce_graphs_match_numpy(data: st.DataObject) -> None:
    """Movement ops around one or two reductions (pads, flips and transposes feeding sums and maxes)."""
    ops: list[OpFn] = [op_reduce, *MOVEMENT_OPS, op_reduce, op_unary]
    pool = grow_graph(data.draw, ops, np.float32, data.draw(st.integers(3, 10)))
    assert_loads_in_bounds(pool[-1].t)
    assert_matches(pool[-1])


@pytest.mark.parametrize("np_dtype", [np.int32, np.float32])
@pytest.mark.parametrize("build", ["sum_of_full", "max_of_full", "sum_in_3d"])
def test_reduction_over_size_one_axes_fuses_as_its_element(np_dtype: type, build: str) -> None:
    """Regression (found by test_random_graphs_reuse_cached_schedules): a reduction over axes of size 1 only, fused
    into a kernel whose other axis the CPU heuristic upcasts, was a REDUCE with no loop and crashed the heuristic
    (`max() arg is an empty sequence`). Such a reduction is its one element: the kernel has no REDUCE at all."""
    name = np.dtype(np_dtype).name
    x = np.arange(64, dtype=np_dtype).reshape(4, 16)
    if build == "sum_of_full":
        out, ref = Tensor.full((1, 16), 2, dtype=name).sum(0) + Tensor(x[0]), x[0] + 2
    elif build == "max_of_full":
        out, ref = Tensor.full((1, 16), -3, dtype=name).max(0) * Tensor(x[1]), x[1] * -3
    else:
        out, ref = Tensor.full((4, 1, 16), 5, dtype=name).sum(1) - Tensor(x), 5 - x
    schedule, _ = create_schedule([out.uop])
    assert len(schedule) == 1
    assert not any(u.op is Ops.REDUCE for u in schedule[0].ast.toposort())
    kernels(out)  # the optimiser takes it
    np.testing.assert_array_equal(out.numpy(), ref.astype(np_dtype))


def conv_weight_gradient(batch: int, cin: int, cout: int, size: int, k: int) -> tuple[Tensor, np.ndarray]:
    """d/dw of sum(conv2d(x, w) * g), and the same in float64 numpy."""
    rng = np.random.default_rng(batch + cin)
    x = rng.standard_normal((batch, cin, size, size), dtype=np.float32)
    w = rng.standard_normal((cout, cin, k, k), dtype=np.float32)
    out = size - k + 1
    g = rng.standard_normal((batch, cout, out, out), dtype=np.float32)
    wt = Tensor(w, requires_grad=True)
    (Tensor(x).conv2d(wt) * Tensor(g)).sum().backward()
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (k, k), axis=(2, 3))  # b c y x ky kx
    return wt.grad, np.einsum("boyx,bcyxij->ocij", g.astype(np.float64), windows)  # type: ignore[return-value]


def test_long_reductions_into_some_thousand_outputs_are_split() -> None:
    """A conv's weight gradient (3200 outputs, each a sum over 256 x 8 x 8 positions) is reduced in two stages:
    the first one's 256 x more outputs keep a GPU busy; each stage divides the batch axis, not a row inside it, and
    the first keeps the rows and columns as axes of their own (its indices stay affine in each). A CPU splits it
    one part per image, the parts outermost (each step of its outer loop reads one image's slice, kept in cache)."""
    grad, ref = conv_weight_gradient(256, 4, 32, 12, 5)
    names = [s.name for s in kernels(grad, device="CUDA")]
    assert "r_32_4_5_5_256_8_8" in names and "r_32_4_5_5_256" in names, names
    assert [s.name for s in kernels(grad, device="CPU")][-2:] == ["r_256_32_4_5_5_8_8", "r_32_4_5_5_256"]
    np.testing.assert_allclose(grad.numpy(), ref, rtol=1e-4, atol=1e-3)
    short, short_ref = conv_weight_gradient(16, 4, 32, 12, 5)  # a 1024-long reduction stays one kernel
    assert "r_32_4_5_5_16_8_8" in [s.name for s in kernels(short, device="CUDA")]
    np.testing.assert_allclose(short.numpy(), short_ref, rtol=1e-4, atol=1e-3)


def test_costly_elementwise_under_an_expand_is_materialised() -> None:
    """A reduction reading costly elementwise work through an EXPAND (a convolution's backward reading BatchNorm's
    backward) would recompute it once per repeat: it gets its own kernel. Cheap work still fuses (on a CPU: a GPU
    stores a matmul's computed factor either way)."""
    rng = np.random.default_rng(0)
    a, b, w = rng.random((16, 8), np.float32) + 1, rng.random((16, 8), np.float32) + 1, rng.random((4, 8), np.float32)
    ta, tb, tw = (Tensor(x, device="CPU") for x in (a, b, w))
    costly = (ta.sqrt() / tb + ta / (tb + 1)).exp() / tb
    out = (costly.reshape(16, 1, 8) * tw.reshape(1, 4, 8)).sum(2)
    assert count_kernels(out) == 2
    c = (np.exp(np.sqrt(a) / b + a / (b + 1)) / b)
    np.testing.assert_allclose(out.numpy(), (c[:, None, :] * w[None]).sum(2), rtol=1e-5)
    cheap = ((ta * 2 + 1).reshape(16, 1, 8) * tw.reshape(1, 4, 8)).sum(2)
    assert count_kernels(cheap) == 1


def test_a_cat_of_computed_halves_under_an_expand_is_stored() -> None:
    """A rotary embedding (llama's, minrf's): each pair (a, b) rotated as (a*c - b*s, a*s + b*c), the two results
    joined by `cat` and flattened, then read by q @ k^T through an EXPAND. Fused, every score recomputed both halves
    under index gates and the kernel did not vectorise (0.3 GFLOP/s); the joined value gets its own kernel. A `cat`
    of plain buffers, and cheap work without a `cat`, still fuse."""
    rng = np.random.default_rng(0)
    x, ang = rng.standard_normal((2, 32, 8, 2), np.float32), rng.standard_normal((32, 8, 1), np.float32)
    tx, tc, ts = Tensor(x, device="CPU"), Tensor(np.cos(ang), device="CPU"), Tensor(np.sin(ang), device="CPU")
    a, b = tx[..., 0:1], tx[..., 1:2]
    q = (a * tc - b * ts).cat(a * ts + b * tc, dim=-1).reshape(2, 32, 16)
    scores = q @ q.transpose(1, 2)
    assert count_kernels(scores) == 2
    xa, xb = x[..., 0:1], x[..., 1:2]
    c, sn = np.cos(ang), np.sin(ang)
    qn = np.concatenate([xa * c - xb * sn, xa * sn + xb * c], -1).reshape(2, 32, 16)
    np.testing.assert_allclose(scores.numpy(), qn @ qn.transpose(0, 2, 1), rtol=1e-4, atol=1e-4)
    plain = tx[..., 0:1].cat(tx[..., 1:2], dim=-1).reshape(2, 32, 16)
    assert count_kernels(plain @ plain.transpose(1, 2)) == 1



def test_a_residual_stream_read_by_every_block_is_stored() -> None:
    """A residual stream `x = x + f_l(x)` built lazily, where each block reduces x in a kernel of its own: block l's
    input is a sum of l + 1 buffers, read by that reduction and by the next sum. Recomputed in each reader, the reads
    grow with the square of the depth (the old schedule: 18 buffers in one kernel at depth 8, 34 at depth 16);
    stored (K inputs, C readers, (C - 1)(K - 1) > 2), no kernel reads more than a few, at any depth. The values
    match numpy."""
    def widest_kernel(depth: int) -> int:
        rng = np.random.default_rng(0)
        base = rng.standard_normal((4, 32), dtype=np.float32)
        branches = [rng.standard_normal((4, 32), dtype=np.float32) for _ in range(depth)]
        x, ref = Tensor(base), base.astype(np.float64)
        for branch in branches:
            x = x + (x - x.mean(axis=0, keepdim=True)) * Tensor(branch)
            ref = ref + (ref - ref.mean(axis=0, keepdims=True)) * branch
        schedule, _ = create_schedule([x.uop])
        np.testing.assert_allclose(x.numpy(), ref, rtol=1e-4, atol=1e-4)
        return max(len(item.bufs) for item in schedule)
    assert widest_kernel(8) == widest_kernel(16) <= 6


def test_a_value_of_two_buffers_read_twice_still_fuses() -> None:
    """`a + b` read by two kernels (two reductions) is recomputed by each: K = 2 inputs, storing it would cost
    more than it saves. So is a value of three buffers read by two kernels ((C - 1)(K - 1) = 2)."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.random((8, 16), np.float32) for _ in range(3))
    two = Tensor(a) + Tensor(b)
    assert count_kernels(two.sum(0), two.max(1)) == 2
    three = Tensor(a) + Tensor(b) * Tensor(c)
    s0, s1 = three.sum(0), three.max(1)
    assert count_kernels(s0, s1) == 2
    np.testing.assert_allclose(s0.numpy(), (a + b * c).sum(0), rtol=1e-5)
    np.testing.assert_allclose(s1.numpy(), (a + b * c).max(1), rtol=1e-5)

def test_a_value_of_one_buffer_and_per_row_values_is_recomputed() -> None:
    """A LayerNorm's normalised input `(x - mean) * rstd * w + b` is read by several kernels, and its inputs are x
    plus values broadcast along rows or columns (the mean, rstd, w, b): recomputed, each reader reads x once, exactly
    what it would read from a stored copy, so it is not stored (`_broadcast_input`): no kernel of its own. The values
    match numpy."""
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((64, 32), np.float32), rng.standard_normal(32, np.float32), rng.random(32, np.float32)
    mean, rstd = x.mean(1, keepdims=True), 1 / np.sqrt(x.var(1, keepdims=True) + 1e-5)
    xt = Tensor(x)
    normed = (xt - xt.mean(1, keepdim=True)) * ((xt - xt.mean(1, keepdim=True)).square().mean(1, keepdim=True)
                                                + 1e-5).rsqrt() * Tensor(w) + Tensor(b)
    outs = normed.sum(0), normed.max(0), (normed * normed).sum(1)
    want = (x - mean) * rstd * w + b
    assert count_kernels(*outs) == 5  # the mean, the variance and the three readers
    for out, ref in zip(outs, (want.sum(0), want.max(0), (want * want).sum(1))):
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------- nested reductions (rewrite.py)
INJECTIVE_OPS: list[OpFn] = [op_permute, op_shrink, op_flip, op_reshape]


def zero_pad(draw: Draw, x: Node) -> Node:
    """A pad with zeros (a crop where negative), the kind a gradient's shrink produces."""
    pads = [(draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in x.ref.shape]
    return Node(x.t.pad(tuple(pads)), np.pad(x.ref, pads))


@PROPERTY
@given(st.data(), st.sampled_from(["sum", "max"]))
def test_nested_reductions_through_views_are_one_kernel(data: st.DataObject, op: str) -> None:
    """reduce(V(reduce(x))) with V reshapes, pads, shrinks, permutes and flips (no expand: no element repeats) is
    one reduction over both sets of axes: one kernel, no intermediate buffer, the same values."""
    draw = data.draw
    x = new_leaf(draw, draw_shape(draw), np.float32)
    axes = tuple(sorted(draw(st.lists(st.integers(0, x.ref.ndim - 1), min_size=1, unique=True))))
    reduce_fn: Callable[..., Any] = np.sum if op == "sum" else np.max
    node = Node(getattr(x.t, op)(axes, keepdim=True), reduce_fn(x.ref, axes, keepdims=True))
    for _ in range(draw(st.integers(1, 4))):
        node = draw(st.sampled_from([*INJECTIVE_OPS, zero_pad]))(draw, node)
    outer = tuple(sorted(draw(st.lists(st.integers(0, node.ref.ndim - 1), min_size=1, unique=True))))
    out = Node(getattr(node.t, op)(outer), reduce_fn(node.ref, outer))
    merged_length = node.ref.size * prod(x.ref.shape[a] for a in axes) // max(1, out.ref.size)
    long_few = merged_length >= SPLIT_MIN_REDUCE and out.ref.size <= SPLIT_MAX_OUTPUTS  # split in two stages
    merged = prod(node.ref.shape[a] for a in outer) <= MERGE_MAX_OUTER
    assert count_kernels(out.t) == (2 if long_few or not merged else 1)
    assert_loads_in_bounds(out.t)
    assert_matches(out)


def test_a_long_outer_reduction_of_a_matmul_is_not_merged() -> None:
    """Summing a matmul's 64 rows merged into it would re-read b for every row: the matmul stays a kernel."""
    a, b = ints(64, 48, seed=1), ints(48, 40, seed=2)
    out = (Tensor(a) @ Tensor(b)).sum(0)
    assert [k.name for k in kernels(out)] == ["r_64_40_48", "r_40_64"]
    np.testing.assert_array_equal(out.numpy(), (a @ b).sum(0))


def test_nested_reductions_over_an_empty_axis_are_not_merged() -> None:
    """max over an empty axis is -inf; padded with zeros and maxed again it is 0, which a merged (empty) max is not."""
    from glassgrad.schedule.rewrite import merge_nested_reduce
    inner = Tensor.empty(3, 0).uop.reduce_axis(Ops.MAX, (1,))
    outer = inner.pad(((1, 1), (0, 0))).reduce_axis(Ops.MAX, (0,))
    assert merge_nested_reduce(outer, {}) is None
    nonempty = Tensor.empty(3, 2).uop.reduce_axis(Ops.MAX, (1,)).pad(((1, 1), (0, 0))).reduce_axis(Ops.MAX, (0,))
    assert merge_nested_reduce(nonempty, {}) is not None


def test_nested_reduction_read_twice_keeps_its_buffer() -> None:
    """A second reader needs the inner result anyway: merging would compute it twice."""
    x = ints(4, 6)
    inner = Tensor(x).sum(1, keepdim=True)
    out = inner.reshape(2, 2).sum(1) + inner.reshape(2, 2).flip(0).sum(1)
    assert count_kernels(out) == 2
    np.testing.assert_array_equal(out.numpy(), x.sum(1).reshape(2, 2).sum(1) + x.sum(1).reshape(2, 2)[::-1].sum(1))


@pytest.mark.parametrize("kwargs", [dict(), dict(padding=2), dict(stride=2), dict(dilation=2, padding=1),
                                    dict(groups=2, stride=(2, 1), padding=(1, 0))])
def test_conv_input_gradient_is_one_kernel(kwargs: dict[str, Any]) -> None:
    """The gradient of a convolution's input: no (N, Cin, OH, OW, KH, KW) intermediate and no folding kernel, one
    transposed-convolution kernel whose weight loads are ungated, on the CPU and on CUDA (tiled)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 9, 8), dtype=np.float32)
    w = rng.standard_normal((6, 4 // kwargs.get("groups", 1), 3, 3), dtype=np.float32)
    xt = Tensor(x, requires_grad=True)
    out = xt.conv2d(Tensor(w), **kwargs)
    g = rng.standard_normal(out.shape, dtype=np.float32)
    (out * Tensor(g)).sum().backward()
    assert xt.grad is not None
    (item, spec), = rendered(xt.grad)
    weight_loads = [u for u in spec.uops if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL  # (not staged)
                    and item.bufs[u.src[0].arg].size == w.size]
    assert weight_loads and all(len(u.src) == 2 for u in weight_loads), "the weight loads should be ungated"
    assert "no-tree-loop-vectorize" not in spec.source
    expected = torch_free_conv_input_gradient(x, w, g, **kwargs)
    np.testing.assert_allclose(xt.grad.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_conv_input_gradient_is_tiled_on_cuda() -> None:
    """The pad's mask around the product goes with the gradient's tile: a tiled (shared-memory) CUDA kernel."""
    xt = Tensor.empty(64, 32, 24, 24).requires_grad_()
    (xt.conv2d(Tensor.empty(32, 32, 5, 5)) * Tensor.empty(64, 32, 20, 20)).sum().backward()
    assert xt.grad is not None
    cuda, = kernels(xt.grad, device="CUDA")
    assert "__shared__" in cuda.source and cuda.local_size == (64, 1, 1), cuda.source


def torch_free_conv_input_gradient(x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: Any = 1, padding: Any = 0,
                                   dilation: Any = 1, groups: int = 1) -> np.ndarray:
    """d/dx of sum(conv2d(x, w) * g) in float64 numpy: every output scatters g * w back onto the input taps."""
    sy, sx = (stride, stride) if isinstance(stride, int) else stride
    py, px = (padding, padding) if isinstance(padding, int) else padding
    dy, dx = (dilation, dilation) if isinstance(dilation, int) else dilation
    n, cin, h, wd = x.shape
    cout, cg, kh, kw = w.shape
    grad = np.zeros((n, cin, h + 2 * py, wd + 2 * px))
    per_group = cout // groups
    for o in range(cout):
        group = o // per_group
        for i in range(kh):
            for j in range(kw):
                for oy in range(g.shape[2]):
                    for ox in range(g.shape[3]):
                        y, xx = oy * sy + i * dy, ox * sx + j * dx
                        grad[:, group * cg:(group + 1) * cg, y, xx] += g[:, o, oy, ox, None] * w[o, :, i, j]
    return grad[:, :, py:py + h, px:px + wd]


# ---------------------------------------------------------------------------------------------- several outputs


def test_an_output_computed_on_the_way_to_another_is_stored_by_its_kernel() -> None:
    """a = x*2 and b = a+1 realized together: b's kernel computes a anyway, so it stores both (one kernel)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = Tensor(x).realize() * 2
    b = a + 1
    assert count_kernels(a, b) == 1
    np.testing.assert_array_equal(a.numpy(), x * 2)
    np.testing.assert_array_equal(b.numpy(), x * 2 + 1)


def test_a_reshaped_output_is_stored_by_the_kernel_that_reads_it() -> None:
    """Through reshapes (the same elements in the same order)."""
    x = np.random.default_rng(0).random((6, 5)).astype(np.float32)
    a = Tensor(x).realize().exp()
    b = a.reshape(3, 10) * 3
    assert count_kernels(a, b) == 1
    np.testing.assert_allclose(a.numpy(), np.exp(x), rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), (np.exp(x) * 3).reshape(3, 10), rtol=1e-6)


def test_a_reduction_keeps_a_kernel_of_its_own() -> None:
    """Only elementwise kernels take a second output: a reduction's kernel is shaped (tiled) for its one store."""
    x = np.random.default_rng(0).random((6, 5)).astype(np.float32)
    t = Tensor(x).realize()
    s = t.sum(axis=1, keepdim=True)
    y = s.sqrt() + s
    assert count_kernels(s, y) == 2
    np.testing.assert_allclose(y.numpy(), np.sqrt(x.sum(axis=1, keepdims=True)) + x.sum(axis=1, keepdims=True),
                               rtol=1e-5)
    a = t * 2
    m = (a + 1).sum(axis=1)  # a reduction's kernel computes a on its way: it does not store it
    assert count_kernels(a, m) == 2
    np.testing.assert_allclose(m.numpy(), (x * 2 + 1).sum(axis=1), rtol=1e-5)


def test_an_output_another_root_of_the_kernel_depends_on_is_not_merged() -> None:
    """b reads a directly and through m = a.sum(): m's kernel needs a's buffer before b's kernel runs, so a keeps
    a kernel of its own (storing it from b's would be a cycle)."""
    x = np.arange(8, dtype=np.float32)
    a = Tensor(x).realize() * 2
    m = a.sum()
    b = a + m
    assert count_kernels(a, m, b) == 3
    np.testing.assert_array_equal(a.numpy(), x * 2)
    np.testing.assert_array_equal(b.numpy(), x * 2 + (x * 2).sum())


def test_an_output_read_through_an_expand_or_another_index_is_not_merged() -> None:
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(x).realize()
    a = t + 1
    b = a.T * 2  # another element of a at each index of b
    assert count_kernels(a, b) == 2
    np.testing.assert_array_equal(b.numpy(), (x + 1).T * 2)
    c = t[:, :1] + 1
    d = c.expand(3, 4) * t
    assert count_kernels(c, d) == 2
    np.testing.assert_array_equal(d.numpy(), (x[:, :1] + 1) * x)


@pytest.mark.parametrize("optimizer", ["SGD", "Adam"])
def test_an_optimizer_step_stores_the_gradient_it_computes(optimizer: str) -> None:
    """`p.grad` keeps its value after the step (tensor value semantics), at no kernel of its own when the gradient is
    elementwise work (as BatchNorm's weight gradient from its reduced parts): the param's update kernel stores it
    too, along with the optimizer state it updates in place (one kernel per param)."""
    from glassgrad.engine import realize
    from glassgrad.nn import optim
    rng = np.random.default_rng(1)
    a, w0 = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    w = Tensor(w0, requires_grad=True)
    opt = optim.SGD([w], lr=0.1, momentum=0.9) if optimizer == "SGD" else optim.Adam([w], lr=0.1)
    loss = (Tensor(a).realize() * w).exp().sum()
    loss.backward()
    items: list[ScheduleItem] = []
    realize.capture_hooks.append(items.append)
    try:
        with Tensor.train():
            opt.step()
    finally:
        realize.capture_hooks.remove(items.append)
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), a * np.exp(a * w0), rtol=1e-5, atol=1e-6)
    grad_buffer = w.grad.uop.base.arg[0]
    writers = [item for item in items if any(buf is grad_buffer for buf, _ in item.writes)]
    state = opt.b if optimizer == "SGD" else [*opt.m, *opt.v]
    expected = {id(t.uop.base.arg[0]) for t in (w, *state)} | {id(grad_buffer)}
    assert len(writers) == 1 and {id(buf) for buf, _ in writers[0].writes} == expected, \
        [item.writes for item in items]


def test_a_weight_gradient_with_few_output_tiles_is_split_to_fill_a_gpu() -> None:
    """dW = g^T x over 16 x 256 tokens into 1536 x 512 outputs fills 48 tiles of 128 x 128: on CUDA the token sum is
    split in 4 parts (192 tiles), then the parts are summed; on the CPU it stays one kernel. Values as numpy's."""
    rng = np.random.default_rng(0)
    g_np, x_np = rng.standard_normal((16, 256, 96), np.float32), rng.standard_normal((16, 256, 32), np.float32)
    g, x = Tensor(g_np), Tensor(x_np)
    big = (Tensor.empty(16, 256, 1536).reshape(16, 256, 1536, 1) * Tensor.empty(16, 256, 512).reshape(16, 256, 1, 512))
    first, second = kernels(big.sum((0, 1)), device="CUDA")
    assert first.global_size[0] == 4 * 12 * 4 and "__shared__" in first.source, (first.name, first.global_size)
    assert "__shared__" not in second.source
    assert len(kernels(big.sum((0, 1)), device="CPU")) == 1
    short = Tensor.empty(2, 256, 1536).reshape(2, 256, 1536, 1) * Tensor.empty(2, 256, 512).reshape(2, 256, 1, 512)
    assert len(kernels(short.sum((0, 1)), device="CUDA")) == 1  # 512 tokens: not worth a second pass
    out = (g.reshape(16, 256, 96, 1) * x.reshape(16, 256, 1, 32)).sum((0, 1))
    np.testing.assert_allclose(out.numpy(), np.einsum("bto,bti->oi", g_np, x_np), rtol=1e-4, atol=1e-3)



@pytest.mark.parametrize("outputs, tokens, parts", [
    ((768, 3072), 8192, 4),   # 144 tiles: enough to fill the GPU once, split on to 576 (parts of 2048 tokens)
    ((768, 768), 8192, 4),    # 36 tiles: 4 parts fill it (144), 8 would leave parts of 1024
    ((1536, 512), 4096, 4),   # 48 tiles: 4 parts fill it; parts of 512 tokens are too short to split further
    ((8192, 768), 50304, 2),  # an LM head's input gradient: 384 tiles, 2 parts of 25152 words
    ((50304, 768), 8192, 1),  # 2358 tiles: busy enough
])
def test_a_long_gpu_matmul_splits_until_several_tiles_share_each_multiprocessor(
        outputs: tuple[int, int], tokens: int, parts: int) -> None:
    """`_gpu_fill_parts`: the fewest parts that make 128 tiles, then more while the parts stay 2048 long, up to 512
    tiles (GPT-2's weight gradients, bf16 step on an H200: 164 -> 153 ms)."""
    m, n = outputs
    product = Tensor.empty(tokens, m).T @ Tensor.empty(tokens, n)
    first = kernels(product, device="CUDA")[0]
    # the parts are the first stage's outermost axis (the kernel's name leads with them); the tiles' own shape is
    # gpudims' choice (128 x 128, or 256 x 128 for float32 products with many tiles)
    expected = f"r_{parts}_{m}_{n}_{tokens // parts}" if parts > 1 else f"r_{m}_{n}_{tokens}"
    assert first.name == expected, (first.name, first.global_size)

def test_gpu_splits_columns_with_the_parts_outermost_and_keeps_rows_whole() -> None:
    """On a GPU: a bias gradient (a column sum over 8 x 1024 tokens into 768 outputs) is split so that parts x
    outputs fill the GPU, the parts outermost (neighbouring threads keep neighbouring outputs); a cross-entropy's
    rows (8192 of 50304 logits) stay one kernel, a work-group per row; BatchNorm's statistics over N x H x W into 128
    channels still split (few outputs, very long reductions); a short column sum does not split."""
    bias = kernels(Tensor.empty(8, 1024, 768).sum((0, 1)), device="CUDA")
    assert [k.name for k in bias] == ["r_128_768_64", "r_768_128"], [k.name for k in bias]
    assert [k.name for k in kernels(Tensor.empty(8192, 50304).logsumexp(1), device="CUDA")
            if k.name.startswith("r_")] == ["r_8192_50304", "r_8192_50304"]
    assert len(kernels(Tensor.empty(64, 128, 56, 56).sum((0, 2, 3)), device="CUDA")) == 2
    assert len(kernels(Tensor.empty(128, 48).sum(0), device="CUDA")) == 1
    assert len(kernels(Tensor.empty(8, 1024, 768).sum((0, 1)), device="CPU")) == 1


def test_a_value_read_only_through_a_narrowing_cast_is_stored_narrow() -> None:
    """Autocast's logits: a matmul (float32 accumulator) cast to bfloat16, read by several kernels that widen it
    again. Every reader rounds it to bfloat16 first, so the kernel that computes it stores the bfloat16 (half the
    bytes of the float32 the loss's kernels read before), and the loss is the same."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 32), dtype=np.float32), rng.standard_normal((32, 48), dtype=np.float32)
    logits = (Tensor(x) @ Tensor(w)).cast(dtypes.bfloat16).float()
    loss = logits.log_softmax(-1).mean() + logits.square().mean()
    schedule, _ = create_schedule([loss.uop])
    matmul = next(item for item in schedule if any(u.op is Ops.REDUCE and u.arg is Ops.ADD and u.src[0].op is Ops.MUL
                                                   for u in item.ast.toposort()))
    assert matmul.bufs[0].dtype == dtypes.bfloat16
    ref = Tensor(x).numpy() @ w
    ref = Tensor(ref).cast(dtypes.bfloat16).float().numpy().astype(np.float64)
    shifted = ref - ref.max(-1, keepdims=True)
    expected = (shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))).mean() + (ref ** 2).mean()
    np.testing.assert_allclose(loss.item(), expected, rtol=1e-5)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_no_gradient_flows_through_the_max_that_shifts_a_softmax(op: str) -> None:
    """softmax(x - c) is softmax(x) for any c: the row max only keeps exp finite, so it is detached (as tinygrad and
    PyTorch do). A gradient through it added a reduction counting the max's ties and another pass over the rows (two
    of the bf16 GPT-2 loss's 8192 x 50304 kernels); the gradient is the same."""
    rng = np.random.default_rng(1)
    data, g = rng.standard_normal((4, 33), dtype=np.float32), rng.standard_normal((4, 33), dtype=np.float32)
    data[0, :3] = data[0].max() + 1  # ties at the max
    x = Tensor(data, requires_grad=True)
    out = x.logsumexp(-1, keepdim=True) if op == "logsumexp" else getattr(x, op)(-1)
    (out * Tensor(g[:, :1] if op == "logsumexp" else g)).sum().backward()
    assert x.grad is not None
    reductions = [u for u in x.grad.uop.toposort() if u.op is Ops.REDUCE_AXIS]
    assert len(reductions) == (2 if op == "logsumexp" else 3)  # max, sum of exp (and the gradient's row sum)
    d = data.astype(np.float64)
    p = np.exp(d - d.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    expected = {"softmax": p * (g - (g * p).sum(-1, keepdims=True)), "log_softmax": g - p * g.sum(-1, keepdims=True),
                "logsumexp": p * g[:, :1]}[op]
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-4, atol=1e-6)


def test_an_unrolled_recurrence_is_scheduled_in_a_few_walks(monkeypatch: pytest.MonkeyPatch) -> None:
    """An LSTM cell unrolled over 16 steps: its state chain c_t = f*c_(t-1) + i*g holds values that several kernels
    share, one level per step. The scheduler stored the lowest level and walked every kernel again for the next:
    one walk per step (68 walks, 40 s for 20 steps; an unrolled 100-step LSTM took over 10 minutes). Now the levels
    are weighed in one pass, each stored one counting as an input of those above it."""
    import glassgrad.schedule as schedule
    from glassgrad import nn
    walks = [0]
    original = schedule._reduces_to_materialise

    def counted(roots: Any) -> Any:
        walks[0] += 1
        return original(roots)
    monkeypatch.setattr(schedule, "_reduces_to_materialise", counted)
    Tensor.manual_seed(0)
    cell = nn.LSTMCell(3, 4)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 16, 3)).astype(np.float32))
    hc, outs = None, []
    for t in range(16):
        hc = cell(x[:, t], hc)
        outs.append(hc[0])
    loss = Tensor.stack(*outs, dim=1).square().mean()
    loss.backward()
    assert cell.weight_ih.grad is not None
    Tensor.realize_all(loss, cell.weight_ih.grad)
    assert walks[0] <= 8, walks[0]
