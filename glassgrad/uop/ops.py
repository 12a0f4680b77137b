"""The one IR: `Ops` and the immutable, hash-consed `UOp`.

In: an op, a dtype, source UOps and an argument. Out: a `UOp` node, shared with every structurally equal node
(`UOp(Ops.ADD, ...) is UOp(Ops.ADD, ...)`), so graphs are DAGs, equality is identity and memo tables are cheap.

The same node type serves every stage:
  * the tensor graph (BUFFER, CONST, movement ops, ALU ops, REDUCE_AXIS, ...), where nodes have a `shape`;
  * kernel ASTs and linear programs (DEFINE_GLOBAL, RANGE, LOAD, STORE, REDUCE, ...), where nodes are scalars
    and integer nodes carry a value range (`vmin`, `vmax`) that the symbolic simplifier uses.
"""
from __future__ import annotations

import functools
import math
import struct
import weakref
from collections.abc import Callable, Iterator
from enum import Enum, auto
from typing import Any, ClassVar

from glassgrad.dtype import DType, dtypes, truncate
from glassgrad.helpers import prod


class Ops(Enum):
    # tensor graph: leaves and bookkeeping
    DEVICE = auto(); BUFFER = auto(); CONST = auto(); COPY = auto(); CONTIGUOUS = auto()  # noqa: E702
    DETACH = auto(); ASSIGN = auto(); ARANGE = auto()  # noqa: E702
    CONTIGUOUS_BACKWARD = auto()  # identity forward; its gradient is made contiguous
    # movement (tensor graph only)
    RESHAPE = auto(); EXPAND = auto(); PERMUTE = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()  # noqa: E702
    REDUCE_AXIS = auto()
    # a one-hot reduction recognised as a lookup (schedule/gather.py): src (x, index_1, ...), arg the axes of x
    # each index selects along; the value is x at the selected element, or 0 where an index is out of range
    GATHER = auto()
    # a one-hot sum over the positions an index names, recognised as a scatter-add (schedule/scatter.py): src (x,
    # index_1, ...), arg (the axes each index selects along, the reduced axes); the sum of x over the reduced axes
    # into the element each index names (nothing where one is out of range). Always a kernel of its own
    SCATTER = auto()
    # dtype changes
    CAST = auto(); BITCAST = auto()  # noqa: E702
    # unary
    NEG = auto(); RECIP = auto(); SQRT = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); TRUNC = auto()  # noqa: E702
    # binary
    ADD = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto(); POW = auto()  # noqa: E702
    CMPLT = auto(); CMPNE = auto(); CMPEQ = auto()  # noqa: E702
    AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()  # noqa: E702
    # ternary
    WHERE = auto()
    # kernel ASTs and linear programs
    # (a STORE with arg Ops.ADD adds its value into the element: a scatter, schedule/scatter.py)
    SINK = auto(); DEFINE_GLOBAL = auto(); RANGE = auto(); LOAD = auto(); STORE = auto(); REDUCE = auto()  # noqa: E702
    DEFINE_ACC = auto(); ACCUMULATE = auto(); ENDRANGE = auto()  # noqa: E702
    # GPU kernels: thread/block ids, and a reduction finished across a work-group through shared memory
    SPECIAL = auto(); GROUP_REDUCE = auto()  # noqa: E702
    # symbolic sizes: a named int in [min, max] (a kernel parameter), and a variable bound to its value
    DEFINE_VAR = auto(); BIND = auto()  # noqa: E702
    # GPU kernels: a work-group's shared buffer (arg = (id, size)) and a barrier after the STOREs into it (its
    # sources); LOADs from the buffer name the BARRIER as their buffer, so they are ordered after it
    DEFINE_LOCAL = auto(); BARRIER = auto()  # noqa: E702
    # tensor cores: a warp's matrix fragment loaded from shared memory (src: the BARRIER, this lane's row address;
    # arg ("row"/"col", transposed: its shared tile is stored [k][position])), a matrix multiply-accumulate of two
    # fragments (the value of a REDUCE whose accumulator is the warp's 4-float fragment; arg: which column half of
    # the col fragment), and one element of such a REDUCE
    FRAGMENT = auto(); WMMA = auto(); GEP = auto()  # noqa: E702
    # asynchronous copies into shared memory: ASYNC_COPY (src: what it comes after, shared index, global buffer,
    # global index[, gate]) moves 16 bytes (skipped where the gate is off), or with arg 4 one 4-byte element
    # (zero-filled where the gate is off); ASYNC_COMMIT closes a group of them; ASYNC_WAIT waits until at most
    # `arg` groups are pending. Both yield the shared buffer, like BARRIER, so what reads it is ordered after them
    ASYNC_COPY = auto(); ASYNC_COMMIT = auto(); ASYNC_WAIT = auto()  # noqa: E702
    # a 16-byte run copied from shared memory into a global buffer (src: the global buffer, its element index, the
    # shared buffer's BARRIER, the shared index): a tensor-core tile's outputs leave through shared memory in whole
    # runs instead of one element per lane (codegen/gpudims.py, `_staged_outputs`)
    COPY_OUT = auto()
    # a value of another lane of the warp: lane l reads lane l ^ arg's (chained kernels' row reductions combine the
    # 4 lanes that share a row; codegen/chained.py)
    SHUFFLE_XOR = auto()
    # several devices (glassgrad/multi.py): MULTI(part_0, ..., part_n-1) arg=axis is one tensor whose parts live on
    # n devices, split along `axis` (None: each part is a whole copy); its device is the tuple of the parts' devices.
    # ALLREDUCE(p_0, ..., p_n-1) arg=(op, i) is, on p_i's device, the elementwise `op` (ADD, MAX, MUL) of the n
    # same-shaped partials: the scheduler runs the n of them as one collective
    MULTI = auto(); ALLREDUCE = auto()  # noqa: E702

    def __repr__(self) -> str:
        return f"Ops.{self.name}"

    # members are singletons: hashing by identity is correct, and much faster than Enum's hash of the name
    __hash__ = object.__hash__


# `Ops.X` is read through the enum metaclass's `__getattr__` hook on Python 3.11 (`EnumType` defines one, which
# turns off the interpreter's fast attribute path for the class): ~85 ns a read, three times a plain class attribute.
# The host paths that run for every node or every realize compare with these module constants instead.
OP_BUFFER, OP_RESHAPE, OP_ASSIGN, OP_MULTI, OP_SHRINK, OP_COPY, OP_ALLREDUCE, OP_CONST, OP_MAX = (
    Ops.BUFFER, Ops.RESHAPE, Ops.ASSIGN, Ops.MULTI, Ops.SHRINK, Ops.COPY, Ops.ALLREDUCE, Ops.CONST, Ops.MAX)
OP_ADD, OP_MUL, OP_NEG = Ops.ADD, Ops.MUL, Ops.NEG  # (Tensor's +, * and -: every elementwise op of a model)
OP_DEVICE, OP_ARANGE, OP_EXPAND, OP_PERMUTE, OP_PAD, OP_REDUCE_AXIS, OP_GATHER, OP_SCATTER, OP_BITCAST = (
    Ops.DEVICE, Ops.ARANGE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.REDUCE_AXIS, Ops.GATHER, Ops.SCATTER, Ops.BITCAST)


class GroupOp:
    Unary = frozenset({Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC})
    Binary = frozenset({Ops.ADD, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE,
                        Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR})
    Ternary = frozenset({Ops.WHERE})
    ALU = Unary | Binary | Ternary
    Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
    Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
    Movement = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.PAD, Ops.SHRINK, Ops.FLIP})
    Elementwise = ALU | frozenset({Ops.CAST, Ops.BITCAST})


ConstType = int | float | bool


def _arg_key(arg: Any) -> Any:
    """Hash key of an argument that tells 0.0 from -0.0 and 1 from 1.0 from True.

    Most arguments are ints, strings, None or tuples of ints (shapes), which are their own keys: those are
    recognised first, because every node construction computes this."""
    kind = type(arg)
    if kind is int or kind is str or arg is None:
        return arg
    if kind is float:
        return ("f", struct.pack("<d", arg))
    if kind is bool:
        return ("b", arg)
    if kind is tuple:
        for a in arg:  # (a loop, not all(): shapes are the most common argument)
            t = type(a)  # only floats, bools and tuples have keys other than themselves (a BUFFER's (buffer, version)
            if t is int:  # is its own key)
                continue
            if t is tuple:  # (a reduction's (op, axes), a pad's pairs: a tuple of ints is its own key, no recursion)
                for b in a:
                    if type(b) is not int:
                        return _tuple_key(arg)
            elif t is float or t is bool or isinstance(a, float):
                return _tuple_key(arg)
        return arg
    if isinstance(arg, float):  # numpy floats
        return ("f", struct.pack("<d", arg))
    return arg


def _tuple_key(arg: tuple[Any, ...]) -> tuple[Any, ...]:
    """`_arg_key` of a tuple holding a float, a bool, or a tuple that is not all ints: each element's key (the tuple
    itself where every element is its own key)."""
    keys = [_arg_key(a) for a in arg]
    return arg if all(k is a for k, a in zip(keys, arg)) else tuple(keys)


class _UOpFields:
    """A UOp's fields. `UOp.__new__` writes them on an instance of this plain class, whose attribute writes are the
    interpreter's own slot stores (~35 ns for the eight, against ~270 through the slots' descriptors), then makes it a
    UOp (`__class__`: the same layout), whose `__setattr__` refuses every later write: nodes are shared, never
    changed."""
    __slots__ = ("op", "dtype", "src", "arg", "arg_key", "_shape", "_range", "_device", "__weakref__")

    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    arg_key: Any  # `_arg_key(arg)`, kept from construction (the schedule cache's structure key reads it per node)
    _shape: tuple[int, ...] | None
    _range: tuple[ConstType, ConstType] | None
    _device: str | tuple[str, ...] | None


class UOp(_UOpFields):
    """One node of the graph. Never mutate one: build a new node instead (they are shared)."""
    __slots__ = ()
    _cache: ClassVar[dict[tuple, _CacheRef]] = {}

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        arg_key = arg if arg is None else _arg_key(arg)  # (ALU nodes have none: no call)
        key = (op, dtype, src, arg_key)
        ref = UOp._cache.get(key)
        if ref is not None and (hit := ref()) is not None:
            return hit
        node = object.__new__(_UOpFields)  # (filled with plain writes, then made a UOp: see _UOpFields)
        node.op, node.dtype, node.src, node.arg, node.arg_key, node._range = op, dtype, src, arg, arg_key, None
        # the cached properties are computed when first asked, except what a node can take at no cost now (see
        # `_AT_BIRTH`): an elementwise node's shape and device are its first source's when that source knows them (so
        # `x * 2` on a known x knows them too), a reshape's or expand's shape is its argument
        birth = _AT_BIRTH.get(op)
        if birth == _FIRST and src:  # (the most common node first)
            first = src[0]
            node._shape, node._device = first._shape, first._device
        elif birth == _ARG and src:
            node._shape, node._device = arg, src[0]._device
        elif birth == _BUFFER:  # arg (buffer, version)
            node._shape, node._device = (arg[0].size,), arg[0].device
        else:
            node._shape = node._device = None
        node.__class__ = cls
        ref = UOp._cache[key] = _CacheRef(node, _forget)
        ref.key = key  # (set here: a constructor taking it would cost a Python call per node)
        return node  # type: ignore[return-value]  # (a UOp now)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("UOp is immutable; build a new one")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("UOp is immutable; build a new one")

    def __reduce__(self) -> tuple[Callable[..., UOp], tuple[Any, ...]]:
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __repr__(self) -> str:
        return pretty(self)

    # ---------- graph walking ----------
    def toposort(self, stop: Callable[[UOp], bool] | None = None) -> list[UOp]:
        """Every node this one depends on (itself included), each after its sources. `stop` prunes the walk: a node
        for which it is true is listed, its sources are not walked.

        A depth-first walk without recursion (graphs can be thousands of nodes deep): the stack holds each node on
        the current path with an iterator over its sources; a node is listed once that iterator is used up."""
        order: list[UOp] = []
        seen: set[UOp] = {self}
        stack: list[tuple[UOp, Iterator[UOp]]] = [(self, iter(() if stop is not None and stop(self) else self.src))]
        while stack:
            node, sources = stack[-1]
            for s in sources:
                if s not in seen:
                    seen.add(s)
                    stack.append((s, iter(() if stop is not None and stop(s) else s.src)))
                    break
            else:
                stack.pop()
                order.append(node)
        return order

    def replace(self, **changes: Any) -> UOp:
        return UOp(changes.get("op", self.op), changes.get("dtype", self.dtype), changes.get("src", self.src),
                   changes.get("arg", self.arg))

    # ---------- constructors ----------
    @staticmethod
    def const(dtype: DType, value: ConstType, device: str | None = None) -> UOp:
        """A scalar constant. Tensor-graph constants name their device; kernel constants do not."""
        src = (UOp(Ops.DEVICE, dtypes.void, (), device),) if device is not None else ()
        return UOp(Ops.CONST, dtype, src, as_dtype(value, dtype))

    @staticmethod
    def variable(name: str, min_val: int, max_val: int, dtype: DType | None = None) -> UOp:
        """tinygrad 0.14's spelling of `Variable(name, min_val, max_val)` (`from glassgrad import UOp`); an int
        Variable always (a `dtype` other than an int one raises)."""
        if dtype is not None and not dtype.is_int:
            raise TypeError(f"UOp.variable {name!r}: a Variable is an int here, got dtype {dtype}")
        from glassgrad.uop.sint import Variable
        return Variable(name, min_val, max_val)

    def bind(self, value: int) -> UOp:
        """This DEFINE_VAR with a value: `Variable('i', 1, 10).bind(3)`. Checks the value is in the variable's range."""
        if self.op is not Ops.DEFINE_VAR:
            raise TypeError(f"bind() is for Variables (DEFINE_VAR), not {self.op}")
        name, lo, hi = self.arg
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"Variable {name!r} can only be bound to an int, got {type(value).__name__} {value!r}")
        if not lo <= value <= hi:
            raise ValueError(f"Variable {name!r} takes values in [{lo}, {hi}]; cannot bind it to {value}")
        return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))

    def alu(self, op: Ops, *others: UOp) -> UOp:
        srcs = (self, *others)
        out_dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype
        return UOp(op, out_dtype, srcs)

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        return UOp(Ops.BITCAST, dtype, (self,))

    def reshape(self, shape: tuple[sint, ...]) -> UOp:
        return self if self.shape == shape else UOp(Ops.RESHAPE, self.dtype, (self,), tuple(shape))

    def expand(self, shape: tuple[sint, ...]) -> UOp:
        return self if self.shape == shape else UOp(Ops.EXPAND, self.dtype, (self,), tuple(shape))

    def permute(self, order: tuple[int, ...]) -> UOp:
        """A permute of a permute is one permute (none when they cancel: a transpose's gradient transposed back), so
        an output that is a reshape of a stored node stays a view of its buffer instead of a copy."""
        if self.op is Ops.PERMUTE:
            return self.src[0].permute(tuple(self.arg[i] for i in order))
        return self if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, self.dtype, (self,), tuple(order))

    def pad(self, padding: tuple[tuple[sint, sint], ...]) -> UOp:
        return self if all(p == (0, 0) for p in padding) else UOp(Ops.PAD, self.dtype, (self,), tuple(padding))

    def shrink(self, bounds: tuple[tuple[sint, sint], ...]) -> UOp:
        if all(b == (0, s) for b, s in zip(bounds, self.shape)):
            return self
        return UOp(Ops.SHRINK, self.dtype, (self,), tuple(bounds))

    def flip(self, axes: tuple[bool, ...]) -> UOp:
        return self if not any(axes) else UOp(Ops.FLIP, self.dtype, (self,), tuple(axes))

    def reduce_axis(self, op: Ops, axes: tuple[int, ...]) -> UOp:
        axes = tuple(sorted(axes))
        return self if not axes else UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))

    # ---------- python operators, used for index arithmetic ----------
    def _wrap(self, x: UOp | ConstType) -> UOp:
        return x if isinstance(x, UOp) else UOp.const(self.dtype, x)

    def __add__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.ADD, self._wrap(x)) if _operand(x) else NotImplemented

    def __radd__(self, x: UOp | ConstType) -> UOp:
        return self._wrap(x).alu(Ops.ADD, self) if _operand(x) else NotImplemented

    def __sub__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.ADD, -self._wrap(x)) if _operand(x) else NotImplemented

    def __rsub__(self, x: UOp | ConstType) -> UOp:  # (`max_len - pos` with a bound Variable pos)
        return self._wrap(x).alu(Ops.ADD, -self) if _operand(x) else NotImplemented

    def __mul__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.MUL, self._wrap(x)) if _operand(x) else NotImplemented

    def __rmul__(self, x: UOp | ConstType) -> UOp:
        return self._wrap(x).alu(Ops.MUL, self) if _operand(x) else NotImplemented

    def __floordiv__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.IDIV, self._wrap(x)) if _operand(x) else NotImplemented

    def __mod__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.MOD, self._wrap(x)) if _operand(x) else NotImplemented

    def __neg__(self) -> UOp: return self.alu(Ops.NEG)  # noqa: E704
    def __lt__(self, x: UOp | ConstType) -> UOp:
        return self.alu(Ops.CMPLT, self._wrap(x)) if _operand(x) else NotImplemented

    def __gt__(self, x: UOp | ConstType) -> UOp:
        return self._wrap(x).alu(Ops.CMPLT, self) if _operand(x) else NotImplemented

    def __le__(self, x: UOp | ConstType) -> UOp:
        return self._int_only("<=").alu(Ops.CMPLT, self._wrap(x) + 1) if _operand(x) else NotImplemented

    def __ge__(self, x: UOp | ConstType) -> UOp:
        return self._wrap(x).alu(Ops.CMPLT, self._int_only(">=") + 1) if _operand(x) else NotImplemented


    def _int_only(self, op: str) -> UOp:
        if not self.dtype.is_int:
            raise TypeError(f"UOp {op} is defined for int (symbolic size) nodes, not {self.dtype}")
        return self

    def __bool__(self) -> bool:
        """A comparison of symbolic sizes (`if start_pos > 0:` with a bound Variable) is True or False when the
        Variables' ranges decide it (a TinyJit capture serves every value, so the bound value is not used); else a
        TypeError. (Every other node is truthy, Python's default: an object, not a value.) Without this, `v < 5`
        was always True."""
        if self.op in GroupOp.Comparison and self.dtype.is_bool and _is_symbolic_size(self):
            lo, hi = self._minmax()
            if lo == hi:
                return bool(lo)
            names = sorted({u.arg[0] for u in self.toposort() if u.op is Ops.DEFINE_VAR})
            raise TypeError(f"this comparison depends on the value of Variable {', '.join(names)} within its range: "
                            "a compiled kernel (and a TinyJit capture) serves every value, so it has no single answer; "
                            "compare the int you bound instead, or give the Variable a range that decides it")
        return True
    def ne(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.CMPNE, self._wrap(x))  # noqa: E704
    def eq(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.CMPEQ, self._wrap(x))  # noqa: E704
    def maximum(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.MAX, self._wrap(x))  # noqa: E704
    def where(self, a: UOp, b: UOp) -> UOp: return UOp(Ops.WHERE, a.dtype, (self, a, b))  # noqa: E704
    __hash__ = object.__hash__

    # ---------- tensor-graph properties ----------
    @property
    def shape(self) -> tuple[int, ...]:
        shape = self._shape
        if shape is None:
            for s in self.src:  # (a loop, not any(): this runs for every new node)
                if s._shape is None:
                    for x in s.src:
                        if x._shape is None:  # deeper: sources first, without recursion
                            _fill_sources(self, "_shape", _infer_shape, lambda n: n._shape is not None)
                            break
                    else:  # (most often a leaf, or a node over known ones: one level, no walk)
                        _set_shape(s, _infer_shape(s))
                        continue
                    break
            shape = _infer_shape(self)
            _set_shape(self, shape)
        return shape

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def device(self) -> Any:
        """The device a tensor-graph node lives on (cached: computed once per node): a name, or for a node of a
        tensor on several devices (glassgrad/multi.py) a tuple of names. (Typed Any: most code handles names only.)"""
        found = self._device
        if found is not None:
            return found
        chain: list[UOp] = []  # walk down first sources (no recursion: graphs can be thousands of nodes deep)
        node = self
        while node._device is None and node.op not in _OWN_DEVICE:
            chain.append(node)
            node = node.src[0]
        if node._device is not None:
            found = node._device
        else:
            if node.op is Ops.DEVICE:
                found = node.arg
            elif node.op is Ops.BUFFER:
                found = node.arg[0].device
            elif node.op is Ops.MULTI:
                found = tuple(s.device for s in node.src)
            elif node.op is Ops.ALLREDUCE:
                found = node.src[node.arg[1]].device
            else:  # COPY names the device it copies to
                found = node.src[1].arg
            chain.append(node)
        for n in chain:
            _set_device(n, found)
        return found

    @property
    def base(self) -> UOp:
        """The node under any movement ops."""
        node = self
        while node.op in GroupOp.Movement:
            node = node.src[0]
        return node

    # ---------- value ranges, for integer index arithmetic ----------
    @property
    def vmin(self) -> ConstType:
        return self._minmax()[0]

    @property
    def vmax(self) -> ConstType:
        return self._minmax()[1]

    def _minmax(self) -> tuple[ConstType, ConstType]:
        value_range = self._range
        if value_range is None:
            if any(s._range is None for s in self.src):
                _fill_sources(self, "_range", _value_range, lambda n: n._range is not None or not _range_uses_src(n))
            value_range = _value_range(self)
            _set_range(self, value_range)
        return value_range


def _fill_sources(u: UOp, slot: str, compute: Callable[[UOp], Any], known: Callable[[UOp], bool]) -> None:
    """Fill in a cached per-node property for the sources of `u` that lack it, sources first.

    Working in toposort order rather than by recursion keeps deep graphs within Python's recursion limit.
    `known(n)`: n has the property already, or can compute it without its sources (the walk stops there)."""
    for node in u.toposort(stop=known):
        if node is not u and getattr(node, slot) is None:
            object.__setattr__(node, slot, compute(node))


class _CacheRef(weakref.ref):
    """The hash-consing table's weak reference to a node; it knows the node's key, to drop the entry when the node is
    collected (unless a new node took the key meanwhile)."""
    __slots__ = ("key",)
    key: tuple


def _forget(ref: _CacheRef) -> None:
    if UOp._cache.get(ref.key) is ref:
        del UOp._cache[ref.key]


def _slot_setter(name: str) -> Callable[[UOp, Any], None]:
    """The setter of one of UOp's fields (its slot descriptor's __set__), for the cached properties (a node's shape,
    device and range, found when first asked: UOp's own __setattr__ refuses writes)."""
    setter: Callable[[UOp, Any], None] = vars(_UOpFields)[name].__set__
    return setter


_set_shape, _set_range, _set_device = (_slot_setter(name) for name in ("_shape", "_range", "_device"))


def _infer_shape(u: UOp) -> tuple[int, ...]:
    """A node's shape from its sources' (module constants, not `Ops.X`: a reduction's shape is asked at every build)."""
    op, arg = u.op, u.arg
    if op in _SAME_SHAPE_AS_SOURCES:  # the most common node, first: its sources have one shape (broadcast already)
        return u.src[0].shape
    if op is OP_CONST or op is OP_DEVICE or op not in _SHAPED:
        return ()
    if op is OP_BUFFER:
        return (arg[0].size,)
    if op is OP_ARANGE:
        return (arg,)
    if op is OP_RESHAPE or op is OP_EXPAND:
        return tuple(arg)
    src = u.src[0].shape
    if op is OP_PERMUTE:
        return tuple(src[i] for i in arg)
    if op is OP_PAD:
        padded = tuple(s + b + a for s, (b, a) in zip(src, arg))
        if any(isinstance(x, UOp) for x in padded):  # a symbolic size (glassgrad/uop/sint.py): keep it simplified
            from glassgrad.uop.sint import as_sint
            padded = tuple(as_sint(x) for x in padded)
        return padded
    if op is OP_SHRINK:
        sizes = tuple(e - b for b, e in arg)
        if any(isinstance(x, UOp) for x in sizes):  # symbolic bounds (glassgrad/uop/sint.py): keep sizes simplified
            from glassgrad.uop.sint import as_sint
            sizes = tuple(as_sint(x) for x in sizes)
        return sizes
    if op is OP_REDUCE_AXIS:
        axes = arg[1]
        return tuple([1 if i in axes else s for i, s in enumerate(src)])
    if op is OP_GATHER:
        return tuple(1 if i in arg else s for i, s in enumerate(src))
    if op is OP_SCATTER:
        return tuple(1 if i in arg[1] else s for i, s in enumerate(src))
    if op is OP_MULTI and arg is not None:  # the parts joined along the axis
        return tuple(sum(p.shape[arg] for p in u.src) if i == arg else s for i, s in enumerate(src))
    if op is OP_BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize:
        return (*src[:-1], src[-1] * u.src[0].dtype.itemsize // u.dtype.itemsize)
    # elementwise: every shaped source has the same shape (the Tensor layer broadcasts first)
    return next((s.shape for s in u.src if s.op is not OP_DEVICE), ())


_SAME_SHAPE_AS_SOURCES = GroupOp.ALU | {Ops.CAST}
_SHAPED = GroupOp.Movement | GroupOp.Elementwise | {Ops.BUFFER, Ops.ARANGE, Ops.REDUCE_AXIS, Ops.GATHER, Ops.SCATTER,
                                                   Ops.COPY,
                                                   Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN, Ops.CONTIGUOUS_BACKWARD,
                                                   Ops.MULTI, Ops.ALLREDUCE}
_OWN_DEVICE = frozenset({Ops.DEVICE, Ops.BUFFER, Ops.COPY, Ops.MULTI, Ops.ALLREDUCE})  # not their first source's

# what `UOp.__new__` sets at once (each is what `_infer_shape` and `device` give, from what the node's sources know):
# _FIRST: shape and device of the first source (None where it does not know them yet); _ARG: the shape is the
# argument, the device the first source's; _BUFFER: a buffer's size and device. Other nodes compute both when asked.
_FIRST, _ARG, _BUFFER = 1, 2, 3
_AT_BIRTH: dict[Ops, int] = {**dict.fromkeys(_SAME_SHAPE_AS_SOURCES | {Ops.CONTIGUOUS, Ops.DETACH, Ops.ASSIGN,
                                                                       Ops.CONTIGUOUS_BACKWARD}, _FIRST),
                             Ops.RESHAPE: _ARG, Ops.EXPAND: _ARG, Ops.BUFFER: _BUFFER}


sint = int | UOp  # a size: an int, or an int expression of Variables (see uop/sint.py)

Range = tuple[ConstType, ConstType]


def as_dtype(value: ConstType, dtype: DType) -> ConstType:
    """`value` as `dtype` stores it: ints wrap around (any Python int, without numpy), floats round, bools test."""
    if dtype.is_int and isinstance(value, int):
        lo, hi = dtype_bounds(dtype)
        return (int(value) - int(lo)) % (int(hi) - int(lo) + 1) + int(lo)
    return truncate(value, dtype)


@functools.cache
def dtype_bounds(dt: DType) -> Range:
    """(smallest, largest) value of an int or bool dtype (cached: numpy's iinfo is slow)."""
    return (dt.min, dt.max)


def _range_uses_src(u: UOp) -> bool:
    dt = u.dtype
    return u.op in (Ops.RANGE, Ops.BIND) or ((dt.is_int or dt.is_bool) and u.op in (_BOOL_RANGE_RULES if dt.is_bool
                                                                         else _INT_RANGE_RULES))


def _operand(x: object) -> bool:
    """Whether a Python operator's other side is one a UOp computes with (a UOp or a number). Anything else (a
    Tensor: `v * t` with a bound Variable v) gets NotImplemented, so Python asks that side (`Tensor.__rmul__`)."""
    return isinstance(x, (UOp, int, float))


def _is_symbolic_size(u: UOp) -> bool:
    """Whether `u` is built only from Variables, their bindings and constants without a device (a user-level
    comparison of symbolic sizes, not a kernel's or a tensor's graph), with at least one Variable."""
    nodes = u.toposort()
    return any(n.op is Ops.DEFINE_VAR for n in nodes) and all(
        n.op in (Ops.DEFINE_VAR, Ops.BIND) or (n.op is Ops.CONST and not n.src) or
        (n.op in GroupOp.ALU and n.dtype != dtypes.void) for n in nodes)


def _value_range(u: UOp) -> Range:
    """A conservative [vmin, vmax] of an integer or bool node's value, under the generated code's semantics.

    Ints wrap around, so a bound that leaves the dtype's range gives the whole range: a node with a narrower range
    is then known to compute its exact mathematical value, which the division and comparison rules rely on."""
    dt = u.dtype
    if u.op is Ops.CONST:
        return (u.arg, u.arg)
    if u.op is Ops.RANGE:
        return (0, max(0, u.src[0].vmax - 1))
    if u.op is Ops.BIND:  # the variable's whole range: code built from a bound size must serve every value
        return u.src[0]._minmax()
    if u.op is Ops.SPECIAL:  # arg = (name, size): a GPU id in 0..size-1 (the kernel returns early outside it)
        return (0, max(0, u.arg[1] - 1))
    if u.op is Ops.DEFINE_VAR:  # arg = (name, min, max)
        return (u.arg[1], u.arg[2])
    if not (dt.is_int or dt.is_bool):
        return (-math.inf, math.inf)
    default = dtype_bounds(dt)
    rule = (_BOOL_RANGE_RULES if dt.is_bool else _INT_RANGE_RULES).get(u.op)
    found = None if rule is None else rule(u, [x._minmax() for x in u.src])
    if found is None or found[0] < default[0] or found[1] > default[1]:
        return default
    return found


def _corners(op: Callable[[Any, Any], Any], a: Range, b: Range) -> Range:
    values = [op(x, y) for x in a for y in b]
    return (min(values), max(values))


def _idiv_range(a: Range, d: Range) -> Range:
    if d[0] > 0 or d[1] < 0:  # truncating division is monotone in each argument when the divisor keeps its sign
        return _corners(_trunc_div, a, d)
    return (min(a[0], -a[1], 0), max(a[1], -a[0], 0))  # |x/d| <= |x|, and x/0 is 0


def _mod_range(a: Range, d: Range) -> Range:
    if a[0] >= 0 and d[0] > a[1]:
        return a  # every divisor is larger than the dividend: x % d == x
    m = max(abs(d[0]), abs(d[1]))  # |x % d| < |d|, |x % d| <= |x|, the sign is x's, and x % 0 is 0
    lo = 0 if a[0] >= 0 else max(a[0], -(m - 1))
    hi = 0 if a[1] <= 0 else min(a[1], m - 1)
    return (min(lo, 0), max(hi, 0))


def _cast_range(u: UOp, s: list[Range]) -> Range | None:
    src = u.src[0].dtype
    if not (src.is_int or src.is_bool):
        return None
    if u.dtype.is_bool:
        return (not s[0][0] <= 0 <= s[0][1], s[0] != (0, 0))
    return (int(s[0][0]), int(s[0][1]))


def _compare_range(u: UOp, s: list[Range]) -> Range | None:
    """(is it always true?, can it be true?) of a comparison."""
    (a_lo, a_hi), (b_lo, b_hi) = s
    if u.op is Ops.CMPLT:
        return (a_hi < b_lo, a_lo < b_hi)
    if any(x.dtype.is_float for x in u.src):
        return None  # NaN != NaN: leave float equality alone
    disjoint = a_hi < b_lo or b_hi < a_lo
    same_value = a_lo == a_hi == b_lo == b_hi
    return (disjoint, not same_value) if u.op is Ops.CMPNE else (same_value, not disjoint)


def _where_range(s: list[Range]) -> Range:
    if s[0][0]:
        return s[1]
    if not s[0][1]:
        return s[2]
    return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))


_COMPARE_RULES: dict[Ops, Callable[[UOp, list[Range]], Range | None]] = {
    Ops.CMPLT: _compare_range, Ops.CMPNE: _compare_range, Ops.CMPEQ: _compare_range,
    Ops.CAST: _cast_range, Ops.WHERE: lambda u, s: _where_range(s)}
_INT_RANGE_RULES: dict[Ops, Callable[[UOp, list[Range]], Range | None]] = {
    **_COMPARE_RULES,
    Ops.ADD: lambda u, s: (s[0][0] + s[1][0], s[0][1] + s[1][1]),
    Ops.NEG: lambda u, s: (-s[0][1], -s[0][0]),
    Ops.MUL: lambda u, s: _corners(lambda x, y: x * y, s[0], s[1]),
    Ops.IDIV: lambda u, s: _idiv_range(s[0], s[1]),
    Ops.MOD: lambda u, s: _mod_range(s[0], s[1]),
    Ops.MAX: lambda u, s: (max(s[0][0], s[1][0]), max(s[0][1], s[1][1])),
    Ops.XOR: lambda u, s: _xor_range(s[0], s[1]),
}


def _xor_range(a: Range, b: Range) -> Range | None:
    """x ^ y of non-negative values stays below the next power of two of the larger (a shared tile's swizzle)."""
    if a[0] < 0 or b[0] < 0:
        return None
    return (0, (1 << max(int(a[1]), int(b[1])).bit_length()) - 1)


_BOOL_RANGE_RULES: dict[Ops, Callable[[UOp, list[Range]], Range | None]] = {
    **_COMPARE_RULES,  # bool ADD/MAX/OR are "or", MUL/AND are "and", NEG is "not"
    Ops.ADD: lambda u, s: (s[0][0] or s[1][0], s[0][1] or s[1][1]),
    Ops.MAX: lambda u, s: (s[0][0] or s[1][0], s[0][1] or s[1][1]),
    Ops.OR: lambda u, s: (s[0][0] or s[1][0], s[0][1] or s[1][1]),
    Ops.MUL: lambda u, s: (s[0][0] and s[1][0], s[0][1] and s[1][1]),
    Ops.AND: lambda u, s: (s[0][0] and s[1][0], s[0][1] and s[1][1]),
    Ops.NEG: lambda u, s: (not s[0][1], not s[0][0]),
}


def _trunc_div(a: ConstType, b: ConstType) -> int:
    """C-style division of integers: rounds toward zero."""
    q = abs(int(a)) // abs(int(b))
    return q if (a >= 0) == (b >= 0) else -q


def pretty(u: UOp, max_nodes: int = 40) -> str:
    """A readable multi-line dump of a graph: one numbered line per node."""
    nodes = u.toposort()
    if len(nodes) > max_nodes:
        return f"UOp({u.op}, {u.dtype}, nsrc={len(u.src)}, arg={u.arg!r}, ... {len(nodes)} nodes)"
    names = {n: f"%{i}" for i, n in enumerate(nodes)}
    lines = [f"{names[n]} = {n.op.name} {n.dtype.name}"
             f"({', '.join(names[s] for s in n.src)}){'' if n.arg is None else ' arg=' + repr(n.arg)}" for n in nodes]
    return "\n".join(lines)
