"""The CUDA runtime (glassgrad/runtime/ops_cuda.py): NVRTC compiling, with or without a GPU, and the driver API.

Compile tests need only cuda-bindings and NVRTC (skipped when those are not installed). Execution tests need a GPU
and skip, with the reason, when cuInit fails.
"""
from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed (pip install 'glassgrad[cuda]')")

from glassgrad.device import Buffer, Compiled, Device, Launch  # noqa: E402
from glassgrad.dtype import dtypes  # noqa: E402
from glassgrad.runtime import ops_cuda  # noqa: E402
from glassgrad.runtime.ops_cuda import CUDAAllocator, CUDACompiler, CUDAError, CUDAProgram  # noqa: E402

ADD_SRC = """extern "C" __global__ void add(float* out, const float* a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] += a[i];
}
"""


@pytest.fixture(scope="module")
def compiler() -> CUDACompiler:
    try:
        return CUDACompiler("sm_90")
    except RuntimeError as e:
        pytest.skip(f"NVRTC is not available: {e}")


@pytest.fixture(scope="module")
def cuda() -> Compiled:
    try:
        return Device["CUDA"]
    except RuntimeError as e:
        pytest.skip(f"no usable CUDA GPU: {e}")


# ---------- compiling: no GPU needed ----------

def test_compile_to_cubin(compiler: CUDACompiler) -> None:
    binary = compiler.compile(ADD_SRC)
    assert binary[:4] == b"\x7fELF"


def test_compile_half_and_bfloat16_headers(compiler: CUDACompiler) -> None:
    src = ('#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n'
           'extern "C" __global__ void cvt(half* out, const __nv_bfloat16* a) { out[0] = (half)((float)a[0]); }\n')
    assert compiler.compile(src)[:4] == b"\x7fELF"


def test_compile_error_shows_log_and_source(compiler: CUDACompiler) -> None:
    src = 'extern "C" __global__ void broken(float* out) { out[0] = not_declared; }\n'
    with pytest.raises(RuntimeError) as info:
        compiler.compile(src)
    message = str(info.value)
    assert "not_declared" in message and "is undefined" in message  # NVRTC's log
    assert src.strip() in message  # the whole source
    assert "sm_90" in message


def test_cache_key_has_arch_and_nvrtc_version(compiler: CUDACompiler) -> None:
    major, minor = ops_cuda.nvrtc_version()
    assert "sm_90" in compiler.cache_key and f"nvrtc {major}.{minor}" in compiler.cache_key
    assert CUDACompiler("sm_80").cache_key != compiler.cache_key


def test_disk_cache(compiler: CUDACompiler, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    binary = CUDACompiler("sm_90").compile_cached(ADD_SRC)
    assert len(list((tmp_path / "kernels").glob("*.checked"))) == 1

    fresh = CUDACompiler("sm_90")  # empty memory cache: must read the file, not run NVRTC

    def no_compile(src: str) -> bytes:
        raise AssertionError("compiled again instead of reading the disk cache")
    monkeypatch.setattr(fresh, "compile", no_compile)
    assert fresh.compile_cached(ADD_SRC) == binary


def test_renderer_needs_no_gpu() -> None:
    assert type(ops_cuda.create_renderer()).__name__ == "CUDARenderer"


def test_glassgrad_imports_without_cuda_bindings() -> None:
    script = textwrap.dedent("""
        import sys
        sys.modules["cuda"] = None  # as if cuda-bindings were not installed
        import glassgrad, glassgrad.device
        try:
            import glassgrad.runtime.ops_cuda
        except ImportError as e:
            assert "pip install" in str(e), e
            print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr


# ---------- executing: a GPU needed ----------

def test_alloc_copy_round_trip(cuda: Compiled) -> None:
    data = np.arange(1000, dtype=np.float32) * 0.5
    handle = cuda.allocator.alloc(data.nbytes)
    cuda.allocator.copyin(handle, data.data.cast("B"))
    out = np.zeros_like(data)
    cuda.allocator.copyout(out.data.cast("B"), handle)
    np.testing.assert_array_equal(out, data)
    cuda.allocator.free(handle, data.nbytes)


def test_buffer_round_trip(cuda: Compiled) -> None:
    data = np.random.default_rng(0).standard_normal(4097).astype(np.float32)
    np.testing.assert_array_equal(Buffer("CUDA", data.size, dtypes.float32).copyin(data).numpy(), data)


def _upload(cuda: Compiled, array: np.ndarray) -> Buffer:
    return Buffer("CUDA", array.size, dtypes.float32).copyin(array)


def test_launch_add_kernel(cuda: Compiled) -> None:
    n = 1000  # not a multiple of the block: the last block's extra threads must do nothing
    out, a = np.arange(n, dtype=np.float32), np.full(n, 2.5, dtype=np.float32)
    out_buf, a_buf = _upload(cuda, out), _upload(cuda, a)
    prg = cuda.program("add", cuda.compiler.compile_cached(ADD_SRC))
    assert prg(out_buf.handle, a_buf.handle, global_size=((n + 127) // 128,), local_size=(128,), vals=(n,)) == 0.0
    cuda.synchronize()
    np.testing.assert_array_equal(out_buf.numpy(), out + a)


def test_launch_after_another_context_was_made_current(cuda: Compiled) -> None:
    """A launch does not set its context each time: when another library left no context or another one current,
    the launch fails in the driver and is made again in the kernel's own context (right values, no error)."""
    from cuda.bindings import driver
    n = 300
    out, a = np.arange(n, dtype=np.float32), np.full(n, 1.5, dtype=np.float32)
    out_buf, a_buf = _upload(cuda, out), _upload(cuda, a)
    prg = cuda.program("add", cuda.compiler.compile_cached(ADD_SRC))
    dev = driver.cuDeviceGet(0)[1]
    try:
        status, other = driver.cuCtxCreate(None, 0, dev)  # cuda-bindings 13: (params, flags, device)
    except TypeError:
        status, other = driver.cuCtxCreate(0, dev)  # cuda-bindings 12: (flags, device)
    assert status == driver.CUresult.CUDA_SUCCESS, status
    try:
        for current in (None, other):
            driver.cuCtxSetCurrent(current)
            prg(out_buf.handle, a_buf.handle, global_size=((n + 127) // 128,), local_size=(128,), vals=(n,))
            cuda.synchronize()
        np.testing.assert_array_equal(out_buf.numpy(), out + 2 * a)
    finally:
        driver.cuCtxDestroy(other)
        cuda.synchronize()  # (makes this GPU's primary context current again)


def test_launch_timed_with_events(cuda: Compiled) -> None:
    n = 1 << 22
    out_buf, a_buf = _upload(cuda, np.zeros(n, np.float32)), _upload(cuda, np.ones(n, np.float32))
    prg = CUDAProgram("add", cuda.compiler.compile_cached(ADD_SRC))  # default: GPU 0
    seconds = prg(out_buf.handle, a_buf.handle, global_size=(n // 256, 1, 1), local_size=(256, 1, 1), vals=(n,),
                  wait=True)
    assert 0.0 < seconds < 1.0
    assert out_buf.numpy()[[0, n - 1]].tolist() == [1.0, 1.0]


def test_bad_launch_names_the_call(cuda: Compiled) -> None:
    buf = _upload(cuda, np.zeros(4, np.float32))
    prg = cuda.program("add", cuda.compiler.compile_cached(ADD_SRC))
    with pytest.raises(CUDAError, match="cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE"):
        prg(buf.handle, buf.handle, global_size=(1,), local_size=(4096,), vals=(4,))  # > 1024 threads a block


def test_graph_replays_updated_launches(cuda: Compiled) -> None:
    """Two launches of `add` as one CUDA graph: launched twice, then with node 1 moved to another buffer and size."""
    n = 1000
    out, a, b = np.arange(n, dtype=np.float32), np.full(n, 2.5, np.float32), np.full(n, -1.0, np.float32)
    out_buf, a_buf, b_buf = _upload(cuda, out), _upload(cuda, a), _upload(cuda, b)
    prg = cuda.program("add", cuda.compiler.compile_cached(ADD_SRC))
    launch = Launch(prg, [out_buf.handle, a_buf.handle], ((n + 127) // 128,), (128,), (n,))
    assert cuda.graph is not None
    graph = cuda.graph([launch, dataclasses.replace(launch)])
    graph()
    graph()
    np.testing.assert_array_equal(out_buf.numpy(), out + 4 * a)
    graph.update(1, Launch(prg, [out_buf.handle, b_buf.handle], (1,), (128,), (100,)))  # the first 100 only
    graph()
    expected = out + 5 * a
    expected[:100] += b[:100]
    np.testing.assert_array_equal(out_buf.numpy(), expected)
    # updated again: the node's parameters are changed in place, the earlier update must not linger
    graph.update(1, Launch(prg, [out_buf.handle, a_buf.handle], (2,), (128,), (200,)))
    graph()
    expected += a
    expected[:200] += a[:200]
    np.testing.assert_array_equal(out_buf.numpy(), expected)
    with pytest.raises(ValueError, match="CUDAPrograms"):
        graph.update(0, Launch(lambda *args, **kw: None, [], (1,), None))
    with pytest.raises(ValueError, match="at least one launch"):
        cuda.graph([])


def test_copy_device_same_gpu(cuda: Compiled) -> None:
    data = np.arange(777, dtype=np.float32)
    src, dest = _upload(cuda, data), Buffer("CUDA", data.size, dtypes.float32)
    assert isinstance(cuda.allocator, CUDAAllocator)
    cuda.allocator.copy_device(dest.handle, src.handle, src.nbytes)
    np.testing.assert_array_equal(dest.numpy(), data)


def test_copy_device_between_gpus(cuda: Compiled) -> None:
    try:
        other = Device["CUDA:1"]
    except RuntimeError as e:
        pytest.skip(f"peer copy needs two GPUs: {e}")
    data = np.arange(555, dtype=np.float32)
    src, dest = _upload(cuda, data), Buffer("CUDA:1", data.size, dtypes.float32)
    assert isinstance(other.allocator, CUDAAllocator) and isinstance(cuda.allocator, CUDAAllocator)
    other.allocator.copy_device(dest.handle, src.handle, src.nbytes, src_allocator=cuda.allocator)
    np.testing.assert_array_equal(dest.numpy(), data)


def test_out_of_memory_is_memory_error(cuda: Compiled) -> None:
    with pytest.raises(MemoryError, match="out of memory"):
        cuda.allocator.alloc(1 << 50)  # a petabyte


def test_bad_device_index(cuda: Compiled) -> None:
    with pytest.raises(RuntimeError, match=r"CUDA device 99 not found: \d+ devices? available"):
        ops_cuda.create_device("CUDA:99")
