"""TinyJit replays through device graphs (CUDA graphs): replays equal eager runs while inputs, buffers and Variable
values change between calls, only the launches that changed are updated in the graph, copies split the graphs, and
CUDAGRAPH=0 / TIMING=1 launch kernel by kernel.

Every replay test runs twice: on the CPU with `EmulatedGraph`, a graph that behaves as a CUDA graph does (it keeps
the launches it was recorded with and changes one only when told to), so the JIT's graph logic is tested without a
GPU; and on CUDA with real CUDA graphs (skipped where no GPU answers)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from test_jit import run_steps

from glassgrad import Context, Device, GlobalCounters, Tensor, TinyJit, Variable, nn, no_grad
from glassgrad.device import Launch
from glassgrad.engine.jit import _Copy, _graph_kernels, _Kernel, _KernelGraph
from glassgrad.nn import optim, state


# ---------------------------------------------------------------------- grouping kernels into graphs (no device)
def _kernel(device: str, name: str = "k") -> _Kernel:
    return _Kernel(None, name, device, (1,), None, 1, 0, 0, [], [])


def _shape(steps: Sequence[object]) -> list[str]:
    return [f"graph {g.device} x{len(g.kernels)}" if isinstance(g, _KernelGraph) else
            f"kernel {g.device}" if isinstance(g, _Kernel) else "copy" for g in steps]


def test_runs_of_kernels_become_graphs_and_copies_split_them() -> None:
    k = _kernel
    steps = [k("CUDA"), k("CUDA"), _Copy(0, 1), k("CUDA"), k("CUDA"), k("CUDA"), k("CPU"), k("CUDA"), _Copy(1, 0),
             k("CUDA"), k("CUDA:1"), k("CUDA:1"), k("CUDA")]
    grouped = _graph_kernels(steps, lambda device: device.startswith("CUDA"))  # type: ignore[arg-type]
    assert _shape(grouped) == ["graph CUDA x2", "copy", "graph CUDA x3", "kernel CPU", "kernel CUDA", "copy",
                               "kernel CUDA", "graph CUDA:1 x2", "kernel CUDA"]
    flat = [s for g in grouped for s in (g.kernels if isinstance(g, _KernelGraph) else [g])]
    assert flat == steps  # nothing dropped, nothing reordered


def test_devices_without_graphs_keep_every_launch() -> None:
    steps = [_kernel("CPU") for _ in range(4)]
    assert _graph_kernels(steps, lambda device: False) == steps  # type: ignore[arg-type]


def test_changing_launches_are_the_kernels_reading_inputs_or_variables() -> None:
    fixed, reads_input = _kernel("CUDA"), _kernel("CUDA")
    reads_input.inputs = [(0, 0)]
    graph = _KernelGraph("CUDA", [fixed, reads_input, fixed])
    assert graph.changing == [1]


def test_launch_same_as_compares_handles_by_identity() -> None:
    a, b = object(), object()
    launch = Launch("prg", [a, b], (4,), None, (3,))
    assert launch.same_as(Launch("prg", [a, b], (4,), None, (3,)))
    assert not launch.same_as(Launch("prg", [b, a], (4,), None, (3,)))
    assert not launch.same_as(Launch("prg", [a, b], (5,), None, (3,)))
    assert not launch.same_as(Launch("prg", [a, b], (4,), None, (2,)))


# ---------------------------------------------------------------------- replays through graphs
class EmulatedGraph:
    """A `LaunchGraph` for the CPU that behaves as a CUDA graph: it keeps copies of the launches it was recorded with,
    changes one only in `update`, and runs them all, in order, when called."""
    made: list[EmulatedGraph] = []

    def __init__(self, launches: list[Launch]) -> None:
        self.launches = [dataclasses.replace(launch, args=list(launch.args)) for launch in launches]
        self.runs = 0
        EmulatedGraph.made.append(self)

    def update(self, index: int, launch: Launch) -> None:
        assert launch.program is self.launches[index].program, "a graph update keeps the kernel"
        self.launches[index] = dataclasses.replace(launch, args=list(launch.args))

    def __call__(self) -> None:
        self.runs += 1
        for launch in self.launches:
            launch()


@pytest.fixture(params=["CPU", "CUDA"])
def device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The default device for one test: the CPU with `EmulatedGraph`, or CUDA with its graphs."""
    if request.param == "CUDA":
        request.getfixturevalue("cuda")  # skips without a GPU
    else:
        EmulatedGraph.made.clear()
        monkeypatch.setattr(Device["CPU"], "graph", EmulatedGraph)
    monkeypatch.setattr(Device, "DEFAULT", request.param)
    return str(request.param)


def _arr(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _chain(x: Tensor, w: Tensor) -> Tensor:
    h = (x * w).contiguous()
    for i in range(4):
        h = (h * 1.5 + i).contiguous()  # one kernel per link
    return (h + w).sum(axis=0)


def _chain_numpy(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    h = x * w
    for i in range(4):
        h = h * np.float32(1.5) + np.float32(i)
    return (h + w).sum(0)


def _graphs(f: TinyJit, *args: object) -> list[_KernelGraph]:
    capture = f.capture_of(*args)
    assert capture is not None
    return capture.graphs


def test_replay_equals_numpy_with_new_inputs_each_call(device: str) -> None:
    f = TinyJit(_chain)
    for i in range(6):
        x, w = _arr(8, 16, seed=i), _arr(8, 16, seed=50 + i)
        np.testing.assert_allclose(f(Tensor(x), Tensor(w)).numpy(), _chain_numpy(x, w), rtol=1e-5, atol=1e-5)
    graphs = _graphs(f, Tensor(x), Tensor(w))
    assert len(graphs) == 1 and len(graphs[0].kernels) == 6 and graphs[0].graph is not None
    reading_inputs = sum(bool(k.inputs) for k in graphs[0].kernels)
    assert graphs[0].updates == 3 * reading_inputs  # recorded at call 3; calls 4, 5, 6 had new buffers


def test_only_changed_launches_are_updated(device: str) -> None:
    """A fixed weight passed again is the same buffer: its kernels keep their launch; a new x updates its kernel."""
    f = TinyJit(_chain)
    w = Tensor(_arr(8, 16, seed=99)).realize()
    xs = [Tensor(_arr(8, 16, seed=i)).realize() for i in range(3)]
    for x in (xs[0], xs[1], xs[2]):  # eager, capture, first replay (records the graph)
        f(x, w)
    graph = _graphs(f, xs[0], w)[0]
    assert graph.updates == 0
    for x, updated in ((xs[2], 0), (xs[0], 1), (xs[0], 1), (xs[1], 2), (xs[2], 3), (xs[2], 3)):
        np.testing.assert_allclose(f(x, w).numpy(), _chain_numpy(x.numpy(), w.numpy()), rtol=1e-5, atol=1e-5)
        assert graph.updates == updated  # only the kernel reading x: (x * w)


def test_swapped_buffers_with_new_contents(device: str) -> None:
    """Two input buffers used in turn while their contents change between calls (written in place)."""
    f = TinyJit(_chain)
    a, b = Tensor(_arr(8, 16, seed=1)).realize(), Tensor(_arr(8, 16, seed=2)).realize()
    for i in range(8):
        x, w = (a, b) if i % 2 == 0 else (b, a)
        new = _arr(8, 16, seed=10 + i)
        x.assign(Tensor(new)).realize()
        np.testing.assert_allclose(f(x, w).numpy(), _chain_numpy(new, w.numpy()), rtol=1e-5, atol=1e-5)


def test_input_written_in_place_by_the_graph(device: str) -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        x.assign(x * 2).realize()
        return ((x + 1).contiguous() * 3).realize()

    for i in range(5):
        x = Tensor(np.full(4, i + 1.0, np.float32))
        x.assign(x).realize()
        out = f(x)
        np.testing.assert_allclose(x.numpy(), (i + 1.0) * 2)
        np.testing.assert_allclose(out.numpy(), ((i + 1.0) * 2 + 1) * 3)


def test_variable_values_change_the_launches(device: str) -> None:
    v = Variable("n", 1, 10)
    data = [_arr(10, 6, seed=i) for i in range(4)]

    @TinyJit
    def f(x: Tensor, n: object) -> Tensor:
        return ((x[:n] * 2 + 1).contiguous().exp() * 0.5).sum(axis=1)

    full = [Tensor(d).realize() for d in data]
    calls = [(0, 3), (1, 3), (2, 5), (2, 5), (3, 7), (0, 2), (1, 10), (1, 1)]
    for i, n in calls:
        out = f(full[i], v.bind(n))
        assert out.shape == (v.bind(n),)
        np.testing.assert_allclose(out.numpy(), (np.exp(data[i][:n] * 2 + 1) * 0.5).sum(1), rtol=1e-5, atol=1e-5)
    graphs = _graphs(f, full[0], v.bind(3))
    assert len(graphs) == 1 and graphs[0].graph is not None
    assert graphs[0].changing == list(range(len(graphs[0].kernels)))  # every kernel has the Variable
    updates = graphs[0].updates
    f(full[1], v.bind(1))  # the same buffer and value as the call before: nothing to update
    assert graphs[0].updates == updates


def _train(steps: int, jit: bool) -> tuple[np.ndarray, list[np.ndarray], TinyJit | None]:
    Tensor.manual_seed(5)
    layers: list[Callable[[Tensor], Tensor]] = [nn.Conv2d(1, 4, 3), nn.BatchNorm(4), Tensor.relu,
                                                Tensor.max_pool2d, lambda x: x.flatten(1), nn.Linear(36, 5)]
    params = state.get_parameters(layers)
    opt = optim.Adam(params, lr=0.01)

    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = x.sequential(layers).sparse_categorical_crossentropy(y).backward()
            with no_grad():
                Tensor.realize_all(loss, *opt.schedule_step())
        return loss

    run = TinyJit(step) if jit else step
    losses = run_steps(run, steps, seed=11)
    return losses, [p.numpy() for p in params], run if isinstance(run, TinyJit) else None


def test_training_through_graphs_equals_eager(device: str) -> None:
    eager_losses, eager_params, _ = _train(8, jit=False)
    losses, params, jitted = _train(8, jit=True)
    np.testing.assert_allclose(losses, eager_losses, rtol=1e-4, atol=1e-5)
    for p, q in zip(params, eager_params):
        np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)
    assert jitted is not None and jitted.captures == 1
    capture = next(iter(jitted._captures.values()))
    assert capture.graphs and all(g.graph is not None for g in capture.graphs)


def test_counters_count_every_kernel_of_a_graph(device: str) -> None:
    f = TinyJit(_chain)
    x, w = Tensor(_arr(8, 16, seed=0)).realize(), Tensor(_arr(8, 16, seed=1)).realize()
    for _ in range(3):
        f(x, w)
    GlobalCounters.reset()
    f(x, w)
    capture = f.capture_of(x, w)
    assert capture is not None and GlobalCounters.kernel_count == capture.kernel_count == 6
    assert GlobalCounters.global_ops > 0


@pytest.mark.parametrize("flags", [{"CUDAGRAPH": 0}, {"TIMING": 1}])
def test_cudagraph_0_and_timing_launch_kernel_by_kernel(device: str, flags: dict[str, int]) -> None:
    f = TinyJit(_chain)
    with Context(**flags):
        for i in range(5):
            x, w = _arr(8, 16, seed=i), _arr(8, 16, seed=20 + i)
            np.testing.assert_allclose(f(Tensor(x), Tensor(w)).numpy(), _chain_numpy(x, w), rtol=1e-5, atol=1e-5)
    graphs = _graphs(f, Tensor(x), Tensor(w))
    assert len(graphs) == 1 and graphs[0].graph is None  # never recorded
    x = _arr(8, 16, seed=40)
    np.testing.assert_allclose(f(Tensor(x), Tensor(w)).numpy(), _chain_numpy(x, w), rtol=1e-5, atol=1e-5)
    assert graphs[0].graph is not None  # flags back on: the next replay records it


def test_emulated_graph_runs_the_replays(device: str) -> None:
    """The CPU tests above went through the emulated graph (not around it): each replay ran it once."""
    if device != "CPU":
        pytest.skip("the emulation is the CPU's")
    f = TinyJit(_chain)
    x, w = Tensor(_arr(8, 16, seed=0)).realize(), Tensor(_arr(8, 16, seed=1)).realize()
    for _ in range(5):
        f(x, w)
    assert len(EmulatedGraph.made) == 1 and EmulatedGraph.made[0].runs == 3


# ---------------------------------------------------------------------- copies inside a capture (CUDA)
def test_copies_between_devices_split_the_graphs(cuda: str) -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        h = x.to(cuda)
        for i in range(3):
            h = (h * 2 + i).contiguous()
        back = h.to("CPU")
        return ((back + 1).contiguous().to(cuda) * 3 + h).contiguous()

    for i in range(5):
        data = _arr(64, seed=i)
        expected = data
        for k in range(3):
            expected = expected * np.float32(2) + np.float32(k)
        out = f(Tensor(data, device="CPU"))
        np.testing.assert_allclose(out.numpy(), (expected + 1) * 3 + expected, rtol=1e-5, atol=1e-5)
    capture = f.capture_of(Tensor(data, device="CPU"))
    assert capture is not None and any(isinstance(s, _Copy) for s in capture.steps)
    assert capture.graphs and all(g.graph is not None and g.device == "CUDA" for g in capture.graphs)
