"""The hand-written optimiser: which `Opt`s to apply to a kernel, from its loads' strides alone.

In: a `Kernel`. Out: a list of `Opt`s (`NOOPT=1` skips this: no opts at all). For a CPU kernel with a reduction:

1. the *vector axis*: the innermost output axis that every load reads contiguously (stride 1) or not at all
   (stride 0), upcast by 16 (or whole, when short and not a multiple of 16): the innermost loop becomes SIMD lanes
   with one accumulator each;
2. the *blocking axis*: another output axis along which the vector loads do not move (stride 0), so one vector load
   serves every row of the tile, upcast by up to 8: `acc[8][16] += a[i, k] * b[k, j]`, a register tile of 128
   accumulators (8 AVX-512 registers), 8 multiply-adds per loaded vector of b instead of one. A kernel whose gated
   loads `codegen/stage.py` will copy for its whole reduction (a padded conv) and whose vector fills whole registers
   gets up to 16 rows (8 on AVX2: `RegisterBudget`), and the blocks of its blocking axis innermost: one copy then
   serves all of them (from the outermost position too, when the innermost axis keeps 8 blocks for the threads: a
   matmul's padded columns; else past every axis when the next one does: a batch-1 conv's output rows).

*Odd sizes*: where no vector width (16, 8, 4) divides the vector axis (1023, 77), or no row count divides the
blocking axis (513), the axis is first padded (`PADTO`) to a multiple of the first width or row count whose padding
adds at most 1/PAD_WASTE (1/8) of its iterations (`_padded_split`), then upcast by it as usual: 1023 -> 1024 and
77 -> 80 for 16 lanes, 513 -> 528 for 16 rows, 27 -> 28 for 4 rows. Whole registers are preferred to a smaller
split that divides: a vector axis of 1000 with rows to share it is padded to 1008 for 16 lanes (not 8 lanes), a
blocking axis of 308 to 312 for 8 rows (not 4), packed channel lanes of 77 or 683 to 80 or 688. A vector axis
that no reduction moves along is never padded (a softmax's row: its loop is elementwise SIMD already), nor one whose
tile would have no rows when 16 to 32 lanes divide it (a column sum of 1023: 31 lanes, `_exact_lanes`; padded, all
its loads were gated and staged for no reuse).

*Loop order and more accumulators*: a matmul's column blocks go outermost when the panel of B one block reads stays
in the L2 at its row stride (`_panel_stays_cached`: not at 4 KB strides, whose rows share a few cache sets); a
tile with no rows (a column sum or max) takes up to 8 of its vector blocks as independent chains (`_column_chains`);
output axes that no load moves along (the input gradient of `conv(x).sum()`) are upcast whole (`_invariant_rows`).
A row sum's accumulator lanes fill whole registers (16) or there are none; a short row is unrolled whole where it
is the innermost loop of a longer reduction or 4 lanes do not divide it. An elementwise transpose whose column reads
outrun the L1 at their stride upcasts the contiguous axis by 8 (`_transposed_rows`).

Three other tile shapes come first where they fit (the first opt is always the tile's SIMD loop):

* *packed channel lanes* (`_packed_channel_tile`): when the vector axis does not fill whole registers (a conv's
  output row of 24, 20, 10, 8 or 6), 16 output channels (8 where 16 divide no axis) are the lanes, their strided
  loads (the weight) are packed by `codegen/stage.py`, and up to 24 rows of output columns go around them; failing a
  pack made once for the whole
  reduction, one remade per image (a weight gradient's incoming gradient) with the window's taps and a few input
  channels as 8 or more rows;
* *reduce lanes* (`_reduce_lane_tile`): when the vector axis has fewer than 8 lanes, or there is none, lanes along a
  short contiguous reduce axis (a conv weight gradient's output row) with rows of output axes that move disjoint
  loads; a row sum of 6-32 elements keeps such lanes across its outer loops;
* *strided lanes* (`_strided_lanes`): with no contiguous axis at all, an output axis read with a stride of 2 (a
  max-pool).

A kernel with no vector axis that reduces over a contiguous row gets 16 accumulator lanes (`UNROLL`), one SIMD
register, and 4 such registers for a long row (independent chains). Elementwise kernels vectorise as they are
(the C renderer marks their innermost loop `omp simd`), a transpose's aside; a scatter's outermost (output) axis
becomes SIMD lanes inside its token loop (`_scatter_lanes`).

Last, a CPU kernel's C optimisation level (`_opt_level`): `OPTLEVEL 3` where its kind (`kernel_kind`: a sum over a 3x3
or smaller window, short untiled rows) measured faster at -O3 with the renderer's compiler (`O3_KINDS`: gcc's), no
opt (-O2) elsewhere; `CPU_OPT_LEVEL=2/3` fixes it for every kernel.

GPU kernels (`gpu_launch_opts`): the *flat* and *grouped* launch shapes of `codegen/gpudims.py`, written as opts where
their sizes divide exactly: `LOCAL`s of the innermost output axes making 256 threads (and an `UPCAST` of 4 for large
elementwise kernels: 4 elements per thread, a block apart), or a `GROUP` of 256 threads on the innermost reduce axis;
a short contiguous row that one thread per output would read with a stride gets a `GROUP` of up to 32 neighbouring
threads per output and `LOCAL`s filling the work-group (`_lane_group_opts`); a large elementwise kernel whose
accesses all run along its innermost axis takes 16 contiguous bytes per thread, moved as vectors where the renderer
can (`_vector_opts`).
Other GPU kernels (tiled matmuls, one-group-per-row kernels, and sizes no split divides) get no opts: gpudims
chooses their shape.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from glassgrad.codegen.gpudims import ELEMENTS_PER_THREAD, LOCAL_SIZE, MANY_ELEMENTS, automatic_shape
from glassgrad.codegen.linearize import Scopes, loop_iterations
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps
from glassgrad.codegen.opt.kernel import MAX_UPCAST, Kernel
from glassgrad.codegen.stage import PACK_REUSE, STAGE_MAX, stages_before_reduction
from glassgrad.helpers import CPU_OPT_LEVEL, prod
from glassgrad.renderer.cstyle import TINY_KERNEL_ITERATIONS, index_stride
from glassgrad.uop.ops import Ops, UOp

VECTOR_WIDTH = 16            # floats in one AVX-512 register: a vector axis of a multiple of this is split by it
VECTOR_WHOLE_MAX = 32        # else a vector axis up to this long is upcast whole
VECTOR_SPLITS = (8, 4)       # and a longer one is split, the inner part this long
BLOCK_SPLITS = (8, 4, 2)     # rows of the register tile
TILE_MAX = 128               # accumulators in the tile
STAGED_BLOCK_SPLITS = (16, 8, 4, 2)  # with a staged load (codegen/stage.py): up to 16 rows (RegisterBudget)
LANES = 16                   # accumulator lanes of a reduction over a row
CHAINS = 4                   # and SIMD registers of such lanes, for a row of at least MIN_CHAIN_STEPS times that
MIN_CHAIN_STEPS = 4
MIN_REDUCE = 4               # a register tile pays only for reductions of at least this many iterations
MIN_OUTPUT_LANES = 8         # a vector axis of fewer output lanes loses to lanes along a short contiguous row,
SHORT_ROW = (6, 32)          # of this many iterations, when the kernel has one
ACCUMULATOR_REGISTERS = 24   # SIMD registers of accumulators in such a tile (of AVX-512's 32)
PACKED_ROWS = 25             # rows of a packed channel tile whose pack is remade per step (a 5x5 window's taps;
#                              MNIST's first weight gradient: 3.1 -> 1.5 ms); a pack made once: RegisterBudget
SHIFT_ROWS = 8               # rows of a packed tile along which the packed values shift (a kernel width)
PAD_WASTE = 8                # an axis no split divides is padded to a multiple of one (PADTO) adding <= 1/8 of it
MIN_PACKED_REDUCE = 64       # packed channel lanes pay for reductions this long (their stores are 16 scalars a row)
MIN_PACKED_REDUCE_STORED = 8  # ... or this long where the lanes' outputs are contiguous (one vector store a row)
CHANNEL_LANES = (16, 8)      # lanes of a packed channel tile: 16 where they divide the channels, else 8 (24 channels)
MIN_THREAD_BLOCKS = 8        # iterations the threads' (outermost) loop keeps when the blocking axis moves inside
CACHE_LINE, L2_SETS, L2_WAYS = 64, 2048, 8  # a 1 MB 8-way L2 (Zen 4): where a matmul's panel of B stays cached
L1_SETS, L1_WAYS = 64, 8     # a 32 KB 8-way L1: where a transposed read's lines stay until their neighbours are read
INVARIANT_TILE_MAX = 256     # accumulators of a tile of output axes no load moves along (`_invariant_rows`)
COLUMN_CHAINS = 8            # registers of independent accumulators in a tile with no rows (`_column_chains`)
TRANSPOSE_ROWS = 8           # rows of an elementwise transpose tile (16 measured slower: 2048^2 x.T + x 5.6 -> 8.8 ms)
WINDOW_TAPS = 3              # an innermost reduce loop this short is a window's taps (`kernel_kind`)
SHORT_LOOP = 128             # untiled rows shorter than this make 'short row' kernels (`kernel_kind`)
# the kernel kinds built at -O3, by compiler family (the rest at -O2): gcc 12 completely unrolls and peels a 3x3
# window's loops at -O3 (one thread: convolutions 1.2-2.0x faster, a depthwise one 2x) and short rows (softmax of rows
# of 77 1.8x, layernorm 1.6x, MNIST's elementwise backward kernels over 20x20 maps 1.45x); where -O3 slowed kernels
# (a 7x7 window 0.78x, max-pool 0.91x, some matmul tiles 0.66x, an elementwise kernel over rows of 1000 0.92x) they
# keep -O2. clang 14's -O3 gained and lost by a few percent on the same kinds (3x3 convolutions 0.94-1.22x): -O2
# throughout. docs/OPTIMIZER.md, "Per-kernel optimisation level"; bench/opt_levels.py
O3_KINDS: dict[str, tuple[str, ...]] = {"gcc": ("window", "short row")}


@dataclass(frozen=True)
class RegisterBudget:
    """How large a CPU's register tiles may be, by the width of the SIMD registers it targets
    (`ClangRenderer.vector_bytes`): AVX-512 has 32 registers of 16 floats, AVX2 16 of 8. The values were measured on
    each (Zen 4 and Zen 2; docs/OPTIMIZER.md, "Register budgets"); a 16-byte target (SSE2, NEON) takes AVX2's."""
    staged_tile_max: int  # accumulators of a staged tile (a padded convolution): 16 registers' worth on both
    packed_rows: int      # rows of a packed channel tile whose pack is made once (a convolution's weight)


BUDGETS = {64: RegisterBudget(staged_tile_max=256, packed_rows=25),  # 27 of 32 registers, with the packed vector
           32: RegisterBudget(staged_tile_max=128, packed_rows=12)}  # and the broadcast value


def register_budget(k: Kernel) -> RegisterBudget:
    return BUDGETS[64] if getattr(k.renderer, "vector_bytes", 64) >= 64 else BUDGETS[32]


def hand_coded_optimizations(k: Kernel) -> list[Opt]:
    if k.renderer.has_local:
        return gpu_launch_opts(k)
    if not k.has_reduce:
        opts = _scatter_lanes(k) or _transposed_rows(k)
    else:
        tile = _reduction_tile(k.copy())  # (its steps apply some of their opts to the kernel they are given)
        opts = tile + _hoisted_axis(k.copy().apply_opts(tile))
    return opts + _opt_level(k.copy().apply_opts(opts))


def _opt_level(k: Kernel) -> list[Opt]:
    """The C compiler's optimisation level for a CPU kernel (`k`, its tile applied): CPU_OPT_LEVEL's when set, else
    the level its kind measured fastest at (docs/OPTIMIZER.md, "Per-kernel optimisation level"); no opt for the
    renderer's default level."""
    level = int(CPU_OPT_LEVEL) or _level_for_kind(k)
    if level == k.renderer.default_opt_level or level not in k.renderer.opt_levels:
        return []
    iterations = loop_iterations(k.ast)
    if isinstance(iterations, int) and iterations <= TINY_KERNEL_ITERATIONS:
        return []  # (gcc builds a tiny kernel without optimisation whatever the level: `ClangRenderer.render`)
    return [Opt(OptOps.OPTLEVEL, 0, level)]


def kernel_kind(k: Kernel) -> str:
    """What `_level_for_kind` tells apart (`k` with its tile applied):

    * 'window': a sum whose innermost reduce loop (not tiled) has at most WINDOW_TAPS iterations: a convolution's
      (or a pool's sum, a depthwise convolution's) 3x3 or smaller window of taps, inside its channel loop if any;
    * 'short row': no register tile, and loops over rows of fewer than SHORT_LOOP elements: every reduce loop of a
      reduction (a softmax or layernorm over rows of 77), the innermost output loop of an elementwise kernel (a
      backward kernel over 20x20 maps, a permute into 64 channels);
    * 'reduction' (another kernel with a reduction) and 'elementwise'."""
    reductions = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
    rows = k.axes_of("reduce") if reductions else k.axes_of("global")[-1:]  # (a reduction's loops, or the innermost)
    loops = [k.size(axis) for axis in rows]
    if reductions and loops and (loops[-1] or WINDOW_TAPS + 1) <= WINDOW_TAPS and \
            all(u.arg is Ops.ADD for u in reductions):
        return "window"
    if not k.upcast and loops and all(size is not None and size < SHORT_LOOP for size in loops):
        return "short row"
    return "reduction" if reductions else "elementwise"


def _level_for_kind(k: Kernel) -> int:
    """The optimisation level of `k`'s kind (`kernel_kind`) for the renderer's compiler (`O3_KINDS`), else the
    default level."""
    return 3 if kernel_kind(k) in O3_KINDS.get(getattr(k.renderer, "family", ""), ()) else \
        k.renderer.default_opt_level


def _reduction_tile(k: Kernel) -> list[Opt]:
    """The tile of a CPU kernel with a reduction (the opts, applied to `k` where the steps say so)."""
    opts: list[Opt] = []
    vector = _vector_axis(k)
    if (packed := _packed_channel_tile(k, vector)):
        return packed
    if vector is None:  # (lanes along a lone short reduction would only add a horizontal sum)
        lanes = _lanes_for_reduction(k) or (_reduce_lane_tile(k) if len(k.axes_of("reduce")) > 1 else [])
        if lanes or not (strided := _strided_lanes(k)):
            return lanes or _invariant_rows(k)
        return strided + _register_rows(k)
    axis, amount = vector
    if (amount or k.size(axis) or VECTOR_WIDTH) < MIN_OUTPUT_LANES and (lanes := _reduce_lane_tile(k)):
        return lanes
    opts += _upcast(k, axis, amount)
    if (row_lanes := _row_reduction_lanes(k)):
        return opts + row_lanes
    return opts + (_register_rows(k) or _column_chains(k, axis, amount))


def _register_rows(k: Kernel) -> list[Opt]:
    """The rows of the register tile around its SIMD lanes (the last upcast axis, applied to `k`): the blocking axis
    (`_blocking_axis`) upcast by the most rows the tile's budget allows (the opts, applied to `k` too)."""
    tile = k.register_tile()
    reduce_size = prod(k.size(a) or MIN_REDUCE for a in k.axes_of("reduce"))  # a symbolic one counts as long
    block = _blocking_axis(k, k.axes.index(k.upcast[-1]))
    if block is None or reduce_size < MIN_REDUCE:
        return []
    # a staged kernel whose vector fills whole registers takes up to 16 rows (16 accumulator registers); with a
    # partly filled one (10 lanes: 8 + 2) each row costs two registers, and 16 rows measured slower than 8 or 4
    staged = stages_before_reduction(k.ast, k.upcast) and tile % VECTOR_WIDTH == 0
    size = k.size(block) or 1  # (symbolic: no row count divides it)
    fitting = [r for r in (STAGED_BLOCK_SPLITS if staged else BLOCK_SPLITS) if
               r * tile <= (register_budget(k).staged_tile_max if staged else TILE_MAX) and
               (block != k.axes_of("global")[0] or size // r >= 2)]
    # the most rows that divide the axis; where fewer than 8 do, the most that pad it by at most 1/PAD_WASTE (308 ->
    # 312 for 8 rows, not 4: a transformer's linear layer over 2 x 77 x 2 tokens, 308x384 @ 384x1536, one thread
    # 5.2 -> 3.2 ms)
    rows = next((r for r in fitting if size % r == 0), None)
    if rows is None or rows < BLOCK_SPLITS[0]:
        rows = _padded_split(size, [r for r in fitting if r > (rows or 1)]) or rows
    if rows is None:
        return []
    opts = _upcast(k, block, rows)
    global_axes = k.axes_of("global")
    if not staged and rows < size and _panel_stays_cached(k, block):
        opts.append(Opt(OptOps.SWAP, block, global_axes[-1]))
        return opts
    # the blocks innermost: one copy serves them all. The threads share the outermost loop, so the blocking axis
    # leaves it only for an innermost axis of enough blocks (a matmul of padded columns, 1000x77 @ 77x1023: its
    # column blocks outermost copy each padded block of the right factor once, not once per 8 rows: 18.7 -> 8.3 ms)
    if staged and rows < size and block != global_axes[-1]:
        if block != global_axes[0] or (k.size(global_axes[-1]) or 0) >= MIN_THREAD_BLOCKS:
            opts.append(Opt(OptOps.SWAP, block, global_axes[-1]))
        elif (k.size(global_axes[1]) or 0) >= MIN_THREAD_BLOCKS:
            # too few blocks innermost for the threads (a batch-1 conv's 7 column blocks of 16 over 111 outputs): the
            # blocks move innermost past each axis in turn, the next one (the output rows) becoming the threads' loop
            # 3x224x224 -> 32, 3x3 stride 2, one thread: 2.1-3.3 -> 1.3-1.5 ms (one copy for the 4 blocks of 8 rows)
            rotation = [Opt(OptOps.SWAP, a, b) for a, b in zip(global_axes, global_axes[1:])]
            k.apply_opts(rotation)
            opts += rotation
    return opts


def _hoisted_axis(k: Kernel) -> list[Opt]:
    """An output axis along which no load moves and no reduction's value changes (the output channels of the weight
    gradient of `conv(x).sum()`, whose incoming gradient is a constant; the batch of its input gradient) is swapped,
    after the tile is made, with the innermost output loop (the opt applied to `k`): the linearizer computes each
    value at the outermost loop it depends on, so the reduction then runs once for all its iterations, which only
    store. Of several, the longest."""
    global_axes = k.axes_of("global")
    if len(global_axes) < 2:
        return []
    hoistable = [a for a in global_axes if (k.size(a) or 0) >= 2 and all(s == 0 for s in k.strides(a)) and
                 not _tile_reduces_along(k, a)]
    if not hoistable or global_axes[-1] in hoistable:
        return []
    axis = max(hoistable, key=lambda a: k.size(a) or 0)
    opts = [Opt(OptOps.SWAP, axis, global_axes[-1])]
    k.apply_opts(opts)
    return opts


def _invariant_rows(k: Kernel) -> list[Opt]:
    """Output axes along which no load moves (stride 0 for every load: only gates or index arithmetic tell their
    outputs apart), upcast whole while the tile stays within INVARIANT_TILE_MAX accumulators, the innermost first,
    then from the outermost in (a batch axis, which no gate reads, before the other spatial axis): each loaded value
    then serves all of them. The input gradient of `conv(x).sum()` reads only the weight (its incoming gradient is a
    constant): one thread, a stride-2 conv 8x64x28^2 -> 128 100 -> 1.9 ms (x' and the batch), a depthwise 8x96x28^2
    3.4 -> 0.065 ms (x and the batch; BEAM=2 found 0.13 ms)."""
    k = k.copy()
    global_axes = k.axes_of("global")
    order = [k.axes[a].arg[0] for a in (global_axes[-1:] + global_axes[:-1])]
    opts: list[Opt] = []
    tile = 1
    for loop in order:
        axes = k.axes_of("global")
        axis = next(a for a in axes if k.axes[a].arg[0] == loop)
        size = k.size(axis)
        if size is None or not 2 <= size <= MAX_UPCAST or any(s != 0 for s in k.strides(axis)) or \
                tile * size > INVARIANT_TILE_MAX or \
                not _tile_reduces_along(k, axis):  # (one no reduction depends on is `_hoisted_axis`')
            continue
        if not any((k.size(a) or 0) >= 2 for a in axes if a != axis):
            continue  # (the threads' loop needs an output axis left)
        opts.append(Opt(OptOps.UPCAST, axis, 0))
        k.apply_opt(opts[-1])
        tile *= size
    return opts


def _cache_lines(step_bytes: int, sets: int, ways: int) -> int:
    """How many lines of a cache of `sets` x `ways` lines a walk with this step can keep: a step of a multiple of a
    line maps to only `sets / gcd(sets, step / line)` sets (a 4 KB step: to one set of a 32 KB L1)."""
    if step_bytes % CACHE_LINE:
        return sets * ways
    return sets // math.gcd(sets, step_bytes // CACHE_LINE) * ways


def _transposed_rows(k: Kernel) -> list[Opt]:
    """An elementwise kernel that reads a load across its rows along the innermost output axis (`x.T + x`, a
    permute copy) reads one float of each line it touches; the neighbouring floats are read by the next iteration of
    the output axis along which that load is contiguous, by then evicted when the inner loop touched more lines than
    the L1 cache keeps at that stride (`_cache_lines`: a stride of 8 KB keeps 8). That axis is upcast by
    TRANSPOSE_ROWS: each line is then read for 8 neighbours at once. One thread: `x.T * 2` of 1024^2 3.3 -> 0.45 ms,
    of 2048x1000 6.3 -> 0.96 ms, `x.T + x` 2048^2 22 -> 5.6 ms; a permute whose inner loop stays in L1 (64 channels,
    `x.permute(0, 2, 3, 1)`) is left alone (upcast it measured 2x slower)."""
    global_axes = k.axes_of("global")
    if len(global_axes) < 2 or (inner := k.size(global_axes[-1])) is None:
        return []
    inner_strides = k.strides(global_axes[-1])
    for i, load in enumerate(k.loads):
        stride = inner_strides[i]
        if stride is None or abs(stride) <= 1 or inner <= _cache_lines(abs(stride) * load.dtype.itemsize, L1_SETS,
                                                                        L1_WAYS):
            continue
        for axis in reversed(global_axes[:-1]):
            size = k.size(axis)
            if k.strides(axis)[i] == 1 and size is not None and size % TRANSPOSE_ROWS == 0 and \
                    (axis != global_axes[0] or size // TRANSPOSE_ROWS >= 2):
                return [Opt(OptOps.UPCAST, axis, TRANSPOSE_ROWS)]
    return []


def _panel_stays_cached(k: Kernel, block: int) -> bool:
    """Whether a matmul's column blocks should be its outermost loop (`SWAP` of the blocking axis, outermost, with the
    vector axis, innermost): then each block's panel of the right factor (the reduction's length times one vector)
    is read from the cache by every block of rows, and the left factor is swept once per column block, where rows
    outermost sweep the whole right factor once per block of 8 rows (twice the traffic for a 8 x 16 tile). Only for
    one reduce axis, enough column blocks for the threads, and a panel the L2 cache can hold at its row stride: a
    stride of a multiple of 4 KB maps every row of the panel to the same few cache sets (`L2_SETS`, `L2_WAYS`:
    1024 x 1024 @ 1024 x 1024 is slower swapped, 1000 x 1000 @ 1000 x 1000 twice as fast)."""
    global_axes, reduce_axes = k.axes_of("global"), k.axes_of("reduce")
    vector = k.axes.index(k.upcast[-1])
    blocks = k.size(global_axes[-1]) or 0
    if len(reduce_axes) != 1 or block != global_axes[0] or len(global_axes) < 2 or blocks < MIN_THREAD_BLOCKS:
        return False
    steps = k.size(reduce_axes[0])
    panel = [i for i, s in enumerate(k.strides(vector)) if s == 1]
    if steps is None or steps < MIN_REDUCE * COLUMN_CHAINS or not panel:  # (a short panel: either order is cached)
        return False
    for i in panel:
        stride = k.strides(reduce_axes[0])[i]
        if stride is None:
            return False
        if stride and steps > _cache_lines(abs(stride) * k.loads[i].dtype.itemsize, L2_SETS, L2_WAYS):
            return False
    return True


def _packed_channel_tile(k: Kernel, vector: tuple[int, int] | None) -> list[Opt]:
    """Channels as SIMD lanes: when the contiguous vector axis does not fill whole registers (a convolution's output row
    of 24, 20, 10, 8 or 6 columns), an output axis of a multiple of 16 (or padded to one) along which the loads that
    move are ungated and small enough to be packed whole (`codegen/stage.py`: a convolution's weight, copied once with
    the channels contiguous) becomes the vector, 16 lanes, and the innermost output axes along which the packed loads
    stay put become up to `RegisterBudget.packed_rows` rows: for each step of the reduction, one vector load of the
    packed weight and a multiply-add per row with one input value. MNIST's second conv at batch 128, 2 threads: 24.5 ->
    15.6 ms; its input gradient (24 columns): 26.9 -> 22.3 ms; the third and fourth convs' input gradients: 7.5 -> 4.7
    ms and 7.8 -> 5.2 ms."""
    if vector is not None and (vector[1] or k.size(vector[0]) or VECTOR_WIDTH) % VECTOR_WIDTH == 0:
        return []
    reduce_size = prod(k.size(a) or MIN_PACKED_REDUCE for a in k.axes_of("reduce"))
    stores = [u for u in k.ast.src if u.op is Ops.STORE]

    def long_enough(axis: int) -> bool:  # (attention's scores q k^T over a head of 32: the keys as lanes, 4x faster)
        stored = all(index_stride(u.src[1], k.axes[axis]) == 1 for u in stores)
        return reduce_size >= (MIN_PACKED_REDUCE_STORED if stored else MIN_PACKED_REDUCE)
    global_axes = k.axes_of("global")
    for width in CHANNEL_LANES:  # 8 lanes only where no axis takes 16 (24 channels: a 5x5 conv's, its weight gradient)
        # packs made once for the whole reduction (a convolution's weight), the outermost axis last (still split in
        # blocks for the threads: `x @ W` of 10 columns, its rows the lanes; MNIST's head 2.4 -> 0.07 ms)
        for axis in reversed(global_axes):
            if long_enough(axis) and (lanes := _channel_lanes(k, axis, "whole", width)) is not None:
                return lanes
        for axis in global_axes:  # packs remade at each step of the outer reduce loop, the outermost axis first
            if long_enough(axis) and (lanes := _channel_lanes(k, axis, "per step", width)):
                return lanes
    return []


def _channel_lanes(k: Kernel, axis: int, fit: str, lanes: int = VECTOR_WIDTH) -> list[Opt] | None:
    """The packed channel tile with `axis` as its `lanes` (16, or 8 where 16 divide no axis: 24 channels; a 5x5
    stride-2 conv 3 -> 24 at 8x64x64, one thread: 2.5 -> 1.0 ms, its weight gradient 5.1 -> 1.5 ms, where the kernel
    width's 5 lanes and 8 channel rows were the tile), if its strided loads pack as `fit` says (`_pack_fit`):
    the opts, [] when it has no rows, or None when the axis does not qualify. With a pack remade at each step of the
    outer reduce loop (a weight gradient's incoming gradient, `g[b, co, y, x]` for one image, output channels as
    lanes) the rows must share each packed vector PACK_REUSE times: the window's taps times a few input channels.
    MNIST's 3x3 weight gradients at batch 128, 2 threads: 10.2 -> 3.4 ms (64 -> 64 channels) and 10.0 -> 4.6-7.1 ms
    (32 -> 64); the 5x5 one of its first conv (25 rows: PACKED_ROWS): 3.1 -> 1.5 ms."""
    size, strides = k.size(axis), k.strides(axis)
    # the strided loads, by position (not by buffer: attention's q and k are one fused qkv buffer, q stays put)
    packed = {i for i, s in enumerate(strides) if s != 0 and s != 1}
    # (an odd axis read with a stride of 2 is `_strided_lanes`' instead: two shuffles per vector, nothing packed)
    if size is None or (size % lanes and (not _padded_split(size, (lanes,)) or 2 in strides)) or not packed or \
            _pack_fit(k, packed) != fit:
        return None
    if axis == k.axes_of("global")[0] and size // lanes < 2:  # (the outermost loop is kept for the threads)
        return None
    # an odd size is padded to whole lanes where that adds at most 1/PAD_WASTE: `x[::3, ::2] @ y.T` of 683 x 683
    # outputs (no axis reads either factor contiguously), one thread 21 -> 1.5 ms
    opts = [Opt(OptOps.PADTO, axis, lanes)] if size % lanes else []
    opts.append(Opt(OptOps.UPCAST, axis, lanes if size > lanes else 0))
    tile = k.copy().apply_opts(opts)
    budget = register_budget(k).packed_rows if fit == "whole" else PACKED_ROWS
    shift = _shift_axis(tile, packed)
    if shift is not None:
        opts.append(Opt(OptOps.UPCAST, shift, 0))
        budget //= tile.size(shift) or 1
        tile.apply_opt(opts[-1])
    for row_axis in reversed(tile.axes_of("global")):
        row_strides, row_size = tile.strides(row_axis), tile.size(row_axis) or 1
        if any(row_strides[i] != 0 for i in packed) or \
                all(s == 0 for s in row_strides):
            continue
        limit = min(budget, row_size // 2 if row_axis == tile.axes_of("global")[0] else row_size)
        rows = _largest_divisor(row_size, limit)
        if rows is None and (rows := _padded_rows(row_size, limit)) is not None:
            opts.append(Opt(OptOps.PADTO, row_axis, rows))  # (a prime row count: 17 -> 2 x 9)
            tile.apply_opt(opts[-1])
            row_size = tile.size(row_axis) or row_size
        if rows is None:
            break
        opts.append(Opt(OptOps.UPCAST, row_axis, 0 if rows == row_size else rows))
        tile.apply_opt(opts[-1])
        budget //= rows
        outputs = tile.axes_of("global")
        if rows < row_size and row_axis != outputs[-1] and \
                (row_axis != outputs[0] or (tile.size(outputs[-1]) or 0) >= MIN_THREAD_BLOCKS):
            # its blocks innermost: the pack (which does not depend on them) is made once for all of them, not once
            # per block of rows (`x @ W.T`, every nn.Linear: W's columns packed per 8 rows; 512x128 @ (512x128).T
            # 3.0 -> 0.8 ms). The threads share the outermost loop: it is given up only for enough blocks
            opts.append(Opt(OptOps.SWAP, row_axis, outputs[-1]))
        if budget < 2 or rows < row_size:
            break
    if fit == "per step" and tile.register_tile() < PACK_REUSE * lanes:
        return None
    return opts if sum(o.op is OptOps.UPCAST for o in opts) > 1 else []


def _padded_rows(size: int, limit: int) -> int | None:
    """The most rows, up to `limit`, that padding `size` to a multiple of adds at most 1/PAD_WASTE of it (17 -> 18 for
    9 rows, where no row count divides it: the quotient loop of a stride-2 kernel's 34 outputs, see polyphase.py)."""
    return next((r for r in range(limit, 1, -1) if -size % r <= size // PAD_WASTE and size % r), None)


def _shift_axis(k: Kernel, packed: set[int]) -> int | None:
    """An output axis (at most SHIFT_ROWS long, not the threads' outermost) along which every packed load moves as
    it does along one of the reduce axes: a window's kernel width in a weight gradient (`x[b, ci, y+kh, x+kw]`), whose
    rows then read one packed buffer at shifted places. Of several, the one moving the loads least far."""
    reduce_axes = k.axes_of("reduce")
    candidates = []
    for axis in k.axes_of("global")[1:]:
        size, strides = k.size(axis), k.strides(axis)
        moves = [strides[i] for i in packed]
        if size is None or not 2 <= size <= SHIFT_ROWS or any(s in (0, None) for s in moves):
            continue
        if all(any(k.strides(r)[i] == strides[i] for r in reduce_axes)
               for i in packed):
            candidates.append((max(abs(s or 0) for s in moves), axis))
    return min(candidates)[1] if candidates else None


def _pack_fit(k: Kernel, packed: set[int]) -> str | None:
    """How these loads (positions in `k.loads`, ungated) can be packed by `codegen/stage.py`: "whole" when each one's
    values over the reduce axes it moves along, times 16 lanes, fit a staging buffer (`stage.STAGE_MAX`: a convolution's
    weight), "per step" when they fit without the outermost of those axes (the pack is remade at each of its steps:
    a weight gradient's incoming gradient, one image at a time), else None."""
    reduce_axes = k.axes_of("reduce")
    fit = "whole"
    for i, load in enumerate(k.loads):
        if i not in packed:
            continue
        moving = [k.size(a) for a in reduce_axes if k.strides(a)[i] != 0]
        if len(load.src) == 3 or any(m is None for m in moving):
            return None
        if prod(m or 1 for m in moving) * VECTOR_WIDTH > STAGE_MAX:
            if prod(m or 1 for m in moving[1:]) * VECTOR_WIDTH > STAGE_MAX:
                return None
            fit = "per step"
    return fit


def _largest_divisor(size: int, limit: int) -> int | None:
    """The largest divisor of `size` from 2 to `limit`, if there is one."""
    return next((d for d in range(limit, 1, -1) if size % d == 0), None)


def _strided_lanes(k: Kernel) -> list[Opt]:
    """Output lanes read with a stride of 2 (a 2x2 max-pool: each output reads columns 2x and 2x + 1; a stride-2
    convolution): the innermost such output axis, whole when short, else by 16 (8, 4; padded when none divides it);
    gcc gathers the even and odd columns with two shuffles. The opts are applied to `k`. MNIST's max-pool of a batch
    norm at batch 128 (10 output columns): 3.5 -> 0.56 ms. A convolution then takes rows of output channels around
    them (`_register_rows`): 3x224x224 -> 32, 3x3, stride 2, 111 output columns: 12.4 -> 3.4 ms."""
    axis = k.axes_of("global")[-1] if len(k.axes_of("global")) > 1 else None
    if axis is None or (size := k.size(axis)) is None or size < MIN_OUTPUT_LANES // 2:
        return []
    if any(s not in (0, 1, 2) for s in k.strides(axis)) or 2 not in k.strides(axis):
        return []
    amount = 0 if size <= VECTOR_WHOLE_MAX else VECTOR_WIDTH if size % VECTOR_WIDTH == 0 else \
        next((f for f in VECTOR_SPLITS if size % f == 0), None) or _padded_split(size, (VECTOR_WIDTH, *VECTOR_SPLITS))
    return [] if amount is None else _upcast(k, axis, amount)


def _row_reduction_lanes(k: Kernel) -> list[Opt]:
    """Lanes for each row reduction of a kernel (one computed once per row, before the loop over the row, so outside
    the tile: softmax's max and sum), as `_lanes_for_reduction` gives a reduction kernel of its own."""
    scopes = Scopes()
    tile = set(k.upcast)
    reductions = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
    rows = [u for u in reductions if not scopes(u) & tile]
    if not tile or len(rows) != len(reductions):
        return []
    k = k.copy()
    opts: list[Opt] = []
    for red in rows:
        axis = k.axes.index(max(red.src[1:], key=lambda r: r.arg[0]))  # its innermost loop
        lanes = _lanes_for_reduction(k, axis)
        k.apply_opts(lanes)
        opts += lanes
    return opts


def _lanes_for_reduction(k: Kernel, axis: int | None = None) -> list[Opt]:
    """A sum, product or max over a contiguous row (`axis`, default the innermost reduce axis): 16 accumulator lanes
    (one SIMD register; 8 or 4 when 16 does not divide the row: a row of 1000), then, for a long row, CHAINS (or 2)
    such registers (independent chains: one add or max per
    register per step waits for the previous one, 3-4 cycles), combined after the loop. A lone `omp simd reduction`
    gives one register, and a max with NaN checks is not vectorised at all without lanes."""
    reduce_axes = k.axes_of("reduce")
    if not reduce_axes or not any(u.op is Ops.REDUCE for u in k.ast.toposort()):
        return []
    axis = reduce_axes[-1] if axis is None else axis
    strides = k.strides(axis)
    size = k.size(axis)
    if any(s not in (0, 1) for s in strides) or 1 not in strides or size is None or size <= LANES:
        return []  # (a row of one register or less: the horizontal sum of lanes would cost more than it saves)
    lanes = next((n for n in (LANES, 8) if size % n == 0 and size > n), None)
    if lanes is None and size <= VECTOR_WHOLE_MAX and (size % 4 or _inside_longer_reduction(k, axis)):
        # a short row no 16 or 8 divide, unrolled whole (two registers, one partly filled): where 4 lanes do not
        # divide it either (a row sum of 17 or 31, one thread: 23 -> 11 us, 33 -> 20 us for 4000 rows), or it is
        # the innermost of a longer reduction (`mean((0, 2, 3))` of 32x64x28x28, rows of 28: 0.80 -> 0.29 ms; a
        # lone row of 28 keeps 4 lanes: 11 us, whole 17 us)
        return [Opt(OptOps.UNROLL, axis, 0)]
    # a sum's lanes fill whole registers or there are none: gcc and clang vectorise its plain `omp simd` loop
    # themselves, and 8 or 4 lanes measured slower (rows of 1000, one thread, gcc/clang: 50/50 -> 37/42 us; rows of
    # 1004 and 4 lanes: 110/124 -> 41/35 us). A max keeps them where the compiler needs them (`max_lanes`: clang
    # leaves its NaN-aware select scalar without, 470 -> 224 us; gcc does not, 62 -> 265 us with 8 lanes)
    partial_lanes = _reduces_by(k, axis, Ops.MAX) and (getattr(k.renderer, "max_lanes", True) or
                                                       size < LANES * MIN_CHAIN_STEPS)  # (gcc, rows of 28: 239 -> 166)
    if lanes == 8 and not partial_lanes:
        return []
    lanes = lanes or next((n for n in VECTOR_SPLITS if size % n == 0 and size > n), None)
    if lanes is None or (lanes < 8 and not partial_lanes):
        return []  # (a row of 77 or 1023: no lanes divide it, it stays one scalar or `omp simd` chain)
    opts = [Opt(OptOps.UNROLL, axis, lanes)]
    chains = next((c for c in (CHAINS, 2) if (size // lanes) % c == 0 and size >= lanes * c * MIN_CHAIN_STEPS), None)
    if chains is not None:
        opts.append(Opt(OptOps.UNROLL, axis, chains))
    return opts


def _column_chains(k: Kernel, axis: int, amount: int) -> list[Opt]:
    """A tile with no rows (no output axis shares its vector loads: a column sum or max, `x.sum(1)` of 32x512x77)
    has one register of accumulators per vector, one add or max per step waiting on the last: more of the vector
    axis' blocks (the outer part of `axis`, split by `amount`) go into the tile, up to COLUMN_CHAINS registers of
    independent chains (its largest divisor up to that, or all of them). One thread: `max(1)` of 32x512x77 0.65 ->
    0.21 ms (5 registers over 80 padded columns), `sum(1)` 0.34 -> 0.15 ms, `sum(0)` of 1000x1024 0.14 -> 0.06 ms."""
    reduce_size = prod(k.size(a) or MIN_REDUCE for a in k.axes_of("reduce"))
    if not amount or reduce_size < MIN_REDUCE * COLUMN_CHAINS or k.axes[axis].arg[1] != "global" or \
            not _tile_reduces_along(k, axis):  # (a softmax's row is elementwise: no accumulators to add)
        return []
    blocks, outermost = k.size(axis), axis == k.axes_of("global")[0]
    if blocks is None or blocks < 2 or k.register_tile() * min(blocks, COLUMN_CHAINS) > TILE_MAX:
        return []
    if blocks <= COLUMN_CHAINS and not outermost:
        return _upcast(k, axis, 0)
    chains = _largest_divisor(blocks, min(COLUMN_CHAINS, blocks // 2 if outermost else blocks))
    return [] if chains is None else _upcast(k, axis, chains)


def _reduces_by(k: Kernel, axis: int, op: Ops) -> bool:
    """Whether a reduction over reduce `axis` is an `op` reduction (Ops.MAX: a max)."""
    rng = k.axes[axis]
    return any(u.op is Ops.REDUCE and rng in u.src[1:] and u.arg is op for u in k.ast.toposort())


def _inside_longer_reduction(k: Kernel, axis: int) -> bool:
    """Whether a reduction over reduce `axis` also reduces over other axes (`mean((0, 2, 3))`: its row of 28 is the
    innermost loop of 32 x 28 x 28)."""
    rng = k.axes[axis]
    return any(u.op is Ops.REDUCE and rng in u.src[1:] and len(u.src) > 2 for u in k.ast.toposort())


def _reduce_lane_tile(k: Kernel) -> list[Opt]:
    """SIMD lanes along a short contiguous reduce axis (6 to 32 iterations, unrolled whole: `Kernel.upcast` makes
    them the innermost loop), and rows of output axes around them: first the smallest output axis that moves some of
    the lanes' loads and not others, whole, then one that moves only others, by its largest divisor that
    ACCUMULATOR_REGISTERS allow. A convolution's weight gradient sums over rows of output positions that both of its
    loads read contiguously: its tile is the kernel width (the input's row shifts, the gradient's stays) times a few
    output channels (the gradient's row changes, the input's stays). MNIST's three weight gradients at batch 128, 2
    threads: 74 -> 35 ms (5x5, 20 lanes), 11 -> 4.1 ms and 24 -> 11 ms (3x3, 8 and 6 lanes). A row of 16 or more may
    also gather (a max-pool's gradient `g[x // 2]`: MNIST's batch-norm gradient sums, 2.3 -> 1.75 ms each); a shorter
    one measured slower with gathers than without lanes."""
    reduce_axes = k.axes_of("reduce")
    if not reduce_axes:
        return []
    axis = reduce_axes[-1]
    strides, size = k.strides(axis), k.size(axis)
    gathers_pay = size is not None and size >= VECTOR_WIDTH  # a gathered load (`g[x // 2]` in a max-pool's gradient)
    if size is None or not SHORT_ROW[0] <= size <= SHORT_ROW[1] or 1 not in strides or \
            any(s not in (0, 1) and not (s is None and gathers_pay) for s in strides):
        return []
    opts = [Opt(OptOps.UNROLL, axis, 0)]
    k = k.copy().apply_opts(opts)
    lanes = k.axes.index(k.upcast[-1])
    budget = ACCUMULATOR_REGISTERS // len(k.renderer.lane_chunks(size))
    moved: set[int] = set()
    while (rows := _lane_rows(k, lanes, moved, budget)) is not None:
        row_axis, amount, count, moves = rows
        opts.append(Opt(OptOps.UPCAST, row_axis, amount))
        k.apply_opt(opts[-1])
        lanes = k.axes.index(k.upcast[-1])
        budget //= count
        moved |= moves
    return opts


def _lane_rows(k: Kernel, lanes: int, moved: set[int], budget: int) -> tuple[int, int, int, set[int]] | None:
    """(axis, amount, rows, buffers of the loads it moves) of the next rows of a reduce-lane tile: an output axis
    that moves some of the lanes' loads (stride 1 on axis `lanes`), none that earlier rows moved, and leaves another
    fixed; with no rows yet the smallest such axis whole (not the threads' outermost axis), else the longest one by
    its largest divisor within the register budget."""
    lane_buffers = {load.src[0].arg for load, s in zip(k.loads, k.strides(lanes)) if s == 1}
    global_axes = k.axes_of("global")
    candidates = []
    for axis in global_axes:
        size = k.size(axis)
        moves = {load.src[0].arg for load, s in zip(k.loads, k.strides(axis)) if s != 0} & lane_buffers
        if size is not None and size >= 2 and moves and moves != lane_buffers and not moves & moved:
            candidates.append((axis, size, moves))
    whole = [c for c in candidates if c[1] <= budget and c[0] != global_axes[0]]
    if whole and not moved:  # of equal sizes, the one moving the loads least far (their rows overlap: the kernel width)
        axis, size, moves = min(whole, key=lambda c: (c[1], sum(abs(s or 0) for s in k.strides(c[0]))))
        return axis, 0, size, moves
    for axis, size, moves in sorted(candidates, key=lambda c: -c[1]):
        if (amount := _largest_divisor(size, min(budget, size // 2))) is not None:
            return axis, amount, amount, moves
    return None


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
        elif _tile_reduces_along(k, axis) and _padded_split(size, (VECTOR_WIDTH,)) and \
                _blocking_axis(k, axis) is not None:  # 1000 -> 1008: whole registers, where rows share the vector
            candidates.append((axis, VECTOR_WIDTH, VECTOR_WIDTH))
        elif (amount := next((f for f in VECTOR_SPLITS if size % f == 0 and size > f), None)) is not None:
            candidates.append((axis, amount, amount))
        elif _tile_reduces_along(k, axis) and _blocking_axis(k, axis) is None and \
                (amount := _exact_lanes(size)) is not None:  # a column sum of 1023: 33 x 31 lanes, no gate
            candidates.append((axis, amount, min(amount, VECTOR_WIDTH)))
        elif _tile_reduces_along(k, axis) and \
                (amount := _padded_split(size, (VECTOR_WIDTH, *VECTOR_SPLITS))) is not None:  # 1023, 77: padded
            candidates.append((axis, amount, amount))
    if not candidates:
        return None
    axis, amount, _ = max(candidates, key=lambda c: c[2])  # max keeps the first (innermost) of equal lanes
    return axis, amount


def _exact_lanes(size: int) -> int | None:
    """The largest lane count from VECTOR_WIDTH to VECTOR_WHOLE_MAX that divides `size` (31 for 1023; none for 77),
    if any: lanes with no padding for a tile with no rows. Padded, every load of such a tile (a column sum) is gated
    and `codegen/stage.py` copies them all first, for no reuse: sum(axis=0) of 1000 x 1023, one thread, 0.46 ->
    0.25 ms; of 2048 x 1023, 4.4 -> 1.0 ms. (11 lanes for 77 measured no faster than 80 padded.)"""
    lanes = _largest_divisor(size, VECTOR_WHOLE_MAX)
    return lanes if lanes is not None and lanes >= VECTOR_WIDTH else None


def _padded_split(size: int, splits: Sequence[int]) -> int | None:
    """The first of `splits` that divides `size` once `size` is padded up to a multiple of it (`OptOps.PADTO`), if
    that adds at most 1/PAD_WASTE of its iterations: 1023 -> 1024 and 77 -> 80 for 16 lanes, 513 -> 520 for 8 rows;
    33 -> 36 for 4 lanes, not 48 for 16."""
    return next((s for s in splits if size > s and -size % s <= size // PAD_WASTE), None)


def _tile_reduces_along(k: Kernel, axis: int) -> bool:
    """Whether a reduction's value moves along output `axis` (a matmul's columns, column sums): its lanes are then
    accumulators inside the reduction, worth padding for. A row reduction broadcast along the axis (a softmax or
    layernorm of rows of 77) is not: the loop over the row is elementwise SIMD already (measured slower padded)."""
    scopes, rng = Scopes(), k.axes[axis]
    return any(rng in scopes(u) for u in k.ast.toposort() if u.op is Ops.REDUCE)


def _upcast(k: Kernel, axis: int, amount: int) -> list[Opt]:
    """UPCAST `axis` by `amount` (0: whole), after a PADTO to a multiple of `amount` when it does not divide the
    axis; the opts are applied to `k` too."""
    size = k.size(axis)
    opts = [Opt(OptOps.PADTO, axis, amount)] if amount and size and size % amount else []
    opts.append(Opt(OptOps.UPCAST, axis, amount))
    k.apply_opts(opts)
    return opts


def _blocking_axis(k: Kernel, vector: int) -> int | None:
    """The output axis along which the most vector loads (those moving along the vector axis: stride 1, 2 for
    strided lanes, or no constant stride where a padded axis gates them) stay put (stride 0); of several, the one
    with room for the most rows (the threads' outermost axis keeps two blocks). A batched `(B, T, C) @ (C, N)` has
    two such axes, B and T: its rows are T's (B = 4 gave 2 rows: 1.67 -> 0.45 ms at 4 x 64 x 128 @ 128 x 512)."""
    if not k.axes_of("global"):  # the vector took the only output axis (`x.sum(0)` of 17 columns): no rows to add
        return None
    vector_loads = [i for i, s in enumerate(k.strides(vector)) if s != 0]
    outermost = k.axes_of("global")[0]
    best, best_key = None, (0, 0)
    for axis in k.axes_of("global"):
        strides = k.strides(axis)
        shared = sum(1 for i in vector_loads if strides[i] == 0)
        size = k.size(axis) or TILE_MAX  # (symbolic: room for any rows)
        key = (shared, min(size // 2 if axis == outermost else size, TILE_MAX))
        if shared and key > best_key and any(s != 0 for s in strides):
            best, best_key = axis, key
    return best


# ---------------------------------------------------------------------------------------------- GPU launch shapes

def _scatter_lanes(k: Kernel) -> list[Opt]:
    """A CPU scatter (an accumulating store, schedule/scatter.py) loops over its output axes outermost, the reduced
    ones inside (`KernelBuilder.build_scatter`): the outermost axis, when every load reads it contiguously or not at
    all, is upcast by 16 (8, 4) as SIMD lanes inside the token loop, its blocks staying the outer loop the threads
    share: `dW[row, d0 + l] += g[t, d0 + l]` a vector at a time instead of one float per cache line."""
    if not any(u.op is Ops.STORE and u.arg is Ops.ADD for u in k.ast.toposort()):
        return []
    axes = k.axes_of("global")
    if len(axes) < 2 or (size := k.size(axes[0])) is None:
        return []
    if any(stride not in (0, 1) for stride in k.strides(axes[0])):
        return []
    amount = next((w for w in (VECTOR_WIDTH, *VECTOR_SPLITS) if size % w == 0 and size > w), None)
    return [Opt(OptOps.UPCAST, axes[0], amount)] if amount else []


def gpu_launch_opts(k: Kernel) -> list[Opt]:
    """The launch shape gpudims would pick without opts, as LOCAL/GROUP opts when they give the same kernel."""
    if any(k.size(axis) is None for axis in range(len(k.axes))):
        return []  # symbolic sizes: gpudims' flat shape checks the real count in the kernel
    shape = automatic_shape(k.ast)
    opts = (_warp_rows(k) or _group_opts(k)) if shape == "grouped" else \
        (_lane_group_opts(k) or _vector_opts(k) or _transpose_opts(k) or _local_opts(k)) if shape == "flat" else []
    try:
        k.copy().apply_opts(opts)
    except KernelOptError:
        return []
    return opts


def _group_opts(k: Kernel) -> list[Opt]:
    """A grouped reduction: LOCAL_SIZE threads share the innermost reduce axis (thread l takes elements l, l+256,
    ...), when every reduction runs over that axis as its innermost loop and 256 divides it."""
    axis = _innermost_reduce_axis(k)
    if axis is None:
        return []
    return [Opt(OptOps.GROUP, axis, LOCAL_SIZE)] if (k.size(axis) or 1) % LOCAL_SIZE == 0 else []


WARP_ROW_MAX = 4096  # a row this long or shorter is reduced by one warp (each lane at most 128 elements) ...
WARP_ROWS_MIN = 1024  # ... when there are at least this many rows (about 8 warps per multiprocessor of an H100)


def _warp_rows(k: Kernel) -> list[Opt]:
    """Many rows of moderate length (a LayerNorm's statistics: 8192 rows of 768): a warp per row, eight rows a
    work-group (`_lane_group_opts`), the lanes combining by shuffles. A work-group of 256 threads per row read 3
    elements a thread and then combined them through shared memory in 8 steps with a barrier each."""
    axis = _innermost_reduce_axis(k)
    rows = prod(k.size(a) or 1 for a in k.axes_of("global"))
    if axis is None or (k.size(axis) or WARP_ROW_MAX + 1) > WARP_ROW_MAX or rows < WARP_ROWS_MIN:
        return []
    opts = _lane_group_opts(k)
    return opts if opts and opts[-1].amount == WARP else []  # (a whole warp per row: rows of a multiple of 32)


def _innermost_reduce_axis(k: Kernel) -> int | None:
    """The innermost reduce axis, when every reduction runs over it as its innermost loop (a GROUP splits it)."""
    reduce_axes = k.axes_of("reduce")
    if not reduce_axes:
        return None
    axis = max(reduce_axes, key=lambda a: k.axes[a].arg[0])
    rng = k.axes[axis]
    reduces = [u for u in k.ast.toposort() if u.op is Ops.REDUCE]
    if any(rng not in red.src[1:] or max(r.arg[0] for r in red.src[1:]) != rng.arg[0] for red in reduces):
        return None
    return axis


LANE_GROUP_MAX = 32   # threads sharing one output's short reduction: at most a warp (they combine by shuffles)
LANE_SHARE = 4        # elements each of them reduces, at least


def _lane_group_opts(k: Kernel) -> list[Opt]:
    """A short reduction over a contiguous row whose thread-per-output layout would read with a stride (D = sum(dO *
    out) over a head's 64 dims, a mean over the last axis of 64): G neighbouring threads share each output's row
    (`GROUP` G, each thread at least LANE_SHARE elements, G <= 32 so a group lies inside a warp and combines by
    shuffles) and LOCAL_SIZE / G outputs share a work-group (`LOCAL`). A warp's loads then cover whole runs of
    rows instead of one element of 32 rows each."""
    axis = _innermost_reduce_axis(k)
    if axis is None or k.axes_of("local", "group", "upcast", "unroll"):
        return []
    size = k.size(axis) or 0
    outputs = [a for a in k.axes_of("global") if (k.size(a) or 1) > 1]
    if not outputs or 1 not in k.strides(axis) or all(st in (0, 1) for st in k.strides(outputs[-1])):
        return []  # (no contiguous row, or neighbouring outputs are read from neighbouring addresses already)
    group = LANE_GROUP_MAX
    while group >= 2 and (size % group or size < group * LANE_SHARE):
        group //= 2
    if group < 2:
        return []
    local = _local_opts(k, LOCAL_SIZE // group)
    if not local:
        return []
    grouped_axis = _innermost_reduce_axis(k.copy().apply_opts(local))
    return [*local, Opt(OptOps.GROUP, grouped_axis, group)] if grouped_axis is not None else []


VECTOR_BYTES = 16  # a GPU thread's widest load or store (CUDA's uint4, Metal's uint4)
WARP = 32


def _vector_opts(k: Kernel) -> list[Opt]:
    """A large elementwise kernel whose store and loads all run contiguously (or stay put) along the innermost output
    axis: each thread takes VECTOR_BYTES of its narrowest contiguous buffer there (`UPCAST`, innermost), the threads
    of a work-group neighbouring runs (`LOCAL`), so that the renderer loads and stores each run as one vector
    (`renderer.cstyle.vector_runs`). A warp's 2-byte accesses moved 64 bytes an instruction, 16-byte ones 512.
    Where a warp's threads cannot all take a 16-byte run of the innermost axis (GPT-2's 50304-wide logits: 6288 runs
    of 8 bfloat16, only 16 of them dividing it), the runs are halved until they can (4 bfloat16, 32 threads): the
    flat shape instead computed every element's row and column with a division and a remainder."""
    if (found := _large_elementwise(k)) is None:
        return []
    outputs, accesses = found
    axis = outputs[-1]
    strides = {u: index_stride(u.src[1], k.axes[axis]) for u in accesses}
    if any(st not in (0, 1) for st in strides.values()) or \
            any(strides[u] != 1 for u in accesses if u.op is Ops.STORE):
        return []
    lanes = VECTOR_BYTES // min(u.src[0].dtype.itemsize for u in accesses if strides[u] == 1)
    while lanes >= 2:  # narrower runs where the row left after the widest has too few factors of 2 for a warp
        if (k.size(axis) or 1) % lanes == 0:
            upcast = [Opt(OptOps.UPCAST, axis, lanes)]
            if local := _run_threads(k.copy().apply_opts(upcast)):
                return [*upcast, *local]
        lanes //= 2
    return []


def _transpose_opts(k: Kernel) -> list[Opt]:
    """A large elementwise kernel that stores along its innermost output axis A and loads a buffer that runs along
    another output axis B instead (`x.T.contiguous()`, attention's dV transposed back, any permute's copy): each
    thread takes 16 bytes of that load along B (`UPCAST`, a vector load), a warp 32 neighbours along A (`LOCAL`),
    so that each of the thread's stores is one of 32 neighbouring elements of the warp. One element a thread, a
    warp's load touched 32 sectors for 64 bytes (bf16); now each 32-byte sector it touches gives it 16."""
    if (found := _large_elementwise(k)) is None or len(found[0]) < 2:
        return []
    outputs, accesses = found
    inner = outputs[-1]
    if any(index_stride(u.src[1], k.axes[inner]) != 1 for u in accesses if u.op is Ops.STORE):
        return []
    for load in (u for u in accesses if u.op is Ops.LOAD and index_stride(u.src[1], k.axes[inner]) not in (0, 1)):
        along = next((a for a in outputs[:-1] if index_stride(load.src[1], k.axes[a]) == 1), None)
        lanes = VECTOR_BYTES // load.src[0].dtype.itemsize
        if along is None or (k.size(along) or 1) % lanes or (k.size(inner) or 1) % WARP:
            continue
        rest = (k.size(along) or 1) // lanes  # (the runs along the load's axis, after the UPCAST)
        threads = [Opt(OptOps.LOCAL, inner, WARP)]  # (innermost first: a LOCAL moves only the axes after it)
        if (across := math.gcd(rest, LOCAL_SIZE // WARP)) > 1:
            threads.append(Opt(OptOps.LOCAL, along, 0 if across == rest else across))
        return [Opt(OptOps.UPCAST, along, lanes), *threads]
    return []


def _large_elementwise(k: Kernel) -> tuple[list[int], list[UOp]] | None:
    """(the output axes longer than 1, the loads and stores) of a GPU kernel the vector-run shapes apply to: no
    reduction, no opts yet, at least MANY_ELEMENTS outputs, and no gated access (a pad's or a masked store's elements
    are not whole runs). None for any other."""
    if not k.renderer.vector_runs or k.has_reduce or k.axes_of("local", "group", "upcast", "unroll"):
        return None
    outputs = [a for a in k.axes_of("global") if (k.size(a) or 1) > 1]
    if not outputs or prod(k.size(a) or 1 for a in outputs) < MANY_ELEMENTS:
        return None
    accesses = [u for u in k.ast.toposort() if u.op in (Ops.LOAD, Ops.STORE)]
    if any(u.op is Ops.LOAD and len(u.src) == 3 or u.op is Ops.STORE and len(u.src) == 4 for u in accesses):
        return None
    return outputs, accesses


def _run_threads(k: Kernel) -> list[Opt]:
    """LOCAL_SIZE threads from the output axes, innermost first, each taking the largest power of two dividing the
    axis that still fits; at least a warp's worth of consecutive runs, so that a warp's accesses are one span of
    memory. The innermost axis gives them, or, where it is taken whole and every access continues along the next
    axis where it ends (a row of 64 bfloat16 heads, 8 runs of 8, then the next row), the axes around it too: a
    4-byte run per thread to make a warp of one such row moved a quarter of the bytes an instruction."""
    threads, opts = LOCAL_SIZE, list[Opt]()
    order = list(reversed(k.axes_of("global")))
    consecutive, run = True, 1
    for i, axis in enumerate(order):
        size = k.size(axis) or 1
        take = math.gcd(size, threads)
        if take > 1:
            opts.append(Opt(OptOps.LOCAL, axis, 0 if take == size else take))
            threads //= take
        if consecutive:
            run *= take
            consecutive = take == size and i + 1 < len(order) and _continues(k, axis, order[i + 1])
        if run < WARP and not consecutive:
            return []
        if threads == 1:
            return opts
    return []


def _continues(k: Kernel, inner: int, outer: int) -> bool:
    """Whether every load and store that moves along axis `inner` continues along axis `outer` where `inner` ends:
    `outer`'s stride is `inner`'s times its size (a row-major pair of axes, for these accesses one axis)."""
    size = k.size(inner)
    if size is None:
        return False
    for u in k.ast.toposort():
        if u.op in (Ops.LOAD, Ops.STORE):
            step = index_stride(u.src[1], k.axes[inner])
            if step is None or step != 0 and index_stride(u.src[1], k.axes[outer]) != step * size:
                return False
    return True


def _local_opts(k: Kernel, threads: int = LOCAL_SIZE) -> list[Opt]:
    """One thread per output, `threads` (or all the outputs, when fewer) per work-group, taken from the innermost
    output axes whole and then a divisor of the next one; large elementwise kernels also upcast the output axis
    just outside the threads by ELEMENTS_PER_THREAD."""
    sizes = {axis: k.size(axis) or 1 for axis in k.axes_of("global")}
    total = prod(sizes.values())
    remaining = min(threads, total)
    opts = []
    for axis in sorted(sizes, reverse=True):  # (a LOCAL moves only the axes after it)
        if remaining == 1:
            break
        if sizes[axis] == 1:
            continue
        if sizes[axis] % remaining == 0:
            opts.append(Opt(OptOps.LOCAL, axis, remaining))
            remaining = 1
        elif remaining % sizes[axis] == 0:
            opts.append(Opt(OptOps.LOCAL, axis, 0))
            remaining //= sizes[axis]
        else:
            return []
    if k.has_reduce or total < MANY_ELEMENTS or total % (LOCAL_SIZE * ELEMENTS_PER_THREAD):
        return opts
    threaded = k.copy().apply_opts(opts)
    outer = [axis for axis in threaded.axes_of("global") if (threaded.size(axis) or 1) > 1]
    if not outer or (threaded.size(outer[-1]) or 1) % ELEMENTS_PER_THREAD:
        return []
    return [*opts, Opt(OptOps.UPCAST, outer[-1], ELEMENTS_PER_THREAD)]
