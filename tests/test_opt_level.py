"""The per-kernel C optimisation level (`OptOps.OPTLEVEL`): its validation, the values it computes (each level the
same), how it reaches the compiler (the source's first line, the flags, compile batches split by level), the caches
that key on it (kernels, compiled binaries, BEAM's winners), and the heuristic's choice by kernel kind and compiler."""
from __future__ import annotations

import ctypes
import json
import pathlib
import subprocess
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from glassgrad import Context, Tensor
from glassgrad.codegen import get_program, kernel_ast
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps, search
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations, kernel_kind
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.codegen.opt.search import actions, beam_search, random_inputs, run_program, stored_buffers
from glassgrad.device import Device
from glassgrad.engine import realize
from glassgrad.renderer.cstyle import ClangRenderer, opt_level_line, opt_level_of
from glassgrad.renderer.cuda import CUDARenderer
from glassgrad.runtime import ops_cpu
from glassgrad.runtime.ccompiler import compiler_info
from glassgrad.schedule import ScheduleItem, create_schedule
from glassgrad.uop.ops import UOp

CPU = Device["CPU"]
LEVEL3 = Opt(OptOps.OPTLEVEL, 0, 3)
RNG = np.random.default_rng(11)


def arr(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape, dtype=np.float32)


def schedule_of(out: Tensor) -> list[ScheduleItem]:
    """The kernels of `out` (copies left out); their inputs are not realized (each is run on random inputs)."""
    schedule, _ = create_schedule([out.uop])
    return [item for item in schedule if item.ast.op not in realize.NOT_KERNELS]


def last_ast(out: Tensor) -> UOp:
    return schedule_of(out)[-1].ast


def kernel_for(ast: UOp, renderer: ClangRenderer | None = None) -> Kernel:
    renderer = renderer or CPU.renderer
    return Kernel(kernel_ast(ast, renderer), renderer)


def tile(ast: UOp) -> list[Opt]:
    """The heuristic's opts for `ast`, without an OPTLEVEL."""
    return [o for o in hand_coded_optimizations(kernel_for(ast)) if o.op is not OptOps.OPTLEVEL]


WORKLOADS: dict[str, Callable[[], Tensor]] = {
    "conv 3x3 padded": lambda: Tensor(arr(2, 8, 12, 12)).conv2d(Tensor(arr(16, 8, 3, 3)), padding=1),
    "conv 3x3 stride 2": lambda: Tensor(arr(2, 4, 13, 13)).conv2d(Tensor(arr(8, 4, 3, 3)), stride=2, padding=1),
    "softmax rows of 77": lambda: Tensor(arr(64, 77)).softmax(-1),
    "layernorm rows of 77": lambda: Tensor(arr(64, 77)).layernorm(),
    "matmul 40x70 @ 70x33": lambda: Tensor(arr(40, 70)) @ Tensor(arr(70, 33)),
    "max_pool 3x3": lambda: Tensor(arr(2, 8, 20, 20)).max_pool2d(3, 2, padding=1),
    "avg_pool 2x2": lambda: Tensor(arr(2, 8, 20, 20)).avg_pool2d(2),
    "gelu": lambda: Tensor(arr(30, 700)).gelu(),
    "relu of 20x20 maps": lambda: Tensor(arr(2, 64, 20, 20)).relu() * 2,
    "row sum float16": lambda: Tensor(arr(96, 77).astype(np.float16)).sum(axis=1),
}


# ---------------------------------------------------------------------------------------------- the opt itself

def test_optlevel_is_validated_and_a_later_one_replaces_an_earlier_one() -> None:
    k = kernel_for(last_ast(WORKLOADS["matmul 40x70 @ 70x33"]()))
    assert k.opt_level is None
    with pytest.raises(KernelOptError, match="-O2 already"):
        k.copy().apply_opt(Opt(OptOps.OPTLEVEL, 0, 2))
    for bad, message in ((Opt(OptOps.OPTLEVEL, 0, 4), "one of"), (Opt(OptOps.OPTLEVEL, 0, 0), "one of"),
                         (Opt(OptOps.OPTLEVEL, 1, 3), "axis must be 0")):
        with pytest.raises(KernelOptError, match=message):
            k.copy().apply_opt(bad)
    k.apply_opt(LEVEL3)
    assert k.opt_level == 3 and k.copy().opt_level == 3
    with pytest.raises(KernelOptError, match="-O3 already"):
        k.copy().apply_opt(LEVEL3)
    k.apply_opt(Opt(OptOps.OPTLEVEL, 0, 2))
    assert k.opt_level == 2
    assert get_program(k.ast, CPU.renderer, []).opt_level is None


def test_optlevel_is_for_cpu_kernels_only() -> None:
    """A GPU renderer has no levels: the opt is rejected (and BEAM never offers it there)."""
    cuda = CUDARenderer()
    ast = last_ast(Tensor(arr(64, 64)).sum(axis=1))
    k = Kernel(kernel_ast(ast, cuda), cuda)
    with pytest.raises(KernelOptError, match="no optimisation levels"):
        k.apply_opt(LEVEL3)
    assert not any(a.op is OptOps.OPTLEVEL for a in actions(k))
    assert [a for a in actions(kernel_for(ast)) if a.op is OptOps.OPTLEVEL] == [Opt(OptOps.OPTLEVEL, 0, 2), LEVEL3]


def test_the_level_is_the_sources_first_line_and_survives_a_rename() -> None:
    ast = last_ast(WORKLOADS["conv 3x3 padded"]())
    spec = get_program(ast, CPU.renderer, [*tile(ast), LEVEL3])
    assert spec.opt_level == 3 and spec.source.startswith(opt_level_line(3) + "\n")
    assert opt_level_of(spec.source) == 3
    plain = get_program(ast, CPU.renderer, tile(ast))
    assert plain.opt_level is None and opt_level_of(plain.source) is None
    assert spec.source == opt_level_line(3) + "\n" + plain.source  # (the same kernel otherwise)
    renamed = spec.renamed("other_name", CPU.renderer)
    assert opt_level_of(renamed.source) == 3 and "void other_name(" in renamed.source
    # a batch renames a kernel whose name another kernel of the batch has: the level stays
    distinct = realize._distinct_name(spec, {spec.name}, "CPU")
    assert distinct.name != spec.name and opt_level_of(distinct.source) == 3


# ---------------------------------------------------------------------------------------------- values

def run_levels(ast: UOp, opts: list[Opt]) -> dict[int, list[np.ndarray]]:
    """The kernel's outputs on fixed random inputs (its lifted constants all 1.5, as BEAM runs them), built at each
    CPU level with `opts`."""
    inputs, outputs = random_inputs(ast, seed=5), stored_buffers(ast)
    results = {}
    for level in CPU.renderer.opt_levels:
        spec = get_program(ast, CPU.renderer, [*opts, *([Opt(OptOps.OPTLEVEL, 0, level)] if level != 2 else [])])
        assert opt_level_of(spec.source) == (None if level == 2 else level)
        results[level] = run_program(CPU, spec, CPU.compiler.compile(spec.source), inputs, outputs,
                                     vals=search.test_values(spec))[1]
    return results


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_level_computes_the_same_values(name: str) -> None:
    """Each kernel of each workload, with the heuristic's tile and with no opts, built at -O2 and at -O3: the same
    outputs (the flags of both keep -ffp-contract=off and no fast-math; only how the loops are compiled changes).
    Floats are compared to 1e-6 relative (a compiler may vectorise an `omp simd` sum with another width)."""
    for item in schedule_of(WORKLOADS[name]()):
        for opts in (tile(item.ast), []):
            results = run_levels(item.ast, opts)
            for level, outs in results.items():
                for got, want in zip(outs, results[2]):
                    if got.dtype.kind == "f":
                        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{name} -O{level}")
                    else:
                        np.testing.assert_array_equal(got, want, err_msg=f"{name} -O{level}")


@pytest.mark.parametrize("level", [2, 3])
def test_tensors_realized_at_a_forced_level_match_numpy(level: int) -> None:
    x, w = arr(2, 3, 9, 9), arr(5, 3, 3, 3)
    s = arr(50, 77)
    with Context(CPU_OPT_LEVEL=level):
        conv = Tensor(x).conv2d(Tensor(w), padding=1).numpy()
        soft = Tensor(s).softmax(-1).numpy()
    pad = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 5, 9, 9), np.float64)
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,oc->nohw", pad[:, :, i:i + 9, j:j + 9], w[:, :, i, j])
    np.testing.assert_allclose(conv, want, rtol=1e-4, atol=1e-4)
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(soft, e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------- the compiler

@pytest.fixture
def compiler_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The command lines of the CPU compiler's runs during the test (compiles still happen)."""
    runs: list[list[str]] = []
    original = subprocess.run

    def recording(args: Any, *rest: Any, **kwargs: Any) -> Any:
        if isinstance(args, list) and args and args[0] == CPU.compiler.cc:
            runs.append(list(args))
        return original(args, *rest, **kwargs)
    monkeypatch.setattr(ops_cpu.subprocess, "run", recording)
    return runs


def _levels(run: list[str]) -> list[str]:
    return [a for a in run if a.startswith("-O")]


def test_a_kernels_level_is_the_compilers_flag(compiler_runs: list[list[str]]) -> None:
    ast = last_ast(WORKLOADS["conv 3x3 padded"]())
    for opts, flag in (([*tile(ast), LEVEL3], "-O3"), (tile(ast), "-O2")):
        CPU.compiler.compile(get_program(ast, CPU.renderer, opts).source)
        assert _levels(compiler_runs[-1]) == [flag]
    def flags(run: list[str]) -> list[str]:
        return [a for a in run[:run.index("-x")] if not a.startswith("-O")]
    assert flags(compiler_runs[-2]) == flags(compiler_runs[-1])  # (every other flag the same)


def test_a_batch_of_two_levels_is_two_compiler_runs(compiler_runs: list[list[str]], tmp_path: pathlib.Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels of -O2 and -O3 compiled together (`compile_cached_many`, as a schedule's batch is): one run per level,
    each with its flag, and each kernel's binary holds that kernel (a run of both at one level would build the other
    kernel at the wrong level)."""
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    asts = [last_ast(WORKLOADS[n]()) for n in ("conv 3x3 padded", "softmax rows of 77", "matmul 40x70 @ 70x33")]
    specs = [get_program(asts[0], CPU.renderer, [*tile(asts[0]), LEVEL3]),
             get_program(asts[1], CPU.renderer, tile(asts[1])),
             get_program(asts[2], CPU.renderer, [*tile(asts[2]), LEVEL3])]
    compiler = ops_cpu.ClangCompiler(CPU.compiler.info)  # (its own memory cache: nothing compiled before)
    binaries = compiler.compile_cached_many([s.source for s in specs])
    assert sorted(_levels(run)[0] for run in compiler_runs) == ["-O2", "-O3"]
    assert binaries[0] == binaries[2] != binaries[1]
    for spec, binary in zip(specs, binaries):
        library = tmp_path / f"{spec.name}.so"
        library.write_bytes(binary)
        assert hasattr(ctypes.CDLL(str(library)), spec.name)
    assert compiler.compile_batch([s.source for s in specs]) is None  # (one run cannot build both levels)


def test_the_probe_names_the_compiler_family() -> None:
    info = CPU.compiler.info
    assert info is not None and info.family in ("gcc", "clang")
    assert CPU.renderer.family == info.family
    for command, family in (("gcc", "gcc"), ("clang", "clang")):
        try:
            assert compiler_info(command).family == family
        except Exception as e:  # noqa: BLE001  (a machine without this compiler)
            assert "not found" in str(e)


# ---------------------------------------------------------------------------------------------- the caches

def test_the_kernel_cache_keys_on_the_forced_level(compiler_runs: list[list[str]], tmp_path: pathlib.Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The same conv realized under CPU_OPT_LEVEL=2 and =3: each setting builds its own kernel (the kernel cache's
    key has the flag), at its own level; neither reuses the other's."""
    monkeypatch.setenv("CACHEDIR", str(tmp_path))  # (a shape no other test builds: nothing in the compile caches)
    x, w = Tensor(arr(2, 8, 13, 11)).realize(), Tensor(arr(16, 8, 3, 3)).realize()
    built: dict[int, Any] = {}
    for level in (2, 3):
        before = set(realize._kernel_cache)
        with Context(CPU_OPT_LEVEL=level):
            out = x.conv2d(w, padding=1).numpy()
        new = [realize._kernel_cache[k] for k in set(realize._kernel_cache) - before]
        (conv,) = [k for k in new if k.spec.name.startswith("r_")]
        built[level] = (conv, out)
        assert conv.spec.opt_level == (3 if level == 3 else None)
        assert opt_level_of(conv.spec.source) == conv.spec.opt_level
    assert built[2][0].program is not built[3][0].program
    np.testing.assert_allclose(built[2][1], built[3][1], rtol=1e-6, atol=1e-6)
    assert {_levels(run)[0] for run in compiler_runs} >= {"-O2", "-O3"}
    with Context(CPU_OPT_LEVEL=3):  # built before: reused, nothing compiled
        runs = len(compiler_runs)
        x.conv2d(w, padding=1).realize()
        assert len(compiler_runs) == runs


def test_beam_chooses_a_level_and_caches_it(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                            compiler_runs: list[list[str]]) -> None:
    """A search where every -O3 candidate times fastest returns opts ending with OPTLEVEL 3; the winner goes to
    BEAM's disk cache with its level, and the next search (and a realize with BEAM) reads it back: the kernel runs
    built at -O3, and is right."""
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    a, b = arr(40, 70), arr(70, 33)
    ast = last_ast(Tensor(a) @ Tensor(b))
    original_run = search.run_program

    def o3_is_fast(dev, spec, binary, inputs, outputs=(0,), best=float("inf"), vals=None):  # type: ignore[no-untyped-def]
        _, out = original_run(dev, spec, binary, inputs, outputs, best, vals)
        return (0.1 if spec.opt_level == 3 else 1.0), out
    monkeypatch.setattr(search, "run_program", o3_is_fast)
    with Context(IGNORE_BEAM_CACHE=1):
        opts = beam_search(ast, "CPU", 2)
    assert LEVEL3 in opts
    (path,) = (tmp_path / "beam").glob("*.json")
    assert ["OPTLEVEL", 0, 3] in json.loads(path.read_text())
    monkeypatch.setattr(search, "run_program", lambda *args, **kwargs: pytest.fail("searched again"))
    assert beam_search(ast, "CPU", 2) == opts
    runs = len(compiler_runs)
    with Context(BEAM=2):
        out = (Tensor(a) @ Tensor(b)).numpy()
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    assert [_levels(run) for run in compiler_runs[runs:]] == [["-O3"]]


def test_beams_cache_key_has_the_heuristics_level() -> None:
    """BEAM's first candidate is the heuristic's kernel, whose level CPU_OPT_LEVEL changes: the disk cache's key
    has it."""
    from glassgrad.codegen.opt.search import _cache_path
    ast = last_ast(WORKLOADS["conv 3x3 padded"]())
    paths = set()
    for level in (0, 2, 3):
        with Context(CPU_OPT_LEVEL=level):
            paths.add(_cache_path(ast, CPU, 2))
    assert len(paths) == 3


# ---------------------------------------------------------------------------------------------- the heuristic

@pytest.mark.parametrize("name, kind", [
    ("conv 3x3 padded", "window"), ("conv 3x3 stride 2", "window"), ("avg_pool 2x2", "window"),
    ("max_pool 3x3", "reduction"), ("softmax rows of 77", "short row"), ("layernorm rows of 77", "short row"),
    ("matmul 40x70 @ 70x33", "reduction"), ("gelu", "elementwise"), ("relu of 20x20 maps", "short row")])
def test_kernel_kinds(name: str, kind: str) -> None:
    ast = last_ast(WORKLOADS[name]())
    k = kernel_for(ast)
    assert kernel_kind(k.copy().apply_opts(tile(ast))) == kind


@pytest.mark.parametrize("family, windows, rows", [("gcc", 3, 3), ("clang", None, None), ("", None, None)])
def test_the_heuristic_picks_the_level_by_kind_and_compiler(family: str, windows: int | None,
                                                            rows: int | None) -> None:
    """gcc: -O3 for window sums and short rows, -O2 (no opt) for the rest; clang and an unknown compiler: -O2.
    A tiny kernel (which gcc builds without optimisation anyway) gets no level."""
    renderer = ClangRenderer(native_half=CPU.renderer.native_half, omp_simd=CPU.renderer.omp_simd,
                             vector_bytes=CPU.renderer.vector_bytes, max_lanes=CPU.renderer.max_lanes, family=family)

    def level(out: Tensor) -> int | None:
        opts = hand_coded_optimizations(kernel_for(last_ast(out), renderer))
        return next((o.amount for o in opts if o.op is OptOps.OPTLEVEL), None)
    assert level(WORKLOADS["conv 3x3 padded"]()) == windows
    assert level(WORKLOADS["softmax rows of 77"]()) == rows
    assert level(WORKLOADS["max_pool 3x3"]()) is None
    assert level(WORKLOADS["matmul 40x70 @ 70x33"]()) is None
    assert level(Tensor(arr(4, 3, 6, 6)).conv2d(Tensor(arr(2, 3, 3, 3)))) is None  # (tiny)
    with Context(CPU_OPT_LEVEL=3):
        assert level(WORKLOADS["matmul 40x70 @ 70x33"]()) == 3
    with Context(CPU_OPT_LEVEL=2):
        assert level(WORKLOADS["conv 3x3 padded"]()) is None
