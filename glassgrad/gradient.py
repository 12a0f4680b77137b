"""Autograd on the tensor graph: one rule per primitive op.

In: a scalar-or-tensor root node, the gradient flowing into it, and the target nodes. Out: {target: gradient node}.
Each rule maps (gradient of the output, the node) to gradients of its sources (None where a source gets none).
Gradients are themselves lazy tensor-graph nodes, so the backward pass is scheduled and fused like anything else.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from glassgrad.dtype import dtypes
from glassgrad.uop.ops import GroupOp, Ops, UOp
from glassgrad.uop.sint import sint_add, sint_sub

Grads = tuple[UOp | None, ...]


def _c(like: UOp, value: float) -> UOp:
    return UOp.const(like.dtype, value, like.device).reshape((1,) * len(like.shape)).expand(like.shape)


def _cos(x: UOp) -> UOp:
    """cos x as 1 - 2 sin(x/2)^2 (as `Tensor.cos`: x/2 is exact, pi/2 - x is not for a large x)."""
    s = x.alu(Ops.MUL, _c(x, 0.5)).alu(Ops.SIN)
    return _c(x, 1.0).alu(Ops.ADD, _c(x, -2.0).alu(Ops.MUL, s.alu(Ops.MUL, s)))


def _true(like: UOp) -> UOp:
    return UOp.const(dtypes.bool, True, like.device).reshape((1,) * len(like.shape)).expand(like.shape)


def _sum_to(g: UOp, shape: tuple[int, ...]) -> UOp:
    """Undo an EXPAND: sum the broadcast dimensions back to `shape`."""
    axes = tuple(i for i, (a, b) in enumerate(zip(shape, g.shape)) if a != b)
    if not axes:
        return g
    return g.reduce_axis(Ops.ADD, axes)


def _reduce_grad(g: UOp, node: UOp) -> Grads:
    op, axes = node.arg
    src = node.src[0]
    if op is Ops.ADD:
        return (g.expand(src.shape),)
    if op is Ops.MAX:
        hit = src.alu(Ops.CMPEQ, node.expand(src.shape)).cast(src.dtype)
        count = hit.reduce_axis(Ops.ADD, axes)
        return (hit.alu(Ops.MUL, g.alu(Ops.FDIV, count).expand(src.shape)),)
    return (g.expand(src.shape).alu(Ops.MUL, _product_of_others(src, node, axes)),)


def _product_of_others(src: UOp, prod: UOp, axes: tuple[int, ...]) -> UOp:
    """d(prod x)/dx_i: prod/x_i where nothing is 0; with one 0 in the group, the product of the rest at the 0 and 0
    elsewhere; with more zeros, 0 everywhere. (prod/x_i alone would give 0/0 = NaN at a zero.)"""
    zero = _c(src, 0.0)
    is_zero = src.alu(Ops.CMPEQ, zero)
    zeros = is_zero.cast(src.dtype).reduce_axis(Ops.ADD, axes).expand(src.shape)
    nonzero_prod = is_zero.where(_c(src, 1.0), src).reduce_axis(Ops.MUL, axes).expand(src.shape)
    safe_src = is_zero.where(_c(src, 1.0), src)
    no_zeros = prod.expand(src.shape).alu(Ops.FDIV, safe_src)
    one_zero = is_zero.where(nonzero_prod, zero)
    return zeros.alu(Ops.CMPEQ, zero).where(no_zeros, zeros.alu(Ops.CMPEQ, _c(src, 1.0)).where(one_zero, zero))


def _pow_grad(g: UOp, node: UOp) -> Grads:
    a, b = node.src
    # d/da a^b = b a^(b-1); define it as 0 where b == 0 (as PyTorch does), not 0 * 0^-1 = NaN
    slope = b.alu(Ops.MUL, a.alu(Ops.POW, b.alu(Ops.ADD, _c(b, -1.0))))
    da = b.alu(Ops.CMPEQ, _c(b, 0.0)).where(_c(g, 0.0), g.alu(Ops.MUL, slope))
    ln_a = a.alu(Ops.LOG2).alu(Ops.MUL, _c(a, math.log(2)))
    # d/db a^b = a^b ln a. Where a == 0 and b >= 0 that is 0 * -inf: define it as 0, as PyTorch does; for b < 0 it is
    # inf * -inf = -inf (PyTorch's value too), which the formula gives
    db = g.alu(Ops.MUL, node.alu(Ops.MUL, ln_a))
    zero_base_flat = a.alu(Ops.CMPEQ, _c(a, 0.0)).alu(Ops.AND, b.alu(Ops.CMPLT, _c(b, 0.0)).alu(Ops.XOR, _true(b)))
    db = zero_base_flat.where(_c(g, 0.0), db)
    return (da, db)


def _max_grad(g: UOp, node: UOp) -> Grads:
    a, b = node.src
    half = _c(g, 0.5)
    a_share = a.alu(Ops.CMPLT, b).where(_c(g, 0.0), a.alu(Ops.CMPEQ, b).where(half, _c(g, 1.0)))
    return (g.alu(Ops.MUL, a_share), g.alu(Ops.MUL, _c(g, 1.0).alu(Ops.ADD, a_share.alu(Ops.NEG))))


def _pad_grad(g: UOp, node: UOp) -> Grads:
    return (g.shrink(tuple((b, sint_add(b, s)) for (b, _), s in zip(node.arg, node.src[0].shape))),)


def _shrink_grad(g: UOp, node: UOp) -> Grads:  # bounds and sizes may be symbolic (a shrink to a bound Variable)
    return (g.pad(tuple((b, sint_sub(s, e)) for (b, e), s in zip(node.arg, node.src[0].shape))),)


def _permute_grad(g: UOp, node: UOp) -> Grads:
    inverse = tuple(sorted(range(len(node.arg)), key=lambda i: node.arg[i]))
    return (g.permute(inverse),)


def _multi_grad(g: UOp, node: UOp) -> Grads:
    """A tensor on several devices (glassgrad/multi.py): each part gets its slice of the gradient, on its device. A
    replicated tensor's parts are one value: its first part gets the gradient (a sum over copies would count it n
    times)."""
    def to(u: UOp, device: str) -> UOp:
        return UOp(Ops.COPY, u.dtype, (u, UOp(Ops.DEVICE, dtypes.void, (), device)))
    axis = node.arg
    if axis is None:
        return (to(g, node.src[0].device), *(None for _ in node.src[1:]))
    out, start = [], 0
    for part in node.src:
        end = start + part.shape[axis]
        out.append(to(g.shrink(tuple((start, end) if i == axis else (0, s) for i, s in enumerate(g.shape))),
                      part.device))
        start = end
    return tuple(out)


RULES: dict[Ops, Callable[[UOp, UOp], Grads]] = {
    Ops.ADD: lambda g, n: (g, g),
    Ops.MUL: lambda g, n: (g.alu(Ops.MUL, n.src[1]), g.alu(Ops.MUL, n.src[0])),
    Ops.FDIV: lambda g, n: (g.alu(Ops.FDIV, n.src[1]),
                            g.alu(Ops.MUL, n.src[0]).alu(Ops.FDIV, n.src[1].alu(Ops.MUL, n.src[1])).alu(Ops.NEG)),
    Ops.NEG: lambda g, n: (g.alu(Ops.NEG),),
    Ops.RECIP: lambda g, n: (g.alu(Ops.MUL, n.alu(Ops.MUL, n)).alu(Ops.NEG),),
    Ops.SQRT: lambda g, n: (g.alu(Ops.FDIV, n.alu(Ops.MUL, _c(n, 2.0))),),
    Ops.EXP2: lambda g, n: (g.alu(Ops.MUL, n.alu(Ops.MUL, _c(n, math.log(2)))),),
    Ops.LOG2: lambda g, n: (g.alu(Ops.FDIV, n.src[0].alu(Ops.MUL, _c(n, math.log(2)))),),
    Ops.SIN: lambda g, n: (g.alu(Ops.MUL, _cos(n.src[0])),),
    Ops.MOD: lambda g, n: (g, g.alu(Ops.MUL, n.src[0].alu(Ops.FDIV, n.src[1]).alu(Ops.TRUNC)).alu(Ops.NEG)),
    Ops.TRUNC: lambda g, n: (_c(g, 0.0),),
    Ops.POW: _pow_grad,
    Ops.MAX: _max_grad,
    Ops.WHERE: lambda g, n: (None, n.src[0].where(g, _c(g, 0.0)), n.src[0].where(_c(g, 0.0), g)),
    Ops.CAST: lambda g, n: (g.cast(n.src[0].dtype) if n.src[0].dtype.is_float else None,),
    Ops.RESHAPE: lambda g, n: (g.reshape(n.src[0].shape),),
    Ops.EXPAND: lambda g, n: (_sum_to(g, n.src[0].shape),),
    Ops.PERMUTE: _permute_grad,
    Ops.PAD: _pad_grad,
    Ops.SHRINK: _shrink_grad,
    Ops.FLIP: lambda g, n: (g.flip(n.arg),),
    Ops.REDUCE_AXIS: _reduce_grad,
    Ops.CONTIGUOUS: lambda g, n: (g,),
    Ops.CONTIGUOUS_BACKWARD: lambda g, n: (UOp(Ops.CONTIGUOUS, g.dtype, (g,)),),
    Ops.ASSIGN: lambda g, n: (None, g),
    Ops.COPY: lambda g, n: (UOp(Ops.COPY, g.dtype, (g, UOp(Ops.DEVICE, dtypes.void, (), n.src[0].device))),),
    Ops.MULTI: _multi_grad,
}
NO_GRADIENT = GroupOp.Comparison | {Ops.IDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.BITCAST, Ops.DETACH,
                                    Ops.CONST, Ops.BUFFER, Ops.DEVICE, Ops.ARANGE}


def compute_gradient(root: UOp, root_grad: UOp, targets: set[UOp], order: list[UOp] | None = None
                     ) -> dict[UOp, UOp]:
    """Reverse-mode accumulation from `root` to every node in `targets` that it depends on. `order`: `root.toposort()`
    when the caller has it (`backward` walked the graph already); used when it holds no DETACH, since the walk that
    stops at DETACH nodes then lists the same nodes in the same order."""
    detach = Ops.DETACH  # (a local: an Enum member's lookup is slow, and these loops run over the whole graph)
    if order is None or any(n.op is detach for n in order):
        order = root.toposort(stop=lambda n: n.op is detach)
    # only walk nodes that lie on a path to some target
    on_path: dict[UOp, bool] = {}
    for n in order:
        found = n in targets
        if not found and n.op is not detach:
            for s in n.src:
                if on_path[s]:  # (every source is listed before the node: toposort)
                    found = True
                    break
        on_path[n] = found
    grads: dict[UOp, UOp] = {root: root_grad}
    for node in reversed(order):
        g = grads.get(node)
        if g is None or node.op in NO_GRADIENT or not on_path[node]:
            continue
        rule = RULES.get(node.op)
        if rule is None:
            raise RuntimeError(f"no gradient rule for {node.op}")
        for src, src_grad in zip(node.src, rule(g, node)):
            if src_grad is None or not on_path.get(src, False) or not src.dtype.is_float:
                continue
            grads[src] = src_grad if src not in grads else grads[src].alu(Ops.ADD, src_grad)
    return {t: grads[t] for t in targets if t in grads}
