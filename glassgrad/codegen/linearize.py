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
from glassgrad.uop.sint import sint, sint_add, sint_prod


def range_size(r: UOp) -> sint:
    """A loop's trip count: an int, or a symbolic size (an expression of DEFINE_VARs, the kernel's int arguments)."""
    return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0]


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


class _Emitter:
    """Builds the linear program. Tracks which values exist in the current loop scope: a value computed inside a
    loop is gone when that loop closes, so a later use outside recomputes it."""

    def __init__(self, program: list[UOp], scopes: Scopes) -> None:
        self.program = program
        self.scopes = scopes
        self.emitted: set[UOp] = set(program)
        self.frames: list[list[UOp]] = [[]]

    def add(self, u: UOp) -> None:
        self.program.append(u)
        self.emitted.add(u)
        self.frames[-1].append(u)

    def open_loop(self, r: UOp) -> None:
        self.program.append(r)
        self.frames.append([])
        self.emitted.add(r)
        self.frames[-1].append(r)

    def close_loop(self, r: UOp) -> None:
        self.program.append(UOp(Ops.ENDRANGE, dtypes.void, (r,)))
        self.emitted.difference_update(self.frames.pop())

    def emit(self, root: UOp) -> None:
        for n in root.toposort(stop=lambda x: x in self.emitted or x.op is Ops.REDUCE):
            if n in self.emitted:
                continue
            if n.op is Ops.REDUCE:
                self.emit_reduce(n, None)
            else:
                self.add(n)

    def emit_reduce(self, red: UOp, upcast: UOp | None) -> None:
        """DEFINE_ACC, the reduce loops (and inside them the upcast loop, with one accumulator per iteration),
        the value, ACCUMULATE. What the loops do not change is computed before them (hoisted)."""
        value, loops = red.src[0], frozenset(red.src[1:])
        inner = loops | ({upcast} if upcast is not None else set())
        for n in value.toposort(stop=lambda x: x in self.emitted or x.op is Ops.REDUCE):
            if n not in self.emitted and n.op is not Ops.RANGE and not self.scopes(n) & inner:
                self.emit(n)
        init = UOp.const(red.dtype, reduce_identity(red.arg, red.dtype))
        acc = UOp(Ops.DEFINE_ACC, red.dtype, (init,) if upcast is None else (init, upcast), red)
        self.add(acc)
        for r in red.src[1:]:
            self.emit(r.src[0])  # a symbolic trip count is computed before its loop
            self.open_loop(r)
        if upcast is not None:
            self.open_loop(upcast)
        self.emit(value)
        self.program.append(UOp(Ops.ACCUMULATE, red.dtype, (acc, value), red.arg))
        for r in ([upcast] if upcast is not None else []) + list(reversed(red.src[1:])):
            self.close_loop(r)
        self.emitted.add(red)  # the accumulator now holds the REDUCE's value (its consumers read it)
        self.frames[-1].append(red)


def linearize(sink: UOp, upcast: UOp | None = None) -> list[UOp]:
    """`upcast`: a global RANGE to place *inside* the reduce loops (an accumulator per iteration), then loop over
    again for the rest of the kernel. Its loads being contiguous, the innermost loop then vectorises."""
    scopes = Scopes()
    nodes = sink.toposort()
    program: list[UOp] = sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    program += sorted((u for u in nodes if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0])  # int parameters
    emitter = _Emitter(program, scopes)
    for special in sorted((u for u in nodes if u.op is Ops.SPECIAL), key=lambda u: u.arg[0]):  # GPU ids come first
        emitter.emit(special)  # with its symbolic limit, if it has one
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global" and u is not upcast),
                           key=lambda u: u.arg[0])
    for r in global_ranges:
        if r.src[0].op is not Ops.CONST:
            emitter.emit(r.src[0])  # a symbolic trip count
        emitter.add(r)
    if upcast is not None:
        for red in (u for u in nodes if u.op is Ops.REDUCE):
            if red not in emitter.emitted:
                emitter.emit_reduce(red, upcast if upcast in scopes(red) else None)
        emitter.open_loop(upcast)
    emitter.emit(sink)
    program.remove(sink)
    if upcast is not None:
        emitter.close_loop(upcast)
    program.extend(UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(global_ranges))
    return program


def estimate_flops(sink: UOp) -> sint:
    """ALU operations executed, counting each node once per iteration of the loops it sits in (symbolic when a
    loop's trip count is)."""
    scopes = Scopes()
    total: sint = 0
    for n in sink.toposort():
        if (n.op in GroupOp.ALU and n.dtype.is_float) or n.op is Ops.REDUCE:
            sizes = [range_size(r) for r in scopes(n.src[0] if n.op is Ops.REDUCE else n)]
            total = sint_add(total, prod(sizes) if all(isinstance(x, int) for x in sizes) else sint_prod(sizes))  # type: ignore[arg-type]
    return total
