"""LOCAL and GROUP opts compute the right numbers: kernels with explicit launch-shape opts run on the EMULATED Metal
device (real threads, real barriers: a group reduction that reads another thread's partial result too early, or a
thread id mapped to the wrong element, shows as wrong numbers) and are compared with the same kernel, unoptimised,
on the CPU backend, on the same random inputs."""
from __future__ import annotations

from collections.abc import Callable

import metal_emulator
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgrad import Tensor, dtypes
from glassgrad.codegen import get_program, optimize_ast
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.codegen.opt.search import random_inputs, run_program
from glassgrad.device import Compiled, Device
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

# (these tests run schedules' kernel ASTs by hand: their float constants stay literals)
pytestmark = [metal_emulator.needs_cxx, pytest.mark.usefixtures("literal_constants")]
L, G, U, R = OptOps.LOCAL, OptOps.GROUP, OptOps.UPCAST, OptOps.UNROLL


@pytest.fixture
def metal(monkeypatch: pytest.MonkeyPatch) -> Compiled:
    device = metal_emulator.create_emulated_device()
    monkeypatch.setitem(Device._devices, "METAL", device)
    return device


def rand(*shape: int, seed: int = 0) -> Tensor:
    return Tensor(np.random.default_rng(seed).standard_normal(shape, dtype=np.float32), device="METAL")


WORKLOADS: dict[str, Callable[[], Tensor]] = {
    "elementwise": lambda: (rand(64, 48) * 2).exp(),
    "wide elementwise": lambda: (rand(32, 64) * 2).exp(),
    "row sums": lambda: rand(16, 512).sum(axis=1),
    "column sums": lambda: rand(128, 48).sum(axis=0),
    "sum of two axes": lambda: rand(6, 16, 64).sum(axis=(1, 2)),
    "int max": lambda: Tensor(np.arange(8 * 256, dtype=np.int32).reshape(8, 256) % 97, device="METAL").max(axis=1),
    "softmax (two reductions, one reads the other)": lambda: rand(8, 64).softmax(-1),
    "short rows": lambda: (rand(64, 64) * rand(64, 64, seed=1)).sum(axis=1),
    "vector runs": lambda: rand(32, 64) * rand(32, 64, seed=1) + 1,
    "vector runs, half": lambda: (rand(16, 64).cast(dtypes.float16) * 2).cast(dtypes.float16),
    "vector runs, a misaligned view": lambda: rand(8, 65)[:, 1:] * 3,
    "transposed copy": lambda: rand(64, 96).T + 1,
    "rows of 64 that continue": lambda: rand(4, 3, 16, 64).cast(dtypes.float16) * 3,
}


def last_ast(out: Tensor) -> UOp:
    schedule, _ = create_schedule([out.uop])
    return optimize_ast(schedule[-1].ast, Device["METAL"].renderer)


def run(dev: Compiled, ast: UOp, opts: list[Opt]) -> np.ndarray:
    spec = get_program(ast, dev.renderer, opts)
    return run_program(dev, spec, dev.compiler.compile(spec.source), random_inputs(ast))[1][0]


def check(metal: Compiled, ast: UOp, opts: list[Opt]) -> None:
    got, want = run(metal, ast, opts), run(Device["CPU"], ast, [])
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    else:
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name, opts", [
    ("elementwise", [Opt(L, 1, 0), Opt(L, 0, 4)]),           # 48 x 4 threads, two axes flattened into the thread id
    ("elementwise", [Opt(L, 0, 16)]),                         # threads along the outer axis, the inner one a loop
    ("elementwise", [Opt(L, 1, 16), Opt(U, 0, 4)]),           # and 4 rows per thread
    ("elementwise", [Opt(L, 1, 16), Opt(L, 0, 8), Opt(OptOps.SWAP, 0, 1)]),
    ("row sums", [Opt(G, 1, 64)]),                            # 64 threads share a row: 8 elements each, then a tree
    ("row sums", [Opt(G, 1, 0)]),                             # the whole row: one element per thread
    ("row sums", [Opt(R, 1, 4), Opt(L, 0, 16)]),              # threads along the rows, each an unrolled loop
    ("column sums", [Opt(L, 0, 16), Opt(R, 2, 8)]),  # (the LOCAL made axis 1 a local one)
    ("column sums", [Opt(G, 1, 32)]),
    ("sum of two axes", [Opt(G, 2, 32)]),
    ("sum of two axes", [Opt(G, 1, 16)]),                     # the outer reduce axis: strided shares
    ("int max", [Opt(G, 1, 128)]),
    ("softmax (two reductions, one reads the other)", [Opt(G, 2, 16)]),
    ("softmax (two reductions, one reads the other)", [Opt(L, 1, 0)]),
    ("row sums", [Opt(L, 0, 4), Opt(G, 2, 64)]),              # 4 groups of 64 threads, each its own segment
    ("row sums", [Opt(G, 1, 32), Opt(L, 0, 8)]),              # LOCAL after GROUP: the group stays innermost
    ("int max", [Opt(L, 0, 4), Opt(G, 2, 16)]),
    ("softmax (two reductions, one reads the other)", [Opt(L, 0, 4), Opt(G, 3, 16)]),
    ("sum of two axes", [Opt(L, 0, 2), Opt(G, 3, 8)]),
    ("transposed copy", [Opt(U, 0, 4), Opt(L, 1, 32), Opt(L, 0, 8)]),  # a vector load along the read's rows
    ("rows of 64 that continue", [Opt(U, 3, 8), Opt(L, 3, 0), Opt(L, 2, 16)]),  # a group over several rows
])
def test_launch_opts_keep_results(metal: Compiled, name: str, opts: list[Opt]) -> None:
    ast = last_ast(WORKLOADS[name]())
    spec = get_program(ast, metal.renderer, opts)
    assert spec.opts == tuple(opts) and spec.local_size is not None
    threads = spec.local_size[0]
    assert threads == Kernel(ast, metal.renderer).apply_opts(opts).threads()  # the launch has the opts' threads
    check(metal, ast, opts)


@pytest.mark.parametrize("name, opts, vectors", [
    ("vector runs", [Opt(U, 1, 4), Opt(L, 1, 0), Opt(L, 0, 16)], 3),  # two loads and the store, 16 bytes each
    ("vector runs", [Opt(U, 1, 8), Opt(L, 1, 0)], 6),                 # 8 floats: two 16-byte accesses each
    ("vector runs, half", [Opt(U, 1, 8), Opt(L, 1, 0)], 3),           # 8 float32 in (two accesses), 8 half out
    ("vector runs, half", [Opt(U, 1, 2), Opt(L, 1, 0)], 2),           # 8 bytes in, 4 bytes out
    ("vector runs, a misaligned view", [Opt(U, 1, 4), Opt(L, 1, 0)], 1),  # the store; the load is 4 bytes off
])
def test_vector_runs(metal: Compiled, name: str, opts: list[Opt], vectors: int) -> None:
    """An innermost upcast loop's contiguous, aligned loads and stores move as one access of up to 16 bytes, with
    MSL's address spaces on both sides, and compute what the CPU does."""
    ast = last_ast(WORKLOADS[name]())
    source = get_program(ast, metal.renderer, opts).source
    assert source.count("device uint") == vectors and source.count("thread uint") == vectors, source
    check(metal, ast, opts)


@pytest.mark.parametrize("name, expected", [
    ("wide elementwise", [Opt(L, 1, 0), Opt(L, 0, 4)]),  # 64 x 4 = 256 threads
    ("row sums", [Opt(G, 1, 256)]),
    ("int max", [Opt(G, 1, 256)]),
    ("short rows", [Opt(L, 0, 16), Opt(G, 2, 16)]),  # 16 threads a row of 64, 16 rows a work-group
])
def test_heuristic_launch_opts(metal: Compiled, name: str, expected: list[Opt]) -> None:
    """The GPU heuristic's LOCAL/GROUP opts on the emulated device, against the CPU."""
    ast = last_ast(WORKLOADS[name]())
    assert hand_coded_optimizations(Kernel(ast, metal.renderer)) == expected
    check(metal, ast, expected)


@pytest.mark.parametrize("name", list(WORKLOADS))
@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_launch_opts_raise_or_agree(metal: Compiled, name: str, data: st.DataObject) -> None:
    """Any sequence of actions (LOCAL and GROUP included): each either raises KernelOptError, changing nothing, or
    applies, and the emulated GPU kernel computes what the unoptimised CPU kernel does."""
    ast = last_ast(WORKLOADS[name]())
    k = Kernel(ast, metal.renderer)
    ops = st.sampled_from([L, G, L, G, U, R, OptOps.SWAP])
    for _ in range(data.draw(st.integers(1, 3))):
        opt = Opt(data.draw(ops), data.draw(st.integers(0, 4)), data.draw(st.sampled_from([0, 2, 4, 8, 16, 32])))
        before = k.ast
        try:
            k.apply_opt(opt)
        except KernelOptError:
            assert k.ast is before
    check(metal, ast, k.applied)


def test_group_reduce_in_ir(metal: Compiled) -> None:
    """GROUP is a GROUP_REDUCE over the work-group's threads: 64 threads, each looping over 8 of the 512."""
    ast = last_ast(WORKLOADS["row sums"]())
    spec = get_program(ast, metal.renderer, [Opt(G, 1, 64)])
    assert spec.local_size == (64, 1, 1) and spec.global_size == (16, 1, 1)
    assert [u.arg[1] for u in spec.uops if u.op is Ops.GROUP_REDUCE] == [64]
    assert [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE] == [8]


def test_an_upcast_output_of_a_reduction_keeps_its_loops_apart(metal: Compiled) -> None:
    """UPCAST of a column sum's whole output axis (hypothesis found it): the upcast loop is one node, opened inside
    the reduction's loop and again for the store after it, and the vector runs rendered around it were rendered
    around both (a store inside the reduction, a load of the reduction's index after its loop: no compile)."""
    ast = last_ast(WORKLOADS["column sums"]())
    check(metal, ast, [Opt(U, 0, 0)])
