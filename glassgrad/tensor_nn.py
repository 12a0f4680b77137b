"""Neural-network functional ops on `Tensor` (a mixin): convolutions, pooling, normalisation, attention, ...

In: tensors shaped as PyTorch expects (N, C, H, W for images). Out: lazy tensors built only from Tensor's movement,
elementwise and reduction ops, so everything fuses and differentiates like the rest.

The key piece is `_windows`: every sliding window of the last spatial dims, as a *view* made of movement ops
(no copying): `x._windows((kh, kw), stride, dilation)` has shape (..., oh, ow, kh, kw) with
`[..., i, j, a, b] = x[..., i*sh + a*dh, j*sw + b*dw]`. A convolution is then an elementwise multiply with the
weights and a sum over (channels, kh, kw): one fused reduce kernel, whose index arithmetic the simplifier folds
back to direct loads.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor


def _tuple(value: int | Sequence[int], n: int, name: str) -> tuple[int, ...]:
    out = (value,) * n if isinstance(value, int) else tuple(value)
    if len(out) != n or any(not isinstance(v, int) or v < 1 for v in out):
        raise ValueError(f"{name} must be a positive int or {n} positive ints, got {value!r}")
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
            raise ValueError(f"window of {kernel} (dilation {dilation}) does not fit a dimension of size {size}")
        lead = t.shape[:-1]
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
               padding: int | Sequence[int] = 0) -> Tensor:
        """PyTorch's conv2d (and conv1d/conv3d by the weight's rank): x (N, Cin, *spatial), weight
        (Cout, Cin/groups, *kernel), optional bias (Cout,)."""
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
        pads = _conv_padding(padding, n)
        x = t.pad(((0, 0), (0, 0), *pads)) if any(p != (0, 0) for p in pads) else t
        windows = x._windows(kernel, _tuple(stride, n, "stride"), _tuple(dilation, n, "dilation"))
        out_sp = windows.shape[2:2 + n]
        # (N, G, 1, Cin/G, *out, *k) * (1, G, Cout/G, Cin/G, 1.., *k), summed over (Cin/G, *k)
        xs = windows.reshape(batch, groups, 1, cin_group, *out_sp, *kernel)
        ws = weight.reshape(1, groups, cout // groups, cin_group, *([1] * n), *kernel)
        axes = (3, *range(4 + n, 4 + 2 * n))
        out = (xs * ws).sum(axes).reshape(batch, cout, *out_sp)
        return out if bias is None else out + bias.reshape(1, cout, *([1] * n))

    def _pool(self, n: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None,
              dilation: int | Sequence[int], padding: int | Sequence[int], pad_value: float) -> Tensor:
        """Windows over the last `n` dims, after padding them with `pad_value`."""
        t = self._t
        kernel = _tuple(kernel_size, n, "kernel_size")
        strides = kernel if stride is None else _tuple(stride, n, "stride")
        pads = _conv_padding(padding, n)
        x = t.pad(((0, 0),) * (t.ndim - n) + tuple(pads), value=pad_value) if any(p != (0, 0) for p in pads) \
            else t
        return x._windows(kernel, strides, _tuple(dilation, n, "dilation"))

    def max_pool2d(self, kernel_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
                   dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0) -> Tensor:
        """Max over windows (padding counts as -inf). Stride defaults to the kernel size, as in PyTorch."""
        t = self._t
        return t._pool(2, kernel_size, stride, dilation, padding, -math.inf).max((-2, -1))

    def avg_pool2d(self, kernel_size: int | Sequence[int] = 2, stride: int | Sequence[int] | None = None,
                   padding: int | Sequence[int] = 0, count_include_pad: bool = True) -> Tensor:
        """Mean over windows; with count_include_pad=False the padding is left out of each window's count."""
        t = self._t
        windows = t._pool(2, kernel_size, stride, 1, padding, 0.0)
        if count_include_pad:
            return windows.mean((-2, -1))
        counts = t.ones_like()._pool(2, kernel_size, stride, 1, padding, 0.0).sum((-2, -1))
        return windows.sum((-2, -1)) / counts
