"""The symbolic simplifier: rewrite rules that make kernel index arithmetic small and fast.

In: a kernel-level UOp graph (scalars; integer nodes know their value range `vmin..vmax`). Out: an equal but
simpler graph. The rules:
  * constant folding, with the generated code's semantics (C: division truncates, `%` takes the dividend's sign,
    x/0 and x%0 are 0 as the renderers guard them, ints wrap; bool ADD/MUL/NEG are or/and/not);
  * identities (`x+0`, `x*1`, `x//1`, `x%1` and `x*0` for ints, double negation, `where` on a known condition,
    `max(x, y)` when x is never below y);
  * any integer or bool node whose range is a single value becomes that constant (so `r < 16` with
    `r` in 0..15 folds to True, and `r // 16` to 0);
  * sums are flattened into terms, like terms are merged, and `(x//c)*c + x%c` is put back together as `x`
    (ints wrap, so this is arithmetic modulo 2**bits, where regrouping is always exact);
  * `(a*c + b) // c -> a + b//c` and `(a*c + b) % c -> b % c` when the values involved are non-negative and
    provably not wrapped around; a common factor of a sum and its divisor is divided out;
  * `(x//a)//b -> x//(a*b)`, `(x%a)%b -> x%b` when b divides a, `(x*a)*b -> x*(a*b)`, `c*x -> x*c`.
Value ranges that would leave the dtype's bounds become the whole range (see `_value_range` in ops.py), which is
what keeps the division and comparison rules right in the presence of wraparound.
The property tests in tests/test_symbolic.py check with hypothesis that no rule changes an integer expression's
value, for int32, uint32 and int64, against a separate reference evaluator.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.uop.ops import ConstType, GroupOp, Ops, UOp, as_dtype, dtype_bounds
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite, substitute


def _c_div(a: int, b: int) -> int:
    if b == 0:
        return 0  # the renderers guard division by zero the same way
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return 0 if b == 0 else a - b * _c_div(a, b)


def _np_float(op: Callable[..., Any], dtype: DType) -> Callable[..., Any]:
    """Run a float op in the dtype's own precision (float32 ops round once, like the C code)."""
    npt = np.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype.np.type

    def run(*xs: ConstType) -> Any:
        with np.errstate(all="ignore"):
            return op(*(npt(x) for x in xs))
    return run


_INT_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x,  # bool NEG is rendered as !x
    Ops.ADD: lambda x, y: x + y, Ops.MUL: lambda x, y: x * y, Ops.IDIV: _c_div,
    Ops.MOD: _c_mod, Ops.MAX: max, Ops.CMPLT: lambda x, y: x < y, Ops.CMPNE: lambda x, y: x != y,
    Ops.CMPEQ: lambda x, y: x == y, Ops.AND: lambda x, y: x & y, Ops.OR: lambda x, y: x | y,
    Ops.XOR: lambda x, y: x ^ y, Ops.WHERE: lambda c, x, y: x if c else y,
    Ops.SHL: lambda x, y: x << y if 0 <= y < 64 else None, Ops.SHR: lambda x, y: x >> y if 0 <= y < 64 else None,
}
_FLOAT_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.NEG: np.negative, Ops.RECIP: np.reciprocal, Ops.SQRT: np.sqrt, Ops.EXP2: np.exp2, Ops.LOG2: np.log2,
    Ops.SIN: np.sin, Ops.TRUNC: np.trunc, Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.FDIV: np.divide, Ops.MAX: np.fmax,
    Ops.POW: np.power, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
}


def exec_alu(op: Ops, dtype: DType, operands: list[ConstType]) -> ConstType | None:
    """Evaluate one ALU op on constants as the generated code would; None when it cannot be folded."""
    if op is Ops.WHERE:
        return as_dtype(operands[1] if operands[0] else operands[2], dtype)
    in_dtype_is_float = any(isinstance(x, float) for x in operands)
    if in_dtype_is_float:
        fn = _FLOAT_ALU.get(op)
        if fn is None:
            return None
        src_dtype = dtype if dtype.is_float else dtypes.float64
        result = _np_float(fn, src_dtype)(*operands)
        if op is Ops.MAX and any(math.isnan(x) for x in operands):  # C's fmax ignores NaN too, but be explicit
            return None
        return as_dtype(bool(result) if dtype.is_bool else float(result), dtype)
    fn = _INT_ALU.get(op)
    if fn is None:
        return None
    result = fn(*operands)
    return None if result is None else as_dtype(result, dtype)


def _fold_const(u: UOp) -> UOp | None:
    if not all(s.op is Ops.CONST for s in u.src):
        return None
    value = exec_alu(u.op, u.dtype, [s.arg for s in u.src])
    return None if value is None else UOp.const(u.dtype, value)


def _fold_cast(x: UOp, c: UOp) -> UOp | None:
    value = c.arg
    if isinstance(value, float) and (x.dtype.is_int or x.dtype.is_bool) and not math.isfinite(value):
        return None  # float->int of inf/NaN has no defined C result: leave it to the device
    if isinstance(value, float) and x.dtype.is_int and not (x.dtype.min <= value <= x.dtype.max):
        return None
    return UOp.const(x.dtype, bool(value) if x.dtype.is_bool else value)


def _holds_exactly(src: DType, mid: DType) -> bool:
    """Whether every value of `src` survives a cast to `mid` unchanged (so casting back gives it again)."""
    if src == mid or src.is_bool:
        return True
    if src.is_float:
        return mid.is_float and mid.itemsize > src.itemsize  # half/bfloat16 -> float32 -> float64
    if mid.is_int:
        return mid.itemsize > src.itemsize and not mid.is_unsigned or \
            mid.itemsize >= src.itemsize and mid.is_unsigned == src.is_unsigned
    mantissa = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 53}.get(mid, 0)
    return mid.is_float and 8 * src.itemsize - (0 if src.is_unsigned else 1) <= mantissa


def _round_trip(x: UOp) -> UOp | None:
    """cast(cast(v, mid), v's dtype) -> v when `mid` holds every value of v's dtype (bfloat16 -> float -> bfloat16:
    a tile copy of it is then a plain load, which cp.async can make)."""
    inner = x.src[0]
    if inner.op is not Ops.CAST or inner.src[0].dtype != x.dtype or not _holds_exactly(x.dtype, inner.dtype):
        return None
    return inner.src[0]


def _exact_half_products(red: UOp) -> UOp | None:
    """A sum of float16/bfloat16 products (a half matmul, a convolution: `float(half(x * y))` summed in float32)
    takes each product exactly, as numpy, PyTorch, cuBLAS and our own tensor-core tiles do: a product of two halves
    is exact in float32 (22 and 16 bits of mantissa; float32 holds their range), so the rounding to half is dropped.
    Rounded, a product below half's normal range lost most of its bits (an fp16 convolution's input gradient from a
    small loss was 6% off PyTorch's on the GPU's generic path, exact on its tensor-core path). The product may sit
    under gates, `where(c, half(x * y), 0)` (a padded convolution's input gradient sums its taps so: 4x PyTorch's
    error on the CPU, from a mean loss over a large output, until the gates were looked through)."""
    value = red.src[0]
    if red.arg is not Ops.ADD or value.op is not Ops.CAST or value.dtype not in (dtypes.float32, dtypes.float64):
        return None
    exact = _exact_half_value(value.src[0], value.dtype)
    return None if exact is None else red.replace(src=(exact, *red.src[1:]))


def _exact_half_value(u: UOp, wide: DType, depth: int = 0) -> UOp | None:
    """A half node `half(x * y)` (x, y widened halves of its dtype) as the product in `wide`, not rounded; through
    gates `where(c, v, 0)` and `where(c, 0, v)`, which keep their conditions. None for anything else."""
    if u.op is Ops.CAST and u.dtype in (dtypes.float16, dtypes.bfloat16):
        product = u.src[0]
        if product.op is Ops.MUL and product.dtype == wide and \
                all(s.op is Ops.CAST and s.src[0].dtype == u.dtype for s in product.src):
            return product
        return None
    if u.op is not Ops.WHERE or depth > 8:
        return None
    for kept in (1, 2):
        zero = u.src[3 - kept]
        if zero.op is Ops.CONST and not zero.src and zero.arg == 0:
            inner = _exact_half_value(u.src[kept], wide, depth + 1)
            if inner is None:
                return None
            srcs = [u.src[0], inner, UOp.const(wide, 0.0)] if kept == 1 else [u.src[0], UOp.const(wide, 0.0), inner]
            return UOp(Ops.WHERE, wide, tuple(srcs))
    return None


def _fold_by_range(x: UOp) -> UOp | None:
    """An integer/bool node whose value range is one number is that number."""
    if (x.dtype.is_int or x.dtype.is_bool) and x.op is not Ops.CONST and x.op not in (Ops.DEFINE_GLOBAL, Ops.LOAD):
        lo, hi = x.vmin, x.vmax
        if lo == hi and not isinstance(lo, float):
            return UOp.const(x.dtype, lo)
    return None


# ---------- sums of integer terms ----------
_ADD, _MUL, _NEG, _CONST = Ops.ADD, Ops.MUL, Ops.NEG, Ops.CONST  # local names: Enum attribute lookups are slow
Terms = list[tuple[UOp | None, int]]


def _terms(x: UOp) -> Terms:
    """Flatten an integer sum into (base, coefficient) terms; base None is the constant term.

    Ints wrap, so this is arithmetic modulo 2**bits, where sums and products regroup freely."""
    out: Terms = []
    stack: list[tuple[UOp, int]] = [(x, 1)]
    while stack:
        node, coef = stack.pop()
        op = node.op
        if op is _ADD:
            stack.append((node.src[1], coef))
            stack.append((node.src[0], coef))
        elif op is _CONST:
            out.append((None, coef * node.arg))
        elif op is _MUL and node.src[1].op is _CONST:
            stack.append((node.src[0], coef * node.src[1].arg))
        elif op is _MUL and node.src[0].op is _CONST:
            stack.append((node.src[1], coef * node.src[0].arg))
        elif op is _NEG:
            stack.append((node.src[0], -coef))
        else:
            out.append((node, coef))
    return out


def _merge_terms(terms: Terms) -> Terms:
    merged: dict[UOp | None, int] = {}
    for base, coef in terms:
        merged[base] = merged.get(base, 0) + coef
    # (x//c)*c*k + (x%c)*k -> x*k: C's / and % satisfy x == (x/c)*c + x%c for every c but 0; x's terms take the
    # place of x%c in the order (a reshape's unflatten-then-flatten index is then the flat index, node for node)
    for base in list(merged):
        if base is None or base.op is not Ops.MOD or base.src[1].op is not Ops.CONST or base not in merged:
            continue
        inner, c = base.src[0], base.src[1].arg
        div = UOp(Ops.IDIV, inner.dtype, (inner, base.src[1]))
        k = merged[base]
        if c != 0 and k != 0 and merged.get(div) == k * c:
            del merged[div]
            expanded: dict[UOp | None, int] = {}
            for key, value in merged.items():
                for part, coef in (_terms(inner) if key is base else [(key, value)]):
                    expanded[part] = expanded.get(part, 0) + (k * coef if key is base else coef)
            merged = expanded
    return [(b, c) for b, c in merged.items() if c != 0]


def _build_sum(terms: Terms, dtype: DType) -> UOp:
    """The canonical sum: non-constant terms left to right (`base` or `base*coef`), then the constant."""
    const = sum(c for b, c in terms if b is None)
    out: UOp | None = None
    for base, coef in terms:
        if base is None:
            continue
        term = base if coef == 1 else base * UOp.const(dtype, coef)
        out = term if out is None else out + term
    if out is None:
        return UOp.const(dtype, const)
    return out if const == 0 else out + UOp.const(dtype, const)


def _is_term(node: UOp, base: UOp, coef: int) -> bool:
    if coef == 1:
        return node is base
    return node.op is _MUL and node.src[0] is base and node.src[1].op is _CONST and node.src[1].arg == coef


def _is_built_from(x: UOp, terms: Terms) -> bool:
    """Is `x` exactly what `_build_sum(terms)` would build? (Checking is much cheaper than rebuilding.)"""
    const = sum(c for b, c in terms if b is None)
    parts = [(b, c) for b, c in terms if b is not None]
    node = x
    if const != 0:
        if node.op is not _ADD or node.src[1].op is not _CONST or node.src[1].arg != const:
            return False
        node = node.src[0]
    if not parts:
        return False
    for base, coef in reversed(parts[1:]):
        if node.op is not _ADD or not _is_term(node.src[1], base, coef):
            return False
        node = node.src[0]
    return _is_term(node, *parts[0])


def _canonical_sum(x: UOp) -> UOp | None:
    if not x.dtype.is_int:
        return None
    terms = _merge_terms(_terms(x))
    if _is_built_from(x, terms):
        return None
    rebuilt = _build_sum(terms, x.dtype)
    return None if rebuilt is x else rebuilt


def _exact_nonneg(u: UOp) -> bool:
    """Is `u` known to be >= 0 and to compute its exact (not wrapped-around) value?

    A value range that left the dtype's bounds becomes the whole range (see `_value_range`), so a narrower one
    proves no wraparound; for unsigned types the whole range also starts at 0, hence the check on vmax."""
    return u.dtype.is_int and u.vmin >= 0 and u.vmax < dtype_bounds(u.dtype)[1]


def _fold_divmod(x: UOp, c: UOp, op: Ops) -> UOp | None:
    """(a*c + b) // c -> a + b//c and (a*c + b) % c -> b % c, for non-negative values; also gcd reduction.
    A coefficient that is not a multiple of c splits into its multiple and its remainder: (k*(c+e)) // c ->
    k + (k*e) // c (when k >= 0), which is how sliding-window (convolution) indices fold."""
    d = c.arg
    if not isinstance(d, int) or d <= 0:
        return None
    if not _exact_nonneg(x):
        return _exact_multiple(x, d, op)
    if x.vmax < d:
        return x if op is Ops.MOD else UOp.const(x.dtype, 0)
    quotient: Terms = []
    rest: Terms = []
    for base, coef in _merge_terms(_terms(x)):
        if base is None:
            quotient.append((None, coef // d))
            if coef % d:
                rest.append((None, coef % d))
        elif coef % d == 0:
            quotient.append((base, coef // d))
        elif abs(coef) > d and base.vmin >= 0:
            # coef = q*d + r with 0 <= r < d: the q*d part divides evenly, r*base stays non-negative
            quotient.append((base, coef // d))
            rest.append((base, coef % d))
        else:
            rest.append((base, coef))
    if not any(b is not None for b, _ in quotient) and all(c_ == 0 for _, c_ in quotient):
        return _divmod_common_factor(rest, d, x.dtype, op)
    rest_sum = _build_sum(rest, x.dtype)
    if not _exact_nonneg(rest_sum):
        return None
    if op is Ops.MOD:
        return rest_sum % c
    return _build_sum(quotient, x.dtype) + rest_sum // c


def _exact_multiple(x: UOp, d: int, op: Ops) -> UOp | None:
    """(d*a) // d -> a and (d*a) % d -> 0 for a sum whose every coefficient (the constant's too) d divides, of any
    sign: an exact multiple divides exactly, whichever way the division rounds. Only when x's value range shows it
    does not wrap (a range that left the dtype's bounds is the whole range), so x is d*a as integers. A polyphase
    kernel's index `(s*q + p + pad - k) / s`, with k = s*j + r chosen to cancel p + pad, is such a multiple."""
    if not x.dtype.is_int or x.dtype.is_unsigned or d < 2:
        return None
    lo, hi = dtype_bounds(x.dtype)
    if not lo < x.vmin or not x.vmax < hi:
        return None
    terms = _merge_terms(_terms(x))
    if not terms or any(coef % d for _, coef in terms):
        return None
    return UOp.const(x.dtype, 0) if op is Ops.MOD else _build_sum([(b, coef // d) for b, coef in terms], x.dtype)


def _divmod_common_factor(terms: Terms, d: int, dtype: DType, op: Ops) -> UOp | None:
    """For a sum `terms` >= 0 and a factor g of d: x = g*a + s with 0 <= s < g (the terms whose coefficients g does
    not divide make s) -> x // d = a // (d/g) and x % d = (a % (d/g))*g + s. With s = 0, (g*a) // (g*e) -> a // e;
    with s a position inside a 16-byte run (`8*j + step`), the run's elements share the quotient."""
    for g in sorted(_gcd_closure(d, [coef for _, coef in terms]), reverse=True):
        if g < 2:
            continue
        big = [(b, coef // g) for b, coef in terms if coef % g == 0]
        small = [(b, coef) for b, coef in terms if coef % g]
        if all(b is None for b, _ in big):
            continue
        rest = _build_sum(small, dtype) if small else UOp.const(dtype, 0)
        if rest.vmin < 0 or rest.vmax >= g or not (_exact_nonneg(rest) or rest.op is Ops.CONST):
            continue
        reduced, small_d = _build_sum(big, dtype), UOp.const(dtype, d // g)
        if op is Ops.IDIV:
            return reduced // small_d
        remainder = (reduced % small_d) * UOp.const(dtype, g)
        return remainder + rest if small else remainder
    return None


def _gcd_closure(d: int, coefs: list[int]) -> set[int]:
    """gcd(d, c) for each coefficient c, and the gcds of any of these: the only factors g of d worth trying above
    (the largest g that works is the gcd of d and the coefficients it divides), a few numbers where the divisors of
    d can be thousands (a vocabulary of 50304)."""
    found = {math.gcd(d, c) for c in coefs if c}
    frontier = set(found)
    while frontier:
        frontier = {math.gcd(a, b) for a in frontier for b in found} - found
        found |= frontier
    return found


def _near_quotient(x: UOp, d: int) -> tuple[UOp, UOp] | None:
    """x = d*q + r with every coefficient's remainder taken nearest to 0 (24*k + p = 25*k + (p - k)), or None
    when no remainder changes sign. (q, r) as sums; r's value range is what the rules below need."""
    quotient: Terms = []
    rest: Terms = []
    signed = False
    for base, coef in _merge_terms(_terms(x)):
        q = (coef + d // 2) // d if base is not None else coef // d
        quotient.append((base, q))
        if coef - q * d:
            rest.append((base, coef - q * d))
        signed |= base is not None and coef - q * d < 0
    if not signed:
        return None
    return _build_sum(quotient, x.dtype), _build_sum(rest, x.dtype)


def _wrapped_remainder(x: UOp, d: int) -> tuple[UOp, UOp] | None:
    """For x >= 0: (q, r) with x == d*q + r and -d <= r < d, where r is not known to be >= 0; then x % d is r or
    r + d, and x // d is q or q - 1, as r is >= 0 or not."""
    if d <= 1 or not _exact_nonneg(x):
        return None
    split = _near_quotient(x, d)
    if split is None:
        return None
    q, r = split
    return (q, r) if -d <= r.vmin and r.vmax < d else None


def _mod_bound(m: UOp, c: UOp) -> UOp | None:
    """x % d < c -> -1 < r and r < c, with x = d*q + r (see `_wrapped_remainder`), when every negative r (a
    remainder of r + d >= c) fails the bound. This is how a gate reading a padded, reshaped gradient (a
    convolution's, seen through its sliding windows) becomes a plain bound on the input position."""
    x, d = m.src
    if not isinstance(d.arg, int) or not isinstance(c.arg, int) or not 0 < c.arg <= d.arg:
        return None
    split = _wrapped_remainder(x, d.arg)
    if split is None or split[1].vmin + d.arg < c.arg:
        return None
    r = split[1]
    return (UOp.const(r.dtype, -1) < r).alu(Ops.AND, r < c)


def gate_bounds(gate: UOp) -> dict[UOp, tuple[int, int]]:
    """{expression: (lowest, highest)} that the conjunction `gate` implies, from its `c < x` and `x < c` terms."""
    bounds: dict[UOp, tuple[int, int]] = {}
    stack = [gate]
    while stack:
        g = stack.pop()
        if g.op is Ops.AND:
            stack.extend(g.src)
        elif g.op is Ops.CMPLT and g.src[0].dtype.is_int:
            a, b = g.src
            if a.op is Ops.CONST and b.op is not Ops.CONST:
                lo, hi = bounds.get(b, (int(b.vmin), int(b.vmax)))
                bounds[b] = (max(lo, a.arg + 1), hi)
            elif b.op is Ops.CONST and a.op is not Ops.CONST:
                lo, hi = bounds.get(a, (int(a.vmin), int(a.vmax)))
                bounds[a] = (lo, min(hi, b.arg - 1))
    return bounds


def divmod_under(expr: UOp, bounds: dict[UOp, tuple[int, int]]) -> dict[UOp, UOp]:
    """The x % d -> r and x // d -> q replacements in `expr` (x = d*q + r, see `_wrapped_remainder`) that hold
    wherever `bounds` (from `gate_bounds`) hold and imply 0 <= r < d."""
    changes: dict[UOp, UOp] = {}
    for u in expr.toposort():
        if u.op not in (Ops.MOD, Ops.IDIV) or u.src[1].op is not Ops.CONST or not isinstance(u.src[1].arg, int):
            continue
        split = _wrapped_remainder(u.src[0], u.src[1].arg)
        if split is None:
            continue
        q, r = split
        lo, hi = bounds.get(simplify(r), (r.vmin, r.vmax))
        if 0 <= lo and hi < u.src[1].arg:
            changes[u] = r if u.op is Ops.MOD else q
    return changes


def _gated_divmod(buf: UOp, idx: UOp, gate: UOp, x: UOp) -> UOp | None:
    """In a gated load's index, x % d -> r and x // d -> q where the gate implies 0 <= r < d (x = d*q + r): the
    load only happens then. The index of a convolution's gradient read through its windows becomes h - kh."""
    if not any(u.op in (Ops.MOD, Ops.IDIV) for u in idx.toposort()):
        return None
    changes = divmod_under(idx, gate_bounds(gate))
    if not changes:
        return None
    return x.replace(src=(buf, substitute(idx, changes), gate))


def _positive_int(u: UOp) -> bool:
    return isinstance(u.arg, int) and not isinstance(u.arg, bool) and u.arg > 0


def _nested_div(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """(x//a)//b -> x//(a*b) for a, b > 0: true of truncating division for every x, if a*b does not overflow."""
    if x.dtype.is_int and _positive_int(a) and _positive_int(b) and a.arg * b.arg <= dtype_bounds(x.dtype)[1]:
        return x // UOp.const(x.dtype, a.arg * b.arg)
    return None


def _nested_mod(x: UOp, a: UOp, b: UOp) -> UOp | None:
    """(x%a)%b -> x%b when b divides a (a != 0): both remainders have x's sign and agree modulo b."""
    if x.dtype.is_int and isinstance(a.arg, int) and a.arg != 0 and _positive_int(b) and a.arg % b.arg == 0:
        return x % b
    return None


def _ordered_max(x: UOp, y: UOp) -> UOp | None:
    """max(x, y) -> x when x is never below y."""
    if (x.dtype.is_int or x.dtype.is_bool) and x.vmin >= y.vmax:
        return x
    return None


def _const_first(m: UOp) -> UOp | None:
    """c*x -> x*c for ints, so products have one spelling (and hash-cons to one node)."""
    a, b = m.src
    return b * a if m.dtype.is_int and a.op is Ops.CONST and b.op is not Ops.CONST else None


def _is_int(u: UOp) -> bool:
    return u.dtype.is_int


def _int_less_equal(x: UOp, y: UOp, e: UOp) -> UOp | None:
    """`(x < y) | (x == y)` (Tensor's `x <= y`) of ints is `not (y < x)`: one comparison (a causal mask's per
    element test), which a WHERE over it then reads with its branches swapped. Not for floats: NaN compares false
    both ways."""
    if not _is_int(x) or x.dtype != y.dtype or set(e.src) != {x, y} or x is y:
        return None
    return UOp(Ops.CMPNE, dtypes.bool, (y.alu(Ops.CMPLT, x), UOp.const(dtypes.bool, True)))


def _negated_where(c: UOp, t: UOp, a: UOp, b: UOp) -> UOp | None:
    """`where(c != True, a, b)` of a bool c is `where(c, b, a)`."""
    return UOp(Ops.WHERE, a.dtype, (c, b, a)) if c.dtype == dtypes.bool and t.arg is True else None


symbolic = PatternMatcher([
    # constants
    (UPat(GroupOp.ALU, name="u"), _fold_const),
    (UPat(Ops.CAST, name="x", src=(UPat.cvar("c"),)), _fold_cast),
    (UPat(Ops.CAST, name="x"), lambda x: x.src[0] if x.src[0].dtype == x.dtype else None),
    (UPat(Ops.CAST, name="x", src=(UPat(Ops.CAST),)), _round_trip),
    (UPat(Ops.REDUCE, name="red"), _exact_half_products),
    # identities
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 0 and _is_int(x) else None),
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 1 else
     (UOp.const(x.dtype, 0) if c.arg == 0 and _is_int(x) else None)),
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: x if c.arg == 1 else None),
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c"))),
     lambda x, c: UOp.const(x.dtype, 0) if c.arg == 1 and _is_int(x) else None),
    # x/0 and x%0 are 0 in the generated code (the renderers guard them), as in constant folding
    (UPat((Ops.IDIV, Ops.MOD), name="u", src=(UPat.var("x"), UPat.cvar("c"))),
     lambda u, x, c: UOp.const(u.dtype, 0) if c.arg == 0 and _is_int(u) else None),
    (UPat(Ops.MAX, src=(UPat.var("x"), UPat.var("y"))), _ordered_max),
    (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(UPat.var("x"),)),)), lambda x: x),
    (UPat(Ops.WHERE, src=(UPat.cvar("c"), UPat.var("a"), UPat.var("b"))), lambda c, a, b: a if c.arg else b),
    (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("a"), UPat.var("a"))), lambda a: a),
    (UPat(Ops.OR, src=(UPat(Ops.CMPLT, src=(UPat.var("x"), UPat.var("y"))), UPat(Ops.CMPEQ, name="e"))),
     _int_less_equal),
    (UPat(Ops.WHERE, src=(UPat(Ops.CMPNE, src=(UPat.var("c"), UPat.cvar("t"))), UPat.var("a"), UPat.var("b"))),
     _negated_where),
    (UPat(Ops.AND, dtype=dtypes.bool, src=(UPat.var("x"), UPat.cvar("c"))),
     lambda x, c: x if c.arg else UOp.const(dtypes.bool, False)),
    (UPat(Ops.AND, dtype=dtypes.bool, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
    # gated loads whose gate is known: always true -> a plain load, never true -> the value 0
    (UPat(Ops.LOAD, src=(UPat.var("buf"), UPat.var("idx"), UPat.cvar("gate")), name="x"),
     lambda buf, idx, gate, x: x.replace(src=(buf, idx)) if gate.arg else UOp.const(x.dtype, 0)),
    # value ranges
    (UPat(GroupOp.ALU | {Ops.CAST}, name="x"), _fold_by_range),
    # integer sums and division
    (UPat(Ops.NEG, name="x"), lambda x: x.src[0] * UOp.const(x.dtype, -1) if _is_int(x) else None),
    (UPat(Ops.MUL, name="m"), _const_first),
    (UPat(Ops.ADD, name="x"), _canonical_sum),
    (UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: _fold_divmod(x, c, Ops.IDIV)),
    (UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x, c: _fold_divmod(x, c, Ops.MOD)),
    (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))), _nested_div),
    (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))), _nested_mod),
    (UPat(Ops.CMPLT, src=(UPat(Ops.MOD, name="m"), UPat.cvar("c"))), _mod_bound),
    (UPat(Ops.LOAD, src=(UPat.var("buf"), UPat.var("idx"), UPat.var("gate")), name="x"), _gated_divmod),
    (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))),
     lambda x, a, b: x * UOp.const(x.dtype, a.arg * b.arg) if _is_int(x) else None),
    (UPat(Ops.MAX, src=(UPat(Ops.MAX, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))),
     lambda x, a, b: x.maximum(UOp.const(x.dtype, max(a.arg, b.arg))) if _is_int(x) else None),
])


_SHARED: contextvars.ContextVar[dict[UOp, UOp] | None] = contextvars.ContextVar("glassgrad_simplified", default=None)


def simplify(u: UOp) -> UOp:
    """Run the symbolic rules over a graph to a fixed point. Inside `shared_simplify()`, calls share one memo of
    the nodes simplified so far (the rules depend on the node alone: a node simplifies the same way every time)."""
    return graph_rewrite(u, symbolic, memo=_SHARED.get())


@contextlib.contextmanager
def shared_simplify() -> Iterator[None]:
    """While active, every `simplify` reuses what earlier ones worked out (codegen simplifies many expressions that
    share most of their nodes: the index of each element a tile copies). Nested uses share the outer memo; it is
    dropped at the outermost exit, so it holds one kernel's nodes, not every node ever simplified."""
    if _SHARED.get() is not None:
        yield
        return
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)
