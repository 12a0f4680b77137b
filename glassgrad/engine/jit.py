"""TinyJit: run a function's kernels again without Python building, scheduling or compiling anything.

In: a function of tensors (and hashable Python values) that realizes its work, typically one training step.
Out: a callable with the same arguments. Per *signature* (every tensor argument's shape, dtype and device, and the
value of every other argument):

  * call 1 runs the function normally (it compiles the kernels and lets lazy state, such as optimiser buffers,
    come into being);
  * call 2 runs it again while listening to `run_schedule` (the capture hook in engine/realize.py): every kernel
    run is recorded with its compiled program, launch size and buffers;
  * calls 3+ replay the recorded kernels with the new call's input buffers: no graph, no schedule, no codegen.

A new signature (another batch size, a changed Python scalar, `Tensor.training` or `no_grad` switched, a param
frozen or unfrozen by its `requires_grad`) starts at call 1 for that signature, so a replay never computes with
stale shapes or constants; each signature keeps its own capture.

Symbolic shapes: a bound Variable is keyed on its unbound form (in a tensor argument's shape, or passed itself), so
one capture serves every value. Each call's values (`var_vals`, from the arguments' BINDs) are passed to the kernels,
whose launch sizes are evaluated for them (`ProgramSpec.at`), and the returned tensors' shapes are bound to them.
Buffers of symbolic size are sized for the Variables' maximum, so the capture's buffers and memory plan fit all.

What a capture holds (tinygrad's rule): tensors passed as arguments, also inside a list/tuple/dict argument, are
*inputs*, swapped for the new call's tensors on each replay. Every other buffer the kernels touch is *state*,
used by identity: parameters, optimiser moments, BatchNorm running statistics. State written in place (`assign`)
stays in place on replay, and the tensors owning it move to the new buffer version as they would eagerly.
Intermediates that nothing outside the capture holds share memory (engine/memory.py).

Returned tensors are realized. Their buffers belong to the capture: every replay returns the same tensor objects
with new values, so a result must be read (`.numpy()`, `.item()`) or copied before the next call.

On a device with graphs (CUDA), each run of consecutive kernels replays as one graph (`_KernelGraph`): recorded
at the first replay, then only the launches whose inputs or Variable values changed are updated in it. Copies stay
outside the graphs. `CUDAGRAPH=0`, `TIMING=1` and `DEBUG>=2` launch kernel by kernel.

Limits: Python values and host data inside the function (`Tensor(np_array)` made there, closure scalars) are
constants of the capture (the capture keeps their buffers alive). A tensor made before the capture and read but not
written by it must stay alive: once no tensor holds its buffer (a batch rebound as a global, gradients of a
`backward()` run outside a jitted `opt.step()`), the next replay raises `JitError` instead of reading its old values.
Reading a tensor's values inside the function (`.item()`, `.numpy()`, `float(t)`) raises `JitError` at capture, as
in tinygrad: a replay would reuse the value read then (`UNSAFE_ALLOW_JIT_BUFFER=1` allows it).
Random numbers are drawn on the device, so each replay draws new ones. `JIT=0` runs the function eagerly on every call.
"""
from __future__ import annotations

import functools
import gc
import itertools
import weakref
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from glassgrad.codegen import ProgramSpec
from glassgrad.device import Buffer, Device, Launch, LaunchGraph
from glassgrad.dtype import dtypes
from glassgrad.engine import realize
from glassgrad.engine.memory import allocate_blocks, plan_memory
from glassgrad.engine.realize import compile_kernel, count_launch, run_allreduce, run_copy
from glassgrad.helpers import CUDAGRAPH, DEBUG, JIT, TIMING, kernel_flags, locked
from glassgrad.multi import at_current_versions, is_realized, view_parts
from glassgrad.schedule import REALIZED, ScheduleItem, buffer_view, is_buffer_view
from glassgrad.tensor import (
    ASSIGN_TARGETS,
    LINEAGE,
    LINEAGE_WATCHES,
    LineageWatch,
    Tensor,
    any_lazy_tensors,
    no_grad,
    realize_pending_assigns,
    realize_readers_of,
    requires_grad_changes,
)
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.params import size_vars
from glassgrad.uop.sint import rebind, sint_eval, unbind

ReturnType = TypeVar("ReturnType")


class JitError(RuntimeError):
    """A function TinyJit cannot capture or replay faithfully, or arguments it cannot take."""


# ---------------------------------------------------------------------- arguments
@dataclass
class _Arguments:
    """What one call's arguments hold besides the signature: the tensors (with names, for errors) and the values of
    the bound Variables in them."""
    tensors: list[Tensor] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    var_vals: dict[str, int] = field(default_factory=dict)

    def unbound(self, size: Any, where: str) -> Any:
        """A size (or a bound Variable) in its unbound form; its values are collected into `var_vals`."""
        if not isinstance(size, UOp):
            return size
        kernel_form, values = unbind(size)
        for name, value in values.items():
            if self.var_vals.setdefault(name, value) != value:
                raise JitError(f"TinyJit argument {where}: Variable {name!r} is bound to {self.var_vals[name]} and "
                               f"{value} in one call")
        return kernel_form


def _describe(value: Any, where: str, args: _Arguments) -> Hashable:
    """The part of the signature an argument gives; its tensors and Variable values are collected in `args`."""
    if isinstance(value, Tensor):
        args.tensors.append(value)
        args.names.append(where)
        layout = value.uop.arg if value.uop.op is Ops.MULTI else None  # the sharded axis (several devices)
        return ("Tensor", tuple(args.unbound(d, where) for d in value.shape), value.dtype, value.device, layout)
    if isinstance(value, UOp) and value.op is Ops.BIND:
        return ("Variable", args.unbound(value, where))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_describe(v, f"{where}[{i}]", args) for i, v in enumerate(value)))
    if isinstance(value, dict):
        return ("dict", tuple((k, _describe(value[k], f"{where}[{k!r}]", args)) for k in sorted(value, key=repr)))
    try:
        hash(value)
    except TypeError:
        raise TypeError(f"TinyJit argument {where} is a {type(value).__name__}: arguments must be tensors, hashable "
                        "values, or lists/tuples/dicts of them") from None
    return (type(value).__name__, repr(value) if isinstance(value, float) else value)  # repr: -0.0 and nan


def _signature(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Hashable, _Arguments]:
    found = _Arguments()
    key = tuple((name, _describe(value, f"{name!r}" if isinstance(name, str) else f"#{name}", found))
                for name, value in [*enumerate(args), *sorted(kwargs.items())])
    # the modes change what the function builds; the codegen flags (ALLOW_TF32) the kernels it captures; a frozen
    # (or unfrozen) param changes which params backward() and the optimizer touch
    return (key, Tensor.training, Tensor.no_grad, kernel_flags(), requires_grad_changes()), found


def _forget_lineage(tensors: list[Tensor]) -> None:
    """Drop the lineage of every realized view of these tensors' buffers. Not only the tensors' own views: the
    realize that made them may have recorded another shape of the same buffer (a gather's (n, 1) sum before the
    reshape to (n,)), which `x.reshape(-1, 1)` in the step finds, and whose graph reads what made the input (inside
    a capture nothing realized before is reused: `Tensor.randint(...)` would be drawn again from an old state)."""
    if not tensors:
        return
    buffers = {id(part.base.arg[0]) for t in tensors for part in view_parts(t.uop)}
    for view in list(LINEAGE.keys()):
        if view.op in (Ops.BUFFER, Ops.RESHAPE, Ops.MULTI) and \
                any(id(part.base.arg[0]) in buffers for part in view_parts(view) if part.base.op is Ops.BUFFER):
            LINEAGE.pop(view, None)


def _input_buffers(tensors: list[Tensor], names: list[str]) -> tuple[list[Buffer], list[Tensor]]:
    """Realize the input tensors and return their buffers (a tensor on several devices has one per device) with the
    tensor each belongs to; two inputs sharing one buffer are refused."""
    Tensor.realize_all(*tensors)
    # an input is a leaf of the step: a gradient must read its buffer (the one each call swaps), not recompute it
    # from the graph that made it before the call (shard, to, a gather `X[samples]` of a random sample)
    _forget_lineage([t for t in tensors if not t._requires_grad and t.uop in LINEAGE])
    _separate_equal_inputs(tensors)
    buffers: list[Buffer] = []
    owners: list[Tensor] = []
    for t, name in zip(tensors, names):
        for part in view_parts(t.uop):
            buf = part.base.arg[0]
            if any(buf is b for b in buffers):
                other = names[next(i for i, o in enumerate(tensors) if o is owners[[id(b) for b in buffers].index(
                    id(buf))])]
                raise JitError(f"TinyJit inputs {other} and {name} share one buffer; pass it once, or pass a "
                               ".clone()")
            buffers.append(buf)
            owners.append(t)
    return buffers, owners


def _separate_equal_inputs(tensors: list[Tensor]) -> None:
    """Two different input tensors made by equal graphs (`Tensor.ones(4).contiguous().realize()` twice) were
    realized into one shared buffer (hash-consing): each later one gets a buffer of its own, so they are two inputs.
    The same tensor passed twice, or views of one buffer of a tensor's own, still share one (refused below). On
    several devices each part's buffer counts (`Tensor.ones(256).contiguous().realize().shard_(devices)` twice)."""
    first: dict[int, Tensor] = {}
    for t in tensors:
        parts = view_parts(t.uop)
        if not all(is_buffer_view(p) for p in parts) or not all(isinstance(d, int) for d in t.shape):
            continue
        shared = [b for b in (p.base.arg[0] for p in parts) if first.setdefault(id(b), t) is not t]
        if shared and not any(b.owned for b in shared):
            t._take_own_buffer()


def _tensors_viewing(buffers: list[Buffer]) -> dict[int, list[weakref.ref[Tensor]]]:
    """id(buffer) -> weak references to the live realized tensors whose node views it (one scan of the live
    objects; only at a capture, and at a replay where every tensor known to hold a buffer died)."""
    wanted = {id(b) for b in buffers}
    found: dict[int, list[weakref.ref[Tensor]]] = {}
    if wanted:
        for o in gc.get_objects():  # (a Tensor another thread is still constructing has no node yet)
            if type(o) is Tensor and (uop := getattr(o, "uop", None)) is not None and is_realized(uop):
                for part in view_parts(uop):
                    if id(part.base.arg[0]) in wanted:
                        found.setdefault(id(part.base.arg[0]), []).append(weakref.ref(o))
    return found


def _returned_tensors(ret: Any) -> list[Tensor]:
    if ret is None:
        return []
    if isinstance(ret, Tensor):
        return [ret]
    if isinstance(ret, (list, tuple)):
        return [t for r in ret for t in _returned_tensors(r)]
    if isinstance(ret, dict):
        return [t for r in ret.values() for t in _returned_tensors(r)]
    raise JitError(f"a TinyJit function must return tensors (or None, or lists/tuples/dicts of them), not a "
                   f"{type(ret).__name__}: a replay runs kernels only and could not recompute it")


def _with_tensors_swapped(ret: Any, swap: dict[int, Tensor]) -> Any:
    """`ret` with every tensor whose id is in `swap` replaced (in lists, tuples and dicts, as returned)."""
    if isinstance(ret, Tensor):
        return swap.get(id(ret), ret)
    if isinstance(ret, (list, tuple)):
        return type(ret)(_with_tensors_swapped(r, swap) for r in ret)
    if isinstance(ret, dict):
        return {k: _with_tensors_swapped(v, swap) for k, v in ret.items()}
    return ret


def _own_buffers(tensors: list[Tensor]) -> None:
    """Give each of these input tensors a buffer of its own where it shares one (equal graphs realize to one
    buffer), so an in-place write the function makes goes into the input's own buffer, which a replay swaps for the
    next call's, instead of into a copy the capture would keep as state."""
    for t in tensors:
        if isinstance(t.device, str) and t._view_of is None and is_buffer_view(t.uop) and \
                not t.uop.base.arg[0].owned and all(isinstance(d, int) for d in t.shape):
            t._take_own_buffer()  # (not a symbolic shape: its copy would be sized for this call's value only)


# ---------------------------------------------------------------------- a capture
@dataclass(eq=False)
class _Slot:
    """An intermediate buffer of a capture while it is planned: its size, and a weak reference to the buffer."""
    device: str
    nbytes: int
    ref: weakref.ref[Buffer]


Ref = Buffer | int | _Slot  # a kernel argument: a state buffer, the index of an input, an intermediate


@dataclass
class _Kernel:
    """One recorded launch. `args` holds the handles; the positions listed in `inputs` take each call's inputs.
    A kernel with Variables keeps its symbolic `spec`: each call evaluates the launch sizes for its values (those the
    call's arguments do not give keep their captured value, `var_vals`)."""
    program: Any
    name: str
    device: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    work: int
    flops: int
    nbytes: int
    args: list[Any]
    inputs: list[tuple[int, int]]  # (argument position, input index)
    spec: ProgramSpec | None = None  # with Variables only
    var_vals: dict[str, int] = field(default_factory=dict)
    vals: tuple[int, ...] = ()  # without Variables: its lifted constants' values (uop/params.py), the same each call

    @property
    def changes_per_call(self) -> bool:
        """Whether a call can launch it differently: it reads an input, or its sizes and values depend on Variables."""
        return bool(self.inputs) or self.spec is not None

    def launch(self, handles: list[Any], var_vals: dict[str, int]) -> tuple[Launch, int]:
        """This call's launch (its input handles in place; sizes and values for its Variables) and its flops."""
        args = self.args.copy()
        for pos, i in self.inputs:
            args[pos] = handles[i]
        if self.spec is None:
            return Launch(self.program, args, self.global_size, self.local_size, self.vals, self.work), self.flops
        values, spec = {**self.var_vals, **var_vals}, self.spec
        if any(name not in values for name in spec.vars):
            spec.at(values)  # (raises: which Variables have no value)
        return (Launch(self.program, args, tuple(sint_eval(g, values) for g in spec.global_size), self.local_size,
                       tuple(values[name] for name in spec.vars), sint_eval(spec.work, values)),
                sint_eval(spec.flops, values))

    def run(self, handles: list[Any], var_vals: dict[str, int], wait: bool) -> None:
        launch, flops = self.launch(handles, var_vals)
        count_launch(self.name, launch(wait), flops, self.nbytes, "(jit)")


@dataclass
class _Copy:
    dest: Buffer | int
    src: Buffer | int

    def run(self, inputs: list[Buffer]) -> None:
        run_copy(*(inputs[b] if isinstance(b, int) else b for b in (self.dest, self.src)))


@dataclass
class _Collective:
    """A recorded all-reduce: `bufs` are its n outputs, then its n inputs (inputs of the call as their index)."""
    op: Ops
    bufs: list[Buffer | int]

    def run(self, inputs: list[Buffer]) -> None:
        run_allreduce(self.op, [inputs[b] if isinstance(b, int) else b for b in self.bufs])


@dataclass(eq=False)
class _KernelGraph:
    """Consecutive kernels of one device whose backend has graphs (CUDA), replayed as one `LaunchGraph`.

    The graph is recorded at the first replay, with that call's launches. Later replays recompute only the launches
    that can change (kernels reading an input, or with Variables) and update in the graph those that did (another
    input buffer, another Variable value), then launch it. With `CUDAGRAPH=0`, `TIMING=1` or `DEBUG>=2` (a time per
    kernel) the kernels are launched one by one instead."""
    device: str
    kernels: list[_Kernel]
    graph: LaunchGraph | None = None
    launches: list[Launch] = field(default_factory=list)  # what the graph launches now
    updates: int = 0  # launches changed in the graph since it was recorded

    def __post_init__(self) -> None:
        self.changing = [i for i, k in enumerate(self.kernels) if k.changes_per_call]
        self.fixed_flops = sum(k.flops for k in self.kernels if not k.changes_per_call)
        self.nbytes = sum(k.nbytes for k in self.kernels)

    def run(self, handles: list[Any], var_vals: dict[str, int], wait: bool) -> None:
        if wait or not CUDAGRAPH:
            for kernel in self.kernels:
                kernel.run(handles, var_vals, wait)
            return
        flops = self.fixed_flops
        if self.graph is None:
            self.launches = [k.launch(handles, var_vals)[0] for k in self.kernels]
            record = Device[self.device].graph
            assert record is not None, f"{self.device} has no graphs"
            self.graph = record(self.launches)
        for i in self.changing:
            launch, kernel_flops = self.kernels[i].launch(handles, var_vals)
            flops += kernel_flops
            if not launch.same_as(self.launches[i]):
                self.graph.update(i, launch)
                self.launches[i] = launch
                self.updates += 1
        self.graph()
        count_launch(f"graph of {len(self.kernels)} kernels", 0.0, flops, self.nbytes, "(jit)", len(self.kernels))


Replayed = _Kernel | _Copy | _Collective | _KernelGraph  # a step of a replay


def _graph_kernels(steps: list[_Kernel | _Copy | _Collective], has_graph: Callable[[str], bool]) -> list[Replayed]:
    """Each run of two or more consecutive kernels of one device that has graphs becomes one `_KernelGraph`. Copies
    stay outside the graphs (they split the runs), as do kernels of devices without graphs (the CPU)."""
    def graph_device(step: _Kernel | _Copy | _Collective) -> str | None:
        return step.device if isinstance(step, _Kernel) and has_graph(step.device) else None

    out: list[Replayed] = []
    for device, run in itertools.groupby(steps, graph_device):
        group = list(run)
        if device is not None and len(group) >= 2:
            out.append(_KernelGraph(device, group))  # type: ignore[arg-type]  # graph_device: only kernels
        else:
            out.extend(group)
    return out


@dataclass
class _Step:
    """A captured item before planning: its AST (or COPY) and its buffers as references."""
    item_ast: Any
    device: str
    refs: list[Ref]
    nbytes: int
    var_vals: dict[str, int]


def _steps_of(items: list[ScheduleItem], inputs: list[Buffer]) -> tuple[list[_Step], dict[Buffer, int]]:
    """Turn the recorded items into steps, intermediates as weak `_Slot`s, and count in-place writes per buffer.
    An intermediate is a buffer a kernel creates in the capture (its first use writes version 0), that is not copied
    between devices or written in place later. The items are cleared: afterwards only the intermediates that
    something outside the capture holds (a returned tensor, a realized `.grad`) are still alive."""
    input_index = {id(b): i for i, b in enumerate(inputs)}
    inplace: dict[Buffer, int] = {}
    for item in items:
        for buf, version in item.writes:
            if version >= 1:
                inplace[buf] = inplace.get(buf, 0) + 1
    copied = {id(b) for item in items if item.ast.op in (Ops.COPY, Ops.ALLREDUCE) for b in item.bufs}
    refs: dict[int, Ref] = {}
    steps = []
    for item in items:
        for buf in item.bufs:
            if id(buf) in refs:
                continue
            if id(buf) in input_index:
                refs[id(buf)] = input_index[id(buf)]
            elif (buf, 0) in item.writes and id(buf) not in copied and buf not in inplace:
                refs[id(buf)] = _Slot(buf.device, max(buf.nbytes, 1), weakref.ref(buf))
            else:
                refs[id(buf)] = buf
        steps.append(_Step(item.ast, item.bufs[0].device, [refs[id(b)] for b in item.bufs],
                           sum(b.nbytes for b in item.bufs), item.var_vals))
    items.clear()
    return steps, inplace


class _Capture:
    """The kernels of one signature, ready to replay."""

    def __init__(self, items: list[ScheduleItem], inputs: list[Buffer], ret: Any, plan: bool,
                 input_tensors: list[Tensor], first_serial: int = -1,
                 lineage_reads: set[tuple[Buffer, int]] | None = None) -> None:
        written = {id(buf) for item in items for buf, _ in item.writes}
        steps, inplace = _steps_of(items, inputs)
        gc.collect()  # intermediates only the recorded items held are gone now
        self.ret = ret
        # an input returned itself (written in place, `t[1:3] = v; return t`): a replay returns that call's tensor
        returned = {id(t) for t in _returned_tensors(ret)}
        self.returned_inputs = {id(t): i for i, t in enumerate(input_tensors) if id(t) in returned}
        self.intermediate_bytes = 0  # bytes of the intermediates nothing else holds, each in its own buffer
        self.pool: list[Buffer] = []  # the memory they share when planned
        slot_buffers = self._place(steps, plan)
        # the kernels hold only handles: every buffer they use that is not the pool's (state, constants made from
        # host data inside the function, an intermediate something else holds) is kept alive here, or its memory
        # would go back to the allocator when its last tensor dies and be handed to another buffer
        self.state_buffers = list({id(r): r for s in steps for r in s.refs if isinstance(r, Buffer)}.values())
        # the buffers the kernels write that the capture holds (returned results, state), by id: an input that is
        # one of them is copied before a replay (`_without_aliases`)
        self.written_ids = {id(b) for b in self.state_buffers if id(b) in written}
        self._version_outputs(ret, inputs, inplace)
        self.steps = _graph_kernels([self._launch(s, slot_buffers) for s in steps],
                                    lambda device: Device[device].graph is not None)
        self.graphs = [s for s in self.steps if isinstance(s, _KernelGraph)]
        self.kernel_count = sum(isinstance(s, _Kernel) for s in self.steps) + sum(len(g.kernels) for g in self.graphs)
        self.symbolic_returns = [t for t in _returned_tensors(ret) if not all(isinstance(d, int) for d in t.shape)]
        index = {id(b): i for i, b in enumerate(inputs)}
        self.written_inputs = [(index[id(b)], n) for b, n in inplace.items() if id(b) in index]
        self.written_state = [(b, n) for b, n in inplace.items() if id(b) not in index]
        held = {id(r) for s in steps for r in s.refs if isinstance(r, Buffer)}
        self.owners = [(weakref.ref(t), part.base.arg[0]) for t in list(ASSIGN_TARGETS.values())
                       if is_realized(t.uop) for part in view_parts(t.uop) if id(part.base.arg[0]) in held]
        # buffers made before the capture that the kernels only read (weights, a dataset, a closure's tensor), with
        # the tensors holding them: when all of those are gone, the value is elsewhere now (see _check_outside_reads)
        outside = [b for b in self.state_buffers if b.serial < first_serial and b not in inplace]
        viewing = _tensors_viewing(outside)  # (one scan of the live objects for all of them)
        self.outside_reads = [(b, viewing[id(b)]) for b in outside if id(b) in viewing]
        # buffer versions the lineage of tensors made before the capture read, current then (`_check_lineage_reads`)
        self.lineage_reads = [(buf, version) for buf, version in lineage_reads or () if buf.version == version]
        if DEBUG >= 1:
            copies = sum(isinstance(s, _Copy) for s in self.steps)
            print(f"TinyJit: captured {self.kernel_count} kernels ({len(self.graphs)} graphs), {copies} copies, "
                  f"{len(inputs)} inputs; intermediates {self.intermediate_bytes / 1e6:.2f} MB in "
                  f"{sum(b.nbytes for b in self.pool) / 1e6:.2f} MB")

    def _place(self, steps: list[_Step], plan: bool) -> dict[_Slot, Buffer]:
        """A buffer for every intermediate still alive is itself (state, from now on); the others get a block of
        the memory plan (or, unplanned, a buffer each)."""
        dead: dict[_Slot, tuple[str, int]] = {}
        for step in steps:
            for i, r in enumerate(step.refs):
                if isinstance(r, _Slot):
                    alive = r.ref()
                    if alive is not None:
                        step.refs[i] = alive
                    else:
                        dead[r] = (r.device, r.nbytes)
        self.intermediate_bytes = sum(nbytes for _, nbytes in dead.values())
        if not plan:
            return {slot: self._new_block(device, nbytes) for slot, (device, nbytes) in dead.items()}
        placed, blocks = plan_memory([[r for r in s.refs if isinstance(r, _Slot)] for s in steps], dead)
        self.pool += allocate_blocks(blocks)
        return {slot: self.pool[placed[slot]] for slot in dead}

    def _new_block(self, device: str, nbytes: int) -> Buffer:
        self.pool.append(Buffer(device, nbytes, dtypes.uint8))
        return self.pool[-1]

    @staticmethod
    def _launch(step: _Step, slot_buffers: dict[_Slot, Buffer]) -> _Kernel | _Copy | _Collective:
        bufs = [slot_buffers[r] if isinstance(r, _Slot) else r for r in step.refs]
        if step.item_ast.op is Ops.COPY:
            dest, src = bufs
            return _Copy(dest, src)
        if step.item_ast.op is Ops.ALLREDUCE:
            return _Collective(step.item_ast.arg[0], bufs)
        kernel = compile_kernel(step.device, step.item_ast)
        args = [None if isinstance(b, int) else b.handle for b in bufs]
        inputs = [(pos, b) for pos, b in enumerate(bufs) if isinstance(b, int)]
        sized = bool(size_vars(kernel.spec.vars))  # (lifted constants keep their captured values: not per call)
        spec = kernel.spec.at(step.var_vals) if kernel.spec.vars else kernel.spec  # the captured launch
        return _Kernel(kernel.program, spec.name, step.device, tuple(sint_eval(g) for g in spec.global_size),
                       spec.local_size, sint_eval(spec.work), sint_eval(spec.flops), step.nbytes, args, inputs,
                       kernel.spec if sized else None, step.var_vals,
                       () if sized else tuple(step.var_vals[name] for name in kernel.spec.vars))

    def replay(self, tensors: list[Tensor], inputs: list[Buffer], var_vals: dict[str, int]) -> Any:
        self._check_outside_reads()
        self._check_lineage_reads()
        self._apply_pending_state()
        # lazy tensors built on what the replay overwrites keep their values: they are computed first
        if any_lazy_tensors():
            owners = [t for ref, _ in self.owners if (t := ref()) is not None]
            realize_readers_of({(inputs[i], inputs[i].version) for i, _ in self.written_inputs} |
                               {(buf, buf.version) for buf, _ in self.written_state} |
                               {(buf, buf.version) for buf in self.output_buffers},
                               owners + [tensors[i] for i, _ in self.written_inputs] + self.returned_outputs)
        inputs = self._without_aliases(inputs)
        handles = [b.handle for b in inputs]
        wait = DEBUG >= 2 or bool(TIMING)
        for step in self.steps:
            if isinstance(step, (_Copy, _Collective)):
                step.run(inputs)
            else:
                step.run(handles, var_vals, wait)
        self._advance_versions(tensors, inputs)
        for buf in self.output_buffers:
            buf.version += 1
        for t in self.returned_outputs:
            t.uop = at_current_versions(t.uop)
        self._bind_returned(var_vals)
        if self.returned_inputs:
            return _with_tensors_swapped(self.ret, {k: tensors[i] for k, i in self.returned_inputs.items()})
        return self.ret

    def _version_outputs(self, ret: Any, inputs: list[Buffer], inplace: dict[Buffer, int]) -> None:
        """The returned results' buffers are rewritten by every replay: they are versioned like buffers written in
        place (owned, a new version per replay, the returned tensors moved to it), so a result computed from an
        earlier call's output and kept (`kept.append((f(x) * 2).realize())`) is not mistaken for the same node of
        the next call's output (it was: every later call got the first replay's value), and a lazy one is realized
        before the replay overwrites what it reads. (One device, int shapes: the common case.)"""
        input_ids = {id(b) for b in inputs}
        self.returned_outputs: list[Tensor] = []
        buffers: dict[int, Buffer] = {}
        for t in _returned_tensors(ret):
            if id(t) in self.returned_inputs or isinstance(t.device, tuple) or not is_buffer_view(t.uop) or \
                    not all(isinstance(d, int) for d in t.shape):
                continue
            buf = t.uop.base.arg[0]
            if id(buf) in input_ids or buf in inplace or id(buf) not in self.written_ids:
                continue
            buf.owned = True
            buffers[id(buf)] = buf
            self.returned_outputs.append(t)
        self.output_buffers = list(buffers.values())

    def _without_aliases(self, inputs: list[Buffer]) -> list[Buffer]:
        """The inputs, each that is a buffer this capture's kernels write (a returned tensor fed back: `h = step(h)`)
        replaced by a copy: the replay would otherwise overwrite it while later kernels still read it (an RNN's
        `tanh(h @ W)` gave wrong numbers from the first replay on). Inputs written in place stay themselves."""
        written_inputs = {i for i, _ in self.written_inputs}
        aliased = [i for i, b in enumerate(inputs) if id(b) in self.written_ids and i not in written_inputs]
        if not aliased:
            return inputs
        out = list(inputs)
        for i in aliased:
            out[i] = Buffer(inputs[i].device, inputs[i].size, inputs[i].dtype)
            run_copy(out[i], inputs[i])
        return out

    def _check_lineage_reads(self) -> None:
        """The step differentiated through a tensor made before the capture, back to a buffer it was computed
        from (`LineageWatch`). If that buffer was written since, an eager call would no longer reach it through
        that tensor, so the captured gradient kernels are not the step any more: refuse rather than replay them."""
        for buf, version in self.lineage_reads:
            if buf.version != version:
                raise JitError(f"the TinyJit step differentiates through a tensor made before its capture from a "
                               f"buffer ({buf.size} x {buf.dtype.name}) that has been assigned since (version "
                               f"{version} -> {buf.version}): a replay would not compute what the function now "
                               "computes. Compute that tensor inside the jitted function, or .detach() it")

    def _check_outside_reads(self) -> None:
        """A buffer made before the capture, which the kernels read, and which no tensor holds any more: the program
        replaced the tensor (a batch made outside the function each step and read as a global, gradients from a
        `backward()` run outside a jitted `opt.step()`), so the function run eagerly would read the new one, and a
        replay would silently read the old values. Raise instead."""
        lost = [(buf, refs) for buf, refs in self.outside_reads if all(r() is None for r in refs)]
        if not lost:
            return
        again = _tensors_viewing([buf for buf, _ in lost])  # a new tensor object may hold the same buffer
        for buf, refs in lost:
            if id(buf) not in again:
                raise JitError(f"the captured kernels read a tensor made before the capture ({buf.size} x "
                               f"{buf.dtype.name} on {buf.device}) that no longer exists: a replay would read its old "
                               "values. A tensor that changes between calls (a batch, gradients from a backward() "
                               "outside the function) must be an argument of the jitted function or computed inside "
                               "it; call reset() to capture again")
            refs[:] = again[id(buf)]

    def _bind_returned(self, var_vals: dict[str, int]) -> None:
        """Returned tensors of symbolic shape read their buffers at this call's sizes."""
        for t in self.symbolic_returns:
            base = t.uop.base
            t.uop = buffer_view(base.arg[0], tuple(rebind(d, var_vals) for d in t.shape), base.arg[1])

    def _apply_pending_state(self) -> None:
        """Assigns to state queued since the last call (say a new learning rate) are applied before the replay
        reads it; a state tensor that now lives in another buffer cannot be replayed."""
        pending = []
        for ref, buf in self.owners:
            t = ref()
            if t is None:
                continue
            uop = t.uop
            if uop.op is Ops.RESHAPE and uop.src[0].op is Ops.BUFFER:  # one device, realized (the common case)
                if uop.src[0].arg[0] is buf:
                    continue
            if not is_realized(uop):
                pending.append(t)
            elif all(part.base.arg[0] is not buf for part in view_parts(uop)):
                raise JitError(f"a state tensor (shape {t.shape}) the TinyJit captured moved to another buffer; "
                               "write into it with assign(), or call reset() on the jitted function")
        if pending:
            with no_grad():
                Tensor.realize_all(*pending)

    def _advance_versions(self, tensors: list[Tensor], inputs: list[Buffer]) -> None:
        """Buffers written in place are at a new version now, as after an eager step: their owners read it."""
        for i, writes in self.written_inputs:
            inputs[i].version += writes
        for i, _ in self.written_inputs:
            tensors[i].uop = at_current_versions(tensors[i].uop)
        for buf, writes in self.written_state:
            buf.version += writes
        for ref, buf in self.owners:
            t = ref()
            if t is None:
                continue
            uop = t.uop
            if uop.op is Ops.RESHAPE or uop.op is Ops.BUFFER:  # one device (the common case): a view of `buf`
                if is_buffer_view(uop) and uop.base.arg[1] != buf.version:
                    t.uop = buffer_view(buf, t.shape, buf.version)
            elif is_realized(uop):
                t.uop = at_current_versions(uop)


# ---------------------------------------------------------------------- the decorator
class TinyJit(Generic[ReturnType]):
    """`@TinyJit` on a function of tensors: call 1 runs it, call 2 captures its kernels, later calls replay them
    (per signature: shapes, dtypes and devices of the tensor arguments, values of the others). Returned tensors are
    realized, and their buffers are reused by the next call: read or copy a result before calling again.
    `plan_memory=False` gives every intermediate its own buffer (to measure what the planner saves). `prune` is
    tinygrad's keyword, accepted for its programs: tinygrad drops the kernels that do not depend on the inputs from
    the replays; here every captured kernel is replayed (the same results, a few more launches)."""

    def __init__(self, fn: Callable[..., ReturnType], plan_memory: bool = True, prune: bool = False) -> None:
        self.fn = fn
        self.prune = prune
        self.plan_memory = plan_memory
        self._seen: set[Hashable] = set()
        self._captures: dict[Hashable, _Capture] = {}
        functools.update_wrapper(self, fn)

    def __get__(self, obj: Any, objtype: Any = None) -> Callable[..., ReturnType]:
        return functools.partial(self.__call__, obj)  # a jitted method

    def reset(self) -> None:
        """Forget every capture: the next call runs eagerly again."""
        self._seen.clear()
        self._captures.clear()

    @property
    def captures(self) -> int:
        return len(self._captures)

    def capture_of(self, *args: Any, **kwargs: Any) -> _Capture | None:
        """The capture that a call with these arguments would replay (None if there is none yet)."""
        return self._captures.get(_signature(args, kwargs)[0])

    @locked  # (a capture's hooks and lineage watch, and a replay's buffers and versions, are process-wide state)
    def __call__(self, *args: Any, **kwargs: Any) -> ReturnType:
        if not JIT:
            return self._run_eagerly(args, kwargs)
        if realize.capture_hooks:
            raise JitError(f"{self.fn.__name__}: a TinyJit cannot run inside another TinyJit's capture")
        key, found = _signature(args, kwargs)
        inputs, owners = _input_buffers(found.tensors, found.names)
        captured = self._captures.get(key)
        if captured is not None:
            if any(not inputs[i].owned for i, _ in captured.written_inputs):
                _own_buffers([owners[i] for i, _ in captured.written_inputs])
                inputs, owners = _input_buffers(found.tensors, found.names)
            return captured.replay(owners, inputs, found.var_vals)
        if key not in self._seen:
            self._seen.add(key)
            return self._run_eagerly(args, kwargs)
        if not all(b.owned for b in inputs):
            _own_buffers(found.tensors)
            inputs, owners = _input_buffers(found.tensors, found.names)
        captured = self._capture(args, kwargs, inputs, owners)
        self._captures[key] = captured
        return captured.ret

    def _run_eagerly(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ReturnType:
        ret = self.fn(*args, **kwargs)
        with no_grad():
            Tensor.realize_all(*_returned_tensors(ret))
        return ret

    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any], inputs: list[Buffer],
                 input_tensors: list[Tensor]) -> _Capture:
        realize_pending_assigns()  # writes queued before the call are not the function's kernels
        first_serial = next(Buffer.serials)  # buffers numbered below existed before the capture
        items: list[ScheduleItem] = []
        hook = items.append
        realize.capture_hooks.append(hook)
        watch = LineageWatch()
        LINEAGE_WATCHES.append(watch)
        try:
            with REALIZED.isolated():
                ret = self._run_eagerly(args, kwargs)
        finally:
            realize.capture_hooks.remove(hook)
            LINEAGE_WATCHES.remove(watch)
            watch.outside.clear()
        input_ids = {id(b) for b in inputs}
        for t in _returned_tensors(ret):
            if all(t is not i for i in input_tensors) and \
                    any(id(part.base.arg[0]) in input_ids for part in view_parts(t.uop)):
                raise JitError(f"{self.fn.__name__} returns (a view of) one of its inputs; return a copy "
                               "(x.contiguous()), since a replay does not recompute it")
        if not items:
            raise JitError(f"{self.fn.__name__} ran no kernels while being captured: nothing to replay")
        return _Capture(items, inputs, ret, self.plan_memory, input_tensors, first_serial, watch.reads)
