"""The engine and its observability: GlobalCounters, DEBUG output, kernels(), the compile cache, the allocator."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import glassgrad
from glassgrad import Context, Device, GlobalCounters, Tensor
from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.kernels import renderer_for
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops

REPO = pathlib.Path(__file__).resolve().parent.parent

# these tests run schedules' kernel ASTs by hand, or count the kernels that distinct constants make
pytestmark = pytest.mark.usefixtures("literal_constants")


def test_global_counters_count_kernels_flops_and_bytes() -> None:
    a, b = Tensor.rand(64, 64).realize(), Tensor.rand(64, 64).realize()
    GlobalCounters.reset()
    with Context(TIMING=1):  # GPU kernels are timed only when asked (it costs a sync per kernel)
        (a * b + 1).realize()
    assert GlobalCounters.kernel_count == 1
    assert GlobalCounters.global_ops == 2 * 64 * 64          # one MUL and one ADD per element
    assert GlobalCounters.global_mem == 3 * 64 * 64 * 4      # two inputs read, one output written
    assert GlobalCounters.time_sum_s > 0
    GlobalCounters.reset()
    assert GlobalCounters.kernel_count == 0 and GlobalCounters.global_ops == 0


def test_debug_2_prints_a_line_per_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    x = Tensor.rand(32, 16).realize()
    with Context(DEBUG=2):
        x.sum(axis=1).realize()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("***")]
    assert len(lines) == 1
    assert "r_32_16" in lines[0] and "us" in lines[0] and "GFLOP/s" in lines[0] and "GB/s" in lines[0]


def test_debug_4_prints_the_source(capsys: pytest.CaptureFixture[str]) -> None:
    x = Tensor.rand(5, 7).realize()
    with Context(DEBUG=4):
        (x * 3.5).realize()
    out = capsys.readouterr().out
    assert "E_5_7(" in out and "3.5f" in out


def test_kernels_lists_without_running() -> None:
    a, b, c = Tensor.rand(8, 8), Tensor.rand(8, 8), Tensor.rand(8, 8)
    out = (a * b + c).relu()
    GlobalCounters.reset()
    ks = glassgrad.kernels(out)
    assert GlobalCounters.kernel_count == 0, "kernels() must not execute anything"
    assert len(ks) == 1
    k = ks[0]
    assert k.name == "E_8_8" and k.global_size and "data0" in k.source
    # CPU kernels have no work-groups; GPU kernels always have one
    assert (k.local_size is None) == (not renderer_for(Device.DEFAULT).has_local)
    # and the tensor is still lazy and still computes the same thing afterwards
    np.testing.assert_allclose(out.numpy(), np.maximum(a.numpy() * b.numpy() + c.numpy(), 0), rtol=1e-6)


def test_kernels_of_softmax() -> None:
    assert len(glassgrad.kernels(Tensor.rand(4, 10).softmax(), device="CPU")) == 1  # max and sum once per row
    assert len(glassgrad.kernels(Tensor.rand(4, 10).softmax(), device="CUDA")) == 1


def test_kernels_for_another_device_share_what_the_tensors_share() -> None:
    """Several tensors retargeted together: a node they share is computed once, as on their own device."""
    x = Tensor.rand(64, 64).realize()
    shared = (x @ x).relu()
    outs = (shared.sum(), shared.max(), shared * 2)
    assert len(glassgrad.kernels(*outs, device="CUDA")) == len(glassgrad.kernels(*outs)) == 4


def test_kernels_of_a_realized_tensor_is_empty() -> None:
    assert glassgrad.kernels(Tensor.rand(3).realize()) == []


def test_kernels_rejects_unknown_device() -> None:
    with pytest.raises(ValueError, match="unknown device"):
        glassgrad.kernels(Tensor.rand(3) + 1, device="TPU")


def _compile_script(marker: float) -> str:
    return textwrap.dedent(f"""
        import numpy as np
        from glassgrad import Tensor
        x = Tensor(np.arange(1000, dtype=np.float32))
        print(float((x * {marker} + 1).sum().item()))
    """)


def _run(code: str, cachedir: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "CACHEDIR": str(cachedir), "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_disk_cache_is_written_and_reused(tmp_path: pathlib.Path) -> None:
    first = _run(_compile_script(1.25), tmp_path)
    assert first.returncode == 0, first.stderr
    binaries = sorted((tmp_path / "kernels").glob("*.checked"))
    assert binaries, "compiling must leave a cached binary"
    stamps = {p: p.stat().st_mtime_ns for p in binaries}
    second = _run(_compile_script(1.25), tmp_path)
    assert second.returncode == 0 and second.stdout == first.stdout
    assert {p: p.stat().st_mtime_ns for p in binaries} == stamps, "a cached kernel must not be rewritten"
    assert not list(tmp_path.rglob("*.tmp")), "no temporary files may be left behind"


def test_cachelevel_0_writes_nothing(tmp_path: pathlib.Path) -> None:
    result = _run(_compile_script(2.5), tmp_path, CACHELEVEL="0")
    assert result.returncode == 0, result.stderr
    assert not [p for p in tmp_path.rglob("*") if p.is_file()], "CACHELEVEL=0 must leave nothing on disk"


def test_two_processes_share_the_cache_safely(tmp_path: pathlib.Path) -> None:
    """Two processes compiling the same new kernels at once: both succeed, both get the right answer."""
    code = _compile_script(3.75)
    env = {**os.environ, "CACHEDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(2)]
    outputs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    expected = float((np.arange(1000, dtype=np.float32) * np.float32(3.75) + 1).sum())
    for out, _ in outputs:
        assert float(out) == pytest.approx(expected, rel=1e-5)
    assert not list(tmp_path.rglob("*.tmp"))


def test_compile_error_shows_the_source() -> None:
    compiler = Device["CPU"].compiler
    with pytest.raises(RuntimeError, match="C compile failed") as info:
        compiler.compile("void broken( { this is not C }")
    assert "this is not C" in str(info.value)


def _new_kernels(count: int) -> tuple[list[Tensor], list[np.ndarray]]:
    """`count` tensors whose kernels nothing has compiled in this process (a fresh constant in each)."""
    marker = float(np.random.default_rng().integers(1, 1 << 20)) / 1024
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(x, device=Device.DEFAULT)
    outs = [(t * marker + i).sum(axis=i % 2) for i in range(count)]
    return outs, [(x * np.float32(marker) + np.float32(i)).sum(axis=i % 2) for i in range(count)]


def _record_compiles(monkeypatch: pytest.MonkeyPatch, threads: int) -> list[str]:
    """Run the compile pool with `threads` threads; returns the list the compiling threads' names go into."""
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", threads)
    compiler = Device[Device.DEFAULT].compiler
    original, names = compiler.compile_cached, []

    def record(src: str) -> bytes:
        names.append(threading.current_thread().name)
        return original(src)
    monkeypatch.setattr(compiler, "compile_cached", record)
    return names


def _compile_on_the_pool(monkeypatch: pytest.MonkeyPatch, threads: int, count: int) -> list[str]:
    """Realize `count` new kernels with `threads` compile threads: each is compiled once, on the pool, before any
    runs, and the results are the same as ever. Returns the names of the threads that compiled."""
    names = _record_compiles(monkeypatch, threads=threads)
    outs, expected = _new_kernels(count)
    Tensor.realize_all(*outs)
    assert len(names) == count and all(n.startswith("glassgrad-compile") for n in names)
    for out, want in zip(outs, expected):
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    return names


def test_new_kernels_of_a_schedule_compile_on_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    names = _compile_on_the_pool(monkeypatch, threads=2, count=4)
    Tensor.realize_all(*_new_kernels(1)[0])  # one new kernel: compiled right here, no pool
    assert len(names) == 5 and names[-1] == threading.current_thread().name


def test_compile_threads_1_still_compiles_beside_the_codegen(monkeypatch: pytest.MonkeyPatch) -> None:
    """One compile thread: the kernels are compiled there (while the calling thread renders the next ones)."""
    _compile_on_the_pool(monkeypatch, threads=1, count=3)


def test_a_compile_that_fails_on_the_pool_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", 2)

    def fail(src: str) -> bytes:
        raise RuntimeError("the compiler is out today")
    monkeypatch.setattr(Device[Device.DEFAULT].compiler, "compile_cached", fail)
    with pytest.raises(RuntimeError, match="the compiler is out today"):
        Tensor.realize_all(*_new_kernels(3)[0])


cpu_only = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="batches of kernels are the C compiler's")


def _count_compiler_runs(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> list[str]:
    """The sources handed to the C compiler from now on, one entry per compiler process. The disk cache is an empty
    folder, so no kernel of the test is found there (an earlier run with the same random constant would have been)."""
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    compiler = Device["CPU"].compiler
    original, runs = compiler._try_compile, []

    def record(src: str, *args: object) -> object:
        runs.append(src)
        return original(src, *args)  # type: ignore[arg-type]
    monkeypatch.setattr(compiler, "_try_compile", record)
    return runs


@cpu_only
def test_new_kernels_compile_in_batches(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """Six new kernels with distinct names on two threads: two compiler runs of three kernels each."""
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", 2)
    runs = _count_compiler_runs(monkeypatch, tmp_path)
    marker = float(np.random.default_rng().integers(1, 1 << 20)) / 1024
    x = np.arange(24, dtype=np.float32)
    t = Tensor(x)
    shapes = [(2, 12), (3, 8), (4, 6), (6, 4), (8, 3), (12, 2)]
    outs = [(t * marker).reshape(s).sum(axis=1) for s in shapes]
    Tensor.realize_all(*outs)
    assert len(runs) == 2 and all(src.count("_entry(void* const* gg_bufs") == 3 for src in runs)
    for out, shape in zip(outs, shapes):
        np.testing.assert_allclose(out.numpy(), (x * np.float32(marker)).reshape(shape).sum(axis=1), rtol=1e-6)


@cpu_only
def test_kernels_of_the_same_name_share_a_batch_under_distinct_names(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: pathlib.Path) -> None:
    """Four different kernels all named r_3_4, two threads: two compiler runs of two kernels each. In each run one
    keeps its name and the other is renamed, and every kernel computes its own result."""
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", 2)
    runs = _count_compiler_runs(monkeypatch, tmp_path)
    marker = float(np.random.default_rng().integers(1, 1 << 20)) / 1024
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    outs = [(Tensor(x) * marker + i).sum(axis=1) for i in range(4)]
    assert {spec.name for spec in glassgrad.kernels(*outs)} == {"r_3_4"}
    Tensor.realize_all(*outs)
    assert len(runs) == 2
    for src in runs:
        names = re.findall(r"void (r_3_4\w*)\(float", src)
        assert len(names) == 2 and len(set(names)) == 2 and "r_3_4" in names
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out.numpy(), (x * np.float32(marker) + np.float32(i)).sum(axis=1), rtol=1e-6)


@cpu_only
def test_a_renamed_kernel_gets_the_same_name_every_time(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: pathlib.Path) -> None:
    """The new name depends on the kernel alone, so a program that runs again finds its renamed kernels in the disk
    cache: two processes, each with two r_3_4 kernels in one batch, write the same two sources."""
    marker = float(np.random.default_rng().integers(1, 1 << 20)) / 1024
    code = textwrap.dedent(f"""
        import numpy as np
        from glassgrad import Device, Tensor
        compiler = Device["CPU"].compiler
        original = compiler._try_compile
        compiler._try_compile = lambda src, *args: print(repr(src)) or original(src, *args)
        x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
        Tensor.realize_all(*[(x * {marker} + i).sum(axis=1) for i in range(2)])
    """)
    sources = []
    for run in range(2):
        env = {**os.environ, "CACHEDIR": str(tmp_path / str(run)), "PYTHONPATH": str(REPO), "COMPILE_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        sources.append(proc.stdout)
    assert sources[0] == sources[1] and re.search(r"void r_3_4_\w+\(", sources[0])


@cpu_only
def test_kernels_with_the_same_source_compile_once(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    """Two different kernel ASTs (a reshape there and back, or not) that render to the same C: one copy is compiled,
    and both kernels use it."""
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", 2)
    runs = _count_compiler_runs(monkeypatch, tmp_path)
    marker = float(np.random.default_rng().integers(1, 1 << 20)) / 1024
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(x)
    outs = [(t * marker).sum(axis=1), (t.reshape(12).reshape(3, 4) * marker).sum(axis=1), (t * marker).sum(axis=0)]
    first, second, _ = glassgrad.kernels(*outs)
    assert first.source == second.source
    assert len({item.ast for item in create_schedule([o.uop for o in outs])[0]}) == 3
    Tensor.realize_all(*outs)
    assert len(runs) == 1 and runs[0].count("_entry(void* const* gg_bufs") == 2
    np.testing.assert_allclose(outs[0].numpy(), (x * np.float32(marker)).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(outs[1].numpy(), (x * np.float32(marker)).sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(outs[2].numpy(), (x * np.float32(marker)).sum(axis=0), rtol=1e-6)


def test_kernels_run_while_later_batches_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Six new kernels in two batches: the second batch's compile waits until the first kernel has run, which
    happens only if kernels start as soon as their own batch is built (and not after all batches are)."""
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", 2)
    outs, expected = _new_kernels(6)
    first_source = glassgrad.kernels(*outs)[0].source
    compiler = Device[Device.DEFAULT].compiler
    original_compile, original_run = compiler.compile_cached_many, realize.run_item
    first_ran, waits = threading.Event(), []

    def compile_many(sources: list[str]) -> list[bytes]:
        if first_source not in sources:
            waits.append(first_ran.wait(timeout=30))
        return original_compile(sources)

    def run_item(item: object) -> None:
        original_run(item)  # type: ignore[arg-type]
        first_ran.set()
    monkeypatch.setattr(compiler, "compile_cached_many", compile_many)
    monkeypatch.setattr(realize, "run_item", run_item)
    Tensor.realize_all(*outs)
    assert waits and all(waits)
    for out, want in zip(outs, expected):
        np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


def test_a_failed_compile_leaves_no_compiler_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """When compiling a schedule fails, every compile it started has finished by the time the error is raised (a
    compile left running would go on after the caller moved on: in a test, into the next test's counts)."""
    from glassgrad.engine import realize
    monkeypatch.setattr(realize, "COMPILE_THREADS", 2)
    compiler = Device[Device.DEFAULT].compiler
    original, started, finished = compiler.compile_cached_many, [], []

    def compile_many(sources: list[str]) -> list[bytes]:
        started.append(sources)
        try:
            if len(started) == 1:
                raise RuntimeError("the compiler is out today")
            return original(sources)
        finally:
            finished.append(sources)
    monkeypatch.setattr(compiler, "compile_cached_many", compile_many)
    with pytest.raises(RuntimeError, match="the compiler is out today"):
        Tensor.realize_all(*_new_kernels(6)[0])
    assert len(started) == len(finished)
    seen = len(started)
    realize._pool().submit(lambda: None).result()  # anything queued before this has run by now, or was dropped
    assert len(started) == seen


@cpu_only
def test_tiny_kernels_are_compiled_without_optimisation() -> None:
    """A kernel whose loops run at most TINY_KERNEL_ITERATIONS times in all is marked for gcc's -O0 (it costs less to
    compile, and it runs for microseconds either way); a bigger one keeps -O2. Both compute the same as numpy."""
    from glassgrad.renderer.cstyle import TINY_KERNEL_ITERATIONS
    marker = float(np.random.default_rng().integers(1, 1 << 20)) / 1024
    small = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)
    big = np.arange(TINY_KERNEL_ITERATIONS * 2, dtype=np.float32).reshape(-1, 16)
    outs = [(Tensor(small) * marker).sum(axis=1), (Tensor(big) * marker).sum(axis=1)]
    tiny, large = (spec.source for spec in glassgrad.kernels(*outs))
    assert 'optimize("O0")' in tiny and "optimize" not in large
    Tensor.realize_all(*outs)
    for out, x in zip(outs, (small, big)):
        np.testing.assert_allclose(out.numpy(), (x * np.float32(marker)).sum(axis=1), rtol=1e-5)


def test_index_strides_along_each_loop() -> None:
    """How far an index moves per step of each loop: affine sums and products by constants; None where not affine."""
    from glassgrad.renderer.cstyle import index_stride, index_strides
    from glassgrad.uop.ops import Ops, UOp
    r0, r1, r2 = (UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 8),), (i, "global")) for i in range(3))
    index = (r0 * 4 + r1) + (r2 * -3 + 7)
    assert index_strides(index) == {r0: 4, r1: 1, r2: -3}
    assert index_strides((r0 * 4 + r1) // 2 + r2) == {r0: None, r1: None, r2: 1}
    assert index_stride(r0 * 4, r1) == 0 and index_stride(r1, r1) == 1 and index_stride(r0 * r1, r0) is None


@cpu_only
def test_a_batch_with_a_broken_source_reports_that_source() -> None:
    """The batch does not compile, so each source is compiled alone: the good one is cached, the broken one raises
    its own error."""
    compiler = Device["CPU"].compiler
    marker = int(np.random.default_rng().integers(1 << 30))
    good = f"void good_{marker}(float* restrict out) {{ out[0] = {marker}.0f; }}\n"
    with pytest.raises(RuntimeError, match="C compile failed") as info:
        compiler.compile_cached_many([good, "void broken( { not C }"])
    assert "not C" in str(info.value)
    assert compiler._cached(compiler._key(good)) is not None


@cpu_only
def test_sources_with_file_local_helpers_are_not_batched() -> None:
    """bfloat16 kernels carry `static` helper functions, which one file cannot define twice."""
    x = Tensor(np.arange(8, dtype=np.float32)).cast("bfloat16")
    sources = [spec.source for spec in glassgrad.kernels(x + 1, x * 2)]
    assert all("static " in src for src in sources)
    assert Device["CPU"].compiler.compile_batch(sources) is None


def test_allocator_reuses_freed_memory() -> None:
    allocator = Device["CPU"].allocator
    buf = Buffer("CPU", 12345, dtypes.float32)
    handle = buf.handle
    address = handle.ctypes.data
    del buf, handle
    again = Buffer("CPU", 12345, dtypes.float32)
    assert again.handle.ctypes.data == address, "a freed block of the same size should be reused"
    assert allocator is Device["CPU"].allocator


def test_buffer_copyin_checks_size() -> None:
    buf = Buffer("CPU", 4, dtypes.float32)
    with pytest.raises(ValueError, match="bytes"):
        buf.copyin(np.zeros(5, np.float32))


def test_device_names() -> None:
    assert Device.canonicalize("cpu") == "CPU"
    assert Device.canonicalize("CUDA:0") == "CUDA"
    assert Device.canonicalize("cuda:1") == "CUDA:1"
    with pytest.raises(ValueError, match="unknown device"):
        Device.canonicalize("GPU9000")
    with pytest.raises(ValueError, match="index"):
        Device.canonicalize("CUDA:x")


def test_default_device_from_tinygrad_flags() -> None:
    """`CUDA=1 python train.py` (older tinygrad's spelling, in many tinygrad READMEs) picks CUDA, as DEV=CUDA does;
    it was ignored, and the program ran on the CPU without a word. Conflicting flags raise instead of guessing."""
    from glassgrad.device import default_device
    assert default_device({}) == "CPU"
    assert default_device({"CUDA": "1"}) == "CUDA"
    assert default_device({"NV": "1"}) == "CUDA"
    assert default_device({"METAL": "1", "CUDA": "0"}) == "METAL"
    assert default_device({"CLANG": "1"}) == "CPU"
    assert default_device({"DEV": "CUDA:1", "CUDA": "1"}) == "CUDA:1"
    assert default_device({"DEV": "METAL"}) == "METAL"
    with pytest.raises(ValueError, match="CUDA=1, METAL=1"):
        default_device({"CUDA": "1", "METAL": "1"})
    with pytest.raises(ValueError, match="DEV=CPU and CUDA=1"):
        default_device({"DEV": "CPU", "CUDA": "1"})


def test_default_device_flag_in_a_fresh_process() -> None:
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k not in ("DEV", "CUDA", "NV", "METAL", "CPU", "CLANG", "LLVM")}
    script = "from glassgrad import Device; print(Device.DEFAULT)"
    out = subprocess.run([sys.executable, "-c", script], env={**env, "METAL": "1"}, capture_output=True, text=True)
    assert out.stdout.strip() == "METAL", out.stderr


def test_cpu_threads_give_the_same_answer() -> None:
    """A kernel big enough to be split across threads computes what one thread computes."""
    x = np.random.default_rng(0).standard_normal((512, 300)).astype(np.float32)
    out = Tensor(x).sum(axis=1).numpy()
    np.testing.assert_allclose(out, x.sum(axis=1), rtol=1e-5, atol=1e-4)


def _deepest_brackets(source: str) -> int:
    depth = deepest = 0
    for ch in source:
        depth += {"(": 1, ")": -1}.get(ch, 0)
        deepest = max(deepest, depth)
    return deepest


@pytest.mark.parametrize("device", ["CPU", "CUDA", "METAL"])
def test_deep_chains_render_within_the_compilers_bracket_limit(device: str) -> None:
    """A chain of 1000 fused multiply-adds is one kernel, but not one expression 2000 operations deep: clang (and
    Apple's Metal compiler, which is clang) stops at 256 nested brackets. Deep expressions get variables."""
    x = Tensor.empty(3)
    for _ in range(1000):
        x = x * 1.0001 + 0.0001
    (kernel,) = glassgrad.kernels(x.cast(dtypes.float16), device=device)
    assert 0 < _deepest_brackets(kernel.source) < 128


def test_a_kernel_reading_more_buffers_than_a_ctypes_call_takes() -> None:
    """`sum(list_of_tensors)` of 1,100 tensors is one elementwise kernel of 1,101 buffers: ctypes calls a C function
    with at most 1,024 arguments, so it raised ArgumentError; such a launch goes through the kernel's `_entry`."""
    n = 1100
    parts = [Tensor(np.array([i, 1.0], np.float32), device=Device.DEFAULT) for i in range(n)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    np.testing.assert_array_equal(total.numpy(), [sum(range(n)), n])


def test_a_reduction_over_a_deep_elementwise_chain() -> None:
    """The staging pass walked a reduction's body recursively: a sum over 1,100 added tensors, reduced, raised
    RecursionError in codegen."""
    n = 1100
    parts = [Tensor(np.full((16, 16), float(i % 7), np.float32), device=Device.DEFAULT) for i in range(n)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    np.testing.assert_array_equal(total.sum(0).numpy(), np.full(16, sum(i % 7 for i in range(n)) * 16.0))


def test_a_permute_of_a_permute_is_one_permute() -> None:
    """A permute of a permute is one permute, none when they cancel (a transpose's gradient transposed back: flash
    attention's dK was a copy through two of them); values as numpy's."""
    x = Tensor(np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32))
    assert x.permute(2, 0, 1).permute(1, 2, 0).uop is x.uop
    twice = x.permute(2, 0, 1).permute(0, 2, 1)
    assert twice.uop.op is Ops.PERMUTE and twice.uop.src[0] is x.uop
    np.testing.assert_array_equal(twice.numpy(), x.numpy().transpose(2, 0, 1).transpose(0, 2, 1))
