"""Data types: what a tensor's elements are, and how mixed types promote.

In: nothing (a table of `DType`s). Out: `dtypes.float32` and friends, `least_upper_dtype` for
promotion (tinygrad's/PyTorch's lattice), and conversions to numpy dtypes and C type names.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from glassgrad.errors import UnknownDTypeError
from glassgrad.helpers import STATE_FLAGS


@dataclass(frozen=True, eq=False)
class DType:
    """One element type. `priority` orders types of the same kind; `fmt` is the numpy type code."""
    priority: int
    itemsize: int
    name: str
    fmt: str | None  # numpy type string; None for bfloat16 (numpy has none)

    def __repr__(self) -> str:
        return f"dtypes.{self.name}"

    # every DType is a singleton in `dtypes`, so identity is equality (and hashing is fast: it is on hot paths)
    __eq__ = object.__eq__
    __hash__ = object.__hash__

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _by_name, (self.name,)  # unpickle to the same singleton (void too: a lazy graph's nodes hold it)

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def is_unsigned(self) -> bool:
        return self in _UINTS

    @property
    def is_bool(self) -> bool:
        return self == dtypes.bool

    @property
    def np(self) -> np.dtype:
        """The numpy dtype that stores this type (bfloat16 is stored as uint16 bits)."""
        return np.dtype(self.fmt if self.fmt is not None else "uint16")

    @property
    def min(self) -> int | float | bool:
        """The smallest value (-inf for floats), as tinygrad's `dtypes.int.min`."""
        return _limits(self)[0]

    @property
    def max(self) -> int | float | bool:
        """The largest value (inf for floats), as tinygrad's `dtypes.int.max`."""
        return _limits(self)[1]


class dtypes:
    """Namespace of every dtype glassgrad knows, with tinygrad's names."""
    bool = DType(0, 1, "bool", "?")
    int8 = DType(1, 1, "int8", "b")
    uint8 = DType(2, 1, "uint8", "B")
    int16 = DType(3, 2, "int16", "h")
    uint16 = DType(4, 2, "uint16", "H")
    int32 = DType(5, 4, "int32", "i")
    uint32 = DType(6, 4, "uint32", "I")
    int64 = DType(7, 8, "int64", "q")
    uint64 = DType(8, 8, "uint64", "Q")
    float16 = DType(9, 2, "float16", "e")
    bfloat16 = DType(10, 2, "bfloat16", None)
    float32 = DType(11, 4, "float32", "f")
    float64 = DType(12, 8, "float64", "d")
    void = DType(-1, 0, "void", None)  # for nodes that hold no value (DEVICE, SINK, STORE)
    # aliases
    half = float16
    float = float32
    double = float64
    int = int32
    long = int64
    default_float = float32
    default_int = int32
    # tinygrad's C-style aliases
    char, uchar, short, ushort, uint, ulong = int8, uint8, int16, uint16, uint32, uint64
    # groups (tinygrad's `dtypes.floats`, `dtypes.ints`, ...)
    floats = (float16, bfloat16, float32, float64)
    uints = (uint8, uint16, uint32, uint64)
    sints = (int8, int16, int32, int64)
    ints = uints + sints
    all = floats + ints + (bool,)  # noqa: A003  (tinygrad's name)

    # tinygrad's predicates take the dtype (`dtypes.is_float(t.dtype)`); `t.dtype.is_float` is the same question
    @staticmethod
    def is_float(x: DType) -> builtins.bool:  # (`bool` here is dtypes.bool)
        return x in _FLOATS

    @staticmethod
    def is_int(x: DType) -> builtins.bool:
        return x in _INTS

    @staticmethod
    def is_unsigned(x: DType) -> builtins.bool:
        return x in _UINTS

    @staticmethod
    def is_bool(x: DType) -> builtins.bool:
        return x is dtypes.bool

    @staticmethod
    def finfo(x: DType) -> tuple[builtins.int, builtins.int]:
        """(exponent bits, mantissa bits) of a float dtype."""
        if x not in _FINFO:
            raise ValueError(f"finfo: {x} is not a floating point type")
        return _FINFO[x]

    @staticmethod
    def from_np(npdtype: np.dtype | type) -> DType:
        d = np.dtype(npdtype)
        for dt in ALL_DTYPES:
            if dt.fmt is not None and np.dtype(dt.fmt) == d:
                return dt
        raise TypeError(f"numpy dtype {d} has no glassgrad equivalent; supported: {[x.name for x in ALL_DTYPES]}")

    @staticmethod
    def from_py(x: object) -> DType:
        """The dtype a Python value (or nested list of them) gets by default."""
        if isinstance(x, (list, tuple)):
            return max((dtypes.from_py(e) for e in x), key=lambda d: d.priority, default=dtypes.default_float)
        if isinstance(x, bool):
            return dtypes.bool
        if isinstance(x, int):
            return dtypes.default_int
        if isinstance(x, float):
            return dtypes.default_float
        raise TypeError(f"cannot make a tensor element from {type(x).__name__}: {x!r}")


ALL_DTYPES: tuple[DType, ...] = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32,
                                 dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16,
                                 dtypes.float32, dtypes.float64)
@functools.cache
def _limits(dtype: DType) -> tuple[int | float | bool, int | float | bool]:
    """(min, max) of a dtype (asked for every int constant and arange: `np.iinfo` once per dtype)."""
    if dtype.is_bool:
        return False, True
    if dtype.is_int:
        info = np.iinfo(dtype.np)
        return int(info.min), int(info.max)
    return float("-inf"), float("inf")


_FLOATS = frozenset({dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64})
_UINTS = frozenset({dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64})
_INTS = frozenset({dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64}) | _UINTS
_FINFO = {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23), dtypes.float64: (11, 52)}
DTYPE_BY_NAME: dict[str, DType] = {d.name: d for d in ALL_DTYPES}
_ALIASES = ("half", "float", "double", "int", "long", "char", "uchar", "short", "ushort", "uint", "ulong")

# Each type's direct supertypes. A set of types promotes to the lowest common ancestor in this lattice,
# so int8+uint8 -> int16, int64+float16 -> float16, float16+bfloat16 -> float32 (as in tinygrad/PyTorch).
_PROMOTES_TO: dict[DType, tuple[DType, ...]] = {
    dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,),
    dtypes.int32: (dtypes.int64,), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
    dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
    dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
    dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
    dtypes.float64: (),
}


@functools.cache
def _ancestors(d: DType) -> frozenset[DType]:
    return frozenset({d}).union(*(_ancestors(p) for p in _PROMOTES_TO[d]))


# least_upper_dtype's answers for one to three dtypes, keyed with the default float (which it can return): a pure
# function of few inputs, asked by every promoting op and every sum (~2 us to compute, a dictionary lookup to recall)
_LEAST_UPPER: dict[tuple[DType, ...], DType] = {}


def least_upper_dtype(*ds: DType) -> DType:
    """The smallest dtype every one of `ds` promotes to. Ints alone that meet only at a float (int64 with uint64)
    give the default float (tinygrad's weak float, JAX's rule), not float16: `int64 + uint64` of 70000 was inf."""
    key = (*ds, dtypes.default_float)
    if (known := _LEAST_UPPER.get(key)) is not None:
        return known
    common = frozenset.intersection(*(_ancestors(d) for d in ds))
    lowest = min(common, key=lambda d: d.priority)
    if lowest.is_float and not any(d.is_float for d in ds):
        lowest = dtypes.default_float
    if len(ds) <= 3:  # (a bounded table: a `cat` of many tensors asks with as many dtypes)
        _LEAST_UPPER[key] = lowest
    return lowest


def _by_name(name: str) -> DType:
    """The DType singleton of this name, void included (what unpickling a DType calls)."""
    return dtypes.void if name == "void" else to_dtype(name)


def to_dtype(x: DType | str | type | np.dtype) -> DType:
    """Accept a DType, its name ('float32', or tinygrad's any-case spelling as in `DEFAULT_FLOAT=HALF`), or a numpy
    dtype."""
    if isinstance(x, DType):
        return x
    if isinstance(x, str) and x not in DTYPE_BY_NAME and x not in _ALIASES and x.lower() != x:
        x = x.lower()
    if isinstance(x, str) and x in DTYPE_BY_NAME:
        return DTYPE_BY_NAME[x]
    if isinstance(x, str) and x in _ALIASES:
        return getattr(dtypes, x)
    try:
        return dtypes.from_np(x)  # type: ignore[arg-type]
    except TypeError:
        raise UnknownDTypeError(f"unknown dtype {x!r}; use one of {sorted(DTYPE_BY_NAME)}") from None


def truncate(value: float | int | bool, dtype: DType) -> float | int | bool:
    """Make a Python scalar exactly what `dtype` would store (wrap ints, round floats)."""
    if dtype.is_bool:
        return bool(value)
    if dtype.is_int:
        return int(np.array(int(value) if not isinstance(value, float) or np.isfinite(value) else 0).astype(dtype.np))
    if dtype == dtypes.bfloat16:
        return float(bf16_to_f32(f32_to_bf16(np.array([value], np.float32)))[0])
    if type(value) is float:  # the common case, every `x * 0.5`: without numpy's per-call cost
        if dtype == dtypes.float64:
            return value
        if dtype == dtypes.float32:
            with contextlib.suppress(OverflowError):  # beyond float32's range: numpy below gives +-inf
                return struct.unpack("<f", struct.pack("<f", value))[0]  # C's double -> float rounding, as numpy's
    with np.errstate(over="ignore"):  # beyond the dtype's range is +-inf, as the kernels give (no numpy warning)
        return float(np.array(value, dtype=dtype.np))


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 array -> bfloat16 bits (uint16), round to nearest even, NaN kept NaN."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    return np.where(nan, np.uint16(0x7FC0), rounded).astype(np.uint16)


def bf16_to_f32(x: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 array."""
    return (x.astype(np.uint32) << 16).view(np.float32)


def _default_setter(attr: str, kind: str) -> Callable[[DType | str], None]:
    """The setter of `dtypes.default_float` or `default_int` for tinygrad's Context(DEFAULT_FLOAT=...)."""
    def write(value: DType | str) -> None:
        dt = to_dtype(value)
        if (kind == "float" and not dt.is_float) or (kind == "int" and not dt.is_int):
            raise ValueError(f"{attr} must be a{'' if kind == 'float' else 'n'} {kind} dtype, got {dt}")
        setattr(dtypes, attr, dt)
    return write


STATE_FLAGS["DEFAULT_FLOAT"] = (lambda: dtypes.default_float, _default_setter("default_float", "float"))
STATE_FLAGS["DEFAULT_INT"] = (lambda: dtypes.default_int, _default_setter("default_int", "int"))
# as tinygrad's: `DEFAULT_FLOAT=HALF python x.py` sets the default from the start (a bad value raises at import)
for _flag in ("DEFAULT_FLOAT", "DEFAULT_INT"):
    if os.environ.get(_flag):
        STATE_FLAGS[_flag][1](os.environ[_flag])


# tinygrad's names for type hints and lookups, which programs import from `tinygrad.dtype`
DTypeLike = DType | str  # (what `to_dtype` and every `dtype=` keyword take)
ConstType = int | float | bool  # a Python scalar a tensor element is made from
# every dtype by its name and tinygrad's aliases ('float', 'half', 'long', ...)
DTYPES_DICT: dict[str, DType] = {**DTYPE_BY_NAME, **{a: getattr(dtypes, a) for a in _ALIASES}}


def sum_acc_dtype(dt: DType) -> DType:
    """The dtype a sum of `dt` accumulates in (as tinygrad's): unsigned ints in at least uint32, ints and bools in at
    least int32, floats in at least float32."""
    if dt.is_unsigned:
        return least_upper_dtype(dt, dtypes.uint32)
    if dt.is_int or dt.is_bool:
        return least_upper_dtype(dt, dtypes.int32)
    return least_upper_dtype(dt, dtypes.float32)


def least_upper_float(dt: DType) -> DType:
    """`dt` if it is a float, else the default float (what a division or an exp of `dt` gives)."""
    return dt if dt.is_float else least_upper_dtype(dt, dtypes.default_float)


def _to_np_dtype(dtype: DType) -> type | None:
    """The numpy scalar type of a dtype (float32 for bfloat16, which numpy lacks), as tinygrad's helper."""
    if dtype == dtypes.bfloat16:
        return np.float32
    return None if dtype.fmt is None else np.dtype(dtype.fmt).type


def _from_np_dtype(npdtype: np.dtype | type) -> DType:
    """The dtype of a numpy dtype (tinygrad's helper; `dtypes.from_np` is the same)."""
    return dtypes.from_np(npdtype)
