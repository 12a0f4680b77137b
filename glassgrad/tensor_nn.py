"""Neural-network functional ops on `Tensor` (a mixin): convolutions (any rank, and transposed), pooling,
batchnorm, scaled dot-product attention, embedding lookup and interpolate.

In: tensors shaped as PyTorch expects (N, C, H, W for images). Out: lazy tensors built only from Tensor's movement,
elementwise and reduction ops, so everything fuses and differentiates like the rest.

The key piece is `_windows`: every sliding window of the last spatial dims, as a *view* made of movement ops
(no copying): `x._windows((kh, kw), stride, dilation)` has shape (..., oh, ow, kh, kw) with
`[..., i, j, a, b] = x[..., i*sh + a*dh, j*sw + b*dw]`. A convolution is then an elementwise multiply with the
weights and a sum over (channels, kh, kw): one fused reduce kernel, whose index arithmetic the simplifier folds
back to direct loads. A transposed convolution is a convolution of the input spread out by its stride (zeros
between elements, again a view); an embedding lookup and a resize are masked reductions built from arange.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.errors import ArgumentError, ShapeError

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor
    from glassgrad.uop.ops import UOp

INTERPOLATE_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "trilinear")


def attention_output(scores: Tensor, value: Tensor, head_dim: int, factors: DType,
                     weights_dtype: DType | None = None) -> Tensor:
    """softmax(scores, -1) @ value for attention's scores (q and k heads `head_dim` long, of dtype `factors`), the
    weights cast to `weights_dtype` first when given (autocast's half weights).

    Where flash attention applies (`schedule.flash_attention`) the weights are spelled exp(scores - lse), lse the
    rows' logsumexp: the scheduler stores only lse (O(T)) and recomputes the T x T scores inside each kernel that
    reduces over them (`schedule._chained`), forward and backward. lse enters the weights detached, and the output
    gets `out * (lse.detach() - lse)`, which is 0: its gradient carries lse's part of the backward, -sum(dO * out)
    per row, where differentiating exp(scores - lse) through lse would sum dO v^T times the weights over all keys
    (a third pass over the T x T scores). Float16 and bfloat16 scores are computed in float32 and rounded once, as
    the softmax is."""
    from glassgrad.schedule import flash_attention  # (the scheduler imports the tensor modules' helpers)
    if not flash_attention(scores.device, scores.shape[-2], scores.shape[-1], max(head_dim, value.shape[-1]), factors):
        weights = scores.softmax(-1)
        return (weights if weights_dtype is None else weights.cast(weights_dtype)) @ value
    x = scores.float() if scores.dtype in (dtypes.float16, dtypes.bfloat16) else scores
    lse = x.logsumexp(-1, keepdim=True)
    fixed = lse.detach()
    out = (x - fixed).exp().cast(weights_dtype or scores.dtype) @ value
    zero = out.detach().cast(x.dtype) * (fixed - lse)
    return out + zero.cast(out.dtype)


def _window_nodes(u: UOp, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...]) -> UOp | None:
    """`_windows`' node made on the nodes themselves, without a Tensor per step (a convolution's windows were two
    thirds of its build on the host): the same movement ops in the same order, so the same node (tested). None
    where a window does not fit (the Tensor path raises its error)."""
    n = len(kernel)
    batch = len(u.shape) - n
    x: UOp | None = u
    for i in reversed(range(n)):
        assert x is not None
        order = tuple(d for d in range(len(x.shape)) if d != batch + i) + (batch + i,)
        x = _window_last_node(x.permute(order), kernel[i], stride[i], dilation[i])
        if x is None:
            return None
    assert x is not None
    pair = {i: batch + 2 * (n - 1 - i) for i in range(n)}
    return x.permute((*range(batch), *(pair[i] for i in range(n)), *(pair[i] + 1 for i in range(n))))


def _window_last_node(t: UOp, kernel: int, stride: int, dilation: int) -> UOp | None:
    """`NNOps._window_last` on a node: (..., H) -> (..., O, K)."""
    size = t.shape[-1]
    out = (size - dilation * (kernel - 1) - 1) // stride + 1
    if out <= 0:
        return None
    lead = t.shape[:-1]
    keep = tuple((0, s) for s in lead)
    if dilation == 1 and kernel <= stride:
        row = t.pad(((0, 0),) * len(lead) + ((0, max(0, out * stride - size)),))
        row = row.shrink((*keep, (0, out * stride))).reshape((*lead, out, stride))
        return row.shrink((*keep, (0, out), (0, kernel)))
    copies = t.reshape((*lead, 1, size)).expand((*lead, kernel, size)).reshape((*lead, kernel * size))
    rows = copies.pad(((0, 0),) * len(lead) + ((0, kernel * dilation),)).reshape((*lead, kernel, size + dilation))
    rows = rows.shrink((*keep, (0, kernel), (0, (out - 1) * stride + 1)))
    if stride > 1:
        rows = rows.pad(((0, 0),) * (len(lead) + 1) + ((0, out * stride - ((out - 1) * stride + 1)),))
        rows = rows.reshape((*lead, kernel, out, stride)).shrink((*keep, (0, kernel), (0, out), (0, 1))) \
            .reshape((*lead, kernel, out))
    last = len(rows.shape) - 1
    return rows.permute((*range(last - 1), last, last - 1))


def _tensor_class() -> type[Tensor]:
    """The Tensor class, for its constructors (imported late: tensor.py imports this module)."""
    from glassgrad.tensor import Tensor
    return Tensor


def _tuple(value: int | Sequence[int], n: int, name: str, minimum: int = 1) -> tuple[int, ...]:
    """An int or n ints -> n ints, each at least `minimum` (ValueError naming `name` otherwise)."""
    out = (value,) * n if isinstance(value, int) else tuple(value)
    if len(out) != n or any(not isinstance(v, int) or isinstance(v, bool) or v < minimum for v in out):
        kind = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{name} must be an int or {n} ints, each {kind}, got {value!r}")
    return out


def _conv_padding(padding: int | Sequence[int], n: int) -> list[tuple[int, int]]:
    """PyTorch/tinygrad padding forms -> one (before, after) per spatial dim: an int, one int per dim, or
    2*n ints given per side with the last dim first ((left, right, top, bottom) for 2-D)."""
    if isinstance(padding, int):
        return [(padding, padding)] * n
    pads = list(padding)
    if len(pads) == n:
        return [(p, p) for p in pads]
    if len(pads) == 2 * n:
        return [(pads[2 * i], pads[2 * i + 1]) for i in range(n)][::-1]
    raise ValueError(f"padding must be an int, {n} ints or {2 * n} ints (per side, last dim first), got {padding!r}")


def _string_padding(padding: str, kernel: Sequence[int], dilation: Sequence[int],
                    stride: Sequence[int]) -> int | list[int]:
    """PyTorch's padding='valid' (0) and 'same' (per-side pads, the odd pixel at the end, in the flat form, last dim
    first; stride 1 only, as in PyTorch)."""
    if padding == "valid":
        return 0
    if padding != "same":
        raise ValueError(f"padding must be an int, ints, 'same' or 'valid', got {padding!r}")
    if any(s != 1 for s in stride):
        raise ValueError(f"padding='same' needs stride 1, got stride {tuple(stride)}")
    flat: list[int] = []
    for k, d in reversed(list(zip(kernel, dilation))):
        total = d * (k - 1)
        flat += [total // 2, total - total // 2]
    return flat


def _lowest(dtype: DType) -> float | int | bool:
    """The value a max never picks over a real one: -inf, the int dtype's minimum, False."""
    return -math.inf if dtype.is_float else dtype.min


@dataclass(frozen=True)
class _PoolGeometry:
    """Where a pool's windows lie: per pooled dim the kernel, stride, dilation, the user's padding and the extra end
    padding that ceil_mode adds."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[tuple[int, int], ...]
    extra: tuple[int, ...]

    @property
    def n(self) -> int:
        return len(self.kernel)

    @property
    def full_pads(self) -> tuple[tuple[int, int], ...]:
        return tuple((b, a + e) for (b, a), e in zip(self.pads, self.extra))

    @staticmethod
    def of(shape: tuple[int, ...], kernel_size: int | Sequence[int], stride: int | Sequence[int] | None,
           dilation: int | Sequence[int], padding: int | Sequence[int], ceil_mode: bool) -> _PoolGeometry:
        n = 2 if isinstance(kernel_size, int) else len(kernel_size)
        if len(shape) < n:
            raise ShapeError(f"a {n}-D pool needs at least {n} dims, got shape {shape}")
        kernel = _tuple(kernel_size, n, "kernel_size")
        strides = kernel if stride is None else _tuple(stride, n, "stride")
        dils = _tuple(dilation, n, "dilation")
        pads = tuple(_conv_padding(padding, n))
        extra = tuple(_ceil_extra(size, k, s, d, p) if ceil_mode else 0
                      for size, k, s, d, p in zip(shape[-n:], kernel, strides, dils, pads))
        return _PoolGeometry(kernel, strides, dils, pads, extra)

    def counts(self, spatial: tuple[int, ...], include_pad: bool, device: str) -> Tensor:
        """How many positions of each window a mean divides by: those in the input (and its padding)."""
        ones = _tensor_class().ones(*spatial, device=device)
        inside = ones.pad(self.pads, value=1.0 if include_pad else 0.0).pad(tuple((0, e) for e in self.extra))
        return inside._windows(self.kernel, self.strides, self.dilations).sum(tuple(range(-self.n, 0)))


def _ceil_extra(size: int, k: int, s: int, d: int, pad: tuple[int, int]) -> int:
    """ceil_mode's extra end padding: enough for one more, partial, window, unless that window would start past the
    input and its left padding (PyTorch drops it then)."""
    span = size + pad[0] + pad[1] - d * (k - 1) - 1
    if span < 0:
        return 0  # no window fits: _windows says so
    out = -(-span // s) + 1
    if (out - 1) * s >= size + pad[0]:
        out -= 1
    return max(0, (out - 1) * s + d * (k - 1) + 1 - (size + pad[0] + pad[1]))


class NNOps:
    """Mixed into Tensor. Methods use only the public Tensor API."""
    __slots__ = ()

    @property
    def _t(self) -> Tensor:
        """This object as the Tensor it is (for the type checker: the mixin is only ever part of a Tensor)."""
        return cast("Tensor", self)

    def _window_last(self, kernel: int, stride: int, dilation: int) -> Tensor:
        """(..., H) -> (..., O, K) with [..., o, k] = x[..., o*stride + k*dilation]."""
        t = self._t
        size = t.shape[-1]
        out = (size - dilation * (kernel - 1) - 1) // stride + 1
        if out <= 0:
            raise ShapeError(f"window of {kernel} (dilation {dilation}) does not fit a dimension of size {size}")
        lead = t.shape[:-1]
        if dilation == 1 and kernel <= stride:  # windows that do not overlap (a 2x2 pool): cut the row into strides
            row = t.pad(((0, 0),) * len(lead) + ((0, max(0, out * stride - size)),))
            row = row.shrink([*((0, s) for s in lead), (0, out * stride)]).reshape(*lead, out, stride)
            return row.shrink([*((0, s) for s in lead), (0, out), (0, kernel)])
        # K copies of the row, laid end to end and re-cut into rows one `dilation` longer: row k starts k*dilation
        # further into its copy, so column j of row k is x[k*dilation + j]
        copies = t.unsqueeze(-2).expand(*lead, kernel, size).reshape(*lead, kernel * size)
        rows = copies.pad(((0, 0),) * len(lead) + ((0, kernel * dilation),)).reshape(*lead, kernel, size + dilation)
        rows = rows.shrink([*((0, s) for s in lead), (0, kernel), (0, (out - 1) * stride + 1)])
        if stride > 1:  # keep every stride-th column
            rows = rows.pad(((0, 0),) * (len(lead) + 1) + ((0, out * stride - ((out - 1) * stride + 1)),))
            rows = rows.reshape(*lead, kernel, out, stride).shrink([*((0, s) for s in lead), (0, kernel), (0, out),
                                                                     (0, 1)]).reshape(*lead, kernel, out)
        return rows.transpose(-1, -2)

    def _windows(self, kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...]) -> Tensor:
        """(..., *spatial) -> (..., *out, *kernel): all sliding windows over the last len(kernel) dims, as a view."""
        t = self._t
        n = len(kernel)
        if t.ndim < n:
            raise ValueError(f"a {n}-D window needs at least {n} dims, got shape {t.shape}")
        node = _window_nodes(t.uop, kernel, stride, dilation) if all(type(d) is int for d in t.shape) else None
        if node is not None:
            return t._view(node)
        batch = t.ndim - n
        x = t
        for i in reversed(range(n)):  # move spatial dim i to the end, window it: (..., O_i, K_i) appended
            order = [d for d in range(x.ndim) if d != batch + i] + [batch + i]
            x = x.permute(order)._window_last(kernel[i], stride[i], dilation[i])
        # layout now: batch, (O, K) pairs for dims n-1 ... 0
        pair = {i: batch + 2 * (n - 1 - i) for i in range(n)}
        return x.permute(*range(batch), *(pair[i] for i in range(n)), *(pair[i] + 1 for i in range(n)))

    def conv2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
               stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
               padding: int | Sequence[int] | str = 0, dtype: DType | str | None = None) -> Tensor:
        """PyTorch's conv2d (and conv1d/conv3d by the weight's rank): x (N, Cin, *spatial), weight
        (Cout, Cin/groups, *kernel), optional bias (Cout,); padding also 'same' or 'valid', as F.conv2d. dtype:
        accumulate in (and return) it (tinygrad's)."""
        t = self._t
        n = weight.ndim - 2
        if n < 1 or t.ndim != n + 2:
            raise ValueError(f"conv: input {t.shape} and weight {weight.shape} need ranks n+2 and n+2 (n >= 1)")
        batch, cin = t.shape[:2]
        cout, cin_group = weight.shape[:2]
        if groups < 1 or cin % groups or cout % groups or cin // groups != cin_group:
            raise ValueError(f"conv: input has {cin} channels, weight {weight.shape} expects {cin_group} per group "
                             f"with groups={groups}")
        kernel = weight.shape[2:]
        if isinstance(padding, str):
            padding = _string_padding(padding, kernel, _tuple(dilation, n, "dilation"), _tuple(stride, n, "stride"))
        pads = _conv_padding(padding, n)
        x = t.pad(((0, 0), (0, 0), *pads)) if any(p != (0, 0) for p in pads) else t
        windows = x._windows(kernel, _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation"))
        out_sp = windows.shape[2:2 + n]
        # (N, G, 1, Cin/G, *out, *k) * (1, G, Cout/G, Cin/G, 1.., *k), summed over (Cin/G, *k)
        xs = windows.reshape(batch, groups, 1, cin_group, *out_sp, *kernel)
        ws = weight.reshape(1, groups, cout // groups, cin_group, *([1] * n), *kernel)
        axes = (3, *range(4 + n, 4 + 2 * n))
        products = xs._product_operand(dtype) * ws._product_operand(dtype)
        out = products.sum(axes, dtype=dtype).reshape(batch, cout, *out_sp)
        return out if bias is None else out + bias.reshape(1, cout, *([1] * n))

    def _pool(self, k_: Sequence[int], stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1) -> Tensor:
        """tinygrad's private window helper, which its example programs call (hlb_cifar10's whitening patches):
        (..., *spatial) -> (..., *out, *k_), every window over the last len(k_) dims, no padding, stride and
        dilation an int or one per dim (default 1). A view."""
        t = self._t
        n = len(k_)
        strides, dilations = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
        if t.ndim < n:
            raise ValueError(f"_pool: a {n}-D window needs at least {n} dims, got shape {t.shape}")
        for k, d, size in zip(k_, dilations, t.shape[-n:]):
            if d * (k - 1) + 1 > size:
                raise ValueError(f"_pool: window {tuple(k_)} (dilation {dilations}) is larger than the input's last "
                                 f"dims {t.shape[-n:]}")
        return t._windows(tuple(k_), strides, dilations)

    def _padded_windows(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None,
                        dilation: int | Sequence[int], padding: int | Sequence[int], ceil_mode: bool,
                        pad_value: float | int | bool) -> tuple[Tensor, _PoolGeometry]:
        """Windows over the last dims (2 for an int kernel_size, else one per kernel entry), after padding them
        with `pad_value`; with ceil_mode, the padding at the end grows so that a last partial window exists."""
        t = self._t
        geo = _PoolGeometry.of(t.shape, kernel_size, stride, dilation, padding, ceil_mode)
        pads = ((0, 0),) * (t.ndim - geo.n) + geo.full_pads
        x = t.pad(pads, value=pad_value) if any(p != (0, 0) for p in pads) else t
        return x._windows(geo.kernel, geo.strides, geo.dilations), geo

    def max_pool2d(self, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                   dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, ceil_mode: bool = False,
                   return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Max over windows of the last 2 dims (or len(kernel_size) dims: 1-D and 3-D pools too); padding never
        wins. Stride defaults to the kernel size, as in PyTorch. ceil_mode keeps a last partial window (one that
        starts inside the input or its left padding). return_indices also gives, as int32, each maximum's index
        into the flattened pooled dims of the input (the first maximum of the window in row-major order)."""
        t = self._t
        if return_indices and t.dtype.is_float:
            from glassgrad.tensor import _calls_libm
            if _calls_libm(t.uop):  # compared with the window's max below: stored once (see _calls_libm)
                t = t.contiguous()
        windows, geo = t._padded_windows(kernel_size, stride, dilation, padding, ceil_mode, _lowest(t.dtype))
        axes = tuple(range(-geo.n, 0))
        out = windows.max(axes)
        if not return_indices:
            return out
        spatial = t.shape[-geo.n:]
        tensor = _tensor_class()
        flat = tensor.arange(math.prod(spatial), device=t.device).reshape(spatial)
        idx = flat.pad(geo.full_pads, value=-1)._windows(geo.kernel, geo.strides, geo.dilations)
        is_max = (windows == out.reshape(*out.shape, *(1,) * geo.n)) & (idx >= 0)
        first = is_max.where(idx, math.prod(spatial)).min(axes)
        return out, first.cast(dtypes.int32)

    def avg_pool2d(self, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                   dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, ceil_mode: bool = False,
                   count_include_pad: bool = True) -> Tensor:
        """Mean over windows (of the last 2 dims, or len(kernel_size) dims). Each window is divided by how many of
        its positions lie in the input, plus, with count_include_pad, in the padding (never in the extra end
        padding of ceil_mode: PyTorch's divisor)."""
        t = self._t
        windows, geo = t._padded_windows(kernel_size, stride, dilation, padding, ceil_mode, 0)
        axes = tuple(range(-geo.n, 0))
        total = windows.cast(dtypes.default_float) if not t.dtype.is_float else windows
        if not count_include_pad or ceil_mode:
            return total.sum(axes) / geo.counts(t.shape[-geo.n:], count_include_pad, t.device)
        return total.mean(axes)

    # ------------------------------------------------------------------ transposed convolution
    def _dilate(self, factors: tuple[int, ...]) -> Tensor:
        """(N, C, *spatial) -> the same with factor-1 zeros between neighbours along each spatial dim: size s becomes
        (s-1)*factor + 1. A view (reshape, pad, reshape, shrink): no copy, and zeros are never read from memory."""
        t = self._t
        n = len(factors)
        if all(f == 1 for f in factors):
            return t
        lead, spatial = t.shape[:-n], t.shape[-n:]
        # (..., s, 1) padded to (..., s, f) puts f-1 zeros after each element; merged back it is (..., s*f)
        x = t.reshape(*lead, *(d for s in spatial for d in (s, 1)))
        x = x.pad(((0, 0),) * len(lead) + tuple(p for f in factors for p in ((0, 0), (0, f - 1))))
        x = x.reshape(*lead, *(s * f for s, f in zip(spatial, factors)))
        return x.shrink([*((0, s) for s in lead), *((0, (s - 1) * f + 1) for s, f in zip(spatial, factors))])

    def conv_transpose2d(self, weight: Tensor, bias: Tensor | None = None, groups: int = 1,
                         stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
                         padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0) -> Tensor:
        """PyTorch's conv_transpose2d (1-D/3-D by the weight's rank): x (N, Cin, *spatial), weight
        (Cin, Cout/groups, *kernel), optional bias (Cout,) -> (N, Cout, *out) with
        out = (in - 1)*stride - 2*padding + dilation*(kernel - 1) + output_padding + 1.

        It is the gradient of a convolution, computed as one: spread the input out by `stride` (zeros between
        elements), pad it by dilation*(kernel-1) - padding on each side (+ output_padding at the end; a negative pad
        crops), and correlate with the weight flipped in space and with its two channel axes swapped per group.
        (stride-1 of every stride taps hit a zero: simple, and still one fused kernel.)"""
        t = self._t
        n = weight.ndim - 2
        if n < 1 or t.ndim != n + 2:
            raise ValueError(f"conv_transpose: input {t.shape} and weight {weight.shape} need ranks n+2 and n+2 "
                             "(n >= 1)")
        cin, cout_group = weight.shape[:2]
        if groups < 1 or t.shape[1] != cin or cin % groups:
            raise ValueError(f"conv_transpose: input {t.shape} has {t.shape[1]} channels, weight {weight.shape} "
                             f"expects {cin} (a multiple of groups={groups})")
        kernel = weight.shape[2:]
        strides, dils = _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation")
        extra = _tuple(output_padding, n, "output_padding", minimum=0)
        if any(e >= s and e >= d for e, s, d in zip(extra, strides, dils)):
            raise ValueError(f"conv_transpose: output_padding {extra} must be smaller than stride {strides} or "
                             f"dilation {dils}")
        pads = _conv_padding(padding, n)
        edges = tuple((d * (k - 1) - before, d * (k - 1) - after + e)
                      for d, k, (before, after), e in zip(dils, kernel, pads, extra))
        x = t._dilate(strides).pad(((0, 0), (0, 0), *edges))
        # (Cin, Cout/G, *k) -> (G, Cin/G, Cout/G, *k) -> (G, Cout/G, Cin/G, *k) -> (Cout, Cin/G, *k), flipped in space
        w = weight.reshape(groups, cin // groups, cout_group, *kernel).transpose(1, 2)
        w = w.reshape(groups * cout_group, cin // groups, *kernel).flip(tuple(range(2, 2 + n)))
        return x.conv2d(w, bias, groups=groups, dilation=dils)

    # ------------------------------------------------------------------ normalisation, attention, lookup
    def batchnorm(self, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
                  axis: int | Sequence[int] = 1) -> Tensor:
        """(x - mean) * invstd * weight + bias (tinygrad's functional batch norm). mean, invstd, weight and bias
        hold one value per position of x's dims `axis` (the channels by default) and broadcast over the rest;
        weight and bias may be None. All elementwise: one fused kernel with whatever computed its inputs."""
        t = self._t
        axes = t._resolve_axes(axis)
        shape = tuple(s if i in axes else 1 for i, s in enumerate(t.shape))

        def fit(p: Tensor, name: str) -> Tensor:
            if p.numel() != math.prod(shape):
                raise ValueError(f"batchnorm: {name} has shape {p.shape}, expected {math.prod(shape)} values for the "
                                 f"axes {axes} of input {t.shape}")
            return p.reshape(shape)

        scale = fit(invstd, "invstd") if weight is None else fit(invstd, "invstd") * fit(weight, "weight")
        out = (t - fit(mean, "mean")) * scale
        return out if bias is None else out + fit(bias, "bias")

    def scaled_dot_product_attention(self, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                     dropout_p: float = 0.0, is_causal: bool = False, enable_gqa: bool = False,
                                     scale: float | None = None) -> Tensor:
        """softmax(q @ k^T * scale + mask) @ v, with q = self (..., L, E), key (..., S, E), value (..., S, Ev) ->
        (..., L, Ev); scale defaults to 1/sqrt(E). attn_mask: bool (True = may attend) or float (added to the
        scores), broadcast to (..., L, S). is_causal: query i sees keys 0..i (PyTorch's top-left alignment).
        Dropout on the attention weights follows `Tensor.training` (as tinygrad; PyTorch's functional form applies
        it whenever dropout_p > 0). enable_gqa: grouped-query attention, key and value have fewer heads (dim -3)
        than the query, a divisor of its count, and each of theirs serves that many query heads in a row."""
        q = self._t
        if enable_gqa:
            key, value = _repeat_heads(key, q, "key"), _repeat_heads(value, q, "value")
        if q.ndim < 2 or key.ndim < 2 or value.ndim < 2 or q.shape[-1] != key.shape[-1] or \
                key.shape[-2] != value.shape[-2]:
            raise ValueError(f"scaled_dot_product_attention: query {q.shape}, key {key.shape} and value {value.shape}"
                             " need (..., L, E), (..., S, E) and (..., S, Ev)")
        if is_causal and attn_mask is not None:
            raise ArgumentError("scaled_dot_product_attention: pass attn_mask or is_causal, not both")
        factor = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = (q @ key.transpose(-1, -2)) * factor
        if is_causal:
            tensor = _tensor_class()
            rows = tensor.arange(q.shape[-2], device=q.device).reshape(q.shape[-2], 1)  # (no -1: symbolic lengths)
            attn_mask = rows >= tensor.arange(key.shape[-2], device=q.device).reshape(1, key.shape[-2])
        if attn_mask is not None:
            scores = attn_mask.where(scores, -math.inf) if attn_mask.dtype == dtypes.bool else scores + attn_mask
        if not 0 <= dropout_p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {dropout_p}")
        if dropout_p > 0 and _tensor_class().training:
            return scores.softmax(-1).dropout(dropout_p) @ value
        return attention_output(scores, value, q.shape[-1], q.dtype)

    def embedding(self, weight: Tensor) -> Tensor:
        """Row lookup: self holds int indices (any shape), weight is (vocab, dim) -> (*self.shape, dim).

        Done as a one-hot gather, sum over v of (index == v) ? weight[v] : 0, which fuses into one reduce kernel
        (the arange is the kernel's loop index, nothing is read for it) and whose gradient is the matching
        scatter-add into weight. An index outside [0, vocab) gives a row of zeros."""
        t = self._t
        if t.dtype.is_float or t.dtype.is_bool:
            raise TypeError(f"embedding: indices must be ints, got {t.dtype}")
        if weight.ndim != 2:
            raise ValueError(f"embedding: weight must be (vocab, dim), got {weight.shape}")
        vocab = weight.shape[0]
        rows = _tensor_class().arange(vocab, device=t.device).reshape(vocab, 1)
        hit = t.reshape(*t.shape, 1, 1) == rows  # (*idx, vocab, 1)
        return hit.where(weight, 0).sum(-2, dtype=weight.dtype)

    # ------------------------------------------------------------------ resampling
    def interpolate(self, size: int | Sequence[int] | None = None, mode: str = "linear", align_corners: bool = False,
                    *, scale_factor: float | Sequence[float] | None = None,
                    recompute_scale_factor: bool | None = None) -> Tensor:
        """Resize the last len(size) dims to `size` (an int resizes every dim after the first two, as for
        (N, C, *spatial) images), with PyTorch's `F.interpolate` index rules:
        - "nearest": out[o] = x[floor(o * r)]; "nearest-exact": x[floor((o + 0.5) * r)];
        - "linear" (also "bilinear"/"trilinear": each resized dim in turn): a blend of the two neighbours of
          src = (o + 0.5) * r - 0.5 (clamped at 0), or src = o * (in-1)/(out-1) with align_corners=True;
        where r = in/out. PyTorch's `scale_factor=` (keyword; a float or one per resized dim) instead of `size`
        gives out = floor(in * scale) and, as in PyTorch, r = 1/scale (not in/out, which can pick other sources
        when in * scale is not an integer), unless `recompute_scale_factor=True`.
        Each resized dim is one reduce over a (out, in) weight matrix built from arange (no host data); a nearest
        resize by an exact integer factor is a pure view (expand + reshape)."""
        t = self._t
        if mode not in INTERPOLATE_MODES:
            raise ValueError(f"interpolate: mode must be one of {INTERPOLATE_MODES}, got {mode!r}")
        sizes, ratios = _interpolate_sizes(t.shape, size, scale_factor, bool(recompute_scale_factor))
        if align_corners and mode.startswith("nearest"):
            raise ValueError("interpolate: align_corners only applies to the linear modes")
        x = t
        for axis in reversed(range(t.ndim - len(sizes), t.ndim)):  # the last dim first, as PyTorch's uint8 path
            out, ratio = sizes[axis - (t.ndim - len(sizes))], ratios[axis - (t.ndim - len(sizes))]
            if mode == "nearest" and t.ndim == 4 and out in (x.shape[axis], 2 * x.shape[axis]):
                ratio = None  # PyTorch's 2-d nearest kernel copies (out = in) or halves (out = 2 in) the index
            # an unchanged size is a copy, but for the nearest modes a scale != 1 moves the sources (as PyTorch)
            if out != x.shape[axis] or (ratio is not None and ratio != 1.0 and mode.startswith("nearest")):
                x = x.transpose(axis, -1)._resize_last(out, mode, align_corners, ratio).transpose(axis, -1)
        return x

    def _resize_last(self, out: int, mode: str, align_corners: bool, ratio: float | None = None) -> Tensor:
        """(..., in) -> (..., out) along the last dim, by `interpolate`'s rules (`ratio`: 1/scale_factor, or None
        for in/out). Values are picked with `where`, never multiplied by a 0 weight, so an inf or NaN only reaches
        the outputs that read it."""
        t = self._t
        size = t.shape[-1]
        r = size / out if ratio is None else ratio
        row = t.unsqueeze(-2)  # (..., 1, in) against (out, in) masks
        if mode.startswith("nearest"):
            k = out // size
            if out % size == 0 and np.array_equal(_nearest_sources(size, out, mode, r), np.arange(out) // k):
                return t.unsqueeze(-1).expand(*t.shape, k).reshape(*t.shape[:-1], out)
            return _nearest_mask(size, out, mode, t.device, r).where(row, 0).sum(-1, dtype=t.dtype)
        if t.dtype == dtypes.uint8:
            weights, precision = _uint8_linear_weights(size, out, align_corners, r)
            acc = (row.cast(dtypes.int32) * _tensor_class()(weights, device=t.device)).sum(-1)
            return ((acc + (1 << (precision - 1))) >> precision).clip(0, 255).cast(dtypes.uint8)
        if not t.dtype.is_float:
            row = row.cast(dtypes.default_float)
        (hit0, lam0), (hit1, lam1) = _linear_taps(size, out, align_corners, t.device, r,
                                                  dtypes.float64 if row.dtype == dtypes.float64 else dtypes.float32)
        return (hit0.where(row * lam0.cast(row.dtype), 0) + hit1.where(row * lam1.cast(row.dtype), 0)).sum(-1)


def _interpolate_sizes(shape: tuple[int, ...], size: int | Sequence[int] | None,
                       scale_factor: float | Sequence[float] | None,
                       recompute: bool) -> tuple[tuple[int, ...], tuple[float | None, ...]]:
    """interpolate's output sizes for the resized (last) dims of `shape`, and for each the source ratio to use
    (1/scale for a scale_factor that is not recomputed, None for in/out). Exactly one of size and scale_factor."""
    n = max(len(shape) - 2, 1)
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    if size is not None:
        sizes = (size,) * n if isinstance(size, int) else tuple(size)
        if not 0 < len(sizes) <= len(shape) or any(isinstance(s, bool) or not isinstance(s, int) or s < 1
                                                   for s in sizes):
            raise ValueError(f"interpolate: size {size!r} must be positive ints for at most the {len(shape)} dims "
                             f"of input {shape}")
        return sizes, (None,) * len(sizes)
    assert scale_factor is not None
    scales = (scale_factor,) * n if isinstance(scale_factor, (int, float)) else tuple(scale_factor)
    if not 0 < len(scales) <= len(shape) or any(isinstance(s, bool) or not isinstance(s, (int, float))
                                                or not s > 0 or math.isinf(s) for s in scales):
        raise ValueError(f"interpolate: scale_factor {scale_factor!r} must be positive numbers for at most the "
                         f"{len(shape)} dims of input {shape}")
    dims = shape[len(shape) - len(scales):]
    sizes = tuple(math.floor(d * float(s)) for d, s in zip(dims, scales))
    if any(o < 1 for o in sizes):
        raise ValueError(f"interpolate: scale_factor {scale_factor!r} makes an empty output from input {shape}")
    return sizes, tuple(None if recompute else 1.0 / float(s) for s in scales)


def _repeat_heads(kv: Tensor, q: Tensor, name: str) -> Tensor:
    """(..., H_kv, S, E) -> (..., H_q, S, E), each head repeated H_q / H_kv times in a row."""
    if q.ndim < 3 or kv.ndim < 3 or q.shape[-3] % kv.shape[-3]:
        raise ShapeError(f"scaled_dot_product_attention with enable_gqa: query {q.shape} needs a head count (dim -3) "
                         f"that is a multiple of the {name}'s {kv.shape}")
    times = q.shape[-3] // kv.shape[-3]
    lead, (heads, s, e) = kv.shape[:-3], kv.shape[-3:]
    return kv.reshape(*lead, heads, 1, s, e).expand(*lead, heads, times, s, e).reshape(*lead, heads * times, s, e)


def _uint8_linear_weights(size: int, out: int, align_corners: bool, ratio: float) -> tuple[np.ndarray, int]:
    """PyTorch's uint8 linear resizing, which a uint8 result must match exactly: (out, size) int32 weights in fixed
    point with `precision` fraction bits, the most that keep the largest weight below 2^15, each rounded half up
    (so a row's weights need not add up to exactly 1). Computed on the host in float64, as PyTorch does."""
    scale = ((size - 1) / (out - 1) if out > 1 else 0.0) if align_corners else ratio
    delta = 0.5 if align_corners else 0.0
    weights = np.zeros((out, size))
    for i in range(out):
        center = scale * (i + 0.5 - delta) + delta
        taps = np.arange(max(int(center - 0.5), 0), min(int(center + 1.5), size))
        w = np.maximum(0.0, 1 - np.abs(taps - center + 0.5))
        weights[i, taps] = w / w.sum() if w.sum() else w
    precision = 0
    while precision < 22 and int(0.5 + weights.max() * (1 << (precision + 1))) < (1 << 15):
        precision += 1
    return np.floor(weights * (1 << precision) + 0.5).astype(np.int32), max(precision, 1)


def _nearest_sources(size: int, out: int, mode: str, ratio: float) -> np.ndarray:
    """The source index of each output position for nearest resizing (`ratio`: in/out or 1/scale_factor), computed
    in float32 as PyTorch does."""
    scale = np.float32(ratio)
    pos = np.arange(out, dtype=np.float32) + (np.float32(0.5) if mode == "nearest-exact" else np.float32(0))
    return np.minimum(np.floor(pos * scale), size - 1).astype(np.int64)


def _nearest_mask(size: int, out: int, mode: str, device: str, ratio: float) -> Tensor:
    """(out, size) bool: row o is true at the source of output o (`_nearest_sources`' float32 arithmetic, done on
    the device from arange)."""
    tensor = _tensor_class()
    pos = tensor.arange(out, device=device).cast(dtypes.float32)
    if mode == "nearest-exact":
        pos = pos + 0.5
    src = (pos * float(np.float32(ratio))).floor().minimum(size - 1)
    return src.reshape(out, 1) == tensor.arange(size, device=device).cast(dtypes.float32).reshape(1, size)


def _linear_taps(size: int, out: int, align_corners: bool, device: str, ratio: float,
                 dtype: DType = dtypes.float32) -> list[tuple[Tensor, Tensor]]:
    """The two taps of linear interpolation, each as ((out, size) bool mask, (out, 1) weight): output o takes 1-lam
    of x[i0] and lam of x[i1], i0 and i1 the neighbours of its source position (PyTorch's
    `area_pixel_compute_source_index` with its index and weight guards). Computed in `dtype`: float32, or float64
    for a float64 input (PyTorch's opmath; float32 weights held a float64 resize to ~3e-7 relative)."""
    tensor = _tensor_class()
    pos = tensor.arange(out, device=device).cast(dtype)
    if align_corners:
        src = pos * ((size - 1) / (out - 1)) if out > 1 else pos * 0.0
    else:
        src = ((pos + 0.5) * ratio - 0.5).maximum(0.0)
    i0 = src.floor().minimum(size - 1)
    lam = (src - i0).clip(0.0, 1.0).reshape(out, 1)
    i1 = (i0 + 1).minimum(size - 1)
    cols = tensor.arange(size, device=device).cast(dtype).reshape(1, size)
    return [(cols == i0.reshape(out, 1), 1 - lam), (cols == i1.reshape(out, 1), lam)]
