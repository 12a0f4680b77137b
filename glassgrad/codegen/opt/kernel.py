"""`Kernel`: a kernel AST and the opts applied to it, with the axis model of `glassgrad.codegen.opt`.

In: a simplified kernel AST and the renderer it is for. Out: after `apply_opt`s, `.ast` (loops split and retyped),
`.upcast` (the upcast ranges, outermost first, for the linearizer), `.local_order` (the work-group ranges, outermost
first, for `codegen/gpudims.py`) and `.opt_level` (the C compiler's optimisation level an `OPTLEVEL` chose; None:
the compiler's default). Each action checks that it fits first and raises `KernelOptError` otherwise, leaving the
kernel as it was.
"""
from __future__ import annotations

from glassgrad.codegen.linearize import Scopes, range_size, split_range
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps, check
from glassgrad.helpers import prod
from glassgrad.renderer.cstyle import CStyleLanguage, index_stride
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.sint import render_sint
from glassgrad.uop.symbolic import simplify

KIND_ORDER = ("global", "local", "reduce", "group", "unroll", "upcast")
TILE_KINDS = ("upcast", "unroll")
MAX_UPCAST = 64          # iterations of one upcast axis
MAX_UNROLL = 32          # iterations of one unrolled axis
MAX_REGISTER_TILE = 512  # accumulators (product of the upcast sizes) and unrolled copies of the loop body
MAX_THREADS = 1024       # threads of one work-group (CUDA and Metal)
MAX_SHARED = 48 * 1024   # bytes of (static) shared memory per work-group


class Kernel:
    def __init__(self, ast: UOp, renderer: CStyleLanguage) -> None:
        self.ast = ast
        self.renderer = renderer
        self.applied: list[Opt] = []
        self.opt_level: int | None = None  # OPTLEVEL's choice (CPU): the C compiler's -O level; None: its default
        # an upcast or local range -> (id of the loop it came from, -order)
        self._tile_order: dict[UOp, int] = {}  # an upcast or unrolled range -> how many opts made one before it
        self._local_origin: dict[UOp, tuple[int, int]] = {}

    def copy(self) -> Kernel:
        new = Kernel(self.ast, self.renderer)
        new.applied = list(self.applied)
        new.opt_level = self.opt_level
        new._tile_order = dict(self._tile_order)
        new._local_origin = dict(self._local_origin)
        return new

    # ---------- the axis model ----------
    @property
    def axes(self) -> list[UOp]:
        """Every loop of the kernel, by kind (global, local, reduce, group, unroll, upcast), then by loop order."""
        rngs = [u for u in self.ast.toposort() if u.op is Ops.RANGE]
        return sorted(rngs, key=lambda r: (KIND_ORDER.index(r.arg[1]), r.arg[0]))

    def axes_of(self, *kinds: str) -> list[int]:
        return [i for i, r in enumerate(self.axes) if r.arg[1] in kinds]

    @property
    def upcast(self) -> tuple[UOp, ...]:
        """The ranges of the register tile (upcast and unrolled), outermost first: the latest opt outermost, the first
        innermost. The first is the SIMD loop (the vector axis), each later one a row of the tile around it."""
        rngs = [r for r in self.axes if r.arg[1] in ("upcast", "unroll")]
        return tuple(sorted(rngs, key=lambda r: -self._tile_order.get(r, 0)))

    @property
    def local_order(self) -> tuple[UOp, ...]:
        """The work-group (local) ranges, outermost first, in the order of the loops they came from (a loop split
        twice has its first part innermost): the thread id enumerates them like the loop nest would."""
        rngs = [r for r in self.axes if r.arg[1] == "local"]
        return tuple(sorted(rngs, key=lambda r: self._local_origin.get(r, (r.arg[0], 0))))

    def threads(self) -> int:
        """Threads of one work-group: the product of the local and group axes' sizes."""
        return prod(r.src[0].arg for r in self.axes if r.arg[1] in ("local", "group"))

    @property
    def loads(self) -> list[UOp]:
        return [u for u in self.ast.toposort() if u.op is Ops.LOAD]

    def strides(self, axis: int) -> list[int | None]:
        """How far each load's index moves per iteration of the axis (None: not affine in it)."""
        rng = self.axes[axis]
        return [index_stride(load.src[1], rng) for load in self.loads]

    @property
    def has_reduce(self) -> bool:
        return any(u.op is Ops.REDUCE for u in self.ast.toposort())

    def register_tile(self) -> int:
        """The largest register tile of one loop nest: over the kernel's reductions and stores, the product of the
        upcast and unrolled loops that one evaluation of its value runs (a kernel with row reductions before its
        store, a fused softmax, has a tile per nest, not their product)."""
        scopes = Scopes()
        tiles = [prod(r.src[0].arg for r in scopes(u.src[0] if u.op is Ops.REDUCE else u) if r.arg[1] in TILE_KINDS)
                 for u in self.ast.toposort() if u.op in (Ops.REDUCE, Ops.STORE)]
        return max(tiles, default=1)

    def describe(self) -> str:
        """The axes as `kind:size`, e.g. 'global:128 global:64 reduce:1024 upcast:8 upcast:16'."""
        return " ".join(f"{r.arg[1]}:{render_sint(range_size(r))}" for r in self.axes)

    def size(self, axis: int) -> int | None:
        """The axis' trip count, or None when it is symbolic (a Variable): such an axis is never split."""
        rng = self.axes[axis]
        return rng.src[0].arg if rng.src[0].op is Ops.CONST else None

    # ---------- actions ----------
    def apply_opts(self, opts: list[Opt]) -> Kernel:
        for opt in opts:
            self.apply_opt(opt)
        return self

    def apply_opt(self, opt: Opt) -> None:
        check(isinstance(opt, Opt) and isinstance(opt.op, OptOps), f"not an Opt: {opt!r}")
        if opt.op is OptOps.OPTLEVEL:  # (no axis: a kernel without loops has one too)
            self._opt_level(opt)
            self.applied.append(opt)
            return
        axes = self.axes
        check(isinstance(opt.axis, int) and 0 <= opt.axis < len(axes),
              f"{opt}: axis {opt.axis} is out of range; this kernel has {len(axes)} axes ({self.describe()})")
        rng = axes[opt.axis]
        kind, size = rng.arg[1], self.size(opt.axis)
        if opt.op in (OptOps.LOCAL, OptOps.GROUP):
            self._thread_split(opt, rng, kind, size)
        elif opt.op is OptOps.SWAP:
            self._swap(opt, rng)
        elif opt.op is OptOps.PADTO:
            self._padto(opt, rng, kind, size)
        else:
            self._shift(opt, rng, kind, size)
        self.applied.append(opt)

    def _shift(self, opt: Opt, rng: UOp, kind: str, size: int | None) -> None:
        check(isinstance(opt.amount, int) and opt.amount >= 0, f"{opt}: the amount must be an int >= 0")
        check(size is not None, f"{opt}: axis {opt.axis} has a symbolic size; only constant sizes are split")
        assert size is not None
        amount = size if opt.amount == 0 else opt.amount
        if opt.op is OptOps.UPCAST:
            check(kind == "global", f"{opt}: UPCAST is for global (output) axes, axis {opt.axis} is {kind}")
            check(amount <= MAX_UPCAST, f"{opt}: upcast {amount} is more than {MAX_UPCAST}")
        else:
            check(kind == "reduce", f"{opt}: UNROLL is for reduce axes, axis {opt.axis} is {kind}")
            check(amount <= MAX_UNROLL, f"{opt}: unroll {amount} is more than {MAX_UNROLL}")
        check(size > 0, f"{opt}: axis {opt.axis} has no iterations")
        check(amount > 1, f"{opt}: splitting off {amount} iteration does nothing")
        check(size % amount == 0, f"{opt}: {amount} does not divide the axis' {size} iterations")
        check(not self.axes_of("group"), f"{opt}: a GROUP kernel's reduction is combined in shared memory, one value "
                                         f"per thread; {opt.op.name} (a register tile) does not combine with it")
        before = self.ast
        new_kind = "upcast" if opt.op is OptOps.UPCAST else "unroll"
        inner = self._split(rng, amount, size, new_kind)
        if new_kind == "unroll":
            self.ast = _lanes_of_reductions(self.ast, inner)
        if (tile := self.register_tile()) > MAX_REGISTER_TILE:
            self.ast = before
            check(False, f"{opt}: the register tile would be {tile} > {MAX_REGISTER_TILE}")
        self._tile_order[inner] = len(self._tile_order)  # the tile's order: the first one innermost

    def _thread_split(self, opt: Opt, rng: UOp, kind: str, size: int | None) -> None:
        """LOCAL: the inner `amount` of a global axis become threads of a work-group (the outer part stays the
        work-group's id). GROUP: the inner `amount` of a reduce axis become threads that each reduce a strided share,
        then combine their partial results in shared memory (`codegen/gpudims.py` builds both)."""
        name = type(self.renderer).__name__
        check(self.renderer.has_local, f"{opt}: {opt.op.name} needs a GPU (work-groups); {name} has none")
        check(isinstance(opt.amount, int) and opt.amount >= 0, f"{opt}: the amount must be an int >= 0")
        wanted = "global" if opt.op is OptOps.LOCAL else "reduce"
        check(kind == wanted, f"{opt}: {opt.op.name} is for {wanted} axes, axis {opt.axis} is {kind}")
        check(size is not None, f"{opt}: axis {opt.axis} has a symbolic size; only constant sizes are split")
        assert size is not None
        amount = size if opt.amount == 0 else opt.amount
        check(amount > 1, f"{opt}: {amount} thread does nothing")
        check(size % amount == 0, f"{opt}: {amount} does not divide the axis' {size} iterations")
        threads = self.threads() * amount
        check(threads <= MAX_THREADS, f"{opt}: {threads} threads per work-group, more than {MAX_THREADS}")
        if opt.op is OptOps.GROUP:
            self._check_group(opt, rng, amount)
        self._check_group_memory(opt, threads, rng if opt.op is OptOps.GROUP else None)
        new_kind = "local" if opt.op is OptOps.LOCAL else "group"
        inner = self._split(rng, amount, size, new_kind)
        if new_kind == "local":
            self._local_origin[inner] = (rng.arg[0], -len(self._local_origin))

    def _split(self, rng: UOp, amount: int, size: int, kind: str) -> UOp:
        """Split `rng`'s inner `amount` iterations off as a loop of `kind` (the whole loop changes kind when `amount`
        is its size); returns the new loop."""
        if amount == size:
            inner = rng.replace(arg=(rng.arg[0], kind))
            self.ast = graph_rewrite(self.ast, PatternMatcher([(UPat(Ops.RANGE, name="x"),
                                                                lambda x: inner if x is rng else None)]))
            return inner
        self.ast, _, inner = split_range(self.ast, rng, amount, kind)
        return inner

    def _check_group(self, opt: Opt, rng: UOp, amount: int) -> None:
        check(not self.axes_of("group"), f"{opt}: one GROUP per kernel (this one has a group axis already)")
        check(not self.axes_of("upcast", "unroll"), f"{opt}: GROUP does not combine with UPCAST/UNROLL (a register "
                                                    f"tile of partial results)")
        check(amount & (amount - 1) == 0, f"{opt}: GROUP needs a power of two (its threads combine in a halving "
                                          f"tree), not {amount}")

    def _check_group_memory(self, opt: Opt, threads: int, group: UOp | None) -> None:
        """Each group reduction combines one value per thread of the work-group in shared memory (with LOCAL
        threads too: several groups side by side, each combining its own segment)."""
        group = group if group is not None else next((self.axes[i] for i in self.axes_of("group")), None)
        if group is None:
            return
        grouped = [u for u in self.ast.toposort() if u.op is Ops.REDUCE and group in u.src[1:]]
        shared = sum(threads * u.dtype.itemsize for u in grouped)
        check(shared <= MAX_SHARED, f"{opt}: {len(grouped)} group reductions of {threads} threads need {shared} "
                                    f"bytes of shared memory, more than {MAX_SHARED}")

    def _padto(self, opt: Opt, rng: UOp, kind: str, size: int | None) -> None:
        """PADTO: global axis `rng` grows from `size` to the next multiple of `amount` (1023 -> 1024 for 16), so that
        an UPCAST by `amount` divides it. The iterations past `size` store nothing and load only what the original
        kernel loads (`pad_accesses`); the values they compute are never stored. PADTO comes just before the UPCAST
        it is for: in a kernel without a register tile yet, that UPCAST makes the axis the SIMD lanes, and the
        loads contiguous along it are masked; once there is a tile, the axis becomes rows, and its loads are
        clamped to the last real row (unmasked). Either is correct whatever follows, only slower. CPU only: GPU
        launch shapes (`codegen/gpudims.py`) are chosen from loops and gates this would change."""
        name = type(self.renderer).__name__
        check(not self.renderer.has_local, f"{opt}: PADTO is for CPU kernels; {name} has work-groups")
        check(kind == "global", f"{opt}: PADTO is for global (output) axes, axis {opt.axis} is {kind}")
        check(isinstance(opt.amount, int) and 1 < opt.amount <= MAX_UPCAST,
              f"{opt}: PADTO needs an amount from 2 to {MAX_UPCAST}")
        check(size is not None, f"{opt}: axis {opt.axis} has a symbolic size; only constant sizes are padded")
        assert size is not None
        padded = -(-size // opt.amount) * opt.amount
        check(size > 0 and padded != size, f"{opt}: the axis' {size} iterations are a multiple of {opt.amount} "
                                           f"already")
        check(padded <= 2 * size, f"{opt}: padding {size} to {padded} iterations more than doubles the axis")
        grown = UOp(Ops.RANGE, rng.dtype, (UOp.const(rng.dtype, padded),), rng.arg)
        ast = graph_rewrite(self.ast, PatternMatcher([(UPat(Ops.RANGE, name="x"),
                                                       lambda x: grown if x is rng else None)]))
        self.ast = simplify(pad_accesses(ast, grown, size, lanes=not self.upcast))

    def _opt_level(self, opt: Opt) -> None:
        """OPTLEVEL: the C compiler's optimisation level for this kernel, one of the renderer's `opt_levels` (the
        CPU's: 2 and 3), other than the level the kernel has already (the renderer's `default_opt_level` before any
        OPTLEVEL): a later OPTLEVEL replaces an earlier one, so BEAM can try the other level on any candidate."""
        name = type(self.renderer).__name__
        levels = self.renderer.opt_levels
        check(bool(levels), f"{opt}: {name} has no optimisation levels to choose (OPTLEVEL is for CPU kernels)")
        check(opt.axis == 0, f"{opt}: OPTLEVEL names no axis; its axis must be 0")
        check(isinstance(opt.amount, int) and opt.amount in levels,
              f"{opt}: the optimisation level must be one of {levels}, not {opt.amount!r}")
        current = self.renderer.default_opt_level if self.opt_level is None else self.opt_level
        check(opt.amount != current, f"{opt}: the kernel is built with -O{current} already")
        self.opt_level = opt.amount

    def _swap(self, opt: Opt, rng: UOp) -> None:
        axes = self.axes
        check(isinstance(opt.amount, int) and 0 <= opt.amount < len(axes) and opt.amount != opt.axis,
              f"{opt}: SWAP needs another axis as its amount")
        other = axes[opt.amount]
        check(rng.arg[1] == "global" and other.arg[1] == "global", f"{opt}: SWAP exchanges two global axes")
        # through ids no loop has, so that the two renames cannot chase each other (equal sizes: equal nodes)
        temporary = {rng: rng.replace(arg=(-1, "global")), other: other.replace(arg=(-2, "global"))}
        final = {temporary[rng]: rng.replace(arg=other.arg), temporary[other]: other.replace(arg=rng.arg)}
        for mapping in (temporary, final):
            self.ast = graph_rewrite(self.ast, PatternMatcher([(UPat(Ops.RANGE, name="x"),
                                                                lambda x, m=mapping: m.get(x))]))


def pad_accesses(ast: UOp, rng: UOp, size: int, lanes: bool) -> UOp:
    """The loads and stores of `ast` with loop `rng` grown past `size` iterations (PADTO): where `rng >= size`,
    every store that depends on it is skipped (`rng < size` is ANDed into its gate); with `lanes` (the loop is to
    become SIMD lanes), a load that moves contiguously along it (stride 1) is gated the same way (it reads nothing
    and gives 0: a masked vector load); any other load that depends on it reads what iteration `size - 1` reads
    (`rng` in its index and gate becomes `min(rng, size - 1)`: for a row of a register tile, one select per row
    outside the vector loop, where a gated scalar in the tile measured 10x slower, its accumulators kept in
    memory). Without `lanes` (a row axis) every use of it but a store's index is clamped (`_clamp_rows`). Either
    way no access leaves the original kernel's."""
    valid = rng < UOp.const(rng.dtype, size)
    clamped = valid.where(rng, UOp.const(rng.dtype, size - 1))
    if not lanes:
        return _clamp_rows(ast, rng, valid, clamped)
    scopes = Scopes()
    new: dict[UOp, UOp] = {}
    for node in ast.toposort():
        src = tuple(new[s] for s in node.src)
        n = node if src == node.src else node.replace(src=src)
        if n.op in (Ops.LOAD, Ops.STORE) and rng in scopes(n):
            if n.op is Ops.STORE or (lanes and index_stride(n.src[1], rng) == 1):
                n = _and_gate(n, valid)
            else:
                n = n.replace(src=(n.src[0], *(_substitute(s, rng, clamped) for s in n.src[1:])))
        new[node] = n
    return new[ast]


def _clamp_rows(ast: UOp, rng: UOp, valid: UOp, clamped: UOp) -> UOp:
    """PADTO of a row axis: every use of `rng` but a store's index becomes `clamped`, so the rows past the end compute
    the last row's value (loads, and the conditions that select them, alike: a padded convolution's gate stays the
    gate of the load it selects, which `codegen/stage.py` then drops from the tile), and the stores get `valid`."""
    scopes = Scopes()
    new: dict[UOp, UOp] = {}
    for node in ast.toposort():
        if node is rng:
            new[node] = clamped
            continue
        src = tuple(new[s] for s in node.src)
        if node.op is Ops.STORE and rng in scopes(node):
            new[node] = _and_gate(node.replace(src=(src[0], node.src[1], *src[2:])), valid)
            continue
        new[node] = node if src == node.src else node.replace(src=src)
    return new[ast]


def _and_gate(access: UOp, valid: UOp) -> UOp:
    """A LOAD or STORE with `valid` ANDed into its gate (a LOAD's third source, a STORE's fourth)."""
    slot = 2 if access.op is Ops.LOAD else 3
    gate = valid if len(access.src) == slot else access.src[slot].alu(Ops.AND, valid)
    return access.replace(src=(*access.src[:slot], gate))


def _substitute(root: UOp, old: UOp, replacement: UOp) -> UOp:
    """`root` with node `old` replaced by `replacement` (in one pass: `replacement` may contain `old`)."""
    new: dict[UOp, UOp] = {}
    for node in root.toposort():
        src = tuple(new[s] for s in node.src)
        new[node] = replacement if node is old else node if src == node.src else node.replace(src=src)
    return new[root]


def _lanes_of_reductions(ast: UOp, lane: UOp) -> UOp:
    """REDUCE(x, r..., lane) -> REDUCE(REDUCE(x, r...), lane): one accumulator per lane across the other loops
    (independent chains, SIMD lanes), then a short loop combining the lanes."""
    def nest(x: UOp) -> UOp | None:
        if lane not in x.src[1:] or len(x.src) == 2:
            return None
        inner = x.replace(src=tuple(r for r in x.src if r is not lane))
        return x.replace(src=(inner, lane))
    return graph_rewrite(ast, PatternMatcher([(UPat(Ops.REDUCE, name="x"), nest)]))


__all__ = ["Kernel", "KernelOptError"]
