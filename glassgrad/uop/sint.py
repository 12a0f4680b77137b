"""Symbolic sizes: `Variable`, bound values, and arithmetic on dimensions that are an int *or* a UOp ("sint").

In: ints and integer expressions of variables. Out: simplified sizes, their largest values, their values for the
bound (or given) variable values, and the kernel form of a size with its variables' values split off.

A `Variable('i', 1, 10)` is a `DEFINE_VAR` node (arg `(name, min, max)`, dtype int32). `v.bind(3)` makes a `BIND`
node `(DEFINE_VAR, CONST 3)`: the variable together with its value for one computation. Tensor shapes hold bound
expressions (`BIND`, `BIND * 4`, `BIND + 1`), so a shape knows its current size; kernels hold only the unbound
`DEFINE_VAR`s (`unbind`), so one kernel serves every value in `[min, max]` and the values travel separately, as the
`var_vals` of a schedule item (name -> int), to become the kernel's int arguments at launch.

Sizes are kept simplified (`uop/symbolic.py`), and nodes are hash-consed, so equal sizes are usually the same
node; `sint_equal` also proves equality by simplifying the difference.
"""
from __future__ import annotations

import functools
import keyword
import re
from collections.abc import Callable
from typing import Any

from glassgrad.dtype import dtypes
from glassgrad.errors import ArgumentError
from glassgrad.uop.ops import ConstType, Ops, UOp, sint
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.symbolic import exec_alu

# names the renderers give their own variables and parameters; a Variable may not take one (it is a parameter too)
_RESERVED = re.compile(r"^((data|ridx|val|alu|acc|smem|red|gidx|bidx|lidx)\d*|start|end|gid|lid|gg_const.*)$")
_C_WORDS = {"auto", "bool", "break", "case", "char", "const", "constant", "continue", "default", "device", "do",
            "double", "else", "enum", "extern", "float", "for", "goto", "half", "if", "inline", "int", "kernel",
            "long", "register", "restrict", "return", "short", "signed", "sizeof", "static", "struct", "switch",
            "thread", "threadgroup", "typedef", "uint", "union", "unsigned", "void", "volatile", "while", "metal"}


def Variable(name: str, min_val: int, max_val: int) -> UOp:  # noqa: N802  (tinygrad's name for it)
    """A symbolic int in [min_val, max_val]; `.bind(n)` gives it a value. It becomes an `int name` kernel
    parameter, so `name` must be a C identifier that the generated code does not use itself."""
    if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
        raise ValueError(f"Variable name must be an identifier (it becomes a kernel parameter), got {name!r}")
    if _RESERVED.match(name) or name in _C_WORDS or keyword.iskeyword(name):
        raise ValueError(f"Variable name {name!r} is reserved by the generated code; pick another name")
    for bound in (min_val, max_val):
        if not isinstance(bound, int) or isinstance(bound, bool):
            raise TypeError(f"Variable {name!r}: min and max must be ints, got {min_val!r} and {max_val!r}")
    if not 0 <= min_val <= max_val < 2**31:
        raise ValueError(f"Variable {name!r}: need 0 <= min <= max < 2**31 (sizes are non-negative int32), "
                         f"got min={min_val}, max={max_val}")
    return UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, min_val, max_val))


def variables(x: sint) -> list[UOp]:
    """The DEFINE_VARs a size depends on (bound or not)."""
    return [] if isinstance(x, int) else [u for u in x.toposort() if u.op is Ops.DEFINE_VAR]


def unbound_variables(x: sint) -> list[UOp]:
    """DEFINE_VARs used directly, not through a BIND: a size that has no value."""
    if isinstance(x, int):
        return []
    bound = {u.src[0] for u in x.toposort() if u.op is Ops.BIND}
    return [v for v in variables(x) if v not in bound]


def _simplify(x: UOp) -> sint:
    from glassgrad.uop.symbolic import simplify
    out = simplify(x)
    return int(out.arg) if out.op is Ops.CONST else out


def as_sint(x: sint) -> sint:
    """A size in its simplest form: an int when it has no variables, else a simplified int32 expression."""
    return x if isinstance(x, int) else _simplify(x)


def _nodes(a: sint, b: sint) -> tuple[UOp, UOp]:
    """Both sizes as nodes; an int becomes a constant of the other's dtype (kernel sizes may be int64)."""
    dt = a.dtype if isinstance(a, UOp) else b.dtype if isinstance(b, UOp) else dtypes.int32
    return (a if isinstance(a, UOp) else UOp.const(dt, a)), (b if isinstance(b, UOp) else UOp.const(dt, b))


# The arithmetic below has fast paths for ints and identities (x*1, x+0, x-x, the common cases when shapes are
# built), and memoises the rest: hash-consing makes a node a cheap, exact key.
def sint_add(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if _is(b, 0) or _is(a, 0):
        return a if _is(b, 0) else b
    return _sint_op(Ops.ADD, a, b)


def sint_sub(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a - b
    if _is(b, 0) or a is b:
        return a if _is(b, 0) else 0
    return _sint_op(Ops.NEG, a, b)


def sint_mul(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    if _is(b, 1) or _is(a, 1):
        return a if _is(b, 1) else b
    return _sint_op(Ops.MUL, a, b)


def _is(x: sint, value: int) -> bool:
    return isinstance(x, int) and x == value


@functools.lru_cache(maxsize=4096)
def _sint_op(op: Ops, a: sint, b: sint) -> sint:
    """a + b (ADD), a - b (NEG), a * b (MUL), simplified."""
    x, y = _nodes(a, b)
    return _simplify(x * y if op is Ops.MUL else x + y if op is Ops.ADD else x - y)


def sint_ceildiv(a: sint, d: int) -> sint:
    """ceil(a / d) for a size a >= 0 and d > 0."""
    if isinstance(a, int):
        return -(-a // d)
    x, y = _nodes(a, d - 1)
    return _simplify((x + y) // UOp.const(x.dtype, d))


def sint_prod(xs: tuple[sint, ...] | list[sint]) -> sint:
    out: sint = 1
    for x in xs:
        out = sint_mul(out, x)
    return out


def sint_equal(a: sint, b: sint) -> bool:
    """True when two sizes are equal for every value of their variables (as far as the simplifier can prove)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sint_sub(a, b)
    return isinstance(diff, int) and diff == 0


def sint_max(x: sint) -> int:
    """The largest value a size can take (what a buffer for it must hold)."""
    return x if isinstance(x, int) else int(x.vmax)


def max_size(shape: tuple[sint, ...]) -> int:
    """The largest element count of a shape (sizes are non-negative: the product of the largest sizes)."""
    out = 1
    for d in shape:
        out *= d if isinstance(d, int) else int(d.vmax)
    return out


def sint_min(x: sint) -> int:
    return x if isinstance(x, int) else int(x.vmin)


def sint_eval(x: sint, var_vals: dict[str, int] | None = None) -> int:
    """A size's value: BINDs give their bound values, unbound variables take theirs from `var_vals` (by name)."""
    return x if isinstance(x, int) else _evaluator(x)(var_vals)


Step = tuple[int, Any, tuple[int, ...]]  # (kind, payload, source slots) of one node of a size's expression
_CONST, _VAR, _COPY, _ALU = range(4)


@functools.lru_cache(maxsize=8192)
def _evaluator(x: UOp) -> Callable[[dict[str, int] | None], int]:
    """The size `x` as a list of steps, made once per expression (a TinyJit replay evaluates the launch sizes of
    every symbolic kernel on every call): each node's value from its sources' slots, in C's integer semantics."""
    nodes = x.toposort(stop=lambda n: n.op is Ops.BIND)
    slot = {u: i for i, u in enumerate(nodes)}
    steps = [_step(u, tuple(slot[s] for s in u.src) if u.op is not Ops.BIND else ()) for u in nodes]

    def evaluate(var_vals: dict[str, int] | None) -> int:
        values: list[ConstType] = []
        for kind, payload, sources in steps:
            if kind == _CONST:
                values.append(payload)
            elif kind == _VAR:
                if var_vals is None or payload not in var_vals:
                    raise RuntimeError(f"symbolic size needs a value for the Variable {payload!r}: bind it with "
                                       ".bind(n)")
                values.append(var_vals[payload])
            elif kind == _COPY:
                values.append(values[sources[0]])
            else:
                values.append(_alu(payload, [values[s] for s in sources]))
        return int(values[-1])
    return evaluate


def _step(u: UOp, sources: tuple[int, ...]) -> Step:
    if u.op is Ops.CONST:
        return _CONST, int(u.arg), ()
    if u.op is Ops.BIND:
        return _CONST, int(u.src[1].arg), ()
    if u.op is Ops.DEFINE_VAR:
        return _VAR, u.arg[0], ()
    if u.op is Ops.CAST:
        return _COPY, None, sources
    return _ALU, (u.op, u.dtype), sources


def _alu(op_dtype: tuple[Ops, Any], operands: list[ConstType]) -> int:
    out = exec_alu(op_dtype[0], op_dtype[1], operands)  # C semantics, as the kernel computes it
    if out is None or isinstance(out, float):
        raise RuntimeError(f"cannot evaluate {op_dtype[0]} in a symbolic size")
    return int(out)


_UNBIND = PatternMatcher([(UPat(Ops.BIND, name="b"), lambda b: b.src[0])])


def unbind(x: UOp) -> tuple[UOp, dict[str, int]]:
    """(the size with every BIND replaced by its DEFINE_VAR, {variable name: bound value})."""
    kernel_form, values = _unbind(x)
    return kernel_form, dict(values)


@functools.lru_cache(maxsize=4096)
def _unbind(x: UOp) -> tuple[UOp, tuple[tuple[str, int], ...]]:
    values: dict[str, int] = {}
    for u in x.toposort():
        if u.op is Ops.BIND:
            name = u.src[0].arg[0]
            if values.setdefault(name, u.src[1].arg) != u.src[1].arg:
                raise ArgumentError(f"bind mismatch on Variable {name!r}: it is bound to two values "
                                    f"({values[name]} and {u.src[1].arg}) in one computation")
    if unbound_variables(x):
        names = sorted(v.arg[0] for v in unbound_variables(x))
        raise RuntimeError(f"Variable {names} has no value: bind it with .bind(n) before using it in a shape")
    return graph_rewrite(x, _UNBIND), tuple(values.items())


def rebind(x: sint, var_vals: dict[str, int]) -> sint:
    """The size with each Variable named in `var_vals` bound to that value instead (the others keep theirs)."""
    if isinstance(x, int):
        return x
    if x.op is Ops.BIND:
        name = x.src[0].arg[0]
        return x.src[0].bind(var_vals[name]) if name in var_vals and var_vals[name] != x.src[1].arg else x
    return x.replace(src=tuple(rebind(s, var_vals) for s in x.src)) if x.src else x


def render_sint(x: sint) -> str:
    """A short readable form of a size: '7', 'i', 'i*4', '(i+1)' (bound variables show their value: 'i=3')."""
    if isinstance(x, int):
        return str(x)
    if x.op is Ops.CONST:
        return str(x.arg)
    if x.op is Ops.DEFINE_VAR:
        return x.arg[0]
    if x.op is Ops.BIND:
        return f"{x.src[0].arg[0]}={x.src[1].arg}"
    symbols = {Ops.ADD: "+", Ops.MUL: "*", Ops.IDIV: "//", Ops.MOD: "%", Ops.MAX: " max "}
    if x.op in symbols and len(x.src) == 2:
        return f"({render_sint(x.src[0])}{symbols[x.op]}{render_sint(x.src[1])})"
    if x.op is Ops.NEG:
        return f"-{render_sint(x.src[0])}"
    if x.op is Ops.CAST:
        return render_sint(x.src[0])
    return x.op.name.lower()
