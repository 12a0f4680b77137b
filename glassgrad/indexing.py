"""`Tensor.__getitem__`: numpy-style indexing built only from movement ops and the Tensor API.

In: a tensor and an index (an int, slice, None, Ellipsis, list of ints, integer numpy array or integer Tensor, or a
tuple of those). Out: a new lazy tensor with numpy's result shape and values.

Two phases:
  * basic indexing (ints, slices with any step, None, ...) is pure view math: `shrink` to the selected span,
    `flip` for negative steps, and for a step s > 1 the pad/reshape/shrink trick (pad the span to a multiple of s,
    view it as (count, s), keep column 0); then one `reshape` drops int dims and inserts None dims;
  * advanced indexing (lists, arrays, integer tensors) is a gather written as a one-hot mask:
    `(idx.unsqueeze(-1) == arange(n))` for each indexed dim, AND-ed together, then `where(mask, x, 0).sum(...)`,
    which autograd differentiates for free, and which the scheduler turns into a direct load of the selected element
    (a GATHER node, glassgrad/schedule/gather.py), fused with whatever reads it.

Semantics follow numpy, with PyTorch's (and tinygrad's) placement: negative ints and negative tensor entries count
from the end; index tensors broadcast together; the broadcast dims replace the indexed dims in place when the index
tensors sit next to each other (ints between them do not separate them: an int selects first, as in PyTorch; numpy
counts it as an advanced index), else they go in front. Out-of-range ints and list entries
raise IndexError naming the dim and its size; entries of a lazy index Tensor cannot be checked without computing
them, so an out-of-range entry there selects nothing and yields 0 (documented difference from numpy).
Boolean masks select as numpy's and PyTorch's do: a bool tensor, array or list covering k dims (its shape theirs)
is the k index arrays of its True entries (a Tensor mask is computed for that: the result's shape depends on its
values). tinygrad raises there. A Python bool or a 0-d mask raises IndexError, which is also a TypeError.
Symbolic slices: a bound Variable (or an int expression of one) as a slice's start or stop, `t[:v]`, `t[v:v+2]`,
is a shrink with symbolic bounds (step 1, no negative bounds); a dimension that is already symbolic takes such
slices and in-range ints. A bound Variable alone, `t[v]`, selects like an int (a shrink to [v, v+1), the dim
dropped); it must lie in the dim for every value in the Variable's range (no counting from the end).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from glassgrad.errors import IndexTypeError
from glassgrad.uop.ops import UOp
from glassgrad.uop.sint import render_sint, sint, sint_add, sint_eval

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor


@dataclass(frozen=True)
class _Item:
    """One entry of the index after Ellipsis expansion: kind is 'int', 'slice', 'none' or 'tensor'."""
    kind: str
    value: Any = None


def getitem(t: Tensor, index: Any) -> Tensor:
    """`t[index]` with numpy semantics (see the module docstring)."""
    items = _parse(t, index if isinstance(index, tuple) else (index,))
    x, tensor_dims = _basic(t, items)
    tensor_items = [it for it in items if it.kind == "tensor"]
    if not tensor_items:
        return x._same_view() if x is t else x  # (t[...]: a view, never t itself)
    return _advanced(x, items, tensor_items, tensor_dims)


# ---------------------------------------------------------------------- parsing
def _parse(t: Tensor, index: tuple[Any, ...]) -> list[_Item]:
    """Classify every entry, expand the Ellipsis and pad with full slices up to t.ndim consumed dims; a boolean
    mask becomes the integer indices of its True entries, one per dim it covers."""
    raw = [_Item("mask", mask) if (mask := _bool_mask(entry)) is not None else _classify(t, entry) for entry in index]
    ellipses = sum(1 for it in raw if it.kind == "ellipsis")
    if ellipses > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    consumed = sum(1 for it in raw if it.kind in ("int", "slice", "tensor")) + \
        sum(it.value.ndim for it in raw if it.kind == "mask")
    if consumed > t.ndim:
        raise IndexError(f"too many indices for tensor of dimension {t.ndim}: {consumed} were given "
                         f"(shape {t.shape})")
    fill = [_Item("slice", slice(None))] * (t.ndim - consumed)
    if ellipses:
        at = next(i for i, it in enumerate(raw) if it.kind == "ellipsis")
        raw = raw[:at] + fill + raw[at + 1:]
    else:
        raw = raw + fill
    return _expand_masks(t, raw)


def _bool_mask(entry: Any) -> np.ndarray | None:
    """A boolean mask index (a bool Tensor, numpy array or nested list, at least 1-d) as a numpy array, else None.
    A Tensor mask is computed here: the result's shape depends on its values (as in PyTorch, a synchronisation)."""
    from glassgrad.tensor import Tensor
    if isinstance(entry, Tensor) and entry.dtype.is_bool and entry.ndim >= 1:
        return np.asarray(entry.numpy())
    if isinstance(entry, (list, tuple, np.ndarray)) and not isinstance(entry, Tensor):
        array = np.asarray(entry)
        if array.dtype == np.bool_ and array.ndim >= 1:
            return array
    return None


def _expand_masks(t: Tensor, items: list[_Item]) -> list[_Item]:
    """Each mask item -> the index tensors of its True entries (numpy's `nonzero`), after checking that its shape is
    the shape of the dims it covers (numpy's rule: a mismatch is an IndexError, never a partial selection)."""
    out: list[_Item] = []
    dim = 0
    for it in items:
        if it.kind != "mask":
            out.append(it)
            dim += it.kind in ("int", "slice", "tensor")
            continue
        covered = tuple(t.shape[dim:dim + it.value.ndim])
        if covered != it.value.shape:
            raise IndexError(f"boolean index of shape {it.value.shape} does not match the indexed dims {covered} of "
                             f"a tensor of shape {t.shape} (from dim {dim})")
        out.extend(_Item("tensor", _host_index(positions, t.device)) for positions in np.nonzero(it.value))
        dim += it.value.ndim
    return out


def _classify(t: Tensor, entry: Any) -> _Item:
    from glassgrad.tensor import Tensor
    if entry is None:
        return _Item("none")
    if entry is Ellipsis:
        return _Item("ellipsis")
    if isinstance(entry, (bool, np.bool_)):
        raise IndexTypeError("boolean indices are not supported; use where() or an integer index instead")
    if isinstance(entry, (int, np.integer)):
        return _Item("int", int(entry))
    if isinstance(entry, UOp):  # a bound Variable (or an int expression of one) selects like an int: t[v]
        if not entry.dtype.is_int:
            raise TypeError(f"a symbolic index must be an int expression of bound Variables, got dtype {entry.dtype}")
        return _Item("int", entry)
    if isinstance(entry, slice):
        if isinstance(entry.start, UOp) or isinstance(entry.stop, UOp):
            return _Item("slice", entry)  # a symbolic slice: checked by _symbolic_span and shrink
        for part in (entry.start, entry.stop, entry.step):
            if part is not None and (not isinstance(part, (int, np.integer)) or isinstance(part, bool)):
                raise TypeError(f"slice bounds must be ints or None, got {entry}")
        return _Item("slice", entry)
    if isinstance(entry, Tensor):
        if entry.dtype.is_bool:
            raise IndexTypeError("boolean mask indexing is not supported; use where() or an integer index tensor")
        if not entry.dtype.is_int:
            raise IndexError(f"tensors used as indices must be integer tensors, got {entry.dtype}")
        if entry.device != t.device:
            raise RuntimeError(f"index tensor is on {entry.device}, the indexed tensor on {t.device}")
        return _Item("tensor", entry)
    if isinstance(entry, (list, tuple, np.ndarray)):
        return _Item("tensor", _host_index(entry, t.device))
    raise IndexTypeError(f"invalid index of type {type(entry).__name__}: {entry!r}; use ints, slices, None, ..., "
                         "lists of ints or integer tensors")  # (PyTorch raises IndexError, numpy IndexError too)


@dataclass(frozen=True)
class _HostIndex:
    """An index whose values are known on the host (from a list or numpy array), so its range can be checked."""
    tensor: Any
    values: np.ndarray


def _host_index(entry: Any, device: str) -> _HostIndex:
    """A list or numpy array of ints as a Tensor (raw values: range checks happen per dim in `_advanced`)."""
    from glassgrad.tensor import Tensor
    array = np.asarray(entry)
    if array.dtype == np.bool_:
        raise IndexTypeError("boolean mask indexing is not supported; use where() or an integer index")
    if array.size == 0 and array.dtype.kind == "f":
        array = array.astype(np.int32)  # [] is an empty list of indices, as in numpy
    if array.dtype.kind not in "iu":
        raise IndexError(f"arrays used as indices must hold integers, got {array.dtype}")
    return _HostIndex(Tensor(array.astype(np.int64) if array.dtype == np.uint64 else array, device=device), array)


# ---------------------------------------------------------------------- basic indexing
def _basic(t: Tensor, items: list[_Item]) -> tuple[Tensor, list[int]]:
    """Apply ints, slices and None. Returns the view and, for each tensor item, the dim it now occupies."""
    bounds: list[tuple[sint, sint]] = []
    flips: list[bool] = []
    steps: list[int] = []
    dim = 0
    for it in (it for it in items if it.kind != "none"):
        size = t.shape[dim]
        if it.kind == "int" and isinstance(it.value, UOp):
            bounds.append((it.value, sint_add(it.value, 1)))  # shrink checks it fits for every value of the Variables
            flips.append(False)
            steps.append(1)
        elif it.kind == "int":
            i = _check_int(it.value, dim, size)
            bounds.append((i, i + 1))
            flips.append(False)
            steps.append(1)
        elif it.kind == "slice":
            lo, hi, step = _slice_span(it.value, size)
            bounds.append((lo, hi))
            flips.append(step < 0)
            steps.append(abs(step))
        else:
            bounds.append((0, size))
            flips.append(False)
            steps.append(1)
        dim += 1
    x = t.shrink(bounds) if t.ndim else t
    if any(flips):
        x = x.flip(tuple(i for i, f in enumerate(flips) if f))
    if any(s > 1 for s in steps):
        x = _take_every(x, steps)
    return _final_reshape(x, items)


def _check_int(i: int, dim: int, size: sint) -> int:
    if isinstance(size, UOp):  # a symbolic dimension: an index below its bound size (what shrink accepts)
        if not 0 <= i < sint_eval(size):
            raise IndexError(f"index {i} into symbolic dimension {dim} of size {render_sint(size)} must be in "
                             f"[0, {sint_eval(size)}) (the size its Variables are bound to)")
        return i
    if not -size <= i < size:
        raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size}")
    return i + size if i < 0 else i


def _slice_span(s: slice, size: sint) -> tuple[sint, sint, int]:
    """The contiguous span [lo, hi) that a slice touches, and its step (count = ceil((hi-lo)/|step|))."""
    if isinstance(size, UOp) or isinstance(s.start, UOp) or isinstance(s.stop, UOp):
        return _symbolic_span(s, size)
    if s.step == 0:
        raise ValueError("slice step cannot be zero")
    start, stop, step = s.indices(size)
    count = len(range(start, stop, step))
    if count == 0:
        return 0, 0, 1
    last = start + (count - 1) * step
    return (start, last + 1, step) if step > 0 else (last, start + 1, step)


def _symbolic_span(s: slice, size: sint) -> tuple[sint, sint, int]:
    """A slice with a Variable bound, or of a symbolic dimension: step 1 and non-negative bounds only (a negative
    bound would count from a symbolic end); shrink checks the bounds fit for every value of the Variables."""
    if s.step not in (None, 1):
        raise IndexError(f"symbolic slices take step 1, got {s.step}")
    for part in (s.start, s.stop):
        if isinstance(part, (int, np.integer)) and not isinstance(part, bool) and part < 0:
            raise IndexError(f"symbolic slices take non-negative bounds, got {s}")
        if part is not None and not isinstance(part, (int, np.integer, UOp)):
            raise TypeError(f"slice bounds must be ints, bound Variables or None, got {s}")
    return (0 if s.start is None else s.start), (size if s.stop is None else s.stop), 1


def _take_every(x: Tensor, steps: list[int]) -> Tensor:
    """Keep every steps[d]-th element along each dim d (starting at 0): pad, view as (count, step), keep column 0."""
    counts = [math.ceil(n / s) for n, s in zip(x.shape, steps, strict=True)]
    x = x.pad(tuple((0, c * s - n) for n, c, s in zip(x.shape, counts, steps, strict=True)))
    x = x.reshape(tuple(v for c, s in zip(counts, steps, strict=True) for v in (c, s)))
    x = x.shrink(tuple(b for c in counts for b in ((0, c), (0, 1))))
    return x.reshape(tuple(counts))


def _final_reshape(x: Tensor, items: list[_Item]) -> tuple[Tensor, list[int]]:
    """Drop the dims of int items, insert size-1 dims for None, and note where tensor items' dims ended up."""
    shape: list[int] = []
    tensor_dims: list[int] = []
    dim = 0
    for it in items:
        if it.kind == "none":
            shape.append(1)
            continue
        if it.kind == "tensor":
            tensor_dims.append(len(shape))
        if it.kind != "int":
            shape.append(x.shape[dim])
        dim += 1
    return x.reshape(tuple(shape)), tensor_dims


# ---------------------------------------------------------------------- advanced indexing
def _advanced(x: Tensor, items: list[_Item], tensor_items: list[_Item], tensor_dims: list[int]) -> Tensor:
    """Gather along the tensor-indexed dims of x with a one-hot mask; place the broadcast dims as numpy does."""
    from glassgrad.tensor import Tensor, _broadcast_shape
    sizes = [x.shape[d] for d in tensor_dims]
    if any(isinstance(n, UOp) for n in sizes):
        raise NotImplementedError("indexing a symbolic (Variable) dimension with a list or tensor is not supported; "
                                  "use a slice, or gather before shrinking to the Variable")
    idxs = [_index_tensor(it.value, d, n) for it, d, n in zip(tensor_items, _source_dims(items), sizes, strict=True)]
    bshape: tuple[int, ...] = ()
    for i in idxs:
        try:
            bshape = _broadcast_shape(bshape, i.shape)
        except ValueError:
            raise IndexError(f"shape mismatch: index tensors of shapes {[j.shape for j in idxs]} cannot be "
                             "broadcast together") from None
    k = len(idxs)
    mask: Tensor | None = None
    for j, (i, n) in enumerate(zip(idxs, sizes, strict=True)):
        wrapped = (i < 0).where(i + n, i) if not i.dtype.is_unsigned else i
        candidates = Tensor.arange(n, device=x.device).reshape((n,) + (1,) * (k - 1 - j))
        hit = wrapped._broadcast_to(bshape).reshape(bshape + (1,) * k) == candidates
        mask = hit if mask is None else mask & hit
    assert mask is not None
    rest = [d for d in range(x.ndim) if d not in tensor_dims]
    moved = x.permute(rest + tensor_dims)
    moved = moved.reshape(tuple(x.shape[d] for d in rest) + (1,) * len(bshape) + tuple(sizes))
    picked = mask.where(moved, False if x.dtype.is_bool else 0)
    axes = tuple(range(-k, 0))
    out = picked.any(axes) if x.dtype.is_bool else picked.sum(axes, dtype=x.dtype)
    return _place(out, len(rest), len(bshape), _adjacent_at(items))


def _source_dims(items: list[_Item]) -> list[int]:
    """For each tensor item, the dim of the *indexed* tensor it indexes (for error messages)."""
    dims, dim = [], 0
    for it in items:
        if it.kind == "tensor":
            dims.append(dim)
        if it.kind != "none":
            dim += 1
    return dims


def _index_tensor(value: Any, dim: int, size: int) -> Tensor:
    if isinstance(value, _HostIndex):
        v = value.values
        if v.size and (v.min() < -size or v.max() >= size):
            bad = int(v[(v < -size) | (v >= size)].reshape(-1)[0])
            raise IndexError(f"index {bad} is out of bounds for dimension {dim} with size {size}")
        return value.tensor
    return value


def _adjacent_at(items: list[_Item]) -> int | None:
    """Output position of the broadcast dims when the index tensors are adjacent, else None (they go first).

    Ints do not count (PyTorch's rule: they select before the gather), so `x[0, :, [1, 2]]` keeps the broadcast
    dims in place and `x[[0, 1], 0, [1, 2]]` too; numpy would put both first."""
    kept = [it for it in items if it.kind != "int"]
    advanced = [i for i, it in enumerate(kept) if it.kind == "tensor"]
    if advanced != list(range(advanced[0], advanced[-1] + 1)):
        return None
    return advanced[0]


def _place(out: Tensor, n_rest: int, n_b: int, at: int | None) -> Tensor:
    """out has the non-indexed dims first, then the broadcast dims; move the broadcast dims to position `at`."""
    position = 0 if at is None else at
    rest = list(range(n_rest))
    bdims = list(range(n_rest, n_rest + n_b))
    order = rest[:position] + bdims + rest[position:]
    return out.permute(order) if order != list(range(len(order))) else out

