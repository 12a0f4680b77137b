"""Tensor-graph rewrites the scheduler applies before it cuts the graph into kernels.

In: the unmaterialised part of a tensor graph (nodes in topological order). Out: an equal graph, rebuilt bottom-up
with a rule applied to every node (`rebuild`), or None when the rule changed nothing.

The rule defined here merges nested reductions:

    reduce(op, V(reduce(op, x)))  ->  reduce(op, V'(x)) over both sets of axes

where V is a (possibly empty) chain of movement ops that never repeats an element (reshape, pad, shrink, permute,
flip: no expand), and V' is V applied with the inner reduction's axes carried along as trailing axes. Every element
of the inner result feeds at most one element of the outer one, so the merged reduction does the same arithmetic, in
one kernel and without the inner result in memory. A pad of the inner result adds elements equal to 0; padded
inside, they are reductions of zeros, which are 0 for ADD and MAX alike.

Only a short outer reduction is merged (at most `MERGE_MAX_OUTER` elements summed per output: a window's taps).
The merged reduction has the inner one's outputs divided by the outer length, so a long outer reduction would turn
a well-shaped kernel into a long reduction into few outputs: `(a @ b).sum(0)` would re-read `b` once per row of `a`
(measured 12x slower on the CPU than the tiled matmul followed by a sum of its rows).

This is a convolution's input gradient: the gradient of its sliding windows, (N, Cin, OH, OW, KH, KW) summed over
the output channels, is folded back onto the input by summing the windows' overlapping elements (the gradient of
the windows' EXPAND, seen through reshapes and pads). Merged, each input element sums over (kh, kw, cout) directly:
a transposed convolution, instead of a 6-D intermediate N*Cin*OH*OW*KH*KW floats large and a second kernel.
"""
from __future__ import annotations

from collections.abc import Callable

from glassgrad.helpers import prod
from glassgrad.uop.ops import Ops, UOp

INJECTIVE = (Ops.RESHAPE, Ops.PAD, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP)  # movement ops that never repeat an element
MERGEABLE = (Ops.ADD, Ops.MAX)  # reductions whose value over padding zeros is the padding's value, 0
MERGE_MAX_OUTER = 32  # the longest outer reduction merged into the inner one (a convolution's taps along one axis)


def rebuild(nodes: list[UOp], rule: Callable[[UOp, dict[UOp, int]], UOp | None],
            materialised: Callable[[UOp], bool]) -> UOp | None:
    """Rebuild `nodes` (topologically ordered, the root last) bottom-up, replacing a node by `rule(node, uses)` where
    that is not None. `uses` counts the readers of each rebuilt node (a node the rule made has one). Materialised
    nodes and everything under them are kept as they are (they are found in REALIZED by identity). None if the rule
    changed nothing."""
    uses: dict[UOp, int] = {}
    for n in nodes:
        for s in n.src:
            uses[s] = uses.get(s, 0) + 1
    new: dict[UOp, UOp] = {}
    changed = False
    for n in nodes:
        if materialised(n):
            new[n] = n
            continue
        srcs = tuple(new[s] for s in n.src)
        rebuilt = n if all(a is b for a, b in zip(srcs, n.src)) else n.replace(src=srcs)
        if rebuilt is not n:
            uses[rebuilt] = uses.get(n, 1)
        replacement = rule(rebuilt, uses)
        if replacement is not None:
            uses[replacement] = uses.get(rebuilt, 1)
            rebuilt, changed = replacement, True
        new[n] = rebuilt
    return new[nodes[-1]] if changed else None


def merge_nested_reduce(u: UOp, uses: dict[UOp, int]) -> UOp | None:
    """reduce(op, V(reduce(op, x))) -> one reduction over V'(x) (see the module docstring), or None.

    The inner reduction and the ops between the two must have this one reader: a second reader would need the
    inner result anyway (and merging would compute it twice)."""
    if u.op is not Ops.REDUCE_AXIS or u.arg[0] not in MERGEABLE:
        return None
    outer_length = prod(u.src[0].shape[a] for a in u.arg[1])
    if not isinstance(outer_length, int) or outer_length > MERGE_MAX_OUTER:
        return None
    chain: list[UOp] = []
    inner = u.src[0]
    while inner.op in INJECTIVE and uses.get(inner, 1) == 1:
        chain.append(inner)
        inner = inner.src[0]
    if inner.op is not Ops.REDUCE_AXIS or inner.arg[0] is not u.arg[0] or uses.get(inner, 1) != 1:
        return None
    x, inner_axes = inner.src[0], inner.arg[1]
    kept = [i for i in range(len(x.shape)) if i not in inner_axes]
    carried = tuple(x.shape[a] for a in inner_axes)
    if 0 in carried:  # an empty inner reduction is its identity, which a pad's zeros reduced again are not (MAX)
        return None
    # x with the inner reduction's axes moved to the end, then shaped as the inner result with them appended
    lifted = x.permute(tuple(kept + list(inner_axes))).reshape(inner.shape + carried)
    for movement in reversed(chain):
        lifted = _carry(movement, lifted, len(carried))
    trailing = tuple(range(len(u.shape), len(u.shape) + len(carried)))
    return lifted.reduce_axis(u.arg[0], u.arg[1] + trailing).reshape(u.shape)


def _carry(movement: UOp, src: UOp, extra: int) -> UOp:
    """`movement` applied to `src`, whose shape is movement's source shape with `extra` more trailing axes."""
    tail = src.shape[len(src.shape) - extra:]
    if movement.op is Ops.RESHAPE:
        return src.reshape(tuple(movement.arg) + tail)
    if movement.op is Ops.PAD:
        return src.pad(tuple(movement.arg) + ((0, 0),) * extra)
    if movement.op is Ops.SHRINK:
        return src.shrink(tuple(movement.arg) + tuple((0, s) for s in tail))
    if movement.op is Ops.PERMUTE:
        n = len(movement.arg)
        return src.permute(tuple(movement.arg) + tuple(range(n, n + extra)))
    assert movement.op is Ops.FLIP, movement.op
    return src.flip(tuple(movement.arg) + (False,) * extra)
