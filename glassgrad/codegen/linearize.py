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


class _Emitter:
    """Builds the linear program. Tracks which values exist in the current loop scope: a value computed inside a
    loop is gone when that loop closes, so a later use outside recomputes it."""

    def __init__(self, program: list[UOp], scopes: Scopes, reduces: list[UOp]) -> None:
        self.program = program
        self.scopes = scopes
        self.reduces = reduces
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
                self.emit_reduce(self.siblings(n), None)
            else:
                self.add(n)

    def siblings(self, red: UOp) -> list[UOp]:
        """`red` and the other REDUCEs of the kernel over the same loops that can share its loop: a register tile
        of outputs is one loop with an accumulator per output, not a loop per output."""
        def independent(r: UOp) -> bool:
            return not any(n.op is Ops.REDUCE for n in r.src[0].toposort(stop=lambda x: x.op is Ops.REDUCE))
        if not independent(red):
            return [red]
        return [r for r in self.reduces if r.src[1:] == red.src[1:] and r not in self.emitted
                and self.scopes(r) == self.scopes(red) and independent(r)]

    def emit_scoped(self, values: list[UOp], opened: frozenset[UOp], loops: frozenset[UOp]) -> None:
        """Emit what `values` need that depends on no loop of `loops` outside `opened` (each node goes in the
        innermost loop it depends on: e.g. a tile copied to shared memory once per outer iteration)."""
        for value in values:
            for n in value.toposort(stop=lambda x: x in self.emitted or x.op is Ops.REDUCE):
                if n not in self.emitted and n.op is not Ops.RANGE and self.scopes(n) & loops <= opened:
                    self.emit(n)

    def emit_reduce(self, reds: list[UOp], upcast: UOp | None) -> None:
        """DEFINE_ACC for each of `reds` (REDUCEs over the same loops), the reduce loops (and inside them the upcast
        loop, with one accumulator per iteration), the values, ACCUMULATE. What the loops do not change is computed
        before them (hoisted)."""
        loops = reds[0].src[1:]
        inner = frozenset(loops) | ({upcast} if upcast is not None else set())
        values = [red.src[0] for red in reds]
        self.emit_scoped(values, frozenset(), inner)
        accs = []
        for red in reds:
            init = UOp.const(red.dtype, reduce_identity(red.arg, red.dtype))
            accs.append(UOp(Ops.DEFINE_ACC, red.dtype, (init,) if upcast is None else (init, upcast), red))
            self.add(accs[-1])
        opened: frozenset[UOp] = frozenset()
        for r in [*loops, *([upcast] if upcast is not None else [])]:
            self.open_loop(r)
            opened |= {r}
            self.emit_scoped(values, opened, inner)
        for red, acc in zip(reds, accs):
            self.program.append(UOp(Ops.ACCUMULATE, red.dtype, (acc, red.src[0]), red.arg))
        for r in ([upcast] if upcast is not None else []) + list(reversed(loops)):
            self.close_loop(r)
        for red in reds:
            self.emitted.add(red)  # the accumulator now holds the REDUCE's value (its consumers read it)
            self.frames[-1].append(red)


def linearize(sink: UOp, upcast: UOp | None = None) -> list[UOp]:
    """`upcast`: a global RANGE to place *inside* the reduce loops (an accumulator per iteration), then loop over
    again for the rest of the kernel. Its loads being contiguous, the innermost loop then vectorises."""
    scopes = Scopes()
    nodes = sink.toposort()
    program: list[UOp] = sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    program += sorted((u for u in nodes if u.op is Ops.SPECIAL), key=lambda u: u.arg[0])  # GPU ids come first
    program += [u for u in nodes if u.op is Ops.DEFINE_LOCAL]
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global" and u is not upcast),
                           key=lambda u: u.arg[0])
    program += global_ranges
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    emitter = _Emitter(program, scopes, reduces)
    if upcast is not None:
        for red in reduces:
            if red not in emitter.emitted:
                emitter.emit_reduce([red], upcast if upcast in scopes(red) else None)
        emitter.open_loop(upcast)
    emitter.emit(sink)
    program.remove(sink)
    if upcast is not None:
        emitter.close_loop(upcast)
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
