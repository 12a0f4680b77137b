"""The schedule cache: graphs with the same structure get the same schedule, without scheduling them again.

In: the scheduler's node list for a graph (toposorted, stopped at materialised nodes). Out, on a hit: the schedule
a previous graph of the same structure got, re-bound to this graph's buffers. A training loop without the JIT
builds a new graph every step, equal to the last one except for the buffers it reads, so from the second step on
it skips fusion, kernel building and write ordering (and, the ASTs being the same nodes, codegen and compiling).

The key is the graph with every materialised leaf (a BUFFER, or a node already in REALIZED) replaced by a
positional placeholder: the n-th distinct buffer of the walk is slot n. Each node is described by its op, dtype,
argument and the positions of its sources, so two graphs with equal keys are the same DAG up to which buffers sit
in the slots (two leaves on one buffer share a slot, so aliasing is part of the key). The scheduler only looks at
that structure, never at buffer contents, so the schedule it made for one graph is right for the other once each
buffer is replaced by the one in the same slot and each buffer the schedule created is created afresh.

Versions (`Buffer.version`, the count of in-place writes) are kept relative: a graph is cacheable only if every
leaf reads its buffer's current version (a stale read goes to the scheduler, which raises), and the template stores
each read and write as "slot n, current version + k". An optimiser step, which assigns to the same parameter
buffers at a new version every step, therefore hits.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from glassgrad.device import Buffer
from glassgrad.dtype import DType
from glassgrad.engine.memory import SchedulePlan
from glassgrad.uop.ops import OP_BUFFER, OP_CONST, OP_RESHAPE, Ops, UOp
from glassgrad.uop.params import float_bits, liftable

# what the scheduler returns: the items (typed as Any here: ScheduleItem lives in the package that imports this)
# and {tensor-graph node: buffer view}
Schedule = tuple[list[Any], dict[UOp, UOp]]
ViewTemplate = tuple[int, int, tuple[tuple[int, ...], ...]]  # (buffer ref, version offset, reshape shapes)


def reshape_chain(u: UOp) -> tuple[UOp, tuple[tuple[int, ...], ...]]:
    """The node under a chain of reshapes, and the chain's shapes from the bottom up."""
    shapes: list[tuple[int, ...]] = []
    while u.op is OP_RESHAPE:
        shapes.append(u.arg)
        u = u.src[0]
    return u, tuple(reversed(shapes))


@dataclass(slots=True)
class GraphKey:
    """A graph's structure (`graph`, hashable), the buffers in its slots, and each node's position in the walk.
    `consts`: the float32 constants that kernels take as parameters (uop/params.py), in walk order; the structure
    has a placeholder for each value (see `values`)."""
    graph: tuple[Any, ...]
    buffers: list[Buffer]
    position: dict[UOp, int]
    consts: list[UOp] = field(default_factory=list)

    def values(self) -> tuple[float, ...]:
        """The values of `consts`: with `graph`, the key of a structure whose schedule holds its constants."""
        return tuple([c.arg for c in self.consts])


VALUE = "value"  # a lifted constant's placeholder in the structure (its value is one of GraphKey.values)
# Markers, the cache's entry for a structure with lifted constants whose schedules are cached per value, under
# (the structure's key, GraphKey.values()): seen with one set of values so far (the next set probes whether one
# schedule serves all: schedule/__init__.py `_constant_slots`), or known to depend on its values.
SEEN_ONCE, LITERAL_VALUES = "seen once", "literal values"


def walk_graph(roots: tuple[UOp, ...], outs: list[UOp], realized: Callable[[UOp], UOp | None],
               realized_ids: tuple[dict[int, Any], dict[int, Any]], keyed: bool = True, lift: bool = False
               ) -> tuple[list[UOp], dict[UOp, UOp], GraphKey | None]:
    """The scheduler's walk of the graph under `roots` and, in the same pass, its cache key.

    Returns the nodes (sources first, as the toposort of a SINK of `roots` lists them without the SINK, stopping at
    materialised nodes: a BUFFER, or a node `realized` gives a buffer view for), each materialised node's view (a
    BUFFER is its own), and the key of `structure_key` (None when `keyed` is off, or the graph must not be cached: a
    leaf that reads an old version of its buffer, or a view that is not reshapes of a buffer). `realized` is asked
    only about nodes whose id is in one of `realized_ids` (REALIZED's tables: nearly every node is in none, and a
    dictionary test is cheaper than a call). No SINK node is built: a cache hit never needs one (the scheduler
    builds it on a miss), so the roots are the walk's first frame and the key ends with their positions. With `lift`
    (LIFT_CONSTANTS), a float32 constant that kernels take as a parameter is written as a placeholder, `VALUE`, and
    listed in the key's `consts`."""
    leaves: dict[UOp, UOp] = {}
    # each node's position in the walk; the dictionary keeps the order of insertion, so it is the node list too
    position: dict[UOp, int] = {}
    slot_of: dict[Buffer, int] = {}
    parts: list[tuple[Any, ...]] | None = [] if keyed else None
    # (locals: this loop runs for every node of every graph realized)
    ids_a, ids_b = realized_ids
    get, buffer_op, const_op = position.__getitem__, OP_BUFFER, OP_CONST
    consts: list[UOp] = []
    stack: list[tuple[UOp | None, Iterator[UOp]]] = [(None, iter(roots))]  # (the roots' frame: no node of its own)
    push = stack.append
    while stack:
        node, sources = stack[-1]
        for s in sources:
            if s in position:
                continue
            if s.op is buffer_op:
                view = s
            else:
                sid = id(s)
                found = realized(s) if sid in ids_a or (ids_b and sid in ids_b) else None
                if found is None:
                    if s.src:
                        push((s, iter(s.src)))
                        break
                    position[s] = len(position)  # a node without sources (a DEVICE) is listed at once
                    if parts is not None:
                        parts.append((s.op, s.dtype, s.arg_key))
                    continue
                view = found
            leaves[s] = view  # a leaf is listed when found, its sources are not walked
            position[s] = len(position)
            if parts is not None and not _add_leaf(parts, s, view, slot_of):
                parts = None
        else:
            stack.pop()
            if node is None:  # the roots' frame: done
                break
            position[node] = len(position)
            if parts is not None:  # (op, dtype, argument, positions of the sources)
                src = node.src
                if node.op is const_op and lift and liftable(node):
                    consts.append(node)
                    parts.append((const_op, node.dtype, VALUE, *map(get, src)))
                elif len(src) == 2:  # (the most common node: no map over its sources)
                    parts.append((node.op, node.dtype, node.arg_key, get(src[0]), get(src[1])))
                elif len(src) == 1:
                    parts.append((node.op, node.dtype, node.arg_key, get(src[0])))
                else:
                    parts.append((node.op, node.dtype, node.arg_key, *map(get, src)))
    nodes = list(position)
    if parts is None:
        return nodes, leaves, None
    return nodes, leaves, _graph_key(parts, roots, outs, slot_of, position, consts)


def _graph_key(parts: list[tuple[Any, ...]], roots: tuple[UOp, ...], outs: list[UOp], slot_of: dict[Buffer, int],
               position: dict[UOp, int], consts: list[UOp] | None = None) -> GraphKey:
    """The key from the nodes' parts: they, the roots' positions (where a SINK of them would be), and each output's
    node under its reshapes with the reshapes' shapes."""
    parts.append(("roots", *[position[r] for r in roots]))
    outputs = []
    for out in outs:
        if out.op is OP_RESHAPE:
            under, shapes = reshape_chain(out)
            outputs.append((position[under], shapes))
        else:  # (reshape_chain's answer without its call)
            outputs.append((position[out], ()))
    return GraphKey((tuple(parts), tuple(outputs)), list(slot_of), position, [] if consts is None else consts)


def _add_leaf(parts: list[tuple[Any, ...]], node: UOp, view: UOp, slot_of: dict[Buffer, int]) -> bool:
    """Add a materialised leaf's entry to `parts`: its buffer's slot (the n-th distinct buffer of the walk), the
    buffer's kind and the view's reshapes. False (no key) when the view is not reshapes of the buffer's current
    version."""
    shapes: tuple[tuple[int, ...], ...]
    op = view.op
    if op is OP_BUFFER:  # (the common views first: reshape_chain's result without its call)
        base, shapes = view, ()
    elif op is OP_RESHAPE and view.src[0].op is OP_BUFFER:
        base, shapes = view.src[0], (view.arg,)
    else:
        base, shapes = reshape_chain(view)
    if base.op is not OP_BUFFER or base.arg[1] != base.arg[0].version:
        return False
    buf: Buffer = base.arg[0]
    slot = slot_of.setdefault(buf, len(slot_of))
    parts.append(("leaf", node.op is OP_BUFFER, slot, buf.device, buf.size, buf.dtype, shapes))
    return True


def structure_key(nodes: list[UOp], roots: tuple[UOp, ...], outs: list[UOp],
                  leaf_view: Callable[[UOp], UOp | None]) -> GraphKey | None:
    """The cache key of a graph. `nodes` is its walk (sources first, down from `roots`, the outputs' nodes under
    their reshapes); `leaf_view(n)` is the buffer view of a materialised node, else None. Returns None when the graph
    must not be cached: a leaf that reads an old version of its buffer, or a view that is not reshapes of a buffer.
    (`walk_graph` computes the same key during its walk.)"""
    position: dict[UOp, int] = {}
    slot_of: dict[Buffer, int] = {}
    parts: list[tuple[Any, ...]] = []
    for i, node in enumerate(nodes):
        view = leaf_view(node)
        if view is None:
            parts.append((node.op, node.dtype, node.arg_key, *[position[s] for s in node.src]))
        elif not _add_leaf(parts, node, view, slot_of):
            return None
        position[node] = i
    return _graph_key(parts, roots, outs, slot_of, position)


@dataclass(frozen=True)
class ScheduleTemplate:
    """A schedule with its buffers replaced by references: 0..len(slots)-1 are the graph's slots, the rest are
    buffers the schedule creates (`new_buffers`: device, size, dtype). Versions are offsets from each buffer's version
    when the schedule was made (0 for created buffers)."""
    new_buffers: tuple[tuple[str, int, DType], ...]
    # (ast, buffer refs, reads, write, var_vals): the Variables' values are part of the key (a BIND holds its value)
    # (ast, buffer slots, reads, writes, var_vals) per item; a version is (slot, writes since the key's version)
    items: tuple[tuple[UOp, tuple[int, ...], tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], dict[str, int]],
                 ...]
    views: tuple[tuple[bool, int, ViewTemplate], ...]  # (is an output, its index in outs / position in the walk, view)
    plan: SchedulePlan  # which created buffers share memory
    # per item, (parameter name, index into the key's consts) of each lifted constant that a graph constant gives:
    # a graph of this structure with other values gets its own values there (`var_vals`)
    param_slots: tuple[tuple[tuple[str, int], ...], ...] = ()
    # per item, the bytes of its buffers (GlobalCounters.global_mem's count of a launch): fixed by the structure, whose
    # key holds each slot's size and dtype
    item_bytes: tuple[int, ...] = ()
    # per view, (an earlier view whose node chain starts its own, or -1; how many of its reshapes that one covers):
    # views of one buffer (a reduction's node and the output reshaped from it) share nodes, made once per replay
    prefixes: tuple[tuple[int, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefixes", tuple(_shared_prefix(self.views, i) for i in range(len(self.views))))

    def var_vals(self, i: int, values: tuple[float, ...]) -> dict[str, int]:
        """Item i's `var_vals` for a graph whose constants (GraphKey.values) are `values`."""
        var_vals = self.items[i][4]
        if not self.param_slots or not self.param_slots[i]:
            return var_vals
        return {**var_vals, **{name: float_bits(values[k]) for name, k in self.param_slots[i]}}

    @staticmethod
    def capture(schedule: Schedule, key: GraphKey, created: list[Buffer], outs: list[UOp],
                plan: SchedulePlan) -> ScheduleTemplate | None:
        """The template of a schedule just made for the graph of `key` (before it runs). None if the schedule uses
        a buffer that is neither in a slot nor created by the scheduler (it would depend on more than the key), or
        hands back a view that is not reshapes of a buffer (a symbolic shape's view shrinks its buffer)."""
        items, views = schedule
        if any(reshape_chain(view)[0].op is not Ops.BUFFER for view in views.values()):
            return None
        ref: dict[Buffer, int] = {b: i for i, b in enumerate(key.buffers)}
        base_version = [b.version for b in key.buffers] + [0] * len(created)
        for b in created:
            ref[b] = len(ref)

        def version_ref(buf: Buffer, version: int) -> tuple[int, int]:
            return ref[buf], version - base_version[ref[buf]]

        def view_template(view: UOp) -> ViewTemplate:
            base, shapes = reshape_chain(view)
            buf, version = base.arg
            return (*version_ref(buf, version), shapes)

        try:
            item_templates = tuple((item.ast, tuple(ref[b] for b in item.bufs),
                                    tuple(version_ref(*r) for r in item.reads),
                                    tuple(version_ref(*w) for w in item.writes), item.var_vals)
                                   for item in items)
            out_index = {id(o): i for i, o in reversed(list(enumerate(outs)))}  # an output's first index
            view_templates = tuple((True, out_index[id(node)], view_template(view)) if id(node) in out_index else
                                   (False, key.position[node], view_template(view)) for node, view in views.items())
        except KeyError:
            return None
        return ScheduleTemplate(tuple((b.device, b.size, b.dtype) for b in created), item_templates, view_templates,
                                plan, item_bytes=tuple(sum(b.size * b.dtype.itemsize for b in item.bufs)
                                                       for item in items))

    def bind(self, key: GraphKey) -> tuple[list[Buffer], list[int]]:
        """The buffers this template's references stand for in the graph of `key`: the key's slots, then fresh
        buffers for the ones the schedule creates, placed in memory by the template's plan; and each one's version
        now (the versions the template's offsets count from)."""
        created = [Buffer(device, size, dtype) for device, size, dtype in self.new_buffers]
        self.plan.place(created)
        return key.buffers + created, [b.version for b in key.buffers] + [0] * len(created)

    def instantiate(self, key: GraphKey, nodes: list[UOp], outs: list[UOp],
                    make_item: Callable[..., Any]) -> Schedule:
        """The schedule for the graph of `key`: this template bound to the graph's buffers (`bind`).
        `make_item(ast, bufs, reads, writes, var_vals)` builds a ScheduleItem."""
        bufs, base_version = self.bind(key)
        values = key.values()
        # (list comprehensions, not generators: this runs for every item of every cache hit)
        items = [make_item(ast, tuple([bufs[r] for r in refs]),
                           frozenset([(bufs[b], base_version[b] + k) for b, k in reads]),
                           tuple([(bufs[b], base_version[b] + k) for b, k in writes]), dict(self.var_vals(i, values)))
                 for i, (ast, refs, reads, writes, _) in enumerate(self.items)]
        return items, self.views_for(bufs, base_version, nodes, outs)

    def views_for(self, bufs: list[Buffer], base_version: list[int], nodes: list[UOp],
                  outs: list[UOp]) -> dict[UOp, UOp]:
        """{node: buffer view} for the graph whose walk is `nodes`, on the buffers (and versions) of `bind`."""
        views: dict[UOp, UOp] = {}
        made: list[UOp] = []
        for (is_out, index, (buf_ref, offset, shapes)), (prefix, done) in zip(self.views, self.prefixes):
            buf = bufs[buf_ref]
            view = made[prefix] if prefix >= 0 else UOp(OP_BUFFER, buf.dtype, (), (buf, base_version[buf_ref] + offset))
            for shape in shapes[done:]:
                view = UOp(OP_RESHAPE, buf.dtype, (view,), shape)
            made.append(view)
            views[outs[index] if is_out else nodes[index]] = view
        return views


def _shared_prefix(views: tuple[tuple[bool, int, ViewTemplate], ...], i: int) -> tuple[int, int]:
    """(the earlier view with the longest chain that starts view i's: the same buffer and version, its reshapes a
    prefix of i's; how many reshapes it has), or (-1, 0) where none does."""
    _, _, (buf_ref, offset, shapes) = views[i]
    best = (-1, 0)
    for j in range(i):
        _, _, (other_ref, other_offset, other_shapes) = views[j]
        n = len(other_shapes)
        if other_ref == buf_ref and other_offset == offset and shapes[:n] == other_shapes and n >= best[1]:
            best = (j, n)
    return best


class ScheduleCache:
    """Least-recently-used map from graph structure to `ScheduleTemplate`, holding at most `capacity` entries.

    A hit hashes its key once: each entry carries the stamp of its last use (an OrderedDict's `move_to_end` would
    hash the key again, and a key is a tuple of a part per node, not cached). Eviction, only when a new entry makes
    the cache too big, scans the stamps for the oldest."""

    def __init__(self, capacity: int = 1024) -> None:
        self.capacity = capacity
        self._entries: dict[tuple[Any, ...], list[Any]] = {}  # key -> [template, stamp of its last use]
        self._clock = 0
        self.hits = self.misses = 0

    def get(self, graph: tuple[Any, ...]) -> ScheduleTemplate | None:
        template, _ = self.lookup(graph, ())
        return template

    def lookup(self, graph: tuple[Any, ...], values: tuple[float, ...]) -> tuple[ScheduleTemplate | None, str | None]:
        """(the template for a graph of structure `graph` and constants `values`, or None; the structure's marker,
        SEEN_ONCE or LITERAL_VALUES, where it has one). One hit or miss is counted."""
        found, marker = self._touch(graph), None
        if isinstance(found, str):
            marker, found = found, self._touch((*graph, values))
        if found is None:
            self.misses += 1
            return None, marker
        self.hits += 1
        return found, marker

    def _touch(self, graph: tuple[Any, ...]) -> Any:
        entry = self._entries.get(graph)
        if entry is None:
            return None
        self._clock += 1
        entry[1] = self._clock
        return entry[0]

    def put(self, graph: tuple[Any, ...], template: ScheduleTemplate | str) -> None:
        self._clock += 1
        self._entries[graph] = [template, self._clock]
        if len(self._entries) > self.capacity:
            oldest = min(self._entries.items(), key=lambda item: item[1][1])[0]
            del self._entries[oldest]

    def clear(self) -> None:
        self._entries.clear()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)
