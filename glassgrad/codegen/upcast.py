"""CPU loop shaping: pull one output dimension inside the reduction loops ("upcast"), so the innermost loop runs
across outputs with contiguous loads and vectorises.

In: a simplified kernel AST with a REDUCE. Out: the AST (with the chosen output RANGE split if it was long) and the
RANGE to upcast, or None. For a convolution the innermost loop becomes `acc[ow] += x[..., ow + kw] * w[...]`; for a
matmul `acc[j] += a[i, k] * b[k, j0 + j]` over 16 columns at a time. Only dimensions that every load reads
contiguously (stride 1) or not at all (stride 0) are chosen, so each iteration of the upcast loop is a SIMD lane.
"""
from __future__ import annotations

from glassgrad.codegen.gpudims import substitute
from glassgrad.renderer.cstyle import index_stride
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.symbolic import simplify

UPCAST_MAX = 32                  # a dimension up to this long is upcast whole
SPLIT_FACTORS = (16, 8, 4)       # a longer one is split, and its inner part of this size upcast


def choose_upcast(ast: UOp) -> tuple[UOp, tuple[UOp, ...]]:
    nodes = ast.toposort()
    if not any(u.op is Ops.REDUCE for u in nodes):
        return ast, ()  # elementwise loops vectorise as they are
    global_ranges = sorted((u for u in nodes if u.op is Ops.RANGE and u.arg[1] == "global"), key=lambda u: u.arg[0])
    loads = [u for u in nodes if u.op is Ops.LOAD]
    next_id = max((u.arg[0] for u in nodes if u.op is Ops.RANGE), default=-1) + 1
    for rng in reversed(global_ranges):  # innermost first
        if rng.src[0].op is not Ops.CONST:
            continue  # a symbolic trip count cannot be split into constant-size SIMD lanes
        strides = [index_stride(load.src[1], rng) for load in loads]
        if any(s not in (0, 1) for s in strides) or 1 not in strides:
            continue
        size = rng.src[0].arg
        # the outermost loop is split across CPU threads: keep some of it as a loop
        whole = size <= UPCAST_MAX and rng is not global_ranges[0]
        factor = size if whole else next((f for f in SPLIT_FACTORS if size % f == 0 and size > f), None)
        if factor is None:
            continue
        inner = UOp(Ops.RANGE, rng.dtype, (UOp.const(rng.dtype, factor),), (next_id, "upcast"))
        if whole:
            return simplify(substitute(ast, {rng: inner})), (inner,)
        outer = UOp(Ops.RANGE, rng.dtype, (UOp.const(rng.dtype, size // factor),), rng.arg)
        return simplify(substitute(ast, {rng: outer * UOp.const(rng.dtype, factor) + inner})), (inner,)
    return ast, ()
