"""The rest of tinygrad's Tensor API: hard activations, casts by name, `*_like` creation, weight initialisers,
`randperm`, `multinomial`, `random_bits`, and `newton_schulz` (Muon's orthogonalisation).

In: tensors (and shapes, for the static initialisers). Out: lazy tensors built from the public Tensor API, with
tinygrad's names, signatures and semantics (PyTorch's where PyTorch has the op).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from glassgrad.dtype import DType, dtypes, to_dtype
from glassgrad.helpers import prod
from glassgrad.multi import make_multi
from glassgrad.tensor_math import computed_in_float32
from glassgrad.uop.ops import Ops

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor


def _tensor_class() -> type[Tensor]:
    from glassgrad.tensor import Tensor
    return Tensor


def _dims(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape of a creation call (`f(2, 3)` or `f((2, 3))`); a negative size is a ValueError, as for `ones`."""
    dims = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed, got shape {dims}")
    return dims


class ExtraOps:
    """Mixed into Tensor."""
    __slots__ = ()

    @property
    def _x(self) -> Tensor:
        return cast("Tensor", self)

    # ------------------------------------------------------------------ activations
    def hardtanh(self, min_val: float = -1, max_val: float = 1) -> Tensor:
        """clip(x, min_val, max_val), with PyTorch's gradient: 0 at both ends, as for relu6 (clip passes it there)."""
        x = self._x
        if not x.dtype.is_float:
            return x.clip(min_val, max_val)
        return (x <= min_val).where(min_val, (x >= max_val).where(max_val, x))

    def hardsigmoid(self, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
        """min(max(alpha*x + beta, 0), 1) (PyTorch's with the defaults)."""
        y = self._x * alpha + beta  # (not relu(y) - relu(y - 1), tinygrad's: inf - inf at x = inf, and y - 1 == y
        return (y <= 0).where(0.0, (y >= 1).where(1.0, y))  # for a big x; gradient 0 at both ends, as PyTorch's)

    def hardswish(self) -> Tensor:
        """x * (relu6(x + 3) / 6) (the factor at most 1: x * 6 overflowed float16 for x near its max)."""
        return self._x * ((self._x + 3).relu6() * (1 / 6))

    # ------------------------------------------------------------------ dtypes and creation
    def is_floating_point(self) -> bool:
        return self._x.dtype.is_float

    def short(self) -> Tensor:
        return self._x.cast(dtypes.int16)

    def bfloat16(self) -> Tensor:
        return self._x.cast(dtypes.bfloat16)

    def empty_like(self, dtype: DType | str | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        """An uninitialised tensor of this one's shape (and dtype, device); on several devices, laid out as it is
        (split along the same axis)."""
        x = self._x
        if device is None and x.uop.op is Ops.MULTI:
            parts = [_tensor_class().empty(p.shape, dtype=dtype or x.dtype, device=p.device).uop for p in x.uop.src]
            out = _tensor_class()(make_multi(parts, x.uop.arg))
            return out.requires_grad_(True) if requires_grad else out
        return _tensor_class().empty(x.shape, dtype=dtype or x.dtype, device=device or x.device,
                                     requires_grad=requires_grad)

    def const_like(self, b: Any, dtype: DType | str | None = None) -> Tensor:
        """A tensor of this one's shape and device filled with `b`, of this one's dtype or `dtype` (tinygrad's)."""
        return _tensor_class().full(self._x.shape, b, dtype=self._x.dtype if dtype is None else dtype,
                                    device=self._x.device)

    # ------------------------------------------------------------------ initialisers (tinygrad's static methods)
    @staticmethod
    def kaiming_uniform(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """U(-b, b), b = sqrt(3) * sqrt(2 / (1 + a^2)) / sqrt(fan_in), fan_in = prod(shape[1:])."""
        dims = _dims(shape)
        bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(dims[1:]))
        return _tensor_class().uniform(*dims, low=-bound, high=bound, **kwargs)

    @staticmethod
    def kaiming_normal(*shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
        """N(0, std^2), std = sqrt(2 / (1 + a^2)) / sqrt(fan_in)."""
        dims = _dims(shape)
        std = math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(dims[1:]))
        return _tensor_class().normal(*dims, mean=0.0, std=std, **kwargs)

    @staticmethod
    def glorot_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        """U(-b, b), b = sqrt(6 / (shape[0] + prod(shape[1:])))."""
        dims = _dims(shape)
        bound = math.sqrt(6.0 / (dims[0] + prod(dims[1:])))
        return _tensor_class().uniform(*dims, low=-bound, high=bound, **kwargs)

    @staticmethod
    def scaled_uniform(*shape: Any, **kwargs: Any) -> Tensor:
        """U(-1, 1) / sqrt(numel)."""
        dims = _dims(shape)
        scale = prod(dims) ** -0.5
        return _tensor_class().uniform(*dims, low=-scale, high=scale, **kwargs)

    # ------------------------------------------------------------------ random
    @staticmethod
    def random_bits(*shape: Any, device: str | None = None) -> Tensor:
        """Random uint32 values from the device generator (see `Tensor.rand`)."""
        from glassgrad.device import Device
        from glassgrad.tensor import _RNG
        dims = _dims(shape)
        return _tensor_class()(_RNG.bits(prod(dims), Device.canonicalize(device or Device.DEFAULT)).reshape(dims).uop)

    @staticmethod
    def randperm(n: int, device: str | None = None, dtype: DType | str = dtypes.int32) -> Tensor:
        """A random permutation of 0..n-1 (the order of n random numbers)."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"randperm needs an int n >= 0, got {n!r}")
        return _tensor_class().rand(n, device=device).argsort().cast(to_dtype(dtype))

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Samples indices from the (unnormalised, non-negative) weights of a 1-d or 2-d tensor, by inverting the
        cumulative distribution. Without replacement only one sample per row is supported (as in tinygrad)."""
        w = self._x
        if w.ndim not in (1, 2) or num_samples < 1:
            raise ValueError(f"multinomial needs 1-d or 2-d weights and num_samples >= 1, got {w.shape}, "
                             f"{num_samples}")
        if not replacement and num_samples > 1:
            raise NotImplementedError("multinomial without replacement draws one sample per row (as in tinygrad)")
        rows = w.reshape(1, -1) if w.ndim == 1 else w
        cdf = rows.float().cumsum(1)
        cdf = cdf / cdf[:, -1:]
        u = _tensor_class().rand(num_samples, rows.shape[0], 1, device=w.device)
        picks = (u >= cdf.unsqueeze(0)).sum(2).permute(1, 0).cast(dtypes.int32)
        picks = picks.minimum(rows.shape[1] - 1)
        return picks.reshape(num_samples) if w.ndim == 1 else picks

    def newton_schulz(self, steps: int = 5, params: Sequence[float] = (3.4445, -4.775, 2.0315),
                      eps: float = 1e-7) -> Tensor:
        """Muon's orthogonalisation of the last two dims (a batch of matrices, as tinygrad): each matrix X is
        divided by its Frobenius norm, then `steps` times X <- p0*X + (p1*A + p2*A^2 + ...) @ X with A = X @ X^T,
        the odd polynomial of `params` (Muon's quintic by default). A matrix with more rows than columns is iterated
        transposed, so A is the smaller Gram matrix."""
        x = self._x
        if x.ndim < 2:
            raise ValueError(f"newton_schulz needs a matrix (or a batch of them, 2 or more dims), got {x.shape}")
        if not params:
            raise ValueError("newton_schulz needs at least one polynomial coefficient in params")
        tall = x.shape[-2] > x.shape[-1]
        if tall:
            x = x.transpose(-2, -1)
        x = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + eps)
        for _ in range(steps):
            x = _odd_polynomial_step(x, tuple(params))
        return x.transpose(-2, -1) if tall else x


class InPlaceOps:
    """PyTorch's in-place methods (`x.add_(y)`, `w.normal_(0, 0.02)`, `b.zero_()`, ...), mixed into Tensor: each is
    `x.assign(op(x))`, so it writes x's own buffer (through a view: the part of its base it shows), returns x, and
    every tensor built from x's old value keeps that value (see `Tensor.assign`). tinygrad has only `assign`."""
    __slots__ = ()

    @property
    def _t(self) -> Tensor:
        return cast("Tensor", self)

    def _write(self, value: Tensor | Any) -> Tensor:
        t = self._t
        if not isinstance(value, _tensor_class()):
            value = _tensor_class()(value, device=t.device, dtype=t.dtype)
        if value.shape != t.shape:
            value = value.expand(t.shape)  # (a broadcast value; a bigger one raises there, as in PyTorch)
        return t.assign(value.cast(t.dtype))

    def add_(self, other: Tensor | Any, alpha: float = 1) -> Tensor:
        return self._write(self._t + (other if alpha == 1 else other * alpha))

    def sub_(self, other: Tensor | Any, alpha: float = 1) -> Tensor:
        return self._write(self._t - (other if alpha == 1 else other * alpha))

    def mul_(self, other: Tensor | Any) -> Tensor: return self._write(self._t * other)  # noqa: E704
    def div_(self, other: Tensor | Any) -> Tensor: return self._write(self._t / other)  # noqa: E704
    def pow_(self, other: Tensor | Any) -> Tensor: return self._write(self._t ** other)  # noqa: E704
    def neg_(self) -> Tensor: return self._write(-self._t)  # noqa: E704
    def abs_(self) -> Tensor: return self._write(self._t.abs())  # noqa: E704
    def exp_(self) -> Tensor: return self._write(self._t.exp())  # noqa: E704
    def log_(self) -> Tensor: return self._write(self._t.log())  # noqa: E704
    def sqrt_(self) -> Tensor: return self._write(self._t.sqrt())  # noqa: E704
    def relu_(self) -> Tensor: return self._write(self._t.relu())  # noqa: E704
    def sigmoid_(self) -> Tensor: return self._write(self._t.sigmoid())  # noqa: E704
    def tanh_(self) -> Tensor: return self._write(self._t.tanh())  # noqa: E704
    def floor_(self) -> Tensor: return self._write(self._t.floor())  # noqa: E704
    def ceil_(self) -> Tensor: return self._write(self._t.ceil())  # noqa: E704
    def zero_(self) -> Tensor: return self._write(self._t.zeros_like())  # noqa: E704
    def fill_(self, value: Any) -> Tensor: return self._write(self._t.full_like(value))  # noqa: E704

    def clamp_(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002 (PyTorch's names)
        return self._write(self._t.clip(min, max))
    clip_ = clamp_

    def masked_fill_(self, mask: Tensor, value: Any) -> Tensor:
        return self._write(self._t.masked_fill(mask, value))

    def copy_(self, src: Tensor | Any) -> Tensor:
        """self's values become src's (broadcast, cast to self's dtype, moved to self's device)."""
        if isinstance(src, _tensor_class()) and src.device != self._t.device:
            src = src.to(self._t.device)
        return self._write(src)

    def uniform_(self, a: float = 0.0, b: float = 1.0) -> Tensor:
        t = self._t
        return self._write(_tensor_class().uniform(*t.shape, low=a, high=b, dtype=t.dtype, device=t.device))

    def normal_(self, mean: float = 0.0, std: float = 1.0) -> Tensor:
        t = self._t
        return self._write(_tensor_class().normal(*t.shape, mean=mean, std=std, dtype=t.dtype, device=t.device))


class TorchOps:
    """PyTorch's names that tinygrad lacks, mixed into Tensor, each built from tinygrad's ops (so they fuse and
    differentiate as those do)."""
    __slots__ = ()

    @property
    def _s(self) -> Tensor:
        return cast("Tensor", self)

    def amax(self, dim: Any = None, keepdim: bool = False) -> Tensor: return self._s.max(dim, keepdim)  # noqa: E704
    def amin(self, dim: Any = None, keepdim: bool = False) -> Tensor: return self._s.min(dim, keepdim)  # noqa: E704

    @computed_in_float32
    def log1p(self) -> Tensor:
        """log(1 + x), accurate for small x (Kahan: log(u) * (x / (u - 1)) with u = 1 + x rounded; x where u is 1,
        and where u is inf, which only x = inf gives). x / (u - 1) is near 1: log(u) * x overflowed for a big x."""
        x = self._s.float() if not self._s.dtype.is_float else self._s
        u = x + 1
        exact = (u == 1) | (u == math.inf)
        return exact.where(x, u.log() * (x / exact.where(1.0, u - 1)))

    def norm(self, p: float = 2.0, dim: Any = None, keepdim: bool = False) -> Tensor:
        """The p-norm over `dim` (all elements by default): (sum |x|^p)^(1/p); p = inf / -inf: the largest / smallest
        |x|; p = 0: the count of nonzeros. As PyTorch's, the gradient at a zero vector is 0 (the root's derivative
        there is infinite: taken as is, 0 * inf made it NaN, which a norm penalty on a zero-initialised weight spread
        to every parameter). A negative p gives PyTorch's values, but a NaN gradient where an entry is 0."""
        a = self._s.float().abs() if not self._s.dtype.is_float else self._s.abs()
        if p in (math.inf, -math.inf):
            return a.max(dim, keepdim) if p > 0 else a.min(dim, keepdim)
        if p == 0:
            return (a != 0).sum(dim, keepdim).cast(a.dtype)
        if p == 1:
            return a.sum(dim, keepdim)
        if p == 2:
            powered = a * a
        elif 0 < p < 1:  # |x|^p has an infinite derivative at 0 too: PyTorch's is 0 there
            nonzero = a > 0
            powered = nonzero.where(nonzero.where(a, 1.0).pow(p), 0.0)
        else:
            powered = a.pow(p)
        total = powered.sum(dim, keepdim)
        positive = total > 0
        safe = positive.where(total, 1.0)
        return positive.where(safe.sqrt() if p == 2 else safe.pow(1.0 / p), 0.0)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        """The slices along `dim`, that dim removed."""
        t = self._s
        axis = dim + t.ndim if dim < 0 else dim
        return tuple(t.shrink(tuple((i, i + 1) if a == axis else None for a in range(t.ndim))).squeeze(axis)
                     for i in range(t.shape[axis]))

    def index_select(self, dim: int, index: Tensor) -> Tensor:
        """The entries of `index` (1-d ints) along `dim`, in its order."""
        t = self._s
        if index.ndim != 1 or index.dtype.is_float:
            raise ValueError(f"index_select needs a 1-d integer index, got shape {index.shape} of {index.dtype}")
        axis = dim + t.ndim if dim < 0 else dim
        return t[(slice(None),) * axis + (index,)]

    def nan_to_num(self, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
        """NaN -> nan, +inf -> posinf (default: the dtype's largest finite value), -inf -> neginf (its lowest)."""
        t = self._s
        if not t.dtype.is_float:
            return t
        exponent, mantissa = dtypes.finfo(t.dtype)  # (bfloat16's largest is 3.39e38: float32's rounds to inf)
        big = (2 - 2.0 ** -mantissa) * 2.0 ** (2 ** (exponent - 1) - 1)
        out = (t != t).where(nan, t)
        out = (out == math.inf).where(big if posinf is None else posinf, out)
        return (out == -math.inf).where(-big if neginf is None else neginf, out)

    def outer(self, other: Tensor) -> Tensor: return self._s.reshape(-1, 1) * other.reshape(1, -1)  # noqa: E704
    def mm(self, other: Tensor) -> Tensor: return self._s.matmul(other)  # noqa: E704
    def bmm(self, other: Tensor) -> Tensor: return self._s.matmul(other)  # noqa: E704
    def view_as(self, other: Tensor) -> Tensor: return self._s.reshape(other.shape)  # noqa: E704
    def reshape_as(self, other: Tensor) -> Tensor: return self._s.reshape(other.shape)  # noqa: E704
    def expand_as(self, other: Tensor) -> Tensor: return self._s.expand(other.shape)  # noqa: E704
    def swapaxes(self, a: int, b: int) -> Tensor: return self._s.transpose(a, b)  # noqa: E704

    def narrow(self, dim: int, start: int, length: int) -> Tensor:
        t = self._s
        axis = dim + t.ndim if dim < 0 else dim
        return t.shrink(tuple((start, start + length) if a == axis else None for a in range(t.ndim)))

    def movedim(self, source: int, destination: int) -> Tensor:
        t = self._s
        order = [a for a in range(t.ndim) if a != source % t.ndim]
        order.insert(destination % t.ndim, source % t.ndim)
        return t.permute(*order)
    moveaxis = movedim

    def count_nonzero(self, dim: Any = None) -> Tensor: return (self._s != 0).sum(dim)  # noqa: E704


def _odd_polynomial_step(x: Tensor, params: tuple[float, ...]) -> Tensor:
    """p0*x + (p1*A + p2*A^2 + ...) @ x with A = x @ x^T (over the last two dims)."""
    if len(params) == 1:
        return params[0] * x
    gram = x @ x.transpose(-2, -1)
    power, poly = gram, params[1] * gram
    for p in params[2:]:
        power = power @ gram
        poly = poly + p * power
    return params[0] * x + poly @ x
