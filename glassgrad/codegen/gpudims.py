"""GPU launch dimensions: a kernel's loops become threads and work-groups.

In: a simplified kernel AST (global RANGEs over the output, REDUCEs over reduce RANGEs), after the kernel's opts.
Out: the AST rewritten for a GPU, the grid size (in blocks) and the block size (in threads).

A kernel with `local` or `group` loops (`Opt(LOCAL)`, `Opt(GROUP)`, from the GPU heuristic or BEAM) takes the
shape they spell (`_from_opts`): one work-group per combination of the remaining global loops, its threads the
local loops (flattened in loop order) and the group loop (innermost), whose REDUCEs become a per-thread share plus
a GROUP_REDUCE over the group's threads (with LOCAL too: several groups per work-group, each its own segment).
The heuristic writes the *flat* and *grouped* shapes below as such opts where their sizes divide.
Without such loops gpudims picks one of four shapes itself (`automatic_shape`):

* **flat**: one thread per output element. The global loops are flattened into one id
  `gidx = blockIdx.x * L + threadIdx.x` (a SPECIAL node whose value range is 0..total-1: the kernel returns early
  past the end) and each loop index becomes `(gidx // stride) % size`. Reductions, if any, are a loop per thread;
  this is right when neighbouring threads read neighbouring memory (e.g. `sum(axis=0)`, a matmul's columns).
* **grouped**: one work-group of L threads per output element, for large reductions that a thread-per-output layout
  would read with a stride (e.g. `sum(axis=1)`, a full `sum()`). Thread `l` accumulates elements `l, l+L, l+2L, ...`
  (neighbouring threads read neighbouring elements), then the group combines its L partial results through shared
  memory (`GROUP_REDUCE`), and thread 0 stores the result.
* **rows**: one work-group per row, when the reductions depend on the outer global loops only and the kernel then
  loops over the inner ones (a fused softmax: the row's max and sum, then its outputs). Each reduction is a group
  reduction that every thread reads (one may read another's result: the sum reads the max); then all threads store
  the row's outputs, thread `l` outputs `l, l+L, ...` (gated past the row's end).

Symbolic trip counts (Variables): the grid size becomes an expression the launch evaluates for the Variables'
values; a flat kernel's `gidx` takes its largest value as its range and gets the symbolic count as a source, which
the renderer checks (`if (gidx >= count) return;`); a grouped reduction's strided loop runs ceil(n / L) times and
gates every load with `l + step*L < n`.
* **tiled**: for matmul-shaped reductions (`matmul_plan`: the one REDUCE sums `x * y`, `x` independent of some output
  loops, `y` of the others). A block computes a 128 x 128 tile of outputs from tiles of both factors copied into
  shared memory (`DEFINE_LOCAL`, `BARRIER`): in float32 each of 256 threads an 8 x 8 register tile (on sm_80+,
  plain float32 factors' tiles copied by cp.async a tile ahead; with many outputs 256 x 128 tiles of 16 x 8 a
  thread, `_simt_shape`); for float16/bfloat16 with whole tiles (128 wide,
  or 64 along an axis 64 divides) on a target with tensor cores, 4 warps each a quarter of the tile with ldmatrix +
  mma.sync m16n8k16 (`FRAGMENT`, `WMMA`, `GEP`) fed by cp.async (`ASYNC_COPY`, `ASYNC_COMMIT`, `ASYNC_WAIT`), each
  side's shared tile laid out as its factor is read. With
  `tf32=True` (ALLOW_TF32=1, opt-in: it rounds the factors to 10 mantissa bits) float32 products take the same
  4 warps on mma.sync m16n8k8 .tf32 (fragments read with plain shared loads and cvt.rna.tf32), remainders included.

Every shape's 64-bit index arithmetic becomes 32-bit where it provably fits (`narrow_indices`).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from glassgrad.codegen.linearize import range_size, reduce_identity
from glassgrad.dtype import DType, dtypes
from glassgrad.helpers import prod
from glassgrad.renderer.cstyle import index_stride
from glassgrad.schedule.indexing import size_node, unflatten_index
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import substitute, unchanged_by
from glassgrad.uop.sint import sint, sint_ceildiv, sint_max, sint_prod
from glassgrad.uop.symbolic import simplify

if TYPE_CHECKING:
    from glassgrad.codegen.chained import ChainPlan

LOCAL_SIZE = 256          # threads per block (a power of two: the group reduction halves it)
GROUP_MIN_REDUCE = 256    # reductions shorter than this stay a loop per thread
FEW_OUTPUTS = 4096        # below this many outputs, a thread per output leaves the GPU mostly idle
ELEMENTS_PER_THREAD = 4   # large elementwise kernels: elements per thread (a small unrolled loop)
MANY_ELEMENTS = 1 << 20   # from this size on

Dims = tuple[int, int, int]
Grid = tuple[sint, int, int]  # blocks: a symbolic count is evaluated at launch
_INDEX_OPS = frozenset({Ops.RANGE, Ops.CONST, Ops.SPECIAL, Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.NEG,
                        Ops.XOR})


def gpu_dims(ast: UOp, local_order: tuple[UOp, ...] = (), local_size: int = LOCAL_SIZE,
             tensor_cores: bool = False, tf32: bool = False, warpgroup: bool = False) -> tuple[UOp, Grid, Dims]:
    """`local_order`: the kernel's local ranges (from `Opt(LOCAL)`), outermost first. `tensor_cores`: the target
    has mma.sync (half/bfloat16 matmuls with whole tiles use them). `tf32`: float32 matmuls may use them too, on
    factors rounded to TensorFloat-32 (ALLOW_TF32=1; ignored without tensor cores). `warpgroup`: the target has
    Hopper's warpgroup MMAs (wgmma), which tiled half/bfloat16 matmuls then use instead of mma.sync."""
    if any(u.op is Ops.RANGE and u.arg[1] in ("local", "group") for u in ast.toposort()):
        ast, global_size, local = _from_opts(ast, local_order)
    else:
        ast, global_size, local = _launch_shape(ast, local_size, tensor_cores, tensor_cores and tf32,
                                                tensor_cores and warpgroup)
    return narrow_indices(ast), global_size, local


def automatic_shape(ast: UOp, chained: bool = True) -> str:
    """The launch shape `gpu_dims` picks for a kernel without LOCAL/GROUP opts: "tiled", "rows", "grouped" or
    "flat" (the GPU heuristic turns the last two into opts where they fit). A kernel with a register tile (UPCAST,
    UNROLL) is flat: the other shapes rebuild the loops of its reductions and outputs without it."""
    nodes = ast.toposort()
    if any(u.op is Ops.RANGE and u.arg[1] in ("upcast", "unroll") for u in nodes):
        return "flat"
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    from glassgrad.codegen.chained import chain_plan  # (it builds on this module's tiles)
    if chained and chain_plan(ast, nodes, global_ranges, reduces) is not None:
        return "chained"
    if matmul_plan(ast, nodes, global_ranges, reduces) is not None:
        return "tiled"
    if reduces and _row_split(global_ranges, reduces) is not None:
        return "rows"
    if reduces and _should_group(nodes, global_ranges, reduces):
        return "grouped"
    return "flat"


def _launch_shape(ast: UOp, local_size: int, tensor_cores: bool, tf32: bool,
                  warpgroup: bool = False) -> tuple[UOp, Grid, Dims]:
    nodes = ast.toposort()
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    shape = automatic_shape(ast)
    if shape == "chained":
        from glassgrad.codegen.chained import chain_plan, chained_tiles
        if tensor_cores:
            return chained_tiles(ast, cast("ChainPlan", chain_plan(ast, nodes, global_ranges, reduces)))
        shape = automatic_shape(ast, chained=False)
    if shape == "tiled":
        return _tiled(ast, cast(MatmulPlan, matmul_plan(ast, nodes, global_ranges, reduces)), tensor_cores, tf32,
                      warpgroup)
    if shape == "rows":
        return _rows(ast, nodes, cast(tuple[list[UOp], list[UOp]], _row_split(global_ranges, reduces)), reduces,
                     local_size)
    if shape == "grouped":
        return _grouped(ast, nodes, global_ranges, reduces, local_size)
    return _flat(ast, global_ranges, local_size)


def _from_opts(ast: UOp, local_order: tuple[UOp, ...]) -> tuple[UOp, Grid, Dims]:
    """The launch shape the opts chose: one work-group per combination of the global loops (`bidx`, their flattened
    index), its threads (`lidx`) the local loops (`Opt(LOCAL)`, flattened in `local_order`) and at most one group
    loop (`Opt(GROUP)`), innermost. A REDUCE over a group loop becomes the thread's share (the other loops, strided
    by the group size) combined by a GROUP_REDUCE over the group's threads; with LOCAL threads too the work-group
    holds several groups side by side (a group per output: a short row read by neighbouring threads), each combining
    its own segment. The group's first thread stores. The split sizes divide exactly: no ids past the end."""
    nodes = ast.toposort()
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    groups = [u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "group"]
    assert set(local_order) == {u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "local"}, "local_order"
    assert len(groups) <= 1, "one GROUP per kernel (Kernel checks)"
    threads = tuple(local_order) + tuple(groups)
    blocks, sizes = _total(_sizes(global_ranges)), cast(tuple[int, ...], _sizes(threads))
    dt = _index_dtype(global_ranges or list(threads))
    bidx = UOp(Ops.SPECIAL, dt, (), ("bidx", sint_max(blocks), 1))  # a symbolic count: the grid is evaluated
    lidx = UOp(Ops.SPECIAL, dt, (), ("lidx", prod(sizes), prod(sizes)))
    if groups:
        ast = _group_loop(ast, groups[0], lidx)
        first_thread = groups[0].eq(UOp.const(dt, 0))  # every thread has its group's result; the first writes it
        ast = ast.replace(src=tuple(s.replace(src=(*s.src[:3], _both(s.src[3] if len(s.src) == 4 else None,
                                                                     first_thread)))
                                    if s.op is Ops.STORE else s for s in ast.src))
    mapping = {**dict(zip(global_ranges, unflatten_index(bidx, _sizes(global_ranges), dt))),
               **dict(zip(threads, unflatten_index(lidx, sizes, dt)))}
    return simplify(substitute(ast, mapping)), (blocks, 1, 1), (prod(sizes), 1, 1)


def _group_loop(ast: UOp, group: UOp, lidx: UOp) -> UOp:
    """Every REDUCE over the `group` loop -> GROUP_REDUCE(this thread's REDUCE over its other loops, the group
    index, the work-group's thread id), arg (op, group size, threads of the work-group); inner ones first (a
    reduction may read another)."""
    done: dict[UOp, UOp] = {}
    threads = lidx.arg[1]
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE and group in u.src[1:]):
        current = substitute(red, done)
        rest = tuple(r for r in current.src[1:] if r is not group)
        partial = current.replace(src=(current.src[0], *rest)) if rest else current.src[0]
        done[current] = UOp(Ops.GROUP_REDUCE, red.dtype, (partial, group, lidx), (red.arg, group.src[0].arg, threads))
    return substitute(ast, done)


def narrow_indices(ast: UOp) -> UOp:
    """64-bit index arithmetic -> 32-bit where every 64-bit value of the kernel is index arithmetic (loop and thread
    ids, constants, ALU ops on them) that provably stays inside int32. The scheduler picks int64 when any tensor
    of the kernel is large, e.g. the n^3 product a matmul reduces, though no index reaches that far; 32-bit
    indices take half the registers and a single instruction per multiply-add on a GPU."""
    wide = [u for u in ast.toposort() if u.dtype == dtypes.int64]
    lo, hi = dtypes.int32.min, dtypes.int32.max
    if not wide or any(u.op not in _INDEX_OPS or not lo <= u.vmin <= u.vmax <= hi for u in wide):
        return ast
    new: dict[UOp, UOp] = {}
    for u in ast.toposort():
        src = tuple(new[s] for s in u.src)
        new[u] = u.replace(dtype=dtypes.int32 if u.dtype == dtypes.int64 else u.dtype, src=src) \
            if src != u.src or u.dtype == dtypes.int64 else u
    return new[ast]




def _sizes(ranges: list[UOp] | tuple[UOp, ...]) -> tuple[sint, ...]:
    return tuple(range_size(r) for r in ranges)


def _total(sizes: tuple[sint, ...]) -> sint:
    return prod(sizes) if all(isinstance(s, int) for s in sizes) else sint_prod(sizes)  # type: ignore[arg-type]


def _reduce_size(red: UOp) -> int:
    """The trip count of a REDUCE's loops together (constant: tiled kernels take no symbolic sizes)."""
    return prod(r.src[0].arg for r in red.src[1:])


def _should_group(nodes: list[UOp], global_ranges: list[UOp], reduces: list[UOp]) -> bool:
    if max(sint_max(_total(_sizes(r.src[1:]))) for r in reduces) < GROUP_MIN_REDUCE:
        return False
    total = sint_max(_total(_sizes(global_ranges)))
    if total < FEW_OUTPUTS or not global_ranges:
        return True
    innermost = global_ranges[-1]
    loads = [u for u in nodes if u.op is Ops.LOAD]
    coalesced = all(index_stride(u.src[1], innermost) in (0, 1) for u in loads)
    return not coalesced


def _index_dtype(global_ranges: list[UOp]) -> DType:
    return global_ranges[0].dtype if global_ranges else dtypes.int32


def _flat(ast: UOp, global_ranges: list[UOp], local_size: int) -> tuple[UOp, Grid, Dims]:
    sizes = _sizes(global_ranges)
    total = _total(sizes)
    local = max(1, min(local_size, sint_max(total)))
    dt = _index_dtype(global_ranges)
    per_block = local * ELEMENTS_PER_THREAD
    if isinstance(total, UOp):  # symbolic: ids up to the largest count, the real count checked in the kernel
        gidx = UOp(Ops.SPECIAL, dt, (size_node(total, dt),), ("gidx", sint_max(total), local))
        mapping = dict(zip(global_ranges, unflatten_index(gidx, sizes, dt)))
        return simplify(substitute(ast, mapping)), (sint_ceildiv(total, local), 1, 1), (local, 1, 1)
    if total % per_block == 0 and total >= MANY_ELEMENTS and not any(u.op is Ops.REDUCE for u in ast.toposort()):
        # each thread handles several elements, a block apart (still coalesced): more loads in flight per thread
        bidx = UOp(Ops.SPECIAL, dt, (), ("bidx", total // per_block, 1))
        lidx = UOp(Ops.SPECIAL, dt, (), ("lidx", local, local))
        next_id = max((r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE), default=-1) + 1  # (upcast ones too)
        unroll = UOp(Ops.RANGE, dt, (UOp.const(dt, ELEMENTS_PER_THREAD),), (next_id, "global"))
        gidx = bidx * UOp.const(dt, per_block) + unroll * UOp.const(dt, local) + lidx
        grid = total // per_block
    else:
        gidx = UOp(Ops.SPECIAL, dt, (), ("gidx", total, local))
        grid = math.ceil(total / local)
    mapping = dict(zip(global_ranges, unflatten_index(gidx, sizes, dt)))
    return simplify(substitute(ast, mapping)), (grid, 1, 1), (local, 1, 1)


def _grouped(ast: UOp, nodes: list[UOp], global_ranges: list[UOp], reduces: list[UOp],
             local_size: int) -> tuple[UOp, Grid, Dims]:
    sizes = _sizes(global_ranges)
    total = _total(sizes)
    dt = _index_dtype(global_ranges)
    bidx = UOp(Ops.SPECIAL, dt, (), ("bidx", sint_max(total), 1))  # the grid is exactly `total` groups
    lidx = UOp(Ops.SPECIAL, dt, (), ("lidx", local_size, local_size))
    next_id = max((u.arg[0] for u in nodes if u.op is Ops.RANGE), default=-1) + 1
    # first the reductions, then the output loops everywhere
    ast = _group_reductions(ast, reduces, lidx, local_size, next_id)
    ast = substitute(ast, dict(zip(global_ranges, unflatten_index(bidx, sizes, dt))))
    # every thread computes the result; thread 0 writes it
    first_thread = lidx.eq(UOp.const(dt, 0))
    stores = tuple(s.replace(src=(*s.src[:3], first_thread)) if s.op is Ops.STORE else s for s in ast.src)
    return simplify(ast.replace(src=stores)), (total, 1, 1), (local_size, 1, 1)


def _row_split(global_ranges: list[UOp], reduces: list[UOp]) -> tuple[list[UOp], list[UOp]] | None:
    """(row loops, loops over a row) when the reductions depend on the outer global loops only and the kernel loops
    over the inner ones after them (a fused softmax: max and sum per row, then the row's outputs); else None."""
    used = {u for red in reduces for u in red.toposort() if u.op is Ops.RANGE and u.arg[1] == "global"}
    outer, inner = [r for r in global_ranges if r in used], [r for r in global_ranges if r not in used]
    loops = [*global_ranges, *(r for red in reduces for r in red.src[1:])]
    if not inner or global_ranges != outer + inner or any(r.src[0].op is not Ops.CONST for r in loops):
        return None  # (a row's group size is chosen from constant lengths)
    return outer, inner


def _rows(ast: UOp, nodes: list[UOp], rows: tuple[list[UOp], list[UOp]], reduces: list[UOp],
          local_size: int) -> tuple[UOp, Grid, Dims]:
    """One work-group per row: every reduction is a group reduction whose result all threads read, then the
    threads store the row's outputs in a loop strided by the group size (thread l: outputs l, l+L, ...)."""
    outer, inner = rows
    outer_sizes, inner_sizes = _sizes(outer), _sizes(inner)
    row_length = max([cast(int, _total(inner_sizes))] + [_reduce_size(r) for r in reduces])
    local = min(local_size, max(32, 1 << (row_length - 1).bit_length()))
    dt = _index_dtype(outer + inner)
    bidx = UOp(Ops.SPECIAL, dt, (), ("bidx", cast(int, _total(outer_sizes)), 1))
    lidx = UOp(Ops.SPECIAL, dt, (), ("lidx", local, local))
    next_id = max(u.arg[0] for u in nodes if u.op is Ops.RANGE) + 1
    ast = _group_reductions(ast, reduces, lidx, local, next_id)
    count = cast(int, _total(inner_sizes))
    step = UOp(Ops.RANGE, dt, (UOp.const(dt, -(-count // local)),), (next_id + len(reduces), "global"))
    flat = step * UOp.const(dt, local) + lidx
    ast = substitute(ast, {**dict(zip(outer, unflatten_index(bidx, outer_sizes, dt))),
                           **dict(zip(inner, unflatten_index(flat, inner_sizes, dt)))})
    if count % local:  # the last step runs past the row: its loads and stores are gated off
        valid = flat < UOp.const(dt, count)
        ast = _gate_loads(ast, valid)
        ast = ast.replace(src=tuple(s.replace(src=(*s.src[:3], valid)) if s.op is Ops.STORE else s for s in ast.src))
    return simplify(ast), (_total(outer_sizes), 1, 1), (local, 1, 1)


def _group_reductions(ast: UOp, reduces: list[UOp], lidx: UOp, local_size: int, first_id: int) -> UOp:
    """Every REDUCE (listed sources first) -> a group reduction, also one that reads another (softmax's sum reads
    the max). The rewrite runs bottom-up, so each is keyed by its form once the reductions inside it are grouped.
    A REDUCE inside another's value that varies with the outer one's loops (a chained kernel's scores, where no
    tensor cores take it) stays a loop of each thread: the group's threads split the outer loop between them."""
    inner = {u for red in reduces for u in red.src[0].toposort()
             if u.op is Ops.REDUCE and any(r in u.toposort() for r in red.src[1:])}
    grouped: dict[UOp, UOp] = {}
    for i, red in enumerate(r for r in reduces if r not in inner):
        current = substitute(red, grouped)
        grouped[current] = _group_reduce(current, lidx, local_size, first_id + i)
    return substitute(ast, grouped)


def _group_reduce(red: UOp, lidx: UOp, local_size: int, range_id: int) -> UOp:
    """REDUCE over ranges -> each thread reduces a strided share, then GROUP_REDUCE combines the group's shares."""
    value, ranges = red.src[0], red.src[1:]
    sizes = _sizes(ranges)
    size = _total(sizes)
    dt = lidx.dtype
    step = UOp(Ops.RANGE, dt, (size_node(sint_ceildiv(size, local_size), dt),), (range_id, "reduce"))
    flat = step * UOp.const(dt, local_size) + lidx
    value = substitute(value, dict(zip(ranges, unflatten_index(flat, sizes, dt))))
    if isinstance(size, UOp) or size % local_size:
        valid = flat < size_node(size, dt)
        value = _gate_loads(value, valid)
        value = valid.where(value, UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)))
    partial = UOp(Ops.REDUCE, red.dtype, (value, step), red.arg)
    return UOp(Ops.GROUP_REDUCE, red.dtype, (partial, lidx, lidx), (red.arg, local_size, local_size))


def _gate_loads(value: UOp, valid: UOp) -> UOp:
    """Loads past the end of the reduction must not happen: add `valid` to every load's gate."""
    inside = value.toposort(stop=lambda u: u.op is Ops.GROUP_REDUCE)  # a reduction read here keeps its own gates
    return substitute(value, {u: _gate_load(u, valid) for u in inside if u.op is Ops.LOAD})


def _gate_load(load: UOp, valid: UOp) -> UOp:
    old = load.src[2] if len(load.src) == 3 else None
    return load.replace(src=(load.src[0], load.src[1], valid if old is None else old.alu(Ops.AND, valid)))


# ---------------------------------------------------------------- tiled: matmul-shaped reductions
TILE = 128            # outputs per block along a tile axis (16 threads of 8 each: 16 x 16 = 256 threads)
NARROW_TILE = 32      # ... along an axis shorter than MIN_SIDE (4 threads of 8: a conv's 32 channels)
TILE_K = 8            # reduction elements per shared-memory tile
PAD = 4               # floats added to each shared-memory row: the transposing stores hit distinct banks
MIN_SIDE = 64         # one tile axis at least this long, the other at least NARROW_TILE, the reduction TILE_K
PER_THREAD = 8        # outputs per thread along each axis: two groups of 4, half a tile apart
ASYNC_TILE_K = 16     # ... with cp.async: a tile of 16 in flight while one is multiplied (two stages, 33 KB)
SIMT_STAGES = 2
WIDE_TILE = 256       # float32 products with many tiles: 256 x 128 tiles, 16 x 8 outputs a thread (`_simt_shape`)
WIDE_TILE_K = 8
WIDE_STAGES = 3       # 3 x 8 x (260 + 132) floats: 37.6 KB
WIDE_MIN_BLOCKS = 264  # two 256 x 128 tiles per multiprocessor of an H100/H200 (132)


@dataclass(frozen=True)
class Operand:
    """One factor of a matmul-shaped product, and the output loops it varies with (its tile axis)."""
    value: UOp
    ranges: tuple[UOp, ...]
    fixed_tile: int = 0  # the tile along this axis when a variant fixes it (tensor cores: 64 or 128), else 0

    @property
    def size(self) -> int:
        return prod(r.src[0].arg for r in self.ranges)

    @property
    def tile(self) -> int:
        """Outputs of a block along this axis."""
        return self.fixed_tile or (TILE if self.size >= MIN_SIDE else NARROW_TILE)


@dataclass(frozen=True)
class MatmulPlan:
    store: UOp
    reduce: UOp
    rows: Operand        # tile axis of threadIdx / 16 (the factor that does not vary with `cols`)
    cols: Operand        # tile axis of threadIdx % 16: holds the output's contiguous loop when there is one
    batch: tuple[UOp, ...]  # output loops both factors vary with: one block per combination

    @property
    def k_ranges(self) -> tuple[UOp, ...]:
        return self.reduce.src[1:]


def matmul_plan(ast: UOp, nodes: list[UOp], global_ranges: list[UOp], reduces: list[UOp]) -> MatmulPlan | None:
    """A kernel whose one REDUCE sums `x * y`, where `x` does not vary with some output loops and `y` does not vary
    with the others (a matmul, a convolution, a batched matmul): each factor is then reused across a whole axis of
    outputs, which a block of threads can share through shared memory. None for any other kernel."""
    stores = [s for s in ast.src if s.op is Ops.STORE]
    if len(reduces) != 1 or len(stores) != 1 or any(isinstance(range_size(r), UOp) for r in nodes if r.op is Ops.RANGE):
        return None  # (tiles need constant trip counts)
    red = reduces[0]
    value, conditions = _masked(_exact_product(red.src[0]))
    if red.arg is not Ops.ADD or not red.dtype.is_float or value.op is not Ops.MUL or red.dtype.itemsize > 4:
        return None
    x, y = value.src
    x_ranges, y_ranges = set(x.toposort()), set(y.toposort())
    if conditions is not None:  # the mask goes with the factor that varies with the same output loops
        masked_ranges = {r for r in conditions.toposort() if r in global_ranges}
        if masked_ranges <= x_ranges:
            x = conditions.where(x, UOp.const(x.dtype, 0))
        elif masked_ranges <= y_ranges:
            y = conditions.where(y, UOp.const(y.dtype, 0))
        else:
            return None
    only_x = tuple(r for r in global_ranges if r in x_ranges and r not in y_ranges)
    only_y = tuple(r for r in global_ranges if r in y_ranges and r not in x_ranges)
    batch = tuple(r for r in global_ranges if r not in only_x and r not in only_y)
    if not only_x or not only_y:
        return None
    rows, cols = Operand(x, only_x), Operand(y, only_y)
    if min(rows.size, cols.size) < NARROW_TILE or max(rows.size, cols.size) < MIN_SIDE or _reduce_size(red) < TILE_K:
        return None
    contiguous = global_ranges[-1] if index_stride(stores[0].src[1], global_ranges[-1]) == 1 else None
    if contiguous in rows.ranges:
        rows, cols = cols, rows
    return MatmulPlan(stores[0], red, rows, cols, batch)


def _masked(value: UOp) -> tuple[UOp, UOp | None]:
    """where(c1, where(c2, v, 0), 0) -> (v, c1 & c2): a product inside a pad's mask (a convolution's input
    gradient sums the taps inside the input). Its tiles hold where(c, x, 0) * y instead, as a padded convolution's
    do: the same unless y is infinite or NaN where c is off."""
    condition: UOp | None = None
    while value.op is Ops.WHERE and value.src[2].op is Ops.CONST and value.src[2].arg == 0:
        condition = value.src[0] if condition is None else condition.alu(Ops.AND, value.src[0])
        value = value.src[1]
    return value, condition


def _exact_product(value: UOp) -> UOp:
    """float16/bfloat16 products are computed in float32 and rounded back (`float(half(x * y))`): a tiled kernel
    accumulates the exact float32 product instead, as cuBLAS and the tensor cores do."""
    if value.op is Ops.CAST and value.src[0].op is Ops.CAST and value.src[0].src[0].op is Ops.MUL \
            and value.dtype == value.src[0].src[0].dtype and value.src[0].dtype.itemsize < value.dtype.itemsize:
        return value.src[0].src[0]
    return value


@dataclass(frozen=True)
class _Block:
    """What both tiled variants share: the ids, the block's tile coordinates and the reduction's loops."""
    dt: DType
    blocks: int
    threads: int
    lidx: UOp
    row_tile: UOp
    col_tile: UOp
    batch_map: dict[UOp, UOp]
    k_outer: UOp
    k_inner: UOp
    k_size: int


def _block(plan: MatmulPlan, tile_k: int, k_inner_size: int, threads: int) -> _Block:
    dt = plan.store.src[1].dtype
    tiles = (math.ceil(plan.rows.size / plan.rows.tile), math.ceil(plan.cols.size / plan.cols.tile))
    batch_sizes = tuple(r.src[0].arg for r in plan.batch)
    blocks = prod(batch_sizes) * tiles[0] * tiles[1]
    bidx = UOp(Ops.SPECIAL, dt, (), ("bidx", blocks, 1))
    lidx = UOp(Ops.SPECIAL, dt, (), ("lidx", threads, threads))
    *batch_ids, row_tile, col_tile = unflatten_index(bidx, (*batch_sizes, *tiles), dt)
    next_id = max((r.arg[0] for r in plan.store.toposort() if r.op is Ops.RANGE), default=-1) + 1
    k_size = _reduce_size(plan.reduce)
    k_outer = UOp(Ops.RANGE, dt, (UOp.const(dt, math.ceil(k_size / tile_k)),), (next_id, "reduce"))
    k_inner = UOp(Ops.RANGE, dt, (UOp.const(dt, k_inner_size),), (next_id + 1, "unroll"))
    return _Block(dt, blocks, threads, lidx, row_tile, col_tile, dict(zip(plan.batch, batch_ids)), k_outer, k_inner,
                  k_size)


Unchanged = tuple[dict[UOp, UOp], dict[UOp, UOp]]


def _output(plan: MatmulPlan, b: _Block, result: UOp, row: UOp, col: UOp, unchanged: Unchanged | None = None) -> UOp:
    """The kernel's STORE (and whatever it computes from the reduction) for output (row, col) of the tile.
    `unchanged`: `_output_unchanged` of the results (the same STORE, faster)."""
    first, loops = unchanged if unchanged is not None else (None, None)
    store = substitute(plan.store, {plan.reduce: result}, first)  # first the REDUCE (while it matches), then the loops
    store = substitute(store, {**b.batch_map, **_positions(plan.rows, row), **_positions(plan.cols, col)}, loops)
    valid = _both(_inside(plan.rows, row), _inside(plan.cols, col))
    return store if valid is None else store.replace(src=(*store.src[:3], valid))


def _output_unchanged(plan: MatmulPlan, b: _Block, results: list[UOp]) -> Unchanged:
    """What `_output`'s two substitutions leave as it is in the kernel's STORE and in `results` (the accumulators
    of all outputs: they share the tile copies), found once instead of walked in each output's substitutions."""
    roots = [plan.store, *results]
    return unchanged_by(roots, {plan.reduce}), \
        unchanged_by(roots, {*b.batch_map, *plan.rows.ranges, *plan.cols.ranges})


@dataclass(frozen=True)
class _SimtTiles:
    """Where the float32 tiles of `_tiled` lie in shared memory: per stage, the rows factor's tile then the columns
    factor's, each k-major ([k][position], rows padded by PAD so the transposing stores hit distinct banks)."""
    plan: MatmulPlan
    tile_k: int
    stages: int

    @property
    def strides(self) -> tuple[int, int]:
        return self.plan.rows.tile + PAD, self.plan.cols.tile + PAD

    @property
    def size(self) -> int:
        return self.stages * self.tile_k * sum(self.strides)

    def at(self, side: int, k_tile: UOp, pos: UOp, kk: UOp) -> UOp:
        """The shared index of position `pos`, k `kk` of factor `side`'s tile in k tile `k_tile`'s stage."""
        dt, strides = pos.dtype, self.strides
        stage = k_tile % UOp.const(dt, self.stages)
        start = stage * UOp.const(dt, self.tile_k * sum(strides)) + UOp.const(dt, side * self.tile_k * strides[0])
        return start + kk * UOp.const(dt, strides[side]) + pos

    def copies(self, b: _Block, k_tile: UOp, elementwise: tuple[bool, bool] = (False, False)) \
            -> list[list[tuple[UOp, UOp]]]:
        """Per factor: (shared index, value) of this thread's share of k tile `k_tile` (`elementwise`: per factor,
        single elements a thread, for 4-byte asynchronous copies)."""
        plan = self.plan
        sides = zip((plan.rows, plan.cols), (b.row_tile, b.col_tile), (plan.rows.value, plan.cols.value))
        return [[(self.at(side, k_tile, *position), element)
                 for position, element in _tile_copy(operand, value, tile, b, plan.k_ranges, self.tile_k, k_tile,
                                                     elementwise[side])]
                for side, (operand, tile, value) in enumerate(sides)]


def _tiled(ast: UOp, plan: MatmulPlan, tensor_cores: bool, tf32: bool = False,
           warpgroup: bool = False) -> tuple[UOp, Dims, Dims]:
    """Each block computes a TILE x TILE tile of outputs (NARROW_TILE along an axis shorter than MIN_SIDE: 64
    threads), each thread an 8 x 8 register tile of it (one REDUCE per output: the linearizer gives them one loop).
    Per k step the block copies both factors' tiles into shared memory, then every thread reads its 8 + 8 factors
    per k from there. Where both factors are plain float32 loads and the target has cp.async (`tensor_cores`: sm_80
    and later), the copies are asynchronous, tiles of ASYNC_TILE_K in SIMT_STAGES stages (16-byte runs where a
    factor is read along its tile axis, else an element each): the next tile's loads are in flight while this one
    is multiplied, which a block that waits for each tile's loads cannot do. Otherwise they go through registers,
    TILE_K at a time, double-buffered (one barrier per step). Tiles past the end of an axis read zeros and store
    nothing."""
    if tensor_cores and (kind := _tensor_core_kind(plan, tf32)) is not None:
        return _tensor_core_tiled(ast, plan, kind, warpgroup)
    shape = _simt_shape(plan, tensor_cores)
    plan, row_per = shape.plan, shape.row_per
    row_tile, col_tile = plan.rows.tile, plan.cols.tile
    col_threads = col_tile // PER_THREAD
    tiles, b, asynchronous = shape.tiles, shape.block, shape.asynchronous
    if not asynchronous:  # through registers: TILE_K a step, double-buffered
        b = _block(plan, TILE_K, TILE_K, b.threads) if tiles.tile_k != TILE_K else b
        tiles = _SimtTiles(plan, TILE_K, 2)
    dt = b.dt
    smem = UOp(Ops.DEFINE_LOCAL, plan.reduce.dtype, (), (0, tiles.size))
    if asynchronous:
        reader = _async_pipeline(smem, b, lambda k_tile: tiles.copies(b, k_tile, shape.elementwise), tiles.stages,
                                 tiles.tile_k)
    else:
        stores = [UOp(Ops.STORE, dtypes.void, (smem, index, element))
                  for group in tiles.copies(b, b.k_outer) for index, element in group]
        reader = UOp(Ops.BARRIER, smem.dtype, (smem, *stores))
    ty, tx = b.lidx // UOp.const(dt, col_threads), b.lidx % UOp.const(dt, col_threads)

    def own(thread: UOp, i: int, tile: int, per: int) -> UOp:  # the i-th of a thread's `per` positions along an axis
        return UOp.const(dt, (i // 4) * (tile // (per // 4)) + i % 4) + thread * UOp.const(dt, 4)

    row_factors = [UOp(Ops.LOAD, smem.dtype, (reader, tiles.at(0, b.k_outer, own(ty, i, row_tile, row_per),
                                                                  b.k_inner))) for i in range(row_per)]
    col_factors = [UOp(Ops.LOAD, smem.dtype, (reader, tiles.at(1, b.k_outer, own(tx, j, col_tile, PER_THREAD),
                                                                  b.k_inner))) for j in range(PER_THREAD)]
    reds = {(i, j): UOp(Ops.REDUCE, plan.reduce.dtype, (row_factors[i] * col_factors[j], b.k_outer, b.k_inner),
                        Ops.ADD) for i in range(row_per) for j in range(PER_THREAD)}
    unchanged = _output_unchanged(plan, b, list(reds.values()))
    outputs = [_output(plan, b, red, b.row_tile * UOp.const(dt, row_tile) + own(ty, i, row_tile, row_per),
                       b.col_tile * UOp.const(dt, col_tile) + own(tx, j, col_tile, PER_THREAD), unchanged)
               for (i, j), red in reds.items()]
    sink = ast.replace(src=(*outputs, *(s for s in ast.src if s is not plan.store)))
    return simplify(sink), (b.blocks, 1, 1), (b.threads, 1, 1)


@dataclass(frozen=True)
class _SimtShape:
    """The float32 tiles `_tiled` takes: the plan (with its row tile), a thread's outputs along the rows, the shared
    tiles, the block, and whether the copies are asynchronous."""
    plan: MatmulPlan
    row_per: int
    tiles: _SimtTiles
    block: _Block
    asynchronous: bool
    elementwise: tuple[bool, bool]  # per factor: copied by 4-byte copies, a single element per thread at a time


def _simt_shape(plan: MatmulPlan, tensor_cores: bool) -> _SimtShape:
    """A 128 x 128 tile, 8 x 8 outputs a thread (two tiles of 16 k in flight with cp.async); or, for a product of
    plain float32 factors with enough outputs that its 256 x 128 tiles still give every multiprocessor two
    (WIDE_MIN_BLOCKS), 16 x 8 outputs a thread in 256-row tiles, three tiles of 8 k in flight (cuBLAS's float32
    shape on Hopper: 24 factors read per k for 128 multiply-adds instead of 16 for 64)."""
    def shape(candidate: MatmulPlan, row_per: int, tile_k: int, stages: int) -> _SimtShape:
        threads = candidate.rows.tile // row_per * candidate.cols.tile // PER_THREAD
        tiles = _SimtTiles(candidate, tile_k if _reduce_size(candidate.reduce) >= tile_k else TILE_K, stages)
        b = _block(candidate, tiles.tile_k, tiles.tile_k, threads)
        groups = tiles.copies(b, b.k_outer)
        # (else 16-byte runs: 4 float32 or 8 half elements, as `_async_copies` copies them)
        elementwise = tuple(_copy_runs(group, 16 // group[0][1].dtype.itemsize) is None for group in groups)
        asynchronous = tensor_cores and all(not each or all(_gathered(value) is not None for _, value in group)
                                            for group, each in zip(groups, elementwise)) and \
            all(each or _copy_runs(group, 16 // group[0][1].dtype.itemsize) is not None
                for k in _pipeline_k_tiles(b, stages) for group, each in zip(tiles.copies(b, k), elementwise))
        return _SimtShape(candidate, row_per, tiles, b, asynchronous, cast(tuple[bool, bool], elementwise))
    if tensor_cores and plan.rows.size >= WIDE_TILE and plan.cols.tile == TILE and \
            _reduce_size(plan.reduce) >= WIDE_TILE_K and \
            prod(r.src[0].arg for r in plan.batch) * math.ceil(plan.rows.size / WIDE_TILE) * \
            math.ceil(plan.cols.size / TILE) >= WIDE_MIN_BLOCKS:
        wide = shape(replace(plan, rows=replace(plan.rows, fixed_tile=WIDE_TILE)), 2 * PER_THREAD, WIDE_TILE_K,
                     WIDE_STAGES)
        if wide.asynchronous:
            return wide
    return shape(plan, PER_THREAD, ASYNC_TILE_K, SIMT_STAGES)


def _pipeline_k_tiles(b: _Block, stages: int) -> list[UOp]:
    """The k tiles `_async_pipeline` copies, spelled as it spells them: the first `stages - 1` by their constant
    index, then `k + stages - 1` in step k. A factor whose copies form 16-byte runs at a symbolic step can fail to
    at a constant one (a convolution's input gradient, whose taps' bounds fold differently)."""
    return [UOp.const(b.dt, t) for t in range(stages - 1)] + [b.k_outer + UOp.const(b.dt, stages - 1)]


def _async_pipeline(smem: UOp, b: _Block, copies: Callable[[UOp], list[list[tuple[UOp, UOp]]]], stages: int,
                    tile_k: int, proxy_fence: bool = False) -> UOp:
    """The shared buffer as step `b.k_outer` reads it, filled by cp.async `stages` tiles deep: tiles 0..S-2 before
    the loop; in step k, wait for tile k, a barrier (tile k landed for every thread, and every thread is done with
    tile k-1, whose stage tile k+S-1 takes), then start tile k+S-1. `copies(k_tile)`: the (shared index, value)
    pairs of tile `k_tile` in its stage, in groups each copied in 16-byte runs or element by element
    (`_async_copies`). `proxy_fence`: the tiles are read by warpgroup MMAs (the async proxy), so each thread's
    wait also fences its copies for them."""
    dt = b.dt
    tiles = math.ceil(b.k_size / tile_k)
    committed = smem
    for t in range(stages - 1):  # S-1 groups (empty past the last tile): the wait below counts on them
        first = [c for group in copies(UOp.const(dt, t)) for c in _async_copies(committed, group, None)] \
            if t < tiles else []
        committed = UOp(Ops.ASYNC_COMMIT, smem.dtype, (committed, *first))
    wait = UOp(Ops.ASYNC_WAIT, smem.dtype, (committed, b.k_outer), (stages - 2, True) if proxy_fence else stages - 2)
    barrier = UOp(Ops.BARRIER, smem.dtype, (wait,))
    ahead = b.k_outer + UOp.const(dt, stages - 1)
    later = [c for group in copies(ahead) for c in _async_copies(barrier, group, ahead < UOp.const(dt, tiles))]
    return UOp(Ops.ASYNC_COMMIT, smem.dtype, (barrier, *later))


# tensor cores: mma.sync m16n8k16 (float16/bfloat16 in) or m16n8k8 (tf32 in), float32 accumulators
ASYNC_STAGES = 3        # tiles in shared memory with cp.async: two in flight while one is multiplied (48 KB)
WARPS = (2, 2)          # warps of a block along rows and columns; each computes a quarter of the tile (64 x 64)
TC_NARROW = 64          # the tile along an axis that 64 divides and TILE does not
MMA_M, MMA_N = 16, 8
CHUNK_BYTES = 16        # the unit of cp.async, of an ldmatrix row, and of the swizzle


@dataclass(frozen=True)
class TensorCoreKind:
    """What differs between the tensor-core tiles: the factors' dtype in shared memory, the k of one mma, and the k
    of one shared-memory tile (64-byte rows of the rows factor in both kinds: the swizzle is the same)."""
    dtype: DType
    mma_k: int
    tile_k: int

    @property
    def chunk(self) -> int:
        """Elements in 16 bytes."""
        return CHUNK_BYTES // self.dtype.itemsize

    @property
    def tf32(self) -> bool:
        return self.dtype == dtypes.float32


TF32 = TensorCoreKind(dtypes.float32, 8, 16)


def _tensor_core_kind(plan: MatmulPlan, tf32: bool) -> tuple[TensorCoreKind, UOp, UOp] | None:
    """(kind, the two values its tiles hold) when the tiled kernel `plan` can run on the tensor cores: half/bfloat16
    factors with whole tiles (m16n8k16), or with `tf32` float32 factors (m16n8k8, any sizes); None otherwise."""
    if (operands := _tensor_core_operands(plan)) is not None:
        return TensorCoreKind(operands[0].dtype, 16, 32), *operands
    if tf32 and _tf32_operands(plan):
        return TF32, plan.rows.value, plan.cols.value
    return None


def _tensor_core_operands(plan: MatmulPlan) -> tuple[UOp, UOp] | None:
    """The float16/bfloat16 values a tensor-core tile multiplies, when the product is `float(x) * float(y)` of one
    such dtype and every tile is whole (no remainders: the fragments have no gates)."""
    x, y = plan.rows.value, plan.cols.value
    if x.op is not Ops.CAST or y.op is not Ops.CAST or x.src[0].dtype != y.src[0].dtype:
        return None
    if x.src[0].dtype not in (dtypes.float16, dtypes.bfloat16) or plan.reduce.dtype != dtypes.float32:
        return None
    if not _tc_tile(plan.rows.size) or not _tc_tile(plan.cols.size) or _reduce_size(plan.reduce) % 32:
        return None
    return x.src[0], y.src[0]


def _tc_tile(size: int) -> int:
    """A tensor-core tile's extent along an axis of `size` outputs: TILE where it divides, else TC_NARROW (an
    attention head's 64: `softmax(q k^T) @ v`, and the gradients of q, k and v), else 0 (not on the tensor cores)."""
    return TILE if size % TILE == 0 else TC_NARROW if size % TC_NARROW == 0 else 0


def _tf32_operands(plan: MatmulPlan) -> bool:
    """A float32 product of float32 factors (not widened halves: those stay exact) summed in float32, both tile axes
    TILE wide (64 outputs or more). Remainders are fine: the tiles copied into shared memory hold zeros past the
    ends, the fragments read whole tiles there, and the stores past the ends are gated off."""
    x, y = plan.rows.value, plan.cols.value
    if plan.reduce.dtype != dtypes.float32 or x.dtype != dtypes.float32 or y.dtype != dtypes.float32:
        return False
    return plan.rows.tile == plan.cols.tile == TILE and not _widened(x) and not _widened(y)


def _widened(value: UOp) -> bool:
    """`value` (under a pad's masks) is a float16/bfloat16 value cast to float32."""
    while value.op is Ops.WHERE and value.src[2].op is Ops.CONST:
        value = value.src[1]
    return value.op is Ops.CAST and value.src[0].dtype in (dtypes.float16, dtypes.bfloat16)


def _tensor_core_tiled(ast: UOp, plan: MatmulPlan, tc: tuple[TensorCoreKind, UOp, UOp],
                       warpgroup: bool = False) -> tuple[UOp, Dims, Dims]:
    """Like `_tiled`, but the 4 warps of a block each multiply a quarter of the tile on the tensor cores (64 x 64 of
    128 x 128; 64 x 32 of a tile 64 wide along the columns, as an attention head's): per mma k-step a warp loads its
    row and column fragments from shared memory (ldmatrix for halves, plain loads for tf32) and issues one mma.sync
    per 16 x 8 part of its quarter (4 x 8 of them for 64 x 64), each adding a 16 x 8 product into 4 float32
    accumulators per thread (one REDUCE per mma tile, whose value is a WMMA; GEP picks an accumulator for the output
    it holds). Plain contiguous factors are copied with cp.async, ASYNC_STAGES tiles deep; others through registers,
    double-buffered. With `warpgroup` (Hopper) halves copied by cp.async are multiplied by warpgroup MMAs instead
    (`_warpgroup_products`)."""
    kind, x, y = tc
    if not kind.tf32:  # whole tiles of 128 or 64 (tf32 tiles are TILE wide, with remainders)
        plan = replace(plan, rows=replace(plan.rows, fixed_tile=_tc_tile(plan.rows.size)),
                       cols=replace(plan.cols, fixed_tile=_tc_tile(plan.cols.size)))
    widths = (plan.rows.tile, plan.cols.tile)
    b = _block(plan, kind.tile_k, kind.tile_k // kind.mma_k, 32 * WARPS[0] * WARPS[1])
    layout = _TileAt(kind, 2, b.k_outer, widths, _tc_k_major(plan, kind, (x, y)))  # (stages and stage: set below)
    sample = _tc_copies(plan, b, layout, (x, y), b.k_outer)
    # cp.async: 16-byte runs, or (float32) one gathered element each, zero-filled where its gate is off
    asynchronous = _copy_runs(sample, kind.chunk) is not None or \
        (kind.tf32 and all(_gathered(value) is not None for _, value in sample))
    if asynchronous and not kind.tf32:  # (runs at a symbolic step, and at the pipeline's first, constant, steps too)
        asynchronous = all(_copy_runs(_tc_copies(plan, b, layout, (x, y), k), kind.chunk) is not None
                           for k in _pipeline_k_tiles(b, ASYNC_STAGES))
    warpgroup = warpgroup and asynchronous and not kind.tf32
    if warpgroup:  # one warpgroup MMA step is the whole k tile (two k16 halves)
        kind = replace(kind, mma_k=kind.tile_k)
        b = _block(plan, kind.tile_k, 1, 32 * WARPS[0] * WARPS[1])
    stages = ASYNC_STAGES if asynchronous else 2
    layout = replace(layout, kind=kind, stages=stages, atom=WGMMA_ATOM if warpgroup else 0)
    smem = UOp(Ops.DEFINE_LOCAL, x.dtype, (), (0, stages * sum(widths) * kind.tile_k))
    if not asynchronous:
        stores = [UOp(Ops.STORE, dtypes.void, (smem, i, v)) for i, v in _tc_copies(plan, b, layout, (x, y), b.k_outer)]
        reader = UOp(Ops.BARRIER, smem.dtype, (smem, *stores))
    else:
        reader = _async_pipeline(smem, b, lambda k_tile: [_tc_copies(plan, b, layout, (x, y), k_tile)], stages,
                                 kind.tile_k, proxy_fence=warpgroup)
    at = replace(layout, stage=b.k_outer % UOp.const(b.dt, stages))
    results = _warpgroup_products(reader, at, b) if warpgroup else _warp_products(reader, at, b)
    unchanged = _output_unchanged(plan, b, [acc for acc, _, _ in results])
    outputs = _staged_outputs(plan, b, smem, widths, results, unchanged) or \
        [_output(plan, b, acc, b.row_tile * UOp.const(b.dt, widths[0]) + row,
                 b.col_tile * UOp.const(b.dt, widths[1]) + col, unchanged) for acc, row, col in results]
    sink = ast.replace(src=(*outputs, *(s for s in ast.src if s is not plan.store)))
    return simplify(sink), (b.blocks, 1, 1), (b.threads, 1, 1)


def _warp_products(reader: UOp, at: _TileAt, b: _Block) -> list[tuple[UOp, UOp, UOp]]:
    """(accumulator, row, column in the tile) of every output of this thread: each warp's quarter of the tile as
    mma.sync tiles of 16 x 8, fed by fragments read from the shared tiles."""
    dt, kind = b.dt, at.kind
    warp, lane = b.lidx // UOp.const(dt, 32), b.lidx % UOp.const(dt, 32)
    warp_row = (warp // UOp.const(dt, WARPS[1])) * UOp.const(dt, at.widths[0] // WARPS[0])
    warp_col = (warp % UOp.const(dt, WARPS[1])) * UOp.const(dt, at.widths[1] // WARPS[1])
    k0 = b.k_inner * UOp.const(dt, kind.mma_k)
    row_frags, col_frags = (_tf32_fragments if kind.tf32 else _half_fragments)(reader, at, warp_row, warp_col, lane, k0)
    results: list[tuple[UOp, UOp, UOp]] = []
    for i in range(len(row_frags)):
        for j in range(at.n_tiles):
            # a half col fragment holds two 16 x 8 column tiles (WMMA's arg: which), a tf32 one a single tile
            col_frag, half = (col_frags[j], 0) if kind.tf32 else (col_frags[j // 2], j % 2)
            mma = UOp(Ops.WMMA, dtypes.float32, (row_frags[i], col_frag), half)
            red = UOp(Ops.REDUCE, dtypes.float32, (mma, b.k_outer, b.k_inner), Ops.ADD)
            for e in range(4):  # accumulator e holds row lane/4 (+8 for e >= 2), column 2*(lane%4) + e%2
                row = warp_row + UOp.const(dt, i * MMA_M + 8 * (e // 2)) + lane // UOp.const(dt, 4)
                col = warp_col + UOp.const(dt, j * MMA_N + e % 2) + (lane % UOp.const(dt, 4)) * UOp.const(dt, 2)
                results.append((UOp(Ops.GEP, dtypes.float32, (red,), e), row, col))
    return results


WGMMA_M = 64     # rows of one warpgroup MMA
WGMMA_ATOM = 64  # positions per block of a [k][position] side read by warpgroup MMAs: 128 bytes, the swizzle's width


def _warpgroup_products(reader: UOp, at: _TileAt, b: _Block) -> list[tuple[UOp, UOp, UOp]]:
    """(accumulator, row, column in the tile) of every output of this thread when the block's 4 warps (one
    warpgroup) multiply the shared tiles with wgmma: per 64 rows of the tile one m64nN MMA over the tile's whole
    width N (128 or 64), k 32 a step (two k16 MMAs), reading both sides from shared memory by descriptor
    (`_TileAt.descriptor`). Thread t of warp w holds N/2 accumulators; accumulator r is row 16w + t/4 (+8 for
    r%4 >= 2), column 8(r/4) + 2(t%4) + r%2: per 8 columns, mma.sync's m16n8 layout."""
    dt = b.dt
    warp, lane = b.lidx // UOp.const(dt, 32), b.lidx % UOp.const(dt, 32)
    zero = UOp.const(dt, 0)
    (row_arg, row_step), (col_arg, col_step) = at.descriptor(0), at.descriptor(1)
    col_desc = UOp(Ops.FRAGMENT, at.kind.dtype, (reader, at(1, zero, zero)), col_arg)
    results: list[tuple[UOp, UOp, UOp]] = []
    for half in range(at.widths[0] // WGMMA_M):
        row_desc = UOp(Ops.FRAGMENT, at.kind.dtype, (reader, at(0, UOp.const(dt, half * WGMMA_M), zero)), row_arg)
        mma = UOp(Ops.WMMA, dtypes.float32, (row_desc, col_desc),
                  ("wgmma", at.widths[1], at.k_major[0], at.k_major[1], row_step, col_step))
        red = UOp(Ops.REDUCE, dtypes.float32, (mma, b.k_outer, b.k_inner), Ops.ADD)
        for r in range(at.widths[1] // 2):
            row = UOp.const(dt, half * WGMMA_M + 8 * ((r % 4) // 2)) + warp * UOp.const(dt, 16) + \
                lane // UOp.const(dt, 4)
            col = UOp.const(dt, 8 * (r // 4) + r % 2) + (lane % UOp.const(dt, 4)) * UOp.const(dt, 2)
            results.append((UOp(Ops.GEP, dtypes.float32, (red,), r), row, col))
    return results


Fragments = tuple[list[UOp], list[UOp]]
RUN_BYTES = 16     # a staged tile leaves shared memory in runs of 16 bytes (one uint4 per lane)
STAGED_PAD = 8     # elements of padding per staged row: rows stay 16-byte aligned, and a fragment's 8 rows of
                   # 2-byte pairs land in 8 different bank groups (row stride 68 words for a 128-wide tile)


def _staged_outputs(plan: MatmulPlan, b: _Block, smem: UOp, widths: tuple[int, int],
                    results: list[tuple[UOp, UOp, UOp]], unchanged: Unchanged) -> list[UOp] | None:
    """The tile's outputs stored through shared memory: once every warp is done with the factors' tiles, each thread
    writes its accumulators' outputs (the kernel's epilogue applied, in the output dtype) to a [row][column] copy
    of the tile in the factors' shared buffer; after a barrier the block copies it out in 16-byte runs, consecutive
    lanes along a row (COPY_OUT). A fragment holds 2 neighbouring columns of 8 rows per lane, so storing it
    directly writes 4 bytes of each of 8 rows per warp instruction; the runs write whole 128-byte lines.

    None (store directly) unless the output has the factors' element size, fits the shared buffer, is stored
    ungated, and each run of 16 bytes of the tile's rows is provably contiguous and aligned in the output.
    `unchanged`: `_output_unchanged` of the results."""
    dt, value = b.dt, plan.store.src[2]
    run = RUN_BYTES // smem.dtype.itemsize
    if len(plan.store.src) != 3 or value.dtype != smem.dtype or widths[1] % run or \
            plan.rows.size % widths[0] or plan.cols.size % widths[1]:
        return None
    stride = next((w for w in (widths[1] + STAGED_PAD, widths[1]) if widths[0] * w <= smem.arg[1]), None)
    runs = widths[0] * widths[1] // run
    if stride is None or runs % b.threads:
        return None
    def in_output(row: UOp, col: UOp) -> tuple[UOp, UOp]:  # tile position -> output position
        return b.row_tile * UOp.const(dt, widths[0]) + row, b.col_tile * UOp.const(dt, widths[1]) + col

    copies = []
    for q in range(runs // b.threads):
        n = b.lidx + UOp.const(dt, q * b.threads)
        row, col = n // UOp.const(dt, widths[1] // run), (n % UOp.const(dt, widths[1] // run)) * UOp.const(dt, run)
        if (index := _run_index(plan, b, *in_output(row, col), run)) is None:
            return None
        copies.append((index, row * UOp.const(dt, stride) + col))
    done = UOp(Ops.BARRIER, smem.dtype, (smem, *(acc for acc, _, _ in results)))  # the factors' tiles are free
    stores = [UOp(Ops.STORE, dtypes.void, (done, row * UOp.const(dt, stride) + col,
                                           _output(plan, b, acc, *in_output(row, col), unchanged).src[2]))
              for acc, row, col in results]
    ready = UOp(Ops.BARRIER, smem.dtype, (done, *stores))
    return [UOp(Ops.COPY_OUT, dtypes.void, (plan.store.src[0], index, ready, local)) for index, local in copies]


def _run_index(plan: MatmulPlan, b: _Block, row: UOp, col: UOp, run: int) -> UOp | None:
    """The output index of (row, col) when outputs (row, col) .. (row, col + run - 1) are consecutive elements and
    the first is a multiple of `run` (a 16-byte aligned run: buffers start 256-byte aligned); else None."""
    positions = {**b.batch_map, **_positions(plan.rows, row)}
    first = simplify(substitute(plan.store.src[1], {**positions, **_positions(plan.cols, col)}))
    aligned = simplify(first % UOp.const(b.dt, run))
    if aligned.op is not Ops.CONST or aligned.arg != 0:
        return None
    for i in range(1, run):
        at = substitute(plan.store.src[1], {**positions, **_positions(plan.cols, col + UOp.const(b.dt, i))})
        step = simplify(at - first)
        if step.op is not Ops.CONST or step.arg != i:
            return None
    return first


def _half_fragments(reader: UOp, at: _TileAt, warp_row: UOp, warp_col: UOp, lane: UOp, k0: UOp) -> Fragments:
    """ldmatrix.x4 of a 16 x 16 row fragment (registers a0..a3: rows 0-7/8-15 x k 0-7, then k 8-15) and of two
    16 x 8 column fragments (b0, b1 of columns 0-7, then of 8-15). Lane l names the row of matrix l/8 it holds: a
    [pos][k] side gives position rows (plain ldmatrix), a [k][pos] side k rows (ldmatrix.trans)."""
    dt = lane.dtype
    eight = UOp.const(dt, 8)  # (an 8 x 8 matrix of 16-bit elements: 8 of them are one 16-byte row)
    row8, odd = lane % eight, ((lane // eight) % UOp.const(dt, 2)) * eight  # lane16 == row8 + odd
    lane16, upper = lane % UOp.const(dt, 16), (lane // UOp.const(dt, 16)) * eight

    def row_at(r0: UOp) -> UOp:  # matrix l/8: rows +8 for odd l/8, k +8 for l >= 16
        return at(0, r0 + odd, k0 + row8 + upper) if at.k_major[0] else at(0, r0 + lane16, k0 + upper)

    def col_at(c0: UOp) -> UOp:  # matrix l/8: k +8 for odd l/8, columns +8 for l >= 16
        return at(1, c0 + upper, k0 + lane16) if at.k_major[1] else at(1, c0 + row8 + upper, k0 + odd)
    row_frags = [UOp(Ops.FRAGMENT, at.kind.dtype, (reader, row_at(warp_row + UOp.const(dt, i * MMA_M))),
                     ("row", at.k_major[0])) for i in range(at.m_tiles)]
    col_frags = [UOp(Ops.FRAGMENT, at.kind.dtype, (reader, col_at(warp_col + UOp.const(dt, p * 2 * MMA_N))),
                     ("col", at.k_major[1])) for p in range(at.n_tiles // 2)]
    return row_frags, col_frags


def _tf32_fragments(reader: UOp, at: _TileAt, warp_row: UOp, warp_col: UOp, lane: UOp, k0: UOp) -> Fragments:
    """The m16n8k8 .tf32 fragments (PTX ISA), each element read on its own (ldmatrix moves 16-bit elements). With
    g = lane/4, t = lane%4: a row fragment is 4 registers, a0..a3 = A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4] of a
    16 x 8 (row, k) block; a column fragment 2, b0, b1 = B[t][g], B[t+4][g] of an 8 x 8 (k, column) block. FRAGMENT's
    sources: the reader, then one shared index per register."""
    dt = lane.dtype
    g, t = lane // UOp.const(dt, 4), lane % UOp.const(dt, 4)
    m_tiles, n_tiles = at.m_tiles, at.n_tiles
    row_frags = [UOp(Ops.FRAGMENT, dtypes.float32, (reader, *(
        at(0, warp_row + UOp.const(dt, i * MMA_M + 8 * (r % 2)) + g, k0 + UOp.const(dt, 4 * (r // 2)) + t)
        for r in range(4))), ("row", False)) for i in range(m_tiles)]
    col_frags = [UOp(Ops.FRAGMENT, dtypes.float32, (reader, *(
        at(1, warp_col + UOp.const(dt, j * MMA_N) + g, k0 + UOp.const(dt, 4 * r) + t)
        for r in range(2))), ("col", True)) for j in range(n_tiles)]
    return row_frags, col_frags


@dataclass(frozen=True)
class _TileAt:
    """Shared-memory index of element (pos, k) of a tensor-core tile in stage `stage`. A side is stored [pos][k]
    (64-byte rows) or [k][pos] (the tile's width), whichever its global loads run along (`k_major`): the 16-byte
    runs a thread copies are then contiguous in shared memory too, so cp.async can make them. By default the rows
    factor is [row][k] and the cols factor [k][col]. 16-byte chunks are swizzled (chunk ^ a few row bits) so that what
    a warp reads at once, and the chunks cp.async writes, fall in distinct banks without padding: a [pos][k] side
    chunk ^ (pos/2)%4 (8 rows of 16 bytes for ldmatrix; 8 rows x 4 k for the tf32 a-fragments); a [k][pos] side
    chunk ^ k%8 for halves (ldmatrix.trans reads 8 k rows of 16 bytes), chunk ^ 2*(k%4) for tf32 (a b-fragment reads
    4 k rows x 8 columns: the XOR spreads the 4 rows over the 8 chunks of a 128-byte line)."""
    kind: TensorCoreKind
    stages: int
    stage: UOp
    widths: tuple[int, int]  # the tile's extent along rows and along columns
    k_major: tuple[bool, bool]  # each side stored [k][position] (else [position][k])
    atom: int = 0  # a [k][position] side in blocks of this many positions, each [k][atom] (0: one block)

    @property
    def m_tiles(self) -> int:
        """16-row mma tiles in a warp's part of the tile."""
        return self.widths[0] // WARPS[0] // MMA_M

    @property
    def n_tiles(self) -> int:
        """8-column mma tiles in a warp's part of the tile."""
        return self.widths[1] // WARPS[1] // MMA_N

    def descriptor(self, side: int) -> tuple[tuple[str, int, int, int], int]:
        """A warpgroup MMA's view of one side (halves, k tiles of 32 = 64-byte rows): (FRAGMENT's "desc" arg, the
        descriptor's step in bytes to k + 16). A [pos][k] side is K-major with the 64-byte swizzle (chunk ^
        (pos/2)%4 is the hardware's XOR of address bits 4-5 with 7-8): 8 rows (512 bytes) between core matrices
        along the positions, k + 16 32 bytes on. A [k][pos] side in blocks of 64 positions (`atom`) is M/N-major with
        the 128-byte swizzle (chunk ^ k%8: bits 4-6 with 7-9): blocks tile_k x 128 bytes apart, 8 k rows (1024
        bytes) between core matrices along k, k + 16 2048 bytes on."""
        size = self.kind.dtype.itemsize
        if self.k_major[side]:
            return ("desc", 1, self.kind.tile_k * self.atom * size, 8 * self.atom * size), 16 * self.atom * size
        return ("desc", 2, CHUNK_BYTES, 8 * self.kind.tile_k * size), 16 * size

    def __call__(self, side: int, pos: UOp, k: UOp) -> UOp:
        dt, chunk_size = pos.dtype, self.kind.chunk
        block = UOp.const(dt, 0)
        if self.atom and self.k_major[side]:  # a block of `atom` positions: [k][atom], tile_k x atom apart
            block = (pos // UOp.const(dt, self.atom)) * UOp.const(dt, self.kind.tile_k * self.atom)
            pos = pos % UOp.const(dt, self.atom)
        row, col, width = (k, pos, self.atom or self.widths[side]) if self.k_major[side] else \
            (pos, k, self.kind.tile_k)
        if not self.k_major[side]:
            swizzle = (row // UOp.const(dt, 2)) % UOp.const(dt, 4)
        else:
            swizzle = (row % UOp.const(dt, 4)) * UOp.const(dt, 2) if self.kind.tf32 else row % UOp.const(dt, 8)
        chunk = (col // UOp.const(dt, chunk_size)).alu(Ops.XOR, swizzle)
        tile = self.widths[side] * self.kind.tile_k
        base = UOp.const(dt, side * self.stages * self.widths[0] * self.kind.tile_k) + self.stage * UOp.const(dt, tile)
        return base + block + row * UOp.const(dt, width) + chunk * UOp.const(dt, chunk_size) + \
            col % UOp.const(dt, chunk_size)


def _tc_copies(plan: MatmulPlan, b: _Block, layout: _TileAt, values: tuple[UOp, UOp],
               k_tile: UOp) -> list[tuple[UOp, UOp]]:
    """(shared index, value): this thread's part of k tile `k_tile` of both factors, in `layout`'s stage
    k_tile % stages."""
    at = replace(layout, stage=k_tile % UOp.const(b.dt, layout.stages))
    sides = zip((plan.rows, plan.cols), (b.row_tile, b.col_tile), values)
    return [(at(side, *position), value) for side, (operand, tile, factor) in enumerate(sides)
            for position, value in _tile_copy(operand, factor, tile, b, plan.k_ranges, at.kind.tile_k, k_tile)]


def _tc_k_major(plan: MatmulPlan, kind: TensorCoreKind, values: tuple[UOp, UOp]) -> tuple[bool, bool]:
    """Which sides of a tensor-core tile are stored [k][position] (`_TileAt`): for halves, a side whose loads run
    along its tile axis (a weight gradient's `dy^T`, a matmul's right factor); the rows of `x @ W^T` (nn.Linear's
    weight, read along k) are then [col][k]. tf32 tiles keep rows [row][k] and columns [k][col]."""
    if kind.tf32:
        return False, True
    return _along_tile(plan.rows, values[0]), _along_tile(plan.cols, values[1])


def _along_tile(operand: Operand, value: UOp) -> bool:
    """Whether one of `value`'s loads is contiguous along the operand's innermost tile loop."""
    return any(index_stride(u.src[1], operand.ranges[-1]) == 1 for u in value.toposort() if u.op is Ops.LOAD)


def _copy_runs(copies: list[tuple[UOp, UOp]], run: int) -> list[tuple[UOp, UOp]] | None:
    """(shared index, LOAD) of the first element of each run of `run` copies, when every run copies `run`
    neighbouring elements of one buffer, ungated, to neighbouring shared positions (one 16-byte async copy each),
    starting at a global index that is provably a multiple of `run` (16-byte aligned, as cp.async needs: a view at
    an odd offset, or rows of an odd length, copy through registers); None otherwise."""
    out = []
    for start in range(0, len(copies), run):
        index0, load0 = copies[start]
        if load0.op is not Ops.LOAD or len(load0.src) != 2 or not _multiple_of(load0.src[1], run):
            return None
        for step, (index, load) in enumerate(copies[start:start + run]):
            offset = UOp.const(index.dtype, step)
            if load.op is not Ops.LOAD or len(load.src) != 2 or load.src[0] is not load0.src[0] or \
                    simplify(load.src[1]) is not simplify(load0.src[1] + offset) or \
                    simplify(index) is not simplify(index0 + offset):
                return None
        out.append((index0, load0))
    return out


def _multiple_of(index: UOp, n: int) -> bool:
    remainder = simplify(index % UOp.const(index.dtype, n))
    return remainder.op is Ops.CONST and remainder.arg == 0


def _async_copies(order: UOp, copies: list[tuple[UOp, UOp]], gate: UOp | None) -> list[UOp]:
    """ASYNC_COPY nodes (issued after `order`) for `copies`: one 16-byte copy per run, skipped where `gate` is off
    (arg None); else, for float32 loads, one 4-byte copy per element (arg 4) of `_gathered` loads, zero-filled
    where `gate` or the element's own gate is off (a pad's zeros, a tile's remainder)."""
    runs = _copy_runs(copies, 16 // copies[0][1].dtype.itemsize)
    if runs is not None:
        return [UOp(Ops.ASYNC_COPY, dtypes.void, (order, index, *load.src, *((gate,) if gate is not None else ())))
                for index, load in runs]
    out = []
    for index, value in copies:
        gathered = _gathered(value)
        assert gathered is not None and value.dtype.itemsize == 4
        buf, element, valid = gathered
        valid = _both(valid, gate)
        out.append(UOp(Ops.ASYNC_COPY, dtypes.void, (order, index, buf, element, *((valid,) if valid is not None
                                                                                  else ())), 4))
    return out


def _gathered(value: UOp) -> tuple[UOp, UOp, UOp | None] | None:
    """(buffer, index, gate or None) when `value` is a global load under zero masks (`where(c, load, 0)`, nested;
    the load's own gate): the element a 4-byte cp.async with zero-fill copies. None for anything computed."""
    valid: UOp | None = None
    while value.op is Ops.WHERE and value.src[2].op is Ops.CONST and value.src[2].arg == 0:
        valid, value = _both(valid, value.src[0]), value.src[1]
    if value.op is not Ops.LOAD or value.src[0].op is not Ops.DEFINE_GLOBAL or value.dtype.itemsize != 4:
        return None
    return value.src[0], value.src[1], _both(valid, value.src[2] if len(value.src) == 3 else None)


def _positions(operand: Operand, flat: UOp) -> dict[UOp, UOp]:
    return dict(zip(operand.ranges, unflatten_index(flat, tuple(r.src[0].arg for r in operand.ranges), flat.dtype)))


def _inside(operand: Operand, flat: UOp) -> UOp | None:
    """`flat < size` where the last tile of the axis runs past its end, else None (always inside)."""
    return None if operand.size % operand.tile == 0 else flat < UOp.const(flat.dtype, operand.size)


def _both(a: UOp | None, b: UOp | None) -> UOp | None:
    return b if a is None else a if b is None else a.alu(Ops.AND, b)


def _tile_copy(operand: Operand, value: UOp, tile: UOp, b: _Block, k_ranges: tuple[UOp, ...],
               tile_k: int, k_tile: UOp, elementwise: bool = False) -> list[tuple[tuple[UOp, UOp], UOp]]:
    """((position in the tile, k in the tile), value) pairs: this thread's share of the operand's TILE x tile_k tile.
    Neighbouring threads take neighbouring elements along the axis the operand's loads are contiguous in
    (coalesced reads). Elements past the end of an axis are zeros. `elementwise`: each thread takes single elements
    (no runs of 16 bytes), as 4-byte asynchronous copies want: a warp's copies then read few whole sectors."""
    dt = b.dt
    threads = b.threads
    along_tile = _along_tile(operand, value)
    k_sizes = tuple(r.src[0].arg for r in k_ranges)
    # each thread copies runs of `vector` neighbouring elements (16 bytes: the compiler can make one access of them)
    size = operand.tile
    vector = 1 if elementwise else max(1, min(16 // value.dtype.itemsize, size * tile_k // threads, tile_k))
    out = []
    for part in range(size * tile_k // threads):
        run = b.lidx * UOp.const(dt, vector) + UOp.const(dt, (part // vector) * threads * vector)
        step = UOp.const(dt, part % vector)
        if along_tile:
            pos, kk = run % UOp.const(dt, size) + step, run // UOp.const(dt, size)
        else:
            pos, kk = run // UOp.const(dt, tile_k), run % UOp.const(dt, tile_k) + step
        flat = tile * UOp.const(dt, size) + pos
        k = k_tile * UOp.const(dt, tile_k) + kk
        mapping = {**b.batch_map, **_positions(operand, flat), **dict(zip(k_ranges, unflatten_index(k, k_sizes, dt)))}
        element_value = substitute(value, mapping)
        valid = _both(_inside(operand, flat), k < UOp.const(dt, b.k_size) if b.k_size % tile_k else None)
        if valid is not None:
            element_value = valid.where(_gate_loads(element_value, valid), UOp.const(value.dtype, 0))
        out.append(((pos, kk), element_value))
    return out
