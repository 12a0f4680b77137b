"""`Tensor`: the user-facing, lazy n-dimensional array.

In: Python scalars, nested lists, numpy arrays, and calls such as `a + b`, `x.sum(1)`, `x @ w`. Out: a tensor whose
`uop` is a node of the tensor graph; nothing is computed until `realize()`, `numpy()`, `item()` or `tolist()`.

Only a handful of primitives build graph nodes (`_unary`, `_binary`, `where`, `_reduce`, the movement ops,
`cast`); every other op (softmax, matmul, cross_entropy, indexing, ...) is composed from them, as in tinygrad.
Shapes and dtypes are checked here, eagerly, so mistakes raise at the line that made them.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import gc
import itertools
import math
import os
import pathlib
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple, cast, overload

import numpy as np

from glassgrad.device import Buffer, Device, canonical_devices
from glassgrad.dtype import DType, bf16_to_f32, dtypes, f32_to_bf16, least_upper_dtype, sum_acc_dtype, to_dtype
from glassgrad.engine.realize import capture_hooks, schedule_and_run
from glassgrad.errors import ArgumentError, DTypeError, ModeError, ShapeError, UnknownModeError
from glassgrad.gradient import compute_gradient
from glassgrad.helpers import GLOBAL_LOCK, TRAINING, locked, normalize_axis, prod, shape_args
from glassgrad.multi import in_use as multi_in_use
from glassgrad.multi import is_realized, lower, make_multi, shard_bounds
from glassgrad.schedule import REALIZED, buffer_view, is_buffer_view, view_versions
from glassgrad.schedule.versions import StaleReaders, overwritten_versions, written_versions
from glassgrad.tensor_extra import ExtraOps, InPlaceOps, TorchOps
from glassgrad.tensor_linalg import LinalgOps
from glassgrad.tensor_math import MathOps, accepts_dim, computed_in_float32
from glassgrad.tensor_nn import NNOps
from glassgrad.tensor_shape import ShapeOps
from glassgrad.tensor_torch import TorchNames
from glassgrad.uop.ops import OP_ADD, OP_ASSIGN, OP_MAX, OP_MUL, OP_MULTI, OP_NEG, GroupOp, Ops, UOp, _arg_key, sint
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite
from glassgrad.uop.sint import (
    as_sint,
    render_sint,
    sint_add,
    sint_ceildiv,
    sint_eval,
    sint_max,
    sint_min,
    sint_prod,
    sint_sub,
    unbound_variables,
)

# realized buffer view -> the graph it was computed from, so gradients flow through realized tensors
LINEAGE: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# tensors that may get a gradient (requires_grad True, or a layer's parameter): id(tensor) -> tensor. Not a WeakSet,
# whose membership test would compare tensors with the elementwise ==
_REQUIRES_GRAD: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
# tensors that own a buffer written in place (assign targets): a TinyJit replay moves them to the new version
ASSIGN_TARGETS: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()  # id(tensor) -> tensor

Scalar = int | float | bool
AxisArg = int | Sequence[int] | None


class ValuesIndices(NamedTuple):
    """`x.max(dim=d)` / `x.min(dim=d)`: PyTorch's result (values, indices)."""
    values: Tensor
    indices: Tensor


class _LazyTensors:
    """The tensors that may still be lazy: before an assign overwrites a buffer, those that read its old contents are
    realized (a tensor keeps the value it had when it was built; see schedule/versions.py). Every op's result joins,
    so adding is one weak reference appended to a list (one list per thread: `tensors(everyone=False)` is the
    calling thread's only); dead and settled entries (realized into a buffer that is never written in place) are
    dropped whenever a list doubles, and whenever it is read."""

    def __init__(self) -> None:
        # every thread's list, with its thread (an ended thread's list stays while it holds tensors)
        self.lists: dict[int, tuple[threading.Thread, list[weakref.ref[Tensor]]]] = {}
        self.limit = 4096
        self.local = threading.local()  # this thread's list
        self.made = itertools.count()

    def _own(self) -> list[weakref.ref[Tensor]]:
        refs: list[weakref.ref[Tensor]] = []
        with GLOBAL_LOCK:
            self.lists[next(self.made)] = (threading.current_thread(), refs)
            self.local.refs = refs
        return refs

    def add(self, t: Tensor) -> None:
        ref = weakref.ref(t)
        try:
            refs = self.local.refs
        except AttributeError:  # (a thread's first)
            refs = self._own()
        refs.append(ref)
        if _OPEN_NO_GRAD_BLOCKS[0] and (blocks := _MODES.no_grad_blocks):  # (an open no_grad() block, this thread's)
            blocks[-1].append(ref)
        if len(refs) > self.limit:
            self.tensors()

    @locked
    def tensors(self, everyone: bool = True) -> list[Tensor]:
        """The live, unsettled tensors, each once: every thread's, or (`everyone` False) the calling thread's. (A
        list's thread may append meanwhile: the entries looked at are replaced in place, so those appended after
        them stay. The empty list of a thread that ended is dropped.)"""
        if everyone:
            lists = list(self.lists.items())
        else:
            own = getattr(self.local, "refs", None)
            lists = [(-1, (threading.current_thread(), own))] if own is not None else []
        alive: dict[int, tuple[Tensor, weakref.ref[Tensor]]] = {}
        longest = 0
        for key, (thread, refs) in lists:
            seen = len(refs)
            kept: dict[int, weakref.ref[Tensor]] = {}
            for ref in refs[:seen]:
                t = ref()
                if t is not None and not _settled(t):
                    alive[id(t)] = (t, ref)
                    kept[id(t)] = ref
            refs[:seen] = list(kept.values())
            if not refs and key >= 0 and not thread.is_alive():
                del self.lists[key]
            longest = max(longest, len(refs))
        self.limit = max(4096, 2 * longest)
        return [t for t, _ in alive.values()]


class _ThreadModes(threading.local):
    """This thread's open `with no_grad()` blocks. They are per thread, as PyTorch's grad mode is: a block in one
    thread does not change what another computes (a global flag set by interleaved blocks of two threads was left
    set after both, and a block cut the gradients of the tensors another thread made meanwhile). `Tensor.no_grad =
    ...` sets the process-wide flag. (`with Tensor.train():` blocks are per thread too: `helpers.ThreadModeVar`.)"""

    def __init__(self) -> None:
        self.no_grad_blocks: list[list[weakref.ref[Tensor]]] = []  # per open block: the results made in it


_MODES = _ThreadModes()
_OPEN_NO_GRAD_BLOCKS = [0]  # open no_grad() blocks in every thread (changed under GLOBAL_LOCK): 0 in most programs
_NO_GRAD = [False]  # `Tensor.no_grad = True`: tinygrad's process-wide switch


# the assign targets that may hold a pending write: every tensor of ASSIGN_TARGETS whose node is an ASSIGN is in here
# (`_note_pending_assign` at each place that gives a tensor a node), so a realize looks at the writes pending now,
# not at every assign target of the program (a model's parameters and its optimizer's state)
_PENDING_ASSIGNS: dict[int, weakref.ref[Tensor]] = {}


def _note_pending_assign(t: Tensor) -> None:
    """Call after giving `t` a new node: an assign target whose node is now an ASSIGN joins `_PENDING_ASSIGNS`."""
    if t.uop.op is Ops.ASSIGN and ASSIGN_TARGETS.get(id(t)) is t:
        _PENDING_ASSIGNS[id(t)] = weakref.ref(t)


@dataclass
class _LazyGradients:
    """The gradients one `backward()` left lazy (and the tensor it was called on), and the nodes of the computation
    they come from (the forward graph's unrealized nodes and the gradients' own): a realize that reads any of these
    computes them all, so that the forward's intermediates are computed once (see `_gradients_realized_with`)."""
    targets: list[weakref.ref[Tensor]]  # the tensors whose `.grad` it set
    grads: list[weakref.ref[Tensor]]    # those gradients, in order
    root: weakref.ref[Tensor]           # the tensor backward() was called on
    nodes: set[UOp]
    # the thread that ran the backward: another thread's realize does not compute them along (graphs of two threads
    # share nodes, the random state's among them, without being one computation; inside a TinyJit capture that
    # would record another thread's gradients as the step's kernels)
    thread: int = field(default_factory=threading.get_ident)

    def unrealized(self) -> list[Tensor]:
        """The gradients still held by their tensors (not zeroed, replaced or accumulated into since) and the
        backward's own tensor, where alive and not realized yet."""
        out = [g for target, ref in zip(self.targets, self.grads) if (t := target()) is not None and
               (g := ref()) is not None and t.grad is g and not is_realized(g.uop)]
        root = self.root()
        return out + [root] if root is not None and not is_realized(root.uop) else out


_LAZY_GRADIENTS: list[_LazyGradients] = []


_VIEW_OPS = frozenset({Ops.BUFFER, Ops.RESHAPE, Ops.SHRINK, Ops.MULTI})  # the ops `is_realized` can be true of


def _note_lazy_gradients(root: Tensor, targets: Sequence[Tensor], forward: list[UOp]) -> None:
    """After `root.backward()` set the `.grad` of `targets`: remember them (and `root`, whose value the forward
    computes on the way: the loss a training loop reads after the step) with the forward nodes they depend on."""
    held = [(t, t.grad) for t in targets if t.grad is not None and not is_realized(t.grad.uop)]
    if held:
        # (is_realized only for the ops a realized view can have: this runs over the forward graph per backward)
        nodes = {u for u in forward if u.op is not Ops.CONST and (u.op not in _VIEW_OPS or not is_realized(u))} | \
            {g.uop for _, g in held}
        _LAZY_GRADIENTS.append(_LazyGradients([weakref.ref(t) for t, _ in held], [weakref.ref(g) for _, g in held],
                                              weakref.ref(root), nodes))


def _gradients_realized_with(pending: list[Tensor]) -> list[Tensor]:
    """The lazy gradients that realizing `pending` computes along: those of every `backward()` whose forward or
    gradients `pending` reads. Realized on their own later, they would compute the forward's intermediates again
    (nothing keeps a schedule's intermediate buffers): `loss.backward(); loss.item(); opt.step()` ran the forward
    twice, and reading each `p.grad` in turn (`p.grad.numpy()`, a clipping loop's `p.grad.mul_(c)`) ran the forward
    and backward once per parameter. PyTorch's backward computes every gradient at once, as this does then."""
    live = [entry for entry in _LAZY_GRADIENTS if entry.unrealized()]
    _LAZY_GRADIENTS[:] = live
    chosen, extra, me = {id(t) for t in pending}, list[Tensor](), threading.get_ident()
    for entry in live:
        if entry.thread == me and any(_reaches(t.uop, entry.nodes) for t in pending):
            for g in entry.unrealized():
                if id(g) not in chosen:
                    chosen.add(id(g))
                    extra.append(g)
    return extra


def _reaches(root: UOp, nodes: set[UOp]) -> bool:
    """Whether `root`'s graph, down to realized nodes, holds one of `nodes` (a walk that stops at the first)."""
    stack, seen = [root], set()
    while stack:
        u = stack.pop()
        if u in nodes:
            return True
        if u in seen or is_realized(u):
            continue
        seen.add(u)
        stack.extend(u.src)
    return False


_FLAG_CHANGES = [0]  # how often a decided requires_grad flag changed (a TinyJit signature holds the count)


def _note_flag_change(old: bool | None, new: bool | None) -> None:
    """Count a tensor's requires_grad flag changing once decided (freezing or unfreezing a param), not a fresh
    tensor's first setting: a step captured before a layer was frozen would replay its updates."""
    if old is not None and old != new:
        _FLAG_CHANGES[0] += 1


def requires_grad_changes() -> int:
    """How many times a decided requires_grad flag has changed in this process."""
    return _FLAG_CHANGES[0]


def _pending_assigns() -> list[Tensor]:
    """The assign targets whose node is an ASSIGN (a write not realized yet). Those whose write was realized (or
    that died) leave the table."""
    found, done = [], []
    for key, ref in _PENDING_ASSIGNS.items():
        t = ref()
        if t is not None and t.uop.op is Ops.ASSIGN and ASSIGN_TARGETS.get(key) is t:
            found.append(t)
        else:
            done.append(key)
    for key in done:
        del _PENDING_ASSIGNS[key]
    return found


# an owned buffer -> the tensor it belongs to. Another tensor can come to hold a view of it: `a = -x;
# a.assign(x)` computes -x into a's new buffer first, so a later `c = -x; c.realize()` is that buffer's view.
# Only the owner writes it in place; another tensor's assign copies it into a buffer of its own first.
_BUFFER_OWNER: weakref.WeakKeyDictionary[Buffer, weakref.ref[Tensor]] = weakref.WeakKeyDictionary()


def _claim_buffer(t: Tensor) -> bool:
    """Whether `t` (a view of an owned buffer) may write that buffer in place: it is the buffer's owner, or the
    buffer has none alive yet and `t` becomes it."""
    buf = t.uop.base.arg[0]
    ref = _BUFFER_OWNER.get(buf)
    owner = ref() if ref is not None else None
    if owner is None:
        _BUFFER_OWNER[buf] = weakref.ref(t)
        return True
    return owner is t


def _settled(t: Tensor) -> bool:
    """A tensor that can never read an overwritten version: realized into a buffer that is never written in place,
    or the owner of a buffer written in place, at its current version (its writes move it to the next one)."""
    if not is_buffer_view(t.uop):
        return False
    buf, version = t.uop.base.arg
    return not buf.owned or (version == buf.version and ASSIGN_TARGETS.get(id(t)) is t)


def _method_hint(x: object) -> str:
    """For an operand that is a tensor's bound method (`w.data - lr * g`, `w.T` misspelled `w.t`): say so, and for
    `data` (tinygrad's method, PyTorch's attribute) what to write instead."""
    owner, name = getattr(x, "__self__", None), getattr(x, "__name__", "")
    if not isinstance(owner, Tensor):
        return ""
    if name == "data":
        return ("; t.data is tinygrad's data() method (the values as a memoryview), not PyTorch's .data attribute: "
                "read the values with t.detach(), write them with t.assign(v) inside no_grad()")
    return f"; t.{name} is a method: call it, t.{name}()"


def _tinygrad_targets(root_nodes: set[UOp], root: Tensor, with_layers: bool = False) -> list[Tensor]:
    """backward()'s targets when no tensor of the graph requires grad: tinygrad 0.14's rule, every live float tensor
    whose node is in the graph (leaves and held intermediates alike; not the root itself), found by a scan of the
    live objects (this path runs only for programs that never set requires_grad). A graph holding a tensor made
    with requires_grad=False is a PyTorch program's: none (backward() then raises, as PyTorch does).
    `with_layers`: the graph also holds layers' parameters, none set to require grad yet (a tinygrad program before
    its optimizer exists): the tensors marked requires_grad=False are left out (a BatchNorm's running statistics),
    the others are still targets."""
    # (hasattr: a Tensor whose constructor raised may still be garbage waiting for the collector, without a node)
    # (a bare constant is skipped, as tinygrad's backward skips it: its node is shared with every equal constant;
    # so is a tensor computed from constants alone that shares its node with another one found or with the root,
    # and a realized tensor found only through what computed it when that was constants alone: a constant of the
    # graph equal to it by chance (a `.grad` of ones realized earlier and the 1.0 inside a `randn`), not its use;
    # a tensor whose write the graph holds, realized since, is found through that write: `_graph_nodes_of`)
    written = {view for n in root_nodes if n.op is Ops.ASSIGN and (view := REALIZED.get(n)) is not None}
    # (a TinyJit capture watches the lineage a step differentiates through; looking at the lineage of every live
    # tensor here is not that: the root's own walk recorded what its graph holds)
    watches = LINEAGE_WATCHES[:]
    LINEAGE_WATCHES.clear()
    try:
        found = [o for o in gc.get_objects() if type(o) is Tensor and o is not root and hasattr(o, "uop") and
                 o.dtype.is_float and not _is_bare_constant(o.uop) and
                 (o.uop in root_nodes or o.uop in written or
                  (_reads_a_buffer(lineage := _with_lineage(o.uop)) and lineage in root_nodes))]
    finally:
        LINEAGE_WATCHES[:] = watches
    found = [t for t in found if not _shares_a_constant_node(t, [*found, root])]
    if not with_layers and any(t._requires_grad is False for t in found):
        return []
    return [t for t in found if t._requires_grad is None]


_LAZY = _LazyTensors()
# bits of the significand (with the implicit one) of the float dtypes narrower than float32: rand's resolution
_SIGNIFICAND_BITS = {dtypes.float16: 11, dtypes.bfloat16: 8}


class _RNG:
    """Random numbers on the device, so that a TinyJit replays a step (dropout, `Tensor.randint` batches) with fresh
    numbers, as tinygrad's do. Counter-based: the k-th number since the seed is `_mix(_mix(lo ^ key) + key)`, where
    lo and hi are the two 32-bit halves of k, `_mix` a 32-bit integer hash (a xor-shift-multiply finaliser) and the
    key a hash of the seed and hi. Per device, a uint64 buffer `[seed, count]` holds the seed and how many numbers
    were drawn before the current batch of draws.

    Draws made between two realizes take consecutive ranges after `count` (host offsets, constants of the graph); the
    next realize adds what they took to `count` in place (an assign, in the same schedule, after every draw that reads
    the old count: see "What a tensor means" in docs/ARCHITECTURE.md). So the k-th number drawn is the same whatever
    was realized in between, and a TinyJit capture holds that assign, so each replay draws the next numbers.
    `Tensor.manual_seed(n)` starts over: the same seed and the same draws give the same numbers.

    The lazy draws that read the count being overwritten are realized first (as any reader of a buffer written in
    place), but a graph can still hold that old version without a tensor of its own: the lineage of a realized
    result (`loss.item()` then `loss.backward()` through a dropout mask), or, from several threads (which share the
    count, as PyTorch's threads share its generator; each draw takes the next range under `GLOBAL_LOCK`), an op
    another thread is half way through, or its draws while this thread captures a TinyJit step. So each advance
    first copies the state as it is (16 bytes, on the device), and graphs that read that version later read the
    copy (`RealizedMap.keep`; a stale-read error before). During a capture the copy is registered when the capture
    ends: a captured kernel must read the state itself, which every replay advances."""
    seed = 0
    states: dict[str, Tensor] = {}   # device -> its [seed, count] buffer
    pending: dict[str, int] = {}     # device -> numbers drawn since its count was last advanced
    deferred: list[tuple[UOp, UOp]] = []  # copies made during a capture: (state version's node, copy's view)

    @staticmethod
    @locked
    def bits(count: int, device: str) -> Tensor:
        """`count` random uint32 values (a lazy tensor of shape (count,))."""
        state = _RNG.states.get(device)
        if state is None:
            state = _RNG.states[device] = Tensor(np.array([_RNG.seed % (1 << 64), 0], np.uint64), device=device,
                                                 requires_grad=False)
        offset = _RNG.pending.get(device, 0)
        _RNG.pending[device] = offset + count
        if count == 0:
            return Tensor.zeros(0, dtype=dtypes.uint32, device=device)
        k = state[1:2] + Tensor.arange(count, dtype=dtypes.uint64, device=device) + offset
        lo = (k & Tensor(0xFFFFFFFF, dtype=dtypes.uint64, device=device)).cast(dtypes.uint32)
        hi = (k >> 32).cast(dtypes.uint32)
        seed = (state[0:1] ^ (state[0:1] >> 32)).cast(dtypes.uint32)
        key = _mix(seed ^ _mix(hi + 0x9E3779B9))
        return _mix(_mix(lo ^ key) + key)

    @staticmethod
    def advances() -> list[Tensor]:
        """The count advances that a realize must run (and forget): one per device that was drawn from."""
        out: list[Tensor] = []
        if not _RNG.pending:  # (every realize: nothing drawn since the last)
            return out
        for device, drawn in list(_RNG.pending.items()):
            del _RNG.pending[device]  # first: an advance still pending is realized by the assign below
            if drawn and (state := _RNG.states.get(device)) is not None:
                if is_buffer_view(state.uop):
                    _RNG.keep_current(state)
                state.assign(state + Tensor(np.array([0, drawn], np.uint64), device=device))
                out.append(state)
        return out

    @staticmethod
    def keep_current(state: Tensor) -> None:
        """A copy of the state's current version that graphs still reading that version read once it is overwritten
        (see the class docstring)."""
        node = state.uop.base
        buf: Buffer = node.arg[0]
        copy = Buffer(buf.device, buf.size, buf.dtype)
        allocator = Device[buf.device].allocator
        if hasattr(allocator, "copy_device"):  # (on the device, ordered after the kernels that wrote it)
            allocator.copy_device(copy.handle, buf.handle, buf.nbytes)
        else:
            copy.copyin(buf.numpy())
        if capture_hooks:
            _RNG.deferred.append((node, buffer_view(copy, (buf.size,))))
        else:
            REALIZED.keep(node, buffer_view(copy, (buf.size,)))

    @staticmethod
    def register_deferred() -> None:
        """After a capture: the copies made during it, readable from now on."""
        for node, view in _RNG.deferred:
            REALIZED.keep(node, view)
        _RNG.deferred.clear()


def _draws_random(t: Tensor) -> bool:
    """Whether a lazy tensor's graph reads the random state (`Tensor.randn(4, 3)` not realized yet). A write where
    the target or the value does (`z[:, 0] = w` into a lazy randn z, `z[:] = Tensor.rand(8, 8)`) gives the target its
    own buffer before the merged value is built: realizing it later, inside the write, advances the state, so the
    value (which reads it) was realized with it, and the pending write held that result as a gradient leaf (w.grad
    None). Other lazy targets are not realized first: a gradient must still reach what they are computed from
    (`z = x * 2; z[:2] = v` differentiates into x)."""
    if is_buffer_view(t.uop) or not _RNG.states:
        return False
    # (any device's state: a tensor drawn on one device and sharded, `Tensor.randn(4, 3).shard(devices)`, reads
    # the state of the device it was drawn on)
    bases = [state.uop.base for state in _RNG.states.values()]
    bases = [b.src[0].base if b.op is Ops.ASSIGN else b for b in bases]  # (a state whose advance is pending)
    rng_buffers = {id(b.arg[0]) for b in bases if b.op is Ops.BUFFER}
    return any(u.op is Ops.BUFFER and id(u.arg[0]) in rng_buffers for u in t.uop.toposort())


def _mix(x: Tensor) -> Tensor:
    """A 32-bit integer hash (xor-shift-multiply, "lowbias32"): every input bit moves every output bit."""
    x = x ^ (x >> 16)
    x = x * Tensor(0x7FEB352D, dtype=dtypes.uint32, device=x.device)
    x = x ^ (x >> 15)
    x = x * Tensor(0x846CA68B, dtype=dtypes.uint32, device=x.device)
    return x ^ (x >> 16)


def _needing_grad(t: Tensor, requires_grad: bool | None) -> Tensor:
    """A constructor's result, marked as needing a gradient when asked (`requires_grad=True`)."""
    return t.requires_grad_(True) if requires_grad else t


class _CastShortcuts:
    """`t.float()`, `t.int()`, ... (a base class, so these names do not shadow the builtins inside Tensor's body)."""
    __slots__ = ()

    def cast(self, dtype: DType | str) -> Tensor:
        raise NotImplementedError

    def float(self) -> Tensor: return self.cast(dtypes.float32)  # noqa: E704
    def half(self) -> Tensor: return self.cast(dtypes.float16)  # noqa: E704
    def int(self) -> Tensor: return self.cast(dtypes.int32)  # noqa: E704
    def long(self) -> Tensor: return self.cast(dtypes.int64)  # noqa: E704
    def bool(self) -> Tensor: return self.cast(dtypes.bool)  # noqa: E704
    def double(self) -> Tensor: return self.cast(dtypes.float64)  # noqa: E704


_UINT_OF_SIZE = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}  # for bitcast


def _training() -> bool:
    """Training mode in this thread: the innermost open `with Tensor.train(mode)` block's mode, else TRAINING's."""
    return bool(TRAINING)


def _no_grad() -> bool:
    """Whether gradient bookkeeping is off in this thread: `Tensor.no_grad = True`, or an open `no_grad()` block."""
    return _NO_GRAD[0] or bool(_OPEN_NO_GRAD_BLOCKS[0] and _MODES.no_grad_blocks)


class _ModeFlag:
    """`t.training` / `t.no_grad` on a tensor: reads the mode, as `Tensor.training` does (tinygrad's were class
    attributes, so both spellings read them). Writing it on one tensor raises: a mode is not a tensor's, so it is set
    on the class (`Tensor.training = True`, `with Tensor.train():`, `Context(TRAINING=1)`)."""

    def __init__(self, name: str, read: Callable[[], bool]) -> None:
        self.name, self.read = name, read

    def __get__(self, obj: object, owner: type | None = None) -> bool:
        return self.read()

    def __set__(self, obj: object, mode: bool) -> None:
        raise AttributeError(f"{self.name} is a mode, not a tensor's: set Tensor.{self.name} (or use a with-block: "
                             f"`with Tensor.train():`, `with no_grad():`), not t.{self.name} on one tensor")


class _TensorType(type):
    """Tensor's metaclass, for class-level properties: `Tensor.training` is a view of the TRAINING flag, so
    `Tensor.training = True` and tinygrad's `Context(TRAINING=1)` set one state, and `with Tensor.train(mode):` sets
    it in its thread while it is open; `Tensor.no_grad` likewise (`no_grad()` blocks: see `_ThreadModes`). (A
    metaclass property wins over the class's own attribute for reads and writes on the class; instances read
    `Tensor.__dict__['training']`, a `_ModeFlag`.)"""

    @property
    def training(cls) -> bool:
        return _training()

    @training.setter
    def training(cls, mode: bool) -> None:
        TRAINING.value = int(mode)

    @property
    def no_grad(cls) -> bool:
        return _no_grad()

    @no_grad.setter
    def no_grad(cls, value: bool) -> None:
        _NO_GRAD[0] = bool(value)


class Tensor(_CastShortcuts, NNOps, MathOps, ShapeOps, LinalgOps, ExtraOps, InPlaceOps, TorchOps, TorchNames,
             metaclass=_TensorType):
    """A lazy tensor. `Tensor([1, 2, 3])`, `Tensor(np.ones((2, 2)))`, `Tensor.rand(3, 4)`."""
    __slots__ = ("uop", "_requires_grad", "grad", "_view_of", "__weakref__")
    no_grad = _ModeFlag("no_grad", _no_grad)  # instances read the mode; the class reads and writes it (_TensorType)
    # numpy on the left (`np_array * t`, `np.float32(2) * t`) defers to Tensor's reflected operators, as with
    # PyTorch's tensors: the result is a Tensor (in the graph), not a numpy array of the values
    __array_priority__: ClassVar[int] = 1000
    training = _ModeFlag("training", _training)  # (as no_grad)
    uop: UOp
    grad: Tensor | None
    # (the tensor a movement op made this from, its node then, this view's movement node over it): assign writes
    # there through that movement node (kept: a realize replaces `uop` by a buffer, the view still shows the parent)
    _view_of: tuple[Tensor, UOp, UOp] | None
    _requires_grad: bool | None  # True, False, or None: undecided (tinygrad's default; see `requires_grad`)

    def __init__(self, data: Any, device: str | None = None, dtype: DType | str | None = None,
                 requires_grad: bool | None = None) -> None:
        if type(data) is UOp and device is None and dtype is None and requires_grad is None \
                and (data.dtype is not dtypes.int32 or not _is_size_expression(data)):  # every op's result
            self.uop, self.grad, self._requires_grad, self._view_of = data, None, None, None
            _LAZY.add(self)  # (one place for it: an inlined copy once missed the open no_grad block's list)
            return
        if isinstance(device, (tuple, list)) and not isinstance(data, (UOp, bool, int, float)):
            whole = Tensor(data, canonical_devices(device)[0], dtype, requires_grad=None)
            self.uop, self.grad, self._requires_grad, self._view_of = whole.shard(tuple(device)).uop, None, None, None
            if requires_grad:
                self.requires_grad_(True)
            return
        device = canonical_devices(device or Device.DEFAULT)
        want = to_dtype(dtype) if dtype is not None else None
        if isinstance(data, UOp) and _is_size_expression(data):  # tinygrad's Tensor(v.bind(3)): a 0-d int tensor
            _check_bound(data, "Tensor")
            uop = UOp(Ops.CONST, dtypes.int32, (UOp(Ops.DEVICE, dtypes.void, (), device),), as_sint(data))
        elif isinstance(data, UOp):
            uop = data
        elif isinstance(data, Tensor):
            raise TypeError("Tensor(Tensor) is ambiguous: use t.detach(), t.clone() or t.cast(dtype)")
        elif isinstance(data, (bool, int, float)) and not isinstance(data, np.generic):
            d = want or _scalar_dtype(data)
            uop = UOp.const(d, data, device)
        elif isinstance(data, (bytes, bytearray)):  # tinygrad's Tensor(b"..."): raw memory, uint8 unless told
            uop = _uop_from_bytes(bytes(data), want, device)
        elif isinstance(data, pathlib.PurePath):  # tinygrad's Tensor(Path): the file's bytes, uint8 unless told
            uop = _uop_from_bytes(np.fromfile(data, dtype=np.uint8), want, device)
        elif isinstance(data, range):  # torch.tensor(range(n)) works
            uop = _uop_from_array(np.array(data, dtype=(want or dtypes.default_int).np if want != dtypes.bfloat16
                                           else np.float32), want, device)
        elif data is None:  # tinygrad's Tensor(None): empty
            uop = _uop_from_array(np.zeros(0, (want or dtypes.default_float).np), want, device)
        else:
            uop = _uop_from_array(data, want, device)
        if want is not None and uop.dtype != want:
            uop = uop.cast(want)
        self.uop, self.grad, self._requires_grad, self._view_of = uop, None, None, None
        if not is_buffer_view(uop):
            _LAZY.add(self)
        elif uop.base.arg[0].owned:  # data made for this tensor: its buffer is this tensor's to write
            _claim_buffer(self)
        if requires_grad:
            self.requires_grad_(True)
        elif requires_grad is False:
            self._requires_grad = False

    # ------------------------------------------------------------------ properties
    @property
    def shape(self) -> tuple[int, ...]:
        return self.uop.shape

    @property
    def dtype(self) -> DType:
        return self.uop.dtype

    @property
    def device(self) -> Any:
        """The device name, or for a tensor on several devices (`shard`) the tuple of their names."""
        return self.uop.device

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def dim(self) -> int:
        """The number of axes (PyTorch's name for `ndim`)."""
        return len(self.shape)

    def t(self) -> Tensor:
        """PyTorch's `t()`: a matrix transposed; 0-d and 1-d tensors as they are."""
        if self.ndim > 2:
            raise ShapeError(f"t() expects a tensor with at most 2 dims, got shape {self.shape}; use transpose")
        return self._same_view() if self.ndim < 2 else self.transpose(0, 1)

    def type_as(self, other: Tensor) -> Tensor:
        """Cast to `other`'s dtype (PyTorch's name)."""
        return self.cast(other.dtype)

    def numel(self) -> int:
        """The element count; for a symbolic shape, a symbolic size (see glassgrad/uop/sint.py)."""
        count = prod(self.shape)
        return count if isinstance(count, int) else sint_prod(self.shape)  # type: ignore[return-value]

    def size(self, dim: int | None = None) -> int | tuple[int, ...]:
        return self.shape if dim is None else self.shape[normalize_axis(dim, self.ndim, "dim")]

    def element_size(self) -> int:
        return self.dtype.itemsize

    def nbytes(self) -> int:
        """Bytes of this tensor's elements (a method, as in tinygrad)."""
        return self.numel() * self.dtype.itemsize

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        shape = "(" + ", ".join(render_sint(d) for d in self.shape) + ("," if self.ndim == 1 else "") + ")"
        return f"<Tensor shape={shape} dtype={self.dtype} device={self.device}" \
               f"{' realized' if is_buffer_view(self.uop) else ''}>"

    def __hash__(self) -> int:
        return id(self)

    def __bool__(self) -> bool:
        if self.numel() != 1:
            raise RuntimeError(f"the truth value of a tensor with {self.numel()} elements is ambiguous; use .any() or"
                               " .all()")
        return bool(self.item())

    @property
    def requires_grad(self) -> bool | None:
        """True: `backward()` fills this tensor's `.grad`. False: never (PyTorch's default for a plain tensor, a
        layer's buffers). None: undecided, tinygrad's default (a layer's parameter until an optimizer takes it; a
        fresh tensor, which gets a gradient only when nothing in the graph asked for one, as in tinygrad 0.14).

        An op's result reports True when a gradient can flow from it to a tensor that `backward()` would fill (one
        with requires_grad=True, or a layer's parameter: not only through detach(), nor made in an open no_grad()
        block), as PyTorch's (and tinygrad 0.10's) results do; None otherwise. (A walk of its graph, done when asked:
        nothing is stored per op.)"""
        if self._requires_grad is None and _reaches_a_grad_leaf(self):
            return True
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        """`t.requires_grad = True` is `t.requires_grad_(True)`, as in PyTorch."""
        if value is None:
            _note_flag_change(self._requires_grad, None)
            self._requires_grad = None
        else:
            self.requires_grad_(bool(value))

    # PyTorch's conversions of a one-element tensor: float(loss), int(n), lst[t.argmax()], f"{loss:.3f}"
    def _one_value(self, what: str) -> Scalar:
        if self.numel() != 1:
            raise TypeError(f"{what} needs a tensor with one element, this one has shape {self.shape}")
        return self.item()

    def __float__(self) -> float:
        return float(self._one_value("float()"))

    def __int__(self) -> int:
        return int(self._one_value("int()"))

    def __index__(self) -> int:
        if not (self.dtype.is_int or self.dtype.is_bool):
            raise TypeError(f"only integer tensors of one element can be used as an index, this one is {self.dtype}")
        return int(self._one_value("an index"))

    def __format__(self, spec: str) -> str:
        if not spec:
            return repr(self)
        return format(self._one_value(f"format spec {spec!r}"), spec)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """np.asarray(t), np.mean(t), plt.plot(t): the values (before this, numpy made an array of 0-d Tensors)."""
        array = self.numpy()
        return array if dtype is None else array.astype(dtype, copy=False)

    @locked
    def requires_grad_(self, value: bool = True) -> Tensor:
        if value and not self.dtype.is_float:
            raise RuntimeError(f"only floating point tensors can require gradients, this one is {self.dtype}")
        if value and self._requires_grad is not True and self._shares_its_node():
            with no_grad():
                self._take_own_buffer()
        _note_flag_change(self._requires_grad, bool(value))
        self._requires_grad = bool(value)
        if value:
            _REQUIRES_GRAD[id(self)] = self
        return self

    def _shares_its_node(self) -> bool:
        """Whether this tensor, about to become a gradient leaf, may hold the very node another tensor holds: a lazy
        graph hash-conses with every equal one (two `Tensor.zeros(3, requires_grad=True)`, two `Tensor(3.5)`), and a
        gradient is found per node, so such leaves would each get the sum of all their gradients. A buffer made for
        this tensor is its own; so is a view of another tensor (it writes there) and an op's result that already
        reaches a gradient leaf (PyTorch's non-leaf: its gradient must keep flowing to that leaf)."""
        if self._view_of is not None or not all(isinstance(s, int) for s in self.shape):
            return False
        # (on several devices: each part, as `_take_own_buffers` makes them)
        parts = self.uop.src if isinstance(self.device, tuple) and self.uop.op is Ops.MULTI else (self.uop,)
        if all(is_buffer_view(u) and u.base.op is Ops.BUFFER and u.base.arg[0].owned for u in parts):
            return False
        return not _reaches_a_grad_leaf(self)

    @property
    def is_param(self) -> bool:
        """tinygrad's name (since it dropped `requires_grad`) for "an optimizer updates this": every tensor but one
        marked `requires_grad=False` / `is_param_(False)` (BatchNorm's running statistics are such buffers)."""
        return self.requires_grad is not False

    @is_param.setter
    def is_param(self, value: bool) -> None:
        self.is_param_(value)

    def is_param_(self, value: bool = True) -> Tensor:
        """Mark this tensor a parameter (the optimizer trains it) or, with False, a buffer it only realizes."""
        if not value:
            self.requires_grad = False
        elif self.requires_grad is False:
            self.requires_grad = None  # undecided, as a fresh tensor: an optimizer turns gradients on
        return self

    # ------------------------------------------------------------------ realizing
    def realize(self, *others: Tensor) -> Tensor:
        """Compute this tensor (and `others`) now, in as few kernels as the scheduler can."""
        Tensor.realize_all(self, *others)
        return self

    @staticmethod
    @locked
    def realize_all(*tensors: Tensor) -> None:
        pending = [t for t in tensors if not is_realized(t.uop)]
        if not pending:
            return
        if _LAZY_GRADIENTS:
            pending += _gradients_realized_with(pending)
        if _RNG.deferred and not capture_hooks:  # (a capture ended: the copies it made are readable now)
            _RNG.register_deferred()
        if _RNG.pending:  # (the guards of the next two calls, inline: every realize)
            pending += _RNG.advances()
        readers = _readers_of_overwritten(pending) if _PENDING_ASSIGNS else []
        pending += readers
        outs = [t.uop for t in pending]
        lowered, unchanged = outs, None
        if multi_in_use():
            unchanged = set[UOp]()
            lowered = lower(outs, REALIZED.get, unchanged)
            if all(low is out for low, out in zip(lowered, outs)):
                lowered = outs  # (nothing on several devices: realized exactly as in a process that never sharded)
        try:
            views = schedule_and_run([p for u in lowered for p in (u.src if u.op is OP_MULTI else (u,))])
        except BaseException as e:
            # a Ctrl-C or a failed compile part way: what did run is recorded as realized (its kernels may have
            # written buffers in place; recomputed from the old versions, a later realize raised a stale read)
            if (computed := getattr(e, "glassgrad_views", None)) is not None:
                Tensor._realized(pending, readers, outs, lowered, computed, partial=True, unchanged=unchanged)
            raise
        Tensor._realized(pending, readers, outs, lowered, views, unchanged=unchanged)

    @staticmethod
    def _realized(pending: list[Tensor], readers: list[Tensor], outs: list[UOp], lowered: list[UOp],
                  views: dict[UOp, UOp], partial: bool = False, unchanged: set[UOp] | None = None) -> None:
        """`realize_all`'s bookkeeping once the schedule of `outs` (`lowered`) ran: each computed node's view and
        lineage recorded, each pending tensor moved to its view (all of them, or, `partial`, after an exception the
        ones computed before it). `unchanged`: the logical nodes the lowered graphs still hold (`multi.lower`)."""
        for out, low in zip(outs, lowered):  # a tensor on several devices: the MULTI of its parts' buffer views
            if (low is not out or low.op is OP_MULTI) and out not in views:
                # (a part not computed, after an exception, leaves the tensor lazy)
                parts = [_computed(p, views, partial) for p in low.src] if low.op is Ops.MULTI else []
                if low.op is Ops.MULTI and all(part is not None for part in parts):
                    views[out] = make_multi(parts, low.arg)  # type: ignore[arg-type]  # (none is None)
                elif low.op is not Ops.MULTI and (part := _computed(low, views, partial)) is not None:
                    views[out] = part
        # after lowering, only the logical graphs are lineage (gradients are taken on them, never per device)
        # (and not a node whose lowered form is a buffer view already: `x.to(d)` of a replicated x is its part on d)
        # (and the logical nodes inside the lowered graphs, computed as they are: an assign realized by a reader)
        lineage_of = None if lowered is outs else \
            {o for o, low in zip(outs, lowered) if not is_realized(low)} | (unchanged or set())
        if _no_grad():  # (Tensor.no_grad, without its metaclass property) the tensors asked for get no lineage; the
            # readers realized only because a write here overwrites what they read keep theirs: they were built outside
            # this block, maybe for a backward (a training forward whose BatchNorm realizes the last step's statistics,
            # and with them the update of a weight that the forward read: the forward so far is realized, and must
            # still lead to the weight)
            kept = {t.uop for t in readers}
            lineage_of = kept if lineage_of is None else lineage_of & kept
        assigned = False
        for node in views:  # (a loop, not any() of a generator: every realize)
            if node.op is OP_ASSIGN:
                assigned = True
                break
        _record_realized(views, True, lineage_of, assigned)
        for t in pending:
            t.uop = views.get(t.uop) or REALIZED.get(t.uop) or t.uop
        if assigned:  # an assign realized as part of a larger graph: its target tensor holds the new version now
            for t in _pending_assigns():
                if t.uop.op is Ops.ASSIGN and (new := views.get(t.uop)) is not None:
                    t.uop = new

    def _buffer(self) -> Buffer:
        if isinstance(self.device, tuple):
            return self.to(self.device[0])._buffer()
        self.realize()
        base = self.uop.base
        if base.op is not Ops.BUFFER:
            raise RuntimeError(f"internal error: realized tensor is not a buffer: {self.uop.op}")
        return base.arg[0]

    def numpy(self) -> np.ndarray:
        """A new numpy array with this tensor's values (bfloat16 comes back as float32). A symbolic shape gives
        the array of its bound size (its buffer holds the largest size; the first elements are this one's)."""
        shape = tuple(sint_eval(d) for d in self.shape)
        if prod(shape) == 0:
            return np.zeros(shape, dtype=np.float32 if self.dtype == dtypes.bfloat16 else self.dtype.np)
        with GLOBAL_LOCK:  # (a capture holds it: one in another thread is waited for, not this thread's)
            if capture_hooks and os.environ.get("UNSAFE_ALLOW_JIT_BUFFER", "0") in ("", "0"):
                from glassgrad.engine.jit import JitError  # (jit imports this module)
                raise JitError("cannot read a tensor's values (numpy(), item(), tolist(), float()) while a TinyJit "
                               "captures: a replay runs only the kernels, so the value would be baked in; compute "
                               "with tensors instead (x.where, x.maximum), or read it outside the jitted function")
            flat = self._buffer().numpy()[:prod(shape)]
        if self.dtype == dtypes.bfloat16:
            flat = bf16_to_f32(flat)
        return flat.reshape(shape)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def item(self) -> Scalar:
        if self.numel() != 1:
            raise ValueError(f"item() needs a tensor with one element, this one has shape {self.shape}")
        return self.numpy().reshape(()).item()

    def contiguous(self) -> Tensor:
        """A tensor that will be materialised in its own buffer, in row-major order. One computed from constants alone
        (`Tensor.ones(3).contiguous()`, tinygrad's way to make a parameter) gets a buffer of its own, as tinygrad's:
        two equal ones would otherwise be one node (hash-consing), whose gradient is the sum of theirs (see
        `clone`)."""
        if not _reads_a_buffer(self.uop) and all(isinstance(s, int) for s in self.shape):
            return self.clone()
        return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

    def detach(self) -> Tensor:
        """The same values, cut from autograd. Like a PyTorch detach it shares this tensor's storage: a write into it
        (`t.detach()[0] = 1`, `assign`) writes this tensor."""
        return self._view(UOp(Ops.DETACH, self.dtype, (self.uop,)))

    def clone(self, device: str | tuple[str, ...] | None = None) -> Tensor:
        """A copy with its own storage (on `device` when given: tinygrad's keyword), differentiable as PyTorch's.
        Its own buffer also makes it its own node: `contiguous()` of equal graphs is one shared node, and two such
        clones would get one gradient between them (tinygrad's `Tensor(3.5).clone()` twice). On several devices each
        part gets a buffer of its own, laid out as the lowered graph's parts (`multi.lower`). (A symbolic shape: a
        contiguous copy.)"""
        src = self if device is None else self.to(device)
        if not all(isinstance(s, int) for s in src.shape):
            return src.contiguous()
        if isinstance(src.device, tuple):
            layout = lower([src.uop], REALIZED.get)[0]
            own = [buffer_view(Buffer(p.device, p.size, p.dtype, owned=True), p.shape) for p in layout.src]
            return Tensor(make_multi(own, layout.arg)).assign(src)
        return Tensor.empty(*src.shape, dtype=src.dtype, device=src.device).assign(src)

    def __deepcopy__(self, memo: dict[int, Any]) -> Tensor:
        """`copy.deepcopy(t)` (and of a model holding tensors): a tensor with its own copy of the values, the same
        requires_grad (a layer's parameter stays one) and a copy of `.grad`, as PyTorch's. Copying the node graph
        instead would duplicate buffer handles: two tensors freeing one device allocation."""
        out = Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (UOp(Ops.DETACH, self.dtype, (self.uop,)),)))
        with no_grad():  # copied now, as PyTorch does: the copy's graph no longer reaches this tensor
            out.realize()
        if self._requires_grad:
            out.requires_grad_(True)
        else:
            out.requires_grad = self._requires_grad
            if id(self) in _REQUIRES_GRAD:
                mark_trainable(out)
        if self.grad is not None:
            out.grad = copy.deepcopy(self.grad, memo)
        memo[id(self)] = out
        return out

    @locked
    def assign(self, x: Tensor | Scalar | list[Any] | tuple[Any, ...] | np.ndarray) -> Tensor:
        """Write `x` into this tensor's own buffer, in place (lazily, like everything else): whatever holds this
        tensor sees the new values after the next realize, and the buffer keeps its identity, which optimisers and
        the JIT rely on. A tensor with no buffer yet gets one first. Returns self."""
        if isinstance(x, Tensor):
            value = x
        elif isinstance(x, (list, tuple, np.ndarray)):  # data, as tinygrad: `w.assign(np_array)`
            value = Tensor(x, device=self.device, dtype=self.dtype)
        else:
            value = Tensor.full(self.shape, x, self.dtype, self.device)
        _no_symbolic("assign", self.shape, value.shape)
        if value.device != self.device:
            raise RuntimeError(f"assign: value is on {value.device}, tensor is on {self.device}")
        if value.shape != self.shape:
            try:
                value = value._broadcast_to(self.shape)
            except ValueError:
                raise ValueError(f"assign: value of shape {value.shape} does not fit tensor of shape "
                                 f"{self.shape}") from None
        if self._view_of is not None:
            return self._assign_through_view(value.cast(self.dtype))
        self._take_own_buffer()
        self.uop = UOp(Ops.ASSIGN, self.dtype, (self.uop, value.cast(self.dtype).uop))
        _note_pending_assign(self)
        _LAZY.add(self)
        return self

    def _assign_through_view(self, value: Tensor) -> Tensor:
        """`t[1:3].assign(v)`, `t.T.assign(v)`: this tensor is a movement-op view of another, so the write goes there
        (as a PyTorch view shares its base's storage): the parent gets `v` at the elements this view shows and keeps
        the others, and this tensor becomes the same view of the parent's new value."""
        parent, parent_uop, view_uop = self._view_of  # type: ignore[misc]
        chain = _movement_chain(view_uop, parent_uop)
        if parent._view_of is None and (_draws_random(parent) or _draws_random(value)):
            parent._take_own_buffer()  # its buffer first: see _draws_random
        full, inside = _place_in_parent(chain, value.uop)
        parent.assign(Tensor(inside).where(Tensor(full), parent))
        self.uop = _rebuild_chain(chain, parent.uop)
        _note_pending_assign(self)
        self._view_of = (parent, parent.uop, self.uop)
        _LAZY.add(self)
        return self

    def _take_own_buffer(self) -> None:
        """Make this tensor's value live in a buffer that belongs to it alone (an in-place write target).
        A pending assign is applied first, in place. Equal graphs realize to one shared buffer (two Tensor.zeros(8)
        are one node), so a tensor without a buffer of its own is copied into a fresh one."""
        if self.uop.op is Ops.ASSIGN:
            self.realize()
        if isinstance(self.device, tuple):
            self._take_own_buffers()
            return
        if not (is_buffer_view(self.uop) and self.uop.base.arg[0].owned and _claim_buffer(self)):
            own = buffer_view(Buffer(self.device, self.numel(), self.dtype, owned=True), self.shape)
            self.uop = UOp(Ops.ASSIGN, self.dtype, (own, self.uop))
            self.realize()
            _claim_buffer(self)
        self._view_of = None  # a buffer of its own: no longer a view of another tensor
        if ASSIGN_TARGETS.get(id(self)) is not self:  # (every assign: a weak dictionary's store makes a reference)
            ASSIGN_TARGETS[id(self)] = self

    def _take_own_buffers(self) -> None:
        """`_take_own_buffer` for a tensor on several devices: a buffer of its own on each, in its layout."""
        self.realize()
        parts = self.uop.src
        if not all(p.base.arg[0].owned for p in parts):
            owned = [buffer_view(Buffer(p.device, p.size, p.dtype, owned=True), p.shape) for p in parts]
            self.uop = make_multi([UOp(Ops.ASSIGN, self.dtype, (o, p)) for o, p in zip(owned, parts)], self.uop.arg)
            self.realize()
        self._view_of = None
        ASSIGN_TARGETS[id(self)] = self

    def to(self, device: str | tuple[str, ...] | DType | None, dtype: DType | None = None) -> Tensor:
        """A copy on `device`. From several devices to one, the parts are gathered; to a tuple of devices, every
        device gets a whole copy (`shard(devices)` with axis None). As PyTorch's, `t.to(dtype)` casts and
        `t.to(device, dtype)` does both."""
        if isinstance(device, DType):
            return self.cast(device)
        if dtype is not None:
            return self.to(device).cast(dtype)
        target = canonical_devices(device or Device.DEFAULT)
        if target == self.device:
            return self
        if isinstance(target, tuple) and not isinstance(self.device, tuple):
            return self.shard(target)
        return self._wrap(UOp(Ops.COPY, self.dtype, (self.uop, UOp(Ops.DEVICE, dtypes.void, (), target))))

    def cast(self, dtype: DType | str) -> Tensor:
        dt = to_dtype(dtype)
        return self if dt == self.dtype else self._wrap(self.uop.cast(dt))

    def bitcast(self, dtype: DType | str) -> Tensor:
        """The same bytes read as `dtype` (little-endian, as numpy's `.view(dtype)` of the contiguous values). To a
        dtype of another size the last dim is rescaled, as in tinygrad: float32 (..., 4) -> uint8 (..., 16), uint8
        (..., 8) -> float32 (..., 2); its bytes must divide evenly into the new items."""
        dt = to_dtype(dtype)
        if dt == self.dtype:
            return self
        if dt.itemsize == self.dtype.itemsize:  # a view (PyTorch's `view(dtype)`): an assign to it writes here
            return self._view(self.uop.bitcast(dt))
        return self._bitcast_resized(dt)

    def _bitcast_resized(self, dt: DType) -> Tensor:
        """bitcast to a dtype of another size, in integer ops every backend renders: the items become unsigned ints
        of their size, which are split into (shifts and masks) or assembled from (shifts and ORs) the new size's."""
        old, new = self.dtype.itemsize, dt.itemsize
        last = self.shape[-1] if self.ndim else None
        if last is None or not isinstance(last, int) or (last * old) % new:
            raise ShapeError(f"bitcast {self.dtype} -> {dt} changes the item size ({old} -> {new} bytes), so the last "
                             f"dim's bytes must divide into {new}-byte items; shape {self.shape} "
                             f"({'no last dim' if last is None else f'{last} x {old} bytes'}) does not")
        old_uint, new_uint = _UINT_OF_SIZE[old], _UINT_OF_SIZE[new]
        bits = self.bitcast(old_uint)
        if new < old:  # each item splits into old/new pieces, lowest bytes first
            mask = (1 << 8 * new) - 1
            pieces = [((bits >> 8 * new * i) & mask).cast(new_uint) for i in range(old // new)]
            return Tensor.stack(*pieces, dim=-1).flatten(-2).bitcast(dt)
        rate = new // old  # `rate` consecutive items make one
        grouped = bits.reshape(*self.shape[:-1], last // rate, rate).cast(new_uint)
        parts = [grouped[..., i] << 8 * old * i for i in range(rate)]
        return functools.reduce(Tensor.bitwise_or, parts).bitcast(dt)

    def _wrap(self, uop: UOp) -> Tensor:
        """A new tensor over `uop` (the one place results of ops are made)."""
        return Tensor(uop)

    def _shows(self, other: Tensor) -> bool:
        """Whether this tensor is `other` or a chain of movement-op views of it (an assign here writes into it)."""
        t: Tensor | None = self
        while t is not None and t is not other:
            t = t._view_of[0] if t._view_of is not None else None
        return t is other

    def _view(self, uop: UOp) -> Tensor:
        """A new tensor over `uop`, a movement op of this tensor's node: an assign to it writes into this tensor."""
        out = Tensor(uop)
        out._view_of = (self, self.uop, uop)
        return out

    def _same_view(self) -> Tensor:
        """A movement op that moves nothing (`reshape` to its own shape, `x[...]`): a view of this tensor, as PyTorch's,
        never `self`: a tensor means the value it had when built, so an assign to this one must not change it."""
        return self._view(self.uop)

    def _same_value(self) -> Tensor:
        """An op whose result equals its input (`sum` over no axes, `floor` of ints): a new tensor on the same node,
        never `self`, which an assign to this one must not change (it is copied first, as any reader of the old
        version), nor an assign to it change this one (a buffer is written in place by its owner only)."""
        return self._wrap(self.uop)

    # ------------------------------------------------------------------ autograd
    @locked
    def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
        """Gradients of this tensor with respect to `targets` (a scalar, unless `gradient` is given). A target must
        be a float tensor that reads memory: a bare constant (`Tensor(2.0)`, `Tensor.full`) is a node every equal
        constant shares, the scalar of `t * 2.0` included, so its gradient would mix theirs in (it was 4 for
        `(Tensor(2.0) * 2.0).gradient(that tensor)`), and so is a tensor computed from constants alone that another
        live tensor equals (`Tensor.ones(3) + 1` twice): give it a buffer first (`requires_grad=True`, `.clone()`)."""
        for t in targets:
            if not t.dtype.is_float:
                raise RuntimeError(f"gradient(): a target must be a float tensor, got {t.dtype}")
            if _is_bare_constant(t.uop) or (not _reads_a_buffer(t.uop) and _shares_a_constant_node(
                    t, (o for o in gc.get_objects() if type(o) is Tensor and hasattr(o, "uop")))):
                raise RuntimeError("gradient(): a target is computed from constants alone (Tensor(2.0), Tensor.full, "
                                   "Tensor.ones(3) + 1) and shares its node with every equal expression; make it "
                                   "with requires_grad=True or .clone() it")
        if gradient is None:
            if self.numel() != 1:
                raise RuntimeError(f"gradient of a tensor of shape {self.shape} needs `gradient=`; only scalars "
                                   "get an implicit gradient of 1")
            gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        if gradient.shape != self.shape:
            raise ValueError(f"gradient shape {gradient.shape} does not match tensor shape {self.shape}")
        root = _with_lineage(self.uop)
        return self._gradient(root, targets, _graph_nodes_of(targets, set(root.toposort())), gradient)

    def _gradient(self, root: UOp, targets: Sequence[Tensor], nodes: Sequence[UOp | None],
                  gradient: Tensor, order: list[UOp] | None = None) -> list[Tensor]:
        """`gradient()` of this tensor, whose graph with lineage substituted (`_with_lineage`) is `root`; `nodes`
        are the targets' nodes in it (`_graph_nodes_of`; None: not in the graph, a zero gradient); `order`:
        `root.toposort()` if the caller has it."""
        return [Tensor.zeros(t.shape, dtype=t.dtype, device=t.device) if g is None else g
                for t, g in zip(targets, self._reached_gradients(root, nodes, gradient, order))]

    def _reached_gradients(self, root: UOp, nodes: Sequence[UOp | None], gradient: Tensor,
                           order: list[UOp] | None = None) -> list[Tensor | None]:
        """The gradients at `nodes` (as `_gradient`), None for a node the gradient does not reach (not in the
        graph, only behind a detach() or a comparison)."""
        grads = compute_gradient(root, gradient.cast(self.dtype).uop, {u for u in nodes if u is not None}, order)
        return [None if u is None or (g := grads.get(u)) is None else Tensor(g) for u in nodes]

    @locked
    def backward(self, gradient: Tensor | None = None, retain_graph: bool | None = None,
                 create_graph: bool = False) -> Tensor:
        """Accumulate d(self)/d(t) into `t.grad` for every tensor `t` with requires_grad=True that self depends on
        differentiably (as PyTorch: one reached only through `detach()` or a comparison keeps `.grad` None, and when
        no such tensor is reached at all, backward() raises). When none of them is in the graph (where PyTorch
        raises), as tinygrad 0.14 (which has no requires_grad): every live float tensor of the computation not marked
        requires_grad=False gets its `.grad` (zeros where the gradient does not reach it, as tinygrad's), so
        `t = Tensor([1.0, 2.0]); t.sum().backward(); t.grad` works as in tinygrad.

        `retain_graph` and `create_graph` are PyTorch's keywords, accepted as what always holds here: the graph is
        lazy and stays (a second backward through it works), and each `.grad` is itself a graph that can be
        differentiated again (a gradient penalty)."""
        if gradient is None and self.numel() != 1:
            raise RuntimeError(f"backward() of a tensor of shape {self.shape} needs `gradient=`; only scalars get an "
                               "implicit gradient of 1")
        if gradient is not None and gradient.shape != self.shape:
            raise ValueError(f"backward(): gradient shape {gradient.shape} does not match tensor shape {self.shape}")
        root, order = _lineage_and_order(self.uop)  # (once: the walk is over the whole forward graph)
        candidates = [t for t in list(_REQUIRES_GRAD.values()) if t._requires_grad is not False]
        root_nodes = set(order)
        found = _in_graph(candidates, root_nodes)
        if gradient is None:
            gradient = Tensor.ones(self.shape, dtype=self.dtype, device=self.device)
        if found:  # PyTorch's rule
            # (only layers' parameters, none requiring grad yet: a tinygrad program before its optimizer exists, where
            # every float tensor of the graph gets its gradient too, a plain `self.w = Tensor.randn(3, 3)` included)
            pytorch = any(t._requires_grad for t, _ in found)
            found = _in_graph([t for t, _ in found], _attached_nodes(root, order, root_nodes))
            extra = [] if pytorch else _others_in_graph(
                _tinygrad_targets(root_nodes, self, with_layers=True), [t for t, _ in found], root_nodes)
            reached = self._reached_gradients(root, [u for _, u in found + extra], gradient, order)
            if all(g is None for g in reached):
                raise RuntimeError("backward(): the tensors with requires_grad=True in this computation are only "
                                   "reached through detach() or non-differentiable ops (comparisons, casts to int), "
                                   "so none gets a gradient (PyTorch raises here too)")
            targets = [t for t, _ in found + extra]
            # (the tinygrad rule's targets get zeros where the gradient does not reach them, as tinygrad's; their
            # gradients are not computed along with the parameters' (`_note_lazy_gradients`): the batch's, a data
            # set's gradient, would be computed at every step of a loop that never reads it, as a hand-written
            # optimizer's loop without an optimizer object (gradaccum_mnist.py) runs. Read, one is computed then.)
            _accumulate(targets, [Tensor.zeros(t.shape, dtype=t.dtype, device=t.device) if g is None and i >= len(found)
                                  else g for i, (t, g) in enumerate(zip(targets, reached))])
            _note_lazy_gradients(self, [t for t, _ in found], order)
            return self
        found = _in_graph(_tinygrad_targets(root_nodes, self), root_nodes)  # tinygrad 0.14's rule
        if not found:
            raise RuntimeError("backward(): no tensor of this computation can take a gradient (int and bool tensors "
                               "cannot, nor tensors made with requires_grad=False; and without requires_grad=True a "
                               "tensor computed from constants alone is none either when another equals it: "
                               "`Tensor.ones(n).contiguous()` made twice is one node, realized into one buffer, so "
                               "make such tensors with requires_grad=True, or from data)")
        targets = [t for t, _ in found]
        _accumulate(targets, self._gradient(root, targets, [u for _, u in found], gradient, order))
        _note_lazy_gradients(self, targets, order)
        return self

    # ------------------------------------------------------------------ creation
    @staticmethod
    @locked
    def manual_seed(seed: int = 0) -> None:
        """Start the random numbers over from `seed` (on every device): runs with one seed repeat."""
        _RNG.seed, _RNG.states, _RNG.pending = int(seed), {}, {}

    @staticmethod
    def _shape_arg(shape: tuple[Any, ...], symbolic: bool = False) -> tuple[int, ...]:
        """Validated dims; with `symbolic`, bound Variable sizes are allowed too (full, zeros, ones)."""
        dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
        for d in dims:
            if isinstance(d, UOp) and symbolic:
                _check_bound(d, "shape")
            elif isinstance(d, UOp):
                raise NotImplementedError("a Variable size is only supported by full/zeros/ones; make the tensor at "
                                          "its largest size and shrink it with the Variable")
            elif not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
                raise ValueError(f"shape must be non-negative ints, got {dims}")
        return tuple(d if isinstance(d, UOp) else int(d) for d in dims)  # type: ignore[misc]  # UOp: symbolic

    @staticmethod
    def full(shape: tuple[int, ...] | int, fill_value: Scalar, dtype: DType | str | None = None,
             device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        dims = Tensor._shape_arg((shape,) if isinstance(shape, (int, UOp)) else (tuple(shape),), symbolic=True)
        if isinstance(fill_value, (list, tuple, Tensor)) or (isinstance(fill_value, np.ndarray) and fill_value.ndim):
            raise TypeError(f"full: fill_value must be a scalar, got {type(fill_value).__name__} (to fill a tensor "
                            "from data, use Tensor(data) or assign(data))")
        t = Tensor(fill_value, device=device, dtype=dtype)
        return _needing_grad(Tensor(t.uop.reshape((1,) * len(dims)).expand(dims)), requires_grad)

    @staticmethod
    def zeros(*shape: Any, dtype: DType | str | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape, True), 0.0, dtype or dtypes.default_float, device, requires_grad)

    @staticmethod
    def ones(*shape: Any, dtype: DType | str | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        return Tensor.full(Tensor._shape_arg(shape, True), 1.0, dtype or dtypes.default_float, device, requires_grad)

    @staticmethod
    def empty(*shape: Any, dtype: DType | str | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        dims = Tensor._shape_arg(shape)
        dt = to_dtype(dtype or dtypes.default_float)
        target = canonical_devices(device or Device.DEFAULT)
        if isinstance(target, tuple):  # a whole tensor on each device
            out = Tensor(make_multi([Tensor.empty(*dims, dtype=dt, device=d).uop for d in target], None))
        else:
            out = Tensor(buffer_view(Buffer(target, prod(dims), dt, owned=True), dims))
        return _needing_grad(out, requires_grad)

    @staticmethod
    def arange(start: Scalar, stop: Scalar | None = None, step: Scalar = 1, dtype: DType | str | None = None,
               device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        if stop is None:
            start, stop = 0, start
        if isinstance(stop, UOp) and not isinstance(start, UOp) and not isinstance(step, UOp):
            return _needing_grad(Tensor._symbolic_arange(start, stop, step, dtype, device), requires_grad)
        _no_symbolic("arange (and ops built on it: argmax, one_hot, eye, cumsum, gather)", (start, stop, step))
        if step == 0:
            raise ValueError("arange step must not be zero")
        count = max(0, math.ceil((stop - start) / step))
        is_float = any(isinstance(v, float) for v in (start, stop, step))
        int_dt = max((_scalar_dtype(v) for v in (start, stop, step)), key=lambda d: d.priority)  # int64 past int32
        dt = to_dtype(dtype) if dtype is not None else (dtypes.default_float if is_float else int_dt)
        if dt.is_int and count:
            _check_fits(dt, (start, start + (count - 1) * step), "arange")
        # index i -> start + i*step, built from a cumulative count so it stays one fused kernel
        idx = _index_tensor(count, device)
        if start == 0 and step == 1:  # the index itself (`* 1 + 0` changes no value; an int index fits dt, checked)
            return _needing_grad(idx if idx.dtype is dt else idx.cast(dt), requires_grad)
        return _needing_grad((idx.cast(dt if dt.is_float else dtypes.int64) * step + start).cast(dt), requires_grad)

    @staticmethod
    def _symbolic_arange(start: Scalar, stop: UOp, step: Scalar, dtype: DType | str | None,
                         device: str | None) -> Tensor:
        """arange up to a bound Variable expression (`arange(start_pos + n)`, as a causal mask's `triu` needs): the
        arange of the largest count its Variables allow, shrunk to the symbolic count (int start and step > 0)."""
        _check_bound(stop, "arange")
        if isinstance(start, float) or isinstance(step, float) or step <= 0:
            raise NotImplementedError(f"arange to a symbolic stop needs an int start and an int step > 0, got start="
                                      f"{start}, step={step}")
        count = sint_ceildiv(sint_sub(stop, int(start)), int(step))
        if sint_min(count) < 0:
            raise ValueError(f"arange({start}, {render_sint(stop)}, {step}): the count can be negative for some "
                             "values of its Variables")
        return Tensor.arange(start, start + sint_max(count) * step, step, dtype, device).shrink(((0, count),))

    @staticmethod
    def linspace(start: Scalar, stop: Scalar, steps: int, dtype: DType | str | None = None,
                 device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        if steps < 0:
            raise ValueError(f"linspace needs steps >= 0, got {steps}")
        dt = to_dtype(dtype or dtypes.default_float)
        if dt.is_bool:
            raise ArgumentError("linspace cannot make a bool tensor: pass an int or float dtype")
        if steps == 1:
            return Tensor.full((1,), start, dt, device, requires_grad)
        idx = _index_tensor(steps, device).cast(dtypes.float64 if dt == dtypes.float64 else dtypes.float32)
        return _needing_grad((idx * ((stop - start) / (steps - 1)) + start).cast(dt), requires_grad)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: DType | str | None = None, device: str | None = None,
            requires_grad: bool | None = None) -> Tensor:
        m = n if m is None else m
        rows = _index_tensor(n, device).reshape(n, 1)
        cols = _index_tensor(m, device).reshape(1, m)
        return _needing_grad((rows == cols).cast(dtype or dtypes.default_float), requires_grad)

    @staticmethod
    def _from_host(array: np.ndarray, dtype: DType | str | None, device: str | None,
                   requires_grad: bool | None) -> Tensor:
        dt = to_dtype(dtype or dtypes.default_float)
        return Tensor(array.astype(np.float32) if dt == dtypes.bfloat16 else array.astype(dt.np),
                      device=device, dtype=dt, requires_grad=requires_grad)

    @staticmethod
    def rand(*shape: Any, dtype: DType | str | None = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        """Uniform in [0, 1), drawn on the device (see `_RNG`, `manual_seed`): k / 2**m for m random bits, m as many
        as the dtype's significand holds (24; 11 for float16, 8 for bfloat16), so rounding never gives 1.0."""
        dims = Tensor._shape_arg(shape)
        dev = canonical_devices(device or Device.DEFAULT)
        if isinstance(dev, tuple):  # drawn on the first device, the same numbers on every one
            return Tensor.rand(*dims, dtype=dtype, device=dev[0], requires_grad=requires_grad).to(dev)
        m = _SIGNIFICAND_BITS.get(to_dtype(dtype or dtypes.default_float), 24)
        bits = _RNG.bits(prod(dims), dev)
        out = ((bits >> (32 - m)).cast(dtypes.float32) * (1.0 / (1 << m))).reshape(dims)
        return Tensor._random_result(out, dtype, requires_grad)

    @staticmethod
    def _random_result(values: Tensor, dtype: DType | str | None, requires_grad: bool | None) -> Tensor:
        out = Tensor(values.cast(to_dtype(dtype or dtypes.default_float)).uop)  # not a view of the drawn bits
        return _needing_grad(out, requires_grad)

    @staticmethod
    def randn(*shape: Any, dtype: DType | str | None = None, device: str | None = None,
              requires_grad: bool | None = None) -> Tensor:
        """Standard normal (Box-Muller on two uniforms), drawn on the device."""
        dims = Tensor._shape_arg(shape)
        u = Tensor.rand(2, *dims, device=device)
        values = (-2.0 * (1.0 - u[0]).log()).sqrt() * (u[1] * (2 * math.pi)).cos()
        return Tensor._random_result(values, dtype, requires_grad)

    @staticmethod
    def randint(*shape: Any, low: int = 0, high: int = 10, dtype: DType | str | None = None,
                device: str | None = None) -> Tensor:
        """Integers in [low, high), drawn on the device."""
        if not all(isinstance(b, (int, np.integer)) for b in (low, high)):  # (a float bound was silently truncated)
            raise TypeError(f"randint bounds must be ints, got low={low!r}, high={high!r}")
        if high <= low:
            raise ValueError(f"randint needs low < high, got low={low}, high={high}")
        if high - low > 1 << 32:
            raise ValueError(f"randint: the range [{low}, {high}) is wider than 2**32")
        dims = Tensor._shape_arg(shape)
        dev = canonical_devices(device or Device.DEFAULT)
        if isinstance(dev, tuple):  # drawn on the first device, the same numbers on every one
            return Tensor.randint(*dims, low=low, high=high, dtype=dtype, device=dev[0]).to(dev)
        bits = _RNG.bits(prod(dims), dev).cast(dtypes.uint64)
        span = Tensor(high - low, dtype=dtypes.uint64, device=dev)
        values = (bits % span).cast(dtypes.int64) + low
        return Tensor._random_result(values.reshape(dims), dtype or dtypes.int32, None)

    @staticmethod
    def uniform(*shape: Any, low: float = 0.0, high: float = 1.0, dtype: DType | str | None = None,
                device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        """Values in [low, high). For an int dtype, each integer of [low, high) equally likely: the draw is floored
        (a cast after adding a negative `low` truncated toward 0, so 0 came twice as often and `low` never)."""
        if low > high:
            raise ValueError(f"uniform needs low <= high, got low={low}, high={high}")
        dt = to_dtype(dtype) if dtype is not None else None
        if dt is not None and not dt.is_float:
            base = math.floor(low)  # floor(x) = floor(x - base) + base, and x - base >= 0 casts by flooring
            values = (Tensor.rand(*shape, device=device) * (high - low) + (low - base)).cast(dt) + base
        else:
            values = Tensor.rand(*shape, device=device) * (high - low) + low
        return Tensor._random_result(values, dtype, requires_grad)

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, dtype: DType | str | None = None,
               device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        if std < 0:
            raise ValueError(f"normal needs std >= 0, got {std}")
        values = Tensor.randn(*shape, device=device) * std + mean
        return Tensor._random_result(values, dtype, requires_grad)

    # the *_like constructors take what the plain ones take (tinygrad's and PyTorch's keywords), this tensor's shape,
    # and its dtype and device unless told otherwise
    def full_like(self, fill_value: Scalar, dtype: DType | str | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return Tensor.full(self.shape, fill_value, dtype or self.dtype, device or self.device, requires_grad)

    def zeros_like(self, dtype: DType | str | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return self.full_like(0, dtype, device, requires_grad)

    def ones_like(self, dtype: DType | str | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return self.full_like(1, dtype, device, requires_grad)

    def rand_like(self, dtype: DType | str | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        return Tensor.rand(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                           requires_grad=requires_grad)

    def randn_like(self, dtype: DType | str | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        return Tensor.randn(self.shape, dtype=dtype or self.dtype, device=device or self.device,
                            requires_grad=requires_grad)

    # ------------------------------------------------------------------ elementwise primitives
    def _scalar_operand(self, x: Scalar) -> UOp:
        """A Python scalar as a node of this tensor's shape, with PyTorch's scalar promotion rules for its dtype."""
        uop = self.uop
        if isinstance(x, float):  # (the most common case first: `x * 0.5`)
            dt = uop.dtype if uop.dtype.is_float else dtypes.default_float
        elif isinstance(x, bool):
            dt = uop.dtype
        elif isinstance(x, int):
            dt = _scalar_dtype(x) if uop.dtype.is_bool else uop.dtype
        elif isinstance(x, UOp):  # a symbolic int (a bound Variable expression), e.g. the count in a symbolic mean
            _check_bound(x, "scalar")
            dt = self.dtype if self.dtype.is_float else dtypes.int32
            node = UOp(Ops.CONST, dt, (UOp(Ops.DEVICE, dtypes.void, (), self.device),), as_sint(x))
            return node.reshape((1,) * self.ndim).expand(self.shape)
        else:
            raise TypeError(f"cannot combine a tensor with {type(x).__name__} {x!r}{_method_hint(x)}")
        return _scalar_node(dt, uop.device, uop.shape, x, _arg_key(x))

    def _broadcasted(self, other: Tensor | Scalar, reverse: bool = False,
                     match_dtype: bool = True) -> tuple[Tensor, Tensor]:
        x = self
        if isinstance(other, Tensor):
            y = other
            if x.device != y.device:
                raise RuntimeError(f"tensors are on different devices: {x.device} and {y.device}; move one with .to()")
            if x.shape != y.shape:
                shape = _broadcast_shape(x.shape, y.shape)
                x, y = x._broadcast_to(shape), y._broadcast_to(shape)
        elif isinstance(other, np.generic):
            # a numpy scalar is a Python scalar, as in PyTorch (and tinygrad, for np.float64): `x / np.sqrt(d)`
            # keeps x's float32 (as a float64 tensor it made the whole graph float64); an array, 0-d too, is a tensor
            return self._broadcasted(other.item(), reverse, match_dtype)
        elif isinstance(other, np.ndarray):
            return self._broadcasted(Tensor(other, device=self.device), reverse, match_dtype)
        else:
            y = Tensor(self._scalar_operand(other))
        if match_dtype and x.dtype != y.dtype:
            out = least_upper_dtype(x.dtype, y.dtype)
            x, y = x.cast(out), y.cast(out)
        return (y, x) if reverse else (x, y)

    def _unary(self, op: Ops) -> Tensor:
        return self._wrap(UOp(op, self.dtype, (self.uop,)))

    def _binary(self, op: Ops, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """`self op other`. When nothing is to broadcast or cast (a tensor of the same shape, dtype and device, or a
        Python scalar whose constant takes self's dtype: most lazy ops), the node is made here, without the general
        path's checks and intermediate Tensors; `_binary_general` makes the same node."""
        # (`_operand`'s tests, inline: this is the most common op of all)
        a, b = self.uop, None
        if isinstance(other, Tensor):
            if other.uop.dtype is a.dtype and other.uop.shape == a.shape and other.uop.device == a.device:
                b = other.uop
        elif type(other) is float and other and other == other and a.dtype.is_float:  # `x * 0.5`: see `_operand`
            b = _scalar_node(a.dtype, a.device, a.shape, other, other)
        else:
            b = self._operand(other)
        if b is None:
            return self._binary_general(op, other, reverse)
        return Tensor(UOp(op, dtypes.bool if op in GroupOp.Comparison else a.dtype, (b, a) if reverse else (a, b)))

    def _operand(self, other: Tensor | Scalar) -> UOp | None:
        """`other`'s node when it combines with this tensor as it is: a tensor of the same shape, dtype and device,
        or a Python scalar whose constant takes this dtype (`_broadcasted` would change neither). Else None."""
        a = self.uop
        if isinstance(other, Tensor):
            b = other.uop
            return b if b.dtype is a.dtype and b.shape == a.shape and b.device == a.device else None
        kind = type(other)
        if kind is float and other and other == other and a.dtype.is_float:  # `x * 0.5`, the most common
            # case: its constant node is cached by value (no ±0.0 or NaN here, whose cache key is their bits)
            return _scalar_node(a.dtype, a.device, a.shape, other, other)
        if kind is int and not a.dtype.is_bool:  # `x < 0`, `t + 1`: an int takes the tensor's dtype (an int is its
            return _scalar_node(a.dtype, a.device, a.shape, other, other)  # own key), as `_scalar_operand` gives it
        if isinstance(other, np.ndarray):
            return None
        const = self._scalar_operand(other.item() if isinstance(other, np.generic) else other)  # (see `_broadcasted`)
        return const if const.dtype is a.dtype else None

    def _binary_general(self, op: Ops, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """`_binary` through `_broadcasted` (device check, broadcasting, dtype promotion), for any operands."""
        x, y = self._broadcasted(other, reverse)
        return x._wrap(x.uop.alu(op, y.uop))

    def _float(self) -> Tensor:
        """Ints and bools become the default float; floats stay as they are."""
        return self if self.dtype.is_float else self.cast(dtypes.default_float)

    def add(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(OP_ADD, x, reverse)  # noqa
    def mul(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(OP_MUL, x, reverse)  # noqa

    def sub(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        dtype = self.uop.dtype
        if not dtype.is_bool and (other := self._operand(x)) is not None:  # (`_sub_general`'s nodes, made directly)
            a, b = (other, self.uop) if reverse else (self.uop, other)
            return Tensor(UOp(OP_ADD, dtype, (a, UOp(OP_NEG, dtype, (b,)))))
        return self._sub_general(x, reverse)

    def _sub_general(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            raise TypeError("subtracting bool tensors is not supported; use ^ or logical_not instead")
        return a + (-b)

    def div(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (ints become floats); rounding_mode 'trunc' or 'floor' as in PyTorch."""
        dtype = self.uop.dtype
        if rounding_mode is None and dtype.is_float and (other := self._operand(x)) is not None:
            # (`_div_general`'s node, made directly: floats of one dtype and shape)
            return Tensor(UOp(Ops.FDIV, dtype, (other, self.uop) if reverse else (self.uop, other)))
        return self._div_general(x, reverse, rounding_mode)

    def _div_general(self, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if rounding_mode is None:
            a, b = a._float(), b._float()
            return a._wrap(a.uop.alu(Ops.FDIV, b.uop))
        if rounding_mode == "trunc":
            return a._wrap(a.uop.alu(Ops.IDIV, b.uop)) if not a.dtype.is_float else a.div(b).trunc()
        if rounding_mode == "floor":
            return a.floordiv(b)
        raise ArgumentError(f"rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    def floordiv(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Floor division like numpy's `//`: rounds toward minus infinity."""
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:
            return a._float_floordiv(b)
        if a.dtype.is_bool:
            a, b = a.cast(dtypes.int32), b.cast(dtypes.int32)
        q = a._wrap(a.uop.alu(Ops.IDIV, b.uop))
        if a.dtype.is_unsigned:
            return q
        remainder = a._wrap(a.uop.alu(Ops.MOD, b.uop))
        adjust = (remainder != 0) & ((a < 0) != (b < 0))
        return adjust.where(q - 1, q)

    def _float_floordiv(self, b: Tensor) -> Tensor:
        """Python's/numpy's/PyTorch's float floor division: from the exact remainder, not floor(a / b), whose rounded
        quotient is off by one near multiples (1.0 // 0.1 is 9.0, but 1.0 / 0.1 rounds to 10.0). b == 0 gives a / b."""
        a = self
        rem = a._wrap(a.uop.alu(Ops.MOD, b.uop))  # C fmod: exact, with the sign of a
        q = (a - rem) / b  # close to an integer
        q = ((rem != 0) & ((b < 0) != (rem < 0))).where(q - 1, q)
        floor = q.floor()
        floor = (q - floor > 0.5).where(floor + 1, floor)
        return (b == 0).where(a / b, floor)

    def mod(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """Remainder with the sign of the divisor, like numpy's `%`."""
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_bool:
            a, b = a.cast(dtypes.int32), b.cast(dtypes.int32)
        r = a._wrap(a.uop.alu(Ops.MOD, b.uop))
        if a.dtype.is_unsigned:
            return r
        return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)

    def pow(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        """self ** x. An int tensor to a float power is float; to a negative int constant is an error (as in
        PyTorch and tinygrad: the answer is not an int)."""
        if not reverse and isinstance(x, (int, float)) and not isinstance(x, bool):
            if x == 2 and (isinstance(x, int) or self.dtype.is_float):
                return self * self
            if isinstance(x, int) and x < 0 and not self.dtype.is_float:
                raise ArgumentError(f"an int tensor ({self.dtype}) to a negative int power ({x}) is not an int; "
                                    "cast the tensor to a float dtype first")
        a, b = self._broadcasted(x, reverse)
        if not a.dtype.is_float:
            if (b.dtype.is_int and a.dtype.is_int) or a.dtype.is_bool:
                return a._int_pow(b)
        return a._wrap(a.uop.alu(Ops.POW, b.uop))

    def _int_pow(self, exponent: Tensor) -> Tensor:
        """Integer power by repeated squaring over the bits of the exponent (negative exponents give 0, or 1 for 1)."""
        result = self.ones_like()
        base = self
        e = exponent
        bits = 8 * e.dtype.itemsize
        for _ in range(bits - (0 if e.dtype.is_unsigned else 1)):
            result = ((e % 2) == 1).where(result * base, result)
            base = base * base
            e = e // 2
        return (exponent < 0).where((self == 1).where(1, (self == -1).where(1 - 2 * (exponent % 2), 0)).cast(
            self.dtype), result)

    def maximum(self, x: Tensor | Scalar) -> Tensor:
        return self._binary(Ops.MAX, x)

    def minimum(self, x: Tensor | Scalar) -> Tensor:
        a, b = self._broadcasted(x)
        if not a.dtype.is_float:  # not -max(-a, -b): negating INT_MIN overflows
            return (a < b).where(a, b)
        return -((-a).maximum(-b))

    def clip(self, min_: Scalar | Tensor | None = None, max_: Scalar | Tensor | None = None, *,
             min: Scalar | Tensor | None = None, max: Scalar | Tensor | None = None) -> Tensor:  # noqa: A002
        """Limit to [min_, max_] (max_ wins if min_ > max_; NaN stays NaN). Built from `where`, so at a bound the
        gradient goes to self, as in PyTorch (maximum/minimum would split it). `min=`/`max=`: PyTorch's keywords."""
        if min is not None or max is not None:
            if min_ is not None or max_ is not None:
                raise ArgumentError("clip: give the bounds as min_/max_ (tinygrad) or min/max (PyTorch), not both")
            min_, max_ = min, max
        if min_ is None and max_ is None:
            raise ArgumentError("clip needs at least one of min_ or max_")
        out = self if min_ is None else (self < min_).where(min_, self)
        return out if max_ is None else (out > max_).where(max_, out)

    clamp = clip

    def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """`cond.where(x, y)`: x where this (bool) tensor is true, else y. All three broadcast."""
        if (node := self._where_node(x, y)) is not None:
            return Tensor(node)
        return self._where_general(x, y)

    def _where_node(self, x: Tensor | Scalar, y: Tensor | Scalar) -> UOp | None:
        """`where`'s node made directly when `_where_general` would change none of the operands: a bool condition,
        and x and y of its shape, one of them a tensor and the other a tensor of the same dtype and device or a
        scalar whose constant takes that dtype (`_operand`). Else None. (relu, clamps and masks: every step)"""
        c = self.uop
        if c.dtype is not dtypes.bool:
            return None
        a: UOp | None
        if isinstance(x, Tensor):
            a = x.uop
            b = x._operand(y) if a.shape == c.shape else None
        elif isinstance(y, Tensor) and y.uop.shape == c.shape:
            a, b = y._operand(x), y.uop
        else:
            return None
        return None if a is None or b is None else UOp(Ops.WHERE, a.dtype, (c, a, b))

    def _where_general(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
        """`where` through `_broadcasted` (casts, broadcasting, dtype promotion), for any operands."""
        cond = self if self.dtype.is_bool else self.cast(dtypes.bool)
        if isinstance(x, Tensor) and isinstance(y, Tensor):
            x, y = x._broadcasted(y)
        elif isinstance(x, Tensor):
            x, y = x._broadcasted(y)
        elif isinstance(y, Tensor):
            y, x = y._broadcasted(x)
        else:  # (a numpy scalar is a Python scalar, as in `_broadcasted`)
            x, y = Tensor(x.item() if isinstance(x, np.generic) else x, device=self.device)._broadcasted(y)
        shape = _broadcast_shape(cond.shape, x.shape)
        cond, x, y = cond._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape)
        return x._wrap(cond.uop.where(x.uop, y.uop))

    # comparisons
    def __lt__(self, x: Tensor | Scalar) -> Tensor: return self._binary(Ops.CMPLT, x)  # type: ignore[override]  # noqa
    def __gt__(self, x: Tensor | Scalar) -> Tensor: return self._binary(Ops.CMPLT, x, reverse=True)  # type: ignore  # noqa
    def __eq__(self, x: Tensor | Scalar) -> Tensor: return self._binary(Ops.CMPEQ, x)  # type: ignore[override]  # noqa
    def __ne__(self, x: Tensor | Scalar) -> Tensor: return self._binary(Ops.CMPNE, x)  # type: ignore[override]  # noqa
    def __le__(self, x: Tensor | Scalar) -> Tensor: return (self < x) | (self == x)  # noqa: E704
    def __ge__(self, x: Tensor | Scalar) -> Tensor: return (self > x) | (self == x)  # noqa: E704

    # logical and bitwise
    def _bitwise(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        dtype = self.uop.dtype
        if not dtype.is_float and (other := self._operand(x)) is not None:  # (`_bitwise_general`'s node, directly)
            return Tensor(UOp(op, dtype, (other, self.uop) if reverse else (self.uop, other)))
        return self._bitwise_general(op, x, reverse)

    def _bitwise_general(self, op: Ops, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        a, b = self._broadcasted(x, reverse)
        if a.dtype.is_float:
            raise DTypeError(f"{op.name.lower()} needs int or bool tensors, got {a.dtype}")
        return a._wrap(a.uop.alu(op, b.uop))

    def bitwise_and(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.AND, x, reverse)

    def bitwise_or(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.OR, x, reverse)

    def bitwise_xor(self, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
        return self._bitwise(Ops.XOR, x, reverse)

    def bitwise_not(self) -> Tensor:
        if self.dtype.is_float:
            raise DTypeError(f"bitwise_not needs int or bool tensors, got {self.dtype}")
        return self.logical_not() if self.dtype.is_bool else self ^ -1 if not self.dtype.is_unsigned else \
            self ^ int(self.dtype.max)

    def logical_not(self) -> Tensor:
        return self == 0 if not self.dtype.is_bool else self != True  # noqa: E712

    def lshift(self, x: int | Tensor, reverse: bool = False) -> Tensor: return self._bitwise(Ops.SHL, x, reverse)  # noqa
    def rshift(self, x: int | Tensor, reverse: bool = False) -> Tensor: return self._bitwise(Ops.SHR, x, reverse)  # noqa

    # ------------------------------------------------------------------ unary math
    def neg(self) -> Tensor:
        if self.dtype.is_bool:
            return self.logical_not()
        return self._unary(Ops.NEG)

    def reciprocal(self) -> Tensor: return self._float()._unary(Ops.RECIP)  # noqa: E704
    def sqrt(self) -> Tensor: return self._float()._unary(Ops.SQRT)  # noqa: E704
    def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()  # noqa: E704
    def exp2(self) -> Tensor: return self._float()._unary(Ops.EXP2)  # noqa: E704
    def log2(self) -> Tensor: return self._float()._unary(Ops.LOG2)  # noqa: E704
    def sin(self) -> Tensor: return self._float()._unary(Ops.SIN)  # noqa: E704

    # exp, log, cos and tan are several ops: for float16/bfloat16 they run in float32 and round once (as tinygrad's
    # and PyTorch's): exp's scaled argument rounded to bfloat16 made exp(20) 1.7% off and exp(88.5) inf
    @computed_in_float32
    def exp(self) -> Tensor: return (self._float() * (1 / math.log(2))).exp2()  # noqa: E704

    @computed_in_float32
    def log(self) -> Tensor: return self.log2() * math.log(2)  # noqa: E704

    @computed_in_float32
    def cos(self) -> Tensor:
        """1 - 2 sin(x/2)^2: x/2 is exact, so a large x keeps its phase (sin(pi/2 - x) lost it in the rounding of
        pi/2 - x: cos(1e4) was 1.5e-4 off, cos(1e20) any number)."""
        s = (self._float() * 0.5).sin()
        return 1 - 2 * (s * s)

    @computed_in_float32
    def tan(self) -> Tensor: return self.sin() / self.cos()  # noqa: E704

    def trunc(self) -> Tensor:
        return self._unary(Ops.TRUNC) if self.dtype.is_float else self._same_value()

    def floor(self) -> Tensor:
        if not self.dtype.is_float:
            return self._same_value()
        t = self.trunc()
        return (self < t).where(t - 1, t)

    def ceil(self) -> Tensor:
        if not self.dtype.is_float:
            return self._same_value()
        t = self.trunc()
        return (self > t).where(t + 1, t)

    def round(self) -> Tensor:
        """Round half to even, like numpy and PyTorch."""
        if not self.dtype.is_float:
            return self._same_value()
        f = self.floor()
        diff = self - f
        f_is_even = (f - (f * 0.5).floor() * 2) == 0
        return (diff > 0.5).where(f + 1, (diff < 0.5).where(f, f_is_even.where(f, f + 1)))

    def abs(self) -> Tensor:
        if self.dtype.is_unsigned or self.dtype.is_bool:
            return self._same_value()
        return self.maximum(-self)

    def sign(self) -> Tensor:
        if self.dtype.is_bool:
            return self._same_value()
        positive, negative = (self > 0).cast(self.dtype), (self < 0).cast(self.dtype)
        out = positive - negative if not self.dtype.is_unsigned else positive
        return (self != self).where(self, out) if self.dtype.is_float else out

    def square(self) -> Tensor: return self * self  # noqa: E704

    # activations
    def relu(self) -> Tensor: return (self <= 0).where(0, self)  # noqa: E704
    def relu6(self) -> Tensor: return (self >= 6).where(6, self.relu())  # noqa: E704  (gradient 0 at 0 and 6)

    @computed_in_float32
    def sigmoid(self) -> Tensor:
        """1/(1+e^-x) for x >= 0 and e^x/(1+e^x) below, both from z = e^-|x| <= 1: no inf anywhere, so the gradient
        of a saturated sigmoid is 0, not NaN (inf*0)."""
        x = self._float()
        positive = x >= 0
        z = positive.where(-x, x).exp()  # e^-|x|, with d/dx = -sign(x) z (|x| itself has no useful gradient at 0)
        r = (1 + z).reciprocal()
        return positive.where(r, z * r)

    @computed_in_float32
    def tanh(self) -> Tensor:
        """2*sigmoid(2x) - 1, except near 0, where that cancels (in float32 tanh(1e-6) would be 7% off): there an odd
        Taylor polynomial, exact to the dtype's precision below the switch point (0.25; 1e-3 for float64)."""
        x = self._float()
        switch = 1e-3 if x.dtype == dtypes.float64 else 0.25
        near_zero = x.abs() < switch
        small = near_zero.where(x, 0.0)  # the series never sees a big x (x^9 overflows, and inf*0 would be NaN)
        s2 = small * small
        series = small * (1 + s2 * (-1 / 3 + s2 * (2 / 15 + s2 * (-17 / 315 + s2 * (62 / 2835)))))
        return near_zero.where(series, 2.0 * (2.0 * x).sigmoid() - 1.0)

    @computed_in_float32
    def silu(self) -> Tensor: return self * self.sigmoid()  # noqa: E704
    swish = silu

    def leaky_relu(self, neg_slope: float = 0.01) -> Tensor:
        return (self > 0).where(self, self * neg_slope)

    @computed_in_float32
    def elu(self, alpha: float = 1.0) -> Tensor:
        positive = self > 0
        return positive.where(self, alpha * (positive.where(0.0, self._float()).exp() - 1))  # exp never overflows

    @computed_in_float32
    def gelu(self, approximate: str = "tanh") -> Tensor:
        """approximate="tanh" (the default, as tinygrad's): PyTorch's gelu(x, approximate='tanh');
        approximate="none": the exact x * Phi(x) = x/2 * (1 + erf(x / sqrt 2)), PyTorch's default."""
        x = self._float()
        if approximate == "none":
            from glassgrad.special import _erf
            return 0.5 * x * (1 + _erf(x * (1 / math.sqrt(2))))
        if approximate != "tanh":
            raise ArgumentError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())

    @computed_in_float32
    def quick_gelu(self) -> Tensor: return self * (self * 1.702).sigmoid()  # noqa: E704

    @computed_in_float32
    def softplus(self, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
        """log(1 + exp(beta*x)) / beta, and x itself above `threshold` (PyTorch's definition)."""
        scaled = self._float() * beta
        # clip, not minimum: at x*beta == threshold minimum would give half the gradient to the constant
        return (scaled > threshold).where(self, (1 + scaled.clip(None, threshold).exp()).log() / beta)

    def logical_and(self, x: Tensor) -> Tensor: return self.bool() & x.bool()  # noqa: E704
    def logical_or(self, x: Tensor) -> Tensor: return self.bool() | x.bool()  # noqa: E704

    # ------------------------------------------------------------------ operators
    def __neg__(self) -> Tensor: return self.neg()  # noqa: E704
    # (+ and * name their ops by module constants: `Ops.X` is a slow read, see uop/ops.py)
    def __add__(self, x: Tensor | Scalar) -> Tensor: return self._binary(OP_ADD, x)  # noqa: E704
    def __radd__(self, x: Tensor | Scalar) -> Tensor: return self.add(x, True)  # noqa: E704
    def __sub__(self, x: Tensor | Scalar) -> Tensor: return self.sub(x)  # noqa: E704
    def __rsub__(self, x: Tensor | Scalar) -> Tensor: return self.sub(x, True)  # noqa: E704
    def __mul__(self, x: Tensor | Scalar) -> Tensor: return self._binary(OP_MUL, x)  # noqa: E704
    def __rmul__(self, x: Tensor | Scalar) -> Tensor: return self.mul(x, True)  # noqa: E704
    def __truediv__(self, x: Tensor | Scalar) -> Tensor: return self.div(x)  # noqa: E704
    def __rtruediv__(self, x: Tensor | Scalar) -> Tensor: return self.div(x, True)  # noqa: E704
    def __floordiv__(self, x: Tensor | Scalar) -> Tensor: return self.floordiv(x)  # noqa: E704
    def __rfloordiv__(self, x: Tensor | Scalar) -> Tensor: return self.floordiv(x, True)  # noqa: E704
    def __mod__(self, x: Tensor | Scalar) -> Tensor: return self.mod(x)  # noqa: E704
    def __rmod__(self, x: Tensor | Scalar) -> Tensor: return self.mod(x, True)  # noqa: E704
    def __pow__(self, x: Tensor | Scalar) -> Tensor: return self.pow(x)  # noqa: E704
    def __rpow__(self, x: Tensor | Scalar) -> Tensor: return self.pow(x, True)  # noqa: E704
    def __matmul__(self, x: Tensor) -> Tensor: return self.matmul(x)  # noqa: E704
    def __rmatmul__(self, x: Tensor | np.ndarray) -> Tensor:  # (`np_array @ t`: numpy defers to this)
        return (x if isinstance(x, Tensor) else Tensor(x, device=self.device)).matmul(self)
    def __and__(self, x: Tensor | Scalar) -> Tensor: return self._bitwise(Ops.AND, x)  # noqa: E704
    def __rand__(self, x: Tensor | Scalar) -> Tensor: return self._bitwise(Ops.AND, x, True)  # noqa: E704
    def __or__(self, x: Tensor | Scalar) -> Tensor: return self._bitwise(Ops.OR, x)  # noqa: E704
    def __ror__(self, x: Tensor | Scalar) -> Tensor: return self._bitwise(Ops.OR, x, True)  # noqa: E704
    def __xor__(self, x: Tensor | Scalar) -> Tensor: return self._bitwise(Ops.XOR, x)  # noqa: E704
    def __rxor__(self, x: Tensor | Scalar) -> Tensor: return self._bitwise(Ops.XOR, x, True)  # noqa: E704
    def __invert__(self) -> Tensor: return self.bitwise_not()  # noqa: E704
    def __lshift__(self, x: int | Tensor) -> Tensor: return self.lshift(x)  # noqa: E704
    def __rshift__(self, x: int | Tensor) -> Tensor: return self.rshift(x)  # noqa: E704
    def __rlshift__(self, x: int | Tensor) -> Tensor: return self.lshift(x, True)  # noqa: E704
    def __rrshift__(self, x: int | Tensor) -> Tensor: return self.rshift(x, True)  # noqa: E704
    def __abs__(self) -> Tensor: return self.abs()  # noqa: E704
    def __iadd__(self, x: Tensor | Scalar) -> Tensor: return self._inplace(self + x)  # noqa: E704
    def __isub__(self, x: Tensor | Scalar) -> Tensor: return self._inplace(self - x)  # noqa: E704
    def __imul__(self, x: Tensor | Scalar) -> Tensor: return self._inplace(self * x)  # noqa: E704
    def __itruediv__(self, x: Tensor | Scalar) -> Tensor: return self._inplace(self / x)  # noqa: E704

    def _inplace(self, result: Tensor) -> Tensor:
        """`x += y` and the like write into x's own buffer (`assign`), as tinygrad's and PyTorch's in-place ops do:
        a TinyJit replays the write (rebinding x to a new graph was captured as a kernel reading x's buffer as it was
        at the capture, so state updated with `*=` in a jitted step froze), and `v += 1` on a view `v = x[1:3]`
        writes x."""
        if result.shape != self.shape:
            raise ValueError(f"in-place op would change shape {self.shape} to {result.shape}")
        return self.assign(result)

    # ------------------------------------------------------------------ movement
    def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
        own = self.uop.shape
        if own == shape:
            return self
        padded = (1,) * (len(shape) - len(own)) + own
        if len(padded) != len(shape) or any(s not in (1, t) for s, t in zip(padded, shape)):
            raise ShapeError(f"cannot broadcast shape {own} to {shape}")
        return self._view(self.uop.reshape(padded).expand(shape))

    def reshape(self, shape: Any, *args: Any) -> Tensor:
        """`reshape((2, 3))`, `reshape(2, 3)` or `reshape(shape=(2, 3))`; one -1 is inferred, None keeps the dim."""
        dims = shape_args(shape, args)
        own = self.uop.shape
        # (the common call, every dim a plain int of a concrete shape: none of the checks below can fail)
        if type(numel := prod(own)) is int and all(type(d) is int and d >= 0 for d in dims) and prod(dims) == numel:
            return self._same_view() if dims == own else self._view(self.uop.reshape(dims))
        dims = tuple(own[i] if d is None else d for i, d in enumerate(dims))
        numel = self.numel()
        if isinstance(numel, UOp):
            return self._symbolic_reshape(dims)
        if any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) for d in dims):
            if any(isinstance(d, UOp) for d in dims):
                return self._symbolic_reshape(dims)
            raise TypeError(f"reshape needs int dimensions, got {dims}")
        if sum(1 for d in dims if d == -1) > 1:
            raise ShapeError(f"reshape: only one dimension can be -1, got {dims}")
        if any(d < -1 for d in dims):
            raise ShapeError(f"reshape: negative dimension in {dims}")
        if -1 in dims:
            known = prod(d for d in dims if d != -1)
            if known == 0 or numel % known:
                raise ShapeError(f"cannot reshape tensor of shape {self.shape} into {dims}")
            dims = tuple(numel // known if d == -1 else d for d in dims)
        dims = tuple(int(d) for d in dims)
        if prod(dims) != numel:
            raise ShapeError(f"cannot reshape tensor of shape {self.shape} ({numel} elements) into {dims}")
        return self._same_view() if dims == self.shape else self._view(self.uop.reshape(dims))

    view = reshape

    def _symbolic_reshape(self, dims: tuple[Any, ...]) -> Tensor:
        """reshape where a dimension is a bound Variable expression: the sizes must be equal for every value."""
        for d in dims:
            if isinstance(d, UOp):
                _check_bound(d, "reshape")
            elif not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
                raise ValueError(f"reshape of a symbolic shape needs non-negative int or Variable dimensions (no -1), "
                                 f"got {tuple(render_sint(x) if isinstance(x, UOp) else x for x in dims)}")
        dims = tuple(as_sint(d) if isinstance(d, UOp) else int(d) for d in dims)
        if sint_min(sint_sub(sint_prod(dims), self.numel())) != 0 or sint_min(sint_sub(self.numel(),
                                                                                      sint_prod(dims))) != 0:
            raise ShapeError(f"cannot reshape symbolic shape ({', '.join(render_sint(d) for d in self.shape)}) into "
                             f"({', '.join(render_sint(d) for d in dims)}): the sizes differ for some variable values")
        return self._same_view() if dims == self.shape else self._view(self.uop.reshape(dims))

    def expand(self, shape: Any, *args: Any) -> Tensor:
        dims = shape_args(shape, args)
        if len(dims) < self.ndim:
            raise ShapeError(f"expand: target {dims} has fewer dimensions than the tensor's shape {self.shape}")
        padded = (1,) * (len(dims) - self.ndim) + self.shape
        dims = tuple(s if d == -1 else d for s, d in zip(padded, dims))
        return self._same_view() if dims == self.shape else self._broadcast_to(dims)

    def permute(self, order: Any, *args: Any) -> Tensor:
        axes = shape_args(order, args)
        norm = tuple(normalize_axis(a, self.ndim) for a in axes)
        if sorted(norm) != list(range(self.ndim)):
            raise ShapeError(f"permute order {axes} is not a permutation of the {self.ndim} dimensions")
        return self._view(self.uop.permute(norm))

    def transpose(self, dim0: int = 1, dim1: int = 0) -> Tensor:
        order = list(range(self.ndim))
        a, b = normalize_axis(dim0, self.ndim), normalize_axis(dim1, self.ndim)
        order[a], order[b] = order[b], order[a]
        return self.permute(order)

    @property
    def T(self) -> Tensor:
        return self.permute(tuple(range(self.ndim))[::-1])

    def flip(self, axis: AxisArg = None, *args: int) -> Tensor:
        axes = self._resolve_axes(shape_args(axis, args) if args else axis)
        return self._view(self.uop.flip(tuple(i in axes for i in range(self.ndim))))

    def shrink(self, bounds: Sequence[tuple[sint, sint] | None]) -> Tensor:
        """Keep [start, end) of each dimension (None keeps it all). Bounds may be bound Variables (`(0, v)`)."""
        if len(bounds) != self.ndim:
            raise ShapeError(f"shrink needs one (start, end) per dimension ({self.ndim}), got {bounds}")
        full = tuple((0, s) if b is None else (_shrink_bound(b[0]), _shrink_bound(b[1])) for b, s in
                     zip(bounds, self.shape))
        for (b, e), s in zip(full, self.shape):
            if isinstance(b, int) and isinstance(e, int) and isinstance(s, int):
                if not 0 <= b <= e <= s:
                    raise ShapeError(f"shrink bounds {full} do not fit shape {self.shape}")
            elif isinstance(b, int) and isinstance(e, int):
                # int bounds of a symbolic dimension (as tinygrad): they must fit its bound value. Its buffer holds
                # the largest size, which the bound value never exceeds, so no value of the Variables reads past it
                if not 0 <= b <= e <= sint_eval(s):
                    raise ShapeError(f"shrink bounds ({b}, {e}) do not fit dimension {render_sint(s)} of bound size "
                                     f"{sint_eval(s)}")
            elif sint_min(b) < 0 or sint_min(sint_sub(e, b)) < 0 or sint_min(sint_sub(s, e)) < 0:
                # symbolic bounds: one kernel serves every value, so they must fit for all of them
                raise ShapeError(f"shrink bounds ({render_sint(b)}, {render_sint(e)}) do not fit dimension "
                                 f"{render_sint(s)} for every value of their Variables (their [min, max] ranges)")
        return self._view(self.uop.shrink(full))

    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Scalar = 0.0) -> Tensor:
        """Pad each dim. `padding` is ((before, after), ...) per dim, or PyTorch's flat (left, right, top, ...) for
        the last dims; a negative amount crops. mode "constant" fills with `value`; "reflect" mirrors the values
        next to the edge (less than the dim's size), "replicate" repeats the edge value, "circular" wraps around
        (at most the dim's size), all as PyTorch's F.pad: a crop applies after reflect and replicate padding is made
        from the input, and before circular padding wraps around what is left."""
        if mode not in PAD_MODES:
            raise UnknownModeError(f"pad mode must be one of {PAD_MODES}, got {mode!r} (the fill value is `value=`)")
        try:
            pads = _normalize_padding(padding, self.ndim)
        except TypeError:
            if not any(isinstance(x, UOp) for p in padding for x in (p if isinstance(p, (tuple, list)) else [p])):
                raise
            return self._padded(_symbolic_padding(padding, self.ndim, mode), value)
        if mode != "constant":
            return self._pad_from_input(pads, mode)
        if any(b < 0 or a < 0 for b, a in pads):
            cropped = self.shrink(tuple((-min(b, 0), s + min(a, 0)) for (b, a), s in zip(pads, self.shape)))
            return cropped.pad(tuple((max(b, 0), max(a, 0)) for b, a in pads), value=value)
        return self._padded(pads, value)

    def _padded(self, pads: tuple[tuple[sint, sint], ...], value: Scalar) -> Tensor:
        """Constant padding by non-negative amounts (ints, or symbolic sizes), filled with `value`."""
        padded = self._view(self.uop.pad(pads))
        if value == 0:
            return padded
        inside = Tensor.ones(self.shape, dtype=dtypes.bool, device=self.device).pad(pads)
        # (the fill takes this tensor's dtype, as PyTorch's: a bool padded with 1 stays bool, an int with 1.5 int)
        return inside.where(padded, Tensor(value, device=self.device).cast(self.dtype))

    def _pad_from_input(self, pads: tuple[tuple[int, int], ...], mode: str) -> Tensor:
        """reflect/replicate/circular padding: per dim, copies of the input's edge (movement ops, joined with zero
        pads and adds as `cat` does), and the crops of negative amounts."""
        x = self
        for d, (before, after) in enumerate(pads):
            if mode == "circular" and (before < 0 or after < 0):
                x = x.shrink(tuple((-min(before, 0), x.shape[d] + min(after, 0)) if i == d else None
                                   for i in range(x.ndim)))
                before, after = max(before, 0), max(after, 0)
            size = x.shape[d]
            grow = (max(before, 0), max(after, 0))
            limit = size - 1 if mode == "reflect" else size if mode == "circular" else None
            if (grow[0] or grow[1]) and (size == 0 or (limit is not None and max(grow) > limit)):
                raise ShapeError(f"pad mode {mode!r}: padding {pads[d]} of dim {d} (size {size}) must be at most "
                                 f"{limit}")
            if grow != (0, 0):
                x = _join_along(x, d, _edge_copy(x, d, grow[0], mode, True), _edge_copy(x, d, grow[1], mode, False))
            if before < 0 or after < 0:
                n = x.shape[d]
                x = x.shrink(tuple((-min(before, 0), n + min(after, 0)) if i == d else None for i in range(x.ndim)))
        return x

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        if self.ndim == 0:
            return self.reshape(1)
        s, e = normalize_axis(start_dim, self.ndim), normalize_axis(end_dim, self.ndim)
        return self.reshape(*self.shape[:s], prod(self.shape[s:e + 1]), *self.shape[e + 1:])

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        d = normalize_axis(dim, self.ndim)
        if -1 not in sizes and prod(sizes) != self.shape[d]:  # with a -1, reshape infers it (or says why not)
            raise ShapeError(f"unflatten: sizes {tuple(sizes)} do not multiply to dim {dim}'s size {self.shape[d]} "
                             f"(shape {self.shape})")
        return self.reshape(*self.shape[:d], *sizes, *self.shape[d + 1:])

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Drop dims of size 1: all of them, or those among `dim` (an int or, as torch >= 2.0, a tuple of ints;
        a named dim of another size stays, as in PyTorch)."""
        if dim is None:
            return self.reshape(tuple(s for s in self.shape if s != 1))
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        if self.ndim == 0:
            for d in dims:
                normalize_axis(d, 1)  # (PyTorch lets a 0-d tensor name dim 0 or -1)
            return self._same_view()
        axes = [normalize_axis(d, self.ndim) for d in dims]
        if len(set(axes)) != len(axes):
            raise ValueError(f"squeeze: dim {dim} names a dim more than once")
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if not (i in axes and s == 1)))

    def unsqueeze(self, dim: int) -> Tensor:
        d = normalize_axis(dim, self.ndim + 1)
        return self.reshape(self.shape[:d] + (1,) + self.shape[d:])

    def repeat(self, repeats: Any, *args: Any) -> Tensor:
        reps = shape_args(repeats, args)
        if len(reps) < self.ndim:
            raise ShapeError(f"repeat needs at least {self.ndim} repeat counts, got {reps}")
        if any(isinstance(r, int) and r < 0 for r in reps):  # (expand would read -1 as "keep this size")
            raise ShapeError(f"repeat counts must be non-negative, got {reps}")
        base = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
        expanded = base.reshape(tuple(x for s in base.shape for x in (1, s)))
        expanded = expanded.expand(tuple(x for r, s in zip(reps, base.shape) for x in (r, s)))
        return expanded.reshape(tuple(r * s for r, s in zip(reps, base.shape)))

    def cat(self: Tensor | Sequence[Tensor], *others: Tensor, dim: int = 0) -> Tensor:
        """Join tensors along `dim`: `a.cat(b, c)`, `Tensor.cat(a, b, c)` and, as `torch.cat`, `Tensor.cat([a, b])`."""
        if isinstance(self, (list, tuple)):
            if others or not self:
                raise ValueError("cat takes either one non-empty sequence of tensors or tensors as arguments")
            return self[0].cat(*self[1:], dim=dim)
        self = cast(Tensor, self)
        tensors = (self, *others)
        if any(t.ndim == 0 for t in tensors):
            raise ShapeError(f"cat: zero-dimensional tensors (shapes {[x.shape for x in tensors]}) have no dimension "
                             "to join along; use stack, or reshape them to (1,)")
        d = normalize_axis(dim, self.ndim, "dim")
        for t in tensors:
            if t.ndim != self.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
                raise ShapeError(f"cat: shapes {[x.shape for x in tensors]} differ outside dimension {d}")
        dt = least_upper_dtype(*(t.dtype for t in tensors))
        if len(tensors) > _CAT_GROUP:  # many tensors: joined in groups, each group materialised (see _CAT_GROUP)
            groups = [tensors[i:i + _CAT_GROUP] for i in range(0, len(tensors), _CAT_GROUP)]
            return Tensor.cat(*(g[0].cast(dt).cat(*g[1:], dim=d).contiguous() for g in groups), dim=d)
        total: sint = 0
        for t in tensors:
            total = sint_add(total, t.shape[d])
        out: Tensor | None = None
        offset: sint = 0
        for t in tensors:  # (sint arithmetic: a symbolic length, `cache[:, :pos].cat(new, dim=1)`, simplified)
            pads = tuple((offset, sint_sub(sint_sub(total, offset), t.shape[d])) if i == d else (0, 0)
                         for i in range(self.ndim))
            piece = t.cast(dt).pad(pads)
            out = piece if out is None else out + piece
            offset = sint_add(offset, t.shape[d])
        assert out is not None
        return out

    def stack(self: Tensor | Sequence[Tensor] = (), *others: Tensor, dim: int = 0) -> Tensor:
        """Join tensors of one shape along a new dim: `a.stack(b, c)` and `Tensor.stack(a, b, c)` alike (a method,
        as in tinygrad); `Tensor.stack([a, b])` also takes one list."""
        if isinstance(self, (list, tuple)) and others:
            raise ValueError("stack takes either one sequence of tensors or tensors as arguments, not both")
        tensors: tuple[Tensor, ...] = (*self, *others) if isinstance(self, (list, tuple)) else \
            (cast(Tensor, self), *others)
        if not tensors:
            raise ValueError("stack needs at least one tensor")
        if any(t.shape != tensors[0].shape for t in tensors):
            raise ValueError(f"stack needs tensors of one shape, got {[t.shape for t in tensors]}")
        d = normalize_axis(dim, tensors[0].ndim + 1, "dim")
        return tensors[0].unsqueeze(d).cat(*(t.unsqueeze(d) for t in tensors[1:]), dim=d)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        d = normalize_axis(dim, self.ndim, "dim")
        n = self.shape[d]
        if isinstance(sizes, int):
            if sizes <= 0:
                raise ValueError(f"split size must be positive, got {sizes}")
            sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
        if sum(sizes) != n:
            raise ShapeError(f"split sizes {list(sizes)} do not add up to dimension {d}'s size {n}")
        out, start = [], 0
        for s in sizes:
            out.append(self.shrink(tuple((start, start + s) if i == d else None for i in range(self.ndim))))
            start += s
        return tuple(out)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        if chunks <= 0:
            raise ValueError(f"chunk count must be positive, got {chunks}")
        n = self.shape[normalize_axis(dim, self.ndim, "dim")]
        return self.split(max(1, math.ceil(n / chunks)), dim)

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, index: Any) -> Tensor:
        from glassgrad.indexing import getitem
        return getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        """`t[1:3] = v`, `t[0, ::2] = 5`, `t[mask] = 0` (a bool mask of t's shape), `t[[0, 2], 1] = v` (tensor or
        list indices): lazily, like `assign`, into this tensor's own buffer."""
        if self._view_of is None and (_draws_random(self) or isinstance(value, Tensor) and _draws_random(value)):
            self._take_own_buffer()  # its buffer first: see _draws_random
        if isinstance(index, Tensor) and index.dtype == dtypes.bool and index.shape == self.shape:
            self.assign(index.where(value, self))
            return
        view = self[index]
        if not view._shows(self):
            self._setitem_by_positions(index, value)
            return
        view.assign(value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype))

    def __delitem__(self, index: Any) -> None:
        """`del t[i]` raises TypeError, as for PyTorch's tensors and numpy arrays (Python's default here, with
        `__setitem__` defined, was an AttributeError naming `__delitem__`)."""
        raise TypeError("a Tensor does not support item deletion (del t[i]); build a new one, e.g. t[mask] or cat")

    def _setitem_by_positions(self, index: Any, value: Any) -> None:
        """`t[idx] = v` with tensor or list indices (advanced indexing): the same index applied to the flat
        positions of `t` says where each element of `v` goes, and a scatter writes them. Where one position is
        named several times the last write wins (numpy's and PyTorch's CPU order)."""
        positions = Tensor.arange(self.numel(), device=self.device).reshape(self.shape)[index]
        values = value if isinstance(value, Tensor) else Tensor(value, device=self.device, dtype=self.dtype)
        try:
            values = values.cast(self.dtype)._broadcast_to(positions.shape)
        except ValueError:
            raise ShapeError(f"t[index] = value: value of shape {values.shape} cannot be broadcast to the indexed "
                             f"shape {positions.shape}") from None
        flat = self.reshape(-1).scatter(0, positions.reshape(-1), values.reshape(-1))
        self.assign(flat.reshape(self.shape))

    def gather(self, dim: int, index: Tensor) -> Tensor:
        """out[i][j][k] = self[index[i][j][k]][j][k] for dim=0 (PyTorch's gather)."""
        d = normalize_axis(dim, self.ndim, "dim")
        if index.ndim != self.ndim or not index.dtype.is_int:  # (a bool index was read as 0 and 1)
            raise ShapeError(f"gather: index must be an int tensor with {self.ndim} dims, got {index.dtype} "
                             f"{index.shape}")
        if any(index.shape[i] > self.shape[i] for i in range(self.ndim) if i != d):
            raise ShapeError(f"gather: index shape {index.shape} is larger than {self.shape} outside dim {d}")
        n = self.shape[d]
        src = self.shrink(tuple(None if i == d else (0, index.shape[i]) for i in range(self.ndim)))
        src = src.unsqueeze(-1).transpose(d, -1)  # dim d -> size 1, candidates on the last axis
        hit = index.unsqueeze(-1) == Tensor.arange(n, device=self.device)
        return hit.where(src, 0).sum(-1, dtype=self.dtype)

    def scatter(self, dim: int, index: Tensor, src: Tensor | Scalar, reduce: str | None = None) -> Tensor:
        """self with self[index[i][j]][j] = src[i][j] for dim=0 (PyTorch's scatter); reduce 'add' or 'multiply'.

        Without `reduce`, where several index entries name one position the last of them along `dim` wins (what
        PyTorch's and tinygrad's CPU loops leave there)."""
        if reduce not in (None, "add", "multiply"):
            raise ModeError(f"scatter reduce must be None, 'add' or 'multiply', got {reduce!r}")
        d = normalize_axis(dim, self.ndim, "dim")
        values = self._scatter_source(d, index, src)
        if index.shape[d] == 0:
            return self
        hit = index.unsqueeze(-1) == Tensor.arange(self.shape[d], device=self.device)  # index.shape + (n,)
        moved = list(range(self.ndim + 1))
        moved[d], moved[-1] = moved[-1], moved[d]
        pad_back = tuple((0, 0) if i == d else (0, self.shape[i] - index.shape[i]) for i in range(self.ndim))

        def onto_self(t: Tensor, fill: Scalar) -> Tensor:  # (..., 1 at d, ..., n) -> self's shape
            return t.permute(moved).squeeze(-1).pad(pad_back, value=fill)

        any_hit = onto_self(hit.any(d, keepdim=True), False)
        if reduce == "multiply":
            return any_hit.where(self * onto_self(hit.where(values.unsqueeze(-1), 1).prod(d, keepdim=True), 1), self)
        if reduce is None:  # keep only the last entry along d that names each target
            k = index.shape[d]
            order = Tensor.arange(k, device=self.device).reshape((k,) + (1,) * (self.ndim - d))
            hit = hit & (order == hit.where(order, -1).max(d, keepdim=True))
        acc = None if self.dtype.is_float else self.dtype  # halves accumulate in float32, as `sum` (scatter_reduce)
        summed = onto_self(hit.where(values.unsqueeze(-1), 0).sum(d, keepdim=True, dtype=acc), 0)
        return self + summed if reduce == "add" else any_hit.where(summed, self)

    def _scatter_source(self, d: int, index: Tensor, src: Tensor | Scalar) -> Tensor:
        """scatter's checked values, cut to the index's shape: PyTorch's rules (index fits self outside dim d and
        src everywhere; a tensor src has self's dtype)."""
        if index.ndim != self.ndim or not index.dtype.is_int:
            raise ShapeError(f"scatter: index must be an int tensor with {self.ndim} dims, got {index.dtype} "
                             f"{index.shape}")
        if any(index.shape[i] > self.shape[i] for i in range(self.ndim) if i != d):
            raise ShapeError(f"scatter: index shape {index.shape} is larger than {self.shape} outside dim {d}")
        if not isinstance(src, Tensor):
            return Tensor.full(index.shape, src, self.dtype, self.device)
        if src.dtype != self.dtype:
            raise DTypeError(f"scatter: src has dtype {src.dtype}, self has {self.dtype}; cast one of them")
        if src.ndim != self.ndim or any(i > s for i, s in zip(index.shape, src.shape)):
            raise ShapeError(f"scatter: index shape {index.shape} is larger than src shape {src.shape}")
        return src.shrink(tuple((0, s) for s in index.shape))

    # ------------------------------------------------------------------ reductions
    def _resolve_axes(self, axis: AxisArg) -> tuple[int, ...]:
        """Sorted, non-negative axes. A 0-d tensor accepts axis 0 or -1 (as PyTorch does) and reduces nothing."""
        ndim = len(self.uop.shape)
        if type(axis) is int and -ndim <= axis < ndim:  # (the common call, one valid axis: what the checks give)
            return (axis % ndim,)
        if axis is None:
            return tuple(range(ndim))
        if not isinstance(axis, (int, tuple, list)):
            raise TypeError(f"axis must be an int, a tuple of ints or None, got {type(axis).__name__} {axis!r}")
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        norm = tuple(normalize_axis(a, self.ndim) for a in axes)
        if len(set(norm)) != len(norm):
            raise ShapeError(f"axis {axis} names a dimension twice")
        return tuple(sorted(norm)) if self.ndim else ()

    def _reduce(self, op: Ops, axis: AxisArg, keepdim: bool) -> Tensor:
        axes = self._resolve_axes(axis)
        shape = self.uop.shape
        if op is OP_MAX and any(shape[a] == 0 for a in axes):
            raise ShapeError(f"max/min over an empty dimension (shape {shape}, axis {axis}) has no identity")
        src = self
        if op is OP_MAX and axes and self.dtype.is_float and _calls_libm(self.uop) and self.requires_grad:
            src = self.contiguous()  # the gradient compares its input with the max: they must be the same values
        # (a REDUCE_AXIS keeps the reduced axes as 1s: the keepdim shape)
        out = src._wrap(src.uop.reduce_axis(op, axes)) if axes else self._same_value()
        if keepdim or not axes:
            return out if keepdim else out.reshape(shape)
        dims = tuple([s for i, s in enumerate(shape) if i not in axes])
        if all(type(s) is int for s in shape):  # (concrete: the dims are ints of the same count, reshape's checks
            return out._view(out.uop.reshape(dims))  # cannot fail)
        return out.reshape(dims)

    def _sum_dtype(self) -> DType:
        return sum_acc_dtype(self.dtype)

    @accepts_dim
    def sum(self, axis: AxisArg = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Sum; ints accumulate in at least int32, float16/bfloat16 in float32 (and return their own dtype)."""
        acc = to_dtype(dtype) if dtype is not None else self._sum_dtype()
        out = self.cast(acc)._reduce(Ops.ADD, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    @accepts_dim
    def prod(self, axis: AxisArg = None, keepdim: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Product; accumulated as sum accumulates (float16/bfloat16 in float32, returning their own dtype)."""
        acc = to_dtype(dtype) if dtype is not None else self._sum_dtype()
        out = self.cast(acc)._reduce(Ops.MUL, axis, keepdim)
        return out.cast(self.dtype) if dtype is None and self.dtype in (dtypes.float16, dtypes.bfloat16) else out

    @overload
    def max(self, axis: AxisArg = None, keepdim: bool = False) -> Tensor: ...
    @overload
    def max(self, *, dim: int, keepdim: bool = False) -> ValuesIndices: ...

    def max(self, axis: AxisArg = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor | ValuesIndices:
        """The largest values along `axis` (tinygrad). With PyTorch's `dim=`, PyTorch's result: the values and their
        indices, `values, indices = x.max(dim=1)` (a tensor there would unpack along its first axis instead)."""
        if dim is not None:
            if not self.dtype.is_float:
                return ValuesIndices(self._reduce(Ops.MAX, dim, keepdim), self.argmax(dim, keepdim))
            return self._values_at(self.argmax(dim, keepdim=True), dim, keepdim)
        return self._reduce(Ops.MAX, axis, keepdim)

    def _values_at(self, indices: Tensor, dim: int, keepdim: bool) -> ValuesIndices:
        """`max`/`min` of floats with `dim=`: the entries at `indices` (dim kept) and the indices. The values are
        gathered, so the gradient goes to that one entry, as PyTorch's (a MAX reduce splits it among tied entries,
        `amax`'s rule and tinygrad's)."""
        values = self.gather(dim, indices) if self.ndim else self
        if keepdim or not self.ndim:
            return ValuesIndices(values, indices)
        return ValuesIndices(values.squeeze(dim), indices.squeeze(dim))

    @overload
    def min(self, axis: AxisArg = None, keepdim: bool = False) -> Tensor: ...
    @overload
    def min(self, *, dim: int, keepdim: bool = False) -> ValuesIndices: ...

    def min(self, axis: AxisArg = None, keepdim: bool = False, *, dim: int | None = None) -> Tensor | ValuesIndices:
        """Floats: -max(-x). Ints and bools: ~max(~x): ~ reverses the order without overflowing (-INT_MIN does).
        With `dim=`, as `max`: the values and their indices."""
        if dim is not None:
            if not self.dtype.is_float:
                return ValuesIndices(self.min(dim, keepdim), self.argmin(dim, keepdim))
            return self._values_at(self.argmin(dim, keepdim=True), dim, keepdim)
        if not self.dtype.is_float:
            return self.bitwise_not().max(axis, keepdim).bitwise_not()
        return -((-self).max(axis, keepdim))

    @accepts_dim
    def mean(self, axis: AxisArg = None, keepdim: bool = False) -> Tensor:
        """Mean; float16/bfloat16 sum and divide in float32 and return their own dtype (as tinygrad and PyTorch:
        summed in half, 70,000 ones overflowed to inf, and the count itself to inf, giving NaN)."""
        count = sint_prod([self.shape[a] for a in self._resolve_axes(axis)])
        half = self.dtype in (dtypes.float16, dtypes.bfloat16)
        total = self.sum(axis, keepdim, dtype=dtypes.float32) if half else self._float().sum(axis, keepdim)
        if isinstance(count, UOp):  # a symbolic count divides as a kernel argument
            out = total / count  # type: ignore[operator]
        else:
            out = total / count if count else total * math.nan
        return out.cast(self.dtype) if half else out

    @accepts_dim
    def var(self, axis: AxisArg = None, keepdim: bool = False, correction: int = 1, *,
            unbiased: bool | None = None) -> Tensor:
        """Variance; float16/bfloat16 are computed in float32 and return their own dtype (as mean). `unbiased`
        (PyTorch's older keyword): False is correction=0, True correction=1."""
        if unbiased is not None:
            correction = int(unbiased)
        dof = sint_sub(sint_prod([self.shape[a] for a in self._resolve_axes(axis)]), correction)
        half = self.dtype in (dtypes.float16, dtypes.bfloat16)
        x = self.float() if half else self._float()
        centered = x - x.mean(axis, keepdim=True)
        squares = (centered * centered).sum(axis, keepdim)
        out = squares / (dof.maximum(0) if isinstance(dof, UOp) else max(0, dof))  # type: ignore[operator]
        return out.cast(self.dtype) if half else out

    @accepts_dim
    def std(self, axis: AxisArg = None, keepdim: bool = False, correction: int = 1, *,
            unbiased: bool | None = None) -> Tensor:
        """sqrt(var), with gradient 0 (as in PyTorch), not NaN, where the variance is 0."""
        v = self.var(axis, keepdim, correction, unbiased=unbiased)
        zero = v == 0
        return zero.where(0.0, zero.where(1.0, v).sqrt())

    @accepts_dim
    def any(self, axis: AxisArg = None, keepdim: bool = False) -> Tensor:
        return self.bool()._reduce(Ops.MAX, axis, keepdim) if self.numel() else \
            Tensor.full(self._reduced_shape(axis, keepdim), False, dtypes.bool, self.device)

    @accepts_dim
    def all(self, axis: AxisArg = None, keepdim: bool = False) -> Tensor:
        return self.logical_not().any(axis, keepdim).logical_not()

    def _reduced_shape(self, axis: AxisArg, keepdim: bool) -> tuple[int, ...]:
        axes = self._resolve_axes(axis)
        return tuple(1 if i in axes else s for i, s in enumerate(self.shape) if keepdim or i not in axes)

    @accepts_dim
    def argmax(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first maximum (over the flattened tensor when axis is None); NaN counts as the maximum.
        int32 (tinygrad's dtype), or int64 over more than 2**31 positions."""
        if axis is None:
            flat = self.flatten().argmax(0)
            return flat.reshape((1,) * self.ndim) if keepdim else flat
        a = normalize_axis(axis, self.ndim)
        if self.ndim == 0:  # axis 0 or -1 of a scalar (as PyTorch): its one index
            return Tensor.zeros((), dtype=dtypes.int32, device=self.device)
        n = self.shape[a]
        if n == 0:
            raise ShapeError(f"argmax over an empty dimension (shape {self.shape}, axis {axis})")
        x = self.contiguous() if self.dtype.is_float and _calls_libm(self.uop) else self  # compared with its max
        is_max = x == x.max(a, keepdim=True)
        if self.dtype.is_float:  # a NaN is the maximum (max propagates it), as in numpy and PyTorch
            is_max = is_max | (x != x)
        countdown = Tensor.arange(n, 0, -1, device=self.device).reshape((n,) + (1,) * (self.ndim - a - 1))
        index_dtype = dtypes.int64 if n - 1 > dtypes.int32.max else dtypes.int32  # (int32 wrapped to negatives)
        return (n - (is_max * countdown).max(a, keepdim)).cast(index_dtype)

    @accepts_dim
    def argmin(self, axis: int | None = None, keepdim: bool = False) -> Tensor:
        flipped = -self if self.dtype.is_float else self.bitwise_not()  # ~x reverses int order without overflow
        return flipped.argmax(axis, keepdim)

    @accepts_dim
    @computed_in_float32
    def logsumexp(self, axis: AxisArg = None, keepdim: bool = False) -> Tensor:
        """log(sum(exp(x))) shifted by the row's max; an empty row gives -inf (log 0, as PyTorch; its max raises)."""
        axes = self._resolve_axes(axis)
        if any(self.shape[a] == 0 for a in axes):
            shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
            out = Tensor.full(shape, -math.inf, dtype=self._float().dtype, device=self.device)
            return out if keepdim else out.squeeze_axes(axes)
        m = self._float().max(axis, keepdim=True).detach()  # any shift gives the same value: no gradient through it
        m = (m == math.inf).where(0.0, (m == -math.inf).where(0.0, m))  # keep inf/-inf rows finite-safe
        out = (self - m).exp().sum(axis, keepdim=True).log() + m
        return out if keepdim else out.squeeze_axes(self._resolve_axes(axis))

    def squeeze_axes(self, axes: tuple[int, ...]) -> Tensor:
        return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

    @accepts_dim
    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sum along `axis`, as one reduction over a triangular mask (n^2 work, one fused kernel).

        dtypes follow `sum`: ints accumulate in at least (u)int32, float16/bfloat16 in float32 and come back as
        themselves."""
        acc = self._sum_dtype()
        out_dtype = self.dtype if self.dtype in (dtypes.float16, dtypes.bfloat16) else acc
        if self.ndim == 0:
            normalize_axis(axis, 0)
            out = self.cast(out_dtype)
            return out._same_value() if out is self else out
        a = normalize_axis(axis, self.ndim)
        n = self.shape[a]
        x = self.transpose(a, -1) if a != self.ndim - 1 else self
        rows = Tensor.arange(n, device=self.device).reshape(n, 1)
        cols = Tensor.arange(n, device=self.device).reshape(1, n)
        lower = cols <= rows  # (n, n): out[i] sums x[j] for j <= i
        out = lower.where(x.unsqueeze(-2), 0).sum(-1, dtype=acc).cast(out_dtype)
        return out.transpose(a, -1) if a != self.ndim - 1 else out

    # ------------------------------------------------------------------ linear algebra and functional
    def dot(self, w: Tensor, dtype: DType | str | None = None) -> Tensor:
        return self.matmul(w, dtype=dtype)

    def matmul(self, w: Tensor, reverse: bool = False, dtype: DType | str | None = None) -> Tensor:
        """Matrix product with numpy's rules: 1-D operands are vectors; leading dims broadcast. reverse: w @ self;
        dtype: the dtype to accumulate in and return (tinygrad's keywords)."""
        if reverse:
            return w.matmul(self, dtype=dtype) if isinstance(w, Tensor) else self.matmul(w)
        if not isinstance(w, Tensor):
            raise TypeError(f"matmul needs a Tensor, got {type(w).__name__}")
        if self.ndim == 0 or w.ndim == 0:
            raise ShapeError(f"matmul needs tensors with at least 1 dim, got shapes {self.shape} and {w.shape}")
        x = self.unsqueeze(0) if self.ndim == 1 else self
        y = w.unsqueeze(-1) if w.ndim == 1 else w
        if x.shape[-1] != y.shape[-2]:
            raise ShapeError(f"matmul shape mismatch: {self.shape} @ {w.shape} (inner dims {x.shape[-1]} != "
                             f"{y.shape[-2]})")
        try:
            _broadcast_shape(x.shape[:-2], y.shape[:-2])
        except ValueError:
            raise ShapeError(f"matmul batch dims {x.shape[:-2]} and {y.shape[:-2]} cannot be broadcast together "
                             f"(shapes {self.shape} @ {w.shape})") from None
        if dtype is None and self.ndim >= 2 and w.ndim >= 2 and (direct := _matmul_node(self.uop, w.uop)) is not None:
            return Tensor(direct)
        # (..., n, 1, k) * (..., 1, m, k) summed over k
        x, y = x._product_operand(dtype), y._product_operand(dtype)
        products = x.unsqueeze(-2) * y.transpose(-1, -2).unsqueeze(-3)
        out = products.sum(-1, dtype=dtype)
        if dtype is None and products.dtype.is_int:  # int8 @ int8 is int8 (wrapping), as in PyTorch and tinygrad;
            out = out.cast(products.dtype)           # sum alone widens small ints to int32
        if self.ndim == 1:
            out = out.squeeze(-2)
        if w.ndim == 1:
            out = out.squeeze(-1)
        return out

    def _product_operand(self, dtype: DType | str | None) -> Tensor:
        """An operand of a sum of products accumulated in `dtype` (matmul, einsum, conv2d's `dtype=`): an int or bool
        operand is cast to it before the product, so each product is exact in the accumulator (numpy's
        `matmul(dtype=)`); multiplied in its own dtype first, int8 products wrapped mod 256 before an int32 sum
        (quantized int8 @ int8 with dtype=int32 was silently wrong). Mod 2**bits, a narrower dtype's result is the
        same either way; float operands are left as they are (a float32 sum of half products is made exact by the
        simplifier, `_exact_half_products`)."""
        if dtype is None or self.dtype.is_float:
            return self
        return self.cast(dtype)

    def linear(self, weight: Tensor, bias: Tensor | None = None, dtype: DType | str | None = None) -> Tensor:
        """`self @ weight + bias` (`dtype`: the matmul's accumulation and result dtype, as in `matmul`)."""
        out = self.matmul(weight, dtype=dtype) if weight.ndim != 1 else self * weight
        return out + bias if bias is not None else out

    def _opmath(self, dtype: DType | str | None) -> tuple[Tensor, DType | None]:
        """(the tensor to compute a softmax-like op in, the dtype to round its result to): `dtype` when given
        (tinygrad's keyword), float32 for float16/bfloat16 (rounded back once, as PyTorch's half kernels compute),
        else self's float dtype."""
        if dtype is not None:
            return self.cast(dtype), None
        if self.dtype in (dtypes.float16, dtypes.bfloat16):
            return self.cast(dtypes.float32), self.dtype
        return self._float(), None

    @accepts_dim
    def softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        """softmax along axis, computed in `dtype` when given (tinygrad's keyword), else in self's float dtype
        (float32 for halves, rounded once)."""
        x, rounded_to = self._opmath(dtype)
        if x.numel() == 0:
            x._resolve_axes(axis)  # nothing to normalise, but a bad axis is still an error
            return x if rounded_to is None else x.cast(rounded_to)
        # the shift by the row's max keeps exp finite and changes nothing else, so no gradient flows through it (a
        # backward through the max would add a reduction that counts its ties, for a term that is exactly zero)
        e = (x - x.max(axis, keepdim=True).detach()).exp()
        out = e * e.sum(axis, keepdim=True).reciprocal()  # one division per row, not per element
        return out if rounded_to is None else out.cast(rounded_to)

    @accepts_dim
    def log_softmax(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        x, rounded_to = self._opmath(dtype)
        if x.numel() == 0:
            x._resolve_axes(axis)
            return x if rounded_to is None else x.cast(rounded_to)
        shifted = x - x.max(axis, keepdim=True).detach()  # (as in softmax: the shift has no gradient)
        out = shifted - shifted.exp().sum(axis, keepdim=True).log()
        return out if rounded_to is None else out.cast(rounded_to)

    def one_hot(self, num_classes: int = -1) -> Tensor:
        if self.dtype.is_float:
            raise DTypeError(f"one_hot needs an int tensor, got {self.dtype}")
        if num_classes == -1:
            num_classes = int(self.max().item()) + 1
        return (self.unsqueeze(-1) == Tensor.arange(num_classes, device=self.device)).where(1, 0)

    def cross_entropy(self, Y: Tensor, reduction: str = "mean", label_smoothing: float = 0.0,
                      weight: Tensor | None = None, ignore_index: int | None = None) -> Tensor:
        """PyTorch's cross_entropy: logits (N, C, ...) against class indices (N, ...) or probabilities (N, C, ...).
        `weight` (C,) weighs each class and `ignore_index` drops the targets equal to it, as in PyTorch: with class
        indices "mean" divides by the summed weights of the kept targets. ignore_index defaults to None, not to
        PyTorch's -100: tinygrad's cross_entropy ignores nothing, and a tinygrad program must keep its loss."""
        axis = 1 if self.ndim > 1 else 0
        classes = self.shape[axis]
        class_weight = None if weight is None else weight.reshape(classes, *([1] * (self.ndim - axis - 1)))
        log_probs = self.log_softmax(axis)
        if Y.dtype.is_float:
            if ignore_index is not None:
                raise ValueError("cross_entropy: ignore_index needs class-index targets, not probabilities")
            if Y.shape != self.shape:
                raise ShapeError(f"cross_entropy: logits {self.shape} do not match targets {Y.shape}")
            target = Y * (1 - label_smoothing) + label_smoothing / classes
            weighted = target if class_weight is None else target * class_weight
            return _reduce_loss(-(log_probs * weighted).sum(axis), reduction)
        target = Y.one_hot(classes)
        target = target.permute(0, -1, *range(1, target.ndim - 1)) if target.ndim > 2 else target
        if target.shape != self.shape:
            raise ShapeError(f"cross_entropy: logits {self.shape} do not match targets {Y.shape}")
        # the picked log-probability selected, not multiplied by the one-hot: a -inf logit of another class (a
        # masked class) times 0 was NaN; the smoothing term only with smoothing (0 * a mean over -inf is NaN too)
        picked = target.cast(dtypes.bool).where(log_probs, 0).sum(axis)
        if class_weight is None and ignore_index is None:  # tinygrad's loss
            return _reduce_loss(-_smoothed(picked, label_smoothing, lambda: log_probs.mean(axis)), reduction)
        sample_weight = Y.ones_like(dtype=self.dtype) if class_weight is None else (target * class_weight).sum(axis)
        keep = None if ignore_index is None else Y != ignore_index
        if keep is not None:  # (selected, not multiplied: an ignored target's log-probability may be -inf)
            sample_weight, picked = keep.where(sample_weight, 0), keep.where(picked, 0)

        def smooth() -> Tensor:
            mean = log_probs.mean(axis) if class_weight is None else (log_probs * class_weight).mean(axis)
            return mean if keep is None else keep.where(mean, 0)
        loss = -_smoothed(picked * sample_weight, label_smoothing, smooth)
        return loss.sum() / sample_weight.sum() if reduction == "mean" else _reduce_loss(loss, reduction)

    def sparse_categorical_crossentropy(self, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                        reduction: str = "mean") -> Tensor:
        """tinygrad's loss: logits (..., C), integer labels (...); labels equal to ignore_index are skipped."""
        if Y.shape != self.shape[:-1] or Y.dtype.is_float:
            raise ValueError(f"sparse_categorical_crossentropy: labels must be ints of shape {self.shape[:-1]}, "
                             f"got {Y.dtype} {Y.shape}")
        log_probs = self.log_softmax(-1)
        keep = Y != ignore_index
        picked = (Y.unsqueeze(-1) == Tensor.arange(self.shape[-1], device=self.device)).where(log_probs, 0).sum(-1)
        loss = keep.where(-_smoothed(picked, label_smoothing, lambda: log_probs.mean(-1)), 0)  # (not * keep: inf * 0)
        if reduction == "mean":
            return loss.sum() / keep.sum().maximum(1)
        return _reduce_loss(loss, reduction)

    def binary_crossentropy(self, Y: Tensor, reduction: str = "mean") -> Tensor:
        """self holds probabilities; log is clamped at -100 as in PyTorch (where a probability is exactly 0 or 1 the
        gradient is that of the clamp, 0, instead of NaN; PyTorch gives a huge finite value there)."""
        loss = -(Y * _clamped_log(self) + (1 - Y) * _clamped_log(1 - self))
        return _reduce_loss(loss, reduction)

    def binary_crossentropy_logits(self, Y: Tensor, reduction: str = "mean", pos_weight: Tensor | None = None
                                   ) -> Tensor:
        """Binary cross-entropy of sigmoid(self) against Y, computed stably from the logits; pos_weight (one per
        class, the last dim) weighs the positive term, as PyTorch's BCEWithLogitsLoss."""
        softplus_neg = (-self).maximum(0) + (1 + (-self.abs()).exp()).log()  # -log(sigmoid(x)), never overflowing
        if pos_weight is None:
            return _reduce_loss((1 - Y) * self + softplus_neg, reduction)
        return _reduce_loss((1 - Y) * self + (1 + (pos_weight - 1) * Y) * softplus_neg, reduction)

    @computed_in_float32
    def layernorm(self, axis: AxisArg = -1, eps: float = 1e-5) -> Tensor:
        centered = self - self.mean(axis, keepdim=True)
        return centered * ((centered * centered).mean(axis, keepdim=True) + eps).rsqrt()

    def dropout(self, p: float = 0.5) -> Tensor:
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if not Tensor.training or p == 0:
            return self
        if p == 1:
            return self.zeros_like()
        keep = Tensor.rand(self.shape, device=self.device) >= p
        return keep.where(self, 0) * (1 / (1 - p))

    def sequential(self, layers: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
        return functools.reduce(lambda x, f: f(x), layers, self)

    # ------------------------------------------------------------------ modes
    @staticmethod
    @contextlib.contextmanager
    def train(mode: bool = True) -> Iterator[None]:
        """`with Tensor.train():` turns on training behaviour (dropout, batchnorm statistics) in this thread while it
        is open (`Tensor.training = True` sets it for every thread)."""
        TRAINING.push(int(mode))
        try:
            yield
        finally:
            TRAINING.pop()

    @staticmethod
    @contextlib.contextmanager
    def test() -> Iterator[None]:
        with Tensor.train(False):
            yield

    # ------------------------------------------------------------------ data, replacing, devices (tinygrad parity)
    def data(self) -> memoryview:
        """This tensor's values as a memoryview of its shape (realized, read back to the host)."""
        if self.dtype == dtypes.bfloat16:
            raise TypeError("data(): bfloat16 has no Python buffer format; use .numpy() (float32) or .tolist()")
        return self.numpy().copy(order="C").data  # (ascontiguousarray would make a 0-d array 1-d)

    def replace(self, x: Tensor) -> Tensor:
        """Make this tensor stand for `x`'s graph (its data, dtype and device), in place; the shapes must match,
        as in tinygrad. Returns self."""
        if not isinstance(x, Tensor):
            raise TypeError(f"replace needs a Tensor, got {type(x).__name__}")
        if x.shape != self.shape:
            raise ValueError(f"replace: shape {x.shape} does not match this tensor's shape {self.shape}")
        self.uop = x.uop
        _note_pending_assign(self)
        return self

    def to_(self, device: str | None) -> Tensor:
        """Move this tensor (and its grad) to `device`, in place."""
        moved = self.to(device)
        if self.grad is not None:
            self.grad = self.grad.to(device)
        return self.replace(moved)

    def shard(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """This tensor split along `axis` over `devices` (tinygrad's sharding): device i holds elements
        [i*k, (i+1)*k) of the axis, k = ceil(size / n), so the last parts may be shorter or empty. `axis=None` puts a
        whole copy on every device. The result is one tensor on several devices (`device` is the tuple): ops on it
        run on every device (see glassgrad/multi.py). One device: a copy to it."""
        if isinstance(devices, str) or not isinstance(devices, (tuple, list)) or not devices:
            raise TypeError(f"shard takes a non-empty tuple of devices, got {devices!r}")
        found = canonical_devices(devices)
        names: tuple[str, ...] = (found,) if isinstance(found, str) else found
        if axis is not None:
            if self.ndim == 0:
                raise ShapeError("shard: a 0-d tensor has no axis to split; use axis=None to copy it to every device")
            axis = normalize_axis(axis, self.ndim)
        if len(names) == 1:
            return self.to(names[0])
        _no_symbolic("shard", self.shape)
        source = self if not isinstance(self.device, tuple) else self.to(self.device[0])
        bounds = shard_bounds(self.shape[axis], len(names)) if axis is not None else ((0, 0),) * len(names)
        parts = []
        for device, bound in zip(names, bounds):
            part = source if axis is None else source.shrink(tuple(bound if i == axis else None
                                                                   for i in range(self.ndim)))
            parts.append(part.contiguous().to(device).uop if part.device != device else part.uop)
        return Tensor(make_multi(parts, axis))

    def shard_(self, devices: tuple[str, ...], axis: int | None = None) -> Tensor:
        """`shard`, in place."""
        return self.replace(self.shard(devices, axis))

    def contiguous_backward(self) -> Tensor:
        """The same values; in the backward pass the gradient flowing through here is materialised (contiguous)."""
        return self._wrap(UOp(Ops.CONTIGUOUS_BACKWARD, self.dtype, (self.uop,)))


# `cat` pads every input to the output's size and adds them: each output element evaluates one gated load per input,
# and the kernel reads every input. More inputs than this are joined in groups, each materialised, so a cat (or stack)
# of n tensors costs O(size * log n), not O(size * n), and no kernel reads more than this many buffers (a cat of 2,000
# tensors was one kernel of 2,001 arguments; Metal allows 31).
_CAT_GROUP = 16


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """No gradient bookkeeping inside, as PyTorch's: realized tensors keep no link to the graph that made them, and
    the float results made inside that are still lazy at the end are detached (a later backward() does not reach
    the tensors they were computed from: `with no_grad(): y = w * 2` then `(y * w).sum().backward()` gives w.grad
    = y, not 2y)."""
    made: list[weakref.ref[Tensor]] = []
    with GLOBAL_LOCK:
        _MODES.no_grad_blocks.append(made)
        _OPEN_NO_GRAD_BLOCKS[0] += 1
    try:
        yield
    finally:
        with GLOBAL_LOCK:
            blocks = _MODES.no_grad_blocks  # (found by identity: list.remove compared the tensors, elementwise)
            del blocks[max(i for i, block in enumerate(blocks) if block is made)]
            _OPEN_NO_GRAD_BLOCKS[0] -= 1
            _detach_lazy_results(made)


def _detach_lazy_results(made: list[weakref.ref[Tensor]]) -> None:
    """Cut the graphs of the float tensors made in a no_grad block that are still lazy (realized ones keep no lineage
    already). A view stays a view (an assign through it still writes the tensor it shows, as through `detach()`);
    writes (ASSIGN) and their targets are left as they are."""
    for ref in made:
        t = ref()
        if t is None or not t.dtype.is_float:
            continue
        uop = t.uop
        if uop.op in (Ops.ASSIGN, Ops.DETACH) or is_buffer_view(uop) or ASSIGN_TARGETS.get(id(t)) is t:
            continue
        t.uop = UOp(Ops.DETACH, uop.dtype, (uop,))


# ---------------------------------------------------------------------- helpers
def _smoothed(picked: Tensor, label_smoothing: float, smooth: Callable[[], Tensor]) -> Tensor:
    """(1 - s) * picked + s * smooth() for label smoothing s; without smoothing just `picked`: the smoothing term (a
    mean of the log-probabilities) is then not built at all. Times 0 it was NaN wherever a logit is -inf (a masked
    class, where PyTorch's loss stays finite), and a pass over the logits for nothing."""
    return picked if label_smoothing == 0 else (1 - label_smoothing) * picked + label_smoothing * smooth()


def _reduce_loss(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _clamped_log(p: Tensor) -> Tensor:
    """max(log(p), -100), never evaluating log(0): its gradient (1/0 times a 0 from the clamp) would be NaN."""
    positive = p > 0
    return positive.where(positive.where(p, 1.0).log(), -100.0).maximum(-100.0)


def _matmul_node(a: UOp, b: UOp) -> UOp | None:
    """The node `matmul` builds for two float matrices (or batches of them) of one dtype and device, made without
    its intermediate Tensors (a third of an eager small matmul's host time): the same nodes in the same order as
    the general path (`(x.unsqueeze(-2) * y.transpose(-1, -2).unsqueeze(-3)).sum(-1)`, tested to be the same node).
    None for anything else (ints, mixed dtypes, symbolic shapes): the general path's checks and rules apply."""
    sa, sb = a.shape, b.shape
    if a.dtype is not b.dtype or not a.dtype.is_float or a.device != b.device or \
            any(type(d) is not int for d in sa) or any(type(d) is not int for d in sb) or sa[-1] != sb[-2]:
        return None
    try:
        batch = _broadcast_shape(sa[:-2], sb[:-2])
    except ShapeError:
        return None
    n, k, m = sa[-2], sa[-1], sb[-1]
    xs = a.reshape((*sa[:-2], n, 1, k))
    ys = b.permute((*range(len(sb) - 2), len(sb) - 1, len(sb) - 2)).reshape((*sb[:-2], 1, m, k))
    full = (*batch, n, m, k)
    xs, ys = (u if u.shape == full else u.reshape((1,) * (len(full) - len(u.shape)) + u.shape).expand(full)
              for u in (xs, ys))
    product = UOp(Ops.MUL, a.dtype, (xs, ys))
    acc = least_upper_dtype(a.dtype, dtypes.float32)
    summed = (product if acc == a.dtype else product.cast(acc)).reduce_axis(Ops.ADD, (len(full) - 1,))
    out = summed.reshape(full[:-1])
    return out.cast(a.dtype) if a.dtype in (dtypes.float16, dtypes.bfloat16) else out


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    pa, pb = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            raise ShapeError(f"shapes {a} and {b} cannot be broadcast together")
        out.append(y if x == 1 else x)
    return tuple(out)


PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _edge_copy(x: Tensor, d: int, count: int, mode: str, left: bool) -> Tensor | None:
    """The `count` values `mode` puts before (left) or after the input along dim d, or None for none."""
    if count == 0:
        return None
    size = x.shape[d]

    def span(lo: int, hi: int) -> Tensor:
        return x.shrink(tuple((lo, hi) if i == d else None for i in range(x.ndim)))

    if mode == "reflect":  # x[count], ..., x[1] | x | x[-2], ..., x[-count-1]
        return (span(1, count + 1) if left else span(size - 1 - count, size - 1)).flip(d)
    if mode == "circular":  # x[-count:] | x | x[:count]
        return span(size - count, size) if left else span(0, count)
    edge = span(0, 1) if left else span(size - 1, size)  # replicate
    return edge.expand(tuple(count if i == d else s for i, s in enumerate(x.shape)))


def _join_along(x: Tensor, d: int, before: Tensor | None, after: Tensor | None) -> Tensor:
    """before | x | after along dim d, as zero-padded pieces added up (a fused view, as `cat` builds it)."""
    pieces = [p for p in (before, x, after) if p is not None]
    total = sum(p.shape[d] for p in pieces)
    out: Tensor | None = None
    offset = 0
    for p in pieces:
        placed = p.pad(tuple((offset, total - offset - p.shape[d]) if i == d else (0, 0) for i in range(x.ndim)))
        out = placed if out is None else out + placed
        offset += p.shape[d]
    assert out is not None
    return out


def as_amount(x: Any) -> sint:
    """A pad amount: a symbolic size as it is, anything else as an int."""
    return x if isinstance(x, UOp) else int(x)


def _symbolic_padding(padding: Sequence[Any], ndim: int, mode: str) -> tuple[tuple[sint, sint], ...]:
    """`pad`'s per-dim (before, after) pairs when some amounts are symbolic (whisper's KV cache pads its entries to
    the cache's length by `max_len - pos - n`): bound int expressions of Variables, constant mode only, and never
    negative for any value of their Variables (one kernel serves them all)."""
    if mode != "constant":
        raise NotImplementedError(f"pad mode {mode!r} with a symbolic (Variable) amount is not supported; only "
                                  "constant padding takes one")
    if all(isinstance(p, (tuple, list)) or p is None for p in padding):
        if len(padding) != ndim:
            raise ValueError(f"pad needs one (before, after) pair per dimension ({ndim}), got {len(padding)}")
        pairs = [(0, 0) if p is None else (p[0], p[1]) for p in padding]
    else:
        flat = list(padding)
        if len(flat) % 2 or len(flat) // 2 > ndim:
            raise ValueError(f"flat padding must have an even length of at most {2 * ndim}, got {len(flat)}")
        pairs = [(0, 0)] * (ndim - len(flat) // 2) + [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][::-1]
    for x in (x for pair in pairs for x in pair):
        if not isinstance(x, UOp):
            if int(x) < 0:
                raise NotImplementedError("pad: a negative (cropping) amount beside a symbolic one is not supported;"
                                          " shrink first")
            continue
        _check_bound(x, "pad")
        if sint_min(x) < 0:
            raise ShapeError(f"pad amount {render_sint(x)} is negative for some values of its Variables (as low as "
                             f"{sint_min(x)}); a symbolic amount must be >= 0 for all of them")
    return tuple((as_amount(b), as_amount(a)) for b, a in pairs)


def _normalize_padding(padding: Sequence[Any], ndim: int) -> tuple[tuple[int, int], ...]:
    if all(isinstance(p, (tuple, list)) or p is None for p in padding):
        if len(padding) != ndim:
            raise ValueError(f"pad needs one (before, after) pair per dimension ({ndim}), got {len(padding)}")
        return tuple((0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding)
    flat = [int(p) for p in padding]
    if len(flat) % 2 or len(flat) // 2 > ndim:
        raise ValueError(f"flat padding {tuple(flat)} must have an even length of at most {2 * ndim}")
    pairs = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)][::-1]  # PyTorch: last dim first
    return tuple([(0, 0)] * (ndim - len(pairs)) + pairs)


# `x * 0.5` makes CONST(0.5) -> RESHAPE -> EXPAND to x's shape: four node lookups (with the DEVICE) that give the same
# nodes every time for the same dtype, device, shape and value. This cache of the finished node makes a scalar
# operand one lookup; it holds the few recent ones alive. `value_key` (see _arg_key) tells apart values that are
# equal in Python but not as constants: 0.0 and -0.0, 1 and 1.0 and True.
@functools.lru_cache(maxsize=1024)
def _scalar_node(dtype: DType, device: str, shape: tuple[int, ...], value: Scalar, value_key: Any) -> UOp:
    return UOp.const(dtype, value, device).reshape((1,) * len(shape)).expand(shape)


def _index_tensor(n: int, device: str | None) -> Tensor:
    """0, 1, ..., n-1 as int32 (int64 past int32's range: an index over 2**31 positions must not wrap): the ARANGE
    leaf, which a kernel evaluates as its loop index (no memory read)."""
    dev = UOp(Ops.DEVICE, dtypes.void, (), canonical_devices(device or Device.DEFAULT))
    dt = dtypes.int64 if isinstance(n, int) and n - 1 > dtypes.int32.max else dtypes.int32
    return Tensor(UOp(Ops.ARANGE, dt, (dev,), n))


def _movement_chain(top: UOp, bottom: UOp) -> list[UOp]:
    """The movement nodes (and DETACHes, same-size BITCASTs) from `top` down to (not including) `bottom`, top
    first."""
    chain, node = [], top
    while node is not bottom:
        if node.op not in GroupOp.Movement and node.op not in (Ops.DETACH, Ops.BITCAST):
            raise RuntimeError("internal error: a view's node is not a chain of movement ops over its parent's")
        chain.append(node)
        node = node.src[0]
    return chain


def _place_in_parent(chain: list[UOp], value: UOp) -> tuple[UOp, UOp]:
    """Undo `chain` (top first) on `value`: the parent-shaped tensor holding `value` where the view shows, and a bool
    mask of those elements."""
    inside = UOp.const(dtypes.bool, True, value.device).reshape((1,) * len(value.shape)).expand(value.shape)
    for node in chain:
        if node.op is Ops.BITCAST:  # the same elements, read as the source's dtype (the mask stays as it is)
            value = value.bitcast(node.src[0].dtype)
            continue
        value, inside = _undo_movement(node, value), _undo_movement(node, inside)
    return value, inside


def _undo_movement(node: UOp, u: UOp) -> UOp:
    """`u`, shaped like movement node `node`, taken back to the shape of the node's source. An expanded (broadcast)
    view shows one element in several places, so it cannot be written; what lands in a PAD's padding is dropped."""
    below = node.src[0].shape
    if node.op is Ops.DETACH:  # (a detached view shows every element as it is)
        return u
    if node.op is Ops.RESHAPE:
        return u.reshape(below)
    if node.op is Ops.PERMUTE:
        return u.permute(tuple(int(i) for i in np.argsort(node.arg)))
    if node.op is Ops.FLIP:
        return u.flip(node.arg)
    if node.op is Ops.SHRINK:
        return u.pad(tuple((b, sint_sub(s, e)) for (b, e), s in zip(node.arg, below)))
    if node.op is Ops.PAD:
        return u.shrink(tuple((b, sint_add(b, s)) for (b, _), s in zip(node.arg, below)))
    raise RuntimeError(f"cannot assign through a broadcast view: {below} expanded to {node.shape} shows each "
                       "element several times")


def _rebuild_chain(chain: list[UOp], bottom: UOp) -> UOp:
    """The same movement ops as `chain` (top first), applied to another node of the same shape."""
    node = bottom
    for op in reversed(chain):
        node = UOp(op.op, op.dtype, (node,), op.arg)
    return node


def mark_trainable(t: Tensor) -> Tensor:
    """A layer's parameter (requires_grad None, as in tinygrad, until an optimizer turns it on): `backward()` fills
    its `.grad` too, as tinygrad's backward does for the tensors of the graph."""
    with GLOBAL_LOCK:  # (backward lists these)
        _REQUIRES_GRAD[id(t)] = t
    return t


def _record_realized(views: dict[UOp, UOp], keep_lineage: bool, lineage_of: set[UOp] | None = None,
                     assigned: bool = True) -> None:
    """Remember each realized node's buffer view (REALIZED) and, with gradients on, the graph it came from (LINEAGE).

    An assign's view gets its value's graph (gradients flow through `y.assign(w * 2)`, as through PyTorch's `copy_`),
    and the value node itself is known to be realized there (a backward that needs the value loads it, instead of
    recomputing it from the target's old contents, which the write replaced). An assign into a tensor that requires
    a gradient records no lineage: a parameter stays a leaf, whatever its optimiser writes into it (also a layer's
    parameter not yet given to an optimiser, requires_grad None: gradaccum_mnist.py updates its parameters with
    hand-written Adam, and a lineage would recompute them from overwritten buffers); nor does one into
    a tensor marked `requires_grad=False` (running statistics, the random generator's state). The target's old
    version forgets its lineage, since nothing can read that version any more: no chain of steps builds up.
    `assigned` False: the caller knows no node of `views` is an ASSIGN."""
    leaves = {id(t.uop) for t in _pending_assigns() if t._requires_grad is not None or id(t) in _REQUIRES_GRAD} \
        if assigned and any(node.op is OP_ASSIGN for node in views) else set()
    for node, view in views.items():
        REALIZED[node] = view
        if node.op is OP_ASSIGN:
            LINEAGE.pop(node.src[0], None)
            if keep_lineage and id(node) not in leaves and (lineage_of is None or node in lineage_of) and \
                    _reads_a_buffer(node.src[1]):
                # (the value's graph does not hold the ASSIGN node, which REALIZED keeps the view for: no cycle)
                LINEAGE[view] = node.src[1]
                if not is_buffer_view(node.src[1]):  # (a buffer's own contents are not a result to load elsewhere:
                    # `t.assign(w)` then a write to t, and `w + 0` read t's overwritten copy instead of w)
                    REALIZED.set_assigned_value(node.src[1], view)
        elif keep_lineage and not is_buffer_view(node) and (lineage_of is None or node in lineage_of):
            LINEAGE[view] = node  # (movement ops of a buffer are computed too)


def _computed(u: UOp, views: dict[UOp, UOp], partial: bool) -> UOp | None:
    """What holds `u`'s value after a realize (`views`, its results): its view, one realized before, or `u` itself;
    after an exception (`partial`) `u` itself only when it is a buffer view, else None (not computed)."""
    return views.get(u) or REALIZED.get(u) or (u if not partial or is_realized(u) else None)


def _is_bare_constant(u: UOp) -> bool:
    """A constant tensor as made (`Tensor(2.0)`, `Tensor.full`/`zeros`/`ones`: a CONST, reshaped and expanded), a
    node every equal constant shares (the scalar of `t * 2.0` too), so not a tensor of its own to differentiate."""
    while u.op in (Ops.RESHAPE, Ops.EXPAND):
        u = u.src[0]
    return u.op is Ops.CONST


def _shares_a_constant_node(t: Tensor, others: Iterable[Tensor]) -> bool:
    """Whether `t` is computed from constants alone (`Tensor.ones(3) + 1`, `Tensor.ones(3).contiguous()`) and
    another of `others` holds the very same node: two such tensors made alike are one node (hash-consing), so the
    gradient found for it is the sum of theirs, neither's own."""
    return not _reads_a_buffer(t.uop) and any(o is not t and o.uop is t.uop for o in others)


def _reads_a_buffer(value: UOp) -> bool:
    """Whether a graph reads memory. One that does not (a fill: `loss.assign(Tensor.zeros_like(loss))`) is a node
    every equal constant in the program shares (hash-consing): recorded as realized in the assigned buffer, a zero in
    any later graph (relu's) would be loaded from that buffer, which the next write overwrites. Stops at the first
    buffer (this runs for every assign realized: an optimizer's update graphs hold the whole backward)."""
    stack, seen = [value], set()
    while stack:
        node = stack.pop()
        if node.op is Ops.BUFFER:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(node.src)
    return False


def _readers_of_overwritten(pending: list[Tensor]) -> list[Tensor]:
    """The lazy tensors (besides `pending`) that read a buffer version which realizing `pending` overwrites: they are
    realized in the same schedule, before the write (the scheduler orders readers of version v first). Nothing to
    do, and nearly free, while no assign is pending."""
    if not _pending_assigns():
        return []
    chosen = {id(t) for t in pending}
    outs, extra = [t.uop for t in pending], list[Tensor]()
    while overwritten := _overwritten_by(outs):
        # (an ASSIGN node computed before writes nothing now: a tensor holding it, `x.sum(())` of a pending assign,
        # reads that version like any view of it)
        writing = {u for t in (*pending, *extra) if (u := t.uop).op is Ops.ASSIGN and REALIZED.get(u) is None}
        _copy_stale_realized(pending, overwritten, writing)
        found = _lazy_readers(StaleReaders(overwritten, REALIZED.get, writing, None, REALIZED.id_tables()), chosen)
        if not found:
            break
        extra += found
        # their graphs may hold assigns of their own; not when every pending assign is written already (an optimizer
        # step's gradients: no walk through the backward graph. An assign whose target tensor is gone is not tracked:
        # a reader of what it overwrites then raises the stale-read error instead of keeping its value)
        if all(t.uop in writing for t in _pending_assigns()):
            break
        outs = [t.uop for t in found]
    return extra


def _copy_stale_realized(pending: list[Tensor], overwritten: set[tuple[Buffer, int]], writing: set[UOp]) -> None:
    """A tensor asked for that is a mere view of a version this realize overwrites reads nothing when realized, so
    it would keep naming the old version: it gets a copy, made before the write. (Its node computed before: `b = -x`
    after `a = -x; a.assign(a + 1)` computed `-x` into a's buffer; or a reshape of an assign realized since.)"""
    for t in pending:
        if t.uop not in writing and _stale_view(t.uop, overwritten):
            t.uop = UOp(Ops.CONTIGUOUS, t.dtype, (t.uop,))


def _stale_view(u: UOp, overwritten: set[tuple[Buffer, int]] | None) -> bool:
    """Whether `u` is movement ops (and detaches) over a buffer view, or over a node computed before (an earlier
    assign, an op's result), that is one of the `overwritten` versions (any, when None): realizing `u` runs no kernel,
    and names that version."""
    while u.op in GroupOp.Movement or u.op is Ops.DETACH:
        u = u.src[0]
    view = u if is_buffer_view(u) else REALIZED.get(u)
    return view is not None and (overwritten is None or any(v in overwritten for v in view_versions(view)))


def _overwritten_by(outs: list[UOp]) -> set[tuple[Buffer, int]]:
    """The buffer versions realizing `outs` overwrites. An optimizer step realizes every pending assign as an output
    of its own: then no walk through the graphs is needed to find them."""
    realizing = {id(o) for o in outs}
    if all(id(t.uop) in realizing for t in _pending_assigns()):
        return {v for u in outs if u.op is Ops.ASSIGN for v in written_versions(u)}
    return overwritten_versions(outs, REALIZED.get)


def realize_pending_assigns() -> None:
    """Apply every in-place write queued so far (`t.assign(v)` not realized yet). A TinyJit calls this before it
    captures a function: a write made before the call (a new learning rate) is the state's value at the call, not
    a kernel of the function to be replayed with that value on every later call."""
    if pending := _pending_assigns():
        with no_grad():
            Tensor.realize_all(*pending)


def any_lazy_tensors() -> bool:
    """Whether some tensor may still be lazy (a TinyJit replay skips the readers' check when none is)."""
    return bool(_LAZY.tensors())


def realize_readers_of(overwritten: set[tuple[Buffer, int]], writers: list[Tensor]) -> None:
    """Before something other than a schedule (a TinyJit replay) overwrites these buffer versions in place, realize
    the lazy tensors that read them. `writers`: the tensors that own those buffers and move to the new versions."""
    readers = StaleReaders(overwritten, REALIZED.get, set(), REALIZED.owned_epoch)
    if found := _lazy_readers(readers, {id(t) for t in writers}):
        # (with their lineage, as the readers a realize finds: a loss built before the replay, realized here because
        # the replay advances the random state its dropout read, still differentiates)
        Tensor.realize_all(*found)


def _lazy_readers(readers: StaleReaders, skip: set[int]) -> list[Tensor]:
    """The tensors of `_LAZY` (but those in `skip`, which the found ones join) whose graphs read an overwritten
    version. A tensor that is a mere view of such a version (an alias of the old contents) is given a copy of its
    own. While this thread captures a TinyJit step, its own tensors only: the capture records what it realizes, and
    another thread's tensors are not the step's (a draw of theirs reads the random state's kept copy: `_RNG`)."""
    found = []
    for t in _LAZY.tensors(everyone=not capture_hooks):
        if id(t) not in skip and readers.reads_old(t.uop):
            if is_buffer_view(t.uop) or _stale_view(t.uop, None):
                # (a node computed before, whose view is the old version: realizing it reads nothing, it would
                # keep naming that version; a copy reads it before the write)
                t.uop = UOp(Ops.CONTIGUOUS, t.dtype, (t.uop,))
            found.append(t)
            skip.add(id(t))
    return found


def _is_leaf_view(u: UOp) -> bool:
    """A buffer (or reshapes of one) with no lineage on any of its nodes: a leaf, nothing to substitute (a parameter;
    asked of every tensor that requires a gradient at each backward)."""
    while u.op is Ops.RESHAPE:
        if u in LINEAGE:
            return False
        u = u.src[0]
    return u.op is Ops.BUFFER and u not in LINEAGE


def _graph_nodes_of(targets: Sequence[Tensor], nodes: set[UOp]) -> list[UOp | None]:
    """Each target's node in a graph (`nodes`, lineage substituted), or None if the graph does not hold it.

    Usually that is the target's node itself. But a graph built on a pending update, `w.assign(...)` then `x @ w`,
    holds that ASSIGN node; if the update is realized before the backward (BatchNorm's forward realizes its running
    statistics, and the scheduler realizes with them the pending writes that read what they overwrite), `w` moves
    to the written buffer's view while the graph keeps the ASSIGN: the target is then that ASSIGN node."""
    written = {view: n for n in nodes if n.op is Ops.ASSIGN and (view := REALIZED.get(n)) is not None}
    out: list[UOp | None] = []
    for t in targets:
        u = _with_lineage(t.uop)
        # (a pending write's value is kept as it is, lineage and all: a realized tensor it holds is there as itself)
        out.append(u if u in nodes else t.uop if t.uop in nodes else written.get(t.uop))
    return out


# operations the CPU renders as libm calls (exp2f, log2f, sinf, powf): inside a vectorised loop glibc's SIMD versions
# (libmvec) may give a result 1 ulp away from the scalar call's, so the same expression computed in two kernels can
# differ in its last bit
_LIBM_OPS = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW})
_FUSED_OPS = GroupOp.Elementwise | GroupOp.Movement


def _calls_libm(u: UOp) -> bool:
    """In: a lazy graph. Out: whether the elementwise expression a kernel would compute for it (the walk stops at
    buffers, reductions and other kernel boundaries) holds a libm call.

    A max reduction's gradient and argmax compare an input with its maximum for exact equality; computed twice, once
    in the max's kernel and once in the comparison's, an input with a libm call need not be bit-identical (the max of
    tanh(x) over a padded column got no gradient where one kernel's SIMD exp2f and the other's scalar one differed):
    such an input is stored once and both read it."""
    return any(n.op in _LIBM_OPS for n in u.toposort(stop=lambda n: n.op not in _FUSED_OPS))


def _reaches_a_grad_leaf(t: Tensor) -> bool:
    """Whether `t`'s graph (lineage substituted; not behind a DETACH) holds a tensor other than `t` that backward()
    fills (requires_grad=True, or a layer's parameter), for a `t` not made in an open no_grad() block: PyTorch's
    requires_grad of an op's result."""
    if not _REQUIRES_GRAD or (Tensor.no_grad and any(r() is t for block in _MODES.no_grad_blocks for r in block)):
        return False
    root = _with_lineage(t.uop)
    nodes = set(root.toposort(stop=lambda n: n.op is Ops.DETACH))
    others = [o for o in list(_REQUIRES_GRAD.values()) if o is not t and o._requires_grad is not False]
    # (a tensor whose node is t's own is another leaf made the same way, `Tensor.eye(3)` twice: lazy nodes are
    # shared, so that is no op of t's)
    return any(u is not None and u is not root for u in _graph_nodes_of(others, nodes))


def _accumulate(targets: Sequence[Tensor], grads: Sequence[Tensor | None]) -> None:
    """Add each gradient into its tensor's `.grad` (None: the gradient does not reach it, `.grad` stays)."""
    for t, g in zip(targets, grads):
        if g is not None:
            t.grad = g if t.grad is None else t.grad + g


def _attached_nodes(root: UOp, order: list[UOp], nodes: set[UOp]) -> set[UOp]:
    """The nodes of `root`'s graph (`order`, as the set `nodes`) not only behind a DETACH: those a gradient may
    reach."""
    if not any(n.op is Ops.DETACH for n in order):
        return nodes
    # `root.toposort(stop=DETACH)` as a set, from `order` (sources before their users, `root` last) without a second
    # walk: going from `root` down, a node is attached when an attached node other than a DETACH reads it
    attached, detach = {root}, Ops.DETACH
    for n in reversed(order):
        if n.op is not detach and n in attached:
            attached.update(n.src)
    return attached


def _others_in_graph(tensors: Sequence[Tensor], found: Sequence[Tensor], nodes: set[UOp]
                     ) -> list[tuple[Tensor, UOp]]:
    """`_in_graph` of the `tensors` not among `found`."""
    ids = {id(t) for t in found}
    return _in_graph([t for t in tensors if id(t) not in ids], nodes)


def _in_graph(tensors: Sequence[Tensor], nodes: set[UOp]) -> list[tuple[Tensor, UOp]]:
    """(tensor, its node) for the tensors a graph holds (`_graph_nodes_of`)."""
    return [(t, u) for t, u in zip(tensors, _graph_nodes_of(tensors, nodes)) if u is not None]


_LINEAGE_OPS = (Ops.RESHAPE, Ops.BUFFER, Ops.MULTI)  # the nodes LINEAGE has entries for (realized views)


def _with_lineage(u: UOp) -> UOp:
    """Replace realized buffer views by the graphs that computed them (so gradients reach the leaves).

    Usually no node of the graph has lineage (a training step's forward graph reads parameters and a batch): one walk
    finds that, and the graph is returned as it is, without a rewrite."""
    return _lineage_and_order(u, False)[0]


class LineageWatch:
    """While a TinyJit captures a step: which buffer versions the lineage of views realized before the capture
    reads (`_lineage_and_order` records them). A gradient through such a view (`h = (w * 2).realize()` made before
    the step, then `(h * w).sum().backward()` in it) reaches w only while w is still at the version h was made
    from; once w is assigned, an eager call no longer differentiates through h, and a replay of kernels captured
    while it did would give other gradients. The JIT checks these versions before each replay."""

    def __init__(self) -> None:
        self.outside = set(LINEAGE.keys())  # the views realized before the capture (held only while it runs)
        self.reads: set[tuple[Any, int]] = set()  # (Buffer, version)

    def record(self, nodes: list[UOp]) -> None:
        stack = [n for n in nodes if n.op in _LINEAGE_OPS and n in self.outside and n in LINEAGE]
        seen: set[UOp] = set()
        while stack:
            for n in LINEAGE[stack.pop()].toposort():
                if n.op is Ops.BUFFER:
                    self.reads.add(n.arg)
                elif n.op in _LINEAGE_OPS and n in LINEAGE and n not in seen:
                    seen.add(n)
                    stack.append(n)


LINEAGE_WATCHES: list[LineageWatch] = []  # the TinyJit captures in progress (at most one)


def _lineage_and_order(u: UOp, want_order: bool = True) -> tuple[UOp, list[UOp]]:
    """`_with_lineage(u)` and, with `want_order`, its toposort (the walk that found no lineage to substitute, when
    there was one: `backward` needs the graph's nodes too). Without `want_order` the list may be empty."""
    if not LINEAGE or _is_leaf_view(u):
        return u, u.toposort() if want_order else []
    nodes = u.toposort()
    if not any(n.op in _LINEAGE_OPS and n in LINEAGE for n in nodes):
        return u, nodes
    for watch in LINEAGE_WATCHES:
        watch.record(nodes)
    # an ASSIGN's target is where it writes, not a value: it stays the buffer, also where the graph reads it (the
    # same node). A state tensor written each step, `c.assign(c + 1)`, has lineage from its last write, which reads
    # the version this pending write will overwrite: substituting it would recompute the old value from contents
    # that are gone (and write the result into c's buffer). A gradient through that read is not taken (a leaf).
    # A pending write itself is kept as it is, value and all: rewritten, it would be a second ASSIGN of the same
    # buffer version, and a schedule holding both (the write read by the loss and its copy in the gradients' graph)
    # wrote it twice (momentum SGD stepped lazily, with a gradient realized in between: the next loss computed from
    # the weights updated twice). Its value's realized parts are leaves for the gradient.
    assigns = [n for n in nodes if n.op is Ops.ASSIGN]
    rewritten = graph_rewrite(u, _lineage_matcher(), ctx={n.src[0] for n in assigns}, memo={n: n for n in assigns})
    return rewritten, rewritten.toposort() if want_order else []


@functools.cache
def _lineage_matcher() -> PatternMatcher:
    """The rewrite rules of `_with_lineage` (made once); ctx: the nodes not to replace (assign targets)."""
    return PatternMatcher([(UPat(op, name="x"), lambda ctx, x: None if x in ctx else _lineage_of_view(x))
                           for op in _LINEAGE_OPS])


def _lineage_of_view(view: UOp) -> UOp | None:
    """The graph that computed a realized `view` (None if none is recorded), known to be realized at `view`.

    Realizing recorded that in REALIZED already; but inside a TinyJit capture (`REALIZED.isolated()`) the entries
    made before it are hidden, and the substituted graph would be recomputed from its sources, which may be gone
    (a data set drawn with `Tensor.randn` read the generator's state, overwritten since). A substituted node stands
    for the view, so it is loaded from there; the capture then reads that buffer as state, as it would have read
    the view itself."""
    node = LINEAGE.get(view)
    if node is not None and REALIZED.get(node) is None:
        REALIZED[node] = view
    return node


def _scalar_dtype(x: Scalar) -> DType:
    """A Python scalar's dtype: bool, the default float, or the default int (int64 if it does not fit int32)."""
    d = dtypes.from_py(x)
    if d != dtypes.default_int or dtypes.int32.min <= x <= dtypes.int32.max:
        return d
    if not dtypes.int64.min <= x <= dtypes.int64.max:
        raise OverflowError(f"Python int {x} does not fit int64; pass dtype= to choose how to store it")
    return dtypes.int64


def _list_dtype(data: list[Any] | tuple[Any, ...]) -> DType:
    """Python values follow `dtypes.from_py`; lists holding numpy scalars or arrays take numpy's dtype for them."""
    try:
        return dtypes.from_py(data)
    except TypeError:
        try:
            probe = np.array(data)
        except ValueError:
            raise ValueError("cannot make a tensor from a ragged nested list") from None
        if probe.dtype.kind not in "biuf":
            raise
        return dtypes.from_np(probe.dtype)


def _short(data: Any, limit: int = 60) -> str:
    text = repr(data)
    return text if len(text) <= limit else text[:limit] + "..."


def _uop_from_bytes(data: bytes | np.ndarray, want: DType | None, device: str) -> UOp:
    """`Tensor(b"...", dtype=dt)`: the bytes read as dt's items, little-endian (tinygrad's and `torch.frombuffer`'s
    meaning; each byte was cast to a float32 value before, 8 values for two packed floats). `data` may be a uint8
    array (a file's bytes, `Tensor(pathlib.Path(...))`: read with numpy, never copied into a `bytes`)."""
    dt = want or dtypes.uint8
    if len(data) % dt.itemsize:
        raise ValueError(f"Tensor(bytes, dtype={dt.name}): {len(data)} bytes are not a whole number of "
                         f"{dt.itemsize}-byte items")
    if dt == dtypes.bfloat16:  # (no numpy bfloat16: its 16-bit patterns, then reinterpreted on the device)
        bits = _uop_from_array(np.frombuffer(data, dtype="<u2").astype(np.uint16), dtypes.uint16, device)
        return UOp(Ops.BITCAST, dtypes.bfloat16, (bits,))
    return _uop_from_array(np.frombuffer(data, dtype=np.dtype(dt.np).newbyteorder("<")), dt, device)


def _bytes_as_lists(data: list[Any] | tuple[Any, ...]) -> list[Any] | tuple[Any, ...]:
    """A nested list of `bytes` (`Tensor([b"abc", b"def"])`, tinygrad's way to batch byte strings) with each bytes as
    the list of its byte values (a nested sequence of ints, as tinygrad reads it); other data as it is (probed by its
    first innermost item: a list mixing bytes with other items is ragged anyway)."""
    first: Any = data
    while isinstance(first, (list, tuple)) and first:
        first = first[0]
    if not isinstance(first, (bytes, bytearray)):
        return data
    return [list(x) if isinstance(x, (bytes, bytearray)) else _bytes_as_lists(x) if isinstance(x, (list, tuple))
            else x for x in data]


def _uop_from_array(data: Any, want: DType | None, device: str) -> UOp:
    if isinstance(data, np.ndarray) or isinstance(data, np.generic):
        array = np.asarray(data)
        if not array.dtype.isnative:  # big-endian data (e.g. read from an IDX file): same values, native bytes
            array = array.astype(array.dtype.newbyteorder("="))
        if array.dtype == np.float16 or array.dtype.kind in "biuf":
            dtype = want if want is not None and want == dtypes.bfloat16 else dtypes.from_np(array.dtype)
        else:
            raise TypeError(f"cannot make a tensor from a numpy array of dtype {array.dtype}")
    elif isinstance(data, (list, tuple)):
        data = _bytes_as_lists(data)
        dtype = _list_dtype(data) if want is None else want
        try:
            try:
                array = np.array(data, dtype=np.float32 if dtype == dtypes.bfloat16 else dtype.np)
            except OverflowError:
                if want is not None or dtype != dtypes.default_int:
                    raise
                dtype = dtypes.int64  # ints too big for int32 get int64, as a lone scalar does
                array = np.array(data, dtype=np.int64)
        except OverflowError as e:
            raise OverflowError(f"cannot make a {dtype.name} tensor from {_short(data)}: {e}") from None
        except ValueError as e:
            raise ValueError(f"cannot make a tensor from a ragged or mixed nested list: {e}") from None
        if array.dtype == object:
            raise ValueError("cannot make a tensor from a ragged nested list")
    else:
        raise TypeError(f"cannot make a tensor from {type(data).__name__}")
    if dtype == dtypes.bfloat16:
        array = f32_to_bf16(array.astype(np.float32))
    buf = Buffer(device, array.size, dtype, owned=True)
    if array.size:
        buf.copyin(array)
    return buffer_view(buf, array.shape)


def _check_fits(dtype: DType, values: Sequence[Scalar], op: str) -> None:
    """OverflowError when a value an int tensor would hold does not fit its dtype (numpy and PyTorch wrap)."""
    for v in values:
        if not dtype.min <= v <= dtype.max:
            raise OverflowError(f"{op}: value {v} does not fit {dtype.name} (range {dtype.min}..{dtype.max})")


_SIZE_OPS = (Ops.DEFINE_VAR, Ops.BIND, Ops.CONST, Ops.ADD, Ops.MUL, Ops.NEG, Ops.IDIV, Ops.MOD, Ops.MAX)


def _is_size_expression(x: UOp) -> bool:
    """Whether a UOp is a symbolic int (a Variable, bound or not, or an int expression of them), not a tensor's
    graph. (Stops at the first node that is not a size op: an op's result is answered in a step or two.)"""
    if x.op not in _SIZE_OPS or x.dtype != dtypes.int32:
        return False
    stack, seen, has_var = [x], set[UOp](), False
    while stack:
        u = stack.pop()
        if u.op not in _SIZE_OPS or (u.op is Ops.CONST and u.src):  # (a tensor's constant has a DEVICE source)
            return False
        has_var = has_var or u.op is Ops.DEFINE_VAR
        stack.extend(s for s in u.src if s not in seen)
        seen.update(u.src)
    return has_var


def _check_bound(x: UOp, where: str) -> None:
    """A symbolic size used by a tensor must have values for all its variables (`Variable(...).bind(n)`)."""
    if x.dtype != dtypes.int32 or not all(u.op in _SIZE_OPS for u in x.toposort()):
        raise TypeError(f"{where}: a UOp used as a size must be an int expression of Variables, got {x.op}")
    if unbound_variables(x):
        names = ", ".join(sorted(v.arg[0] for v in unbound_variables(x)))
        raise ValueError(f"{where}: Variable {names} is not bound to a value; use Variable(...).bind(n)")


def _shrink_bound(x: Any) -> int | UOp:
    if isinstance(x, UOp):
        _check_bound(x, "shrink")
        return as_sint(x)
    return int(x)


def _no_symbolic(op: str, *shapes: tuple[Any, ...]) -> None:
    if any(isinstance(d, UOp) for shape in shapes for d in shape):
        raise NotImplementedError(f"{op} with a symbolic (Variable) size is not supported; use int sizes here, or "
                                  "shrink with the Variable after this op")
