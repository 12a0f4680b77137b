"""Tensors on several devices: how they are split, and how a graph over them becomes one graph per device.

In: tensor-graph nodes whose device is a tuple of device names: `MULTI` leaves (`Tensor.shard`, realized multi-device
tensors) and the ordinary ops built on them (autograd works on this *logical* graph, shapes are the whole tensor's).
Out (`lower`): for each node, `MULTI(part_0, ..., part_n-1)` with `arg=axis`, part i an ordinary single-device graph
on device i, which the scheduler fuses and runs like any other. The rules, one per kind of op:

  * sources are brought to one layout first: the first sharded source's axis and bounds (a replicated source is
    shrunk to each device's slice, no copy; a source sharded otherwise is gathered, then shrunk);
  * elementwise ops, casts, CONTIGUOUS, ASSIGN (to the target's layout): the same op per device;
  * a reduction over other axes stays per device; over the sharded axis each device reduces its part and the
    partials are combined by `ALLREDUCE` nodes (the scheduler runs them as one collective): the result is replicated;
  * RESHAPE keeps the sharded axis when each part reshapes on its own (the elements before the axis stay before it);
    one that would split the axis across devices raises `ShapeError`. PERMUTE moves the axis. EXPAND, PAD, SHRINK and
    FLIP of other axes run per device; of the sharded axis, the tensor is gathered (replicated) first;
  * COPY to one device gathers (the parts joined along the axis); COPY to several devices replicates.

Splits follow tinygrad: `ceil(size / n)` per device, the last ones shorter or empty (7 over 3: 3, 3, 1).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from glassgrad.dtype import dtypes
from glassgrad.errors import ShapeError
from glassgrad.helpers import prod
from glassgrad.schedule import is_buffer_view
from glassgrad.uop.ops import OP_MULTI, GroupOp, Ops, UOp

Bounds = tuple[tuple[int, int], ...]
REDUCIBLE = (Ops.ADD, Ops.MAX, Ops.MUL)  # the reduce ops an ALLREDUCE combines


def shard_bounds(size: int, count: int) -> Bounds:
    """[start, end) of each of `count` parts of an axis of `size` elements (tinygrad's split: ceil(size/count))."""
    step = math.ceil(size / count) if count else 0
    return tuple((min(i * step, size), min((i + 1) * step, size)) for i in range(count))


def bounds_of(multi: UOp) -> Bounds | None:
    """The [start, end) of each part along the sharded axis (None for a replicated tensor)."""
    if multi.arg is None:
        return None
    out, start = [], 0
    for part in multi.src:
        out.append((start, start + part.shape[multi.arg]))
        start += part.shape[multi.arg]
    return tuple(out)


def is_realized(u: UOp) -> bool:
    """A buffer view, or a MULTI of buffer views (a realized tensor on several devices)."""
    return is_buffer_view(u) or (u.op is OP_MULTI and all(is_buffer_view(p) for p in u.src))


def view_parts(u: UOp) -> tuple[UOp, ...]:
    """The per-device views of a realized tensor's node: its parts (several devices), or itself."""
    return u.src if u.op is Ops.MULTI else (u,)


def at_current_versions(u: UOp) -> UOp:
    """A realized tensor's node re-pointed at its buffers' current versions (after in-place writes elsewhere)."""
    from glassgrad.schedule import buffer_view
    parts = [buffer_view(p.base.arg[0], p.shape, p.base.arg[0].version) for p in view_parts(u)]
    return make_multi(parts, u.arg) if u.op is Ops.MULTI else parts[0]


def make_multi(parts: Sequence[UOp], axis: int | None) -> UOp:
    _IN_USE[0] = True
    return UOp(Ops.MULTI, parts[0].dtype, tuple(parts), axis)


def is_multi_device(u: UOp) -> bool:
    return u.op is not Ops.DEVICE and _device(u) is not None and isinstance(_device(u), tuple)


def _device(u: UOp) -> str | tuple[str, ...] | None:
    """The node's device, or None for nodes that have none (a kernel constant inside a bound Variable)."""
    if u.op in (Ops.DEFINE_VAR, Ops.BIND) or (u.op is Ops.CONST and not u.src):
        return None
    return u.device  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- moving parts between layouts
def _slice(u: UOp, axis: int, bound: tuple[int, int]) -> UOp:
    return u.shrink(tuple(bound if i == axis else (0, s) for i, s in enumerate(u.shape)))


def gather_to(multi: UOp, device: str) -> UOp:
    """The whole tensor on `device`: its part there (replicated), else the parts copied there and joined."""
    if multi.arg is None:
        return next((p for p in multi.src if p.device == device), None) or _copy(multi.src[0], device)
    axis, total = multi.arg, multi.shape[multi.arg]
    out: UOp | None = None
    for part, (start, end) in zip(multi.src, bounds_of(multi) or ()):
        if end == start:
            continue
        piece = _copy(part, device).pad(tuple((start, total - end) if i == axis else (0, 0)
                                              for i in range(len(part.shape))))
        out = piece if out is None else out.alu(Ops.OR if out.dtype.is_bool else Ops.ADD, piece)
    assert out is not None, "a sharded tensor has at least one non-empty part"
    return out


def _copy(u: UOp, device: str) -> UOp:
    return u if u.device == device else UOp(Ops.COPY, u.dtype, (u, UOp(Ops.DEVICE, dtypes.void, (), device)))


def replicate(multi: UOp) -> UOp:
    """The same tensor, whole on every device (an all-gather: copies between devices)."""
    if multi.arg is None:
        return multi
    return make_multi([gather_to(multi, p.device) for p in multi.src], None)


def reshard(multi: UOp, axis: int | None, bounds: Bounds | None) -> tuple[UOp, ...]:
    """The parts of `multi` in the layout (axis, bounds): no copy from a replicated tensor; gathered otherwise."""
    if multi.arg == axis and bounds_of(multi) == bounds:
        return multi.src
    whole = replicate(multi)
    if axis is None or bounds is None:
        return whole.src
    return tuple(_slice(p, axis, b) for p, b in zip(whole.src, bounds))


# ---------------------------------------------------------------------- lowering
_IN_USE: list[bool] = [False]  # set once a MULTI node is made: from then on realizes look for them


def in_use() -> bool:
    """Whether any tensor on several devices was ever made (until then, `lower` has nothing to do)."""
    return _IN_USE[0]


def lower(roots: Sequence[UOp], realized: Callable[[UOp], UOp | None], unchanged: set[UOp] | None = None
          ) -> list[UOp]:
    """Each root as `MULTI(per-device graphs)` if it is on several devices; a single-device root with the copies
    from several devices inside it gathered (`x.to('CPU')`). `realized(node)` gives the view (a MULTI of buffer
    views) of a node computed before: it is used, not recomputed. `unchanged`, when given, receives the nodes of the
    roots' graphs that are their own lowered form (single-device nodes with nothing on several devices below them):
    the logical nodes that the lowered graphs still hold."""
    memo: dict[UOp, UOp] = {}

    def stop(u: UOp) -> bool:
        return u.op in (Ops.MULTI, Ops.BUFFER) or realized(u) is not None

    out = []
    for root in roots:
        for node in root.toposort(stop=stop):
            if node in memo:
                continue
            # (a BUFFER is its own view, as in the scheduler: `realized` holds a copy of an old version of some
            # buffers, which a read of that version gets there, but a write into the buffer must stay in it)
            view = realized(node) if node.op is not Ops.MULTI and node.op is not Ops.BUFFER else None
            memo[node] = low = view if view is not None else node if stop(node) else _lower_node(node, memo)
            if unchanged is not None and low is node:
                unchanged.add(node)
        out.append(memo[root])
    return out


def _lower_node(n: UOp, memo: dict[UOp, UOp]) -> UOp:
    srcs = [memo.get(s, s) for s in n.src]
    if not is_multi_device(n):  # a single-device node: the same, over its lowered sources (a gather in a COPY)
        if n.op is Ops.COPY and srcs[0].op is Ops.MULTI:
            return gather_to(srcs[0], n.src[1].arg)
        return n if all(a is b for a, b in zip(srcs, n.src)) else n.replace(src=tuple(srcs))
    devices: tuple[str, ...] = n.device
    if n.op in (Ops.CONST, Ops.ARANGE):
        return make_multi([UOp(n.op, n.dtype, (UOp(Ops.DEVICE, dtypes.void, (), d),), n.arg) for d in devices],
                          None)
    if n.op is Ops.COPY:
        return _lower_copy(n, srcs[0])
    if n.op is Ops.REDUCE_AXIS:
        return _lower_reduce(n, srcs[0])
    if n.op in GroupOp.Movement:
        return _lower_movement(n, srcs[0])
    if n.op is Ops.ASSIGN:
        target = srcs[0]
        values = reshard(srcs[1], target.arg, bounds_of(target))
        return make_multi([UOp(Ops.ASSIGN, n.dtype, (t, v)) for t, v in zip(target.src, values)], target.arg)
    if n.op in GroupOp.Elementwise or n.op in (Ops.CONTIGUOUS, Ops.DETACH, Ops.CONTIGUOUS_BACKWARD):
        return _lower_elementwise(n, srcs)
    raise NotImplementedError(f"{n.op} on a tensor on several devices {devices} is not supported")


def _lower_elementwise(n: UOp, srcs: list[UOp]) -> UOp:
    multis = [s for s in srcs if s.op is Ops.MULTI]
    if any(len(m.src) != len(multis[0].src) or m.device != multis[0].device for m in multis):
        raise RuntimeError(f"{n.op}: operands are on different device sets {[m.device for m in multis]}")
    layout = next((m for m in multis if m.arg is not None), multis[0])
    axis, bounds = layout.arg, bounds_of(layout)
    per_source = [reshard(s, axis, bounds) if s.op is Ops.MULTI else (s,) * len(layout.src) for s in srcs]
    parts = [UOp(n.op, n.dtype, tuple(ps), n.arg) for ps in zip(*per_source)]
    return make_multi(parts, axis)


def _lower_reduce(n: UOp, src: UOp) -> UOp:
    op, axes = n.arg
    partials = [p.reduce_axis(op, axes) for p in src.src]
    if src.arg is None or src.arg not in axes:
        return make_multi(partials, src.arg)
    if op not in REDUCIBLE:
        raise NotImplementedError(f"a {op} reduction over the sharded axis of a tensor on several devices")
    return make_multi([UOp(Ops.ALLREDUCE, n.dtype, tuple(partials), (op, i)) for i in range(len(partials))], None)


def _lower_copy(n: UOp, src: UOp) -> UOp:
    target = n.src[1].arg
    if isinstance(target, tuple):  # to several devices: a replicated tensor
        parts = [gather_to(src, d) if src.op is Ops.MULTI else _copy(src, d) for d in target]
        return make_multi(parts, None)
    return gather_to(src, target)


def _lower_movement(n: UOp, src: UOp) -> UOp:
    axis = src.arg
    if n.op is Ops.PERMUTE:
        return make_multi([p.permute(n.arg) for p in src.src], None if axis is None else n.arg.index(axis))
    if n.op is Ops.RESHAPE:
        return _lower_reshape(n, src)
    touches_axis = axis is not None and (
        (n.op is Ops.EXPAND and n.arg[axis] != src.shape[axis]) or
        (n.op is Ops.PAD and n.arg[axis] != (0, 0)) or
        (n.op is Ops.SHRINK and n.arg[axis] != (0, src.shape[axis])) or
        (n.op is Ops.FLIP and n.arg[axis]))
    if touches_axis:
        src, axis = replicate(src), None
    parts = []
    for p in src.src:
        arg = n.arg
        if axis is not None and n.op is Ops.EXPAND:  # (the sharded axis is left whole: each part keeps its size)
            arg = tuple(p.shape[axis] if i == axis else s for i, s in enumerate(arg))
        elif axis is not None and n.op is Ops.SHRINK:
            arg = tuple((0, p.shape[axis]) if i == axis else b for i, b in enumerate(arg))
        parts.append(UOp(n.op, n.dtype, (p,), arg))
    return make_multi(parts, axis)


def _lower_reshape(n: UOp, src: UOp) -> UOp:
    shape: tuple[int, ...] = n.arg
    if src.arg is None:
        return make_multi([p.reshape(shape) for p in src.src], None)
    axis, old = src.arg, src.shape
    before = prod(old[:axis])
    for new_axis in range(len(shape)):
        if prod(shape[:new_axis]) != before or (shape[new_axis] == 1 and old[axis] != 1):
            continue
        sizes = [shape[new_axis] * p.shape[axis] / old[axis] for p in src.src]
        if all(s == int(s) for s in sizes):
            parts = [p.reshape(tuple(int(s) if i == new_axis else d for i, d in enumerate(shape)))
                     for p, s in zip(src.src, sizes)]
            if all(prod(q.shape) == prod(p.shape) for q, p in zip(parts, src.src)):
                return make_multi(parts, new_axis)
    raise ShapeError(f"reshape {old} -> {shape} would split axis {axis}, which is sharded over {len(src.src)} devices "
                     f"as {[p.shape[axis] for p in src.src]}; reshape so that each device's part stays whole, or "
                     "gather the tensor first (.to(device))")
