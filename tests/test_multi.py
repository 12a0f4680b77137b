"""Tensors on several devices (glassgrad/multi.py), on CPU devices: CPU:0, CPU:1, CPU:2 are separate devices on one
processor, so the sharding, collectives, autograd, optimisers and the JIT run here exactly as on several GPUs (the
all-reduce goes through the host instead of NCCL)."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor, TinyJit, nn
from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.engine.collectives import host_allreduce
from glassgrad.errors import ShapeError
from glassgrad.nn.optim import SGD, Adam
from glassgrad.nn.state import get_parameters
from glassgrad.uop.ops import Ops

D2 = ("CPU:0", "CPU:1")
D3 = ("CPU:0", "CPU:1", "CPU:2")


def _data(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("devices", [D2, D3])
@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2])
def test_shard_round_trip(devices: tuple[str, ...], axis: int | None) -> None:
    a = _data(7, 4, 3)
    t = Tensor(a).shard(devices, axis)
    assert t.device == ("CPU", *devices[1:]) and t.shape == a.shape
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t.to("CPU:1").numpy(), a)
    assert t.tolist() == a.tolist()


def test_uneven_and_empty_parts() -> None:
    t = Tensor(np.arange(4, dtype=np.float32)).shard(D3, axis=0)  # parts of 2, 2 and 0
    assert [p.shape for p in t.uop.src] == [(2,), (2,), (0,)]
    np.testing.assert_array_equal((t * 2).numpy(), np.arange(4) * 2)
    assert t.sum().item() == 6.0 and t.max().item() == 3.0
    empty = Tensor(np.zeros((0, 3), np.float32)).shard(D2, axis=0)
    assert empty.numpy().shape == (0, 3) and empty.sum(0).numpy().tolist() == [0.0] * 3


def test_zero_d() -> None:
    t = Tensor(3.0).shard(D2)
    assert (t + 1).item() == 4.0
    with pytest.raises(ShapeError, match="0-d"):
        Tensor(3.0).shard(D2, axis=0)


@pytest.mark.parametrize("devices", [D2, D3])
def test_elementwise_broadcast_reduce_matmul(devices: tuple[str, ...]) -> None:
    x, w, b = _data(7, 5), _data(5, 3, seed=1), _data(3, seed=2)
    xs = Tensor(x).shard(devices, axis=0)
    ws, bs = Tensor(w).shard(devices), Tensor(b).shard(devices)
    np.testing.assert_allclose((xs * 2 - 1).exp().numpy(), np.exp(x * 2 - 1), rtol=1e-6)
    np.testing.assert_allclose(xs.sum(1).numpy(), x.sum(1), rtol=1e-5)
    np.testing.assert_allclose(xs.sum(0).numpy(), x.sum(0), rtol=1e-5)   # over the sharded axis: an all-reduce
    np.testing.assert_allclose(xs.max().numpy(), x.max())
    np.testing.assert_allclose(xs.mean().numpy(), x.mean(), rtol=1e-5)
    out = xs @ ws + bs
    assert out.uop.op is not Ops.MULTI  # lazy; realized it is still split by rows
    np.testing.assert_allclose(out.numpy(), x @ w + b, rtol=1e-5, atol=1e-6)
    assert out.realize().uop.op is Ops.MULTI and out.uop.arg == 0
    np.testing.assert_allclose(xs.softmax(-1).numpy(), np.exp(x) / np.exp(x).sum(-1, keepdims=True), rtol=1e-5)
    # two tensors split along different axes: the second is gathered and re-split
    ys = Tensor(x).shard(devices, axis=1)
    np.testing.assert_allclose((xs + ys).numpy(), 2 * x)


def test_movement_ops_track_the_axis() -> None:
    a = _data(6, 4, 2)
    t = Tensor(a).shard(D2, axis=0)
    np.testing.assert_array_equal(t.reshape(6, 8).numpy(), a.reshape(6, 8))
    np.testing.assert_array_equal(t.reshape(48).numpy(), a.reshape(48))
    np.testing.assert_array_equal(t.permute(2, 0, 1).numpy(), a.transpose(2, 0, 1))
    assert t.permute(2, 0, 1).realize().uop.arg == 1
    np.testing.assert_array_equal(t[:, 1:3].numpy(), a[:, 1:3])
    np.testing.assert_array_equal(t[1:4].numpy(), a[1:4])  # shrink of the sharded axis: gathered first
    np.testing.assert_array_equal(t.pad(((1, 0), (0, 0), (0, 1))).numpy(), np.pad(a, ((1, 0), (0, 0), (0, 1))))
    np.testing.assert_array_equal(t.flip(1).numpy(), a[:, ::-1])
    np.testing.assert_array_equal(t[:, :1].expand(6, 3, 2).numpy(), np.broadcast_to(a[:, :1], (6, 3, 2)))
    np.testing.assert_array_equal(Tensor(a).shard(D2, axis=1).cat(Tensor(a).shard(D2, axis=1), dim=0).numpy(),
                                  np.concatenate([a, a]))
    with pytest.raises(ShapeError, match="sharded"):
        Tensor(np.arange(6.0)).shard(D2, axis=0).reshape(3, 2).realize()  # parts of 3 would straddle rows
    rows = Tensor(np.arange(6.0)).shard(D3, axis=0).reshape(3, 2)  # parts of 2: a row each
    np.testing.assert_array_equal(rows.numpy(), np.arange(6.0).reshape(3, 2))


def test_allreduce_host() -> None:
    ins = [Buffer(d, 5, dtypes.float32).copyin(np.arange(5, dtype=np.float32) * (i + 1)) for i, d in enumerate(D3)]
    outs = [Buffer(d, 5, dtypes.float32) for d in D3]
    host_allreduce(Ops.ADD, ins, outs)
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), np.arange(5) * 6)
    host_allreduce(Ops.MAX, ins, outs)
    np.testing.assert_array_equal(outs[1].numpy(), np.arange(5) * 3)


def test_allreduce_is_one_schedule_item() -> None:
    from glassgrad.multi import lower
    from glassgrad.schedule import REALIZED, create_schedule
    t = Tensor(_data(8, 3)).shard(D2, axis=0).realize()
    low = lower([t.sum(0).uop], REALIZED.get)[0]
    items, _ = create_schedule(list(low.src))
    collectives = [i for i in items if i.ast.op is Ops.ALLREDUCE]
    assert len(collectives) == 1 and [b.device for b in collectives[0].bufs] == ["CPU", "CPU:1"] * 2


def test_gradients_match_one_device() -> None:
    x, w = _data(6, 4), _data(4, 3, seed=1)

    def grads(devices: tuple[str, ...] | None) -> list[np.ndarray]:
        xt, wt = Tensor(x), Tensor(w, requires_grad=True)
        if devices:
            xt, wt = xt.shard(devices, axis=0), wt.shard(devices).requires_grad_(True)
        xt.requires_grad_(True)
        ((xt @ wt).relu() * 3).sum().backward()
        assert xt.grad is not None and wt.grad is not None
        return [xt.grad.numpy(), wt.grad.numpy()]

    for devices in (D2, D3):
        for got, want in zip(grads(devices), grads(None)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _train(devices: tuple[str, ...] | None, opt_class: type, steps: int = 4, jit: bool = False) -> list[float]:
    Tensor.manual_seed(3)
    rng = np.random.default_rng(5)
    X, Y = rng.standard_normal((steps, 12, 6)).astype(np.float32), rng.integers(0, 4, (steps, 12))
    model = nn.Sequential(nn.Linear(6, 8), Tensor.relu, nn.Linear(8, 4)) if hasattr(nn, "Sequential") else None
    layers = [nn.Linear(6, 8), nn.Linear(8, 4)] if model is None else None
    params = get_parameters(model if model is not None else layers)
    if devices:
        for p in params:
            p.shard_(devices)
    opt = opt_class(params, lr=0.05)

    def forward(x: Tensor) -> Tensor:
        if model is not None:
            return model(x)
        assert layers is not None
        return layers[1](layers[0](x).relu())

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = forward(x).sparse_categorical_crossentropy(y).backward()
            return loss.realize(*opt.schedule_step())

    run = TinyJit(step) if jit else step
    losses = []
    for i in range(steps):
        x, y = Tensor(X[i]), Tensor(Y[i])
        if devices:
            x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)
        losses.append(run(x, y).item())
    return losses


@pytest.mark.parametrize("opt_class", [SGD, Adam])
def test_data_parallel_training_matches_one_device(opt_class: type) -> None:
    want = _train(None, opt_class)
    np.testing.assert_allclose(_train(D2, opt_class), want, rtol=1e-5)
    np.testing.assert_allclose(_train(D3, opt_class), want, rtol=1e-5)


def test_jit_replays_collectives() -> None:
    eager = _train(D2, Adam, steps=5)
    jitted = _train(D2, Adam, steps=5, jit=True)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)


def test_bad_input() -> None:
    t = Tensor(_data(4, 2))
    with pytest.raises(ValueError, match="unknown device"):
        t.shard(("CPU:0", "GPU:1"))
    with pytest.raises(IndexError):
        t.shard(D2, axis=2)
    with pytest.raises(ValueError, match="twice"):
        t.shard(("CPU:1", "CPU:1"))
    with pytest.raises(RuntimeError, match="different devices"):
        t.shard(D2, axis=0) + t.shard(D3, axis=0)
    with pytest.raises(RuntimeError, match="different devices"):
        t.shard(D2, axis=0) + t


def test_conv_batchnorm_gradients_match_one_device() -> None:
    """A convolution and a BatchNorm over a row-split batch: the statistics are over the whole batch (all-reduced)."""
    x, w = _data(4, 2, 6, 6), _data(3, 2, 3, 3, seed=1)

    def grads(devices: tuple[str, ...] | None) -> list[np.ndarray]:
        bn = nn.BatchNorm(3)
        xt, wt = Tensor(x), Tensor(w)
        if devices:
            xt, wt = xt.shard(devices, axis=0), wt.shard(devices)
            for p in get_parameters(bn):
                p.shard_(devices)
        wt.requires_grad_(True)
        with Tensor.train():
            loss = bn(xt.conv2d(wt)).relu().sum()
            loss.backward()
        assert wt.grad is not None
        return [loss.numpy(), wt.grad.numpy(), bn.running_mean.numpy()]

    for got, want in zip(grads(D2), grads(None)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("where", ["CPU", D2])
def test_jit_replays_draw_new_numbers_once_a_tensor_was_sharded(where: str | tuple[str, ...]) -> None:
    """Once any tensor was sharded, every realize goes through the multi-device lowering. It replaced the random
    state's buffer by the copy kept of its old version, so the TinyJit capture's advance wrote into that copy and
    every replay drew the same batch (beautiful_mnist's `Tensor.randint` batches after a sharded test; the losses fell
    smoothly, wrong). Each replay must draw what an eager run draws, on one device and on several."""
    from glassgrad.helpers import Context
    Tensor.ones(4).shard(D2).realize()  # (multi in use from here on, as in a process that sharded anything)

    def draws(jit: int) -> list[list[float]]:
        Tensor.manual_seed(3)
        step = TinyJit(lambda: (Tensor.randint(6, high=1000, device=where) + Tensor.rand(6, device=where)).realize())
        with Context(JIT=jit):
            return [step().tolist() for _ in range(5)]

    jitted, eager = draws(1), draws(0)
    assert len({tuple(d) for d in jitted}) == 5
    assert jitted == eager


@pytest.mark.parametrize("axis", [None, 0])
def test_gradient_through_a_sharded_assign_realized_by_a_reader(axis: int | None) -> None:
    """`y.assign(w * 2)` realized inside a reader's graph (not as a root of the realize) keeps its lineage on several
    devices too, as on one: backward through y reaches w."""
    w = Tensor([1.0, 2.0, 3.0, 4.0]).shard(D2, axis=axis)
    w.requires_grad = True
    y = Tensor.zeros(4).shard(D2, axis=axis).realize()
    y.assign(w * 2)
    (y * 1).realize()
    y.sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), [2, 2, 2, 2])
