"""The hand-written optimiser: which `Opt`s to apply to a kernel, from its loads' strides alone.

In: a `Kernel`. Out: a list of `Opt`s (`NOOPT=1` skips this: no opts at all). For a CPU kernel with a reduction:

1. the *vector axis*: the innermost output axis that every load reads contiguously (stride 1) or not at all
   (stride 0), upcast by 16 (or whole, when short and not a multiple of 16): the innermost loop becomes SIMD lanes
   with one accumulator each;
2. the *blocking axis*: another output axis along which the vector loads do not move (stride 0), so one vector load
   serves every row of the tile, upcast by up to 8: `acc[8][16] += a[i, k] * b[k, j]`, a register tile of 128
   accumulators (8 AVX-512 registers), 8 multiply-adds per loaded vector of b instead of one.

A max over a contiguous row gets 16 accumulator lanes (`UNROLL`), one SIMD register; sums and products are vectorised
by the renderer (`omp simd reduction`). Elementwise kernels vectorise as they are. GPU kernels get no opts here:
`codegen/gpudims.py` shapes them.
"""
from __future__ import annotations

from glassgrad.codegen.opt import Opt, OptOps
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.helpers import prod
from glassgrad.uop.ops import Ops

VECTOR_WIDTH = 16            # floats in one AVX-512 register: a vector axis of a multiple of this is split by it
VECTOR_WHOLE_MAX = 32        # else a vector axis up to this long is upcast whole
VECTOR_SPLITS = (8, 4)       # and a longer one is split, the inner part this long
BLOCK_SPLITS = (8, 4, 2)     # rows of the register tile
TILE_MAX = 128               # accumulators in the tile
LANES = 16                   # accumulator lanes of a max over a row
MIN_REDUCE = 4               # a register tile pays only for reductions of at least this many iterations


def hand_coded_optimizations(k: Kernel) -> list[Opt]:
    if k.renderer.has_local or not k.has_reduce:
        return []
    k = k.copy()
    opts: list[Opt] = []
    vector = _vector_axis(k)
    if vector is None:
        return _lanes_for_reduction(k)
    axis, amount = vector
    opts.append(Opt(OptOps.UPCAST, axis, amount))
    k.apply_opt(opts[-1])
    tile = k.register_tile()
    reduce_size = prod(k.size(a) or MIN_REDUCE for a in k.axes_of("reduce"))  # a symbolic one counts as long
    block = _blocking_axis(k, k.axes.index(k.upcast[-1]))
    if block is not None and reduce_size >= MIN_REDUCE:
        size = k.size(block) or 1  # (symbolic: no row count divides it)
        rows = next((r for r in BLOCK_SPLITS if size % r == 0 and r * tile <= TILE_MAX and
                     (block != k.axes_of("global")[0] or size // r >= 2)), None)
        if rows is not None:
            opts.append(Opt(OptOps.UPCAST, block, rows))
    return opts


def _lanes_for_reduction(k: Kernel) -> list[Opt]:
    """A max over a contiguous row: 16 accumulator lanes (one SIMD register), combined after the loop. Sums and
    products are vectorised by the renderer's `omp simd reduction` already; a max with NaN checks is not."""
    reduce_axes = k.axes_of("reduce")
    if not reduce_axes or not any(u.op is Ops.REDUCE and u.arg is Ops.MAX for u in k.ast.toposort()):
        return []
    axis = reduce_axes[-1]
    strides = k.strides(axis)
    size = k.size(axis)
    if any(s not in (0, 1) for s in strides) or 1 not in strides or size is None or size % LANES or size == LANES:
        return []
    return [Opt(OptOps.UNROLL, axis, LANES)]


def _vector_axis(k: Kernel) -> tuple[int, int] | None:
    """(axis, amount) of the output axis to make SIMD lanes; amount 0 means the whole axis. Of the axes every load
    reads contiguously or not at all, the one filling the most lanes of one register, the innermost on a tie (a
    conv's input gradient is 8 wide along the output width, 3 along the kernel width)."""
    global_axes = k.axes_of("global")
    candidates = []
    for axis in reversed(global_axes):
        strides = k.strides(axis)
        size = k.size(axis)
        if size is None or any(s not in (0, 1) for s in strides) or 1 not in strides:
            continue
        if size % VECTOR_WIDTH == 0 and size > VECTOR_WIDTH:  # one register exactly (a 3x3 conv: 4.5x faster
            candidates.append((axis, VECTOR_WIDTH, VECTOR_WIDTH))  # than two registers per row of the tile)
        elif size <= VECTOR_WHOLE_MAX and axis != global_axes[0]:  # the outermost loop is kept for the threads
            # a row of 17..31 lanes takes two registers, one partly filled: a last resort (measured 2x slower than 5)
            candidates.append((axis, 0, size if size <= VECTOR_WIDTH else 1))
        elif (amount := next((f for f in VECTOR_SPLITS if size % f == 0 and size > f), None)) is not None:
            candidates.append((axis, amount, amount))
    if not candidates:
        return None
    axis, amount, _ = max(candidates, key=lambda c: c[2])  # max keeps the first (innermost) of equal lanes
    return axis, amount


def _blocking_axis(k: Kernel, vector: int) -> int | None:
    """The output axis along which the most vector loads (stride 1 on the vector axis) stay put (stride 0)."""
    vector_loads = [i for i, s in enumerate(k.strides(vector)) if s == 1]
    best, best_shared = None, 0
    for axis in k.axes_of("global"):
        strides = k.strides(axis)
        shared = sum(1 for i in vector_loads if strides[i] == 0)
        if shared > best_shared and any(s not in (0, None) for s in strides):
            best, best_shared = axis, shared
    return best
