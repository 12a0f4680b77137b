"""Convolutions on the CPU: staging of gated loads (`codegen/stage.py`: where the copies go in the generated C, that
the tile's loop reads the staging buffer without gates) and SIMD lane loops written in register-sized chunks, with
results against numpy (and PyTorch when installed) for convolutions of several shapes."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgrad import Tensor
from glassgrad.codegen import get_program, optimize_ast
from glassgrad.codegen import stage as stage_module
from glassgrad.codegen.linearize import linearize
from glassgrad.codegen.opt import Opt, OptOps
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.codegen.stage import stage_gated_loads, stages_before_reduction
from glassgrad.device import Device
from glassgrad.renderer.cstyle import ClangRenderer
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

try:
    import torch
except ImportError:  # PyTorch is optional
    torch = None

CPU = Device["CPU"]
# the register tiles these tests name are AVX-512's (RegisterBudget): the kernels are rendered for it on any machine
AVX512 = ClangRenderer(native_half=CPU.renderer.native_half, omp_simd=CPU.renderer.omp_simd, vector_bytes=64)
AVX2 = ClangRenderer(native_half=CPU.renderer.native_half, omp_simd=CPU.renderer.omp_simd, vector_bytes=32)


def conv_ast(x: tuple[int, ...], w: tuple[int, ...], **kwargs: int) -> UOp:
    schedule, _ = create_schedule([Tensor.empty(*x).conv2d(Tensor.empty(*w), **kwargs).uop])
    return optimize_ast(schedule[-1].ast, CPU.renderer)


def conv_reference(x: np.ndarray, w: np.ndarray, padding: int, stride: int = 1) -> np.ndarray:
    n, cin, h, wd = x.shape
    cout, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((n, cout, oh, ow), np.float64)
    for i in range(kh):
        for j in range(kw):
            window = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", window, w[:, :, i, j])
    return out.astype(np.float32)


def tile_loop(source: str) -> str:
    """The C of the register tile's reduction: from the accumulator's declaration to the end of its loops."""
    start = source.index("float acc0[")
    return source[start:source.index("data0[", start)]


def test_padded_conv_stages_its_input_once_per_output_position() -> None:
    """The heuristic's kernel for a padded 3x3 conv: the gated input loads run in copy loops before the reduction
    (16 output channels per tile, the channel blocks innermost, so one copy serves all of them); the tile's loop
    reads the buffer through a restrict pointer, with no gate left."""
    ast = conv_ast((2, 8, 16, 16), (32, 8, 3, 3), padding=1)
    opts = hand_coded_optimizations(Kernel(ast, AVX512))
    assert opts == [Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.SWAP, 1, 2)]
    source = get_program(ast, AVX512, opts).source
    # its footprint: 8 input channels x 3 kernel rows x 18 padded columns (a column x + kx is copied once, not once
    # for each of the 16 x 3 pairs that read it)
    assert "float smem0_[432] __attribute__((aligned(64))); float* restrict smem0 = smem0_;" in source
    copy = source[source.index("smem0 = smem0_;"):source.index("float acc0[")]
    assert " ? data1[" in copy and "smem0[" in copy and "#pragma omp simd" in copy
    loop = tile_loop(source)
    assert "?" not in loop and "data1" not in loop and "= smem0[" in loop
    spec = get_program(ast, AVX512, opts)
    staged = [u for u in spec.uops if u.op in (Ops.LOAD, Ops.STORE) and
              (u.src[0].op is Ops.DEFINE_LOCAL or u.src[0].op is Ops.BARRIER)]
    assert len(staged) == 2  # the copy's store and the tile's load, both inside the buffer
    assert all(0 <= u.src[1].vmin and u.src[1].vmax < 432 for u in staged)
    # the copy (3 loops: input channels, kernel rows, padded columns) sits inside the loops over the batch and the
    # output rows, outside the loop over the 2 blocks of 16 output channels
    outer, blocks = copy.split("for (long long ridx2 = 0; ridx2 < 2; ridx2++) {")
    assert outer.count("for (") == 2 + 3 and "smem0[" in outer and "for (" not in blocks


@pytest.mark.parametrize("x_shape, w_shape, padding, stride", [
    ((2, 8, 16, 16), (32, 8, 3, 3), 1, 1),
    ((1, 3, 11, 13), (16, 3, 3, 3), 1, 1),    # odd sizes: the vector axis is split, not whole
    ((2, 4, 9, 9), (8, 4, 5, 5), 2, 1),       # 5x5 with padding 2
    ((2, 4, 12, 12), (16, 4, 3, 3), 1, 2),    # strided: the loads along the vector axis are not contiguous
    ((1, 128, 4, 16), (16, 128, 3, 3), 1, 1),  # a whole reduction's copy over STAGE_MAX: one per input channel
])
def test_padded_convs_match_numpy(x_shape: tuple[int, ...], w_shape: tuple[int, ...], padding: int,
                                  stride: int) -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(x_shape, dtype=np.float32), rng.standard_normal(w_shape, dtype=np.float32)
    out = Tensor(x).conv2d(Tensor(w), padding=padding, stride=stride).numpy()
    np.testing.assert_allclose(out, conv_reference(x, w, padding, stride), rtol=1e-4, atol=1e-4)
    if torch is not None:
        expected = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=padding, stride=stride)
        np.testing.assert_allclose(out, expected.numpy(), rtol=1e-4, atol=1e-4)


def test_large_reduction_is_staged_inside_its_outer_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole reduction's copy over STAGE_MAX elements: the copy is made per step of the outermost reduce loop
    (the input channels), covering the kernel window and the lanes."""
    monkeypatch.setattr(stage_module, "STAGE_MAX", 256)
    ast = conv_ast((2, 8, 8, 16), (16, 8, 3, 3), padding=1)
    k = Kernel(ast, CPU.renderer).apply_opts([Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UPCAST, 1, 8)])
    assert not stages_before_reduction(k.ast, k.upcast)
    staged = stage_gated_loads(k.ast, k.upcast)
    barrier = next(u for u in staged.toposort() if u.op is Ops.BARRIER)
    local = barrier.src[0]
    assert local.op is Ops.DEFINE_LOCAL and local.arg[1] == 3 * 18  # kernel rows x (16 columns + 2 of padding)
    program = linearize(staged, k.upcast)
    reduce_loops = [u for u in program if u.op is Ops.RANGE and u.arg[1] == "reduce"]
    copy_loops = [u for u in program if u.op is Ops.RANGE and u.arg[1] == "stage"]
    assert program.index(reduce_loops[0]) < program.index(copy_loops[0]) < program.index(reduce_loops[1])


def test_ungated_and_untiled_kernels_are_not_staged() -> None:
    a, b = Tensor.empty(64, 64), Tensor.empty(64, 64)
    assert "smem" not in get_program(create_schedule([(a @ b).uop])[0][-1].ast, CPU.renderer).source
    ast = conv_ast((2, 4, 8, 8), (8, 4, 3, 3))  # no padding: no gates
    assert "smem" not in get_program(ast, CPU.renderer).source
    padded = conv_ast((2, 4, 8, 8), (8, 4, 3, 3), padding=1)
    assert "smem" not in get_program(padded, CPU.renderer, []).source  # no register tile: nothing to protect


def test_gated_where_folds_into_the_load() -> None:
    """WHERE(g, LOAD(buf, i, g), 0) is the gated load itself: the source selects once, not twice."""
    source = get_program(conv_ast((1, 2, 6, 6), (2, 2, 3, 3), padding=1), CPU.renderer, []).source
    assert len(re.findall(r"\? data1\[", source)) == 1 and "? val" not in source


@pytest.mark.parametrize("size, chunks", [(20, [16, 4]), (30, [16, 8, 4, 2]), (16, [16]), (48, [48]), (36, [32, 4]),
                                          (5, [4, 1]), (3, [3]), (8, [8]), (24, [16, 8]), (12, [8, 4])])
def test_lane_chunks(size: int, chunks: list[int]) -> None:
    assert ClangRenderer().lane_chunks(size) == chunks


def test_lane_loop_of_20_is_written_as_16_and_4() -> None:
    """A 5x5 conv with 20 output columns (MNIST's second conv): the lane loop of the tile, and of the stores, is a
    loop over lanes 0-15 then one over 16-19 (gcc made a scalar loop of the last 4, accumulators in memory). Four
    output channels: with 8 or a multiple of 8 they would be the lanes of a packed channel tile instead."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3, 24, 24), dtype=np.float32), rng.standard_normal((4, 3, 5, 5), dtype=np.float32)
    out = Tensor(x).conv2d(Tensor(w))
    source = get_program(create_schedule([out.uop])[0][-1].ast, CPU.renderer).source
    assert len(re.findall(r"for \(long long (ridx\d+) = 0; \1 < 16; \1\+\+\)", source)) == 2
    assert len(re.findall(r"for \(long long (ridx\d+) = 16; \1 < 20; \1\+\+\)", source)) == 2
    np.testing.assert_allclose(out.numpy(), conv_reference(x, w, 0), rtol=1e-4, atol=1e-4)


def test_partly_filled_vector_gives_packed_channel_lanes() -> None:
    """A padded conv with 10 output columns (8 + 2 lanes would leave registers partly empty): the output channels
    become the 16 SIMD lanes, the weights are packed once per block of 16 channels with the lanes contiguous, the
    output columns (10) and 2 output rows become 20 rows of the tile, and the tile's loop reads the two staging
    buffers only: a broadcast input value times a vector of weights."""
    ast = conv_ast((2, 8, 10, 10), (32, 8, 3, 3), padding=1)
    opts = hand_coded_optimizations(Kernel(ast, AVX512))
    assert opts == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UPCAST, 2, 2)]
    source = get_program(ast, AVX512, opts).source
    assert "float smem1_[1152]" in source  # 8 input channels x 3 x 3 taps x 16 output channels
    pack = source[source.index("smem1 = smem1_;"):source.index("float acc0[")]
    lanes_last = r"smem1\[\(+ridx\d+ \* 144\) \+ \(ridx\d+ \* 48\)\) \+ \(ridx\d+ \* 16\)\) \+ ridx\d+\)\] = val"
    assert re.search(lanes_last, pack)
    loop = source[source.index("#pragma GCC unroll 2"):source.index("data0[")]
    assert "data" not in loop and "?" not in loop and "= smem0[" in loop and "= smem1[" in loop
    assert loop.index("= smem0[") < loop.index("#pragma omp simd") < loop.index("= smem1[")
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 8, 10, 10), dtype=np.float32), rng.standard_normal((32, 8, 3, 3), dtype=np.float32)
    np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w), padding=1).numpy(), conv_reference(x, w, 1),
                               rtol=1e-4, atol=1e-4)


def conv_input_gradient_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, g: np.ndarray,
                                  padding: int, stride: int = 1) -> np.ndarray:
    """d/dx of sum(g * relu(conv2d(x, w, padding, stride) + b)), by scattering each tap's products back to the
    input (`g` selected where the ReLU passes, so an inf where it does not is not multiplied by 0)."""
    pre = conv_reference(x, w, padding, stride) + b[None, :, None, None]
    upstream = np.where(pre > 0, g, 0).astype(np.float64)
    n, cin, h, wd = x.shape
    _, _, kh, kw = w.shape
    _, _, oh, ow = upstream.shape
    grad = np.zeros((n, cin, h + 2 * padding + stride, wd + 2 * padding + stride))
    for i in range(kh):
        for j in range(kw):
            grad[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += \
                np.einsum("nohw,oc->nchw", upstream, w[:, :, i, j])
    return grad[:, :, padding:padding + h, padding:padding + wd].astype(np.float32)


@pytest.mark.parametrize("x_shape, w_shape, padding", [
    ((4, 32, 10, 10), (64, 32, 3, 3), 0),  # MNIST's third conv: 10 columns, 8 of output
    ((2, 8, 9, 7), (16, 8, 3, 3), 1),
    ((2, 4, 12, 12), (8, 4, 5, 5), 2),
])
def test_conv_input_gradient_stages_the_relu_gradient_once(x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                                                           padding: int) -> None:
    """The input gradient of `relu(conv(x) + b)`: the copy loops compute `relu'(conv + b) * g` over the padded
    window's footprint, and the tile's loop is a plain multiply-add of the buffer and the weight (no gate, no
    select); the gradient matches numpy (and PyTorch)."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(x_shape, dtype=np.float32), rng.standard_normal(w_shape, dtype=np.float32)
    b = rng.standard_normal(w_shape[0], dtype=np.float32)
    out_shape = (x_shape[0], w_shape[0], x_shape[2] + 2 * padding - w_shape[2] + 1,
                 x_shape[3] + 2 * padding - w_shape[3] + 1)
    g = rng.standard_normal(out_shape, dtype=np.float32)
    tx, tw, tb = Tensor(x, requires_grad=True), Tensor(w), Tensor(b)
    ((tx.conv2d(tw, padding=padding) + tb.reshape(1, -1, 1, 1)).relu() * Tensor(g)).sum().backward()
    assert tx.grad is not None
    schedule, _ = create_schedule([tx.grad.uop])
    ast = optimize_ast(schedule[-1].ast, CPU.renderer)
    source = get_program(ast, CPU.renderer).source
    loop = source[source.index("#pragma GCC unroll"):source.index("data0[")]  # the tile's rows, inside the reduction
    assert "?" not in loop and "= smem0[" in loop
    assert re.search(r"acc0\[([^]]+)\] = GG_FMAF\(val\d+, val\d+, acc0\[\1\]\);", loop)  # a fused multiply-add
    expected = conv_input_gradient_reference(x, w, b, g, padding)
    np.testing.assert_allclose(tx.grad.numpy(), expected, rtol=1e-4, atol=1e-4)
    if torch is not None:
        t = torch.from_numpy(x).requires_grad_()
        pre = torch.nn.functional.conv2d(t, torch.from_numpy(w), torch.from_numpy(b), padding=padding)
        (pre.relu() * torch.from_numpy(g)).sum().backward()
        assert t.grad is not None
        np.testing.assert_allclose(tx.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def _heuristic_agrees_with_unoptimised(ast: UOp, renderer: ClangRenderer | None = None) -> None:
    from glassgrad.codegen.opt.search import random_inputs, run_program
    inputs = random_inputs(ast)
    outs = []
    for opts in ([], None):
        spec = get_program(ast, renderer or CPU.renderer, opts)
        outs.append(run_program(CPU, spec, CPU.compiler.compile(spec.source), inputs)[1][0])
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 2), cin=st.integers(1, 5), cout=st.sampled_from([1, 3, 8, 16]), h=st.integers(3, 12),
       w=st.integers(3, 19), k=st.sampled_from([1, 2, 3, 5]), padding=st.integers(0, 2), stride=st.integers(1, 2),
       dilation=st.integers(1, 2))
def test_staged_convolutions_agree_with_unoptimised(n: int, cin: int, cout: int, h: int, w: int, k: int, padding: int,
                                                    stride: int, dilation: int) -> None:
    """Any convolution's forward and input-gradient kernels (a relu between): the heuristic's kernel, staged over
    window footprints, computes what the unoptimised kernel does on the same random inputs."""
    span = dilation * (k - 1) + 1
    if h + 2 * padding < span or w + 2 * padding < span:
        return
    x = Tensor.empty(n, cin, h, w).requires_grad_()
    out = x.conv2d(Tensor.empty(cout, cin, k, k), padding=padding, stride=stride, dilation=dilation).relu()
    out.sum().backward()
    assert x.grad is not None
    for tensor in (out, x.grad):
        schedule, _ = create_schedule([tensor.uop])
        _heuristic_agrees_with_unoptimised(optimize_ast(schedule[-1].ast, CPU.renderer))


def test_weight_gradient_packs_each_image_once_for_many_outputs() -> None:
    """A conv's weight gradient on a CPU (12,800 outputs, each a sum over 64 x 16 x 16 positions) is reduced one
    image at a time (the parts outermost), then summed; the first stage takes 16 input channels as lanes, the kernel
    width and 4 output channels as rows, and packs `relu(x)` for an image once for every block of output channels
    (the blocks innermost). The gradient matches numpy's (and PyTorch's)."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((64, 16, 20, 20), dtype=np.float32)
    w = rng.standard_normal((32, 16, 5, 5), dtype=np.float32)
    g = rng.standard_normal((64, 32, 16, 16), dtype=np.float32)
    tw = Tensor(w, requires_grad=True)
    (Tensor(x).relu().conv2d(tw) * Tensor(g)).sum().backward()
    assert tw.grad is not None
    from test_ccompiler import cpu_rendered_by

    from glassgrad.kernels import kernels
    with cpu_rendered_by(AVX512):
        specs = kernels(tw.grad, device="CPU")
    assert [s.name for s in specs[-2:]] == ["r_64_32_16_5_5_16_16", "r_32_16_5_5_64"]
    # (the 16 input channels upcast whole: the axes after them move up by one)
    assert specs[-2].opts == (Opt(OptOps.UPCAST, 2, 0), Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UPCAST, 1, 4),
                              Opt(OptOps.SWAP, 1, 2))
    windows = np.lib.stride_tricks.sliding_window_view(np.maximum(x, 0).astype(np.float64), (5, 5), axis=(2, 3))
    expected = np.einsum("boyx,bcyxij->ocij", g.astype(np.float64), windows)
    np.testing.assert_allclose(tw.grad.numpy(), expected, rtol=1e-4, atol=1e-3)


def test_weight_gradient_packs_the_incoming_gradient_per_image() -> None:
    """A 3x3 weight gradient of 64 -> 64 channels on 6x6 outputs (MNIST's fourth conv): 16 output channels are the
    lanes, the incoming gradient `g[b, co, y, x]` is packed one image at a time (36 x 16 values, remade per image),
    and the window's 9 taps times 2 input channels are 18 rows sharing each packed vector. The gradient matches
    numpy's. (At a batch whose inputs fit a pack whole, the input channels are the lanes instead.)"""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((32, 64, 8, 8), dtype=np.float32)
    w = rng.standard_normal((64, 64, 3, 3), dtype=np.float32) * 0.1
    g = rng.standard_normal((32, 64, 6, 6), dtype=np.float32)
    tw = Tensor(w, requires_grad=True)
    (Tensor(x).conv2d(tw) * Tensor(g)).sum().backward()
    assert tw.grad is not None
    from glassgrad.kernels import kernels
    spec = kernels(tw.grad, device="CPU")[-1]
    assert spec.name == "r_64_64_3_3_32_6_6"
    assert spec.opts == (Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UPCAST, 2, 0),
                         Opt(OptOps.UPCAST, 1, 2))
    assert re.search(r"smem\d+\[\(\(\(\w+ \* 96\) \+ \(\w+ \* 16\)\) \+ \w+\)\] = ", spec.source), spec.source
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (3, 3), axis=(2, 3))
    expected = np.einsum("boyx,bcyxij->ocij", g.astype(np.float64), windows)
    np.testing.assert_allclose(tw.grad.numpy(), expected, rtol=1e-4, atol=1e-3)


def test_the_register_budget_follows_the_simd_width() -> None:
    """AVX2 has half of AVX-512's registers, each half as wide: a staged conv tile takes 8 rows of 16 output
    channels there instead of 16 (128 accumulators, 16 registers), and a packed channel tile at most 12 rows (10
    output columns) instead of 20; the values are the same either way."""
    staged = conv_ast((2, 8, 16, 16), (32, 8, 3, 3), padding=1)
    assert hand_coded_optimizations(Kernel(staged, AVX2)) == \
        [Opt(OptOps.UPCAST, 3, 0), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.SWAP, 1, 2)]
    packed = conv_ast((2, 8, 10, 10), (32, 8, 3, 3), padding=1)
    assert hand_coded_optimizations(Kernel(packed, AVX2)) == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 3, 0)]
    for ast in (staged, packed):
        _heuristic_agrees_with_unoptimised(ast, AVX2)


@pytest.mark.parametrize("x_shape, w_shape, padding", [
    ((4, 32, 10, 10), (64, 32, 3, 3), 0),
    ((2, 8, 16, 16), (32, 8, 3, 3), 1),
    ((2, 4, 12, 12), (8, 4, 5, 5), 2),
])
def test_input_gradient_of_a_summed_relu_conv_has_no_gate_in_its_tile(x_shape: tuple[int, ...],
                                                                     w_shape: tuple[int, ...], padding: int) -> None:
    """`conv(x).relu().sum().backward()`: the incoming gradient is the constant 1, so the staged value is the ReLU's
    derivative alone, `y <= 0 ? 0 : 1`, which is 0 on the padding too (the padded `y` reads 0): the padding's
    selects are dropped and the tile is a plain multiply-add (it kept them, 17x slower: 420 against 25 ms at
    16x32x32x32 -> 64). The gradient matches numpy's (and PyTorch's)."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal(x_shape, dtype=np.float32), rng.standard_normal(w_shape, dtype=np.float32)
    tx = Tensor(x, requires_grad=True)
    tx.conv2d(Tensor(w), padding=padding).relu().sum().backward()
    assert tx.grad is not None
    schedule, _ = create_schedule([tx.grad.uop])
    ast = optimize_ast(schedule[-1].ast, CPU.renderer)
    source = get_program(ast, CPU.renderer).source
    loop = source[source.index("#pragma GCC unroll"):source.index("data0[")]  # the tile's rows, inside the reduction
    assert "?" not in loop and "= smem0[" in loop and "GG_FMAF(" in loop, loop
    g = np.ones((x_shape[0], w_shape[0], x_shape[2] + 2 * padding - w_shape[2] + 1,
                 x_shape[3] + 2 * padding - w_shape[3] + 1), np.float32)
    expected = conv_input_gradient_reference(x, w, np.zeros(w_shape[0], np.float32), g, padding)
    np.testing.assert_allclose(tx.grad.numpy(), expected, rtol=1e-4, atol=1e-4)
    if torch is not None:
        t = torch.from_numpy(x).requires_grad_()
        torch.nn.functional.conv2d(t, torch.from_numpy(w), padding=padding).relu().sum().backward()
        assert t.grad is not None
        np.testing.assert_allclose(tx.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_a_stride_2_convolution_gets_rows_of_output_channels() -> None:
    """A first layer (3 input channels, stride 2): no output axis is read contiguously, so the lanes are 16 output
    columns read with a stride of 2 (111 padded to 112), and 8 output channels are the rows that share each gathered
    vector of the input (it had no opts at all: 12.4 -> 3.4 ms at 3x224x224 -> 32). The 7 column blocks are too few
    for the threads' loop, so the 4 channel blocks move innermost past both other axes (one copy of the input's
    columns for all of them), the 111 output rows becoming the threads' loop. Values as numpy's."""
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((1, 3, 224, 224), dtype=np.float32), rng.standard_normal((32, 3, 3, 3), dtype=np.float32)
    ast = conv_ast(x.shape, w.shape, stride=2)
    opts = hand_coded_optimizations(Kernel(ast, AVX2))  # (AVX2's 8 rows; the test ran on the machine's renderer,
    assert opts == [Opt(OptOps.PADTO, 2, 16), Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 0, 8),  # AVX-512: 16)
                    Opt(OptOps.SWAP, 0, 1), Opt(OptOps.SWAP, 1, 2)]
    source = get_program(ast, AVX2, opts).source
    assert re.search(r"for \(long long ridx\d+ = start; ridx\d+ < end; ridx\d+\+\+\) \{\n\s*long long alu\d+ = "
                     r"\(ridx\d+ \* 448\)", source), source  # the threads' loop: the output rows (2 * 224 a row)
    _heuristic_agrees_with_unoptimised(ast, AVX2)
    np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w), stride=2).numpy(), conv_reference(x, w, 0, stride=2),
                               rtol=1e-4, atol=1e-4)



def test_a_batched_matmul_takes_its_rows_from_the_longer_batch_axis() -> None:
    """`(B, T, C) @ (C, N)` (a linear layer on a transformer's activations): the weight's vector of N stays put along
    both B and T; the rows come from T (8 of 64), not from B = 4, the threads' outermost axis, which left room for 2
    (3.9x slower over a transformer block's three such kernels). Values as numpy's."""
    rng = np.random.default_rng(10)
    x, w = rng.standard_normal((4, 64, 128), dtype=np.float32), rng.standard_normal((128, 512), dtype=np.float32)
    schedule, _ = create_schedule([(Tensor.empty(4, 64, 128) @ Tensor.empty(128, 512)).uop])
    assert hand_coded_optimizations(Kernel(schedule[-1].ast, CPU.renderer)) == \
        [Opt(OptOps.UPCAST, 2, 16), Opt(OptOps.UPCAST, 1, 8)]
    np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kwargs, footprint", [
    (dict(stride=2, padding=1), 8 * 3 * 17),     # 8 rows of stride 2 and 3 taps: columns 2 * row + kx, 17 of them
    (dict(dilation=2, padding=2), 8 * 3 * 20),   # 16 lanes and 3 taps 2 apart: columns lane + 2 * kx, 20 of them
])
def test_a_strided_window_is_staged_as_one_axis_of_columns(kwargs: dict[str, int], footprint: int) -> None:
    """The columns a stride-2 (or dilated) window reads form one axis of the staging buffer, 2 * row + kx (or
    lane + 2 * kx), not one axis per loop: the copy loop then reads the input contiguously and vectorises (with a
    relu before the conv it was a scalar loop with a branch per value: 8x48x32x32 -> 64, 3x3, stride 2, one thread
    27 -> 5 ms). The values are numpy's."""
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 8, 16, 16), dtype=np.float32), rng.standard_normal((32, 8, 3, 3), dtype=np.float32)
    schedule, _ = create_schedule([Tensor.empty(*x.shape).relu().conv2d(Tensor.empty(*w.shape), **kwargs).uop])
    ast = optimize_ast(schedule[-1].ast, CPU.renderer)
    source = get_program(ast, AVX2, hand_coded_optimizations(Kernel(ast, AVX2))).source
    assert f"float smem0_[{footprint}]" in source
    _heuristic_agrees_with_unoptimised(ast, AVX2)
    out = Tensor(x).relu().conv2d(Tensor(w), **kwargs).numpy()
    dilated = np.zeros((32, 8, 5, 5), np.float32)
    dilated[:, :, ::2, ::2] = w
    expected = conv_reference(np.maximum(x, 0), w, 1, 2) if "stride" in kwargs else \
        conv_reference(np.maximum(x, 0), dilated, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_packed_tile_pads_a_prime_row_count() -> None:
    """A packed channel tile whose rows no count within the budget divides (17 output columns, AVX2's 12 rows) pads
    them to 2 x 9 (`heuristic._padded_rows`); with AVX-512's 25 the 17 are rows whole. Both compute what the
    unoptimised kernel does (the padded rows clamped, the store past 17 skipped)."""
    ast = conv_ast((2, 8, 19, 19), (32, 8, 3, 3))
    avx2 = hand_coded_optimizations(Kernel(ast, AVX2))
    assert Opt(OptOps.PADTO, 3, 9) in avx2 and Opt(OptOps.UPCAST, 3, 9) in avx2, avx2
    assert Opt(OptOps.UPCAST, 3, 0) in hand_coded_optimizations(Kernel(ast, AVX512))
    _heuristic_agrees_with_unoptimised(ast, AVX2)


# ---------------------------------------------------------------------------- convolutions of untuned shapes (stop 31)

def weight_gradient_reference(x: np.ndarray, g: np.ndarray, kernel: int, padding: int, stride: int) -> np.ndarray:
    """d/dw of sum(g * conv2d(x, w, padding, stride)): each tap's window of x against g, summed over the batch."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kernel, kernel), axis=(2, 3))[:, :, ::stride, ::stride]
    oh, ow = g.shape[2:]
    return np.einsum("boyx,bcyxij->ocij", g.astype(np.float64), windows[:, :, :oh, :ow]).astype(np.float32)


def copy_loops(source: str) -> list[tuple[str, str]]:
    """(loop variable, body) of each staging copy's innermost loop: an `omp simd` loop that stores to a buffer."""
    loops = re.finditer(r"#pragma omp simd\n\s*for \(long long (ridx\d+) = 0; \1 < \d+; \1\+\+\) \{\n(.*?)\n\s*\}",
                        source, re.S)
    return [(m.group(1), m.group(2)) for m in loops if re.search(r"smem\d+\[[^\]]*\] = ", m.group(2))]


def test_a_transposing_pack_copies_along_the_rows_it_reads() -> None:
    """The weight gradient of a stride-2 conv over 16x16 outputs (a small CNN's third conv) packs the incoming
    gradient `g[b, co, y, x]` one image at a time with the output channels contiguous: a transpose. Its innermost
    copy loop runs along x, which the loads read contiguously (the stores land 16 apart), not along the channels
    (loads 256 apart: gcc 12 left that loop scalar, with a mispredicted branch for the ReLU's mask, 27 -> 7 ms on
    one thread). Every staging copy of the step whose loads run contiguously along some copy loop of 8 or more reads
    them so in its innermost loop; the gradients match numpy's (and PyTorch's)."""
    from glassgrad.kernels import kernels
    rng = np.random.default_rng(31)
    x = rng.standard_normal((8, 16, 32, 32), dtype=np.float32)
    w = (rng.standard_normal((32, 16, 3, 3), dtype=np.float32) * 0.1).astype(np.float32)
    tw = Tensor(w, requires_grad=True)
    Tensor(x).relu().conv2d(tw, stride=2, padding=1).relu().mean((2, 3)).sum().backward()
    assert tw.grad is not None
    spec = next(s for s in kernels(tw.grad, device="CPU") if s.name.startswith("r_32_16_3_3"))
    pack = [(lane, body) for lane, body in copy_loops(spec.source) if re.search(rf"{lane} \* 256", body) or
            re.search(rf"smem\d+\[[^\]]*\({lane} \* 16\)", body)]
    assert pack, spec.source  # the gradient's pack: its channels 256 apart in g, 16 apart in the buffer
    for lane, body in pack:
        loads = re.findall(r"data\d+\[([^;]*)\];", body)
        assert loads and all(f"{lane} *" not in index for index in loads), body  # read along the lane loop
    y = conv_reference(np.maximum(x, 0), w, 1, 2)
    g = (y > 0).astype(np.float32) / np.float32(16 * 16)
    expected = weight_gradient_reference(np.maximum(x, 0), g, 3, 1, 2)
    np.testing.assert_allclose(tw.grad.numpy(), expected, rtol=1e-4, atol=1e-5)
    if torch is not None:
        t = torch.from_numpy(w).requires_grad_()
        torch.nn.functional.conv2d(torch.from_numpy(x).relu(), t, stride=2, padding=1).relu().mean((2, 3)).sum() \
            .backward()
        assert t.grad is not None
        np.testing.assert_allclose(tw.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("x_shape, cout, stride", [((2, 8, 16, 16), 16, 2), ((3, 4, 10, 9), 24, 2),
                                                   ((2, 6, 13, 11), 16, 1)])
def test_a_staged_select_is_bitwise_and_keeps_its_zeros(x_shape: tuple[int, ...], cout: int, stride: int) -> None:
    """The input gradient of `(conv(x).relu() * g).sum()` stages the ReLU's gradient `y <= 0 ? 0 : g` over the padded
    input; in the copy the select is written on the float's bits (`gg_selectf`: gcc 12 vectorises it where it left
    `c ? 0 : g` scalar, with a branch, whenever c read a masked load and g stayed put along the loop: 16 -> 6 ms for
    a stride-2 input gradient). It is still a select: where the ReLU does not pass, an infinite g gives 0, not
    0 * inf = NaN; the gradient is numpy's, odd sizes included."""
    from glassgrad.kernels import kernels
    rng = np.random.default_rng(32)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = (rng.standard_normal((cout, x_shape[1], 3, 3), dtype=np.float32) * 0.2).astype(np.float32)
    pre = conv_reference(x, w, 1, stride)
    g = np.where(pre > 0, rng.standard_normal(pre.shape, dtype=np.float32), np.float32(np.inf)).astype(np.float32)
    tx = Tensor(x, requires_grad=True)
    (tx.conv2d(Tensor(w), stride=stride, padding=1).relu() * Tensor(g)).sum().backward()
    assert tx.grad is not None
    assert any("gg_selectf(" in body for _, body in copy_loops(kernels(tx.grad, device="CPU")[-1].source))
    out = tx.grad.numpy()
    assert np.isfinite(out).all()
    expected = conv_input_gradient_reference(x, w, np.zeros(cout, np.float32), g, 1, stride)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, cout, kernel, stride, padding", [
    ((8, 3, 20, 20), 24, 5, 2, 2),   # a first layer of 24 channels (5x5, stride 2)
    ((1, 3, 13, 17), 24, 5, 2, 2),   # batch 1, odd sizes
    ((2, 8, 11, 9), 8, 3, 1, 1),     # 8 channels
    ((1, 8, 9, 15), 40, 3, 2, 0),    # 40 channels: 5 blocks of 8
])
def test_channels_of_a_multiple_of_8_are_the_lanes_of_a_packed_tile(x_shape: tuple[int, ...], cout: int,
                                                                    kernel: int, stride: int, padding: int) -> None:
    """A conv whose output channels 16 does not divide but 8 does (24): its forward takes 8 channels as the lanes of
    a packed channel tile (the weight packed, output columns as rows) where it had the output columns, or the kernel
    width, as lanes (5x5 stride 2 3 -> 24 at 8x64x64, one thread: 2.5 -> 1.0 ms), and a strided one's weight
    gradient 8 channels as lanes against the incoming gradient packed (5.1 -> 1.5 ms). Forward, input and weight
    gradients match numpy's (and PyTorch's), batch 1 and odd sizes included."""
    from glassgrad.kernels import kernels
    rng = np.random.default_rng(33)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = (rng.standard_normal((cout, x_shape[1], kernel, kernel), dtype=np.float32) * 0.2).astype(np.float32)
    forward = hand_coded_optimizations(Kernel(conv_ast(x_shape, w.shape, stride=stride, padding=padding),
                                              CPU.renderer))
    lanes = 0 if cout == 8 else 8  # (8 channels: the axis whole)
    assert forward[0] == Opt(OptOps.UPCAST, 0 if x_shape[0] == 1 else 1, lanes), forward  # (batch 1: no batch axis)
    tx, tw = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = tx.conv2d(tw, stride=stride, padding=padding)
    g = rng.standard_normal(out.shape, dtype=np.float32)
    (out * Tensor(g)).sum().backward()
    assert tx.grad is not None and tw.grad is not None
    if x_shape[0] > 1 and stride == 2:  # (a stride-1 one keeps lanes along its output rows: MNIST's tile)
        weight_opts = kernels(tw.grad, device="CPU")[-1].opts
        assert weight_opts[0] == Opt(OptOps.UPCAST, 0, lanes), weight_opts
    np.testing.assert_allclose(out.numpy(), conv_reference(x, w, padding, stride), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tw.grad.numpy(), weight_gradient_reference(x, g, kernel, padding, stride),
                               rtol=1e-4, atol=1e-3)
    if torch is not None:
        tt, tv = torch.from_numpy(x).requires_grad_(), torch.from_numpy(w).requires_grad_()
        (torch.nn.functional.conv2d(tt, tv, stride=stride, padding=padding) * torch.from_numpy(g)).sum().backward()
        assert tt.grad is not None and tv.grad is not None
        np.testing.assert_allclose(tx.grad.numpy(), tt.grad.numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(tw.grad.numpy(), tv.grad.numpy(), rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("x_shape, cout, stride", [((1, 3, 97, 61), 32, 2), ((1, 3, 225, 37), 16, 2),
                                                   ((1, 1, 40, 131), 24, 3)])
def test_batch_1_strided_convs_of_odd_sizes(x_shape: tuple[int, ...], cout: int, stride: int) -> None:
    """Batch-1 strided first layers of odd sizes (the output rows the threads' loop when the column blocks are too
    few, the channel blocks innermost): the heuristic's kernel computes what the unoptimised one does, and numpy's
    convolution."""
    rng = np.random.default_rng(34)
    x = rng.standard_normal(x_shape, dtype=np.float32)
    w = rng.standard_normal((cout, x_shape[1], 3, 3), dtype=np.float32)
    _heuristic_agrees_with_unoptimised(conv_ast(x.shape, w.shape, stride=stride))
    np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w), stride=stride).numpy(),
                               conv_reference(x, w, 0, stride=stride), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows, inner, cols", [(128, 576, 10), (48, 300, 7), (32, 200, 3)])
def test_a_narrow_matmul_packs_its_rows_along_the_outermost_axis(rows: int, inner: int, cols: int) -> None:
    """`x @ W` with few columns (a classifier's 10 logits; 10 is no vector width): the rows of x become the 16 (or
    8) lanes, x packed whole with them contiguous, the columns the tile's rows. The pack runs along the outermost
    axis, which a pack made once was not allowed before (no opts at all: MNIST's head, 128 x 576 @ 576 x 10, one
    thread 2.4 -> 0.07 ms). Values as numpy's."""
    rng = np.random.default_rng(35)
    x, w = rng.standard_normal((rows, inner), dtype=np.float32), rng.standard_normal((inner, cols), dtype=np.float32)
    schedule, _ = create_schedule([(Tensor.empty(rows, inner) @ Tensor.empty(inner, cols)).uop])
    ast = optimize_ast(schedule[-1].ast, CPU.renderer)
    opts = hand_coded_optimizations(Kernel(ast, CPU.renderer))
    assert opts[0] in (Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 8)) and len(opts) > 1, opts
    _heuristic_agrees_with_unoptimised(ast)
    np.testing.assert_allclose((Tensor(x) @ Tensor(w)).numpy(), x @ w, rtol=1e-4, atol=1e-3)
