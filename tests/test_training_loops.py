"""Training loops as users write them, step by step against a reference: a tensor keeps the value it had when it
was built, so `loss.item()` after `opt.step()` is the pre-step loss, and tinygrad's beautiful_mnist step (TinyJit,
`Tensor.train()` as a decorator, BatchNorm, `loss.realize(*opt.schedule_step())`) runs without work-arounds.

References: PyTorch (same initial weights; skipped where torch is not installed) for a small CNN with BatchNorm,
and a hand-written numpy softmax regression (always) for the optimisers' updates. Losses agree to 1e-5 relative.
The tests run on `Device.DEFAULT` (`DEV=CUDA pytest tests/test_training_loops.py` runs them on a GPU)."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from glassgrad import Context, Tensor, TinyJit, Variable, nn
from glassgrad.helpers import TRAINING
from glassgrad.nn import optim
from glassgrad.nn.state import get_parameters

RTOL = 1e-5
STEPS = 4
OPTIMIZERS: dict[str, tuple[Callable[..., optim.Optimizer], dict[str, float]]] = {
    "sgd_momentum": (optim.SGD, {"lr": 0.05, "momentum": 0.9}),
    "adam": (optim.Adam, {"lr": 0.01}),
    "adamw": (optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
}


# ---------------------------------------------------------------------- a small CNN with BatchNorm, twice
class SmallCNN:
    """conv 1->4 3x3, BatchNorm, relu, 2x2 max-pool, linear 36->5 (beautiful_mnist in miniature)."""

    def __init__(self) -> None:
        self.conv = nn.Conv2d(1, 4, 3)
        self.bn = nn.BatchNorm(4)
        self.fc = nn.Linear(36, 5)

    def __call__(self, x: Tensor) -> Tensor:
        return self.fc(self.bn(self.conv(x)).relu().max_pool2d().flatten(1))


def torch_twin(model: SmallCNN, name: str) -> tuple[Any, Any]:
    """The same CNN in PyTorch with the same weights, and its optimizer."""
    torch = pytest.importorskip("torch")
    tm = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                             torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(36, 5))
    with torch.no_grad():
        for dst, src in ((tm[0].weight, model.conv.weight), (tm[0].bias, model.conv.bias),
                         (tm[5].weight, model.fc.weight), (tm[5].bias, model.fc.bias)):
            assert src is not None
            dst.copy_(torch.tensor(src.numpy()))
    cls = {"sgd_momentum": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return tm, cls(tm.parameters(), **OPTIMIZERS[name][1])


def batches(n: int, seed: int = 0, size: int = 8) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((size, 1, 8, 8)).astype(np.float32), rng.integers(0, 5, size).astype(np.int32))
            for _ in range(n)]


def torch_losses(model: SmallCNN, name: str, data: list[tuple[np.ndarray, np.ndarray]],
                 accumulate: int = 1) -> list[float]:
    """PyTorch's losses for the same loop (`accumulate` micro-batches per step, their gradients summed)."""
    torch = pytest.importorskip("torch")
    tm, topt = torch_twin(model, name)
    tm.train()
    out = []
    for i in range(0, len(data), accumulate):
        topt.zero_grad()
        for x, y in data[i:i + accumulate]:
            loss = torch.nn.functional.cross_entropy(tm(torch.tensor(x)), torch.tensor(y, dtype=torch.long))
            loss.backward()
            out.append(loss.item())
        topt.step()
    return out


def fresh(name: str) -> tuple[SmallCNN, optim.Optimizer]:
    Tensor.manual_seed(0)
    model = SmallCNN()
    cls, kwargs = OPTIMIZERS[name]
    return model, cls(get_parameters(model), **kwargs)


def snapshot(model: SmallCNN) -> SmallCNN:
    """A copy of the model's initial weights (the reference starts from these, the loop changes the original)."""
    copy = SmallCNN()
    for dst, src in zip(get_parameters(copy), get_parameters(model)):
        dst.assign(Tensor(src.numpy())).realize()
    return copy


# ---------------------------------------------------------------------- the PyTorch habit
@pytest.mark.parametrize("name", list(OPTIMIZERS))
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_pytorch_habit_loop_reads_the_loss_after_the_step(name: str, jit: bool) -> None:
    """`opt.zero_grad(); loss = ...; loss.backward(); opt.step(); loss.item()`: the pre-step loss, as PyTorch's."""
    model, opt = fresh(name)
    initial, data = snapshot(model), batches(STEPS)

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).cross_entropy(y)
        loss.backward()
        opt.step()
        return loss

    run = TinyJit(step) if jit else step
    losses = []
    with Tensor.train():
        for x, y in data:
            losses.append(run(Tensor(x), Tensor(y)).item())
    np.testing.assert_allclose(losses, torch_losses(initial, name, data), rtol=RTOL)


# ---------------------------------------------------------------------- tinygrad's beautiful_mnist step
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_beautiful_mnist_step(name: str) -> None:
    """TinyJit over `Tensor.train()` as a decorator, BatchNorm, `loss.realize(*opt.schedule_step())`, six steps
    (eager, capture, replays), against PyTorch."""
    model, opt = fresh(name)
    initial, data = snapshot(model), batches(6)

    @TinyJit
    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    losses = [step(Tensor(x), Tensor(y)).item() for x, y in data]
    np.testing.assert_allclose(losses, torch_losses(initial, name, data), rtol=RTOL)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_context_training_flag_is_training_mode(jit: bool) -> None:
    """tinygrad's current spelling of training mode, `@Context(TRAINING=1)` (beautiful_mnist on tinygrad master),
    is `Tensor.training`: BatchNorm uses batch statistics, `opt.step()` is allowed, losses match PyTorch; outside
    it, eval mode is back (running statistics). `Tensor.train()` sets the same flag."""
    model, opt = fresh("adam")
    initial, data = snapshot(model), batches(4)

    @Context(TRAINING=1)
    def step(x: Tensor, y: Tensor) -> Tensor:
        assert Tensor.training
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    run = TinyJit(step) if jit else step
    losses = [run(Tensor(x), Tensor(y)).item() for x, y in data]
    np.testing.assert_allclose(losses, torch_losses(initial, "adam", data), rtol=RTOL)
    assert not Tensor.training and not TRAINING
    assert np.abs(model.bn.running_mean.numpy()).max() > 0  # the steps updated the running statistics
    with Tensor.train():
        assert TRAINING.value == 1
    x = Tensor(data[0][0])
    with Context(TRAINING=0):
        evaluated = model.bn(model.conv(x)).numpy()
    assert model.bn.running_var is not None
    by_hand = (model.conv(x) - model.bn.running_mean.reshape(1, -1, 1, 1)) * \
        (model.bn.running_var.reshape(1, -1, 1, 1) + model.bn.eps).rsqrt() * model.bn.weight.reshape(1, -1, 1, 1) + \
        model.bn.bias.reshape(1, -1, 1, 1)
    np.testing.assert_allclose(evaluated, by_hand.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("symbolic", [False, True], ids=["int", "variable"])
def test_one_graph_for_all_steps_stunning_mnist(symbolic: bool) -> None:
    """tinygrad's stunning_mnist: every step scheduled lazily (`opt.schedule_step()`, nothing realized), the batches
    gathered from a lazy sample of a dataset and picked by a step index (an int or a bound Variable), the losses
    read at the end. BatchNorm's forward realizes the last step's statistics, and with them the weight updates and
    the forward so far: the gradients must still reach the weights before the BatchNorm. Losses match PyTorch's."""
    model, opt = fresh("adam")
    initial, pool = snapshot(model), batches(3)
    np_x, np_y = np.concatenate([x for x, _ in pool]), np.concatenate([y for _, y in pool])
    order = Tensor.randint(3, 8, high=24)  # lazy, as stunning_mnist's samples: realizing it advances the generator
    xs, ys = Tensor(np_x)[order], Tensor(np_y)[order]
    step = Variable("step", 0, 2)
    losses = []
    with Context(TRAINING=1):
        for i in range(3):
            at = step.bind(i) if symbolic else i
            opt.zero_grad()
            losses.append(model(xs[at]).sparse_categorical_crossentropy(ys[at]).backward())
            opt.schedule_step()
    picked = order.numpy()
    data = [(np_x[row], np_y[row]) for row in picked]
    np.testing.assert_allclose([loss.item() for loss in losses], torch_losses(initial, "adam", data), rtol=RTOL)


def test_train_as_a_context_manager_and_a_decorator_agree() -> None:
    """The same steps under `with Tensor.train():` and under `@Tensor.train()` give the same losses and weights;
    outside them, training mode is off again."""
    data = batches(3)
    results = []
    for style in ("context", "decorator"):
        model, opt = fresh("adam")

        def body(x: Tensor, y: Tensor, model: SmallCNN = model, opt: optim.Optimizer = opt) -> float:
            opt.zero_grad()
            loss = model(x).cross_entropy(y).backward()
            opt.step()
            return float(loss.item())

        if style == "context":
            with Tensor.train():
                losses = [body(Tensor(x), Tensor(y)) for x, y in data]
        else:
            losses = [Tensor.train()(body)(Tensor(x), Tensor(y)) for x, y in data]
        assert not Tensor.training
        results.append((losses, model.fc.weight.numpy()))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_gradient_accumulation_over_two_micro_batches() -> None:
    """Two backward() calls add into .grad, one step: PyTorch's loop with the same accumulation."""
    model, opt = fresh("sgd_momentum")
    initial, data = snapshot(model), batches(6)
    losses = []
    with Tensor.train():
        for i in range(0, len(data), 2):
            opt.zero_grad()
            for x, y in data[i:i + 2]:
                loss = model(Tensor(x)).cross_entropy(Tensor(y))
                loss.backward()
                losses.append(loss)
            opt.step()
    np.testing.assert_allclose([loss.item() for loss in losses], torch_losses(initial, "sgd_momentum", data, 2),
                               rtol=RTOL)


# ---------------------------------------------------------------------- value semantics, numpy reference (always)
def softmax_regression_reference(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float,
                                 steps: int) -> tuple[list[float], list[np.ndarray], list[np.ndarray]]:
    """Plain SGD on mean cross-entropy of x @ w: the losses, the weights before each step and the gradients."""
    losses, weights, grads = [], [], []
    for _ in range(steps):
        logits = x @ w
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        losses.append(float(-np.log(p[np.arange(len(y)), y]).mean()))
        p[np.arange(len(y)), y] -= 1
        grads.append(x.T @ p / len(y))
        weights.append(w.copy())
        w = w - lr * grads[-1]
    return losses, weights, grads


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_values_built_before_the_step_keep_their_values(jit: bool) -> None:
    """Every tensor built in a step (the loss, the logits, a copy of the weight, the gradient) still reads its
    value after one and after two more optimizer steps: numpy's numbers, not the updated weight's."""
    rng = np.random.default_rng(3)
    w0, x, y = (rng.standard_normal((6, 4)) * 0.3).astype(np.float32), rng.standard_normal((10, 6)).astype(
        np.float32), rng.integers(0, 4, 10)
    ref_losses, ref_weights, ref_grads = softmax_regression_reference(w0, x, y, 0.5, 5)
    w = Tensor(w0, requires_grad=True)
    opt = optim.SGD([w], lr=0.5)
    xt, yt = Tensor(x), Tensor(y.astype(np.int32))

    def step() -> tuple[Tensor, Tensor, Tensor]:
        opt.zero_grad()
        loss = (xt @ w).cross_entropy(yt)
        loss.backward()
        before = w * 1  # lazy, built on the weight before the step
        opt.step()
        assert w.grad is not None
        return loss, before, w.grad

    run = TinyJit(step) if jit else step
    kept: list[tuple[int, Tensor, Tensor, Tensor]] = []
    with Tensor.train():
        for i in range(5):
            loss, before, grad = run()
            if not jit or i < 2:  # a TinyJit returns its results in buffers the next call overwrites
                kept.append((i, loss, before, grad))
            np.testing.assert_allclose(loss.item(), ref_losses[i], rtol=RTOL)
    for i, loss, before, grad in kept:
        if jit:
            continue
        np.testing.assert_allclose(loss.item(), ref_losses[i], rtol=RTOL)
        np.testing.assert_allclose(before.numpy(), ref_weights[i], rtol=RTOL)
        np.testing.assert_allclose(grad.numpy(), ref_grads[i], rtol=1e-4, atol=1e-6)


def test_grad_after_the_step_is_the_gradient_the_step_used() -> None:
    """PyTorch's habit of reading `p.grad` after `opt.step()`: the gradient at the pre-step weights."""
    rng = np.random.default_rng(4)
    w0, x, y = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((7, 5)).astype(
        np.float32), rng.integers(0, 3, 7)
    _, _, ref_grads = softmax_regression_reference(w0, x, y, 0.1, 2)
    w = Tensor(w0, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    with Tensor.train():
        for i in range(2):
            opt.zero_grad()
            (Tensor(x) @ w).cross_entropy(Tensor(y.astype(np.int32))).backward()
            opt.step()
            assert w.grad is not None
            np.testing.assert_allclose(w.grad.numpy(), ref_grads[i], rtol=1e-4, atol=1e-6)


def test_a_view_of_the_old_weights_keeps_them() -> None:
    """A reshape of a realized weight is a view of its buffer: it keeps the old numbers through an update too."""
    w = Tensor(np.arange(6, dtype=np.float32), requires_grad=True)
    view = w.reshape(2, 3)
    w.grad = Tensor.ones(6)
    with Tensor.train():
        optim.SGD([w], lr=1.0).step()
    np.testing.assert_array_equal(view.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(w.numpy(), np.arange(6, dtype=np.float32) - 1)


def test_many_steps_keep_lineage_and_graphs_bounded() -> None:
    """The beautiful_mnist step records lineage (no no_grad): it must not chain step after step."""
    from glassgrad.tensor import LINEAGE
    model, opt = fresh("adam")
    data = batches(1)

    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    sizes = []
    for _ in range(6):
        step(Tensor(data[0][0]), Tensor(data[0][1]))
        sizes.append(len(LINEAGE))
    assert sizes[-1] <= sizes[2], sizes
    for p in get_parameters(model):
        assert len(p.uop.toposort()) <= 2


def test_a_jit_replay_runs_only_its_captured_kernels() -> None:
    """Value semantics cost a replay nothing: the parameters the replay moves to new versions are not copied."""
    from glassgrad import GlobalCounters
    model, opt = fresh("adam")
    x, y = (Tensor(a) for a in batches(1)[0])

    @TinyJit
    @Tensor.train()
    def step() -> Tensor:
        opt.zero_grad()
        loss = model(x).sparse_categorical_crossentropy(y).backward()
        return loss.realize(*opt.schedule_step())

    step()
    GlobalCounters.reset()
    step()  # the capture: the kernels a replay runs
    captured = GlobalCounters.kernel_count
    for _ in range(2):
        GlobalCounters.reset()
        step()
        assert GlobalCounters.kernel_count == captured


def test_beautiful_mnist_as_tinygrad_writes_it() -> None:
    """tinygrad's examples/beautiful_mnist.py train step, line for line: `@function` on the model, `@TinyJit` over
    `@Tensor.train()` on a method, the batch drawn inside the step with `Tensor.randint` and gathered with `X[samples]`.
    Every replay draws a new batch, and the TinyJit's losses equal an eager run's (JIT=0) bit for bit."""
    from glassgrad import function
    from glassgrad.helpers import Context

    rng = np.random.default_rng(5)
    images = Tensor(rng.integers(0, 255, (40, 1, 8, 8)).astype(np.uint8))
    labels = Tensor(rng.integers(0, 5, 40).astype(np.uint8))

    class Model:
        def __init__(self) -> None:
            self.layers = [nn.Conv2d(1, 4, 3), Tensor.relu, nn.BatchNorm(4), Tensor.max_pool2d,
                           lambda x: x.flatten(1), nn.Linear(36, 5)]

        @function
        def __call__(self, x: Tensor) -> Tensor:
            return x.sequential(self.layers)

        @TinyJit
        @Tensor.train()
        def train_step(self, x_train: Tensor, y_train: Tensor) -> Tensor:
            opt.zero_grad()
            samples = Tensor.randint(8, high=x_train.shape[0])
            loss = self(x_train[samples]).sparse_categorical_crossentropy(y_train[samples]).backward()
            return loss.realize(*opt.schedule_step())

    def run(jit: int) -> list[float]:
        nonlocal opt
        Tensor.manual_seed(1)
        model = Model()
        opt = optim.Adam(get_parameters(model))
        with Context(JIT=jit):
            return [model.train_step(images, labels).item() for _ in range(6)]

    opt: optim.Optimizer
    jitted, eager = run(1), run(0)
    assert len(set(jitted)) == 6  # a new batch every step
    np.testing.assert_array_equal(jitted, eager)


def _gradaccum_losses(jit: bool, steps: int = 5, micro: int = 2) -> list[float]:
    """tinygrad's gradaccum_mnist in miniature: micro-batches (jitted) sum the loss and the concatenated gradients
    into buffers; a hand-written Adam (jitted) updates the parameters with `assign` (no optimizer object, so they
    keep requires_grad None), decays its bias corrections with `*=` and zeroes the sums with `zeros_like` fills."""
    Tensor.manual_seed(0)
    model = SmallCNN()
    params = get_parameters(model)
    params, buffers = [p for p in params if p.is_param], [p for p in params if not p.is_param]
    sizes = [0]
    for p in params:
        sizes.append(sizes[-1] + p.numel())
    m, v = Tensor.zeros(sizes[-1]).contiguous(), Tensor.zeros(sizes[-1]).contiguous()
    b1_t, b2_t = Tensor.ones((1,)).contiguous(), Tensor.ones((1,)).contiguous()
    loss, grads = Tensor.zeros(()).contiguous(), Tensor.zeros(sizes[-1]).contiguous()
    Tensor.realize(*params, *buffers, m, v, b1_t, b2_t, loss, grads)
    rng = np.random.default_rng(0)
    xs, ys = Tensor(rng.standard_normal((64, 1, 8, 8)).astype(np.float32)), Tensor(rng.integers(0, 5, 64))

    def microbatch() -> None:
        with Context(TRAINING=1):
            samples = Tensor.randint(8, high=64)
            for t in params:
                t.grad = None
            uloss = (model(xs[samples]).sparse_categorical_crossentropy(ys[samples]) / micro).backward()
            ugrads = Tensor.cat(*[t.grad.contiguous().flatten() for t in params if t.grad is not None])
            loss.assign(loss + uloss)
            grads.assign(grads + ugrads)
            Tensor.realize(*params, *buffers, loss, grads)

    def optimizer() -> None:
        nonlocal b1_t, b2_t
        b1_t *= 0.9
        b2_t *= 0.999
        m.assign(0.9 * m + 0.1 * grads)
        v.assign(0.999 * v + 0.001 * grads * grads)
        delta = 0.01 * ((m / (1 - b1_t)) / ((v / (1 - b2_t)).sqrt() + 1e-6))
        for j, p in enumerate(params):
            p.assign(p.detach() - delta[sizes[j]:sizes[j + 1]].reshape(p.shape))
        loss.assign(Tensor.zeros_like(loss))
        grads.assign(Tensor.zeros_like(grads))
        Tensor.realize(*params, m, v, b1_t, b2_t, loss, grads)

    run_micro, run_opt = (TinyJit(microbatch), TinyJit(optimizer)) if jit else (microbatch, optimizer)
    out = []
    for _ in range(steps):
        for _ in range(micro):
            run_micro()
        out.append(float(loss.item()))
        run_opt()
    return out


def test_gradient_accumulation_with_a_hand_written_optimizer_jit_equals_eager() -> None:
    """The eager run once failed (a parameter's hand-written update recorded lineage, recomputed later from the zeroed
    gradient sums; and the zero fill was recorded as realized in the sum's buffer, so later zeros were read from
    it), and the jitted run's losses drifted (the `*=` decays froze after the capture; the parameters were
    recomputed from old buffers). Both now give the same losses, which go down."""
    eager, jitted = _gradaccum_losses(False), _gradaccum_losses(True)
    np.testing.assert_allclose(jitted, eager, rtol=1e-5)
    assert eager[-1] < eager[0]


@pytest.mark.parametrize("realized", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_requires_grad_set_as_an_attribute(realized: bool, dtype: str) -> None:
    """`x.requires_grad = True` (PyTorch's habit, after the tensor exists) is `x.requires_grad_(True)`: backward fills
    x.grad. It used to set the flag without registering the tensor, so x.grad stayed None (or backward raised)."""
    data = np.array([0.5, -1.0, 2.0, 0.0], dtype=np.float32)
    x = Tensor(data).cast(dtype)
    if realized:
        x.realize()
    x.requires_grad = True
    (x * x * 3).sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.float().numpy(), 6 * data, rtol=1e-2)
    w = Tensor(data)
    w.requires_grad = True
    w.requires_grad = False  # switched off again: not a target (and nothing else asks, so backward raises)
    with pytest.raises(RuntimeError, match="can take a gradient"):
        (w * 2).sum().backward()
    with pytest.raises(RuntimeError, match="floating point"):
        Tensor([1, 2]).requires_grad = True


def test_pytorch_keywords_of_backward_and_zero_grad() -> None:
    """`loss.backward(retain_graph=True)` (then a second backward through the same graph), `create_graph=True` (the
    gradient differentiated again) and `opt.zero_grad(set_to_none=False)` are PyTorch habits: they raised TypeError."""
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = (x * x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), 2 * 3 * np.array([1.0, 4.0, 9.0]))
    x.grad = None
    (x * x * x).sum().backward(create_graph=True)
    first = x.grad
    assert first is not None
    x.grad = None
    first.sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), 6 * np.array([1.0, 2.0, 3.0]))
    opt = optim.SGD([x], lr=0.1)
    opt.zero_grad(set_to_none=False)
    assert x.grad is not None and np.array_equal(x.grad.numpy(), np.zeros(3))
    opt.zero_grad()
    assert x.grad is None
    assert Tensor.empty(2, 3, 4).dim() == 3


# ---------------------------------------------------------------------- the forward computed once per step
def _mlp_step_kernels(read: str) -> tuple[int, list[float]]:
    """Kernels of the third step of a small MLP's eager training loop, where the loop reads what `read` names
    between `loss.backward()` and `opt.step()`; and the losses of the three steps."""
    from glassgrad import GlobalCounters
    rng = np.random.default_rng(0)
    Tensor.manual_seed(0)
    layers = [nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 4)]
    opt = optim.Adam(get_parameters(layers), lr=0.01)
    x, y = Tensor(rng.standard_normal((8, 16)).astype(np.float32)), Tensor(rng.integers(0, 4, 8))
    losses, kernels = [], 0
    with Tensor.train():
        for _ in range(3):
            GlobalCounters.reset()
            opt.zero_grad()
            loss = layers[2](layers[1](layers[0](x).relu()).relu()).sparse_categorical_crossentropy(y)
            loss.backward()
            if read == "loss":
                losses.append(loss.item())
            elif read == "each grad":
                [np.linalg.norm(p.grad.numpy()) for p in opt.params if p.grad is not None]
            elif read == "one grad":
                assert opt.params[0].grad is not None
                opt.params[0].grad.square().sum().item()
            opt.step()
            if read != "loss":
                losses.append(loss.item())
            kernels = GlobalCounters.kernel_count
    return kernels, losses


@pytest.mark.parametrize("read", ["loss", "each grad", "one grad"])
def test_reading_the_loss_or_a_gradient_before_the_step_computes_the_forward_once(read: str) -> None:
    """`loss.item()` (or a gradient) read between backward() and the step realizes every gradient of that backward
    along with it: the step then runs only the optimizer's kernels, and the forward is not computed again. Reading
    each `p.grad` in turn ran the forward and backward once per parameter."""
    plain, plain_losses = _mlp_step_kernels("nothing")
    kernels, losses = _mlp_step_kernels(read)
    np.testing.assert_allclose(losses, plain_losses, rtol=1e-6)
    extra = 1 if read == "one grad" else 0  # (the square-sum's own kernel)
    assert kernels == plain + extra, (kernels, plain)
