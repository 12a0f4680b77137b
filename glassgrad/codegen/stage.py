"""Staging (CPU): a gated load inside a register tile's reduction is copied into a small local buffer first.

In: an optimised kernel AST and its upcast ranges (`Kernel.upcast`). Out: the AST where each such load reads a
staging buffer (`DEFINE_LOCAL`: an array on the thread's stack) instead, filled by a loop nest of its own just
inside the outermost reduce loop it fits under. A padded convolution's input loads are gated (`valid ? x[i] : 0`):
compiled as SIMD lanes they are masked loads, and gcc then keeps the register tile's accumulators in memory (a load
and a store of every accumulator per step, measured 2x slower: its loop-invariant motion cannot tell what a masked
load reads). Staged, the masked loads run in the copy loops, the tile's loops read plain contiguous floats through
a `restrict` pointer, and the accumulators stay in registers.

    for ci:                                   for ci:
      for kh, kw:                               for kh', kw', lane':          (copy loops, kind "stage")
        for row, lane:                            stage[kh', kw', lane'] = valid ? x[...] : 0
          acc[row, lane] += (valid ? x : 0) * w  for kh, kw:
                                                  for row, lane:
                                                    acc[row, lane] += stage[kh, kw, lane] * w

In the IR the copy is `BARRIER(DEFINE_LOCAL, STORE(local, index, value))` with arg "stage", as a GPU tile copy
is, except that its loops are RANGEs of kind "stage" under the BARRIER: the linearizer opens them around the
stores wherever the BARRIER is placed (the outermost point where every loop it depends on is open).
"""
from __future__ import annotations

import math

from glassgrad.dtype import dtypes
from glassgrad.helpers import prod
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.symbolic import simplify

STAGE_MAX = 16384  # elements of one staging buffer (64 KB of float32 on the stack: read once per 8-16 FMAs, L2 is
#                   fast enough; a 3x3 convolution over 64 input channels with 16 lanes is 9216)


def _is_positive_zero(c: UOp) -> bool:
    return c.op is Ops.CONST and c.arg == 0 and (not isinstance(c.arg, float) or math.copysign(1.0, c.arg) > 0)


def _drop_regate(g: UOp, load: UOp, zero: UOp) -> UOp | None:
    return load if len(load.src) == 3 and load.src[2] is g and _is_positive_zero(zero) else None


# WHERE(g, LOAD(buf, i, g), 0) -> LOAD(buf, i, g): a gated load is 0 already where its gate is false (a padded
# view's value is both gated and selected)
fold_gated_where = PatternMatcher([
    (UPat(Ops.WHERE, src=(UPat.var("g"), UPat(Ops.LOAD, name="load"), UPat(Ops.CONST, name="zero"))), _drop_regate),
])


def _replace(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
    return graph_rewrite(root, PatternMatcher([(UPat(name="x"), lambda x: mapping.get(x))])) if mapping else root


def _depends(u: UOp) -> set[UOp]:
    return {r for r in u.toposort() if r.op is Ops.RANGE}


def _tile_loops(red: UOp, upcast: tuple[UOp, ...]) -> tuple[list[UOp], list[UOp]]:
    """(reduce loops outermost first, the loops inside them: unrolled lanes, then the upcast loops), in the order
    the linearizer opens them for this REDUCE."""
    own = [r for r in red.src[1:] if r.arg[1] != "unroll"]
    inner = [r for r in red.src[1:] if r.arg[1] == "unroll"]
    scope = _depends(red.src[0])
    return own, inner + [u for u in upcast if u in scope and u not in inner]


def _staging_loops(load: UOp, reduce_loops: list[UOp], inner: list[UOp]) -> list[UOp] | None:
    """The loops the staging buffer covers (its axes, outermost first): those of the load's loops inside the
    outermost reduce loop under which the buffer fits in STAGE_MAX elements; None when no reduce loop is among them
    (staging inside the innermost reduce loop would leave the masked loads in the tile's loop)."""
    uses = _depends(load)
    for split in range(len(reduce_loops)):
        axes = [r for r in reduce_loops[split:] + inner if r in uses]
        if prod(r.src[0].arg for r in axes) <= STAGE_MAX:
            return axes if any(r in reduce_loops for r in axes) else None
    return None


def stages_before_reduction(ast: UOp, upcast: tuple[UOp, ...]) -> bool:
    """Whether `stage_gated_loads` would copy some gated load for a whole reduction, before its loops: the copy then
    depends on global loops only, and is made once for every position of the global loops it does not use."""
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE):
        reduce_loops, inner = _tile_loops(red, upcast)
        for load in (u for u in red.src[0].toposort() if u.op is Ops.LOAD and len(u.src) == 3):
            axes = _staging_loops(load, reduce_loops, inner) if inner and _constant(reduce_loops + inner) else None
            if axes is not None and all(r in axes for r in reduce_loops if r in _depends(load)):
                return True
    return False


def _constant(loops: list[UOp]) -> bool:
    return all(r.src[0].op is Ops.CONST for r in loops)


def stage_gated_loads(ast: UOp, upcast: tuple[UOp, ...]) -> UOp:
    """Stage every gated load of a reduction that has a register tile (upcast or unrolled loops) into a local buffer
    (see the module docstring). Loops of symbolic size are left as they are."""
    ast = graph_rewrite(ast, fold_gated_where)
    if not upcast:
        return ast
    next_id = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    local_id = sum(1 for u in ast.toposort() if u.op is Ops.DEFINE_LOCAL)
    mapping: dict[UOp, UOp] = {}
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE):
        reduce_loops, inner = _tile_loops(red, upcast)
        if not inner or not _constant(reduce_loops + inner):
            continue
        for load in red.src[0].toposort(stop=lambda x: x.op is Ops.REDUCE):
            if load.op is not Ops.LOAD or len(load.src) != 3 or load in mapping:
                continue
            axes = _staging_loops(load, reduce_loops, inner)
            if axes is None:
                continue
            copies = [UOp(Ops.RANGE, r.dtype, r.src, (next_id + i, "stage")) for i, r in enumerate(axes)]
            next_id += len(axes)
            local = UOp(Ops.DEFINE_LOCAL, load.dtype, (), (local_id, prod(r.src[0].arg for r in axes)))
            local_id += 1
            store = UOp(Ops.STORE, dtypes.void, (local, _flat(copies), _replace(load, dict(zip(axes, copies)))))
            staged = UOp(Ops.BARRIER, load.dtype, (local, store), "stage")
            mapping[load] = UOp(Ops.LOAD, load.dtype, (staged, _flat(axes)))
    return simplify(_replace(ast, mapping))


def _flat(loops: list[UOp]) -> UOp:
    """The row-major position of a combination of the loops' indices (the last one contiguous)."""
    index = loops[0]
    for r in loops[1:]:
        index = index * UOp.const(r.dtype, r.src[0].arg) + r
    return index
