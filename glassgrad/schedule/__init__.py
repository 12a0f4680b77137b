"""The scheduler: cut a tensor graph into kernels (fusion) and say which buffers each one reads and writes.

In: the tensor-graph nodes to realize. Out: `ScheduleItem`s in dependency order, and for every node that was
materialised, its buffer view (`BUFFER.reshape(shape)`), which the caller swaps in for the node.

What gets materialised (a kernel writes it to memory):
  * the requested outputs, every CONTIGUOUS node, every COPY between devices (and a COPY's source);
  * a REDUCE_AXIS that would otherwise be recomputed: one reached from its consumer through an EXPAND or
    through another reduction, or one that more than one kernel reads. Not a row reduction (over the last axis,
    broadcast back over it to a kernel that runs over the same rows): that kernel computes it once per row, so
    softmax's max and sum live in the softmax kernel;
  * costly elementwise work (divisions, square roots, long chains) reached through an EXPAND: a convolution's
    backward reads its incoming gradient once per weight, which must not recompute BatchNorm's backward each time;
    and a `cat` of computed values reached that way (each piece would be computed under index gates per repeat);
  * an elementwise value of many inputs that several kernels would each recompute (`_shared_values_to_store`: a
    residual stream, which every block reads);
  * on a device that limits a kernel's buffers (Metal), partial values, so that no kernel reads more than that
    (`_split_for_buffer_limit`).
Everything else fuses into the kernel that consumes it: elementwise chains, movement ops (as index math on
the loads), and a reduction together with its elementwise inputs and the elementwise math on its result.
Nodes realized before (`REALIZED`) are loaded from their buffers, never recomputed. A reshape keeps row-major
order, so a requested output that is only reshapes of another node costs no kernel of its own: it becomes a view
of that node's buffer (and a reshape of a buffer is already realized).

Symbolic shapes: a node whose shape holds bound Variables gets a buffer for its largest size, and its view is
`BUFFER.shrink((0, n)).reshape(shape)` (the first n elements). Each item's `var_vals` holds the Variables' values.

Buffers created for kernels whose results no view refers to (the schedule's intermediates) share memory where
their lifetimes within the schedule do not overlap (engine/memory.py's `SchedulePlan`).

A graph with the structure of one scheduled before (other buffers) reuses that schedule: see schedule/cache.py.
"""
from __future__ import annotations

import contextlib
import functools
import struct
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from glassgrad.codegen.linearize import reduce_identity
from glassgrad.device import Buffer
from glassgrad.dtype import DType, dtypes
from glassgrad.engine.memory import SchedulePlan
from glassgrad.helpers import FLASH_ATTENTION, LIFT_CONSTANTS, SCACHE, prod
from glassgrad.schedule.cache import LITERAL_VALUES, SEEN_ONCE, GraphKey, ScheduleCache, ScheduleTemplate, walk_graph
from glassgrad.schedule.gather import gather_one_hot
from glassgrad.schedule.indexing import KernelBuilder
from glassgrad.schedule.rewrite import merge_nested_reduce, rebuild
from glassgrad.schedule.scatter import scatter_one_hot
from glassgrad.uop.ops import OP_ASSIGN, OP_BUFFER, OP_RESHAPE, OP_SHRINK, GroupOp, Ops, UOp, sint
from glassgrad.uop.params import PARAM_PREFIX, float_bits, lift_constants
from glassgrad.uop.pattern import substitute
from glassgrad.uop.sint import max_size, sint_prod
from glassgrad.uop.symbolic import simplify


class RealizedMap:
    """Tensor-graph node -> view of the buffer that holds its value. Weak on both sides: an entry lasts while the
    node is alive and something (a Tensor) still holds the view, so realized buffers are never kept alive here.
    An ASSIGN's entry holds its view for as long as the node lives: the node holds the target buffer anyway, and a
    graph that reads the assign's result (or a tensor still holding the node) must find it there, not recompute the
    write from the buffer's old version.

    The scheduler asks this about every node of every graph it sees, and nearly always the answer is no, so the map
    is keyed by `id(node)` (a WeakKeyDictionary makes a weak reference per lookup). The entry keeps a weak reference
    to its node, which tells a live entry from one whose id was reused, and removes the entry when the node dies."""

    def __init__(self) -> None:
        self._map: dict[int, tuple[weakref.ref[UOp], Callable[[], UOp | None]]] = {}
        # an assign's value node -> the target buffer's view after the write: state, kept through `isolated()`
        self._assigned: dict[int, tuple[weakref.ref[UOp], Callable[[], UOp | None]]] = {}
        # counts the changes that can make a node read a buffer written in place where it did not before: an entry
        # whose view is of such ("owned") buffer, and `isolated()` (schedule/versions.py caches what graphs read)
        self.owned_epoch = 0

    def __setitem__(self, node: UOp, view: UOp) -> None:
        if node.op is OP_ASSIGN:
            self.owned_epoch += 1
            self._put(self._map, node, lambda: view)
            return
        # (every realized node: `_views_owned_buffer` and `_put` inline for the common view, reshapes of a buffer)
        base = view
        while base.op is OP_RESHAPE:
            base = base.src[0]
        if base.arg[0].owned if base.op is OP_BUFFER else _views_owned_buffer(view):
            self.owned_epoch += 1
        ref = _EntryRef(node, _forget_entry)
        ref.table, ref.key = self._map, id(node)
        self._map[ref.key] = (ref, weakref.ref(view))

    def set_assigned_value(self, value: UOp, view: UOp) -> None:
        """`value` was written into an assign target, whose buffer holds it at `view` (while the view lives). Unlike
        other results, this one is loaded inside `isolated()` too: it is state (a JIT replay reads that buffer), and
        its graph may read the target's old contents, which no longer exist."""
        self.owned_epoch += 1
        self._put(self._assigned, value, weakref.ref(view))

    def keep(self, node: UOp, view: UOp) -> None:
        """`node`'s value is at `view` (a copy in a buffer of its own, never written in place) for as long as the node
        lives, through `isolated()` too: the random generator's state at a version that is about to be overwritten,
        while another thread may still be building a graph that reads it (`tensor._RNG.advances`)."""
        self.owned_epoch += 1
        self._put(self._assigned, node, lambda: view)

    @staticmethod
    def _put(table: dict[int, tuple[weakref.ref[UOp], Callable[[], UOp | None]]], node: UOp,
             view: Callable[[], UOp | None]) -> None:
        ref = _EntryRef(node, _forget_entry)
        ref.table, ref.key = table, id(node)  # (attributes, not a closure per entry: every realized node has one)
        table[ref.key] = (ref, view)

    def get(self, node: UOp) -> UOp | None:
        """The view holding `node`'s value, or None. An assigned value whose target has been written again since is
        None: its copy is gone, and the node is computed from its sources again (a later `t[:3].assign(1.0)` on an
        equal buffer builds the very same value node); a source that is gone too raises when it is read."""
        entry = self._map.get(id(node))
        assigned = entry is None
        if assigned:
            entry = self._assigned.get(id(node))
        if entry is None or entry[0]() is not node:
            return None
        view = entry[1]()
        if assigned and view is not None and (base := view.base).op is Ops.BUFFER and \
                base.arg[1] < base.arg[0].version:
            return None
        return view

    def __contains__(self, node: UOp) -> bool:
        return self.get(node) is not None

    def id_tables(self) -> tuple[dict[int, Any], dict[int, Any]]:
        """The tables keyed by `id(node)`: `get(node)` is None for a node whose id is in none of them."""
        return self._map, self._assigned

    @contextlib.contextmanager
    def isolated(self) -> Iterator[None]:
        """Inside the block, results realized before it are not reused (everything is computed from buffers), and
        afterwards the results realized inside it are forgotten. The JIT captures a step this way: the capture then
        holds every kernel the step needs, and no later graph reuses a buffer that the JIT's replays overwrite."""
        outer, self._map = self._map, {}
        self.owned_epoch += 1
        try:
            yield
        finally:
            self._map = outer
            self.owned_epoch += 1


class _EntryRef(weakref.ref):  # type: ignore[type-arg]
    """A `RealizedMap` entry's weak reference to its node; it knows its table and key, to drop the entry when the
    node dies (unless a new node with the same id took the key meanwhile)."""
    __slots__ = ("table", "key")
    table: dict[int, Any]
    key: int


def _forget_entry(ref: _EntryRef) -> None:
    entry = ref.table.get(ref.key)
    if entry is not None and entry[0] is ref:
        del ref.table[ref.key]


def _views_owned_buffer(view: UOp) -> bool:
    """Whether a realized view reads a buffer that is written in place (one device or several)."""
    base = without_reshapes(view)
    if base.op is OP_BUFFER:  # (the common case, without view_versions' list)
        return bool(base.arg[0].owned)
    return any(buf.owned for buf, _ in view_versions(view))


def view_versions(view: UOp) -> list[BufferVersion]:
    """The buffer versions a realized view reads (a MULTI view: one per device)."""
    out = []
    for part in view.src if view.op is Ops.MULTI else (view,):
        base = without_reshapes(part)
        base = base.src[0] if base.op is Ops.SHRINK else base
        if base.op is Ops.BUFFER:
            out.append(base.arg)
    return out


REALIZED = RealizedMap()


BufferVersion = tuple[Buffer, int]  # a buffer's contents after its n-th in-place write (ASSIGN)
Stored = tuple[UOp, Buffer, int]  # a further output of a kernel: the node, its buffer, the version it writes


@dataclass(frozen=True)
class ScheduleItem:
    """One unit of work: a kernel AST (SINK) with its buffers (output first), or a COPY between buffers.
    `reads`/`writes` name buffer versions, so the order of in-place writes can be checked and fixed. A kernel writes
    one buffer, or several of the same shape (the first is `bufs[0]`; see `_merge_outputs`).
    `var_vals`: the value of each Variable (by name) in the kernel's symbolic sizes, its int arguments at launch."""
    ast: UOp
    bufs: tuple[Buffer, ...]
    reads: frozenset[BufferVersion] = frozenset()
    writes: tuple[BufferVersion, ...] = ()
    var_vals: dict[str, int] = field(default_factory=dict, hash=False)


def buffer_view(buf: Buffer, shape: tuple[sint, ...], version: int = 0) -> UOp:
    """The tensor-graph node that reads `buf` (after its `version`-th in-place write) as a tensor of `shape`.
    A symbolic shape reads the first n (its bound size) elements of a buffer sized for the largest value."""
    node = UOp(Ops.BUFFER, buf.dtype, (), (buf, version))
    if not all(isinstance(d, int) for d in shape):
        node = node.shrink(((0, sint_prod(shape)),))
    return node.reshape(shape)


def without_reshapes(u: UOp) -> UOp:
    """The node under any chain of reshapes: the same elements, in the same row-major order."""
    while u.op is OP_RESHAPE:
        u = u.src[0]
    return u


def is_buffer_view(u: UOp) -> bool:
    """True for a buffer, or reshapes of one, or of a symbolic prefix of one: contiguous, nothing to compute."""
    while u.op is OP_RESHAPE:  # (without_reshapes, inline: every realize asks this of every tensor it looks at)
        u = u.src[0]
    op = u.op
    return op is OP_BUFFER or (op is OP_SHRINK and u.src[0].op is OP_BUFFER and
                                     isinstance(u.arg[0][1], UOp) and u.arg[0][0] == 0)


def _materialised(u: UOp) -> bool:
    return u.op is Ops.BUFFER or u in REALIZED


ROW_FUSE_MAX = 16384  # a reduction over the last axis up to this long may fuse into the kernel that broadcasts it

# How a node is evaluated in its root's kernel, for the walk below: "row" at the root's own index (elementwise from
# it, so the last axis is the row), "bcast" once per row (elementwise from an EXPAND of the last axis), None otherwise.
RowMode = str | None
WalkState = tuple[UOp, bool, bool, RowMode, "tuple[sint, ...] | None"]  # node, repeated, expanded, mode, row shape


def _row_reduce(node: UOp, row_shape: tuple[sint, ...] | None) -> bool:
    """A reduction over the last axis of the root's rows: it can be computed in the root's kernel, once per row (on
    a GPU a work-group's group reduction; on a CPU a loop with SIMD accumulator lanes before the loop over the row,
    which then reads the row from L1: softmax 1024x2048 in one kernel, 1.3 -> 0.65 ms on 2 cores)."""
    return (row_shape is not None and node.op is Ops.REDUCE_AXIS and node.src[0].shape == row_shape and
            node.arg[1] == (len(row_shape) - 1,) and all(isinstance(d, int) for d in row_shape) and
            bool(1 < row_shape[-1] <= ROW_FUSE_MAX))  # type: ignore[operator]


def _walk_start(root: UOp) -> tuple[bool, RowMode, tuple[sint, ...] | None]:
    """(repeated, mode, row shape) for the sources of `root`."""
    if root.op is Ops.REDUCE_AXIS:
        return (True, "row", root.src[0].shape) if _row_reduce(root, root.src[0].shape) else (True, None, None)
    if root.op in GroupOp.Elementwise or root.op is Ops.CONTIGUOUS:
        return False, "row", root.shape
    if root.op is Ops.SCATTER:  # its kernel holds no reduction: any under it is materialised
        return True, None, None
    return False, None, None


def _reduces_to_materialise(roots: dict[UOp, None]) -> set[UOp]:
    """REDUCE_AXIS nodes that fusing would recompute: reached through an EXPAND or a reduction, or from two kernels;
    and costly elementwise work reached through an EXPAND (fused, it would be recomputed once per repeat).

    The exception is a row reduction (a reduction over the last axis of a kernel's rows, broadcast back over that
    axis by an EXPAND): the kernel computes it once per row before it loops over the row (softmax's max and sum)."""
    found: set[UOp] = set()
    reached_from: dict[UOp, UOp] = {}
    cost: dict[UOp, int] = {}
    readers: dict[UOp, set[UOp]] = {}  # elementwise node -> the kernels (roots) that would compute it
    over_chained: dict[UOp, bool] = {}
    for root in roots:
        seen: set[WalkState] = set()
        fused: dict[UOp, None] = {root: None} if root.op is Ops.REDUCE_AXIS else {}
        repeated, mode, row_shape = _walk_start(root)
        stack: list[WalkState] = [(s, repeated, False, mode, row_shape) for s in root.src]
        chained, statistics = False, []  # (a chained kernel's per-row values with a transcendental, below)
        flash = _flash_device(root.device)
        while stack:
            state = stack.pop()
            node, repeated, expanded, mode, row_shape = state
            if state in seen or _materialised(node) or node in roots:
                continue
            seen.add(state)
            if node.op in GroupOp.ALU:
                readers.setdefault(node, set()).add(root)
            if node.op is Ops.REDUCE_AXIS and repeated and _chained(node):  # recomputed where it is read
                found.update(n for n in _computed_tile_operands(node, roots) if n not in roots)
                stack.extend((s, True, expanded, None, None) for s in node.src)
                chained = True
                continue
            if flash and expanded and node.op in GroupOp.ALU and \
                    COSTLY_IN_CHAIN <= _elementwise_cost(node, cost) < COSTLY_ELEMENTWISE:
                statistics.append(node)
            if node.op is Ops.REDUCE_AXIS:
                fused[node] = None
                if reached_from.setdefault(node, root) is not root:
                    found.add(node)
                    continue
                if mode == "bcast" and _row_reduce(node, row_shape):  # once per row of this kernel
                    stack.extend((s, True, expanded, "row", row_shape) for s in node.src)
                    continue
                if repeated:
                    found.add(node)
                    continue
                if mode == "row" and _row_reduce(node, node.src[0].shape):  # once per output: its rows are its own
                    stack.extend((s, True, expanded, "row", node.src[0].shape) for s in node.src)
                    continue
            elif expanded and node.op in GroupOp.ALU and (_elementwise_cost(node, cost) >= COSTLY_ELEMENTWISE or
                                                          _joins_computed_pieces(node, cost)) and \
                    not _over_chained(node, over_chained):
                found.add(node)
                continue
            if mode is not None and (node.op in GroupOp.Elementwise or node.op is Ops.DETACH):  # (DETACH: identity)
                stack.extend((s, repeated, expanded, mode, row_shape) for s in node.src)
            elif mode == "row" and node.op is Ops.RESHAPE and node.src[0].op is Ops.REDUCE_AXIS:
                stack.append((node.src[0], repeated, expanded, "row", None))  # a reduction without keepdim
            elif mode == "row" and node.op is Ops.EXPAND and row_shape is not None and \
                    node.src[0].shape == row_shape[:-1] + (1,):
                stack.append((node.src[0], True, expanded, "bcast", row_shape))  # per row, not per element
            else:
                below = repeated or node.op in (Ops.EXPAND, Ops.REDUCE_AXIS)
                stack.extend((s, below, expanded or node.op is Ops.EXPAND, None, None) for s in node.src)
        if chained:  # per-row values: at most 1/16 of the kernel's outputs (one per row of a head's 16..128 dims)
            found.update(_outermost(n for n in statistics if n.size * 16 <= root.size and
                                    not _over_chained(n, over_chained)))
        found.update(_matmuls_sharing_a_kernel(fused, root))
        found.update(n for u in fused for n in _computed_tile_operands(u, roots)
                     if n not in roots and not _over_chained(n, over_chained))
    return found or set(n for n in _shared_values_to_store(readers, roots) if not _over_chained(n, over_chained))


def _outermost(nodes: Iterable[UOp]) -> set[UOp]:
    """The nodes that no other one of `nodes` computes."""
    candidates = set(nodes)
    inside = {u for n in candidates for u in n.toposort(stop=_materialised) if u is not n}
    return candidates - inside


def _over_chained(node: UOp, memo: dict[UOp, bool]) -> bool:
    """Whether elementwise work reaches a chained matmul (`_chained`) through views and casts: a value of the T x T
    scores (the probabilities, their gradient), which is recomputed with them rather than stored."""
    if node not in memo:
        def stop(u: UOp) -> bool:
            return u in memo or u.op is Ops.REDUCE_AXIS or _materialised(u)
        for u in node.toposort(stop=stop):  # (sources first)
            if u not in memo:
                memo[u] = _chained(u) if u.op is Ops.REDUCE_AXIS else \
                    not _materialised(u) and any(memo[s] for s in u.src)
    return memo[node]


CHAIN_MAX_INNER = 128  # the longest reduction of a chained matmul: an attention head's 64 or 128 dims
CHAIN_MIN_RATIO = 2   # ... and its output's sides are at least this many times as long
FLASH_TILE = 64       # by default (FLASH_ATTENTION=-1) flash attention needs whole tiles of the GPU's chained kernels:
FLASH_MAX_HEAD = 64   # rows and keys multiples of 64, heads a multiple of 16 up to 64 (codegen/chained.py)


def _chained(u: UOp) -> bool:
    """Attention's scores where flash attention applies (`flash_attention`): a batched matmul-shaped reduction over a
    short axis (q @ k^T over a head's dims; the backward's dO @ v^T) whose two output sides are long (T x T from two
    T x 64 factors). It is never stored: every kernel that reduces over it recomputes it (on a GPU its tile stays in
    registers between two tensor-core products), so no T x T buffer exists."""
    if not _flash_device(u.device) or not _matmul_shaped(u) or len(u.arg[1]) != 1:
        return False
    shape, axis = u.src[0].shape, u.arg[1][0]
    if len(shape) < 3 or not all(isinstance(d, int) for d in shape):
        return False
    value = u.src[0]
    while value.op is Ops.CAST:
        value = value.src[0]
    sides = []
    for factor in value.src:
        while factor.op is Ops.CAST:
            factor = factor.src[0]
        if factor.op is not Ops.EXPAND:
            return False
        broadcast = [i for i, (a, b) in enumerate(zip(factor.src[0].shape, factor.shape)) if a != b]
        if len(broadcast) != 1 or broadcast[0] == axis:
            return False
        sides.append(broadcast[0])
    return sides[0] != sides[1] and \
        flash_attention(u.device, shape[sides[1]], shape[sides[0]], shape[axis], _product_dtype(value))


def _product_dtype(product: UOp) -> DType:
    """The dtype a matmul's product multiplies in: its own, or its factors' where both are widened from one."""
    widened = {s.src[0].dtype for s in product.src if s.op is Ops.CAST}
    return widened.pop() if len(widened) == 1 and all(s.op is Ops.CAST for s in product.src) else product.dtype


def flash_attention(device: Any, rows: sint, keys: sint, head_dim: sint, dtype: DType) -> bool:
    """Whether attention with rows x keys scores, over heads `head_dim` long of `dtype` factors, is computed without
    storing the scores (FLASH_ATTENTION: 1 everywhere, 0 nowhere; -1, the default, on CUDA for float16/bfloat16
    factors in whole tiles of the chained tensor-core kernels). Rows and keys are at least CHAIN_MIN_RATIO heads
    long in any case (shorter, the scores are no larger than the factors)."""
    if not (isinstance(rows, int) and isinstance(keys, int) and isinstance(head_dim, int)) or \
            min(rows, keys) < CHAIN_MIN_RATIO * head_dim or head_dim > CHAIN_MAX_INNER:
        return False
    if FLASH_ATTENTION.value != -1:
        return bool(FLASH_ATTENTION.value)
    return _flash_device(device) and dtype in (dtypes.float16, dtypes.bfloat16) and rows % FLASH_TILE == 0 and \
        keys % FLASH_TILE == 0 and head_dim % 16 == 0 and head_dim <= FLASH_MAX_HEAD


def _flash_device(device: Any) -> bool:
    """Whether flash attention can apply on `device` at all (FLASH_ATTENTION=1: anywhere; -1: CUDA)."""
    if FLASH_ATTENTION.value != -1:
        return bool(FLASH_ATTENTION.value)
    return isinstance(device, str) and device.split(":")[0] == "CUDA"


def _shared_values_to_store(readers: dict[UOp, set[UOp]], roots: dict[UOp, None]) -> list[UOp]:
    """Elementwise values that several kernels would each recompute from many inputs, which one kernel should store
    instead. Computed in each of C kernels from K inputs (buffers, reductions, stored values), a value costs C * K
    reads per element; stored, K reads, a write and C reads. Inputs that are broadcast to the value (a LayerNorm's
    per-row mean and scale, its per-channel weight: `_broadcast_input`) are read from cache and do not count: a
    LayerNorm's normalised input, `(x - mean) * rstd * w`, is one read of x wherever it is recomputed (stored, the
    bf16 GPT-2 step wrote and read back 18 such float32 tensors per block). It is stored when (C - 1)(K - 1) > 2,
    and K >= 3 (a sum of two buffers is left fused): a residual stream `x + f(x) + g(...) + ...` that every block's
    LayerNorm and the backward read, built lazily from every earlier block's output (GPT-2's 24th sum read 24
    buffers in each of its readers: O(layers^2) traffic).

    The values are weighed lowest first, in one pass: one chosen is an input of those above it (which are weighed
    with its buffer as one of their K). Choosing only the lowest and walking every kernel again for the rest took
    one walk per level: an LSTM cell's state chain unrolled over 20 steps was 68 walks (40 s to schedule its
    backward, quadratic in the steps)."""
    chosen: dict[UOp, None] = {}

    def is_input(u: UOp) -> bool:
        return _materialised(u) or u.op is Ops.REDUCE_AXIS or u in roots or u in chosen

    inputs: dict[UOp, frozenset[UOp]] = {}

    def inputs_of(value: UOp) -> int:
        for n in value.toposort(stop=lambda x: x in inputs or is_input(x)):
            if n not in inputs:
                inputs[n] = frozenset((n,)) if is_input(n) and n is not value else \
                    frozenset().union(*(inputs[s] for s in n.src))
        return sum(1 for i in inputs[value] if not _broadcast_input(i, value))

    kernels = {n: len(k) for n, k in readers.items() if n not in roots and len(k) >= 2}
    order: dict[UOp, None] = {}  # the candidates and what they compute, sources first
    for value in kernels:
        order.update(dict.fromkeys(value.toposort(stop=lambda x: x in order or is_input(x))))
    for n in order:  # (a node is weighed after every candidate below it is decided: `inputs` stays valid)
        if n in kernels and (k := inputs_of(n)) >= 3 and (kernels[n] - 1) * (k - 1) > 2:
            chosen[n] = None
    return list(chosen)


BROADCAST_INPUT = 16  # an input with at most 1/16 of a value's elements is read per row or per column, not per element


def _broadcast_input(u: UOp, value: UOp) -> bool:
    """Whether `u`, an input of the elementwise `value`, is broadcast to it (a row's mean, a per-channel weight):
    recomputing `value` in another kernel reads it from cache, so it costs no memory traffic per element."""
    return isinstance(u.size, int) and isinstance(value.size, int) and u.size * BROADCAST_INPUT <= value.size


def _computed_tile_operands(u: UOp, roots: dict[UOp, None]) -> list[UOp]:
    """On a GPU, the factors of a matmul-shaped reduction that are computed rather than read (an elementwise
    combination under the views and casts: a GELU's gradient, the q, k and v gradients gathered from the heads'
    layout by pads and adds): each is stored by a kernel of its own. A tiled kernel copies every factor element once
    per tile that reads it (N / 128 times), a 16-byte cp.async only from a stored buffer; fused, the computation and
    its gathers are repeated in every copy (GPT-2's c_fc weight gradient: 1.2 ms in the step against 0.1 alone).
    Where a narrowing cast sits right on the computed value (autocast's bfloat16), the cast value is stored: half the
    bytes in every copy (bf16 GPT-2 step on an H200: 151.0 -> 148.8 ms). Never a cast above a view: over an EXPAND it
    would store the repeats. A factor whose views pass a node already stored (`roots`) is read from that buffer."""
    if u.op is not Ops.REDUCE_AXIS or not _thread_per_output(u.device) or not _matmul_shaped(u):
        return []
    value = u.src[0]
    while value.op is Ops.CAST:
        value = value.src[0]
    return [stored for factor in value.src if (stored := _stored_factor(factor, roots)) is not None]


def _stored_factor(factor: UOp, roots: dict[UOp, None]) -> UOp | None:
    """The node to store for a matmul factor, down its views and casts: the computed value, or above it the highest
    node reached through reshapes, permutes and narrowing float casts only (float32 -> bfloat16 under autocast: half
    the bytes; the q, k and v gradients in the layout the matmul reads them: its tile copies are then contiguous runs,
    which cp.async makes). A reduction (attention's `p @ v`, stored anyway) is stored this way only through a
    narrowing cast: its kernel then writes the bfloat16 the next matmul reads. None when the factor is read from a
    buffer, or from a node already chosen to be stored (in `roots`: a shrink of the padded value under it, say)."""
    chain: list[UOp] = []
    while factor.op in GroupOp.Movement or factor.op is Ops.CAST:
        if factor in roots:
            return None
        chain.append(factor)
        factor = factor.src[0]
    if factor.op not in GroupOp.ALU and factor.op is not Ops.REDUCE_AXIS or _materialised(factor) or factor in roots:
        return None
    climbed: list[UOp] = []
    for node in reversed(chain):  # upwards from the computed value
        if node.op not in (Ops.RESHAPE, Ops.PERMUTE) and not _narrowing_cast(node):
            break
        climbed.append(node)
    if factor.op is Ops.REDUCE_AXIS and not any(_narrowing_cast(u) for u in climbed):
        return None
    return climbed[-1] if climbed else factor


def _narrowing_cast(u: UOp) -> bool:
    return u.op is Ops.CAST and u.dtype.is_float and u.src[0].dtype.is_float and \
        u.dtype.itemsize < u.src[0].dtype.itemsize


def _matmuls_sharing_a_kernel(fused: dict[UOp, None], root: UOp) -> list[UOp]:
    """The matmul-shaped reductions of a kernel that would hold several reductions (but for one, kept, when all
    of them are matmuls under an elementwise root): each becomes a kernel of its own. A matmul is fast only as the
    one reduction of its kernel (tiles, tensor cores; the CPU's packed tiles); a kernel holding two of them
    (`x @ W1 + h @ W2`, the gradient of a tensor read by two matmuls, the q, k and v gradients stored as one) nests
    their loops untiled. On the H100 the bf16 GPT-2 step went from 210.5 to 200.3 ms (the MLP's input gradients),
    and with the q, k and v gradients stored as one tensor it had been 8.7 s (docs/OPTIMIZER.md)."""
    others = [u for u in fused if u is not root]
    matmuls = [u for u in others if _matmul_shaped(u)]
    if len(fused) < 2 or not matmuls:
        return []
    if root.op is not Ops.REDUCE_AXIS and len(matmuls) == len(others):
        return matmuls[1:]  # one of them stays, with the root's elementwise work as its epilogue
    return matmuls


COSTLY_ELEMENTWISE = 32  # ALU work (divisions and transcendentals count 8) worth a buffer rather than recomputing
# ... in a chained kernel (flash attention's), for a value it reads through a broadcast: a per-query statistic with a
# transcendental (the log-sum-exp, max + log(sum)) is loaded and recomputed for every score of the T x T tile a block
# walks. dk's kernel, whose rows are the keys, took a log and two loads per score; stored, it loads one value.
COSTLY_IN_CHAIN = 8
_SLOW_OPS = (Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW, Ops.RECIP)


def _joins_computed_pieces(u: UOp, memo: dict[UOp, int]) -> bool:
    """Whether `u` is a `cat` of computed values: a sum of PADs (each piece padded to its place), at least one of
    which pads ALU work. Fused into a kernel that reads it through a broadcast, every element computes each piece
    under an index gate, once per repeat, and those gates keep the loop from vectorising (a rotary embedding's
    interleaved halves read by q @ k^T: 0.3 GFLOP/s fused, 3.4x faster for the attention stored)."""
    if u.op is not Ops.ADD:
        return False
    pieces, stack = [], [u]
    while stack:
        n = stack.pop()
        if n.op is Ops.ADD:
            stack.extend(n.src)
        elif n.op is Ops.PAD:
            pieces.append(n.src[0])
        else:
            return False
    return any(_elementwise_cost(p, memo) > 0 for p in pieces)


def _elementwise_cost(u: UOp, memo: dict[UOp, int]) -> int:
    """ALU operations computing one element of `u` in a fused kernel (down to materialised nodes and reductions)."""
    if u in memo:
        return memo[u]
    total = 0
    for n in u.toposort(stop=lambda x: _materialised(x) or x.op is Ops.REDUCE_AXIS):
        if n.op in GroupOp.ALU:
            total += 8 if n.op in _SLOW_OPS else 1
    memo[u] = total
    return total


def _choose_roots(outs: list[UOp], nodes: list[UOp]) -> dict[UOp, None]:
    roots: dict[UOp, None] = {o: None for o in outs if not is_buffer_view(o) and not _materialised(o)}
    for n in nodes:
        if _materialised(n):  # the walk stops at these, but lists them: they are loaded, never recomputed
            continue
        if n.op in (Ops.CONTIGUOUS, Ops.ASSIGN, Ops.SCATTER):  # (a scatter writes to data-dependent places)
            roots[n] = None
        if n.op in (Ops.COPY, Ops.ALLREDUCE):  # their sources are read whole, from buffers
            roots[n] = None
            for src in n.src[:1] if n.op is Ops.COPY else n.src:
                if not is_buffer_view(src) and not _materialised(src):
                    roots[src] = None
    consumers: dict[UOp, list[UOp]] = {}
    for n in nodes:
        for src in dict.fromkeys(n.src):
            consumers.setdefault(src, []).append(n)
    chosen: set[UOp] = set()  # the roots chosen below (the others are required: outputs, copies' sources, ...)
    while extra := _reduces_to_materialise(roots) or _split_for_buffer_limit(roots, nodes):
        added = [v for u in extra if (v := _narrowed(_shrunk_view(u, consumers), consumers)) not in roots]
        if not added:  # all of them are stored already, as the views above them: the walk would find them forever
            break
        roots.update(dict.fromkeys(added))
        chosen.update(added)
        for redundant in _reshapes_of_roots(roots, chosen):
            del roots[redundant]
            chosen.discard(redundant)
    return roots


BUFFER_MARGIN = 2  # argument slots kept free under a device's buffer limit (a kernel's symbolic sizes)


def _argument_limit(device: Any) -> int | None:
    """How many arguments one kernel may take on `device` (its renderer's `max_buffers`: Metal's argument table),
    or None where there is no limit worth checking (CPU, CUDA)."""
    from glassgrad.kernels import renderer_class  # (kernels.py imports the scheduler)
    name = device[0] if isinstance(device, tuple) else device
    return renderer_class(name).max_buffers if isinstance(name, str) else None


def _max_kernel_inputs(device: Any) -> int | None:
    """How many buffers one kernel may read on `device` (its argument limit, less the output and a margin)."""
    limit = _argument_limit(device)
    return None if limit is None else limit - 1 - BUFFER_MARGIN


def _parameter_room(device: Any, builder: KernelBuilder) -> int | None:
    """How many lifted constants (uop/params.py) a kernel's arguments have room for beside its buffers and
    Variables, where the device limits them (Metal), else None."""
    limit = _argument_limit(device)
    return None if limit is None else max(0, limit - len(builder.buffers) - len(builder.var_vals))


def _split_for_buffer_limit(roots: dict[UOp, None], nodes: list[UOp]) -> set[UOp]:
    """Values to store so that no kernel reads more buffers than its device allows (Metal: 31 arguments). Fused,
    the backward of an LSTM unrolled over 12 steps read 55 buffers in one elementwise kernel, which Metal cannot
    launch. Walking up from the leaves, each node's kernel reads the union of its sources' buffers (a root or a
    realized node is one buffer); where the union passes the limit, the sources that read the most are stored,
    the fewest that bring it back under (each is at most the limit itself, having been checked first)."""
    if all(_max_kernel_inputs(d) is None for d in {r.device for r in roots}):
        return set()  # (the common case, CPU and CUDA: no walk)
    reads: dict[UOp, frozenset[UOp]] = {}
    found: set[UOp] = set()

    def contribution(s: UOp) -> frozenset[UOp]:
        return frozenset({s}) if s in roots or _materialised(s) else reads.get(s, frozenset())
    for n in nodes:
        if _materialised(n) or n.op is Ops.SINK:
            continue
        parts = {s: contribution(s) for s in n.src}
        union = frozenset().union(*parts.values())
        limit = _max_kernel_inputs(n.device) if union else None
        if limit is not None and len(union) > limit:
            for src in sorted(parts, key=lambda s: -len(parts[s])):
                base = src
                while base.op in GroupOp.Movement:
                    base = base.src[0]
                if len(parts[src]) > 1 and base not in roots and not _materialised(base):
                    found.add(base)  # stored: this kernel reads it as one buffer
                    parts[src] = frozenset({base})
                    union = frozenset().union(*parts.values())
                    if len(union) <= limit:
                        break
        reads[n] = union
    return found


def _reshapes_of_roots(roots: dict[UOp, None], chosen: set[UOp]) -> list[UOp]:
    """Chosen roots that are only reshapes of another root: a reshape of a stored buffer is a view of it, free to
    read. Two walks can choose one value at two places: a LayerNorm's output cast to bfloat16 is stored as the
    forward matmul's factor (the reshape its tile copies read) and then, the weight gradient's walk reaching the cast
    through other views, as the cast itself; kept, both kernels computed the normalisation and stored it. (Only
    chosen roots: an all-reduce's or a copy's source must be a buffer of its own.)"""
    redundant = []
    for root in chosen:
        node = root
        while node.op is Ops.RESHAPE:
            node = node.src[0]
            if node in roots:
                redundant.append(root)
                break
    return redundant


def _shrunk_view(u: UOp, consumers: dict[UOp, list[UOp]]) -> UOp:
    """What to store for a node the scheduler materialises: the highest shrink above it reached through single
    consumers that are reshapes and shrinks, else the node itself. Every reader sees it through that shrink, so the
    kernel computes only those elements: the input gradient of a padded convolution is its windows' gradient folded
    onto the padded input, read without the pad's border (CNN of bench/wide.py: (8, 48, 34, 34) -> (8, 48, 32, 32),
    whose stride-2 phases are then 16 wide, not 17)."""
    top = node = u
    while (user := _only_reader(node, consumers)) is not None and user.op in (Ops.RESHAPE, Ops.SHRINK):
        node = user
        if node.op is Ops.SHRINK:
            top = node
    return top


def _only_reader(node: UOp, consumers: dict[UOp, list[UOp]]) -> UOp | None:
    """The one node that reads `node`, if exactly one does."""
    users = consumers.get(node, [])
    return users[0] if len(users) == 1 else None


def _narrowed(u: UOp, consumers: dict[UOp, list[UOp]]) -> UOp:
    """A value to store whose only reader is a narrowing float cast (through reshapes) is stored as that cast: every
    reader rounds it first anyway, so the narrower buffer holds the same values in half the bytes (a bf16 GPT-2's
    logits, 8192 x 50304, were stored as float32 and read by the loss's eight kernels; their gradient as float32
    and read by two matmuls that round it to bfloat16)."""
    node = u
    while (user := _only_reader(node, consumers)) is not None and user.op is Ops.RESHAPE:
        node = user
    return user if user is not None and _narrowing_cast(user) else u


SCHEDULE_CACHE = ScheduleCache()


def create_schedule(outs: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """Schedule the kernels that compute `outs`. Returns the items and {node: buffer view} for new buffers.
    Only the outputs' views stay valid once the schedule has run: the intermediates' buffers share memory (their
    views serve REALIZED, which forgets a view nobody holds).

    A graph with the structure of one scheduled before (same ops, shapes, dtypes, devices; other buffers) reuses
    that schedule through `SCHEDULE_CACHE` (see schedule/cache.py; `SCACHE=0` turns it off)."""
    found = find_schedule(outs)
    return found.instantiate() if isinstance(found, CachedSchedule) else found


@dataclass(slots=True)
class CachedSchedule:
    """A graph whose structure the schedule cache holds: the template with what binds it to this graph (the walk's
    key, with the buffers in the slots, and nodes). `instantiate()` makes the schedule's items; a realize that needs
    no items replays the template instead (`engine/realize.py: replay`)."""
    template: ScheduleTemplate
    key: GraphKey
    nodes: list[UOp]
    outs: list[UOp]

    def instantiate(self) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
        return self.template.instantiate(self.key, self.nodes, self.outs, ScheduleItem)


def find_schedule(outs: list[UOp]) -> CachedSchedule | tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """`create_schedule`'s work up to a cache hit: the walk of the graph with its structure key, and either the
    cached template for that structure (a `CachedSchedule`, not instantiated) or, on a miss, the new schedule
    (which goes into the cache) as `create_schedule` returns it."""
    originals = tuple([without_reshapes(o) for o in outs])
    # the walk (stopping at materialised nodes) and the structure key in one pass
    lift = bool(LIFT_CONSTANTS.value)
    nodes, _, key = walk_graph(originals, outs, REALIZED.get, REALIZED.id_tables(), bool(SCACHE.value), lift)
    # (the flags change the fusion, and the kernels' parameters)
    graph_key: tuple[Any, ...] = (FLASH_ATTENTION.value, lift, key.graph) if key is not None else ()
    marker = None
    if key is not None:
        found, marker = SCHEDULE_CACHE.lookup(graph_key, key.values())
        if found is not None:
            return CachedSchedule(found, key, nodes, outs)
    sink = UOp(Ops.SINK, dtypes.void, originals)
    nodes.append(sink)  # (the scheduler's node list ends with the SINK, as `sink.toposort` lists it)
    created: list[Buffer] = []
    schedule, views = _schedule_graph(outs, list(originals), sink, nodes, created)
    # only nodes of the graph as given are recorded (not those of a graph rewritten to split reductions): what the
    # caller puts in REALIZED then depends on the graph's structure alone, as the cache needs
    in_graph, out_ids = key.position if key is not None else set(nodes), {id(o) for o in outs}
    views = {n: v for n, v in views.items() if n in in_graph or id(n) in out_ids}
    # the outputs' buffers outlive the schedule (their tensors hold the views); the other created buffers are the
    # schedule's own, since REALIZED holds views weakly: they share memory by lifetime
    held = {view.base.arg[0] for o in outs if (view := views.get(o)) is not None}
    # a view of any other buffer would die with the caller's dict (REALIZED holds views weakly, an assign's excepted)
    # and its buffer's memory is shared with others: it is not handed back (nor made again by a cache hit)
    views = {n: v for n, v in views.items() if id(n) in out_ids or n.op is Ops.ASSIGN or v.base.arg[0] in held}
    plan = SchedulePlan.make([item.bufs for item in schedule], created, held)
    plan.place(created)
    if key is not None and (template := ScheduleTemplate.capture((schedule, views), key, created, outs,
                                                                 plan)) is not None:
        _cache_template(graph_key, key, template, marker, schedule, outs)
    return schedule, views


def _cache_template(graph_key: tuple[Any, ...], key: GraphKey, template: ScheduleTemplate, marker: str | None,
                    schedule: list[ScheduleItem], outs: list[UOp]) -> None:
    """Put a new schedule's template in the cache. A structure without lifted constants: under its key. With
    them: per value (under the key with the values) the first time; the second time, with other values, the probe
    (`_constant_slots`) decides whether one template serves every value (then under the structure's key alone) or
    the structure stays cached per value (LITERAL_VALUES). A structure seen once never pays for the probe."""
    if not key.consts:
        SCHEDULE_CACHE.put(graph_key, template)
        return
    if marker is SEEN_ONCE and (slots := _constant_slots(schedule, key, outs)) is not None:
        SCHEDULE_CACHE.put(graph_key, replace(template, param_slots=slots))
        return
    SCHEDULE_CACHE.put(graph_key, LITERAL_VALUES if marker is not None else SEEN_ONCE)
    SCHEDULE_CACHE.put((*graph_key, key.values()), template)


def _sentinels(values: tuple[float, ...]) -> list[float] | None:
    """For each value, another float32 a few ulps further from 0: finite, not special (0, ±1), and unlike every
    value and every other sentinel. None where that fails (values near the float32 maximum)."""
    out: list[float] = []
    taken = set(values)
    for k, v in enumerate(values):
        bits = float_bits(v)
        magnitude = (bits & 0x7FFFFFFF) + 3 * (k + 1)
        if magnitude >= 0x7F800000:
            return None
        s = struct.unpack("<f", struct.pack("<I", magnitude | (bits & 0x80000000) & 0xFFFFFFFF))[0]
        if s in taken or s in (0.0, 1.0, -1.0):
            return None
        taken.add(s)
        out.append(s)
    return out


def _constant_slots(schedule: list[ScheduleItem], key: GraphKey, outs: list[UOp]
                    ) -> tuple[tuple[tuple[str, int], ...], ...] | None:
    """Which kernel parameter takes which graph constant, per item (the template's `param_slots`), or None when the
    schedule depends on the constants' values otherwise (then the cache keys it with them).

    The graph is scheduled a second time with each lifted constant moved by a few ulps (`_sentinels`). Every item
    must come out with the same AST, and each parameter either keeps its value (a constant of the structure, e.g.
    a mean's 1/n) or takes exactly one constant's sentinel where the first schedule took that constant's value.
    Anything else (a constant folded into another, a kernel that keeps its constants as literals, a value that
    changed a decision) shows up as a difference, and the structure's schedule is then cached per value."""
    values = key.values()
    sentinels = _sentinels(values)
    if sentinels is None:
        return None
    mapping = {c: UOp(c.op, c.dtype, c.src, s) for c, s in zip(key.consts, sentinels)}
    outs_b = [substitute(o, mapping) for o in outs]
    originals_b = tuple([without_reshapes(o) for o in outs_b])
    nodes_b, _, _ = walk_graph(originals_b, outs_b, REALIZED.get, REALIZED.id_tables(), False)
    sink_b = UOp(Ops.SINK, dtypes.void, originals_b)
    nodes_b.append(sink_b)
    try:
        schedule_b, _ = _schedule_graph(outs_b, list(originals_b), sink_b, nodes_b, [])
    except Exception:  # (the first schedule was made; this one is only a probe)
        return None
    if len(schedule_b) != len(schedule):
        return None
    slot_of = {float_bits(s): k for k, s in enumerate(sentinels)}
    slots: list[tuple[tuple[str, int], ...]] = []
    for a, b in zip(schedule, schedule_b):
        if a.ast is not b.ast or a.var_vals.keys() != b.var_vals.keys() or len(a.bufs) != len(b.bufs):
            return None
        item: list[tuple[str, int]] = []
        for name, value in a.var_vals.items():
            if b.var_vals[name] == value:
                continue  # a size's Variable, or a constant of the structure
            k = slot_of.get(b.var_vals[name])
            if k is None or not name.startswith(PARAM_PREFIX) or float_bits(values[k]) != value:
                return None
            item.append((name, k))
        slots.append(tuple(item))
    return tuple(slots)


def _schedule_graph(outs: list[UOp], originals: list[UOp], sink: UOp, nodes: list[UOp],
                    created: list[Buffer]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    """The scheduler proper (see the module docstring). Every buffer it makes is appended to `created`.

    A reshape keeps row-major order, so an output that is a reshape of some node costs no kernel of its own: the
    node under the reshapes is materialised (unless it already is) and the output becomes a view of its buffer."""
    for rule in (gather_one_hot, scatter_one_hot, merge_nested_reduce, _split_rule):  # graph rewrites
        if (rewritten := rebuild(nodes, rule, _materialised)) is not None:
            sink = rewritten
            nodes = sink.toposort(stop=_materialised)
    targets = list(sink.src)
    roots = _choose_roots(targets, nodes)
    merged = _merged_outputs(roots, nodes)
    first_created = len(created)
    schedule, views, via_temp = _items(nodes, roots, merged, created)
    # a kernel of several outputs made an order need a temporary copy, or writes in place an output that it reads
    # at other elements too: without merged outputs, no ordering is harder than the graph's own
    if merged and (_topological(schedule)[1] or any(len(it.writes) > 1 and reads_other_elements(it.ast)
                                                    for it in schedule)):
        del created[first_created:]
        schedule, views, via_temp = _items(nodes, roots, {}, created)

    def view_of(u: UOp) -> UOp | None:
        return views.get(u) or REALIZED.get(u)

    for original, target in zip(originals, targets):
        if original is not target and (target_view := view_of(target)) is not None:
            views[original] = target_view  # a split reduction: the original node's value is the new graph's
    for out_node, target in zip(outs, targets):
        if out_node is not target and (target_view := view_of(target)) is not None:
            views[out_node] = target_view.reshape(out_node.shape)  # holding it keeps the target's entry alive
    return order_writes(schedule, via_temp), views


def _items(nodes: list[UOp], roots: dict[UOp, None], merged: dict[UOp, UOp], created: list[Buffer]
           ) -> tuple[list[ScheduleItem], dict[UOp, UOp], dict[int, Callable[[], list[ScheduleItem]]]]:
    """A kernel (or a copy, or an in-place write) per root, in graph order, and each root's buffer view. A root in
    `merged` is stored by the kernel of the root it maps to (`_merged_outputs`), not by one of its own.
    Also returns, for each in-place write, the same write through a temporary buffer (see `order_writes`)."""
    views: dict[UOp, UOp] = {}
    stored_by: dict[UOp, list[Stored]] = {owner: [] for owner in merged.values()}

    def view_of(u: UOp) -> UOp | None:
        return views.get(u) or REALIZED.get(u)

    schedule: list[ScheduleItem] = []
    via_temp: dict[int, Callable[[], list[ScheduleItem]]] = {}  # in-place assign item -> the same through a temp
    collectives: dict[tuple[UOp, ...], list[Buffer]] = {}  # an ALLREDUCE's partials -> its output buffers
    for node in nodes:
        if node not in roots:
            continue
        if node.op is Ops.ALLREDUCE:
            if node.src not in collectives:
                collectives[node.src] = _allreduce_item(node, view_of, created, schedule)
            views[node] = buffer_view(collectives[node.src][node.arg[1]], node.shape)
            continue
        if node in merged and node.op is Ops.ASSIGN:  # written in place by the kernel of the root it maps to
            buf, version = without_reshapes(node.src[0]).arg
            stored_by[merged[node]].append((node, buf, version + 1))
            views[node] = buffer_view(buf, node.shape, version + 1)
            continue
        also = tuple(stored_by.get(node, ()))
        # the kernel computes the outputs it also stores: it must not load them from their own (unwritten) buffers
        own_view = view_of if not also else _hiding({n for n, _, _ in also}, view_of)
        if node.op is Ops.ASSIGN:
            items = _assign_items(node, own_view, created, also=also)
            if len(items) == 1:
                via_temp[id(items[0])] = functools.partial(_assign_items, node, own_view, created, True, also)
            schedule += items
            buf, version = without_reshapes(node.src[0]).arg
            views[node] = buffer_view(buf, node.shape, version + 1)
            continue
        out = Buffer(node.device, _buffer_size(node), node.dtype)
        created.append(out)
        if node in merged:
            stored_by[merged[node]].append((node, out, 0))
        elif node.size == 0:
            pass
        elif node.op is Ops.COPY:
            src = (view_of(node.src[0]) or node.src[0]).base
            schedule.append(ScheduleItem(UOp(Ops.COPY, node.dtype, (), node.src[1].arg), (out, src.arg[0]),
                                         frozenset({src.arg}), ((out, 0),)))
        elif node.op is Ops.SCATTER:
            schedule += _scatter_items(node, out, own_view)
        else:
            schedule.append(_kernel_item(node, out, 0, own_view, also))
        views[node] = buffer_view(out, node.shape)  # later kernels load it from here
    return schedule, views, via_temp


def _hiding(hidden: set[UOp], view_of: Callable[[UOp], UOp | None]) -> Callable[[UOp], UOp | None]:
    return lambda u: None if u in hidden else view_of(u)


def _merged_outputs(roots: dict[UOp, None], nodes: list[UOp]) -> dict[UOp, UOp]:
    """{root: the root whose kernel also stores it}. A root X that another root's kernel computes anyway, at that
    kernel's own index (elementwise ops and reshapes lead from the kernel's value to X: the same elements in the
    same row-major order, no other movement, no reduction in between), is stored by that kernel, a second output,
    rather than computed by a kernel of its own. X may be an in-place write (an ASSIGN, stored into its target's
    buffer), and the outputs X's own kernel would have stored move with it. So an optimizer step is one kernel per
    param: AdamW's update of p computes the new moments m and v on the way, and stores all three (and the gradient,
    where that is elementwise work such as BatchNorm's: `p.grad` after the step costs no kernel).

    Only for elementwise kernels: neither kernel may hold a reduction. A reduction's kernel is shaped for the
    hardware (tiles, work-groups) by its loads and its one store; a weight gradient merged into AdamW's update took
    a GPT step on the H100 from 65 to 213 ms. Not where a root the merged kernel reads depends on X (X would be
    needed before the kernel that writes it runs), nor for copies or symbolic shapes."""
    merged: dict[UOp, UOp] = {}
    owned: dict[UOp, set[UOp]] = {}  # a root -> the roots its kernel stores as well (merged's inverse)
    reads: dict[UOp, set[UOp]] = {}  # a candidate kernel's root -> the roots that kernel reads
    loads: dict[UOp, set[UOp]] = {}  # ... and the realized nodes it reads
    depends = _RootDependencies(roots, nodes)
    for node in nodes:
        if node not in roots or node.size == 0 or not all(isinstance(d, int) for d in node.shape):
            continue
        if node.op is Ops.ASSIGN:
            start = [node.src[1]]  # the value written, at the target's index
        elif node.op in GroupOp.Elementwise:
            start = list(node.src)
        else:
            continue
        if _has_reduction(start, roots):
            continue
        reached, frontier, loaded = _elementwise_reach(start, roots)
        reads[node], loads[node] = set(frontier), loaded
        limit = _max_kernel_inputs(node.device)
        for extra in reached:
            if extra not in reads or extra in merged or extra.size != node.size or extra.device != node.device:
                continue  # (`reads` holds exactly the roots that could be kernels of this kind themselves)
            stored = {extra, *owned.pop(extra, ())}
            kernel_reads = (reads[node] | reads[extra]) - stored
            kernel_loads = loads[node] | loads[extra]
            too_many = limit is not None and \
                len(kernel_reads) + len(kernel_loads) + len(stored) + len(owned.get(node, ())) > limit
            if too_many or depends.any_on(kernel_reads, stored) or \
                    not _distinct_targets([node, *stored, *owned.get(node, ())]):
                owned[extra] = stored - {extra}  # (kept by its own kernel)
                continue
            for x in stored:
                merged[x] = node
            owned.setdefault(node, set()).update(stored)
            reads[node], loads[node] = kernel_reads, kernel_loads
    return merged


def _distinct_targets(outputs: list[UOp]) -> bool:
    """Whether no two of a kernel's outputs are in-place writes to one buffer (`p.assign(p + 1)` twice: both
    versions from one kernel would be stored in no defined order)."""
    targets = [without_reshapes(u.src[0]).arg[0] for u in outputs if u.op is Ops.ASSIGN]
    return len({id(b) for b in targets}) == len(targets)


class _RootDependencies:
    """Which roots depend on which, through the graph (down to materialised nodes): built on the first question,
    in one walk over `nodes` (topologically ordered), each node's set of roots below it as a bit mask."""

    def __init__(self, roots: dict[UOp, None], nodes: list[UOp]) -> None:
        self.nodes = nodes
        self._masks: dict[UOp, int] | None = None
        self._bit = {r: 1 << i for i, r in enumerate(roots)}

    def any_on(self, readers: Iterable[UOp], written: Iterable[UOp]) -> bool:
        """Whether any of `readers` depends on any of `written`."""
        if self._masks is None:
            self._masks = self._build()
        wanted = 0
        for w in written:
            wanted |= self._bit.get(w, 0)
        return any(self._masks.get(r, 0) & wanted for r in readers)

    def _build(self) -> dict[UOp, int]:
        masks: dict[UOp, int] = {}
        for u in self.nodes:
            mask = 0
            if not _materialised(u):
                for s in u.src:
                    mask |= masks.get(s, 0) | self._bit.get(s, 0)
            masks[u] = mask
        return masks


def _has_reduction(start: list[UOp], roots: dict[UOp, None]) -> bool:
    """Whether the fused region computing `start` (down to materialised nodes and other roots) holds a reduction."""
    stack, seen = list(start), set()
    while stack:
        u = stack.pop()
        if u in seen or _materialised(u) or (u in roots and u not in start):
            continue
        seen.add(u)
        if u.op is Ops.REDUCE_AXIS:
            return True
        stack.extend(u.src)
    return False


def _elementwise_reach(start: list[UOp], roots: dict[UOp, None]) -> tuple[list[UOp], list[UOp], set[UOp]]:
    """The roots a kernel whose value at its index is computed from `start` (at that index) reaches through
    elementwise ops and reshapes alone, and nowhere else; every root its fused region reads (where the walk
    through all of its ops stops); and the realized nodes it reads (its other input buffers)."""
    reached: list[UOp] = []
    elsewhere: list[UOp] = []  # reached at other indices too (through a row reduction, an expand, ...)
    frontier: list[UOp] = []
    loaded: set[UOp] = set()
    seen: set[tuple[UOp, bool]] = set()
    stack: list[tuple[UOp, bool]] = [(s, True) for s in start]
    while stack:
        u, direct = stack.pop()
        if (u, direct) in seen:
            continue
        if _materialised(u):
            loaded.add(u)
            continue
        seen.add((u, direct))
        if u in roots:
            frontier.append(u)
            (reached if direct else elsewhere).append(u)
            continue
        stack.extend((s, direct and (u.op in GroupOp.Elementwise or u.op is Ops.RESHAPE)) for s in u.src)
    # computed in the kernel, a root read elsewhere too would be recomputed there (softmax's max over a matmul)
    return [u for u in dict.fromkeys(reached) if u not in elsewhere], frontier, loaded


def _allreduce_item(node: UOp, view_of: Callable[[UOp], UOp | None], created: list[Buffer],
                    schedule: list[ScheduleItem]) -> list[Buffer]:
    """One collective item for the n ALLREDUCE nodes over `node`'s partials (one output buffer per device); returns
    the output buffers. Its AST is `ALLREDUCE arg=(op, n)`, its buffers the n outputs, then the n partials."""
    if not all(isinstance(d, int) for d in node.shape):
        raise NotImplementedError("a reduction over a sharded axis with a symbolic (Variable) shape")
    outs = [Buffer(src.device, node.size, node.dtype) for src in node.src]
    created.extend(outs)
    ins = [(view_of(src) or src).base.arg for src in node.src]
    if node.size:
        ast = UOp(Ops.ALLREDUCE, node.dtype, (), (node.arg[0], len(outs)))
        schedule.append(ScheduleItem(ast, (*outs, *(b for b, _ in ins)), frozenset(ins), tuple((b, 0) for b in outs)))
    return outs


def _buffer_size(node: UOp) -> int:
    """Elements a buffer for `node` needs: its size, or for a symbolic shape its largest size."""
    return max_size(node.shape)


SPLIT_MIN_REDUCE = 1 << 16  # reductions at least this long ...
SPLIT_MAX_OUTPUTS = 1024    # ... into at most this many outputs are split in two stages
SPLIT_GROUPS = 1 << 15      # their first stage has about this many outputs at most (a GPU work-group each)
SPLIT_MIN_REDUCE_WIDE = 1 << 14   # with more outputs (a thread or a tile each), reductions this long ...
SPLIT_MAX_OUTPUTS_WIDE = 1 << 16  # ... into at most this many outputs too (a convolution's weight gradient)
SPLIT_PARTIALS = 1 << 22          # their first stage has at most about this many outputs
GPU_TILE_OUTPUTS = 128 * 128      # outputs of one work-group of a GPU's tiled (matmul-shaped) kernel
GPU_MIN_BLOCKS = 128              # work-groups that fill a large GPU (an H100 has 132 multiprocessors)
SPLIT_MIN_PART = 512              # a GPU split leaves each part a reduction at least this long
GPU_BUSY_BLOCKS = 512             # and past GPU_MIN_BLOCKS, a very long reduction splits on to this many work-groups
SPLIT_LONG_PART = 2048            # while its parts stay this long (several work-groups per multiprocessor hide loads)


def _split_parts(u: UOp) -> tuple[int, bool] | None:
    """How a long reduction is split in two stages, if it is: (parts, whether the parts are the outermost axis of the
    first stage). A GPU reduces a few outputs in work-groups, so only very long reductions into them are split; with
    more outputs each one is a thread's (or a tile's) loop, and a long loop over few threads leaves the GPU idle. A CPU
    splits such a reduction over several axes (a convolution's weight gradient, over the batch and the image) by its
    outermost axis, the parts outermost (`_batch_parts`)."""
    if u.op is not Ops.REDUCE_AXIS:
        return None
    reduced = prod(u.src[0].shape[a] for a in u.arg[1])
    if not isinstance(reduced, int) or not isinstance(u.size, int):
        return None  # symbolic reductions stay one stage
    gpu = _thread_per_output(u.device)
    if gpu and not _matmul_shaped(u):
        return _gpu_parts(u, reduced)
    if u.size <= SPLIT_MAX_OUTPUTS:
        factor = _split_factor(u) if reduced >= SPLIT_MIN_REDUCE else None
        return None if factor is None else (factor, False)
    if reduced < SPLIT_MIN_REDUCE_WIDE or u.size > SPLIT_MAX_OUTPUTS_WIDE:
        factor = _gpu_fill_parts(u, reduced) if gpu else None
        return None if factor is None else (factor, True)
    if gpu:
        return None if (factor := _split_factor(u)) is None else (factor, False)
    return None if (factor := _batch_parts(u)) is None else (factor, True)


GPU_FILL_THREADS = 1 << 15  # threads that fill a large GPU (a flat kernel's threads; 256 x 128 work-groups)
GPU_COLUMN_THREADS = 1 << 17  # threads a column reduction's loop loads in (1 << 15 left ~6 warps per multiprocessor)
SPLIT_MIN_COLUMN = 64       # a column reduction's parts are at least this long ...
SPLIT_COLUMN_REDUCE = 4096  # ... and only reductions this long are split (a shorter loop per thread is cheap)


def _gpu_parts(u: UOp, reduced: int) -> tuple[int, bool] | None:
    """A GPU's reductions that are not matmul-shaped:
    * a reduction along the innermost axis (rows: a softmax's, a LayerNorm's, a cross-entropy's over the vocabulary)
      is read coalesced by a work-group per output (gpudims' grouped and rows shapes), so with more than
      SPLIT_MAX_OUTPUTS outputs it stays whole: split into parts of a row, neighbouring threads would each read their
      own part, far apart in memory (a cross-entropy over 50304 logits in 192 parts: 2-3 ms instead of about 0.6).
      With fewer outputs, very long rows (SPLIT_MIN_REDUCE: BatchNorm's statistics) split as before.
    * a reduction along outer axes (columns: a bias's or a LayerNorm weight's gradient, summed over the tokens) is a
      loop per output thread, coalesced across the outputs: too few outputs to fill the GPU and a long loop are split
      into parts, the parts outermost (neighbouring threads keep neighbouring outputs), each at least SPLIT_MIN_COLUMN
      long, so that parts x outputs is about GPU_COLUMN_THREADS: each thread has one load in flight per step, so
      the loads' latency is hidden only by many threads (GPT-2's LayerNorm weight gradients, 768 columns of 8192
      rows: 32 parts ran 6 warps per multiprocessor)."""
    if _reduces_innermost(u):
        if u.size > SPLIT_MAX_OUTPUTS or reduced < SPLIT_MIN_REDUCE:
            return None
        return None if (factor := _split_factor(u)) is None else (factor, False)
    if u.size >= GPU_FILL_THREADS or reduced < SPLIT_COLUMN_REDUCE:
        return None
    parts = 1
    while parts * 2 * u.size <= GPU_COLUMN_THREADS and reduced // (parts * 2) >= SPLIT_MIN_COLUMN and parts < 256:
        parts *= 2
    outermost = u.src[0].shape[u.arg[1][0]]
    while parts > 1 and outermost % parts and reduced % parts:
        parts //= 2
    return (parts, True) if parts > 1 else None


def _reduces_innermost(u: UOp) -> bool:
    """Whether the reduction runs along the innermost axis of what it reduces (a row of a row-major tensor)."""
    return len(u.src[0].shape) - 1 in u.arg[1]


def _matmul_shaped(u: UOp) -> bool:
    """A sum of products of two factors that are each expanded along some axis (a matmul, a convolution, a weight
    gradient): gpudims tiles it, and `_gpu_fill_parts` decides its split."""
    value = u.src[0]
    while value.op is Ops.CAST:
        value = value.src[0]
    if u.arg[0] is not Ops.ADD or value.op is not Ops.MUL:
        return False
    return all(_expanded(factor) for factor in value.src)


def _expanded(u: UOp) -> bool:
    """Whether movement ops (and casts) down from `u` include an EXPAND: the value repeats along some axis."""
    while u.op in GroupOp.Movement or u.op is Ops.CAST:
        if u.op is Ops.EXPAND:
            return True
        u = u.src[0]
    return False


def _gpu_fill_parts(u: UOp, reduced: int) -> int | None:
    """On a GPU: the parts of a long reduction whose outputs fill fewer work-groups than the GPU has
    multiprocessors, counted as tiles of a matmul-shaped kernel (a weight gradient: 1536 x 512 outputs, 48 tiles,
    summed over 4096 tokens). The fewest parts (a power of two, at most 16) that fill GPU_MIN_BLOCKS tiles and leave
    each part SPLIT_MIN_PART long (reductions under 1024 stay whole), dividing the outermost reduced axis or the
    whole reduction. The partial sums cost `parts` extra writes and reads per output, against `reduced` reads per
    output in the first stage. H100, dW of 16 x 256 tokens into 1536 x 512: see docs/OPTIMIZER.md. Then, while the
    parts stay SPLIT_LONG_PART long, up to GPU_BUSY_BLOCKS work-groups: a tile waits on its loads, and one or two
    work-groups per multiprocessor cannot hide that (GPT-2's 768 x 3072 weight gradients over 8192 tokens, 144 tiles:
    4 parts; the bf16 step on an H200 went from 164 to 153 ms). Shorter parts measured slower (B16 T256 1536 x 512
    in 16 parts of 256: 0.58 -> 0.82 ms). The parts are the first stage's outermost axis: a batch of whole tiles, each
    storing its rows of partial sums contiguously (with the parts innermost, each fp32 store of a tile's epilogue
    landed 16 bytes from the next; GPT-2's bf16 768 x 3072 weight gradients over 8192 tokens, H200: 192 -> 141 us)."""
    tiles = -(-u.size // GPU_TILE_OUTPUTS)
    outermost = u.src[0].shape[u.arg[1][0]]
    parts = 1
    if tiles < GPU_MIN_BLOCKS:
        parts = next((p for p in (2, 4, 8, 16) if reduced // p >= SPLIT_MIN_PART and tiles * p >= GPU_MIN_BLOCKS and
                      (outermost % p == 0 or reduced % p == 0)), 0)
        if parts == 0:
            return None
    while tiles * parts < GPU_BUSY_BLOCKS and reduced // (parts * 2) >= SPLIT_LONG_PART and parts < 16 and \
            (outermost % (parts * 2) == 0 or reduced % (parts * 2) == 0):
        parts *= 2
    return parts if parts > 1 else None


def _batch_parts(u: UOp) -> int | None:
    """On a CPU: the parts of a wide reduction over several axes, one per index of its outermost reduced axis (an
    image of the batch), when the partial results fit SPLIT_PARTIALS. Each first-stage step then reads one image's
    slice of the inputs, which stays in cache for all of its outputs (a weight gradient reduced in one stage reads the
    whole batch again for every block of its outputs), and the kernel can pack that slice once for many of them."""
    sizes = [u.src[0].shape[a] for a in u.arg[1]]
    if len(sizes) < 2 or not isinstance(sizes[0], int) or sizes[0] < 2 or sizes[0] * u.size > SPLIT_PARTIALS:
        return None
    return sizes[0]


@functools.cache
def _thread_per_output(device: str) -> bool:
    """Whether the device's kernels run a thread (or a tile) per output (GPUs), so that some thousand outputs leave
    it mostly idle; a CPU's few cores split the outer loop of any of them, and partial results only cost it memory."""
    from glassgrad.kernels import renderer_class  # (kernels.py imports the scheduler)
    return renderer_class(device).has_local


def _split_factor(u: UOp) -> int | None:
    """The number of parts: at most 256 (and SPLIT_GROUPS or SPLIT_PARTIALS first-stage outputs), at least 16; one
    that divides the outermost reduced axis where there is one (the parts are then whole slices of it: simpler
    indices), else the whole. Where no divisor of at least a quarter of that limit exists (a prime length, or 2**31
    + 77 = 25 x 85899349), the limit itself, the reduction padded with its identity to a multiple (`_split_reduce`):
    with 25 parts, or unsplit, a GPU reduced 2**31 bytes in 25 work-groups (one for a prime length), each of whose
    threads summed 335,000 values in float32, past 2**24 (the mean of 2**31 uint8 values ~125 came out 124.72)."""
    sizes = [u.src[0].shape[a] for a in u.arg[1]]
    size = max(1, u.size)
    limit = min(256, (SPLIT_GROUPS if size <= SPLIT_MAX_OUTPUTS else SPLIT_PARTIALS) // size)
    if limit < 16:
        return None
    for n in (sizes[0], prod(sizes)):
        if (k := next((k for k in range(limit, 15, -1) if n % k == 0), None)) is not None and k >= limit // 4:
            return k
    return limit


def _pad_with_identity(u: UOp, op: Ops, extra: int) -> UOp:
    """`u` with `extra` more elements at the end of its last axis, each the identity of the reduction `op` (0 for
    ADD, 1 for MUL, the dtype's lowest value for MAX), so that a split's parts need not divide the reduction."""
    pads = ((0, 0),) * (len(u.shape) - 1) + ((0, extra),)
    padded = u.pad(pads)
    identity = reduce_identity(op, u.dtype)
    if identity == 0:
        return padded
    ones = (1,) * len(u.shape)
    inside = UOp.const(dtypes.bool, True, u.device).reshape(ones).expand(u.shape).pad(pads)
    return inside.where(padded, UOp.const(u.dtype, identity, u.device).reshape(ones).expand(padded.shape))


def _split_reduce(u: UOp, factor: int, batch: bool) -> UOp:
    """reduce(x, axes) with few outputs -> reduce(reduce(x viewed as (..., K, n/K)) over n/K) over K: the first
    stage has K times more outputs, so its work spreads over threads (CPU) or work-groups (GPU). `batch`: the K parts
    are the first stage's outermost axis."""
    op, axes = u.arg
    src = u.src[0]
    keep = [i for i in range(len(src.shape)) if i not in axes]
    sizes = [src.shape[a] for a in axes]
    # parts of the outermost reduced axis keep the others as they are (the kernel's indices stay affine in each);
    # otherwise the reduced axes are flattened first
    kept = tuple(src.shape[i] for i in keep)
    moved = src.permute(tuple(keep + list(axes)))
    if sizes[0] % factor == 0:
        inner: tuple[sint, ...] = (sizes[0] // factor, *sizes[1:])
    else:  # the reduced axes flattened, padded with the identity where the parts do not divide them
        total = prod(sizes)
        inner = (-(-total // factor),)
        moved = moved.reshape(kept + (total,))
        if total % factor:
            moved = _pad_with_identity(moved, op, factor * inner[0] - total)
    grouped = moved.reshape(kept + (factor, *inner))
    n = len(keep)
    if batch:  # the parts outermost: the CPU's threads and loops go image by image
        grouped = grouped.permute((n, *range(n), *range(n + 1, n + 1 + len(inner))))
    partial = grouped.reduce_axis(op, tuple(range(n + 1, n + 1 + len(inner))))
    return partial.reduce_axis(op, (0 if batch else n,)).reshape(u.shape)


def _split_rule(u: UOp, uses: dict[UOp, int]) -> UOp | None:
    """Split a long, few-output reduction in two stages (see `_split_parts`)."""
    return None if (parts := _split_parts(u)) is None else _split_reduce(u, *parts)


def _kernel_item(node: UOp, out: Buffer, version: int, view_of: Callable[[UOp], UOp | None],
                 also: Sequence[Stored] = ()) -> ScheduleItem:
    """The kernel that writes `node` into `out` (making its `version`), and each of `also` into its own buffer (an
    in-place write making that buffer's next version, or a new buffer's version 0)."""
    builder = KernelBuilder(view_of)
    ast = builder.build(node, out, [(n, buf) for n, buf, _ in also])
    ast, params = lift_constants(ast, _parameter_room(node.device, builder))
    writes = ((out, version), *((buf, v) for _, buf, v in also))
    return ScheduleItem(ast, tuple(builder.buffers), frozenset(builder.reads), writes, {**builder.var_vals, **params})


def _scatter_items(node: UOp, out: Buffer, view_of: Callable[[UOp], UOp | None]) -> list[ScheduleItem]:
    """A SCATTER (schedule/scatter.py): a kernel filling `out` with zeros, then the kernel adding each source element
    into its place. Both write version 0 of `out`; the fill comes first in the list, and `order_writes` keeps the
    given order where nothing forces another (readers of `out` wait for the second, the last writer)."""
    fill = KernelBuilder(view_of)
    fill_ast = fill.build_fill(out, node.size)
    builder = KernelBuilder(view_of)
    ast = builder.build_scatter(node, out, outer_kept=not _thread_per_output(node.device))
    ast, params = lift_constants(ast, _parameter_room(node.device, builder))
    return [ScheduleItem(fill_ast, tuple(fill.buffers), frozenset(), ((out, 0),)),
            ScheduleItem(ast, tuple(builder.buffers), frozenset(builder.reads), ((out, 0),),
                         {**builder.var_vals, **params})]


def _assign_items(node: UOp, view_of: Callable[[UOp], UOp | None], created: list[Buffer],
                  via_temp: bool = False, also: Sequence[Stored] = ()) -> list[ScheduleItem]:
    """ASSIGN(target, value): write value into target's own buffer. If the value reads that buffer at any other
    element than the one being written (x.assign(x.T)), computing in place would read overwritten data: compute
    into a temporary buffer first (appended to `created`), then copy it in. `via_temp` asks for that route anyway
    (to break a cycle). `also`: outputs the value's kernel stores as well (see `_merged_outputs`)."""
    target, value = node.src
    buf, version = without_reshapes(target).arg
    if value.size == 0:
        return []
    item = _kernel_item(value, buf, version + 1, view_of, also)
    if not via_temp and not reads_other_elements(item.ast):
        return [item]
    temp = Buffer(buf.device, buf.size, buf.dtype)
    created.append(temp)
    first = _kernel_item(value, temp, 0, view_of, also)
    return [first, _kernel_item(buffer_view(temp, node.shape), buf, version + 1, view_of)]


@functools.lru_cache(maxsize=4096)  # the same update kernel recurs every training step (ASTs are hash-consed)
def reads_other_elements(ast: UOp) -> bool:
    """True if the kernel loads from a buffer it stores at an index other than the one it stores (only an in-place
    write loads its own output buffer)."""
    simplified = simplify(ast)
    stored_at = {u.src[0]: u.src[1] for u in simplified.src if u.op is Ops.STORE}
    return any(u.op is Ops.LOAD and u.src[0] in stored_at and u.src[1] is not stored_at[u.src[0]]
               for u in simplified.toposort())


def order_writes(items: list[ScheduleItem],
                 via_temp: dict[int, Callable[[], list[ScheduleItem]]] | None = None) -> list[ScheduleItem]:
    """Order items so each runs after the items whose outputs it reads, and every reader of a buffer's old version
    runs before the in-place write that replaces it. Otherwise the given (graph) order is kept.

    In-place writes can wait on each other in a cycle (an optimiser step: w's new value reads b's old one and b's
    new value reads w's old one). Then one of them is computed into a temporary buffer first and copied in place
    once the old value's readers have run (`via_temp` gives that version of an item), until an order exists."""
    alternatives = dict(via_temp or {})
    while True:
        ordered, stuck = _topological(items)
        if not stuck:
            return ordered
        index = next((i for i in stuck if id(items[i]) in alternatives), None)
        if index is None:
            raise RuntimeError("in-place writes (assign) form a cycle that cannot be broken; realize the assigns "
                               "separately")
        items = items[:index] + alternatives.pop(id(items[index]))() + items[index + 1:]


def _topological(items: list[ScheduleItem]) -> tuple[list[ScheduleItem], list[int]]:
    """Kahn's algorithm over read/write dependencies, preferring the given order. Returns (order, stuck items)."""
    writer: dict[BufferVersion, int] = {}
    for i, item in enumerate(items):
        for written in item.writes:
            if written[1] > 0 and writer.get(written, i) != i:  # (a fill and a scatter both make version 0)
                raise RuntimeError(f"internal error: two kernels of one schedule write version {written[1]} of "
                                   f"{written[0]} (two copies of one pending assign); please report this")
            writer[written] = i
    after: list[set[int]] = [set() for _ in items]  # after[i]: items that must run before item i
    for i, item in enumerate(items):
        after[i] |= {writer[r] for r in item.reads if r in writer and writer[r] != i}
        for buf, version in item.reads:  # reading version v must happen before the write making version v+1
            overwriter = writer.get((buf, version + 1))
            if overwriter is not None and overwriter != i:
                after[overwriter].add(i)
    ordered: list[ScheduleItem] = []
    done: set[int] = set()
    while len(done) < len(items):
        ready = [i for i in range(len(items)) if i not in done and after[i] <= done]
        if not ready:
            return ordered, [i for i in range(len(items)) if i not in done]
        done.add(ready[0])
        ordered.append(items[ready[0]])
    return ordered, []
