"""Staging (CPU): the gated values of a register tile's reduction are computed into a small local buffer first.

In: an optimised kernel AST and its upcast ranges (`Kernel.upcast`). Out: the AST where each such value reads a
staging buffer (`DEFINE_LOCAL`: an array on the thread's stack) instead, filled by a loop nest of its own just
inside the outermost reduce loop it fits under. A padded convolution's input loads are gated (`valid ? x[i] : 0`):
compiled as SIMD lanes they are masked loads, and gcc then keeps the register tile's accumulators in memory (a load
and a store of every accumulator per step, measured 2x slower: its loop-invariant motion cannot tell what a masked
load reads). Staged, the masked loads run in the copy loops, the tile's loops read plain contiguous floats through
a `restrict` pointer, and the accumulators stay in registers.

    for ci:                                   for ci:
      for kh, kw:                               for kh', col':                (copy loops, kind "stage")
        for row, lane:                            stage[kh', col'] = valid ? x[...] : 0
          acc[row, lane] += (valid ? x : 0) * w  for kh, kw:
                                                  for row, lane:
                                                    acc[row, lane] += stage[kh, kw + lane] * w

What is staged is the largest part of the reduction's value around the gated loads that uses no tile loop they do
not use: for a convolution's input gradient that is `relu'(y) * g` (two gated loads and the relu's mask), leaving a
plain multiply-add in the tile. In a sum, a select by the padding's gate around a product with such a load is
dropped first (the load is 0 there already). The buffer covers the value's *footprint*: loops that move every index
and gate in proportion (by a whole factor, either sign) share one axis of their weighted sum, so a window's column
`kw + lane` is one axis of 16 + 2 values, not 3 x 16, and a stride-2 window's `kw + 2 * row` one of 17 for 8 rows, not
3 x 8 (a contiguous copy that vectorises, where the gathers with a stride of 2 were a scalar loop); the innermost tile
loop counts up along its axis.

Row values (`stage_row_values`): a costly value that a row reduction and the loop over the row both compute
(softmax's `exp(x - max)`) is staged once per row, and both read the buffer.

In the IR the copy is `BARRIER(DEFINE_LOCAL, STORE(local, index, value))` with arg "stage", as a GPU tile copy
is, except that its loops are RANGEs of kind "stage" under the BARRIER: the linearizer opens them around the
stores wherever the BARRIER is placed (the outermost point where every loop it depends on is open).
"""
from __future__ import annotations

import math

from glassgrad.codegen.linearize import Scopes
from glassgrad.dtype import dtypes
from glassgrad.helpers import prod
from glassgrad.renderer.cstyle import index_strides
from glassgrad.uop.ops import GroupOp, Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.symbolic import simplify

STAGE_MAX = 16384  # elements of one staging buffer (64 KB of float32 on the stack: read once per 8-16 FMAs, L2 is
#                   fast enough; a 3x3 convolution over 64 input channels with 16 lanes is 9216)
PACK_REUSE = 8     # a pack inside the reduction (remade per outer step) pays when this many tile rows share it
COPY_RUN = 8       # a copy's innermost loop may be one along which its loads run contiguously for this many values
SHARE_MIN = 4      # an ungated value is staged when the tile would compute each of its values this many times
COSTLY = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.FDIV, Ops.POW})  # worth a row buffer to compute once


def _is_positive_zero(c: UOp) -> bool:
    return c.op is Ops.CONST and c.arg == 0 and (not isinstance(c.arg, float) or math.copysign(1.0, c.arg) > 0)


def _drop_regate(g: UOp, load: UOp, zero: UOp) -> UOp | None:
    return load if len(load.src) == 3 and load.src[2] is g and _is_positive_zero(zero) else None


# WHERE(g, LOAD(buf, i, g), 0) -> LOAD(buf, i, g): a gated load is 0 already where its gate is false (a padded
# view's value is both gated and selected)
fold_gated_where = PatternMatcher([
    (UPat(Ops.WHERE, src=(UPat.var("g"), UPat(Ops.LOAD, name="load"), UPat(Ops.CONST, name="zero"))), _drop_regate),
])


def _conjuncts(cond: UOp) -> set[UOp]:
    return _conjuncts(cond.src[0]) | _conjuncts(cond.src[1]) if cond.op is Ops.AND else {cond}


def _zero_unless(x: UOp, conds: set[UOp]) -> bool:
    """Whether `x` is 0 wherever one of `conds` is false: a load gated by all of them, a product with such a
    factor, or a select of such values."""
    if x.op is Ops.LOAD:
        return len(x.src) == 3 and conds <= _conjuncts(x.src[2])
    if x.op is Ops.MUL:
        return _zero_unless(x.src[0], conds) or _zero_unless(x.src[1], conds)
    if x.op is Ops.CAST:
        return _zero_unless(x.src[0], conds)
    if x.op is Ops.WHERE and all(_is_positive_zero(v) or _zero_unless(v, conds) for v in x.src[1:]):
        return True
    return _folds_to_zero(x, conds)


def _folds_to_zero(x: UOp, conds: set[UOp]) -> bool:
    """Whether `x` simplifies to +0 once each load gated by all of `conds` is replaced by the 0 it reads where one
    of them is false: a ReLU's derivative of a padded input, `x <= 0 ? 0 : 1` (the gradient of `relu(conv).sum()`)."""
    gated = {u: UOp.const(u.dtype, 0) for u in x.toposort() if u.op is Ops.LOAD and len(u.src) == 3 and
             conds <= _conjuncts(u.src[2])}
    if not gated:
        return False
    folded = simplify(_replace(x, gated))
    return folded.op is Ops.CONST and _is_positive_zero(folded)


def _drop_zero_select(g: UOp, x: UOp, zero: UOp) -> UOp | None:
    return x if _is_positive_zero(zero) and x.dtype.is_float and _zero_unless(x, _conjuncts(g)) else None


# In a sum: WHERE(g, x * w, 0) -> x * w when x is a load gated by g (at least): a padded input's zeros are zeros of
# the product already. (Only a weight that is inf or NaN could tell them apart: 0 * inf is NaN, as in the unfused
# `pad(x) * w`.) A convolution's input gradient selects its products by the padding's gate once per multiply-add.
drop_zero_selects = PatternMatcher([
    (UPat(Ops.WHERE, src=(UPat.var("g"), UPat.var("x"), UPat(Ops.CONST, name="zero"))), _drop_zero_select),
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


# One axis of a staging buffer: its loops with their weights, the number of values it takes, and the offset that makes
# the first one 0. A buffer axis of several loops holds their weighted sum (a window's `x + kx`, or `y - ky` in a
# transposed convolution), which the staged value depends on only through that sum.
Dim = tuple[tuple[tuple[UOp, int], ...], int, int]


def _is_root_candidate(n: UOp, inner: list[UOp], loads: list[UOp]) -> bool:
    """A value the copy loops can compute instead of the tile's loop: no reduction, buffer or staging inside, and no
    tile loop that its loads do not already depend on (those would multiply the copies, not share them)."""
    if n.dtype.is_bool:
        return False
    if any(u.op in (Ops.REDUCE, Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.STORE) for u in n.toposort()):
        return False
    loaded = set().union(*(_depends(load) for load in loads))
    return all(r in loaded for r in _depends(n) if r in inner)


def _stage_roots(body: UOp, reduce_loops: list[UOp], inner: list[UOp]) -> list[tuple[UOp, list[Dim]]]:
    """The largest parts of a reduction's value that can be staged whole, with their buffers' axes: one with gated
    loads (a padded convolution's input, or its input gradient's `relu'(x) * g`) is staged to take the masked loads
    out of the tile's loop; one with loads and arithmetic but no gate (a fused `relu(x + b)` that the tile evaluates
    for each of its rows and each tap of the window) only when its footprint is much smaller than the tile's
    evaluations of it. Either leaves the multiply-add with the other operand in the tile's loop."""
    roots: list[tuple[UOp, list[Dim]]] = []
    seen: set[UOp] = set()

    stack = [body]  # a depth-first walk, sources in order, without recursion (a cat of 1,000 tensors is that deep)
    while stack:
        n = stack.pop()
        if n in seen or n.op is Ops.REDUCE:
            continue
        seen.add(n)
        loads = [u for u in n.toposort(stop=lambda x: x.op is Ops.REDUCE) if u.op is Ops.LOAD]
        if not loads:
            continue
        gated = [u for u in loads if len(u.src) == 3]
        if gated and _is_root_candidate(n, inner, gated):
            if (dims := _staging_dims(n, reduce_loops, inner, False)) is not None:
                roots.append((n, dims))
            continue
        if not gated and n.op in GroupOp.ALU and _is_root_candidate(n, inner, loads) and \
                (dims := _staging_dims(n, reduce_loops, inner, True)) is not None:
            roots.append((n, dims))
            continue
        if n.op is Ops.LOAD and (dims := _pack_dims(n, reduce_loops, inner)) is not None:
            roots.append((n, dims))
            continue
        stack.extend(reversed(n.src))
    return roots


def _pack_dims(load: UOp, reduce_loops: list[UOp], inner: list[UOp]) -> list[Dim] | None:
    """A *pack*: an ungated load that the tile's SIMD loop (the innermost, `inner[-1]`) reads with a stride other than
    0 or 1 (a convolution's weight `w[co, ci, kh, kw]` with the output channels as lanes) is copied whole, for every
    reduce loop it depends on, with the lanes contiguous: made once before the reduction, it turns a gather per
    multiply-add into one vector load."""
    strides = index_strides(load.src[1])
    if len(load.src) == 3 or not inner or strides.get(inner[-1], 0) in (0, 1):
        return None
    dims = _staging_dims(load, reduce_loops, inner, False)
    reuse = prod(r.src[0].arg for r in inner if strides.get(r, 0) == 0)  # tile rows that share each packed vector
    return dims if dims is not None and (_covers_reduction(load, dims, reduce_loops) or reuse >= PACK_REUSE) else None


def _covers_reduction(root: UOp, dims: list[Dim], reduce_loops: list[UOp]) -> bool:
    """Whether the buffer's axes hold every reduce loop `root` depends on: it is staged before the reduction."""
    covered = {r for members, _, _ in dims for r, _ in members}
    return all(r in covered for r in reduce_loops if r in _depends(root))


def _affine_leaves(root: UOp) -> list[UOp]:
    """The integer expressions through which `root` uses its loops: load indices, and the operands of the gates'
    comparisons (every use of a loop sits inside one; a reduction's inside is its own)."""
    leaves: list[UOp] = []
    seen: set[UOp] = set()
    stack = [root]  # depth-first, sources in order, without recursion
    while stack:
        n = stack.pop()
        if n in seen or n.op is Ops.REDUCE:
            continue
        seen.add(n)
        if n.dtype.is_int:
            leaves.append(n)
            continue
        stack.extend(reversed(n.src))
    return leaves


def _footprint(root: UOp, loops: list[UOp], lane: UOp | None = None) -> list[Dim]:
    """The staging buffer's axes for `root` over `loops`: loops whose strides are integer multiples of one another in
    every affine leaf share one axis of their weighted sum (`kw + lane`, `y - ky`, or a stride-2 window's
    `kw + 2 * row`), when that axis is no longer than their separate axes would be together; a loop that no affine
    leaf shows is its own axis. The SIMD `lane` loop only joins an axis with weight +-1 (its reads stay contiguous)."""
    leaves = [index_strides(leaf) for leaf in _affine_leaves(root)]
    if any(s is None for leaf in leaves for s in leaf.values()):
        return [(((r, 1),), r.src[0].arg, 0) for r in loops]  # not affine: one axis per loop
    groups: list[tuple[list[int], list[tuple[UOp, int]]]] = []  # (the strides of weight 1, members with weights)
    for r in loops:
        strides = [leaf.get(r, 0) or 0 for leaf in leaves]
        for i, (base, members) in enumerate(groups):
            if (joined := _joined(base, members, r, strides, lane)) is not None:
                groups[i] = joined
                break
        else:
            groups.append((strides, [(r, 1)]))
    dims: list[Dim] = []
    for _, group in groups:
        if group[-1][1] < 0:  # the innermost loop counts up (the tile's lanes then read forwards)
            group = [(r, -weight) for r, weight in group]
        dims.append((tuple(group), _extent(group), sum(-w * (r.src[0].arg - 1) for r, w in group if w < 0)))
    return dims


def _extent(members: list[tuple[UOp, int]]) -> int:
    """The number of values a weighted sum of loops takes from its least to its largest."""
    return sum(abs(w) * (r.src[0].arg - 1) for r, w in members) + 1


def _joined(base: list[int], members: list[tuple[UOp, int]], r: UOp, strides: list[int],
            lane: UOp | None) -> tuple[list[int], list[tuple[UOp, int]]] | None:
    """The group with loop `r` added, when r's strides are a whole multiple of the group's unit strides `base` (or
    these of r's, making r the unit) and the shared axis is shorter than separate ones; else None."""
    if (weight := _multiple(base, strides)) is not None:
        joined = (base, [*members, (r, weight)])
    elif (scale := _multiple(strides, base)) is not None:
        joined = (strides, [(m, w * scale) for m, w in members] + [(r, 1)])
    else:
        return None
    new = joined[1]
    if any(m is lane and abs(w) != 1 for m, w in new) or _extent(new) >= _extent(members) * r.src[0].arg:
        return None
    return joined


def _multiple(first: list[int], second: list[int]) -> int | None:
    """The integer k (not 0) with `second == k * first` in every leaf, when `first` is not all zero; else None."""
    pivot = next((i for i, f in enumerate(first) if f), None)
    if pivot is None or second[pivot] % first[pivot]:
        return None
    k = second[pivot] // first[pivot]
    return k if k and all(s == k * f for f, s in zip(first, second)) else None


def _staging_dims(root: UOp, reduce_loops: list[UOp], inner: list[UOp], to_share: bool) -> list[Dim] | None:
    """The axes of `root`'s staging buffer (outermost first; the innermost tile loop's last): over the loops inside
    the outermost reduce loop under which the buffer fits in STAGE_MAX elements; None when no reduce loop is among
    them (staging inside the innermost reduce loop would leave the masked loads in the tile's loop), or, `to_share`,
    when the tile's loops inside that point evaluate it fewer than SHARE_MIN times per staged value."""
    uses = _depends(root)
    order = reduce_loops + inner
    for split in range(len(reduce_loops)):
        loops = [r for r in order[split:] if r in uses]
        dims = _footprint(root, loops, inner[-1] if inner else None)
        size = prod(extent for _, extent, _ in dims)
        if size <= STAGE_MAX:
            if not any(r in reduce_loops for r in loops) or \
                    (to_share and prod(r.src[0].arg for r in order[split:]) < SHARE_MIN * size):
                return None
            return sorted(dims, key=lambda d: max(order.index(r) for r, _ in d[0]))
    return None


def stages_before_reduction(ast: UOp, upcast: tuple[UOp, ...]) -> bool:
    """Whether `stage_gated_loads` would copy some gated value for a whole reduction, before its loops: the copy then
    depends on global loops only, and is made once for every position of the global loops it does not use."""
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE):
        reduce_loops, inner = _tile_loops(red, upcast)
        if not inner or not _constant(reduce_loops + inner) or _too_many_loads(red.src[0]):
            continue
        if any(_covers_reduction(root, dims, reduce_loops)
               for root, dims in _stage_roots(red.src[0], reduce_loops, inner)):
            return True
    return False


# A reduction reading more buffers than this is not staged: the search for staging roots walks each candidate's graph
# (quadratic in its size), and such bodies are sums over many inputs (a stack of 1,000 tensors summed: 12 minutes of
# codegen), not the convolutions and matmuls that staging is for.
MAX_STAGED_LOADS = 64


def _too_many_loads(body: UOp) -> bool:
    return sum(u.op is Ops.LOAD for u in body.toposort(stop=lambda x: x.op is Ops.REDUCE)) > MAX_STAGED_LOADS


def _constant(loops: list[UOp]) -> bool:
    return all(r.src[0].op is Ops.CONST for r in loops)


def stage_gated_loads(ast: UOp, upcast: tuple[UOp, ...]) -> UOp:
    """Stage the gated values of every reduction that has a register tile (upcast or unrolled loops) into a local
    buffer (see the module docstring). Loops of symbolic size are left as they are."""
    ast = graph_rewrite(ast, fold_gated_where)
    if not upcast:
        return ast
    sums = {red: red.replace(src=(graph_rewrite(red.src[0], drop_zero_selects), *red.src[1:]))
            for red in ast.toposort() if red.op is Ops.REDUCE and red.arg is Ops.ADD}
    ast = _replace(ast, {old: new for old, new in sums.items() if new is not old})
    next_id, local_id = _fresh_ids(ast)
    mapping: dict[UOp, UOp] = {}
    for red in (u for u in ast.toposort() if u.op is Ops.REDUCE):
        reduce_loops, inner = _tile_loops(red, upcast)
        if not inner or not _constant(reduce_loops + inner) or _too_many_loads(red.src[0]):
            continue
        for root, dims in _stage_roots(red.src[0], reduce_loops, inner):
            if root in mapping:
                continue
            copies = _copy_loops(root, dims, next_id)
            next_id += len(dims)
            staged = _stage_buffer(local_id, prod(extent for _, extent, _ in dims), _flat(copies, dims),
                                   _replace(root, _copy_values(dims, copies)))
            local_id += 1
            mapping[root] = UOp(Ops.LOAD, root.dtype, (staged, _flat([_position(d) for d in dims], dims)))
    return simplify(_replace(ast, mapping))


def _fresh_ids(ast: UOp) -> tuple[int, int]:
    """The first loop id and staging-buffer id that `ast` does not use yet."""
    nodes = ast.toposort()
    return max(u.arg[0] for u in nodes if u.op is Ops.RANGE) + 1, sum(1 for u in nodes if u.op is Ops.DEFINE_LOCAL)


def _stage_buffer(local_id: int, size: int, index: UOp, value: UOp) -> UOp:
    """A staging copy: `BARRIER(local, STORE(local, index, value))`, readable once the BARRIER is placed."""
    local = UOp(Ops.DEFINE_LOCAL, value.dtype, (), (local_id, size))
    return UOp(Ops.BARRIER, value.dtype, (local, UOp(Ops.STORE, dtypes.void, (local, index, value))), "stage")


def _copy_loop(like: UOp, extent: int, loop_id: int) -> UOp:
    return UOp(Ops.RANGE, like.dtype, (UOp.const(like.dtype, extent),), (loop_id, "stage"))


def _copy_loops(root: UOp, dims: list[Dim], first_id: int) -> list[UOp]:
    """One copy loop per axis of the buffer, numbered from `first_id` in the order the linearizer nests them (by id):
    the buffer's axes in order, except that where `root`'s loads do not run contiguously along the last axis (a pack
    that transposes: a weight gradient's `g[b, co, y, x]` copied with its channels `co` contiguous) and do along
    another of at least COPY_RUN values (x), that axis' loop is innermost, so the copy reads contiguous vectors and
    writes with a stride, not a gather per value (a scalar loop, which gcc 12 compiled with a branch for a ReLU's
    mask: a 3x3 weight gradient's pack, 27 -> 7 ms)."""
    loops = [_copy_loop(members[0][0], extent, first_id + i) for i, (members, extent, _) in enumerate(dims)]
    order = list(range(len(dims)))
    value = _replace(root, _copy_values(dims, loops))
    indices = [u.src[1] for u in value.toposort() if u.op is Ops.LOAD and u.src[1].dtype.is_int]

    def contiguous(axis: int) -> int:  # loads read along it with stride 1 (-1: some with another nonzero stride)
        strides = [index_strides(i).get(loops[axis], 0) for i in indices]
        return -1 if any(s not in (0, 1) for s in strides) else strides.count(1)
    if len(dims) > 1 and contiguous(len(dims) - 1) <= 0:
        runs = [(contiguous(a), dims[a][1], a) for a in order[:-1] if dims[a][1] >= COPY_RUN]
        if (best := max((r for r in runs if r[0] > 0), default=None)) is not None:
            order.remove(best[2])
            order.append(best[2])
    ids = {axis: first_id + rank for rank, axis in enumerate(order)}
    return [_copy_loop(members[0][0], extent, ids[a]) for a, (members, extent, _) in enumerate(dims)]


def _copy_values(dims: list[Dim], copies: list[UOp]) -> dict[UOp, UOp]:
    """The loop values at which the copy loops evaluate the staged value: for each axis, a loop of weight +-1 takes
    the axis' weighted sum and the others 0."""
    values: dict[UOp, UOp] = {}
    for (members, _, offset), copy in zip(dims, copies):
        first, weight = next((r, w) for r, w in members if abs(w) == 1)
        total = copy - UOp.const(copy.dtype, offset) if offset else copy
        values[first] = total if weight > 0 else total * UOp.const(copy.dtype, -1)
        values.update({r: UOp.const(r.dtype, 0) for r, _ in members if r is not first})
    return values


def _position(dim: Dim) -> UOp:
    """An axis' index in the tile's loop: the weighted sum of its loops, plus its offset."""
    members, _, offset = dim
    total: UOp | None = None
    for r, weight in members:
        term = r if weight == 1 else r * UOp.const(r.dtype, weight)
        total = term if total is None else total + term
    assert total is not None
    return total + UOp.const(total.dtype, offset) if offset else total


def _flat(positions: list[UOp], dims: list[Dim]) -> UOp:
    """The row-major position in the buffer of one position per axis (the last axis contiguous)."""
    index = positions[0]
    for position, (_, extent, _) in zip(positions[1:], dims[1:]):
        index = index * UOp.const(position.dtype, extent) + position
    return index


# ---------------------------------------------------------------------------------------------- row values

def stage_row_values(ast: UOp) -> UOp:
    """A costly value (an `exp`) that a row reduction computes along the row and the kernel computes again along the
    same row (softmax: `exp(x - max)` in the sum, then in the output) is computed once per row into a staging buffer
    that both read: one copy loop of SIMD lanes, then two passes over L1 (softmax 1024 x 2048 on 2 cores: 0.67 ->
    0.54 ms). Uses are matched by their *canonical form*: the value with its loops inside the row replaced by one
    position along the row, which they must enumerate exactly once, in order (an axis split by opts)."""
    scopes = Scopes()
    nodes = ast.toposort()
    rows = [u for u in nodes if u.op is Ops.REDUCE and scopes(u) and all(r.arg[1] == "global" for r in scopes(u))]
    if not rows:
        return ast
    placeholder, local_id = _fresh_ids(ast)  # (the placeholder: the position's loop id in canonical forms)
    next_id = placeholder + 1
    mapping: dict[UOp, UOp] = {}
    covered: set[UOp] = set()  # the staged values and everything inside them
    for red in rows:
        forms: dict[UOp, list[tuple[UOp, UOp]]] = {}  # canonical form -> uses (node, its index along the row)
        for n in reversed(nodes):  # users before their sources: the largest values first
            if n.op in GroupOp.ALU and n.dtype.is_float and any(u.op in COSTLY for u in n.toposort()) and \
                    (canonical := _canonical(n, scopes(red), scopes, placeholder)) is not None:
                forms.setdefault(canonical[0], []).append((n, canonical[1]))
        body = set(red.src[0].toposort())
        for form, uses in forms.items():
            if len(uses) < 2 or not any(n in body for n, _ in uses) or any(n in covered for n, _ in uses):
                continue
            position = next(u for u in form.toposort() if u.op is Ops.RANGE and u.arg[0] == placeholder)
            copy = _copy_loop(position, position.src[0].arg, next_id)
            next_id += 1
            barrier = _stage_buffer(local_id, position.src[0].arg, copy, _replace(form, {position: copy}))
            local_id += 1
            mapping.update({n: UOp(Ops.LOAD, form.dtype, (barrier, index)) for n, index in uses})
            covered.update(m for n, _ in uses for m in n.toposort())
    return simplify(_replace(ast, mapping)) if mapping else ast


def _canonical(n: UOp, outer: frozenset[UOp], scopes: Scopes, placeholder: int) -> tuple[UOp, UOp] | None:
    """(`n` with its loops other than `outer` replaced by one position along the row (a loop of id `placeholder`,
    as long as the row), `n`'s index along the row), or None when those loops do not enumerate a row of at most
    STAGE_MAX values exactly once in order (strides of a mixed radix times the innermost loop's, the same in every
    index and gate of `n` that they move), or when `n` uses a reduction computed inside the row, or staging
    already."""
    scope = scopes(n)
    inside = n.toposort(stop=lambda x: x.op is Ops.REDUCE)  # (a reduction's inside is its own)
    if not outer <= scope or any(u.op in (Ops.DEFINE_LOCAL, Ops.BARRIER) for u in inside) or \
            any(u.op is Ops.REDUCE and not scopes(u) <= outer for u in inside):
        return None
    loops = [r for r in scope if r not in outer]
    if not loops or any(r.src[0].op is not Ops.CONST for r in loops):
        return None
    strides: dict[UOp, int] = {}
    for leaf in (index_strides(leaf) for leaf in _affine_leaves(n)):  # (one that no such loop moves is per row)
        moves = {r: leaf.get(r, 0) for r in loops}
        if not any(moves.values()):
            continue
        if any(not m for m in moves.values()) or (strides and moves != strides):
            return None
        strides = moves  # type: ignore[assignment]
    if not strides:
        return None
    order = sorted(loops, key=lambda r: -abs(strides[r]))
    unit = strides[order[-1]]  # a row along a strided axis (a softmax of a transposed view) moves by its stride
    size = 1
    for r in reversed(order):  # the innermost moves by one unit, each other by the sizes inside it
        if strides[r] != size * unit:
            return None
        size *= r.src[0].arg
    if size > STAGE_MAX:
        return None
    dtype = order[0].dtype
    position = UOp(Ops.RANGE, dtype, (UOp.const(dtype, size),), (placeholder, "stage"))
    form = simplify(_replace(n, {r: position if r is order[-1] else UOp.const(r.dtype, 0) for r in loops}))
    index = sum((r * UOp.const(dtype, strides[r] // unit) for r in order[:-1]), start=order[-1])  # type: ignore
    return form, index
