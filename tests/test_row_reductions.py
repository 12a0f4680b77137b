"""Row reductions fused into the kernel that broadcasts them (softmax, log_softmax, layernorm: one kernel).

Without a GPU: the C rendering of such a kernel computes each row's reductions once, with SIMD accumulator lanes,
before its loop over the row; the CUDA kernel
is one work-group per row with a group reduction per reduction, every thread storing a strided share of the row,
and every access in bounds; hypothesis property tests of softmax/log_softmax/layernorm against numpy (on the
emulated Metal device, `DEV=METAL GLASSGRAD_METAL_EMULATION=1`, these run the fused kernels). With a GPU
(skipped otherwise): the numbers.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_schedule import check_access, count_kernels

from glassgrad import Tensor
from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.codegen.opt import OptOps
from glassgrad.kernels import kernels, renderer_for
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_layernorm(x: np.ndarray) -> np.ndarray:
    centered = x - x.mean(-1, keepdims=True)
    return centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5)


def layernorm(t: Tensor) -> Tensor:
    centered = t - t.mean(-1, keepdim=True)
    return centered / ((centered * centered).mean(-1, keepdim=True) + 1e-5).sqrt()


ROW_OPS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
    "softmax": (lambda t: t.softmax(), np_softmax),
    "log_softmax": (lambda t: t.log_softmax(), np_log_softmax),
    "layernorm": (layernorm, np_layernorm),
}


def test_cpu_row_kernel_computes_each_reduction_once_before_the_loop_over_the_row() -> None:
    """On a CPU too, softmax is one kernel: per row, a max loop and a sum loop, each with SIMD accumulator lanes
    (4 chains of 16, as a reduction kernel of its own gets), then the loop over the row that stores."""
    t = Tensor.empty(16, 256, device="CPU").softmax()
    schedule, _ = create_schedule([t.uop])
    assert len(schedule) == 1
    spec = get_program(schedule[0].ast, renderer_for("CPU"))
    assert [o.op for o in spec.opts] == [OptOps.UPCAST] + [OptOps.UNROLL] * 4
    program = list(spec.uops)
    reduce_loops = [i for i, u in enumerate(program) if u.op is Ops.RANGE and u.arg[1] == "reduce"]
    row_loops = [i for i, u in enumerate(program) if u.op is Ops.RANGE and u.arg[1] in ("global", "upcast")][1:]
    closes = [i for i, u in enumerate(program) if u.op is Ops.ENDRANGE and u.src[0].arg[1] in ("reduce", "unroll")]
    assert len(reduce_loops) == 2 and row_loops
    assert max(closes) < min(row_loops)  # max and sum are done (once per row) before the outputs are computed
    inputs = [u for u in program if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL]
    assert len(inputs) == 2  # the max pass and the exp's staging copy read the row; the sum and the output read the
    #                          staged exp (no reduction emitted twice)
    assert sum(u.op is Ops.DEFINE_ACC and len(u.src) == 3 for u in program) == 2  # a 4x16 lane tile each
    assert spec.work == 2 * 16 * 256  # two passes over each row (what the CPU runtime splits across threads)


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("shape", [(16, 2048), (8, 1000), (3, 7), (2, 3, 96)])
def test_cpu_row_kernel_numbers(op: str, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32) * 4
    out = ROW_OPS[op][0](Tensor(x, device="CPU"))
    assert count_kernels(out) == 1
    np.testing.assert_allclose(out.numpy(), ROW_OPS[op][1](x), rtol=1e-5, atol=1e-6)


def test_cpu_transposed_softmax_reduces_each_row_once() -> None:
    """softmax over a transposed view: the SIMD lanes are 8 rows (contiguous in memory), so the row reductions keep
    the lanes' loop; they still run once per block of rows, before the loop over the row (emitted inside it, they
    ran once per output block: 137 ms instead of 5 ms at 1024 x 2048)."""
    x = np.random.default_rng(4).standard_normal((300, 40)).astype(np.float32)
    t = Tensor(x, device="CPU").T.softmax()
    schedule, _ = create_schedule([t.uop])
    program = list(get_program(schedule[-1].ast, renderer_for("CPU")).uops)
    outer = next(u for u in program if u.op is Ops.RANGE and u.arg[1] == "global")
    row_loop = next(i for i, u in enumerate(program) if u.op is Ops.RANGE and u.arg[1] == "global" and u is not outer)
    reduce_ends = [i for i, u in enumerate(program) if u.op is Ops.ENDRANGE and u.src[0].arg[1] == "reduce"]
    assert len(reduce_ends) == 2 and max(reduce_ends) < row_loop
    np.testing.assert_allclose(t.numpy(), np_softmax(x.T), rtol=1e-5, atol=1e-7)


VIEW_ROWS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
    "pad": (lambda t: t.pad(((0, 0), (5, 7))), lambda a: np.pad(a, ((0, 0), (5, 7)))),
    "pad_rows_too": (lambda t: t.pad(((1, 2), (3, 4))), lambda a: np.pad(a, ((1, 2), (3, 4)))),
    "shrink": (lambda t: t[:, 17:251], lambda a: a[:, 17:251]),
    "flip": (lambda t: t.flip(1), lambda a: a[:, ::-1]),
    "stride2": (lambda t: t[:, ::2], lambda a: a[:, ::2]),
    "expand": (lambda t: t[:, :1].expand(24, 64), lambda a: np.broadcast_to(a[:, :1], (24, 64))),
    "permute": (lambda t: t.reshape(24, 20, 15).permute(0, 2, 1), lambda a: a.reshape(24, 20, 15).transpose(0, 2, 1)),
}


@pytest.mark.parametrize("view", list(VIEW_ROWS))
def test_cpu_softmax_of_views_is_one_kernel_and_right(view: str) -> None:
    """Rows that are padded (gated loads), shrunk, flipped (negative strides), strided, broadcast or permuted: one
    kernel each, against numpy (the staged exp's canonical form must see the same row in the sum and the output)."""
    x = (np.random.default_rng(5).standard_normal((24, 300)) * 3).astype(np.float32)
    make, ref = VIEW_ROWS[view]
    out = make(Tensor(x, device="CPU")).softmax()
    assert count_kernels(out) == 1
    np.testing.assert_allclose(out.numpy(), np_softmax(ref(x)), rtol=1e-5, atol=1e-7)


def test_cpu_softmax_computes_each_exp_once() -> None:
    """softmax's `exp(x - max)` is needed by the sum and by the output: the CPU kernel computes it once per row into
    a staging buffer (one exp2f call in the source), which both passes read."""
    x = np.random.default_rng(3).standard_normal((8, 1000)).astype(np.float32) * 3
    t = Tensor(x, device="CPU").softmax()
    schedule, _ = create_schedule([t.uop])
    source = get_program(schedule[-1].ast, renderer_for("CPU")).source
    kernel = source[source.index("\nvoid "):]  # (the helpers before it declare and define vector exp2f's)
    assert kernel.count("exp2f(") == 1, source
    np.testing.assert_allclose(t.numpy(), np_softmax(x), rtol=1e-5, atol=1e-7)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 5), width=st.integers(2, 300), scale=st.sampled_from([0.1, 3.0, 30.0]))
def test_cpu_row_kernels_match_numpy(rows: int, width: int, scale: float) -> None:
    """Any row width (lanes that do not divide it, short rows, the staged exp): softmax, log_softmax and layernorm
    against numpy."""
    x = (np.random.default_rng(width).standard_normal((rows, width)) * scale).astype(np.float32)
    for op, (fn, ref) in ROW_OPS.items():
        np.testing.assert_allclose(fn(Tensor(x, device="CPU")).numpy(), ref(x), rtol=2e-5, atol=2e-6, err_msg=op)


def cuda_row_kernel(shape: tuple[int, ...], op: str = "softmax") -> tuple[ProgramSpec, int]:
    t = ROW_OPS[op][0](Tensor.empty(*shape))
    specs = kernels(t, device="CUDA")
    assert len(specs) == 1
    schedule, _ = create_schedule([t.uop])
    return specs[0], schedule[-1].bufs[0].size


@pytest.mark.parametrize("shape,local", [((64, 1024), 256), ((8, 1000), 256), ((30, 10), 32), ((2, 3, 300), 256),
                                         ((4, 100), 128)])
def test_cuda_row_kernel_is_one_group_per_row(shape: tuple[int, ...], local: int) -> None:
    spec, _ = cuda_row_kernel(shape)
    rows = int(np.prod(shape[:-1]))
    assert spec.global_size == (rows, 1, 1) and spec.local_size == (local, 1, 1)
    ops = [u.op for u in spec.uops]
    assert ops.count(Ops.GROUP_REDUCE) == 2
    first_group_reduce = ops.index(Ops.GROUP_REDUCE)
    store = next(u for u in spec.uops if u.op is Ops.STORE)
    # every thread stores its strided share of the row, in the loop over the row (none if one pass covers it)
    # that follows the reductions
    stored = spec.uops.index(store)
    row_loop = next((i for i, u in enumerate(spec.uops) if u.op is Ops.RANGE and u.arg[1] == "global"), stored)
    assert first_group_reduce < row_loop <= stored
    assert (row_loop < stored) == (shape[-1] > local)
    assert not any(n.op is Ops.CMPEQ for n in store.toposort())  # no `lidx == 0` gate
    assert ops[row_loop:].count(Ops.GROUP_REDUCE) == 0  # no barrier inside the loop over the row


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("shape", [(8, 1000), (30, 10), (2, 3, 300), (2, 1024), (1000,)])
def test_cuda_row_kernel_accesses_stay_in_bounds(op: str, shape: tuple[int, ...]) -> None:
    spec, out_size = cuda_row_kernel(shape, op)
    size = int(np.prod(shape))
    checked = 0
    for u in spec.uops:
        if u.op is Ops.LOAD:
            check_access(u, size, f"{spec.name}: load")
            checked += 1
        elif u.op is Ops.STORE:
            gated = u.src[:2] + u.src[3:] if len(u.src) == 4 else u.src[:2]
            check_access(u.replace(op=Ops.LOAD, src=gated, dtype=u.src[2].dtype), out_size, f"{spec.name}: store")
            checked += 1
    assert checked >= 2


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(2, 600), op=st.sampled_from(list(ROW_OPS)),
       scale=st.sampled_from([1.0, 30.0]))
def test_row_ops_match_numpy(rows: int, cols: int, op: str, scale: float) -> None:
    shape = (rows, cols) if rows > 1 else (cols,)
    x = (np.random.default_rng(rows * 1000 + cols).standard_normal(shape) * scale).astype(np.float32)
    fn, ref = ROW_OPS[op]
    np.testing.assert_allclose(fn(Tensor(x)).numpy(), ref(x.astype(np.float64)), rtol=2e-4, atol=2e-5)


# ---------------------------------------------------------------- on a GPU


@pytest.mark.parametrize("op", list(ROW_OPS))
@pytest.mark.parametrize("shape", [(8, 1000), (30, 10), (2, 3, 300), (64, 8192), (3, 16384), (1000,)])
def test_row_ops_on_gpu(cuda: str, op: str, shape: tuple[int, ...]) -> None:
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32) * 5
    fn, ref = ROW_OPS[op]
    np.testing.assert_allclose(fn(Tensor(x, device=cuda)).numpy(), ref(x.astype(np.float64)), rtol=2e-4,
                               atol=2e-5)


@pytest.mark.parametrize("columns", [77, 1000, 1023])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_row_max_of_any_length_keeps_nan_and_infinities(columns: int, dtype: type) -> None:
    """A row max of a length 16 does not divide: lanes of 8 (1000), or a SIMD max with a NaN flag (77, 1023, whose
    C loop says `reduction(max:...)`); NaN anywhere in a row gives NaN, infinities and all -inf rows stay."""
    x = np.random.default_rng(columns).standard_normal((9, columns)).astype(dtype)
    x[1, columns // 2] = np.nan
    x[2, -1] = np.nan
    x[3, :] = -np.inf
    x[4, 0] = np.inf
    x[5, :] = np.nan
    x[6, 3] = -np.inf
    x[7, 5] = 1e-42 if dtype == np.float32 else 1e-310  # a denormal
    x[7, :5] = -1.0
    x[7, 6:] = -2.0
    np.testing.assert_array_equal(Tensor(x, device="CPU").max(-1).numpy(), x.max(-1))
    with np.errstate(invalid="ignore"):
        expected = np_softmax(x)
    np.testing.assert_allclose(Tensor(x, device="CPU").softmax(-1).numpy(), expected, rtol=1e-5, atol=1e-7)


def test_cpu_row_max_of_77_is_a_simd_reduction() -> None:
    x = Tensor(np.zeros((64, 77), np.float32), device="CPU")
    source = kernels(x.max(-1), device="CPU")[0].source
    assert "reduction(max:" in source and "= NAN;" in source
    source = kernels(Tensor(np.zeros((64, 1000), np.float32), device="CPU").max(-1), device="CPU")[0].source
    # 8 lanes instead where the compiler needs them (clang); gcc vectorises the plain reduction, 4x faster
    from glassgrad import Device
    assert ("reduction(max:" not in source) == Device["CPU"].renderer.max_lanes  # type: ignore[attr-defined]
