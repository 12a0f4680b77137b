"""Linearizer tests: several upcast ranges (a register tile with an accumulator array indexed by their flattened
combination) and unrolled reduce ranges, compiled and run on the CPU against numpy, plus the loop placement
(hoisting) of what the inner loops do not change."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor
from glassgrad.codegen import get_program, optimize_ast
from glassgrad.codegen.linearize import Scopes, linearize, split_range
from glassgrad.device import Device
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

# the kernels here are rendered for the CPU and run on the tensors' buffers: those must be CPU buffers; they run
# schedules' kernel ASTs by hand, without the items' values for lifted constants
pytestmark = [pytest.mark.skipif(Device.DEFAULT != "CPU", reason=f"CPU kernels on {Device.DEFAULT} buffers"),
              pytest.mark.usefixtures("literal_constants")]


def split(ast: UOp, rng: UOp, amount: int, kind: str) -> tuple[UOp, UOp]:
    ast, _, inner = split_range(ast, rng, amount, kind)
    return ast, inner


def ranges(ast: UOp, kind: str) -> list[UOp]:
    return sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.arg[1] == kind), key=lambda u: u.arg[0])


def run_shaped(out: Tensor, shape: list[tuple[int, int, str]], upcast_order: list[int] | None = None) -> np.ndarray:
    """Schedule `out` (its last kernel), split (range index, amount, kind) as listed, run it, return the result.
    `upcast_order`: positions into the new upcast ranges, outermost first (default: as created)."""
    schedule, _ = create_schedule([out.uop])
    for item in schedule[:-1]:
        from glassgrad.engine.realize import run_item
        run_item(item)
    item = schedule[-1]
    dev = Device["CPU"]
    ast = optimize_ast(item.ast, dev.renderer)
    original = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda u: u.arg[0])
    upcasts: list[UOp] = []
    for index, amount, kind in shape:
        rng = next(u for u in ast.toposort() if u.op is Ops.RANGE and u.arg == original[index].arg)
        ast, inner = split(ast, rng, amount, kind)
        if kind == "upcast":
            upcasts.append(inner)
    order = upcast_order if upcast_order is not None else list(range(len(upcasts)))
    program = linearize(ast, tuple(upcasts[i] for i in order))
    source = dev.renderer.render("k", program)
    lib = dev.program("k", dev.compiler.compile(source))
    outer = ranges(ast, "global")
    lib(*[b.handle for b in item.bufs], global_size=(outer[0].src[0].arg,) if outer else (1,), work=0)
    return item.bufs[0].numpy().reshape(out.shape)


@pytest.fixture
def mats() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((32, 24), dtype=np.float32), rng.standard_normal((24, 48), dtype=np.float32)


@pytest.mark.parametrize("shape", [
    [(0, 4, "upcast"), (1, 16, "upcast")],                      # 4x16 register tile
    [(0, 8, "upcast"), (1, 8, "upcast"), (2, 4, "unroll")],     # plus an unrolled reduce
    [(1, 3, "upcast"), (0, 2, "upcast"), (1, 4, "upcast")],     # three upcasts, one range split twice
    [(2, 6, "unroll")],                                         # unroll alone
])
def test_matmul_register_tiles(mats: tuple[np.ndarray, np.ndarray], shape: list[tuple[int, int, str]]) -> None:
    a, b = mats
    got = run_shaped(Tensor(a) @ Tensor(b), shape)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_upcast_order_is_free(mats: tuple[np.ndarray, np.ndarray]) -> None:
    a, b = mats
    got = run_shaped(Tensor(a) @ Tensor(b), [(0, 4, "upcast"), (1, 16, "upcast")], upcast_order=[1, 0])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_two_reductions_with_upcasts() -> None:
    """softmax's last kernel reads two reductions (max, then sum of exp); both keep a row of accumulators."""
    x = np.random.default_rng(1).standard_normal((8, 32), dtype=np.float32)
    t = Tensor(x)
    out = (t - t.max(axis=1, keepdim=True)).exp()
    out = out / out.sum(axis=1, keepdim=True)
    got = run_shaped(out, [(0, 4, "upcast")])
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_elementwise_upcasts() -> None:
    x = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
    got = run_shaped(Tensor(x) * 2 + 1, [(0, 4, "upcast"), (1, 8, "upcast")])
    np.testing.assert_array_equal(got, x * 2 + 1)


def test_loads_hoisted_out_of_upcast_loops(mats: tuple[np.ndarray, np.ndarray]) -> None:
    """In `acc[i][j] += a[i, k] * b[k, j]` the load of a sits inside the i loop and outside the j loop."""
    a, b = mats
    schedule, _ = create_schedule([(Tensor(a) @ Tensor(b)).uop])
    ast = optimize_ast(schedule[-1].ast, Device["CPU"].renderer)
    i, j = ranges(ast, "global")
    ast, ui = split(ast, i, 4, "upcast")
    ast, uj = split(ast, j, 8, "upcast")
    program = linearize(ast, (ui, uj))
    depth, depth_of_load = 0, []
    for u in program:
        depth += 1 if u.op is Ops.RANGE else -1 if u.op is Ops.ENDRANGE else 0
        if u.op is Ops.LOAD:
            depth_of_load.append(depth)
    # global i, global j, reduce k, upcast i (load a here), upcast j (load b here)
    assert depth_of_load == [4, 5]
    acc = next(u for u in program if u.op is Ops.DEFINE_ACC)
    assert acc.src[1:] == (ui, uj)
    source = Device["CPU"].renderer.render("k", program)
    assert f"acc0[(ridx{ui.arg[0]}*16+ridx{uj.arg[0]})]" in source  # rows padded to 16: aligned
    assert "#pragma GCC unroll 4" in source and "#pragma omp simd" in source


def test_values_of_outer_loops_are_computed_there() -> None:
    """A per-channel value (`1/sqrt(v[c])`) of a kernel over (batch, channel, position) is computed once per
    channel, in a variable before the loop over positions, not inlined into it; the result matches numpy."""
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal((4, 8, 16), dtype=np.float32), rng.random(8, dtype=np.float32) + 0.5
    out = Tensor(x) * Tensor(v).sqrt().reciprocal().reshape(1, 8, 1)
    schedule, _ = create_schedule([out.uop])
    source = get_program(schedule[-1].ast, Device["CPU"].renderer).source
    lines = source.splitlines()
    inner = max(i for i, text in enumerate(lines) if text.lstrip().startswith("for ("))
    assert any("sqrtf(" in text and " = " in text for text in lines[:inner])
    assert not any("sqrtf(" in text for text in lines[inner:])
    np.testing.assert_allclose(out.numpy(), x / np.sqrt(v)[None, :, None], rtol=1e-5)


def test_hoisting_leaves_reductions_in_their_tiles() -> None:
    """Values computed from a reduction are not hoisted with the loop-invariant ones: a row sum with accumulator
    lanes (and softmax: a max and a sum per row, then the row) reads its input once per pass, in its lane loops, not
    again in a scalar loop emitted early; the results match numpy."""
    a = np.random.default_rng(1).standard_normal((8, 256), dtype=np.float32)
    shifted = np.exp(a - a.max(1, keepdims=True))
    for out, expected in ((Tensor(a).sum(axis=1), a.sum(axis=1)),
                          (Tensor(a).softmax(-1), shifted / shifted.sum(1, keepdims=True))):
        for item in create_schedule([out.uop])[0]:
            spec = get_program(item.ast, Device["CPU"].renderer)
            loads = [u.src[0].arg for u in spec.uops if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL]
            assert loads and all(spec.source.count(f"data{n}[") == loads.count(n) <= 2 for n in set(loads)), spec.source
        np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def _recomputed_reductions(spec_uops: tuple[UOp, ...]) -> list[tuple[str, ...]]:
    """For each accumulator, the loops open around it that its reduction does not depend on (it would be computed
    again on each of their iterations)."""
    scopes = Scopes()
    open_loops: list[UOp] = []
    found = []
    for u in spec_uops:
        if u.op is Ops.RANGE:
            open_loops.append(u)
        elif u.op is Ops.ENDRANGE:
            open_loops.remove(u.src[0])
        elif u.op is Ops.DEFINE_ACC:
            extra = [r for r in open_loops if r not in scopes(u.arg) and r not in u.src[1:] and r.arg[1] != "stage"]
            if extra:
                found.append(tuple(f"ridx{r.arg[0]}" for r in extra))
    return found


GRAPHS = {
    "softmax": lambda x: x.softmax(), "softmax_of_transpose": lambda x: x.T.softmax(),
    "log_softmax_axis0": lambda x: x.log_softmax(0), "var": lambda x: x.var(1), "std_axis0": lambda x: x.std(0),
    "matmul_softmax": lambda x: (x @ x.T).softmax(), "argmax": lambda x: x.argmax(1), "cumsum": lambda x: x.cumsum(1),
    "mean_minus_max": lambda x: x.mean(0) - x.max(1, keepdim=True),
    "conv": lambda x: x.reshape(2, 3, 16, 32).conv2d(x[:4, :27].reshape(4, 3, 3, 3), padding=1),
}


@pytest.mark.parametrize("name", list(GRAPHS))
def test_no_reduction_runs_inside_a_loop_it_does_not_depend_on(name: str) -> None:
    """Every kernel's reductions sit only in loops they depend on (their own, the loops of their value and their tile's
    lanes): softmax of a transposed view once ran its max and sum once per output block, 30x slower."""
    x = Tensor(np.random.default_rng(0).standard_normal((48, 64)).astype(np.float32))
    schedule, _ = create_schedule([GRAPHS[name](x).uop])
    for item in schedule:
        if item.ast.op is not Ops.COPY:
            spec = get_program(item.ast, Device["CPU"].renderer)
            assert not _recomputed_reductions(spec.uops), (spec.name, _recomputed_reductions(spec.uops))
