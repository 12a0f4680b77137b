"""LOCAL and GROUP opts for GPU renderers, without a GPU: validation (a wrong opt raises KernelOptError naming what
was wrong, on CPU too), the GPU heuristic's choices (the flat and grouped launch shapes as opts), the launch sizes and
IR they give, BEAM's actions, and NVRTC compiling the CUDA source of a few opts. With a GPU (skipped otherwise): the
numbers, against the CPU backend. (tests/metal/test_metal_opts.py runs such kernels on the emulated Metal device.)"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_schedule import check_access

from glassgrad import Tensor
from glassgrad.codegen import get_program, optimize_ast
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps
from glassgrad.codegen.opt import kernel as kernel_module
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.codegen.opt.search import actions, buffer_sizes, random_inputs, run_program
from glassgrad.device import Device
from glassgrad.dtype import dtypes
from glassgrad.kernels import _retarget, renderer_for
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

L, G, U, R = OptOps.LOCAL, OptOps.GROUP, OptOps.UPCAST, OptOps.UNROLL
CUDA = renderer_for("CUDA")
E = Tensor.empty


def cuda_ast(out: Tensor) -> UOp:
    """The last kernel of `out`'s schedule as the CUDA device would get it (nothing allocated or run)."""
    moved = _retarget(UOp(Ops.SINK, dtypes.void, (out.uop,)), "CUDA").src[0]
    schedule, _ = create_schedule([moved])
    return optimize_ast(schedule[-1].ast, CUDA)


def cuda_kernel(out: Tensor) -> Kernel:
    return Kernel(cuda_ast(out), CUDA)


# ---------------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("make, opts, message", [
    (lambda: E(16, 768).sum(axis=1), [Opt(L, 1, 2)], "LOCAL is for global axes, axis 1 is reduce"),
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 0, 2)], "GROUP is for reduce axes, axis 0 is global"),
    (lambda: E(16, 768).sum(axis=1), [Opt(L, 0, 3)], "3 does not divide the axis' 16"),
    (lambda: E(16, 768).sum(axis=1), [Opt(L, 0, 1)], "does nothing"),
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, 3)], "power of two"),
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, 0)], "power of two"),  # whole axis: 768 threads
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, -4)], "int >= 0"),
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, 256), Opt(G, 1, 0)], "one GROUP per kernel"),
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, 256), Opt(L, 0, 8)], "2048 threads per work-group"),
    (lambda: E(16, 768).sum(axis=1), [Opt(L, 0, 16), Opt(G, 1, 128)], "2048 threads per work-group"),
    (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, 256), Opt(U, 0, 4)], "does not combine"),
    (lambda: E(16, 768).sum(axis=1), [Opt(R, 1, 4), Opt(G, 1, 2)], "does not combine"),
    (lambda: E(64, 64) * 2, [Opt(L, 1, 0), Opt(L, 0, 32)], "2048 threads per work-group, more than 1024"),
    (lambda: E(64, 64) * 2, [Opt(L, 2, 2)], "out of range"),
    (lambda: E(77, 1023) @ E(1023, 1023), [Opt(OptOps.PADTO, 0, 16)], "PADTO is for CPU kernels"),
])
def test_wrong_launch_opts_raise(make: Callable[[], Tensor], opts: list[Opt], message: str) -> None:
    k = cuda_kernel(make())
    *fine, wrong = opts
    k.apply_opts(fine)
    before, applied = k.ast, list(k.applied)
    with pytest.raises(KernelOptError, match=message):
        k.apply_opt(wrong)
    assert k.ast is before and k.applied == applied  # nothing changed


def test_group_shared_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    k = cuda_kernel(E(16, 768).sum(axis=1))
    k.copy().apply_opt(Opt(G, 1, 256))
    monkeypatch.setattr(kernel_module, "MAX_SHARED", 512)  # 256 float32 partial results: 1024 bytes
    with pytest.raises(KernelOptError, match="1024 bytes of shared memory, more than 512"):
        k.apply_opt(Opt(G, 1, 256))


@pytest.mark.parametrize("op", [L, G])
def test_launch_opts_need_a_gpu(op: OptOps) -> None:
    cpu = Device["CPU"].renderer
    schedule, _ = create_schedule([E(16, 64).sum(axis=1).uop])
    k = Kernel(optimize_ast(schedule[-1].ast, cpu), cpu)
    with pytest.raises(KernelOptError, match=f"{op.name} needs a GPU \\(work-groups\\); ClangRenderer has none"):
        k.apply_opt(Opt(op, 1 if op is G else 0, 2))


# ---------------------------------------------------------------------------------------------- launch shapes

@pytest.mark.usefixtures("literal_constants")
def test_local_launch() -> None:
    """Two LOCALs: the work-group's 256 threads span 4 rows of 64 (the thread id flattens them as the loops would
    nest: row-major); the 64 / 4 row blocks are the work-groups."""
    ast = cuda_ast(E(64, 64) * 2)
    spec = get_program(ast, CUDA, [Opt(L, 1, 0), Opt(L, 0, 4)])
    assert (spec.global_size, spec.local_size) == ((16, 1, 1), (256, 1, 1))
    # row = bidx*4 + lidx/64, column = lidx%64: the simplifier folds row*64 + column back into one contiguous index
    assert "int alu0 = ((bidx0 * 256) + lidx0);" in spec.source and "data0[alu0] = (val0 * 2.0f);" in spec.source


def test_group_launch() -> None:
    spec = get_program(cuda_ast(E(16, 768).sum(axis=1)), CUDA, [Opt(G, 1, 256)])
    assert (spec.global_size, spec.local_size) == ((16, 1, 1), (256, 1, 1))
    assert [u.arg for u in spec.uops if u.op is Ops.GROUP_REDUCE] == [(Ops.ADD, 256, 256)]
    assert "for (int ridx1 = 0; ridx1 < 3; ridx1++)" in spec.source  # 768 / 256 elements per thread
    assert "if ((lidx0 == 0)) data0[bidx0] = red0;" in spec.source


def test_several_groups_per_work_group() -> None:
    """LOCAL with GROUP: 16 outputs of a work-group, each summed by 16 neighbouring threads (the group is the
    innermost thread index, so a group's threads read a contiguous run of its row). On CUDA a group inside a warp
    combines by shuffles; the group's first thread stores."""
    spec = get_program(cuda_ast(E(64, 64).sum(axis=1)), CUDA, [Opt(L, 0, 16), Opt(G, 2, 16)])
    assert (spec.global_size, spec.local_size) == ((4, 1, 1), (256, 1, 1))
    assert [u.arg for u in spec.uops if u.op is Ops.GROUP_REDUCE] == [(Ops.ADD, 16, 256)]
    assert "__shfl_xor_sync(0xffffffffu, red0, s)" in spec.source and "__syncthreads" not in spec.source
    group = re.search(r"int (alu\d+) = \(lidx0 % 16\);", spec.source)
    assert group and f"if (({group[1]} == 0)) data0[" in spec.source


def test_several_groups_combine_in_shared_memory_segments() -> None:
    """A group wider than a warp (64 threads), or a work-group that is not whole warps, combines in shared memory:
    each group's tree runs over its own segment of the work-group's slots and reads its first slot."""
    spec = get_program(cuda_ast(E(8, 256).sum(axis=1)), CUDA, [Opt(L, 0, 4), Opt(G, 2, 64)])
    assert spec.local_size == (256, 1, 1) and "__shfl" not in spec.source
    group = re.search(r"int (alu\d+) = \(lidx0 % 64\);", spec.source)
    assert group and "float smem0[256];" in spec.source
    assert f"if ({group[1]} < s) smem0[lidx0] = smem0[lidx0] + smem0[lidx0 + s];" in spec.source
    assert f"float red0 = smem0[lidx0 - {group[1]}];" in spec.source
    odd = get_program(cuda_ast(E(6, 64).sum(axis=1)), CUDA, [Opt(L, 0, 3), Opt(G, 2, 4)])  # 12 threads
    assert odd.local_size == (12, 1, 1) and "__shfl" not in odd.source and "float smem0[12];" in odd.source


@pytest.mark.parametrize("make, opts", [
    (lambda: (E(8, 12, 1024, 64, dtype=dtypes.bfloat16).float() * E(8, 12, 1024, 64, dtype=dtypes.bfloat16).float()
              ).sum(-1), [Opt(L, 2, 16), Opt(G, 4, 16)]),   # flash attention's D: rows of a head's 64 dims
    (lambda: E(1000, 128).mean(-1), [Opt(L, 0, 8), Opt(G, 2, 32)]),
    (lambda: E(4096, 8).max(-1), [Opt(L, 0, 128), Opt(G, 2, 2)]),
    (lambda: E(64, 1000).sum(0), None),        # columns: neighbouring outputs are neighbouring addresses
    (lambda: E(64, 1024).sum(1), [Opt(G, 1, 256)]),  # a long row: one group of 256 per output, as before
])
def test_short_strided_rows_get_lane_groups(make: Callable[[], Tensor], opts: list[Opt] | None) -> None:
    """The GPU heuristic gives a short contiguous row that one thread per output would read with a stride a group
    of up to 32 neighbouring threads (each at least 4 elements), and LOCALs that fill 256 threads."""
    k = cuda_kernel(make())
    chosen = hand_coded_optimizations(k)
    if opts is None:
        assert not any(o.op is G for o in chosen)
    else:
        assert chosen == opts


def test_flat_shape_with_upcast_names_loops_apart() -> None:
    """An UPCAST without LOCAL on a large elementwise kernel takes gpudims' flat shape, whose 4-elements-per-thread
    loop needs an id no other loop has (it once reused the upcast loop's: `ridx1` inside `ridx1`, read out of
    bounds on the H100 during a BEAM search)."""
    spec = get_program(cuda_ast(E(64 * 1024 * 1024) * 2), CUDA, [Opt(U, 0, 32)])
    loops = [u.arg[0] for u in spec.uops if u.op is Ops.RANGE]
    assert len(loops) == 2 and len(set(loops)) == 2


@pytest.mark.parametrize("make", [lambda: E(1 << 22) * 2, lambda: E(512, 1024).sum(axis=1),
                                  lambda: E(32, 64).softmax(-1)], ids=["large elementwise", "row sums", "softmax"])
def test_every_action_stays_in_bounds(make: Callable[[], Tensor]) -> None:
    """Every legal single action BEAM would try on a GPU: each load and store of the rendered kernel stays inside its
    buffer for every thread and loop iteration, and no loop is opened inside a loop of the same name."""
    ast = cuda_ast(make())
    sizes = buffer_sizes(ast)
    k = Kernel(ast, CUDA)
    tried = 0
    for action in actions(k):
        try:
            k.copy().apply_opt(action)
        except KernelOptError:
            continue
        spec = get_program(ast, CUDA, [action])
        open_loops: list[int] = []
        for u in spec.uops:
            if u.op is Ops.RANGE:
                assert u.arg[0] not in open_loops, f"{action}: loop {u.arg[0]} opened inside itself"
                open_loops.append(u.arg[0])
            elif u.op is Ops.ENDRANGE:
                open_loops.pop()
            elif u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL:
                check_access(u, sizes[u.src[0].arg][1], f"{spec.name} with {action}")
        tried += 1
    assert tried >= 8


# ---------------------------------------------------------------------------------------------- heuristic, BEAM

@pytest.mark.parametrize("make, expected", [
    (lambda: E(8192, 8192).sum(axis=1), [Opt(G, 1, 256)]),                 # grouped: a work-group per row
    (lambda: E(64 * 1024 * 1024) * 2, [Opt(U, 0, 4), Opt(L, 0, 256)]),     # vector runs: 16 bytes per thread
    (lambda: E(64 * 1024 * 1024)[::2] * 2, [Opt(L, 0, 256), Opt(U, 0, 4)]),  # flat, 4 elements per thread
    (lambda: E(8192, 8192).sum(axis=0), [Opt(L, 0, 256)]),                 # flat: a thread per column
    (lambda: E(32, 4, 2) + 1, [Opt(L, 2, 0), Opt(L, 1, 0), Opt(L, 0, 32)]),  # under 256 outputs: all threads
    (lambda: E(1000) + 1, []),                  # 256 does not divide 1000: gpudims' flat shape (ids past the end)
    (lambda: E(4096, 1000).sum(axis=1), []),    # ... nor the reduction: gpudims' grouped shape (gated last step)
    (lambda: E(8192, 768).sum(axis=1), [Opt(L, 0, 8), Opt(G, 2, 32)]),  # many rows of 768: a warp per row
    (lambda: E(512, 768).sum(axis=1), [Opt(G, 1, 256)]),  # few rows: a work-group per row
    (lambda: E(512, 512) @ E(512, 512), []),    # tiled
    (lambda: E(256, 256).softmax(-1), []),      # rows
])
def test_gpu_heuristic(make: Callable[[], Tensor], expected: list[Opt]) -> None:
    ast = cuda_ast(make())
    opts = hand_coded_optimizations(Kernel(ast, CUDA))
    assert opts == expected
    warp_rows = bool(opts) and opts[-1] == Opt(G, opts[-1].axis, 32) and len(opts) == 2
    if opts and opts[0].op is not U and not warp_rows:  # the opts give the kernel the automatic shape gives (same
        # launch, same loads); a warp per row is the heuristic's own choice (gpudims' grouped shape: a group per row)
        with_opts, automatic = get_program(ast, CUDA, opts), get_program(ast, CUDA, [])
        assert (with_opts.global_size, with_opts.local_size) == (automatic.global_size, automatic.local_size)


def test_beam_actions_include_launch_opts() -> None:
    k = cuda_kernel(E(64, 1024).sum(axis=1))
    legal = []
    for action in actions(k):
        try:
            k.copy().apply_opt(action)
            legal.append(action)
        except KernelOptError:
            pass
    assert Opt(G, 1, 256) in legal and Opt(L, 0, 64) in legal
    schedule, _ = create_schedule([E(64, 1024).sum(axis=1).uop])
    cpu = Device["CPU"].renderer
    assert not any(a.op in (L, G) for a in actions(Kernel(optimize_ast(schedule[-1].ast, cpu), cpu)))
    assert not any(a.op is OptOps.PADTO for a in actions(k))  # (CPU only)


@pytest.mark.parametrize("make", [lambda: E(77, 1023) @ E(1023, 1023), lambda: E(1000, 1023).sum(axis=0),
                                  lambda: E(1, 1024) @ E(1024, 1000)], ids=["matmul", "column sums", "GEMV"])
def test_gpu_heuristic_never_pads(make: Callable[[], Tensor]) -> None:
    """Odd sizes that the CPU heuristic pads (PADTO) keep their GPU launch opts: no PADTO on a GPU."""
    assert not any(o.op is OptOps.PADTO for o in hand_coded_optimizations(cuda_kernel(make())))


# ---------------------------------------------------------------------------------------------- CUDA source

CASES: dict[str, tuple[Callable[[], Tensor], list[Opt]]] = {
    "local, two axes": (lambda: (E(64, 64) * 2).exp(), [Opt(L, 1, 0), Opt(L, 0, 4)]),
    "local and upcast": (lambda: E(4096) * E(4096), [Opt(L, 0, 128), Opt(U, 0, 4)]),
    "local with a reduction loop, unrolled": (lambda: E(256, 96).sum(axis=0), [Opt(L, 0, 32), Opt(R, 2, 4)]),
    "group": (lambda: E(16, 768).sum(axis=1), [Opt(G, 1, 128)]),
    "group, whole axis, half": (lambda: E(16, 512, dtype=dtypes.float16).sum(axis=1), [Opt(G, 1, 0)]),
    "group over two reductions": (lambda: E(32, 64).softmax(-1), [Opt(G, 2, 32)]),
    "groups per work-group, shuffles": (lambda: E(64, 64).sum(axis=1), [Opt(L, 0, 16), Opt(G, 2, 16)]),
    "groups per work-group, half max": (lambda: E(256, 32, dtype=dtypes.float16).max(axis=1),
                                        [Opt(L, 0, 32), Opt(G, 2, 8)]),
    "groups per work-group, bf16 row products": (
        lambda: (E(2, 3, 64, 64, dtype=dtypes.bfloat16).float() * E(2, 3, 64, 64, dtype=dtypes.bfloat16).float()
                 ).sum(-1), [Opt(L, 2, 16), Opt(G, 4, 16)]),
    "groups per work-group, shared memory": (lambda: E(8, 256).sum(axis=1), [Opt(L, 0, 4), Opt(G, 2, 64)]),
    "groups per work-group, softmax": (lambda: E(64, 64).softmax(-1), [Opt(L, 0, 8), Opt(G, 3, 32)]),
    "vector runs, bf16": (lambda: E(64, 768, dtype=dtypes.bfloat16) + E(64, 768, dtype=dtypes.bfloat16),
                          [Opt(U, 1, 8), Opt(L, 1, 32), Opt(L, 0, 8)]),
    "vector runs, float rows and broadcasts": (
        lambda: ((E(64, 768, dtype=dtypes.bfloat16).float() - E(64, 1)) * E(768) + E(768)).cast(dtypes.bfloat16),
        [Opt(U, 1, 8), Opt(L, 1, 32), Opt(L, 0, 8)]),
    "vector runs, an aligned view": (lambda: E(32, 1032)[:, 8:] * 3, [Opt(U, 1, 4), Opt(L, 1, 0)]),
    "vector runs, a misaligned view": (lambda: E(32, 1025)[:, 1:] * 3, [Opt(U, 1, 4), Opt(L, 1, 0)]),
    "vector runs, short half runs": (lambda: E(64, 256, dtype=dtypes.float16) * 2, [Opt(U, 1, 2), Opt(L, 1, 128)]),
    "a warp per row": (lambda: (E(2048, 768) * E(2048, 768)).sum(axis=1), [Opt(L, 0, 8), Opt(G, 2, 32)]),
    "vector runs, a warp over rows that continue": (  # 64-wide bf16 heads: 8 runs a row, 4 rows a warp
        lambda: (E(8, 12, 256, 64, dtype=dtypes.bfloat16).float() * (E(8, 12, 256, 1) + 1)).cast(dtypes.bfloat16),
        [Opt(U, 3, 8), Opt(L, 3, 0), Opt(L, 2, 32)]),
    "transposed copy, vector loads": (lambda: E(1024, 1024).T + 1, [Opt(U, 0, 4), Opt(L, 1, 32), Opt(L, 0, 8)]),
    "permuted bf16 heads, vector loads": (
        lambda: E(2, 3, 64, 1024, dtype=dtypes.bfloat16).permute(0, 1, 3, 2).contiguous(),
        [Opt(U, 2, 8), Opt(L, 3, 32), Opt(L, 2, 8)]),
    "vector runs, halved for a warp": (
        lambda: ((E(32, 50304, dtype=dtypes.bfloat16).float() - E(32, 1)) * E(32, 1)).cast(dtypes.bfloat16),
        [Opt(U, 1, 4), Opt(L, 1, 32), Opt(L, 0, 8)]),
}


@pytest.mark.parametrize("make, opts, vector_loads, vector_stores", [
    (lambda: E(2048, 768, dtype=dtypes.bfloat16) + E(2048, 768, dtype=dtypes.bfloat16), None, 2, 1),
    (lambda: ((E(2048, 768, dtype=dtypes.bfloat16).float() - E(2048, 1)) * E(768)).cast(dtypes.bfloat16), None, 3, 1),
    (lambda: E(32, 1032)[:, 8:] * 3, [Opt(U, 1, 4), Opt(L, 1, 0)], 1, 1),
    (lambda: E(32, 1025)[:, 1:] * 3, [Opt(U, 1, 4), Opt(L, 1, 0)], 0, 1),  # (row starts 1 element off 16 bytes)
    (lambda: E(64, 256, dtype=dtypes.float16) * 2, [Opt(U, 1, 2), Opt(L, 1, 128)], 1, 1),  # 4-byte runs
    # a transposed read: each thread loads 4 floats along the read's rows (one vector), a warp 32 neighbouring
    # columns, and stores one element per column (coalesced across the warp); it was the flat shape, scalar loads
    (lambda: E(1024, 1024).T + 1, None, 1, 0),
    # a row of 50304 bfloat16 (GPT-2's logits): 8-element runs leave 6288 a row, 16 of them dividing it, so the
    # heuristic takes runs of 4 (8 bytes), 32 threads along the row; it was the flat shape, one element a thread
    (lambda: ((E(32, 50304, dtype=dtypes.bfloat16).float() - E(32, 1)) * E(32, 1)).cast(dtypes.bfloat16), None, 1, 1),
])
def test_contiguous_runs_move_as_vectors(make: Callable[[], Tensor], opts: list[Opt] | None, vector_loads: int,
                                         vector_stores: int) -> None:
    """An innermost upcast loop's contiguous, aligned loads and stores become vector accesses of up to 16 bytes
    (several for a longer run: 8 floats are two), read into and written from a register array the loop indexes."""
    ast = cuda_ast(make())
    spec = get_program(ast, CUDA, opts if opts is not None else hand_coded_optimizations(Kernel(ast, CUDA)))
    vectors = re.findall(r"\*\((?:uint4|uint2|unsigned int)\*\)\((.*?)\) = \*\(const [\w ]+\*\)\((.*?)\);",
                         spec.source)
    assert sum(src.startswith("&data") for _, src in vectors) == vector_loads, spec.source
    assert sum(dst.startswith("&data") for dst, _ in vectors) == vector_stores, spec.source


@pytest.mark.parametrize("make, width", [
    # attention's heads (rows of 64 bfloat16, a per-row factor): 8 runs of 8 a row, a warp over 4 rows, which follow
    # each other in memory; the runs were halved to 2 elements (4 bytes) to make a warp of one row
    (lambda: (E(8, 12, 256, 64, dtype=dtypes.bfloat16).float() * (E(8, 12, 256, 1) + 1)).cast(dtypes.bfloat16),
     "uint4"),
    (lambda: E(8, 12, 256, 64, dtype=dtypes.bfloat16) * 3, "uint4"),  # (one axis: the rows merge)
    # rows that do not follow each other (a slice of wider rows) still give a warp one row: runs of 2 floats
    (lambda: E(65536, 72)[:, :64] + E(65536, 64), "uint2"),
])
def test_vector_width_of_short_rows(make: Callable[[], Tensor], width: str) -> None:
    ast = cuda_ast(make())
    spec = get_program(ast, CUDA, hand_coded_optimizations(Kernel(ast, CUDA)))
    widths = set(re.findall(r"\*\((uint4|uint2|unsigned int)\*\)\(&data", spec.source))
    assert widths == {width}, spec.source


@pytest.mark.parametrize("name", CASES)
def test_launch_opts_compile_for_sm_90(name: str, nvrtc: Any) -> None:
    make, opts = CASES[name]
    spec = get_program(cuda_ast(make()), CUDA, opts)
    assert spec.opts == tuple(opts)
    assert nvrtc.compile(spec.source)[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", CASES)
@pytest.mark.usefixtures("literal_constants")  # (kernel ASTs run by hand)
def test_launch_opts_on_gpu(cuda: str, name: str) -> None:
    """On a GPU: the kernel with the opts computes what the unoptimised kernel computes on the CPU."""
    make, opts = CASES[name]
    ast = cuda_ast(make())
    dev, cpu = Device[cuda], Device["CPU"]
    spec = get_program(ast, dev.renderer, opts)
    got = run_program(dev, spec, dev.compiler.compile(spec.source), random_inputs(ast))[1][0]
    reference = get_program(ast, cpu.renderer, [])
    want = run_program(cpu, reference, cpu.compiler.compile(reference.source), random_inputs(ast))[1][0]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-3, atol=2e-3)
