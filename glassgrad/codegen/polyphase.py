"""Polyphase: a sum whose taps a stride's congruence gates runs only the taps that pass it.

In: a simplified kernel AST. Out: an equal AST in which such a sum loops over the valid taps alone.

The backward of a strided window (a convolution's input gradient, a transposed convolution's forward, a strided
pool's gradient) reads its incoming values through a pad that keeps every s-th position, so its sum over a tap k is
guarded by `(c*k + B) % s == 0`: B an affine sum of output loops, c = +-1 modulo s. Only one tap in s passes (one in
s^2 in 2-D), and the mod gate is not affine, so the tile's copies gather. The rewrite (a polyphase decomposition,
as a transposed convolution does):

* every output loop o whose coefficient in B s does not divide is split by its phase, o = s*q + p (p and q global
  loops: q in o's place, p just inside the outermost loop), so that B = s*Q + P with P a sum over the phases alone;
* the tap becomes k = s*j + r, j a reduce loop of ceil(K/s) taps, r = (-c*P) mod s picked per phase. It is
  written as k = s*j + c*(s*h - P) with h = (c*r + P) / s (an exact division), so that c*k + B is s*(c*j + h + Q)
  term by term and the simplifier divides the index by s exactly (`symbolic._exact_multiple`); the guard becomes
  true and is dropped.

Where s does not divide K, the taps past K are guarded off (`k < K`), gated loads get that gate too and ungated
ones read tap K - 1 instead (a weight stays ungated, so it is still packed); where s does not divide an output
loop's size, the positions past it store nothing and the loads that move with q are gated. No access leaves the
original kernel's. The gate is matched in the chain of `where(cond, v, 0)` around the sum's value (a pad's zeros)
or around a factor of the product under it (a transposed convolution's dilated input), each clause simplified under
the others' bounds first (the windows' `(34*k + x + 1) % 35` is `x + 1 - k` where `0 <= x + 1 - k < 31` holds). A
`x % s < 1` clause counts only where x is known to be >= 0, or where `-1 < x % s` is a clause too.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from glassgrad.codegen.linearize import Scopes
from glassgrad.dtype import dtypes
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.params import is_const_param
from glassgrad.uop.pattern import substitute
from glassgrad.uop.symbolic import divmod_under, gate_bounds, simplify

SPREAD = 8  # loop ids are multiplied by this at each split, leaving room for the phase loops (at most 7 at a time)


@dataclass(frozen=True)
class _Congruence:
    """A guard `(c*k + sum(coef*o) + const) % s == 0`, k a reduce loop of the sum, o output loops; `sign` is +1 or
    -1, congruent to c modulo s (a dilation d gives c = -d: 2 for stride 3 is -1)."""
    clause: UOp
    tap: UOp
    sign: int
    stride: int
    outputs: tuple[tuple[UOp, int], ...]
    const: int
    used: tuple[UOp, ...]  # the other guard clauses whose bounds simplified it


def polyphase(ast: UOp) -> UOp:
    """`ast` with each stride-gated sum over taps split by phase (see the module docstring), until none is left."""
    for _ in range(8):  # one tap loop per step: a 3-D window needs three
        found = _find(ast)
        if found is None:
            return ast
        ast = _split(ast, *found)
    return ast


def _find(ast: UOp) -> tuple[UOp, _Congruence] | None:
    nodes = ast.toposort()
    reduces = [u for u in nodes if u.op is Ops.REDUCE]
    sized = any(u.op is Ops.DEFINE_VAR and not is_const_param(u) for u in nodes)  # (a symbolic size)
    if len(reduces) != 1 or reduces[0].arg is not Ops.ADD or sized:
        return None
    red = reduces[0]
    clauses = _guards(red.src[0])
    for clause in clauses:
        found = _congruence(clause, [c for c in clauses if c is not clause], red)
        if found is not None:
            return red, found
    return None


def _guards(value: UOp) -> list[UOp]:
    """The conjuncts of the `where(cond, v, 0)` chain around a sum's value, and around the factors of a product
    under it: where one is false, the term is 0 (a product with a factor the chain zeroes is taken as 0 also when
    another factor is inf or NaN, as a transposed convolution skips the zeros between its inputs; the unfused
    `dilate(x) * w` would give NaN there)."""
    out: list[UOp] = []
    while True:
        if value.op is Ops.CAST:
            value = value.src[0]
        elif _is_guard(value):
            out += _conjuncts(value.src[0])
            value = value.src[1]
        elif value.op is Ops.MUL and value.dtype.is_float:
            return out + [c for f in value.src for c in _guards(f) if _is_guard(f)]
        else:
            return out


def _is_guard(u: UOp) -> bool:
    return u.op is Ops.WHERE and u.src[2].op is Ops.CONST and u.src[2].arg == 0


def _conjuncts(cond: UOp) -> list[UOp]:
    return [t for s in cond.src for t in _conjuncts(s)] if cond.op is Ops.AND else [cond]


def _congruence(clause: UOp, others: list[UOp], red: UOp) -> _Congruence | None:
    if clause.op not in (Ops.CMPLT, Ops.CMPEQ) or clause.src[0].op is not Ops.MOD:
        return None
    (arg, modulus), bound = clause.src[0].src, clause.src[1]
    wanted = 1 if clause.op is Ops.CMPLT else 0
    if modulus.op is not Ops.CONST or bound.op is not Ops.CONST or bound.arg != wanted or modulus.arg < 2:
        return None
    stride = int(modulus.arg)
    bounds = _bounds_of(others)
    changes = divmod_under(arg, bounds)
    arg = simplify(substitute(arg, changes))
    signed = not any(o.op is Ops.CMPLT and o.src[1] is clause.src[0] and o.src[0].op is Ops.CONST and
                     o.src[0].arg == -1 for o in others)  # `-1 < x % s` too: x % s is 0 whatever x's sign
    if clause.op is Ops.CMPLT and signed and bounds.get(arg, (arg.vmin, arg.vmax))[0] < 0:
        return None  # a negative operand's remainder is <= 0 whatever its phase
    terms = _affine(arg)
    if terms is None:
        return None
    taps = [(r, c) for r, c in terms if r in red.src[1:] and c % stride]
    outputs = tuple((r, c) for r, c in terms if r is not None and r not in red.src[1:])
    if len(taps) != 1 or any(r.arg[1] != "global" for r, _ in outputs):
        return None
    sign = _unit(taps[0][1], stride)
    if sign is None:
        return None
    const = sum(c for r, c in terms if r is None)
    used = tuple(others) if changes else ()
    return _Congruence(clause, taps[0][0], sign, stride, outputs, const, used)


def _unit(coef: int, stride: int) -> int | None:
    """+1 or -1 congruent to `coef` modulo `stride` (the coefficient itself when it is one), else None: only then
    is the tap that passes written without a division (k = s*j + c*(s*h - P))."""
    if abs(coef) == 1:
        return coef
    return 1 if coef % stride == 1 else -1 if coef % stride == stride - 1 else None


def _bounds_of(clauses: list[UOp]) -> dict[UOp, tuple[int, int]]:
    return gate_bounds(_and(clauses)) if clauses else {}


def _affine(x: UOp) -> list[tuple[UOp | None, int]] | None:
    """x as (loop, coefficient) terms and (None, constant), or None when it is not an affine sum of loops."""
    out: list[tuple[UOp | None, int]] = []
    stack: list[tuple[UOp, int]] = [(x, 1)]
    while stack:
        node, coef = stack.pop()
        if node.op is Ops.ADD:
            stack += [(s, coef) for s in node.src]
        elif node.op is Ops.MUL and node.src[1].op is Ops.CONST:
            stack.append((node.src[0], coef * node.src[1].arg))
        elif node.op is Ops.CONST and isinstance(node.arg, int):
            out.append((None, coef * node.arg))
        elif node.op is Ops.RANGE and node.src[0].op is Ops.CONST:
            out.append((node, coef))
        else:
            return None
    merged: dict[UOp | None, int] = {}
    for base, coef in out:
        merged[base] = merged.get(base, 0) + coef
    return [(b, c) for b, c in merged.items() if c != 0 or b is None]


def _split(ast: UOp, red: UOp, g: _Congruence) -> UOp:
    s, dt = g.stride, g.tap.dtype
    ranges = [u for u in ast.toposort() if u.op is Ops.RANGE]
    outer = min((r.arg[0] for r in ranges if r.arg[1] == "global"), default=0)
    # loop ids times SPREAD: a split loop's quotient takes its place, its phase one of the ids just after the
    # outermost loop (which the CPU splits over threads), so that what depends on the phases alone (a packed weight
    # of the taps that pass) is made once per phase, not once per quotient
    final = {r: r.replace(arg=(SPREAD * r.arg[0], r.arg[1])) for r in ranges}
    phase_ids = iter(range(SPREAD * outer + 1, SPREAD * outer + SPREAD))
    mapping: dict[UOp, UOp] = {}
    valid: list[tuple[frozenset[UOp], UOp]] = []  # (loops, condition): where a loop runs past its original end
    phase = UOp.const(dt, g.const)
    for o, coef in g.outputs:
        if coef % s == 0:
            continue
        size = o.src[0].arg
        if size <= s:
            phase = phase + final[o] * UOp.const(dt, coef)  # short: it is a phase already
            continue
        p = UOp(Ops.RANGE, dt, (UOp.const(dt, s),), (next(phase_ids), "global"))
        q = UOp(Ops.RANGE, dt, (UOp.const(dt, -(-size // s)),), (SPREAD * o.arg[0], "global"))
        mapping[o] = q * UOp.const(dt, s) + p
        phase = phase + p * UOp.const(dt, coef)
        if size % s:
            # (every phase occurs at q = 0, inside the loop: only what moves with q can leave it)
            valid.append((frozenset({q}), mapping[o] < UOp.const(dt, size)))
    taps = g.tap.src[0].arg
    j = UOp(Ops.RANGE, dt, (UOp.const(dt, -(-taps // s)),), (SPREAD * g.tap.arg[0], "reduce"))
    lam = (-g.sign) % s
    offset = s * -(-max(0, -lam * int(phase.vmin)) // s)  # keeps lam*P + offset >= 0, so % gives the residue
    r = (phase * UOp.const(dt, lam) + UOp.const(dt, offset)) % UOp.const(dt, s)
    h = (r * UOp.const(dt, g.sign) + phase) // UOp.const(dt, s)
    mapping[g.tap] = j * UOp.const(dt, s) + (h * UOp.const(dt, s) - phase) * UOp.const(dt, g.sign)
    clamped = None
    if taps % s:  # the last taps of some phases are past K: guarded off, and read at K - 1 by ungated loads
        tap_valid = mapping[g.tap] < UOp.const(dt, taps)
        clamped = tap_valid.where(mapping[g.tap], UOp.const(dt, taps - 1))
        valid.append((frozenset({j}), tap_valid))
    ast = substitute(ast, {red: red.replace(src=(_drop_clause(red.src[0], g.clause, g.used), *red.src[1:]))})
    ast = _rebuilt(ast, {**final, **mapping}, {g.tap: j}, {g.tap: clamped} if clamped is not None else {})
    if clamped is not None:
        new_red = next(u for u in ast.toposort() if u.op is Ops.REDUCE)
        value = tap_valid.where(new_red.src[0], UOp.const(new_red.dtype, 0))
        ast = substitute(ast, {new_red: new_red.replace(src=(value, *new_red.src[1:]))})
    return simplify(_gate_accesses(ast, valid, gated_only=frozenset({j})))


def _rebuilt(ast: UOp, mapping: dict[UOp, UOp], loops: dict[UOp, UOp], ungated: dict[UOp, UOp]) -> UOp:
    """`ast` with its loops replaced by `mapping`'s nodes in one pass (a replacement is not looked up again: the
    renamed loops may equal old ones), a REDUCE's loops by `loops`' (or their renamed selves), and in the index of
    an ungated load by `ungated`'s where it has one (the tap clamped into its loop)."""
    new: dict[UOp, UOp] = {}
    for node in ast.toposort():
        if node in mapping:
            new[node] = mapping[node]
        elif node.op is Ops.REDUCE:
            rngs = tuple(loops.get(r, new[r]) for r in node.src[1:])
            new[node] = node.replace(src=(new[node.src[0]], *rngs))
        elif node.op is Ops.LOAD and len(node.src) == 2 and ungated:
            new[node] = node.replace(src=(node.src[0], _rebuilt(node.src[1], {**mapping, **ungated}, loops, {})))
        else:
            src = tuple(new[x] for x in node.src)
            new[node] = node if src == node.src else node.replace(src=src)
    return new[ast]


def _drop_clause(value: UOp, clause: UOp, used: tuple[UOp, ...]) -> UOp:
    """The sum's value with `clause` true in its guards, and in the gates of loads that also check `used` (the
    clauses its simplification relied on; elsewhere it may still be what keeps the load inside its buffer)."""
    new: dict[UOp, UOp] = {}
    for node in value.toposort():
        src = tuple(new[x] for x in node.src)
        n = node if src == node.src else node.replace(src=src)
        if n.op is Ops.LOAD and len(n.src) == 3:
            terms = _conjuncts(n.src[2])
            if clause in terms and all(u in terms for u in used):
                n = n.replace(src=(n.src[0], n.src[1], _and(t for t in terms if t is not clause)))
        new[node] = n
    return _drop_in_guards(new[value], clause)


def _drop_in_guards(value: UOp, clause: UOp) -> UOp:
    """`value` with `clause` true in the guards `_guards` reads."""
    if value.op is Ops.CAST:
        return value.replace(src=(_drop_in_guards(value.src[0], clause),))
    if _is_guard(value):
        cond = _and(t for t in _conjuncts(value.src[0]) if t is not clause)
        return value.replace(src=(cond, _drop_in_guards(value.src[1], clause), value.src[2]))
    if value.op is Ops.MUL and value.dtype.is_float:
        return value.replace(src=tuple(_drop_in_guards(f, clause) if _is_guard(f) else f for f in value.src))
    return value


def _and(terms: Iterable[UOp]) -> UOp:
    out: UOp | None = None
    for t in terms:
        out = t if out is None else out.alu(Ops.AND, t)
    return out if out is not None else UOp.const(dtypes.bool, True)


def _gate_accesses(ast: UOp, valid: list[tuple[frozenset[UOp], UOp]], gated_only: frozenset[UOp]) -> UOp:
    """Loads and stores that depend on a loop of `valid` get its condition in their gate (a LOAD's third source,
    a STORE's fourth): iterations past the original end read nothing and store nothing. For the loops of
    `gated_only`, only loads that have a gate already (the others were clamped)."""
    if not valid:
        return ast
    scopes = Scopes()
    new: dict[UOp, UOp] = {}
    for node in ast.toposort():
        src = tuple(new[x] for x in node.src)
        n = node if src == node.src else node.replace(src=src)
        if n.op in (Ops.LOAD, Ops.STORE):
            where = node.src[1:] if node.op is Ops.LOAD else node.src[1:2] + node.src[3:]  # not a store's value
            loops = frozenset().union(*map(scopes, where))
            gated = n.op is Ops.STORE or len(n.src) > 2
            conds = [c for rngs, c in valid if rngs & loops and (gated or not rngs <= gated_only)]
            if conds:
                slot = 2 if n.op is Ops.LOAD else 3
                gate = _and(([n.src[slot]] if len(n.src) > slot else []) + conds)
                n = n.replace(src=(*n.src[:slot], gate))
        new[node] = n
    return new[ast]


__all__ = ["polyphase"]
