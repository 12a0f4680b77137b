"""Neural-network layers on top of `Tensor`, with tinygrad's names and PyTorch's initialisation and state names.

In: sizes at construction; tensors shaped as PyTorch expects when called (`layer(x)`). Out: lazy tensors, built from
the functional ops of `Tensor` (`linear`, `conv2d`, `conv_transpose2d`, `batchnorm`, `layernorm`, `embedding`, ...),
so a layer's forward fuses with its neighbours like any other op.

Layers are plain objects: their tensors are attributes named as in PyTorch (`weight`, `bias`, `running_mean`,
`running_var`, `num_batches_tracked`), so `glassgrad.nn.state.get_state_dict(model)` gives PyTorch's keys and
`get_parameters(model)` finds everything an optimiser needs. Every tensor is created realized, in a buffer of its
own (random ones by `Tensor.uniform`/`Tensor.randn`, constant ones from a host array), so in-place updates of one
never touch another. Trained weights start with `requires_grad=None`, as in tinygrad: an optimiser turns them on,
and `backward()` fills their `.grad` anyway (tinygrad's backward does so for the tensors of the graph); running
statistics are `requires_grad=False` buffers.

Initialisation is PyTorch's default: Linear and convolution weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
(`kaiming_uniform_(a=sqrt(5))` works out to that bound), LSTMCell's weights and biases ~ U(-1/sqrt(hidden),
1/sqrt(hidden)), norm weights 1 and biases 0, Embedding ~ N(0, 1). (tinygrad starts LSTMCell's biases at 0 and draws
Embedding with glorot_uniform.)

The submodules `optim`, `state`, `lr`, `datasets` and `utils` (PyTorch's gradient clipping) are imported here too,
so `nn.optim.SGD` and `nn.utils.clip_grad_norm_` work after `from glassgrad import nn`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from glassgrad import amp
from glassgrad.dtype import DType, dtypes
from glassgrad.tensor import Tensor, mark_trainable, no_grad
from glassgrad.tensor_nn import _conv_padding, _string_padding, _tuple

__all__ = ["Linear", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "BatchNorm", "BatchNorm1d",
           "BatchNorm2d", "BatchNorm3d", "LayerNorm", "LayerNorm2d", "GroupNorm", "InstanceNorm", "RMSNorm",
           "Embedding", "LSTMCell", "Dropout"]

IntOrInts = int | Sequence[int]


# ---------------------------------------------------------------------- parameter creation
def _uniform(shape: tuple[int, ...], fan_in: int) -> Tensor:
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) in a fresh buffer (PyTorch's default for weights and biases)."""
    bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    with no_grad():  # drawn on the device, straight into the parameter's own buffer
        return mark_trainable(Tensor.empty(*shape).assign(Tensor.uniform(*shape, low=-bound, high=bound)).realize())


def _filled(shape: tuple[int, ...], value: float, dtype: DType | None = None,
            requires_grad: bool | None = None) -> Tensor:
    """A realized tensor of `value` in a buffer of its own (never the shared node that `Tensor.full` would be); a
    trainable parameter unless `requires_grad=False`. The dtype defaults to `dtypes.default_float` at creation, as
    for the random weights (a norm's weight of float32 in a float64 model would compute it in float32)."""
    with no_grad():
        t = Tensor.empty(*shape, dtype=dtypes.default_float if dtype is None else dtype)
        if requires_grad is False:
            t.requires_grad = False
        t.assign(value).realize()
    return t if requires_grad is False else mark_trainable(t)


# ---------------------------------------------------------------------- dense and convolutional layers
class Linear:
    """y = x @ weight.T + bias. weight (out_features, in_features), bias (out_features,). Under
    `glassgrad.amp.autocast(dtype)` computed (and returned) in that half dtype, the weights staying float32."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        self.weight = _uniform((out_features, in_features), in_features)
        self.bias = _uniform((out_features,), in_features) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return amp.linear(x, self.weight.T, self.bias)


def _conv_padding_arg(padding: IntOrInts | str, kernel: tuple[int, ...], dilation: tuple[int, ...],
                      stride: tuple[int, ...]) -> IntOrInts:
    """'valid' -> 0; 'same' -> per-side pads (the odd pixel at the end, as PyTorch), in conv2d's flat form
    (last dim first); ints pass through."""
    return padding if not isinstance(padding, str) else _string_padding(padding, kernel, dilation, stride)


def _conv_geometry(in_channels: int, out_channels: int, groups: int, kernel_size: IntOrInts, stride: IntOrInts,
                   dilation: IntOrInts, dims: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Check the channel/group arithmetic of a convolution layer; (kernel_size, stride, dilation) as tuples."""
    if groups < 1 or in_channels % groups or out_channels % groups:
        raise ValueError(f"in_channels {in_channels} and out_channels {out_channels} must be multiples of "
                         f"groups {groups}")
    return (_tuple(kernel_size, dims, "kernel_size"), _tuple(stride, dims, "stride"),
            _tuple(dilation, dims, "dilation"))


CONV_PADDING_MODES = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}


class _ConvNd:
    """A convolution over the last `dims` dims: weight (out, in/groups, *kernel), bias (out,). PyTorch's
    `padding_mode` ("zeros", "reflect", "replicate", "circular") says what the padding is filled with."""
    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrInts, stride: IntOrInts = 1,
                 padding: IntOrInts | str = 0, dilation: IntOrInts = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros") -> None:
        self.kernel_size, self.stride, self.dilation = _conv_geometry(in_channels, out_channels, groups, kernel_size,
                                                                      stride, dilation, self.dims)
        self.padding = _conv_padding_arg(padding, self.kernel_size, self.dilation, self.stride)
        if padding_mode not in CONV_PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {tuple(CONV_PADDING_MODES)}, got {padding_mode!r}")
        self.groups, self.padding_mode = groups, padding_mode
        fan_in = in_channels // groups * math.prod(self.kernel_size)
        self.weight = _uniform((out_channels, in_channels // groups, *self.kernel_size), fan_in)
        self.bias = _uniform((out_channels,), fan_in) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        if self.padding_mode == "zeros":
            return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)
        pads = _conv_padding(self.padding, self.dims)  # (before, after) per spatial dim, the first one first
        x = x.pad(((0, 0),) * (x.ndim - self.dims) + tuple(pads), mode=CONV_PADDING_MODES[self.padding_mode])
        return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, 0)


class Conv2d(_ConvNd):
    """2-D convolution of (N, C, H, W) images (PyTorch's Conv2d; padding may also be 'same' or 'valid')."""
    dims = 2


class Conv1d(_ConvNd):
    """1-D convolution of (N, C, L) sequences (PyTorch's Conv1d)."""
    dims = 1


class _ConvTransposeNd:
    """A transposed convolution over the last `dims` dims: weight (in, out/groups, *kernel), bias (out,).
    Arguments in tinygrad's order (PyTorch puts groups, bias, dilation after output_padding): pass them by name."""
    dims = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrInts, stride: IntOrInts = 1,
                 padding: IntOrInts = 0, output_padding: IntOrInts = 0, dilation: IntOrInts = 1, groups: int = 1,
                 bias: bool = True) -> None:
        self.kernel_size, self.stride, self.dilation = _conv_geometry(in_channels, out_channels, groups, kernel_size,
                                                                      stride, dilation, self.dims)
        self.output_padding = _tuple(output_padding, self.dims, "output_padding", minimum=0)
        self.padding, self.groups = padding, groups
        fan_in = out_channels // groups * math.prod(self.kernel_size)  # PyTorch takes fan_in from weight dim 1
        self.weight = _uniform((in_channels, out_channels // groups, *self.kernel_size), fan_in)
        self.bias = _uniform((out_channels,), fan_in) if bias else None

    def __call__(self, x: Tensor) -> Tensor:
        return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding,
                                  self.output_padding)


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution (PyTorch's ConvTranspose2d)."""
    dims = 2


class ConvTranspose1d(_ConvTransposeNd):
    """1-D transposed convolution (PyTorch's ConvTranspose1d)."""
    dims = 1


# ---------------------------------------------------------------------- normalisation
class BatchNorm:
    """Batch normalisation over dim 1 of (N, C, ...) inputs (BatchNorm1d/2d/3d alike), PyTorch's semantics:

    - training (`Tensor.training`), or track_running_stats=False: normalise with the batch's mean and biased
      variance over every dim but 1. With running stats, also update them in place (`assign`, detached):
      running = (1 - momentum) * running + momentum * batch, the variance unbiased (n/(n-1)), and count
      `num_batches_tracked`; momentum=None averages all batches so far (factor 1/num_batches_tracked).
    - eval with running stats: normalise with running_mean and running_var (one elementwise kernel).

    The updates are lazy like everything else: they happen when the running stats are realized (an optimiser's
    `step()` realizes them with the parameters, since `get_parameters` lists them as buffers). A training forward
    that finds the previous step's updates still pending realizes them first, so the buffers keep their identity."""

    def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True,
                 momentum: float | None = 0.1) -> None:
        self.sz, self.eps, self.momentum, self.track_running_stats = sz, eps, momentum, track_running_stats
        self.weight = _filled((sz,), 1.0) if affine else None
        self.bias = _filled((sz,), 0.0) if affine else None
        self.running_mean: Tensor | None = None
        self.running_var: Tensor | None = None
        self.num_batches_tracked: Tensor | None = None
        if track_running_stats:
            self.running_mean = _filled((sz,), 0.0, requires_grad=False)
            self.running_var = _filled((sz,), 1.0, requires_grad=False)
            self.num_batches_tracked = _filled((), 0, dtypes.int64, requires_grad=False)

    def calc_stats(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """The batch's per-channel mean and biased variance, both (C,). The mean is detached inside the variance:
        d var / d mean = -2 * mean(x - mean) = 0, so the gradient is unchanged and the backward graph smaller."""
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean = x.mean(axes)
        centered = x - mean.detach().reshape(1, -1, *([1] * (x.ndim - 2)))
        return mean, (centered * centered).mean(axes)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.sz:
            raise ValueError(f"BatchNorm({self.sz}) needs input (N, {self.sz}, ...), got {x.shape}")
        if self.running_mean is not None and self.running_var is not None and not Tensor.training:
            return x.batchnorm(self.weight, self.bias, self.running_mean, (self.running_var + self.eps).rsqrt())
        count = x.numel() // self.sz
        if count <= 1 and Tensor.training:
            raise ValueError(f"BatchNorm in training needs more than 1 value per channel, got input {x.shape}")
        mean, var = self.calc_stats(x)
        if Tensor.training and self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), count)
        return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())

    def _update_running_stats(self, mean: Tensor, var: Tensor, count: int) -> None:
        """Queue the in-place updates of running_mean, running_var and num_batches_tracked (mean, var detached).
        The count is assigned first and momentum=None reads the *new* count, so realizing the three buffers
        separately, in any order, never reads a version that an assign has overwritten."""
        assert self.running_mean is not None and self.running_var is not None and self.num_batches_tracked is not None
        with no_grad():  # a previous step's updates still pending (no optimiser step in between): apply them first,
            # since assigning onto a pending assign would move the tensor to a new buffer (see Tensor.assign)
            Tensor.realize_all(self.running_mean, self.running_var, self.num_batches_tracked)
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        factor: Tensor | float = self.momentum if self.momentum is not None else \
            1 / self.num_batches_tracked.cast(dtypes.float32)
        unbiased = var * (count / (count - 1))
        self.running_mean.assign((1 - factor) * self.running_mean + factor * mean)
        self.running_var.assign((1 - factor) * self.running_var + factor * unbiased)


BatchNorm1d = BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
    """Normalise over the last len(normalized_shape) dims, then * weight + bias (both normalized_shape)."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.eps = eps
        self.weight = _filled(self.normalized_shape, 1.0) if elementwise_affine else None
        self.bias = _filled(self.normalized_shape, 0.0) if elementwise_affine and bias else None

    def __call__(self, x: Tensor) -> Tensor:
        n = len(self.normalized_shape)
        if x.shape[x.ndim - n:] != self.normalized_shape:
            raise ValueError(f"LayerNorm{self.normalized_shape} got input {x.shape}")
        out = x.layernorm(tuple(range(-n, 0)), self.eps)
        if self.weight is not None:
            out = out * self.weight
        return out if self.bias is None else out + self.bias


class LayerNorm2d(LayerNorm):
    """LayerNorm over the channels of (N, C, H, W) images, at each position (tinygrad's; ConvNeXt's and SAM's
    channels-first LayerNorm): normalized_shape is C, weight and bias (C,)."""

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim != 4:
            raise ValueError(f"LayerNorm2d{self.normalized_shape} needs input (N, C, H, W), got {x.shape}")
        return super().__call__(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _channel_affine_params(channels: int, affine: bool) -> tuple[Tensor | None, Tensor | None]:
    """A per-channel norm's (weight, bias): ones and zeros of shape (C,), or (None, None) without `affine`."""
    return (_filled((channels,), 1.0), _filled((channels,), 0.0)) if affine else (None, None)


def _grouped_norm(x: Tensor, groups: int, eps: float, weight: Tensor | None, bias: Tensor | None) -> Tensor:
    """Normalise (N, C, ...) over each of `groups` groups of channels of each sample (their channels and positions),
    then * weight + bias per channel (both (C,); skipped when either is None)."""
    out = x.reshape(x.shape[0], groups, -1).layernorm(-1, eps).reshape(x.shape)
    if weight is None or bias is None:
        return out
    shape = (1, -1, *([1] * (out.ndim - 2)))
    return out * weight.reshape(shape) + bias.reshape(shape)


class GroupNorm:
    """Split the channels of (N, C, ...) into num_groups groups, normalise each group of each sample over its
    channels and positions, then * weight + bias per channel (both (C,))."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        if num_groups < 1 or num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_channels {num_channels} must be a multiple of num_groups {num_groups}")
        self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
        self.weight, self.bias = _channel_affine_params(num_channels, affine)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}) needs input (N, "
                             f"{self.num_channels}, ...), got {x.shape}")
        return _grouped_norm(x, self.num_groups, self.eps, self.weight, self.bias)


class InstanceNorm:
    """Normalise each channel of each sample of (N, C, ...) over its positions (mean and biased variance), then
    * weight + bias per channel (both (C,)). tinygrad's signature, so affine defaults to True (PyTorch's
    InstanceNorm1d/2d/3d default to affine=False); no running statistics (PyTorch's default too)."""

    def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
        self.num_features, self.eps = num_features, eps
        self.weight, self.bias = _channel_affine_params(num_features, affine)

    def __call__(self, x: Tensor) -> Tensor:
        if x.ndim < 3 or x.shape[1] != self.num_features:
            raise ValueError(f"InstanceNorm({self.num_features}) needs input (N, {self.num_features}, positions...), "
                             f"got {x.shape}")
        return _grouped_norm(x, self.num_features, self.eps, self.weight, self.bias)  # a group per channel


class RMSNorm:
    """x / sqrt(mean(x^2 over the last dim) + eps) * weight, computed in float32 and cast back (tinygrad's)."""

    def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True) -> None:
        self.eps = eps
        self.weight = _filled((dim,), 1.0) if elementwise_affine else None

    def __call__(self, x: Tensor) -> Tensor:
        xf = x.float()
        out = (xf * ((xf * xf).mean(-1, keepdim=True) + self.eps).rsqrt()).cast(x.dtype)
        return out if self.weight is None else out * self.weight


# ---------------------------------------------------------------------- lookup and regularisation
class Embedding:
    """Rows of weight (vocab_size, embed_size) picked by int indices: (*idx) -> (*idx, embed_size)."""

    def __init__(self, vocab_size: int, embed_size: int) -> None:
        self.vocab_sz, self.embed_sz = vocab_size, embed_size
        with no_grad():
            self.weight = mark_trainable(Tensor.empty(vocab_size, embed_size).assign(
                Tensor.randn(vocab_size, embed_size)).realize())

    def __call__(self, idx: Tensor) -> Tensor:
        return idx.embedding(self.weight)


# ---------------------------------------------------------------------- recurrent
class LSTMCell:
    """One LSTM step, PyTorch's LSTMCell: gates = x @ weight_ih.T + bias_ih + h @ weight_hh.T + bias_hh, split into
    (input, forget, cell, output) chunks of hidden_size; c' = sigmoid(f) * c + sigmoid(i) * tanh(g) and
    h' = sigmoid(o) * tanh(c'). Called as `cell(x, (h, c))` or `cell(x)` (zero state); returns (h', c').
    x is (N, input_size), or (input_size,) unbatched as in PyTorch. Every weight and bias ~ U(-1/sqrt(hidden),
    1/sqrt(hidden)) (PyTorch's init; tinygrad starts the biases at 0)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True) -> None:
        self.input_size, self.hidden_size = input_size, hidden_size
        self.weight_ih = _uniform((4 * hidden_size, input_size), hidden_size)
        self.weight_hh = _uniform((4 * hidden_size, hidden_size), hidden_size)
        self.bias_ih = _uniform((4 * hidden_size,), hidden_size) if bias else None
        self.bias_hh = _uniform((4 * hidden_size,), hidden_size) if bias else None

    def __call__(self, x: Tensor, hc: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        if x.ndim not in (1, 2) or x.shape[-1] != self.input_size:
            raise ValueError(f"LSTMCell({self.input_size}, {self.hidden_size}) needs input (N, {self.input_size}) "
                             f"or ({self.input_size},), got {x.shape}")
        if x.ndim == 1:
            h, c = self(x.unsqueeze(0), None if hc is None else (hc[0].unsqueeze(0), hc[1].unsqueeze(0)))
            return h.squeeze(0), c.squeeze(0)
        if hc is None:
            zeros = Tensor.zeros(x.shape[0], self.hidden_size, dtype=x.dtype, device=x.device)
            hc = (zeros, zeros)
        want = (x.shape[0], self.hidden_size)
        if hc[0].shape != want or hc[1].shape != want:
            raise ValueError(f"LSTMCell state (h, c) must both be {want}, got {hc[0].shape} and {hc[1].shape}")
        gates = x.linear(self.weight_ih.T, self.bias_ih) + hc[0].linear(self.weight_hh.T, self.bias_hh)
        i, f, g, o = gates.chunk(4, dim=1)
        c = f.sigmoid() * hc[1] + i.sigmoid() * g.tanh()
        return o.sigmoid() * c.tanh(), c


class Dropout:
    """Zero each element with probability p and scale the rest by 1/(1-p), only while `Tensor.training`."""

    def __init__(self, p: float = 0.5) -> None:
        if not 0 <= p <= 1:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def __call__(self, x: Tensor) -> Tensor:
        return x.dropout(self.p)


from glassgrad.nn import datasets, lr, optim, state, utils  # noqa: E402, F401  (submodules, as tinygrad's nn has them)
