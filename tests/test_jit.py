"""TinyJit and the memory planner: replays equal eager runs (training with Adam and BatchNorm, random graphs), the
function body runs twice per signature, signatures (shape, dtype, scalars) recapture, JIT=0, outputs' buffers are
reused, state tensors follow in-place writes, and the errors a user can run into. Runs on the default device
(DEV=CUDA reruns it on a GPU)."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgrad import Context, Device, Tensor, TinyJit, dtypes, nn, no_grad
from glassgrad.engine.jit import JitError
from glassgrad.engine.memory import lifetimes, plan_memory
from glassgrad.nn import optim, state


# ---------------------------------------------------------------------- training: replay == eager
class Net:
    """A small CNN with BatchNorm, so a step updates params, Adam moments, the step count and running stats."""

    def __init__(self) -> None:
        self.layers: list[Callable[[Tensor], Tensor]] = [
            nn.Conv2d(1, 4, 3), nn.BatchNorm(4), Tensor.relu, Tensor.max_pool2d, lambda x: x.flatten(1),
            nn.Linear(36, 5)]

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


def _train(steps: int, jit: bool) -> dict[str, Any]:
    Tensor.manual_seed(3)
    net = Net()
    params = state.get_parameters(net)
    opt = optim.Adam(params, lr=0.01)
    body_calls = 0

    def step(x: Tensor, y: Tensor) -> Tensor:
        nonlocal body_calls
        body_calls += 1
        with Tensor.train():
            opt.zero_grad()
            loss = net(x).sparse_categorical_crossentropy(y).backward()
            with no_grad():
                Tensor.realize_all(loss, *[p.grad for p in opt.params if p.grad is not None], *opt.schedule_step())
        return loss

    losses = run_steps(TinyJit(step) if jit else step, steps, seed=7)
    bn = net.layers[1]
    assert isinstance(bn, nn.BatchNorm) and bn.running_mean is not None and bn.running_var is not None
    return {"losses": losses, "params": [p.numpy() for p in params],
            "grads": [p.grad.numpy() for p in opt.params if p.grad is not None],
            "adam": [t.numpy() for t in opt.state()], "running": [bn.running_mean.numpy(), bn.running_var.numpy()],
            "body_calls": body_calls, "eval": _eval(net)}


def run_steps(run: Callable[[Tensor, Tensor], Tensor], steps: int, seed: int) -> np.ndarray:
    """The losses of `steps` calls of a training step on random (8, 1, 8, 8) images with labels 0..4."""
    rng = np.random.default_rng(seed)
    losses = []
    for _ in range(steps):
        x = Tensor(rng.standard_normal((8, 1, 8, 8), dtype=np.float32))
        y = Tensor(rng.integers(0, 5, 8).astype(np.int32))
        losses.append(run(x, y).item())
    return np.array(losses)


def _eval(net: Net) -> np.ndarray:
    with no_grad(), Tensor.test():
        return net(Tensor(np.linspace(-1, 1, 2 * 64, dtype=np.float32).reshape(2, 1, 8, 8))).numpy()


def test_training_replay_equals_eager() -> None:
    eager, jitted = _train(20, jit=False), _train(20, jit=True)
    np.testing.assert_allclose(jitted["losses"], eager["losses"], rtol=1e-5, atol=1e-6)
    for key in ("params", "grads", "adam", "running"):
        for a, b in zip(jitted[key], eager[key]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(jitted["eval"], eager["eval"], rtol=1e-5, atol=1e-6)
    assert eager["body_calls"] == 20 and jitted["body_calls"] == 2
    assert len(set(jitted["losses"].tolist())) > 10  # replays really compute (the losses change)


def test_eager_use_of_state_between_replays_is_current() -> None:
    """Values computed eagerly from the params and kept alive must not be reused after a replay moved the params."""
    Tensor.manual_seed(0)
    w = Tensor.randn(4, 4, requires_grad=True)
    opt = optim.SGD([w], lr=0.1)
    x_test = Tensor(np.eye(4, dtype=np.float32))

    @TinyJit
    def step(x: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = (x @ w).square().sum().backward()
            with no_grad():
                Tensor.realize_all(loss, *opt.schedule_step())
        return loss

    kept = []
    for i in range(5):
        step(Tensor(np.full((2, 4), i + 1.0, np.float32)))
        kept.append((x_test @ w).realize())  # held: a stale cache would hand the same buffer back
        np.testing.assert_allclose(kept[-1].numpy(), w.numpy(), rtol=1e-6)
    assert not np.allclose(kept[-1].numpy(), kept[-2].numpy())


def test_pending_assign_to_state_is_applied_before_replay() -> None:
    w = Tensor(np.ones(3, np.float32)).realize()
    w.assign(w)  # w owns its buffer now
    w.realize()
    scale = Tensor(np.array(2.0, np.float32)).realize()
    scale.assign(scale).realize()

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return w.assign(w * scale + x).realize() * 1

    outs = [f(Tensor(np.ones(3, np.float32))).numpy().copy() for _ in range(3)]
    scale.assign(Tensor(np.array(10.0, np.float32)))  # lazy: not realized by the user
    outs.append(f(Tensor(np.ones(3, np.float32))).numpy().copy())
    expected, value = [], 1.0
    for s in (2, 2, 2, 10):
        value = value * s + 1
        expected.append(value)
    np.testing.assert_allclose([o[0] for o in outs], expected)
    np.testing.assert_allclose(w.numpy(), expected[-1])


def test_a_write_pending_at_the_capture_call_is_not_captured() -> None:
    """A hand-written warmup, `opt.lr.assign(Tensor([lr]))` left lazy before each call of a jitted step: the write
    queued before call 2 was realized inside the capture, so every replay wrote that call's lr again over the new
    one (lr stuck at its second value). Writes queued before a call are the state's value at that call."""
    scale = Tensor(np.array([1.0], np.float32)).realize()
    scale.assign(scale).realize()  # owns its buffer, as an optimizer's lr

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * scale).realize()

    outs = []
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        scale.assign(Tensor(np.array([value], np.float32)))  # lazy
        outs.append(f(Tensor(np.ones(2, np.float32))).numpy()[0])
    assert f.captures == 1
    np.testing.assert_array_equal(outs, [1.0, 2.0, 3.0, 4.0, 5.0])


@pytest.mark.parametrize("pattern", ["batch_as_global", "step_only", "step_only_realized_grads"])
def test_a_tensor_replaced_outside_the_function_raises_instead_of_replaying_stale_values(pattern: str) -> None:
    """Tensors that change between calls but are not arguments: a batch made each step and read as a global, or
    `TinyJit(opt.step)` with `backward()` outside. The replays read the capture call's buffers again (an old batch,
    old gradients) and trained with wrong numbers silently; now the first replay after the tensor is gone raises."""
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.1)
    batch = {"x": Tensor([1.0, 1.0])}

    @TinyJit
    def step() -> Tensor:
        if pattern == "batch_as_global":
            opt.zero_grad()
            (w * w * batch["x"]).sum().backward()
        opt.step()
        return w.sum()

    with Tensor.train(), pytest.raises(JitError, match="made before the capture"):
        for i in range(4):
            batch["x"] = Tensor([float(i + 1), 1.0])
            if pattern != "batch_as_global":
                opt.zero_grad()
                (w * w * batch["x"]).sum().backward()
                if pattern == "step_only_realized_grads":
                    assert w.grad is not None
                    w.grad.realize()
            step()


def test_a_read_tensor_rebound_to_a_view_of_its_own_buffer_still_replays() -> None:
    """The check above looks for any tensor holding the buffer, not only the object seen at the capture."""
    table = {"w": Tensor(np.arange(6, dtype=np.float32)).realize()}

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (table["w"].reshape(2, 3) * x).sum(1).realize()

    for i in range(4):
        table["w"] = table["w"].reshape(3, 2).reshape(6)  # new tensor objects, one buffer
        np.testing.assert_allclose(f(Tensor(np.full(3, float(i), np.float32))).numpy(), [3.0 * i, 12.0 * i])


def test_freezing_a_param_after_the_capture_is_a_new_signature() -> None:
    """`w1.requires_grad = False` between calls of a jitted training step: the replays kept updating w1 with the
    captured kernels (eagerly the optimizer skips a frozen param). The flag change now starts a new signature."""
    w1, w2 = Tensor([1.0, 2.0]), Tensor([3.0])
    opt = nn.optim.SGD([w1, w2], lr=0.1)

    @TinyJit
    def step() -> Tensor:
        opt.zero_grad()
        loss = (w1.sum() * w2).sum()
        loss.backward()
        opt.step()
        return loss

    with Tensor.train():
        for i in range(5):
            if i == 3:
                w1.requires_grad = False
                frozen = w1.numpy().copy()
            step()
    a, b = np.array([1.0, 2.0]), 3.0
    for i in range(5):
        a, b = (a, b - 0.1 * a.sum()) if i >= 3 else (a - 0.1 * b, b - 0.1 * a.sum())
    np.testing.assert_array_equal(w1.numpy(), frozen)
    np.testing.assert_allclose(w1.numpy(), a, rtol=1e-5)
    np.testing.assert_allclose(w2.numpy(), [b], rtol=1e-5)
    assert step.captures == 2  # (the frozen one captured at its second call)


# ---------------------------------------------------------------------- calls, signatures, flags
def _counting(fn: Callable[..., Tensor]) -> tuple[TinyJit[Tensor], list[int]]:
    calls = [0]

    def body(*args: Any, **kwargs: Any) -> Tensor:
        calls[0] += 1
        return fn(*args, **kwargs)
    return TinyJit(body), calls


def _arr(*shape: int, seed: int = 0, dtype: Any = np.float32) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_body_runs_twice_and_replays_use_new_inputs() -> None:
    f, calls = _counting(lambda a, b: (a @ b).relu().sum(axis=0))
    for i in range(6):
        a, b = _arr(3, 4, seed=i), _arr(4, 5, seed=100 + i)
        np.testing.assert_allclose(f(Tensor(a), Tensor(b)).numpy(), np.maximum(a @ b, 0).sum(0), rtol=1e-5, atol=1e-6)
    assert calls[0] == 2 and f.captures == 1


def test_shape_and_dtype_changes_capture_per_signature() -> None:
    f, calls = _counting(lambda a: (a * 2 + 1).contiguous())
    for i in range(3):
        for shape, dtype in (((4,), np.float32), ((2, 3), np.float32), ((4,), np.int32)):
            a = (_arr(*shape, seed=i) * 10).astype(dtype)
            out = f(Tensor(a))
            assert out.shape == shape and out.dtype == dtypes.from_np(np.dtype(dtype))
            np.testing.assert_allclose(out.numpy(), a * 2 + 1, rtol=1e-6)
    assert calls[0] == 6 and f.captures == 3  # two runs per signature, then replays


def test_scalar_arguments_are_part_of_the_signature() -> None:
    f, calls = _counting(lambda a, scale, shift=0.0: (a * scale + shift).contiguous())
    a = _arr(5)
    for _ in range(3):
        for scale, shift in ((2.0, 0.0), (3.0, 0.0), (2.0, 1.5), (3, 0.0)):
            np.testing.assert_allclose(f(Tensor(a), scale, shift=shift).numpy(), a * scale + shift, rtol=1e-6)
    assert f.captures == 4 and calls[0] == 8


def test_train_and_eval_modes_are_separate_signatures() -> None:
    f, calls = _counting(lambda a: a.dropout(0.5) if Tensor.training else (a * 3).contiguous())
    x = Tensor(np.ones(4, np.float32)).realize()
    for _ in range(3):
        np.testing.assert_allclose(f(x).numpy(), 3.0)
    with Tensor.train():  # dropout draws its mask on the device: every replay draws a new one
        masks = [f(x).numpy() for _ in range(6)]
    assert calls[0] == 4  # each mode: one eager call, one capture
    assert all(set(np.unique(m)) <= {0.0, 2.0} for m in masks)
    assert len({m.tobytes() for m in masks}) > 1


def test_jit_0_runs_eagerly_every_call() -> None:
    f, calls = _counting(lambda a: (a + 1).contiguous())
    with Context(JIT=0):
        for i in range(4):
            np.testing.assert_allclose(f(Tensor(_arr(3, seed=i))).numpy(), _arr(3, seed=i) + 1)
    assert calls[0] == 4 and f.captures == 0


def test_outputs_buffers_are_reused_by_the_next_call() -> None:
    f = TinyJit(lambda a: (a * 2).contiguous())
    outs = [f(Tensor(np.full(3, float(i), np.float32))) for i in range(5)]
    assert outs[2] is outs[3] is outs[4]  # replays return the same tensor objects ...
    np.testing.assert_allclose(outs[2].numpy(), 8.0)  # ... holding the latest call's values
    np.testing.assert_allclose(outs[0].numpy(), 0.0)  # the eager call's output is its own
    kept = f(Tensor(np.ones(3, np.float32))).numpy()  # copy a result out to keep it
    f(Tensor(np.zeros(3, np.float32)))
    np.testing.assert_allclose(kept, 2.0)


def test_unrealized_and_keyword_and_nested_inputs() -> None:
    f = TinyJit(lambda xs, b=None: (xs[0] + xs[1] * b["w"]).contiguous())
    for i in range(4):
        a, c, w = _arr(3, seed=i), _arr(3, seed=10 + i), _arr(3, seed=20 + i)
        lazy = Tensor(a) * 1  # inputs are realized before the call
        out = f([lazy, Tensor(c)], b={"w": Tensor(w)})
        np.testing.assert_allclose(out.numpy(), a + c * w, rtol=1e-6)


def test_input_written_in_place() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        x.assign(x * 2).realize()
        return (x + 1).realize()

    for i in range(4):
        x = Tensor(np.full(3, i + 1.0, np.float32))
        x.assign(x).realize()
        out = f(x)
        np.testing.assert_allclose(x.numpy(), (i + 1.0) * 2)
        np.testing.assert_allclose(out.numpy(), (i + 1.0) * 2 + 1)
        np.testing.assert_allclose((x * 3).numpy(), (i + 1.0) * 6)  # the input tensor reads its new version


def test_jitted_method() -> None:
    class Scaler:
        def __init__(self) -> None:
            self.k = Tensor(np.array([1.0, 2.0, 3.0], np.float32)).realize()

        @TinyJit
        def __call__(self, x: Tensor) -> Tensor:
            return (x * self.k).contiguous()

    s = Scaler()
    for i in range(4):
        np.testing.assert_allclose(s(Tensor(np.full(3, float(i), np.float32))).numpy(), [i, 2 * i, 3 * i])


# ---------------------------------------------------------------------- errors
def _run3(f: Callable[..., Any], *args: Any) -> None:
    for _ in range(3):
        f(*args)


def test_errors() -> None:
    x = Tensor(_arr(3)).realize()
    with pytest.raises(JitError, match="share one buffer"):
        TinyJit(lambda a, b: (a + b).contiguous())(x, x)
    with pytest.raises(JitError, match="must return tensors"):
        TinyJit(lambda a: 3.0)(x)
    with pytest.raises(JitError, match="returns .* one of its inputs"):
        _run3(TinyJit(lambda a: a.reshape(1, 3)), x)  # (the input itself may be returned: see test_tinygrad_compat)
    with pytest.raises(TypeError, match="hashable"):
        TinyJit(lambda a, opts: a)(x, {"k": [1, {2}]})
    with pytest.raises(JitError, match="no kernels"):
        _run3(TinyJit(lambda a: None), x)
    inner = TinyJit(lambda a: (a + 1).contiguous())
    with pytest.raises(JitError, match="inside another"):
        _run3(TinyJit(lambda a: inner(a) * 2), x)


@pytest.mark.parametrize("read", ["item", "numpy", "tolist", "float", "bool"])
def test_reading_values_during_the_capture_raises(read: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`s = x.sum().item()` inside a jitted function was baked into the capture, so every replay computed with the
    second call's value ([4, 2] where [6, 3] was due); tinygrad raises JitError there, and so does glassgrad now
    (UNSAFE_ALLOW_JIT_BUFFER=1 allows it, as in tinygrad)."""
    def fn(x: Tensor) -> Tensor:
        s = x.sum()
        value = {"item": s.item, "numpy": lambda: float(s.numpy()), "tolist": s.tolist, "float": lambda: float(s),
                 "bool": lambda: float(bool(s > 2))}[read]()
        return (x * value).contiguous()
    step = TinyJit(fn)
    np.testing.assert_array_equal(step(Tensor([0.0, 1.0])).numpy(), [0.0, 1.0] if read != "bool" else [0.0, 0.0])
    with pytest.raises(JitError, match="baked in"):
        step(Tensor([1.0, 1.0]))
    monkeypatch.setenv("UNSAFE_ALLOW_JIT_BUFFER", "1")
    TinyJit(fn)(Tensor([1.0, 1.0]))
    _run3(TinyJit(fn), Tensor([1.0, 1.0]))


def test_state_moved_to_another_buffer_is_refused() -> None:
    w = Tensor(np.ones(3, np.float32)).realize()
    w.assign(w).realize()
    f = TinyJit(lambda x: w.assign(w + x).realize() * 1)
    _run3(f, Tensor(np.ones(3, np.float32)))
    w.uop = Tensor(np.zeros(3, np.float32)).realize().uop  # not an assign: w now reads another buffer
    with pytest.raises(JitError, match="moved to another buffer"):
        f(Tensor(np.ones(3, np.float32)))


def test_reset_starts_over() -> None:
    f, calls = _counting(lambda a: (a + 1).contiguous())
    _run3(f, Tensor(_arr(3)))
    f.reset()
    _run3(f, Tensor(_arr(3)))
    assert calls[0] == 4


# ---------------------------------------------------------------------- random graphs
OPS: list[tuple[str, Callable[[Tensor, Tensor], Tensor]]] = [
    ("add", lambda a, b: a + b), ("mul", lambda a, b: a * b), ("relu", lambda a, b: a.relu()),
    ("sub_exp", lambda a, b: (a - b).clip(-3, 3).exp()), ("max", lambda a, b: a.maximum(b)),
    ("sum0", lambda a, b: a.sum(axis=0, keepdim=True).expand(a.shape)),
    ("max1", lambda a, b: a.max(axis=1, keepdim=True) + b),
    ("permute", lambda a, b: a.T.reshape(a.shape) if a.shape[0] == a.shape[1] else a.flip(0)),
    ("flip", lambda a, b: a.flip(1)), ("pad_shrink", lambda a, b: a.pad(((1, 0), (0, 1)))[:-1, 1:]),
    ("realize", lambda a, b: a.contiguous().realize()), ("contig", lambda a, b: (a * 0.5).contiguous()),
]


def _graph(recipe: list[tuple[int, int, int]]) -> Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]:
    """A function of two (4, 4) tensors: each step applies OPS[op] to two earlier values; returns two values."""
    def fn(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        values = [x, y]
        for op, i, j in recipe:
            values.append(OPS[op][1](values[i % len(values)], values[j % len(values)]))
        return values[-1] * 1, (values[-2] + values[len(values) // 2]).sum(axis=1)
    return fn


@settings(max_examples=int(os.environ.get("JIT_EXAMPLES", "25")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(OPS) - 1), st.integers(0, 20), st.integers(0, 20)), min_size=1,
                max_size=8), st.integers(0, 2**31 - 1))
def test_random_graphs_replay_like_eager(recipe: list[tuple[int, int, int]], seed: int) -> None:
    fn = _graph(recipe)
    jitted = TinyJit(fn)
    rng = np.random.default_rng(seed)
    outputs = []
    for _ in range(4):
        x, y = rng.standard_normal((4, 4), dtype=np.float32), rng.standard_normal((4, 4), dtype=np.float32)
        got = [t.numpy() for t in jitted(Tensor(x), Tensor(y))]
        want = [t.numpy() for t in fn(Tensor(x), Tensor(y))]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
        outputs.append(got)
    # each call's results were read before the next call; the two outputs never share memory
    a, b = jitted(Tensor(np.zeros((4, 4), np.float32)), Tensor(np.ones((4, 4), np.float32)))
    assert a.uop.base.arg[0] is not b.uop.base.arg[0]


# ---------------------------------------------------------------------- the memory planner
def test_plan_memory_chain_reuses_blocks() -> None:
    steps = [["a"], ["a", "b"], ["b", "c"], ["c", "d"], ["d", "e"]]
    sizes = {k: ("CPU", 100) for k in "abcde"}
    placed, blocks = plan_memory(steps, sizes)
    assert len(blocks) == 2 and placed["a"] == placed["c"] == placed["e"] and placed["b"] == placed["d"]
    assert placed["a"] != placed["b"]


def test_plan_memory_shares_a_bigger_block_and_keeps_devices_apart() -> None:
    placed, blocks = plan_memory([["a"], ["b"], ["c"]], {"a": ("CPU", 10), "b": ("CPU", 50), "c": ("CUDA", 10)})
    assert placed["a"] == placed["b"] and blocks[placed["a"]].nbytes == 50
    assert blocks[placed["c"]].device == "CUDA" and placed["c"] != placed["a"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=1, max_size=3), min_size=1, max_size=12),
       st.lists(st.integers(1, 64), min_size=10, max_size=10), st.sets(st.integers(0, 9)))
def test_plan_memory_never_overlaps_lifetimes(steps: list[list[int]], sizes: list[int], cuda: set[int]) -> None:
    shareable = {k: ("CUDA" if k in cuda else "CPU", sizes[k]) for k in range(10)}
    placed, blocks = plan_memory(steps, shareable)
    spans = lifetimes(steps)
    assert set(placed) == set(spans)
    for k, b in placed.items():
        assert blocks[b].nbytes >= shareable[k][1] and blocks[b].device == shareable[k][0]
        for other, ob in placed.items():
            if other != k and ob == b:
                assert spans[k][1] < spans[other][0] or spans[other][1] < spans[k][0]
    live_peak = max(sum(shareable[k][1] for k, (f, last) in spans.items() if f <= i <= last) for i in range(len(steps)))
    assert sum(b.nbytes for b in blocks) >= live_peak


def _chain(x: Tensor) -> Tensor:
    for i in range(8):
        x = (x * 1.5 + i).contiguous()  # each link its own kernel and intermediate buffer
    return x.sum(axis=0)


def test_planned_capture_equals_unplanned_and_uses_less_memory() -> None:
    planned, unplanned = TinyJit(_chain), TinyJit(_chain, plan_memory=False)
    allocator = Device[Device.DEFAULT].allocator
    live = {}
    for name, f in (("unplanned", unplanned), ("planned", planned)):
        for i in range(4):
            a = _arr(64, 256, seed=i)
            base = allocator.live_bytes
            out = f(Tensor(a)).numpy()
            expected = a
            for k in range(8):
                expected = expected * np.float32(1.5) + np.float32(k)
            np.testing.assert_allclose(out, expected.sum(0), rtol=1e-5)
        capture = f.capture_of(Tensor(a))
        assert capture is not None
        live[name] = sum(b.nbytes for b in capture.pool)
        assert base >= live[name]  # the pool is allocated while the capture lives
    assert live["unplanned"] == 8 * 64 * 256 * 4  # every intermediate in its own buffer
    assert live["planned"] == 2 * 64 * 256 * 4    # a chain needs two blocks, used in turn


def test_random_numbers_inside_a_jit_are_fresh_on_every_replay() -> None:
    """tinygrad's beautiful_mnist draws its batch with Tensor.randint inside the TinyJit: each replay must draw new
    numbers (the generator's state is a device buffer the captured step advances in place), reproducibly by seed."""
    def run() -> list[np.ndarray]:
        Tensor.manual_seed(7)
        step = TinyJit(lambda a: (a + Tensor.rand(64) + Tensor.randint(64, low=0, high=5)).contiguous())
        x = Tensor.zeros(64).contiguous().realize()
        return [step(x).numpy().copy() for _ in range(6)]
    first, second = run(), run()
    assert len({o.tobytes() for o in first}) == 6
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    for o in first:
        assert ((o >= 0) & (o < 6)).all()


@pytest.mark.parametrize("realize_inside", [True, False])
def test_random_numbers_are_fresh_when_the_function_realizes_its_result(realize_inside: bool) -> None:
    """`return (x + Tensor.rand(4)).realize()`: the generator's advance adds a host constant [0, drawn] that only the
    captured kernel used; its buffer died after the capture and its memory was handed to the next buffer of that
    size, so every replay added 0 and repeated the capture's numbers. Replays equal eager calls of the same seed."""
    def run(jit: bool) -> list[np.ndarray]:
        Tensor.manual_seed(5)

        def fn(x: Tensor) -> Tensor:
            out = x + Tensor.rand(4)
            return out.realize() if realize_inside else out
        step = TinyJit(fn) if jit else fn
        return [step(Tensor([0.0, 0.0, 0.0, 0.0])).numpy().copy() for _ in range(5)]
    jitted, eager = run(True), run(False)
    assert len({o.tobytes() for o in jitted}) == 5
    for a, b in zip(jitted, eager):
        np.testing.assert_array_equal(a, b)


def test_a_host_constant_made_inside_the_function_keeps_its_values() -> None:
    """`x * Tensor(np_array)` made inside the function is a constant of the capture: the kernels hold its memory, not
    its Buffer, so once the tensor died the allocator gave the memory to other buffers of its size and the replays
    read their values (here 9s) instead of the constant's."""
    c = np.arange(100, dtype=np.float32)
    step = TinyJit(lambda x: x * Tensor(c))
    keep = []
    for i in range(5):
        np.testing.assert_array_equal(step(Tensor(np.full(100, i, np.float32))).numpy(), c * i)
        keep += [Tensor(np.full(100, 9.0, np.float32)).realize() for _ in range(3)]


def test_a_replay_realizes_a_leftover_graph_whose_part_was_assigned_since() -> None:
    """A replay asks which lazy tensors read what it overwrites, and caches what each leftover graph reads
    (schedule/versions.py, `owned_reads`). An assign that stores part of such a graph in the replay's state buffer
    makes the cached answer stale: the next replay must compute the leftover first, from the value it had."""
    t = Tensor.zeros(4).contiguous().realize()

    @TinyJit
    def step() -> None:
        t.assign(t + 1).realize()
    for _ in range(3):
        step()
    x = Tensor([1.0, 2.0, 3.0, 4.0]) * 2
    leftover = x + 1
    step()  # the replay asks what `leftover` reads: no buffer written in place
    t.assign(x).realize()  # x's value now lives in t's buffer...
    old_view = t.uop  # (kept alive, so that x stays known as realized there)
    step()  # ...which this replay overwrites: `leftover` is computed first
    np.testing.assert_allclose(leftover.numpy(), [3.0, 5.0, 7.0, 9.0])
    np.testing.assert_allclose(t.numpy(), [3.0, 5.0, 7.0, 9.0])
    assert old_view is not t.uop


def test_prune_keyword_of_tinygrad() -> None:
    """TinyJit(fn, prune=True) raised TypeError; it is accepted and gives the unpruned results."""
    weights = Tensor(_arr(16)).realize()
    fn = TinyJit(lambda x: (weights * 2).contiguous() + x, prune=True)
    for i in range(4):
        a = Tensor(_arr(16) + i).realize()
        np.testing.assert_allclose(fn(a).numpy(), weights.numpy() * 2 + a.numpy(), rtol=1e-6)


def test_inputs_gathered_by_a_random_sample_each_call() -> None:
    """beautiful_cartpole's loop: `samples = Tensor.randint(...).realize()`, then `step(X[samples], R[samples])`, the
    step reading `r.reshape(-1, 1)`. Realizing the gathered input recorded lineage for another shape of its buffer
    (the gather's (n, 1) sum), which the capture's backward recomputed from the random draw, whose generator state
    had moved on: the capture failed. Losses of eager, capture and replays match a run without the JIT."""
    def run(jit: bool) -> list[float]:
        Tensor.manual_seed(0)
        lin = nn.Linear(4, 2)
        opt = nn.optim.Adam(nn.state.get_parameters(lin), lr=1e-2)

        def step(x: Tensor, r: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                loss = (lin(x) - r.reshape(-1, 1)).square().mean().backward()
                opt.step()
                return loss.realize()
        fn = TinyJit(step) if jit else step
        rng = np.random.default_rng(0)
        xs, rs = Tensor(rng.random((50, 4), dtype=np.float32)), Tensor(rng.random(50, dtype=np.float32))
        losses = []
        for _ in range(4):
            samples = Tensor.randint(8, high=50).realize()
            losses.append(fn(xs[samples], rs[samples]).item())
        return losses
    np.testing.assert_allclose(run(True), run(False), rtol=1e-6)


def test_state_updated_in_place_with_an_operator_inside_a_jit() -> None:
    """gradaccum_mnist's functional Adam: `b1_t *= b1` on a state tensor the step closes over. The in-place operator
    rebound the tensor to a new graph, which the capture recorded as a kernel reading the state as it was at the
    capture: replays kept writing the same value (b1_t froze at b1**2, the loss drifted from the eager run's).
    Eager and jitted calls give the same sequence."""
    def run(jit: bool) -> list[float]:
        state = Tensor.ones((1,)).contiguous().realize()
        acc = Tensor.zeros((1,)).contiguous().realize()

        def step() -> Tensor:
            nonlocal state
            state *= 0.5
            acc.assign(acc + state)
            return acc.realize(state)
        fn = TinyJit(step) if jit else step
        return [float(fn().item()) for _ in range(5)]
    expected = [sum(0.5 ** k for k in range(1, n + 1)) for n in range(1, 6)]
    np.testing.assert_allclose(run(False), expected, rtol=1e-6)
    np.testing.assert_allclose(run(True), expected, rtol=1e-6)


def _step_through_outside_lineage() -> tuple[Tensor, Tensor, Callable[[], tuple[Tensor, Tensor]]]:
    """A step that differentiates through h, made (and realized) before the step from w: the gradient reaches w
    through h only while w is at the version h was computed from."""
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True).realize()
    h = (w * 2).realize()

    def step() -> tuple[Tensor, Tensor]:
        w.grad = None
        out = (w * 2).sum() + (h * w).sum()
        out.backward()
        assert w.grad is not None
        return out.realize(), w.grad.realize()
    return w, h, step


def test_replay_through_an_outside_tensors_lineage_matches_eager_while_its_source_is_unchanged() -> None:
    w, h, step = _step_through_outside_lineage()
    jitted = TinyJit(step)
    for _ in range(4):  # eager, capture, replays
        loss, grad = jitted()
        assert loss.item() == pytest.approx(float((2 * w.numpy()).sum() + (h.numpy() * w.numpy()).sum()))
        np.testing.assert_allclose(grad.numpy(), 2 + h.numpy() + 2 * w.numpy())  # d/dw through h = 2w too
        eager_loss, eager_grad = step()
        np.testing.assert_allclose(grad.numpy(), eager_grad.numpy())


def test_replay_through_an_outside_tensors_lineage_refuses_once_its_source_is_assigned() -> None:
    """After w.assign an eager call no longer reaches w through h (its lineage reads w's old version): the captured
    gradient kernels, which did, would give other numbers (2 + 4w instead of 2 + h). The replay raises instead."""
    w, h, step = _step_through_outside_lineage()
    jitted = TinyJit(step)
    jitted()
    jitted()  # captured
    w.assign(w.detach() + 1).realize()
    _, eager_grad = step()
    np.testing.assert_allclose(eager_grad.numpy(), 2 + h.numpy())
    with pytest.raises(JitError, match="assigned since"):
        jitted()
    detached = TinyJit(lambda: ((w * 2).sum() + (h.detach() * w).sum()).realize())
    for _ in range(3):  # a detached h is a constant: nothing to check
        out = detached()
        w.assign(w.detach() + 1).realize()
    assert np.isfinite(out.item())
