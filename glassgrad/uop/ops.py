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
from collections.abc import Callable
from enum import Enum, auto
from typing import Any, ClassVar

from glassgrad.dtype import DType, dtypes, truncate
from glassgrad.helpers import prod


class Ops(Enum):
    # tensor graph: leaves and bookkeeping
    DEVICE = auto(); BUFFER = auto(); CONST = auto(); COPY = auto(); CONTIGUOUS = auto()  # noqa: E702
    DETACH = auto(); ASSIGN = auto(); ARANGE = auto()  # noqa: E702
    # movement (tensor graph only)
    RESHAPE = auto(); EXPAND = auto(); PERMUTE = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()  # noqa: E702
    REDUCE_AXIS = auto()
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
    SINK = auto(); DEFINE_GLOBAL = auto(); RANGE = auto(); LOAD = auto(); STORE = auto(); REDUCE = auto()  # noqa: E702
    DEFINE_ACC = auto(); ACCUMULATE = auto(); ENDRANGE = auto()  # noqa: E702

    def __repr__(self) -> str:
        return f"Ops.{self.name}"


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
    ReduceOps = frozenset({Ops.ADD, Ops.MUL, Ops.MAX})


ConstType = int | float | bool


def _arg_key(arg: Any) -> Any:
    """Hash key of an argument that tells 0.0 from -0.0 and 1 from 1.0 from True."""
    if isinstance(arg, float):
        return ("f", struct.pack("<d", arg))
    if isinstance(arg, bool):
        return ("b", arg)
    if isinstance(arg, tuple):
        return tuple(_arg_key(a) for a in arg)
    return arg


class UOp:
    """One node of the graph. Never mutate one: build a new node instead (they are shared)."""
    __slots__ = ("op", "dtype", "src", "arg", "_shape", "_range", "__weakref__")
    _cache: ClassVar[dict[tuple, weakref.ref[UOp]]] = {}

    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any
    _shape: tuple[int, ...] | None
    _range: tuple[ConstType, ConstType] | None

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        key = (op, dtype, src, _arg_key(arg))
        ref = UOp._cache.get(key)
        if ref is not None and (hit := ref()) is not None:
            return hit
        node = object.__new__(cls)
        object.__setattr__(node, "op", op)
        object.__setattr__(node, "dtype", dtype)
        object.__setattr__(node, "src", src)
        object.__setattr__(node, "arg", arg)
        object.__setattr__(node, "_shape", None)
        object.__setattr__(node, "_range", None)
        UOp._cache[key] = weakref.ref(node, functools.partial(_forget, key))
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("UOp is immutable; build a new one")

    def __reduce__(self) -> tuple[Callable[..., UOp], tuple[Any, ...]]:
        return UOp, (self.op, self.dtype, self.src, self.arg)

    def __repr__(self) -> str:
        return pretty(self)

    # ---------- graph walking ----------
    def toposort(self, stop: Callable[[UOp], bool] | None = None) -> list[UOp]:
        """Every node this one depends on (itself included), each after its sources. `stop` prunes the walk."""
        order: list[UOp] = []
        seen: set[UOp] = set()
        stack: list[tuple[UOp, bool]] = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if node in seen:
                continue
            seen.add(node)
            stack.append((node, True))
            if stop is None or not stop(node):
                stack.extend((s, False) for s in reversed(node.src) if s not in seen)
        return order

    def replace(self, **changes: Any) -> UOp:
        return UOp(changes.get("op", self.op), changes.get("dtype", self.dtype), changes.get("src", self.src),
                   changes.get("arg", self.arg))

    # ---------- constructors ----------
    @staticmethod
    def const(dtype: DType, value: ConstType, device: str | None = None) -> UOp:
        """A scalar constant. Tensor-graph constants name their device; kernel constants do not."""
        src = (UOp(Ops.DEVICE, dtypes.void, (), device),) if device is not None else ()
        return UOp(Ops.CONST, dtype, src, truncate(value, dtype))

    def const_like(self, value: ConstType) -> UOp:
        return UOp.const(self.dtype, value, self.device if self.op is not Ops.DEVICE and self._has_device() else None)

    def _has_device(self) -> bool:
        try:
            return self.device is not None
        except (AttributeError, IndexError):
            return False

    def alu(self, op: Ops, *others: UOp) -> UOp:
        srcs = (self, *others)
        out_dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype
        return UOp(op, out_dtype, srcs)

    def cast(self, dtype: DType) -> UOp:
        return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

    def bitcast(self, dtype: DType) -> UOp:
        return UOp(Ops.BITCAST, dtype, (self,))

    def reshape(self, shape: tuple[int, ...]) -> UOp:
        return self if self.shape == shape else UOp(Ops.RESHAPE, self.dtype, (self,), tuple(shape))

    def expand(self, shape: tuple[int, ...]) -> UOp:
        return self if self.shape == shape else UOp(Ops.EXPAND, self.dtype, (self,), tuple(shape))

    def permute(self, order: tuple[int, ...]) -> UOp:
        return self if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, self.dtype, (self,), tuple(order))

    def pad(self, padding: tuple[tuple[int, int], ...]) -> UOp:
        return self if all(p == (0, 0) for p in padding) else UOp(Ops.PAD, self.dtype, (self,), tuple(padding))

    def shrink(self, bounds: tuple[tuple[int, int], ...]) -> UOp:
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

    def __add__(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.ADD, self._wrap(x))  # noqa: E704
    def __radd__(self, x: UOp | ConstType) -> UOp: return self._wrap(x).alu(Ops.ADD, self)  # noqa: E704
    def __sub__(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.ADD, -self._wrap(x))  # noqa: E704
    def __mul__(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.MUL, self._wrap(x))  # noqa: E704
    def __rmul__(self, x: UOp | ConstType) -> UOp: return self._wrap(x).alu(Ops.MUL, self)  # noqa: E704
    def __floordiv__(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.IDIV, self._wrap(x))  # noqa: E704
    def __mod__(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.MOD, self._wrap(x))  # noqa: E704
    def __neg__(self) -> UOp: return self.alu(Ops.NEG)  # noqa: E704
    def __lt__(self, x: UOp | ConstType) -> UOp: return self.alu(Ops.CMPLT, self._wrap(x))  # noqa: E704
    def __and__(self, x: UOp) -> UOp: return self.alu(Ops.AND, x)  # noqa: E704
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
            shape = _infer_shape(self)
            object.__setattr__(self, "_shape", shape)
        return shape

    @property
    def size(self) -> int:
        return prod(self.shape)

    @property
    def device(self) -> str:
        node = self
        while node.op is not Ops.DEVICE:
            if node.op is Ops.BUFFER:
                return node.arg[0].device
            if node.op is Ops.COPY:
                return node.src[1].arg
            node = node.src[0]
        return node.arg

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
            value_range = _value_range(self)
            object.__setattr__(self, "_range", value_range)
        return value_range


def _forget(key: tuple, _ref: weakref.ref[UOp]) -> None:
    """Drop a collected node's cache entry (unless a new node took the key meanwhile)."""
    ref = UOp._cache.get(key)
    if ref is not None and ref() is None:
        del UOp._cache[key]


def _infer_shape(u: UOp) -> tuple[int, ...]:
    op, arg = u.op, u.arg
    if op in (Ops.CONST, Ops.DEVICE) or op not in _SHAPED:
        return ()
    if op is Ops.BUFFER:
        return (arg[0].size,)
    if op is Ops.ARANGE:
        return (arg,)
    if op in (Ops.RESHAPE, Ops.EXPAND):
        return tuple(arg)
    src = u.src[0].shape
    if op is Ops.PERMUTE:
        return tuple(src[i] for i in arg)
    if op is Ops.PAD:
        return tuple(s + b + a for s, (b, a) in zip(src, arg))
    if op is Ops.SHRINK:
        return tuple(e - b for b, e in arg)
    if op is Ops.REDUCE_AXIS:
        return tuple(1 if i in arg[1] else s for i, s in enumerate(src))
    if op is Ops.BITCAST and u.dtype.itemsize != u.src[0].dtype.itemsize:
        return (*src[:-1], src[-1] * u.src[0].dtype.itemsize // u.dtype.itemsize)
    # elementwise: every shaped source has the same shape (the Tensor layer broadcasts first)
    return next((s.shape for s in u.src if s.op is not Ops.DEVICE), ())


_SHAPED = GroupOp.Movement | GroupOp.Elementwise | {Ops.BUFFER, Ops.ARANGE, Ops.REDUCE_AXIS, Ops.COPY, Ops.CONTIGUOUS,
                                                   Ops.DETACH, Ops.ASSIGN}


def _value_range(u: UOp) -> tuple[ConstType, ConstType]:
    """A conservative [vmin, vmax] of an integer or bool node's value."""
    dt = u.dtype
    default = (dt.min(), dt.max()) if dt.is_int or dt.is_bool else (-math.inf, math.inf)
    if u.op is Ops.CONST:
        return (u.arg, u.arg)
    if u.op is Ops.RANGE:
        return (0, u.src[0].vmax - 1)
    if not (dt.is_int or dt.is_bool):
        return default
    s = [x._minmax() for x in u.src]
    if u.op is Ops.ADD:
        return (s[0][0] + s[1][0], s[0][1] + s[1][1])
    if u.op is Ops.NEG and dt.is_int and not dt.is_unsigned:
        return (-s[0][1], -s[0][0])
    if u.op is Ops.MUL:
        corners = [a * b for a in s[0] for b in s[1]]
        return (min(corners), max(corners))
    if u.op is Ops.IDIV and s[1][0] == s[1][1] and isinstance(s[1][0], int) and s[1][0] > 0:
        d = s[1][0]
        return (_trunc_div(s[0][0], d), _trunc_div(s[0][1], d))
    if u.op is Ops.MOD and s[1][0] == s[1][1] and isinstance(s[1][0], int) and s[1][0] > 0:
        d = s[1][0]
        if s[0][0] >= 0:
            return (s[0][0], s[0][1]) if s[0][1] < d else (0, min(s[0][1], d - 1))
        return (-(d - 1), d - 1)
    if u.op is Ops.MAX:
        return (max(s[0][0], s[1][0]), max(s[0][1], s[1][1]))
    if u.op is Ops.WHERE:
        return (min(s[1][0], s[2][0]), max(s[1][1], s[2][1]))
    if u.op is Ops.CMPLT:  # (always true?, can be true?)
        return (s[0][1] < s[1][0], s[0][0] < s[1][1])
    if u.op is Ops.AND and dt.is_bool:
        return (s[0][0] and s[1][0], s[0][1] and s[1][1])
    if u.op is Ops.CAST and u.src[0].dtype.is_int:
        if dt.min() <= s[0][0] and s[0][1] <= dt.max():
            return s[0]
    return default


def _trunc_div(a: ConstType, b: int) -> int:
    """C-style division (rounds toward zero) of integers; infinities pass through."""
    if isinstance(a, float):
        return a  # type: ignore[return-value]
    q = abs(int(a)) // b
    return q if a >= 0 else -q


def pretty(u: UOp, max_nodes: int = 40) -> str:
    """A readable multi-line dump of a graph: one numbered line per node."""
    nodes = u.toposort()
    if len(nodes) > max_nodes:
        return f"UOp({u.op}, {u.dtype}, nsrc={len(u.src)}, arg={u.arg!r}, ... {len(nodes)} nodes)"
    names = {n: f"%{i}" for i, n in enumerate(nodes)}
    lines = [f"{names[n]} = {n.op.name} {n.dtype.name}"
             f"({', '.join(names[s] for s in n.src)}){'' if n.arg is None else ' arg=' + repr(n.arg)}" for n in nodes]
    return "\n".join(lines)
