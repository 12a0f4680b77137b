"""Linearisation: a kernel AST (a DAG) -> a flat list of UOps in execution order, with explicit loops.

In: `SINK(STORE(...))` whose values are written over RANGE nodes and REDUCE nodes. Out: a list such as

    DEFINE_GLOBAL 0, DEFINE_GLOBAL 1, RANGE r0 (global), ...values..., DEFINE_ACC a,
    RANGE r1 (reduce), ...values that depend on r1..., ACCUMULATE a, ENDRANGE r1, ...epilogue..., STORE, ENDRANGE r0

Global loops open first, outermost first. Each REDUCE becomes an accumulator: everything its input needs that
does not depend on its reduce loops is placed before the loop (hoisted), the rest inside. Consumers of a
REDUCE read its accumulator after the loop.
"""
from __future__ import annotations

from glassgrad.dtype import DType, dtypes
from glassgrad.helpers import prod
from glassgrad.uop.ops import GroupOp, Ops, UOp


def reduce_identity(op: Ops, dtype: DType) -> int | float | bool:
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    return dtype.min()


class Scopes:
    """Which loops each node depends on (open RANGEs under it, not counting those a REDUCE under it closes)."""

    def __init__(self) -> None:
        self._memo: dict[UOp, frozenset[UOp]] = {}

    def __call__(self, u: UOp) -> frozenset[UOp]:
        if u not in self._memo:
            for n in u.toposort(stop=lambda x: x in self._memo):
                if n in self._memo:
                    continue
                if n.op is Ops.RANGE:
                    self._memo[n] = frozenset({n})
                elif n.op is Ops.REDUCE:
                    self._memo[n] = self._memo[n.src[0]] - frozenset(n.src[1:])
                else:
                    self._memo[n] = frozenset().union(*(self._memo[s] for s in n.src))
        return self._memo[u]


def linearize(sink: UOp) -> list[UOp]:
    scopes = Scopes()
    nodes = sink.toposort()
    program: list[UOp] = sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    program += sorted((u for u in nodes if u.op is Ops.SPECIAL), key=lambda u: u.arg[0])  # GPU ids come first
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    program += global_ranges
    emitted: set[UOp] = set(program)

    def emit(root: UOp) -> None:
        for n in root.toposort(stop=lambda x: x in emitted or x.op is Ops.REDUCE):
            if n in emitted:
                continue
            if n.op is Ops.REDUCE:
                emit_reduce(n)
            else:
                program.append(n)
                emitted.add(n)

    def emit_reduce(red: UOp) -> None:
        value, loops = red.src[0], frozenset(red.src[1:])
        # hoist what the loop does not change (another REDUCE is emitted whole, never split across loops)
        for n in value.toposort(stop=lambda x: x in emitted or x.op is Ops.REDUCE):
            if n not in emitted and n.op is not Ops.RANGE and not scopes(n) & loops:
                emit(n)
        acc = UOp(Ops.DEFINE_ACC, red.dtype, (UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)),), red)
        program.append(acc)
        program.extend(red.src[1:])
        emitted.update(red.src[1:])
        emit(value)
        program.append(UOp(Ops.ACCUMULATE, red.dtype, (acc, value), red.arg))
        program.extend(UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(red.src[1:]))
        emitted.add(red)

    emit(sink)
    program.remove(sink)
    program.extend(UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(global_ranges))
    return program


def estimate_flops(sink: UOp) -> int:
    """ALU operations executed, counting each node once per iteration of the loops it sits in."""
    scopes = Scopes()
    total = 0
    for n in sink.toposort():
        if (n.op in GroupOp.ALU and n.dtype.is_float) or n.op is Ops.REDUCE:
            total += prod(r.src[0].arg for r in scopes(n.src[0] if n.op is Ops.REDUCE else n))
    return total
