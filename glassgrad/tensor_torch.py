"""More of PyTorch's Tensor names, mixed into Tensor (`TorchNames`): expm1, atan2, hypot, det/slogdet/logdet, the
`new_*` constructors, `cuda()`/`cpu()`/`type(dtype)`, mv/kron/cross/baddbmm/dist/scatter_add, and the comparison and
math aliases PyTorch programs call as methods (`x.gt(0)`, `x.absolute()`).

In: tensors (and Python scalars where PyTorch takes them). Out: lazy tensors built only from the public Tensor API,
so they fuse and differentiate as the ops they are made of; values and dtypes follow PyTorch's.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.errors import ArgumentError, ShapeError
from glassgrad.tensor_math import _horner, _small, computed_in_float32

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor

Scalar = float | int | bool


# sin(y)/y = sum (-1)^n y^(2n) / (2n+1)!, highest power first (9 terms: float64 rounding for |y| < 1)
_SINC_SERIES = [(-1) ** n / math.factorial(2 * n + 1) for n in reversed(range(9))]


def _tensor_class() -> type[Tensor]:
    from glassgrad.tensor import Tensor
    return Tensor


def _floated(t: Tensor) -> Tensor:
    """`t` as a float tensor (ints and bools become the default float, as PyTorch's float math does)."""
    return t if t.dtype.is_float else t.cast(dtypes.default_float)


class TorchNames:
    """PyTorch names, as methods of Tensor."""
    __slots__ = ()

    @property
    def _s(self) -> Tensor:
        return cast("Tensor", self)

    # ------------------------------------------------------------------ math
    def expm1(self) -> Tensor:
        """exp(x) - 1, accurate for small x: Kahan's (u - 1) * x / log(u), u = exp(x) rounded, for |x| < 0.5 (fed a
        clamped x, so the other branch's infinities never reach the gradient); exp(x) - 1 elsewhere."""
        x = _floated(self._s)
        if x.dtype in (dtypes.float16, dtypes.bfloat16):  # (computed in float32, as PyTorch does)
            return x.float().expm1().cast(x.dtype)
        small = x.abs() < 0.5
        xs = small.where(x, 0.0)
        u = xs.exp()
        one = u == 1
        kahan = one.where(xs, (u - 1) * xs / one.where(1.0, u.log()))
        return small.where(kahan, x.exp() - 1)

    def atan2(self, other: Tensor | Scalar) -> Tensor:
        """The angle of (x=other, y=self) in [-pi, pi], as torch.atan2(self, other). The arctangent is taken of the
        smaller over the larger magnitude (no overflow, a well-defined gradient wherever the point is not 0);
        the sign of a zero y picks the side at x < 0, as in C. Both infinite: the diagonals (pi/4, 3pi/4, ...), as
        C, numpy and PyTorch give (inf / inf would be NaN)."""
        y, x = self._s._broadcasted(other)
        y, x = _floated(y), _floated(x)
        swap = y.abs() > x.abs()
        den = swap.where(y, x)
        num, origin = swap.where(x, y), den == 0  # (den is 0 only where both are: the value there is +-0 and, as
        ratio = origin.where(num * 0.0, num / origin.where(1.0, den))  # PyTorch's, so is the gradient)
        both_inf = (y.abs() == math.inf) & (x.abs() == math.inf)
        ratio = both_inf.where(y.sign() * x.sign(), ratio)
        r = ratio.atan()
        left = x.signbit().where(r + y.full_like(math.pi).copysign(y), r)  # (x = -0.0 too, as C; r keeps -0.0)
        return swap.where(y.full_like(math.pi / 2).copysign(y) - r, left)

    def arctan2(self, other: Tensor | Scalar) -> Tensor: return self.atan2(other)  # noqa: E704

    def hypot(self, other: Tensor | Scalar) -> Tensor:
        """sqrt(self^2 + other^2), scaled by the larger magnitude so float16 does not overflow at 256."""
        a, b = self._s._broadcasted(other)
        a, b = _floated(a).abs(), _floated(b).abs()
        big = a.maximum(b)
        scale = (big == 0).where(1.0, big)
        inf = (a == math.inf) | (b == math.inf)
        return inf.where(math.inf, big * ((a / scale).square() + (b / scale).square()).sqrt())

    def xlogy(self, other: Tensor | Scalar) -> Tensor:
        """self * log(other), 0 where self is 0 (NaN where other is NaN), as PyTorch's. The gradient in self is
        log(other) at self = 0 too (PyTorch's; 0 where other <= 0): picking 0 with `where` there had made it 0, so
        an entropy or KL term taught nothing to a probability that was exactly 0."""
        x, y = self._s._broadcasted(other)
        x, y = _floated(x), _floated(y)
        unsafe = (x == 0) & ((y <= 0) | (y == math.inf))  # log(y) infinite or NaN where the value must be 0
        return x * unsafe.where(1.0, y).log()

    def frac(self) -> Tensor: return self._s - self._s.trunc()  # noqa: E704
    def deg2rad(self) -> Tensor: return _floated(self._s) * (math.pi / 180)  # noqa: E704
    def rad2deg(self) -> Tensor: return _floated(self._s) * (180 / math.pi)  # noqa: E704
    def erfc(self) -> Tensor: return 1 - _floated(self._s).erf()  # noqa: E704

    def logit(self, eps: float | None = None) -> Tensor:
        """log(p / (1 - p)), p clamped to [eps, 1 - eps] when eps is given."""
        p = _floated(self._s)
        if eps is not None:
            p = p.clamp(eps, 1 - eps)
        return (p / (1 - p)).log()

    @computed_in_float32
    def sinc(self) -> Tensor:
        """sin(pi x) / (pi x) (float16 in float32: pi x overflowed near its max). Below |pi x| = 1 its Taylor series:
        the quotient's gradient, (cos(px) px - sin(px)) / px^2, cancels there (it was -7e13 at x = 1e-20, 2x off at
        1e-4; PyTorch's float32 is 3x off at 1e-4)."""
        x = _floated(self._s)
        near, small = _small(x * math.pi, 1.0)
        px = near.where(1.0, x) * math.pi
        return near.where(_horner(small * small, _SINC_SERIES), px.sin() / px)

    def addcmul(self, tensor1: Tensor, tensor2: Tensor, value: Scalar = 1) -> Tensor:
        return self._s + value * tensor1 * tensor2

    def addcdiv(self, tensor1: Tensor, tensor2: Tensor, value: Scalar = 1) -> Tensor:
        return self._s + value * tensor1 / tensor2

    def addmm(self, mat1: Tensor, mat2: Tensor, beta: Scalar = 1, alpha: Scalar = 1) -> Tensor:
        return beta * self._s + alpha * (mat1 @ mat2)

    def fmax(self, other: Tensor | Scalar) -> Tensor:
        """The larger of the two, ignoring a NaN (NaN only where both are)."""
        a, b = self._s._broadcasted(other)
        return (a != a).where(b, (b != b).where(a, a.maximum(b)))

    def fmin(self, other: Tensor | Scalar) -> Tensor:
        a, b = self._s._broadcasted(other)
        return (a != a).where(b, (b != b).where(a, a.minimum(b)))

    def signbit(self) -> Tensor:
        """True where the sign bit is set (-0.0 and NaNs made negative included, as C's signbit)."""
        t = self._s
        if not t.dtype.is_float:
            return t < 0
        return (t < 0) | ((t == 0) & (t.reciprocal() < 0))

    # ------------------------------------------------------------------ aliases PyTorch programs call as methods
    def lt(self, other: Tensor | Scalar) -> Tensor: return self._s < other  # noqa: E704
    def le(self, other: Tensor | Scalar) -> Tensor: return self._s <= other  # noqa: E704
    def gt(self, other: Tensor | Scalar) -> Tensor: return self._s > other  # noqa: E704
    def ge(self, other: Tensor | Scalar) -> Tensor: return self._s >= other  # noqa: E704
    less, less_equal, greater, greater_equal = lt, le, gt, ge

    def absolute(self) -> Tensor: return self._s.abs()  # noqa: E704
    def negative(self) -> Tensor: return -self._s  # noqa: E704
    def positive(self) -> Tensor: return self._s  # noqa: E704
    def sgn(self) -> Tensor: return self._s.sign()  # noqa: E704
    def arcsin(self) -> Tensor: return self._s.asin()  # noqa: E704
    def arccos(self) -> Tensor: return self._s.acos()  # noqa: E704
    def arctan(self) -> Tensor: return self._s.atan()  # noqa: E704
    def true_divide(self, other: Tensor | Scalar) -> Tensor: return self._s / other  # noqa: E704
    def clamp_min(self, min: Tensor | Scalar) -> Tensor: return self._s.maximum(min)  # noqa: E704, A002
    def clamp_max(self, max: Tensor | Scalar) -> Tensor: return self._s.minimum(max)  # noqa: E704, A002
    def logical_xor(self, other: Tensor | Scalar) -> Tensor: return self._s.bool() != other  # noqa: E704
    def swapdims(self, a: int, b: int) -> Tensor: return self._s.transpose(a, b)  # noqa: E704
    def ravel(self) -> Tensor: return self._s.reshape(-1)  # noqa: E704
    def fliplr(self) -> Tensor: return self._s.flip(1)  # noqa: E704
    def flipud(self) -> Tensor: return self._s.flip(0)  # noqa: E704
    def nelement(self) -> int: return self._s.numel()  # noqa: E704
    def ndimension(self) -> int: return self._s.ndim  # noqa: E704
    def broadcast_to(self, *shape: Any) -> Tensor: return self._s.expand(*shape)  # noqa: E704
    def cpu(self) -> Tensor: return self._s.to("CPU")  # noqa: E704

    def cuda(self, device: int | str | None = None) -> Tensor:
        """A copy on the GPU (`x.cuda()`, `x.cuda(1)`, `x.cuda("cuda:1")`), PyTorch's spelling of `to("CUDA:n")`."""
        if device is None or isinstance(device, int) and not isinstance(device, bool):
            return self._s.to("CUDA" if not device else f"CUDA:{device}")
        if isinstance(device, str) and device.upper().startswith("CUDA"):
            return self._s.to(device)
        raise ArgumentError(f"cuda(): device must be None, a GPU index or 'cuda:n', got {device!r}")

    def type(self, dtype: DType | str | None = None) -> Tensor | str:
        """PyTorch's `t.type(dtype)`: `t` cast to `dtype`; without one, the dtype's name ('dtypes.float32')."""
        return str(self._s.dtype) if dtype is None else self._s.cast(dtype)

    def mv(self, vec: Tensor) -> Tensor:
        """Matrix (n, m) times vector (m,) -> (n,)."""
        if self._s.ndim != 2 or vec.ndim != 1:
            raise ShapeError(f"mv: needs a matrix and a vector, got shapes {self._s.shape} and {vec.shape}")
        return self._s.matmul(vec)

    def kron(self, other: Tensor) -> Tensor:
        """The Kronecker product: block (i, j, ...) of the result is self[i, j, ...] * other (dims padded with 1s
        in front to the longer rank, as PyTorch's)."""
        a, b = self._s, other
        n = max(a.ndim, b.ndim)
        a = a.reshape((1,) * (n - a.ndim) + a.shape)
        b = b.reshape((1,) * (n - b.ndim) + b.shape)
        # a's dims interleaved with b's: (a0, b0, a1, b1, ...), each pair then merged
        pairs = a.reshape(tuple(d for size in a.shape for d in (size, 1))) * \
            b.reshape(tuple(d for size in b.shape for d in (1, size)))
        return pairs.reshape(tuple(x * y for x, y in zip(a.shape, b.shape)))

    def cross(self, other: Tensor, dim: int | None = None) -> Tensor:
        """The cross product of 3-vectors along `dim` (by default the first dim of size 3, as torch.cross); shapes
        broadcast, dtypes promote."""
        a, b = self._s._broadcasted(other)
        if dim is None:
            dim = next((i for i, size in enumerate(a.shape) if size == 3), 0)
        if not a.shape or not -a.ndim <= dim < a.ndim or a.shape[dim] != 3:
            raise ShapeError(f"cross: dim {dim} of shape {tuple(a.shape)} must exist and have size 3")
        x = [a.narrow(dim, i, 1) for i in range(3)]
        y = [b.narrow(dim, i, 1) for i in range(3)]
        return x[1].mul(y[2]).sub(x[2] * y[1]).cat(x[2] * y[0] - x[0] * y[2], x[0] * y[1] - x[1] * y[0], dim=dim)

    def scatter_add(self, dim: int, index: Tensor, src: Tensor) -> Tensor:
        """PyTorch's scatter_add: self[index[i][j]][j] += src[i][j] for dim=0 (repeated indices add up)."""
        return self._s.scatter_reduce(dim, index, src, reduce="sum")

    def baddbmm(self, batch1: Tensor, batch2: Tensor, beta: Scalar = 1, alpha: Scalar = 1) -> Tensor:
        """beta * self + alpha * (batch1 @ batch2), batched; beta = 0 ignores self (NaNs in it too), as PyTorch's."""
        product = batch1.matmul(batch2)
        product = product if alpha == 1 else product * alpha
        return product if beta == 0 else (self._s if beta == 1 else self._s * beta) + product

    def dist(self, other: Tensor, p: float = 2.0) -> Tensor:
        """The p-norm of self - other (broadcast), PyTorch's torch.dist."""
        return (self._s - other).norm(p)

    def remainder(self, other: Tensor | Scalar) -> Tensor:
        """Python's %: the sign of the divisor."""
        return self._s % other

    def floor_divide(self, other: Tensor | Scalar) -> Tensor:
        """Division rounded down (torch >= 1.13's floor_divide), for ints and floats."""
        return self._s // other

    @property
    def mT(self) -> Tensor:  # noqa: N802 (PyTorch's name)
        """The last two dims swapped."""
        t = self._s
        if t.ndim < 2:
            raise ShapeError(f"mT needs at least 2 dims, this tensor has shape {t.shape}")
        return t.transpose(-2, -1)

    def tile(self, *dims: Any) -> Tensor:
        """torch.tile: `repeat`, with fewer counts than dims padded with ones in front."""
        t = self._s
        reps = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else tuple(dims)
        return t.repeat((1,) * (t.ndim - len(reps)) + reps)

    def trace(self) -> Tensor:
        """The sum of a matrix's diagonal."""
        t = self._s
        if t.ndim != 2:
            raise ShapeError(f"trace needs a matrix, got shape {t.shape}")
        return t.diagonal().sum()

    def inner(self, other: Tensor) -> Tensor:
        """Sums of products over the last dims (a dot product for vectors; scalars multiply)."""
        t = self._s
        if t.ndim == 0 or other.ndim == 0:
            return t * other
        return (t.reshape(*t.shape[:-1], *(1,) * (other.ndim - 1), t.shape[-1]) * other).sum(-1)

    def diff(self, n: int = 1, dim: int = -1) -> Tensor:
        """The n-th forward difference along `dim`."""
        t = self._s
        axis = dim % t.ndim if t.ndim else 0
        for _ in range(n):
            size = t.shape[axis]
            hi = t.shrink(tuple((1, size) if a == axis else None for a in range(t.ndim)))
            lo = t.shrink(tuple((0, size - 1) if a == axis else None for a in range(t.ndim)))
            t = (hi != lo) if t.dtype.is_bool else hi - lo
        return t

    def unique(self, sorted: bool = True, return_inverse: bool = False, return_counts: bool = False,  # noqa: A002
               dim: int | None = None) -> Tensor | tuple[Tensor, ...]:
        """torch.unique of the flattened tensor: its distinct values in ascending order (sorted=False gives that
        order too, as PyTorch's CPU kernel does), with `return_inverse` each element's index into them (int64, the
        input's shape) and `return_counts` how often each occurs (int64). Each NaN is a value of its own, as in
        PyTorch (numpy's default merges them). The output's size depends on the data, so this realizes the tensor
        and computes on the host through numpy (a device-to-host sync, not lazy, nothing for a JIT to capture);
        the outputs are new leaves on the tensor's device, without gradients. dim= (unique slices) is not
        supported."""
        if dim is not None:
            raise ArgumentError(f"unique: dim={dim} (unique slices along a dim) is not supported; only the unique "
                                "values of the flattened tensor (dim=None)")
        t = self._s
        values, inverse, counts = _unique_flat(t.detach().numpy().reshape(-1))
        T = _tensor_class()
        outs = [T(values, dtype=t.dtype, device=t.device)]
        if return_inverse:
            outs.append(T(inverse.reshape(t.shape), dtype=dtypes.int64, device=t.device))
        if return_counts:
            outs.append(T(counts, dtype=dtypes.int64, device=t.device))
        return outs[0] if len(outs) == 1 else tuple(outs)

    # ------------------------------------------------------------------ new_* constructors
    def _like_kwargs(self, dtype: DType | str | None, device: str | None) -> dict[str, Any]:
        return {"dtype": dtype if dtype is not None else self._s.dtype,
                "device": device if device is not None else self._s.device}

    def new_zeros(self, *size: Any, dtype: DType | str | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        """Zeros of `size`, with this tensor's dtype and device unless given (PyTorch's new_zeros)."""
        return _tensor_class().zeros(*size, **self._like_kwargs(dtype, device), requires_grad=requires_grad)

    def new_ones(self, *size: Any, dtype: DType | str | None = None, device: str | None = None,
                 requires_grad: bool | None = None) -> Tensor:
        return _tensor_class().ones(*size, **self._like_kwargs(dtype, device), requires_grad=requires_grad)

    def new_empty(self, *size: Any, dtype: DType | str | None = None, device: str | None = None,
                  requires_grad: bool | None = None) -> Tensor:
        out = _tensor_class().empty(*size, **self._like_kwargs(dtype, device))
        return out.requires_grad_(True) if requires_grad else out

    def new_full(self, size: Any, fill_value: Scalar, dtype: DType | str | None = None, device: str | None = None,
                 requires_grad: bool | None = None) -> Tensor:
        shape = (size,) if isinstance(size, int) else tuple(size)
        return _tensor_class().full(shape, fill_value, **self._like_kwargs(dtype, device),
                                    requires_grad=requires_grad)

    def new_tensor(self, data: Any, dtype: DType | str | None = None, device: str | None = None,
                   requires_grad: bool | None = None) -> Tensor:
        """A copy of `data` (a list, array or tensor) with this tensor's dtype and device unless given."""
        T = _tensor_class()
        if isinstance(data, T):
            data = data.detach().numpy()
        return T(data, **self._like_kwargs(dtype, device), requires_grad=requires_grad)

    # ------------------------------------------------------------------ determinants
    def det(self) -> Tensor:
        """The determinant of each square matrix in the last two dims (batched), by LU with partial pivoting (see
        `_lu_diagonal`); differentiable. A singular matrix gives 0."""
        sign, diag = _lu_diagonal(self._s, "det")
        return sign * diag.prod(-1)

    def slogdet(self) -> tuple[Tensor, Tensor]:
        """(sign, log|det|) of each square matrix: sign 0 and log|det| -inf for a singular one, as PyTorch's."""
        sign, diag = _lu_diagonal(self._s, "slogdet")
        return sign * diag.sign().prod(-1), diag.abs().log().sum(-1)

    def logdet(self) -> Tensor:
        """log(det): NaN for a negative determinant, -inf for a singular matrix, as PyTorch's."""
        sign, logabs = self.slogdet()
        return (sign < 0).where(math.nan, logabs)


def _unique_flat(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted distinct values, each element's index into them, counts) of a 1-d array; every NaN is its own value,
    after the others (PyTorch's order; no `equal_nan`, which needs numpy 1.24)."""
    nan = np.isnan(flat) if flat.dtype.kind == "f" else np.zeros(flat.shape, dtype=bool)
    values, inverse, counts = np.unique(flat[~nan], return_inverse=True, return_counts=True)
    n_nan = int(nan.sum())
    full_inverse = np.empty(flat.shape, dtype=np.int64)
    full_inverse[~nan] = inverse.reshape(-1)
    full_inverse[nan] = len(values) + np.arange(n_nan)
    return (np.concatenate([values, flat[nan]]), full_inverse,
            np.concatenate([counts, np.ones(n_nan, dtype=counts.dtype)]).astype(np.int64))


def _lu_diagonal(a: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """Gaussian elimination with partial pivoting over the last two dims of `a` (..., n, n): (the permutation's sign,
    shape (...)), and U's diagonal (..., n), in float. Each of the n steps picks the row of largest magnitude in the
    column (`argmax`), swaps it up with a permutation matrix made of one-hot rows (so the gradient flows through the
    swap as through a matmul), and subtracts multiples of it from the rows below; a zero pivot leaves its column (the
    determinant is 0 through the diagonal)."""
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ShapeError(f"{name} needs square matrices in the last two dims, got shape {a.shape}")
    T = _tensor_class()
    n, lead = a.shape[-1], a.shape[:-2]
    m = _floated(a)
    sign = T.ones(*lead, dtype=m.dtype, device=m.device)
    diag: list[Tensor] = []
    for k in range(n):
        rest = m  # (..., n-k, n-k): the rows not eliminated yet, with the columns left
        pivot = rest[..., :, 0].abs().argmax(-1)  # (...)
        rows = T.arange(n - k, device=m.device)
        pick = (rows == pivot.unsqueeze(-1)).cast(m.dtype)  # one-hot of the pivot row
        first = (rows == 0).cast(m.dtype)
        swapped = (pick.unsqueeze(-1) * first.unsqueeze(-2) + first.unsqueeze(-1) * pick.unsqueeze(-2))
        keep = (1 - pick - first).maximum(0)  # rows neither moved: (pivot 0 gives pick = first, so 1-2 -> 0)
        perm = swapped.minimum(1) + keep.unsqueeze(-1) * T.eye(n - k, dtype=m.dtype, device=m.device)
        rest = perm @ rest
        sign = (pivot != 0).where(-sign, sign)
        top, below = rest[..., 0, :], rest[..., 1:, :]
        p = top[..., 0]
        diag.append(p)
        safe = (p == 0).where(1.0, p)
        factors = below[..., :, 0] / safe.unsqueeze(-1)
        m = (below - factors.unsqueeze(-1) * top.unsqueeze(-2))[..., :, 1:]
    return sign, T.stack(*diag, dim=-1) if diag else T.ones(*lead, 0, dtype=m.dtype, device=m.device)
