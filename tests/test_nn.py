"""Layers of glassgrad.nn: forward values against torch.nn with the same weights copied in (when PyTorch is
importable) and numpy references (always), BatchNorm's training/eval behaviour and running statistics over several
steps, initialisation ranges and statistics, parameters in buffers of their own, state-dict names that line up with
PyTorch's, kernel counts, and a tiny CNN whose gradients match PyTorch's and finite differences."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_nn_functional import np_batchnorm, np_conv, np_conv_transpose, np_max_pool, numerical_grads
from torch_optional import needs_torch, torch

from glassgrad import GlobalCounters, Tensor, dtypes, kernels, nn
from glassgrad.nn.optim import SGD
from glassgrad.nn.state import get_parameters, get_state_dict, load_state_dict
from glassgrad.uop.ops import Ops


def _rand(shape: tuple[int, ...], seed: int, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)


def _copy_to_torch(layer: Any, t_layer: Any) -> None:
    """Load the glassgrad layer's state dict into the torch layer (names and shapes must agree)."""
    state = {k: torch.tensor(v.numpy()) for k, v in get_state_dict(layer).items()}
    t_layer.load_state_dict(state, strict=True)


def _check_layer(layer: Any, x: np.ndarray, np_ref: Callable[[np.ndarray], np.ndarray],
                 torch_layer: Callable[[], Any] | None, atol: float = 1e-5) -> None:
    """layer(x) against np_ref(x) (always) and torch_layer()(x) with the layer's weights copied in."""
    got = layer(Tensor(x)).numpy()
    np.testing.assert_allclose(got, np_ref(x), atol=atol, rtol=1e-4, err_msg="vs numpy")
    if torch is not None and torch_layer is not None:
        t_layer = torch_layer()
        _copy_to_torch(layer, t_layer)
        with torch.no_grad():
            np.testing.assert_allclose(got, t_layer(torch.tensor(x)).numpy(), atol=atol, rtol=1e-4, err_msg="vs torch")


def _np_params(layer: Any) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in get_state_dict(layer).items()}


# ---------------------------------------------------------------------- dense and convolutional layers
@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias: bool) -> None:
    layer = nn.Linear(6, 4, bias=bias)
    p = _np_params(layer)
    _check_layer(layer, _rand((3, 2, 6), 0), lambda x: x @ p["weight"].T + p.get("bias", 0),
                 (lambda: torch.nn.Linear(6, 4, bias=bias)) if torch else None)


CONV_CASES = [
    (3, 4, 3, {}), (4, 6, (3, 2), dict(stride=2, padding=1, groups=2, bias=False)),
    (2, 3, 3, dict(dilation=2, padding=(2, 1))), (3, 4, (3, 4), dict(padding="same", dilation=(1, 2))),
    (3, 3, 3, dict(padding="valid", groups=3)),
]


@pytest.mark.parametrize("cin, cout, k, kw", CONV_CASES)
def test_conv2d(cin: int, cout: int, k: Any, kw: dict[str, Any]) -> None:
    layer = nn.Conv2d(cin, cout, k, **kw)
    p = _np_params(layer)
    conv_kw = {a: layer.__dict__[a] for a in ("stride", "padding", "dilation", "groups")}
    _check_layer(layer, _rand((2, cin, 7, 8), 0), lambda x: np_conv(x, p["weight"], p.get("bias"), **conv_kw),
                 (lambda: torch.nn.Conv2d(cin, cout, k, **kw)) if torch else None)


def test_conv1d() -> None:
    layer = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)
    p = _np_params(layer)
    assert p["weight"].shape == (6, 2, 3)
    _check_layer(layer, _rand((2, 4, 11), 0), lambda x: np_conv(x, p["weight"], p["bias"], 2, 1, 1, 2),
                 (lambda: torch.nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)) if torch else None)


@pytest.mark.parametrize("kw", [{}, dict(stride=2, padding=1, output_padding=1), dict(stride=2, groups=2, dilation=2)])
def test_conv_transpose2d(kw: dict[str, Any]) -> None:
    layer = nn.ConvTranspose2d(4, 6, 3, **kw)
    p = _np_params(layer)
    assert p["weight"].shape == (4, 6 // kw.get("groups", 1), 3, 3)
    _check_layer(layer, _rand((2, 4, 5, 4), 0), lambda x: np_conv_transpose(x, p["weight"], p["bias"], **kw),
                 (lambda: torch.nn.ConvTranspose2d(4, 6, 3, **kw)) if torch else None)


def test_conv_transpose1d() -> None:
    layer = nn.ConvTranspose1d(3, 2, 4, stride=2, padding=1)
    p = _np_params(layer)
    _check_layer(layer, _rand((2, 3, 6), 0), lambda x: np_conv_transpose(x, p["weight"], p["bias"], 2, 1),
                 (lambda: torch.nn.ConvTranspose1d(3, 2, 4, stride=2, padding=1)) if torch else None)


def test_conv_layer_errors() -> None:
    with pytest.raises(ValueError, match="groups"):
        nn.Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="same"):
        nn.Conv2d(3, 4, 3, stride=2, padding="same")
    with pytest.raises(ValueError, match="padding"):
        nn.Conv2d(3, 4, 3, padding="full")


# ---------------------------------------------------------------------- batch norm
class _NumpyBatchNorm:
    """PyTorch's BatchNorm rules in numpy (float64), the reference when PyTorch is absent."""

    def __init__(self, sz: int, eps: float, momentum: float | None) -> None:
        self.mean, self.var, self.count = np.zeros(sz), np.ones(sz), 0
        self.eps, self.momentum = eps, momentum

    def __call__(self, x: np.ndarray, w: np.ndarray, b: np.ndarray, training: bool) -> np.ndarray:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        if not training:
            return np_batchnorm(x, w, b, self.mean, 1 / np.sqrt(self.var + self.eps))
        mean, var, n = x.mean(axes), x.var(axes), x.size // x.shape[1]
        self.count += 1
        f = self.momentum if self.momentum is not None else 1 / self.count
        self.mean = (1 - f) * self.mean + f * mean
        self.var = (1 - f) * self.var + f * var * n / (n - 1)
        return np_batchnorm(x, w, b, mean, 1 / np.sqrt(var + self.eps))


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (4, 3, 4, 4)])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_train_eval_and_running_stats(shape: tuple[int, ...], momentum: float | None) -> None:
    bn = nn.BatchNorm(3, momentum=momentum)
    bn.weight.assign(Tensor(_rand((3,), 1, 0.5, 1.5))).realize()
    bn.bias.assign(Tensor(_rand((3,), 2))).realize()
    w, b = bn.weight.numpy(), bn.bias.numpy()
    ref = _NumpyBatchNorm(3, 1e-5, momentum)
    t_bn = None if torch is None else \
        (torch.nn.BatchNorm2d if len(shape) == 4 else torch.nn.BatchNorm1d)(3, momentum=momentum)
    if t_bn is not None:
        _copy_to_torch(bn, t_bn)
    for step in range(4):
        x = _rand(shape, 10 + step, -2, 3)
        training = step < 3
        with Tensor.train(training):
            out = bn(Tensor(x))
        Tensor.realize_all(out, bn.running_mean, bn.running_var, bn.num_batches_tracked)
        np.testing.assert_allclose(out.numpy(), ref(x.astype(np.float64), w, b, training), atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(bn.running_mean.numpy(), ref.mean, atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(bn.running_var.numpy(), ref.var, atol=1e-6, rtol=1e-5)
        assert bn.num_batches_tracked.item() == ref.count
        if t_bn is not None:
            t_bn.train(training)
            with torch.no_grad():
                np.testing.assert_allclose(out.numpy(), t_bn(torch.tensor(x)).numpy(), atol=1e-5, rtol=1e-4)
            np.testing.assert_allclose(bn.running_mean.numpy(), t_bn.running_mean.numpy(), atol=1e-6, rtol=1e-5)
            np.testing.assert_allclose(bn.running_var.numpy(), t_bn.running_var.numpy(), atol=1e-6, rtol=1e-5)
            assert bn.num_batches_tracked.item() == t_bn.num_batches_tracked.item()


def test_batchnorm_updates_are_in_place_detached_and_lazy() -> None:
    bn = nn.BatchNorm2d(2)
    buffers = {k: v.uop.base.arg[0] for k, v in get_state_dict(bn).items()}
    xs = [_rand((3, 2, 2, 2), s, -1, 4) for s in range(3)]
    ref = _NumpyBatchNorm(2, 1e-5, 0.1)
    for x in xs:  # three training forwards, nothing realized in between
        with Tensor.train():
            bn(Tensor(x))
        ref(x.astype(np.float64), np.ones(2), np.zeros(2), True)
    Tensor.realize_all(bn.running_mean, bn.running_var, bn.num_batches_tracked)
    np.testing.assert_allclose(bn.running_mean.numpy(), ref.mean, rtol=1e-5)
    np.testing.assert_allclose(bn.running_var.numpy(), ref.var, rtol=1e-5)
    assert bn.num_batches_tracked.item() == 3
    assert {k: v.uop.base.arg[0] for k, v in get_state_dict(bn).items()} == buffers  # the same buffers
    assert bn.running_mean.requires_grad is False and bn.running_var.requires_grad is False
    x = Tensor(xs[0], requires_grad=True)
    with Tensor.train():
        loss = bn(x).square().sum()
    loss.backward()  # the running stats take no part in the gradient
    assert x.grad is not None and bn.running_mean.grad is None


def test_batchnorm_without_affine_or_running_stats() -> None:
    x = _rand((4, 3, 5), 0, -1, 2)
    axes = (0, 2)
    normed = (x - x.mean(axes, keepdims=True)) / np.sqrt(x.var(axes, keepdims=True) + 1e-5)
    plain = nn.BatchNorm1d(3, affine=False, track_running_stats=False)
    assert get_state_dict(plain) == {}
    for training in (True, False):  # no running stats: batch statistics in eval too, as PyTorch
        with Tensor.train(training):
            np.testing.assert_allclose(plain(Tensor(x)).numpy(), normed, atol=1e-5)
    no_affine = nn.BatchNorm1d(3, affine=False)
    assert sorted(get_state_dict(no_affine)) == ["num_batches_tracked", "running_mean", "running_var"]
    with Tensor.train():
        np.testing.assert_allclose(no_affine(Tensor(x)).numpy(), normed, atol=1e-5)
    if torch is not None:
        t_bn = torch.nn.BatchNorm1d(3, affine=False, track_running_stats=False).eval()
        np.testing.assert_allclose(plain(Tensor(x)).numpy(), t_bn(torch.tensor(x)).numpy(), atol=1e-5)


def test_batchnorm_errors() -> None:
    bn = nn.BatchNorm2d(3)
    with pytest.raises(ValueError, match=r"\(N, 3"):
        bn(Tensor(_rand((2, 4, 3, 3), 0)))
    with Tensor.train(), pytest.raises(ValueError, match="more than 1 value"):
        bn(Tensor(_rand((1, 3, 1, 1), 0)))


def test_batchnorm_kernel_counts() -> None:
    bn = nn.BatchNorm2d(4)
    x = Tensor(_rand((8, 4, 6, 6), 0)).realize()
    with Tensor.train():
        out = bn(x)
    # batch mean, batch variance, normalise; updating the three running buffers is one small kernel each
    assert len(kernels(out)) == 3
    GlobalCounters.reset()
    Tensor.realize_all(out, bn.running_mean, bn.running_var, bn.num_batches_tracked)
    assert GlobalCounters.kernel_count == 6
    assert len(kernels(bn(x))) == 1  # eval: one elementwise kernel


# ---------------------------------------------------------------------- other norms, embedding, dropout
def _np_layernorm(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mean = x.mean(axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)


@pytest.mark.parametrize("shape, affine", [((5,), True), ((3, 5), True), ((5,), False)])
def test_layernorm(shape: tuple[int, ...], affine: bool) -> None:
    layer = nn.LayerNorm(shape[0] if len(shape) == 1 else shape, eps=1e-5, elementwise_affine=affine)
    if affine:
        layer.weight.assign(Tensor(_rand(shape, 1))).realize()
        layer.bias.assign(Tensor(_rand(shape, 2))).realize()
    p = _np_params(layer)
    axes = tuple(range(-len(shape), 0))
    _check_layer(layer, _rand((2, 4, *shape), 0, -2, 3),
                 lambda x: _np_layernorm(x, axes, 1e-5) * p.get("weight", 1) + p.get("bias", 0),
                 (lambda: torch.nn.LayerNorm(shape, eps=1e-5, elementwise_affine=affine)) if torch else None)


@pytest.mark.parametrize("groups, affine", [(1, True), (2, True), (6, False)])
def test_groupnorm(groups: int, affine: bool) -> None:
    layer = nn.GroupNorm(groups, 6, eps=1e-5, affine=affine)
    if affine:
        layer.weight.assign(Tensor(_rand((6,), 1))).realize()
        layer.bias.assign(Tensor(_rand((6,), 2))).realize()
    p = _np_params(layer)

    def ref(x: np.ndarray) -> np.ndarray:
        out = _np_layernorm(x.reshape(x.shape[0], groups, -1), (-1,), 1e-5).reshape(x.shape)
        return out * p["weight"].reshape(1, 6, 1, 1) + p["bias"].reshape(1, 6, 1, 1) if affine else out

    _check_layer(layer, _rand((3, 6, 4, 5), 0, -2, 3), ref,
                 (lambda: torch.nn.GroupNorm(groups, 6, eps=1e-5, affine=affine)) if torch else None)
    with pytest.raises(ValueError, match="multiple"):
        nn.GroupNorm(4, 6)


def test_rmsnorm() -> None:
    layer = nn.RMSNorm(5, eps=1e-6)
    layer.weight.assign(Tensor(_rand((5,), 1))).realize()
    w = layer.weight.numpy()
    _check_layer(layer, _rand((2, 3, 5), 0, -2, 3), lambda x: x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w,
                 (lambda: torch.nn.RMSNorm(5, eps=1e-6)) if torch else None)
    half = nn.RMSNorm(5, elementwise_affine=False)(Tensor(_rand((2, 5), 0)).half())
    assert half.dtype == dtypes.float16 and get_state_dict(nn.RMSNorm(5, elementwise_affine=False)) == {}


def test_embedding_layer() -> None:
    layer = nn.Embedding(11, 4)
    w = layer.weight.numpy()
    idx = np.random.default_rng(0).integers(0, 11, (2, 7)).astype(np.int32)
    got = layer(Tensor(idx)).numpy()
    np.testing.assert_array_equal(got, w[idx])
    if torch is not None:
        t_layer = torch.nn.Embedding(11, 4)
        _copy_to_torch(layer, t_layer)
        np.testing.assert_array_equal(got, t_layer(torch.tensor(idx, dtype=torch.int64)).detach().numpy())


def test_dropout_layer() -> None:
    layer = nn.Dropout(0.25)
    x = Tensor(np.ones((100, 100), np.float32))
    np.testing.assert_array_equal(layer(x).numpy(), 1)
    with Tensor.train():
        out = layer(x).numpy()
    assert set(np.unique(out)) <= {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.03
    with pytest.raises(ValueError, match="probability"):
        nn.Dropout(1.5)


# ---------------------------------------------------------------------- tinygrad's other layers
def _grads_vs_torch(layer: Any, t_layer: Any, inputs: list[np.ndarray], call: Callable[..., Any],
                    t_call: Callable[..., Any], atol: float = 1e-5) -> None:
    """Outputs of call(layer, *inputs) and t_call(t_layer, *inputs) (a tensor or a tuple of them), and the gradients
    of sum(out_k * w_k) over random w_k with respect to every input and every parameter, glassgrad against torch."""
    _copy_to_torch(layer, t_layer)
    xs = [Tensor(a, requires_grad=True) for a in inputs]
    txs = [torch.tensor(a, requires_grad=True) for a in inputs]
    outs, t_outs = call(layer, *xs), t_call(t_layer, *txs)
    outs, t_outs = (outs, t_outs) if isinstance(outs, tuple) else ((outs,), (t_outs,))
    ws = [_rand(tuple(o.shape), 50 + k) for k, o in enumerate(outs)]
    for o, t_o in zip(outs, t_outs):
        np.testing.assert_allclose(o.numpy(), t_o.detach().numpy(), atol=atol, rtol=1e-4, err_msg="forward")
    sum(((o * Tensor(w)).sum() for o, w in zip(outs, ws)), Tensor(0.0)).backward()
    sum((t_o * torch.tensor(w)).sum() for t_o, w in zip(t_outs, ws)).backward()
    for k, (x, tx) in enumerate(zip(xs, txs)):
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=atol, rtol=1e-4, err_msg=f"input {k}")
    t_params = dict(t_layer.named_parameters())
    for name, param in get_state_dict(layer).items():
        np.testing.assert_allclose(param.grad.numpy(), t_params[name].grad.numpy(), atol=atol, rtol=1e-4,
                                   err_msg=name)


@pytest.mark.parametrize("shape, affine", [((3, 4, 10), True), ((2, 4, 5, 6), True), ((2, 4, 5, 6), False),
                                           ((2, 4, 3, 2, 3), True)])
def test_instancenorm(shape: tuple[int, ...], affine: bool) -> None:
    """tinygrad's InstanceNorm (affine by default): each (sample, channel) normalised over its positions."""
    layer = nn.InstanceNorm(4, eps=1e-5, affine=affine)
    assert (layer.weight is not None) == affine and nn.InstanceNorm(4).weight is not None
    if affine:
        layer.weight.assign(Tensor(_rand((4,), 1))).realize()
        layer.bias.assign(Tensor(_rand((4,), 2))).realize()
    p = _np_params(layer)
    per_channel = (1, 4, *([1] * (len(shape) - 2)))

    def ref(x: np.ndarray) -> np.ndarray:
        out = _np_layernorm(x, tuple(range(2, x.ndim)), 1e-5)
        return out * p["weight"].reshape(per_channel) + p["bias"].reshape(per_channel) if affine else out

    t_class = {3: "InstanceNorm1d", 4: "InstanceNorm2d", 5: "InstanceNorm3d"}[len(shape)]
    make = (lambda: getattr(torch.nn, t_class)(4, eps=1e-5, affine=affine)) if torch else None
    x = _rand(shape, 0, -2, 3)
    _check_layer(layer, x, ref, make)
    if torch is not None and affine:
        _grads_vs_torch(layer, make(), [x], lambda m, a: m(a), lambda m, a: m(a))
    with pytest.raises(ValueError, match=r"InstanceNorm\(4\).*\(2, 3, 5\)"):
        layer(Tensor(_rand((2, 3, 5), 0)))


def test_layernorm2d() -> None:
    """tinygrad's LayerNorm2d: LayerNorm over the channels of (N, C, H, W), at each position."""
    layer = nn.LayerNorm2d(4, eps=1e-6)
    layer.weight.assign(Tensor(_rand((4,), 1))).realize()
    layer.bias.assign(Tensor(_rand((4,), 2))).realize()
    p = _np_params(layer)
    # seed 5 with a ramp over the channels: every position's variance over C is >= 0.7 (a tiny one makes the
    # gradient ill-conditioned, and float32 glassgrad and torch then differ by more than rounding)
    x = _rand((2, 4, 4, 5), 5, -2, 3) + np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)

    def ref(a: np.ndarray) -> np.ndarray:
        return _np_layernorm(a, (1,), 1e-6) * p["weight"].reshape(1, 4, 1, 1) + p["bias"].reshape(1, 4, 1, 1)

    _check_layer(layer, x, ref, None)
    if torch is not None:
        def t_call(m: Any, a: Any) -> Any:
            return m(a.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        _grads_vs_torch(layer, torch.nn.LayerNorm(4, eps=1e-6), [x], lambda m, a: m(a), t_call)
    assert nn.LayerNorm2d(3).normalized_shape == (3,)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\).*\(2, 4\)"):
        layer(Tensor(_rand((2, 4), 0)))


@pytest.mark.parametrize("bias", [True, False])
def test_lstmcell_matches_torch(bias: bool) -> None:
    """LSTMCell(x, (h, c)) -> (h', c') with PyTorch's gate order and names; two chained steps, forward and
    gradients of every weight and of x, h0, c0 against torch.nn.LSTMCell with the same weights."""
    cell = nn.LSTMCell(5, 4, bias=bias)
    names = ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if bias else [])
    assert list(get_state_dict(cell)) == names
    bound = 1 / math.sqrt(4)
    assert all(np.abs(v.numpy()).max() <= bound for v in get_state_dict(cell).values())
    x1, x2, h0, c0 = _rand((3, 5), 0), _rand((3, 5), 1), _rand((3, 4), 2), _rand((3, 4), 3)
    p = _np_params(cell)

    def np_step(x: np.ndarray, h: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gates = x @ p["weight_ih"].T + h @ p["weight_hh"].T + (p["bias_ih"] + p["bias_hh"] if bias else 0)
        i, f, g, o = np.split(gates, 4, axis=1)
        sig = lambda z: 1 / (1 + np.exp(-z))  # noqa: E731
        c2 = sig(f) * c + sig(i) * np.tanh(g)
        return sig(o) * np.tanh(c2), c2

    h, c = cell(Tensor(x1), (Tensor(h0), Tensor(c0)))
    for got, want in zip((h, c), np_step(x1, h0, c0)):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5, rtol=1e-4)
    zero_h, zero_c = cell(Tensor(x1))
    for got, want in zip((zero_h, zero_c), np_step(x1, np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32))):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5, rtol=1e-4)
    one_h, one_c = cell(Tensor(x1[0]), (Tensor(h0[0]), Tensor(c0[0])))  # unbatched, as PyTorch
    assert one_h.shape == one_c.shape == (4,)
    np.testing.assert_allclose(one_h.numpy(), h.numpy()[0], atol=1e-6)
    if torch is not None:
        def two_steps(m: Any, a: Any, b: Any, h: Any, c: Any) -> Any:
            return m(b, m(a, (h, c)))
        _grads_vs_torch(cell, torch.nn.LSTMCell(5, 4, bias=bias), [x1, x2, h0, c0], two_steps, two_steps)


def test_lstmcell_errors() -> None:
    cell = nn.LSTMCell(5, 4)
    with pytest.raises(ValueError, match=r"LSTMCell\(5, 4\).*\(3, 6\)"):
        cell(Tensor(_rand((3, 6), 0)))
    with pytest.raises(ValueError, match=r"\(3, 4\).*\(2, 4\)"):
        cell(Tensor(_rand((3, 5), 0)), (Tensor(_rand((2, 4), 0)), Tensor(_rand((2, 4), 0))))


def test_batchnorm3d_is_batchnorm() -> None:
    assert nn.BatchNorm3d is nn.BatchNorm
    bn = nn.BatchNorm3d(2)
    x = _rand((2, 2, 3, 2, 2), 0)
    with Tensor.train():
        out = bn(Tensor(x)).numpy()
    mean, var = x.mean((0, 2, 3, 4), keepdims=True), x.var((0, 2, 3, 4), keepdims=True)
    np.testing.assert_allclose(out, (x - mean) / np.sqrt(var + 1e-5), atol=1e-5)


# ---------------------------------------------------------------------- initialisation and buffers
@pytest.mark.parametrize("make, fan_in", [
    (lambda: nn.Linear(64, 48), 64), (lambda: nn.Conv2d(8, 16, 3, groups=2), 36),
    (lambda: nn.Conv1d(6, 12, 5), 30), (lambda: nn.ConvTranspose2d(8, 12, 3, groups=2), 54),
])
def test_kaiming_uniform_init(make: Callable[[], Any], fan_in: int) -> None:
    layer = make()
    bound = 1 / math.sqrt(fan_in)
    for name in ("weight", "bias"):
        v = getattr(layer, name).numpy()
        assert np.abs(v).max() <= bound
        if v.size > 1000:  # U(-b, b): mean 0, std b/sqrt(3), and values fill the range
            assert abs(v.mean()) < 0.05 * bound
            assert abs(v.std() - bound / math.sqrt(3)) < 0.05 * bound
            assert np.abs(v).max() > 0.98 * bound
    assert layer.weight.requires_grad is None  # an optimiser turns it on (tinygrad's rule)


@needs_torch
@pytest.mark.parametrize("make, t_make", [
    (lambda: nn.Linear(64, 48), lambda: torch.nn.Linear(64, 48)),
    (lambda: nn.Conv2d(8, 16, 3, groups=2), lambda: torch.nn.Conv2d(8, 16, 3, groups=2)),
    (lambda: nn.ConvTranspose2d(8, 12, 3, groups=2), lambda: torch.nn.ConvTranspose2d(8, 12, 3, groups=2)),
])
def test_init_bound_matches_torch(make: Callable[[], Any], t_make: Callable[[], Any]) -> None:
    """Both inits are uniform over the same range: the largest |weight| of each is within 3% of the other's."""
    torch.manual_seed(0)
    ours, theirs = np.abs(make().weight.numpy()).max(), t_make().weight.abs().max().item()
    assert abs(ours - theirs) < 0.03 * theirs


def test_norm_and_embedding_init() -> None:
    bn = nn.BatchNorm2d(5)
    np.testing.assert_array_equal(bn.weight.numpy(), 1)
    np.testing.assert_array_equal(bn.bias.numpy(), 0)
    np.testing.assert_array_equal(bn.running_mean.numpy(), 0)
    np.testing.assert_array_equal(bn.running_var.numpy(), 1)
    assert bn.num_batches_tracked.shape == () and bn.num_batches_tracked.dtype == dtypes.int64
    assert bn.num_batches_tracked.item() == 0
    for layer in (nn.LayerNorm(5), nn.GroupNorm(1, 5)):
        np.testing.assert_array_equal(layer.weight.numpy(), 1)
        np.testing.assert_array_equal(layer.bias.numpy(), 0)
    emb = nn.Embedding(200, 50).weight.numpy()
    assert abs(emb.mean()) < 0.05 and abs(emb.std() - 1) < 0.04  # 10,000 samples: 5 standard errors


class TinyCNN:
    """Conv2d -> BatchNorm -> relu -> max_pool2d -> Linear; attribute names match _torch_tiny_cnn."""

    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)
        self.fc = nn.Linear(18, 3)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(self.bn(self.conv(x)).relu().max_pool2d(2).flatten(1))


def _torch_tiny_cnn() -> Any:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(2)
            self.fc = torch.nn.Linear(18, 3)

        def forward(self, x: Any) -> Any:
            return self.fc(torch.nn.functional.max_pool2d(self.bn(self.conv(x)).relu(), 2).flatten(1))

    return Net()


TINY_KEYS = ["bn.bias", "bn.num_batches_tracked", "bn.running_mean", "bn.running_var", "bn.weight", "conv.bias",
             "conv.weight", "fc.bias", "fc.weight"]  # PyTorch's names for the same model


def test_every_parameter_has_its_own_realized_buffer() -> None:
    models = [TinyCNN(), TinyCNN(), nn.LayerNorm(2), nn.GroupNorm(1, 2), nn.RMSNorm(2), nn.Embedding(3, 2)]
    params = get_parameters(models)
    assert all(p.uop.base.op is Ops.BUFFER for p in params), "every parameter starts realized"
    assert len({id(p.uop.base.arg[0]) for p in params}) == len(params), "no two parameters share a buffer"
    a, b = models[0].bn, models[1].bn
    a.bias.assign(a.bias + 5).realize()
    np.testing.assert_array_equal(b.bias.numpy(), 0)
    assert not np.array_equal(models[0].conv.weight.numpy(), models[1].conv.weight.numpy())


def test_state_dict_keys_match_torch() -> None:
    model = TinyCNN()
    state = get_state_dict(model)
    assert sorted(state) == TINY_KEYS
    if torch is not None:
        t_state = _torch_tiny_cnn().state_dict()
        assert sorted(t_state) == TINY_KEYS
        assert {k: tuple(v.shape) for k, v in t_state.items()} == {k: v.shape for k, v in state.items()}


@needs_torch
def test_load_torch_state_dict_and_match_outputs() -> None:
    torch.manual_seed(0)
    t_model = _torch_tiny_cnn()
    x = _rand((4, 1, 6, 6), 0)
    t_model.train()
    t_model(torch.tensor(x))  # move the running stats away from their init
    model = TinyCNN()
    load_state_dict(model, {k: Tensor(v.numpy()) for k, v in t_model.state_dict().items()})
    for training in (False, True):
        t_model.train(training)
        with Tensor.train(training), torch.no_grad():
            np.testing.assert_allclose(model(Tensor(x)).numpy(), t_model(torch.tensor(x)).numpy(), atol=1e-5)


# ---------------------------------------------------------------------- the tiny CNN's gradients
def _np_tiny_cnn(x: np.ndarray, cw: np.ndarray, cb: np.ndarray, bw: np.ndarray, bb: np.ndarray, fw: np.ndarray,
                 fb: np.ndarray) -> np.ndarray:
    """TinyCNN's training-mode forward in numpy (any float dtype)."""
    h = np_conv(x, cw, cb, padding=1)
    mean, var = h.mean((0, 2, 3)), h.var((0, 2, 3))
    h = np.maximum(np_batchnorm(h, bw, bb, mean, 1 / np.sqrt(var + 1e-5)), 0)
    return np_max_pool(h, 2).reshape(h.shape[0], -1) @ fw.T + fb


def test_tiny_cnn_gradients() -> None:
    model = TinyCNN()
    model.bn.weight.assign(Tensor(_rand((2,), 3, 0.5, 1.5))).realize()
    model.bn.bias.assign(Tensor(_rand((2,), 4))).realize()
    names = ["conv.weight", "conv.bias", "bn.weight", "bn.bias", "fc.weight", "fc.bias"]
    state = get_state_dict(model)
    params = [state[n].requires_grad_(True) for n in names]
    x = Tensor(_rand((4, 1, 6, 6), 0), requires_grad=True)
    target = _rand((4, 3), 1)
    with Tensor.train():
        out = model(x)
    (out * Tensor(target)).sum().backward()
    got = {n: p.grad.numpy() for n, p in zip(names, params)}
    got["x"] = x.grad.numpy()
    arrays = [x.numpy()] + [p.numpy() for p in params]
    np.testing.assert_allclose(out.numpy(), _np_tiny_cnn(*arrays), atol=1e-5, rtol=1e-4)
    numeric = numerical_grads(_np_tiny_cnn, arrays, list(range(7)), target.astype(np.float64))
    for name, n in zip(["x", *names], numeric):
        np.testing.assert_allclose(got[name], n, atol=1e-3, rtol=1e-2, err_msg=f"{name} vs finite differences")
    if torch is not None:
        t_model = _torch_tiny_cnn().train()
        _copy_to_torch(model, t_model)
        tx = torch.tensor(arrays[0], requires_grad=True)
        (t_model(tx) * torch.tensor(target)).sum().backward()
        t_grads = {n: p.grad.numpy() for n, p in t_model.named_parameters()}
        t_grads["x"] = tx.grad.numpy()
        for name in ["x", *names]:
            np.testing.assert_allclose(got[name], t_grads[name], atol=1e-5, rtol=1e-4, err_msg=f"{name} vs torch")


@needs_torch
def test_tiny_cnn_sgd_steps_match_torch() -> None:
    """Three SGD steps in training mode: parameters and running statistics follow PyTorch's."""
    model, t_model = TinyCNN(), _torch_tiny_cnn().train()
    _copy_to_torch(model, t_model)
    opt = SGD(get_parameters(model), lr=0.1, momentum=0.9)
    t_opt = torch.optim.SGD(t_model.parameters(), lr=0.1, momentum=0.9)
    for step in range(3):
        x, y = _rand((8, 1, 6, 6), 20 + step), np.random.default_rng(step).integers(0, 3, 8)
        with Tensor.train():
            opt.zero_grad()
            model(Tensor(x)).sparse_categorical_crossentropy(Tensor(y.astype(np.int32))).backward()
            opt.step()
        t_opt.zero_grad()
        torch.nn.functional.cross_entropy(t_model(torch.tensor(x)), torch.tensor(y)).backward()
        t_opt.step()
    t_state = t_model.state_dict()
    for name, value in get_state_dict(model).items():
        np.testing.assert_allclose(value.numpy(), t_state[name].numpy(), atol=1e-5, rtol=1e-4, err_msg=name)


def test_two_batchnorms_in_a_row_sgd_step() -> None:
    bn, bn2 = nn.BatchNorm(3), nn.BatchNorm(3)
    opt = SGD(get_parameters([bn, bn2]), lr=0.1)
    with Tensor.train():
        opt.zero_grad()
        bn2(bn(Tensor(_rand((4, 3), 0)))).square().sum().backward()
        opt.step()


def test_layer_kernel_counts() -> None:
    x = Tensor(_rand((2, 3, 8, 8), 0)).realize()
    assert len(kernels(nn.Conv2d(3, 4, 3, padding=1)(x))) == 1  # the bias add fuses into the conv's reduce
    assert len(kernels(nn.ConvTranspose2d(3, 4, 3, stride=2)(x))) == 1
    assert len(kernels(nn.Linear(8, 5)(x))) == 1
    assert len(kernels(nn.Embedding(10, 4)(Tensor(np.array([[1, 2], [3, 9]], np.int32))))) == 1


def test_backward_fills_layer_gradients_without_an_optimizer() -> None:
    """tinygrad's test_tiny `test_mnist_backward`: layer parameters (requires_grad None until an optimizer turns it
    on) get `.grad` from a plain `backward()`, and so does the input, as tinygrad's backward fills every float tensor
    of the graph; running statistics do not."""
    layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), nn.Conv2d(4, 2, 3)]
    x = Tensor(np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype(np.float32))
    with Tensor.train():
        x.sequential(layers).sum().backward()
    params = get_parameters(layers)
    trained = [p for p in params if p.requires_grad is not False]
    assert len(trained) == 6 and all(p.grad is not None and p.grad.shape == p.shape for p in trained)
    assert all(p.grad is None for p in params if p.requires_grad is False)
    assert x.grad is not None
    with Tensor.train():
        expect = x.sequential(layers).sum().gradient(x)[0]
    np.testing.assert_allclose(x.grad.numpy(), expect.numpy(), rtol=1e-5, atol=1e-6)


def test_requires_grad_twice_on_a_tensor() -> None:
    """A second requires_grad_() on the same tensor (as users do with layer parameters) is harmless."""
    w = Tensor([1.0, 2.0, 3.0])
    w.requires_grad_()
    w.requires_grad_()
    (w * w).sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), [2, 4, 6])
