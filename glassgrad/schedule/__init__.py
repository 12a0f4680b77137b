"""The scheduler: cut a tensor graph into kernels (fusion) and say which buffers each one reads and writes.

In: the tensor-graph nodes to realize. Out: `ScheduleItem`s in dependency order, and for every node that was
materialised, its buffer view (`BUFFER.reshape(shape)`), which the caller swaps in for the node.

What gets materialised (a kernel writes it to memory):
  * the requested outputs, every CONTIGUOUS node, every COPY between devices (and a COPY's source);
  * a REDUCE_AXIS that would otherwise be recomputed: one reached from its consumer through an EXPAND or
    through another reduction (softmax's max and sum), or one that more than one kernel reads.
Everything else fuses into the kernel that consumes it: elementwise chains, movement ops (as index math on
the loads), and a reduction together with its elementwise inputs and the elementwise math on its result.
Nodes realized before (`REALIZED`) are loaded from their buffers, never recomputed. A reshape keeps row-major
order, so a requested output that is only reshapes of another node costs no kernel of its own: it becomes a view
of that node's buffer (and a reshape of a buffer is already realized).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.schedule.indexing import KernelBuilder
from glassgrad.uop.ops import Ops, UOp


class RealizedMap:
    """Tensor-graph node -> view of the buffer that holds its value. Weak on both sides: an entry lasts while the
    node is alive and something (a Tensor) still holds the view, so realized buffers are never kept alive here."""

    def __init__(self) -> None:
        self._map: weakref.WeakKeyDictionary[UOp, weakref.ref[UOp]] = weakref.WeakKeyDictionary()

    def __setitem__(self, node: UOp, view: UOp) -> None:
        self._map[node] = weakref.ref(view)

    def get(self, node: UOp) -> UOp | None:
        ref = self._map.get(node)
        return None if ref is None else ref()

    def __contains__(self, node: UOp) -> bool:
        return self.get(node) is not None


REALIZED = RealizedMap()


@dataclass(frozen=True)
class ScheduleItem:
    """One unit of work: a kernel AST (SINK) with its buffers (output first), or a COPY between buffers."""
    ast: UOp
    bufs: tuple[Buffer, ...]


def buffer_view(buf: Buffer, shape: tuple[int, ...]) -> UOp:
    """The tensor-graph node that reads `buf` as a tensor of `shape`."""
    return UOp(Ops.BUFFER, buf.dtype, (), (buf, 0)).reshape(shape)


def without_reshapes(u: UOp) -> UOp:
    """The node under any chain of reshapes: the same elements, in the same row-major order."""
    while u.op is Ops.RESHAPE:
        u = u.src[0]
    return u


def is_buffer_view(u: UOp) -> bool:
    """True for a buffer, or reshapes of one: already contiguous in memory, nothing to compute."""
    return without_reshapes(u).op is Ops.BUFFER


def _materialised(u: UOp) -> bool:
    return u.op is Ops.BUFFER or u in REALIZED


def _reduces_to_materialise(roots: dict[UOp, None]) -> set[UOp]:
    """REDUCE_AXIS nodes that fusing would recompute: reached through an EXPAND or a reduction, or from two kernels."""
    found: set[UOp] = set()
    reached_from: dict[UOp, UOp] = {}
    for root in roots:
        seen: set[tuple[UOp, bool]] = set()
        stack: list[tuple[UOp, bool]] = [(s, root.op is Ops.REDUCE_AXIS) for s in root.src]
        while stack:
            node, repeated = stack.pop()
            if (node, repeated) in seen or _materialised(node) or node in roots:
                continue
            seen.add((node, repeated))
            if node.op is Ops.REDUCE_AXIS:
                if repeated or reached_from.setdefault(node, root) is not root:
                    found.add(node)
                    continue
            below = repeated or node.op in (Ops.EXPAND, Ops.REDUCE_AXIS)
            stack.extend((s, below) for s in node.src)
    return found


def _choose_roots(outs: list[UOp], nodes: list[UOp]) -> dict[UOp, None]:
    roots: dict[UOp, None] = {o: None for o in outs if not is_buffer_view(o) and not _materialised(o)}
    for n in nodes:
        if _materialised(n):  # the walk stops at these, but lists them: they are loaded, never recomputed
            continue
        if n.op is Ops.CONTIGUOUS:
            roots[n] = None
        if n.op is Ops.COPY:
            roots[n] = None
            if not is_buffer_view(n.src[0]) and not _materialised(n.src[0]):
                roots[n.src[0]] = None
    while extra := _reduces_to_materialise(roots):
        roots.update(dict.fromkeys(extra))
    return roots


def create_schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Schedule the kernels that compute `outs`. Returns the items and {node: buffer view} for new buffers.

    A reshape keeps row-major order, so an output that is a reshape of some node costs no kernel of its own: the
    node under the reshapes is materialised (unless it already is) and the output becomes a view of its buffer."""
    targets = [without_reshapes(o) for o in outs]
    sink = UOp(Ops.SINK, dtypes.void, tuple(targets))
    nodes = sink.toposort(stop=_materialised)
    roots = _choose_roots(targets, nodes)
    views: dict[UOp, UOp] = {}

    def view_of(u: UOp) -> UOp | None:
        return views.get(u) or REALIZED.get(u)


    schedule: list[ScheduleItem] = []
    for node in nodes:
        if node not in roots:
            continue
        out = Buffer(node.device, node.size, node.dtype)
        if node.size == 0:
            pass
        elif node.op is Ops.COPY:
            src = view_of(node.src[0]) or node.src[0]
            schedule.append(ScheduleItem(UOp(Ops.COPY, node.dtype, (), node.src[1].arg), (out, src.base.arg[0])))
        else:
            builder = KernelBuilder(view_of)
            schedule.append(ScheduleItem(builder.build(node, out), tuple(builder.buffers)))
        views[node] = buffer_view(out, node.shape)  # later kernels load it from here
    for out_node, target in zip(outs, targets):
        if out_node is not target and (target_view := view_of(target)) is not None:
            views[out_node] = target_view.reshape(out_node.shape)  # holding it keeps the target's entry alive
    return schedule, views
