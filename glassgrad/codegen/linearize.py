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
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.sint import sint, sint_add, sint_prod
from glassgrad.uop.symbolic import simplify


def range_size(r: UOp) -> sint:
    """A loop's trip count: an int, or a symbolic size (an expression of DEFINE_VARs, the kernel's int arguments)."""
    return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0]


def reduce_identity(op: Ops, dtype: DType) -> int | float | bool:
    if op is Ops.ADD:
        return 0
    if op is Ops.MUL:
        return 1
    return dtype.min


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
                elif _is_stage(n):  # its copy loops are its own: it depends on the loops around them
                    self._memo[n] = frozenset(r for s in n.src for r in self._memo[s] if r.arg[1] != "stage")
                else:
                    self._memo[n] = frozenset().union(*(self._memo[s] for s in n.src))
        return self._memo[u]


class _Emitter:
    """Builds the linear program. Tracks which values exist in the current loop scope: a value computed inside a
    loop is gone when that loop closes, so a later use outside recomputes it."""

    def __init__(self, program: list[UOp], scopes: Scopes, reduces: list[UOp], tile: tuple[UOp, ...] = ()) -> None:
        self.program = program
        self.tile = tile  # the register tile's loops, outermost first
        self.scopes = scopes
        self.reduces = reduces
        self.emitted: set[UOp] = set(program)
        self.frames: list[list[UOp]] = [[]]
        self.open_ranges: set[UOp] = set()  # the loops open where the next node goes

    def add(self, u: UOp) -> None:
        if u.op is Ops.RANGE:  # (a global loop: open to the kernel's end)
            self.open_ranges.add(u)
        self.program.append(u)
        self.emitted.add(u)
        self.frames[-1].append(u)

    def open_loop(self, r: UOp) -> None:
        if r.src[0].op is not Ops.CONST:
            self.emit(r.src[0])  # a symbolic trip count is computed before its loop
        self.program.append(r)
        self.open_ranges.add(r)
        self.frames.append([])
        self.emitted.add(r)
        self.frames[-1].append(r)

    def close_loop(self, r: UOp) -> None:
        self.open_ranges.discard(r)
        self.program.append(UOp(Ops.ENDRANGE, dtypes.void, (r,)))
        self.emitted.difference_update(self.frames.pop())

    def emit(self, root: UOp) -> None:
        for n in root.toposort(stop=lambda x: x in self.emitted or x.op is Ops.REDUCE or _is_stage(x)):
            if n in self.emitted:
                continue
            if n.op is Ops.REDUCE:
                self.emit_reduce(self.siblings(n), ())
            elif _is_stage(n):
                self.emit_stage(n)
            else:
                self.add(n)

    def emit_stage(self, barrier: UOp) -> None:
        """A staging copy (`codegen/stage.py`): its loops open around its stores, then the buffer is readable."""
        loops = sorted((r for r in barrier.toposort() if r.op is Ops.RANGE and r.arg[1] == "stage"),
                       key=lambda r: r.arg[0])
        for loop in loops:
            self.open_loop(loop)
        for store in barrier.src[1:]:
            self.emit(store)
        for loop in reversed(loops):
            self.close_loop(loop)
        self.add(barrier)

    def siblings(self, red: UOp) -> list[UOp]:
        """`red` and the kernel's other REDUCEs over the same loops that can share its loops (none reads another's
        result): a register tile of outputs becomes one loop with an accumulator per output, not a loop each. A
        REDUCE under one of them over other loops (a chained kernel's scores, which all its outputs share) is
        computed inside the shared loop, once."""
        loops = set(red.src[1:])

        def independent(r: UOp) -> bool:
            return not any(n.op is Ops.REDUCE and loops & set(n.src[1:]) for n in r.src[0].toposort())
        if not independent(red):
            return [red]
        return [r for r in self.reduces if r.src[1:] == red.src[1:] and r not in self.emitted
                and self.scopes(r) == self.scopes(red) and independent(r)]

    def emit_reductions_outside(self, reductions: list[UOp], loops: frozenset[UOp]) -> None:
        """Emit the reductions (and group reductions, staging copies) that depend on none of `loops` (not yet open)
        and sit in no reduce loop: a row reduction that a kernel broadcasts over its inner loops (softmax's max and
        sum) is then computed once per row, before the loops over the row; a staging copy that does not depend on
        the inner global loops (a convolution's output channels) is made once for all of them."""
        for red in reductions:
            scope = self.scopes(red)
            if red in self.emitted or scope & loops:
                continue
            # a reduction may keep loops of the register tile (one accumulator per lane: a softmax over a transposed
            # view whose lanes are 16 rows), which open around its own loops, not the kernel's
            tiled = red.op is Ops.REDUCE and all(r in self.tile for r in scope if r.arg[1] != "global")
            if tiled or all(r.arg[1] == "global" for r in scope):
                self.emit_with_lanes(red)

    def emit_with_lanes(self, root: UOp) -> None:
        """Emit `root`, first each reduction under it whose value keeps loops of the register tile (an unrolled
        reduction's lanes, `REDUCE(REDUCE(x, r, lane), lane)`) as a tile of accumulators, those loops innermost: a
        fused row reduction gets the SIMD lanes of a kernel of its own."""
        for n in root.toposort(stop=lambda x: x in self.emitted):
            if n.op is Ops.REDUCE and n not in self.emitted and (lanes := tuple(u for u in self.tile
                                                                                 if u in self.scopes(n))):
                self.emit_reduce([n], lanes)
        self.emit(root)

    def emit_hoisted(self, roots: list[UOp], inner: frozenset[UOp], values_only: bool = False) -> None:
        """Emit what `roots` need that depends on none of the loops in `inner` (not yet open): it is computed once
        here instead of on every iteration of those loops. `values_only`: only loads and arithmetic, not reductions,
        stores or anything computed from them (those stay where their own loops put them)."""
        held = (Ops.REDUCE, *(_NOT_HOISTED if values_only else ()))
        blocked: set[UOp] = set()
        for root in roots:
            for n in root.toposort(stop=lambda x: x in self.emitted or x.op in held or _is_stage(x)):
                if n in self.emitted or n.op is Ops.RANGE:
                    continue
                if values_only and (n.op in held or _is_stage(n) or any(s in blocked for s in n.src)):
                    blocked.add(n)
                elif not self.scopes(n) & inner:
                    self.emit(n)

    def hoist_nested(self, values: list[UOp]) -> None:
        """Emit now what the REDUCEs nested in `values` need that depends only on loops already open: the hoisting
        of `open_nest` stops at a REDUCE, so without this such values would be computed inside the inner REDUCE's
        loop nest, once per iteration of every loop around it. A chained kernel's first asynchronous copies (the
        rows' factors and the first step's keys, read only by its inner products) must run once, before its loop
        over the keys: issued again on every step, they overwrote the stage another step's keys had just filled."""
        nested = [n for v in values for n in v.toposort(stop=lambda x: x in self.emitted)
                  if n.op is Ops.REDUCE and n not in self.emitted]
        blocked: set[UOp] = set()
        for root in (r.src[0] for r in nested):
            # (below barriers too: a wait's copies may be loop-invariant; none of the held ops is emitted here)
            for n in root.toposort(stop=lambda x: x in self.emitted or x.op is Ops.REDUCE or _is_stage(x)):
                if n in self.emitted or n.op is Ops.RANGE:
                    continue
                if n.op in _NOT_HOISTED or _is_stage(n) or any(s in blocked for s in n.src):
                    blocked.add(n)
                elif self.scopes(n) <= self.open_ranges:
                    self.emit(n)

    def open_nest(self, roots: list[UOp], loops: list[UOp]) -> None:
        """Open `loops` outermost first; before each, emit the part of `roots` that it and the loops inside it do
        not change (so a load that depends on the reduce loop but not on the upcast loops sits between them, and a
        shared-memory tile is copied once per outer step of a tiled reduction, not once per inner step)."""
        self.emit_hoisted(roots, frozenset(loops))
        for i, loop in enumerate(loops):
            self.open_loop(loop)
            self.emit_hoisted(roots, frozenset(loops[i + 1:]))

    def emit_reduce(self, reds: list[UOp], upcast: tuple[UOp, ...]) -> None:
        """For REDUCEs over the same loops: a DEFINE_ACC each, the reduce loops, then its unrolled loops, then the
        upcast loops (one accumulator per upcast iteration: an array indexed by their flattened combination), the
        values, an ACCUMULATE each."""
        values = [red.src[0] for red in reds]
        loops = sorted(reds[0].src[1:], key=lambda r: r.arg[1] == "unroll") + list(upcast)
        accs = []
        for red in reds:
            init = UOp.const(red.dtype, reduce_identity(red.arg, red.dtype))
            accs.append(UOp(Ops.DEFINE_ACC, red.dtype, (init, *upcast), red))
            self.add(accs[-1])
        self.hoist_nested(values)
        self.open_nest(values, loops)
        for value in values:
            self.emit(value)
        for red, acc in zip(reds, accs):
            self.program.append(UOp(Ops.ACCUMULATE, red.dtype, (acc, red.src[0]), red.arg))
        for r in reversed(loops):
            self.close_loop(r)
        for red in reds:
            self.emitted.add(red)  # the accumulator now holds the REDUCE's value (its consumers read it)
            self.frames[-1].append(red)


_NOT_HOISTED = (Ops.REDUCE, Ops.GROUP_REDUCE, Ops.STORE, Ops.COPY_OUT, Ops.SINK, Ops.DEFINE_ACC, Ops.ACCUMULATE,
                Ops.BARRIER, Ops.SHUFFLE_XOR)


def _is_stage(u: UOp) -> bool:
    return u.op is Ops.BARRIER and u.arg == "stage"


def split_range(ast: UOp, rng: UOp, amount: int, kind: str, inner_first: bool = False) -> tuple[UOp, UOp, UOp]:
    """Split loop `rng` (size N) into an outer loop of N/amount (keeping `rng`'s id and kind) and a new inner loop of
    `amount` iterations of `kind` ("upcast", "unroll", ...): `rng` becomes `outer*amount + inner` everywhere, and a
    REDUCE over `rng` now reduces over both. `inner_first`: the new loop takes the high part (`inner*(N/amount) +
    outer`) instead. Returns (new ast, outer, inner). Raises ValueError if `amount` does not divide N."""
    if rng.src[0].op is not Ops.CONST:
        raise ValueError(f"cannot split a loop of symbolic size {rng.src[0]}")
    size = rng.src[0].arg
    if amount < 1 or size % amount:
        raise ValueError(f"cannot split a loop of {size} iterations by {amount}")
    next_id = max(u.arg[0] for u in ast.toposort() if u.op is Ops.RANGE) + 1
    inner = UOp(Ops.RANGE, rng.dtype, (UOp.const(rng.dtype, amount),), (next_id, kind))
    outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(rng.dtype, size // amount),), rng.arg)
    index = inner * UOp.const(rng.dtype, size // amount) + outer if inner_first else \
        outer * UOp.const(rng.dtype, amount) + inner
    reduces = {u: u.replace(src=tuple(x for r in u.src for x in ((outer, inner) if r is rng else (r,))))
               for u in ast.toposort() if u.op is Ops.REDUCE and rng in u.src[1:]}
    ast = graph_rewrite(ast, PatternMatcher([(UPat(name="x"), lambda x: reduces.get(x))])) if reduces else ast
    return simplify(graph_rewrite(ast, PatternMatcher([(UPat(Ops.RANGE, name="x"),
                                                        lambda x: index if x is rng else None)]))), outer, inner


def _values_before_stores(sink: UOp, nodes: list[UOp]) -> list[UOp]:
    """What to open the stores' loop nest around: the sink, or, in a kernel that reads a buffer it also writes, the
    stores' values (indices, gates) first. A kernel with several outputs may read what one of them overwrites (`b =
    -x` realized with `x.assign(x - x)`, whose value folds to 0 and reads nothing): every output means the old
    contents, so no store may come before a load of its buffer; each iteration writes only the element it read."""
    stores = [u for u in sink.src if u.op is Ops.STORE]
    written = {s.src[0] for s in stores}
    if len(stores) > 1 and any(u.op is Ops.LOAD and u.src[0] in written for u in nodes):
        return [src for store in stores for src in store.src[1:]]
    return [sink]


def linearize(sink: UOp, upcast: tuple[UOp, ...] = ()) -> list[UOp]:
    """`upcast`: RANGEs (outermost first) to place *inside* the reduce loops, each reduction keeping an accumulator
    per combination of their values (a register tile), then looped over again for the rest of the kernel. The
    innermost one is usually contiguous in memory, so that loop vectorises; the renderer unrolls the others."""
    scopes = Scopes()
    nodes = sink.toposort()
    program: list[UOp] = sorted((u for u in nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    program += sorted((u for u in nodes if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0])  # int parameters
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    emitter = _Emitter(program, scopes, reduces, upcast)
    # row reductions, and staging copies (codegen/stage.py), go between the global loops they are inside of
    row_reductions = [u for u in nodes if u.op in (Ops.REDUCE, Ops.GROUP_REDUCE) or _is_stage(u)]
    for special in sorted((u for u in nodes if u.op is Ops.SPECIAL), key=lambda u: u.arg[0]):  # GPU ids come first
        emitter.emit(special)  # with its symbolic limit, if it has one
    for local in (u for u in nodes if u.op is Ops.DEFINE_LOCAL):
        emitter.add(local)
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global" and u not in upcast),
                           key=lambda u: u.arg[0])
    all_ranges = frozenset(u for u in nodes if u.op is Ops.RANGE)
    outer_roots = [s for u in nodes if u.op is Ops.STORE for s in u.src[1:]] + [red.src[0] for red in reduces]
    for i, r in enumerate(global_ranges):
        emitter.emit_reductions_outside(row_reductions, frozenset(global_ranges[i:]))
        if r.src[0].op is not Ops.CONST:
            emitter.emit(r.src[0])  # a symbolic trip count
        emitter.add(r)
        # values the kernel needs that depend on no loop inside this one: once per iteration of this loop (a batch
        # norm's 1/sqrt(var + eps) per channel, not per output position)
        pending = all_ranges - frozenset(global_ranges[:i + 1])
        emitter.emit_hoisted(outer_roots, pending, values_only=True)
    if upcast:
        for red in reduces:  # the outermost reductions, before the upcast loops
            if red not in emitter.emitted and not any(r.arg[1] in ("reduce", "unroll") and r not in upcast
                                                      for r in scopes(red)):
                emitter.emit_reduce([red], tuple(u for u in upcast if u in scopes(red)))
    epilogue = [u for u in upcast if u in scopes(sink)]  # not the unrolled lanes of a reduction: reduced by now
    emitter.open_nest(_values_before_stores(sink, nodes), epilogue)
    emitter.emit(sink)
    program.remove(sink)
    for r in reversed(epilogue):
        emitter.close_loop(r)
    program.extend(UOp(Ops.ENDRANGE, dtypes.void, (r,)) for r in reversed(global_ranges))
    return program


def loop_iterations(sink: UOp) -> sint:
    """Iterations of the kernel's loops: of each reduction's loop nest, or of the stores' loop nest in a kernel
    without reductions (a row reduction's loop runs once per row, not once per output of the row)."""
    scopes = Scopes()
    total: sint = 0
    nodes = sink.toposort()
    nests = [n for n in nodes if n.op is Ops.REDUCE] or [n for n in nodes if n.op is Ops.STORE]
    for n in nests:
        sizes = [range_size(r) for r in scopes(n.src[0] if n.op is Ops.REDUCE else n)]
        total = sint_add(total, prod(sizes) if all(isinstance(x, int) for x in sizes) else sint_prod(sizes))  # type: ignore[arg-type]
    return total


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
