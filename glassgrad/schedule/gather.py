"""Gathers: one-hot reductions become data-dependent loads (a tensor-graph rewrite the scheduler runs before fusion).

In: a REDUCE_AXIS of the unmaterialised tensor graph. Out: an equal graph in which the reduction over each axis that
only *selects* one element is a `GATHER` node, or None when there is no such axis.

Advanced indexing, `gather` and `embedding` are built as one-hot sums (glassgrad/indexing.py):

    out[o] = sum_k where(a[o] == k, x[o, k], 0)

which is O(n) work per output: `X[samples]` compares every sample with every row of X. The sum has at most one
non-zero term, the one at k = a[o], so it equals

    out[o] = x[o, a[o]] if 0 <= a[o] < n else 0          (GATHER: one load of a, one load of x)

The rule (`gather_one_hot`) matches REDUCE_AXIS(op, axes) of WHERE(cond, x, 0) where op is ADD (or MAX of bools or
unsigned ints: 0 is their identity too), and `cond` is an AND of terms (movement ops above the ANDs are pushed down
onto each term) of which one, for a reduced axis k, is CMPEQ(a, q) with

  * q equal to k's index itself (an `arange` along k, seen through any movement ops and value-preserving int casts);
  * a independent of every axis collapsed this way (it does not vary along them).

Both are decided on the kernel expressions the KernelBuilder makes for a and q at fresh loop indices
(schedule/indexing.py): what it computes is what the kernel will compute, so reshapes, expands, permutes and the
int64 arithmetic of `Tensor.arange` need no rules of their own here. The other terms of the AND stay in the gathered
value (`x' = where(rest, x, 0)`), evaluated at the selected element. Reduced axes without such a term stay a
REDUCE_AXIS over the GATHER (the batch axis of a cross-entropy's picked log-probabilities).

    GATHER(x', a_1, ..., a_m) arg=(k_1, ..., k_m): shape of x' with the axes k_i of size 1;
    value at o: x'[o with k_i := a_i[o]] if every a_i[o] is in [0, n_i), else 0.

`KernelBuilder` lowers it as a load of each a_i, clamped into [0, n_i) before it becomes an index (so no load is ever
out of bounds and the index keeps a small value range for the simplifier), and a select of 0 where one was out of
range: what the one-hot sum gives for such an index. To the scheduler a GATHER is elementwise-like (one read of its
sources per output), so it fuses with its producers and consumers like a load, and a long reduction over few outputs
is no longer split in two stages when it was a lookup. Gradients are taken on the tensor graph before scheduling, so
they never see a GATHER; `embedding`'s backward (a scatter-add: its one-hot is over the tokens, not an arange along
a reduced axis) keeps its reduction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from glassgrad.dtype import DType, dtypes
from glassgrad.helpers import prod
from glassgrad.uop.ops import GroupOp, Ops, UOp, dtype_bounds
from glassgrad.uop.symbolic import simplify

# movement ops that commute with elementwise ops (a PAD's fill would be the op of the fills, not a fill)
PUSHABLE = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP})
MAX_TERMS = 16  # the most AND terms looked at in one condition
# the ops a condition's operands may contain for the trial lowering (everything the KernelBuilder lowers in a kernel)
LOWERABLE = GroupOp.Elementwise | GroupOp.Movement | frozenset(
    {Ops.BUFFER, Ops.CONST, Ops.DEVICE, Ops.ARANGE, Ops.REDUCE_AXIS, Ops.GATHER, Ops.DETACH, Ops.CONTIGUOUS})


@dataclass(frozen=True)
class Selection:
    """A term `index == arange along axis` of a one-hot condition."""
    axis: int
    index: UOp  # the tensor node compared with the arange (the full shape of the condition)


def gather_one_hot(u: UOp, uses: dict[UOp, int]) -> UOp | None:
    """REDUCE_AXIS(op, where(AND(index == arange_k, ...), x, 0)) -> GATHER (see the module docstring), or None. A sum
    of such a one-hot plus a term constant along the reduced axes, or its negation, is split first (`_one_hot_plus`)."""
    if not _reduces_with_zero(u):
        return None
    where = u.src[0]
    if where.op is not Ops.WHERE:
        return _one_hot_plus(u, uses)
    if not _is_zero(where.src[2]) or not all(isinstance(s, int) for s in where.shape):
        return None
    terms = _conjuncts(where.src[0])
    if terms is None:
        return None
    chosen = _selections(terms, u.arg[1], where.shape)
    if not chosen:
        return None
    return _rebuild(u, where, terms, chosen)


def _one_hot_plus(u: UOp, uses: dict[UOp, int]) -> UOp | None:
    """sum_k ±(c + where(index == k, x, 0)) with c constant along the reduced axes -> ±(n c + GATHER), n the number of
    terms summed (and sum_k -where(...) -> -GATHER). A cross-entropy's backward sums its one-hot's gradient over the
    classes in this form (with label smoothing, the mean's term plus the picked class's): a GPU thread per row looped
    over all 50304 classes of GPT-2's vocabulary."""
    if u.arg[0] is not Ops.ADD or not isinstance(u.device, str):
        return None
    value, negated = u.src[0], False
    while value.op is Ops.NEG:
        value, negated = value.src[0], not negated
    constant: UOp | None = None
    if value.op is Ops.ADD:
        constant, value = value.src if _constant_along(value.src[0], u.arg[1]) else value.src[::-1]
        if not _constant_along(constant, u.arg[1]):
            return None
    if value.op is not Ops.WHERE:
        return None
    total = gather_one_hot(value.reduce_axis(Ops.ADD, u.arg[1]), uses)
    if total is None:
        return None
    if constant is not None:
        count = prod(cast(int, u.src[0].shape[a]) for a in u.arg[1])
        times = UOp.const(u.dtype, count, u.device).reshape((1,) * len(u.shape)).expand(u.shape)
        total = constant.src[0].expand(u.shape) * times + total
    return -total if negated else total


def _constant_along(u: UOp, axes: tuple[int, ...]) -> bool:
    """Whether `u` is an EXPAND of a value with size 1 along every axis of `axes` (and all sizes known)."""
    return u.op is Ops.EXPAND and all(isinstance(d, int) for d in u.shape) and \
        all(u.src[0].shape[a] == 1 for a in axes)


def _reduces_with_zero(u: UOp) -> bool:
    """A reduction for which zeros change nothing: a sum, or a max of values that are never below 0."""
    if u.op is not Ops.REDUCE_AXIS:
        return False
    return u.arg[0] is Ops.ADD or (u.arg[0] is Ops.MAX and (u.dtype.is_bool or u.dtype.is_unsigned))


def _is_zero(u: UOp) -> bool:
    """A constant 0 (or False), seen through movement ops and casts."""
    while u.op in GroupOp.Movement or u.op is Ops.CAST:
        u = u.src[0]
    return u.op is Ops.CONST and not isinstance(u.arg, UOp) and u.arg == 0


def _conjuncts(cond: UOp) -> list[UOp] | None:
    """The terms of an AND tree, each with the movement ops above it pushed down onto its sources (a comparison's
    operands get them), so every term has the condition's shape. None for more than MAX_TERMS terms."""
    terms: list[UOp] = []
    stack: list[tuple[UOp, tuple[UOp, ...]]] = [(cond, ())]
    while stack:
        node, moves = stack.pop()
        while node.op in PUSHABLE:
            moves, node = (*moves, node), node.src[0]
        if node.op is Ops.AND and node.dtype == dtypes.bool:
            stack.extend((s, moves) for s in reversed(node.src))
        elif node.op is Ops.CMPEQ:
            terms.append(node.replace(src=tuple(_apply(moves, s) for s in node.src)))
        else:
            terms.append(_apply(moves, node))
        if len(terms) > MAX_TERMS:
            return None
    return terms


def _apply(moves: tuple[UOp, ...], node: UOp) -> UOp:
    """The movement ops `moves` (outermost first) applied to `node` instead of their original source."""
    for move in reversed(moves):
        node = UOp(move.op, node.dtype, (node,), move.arg)
    return node


def _selections(terms: list[UOp], axes: tuple[int, ...], shape: tuple[int, ...]) -> list[tuple[int, Selection]]:
    """For each reduced axis (longer than 1) the first term `index == arange along it` whose index varies along no
    selected axis, as (term position, Selection). Decided on the terms' kernel expressions at fresh loop indices."""
    from glassgrad.schedule import REALIZED  # (the scheduler imports this module)
    from glassgrad.schedule.indexing import KernelBuilder
    builder = KernelBuilder(REALIZED.get)
    ranges = tuple(builder.new_range(s, "global") if s != 1 else UOp.const(dtypes.int32, 0) for s in shape)
    candidates: list[tuple[int, Selection, UOp]] = []
    taken: set[int] = set()
    for position, term in enumerate(terms):
        if term.op is not Ops.CMPEQ or not all(_lowerable(s) for s in term.src) or not term.src[0].dtype.is_int:
            continue
        for index, other in (term.src, term.src[::-1]):
            if not _arange_like(other):
                continue
            axis = _arange_axis(simplify(builder.lower(other, ranges, None)), ranges, axes, taken)
            if axis is not None:
                candidates.append((position, Selection(axis, index), simplify(builder.lower(index, ranges, None))))
                taken.add(axis)
                break
    while True:  # drop a term whose index varies along a selected axis, until none does
        selected = {ranges[c[1].axis] for c in candidates}
        kept = [c for c in candidates if not any(u in selected for u in c[2].toposort())]
        if len(kept) == len(candidates):
            return [(p, s) for p, s, _ in kept]
        candidates = kept


ARANGE_OPS = GroupOp.Movement | frozenset({Ops.CAST, Ops.ADD, Ops.MUL, Ops.NEG, Ops.CONST, Ops.DEVICE})
ARANGE_MAX_NODES = 64


def _arange_like(u: UOp) -> bool:
    """A cheap test before the trial lowering: `u` is a small graph of arithmetic and movement ops on an ARANGE
    (what `Tensor.arange` builds), not, say, the other side of `x == x.max()` (a max-pool's backward)."""
    seen: set[UOp] = set()
    stack, found = [u], False
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if len(seen) > ARANGE_MAX_NODES or (n.op is not Ops.ARANGE and n.op not in ARANGE_OPS):
            return False
        found = found or n.op is Ops.ARANGE
        stack.extend(n.src)
    return found


def _lowerable(u: UOp) -> bool:
    from glassgrad.schedule import REALIZED
    return all(n.op in LOWERABLE for n in u.toposort(stop=lambda n: n in REALIZED) if n not in REALIZED)


def _arange_axis(value: UOp, ranges: tuple[UOp, ...], axes: tuple[int, ...], taken: set[int]) -> int | None:
    """The reduced axis (not yet taken) whose index `value` is, up to value-preserving int casts, else None."""
    while value.op is Ops.CAST and value.dtype.is_int and value.src[0].dtype.is_int and \
            _fits(value.src[0], value.dtype):
        value = value.src[0]
    return next((a for a in axes if ranges[a] is value and a not in taken and ranges[a].op is Ops.RANGE), None)


def _fits(u: UOp, dtype: DType) -> bool:
    lo, hi = dtype_bounds(dtype)
    return bool(lo <= u.vmin and u.vmax <= hi)


def masked_by_the_rest(value: UOp, zero: UOp, terms: list[UOp], chosen: list[tuple[int, Selection]]) -> UOp:
    """where(rest, value, zero): the AND terms of the condition that no chosen selection took stay in the value."""
    picked = {p for p, _ in chosen}
    rest = [t for p, t in enumerate(terms) if p not in picked]
    if not rest:
        return value
    cond = rest[0]
    for t in rest[1:]:
        cond = cond.alu(Ops.AND, t)
    return cond.where(value, zero)


def selected_indices(chosen: list[tuple[int, Selection]], shape: tuple[int, ...]) -> tuple[tuple[int, ...],
                                                                                          tuple[UOp, ...]]:
    """(the selected axes, each selection's index tensor with those axes of size 1)."""
    selected = tuple(s.axis for _, s in chosen)
    bounds = tuple((0, 1) if i in selected else (0, n) for i, n in enumerate(shape))
    return selected, tuple(s.index.shrink(bounds) for _, s in chosen)


def _rebuild(u: UOp, where: UOp, terms: list[UOp], chosen: list[tuple[int, Selection]]) -> UOp:
    """GATHER over the selected axes of where(rest, x, 0), reduced over the other axes as before."""
    value = masked_by_the_rest(where.src[1], where.src[2], terms, chosen)
    gathered, indices = selected_indices(chosen, where.shape)
    node = UOp(Ops.GATHER, value.dtype, (value, *indices), gathered)
    others = tuple(a for a in u.arg[1] if a not in gathered)
    return node.reduce_axis(u.arg[0], others) if others else node
