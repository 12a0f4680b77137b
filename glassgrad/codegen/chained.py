"""Chained tensor-core kernels: flash attention's kernels on a GPU.

In: a kernel AST whose one outer REDUCE (over the keys, `key`) sums, or takes the max of, a value computed from one
or two inner REDUCEs, each a product of two half (float16/bfloat16) factors summed over a short axis: attention's
scores q k^T, and in the backward dO v^T. The scheduler builds such kernels where flash attention applies
(`schedule._chained`: the scores are recomputed, never stored). Out: the AST rewritten for a GPU with tensor cores,
with its grid and block sizes.

A block of 4 warps owns 64 rows (16 a warp) of one batch entry. Before its loop over the keys it copies its rows'
factors (q, and dO) into shared memory; each step copies the next 64 keys' factors (k, v; double-buffered, cp.async
where they are plain 16-byte runs) and then, per warp:
  * the inner products on the tensor cores (mma.sync m16n8k16): a 16 x 64 tile of scores in registers, 4 floats
    per lane per 16 x 8 part;
  * the elementwise work on them, in registers (scale, mask, exp(s - logsumexp), dS = P (dP - D));
  * either a second product (`column` set: p @ v, dS @ k, P^T dO): the accumulators, rounded to the half dtype,
    are exactly the row fragment the next mma takes (FRAGMENT "pack"), times the column factor's tile read with
    ldmatrix.trans, into the output's accumulators;
  * or a row reduction (the softmax's max, its sum, D): each lane folds its 16 values of each of its 2 rows, and
    after the loop the 4 lanes that share a row combine theirs through shared memory.
Nothing of size keys x rows is written to memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad.codegen.gpudims import Operand, _async_copies, _Block, _copy_runs, _positions, _tile_copy
from glassgrad.dtype import DType, dtypes
from glassgrad.helpers import prod
from glassgrad.schedule.indexing import unflatten_index
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import substitute, unchanged_by
from glassgrad.uop.symbolic import simplify

ROWS = 64          # rows of a block: 4 warps of 16 (one mma's rows)
KEYS = 64          # keys per step of the loop
WARP_ROWS = 16
THREADS = 128
MAX_INNER = 128    # the longest inner reduction (a head's dims)
MAX_COLUMNS = 128  # the most output columns (a head's dims): a warp holds all of them in registers
SHARED_BYTES = 48 * 1024
HALVES = (dtypes.float16, dtypes.bfloat16)


@dataclass(frozen=True)
class ChainPlan:
    store: UOp
    outer: UOp                              # REDUCE over `key`: ADD or MAX
    inners: tuple[UOp, ...]                 # the REDUCEs inside it (the scores)
    factors: tuple[tuple[UOp, UOp], ...]    # each inner's (row factor, key factor), half values
    weight: UOp                             # per (row, key): what is summed (times `column`) or reduced
    column: UOp | None                      # the second product's half factor, per (key, column); None: a row reduction
    rows: tuple[UOp, ...]
    cols: tuple[UOp, ...]
    batch: tuple[UOp, ...]
    key: UOp
    dtype: DType                            # the factors' half dtype

    @property
    def columns(self) -> int:
        return prod(r.src[0].arg for r in self.cols) if self.cols else 0


def _ranges(u: UOp, stop: tuple[UOp, ...] = ()) -> set[UOp]:
    return {n for n in u.toposort(stop=lambda x: x in stop) if n.op is Ops.RANGE}


def _half_product(value: UOp) -> tuple[UOp, UOp] | None:
    """(x, y) of a float32 product of two half values: `float(x * y)`, `float(x) * float(y)`, or that product
    rounded to the half dtype and back (as the renderer spells `float(x * y)`; the tensor cores keep it exact, as
    the tiled matmuls do)."""
    if value.op is Ops.CAST and value.dtype == dtypes.float32 and value.src[0].op is Ops.CAST and \
            value.src[0].dtype in HALVES and value.src[0].src[0].op is Ops.MUL:
        value = value.src[0].src[0]
    if value.op is Ops.CAST and value.dtype == dtypes.float32 and value.src[0].op is Ops.MUL and \
            value.src[0].dtype in HALVES:
        x, y = value.src[0].src
        return (x, y) if x.dtype == y.dtype else None
    if value.op is Ops.MUL and value.dtype == dtypes.float32 and all(
            s.op is Ops.CAST and s.src[0].dtype in HALVES for s in value.src):
        x, y = (s.src[0] for s in value.src)
        return (x, y) if x.dtype == y.dtype else None
    return None


def chain_plan(ast: UOp, nodes: list[UOp], global_ranges: list[UOp], reduces: list[UOp]) -> ChainPlan | None:
    """The plan of a chained kernel (module docstring), or None for any other kernel."""
    stores = [s for s in ast.src if s.op is Ops.STORE]
    if len(stores) != 1 or len(stores[0].src) != 3 or any(r.op is Ops.RANGE and not isinstance(r.src[0].arg, int)
                                                          for r in nodes):
        return None
    outers = [r for r in reduces if any(u.op is Ops.REDUCE for u in r.src[0].toposort())]
    if len(outers) != 1:
        return None
    outer = outers[0]
    inners = tuple(r for r in reduces if r is not outer)
    if len(outer.src) != 2 or outer.arg not in (Ops.ADD, Ops.MAX) or outer.dtype != dtypes.float32 or \
            not 1 <= len(inners) <= 2 or not set(inners) <= set(outer.src[0].toposort()):
        return None
    key = outer.src[1]
    factors = []
    for inner in inners:
        pair = _half_product(inner.src[0])
        if len(inner.src) != 2 or inner.arg is not Ops.ADD or inner.dtype != dtypes.float32 or pair is None:
            return None
        x, y = pair if key not in _ranges(pair[0]) else pair[::-1]
        if key in _ranges(x) or key not in _ranges(y):
            return None
        factors.append((x, y))
    dtype = factors[0][0].dtype
    if any(x.dtype != dtype for pair in factors for x in pair):
        return None
    x_ranges = set().union(*(_ranges(x) for x, _ in factors))
    y_ranges = set().union(*(_ranges(y) for _, y in factors))
    rows = tuple(g for g in global_ranges if g in x_ranges and g not in y_ranges)
    batch = tuple(g for g in global_ranges if g in x_ranges and g in y_ranges)
    cols = tuple(g for g in global_ranges if g not in x_ranges)
    if not rows or any(g in y_ranges for g in cols):
        return None
    weight, column = outer.src[0], None
    if cols:
        pair = _half_product(outer.src[0])
        if outer.arg is not Ops.ADD or pair is None:
            return None
        weight, column = pair if any(u in inners for u in pair[0].toposort()) else pair[::-1]
        if any(u in inners for u in column.toposort()) or _ranges(column) - {key, *cols, *batch}:
            return None
        weight = weight.src[0] if weight.op is Ops.CAST and weight.src[0].dtype == dtypes.float32 else \
            weight.cast(dtypes.float32)
    if _ranges(weight, inners) - {key, *rows, *batch}:
        return None
    plan = ChainPlan(stores[0], outer, inners, tuple(factors), weight, column, rows, cols, batch, key, dtype)
    return plan if _fits(plan) else None


def _fits(plan: ChainPlan) -> bool:
    """Whole tiles (64 rows, 64 keys, inner lengths a multiple of 16, at most 128 of them and of columns) whose
    shared memory fits 48 KB."""
    row_size = prod(r.src[0].arg for r in plan.rows)
    inner_sizes = [inner.src[1].src[0].arg for inner in plan.inners]
    if row_size % ROWS or plan.key.src[0].arg % KEYS or any(e % 16 or e > MAX_INNER for e in inner_sizes):
        return False
    if plan.cols and (plan.columns % 16 or plan.columns > MAX_COLUMNS):
        return False
    return _shared_layout(plan)[1] * plan.dtype.itemsize <= SHARED_BYTES


def _shared_column(plan: ChainPlan) -> int | None:
    """The inner whose key factor is the column factor too (dQ = dS @ k, dK = dS^T @ q): they share one tile."""
    if plan.column is None or len(plan.cols) != 1:
        return None
    for i, (inner, (_, y)) in enumerate(zip(plan.inners, plan.factors)):
        e = inner.src[1]
        if e.src[0].arg == plan.columns and simplify(substitute(y, {e: plan.cols[0]})) is simplify(plan.column):
            return i
    return None


def _shared_layout(plan: ChainPlan) -> tuple[dict[tuple[str, int, int], int], int]:
    """Element offsets of the shared tiles: ("x", inner, 0) the rows' factors (copied once), ("y", inner, stage)
    and ("g", 0, stage) the keys' factors of each of 2 stages; and the total."""
    offsets: dict[tuple[str, int, int], int] = {}
    total = 0
    widths = [inner.src[1].src[0].arg for inner in plan.inners]
    for i, width in enumerate(widths):
        offsets[("x", i, 0)] = total
        total += ROWS * width
    shared = _shared_column(plan)
    for stage in range(2):
        for i, width in enumerate(widths):
            offsets[("y", i, stage)] = total
            total += KEYS * width
        if plan.column is not None:
            if shared is not None:
                offsets[("g", 0, stage)] = offsets[("y", shared, stage)]
            else:
                offsets[("g", 0, stage)] = total
                total += KEYS * plan.columns
    return offsets, total


def _at(base: int, width: int, pos: UOp, kk: UOp) -> UOp:
    """Shared index of element (pos, kk) of a [pos][kk] tile `width` wide: 16-byte chunks XOR-swizzled by the row,
    so that the 8 rows an ldmatrix (or ldmatrix.trans) reads at one chunk fall in 8 different bank groups. The
    swizzle permutes chunks within aligned groups of the largest power of two (up to 8) that divides the row's
    chunks, so every chunk stays in its row (a 48-wide row has 6: pairs)."""
    dt = pos.dtype
    chunks = width // 8
    swizzle = pos % UOp.const(dt, min(8, chunks & -chunks))
    chunk = (kk // UOp.const(dt, 8)).alu(Ops.XOR, swizzle)
    return UOp.const(dt, base) + pos * UOp.const(dt, width) + chunk * UOp.const(dt, 8) + kk % UOp.const(dt, 8)


def chained_tiles(ast: UOp, plan: ChainPlan) -> tuple[UOp, tuple[int, int, int], tuple[int, int, int]]:
    """The kernel of `plan` on the tensor cores (module docstring): the rewritten AST, grid and block sizes."""
    dt = plan.store.src[1].dtype
    c = lambda v: UOp.const(dt, v)  # noqa: E731
    batch_sizes = tuple(r.src[0].arg for r in plan.batch)
    row_blocks = prod(r.src[0].arg for r in plan.rows) // ROWS
    blocks = prod(batch_sizes) * row_blocks
    bidx = UOp(Ops.SPECIAL, dt, (), ("bidx", blocks, 1))
    lidx = UOp(Ops.SPECIAL, dt, (), ("lidx", THREADS, THREADS))
    *batch_ids, row_block = unflatten_index(bidx, (*batch_sizes, row_blocks), dt)
    batch_map = dict(zip(plan.batch, batch_ids))
    next_id = max((r.arg[0] for r in ast.toposort() if r.op is Ops.RANGE), default=-1) + 1
    steps = plan.key.src[0].arg // KEYS
    start, count = _key_steps(plan, row_block, steps)
    loop = UOp(Ops.RANGE, dt, (count,), (next_id, "reduce"))
    step = loop if start.op is Ops.CONST and start.arg == 0 else start + loop
    offsets, total = _shared_layout(plan)
    smem = UOp(Ops.DEFINE_LOCAL, plan.dtype, (), (0, total))
    widths = [inner.src[1].src[0].arg for inner in plan.inners]

    def block(width: int) -> _Block:  # what `_tile_copy` reads: ids, batch, and whole tiles (no gates)
        return _Block(dt, blocks, THREADS, lidx, row_block, c(0), batch_map, step, step, width)

    def key_copies(at_step: UOp) -> list[tuple[UOp, UOp]]:  # the keys' factors of step `at_step`, in its stage
        stage = at_step % c(2)
        out = []
        for i, ((_, y), width) in enumerate(zip(plan.factors, widths)):
            for pos_kk, value in _tile_copy(Operand(y, (plan.key,), KEYS), y, at_step, block(width),
                                            (plan.inners[i].src[1],), width, c(0)):
                out.append((_staged(offsets, ("y", i), stage, width, *pos_kk), value))
        if plan.column is not None and _shared_column(plan) is None:
            for pos_kk, value in _tile_copy(Operand(plan.column, (plan.key,), KEYS), plan.column, at_step,
                                            block(plan.columns), plan.cols, plan.columns, c(0)):
                out.append((_staged(offsets, ("g", 0), stage, plan.columns, *pos_kk), value))
        return out

    row_copies = [(_at(offsets[("x", i, 0)], width, *pos_kk), value)
                  for i, ((x, _), width) in enumerate(zip(plan.factors, widths))
                  for pos_kk, value in _tile_copy(Operand(x, plan.rows, ROWS), x, row_block, block(width),
                                                  (plan.inners[i].src[1],), width, c(0))]
    first = row_copies + key_copies(start)
    if _copy_runs(first, 16 // plan.dtype.itemsize) is not None:
        committed = UOp(Ops.ASYNC_COMMIT, smem.dtype, (smem, *_async_copies(smem, first, None)))
        wait = UOp(Ops.ASYNC_WAIT, smem.dtype, (committed, loop), 0)
        barrier = UOp(Ops.BARRIER, smem.dtype, (wait,))  # step k's tiles landed; all are done with step k-1's
        ahead = step + c(1)
        later = _async_copies(barrier, key_copies(ahead), loop + c(1) < count)
        reader = UOp(Ops.ASYNC_COMMIT, smem.dtype, (barrier, *later))
    else:  # computed factors: through registers, double-buffered (one barrier a step)
        stores = [UOp(Ops.STORE, dtypes.void, (smem, i, v)) for i, v in row_copies + key_copies(step)]
        reader = UOp(Ops.BARRIER, smem.dtype, (smem, *stores))
    lane = lidx % c(32)
    warp_row = (lidx // c(32)) * c(WARP_ROWS)
    group, in_group = lane // c(4), lane % c(4)
    lane16, upper = lane % c(16), (lane // c(16)) * c(8)
    row8, odd = lane % c(8), ((lane // c(8)) % c(2)) * c(8)
    stage = step % c(2)
    scores: list[list[UOp]] = []  # per inner, per 8 keys: a REDUCE of 4 accumulators
    for i, width in enumerate(widths):
        k16 = UOp(Ops.RANGE, dt, (c(width // 16),), (next_id + 1 + i, "unroll"))
        row_frag = UOp(Ops.FRAGMENT, plan.dtype, (reader, _at(offsets[("x", i, 0)], width, warp_row + lane16,
                                                              k16 * c(16) + upper)), ("row", False))
        col_frags = [UOp(Ops.FRAGMENT, plan.dtype, (reader, _staged(offsets, ("y", i), stage, width,
                                                                    c(16 * p) + row8 + upper, k16 * c(16) + odd)),
                                              ("col", False))
                     for p in range(KEYS // 16)]
        scores.append([UOp(Ops.REDUCE, dtypes.float32, (UOp(Ops.WMMA, dtypes.float32, (row_frag, col_frags[n // 2]),
                                                            n % 2), k16), Ops.ADD) for n in range(KEYS // 8)])
    # the weight of each (row, key) this lane holds: weights[n][e] is row group + 8 (e // 2), key 8 n + 2 t + e % 2
    weights = []
    roots = [plan.weight, *(score for per_inner in scores for score in per_inner)]
    unchanged = unchanged_by(roots, plan.inners), unchanged_by(roots, {*batch_map, *plan.rows, plan.key})
    for n in range(KEYS // 8):
        row_n = []
        for e in range(4):
            row = row_block * c(ROWS) + warp_row + group + c(8 * (e // 2))
            key_at = step * c(KEYS) + c(8 * n + e % 2) + in_group * c(2)
            value = substitute(plan.weight, {inner: UOp(Ops.GEP, dtypes.float32, (scores[i][n],), e)
                                             for i, inner in enumerate(plan.inners)}, unchanged[0])
            row_n.append(substitute(value, {**batch_map, **_positions(Operand(plan.weight, plan.rows), row),
                                            plan.key: key_at}, unchanged[1]))
        weights.append(row_n)
    if plan.column is not None:
        outputs = _second_product(plan, weights, reader, offsets, stage, loop, row_block, warp_row, lane16, upper,
                                  group, in_group, batch_map)
    else:
        outputs = _row_reduction(plan, weights, loop, row_block, warp_row, group, in_group, batch_map)
    sink = ast.replace(src=(*outputs, *(s for s in ast.src if s is not plan.store)))
    return simplify(sink), (blocks, 1, 1), (THREADS, 1, 1)


def _key_steps(plan: ChainPlan, row_block: UOp, steps: int) -> tuple[UOp, UOp]:
    """(first step, number of steps) of a block's loop over the keys: all of them, or, where a mask of the rows' and
    keys' indices (a causal mask) hides whole 64 x 64 tiles and the weight is then the reduction's identity (0, or
    -inf for a max), only the steps whose tiles it does not hide, when they run from an affine function of the
    block's row to another (causal: the keys up to the block's last row; in the key-side gradients, from the
    block's first key on). Half the work of causal attention."""
    dt = row_block.dtype
    full = (UOp.const(dt, 0), UOp.const(dt, steps))
    needed = _needed_tiles(plan)
    if needed is None or needed.all():
        return full
    bounds = []
    for row in needed:
        taken = np.flatnonzero(row)
        if len(taken) == 0 or taken[-1] - taken[0] + 1 != len(taken):
            return full
        bounds.append((int(taken[0]), int(taken[-1]) + 1))
    first, end = _affine([b[0] for b in bounds]), _affine([b[1] for b in bounds])
    if first is None or end is None:
        return full
    start = UOp.const(dt, first[0]) * row_block + UOp.const(dt, first[1]) if first[0] else UOp.const(dt, first[1])
    count = UOp.const(dt, end[0] - first[0]) * row_block + UOp.const(dt, end[1] - first[1])
    return start, simplify(count)


def _affine(values: list[int]) -> tuple[int, int] | None:
    """(a, b) with values[i] == a * i + b for every i, or None."""
    slope = values[1] - values[0] if len(values) > 1 else 0
    return (slope, values[0]) if all(v == values[0] + slope * i for i, v in enumerate(values)) else None


def _needed_tiles(plan: ChainPlan) -> np.ndarray | None:
    """[row block, key step]: whether the tile has a weight that is not the identity, by the first condition on the
    rows' and keys' indices alone (a WHERE's) that makes the weight the reduction's identity where it is false (or
    where it is true); None without one."""
    conditions = [u.src[0] for u in plan.weight.toposort(stop=lambda x: x in plan.inners) if u.op is Ops.WHERE]
    identity = "zero" if plan.outer.arg is Ops.ADD else "ninf"
    for condition in dict.fromkeys(conditions):
        if any(u.op is Ops.RANGE and u not in (*plan.rows, plan.key) or u.op not in _INDEX_OPS or
               u.op is Ops.CAST and not (u.dtype.is_int and u.src[0].dtype.is_int) for u in condition.toposort()):
            continue
        # (the weight is the identity where the condition is false, or, with the WHERE's branches the other way
        # round, where it is true: `where(row < key, -inf, s)`)
        hiding = [h for h in (False, True)
                  if _value_class(substitute(plan.weight, {condition: UOp.const(dtypes.bool, h)}), plan.inners, {})
                  == identity]
        if not hiding:
            continue
        row_sizes = [r.src[0].arg for r in plan.rows]
        flat_rows, keys = np.arange(prod(row_sizes))[:, None], np.arange(plan.key.src[0].arg)[None, :]
        env = {plan.key: keys}
        stride = 1
        for r, size in reversed(list(zip(plan.rows, row_sizes))):
            env[r] = (flat_rows // stride) % size
            stride *= size
        value = _evaluate(condition, env).astype(bool)
        shown = np.broadcast_to(value if hiding[0] is False else ~value, (flat_rows.shape[0], keys.shape[1]))
        blocks = shown.reshape(shown.shape[0] // ROWS, ROWS, shown.shape[1] // KEYS, KEYS)
        return np.asarray(blocks.any(axis=(1, 3)))
    return None


_INDEX_OPS = frozenset({Ops.RANGE, Ops.CONST, Ops.ADD, Ops.MUL, Ops.IDIV, Ops.MOD, Ops.NEG, Ops.MAX, Ops.CMPLT,
                        Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR, Ops.CAST})
_NUMPY_OPS = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.IDIV: np.floor_divide, Ops.MOD: np.mod, Ops.MAX: np.maximum,
              Ops.CMPLT: np.less, Ops.CMPEQ: np.equal, Ops.CMPNE: np.not_equal, Ops.AND: np.bitwise_and,
              Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor}


def _evaluate(u: UOp, env: dict[UOp, np.ndarray]) -> np.ndarray:
    """An index expression over non-negative loop indices (`env`: each loop's values), with numpy."""
    values: dict[UOp, Any] = {}
    for n in u.toposort():
        if n.op is Ops.RANGE:
            values[n] = env[n]
        elif n.op is Ops.CONST:
            values[n] = np.array(n.arg)
        elif n.op is Ops.NEG:
            values[n] = -values[n.src[0]]
        elif n.op is Ops.CAST:  # (between int widths: the indices fit either)
            values[n] = values[n.src[0]]
        else:
            values[n] = _NUMPY_OPS[n.op](values[n.src[0]], values[n.src[1]])
    return np.asarray(values[u])


def _value_class(u: UOp, opaque: tuple[UOp, ...], memo: dict[UOp, str | None]) -> str | None:
    """What a float value is where a mask is off: "ninf" (-inf), "zero", "finite", "false"/"true"/"bool" for
    conditions, or None (unknown, or possibly +inf or NaN). Loads and the scores are taken as finite (a row that
    is hidden whole has a logsumexp of -inf, and its NaNs are not kept for the tiles skipped)."""
    if u in memo:
        return memo[u]
    kids = [_value_class(s, opaque, memo) for s in u.src] if u not in opaque else []
    out: str | None = None
    if u in opaque or u.op in (Ops.LOAD, Ops.GEP, Ops.REDUCE, Ops.RANGE):
        out = "finite"
    elif u.op is Ops.CONST:
        v = u.arg
        out = ("true" if v else "false") if isinstance(v, bool) else "ninf" if v == -math.inf else "zero" \
            if v == 0 else "finite" if math.isfinite(v) else None
    elif u.dtype == dtypes.bool:
        out = "bool"
    elif u.op is Ops.WHERE:
        out = kids[2] if kids[0] == "false" else kids[1] if kids[0] == "true" else \
            kids[1] if kids[1] == kids[2] else "finite" if {kids[1], kids[2]} <= {"finite", "zero"} else None
    elif u.op is Ops.CAST:
        out = kids[0]
    elif u.op is Ops.EXP2:
        out = {"ninf": "zero", "zero": "finite", "finite": "finite"}.get(kids[0] or "")
    elif u.op in (Ops.LOG2, Ops.SQRT, Ops.RECIP, Ops.SIN):
        out = "finite" if kids[0] == "finite" else None
    elif u.op is Ops.NEG:
        out = kids[0] if kids[0] in ("zero", "finite") else None
    elif u.op is Ops.ADD:
        out = _added(kids[0], kids[1])
    elif u.op is Ops.MUL:
        out = _multiplied(u, kids)
    elif u.op is Ops.FDIV:
        out = kids[0] if kids[0] in ("zero", "finite") and kids[1] == "finite" else None
    elif u.op is Ops.MAX:
        out = kids[1] if kids[0] == "ninf" else kids[0] if kids[1] == "ninf" else \
            "finite" if {kids[0], kids[1]} <= {"finite", "zero"} else None
    memo[u] = out
    return out


def _added(x: str | None, y: str | None) -> str | None:
    if x == "zero" or y == "zero":
        return y if x == "zero" else x
    if "ninf" in (x, y) and {x, y} <= {"ninf", "finite"}:
        return "ninf"
    return "finite" if x == y == "finite" else None


def _multiplied(u: UOp, kids: list[str | None]) -> str | None:
    if "zero" in kids and set(kids) <= {"zero", "finite"}:
        return "zero"
    for i in (0, 1):  # -inf times a positive constant
        other = u.src[1 - i]
        if kids[i] == "ninf" and other.op is Ops.CONST and isinstance(other.arg, float) and 0 < other.arg < math.inf:
            return "ninf"
    return "finite" if kids == ["finite", "finite"] else None


def _staged(offsets: dict[tuple[str, int, int], int], region: tuple[str, int], stage: UOp, width: int, pos: UOp,
            kk: UOp) -> UOp:
    """Shared index of (pos, kk) in the tile `region` of stage `stage` (0 or 1)."""
    first, second = offsets[(region[0], region[1], 0)], offsets[(region[0], region[1], 1)]
    base = stage * UOp.const(pos.dtype, second - first)
    return base + _at(first, width, pos, kk)


def _second_product(plan: ChainPlan, weights: list[list[UOp]], reader: UOp, offsets: dict[tuple[str, int, int], int],
                    stage: UOp, step: UOp, row_block: UOp, warp_row: UOp, lane16: UOp, upper: UOp, group: UOp,
                    in_group: UOp, batch_map: dict[UOp, UOp]) -> list[UOp]:
    """The weights (rounded to the half dtype) times the column factor's tile: per 16 keys the 8 accumulators of two
    key parts are one row fragment (a0..a3: rows g, g+8 x keys 2t.., 8+2t..), so the product needs no shuffles."""
    dt = step.dtype
    c = lambda v: UOp.const(dt, v)  # noqa: E731
    packed = [UOp(Ops.FRAGMENT, plan.dtype, (*weights[2 * p], *weights[2 * p + 1]), ("pack", False))
              for p in range(KEYS // 16)]
    col_frags = [[UOp(Ops.FRAGMENT, plan.dtype, (reader, _staged(offsets, ("g", 0), stage, plan.columns,
                                                                 c(16 * p) + lane16, c(16 * q) + upper)),
                      ("col", True)) for q in range(plan.columns // 16)] for p in range(KEYS // 16)]
    accs = []
    for n in range(plan.columns // 8):
        chain: UOp | None = None
        for p in range(KEYS // 16):
            chain = UOp(Ops.WMMA, dtypes.float32, (packed[p], col_frags[p][n // 2], *(() if chain is None else
                                                                                       (chain,))), n % 2)
        assert chain is not None
        accs.append(UOp(Ops.REDUCE, dtypes.float32, (chain, step), Ops.ADD))
    roots = [plan.store, *accs]  # (what the substitutions below leave as it is: found once, not walked in each)
    unchanged = unchanged_by(roots, {plan.outer}), unchanged_by(roots, {*batch_map, *plan.rows, *plan.cols})
    outputs = []
    for n, acc in enumerate(accs):
        for e in range(4):
            row = row_block * c(ROWS) + warp_row + group + c(8 * (e // 2))
            col = c(8 * n + e % 2) + in_group * c(2)
            store = substitute(plan.store, {plan.outer: UOp(Ops.GEP, dtypes.float32, (acc,), e)}, unchanged[0])
            outputs.append(substitute(store, {**batch_map, **_positions(Operand(plan.weight, plan.rows), row),
                                              **_positions(Operand(plan.weight, plan.cols), col)}, unchanged[1]))
    return outputs


def _row_reduction(plan: ChainPlan, weights: list[list[UOp]], step: UOp, row_block: UOp, warp_row: UOp,
                   group: UOp, in_group: UOp, batch_map: dict[UOp, UOp]) -> list[UOp]:
    """Each lane reduces its 16 weights of each of its 2 rows per step, over all steps; then the 4 lanes of a row
    (lanes 4g..4g+3) combine theirs with two shuffles and the first of them stores the row's output."""
    dt = step.dtype
    c = lambda v: UOp.const(dt, v)  # noqa: E731
    op = plan.outer.arg
    outputs = []
    for half in range(2):
        values = [weights[n][e] for n in range(KEYS // 8) for e in (2 * half, 2 * half + 1)]
        total = UOp(Ops.REDUCE, dtypes.float32, (_combine(op, values), step), op)
        for mask in (1, 2):
            total = total.alu(op, UOp(Ops.SHUFFLE_XOR, dtypes.float32, (total,), mask))
        store = substitute(plan.store, {plan.outer: total})
        store = substitute(store, {**batch_map, **_positions(Operand(plan.weight, plan.rows),
                                                             row_block * c(ROWS) + warp_row + group + c(8 * half))})
        outputs.append(store.replace(src=(*store.src[:3], in_group.eq(c(0)))))
    return outputs


def _combine(op: Ops, values: list[UOp]) -> UOp:
    """A balanced tree of `op` over `values`."""
    while len(values) > 1:
        values = [values[i].alu(op, values[i + 1]) if i + 1 < len(values) else values[i]
                  for i in range(0, len(values), 2)]
    return values[0]
