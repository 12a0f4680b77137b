"""Paths users walk that the other test files did not: tinygrad programs run with their import changed, PyTorch
habits. Each test names the symptom it guards against. Values against numpy (always) and PyTorch (when installed)."""
from __future__ import annotations

import numpy as np
import pytest
from torch_optional import torch

from glassgrad import Tensor, nn


# ---------------------------------------------------------------------- backward() before an optimizer exists
class _PlainParams:
    """A tinygrad-style model: an nn layer and plain tensors used as parameters (no requires_grad anywhere)."""

    def __init__(self) -> None:
        self.l = nn.Linear(3, 4)
        self.w = Tensor.randn(4, 2)
        self.u = Tensor.uniform(2, 2)
        self.b = Tensor.zeros(2).contiguous()

    def __call__(self, x: Tensor) -> Tensor:
        return (self.l(x).relu() @ self.w @ self.u + self.b).tanh()


def test_plain_tensor_params_beside_layers_get_grads_before_an_optimizer() -> None:
    """`self.w = Tensor.randn(4, 2)` in a model that also has nn layers: `loss.backward()` before any optimizer
    exists gave the layer's parameters their gradients but w, u, b (and the input) none: tinygrad fills every
    float tensor of the graph."""
    m = _PlainParams()
    x = Tensor.randn(5, 3)
    loss = m(x).square().mean()
    loss.backward()
    grads = [t.grad for t in (m.l.weight, m.l.bias, m.w, m.u, m.b, x)]
    assert all(g is not None for g in grads)
    if torch is not None:
        tl = [torch.tensor(t.numpy(), requires_grad=True) for t in (m.l.weight, m.l.bias, m.w, m.u, m.b, x)]
        tw, tb, tpw, tpu, tpb, tx = tl
        ((torch.relu(tx @ tw.T + tb) @ tpw @ tpu + tpb).tanh().square().mean()).backward()
        for g, t in zip(grads, tl):
            assert g is not None
            np.testing.assert_allclose(g.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_plain_tensor_params_then_optimizer_step_trains_them() -> None:
    """The same model trained the tinygrad way: a backward before the optimizer (a sanity check of the gradients)
    then the optimizer over every parameter. The plain tensors move, and the loss goes down."""
    Tensor.manual_seed(1)
    m = _PlainParams()
    x, y = Tensor.randn(8, 3), Tensor.randn(8, 2).tanh()
    (m(x) - y).square().mean().backward()
    assert m.w.grad is not None
    params = nn.state.get_parameters(m)
    assert any(p is m.w for p in params)
    opt = nn.optim.Adam(params, lr=0.05)
    w0 = m.w.numpy().copy()
    with Tensor.train():
        losses = []
        for _ in range(20):
            opt.zero_grad()
            loss = (m(x) - y).square().mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    assert not np.allclose(m.w.numpy(), w0)
    assert losses[-1] < losses[0] * 0.7


def test_pytorch_program_with_layers_keeps_its_rule() -> None:
    """With a tensor marked requires_grad=True in the graph, PyTorch's rule stays: a plain input gets no .grad."""
    lin = nn.Linear(3, 2)
    x, w = Tensor.randn(4, 3), Tensor.randn(2, 2, requires_grad=True)
    (lin(x) @ w).sum().backward()
    assert x.grad is None and w.grad is not None and lin.weight.grad is not None


def test_running_statistics_beside_plain_params_get_no_grad() -> None:
    """A BatchNorm (its running statistics are requires_grad=False buffers) in an eval-mode graph with a plain
    parameter: the parameter gets its gradient, the statistics none."""
    bn = nn.BatchNorm2d(2)
    w = Tensor.randn(1, 2, 1, 1)
    x = Tensor.randn(3, 2, 4, 4)
    (bn(x) * w).sum().backward()
    assert w.grad is not None and bn.running_mean.grad is None
    np.testing.assert_allclose(w.grad.numpy(), bn(x).sum((0, 2, 3), keepdim=True).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("make", [lambda: Tensor.ones(3).contiguous(), lambda: Tensor.full((3,), 2.0).contiguous(),
                                  lambda: Tensor.arange(3).float().contiguous()])
def test_equal_contiguous_constants_are_separate_tensors(make) -> None:  # type: ignore[no-untyped-def]
    """`Tensor.ones(3).contiguous()` twice: tinygrad gives each its own buffer. They were one node, so an in-place
    write to one (after realizing both) could show in the other, and backward gave neither a gradient."""
    a, b = make(), make()
    ref = a.numpy().copy()
    (a * 2 + b * 3).sum().backward()
    assert a.grad is not None and b.grad is not None
    assert (a.grad.tolist(), b.grad.tolist()) == ([2.0] * 3, [3.0] * 3)
    a += 1
    np.testing.assert_array_equal(b.numpy(), ref)
    np.testing.assert_array_equal(a.numpy(), ref + 1)


# ---------------------------------------------------------------------- whisper's KV cache: symbolic cat and pad
def _kv_step(cache: Tensor, pos: int, new: Tensor, max_len: int) -> Tensor:
    """tinygrad's whisper.py self-attention cache: the first `pos` entries, the new one joined (cat along a
    symbolic length), padded back to the cache's length by `max_len - pos - n` (a symbolic amount)."""
    from glassgrad import Variable
    v = Variable("pos", 1, max_len - 1).bind(pos)
    k = cache.shrink((None, (0, v), None)).cat(new, dim=1)
    return k.pad((None, (0, max_len - v - new.shape[1]), None))


def test_symbolic_cat_and_pad_fill_a_kv_cache() -> None:
    """whisper.py's decoder: `max_len - len - n` with a bound Variable len raised TypeError (int - UOp), the cat of
    a symbolic-length slice NotImplementedError, and pad by a symbolic amount NotImplementedError."""
    max_len, rows = 6, np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    cache = Tensor.zeros(1, max_len, 3).contiguous().realize()
    cache[:, :1] = Tensor(rows[None, :1])
    cache.realize()
    for pos in range(1, 5):
        out = _kv_step(cache, pos, Tensor(rows[None, pos:pos + 1]), max_len)
        assert out.shape == (1, max_len, 3)
        cache.assign(out.contiguous()).realize()
        expect = np.zeros((max_len, 3), np.float32)
        expect[:pos + 1] = rows[:pos + 1]
        np.testing.assert_array_equal(cache.numpy()[0], expect)


def test_symbolic_kv_cache_in_a_jit_replays_each_position() -> None:
    """The same step inside a TinyJit, as whisper's decoder runs it: each replay writes its own position."""
    from glassgrad import TinyJit, Variable
    max_len = 8
    cache = Tensor.zeros(1, max_len, 2).contiguous().realize()

    @TinyJit
    def step(x: Tensor, v: Variable) -> Tensor:
        k = cache.shrink((None, (0, v), None)).cat(x, dim=1)
        cache.assign(k.pad((None, (0, max_len - v - 1), None)).contiguous()).realize()
        return (k * 2).sum(1).realize()

    for pos in range(1, 7):
        got = step(Tensor([[[float(pos), -pos]]]), Variable("p", 1, max_len - 1).bind(pos)).numpy()
        np.testing.assert_allclose(got, [[2.0 * sum(range(1, pos + 1)), -2.0 * sum(range(1, pos + 1))]])
    np.testing.assert_array_equal(cache.numpy()[0, :, 0], [0, 1, 2, 3, 4, 5, 6, 0])


def test_symbolic_pad_checks_and_gradient() -> None:
    """A symbolic amount that can be negative raises, as does a non-constant mode; the gradient of a symbolic pad is
    the shrink back."""
    from glassgrad import Variable
    from glassgrad.errors import ShapeError
    v = Variable("n", 1, 5).bind(3)
    x = Tensor.ones(2, 4)
    with pytest.raises(ShapeError, match="negative"):
        x.pad((None, (0, 2 - v)))
    with pytest.raises(NotImplementedError, match="constant"):
        x.pad((None, (0, v)), mode="reflect")
    w = Tensor([[1.0, 2.0, 3.0, 4.0]], requires_grad=True)
    y = w.pad((None, (v, 0)), value=5.0)
    assert y.shape[1] is not None
    (y * 3).sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), np.full((1, 4), 3.0))
    np.testing.assert_array_equal(y.shrink((None, (v, v + 4))).numpy(), w.numpy())


def test_int_minus_a_variable() -> None:
    """`8 - v` for a bound Variable v (tinygrad's UOp has __rsub__): was a TypeError."""
    from glassgrad import Variable
    from glassgrad.uop.sint import sint_eval
    v = Variable("m", 1, 7).bind(3)
    assert sint_eval(8 - v) == 5 and sint_eval(8 - v - 1) == 4


# ---------------------------------------------------------------------- names tinygrad's programs import
def test_names_tinygrad_examples_import() -> None:
    """examples/audio_helpers.py (whisper) imports DTypeLike from tinygrad.dtype; mixtral.py, stable_diffusion.py and
    others import tqdm, Profiling, profile_marker, ceildiv, ... from tinygrad.helpers: each was an ImportError."""
    from glassgrad import dtypes
    from glassgrad.dtype import (
        DTYPES_DICT,
        ConstType,
        DTypeLike,
        _from_np_dtype,
        _to_np_dtype,
        least_upper_float,
        sum_acc_dtype,
    )
    from glassgrad.helpers import (
        OSX,
        Profiling,
        all_int,
        all_same,
        argfix,
        ceildiv,
        pluralize,
        profile_marker,
        temp,
        tqdm,
        unwrap,
    )
    assert DTypeLike is not None and ConstType is not None and isinstance(OSX, bool)
    assert DTYPES_DICT["half"] is dtypes.float16 and DTYPES_DICT["float32"] is dtypes.float32
    assert _to_np_dtype(dtypes.bfloat16) is np.float32 and _to_np_dtype(dtypes.int8) is np.int8
    assert _from_np_dtype(np.dtype("uint16")) is dtypes.uint16
    assert (sum_acc_dtype(dtypes.uint8), sum_acc_dtype(dtypes.bool), sum_acc_dtype(dtypes.float16),
            sum_acc_dtype(dtypes.float64)) == (dtypes.uint32, dtypes.int32, dtypes.float32, dtypes.float64)
    assert least_upper_float(dtypes.int8) is dtypes.float32 and least_upper_float(dtypes.half) is dtypes.half
    assert ceildiv(7, 2) == 4 and ceildiv(-7, 2) == -3 and argfix((1, 2)) == (1, 2) and argfix(1, 2) == (1, 2)
    assert all_same([1, 1]) and not all_same([1, 2]) and all_int((1, 2)) and not all_int((1, 2.0))
    assert unwrap(3) == 3 and pluralize("kernel", 1) == "1 kernel" and pluralize("kernel", 2) == "2 kernels"
    assert temp("x").endswith("x")
    profile_marker("step")
    assert list(tqdm(range(3), desc="d")) == [0, 1, 2]
    with tqdm(total=4) as bar:
        bar.update(2)
    with Profiling(enabled=False):
        pass
    with pytest.raises(ValueError):
        unwrap(None)


def test_renderer_supported_dtypes() -> None:
    """tinygrad's stable diffusion UNet asks `Device[Device.DEFAULT].renderer.supported_dtypes()` before casting to
    float16: it was an AttributeError. Metal has no float64."""
    from glassgrad import Device, dtypes
    from glassgrad.renderer.metal import MetalRenderer
    supported = Device[Device.DEFAULT].renderer.supported_dtypes()
    assert {dtypes.float16, dtypes.float32, dtypes.int32, dtypes.bool} <= supported
    assert dtypes.float64 not in MetalRenderer().supported_dtypes()


# ---------------------------------------------------------------------- PyTorch keywords of sorting
def test_sort_stable_and_topk_sorted_keywords() -> None:
    """`x.sort(1, stable=True)`, `x.argsort(stable=True)` and `x.topk(2, sorted=False)` are PyTorch's keywords: each
    was a TypeError. The sort is stable either way (equal values keep their order)."""
    ties = np.array([[1, 3, 3, 2, 3], [5, 5, 1, 0, 5]], np.float32)
    expect = np.argsort(ties, axis=1, kind="stable")
    np.testing.assert_array_equal(Tensor(ties).sort(1, stable=True)[1].numpy(), expect)
    np.testing.assert_array_equal(Tensor(ties).argsort(1, stable=True).numpy(), expect)
    np.testing.assert_array_equal(Tensor(ties).sort(1, stable=False)[0].numpy(), np.sort(ties, axis=1))
    values = Tensor(ties).topk(2, sorted=False)[0].numpy()
    np.testing.assert_array_equal(np.sort(values, axis=1), np.sort(ties, axis=1)[:, -2:])
    if torch is not None:
        np.testing.assert_array_equal(Tensor(ties).sort(dim=1, stable=True)[1].numpy(),
                                      torch.tensor(ties).sort(dim=1, stable=True)[1].numpy())
