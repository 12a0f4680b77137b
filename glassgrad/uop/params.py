"""Float constants as kernel parameters, so a changed Python number does not build a new kernel.

In: one kernel's AST (a SINK, from `KernelBuilder`). Out: the same AST with each float32 constant that is not
special replaced by a kernel parameter, and the parameters' values (the constants' bits) to launch it with.

Why: a loop that scales by a Python float that changes every step (`x * lr` with a decaying `lr`, a noise level, a
temperature) would otherwise make a kernel that differs only in one literal, and compile it (tens of milliseconds
with gcc or NVRTC) on every step. With the value as a parameter the kernel cache finds the kernel built for the
first step, and each step passes its own value.

How: a lifted constant is `BITCAST(DEFINE_VAR gg_const<i> : int32 -> float32)`: an int parameter holding the
float's bits (every backend passes a kernel's int parameters as 32-bit ints already; the kernel reinterprets them).
Equal constants share one parameter; parameters are numbered in the AST's order, so equal kernels get equal names.
The values are exact (the float32 bits), so a kernel computes what it would with the literal.

`LIFT_CONSTANTS=0` keeps every constant a literal (tests that run a schedule's kernels by hand, outside
`engine/realize.py`'s launches, which pass the values).

Left as literals: 0, 1 and -1, infinities and NaN (the simplifier's identities, a max's -inf, relu's 0 and the
value lattice of masks read them), other dtypes' constants (indices, masks; half and double constants, rarer in user
loops), and every constant of a kernel with a reduction nested in another (flash attention's chained kernels: their
causal tile skipping proves masks from constant values, `codegen/chained.py` `_value_class`).
"""
from __future__ import annotations

import math
import struct

from glassgrad.dtype import dtypes
from glassgrad.helpers import LIFT_CONSTANTS
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import substitute

PARAM_PREFIX = "gg_const"  # the parameters' names: gg_const0, gg_const1, ... (`Variable` refuses such names)
_INT32_RANGE = (-(2**31), 2**31 - 1)


def is_const_param(u: UOp) -> bool:
    """Whether `u` is a lifted constant's parameter (a DEFINE_VAR that holds float bits, not a symbolic size)."""
    return u.op is Ops.DEFINE_VAR and u.arg[0].startswith(PARAM_PREFIX)


def size_vars(names: tuple[str, ...]) -> tuple[str, ...]:
    """Of a kernel's parameter names, the Variables of symbolic sizes (not lifted constants)."""
    return tuple(n for n in names if not n.startswith(PARAM_PREFIX))


def float_bits(value: float) -> int:
    """A float32's bits as a signed 32-bit int (the parameter's value)."""
    return int(struct.unpack("<i", struct.pack("<f", value))[0])


def liftable(u: UOp) -> bool:
    """Whether a CONST (of a kernel AST, or of a tensor graph) is one that kernels take as a parameter."""
    return u.op is Ops.CONST and u.dtype == dtypes.float32 and isinstance(u.arg, float) and math.isfinite(u.arg) \
        and u.arg not in (0.0, 1.0, -1.0)


def _nested_reduction(nodes: list[UOp]) -> bool:
    """Whether a reduction runs inside another's loop (a chained kernel): an inner REDUCE in the outer one's value
    that depends on the outer one's loop. (A softmax's sum of exp(x - max) holds the max, over a loop of its own.)"""
    for outer in (u for u in nodes if u.op is Ops.REDUCE):
        loops = set(outer.src[1:])
        for inner in outer.src[0].toposort():
            if inner.op is Ops.REDUCE and any(n in loops for n in inner.toposort()):
                return True
    return False


def lift_constants(ast: UOp, room: int | None = None) -> tuple[UOp, dict[str, int]]:
    """(`ast` with its liftable float32 constants as parameters, {parameter name: the constant's bits}). `room`: at
    most this many parameters (Metal's argument table holds the buffers, Variables and these: 31 in all); the
    constants after the first `room` distinct values stay literals."""
    if not LIFT_CONSTANTS.value:
        return ast, {}
    nodes = ast.toposort()
    consts = [u for u in nodes if liftable(u) and not u.src]
    if not consts or _nested_reduction(nodes) or room == 0:
        return ast, {}
    names: dict[int, str] = {}  # bits -> parameter name
    mapping: dict[UOp, UOp] = {}
    for c in consts:
        bits = float_bits(c.arg)
        if bits not in names and room is not None and len(names) >= room:
            continue
        name = names.setdefault(bits, f"{PARAM_PREFIX}{len(names)}")
        var = UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, *_INT32_RANGE))
        mapping[c] = UOp(Ops.BITCAST, dtypes.float32, (var,))
    lifted = substitute(ast, mapping)
    # every parameter stays in the signature even where the simplifier removes its uses (as Variables do)
    params = tuple(UOp(Ops.DEFINE_VAR, dtypes.int32, (), (name, *_INT32_RANGE)) for name in names.values())
    lifted = UOp(Ops.SINK, lifted.dtype, (*lifted.src, *params), lifted.arg)
    return lifted, {name: bits for bits, name in names.items()}
