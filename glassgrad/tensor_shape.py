"""Movement, cumulative and selection ops on `Tensor` (a mixin), with tinygrad's names and signatures.

In: tensors and the usual axis/shape arguments (negative axes allowed). Out: lazy tensors made of movement ops,
`where`, comparisons against `arange` and reductions, as in tinygrad:

* views: `pad_to`, `shrink_to`, `diag`, `diagonal`, `roll`, `unfold`, `repeat_interleave`, `meshgrid`, `rearrange`;
* masks from `arange`: `tril`, `triu`, `masked_fill`;
* cumulative ops as one reduction over a triangular mask (n^2 work, one fused kernel, like `cumsum`): `cumprod`,
  `cummax`, `cummin`, `logcumsumexp`;
* scatter/gather through one-hot masks: `scatter_reduce`, `max_unpool2d`, `nll_loss`;
* ops whose output shape depends on the data (`nonzero`, `masked_select` without `size=`) read the mask back to
  the host once to learn the count, as tinygrad does; with `size=` they stay lazy (and jittable);
* small reductions: `var_mean`, `std_mean`, `softmin`, `normalize`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from glassgrad.dtype import DType, dtypes, to_dtype
from glassgrad.errors import ArgumentError, DTypeError, ShapeError
from glassgrad.helpers import normalize_axis, prod, shape_args
from glassgrad.tensor_math import accepts_dim

if TYPE_CHECKING:
    from glassgrad.tensor import AxisArg, Scalar, Tensor

SCATTER_REDUCTIONS = ("sum", "prod", "mean", "amax", "amin")


def _tensor_class() -> type[Tensor]:
    from glassgrad.tensor import Tensor
    return Tensor


def _lowest(dtype: DType) -> Scalar:
    return -math.inf if dtype.is_float else dtype.min


def _highest(dtype: DType) -> Scalar:
    return math.inf if dtype.is_float else dtype.max


class ShapeOps:
    """Mixed into Tensor. Methods use only the public Tensor API."""
    __slots__ = ()

    @property
    def _m(self) -> Tensor:
        """This object as the Tensor it is (for the type checker: the mixin is only ever part of a Tensor)."""
        return cast("Tensor", self)

    # ------------------------------------------------------------------ views
    def shrink_to(self, shape: Any, *args: Any) -> Tensor:
        """Keep the first `shape[d]` elements of each dim d (None keeps the dim whole)."""
        t = self._m
        dims = shape_args(shape, args)
        if len(dims) != t.ndim:
            raise ValueError(f"shrink_to: shape {dims} needs one entry per dim of {t.shape}")
        return t.shrink(tuple(None if d is None else (0, d) for d in dims))

    def pad_to(self, shape: Any, *args: Any, value: Scalar = 0) -> Tensor:
        """Pad each dim d at its end up to `shape[d]` with `value` (None keeps the dim as it is)."""
        t = self._m
        dims = shape_args(shape, args)
        if len(dims) != t.ndim:
            raise ValueError(f"pad_to: shape {dims} needs one entry per dim of {t.shape}")
        if any(d is not None and d < s for d, s in zip(dims, t.shape)):
            raise ValueError(f"pad_to: shape {dims} is smaller than {t.shape}; use shrink_to to cut")
        pads = tuple((0, 0 if d is None else d - s) for d, s in zip(dims, t.shape))
        return t if all(p == (0, 0) for p in pads) else t.pad(pads, value=value)

    def diag(self) -> Tensor:
        """A 1-D tensor (n,) -> the (n, n) matrix with it on the diagonal (tinygrad takes 1-D input only)."""
        t = self._m
        if t.ndim != 1:
            raise ValueError(f"diag expects a 1-D tensor, got shape {t.shape} (for a diagonal, use diagonal())")
        n = t.shape[0]
        # (n, 1) padded to (n, n+1), flattened: element i lands at i*(n+1), the diagonal of an (n, n) matrix
        return t.unsqueeze(-1).pad(((0, 0), (0, n))).flatten().shrink(((0, n * n),)).reshape(n, n)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        """The diagonal of dims (dim1, dim2), appended as the last dim; offset > 0 is above the main diagonal."""
        t = self._m
        d1, d2 = normalize_axis(dim1, t.ndim, "dim1"), normalize_axis(dim2, t.ndim, "dim2")
        if d1 == d2:
            raise ShapeError(f"diagonal: dim1 and dim2 must differ, both name dim {d1}")
        x = t.permute(*[i for i in range(t.ndim) if i not in (d1, d2)], d1, d2)
        lead = x.shape[:-2]
        rows, cols = x.shape[-2], x.shape[-1]
        start_r, start_c = min(rows, max(0, -offset)), min(cols, max(0, offset))
        n = max(0, min(rows - start_r, cols - start_c))
        x = x.shrink((*((0, s) for s in lead), (start_r, start_r + n), (start_c, start_c + n)))
        if n == 0:
            return x.reshape(*lead, 0)
        flat = x.reshape(*lead, n * n).pad((*((0, 0) for _ in lead), (0, n)))
        return flat.reshape(*lead, n, n + 1).shrink((*((0, s) for s in lead), (0, n), (0, 1))).reshape(*lead, n)

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """Shift elements circularly along `dims` (the flattened tensor when dims is None), as torch.roll."""
        t = self._m
        if dims is None:
            if not isinstance(shifts, int):
                if len(shifts) != 1:
                    raise ShapeError(f"roll without dims takes one shift, got {len(shifts)}: {shifts!r}")
                shifts = shifts[0]
            return t.flatten().roll(shifts, 0).reshape(t.shape)
        dim_list = [dims] if isinstance(dims, int) else list(dims)
        shift_list = [shifts] if isinstance(shifts, int) else list(shifts)
        if len(dim_list) != len(shift_list):
            raise ShapeError(f"roll: {len(shift_list)} shifts for {len(dim_list)} dims")
        out = t
        for d, s in zip(dim_list, shift_list):
            a = normalize_axis(d, t.ndim, "dim")
            n = t.shape[a]
            if n == 0 or s % n == 0:
                continue
            k = s % n  # the last k elements move to the front
            tail, head = out.split([n - k, k], a)
            out = head.cat(tail, dim=a)
        return out

    def unfold(self, dim: int, size: int, step: int) -> Tensor:
        """All windows of `size` along `dim`, every `step`: dim becomes the window count and a last dim of `size`
        is appended (torch.Tensor.unfold). A view."""
        t = self._m
        a = normalize_axis(dim, max(t.ndim, 1), "dim")
        if size < 0 or step <= 0:
            raise ShapeError(f"unfold needs size >= 0 and step > 0, got size={size}, step={step}")
        x = t if t.ndim else t.reshape(1)
        if size > x.shape[a]:
            raise ShapeError(f"unfold: size {size} is larger than dim {dim} of shape {t.shape}")
        order = [i for i in range(x.ndim) if i != a] + [a]
        moved = x.permute(order)
        if size == 0:  # (n // step + 1) empty windows
            empty = (*moved.shape[:-1], x.shape[a] // step + 1, 0)
            windows = _tensor_class().zeros(empty, dtype=t.dtype, device=t.device)
        else:
            windows = moved._window_last(size, step, 1)
        back = [0] * x.ndim
        for pos, src in enumerate(order):
            back[src] = pos
        out = windows.permute(*back, x.ndim)
        return out if t.ndim else out.reshape(out.shape[-2:])

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        """Repeat each element `repeats` times along `dim` (of the flattened tensor when dim is None)."""
        t = self._m
        if not isinstance(repeats, int) or repeats < 0:
            raise ValueError(f"repeat_interleave takes a non-negative int repeats, got {repeats!r}")
        x, a = (t.flatten(), 0) if dim is None else (t, normalize_axis(dim, t.ndim, "dim"))
        shape = x.shape
        x = x.reshape(*shape[:a + 1], 1, *shape[a + 1:]).expand(*shape[:a + 1], repeats, *shape[a + 1:])
        return x.reshape(*shape[:a], shape[a] * repeats, *shape[a + 1:])

    def meshgrid(self, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids from 0-d or 1-D tensors: `x.meshgrid(y)` or `Tensor.meshgrid(x, y)`."""
        if indexing not in ("ij", "xy"):
            raise ArgumentError(f"meshgrid indexing must be 'ij' or 'xy', got {indexing!r}")
        tensors = (self._m, *args)
        if any(t.ndim > 1 for t in tensors):
            raise ValueError(f"meshgrid takes 0-d or 1-D tensors, got shapes {[t.shape for t in tensors]}")
        if len(tensors) == 1:
            return tensors
        flat = [t.reshape(-1) for t in tensors]
        shape = [t.shape[0] for t in flat]
        if indexing == "xy":
            shape[0], shape[1] = shape[1], shape[0]
        out = []
        for i, t in enumerate(flat):
            axis = (1 - i if i < 2 else i) if indexing == "xy" else i
            view = [1] * len(flat)
            view[axis] = t.shape[0]
            out.append(t.reshape(view).expand(shape))
        return tuple(out)

    def rearrange(self, formula: str, **sizes: int) -> Tensor:
        """einops' rearrange: `"b (h w) c -> b h w c"` with `h=2`; `...` stands for any dims; `()` and `1` are
        size-1 dims. Reshape, permute, reshape: a view."""
        from glassgrad.tensor_linalg import rearrange
        return rearrange(self._m, formula, sizes)

    # ------------------------------------------------------------------ masks
    def _tri_mask(self, diagonal: int, upper: bool) -> Tensor:
        t = self._m
        if t.ndim < 2:
            raise ValueError(f"{'triu' if upper else 'tril'} needs at least 2 dims, got shape {t.shape}")
        tensor = _tensor_class()
        rows = tensor.arange(t.shape[-2], device=t.device).reshape(t.shape[-2], 1)
        cols = tensor.arange(t.shape[-1], device=t.device).reshape(1, t.shape[-1])
        return (cols - rows >= diagonal) if upper else (cols - rows <= diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        """Keep elements on and above the `diagonal`-th diagonal of the last two dims; zero the rest."""
        t = self._m
        return t._tri_mask(diagonal, True).where(t, t.zeros_like())

    def tril(self, diagonal: int = 0) -> Tensor:
        """Keep elements on and below the `diagonal`-th diagonal of the last two dims; zero the rest."""
        t = self._m
        return t._tri_mask(diagonal, False).where(t, t.zeros_like())

    def masked_fill(self, mask: Tensor, value: Tensor | Scalar) -> Tensor:
        """`value` where the bool `mask` is True, else self (mask and value broadcast; the dtype stays self's)."""
        t = self._m
        if not mask.dtype.is_bool:
            raise TypeError(f"masked_fill needs a bool mask, got {mask.dtype}")
        fill = value.cast(t.dtype) if isinstance(value, _tensor_class()) else value
        return mask.where(fill, t).cast(t.dtype)

    # ------------------------------------------------------------------ data-dependent shapes
    def masked_select(self, mask: Tensor, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
        """The elements of self where the bool `mask` (broadcast to self's shape) is True, as a 1-D tensor.
        Without `size` the mask is read back to learn how many (the result is realized to that shape); with
        `size` the output has that length, cut or padded with `fill_value`, and nothing is read back."""
        t = self._m
        if not mask.dtype.is_bool:
            raise TypeError(f"masked_select needs a bool mask, got {mask.dtype}")
        flat = t.flatten()
        keep = mask._broadcast_to(t.shape).flatten()
        tensor = _tensor_class()
        if size is None:
            hits = np.flatnonzero(keep.numpy()).astype(np.int32)
            return flat._take(tensor(hits, device=t.device)) if hits.size else \
                tensor.zeros(0, dtype=t.dtype, device=t.device)
        if size < 0:
            raise ValueError(f"masked_select size must be >= 0, got {size}")
        positions = _true_positions(keep, size)
        found = tensor.arange(size, device=t.device) < keep.sum()
        return found.where(flat._take(positions), fill_value).cast(t.dtype)

    def nonzero(self, size: int | None = None, fill_value: Scalar = 0) -> Tensor:
        """Indices of the non-zero elements, shape (count, ndim), int32, in row-major order. Without `size` the
        count is read back (realized); with `size` the rows are cut or padded with `fill_value`."""
        t = self._m
        tensor = _tensor_class()
        flat = (t != 0).flatten()
        if size is None:
            positions = tensor(np.flatnonzero(flat.numpy()).astype(np.int32), device=t.device)
            found: Tensor | None = None
        else:
            if size < 0:
                raise ValueError(f"nonzero size must be >= 0, got {size}")
            positions = _true_positions(flat, size)
            found = tensor.arange(size, device=t.device) < flat.sum()
        if t.ndim == 0:
            return positions.reshape(-1, 1).shrink((None, (0, 0)))
        strides = [prod(t.shape[d + 1:]) for d in range(t.ndim)]
        coords = tensor.stack(*[(positions // s) % n for s, n in zip(strides, t.shape)], dim=-1).cast(dtypes.int32)
        return coords if found is None else found.unsqueeze(-1).where(coords, fill_value).cast(dtypes.int32)

    def _take(self, positions: Tensor) -> Tensor:
        """self (1-D) at int `positions` (1-D): a one-hot gather, len(positions) * len(self) work; positions out
        of range give 0."""
        t = self._m
        tensor = _tensor_class()
        hit = positions.reshape(-1, 1) == tensor.arange(t.shape[0], device=t.device).reshape(1, -1)
        zero = False if t.dtype.is_bool else 0
        picked = hit.where(t.reshape(1, -1), zero)
        return picked.any(-1) if t.dtype.is_bool else picked.sum(-1, dtype=t.dtype)

    # ------------------------------------------------------------------ cumulative
    def _lower_mask(self, n: int) -> Tensor:
        """(n, n) bool, [i, j] = j <= i."""
        tensor = _tensor_class()
        rows = tensor.arange(n, device=self._m.device).reshape(n, 1)
        return tensor.arange(n, device=self._m.device).reshape(1, n) <= rows

    def _last(self, axis: int) -> tuple[Tensor, int]:
        t = self._m
        a = normalize_axis(axis, t.ndim)
        return (t.transpose(a, -1) if a != t.ndim - 1 else t), a

    def _back(self, a: int) -> Tensor:
        t = self._m
        return t.transpose(a, -1) if a != t.ndim - 1 else t

    @accepts_dim
    def cumprod(self, axis: int) -> Tensor:
        """Running product along `axis` (dtypes as `prod`)."""
        t = self._m
        if t.ndim == 0:
            normalize_axis(axis, 0)
            return t.cast(t._sum_dtype())
        x, a = t._last(axis)
        out = t._lower_mask(x.shape[-1]).where(x.unsqueeze(-2), 1).prod(-1)
        return out._back(a)

    @accepts_dim
    def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running max along `axis`, int32 index where it was found); with ties, the latest index (as PyTorch).
        The values are gathered at the indices, so the gradient goes to that one element."""
        t = self._m
        if t.ndim == 0:
            normalize_axis(axis, 0)
            return t, t.zeros_like(dtypes.int32)
        x, a = t._last(axis)
        n = x.shape[-1]
        if n == 0:
            return t, t.zeros_like(dtypes.int32)
        lower = t._lower_mask(n)
        values = lower.where(x.unsqueeze(-2), _lowest(t.dtype)).max(-1).detach()
        tensor = _tensor_class()
        match = lower & (x.unsqueeze(-2) == values.unsqueeze(-1))
        if t.dtype.is_float:  # a NaN is the running max from where it appears (max propagates it)
            match = match | (lower & x.unsqueeze(-2).isnan() & values.unsqueeze(-1).isnan())
        idx = ((tensor.arange(n, device=t.device) + 1) * match).max(-1) - 1
        idx = idx.cast(dtypes.int32)
        return x.gather(-1, idx)._back(a), idx._back(a)

    def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running min along `axis`, int32 index where it was found); with ties, the latest index (as PyTorch)."""
        t = self._m
        if t.dtype.is_float:
            values, idx = (-t).cummax(axis)
            return -values, idx
        values, idx = t.bitwise_not().cummax(axis)  # ~x reverses the order of ints without overflow
        return values.bitwise_not(), idx

    @accepts_dim
    def logcumsumexp(self, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along `axis`, shifted by the running max so nothing overflows."""
        t = self._m._float()
        if t.ndim == 0:
            normalize_axis(axis, 0)
            return t
        x, a = t._last(axis)
        n = x.shape[-1]
        if n == 0:
            return t
        shift = x.cummax(-1)[0].detach()
        shift = shift.isinf().where(0.0, shift)
        terms = t._lower_mask(n).where(x.unsqueeze(-2) - shift.unsqueeze(-1), -math.inf)
        return (terms.exp().sum(-1).log() + shift)._back(a)

    # ------------------------------------------------------------------ reductions
    @accepts_dim
    def var_mean(self, axis: AxisArg = None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        t = self._m
        return t.var(axis, keepdim, correction), t.mean(axis, keepdim)

    @accepts_dim
    def std_mean(self, axis: AxisArg = None, keepdim: bool = False, correction: int = 1) -> tuple[Tensor, Tensor]:
        t = self._m
        return t.std(axis, keepdim, correction), t.mean(axis, keepdim)

    def softmin(self, axis: int = -1, dtype: DType | str | None = None) -> Tensor:
        t = self._m
        x = t.cast(to_dtype(dtype)) if dtype is not None else t
        return (-x._float()).softmax(axis)

    def normalize(self, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
        """self / max(||self||_p along dim, eps) (torch.nn.functional.normalize). A zero vector stays zero, with
        gradient 1/eps (as PyTorch), not NaN."""
        t = self._m._float()
        norm = t.norm(p, dim, keepdim=True)
        return t / (norm < eps).where(eps, norm)

    # ------------------------------------------------------------------ scatter, unpooling, losses
    def scatter_reduce(self, dim: int, index: Tensor, src: Tensor, reduce: str, include_self: bool = True) -> Tensor:
        """torch.Tensor.scatter_reduce: for dim=0, self[index[i][j]][j] combines with src[i][j] by `reduce`
        ('sum', 'prod', 'mean', 'amax', 'amin'); include_self=False leaves self's value out where anything lands."""
        t = self._m
        if reduce not in SCATTER_REDUCTIONS:
            raise ArgumentError(f"scatter_reduce: reduce must be one of {SCATTER_REDUCTIONS}, got {reduce!r}")
        if t.dtype != src.dtype:
            raise DTypeError(f"scatter_reduce: self is {t.dtype} but src is {src.dtype}; cast one of them")
        values, hit = t._scatter_operands(dim, index, src)
        landed = hit.any(-1)
        # ints sum and multiply in their own dtype (wrapping, as PyTorch's); floats as `sum`/`prod` do, float16 and
        # bfloat16 in float32 (in their own dtype, 1000 bfloat16 adds into one place were 13% off PyTorch's result)
        acc = None if t.dtype.is_float else t.dtype

        def base(identity: Scalar) -> Tensor:
            return t if include_self else landed.where(identity, t).cast(t.dtype)

        if reduce == "sum":
            return hit.where(values, 0).sum(-1, dtype=acc) + base(0)
        if reduce == "prod":
            return hit.where(values, 1).prod(-1, dtype=acc) * base(1)
        if reduce == "amax":
            return hit.where(values, _lowest(t.dtype)).max(-1).maximum(base(_lowest(t.dtype)))
        if reduce == "amin":
            return hit.where(values, _highest(t.dtype)).min(-1).minimum(base(_highest(t.dtype)))
        count = hit.sum(-1) + (1 if include_self else landed.logical_not().cast(dtypes.int32))
        total = hit.where(values, 0).sum(-1, dtype=acc) + base(0)
        mean = total / count
        return mean if t.dtype.is_float else total.div(count, rounding_mode="floor").cast(t.dtype)

    def _scatter_operands(self, dim: int, index: Tensor, src: Tensor) -> tuple[Tensor, Tensor]:
        """(src, hit), both self.shape + (k,) where k = index.shape[dim]: hit[..., c, ..., i] says that
        index[..., i, ...] == c (c at position dim); src[..., c, ..., i] = src[..., i, ...]."""
        t = self._m
        d = normalize_axis(dim, t.ndim, "dim")
        if index.ndim != t.ndim or src.ndim != t.ndim or index.dtype.is_float:
            raise ValueError(f"scatter: index must be an int tensor and self, index and src need the same number of "
                             f"dims, got self {t.shape}, index {index.dtype} {index.shape}, src {src.shape}")
        if any((i != d and s < n) or m < n for i, (s, n, m) in enumerate(zip(t.shape, index.shape, src.shape))):
            raise ValueError(f"scatter: index {index.shape} must be no larger than src {src.shape}, and than self "
                             f"{t.shape} outside dim {d}")
        tensor = _tensor_class()
        values = src.shrink(tuple((0, n) for n in index.shape))
        size = t.shape[d]
        hit = index.unsqueeze(-1) == tensor.arange(size, device=t.device)  # index.shape + (size,)
        values = values.unsqueeze(-1).expand(*values.shape, size)
        values, hit = values.transpose(-1, d), hit.transpose(-1, d)  # size at dim d, index.shape[d] last
        pads = tuple((0, 0) if i == d else (0, s - n) for i, (s, n) in enumerate(zip(t.shape, index.shape)))
        return values.pad((*pads, (0, 0))), hit.pad((*pads, (0, 0)), value=False)

    def max_unpool2d(self, indices: Tensor, kernel_size: int | Sequence[int] = (2, 2),
                     stride: int | Sequence[int] | None = None, dilation: int | Sequence[int] = 1,
                     padding: int | Sequence[int] = 0, output_size: Sequence[int] | None = None) -> Tensor:
        """The partial inverse of max_pool2d: each value goes to the flat position `indices` names in its (N, C)
        plane, zeros elsewhere (torch's max_unpool; any number of spatial dims, as tinygrad). A position named by
        several inputs (overlapping windows) gets the first of them, and only that one gets its gradient (PyTorch
        gives the gradient to each)."""
        from glassgrad.tensor_nn import _conv_padding, _tuple
        t = self._m
        if t.ndim < 3 or indices.shape != t.shape or indices.dtype.is_float:
            raise ValueError(f"max_unpool2d: input (N, C, *spatial) {t.shape} needs int indices of the same shape, "
                             f"got {indices.dtype} {indices.shape}")
        batch, channels, *spatial = t.shape
        n = len(spatial)
        if output_size is None:
            kernel = _tuple(kernel_size, n, "kernel_size")
            strides = kernel if stride is None else _tuple(stride, n, "stride")
            dils = _tuple(dilation, n, "dilation")
            pads = _conv_padding(padding, n)
            out = tuple((i - 1) * s - (b + a) + d * (k - 1) + 1
                        for i, k, d, s, (b, a) in zip(spatial, kernel, dils, strides, pads))
        else:
            out = tuple(output_size)[-n:]
        tensor = _tensor_class()
        plane = prod(out)
        hit = indices.reshape(batch, channels, -1, 1) == tensor.arange(plane, device=t.device)  # (N, C, L, P)
        # overlapping windows can name one position several times (with equal values): the first one is placed
        count = hit.shape[2]
        source = tensor.arange(count, device=t.device).reshape(count, 1)
        first = hit.where(source, count).min(2, keepdim=True)
        chosen = hit & (source == first)
        placed = chosen.where(t.reshape(batch, channels, -1, 1), 0).sum(2, dtype=t.dtype)
        return placed.reshape(batch, channels, *out)

    def nll_loss(self, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
                 reduction: str = "mean") -> Tensor:
        """Negative log likelihood: self holds log-probabilities (N, C, ...), Y class indices (N, ...); `weight`
        (C,) weighs each class; targets equal to ignore_index count for nothing (PyTorch's nll_loss)."""
        t = self._m
        if t.ndim < 2 or Y.dtype.is_float or Y.shape != (t.shape[0], *t.shape[2:]):
            raise ValueError(f"nll_loss: input (N, C, ...) {t.shape} needs int targets of shape "
                             f"{(t.shape[0], *t.shape[2:]) if t.ndim >= 2 else '(N, ...)'}, got {Y.dtype} {Y.shape}")
        tensor = _tensor_class()
        target = Y if ignore_index is None else (Y == ignore_index).where(0, Y)
        if weight is None:
            w = tensor.ones(Y.shape, dtype=t.dtype, device=t.device)
        else:
            w = weight._take(target.flatten()).reshape(Y.shape).cast(t.dtype)
        if ignore_index is not None:
            w = (Y != ignore_index).where(w, 0)
        picked = t.gather(1, target.unsqueeze(1)).squeeze(1)
        loss = -picked * w
        if reduction == "mean":
            return loss.sum() / w.sum()
        if reduction == "sum":
            return loss.sum()
        if reduction == "none":
            return loss
        raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _true_positions(mask: Tensor, size: int) -> Tensor:
    """For a 1-D bool mask: int32 (size,), entry k = the position of the (k+1)-th True (len(mask) past the last).
    Position of the (k+1)-th True = how many running counts are <= k: one (size, n) comparison and sum."""
    tensor = _tensor_class()
    running = mask.cast(dtypes.int32).cumsum(0)
    k = tensor.arange(size, device=mask.device).reshape(-1, 1)
    return (running.reshape(1, -1) <= k).sum(-1).cast(dtypes.int32)
