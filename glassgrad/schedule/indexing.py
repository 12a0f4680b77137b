"""Lowering one kernel's tensor graph to a kernel AST: movement ops become index arithmetic.

In: the tensor-graph node a kernel computes, and the buffers of every already-materialised node it reads.
Out: `SINK(STORE(out, index, value))`, where `value` is a scalar expression of LOADs, ALU ops and REDUCEs
written over RANGE nodes (one per output dimension, one per reduced dimension).

This is "rangeify": instead of tracking views, each node is evaluated *at an index*. Given the index tuple of
a node's output element, a movement op tells which element of its source that is:
  permute -> reorder the indices;  expand -> the broadcast dimension reads index 0;
  shrink  -> add the start;        flip   -> size-1-i;
  pad     -> subtract the left pad, and the element is valid only inside the source (a gate on the loads);
  reshape -> flatten the indices of a group of dimensions and split them again in the source's shape.
The symbolic simplifier then folds the resulting divisions and modulos away where it can.

Symbolic shapes (glassgrad/uop/sint.py): tensor shapes may hold bound Variables (`BIND`). Every size that enters the
kernel goes through `KernelBuilder.size`, which replaces each BIND by its unbound DEFINE_VAR and records the bound
value in `var_vals`. So the AST (and the compiled kernel) is the same for every value, and the values travel with the
schedule item, to be passed as the kernel's int arguments.
"""
from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from itertools import count
from typing import cast

from glassgrad.device import Buffer
from glassgrad.dtype import DType, dtypes
from glassgrad.errors import ArgumentError
from glassgrad.helpers import prod
from glassgrad.uop.ops import GroupOp, Ops, UOp, dtype_bounds
from glassgrad.uop.pattern import substitute
from glassgrad.uop.sint import max_size, sint, unbind
from glassgrad.uop.symbolic import simplify

Index = tuple[UOp, ...]
Request = tuple[UOp, Index, "UOp | None"]  # (node, index, gate): "the value of node at index"
LoweringStep = Generator[Request, UOp, UOp]  # yields what it needs, receives it, returns the value


def reshape_groups(old: tuple[sint, ...], new: tuple[sint, ...]) -> list[tuple[list[int], list[int]]]:
    """Split two shapes of equal size into runs of dimensions with equal products: [(old dims, new dims)]."""
    if not all(isinstance(d, int) for d in old + new):
        return _symbolic_reshape_groups(old, new)
    return _int_reshape_groups(cast(tuple[int, ...], old), cast(tuple[int, ...], new))


def _int_reshape_groups(old: tuple[int, ...], new: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    if prod(old) == 0:
        return [(list(range(len(old))), list(range(len(new))))]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        old_dims: list[int] = []
        new_dims: list[int] = []
        old_size = new_size = 1
        if i < len(old):
            old_dims.append(i); old_size *= old[i]; i += 1  # noqa: E702
        if j < len(new):
            new_dims.append(j); new_size *= new[j]; j += 1  # noqa: E702
        while old_size != new_size:
            if old_size < new_size:
                old_dims.append(i); old_size *= old[i]; i += 1  # noqa: E702
            else:
                new_dims.append(j); new_size *= new[j]; j += 1  # noqa: E702
        groups.append((old_dims, new_dims))
    return groups


def _symbolic_reshape_groups(old: tuple[sint, ...], new: tuple[sint, ...]) -> list[tuple[list[int], list[int]]]:
    """Symbolic sizes cannot be compared by size: equal leading and trailing dimensions keep their own groups,
    everything between is one group (flattened and split again)."""
    lead = 0
    while lead < min(len(old), len(new)) and _same(old[lead], new[lead]):
        lead += 1
    trail = 0
    while trail < min(len(old), len(new)) - lead and _same(old[-1 - trail], new[-1 - trail]):
        trail += 1
    groups = [([i], [i]) for i in range(lead)]
    middle = (list(range(lead, len(old) - trail)), list(range(lead, len(new) - trail)))
    if middle[0] or middle[1]:
        groups.append(middle)
    return groups + [([len(old) - 1 - t], [len(new) - 1 - t]) for t in reversed(range(trail))]


def _same(a: sint, b: sint) -> bool:
    return a is b if isinstance(a, UOp) or isinstance(b, UOp) else a == b


def size_node(s: sint, dtype: DType) -> UOp:
    """A size in a kernel: a constant, or a (kernel-form, unbound) symbolic expression in the index dtype."""
    return s.cast(dtype) if isinstance(s, UOp) else UOp.const(dtype, s)


def flat_index(idxs: Index, shape: tuple[sint, ...], dtype: DType) -> UOp:
    """Row-major linear index of `idxs` in `shape` (symbolic sizes in kernel form)."""
    total = UOp.const(dtype, 0)
    for i, s in zip(idxs, shape):
        total = total * size_node(s, dtype) + i if s != 1 else total
    return total


def unflatten_index(flat: UOp, shape: tuple[sint, ...], dtype: DType) -> list[UOp]:
    """The per-dimension indices of row-major linear index `flat` in `shape`.

    The outermost dimension takes no modulo: for a `flat` inside the shape, `flat // stride` is already in range.
    A `flat` outside it only happens in a pad's padding, where every load is gated off and the value discarded;
    a modulo there would only hide the range from the simplifier (and cost a division per element)."""
    outermost = next((d for d, s in enumerate(shape) if s != 1), 0)
    out: list[UOp] = []
    stride: sint = 1
    for d in reversed(range(len(shape))):
        s = shape[d]
        if s == 1:
            out.append(UOp.const(dtype, 0))
        else:
            part = flat // size_node(stride, dtype) if stride != 1 else flat
            out.append(part if d == outermost else part % size_node(s, dtype))
        stride = stride * s
    return out[::-1]


@dataclass
class KernelBuilder:
    """Builds one kernel's AST. `view_of` gives the buffer view of a materialised tensor node, else None."""
    view_of: Callable[[UOp], UOp | None]
    index_dtype: DType = dtypes.int32
    buffers: list[Buffer] = field(default_factory=list)
    reads: set[tuple[Buffer, int]] = field(default_factory=set)  # (buffer, version) of every load
    var_vals: dict[str, int] = field(default_factory=dict)  # the bound value of every Variable in a size
    _globals: dict[int, UOp] = field(default_factory=dict)
    _variables: dict[str, UOp] = field(default_factory=dict)  # name -> DEFINE_VAR
    _memo: dict[tuple[UOp, Index, UOp | None], UOp] = field(default_factory=dict)
    _range_ids: count = field(default_factory=count)

    def new_range(self, size: sint, kind: str) -> UOp:
        return UOp(Ops.RANGE, self.index_dtype, (self.size(size),), (next(self._range_ids), kind))

    def size(self, s: sint) -> UOp:
        """A tensor-graph size as a kernel value: a constant, or the expression with its Variables unbound (their
        values go to `var_vals`, so the kernel is the same for every value)."""
        if isinstance(s, int):
            return UOp.const(self.index_dtype, s)
        kernel_form, values = unbind(s)
        for u in kernel_form.toposort():
            if u.op is Ops.DEFINE_VAR and self._variables.setdefault(u.arg[0], u) is not u:
                other = self._variables[u.arg[0]]
                raise ValueError(f"two different Variables are named {u.arg[0]!r} (ranges {other.arg[1:]} and "
                                 f"{u.arg[1:]}) in one kernel; give them different names")
        for name, value in values.items():
            if self.var_vals.setdefault(name, value) != value:
                raise ArgumentError(f"bind mismatch on Variable {name!r}: it is bound to two values "
                                    f"({self.var_vals[name]} and {value}) in one kernel")
        return size_node(kernel_form, self.index_dtype)

    def shape(self, shape: tuple[sint, ...]) -> tuple[sint, ...]:
        """A tensor-graph shape in kernel form: ints stay ints, symbolic sizes become unbound expressions."""
        return tuple(s if isinstance(s, int) else self.size(s) for s in shape)

    def global_for(self, buf: Buffer) -> UOp:
        for i, b in enumerate(self.buffers):
            if b is buf:
                return self._globals[i]
        i = len(self.buffers)
        self.buffers.append(buf)
        self._globals[i] = UOp(Ops.DEFINE_GLOBAL, buf.dtype, (), i)
        return self._globals[i]

    def build(self, node: UOp, out: Buffer, also: Sequence[tuple[UOp, Buffer]] = ()) -> UOp:
        """SINK(STORE(out[i], node[i])) over the output's shape. `also`: nodes of the same shape that the kernel
        computes at the same index anyway (on the way to `node`), each stored to its own buffer as well."""
        self.index_dtype = dtypes.int64 if max(self._largest(n) for n in (node, *(n for n, _ in also))) >= 2**31 \
            else dtypes.int32
        outputs = [self.global_for(buf) for buf in (out, *(buf for _, buf in also))]
        idxs = tuple(UOp.const(self.index_dtype, 0) if s == 1 else self.new_range(s, "global") for s in node.shape)
        index = flat_index(idxs, self.shape(node.shape), self.index_dtype)
        # an output of another shape (a reshape of this one's elements) is stored at the same row-major position
        values = [self.lower(n if n.shape == node.shape else n.reshape(node.shape), idxs, None)
                  for n in (node, *(n for n, _ in also))]
        stores = [UOp(Ops.STORE, dtypes.void, (g, index, value)) for g, value in zip(outputs, values)]
        # every buffer stays a kernel parameter, even one whose loads all simplify away (e.g. all padding); so does
        # every Variable, even one left only in the launch size (a GPU grid), so the parameters are always the same
        variables = (self._variables[name] for name in sorted(self._variables))
        return self._ungate(UOp(Ops.SINK, dtypes.void, (*stores, *self._globals.values(), *variables)))

    def build_fill(self, out: Buffer, size: int) -> UOp:
        """SINK(STORE(out[i], 0)) for i < size: the zeros a SCATTER's kernel adds into."""
        self.index_dtype = dtypes.int64 if size >= 2**31 else dtypes.int32
        output = self.global_for(out)
        store = UOp(Ops.STORE, dtypes.void, (output, self.new_range(size, "global"), UOp.const(out.dtype, 0)))
        return UOp(Ops.SINK, dtypes.void, (store, output))

    def build_scatter(self, node: UOp, out: Buffer, outer_kept: bool) -> UOp:
        """SINK(STORE(out[i], value, gate) arg=ADD) for a SCATTER (schedule/scatter.py): its loops run over the
        source's elements with the selected axes collapsed; each adds x' at the element its indices select into the
        output element they name, gated off where an index is out of range (the index itself is clamped, so even the
        address never leaves the buffer). `outer_kept`: the loops of kept (output) axes go outermost, the reduced
        ones inside (the CPU splits its outer loop over threads; along a kept axis no two threads add to one element);
        else the source's own order (GPU threads: neighbours along its last axis read and add side by side)."""
        x, indices = node.src[0], node.src[1:]
        selected, reduced = node.arg
        self.index_dtype = dtypes.int64 if max(self._largest(x), node.size) >= 2**31 else dtypes.int32
        output = self.global_for(out)
        loop_axes = [a for a, s in enumerate(x.shape) if a not in selected and s != 1]
        if outer_kept:
            loop_axes = [a for a in loop_axes if a not in reduced] + [a for a in loop_axes if a in reduced]
        ranges = {a: self.new_range(x.shape[a], "global") for a in loop_axes}
        idxs = tuple(ranges.get(a, UOp.const(self.index_dtype, 0)) for a in range(len(x.shape)))
        picked = list(idxs)
        inside: UOp | None = None
        for axis, index_node in zip(selected, indices):
            value = self.lower(index_node, idxs, None)
            n = x.shape[axis]
            fits = _below(value, n)
            if not value.dtype.is_unsigned:
                fits = (UOp.const(value.dtype, -1) < value).alu(Ops.AND, fits)
            inside = fits if inside is None else inside.alu(Ops.AND, fits)
            picked[axis] = self._clamp(value.cast(self.index_dtype), n)
        assert inside is not None
        value = self.lower(x, tuple(picked), None)
        position = tuple(UOp.const(self.index_dtype, 0) if a in reduced else p for a, p in enumerate(picked))
        index = flat_index(position, self.shape(node.shape), self.index_dtype)
        store = UOp(Ops.STORE, dtypes.void, (output, index, value, inside), Ops.ADD)
        return self._ungate(UOp(Ops.SINK, dtypes.void, (store, *self._globals.values())))

    def _ungate(self, ast: UOp) -> UOp:
        """Drop the gates of loads that stay inside their buffer anyway. A gate (a pad's) only keeps a load from
        reading outside its buffer: the pad's WHERE discards the value where the gate is off. An ungated load is
        cheaper, and one that does not depend on the inner loop is hoisted out of it (a convolution's weights in its
        input gradient). The gates are first used to simplify the indices (symbolic.py's `_gated_divmod`)."""
        if not any(u.op is Ops.LOAD and len(u.src) == 3 for u in ast.toposort()):
            return ast
        ast = simplify(ast)
        sizes = {g: buf.size for g, buf in zip(self._globals.values(), self.buffers)}
        changes = {u: u.replace(src=u.src[:2]) for u in ast.toposort() if u.op is Ops.LOAD and len(u.src) == 3 and
                   isinstance(idx_max := u.src[1].vmax, int) and 0 <= u.src[1].vmin and idx_max < sizes[u.src[0]]}
        return substitute(ast, changes) if changes else ast

    def _largest(self, node: UOp) -> int:
        """The largest element count any index in this kernel can reach."""
        nodes = node.toposort(stop=lambda n: self.view_of(n) is not None)
        views = [v for n in nodes if (v := self.view_of(n)) is not None]
        return max([max_size(n.shape) for n in nodes + views if n.op is not Ops.DEVICE] +
                   [v.base.size for v in views] + [1])

    def lower(self, node: UOp, idxs: Index, gate: UOp | None) -> UOp:
        """`node`'s value at `idxs` (loads gated by `gate`), as a kernel expression.

        Each lowering step (`_lower` and its helpers) is a generator: it yields the (node, index, gate) it needs
        and receives that value back. This driver keeps the pending steps on its own stack, so a fused chain of
        thousands of ops never hits Python's recursion limit; finished values are memoised."""
        root: Request = (node, idxs, gate)
        stack: list[tuple[Request, LoweringStep]] = []
        reply: UOp | None = None
        if root not in self._memo:
            stack.append((root, self._lower(*root)))
        while stack:
            key, step = stack[-1]
            try:
                request = next(step) if reply is None else step.send(reply)  # a new step starts with next()
            except StopIteration as done:
                self._memo[key] = reply = done.value
                stack.pop()
                continue
            reply = self._memo.get(request)
            if reply is None:
                stack.append((request, self._lower(*request)))
        return self._memo[root]

    def _lower(self, node: UOp, idxs: Index, gate: UOp | None) -> LoweringStep:
        view = self.view_of(node)
        if view is not None:
            return (yield (view, idxs, gate))
        op = node.op
        if op is Ops.BUFFER:
            buf: Buffer = node.arg[0]
            if node.arg[1] < buf.version:
                raise RuntimeError(f"this computation reads {buf} as it was before an assign overwrote it (version "
                                   f"{node.arg[1]}, now {buf.version}), and no tensor holds those contents any more; "
                                   "typically a backward() through a result realized before an in-place write to one "
                                   "of its inputs: call backward() before the write (as before an optimizer step)")
            self.reads.add(node.arg)
            return UOp(Ops.LOAD, buf.dtype, (self.global_for(buf), idxs[0]) + ((gate,) if gate is not None else ()))
        if op is Ops.CONST:  # a symbolic scalar (e.g. a symbolic mean's count) holds its size as the arg
            return self.size(node.arg).cast(node.dtype) if isinstance(node.arg, UOp) else \
                UOp.const(node.dtype, node.arg)
        if op is Ops.ARANGE:
            return idxs[0].cast(node.dtype)
        if op in GroupOp.Elementwise:
            srcs = []
            for s in node.src:
                srcs.append((yield (s, idxs, gate)))
            return UOp(op, node.dtype, tuple(srcs))
        if op in (Ops.DETACH, Ops.CONTIGUOUS, Ops.CONTIGUOUS_BACKWARD):
            return (yield (node.src[0], idxs, gate))
        if op is Ops.ASSIGN:  # an in-place write this kernel also stores (the scheduler's merged outputs)
            return (yield (node.src[1], idxs, gate))
        if op is Ops.REDUCE_AXIS:
            return (yield from self._lower_reduce(node, idxs, gate))
        if op is Ops.GATHER:
            return (yield from self._lower_gather(node, idxs, gate))
        if op is Ops.PAD:
            return (yield from self._lower_pad(node, idxs, gate))
        if op in GroupOp.Movement:
            return (yield (node.src[0], self.source_index(node, idxs), gate))
        raise RuntimeError(f"cannot lower {op} into a kernel (it should have been materialised by the scheduler)")

    def source_index(self, node: UOp, idxs: Index) -> Index:
        """For a movement op (not PAD): the source's index of the element at `idxs` of `node`."""
        src_shape, dt = self.shape(node.src[0].shape), self.index_dtype
        if node.op is Ops.PERMUTE:
            out: list[UOp] = [idxs[0]] * len(idxs)
            for i, axis in enumerate(node.arg):
                out[axis] = idxs[i]
            return tuple(out)
        if node.op is Ops.EXPAND:
            return tuple(UOp.const(dt, 0) if s == 1 else i for i, s in zip(idxs, src_shape))
        if node.op is Ops.SHRINK:
            return tuple(i + self.size(b) if isinstance(b, UOp) or b else i for i, (b, _) in zip(idxs, node.arg))
        if node.op is Ops.FLIP:
            return tuple(size_node(s, dt) - UOp.const(dt, 1) - i if f else i for i, s, f in
                         zip(idxs, src_shape, node.arg))
        assert node.op is Ops.RESHAPE
        result: list[UOp] = [UOp.const(dt, 0)] * len(src_shape)
        shape = self.shape(node.shape)
        for old_dims, new_dims in reshape_groups(src_shape, shape):
            if len(old_dims) == 1 and len(new_dims) == 1:
                result[old_dims[0]] = idxs[new_dims[0]]
                continue
            flat = flat_index(tuple(idxs[j] for j in new_dims), tuple(shape[j] for j in new_dims), dt)
            parts = unflatten_index(flat, tuple(src_shape[j] for j in old_dims), dt)
            for d, part in zip(old_dims, parts):
                result[d] = part
        return tuple(result)

    def _lower_pad(self, node: UOp, idxs: Index, gate: UOp | None) -> LoweringStep:
        dt = self.index_dtype
        valid: UOp | None = None
        src_idxs: list[UOp] = []
        for i, s, (before, after) in zip(idxs, self.shape(node.src[0].shape), node.arg):
            if isinstance(before, int) and isinstance(after, int) and isinstance(s, int):
                first, end = UOp.const(dt, before - 1), UOp.const(dt, before + s)
                start = UOp.const(dt, before) if before else None
            else:  # symbolic: the gradient of a shrink to a Variable pads by a symbolic amount
                start = self.size(before)
                first, end = start - UOp.const(dt, 1), start + size_node(s, dt)
            src_idxs.append(i - start if start is not None else i)
            if isinstance(before, UOp) or isinstance(after, UOp) or before or after:
                # before <= i < before + s, as two comparisons whose value ranges the simplifier can fold
                inside = (first < i).alu(Ops.AND, i < end)
                valid = inside if valid is None else valid.alu(Ops.AND, inside)
        if valid is None:
            return (yield (node.src[0], tuple(src_idxs), gate))
        inner_gate = valid if gate is None else gate.alu(Ops.AND, valid)
        value = yield (node.src[0], tuple(src_idxs), inner_gate)
        return valid.where(value, UOp.const(node.dtype, 0))

    def _lower_reduce(self, node: UOp, idxs: Index, gate: UOp | None) -> LoweringStep:
        reduce_op, axes = node.arg
        src_shape = node.src[0].shape
        ranges = [self.new_range(src_shape[a], "reduce") for a in axes if src_shape[a] != 1]
        loops = iter(ranges)
        src_idxs = list(idxs)
        for a in axes:  # a reduced axis of size 1 is just index 0: no loop
            src_idxs[a] = next(loops) if src_shape[a] != 1 else UOp.const(self.index_dtype, 0)
        value = yield (node.src[0], tuple(src_idxs), gate)
        if not ranges:  # every reduced axis has size 1: the one element is the result (sum, product and max alike)
            return value
        return UOp(Ops.REDUCE, node.dtype, (value, *ranges), reduce_op)


    def _lower_gather(self, node: UOp, idxs: Index, gate: UOp | None) -> LoweringStep:
        """GATHER(x, a_1, ...) (schedule/gather.py): x at the element whose index along axis k_i is a_i's value, or 0
        where some a_i is outside [0, n_i). Each a_i is clamped into that range before it becomes an index, so the load
        of x never leaves its buffer and the index keeps a small value range (the select discards the clamped ones)."""
        x = node.src[0]
        src_idxs = list(idxs)
        outside: UOp | None = None
        for axis, index_node in zip(node.arg, node.src[1:]):
            value = yield (index_node, idxs, gate)
            last = UOp.const(value.dtype, x.shape[axis] - 1)
            bad = last < value if value.dtype.is_unsigned else (value < UOp.const(value.dtype, 0)).alu(Ops.OR,
                                                                                                        last < value)
            outside = bad if outside is None else outside.alu(Ops.OR, bad)
            src_idxs[axis] = self._clamp(value.cast(self.index_dtype), x.shape[axis])
        picked = yield (x, tuple(src_idxs), gate)
        assert outside is not None
        return outside.where(UOp.const(node.dtype, 0), picked)

    def _clamp(self, i: UOp, n: int) -> UOp:
        """i clamped into [0, n): max(i, 0), then min(., n-1) as -max(-., 1-n), whose value range is [0, n-1]."""
        dt = self.index_dtype
        low = i.maximum(UOp.const(dt, 0))
        return -((-low).maximum(UOp.const(dt, 1 - n)))


def _below(value: UOp, n: int) -> UOp:
    """`value < n` (true for every value when n is past the dtype's largest value)."""
    if n > dtype_bounds(value.dtype)[1]:
        return UOp.const(dtypes.bool, True)
    return value < UOp.const(value.dtype, n)


def kernel_name(ast: UOp) -> str:
    """'E_4_4' for elementwise kernels, 'r_64_256' for kernels with a reduction (sizes of their loops); a symbolic
    loop size shows its Variables' names ('r_i_4')."""
    ranges = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.arg[0])
    prefix = "r" if any(r.arg[1] == "reduce" for r in ranges) else "E"
    return prefix + "".join(f"_{_size_name(r.src[0])}" for r in ranges) if ranges else prefix + "_1"


def _size_name(size: UOp) -> str:
    if size.op is Ops.CONST:
        return str(size.arg)
    return "_".join(sorted({u.arg[0] for u in size.toposort() if u.op is Ops.DEFINE_VAR})) or "n"

