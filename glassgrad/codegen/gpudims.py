"""GPU launch dimensions: a kernel's loops become threads and work-groups.

In: a simplified kernel AST (global RANGEs over the output, REDUCEs over reduce RANGEs). Out: the AST rewritten
for a GPU, the grid size (in blocks) and the block size (in threads). Two shapes of kernel:

* **flat**: one thread per output element. The global loops are flattened into one id
  `gidx = blockIdx.x * L + threadIdx.x` (a SPECIAL node whose value range is 0..total-1: the kernel returns early
  past the end) and each loop index becomes `(gidx // stride) % size`. Reductions, if any, are a loop per thread;
  this is right when neighbouring threads read neighbouring memory (e.g. `sum(axis=0)`, a matmul's columns).
* **grouped**: one work-group of L threads per output element, for large reductions that a thread-per-output layout
  would read with a stride (e.g. `sum(axis=1)`, a full `sum()`). Thread `l` accumulates elements `l, l+L, l+2L, ...`
  (neighbouring threads read neighbouring elements), then the group combines its L partial results through shared
  memory (`GROUP_REDUCE`), and thread 0 stores the result.

Symbolic trip counts (Variables): the grid size becomes an expression the launch evaluates for the Variables'
values; a flat kernel's `gidx` takes its largest value as its range and gets the symbolic count as a source, which
the renderer checks (`if (gidx >= count) return;`); a grouped reduction's strided loop runs ceil(n / L) times and
gates every load with `l + step*L < n`.
"""
from __future__ import annotations

import math

from glassgrad.codegen.linearize import range_size, reduce_identity
from glassgrad.dtype import DType, dtypes
from glassgrad.helpers import prod
from glassgrad.renderer.cstyle import index_stride
from glassgrad.schedule.indexing import size_node, unflatten_index
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.sint import sint, sint_ceildiv, sint_max, sint_prod
from glassgrad.uop.symbolic import simplify

LOCAL_SIZE = 256          # threads per block (a power of two: the group reduction halves it)
GROUP_MIN_REDUCE = 256    # reductions shorter than this stay a loop per thread
FEW_OUTPUTS = 4096        # below this many outputs, a thread per output leaves the GPU mostly idle
ELEMENTS_PER_THREAD = 4   # large elementwise kernels: elements per thread (a small unrolled loop)
MANY_ELEMENTS = 1 << 20   # from this size on

Dims = tuple[int, int, int]
Grid = tuple[sint, int, int]  # blocks: a symbolic count is evaluated at launch


def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
    """Replace nodes of `root`'s graph by their entries in `mapping` (matched before their sources change)."""
    if not mapping:
        return root
    return graph_rewrite(root, PatternMatcher([(UPat(name="x"), lambda x: mapping.get(x))]))


def gpu_dims(ast: UOp, local_size: int = LOCAL_SIZE) -> tuple[UOp, Grid, Dims]:
    nodes = ast.toposort()
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    if reduces and _should_group(nodes, global_ranges, reduces):
        return _grouped(ast, nodes, global_ranges, reduces, local_size)
    return _flat(ast, global_ranges, local_size)


def _sizes(ranges: list[UOp] | tuple[UOp, ...]) -> tuple[sint, ...]:
    return tuple(range_size(r) for r in ranges)


def _total(sizes: tuple[sint, ...]) -> sint:
    return prod(sizes) if all(isinstance(s, int) for s in sizes) else sint_prod(sizes)  # type: ignore[arg-type]


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
        next_id = max((r.arg[0] for r in global_ranges), default=-1) + 1
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
    # first the reductions (matched while the graph is unchanged), then the output loops everywhere
    grouped = {}
    for i, red in enumerate(reduces):
        grouped[red] = _group_reduce(red, lidx, local_size, next_id + i)
    ast = substitute(ast, grouped)
    ast = substitute(ast, dict(zip(global_ranges, unflatten_index(bidx, sizes, dt))))
    # every thread computes the result; thread 0 writes it
    first_thread = lidx.eq(UOp.const(dt, 0))
    stores = tuple(s.replace(src=(*s.src[:3], first_thread)) if s.op is Ops.STORE else s for s in ast.src)
    return simplify(ast.replace(src=stores)), (total, 1, 1), (local_size, 1, 1)


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
    return UOp(Ops.GROUP_REDUCE, red.dtype, (partial, lidx), (red.arg, local_size))


def _gate_loads(value: UOp, valid: UOp) -> UOp:
    """Loads past the end of the reduction must not happen: add `valid` to every load's gate."""
    def gate(x: UOp) -> UOp:
        old = x.src[2] if len(x.src) == 3 else None
        return x.replace(src=(x.src[0], x.src[1], valid if old is None else old.alu(Ops.AND, valid)))
    loads = {u: gate(u) for u in value.toposort() if u.op is Ops.LOAD}
    return substitute(value, loads)
