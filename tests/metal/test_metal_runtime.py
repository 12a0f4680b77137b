"""glassgrad/runtime/ops_metal.py against a FAKE `Metal` module (tests/metal/fake_metal.py), on any OS.

What is checked: the calls ops_metal makes (shared buffers, fast math off, pipeline set before buffers, buffer i at
index i with offset 0, launch sizes, commit/wait order), its caches, its errors (compile error, missing kernel, too
many threads, failed command buffer) and, because the fake runs dispatched kernels with the emulator, that results
come back right through copyin/copyout. What is not: that real Metal behaves like the fake. No Mac has run this.
"""
from __future__ import annotations

import sys

import fake_metal
import metal_emulator
import numpy as np
import pytest

from glassgrad import Tensor
from glassgrad.device import Compiled, Device
from glassgrad.runtime import ops_metal
from glassgrad.runtime.ops_metal import MetalError

pytestmark = metal_emulator.needs_cxx  # the fake runs kernels on the emulator

ADD_ONE = """#include <metal_stdlib>
using namespace metal;
kernel void add_one(device float* data0 [[buffer(0)]], const device float* data1 [[buffer(1)]], \
uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) {
  int i = (int)gid.x * 4 + lid.x;
  if (i >= 10) return;
  data0[i] = data1[i] + 1.0f;
}
"""


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> fake_metal.Device:
    module, device = fake_metal.make_module()
    monkeypatch.setitem(sys.modules, "Metal", module)
    return device


@pytest.fixture
def metal(fake: fake_metal.Device) -> Compiled:
    return ops_metal.create_device("METAL")


def upload(metal: Compiled, array: np.ndarray) -> object:
    handle = metal.allocator.alloc(array.nbytes)
    metal.allocator.copyin(handle, array.view(np.uint8).reshape(-1).data)
    return handle


def download(metal: Compiled, handle: object, count: int, dtype: type = np.float32) -> np.ndarray:
    out: np.ndarray = np.empty(count, dtype=dtype)
    metal.allocator.copyout(out.view(np.uint8).data, handle)
    return out


def test_without_pyobjc_says_what_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "Metal", None)  # `import Metal` raises ImportError
    with pytest.raises(RuntimeError, match="METAL needs macOS with pyobjc-framework-Metal"):
        ops_metal.create_device("METAL")
    assert type(ops_metal.create_renderer()).__name__ == "MetalRenderer"  # rendering needs no Mac


def test_only_one_device_name(fake: fake_metal.Device) -> None:
    with pytest.raises(ValueError, match="one device, 'METAL'"):
        ops_metal.create_device("METAL:1")


def test_buffers_are_shared_storage_and_round_trip(metal: Compiled, fake: fake_metal.Device) -> None:
    data = np.arange(10, dtype=np.float32)
    handle = upload(metal, data)
    assert ("newBuffer", 40, 0) in fake.log  # 0 is the fake's MTLResourceStorageModeShared
    np.testing.assert_array_equal(download(metal, handle, 10), data)


def test_dispatch_binds_buffers_in_order_and_runs(metal: Compiled, fake: fake_metal.Device) -> None:
    out, inp = metal.allocator.alloc(40), upload(metal, np.arange(10, dtype=np.float32))
    program = metal.program("add_one", metal.compiler.compile(ADD_ONE))
    fake.log.clear()
    assert program(out, inp, global_size=(3,), local_size=(4,)) == 0.0  # asynchronous: no time yet
    assert fake.log == [("setComputePipelineState", program.pipeline), ("setBuffer", out, 0, 0),
                        ("setBuffer", inp, 0, 1), ("dispatch", (3, 1, 1), (4, 1, 1)), ("endEncoding",), ("commit",)]
    assert not fake.command_buffers[-1].completed
    np.testing.assert_array_equal(download(metal, out, 10), np.arange(10, dtype=np.float32) + 1)
    assert fake.command_buffers[-1].completed  # copyout waited for the kernel


def test_integer_arguments_follow_the_buffers(metal: Compiled, fake: fake_metal.Device) -> None:
    out, inp = metal.allocator.alloc(40), metal.allocator.alloc(40)
    program = metal.program("add_one", metal.compiler.compile(ADD_ONE))
    fake.log.clear()
    program(out, inp, global_size=(3,), local_size=(4,), vals=(7,))
    assert ("setBytes", (7).to_bytes(4, "little"), 4, 2) in fake.log


def test_wait_returns_gpu_time(metal: Compiled, fake: fake_metal.Device) -> None:
    out, inp = metal.allocator.alloc(40), metal.allocator.alloc(40)
    program = metal.program("add_one", metal.compiler.compile(ADD_ONE))
    assert program(out, inp, global_size=(3,), local_size=(4,), wait=True) == pytest.approx(0.25)
    assert fake.log[-1] == ("waitUntilCompleted",)


def test_fast_math_off_and_library_compiled_once(metal: Compiled, fake: fake_metal.Device) -> None:
    binary = metal.compiler.compile(ADD_ONE)
    metal.program("add_one", binary)
    metal.program("add_one", binary)
    assert fake.compiled_sources == [ADD_ONE]
    assert fake.options[0].fast_math is False


def test_compile_error_has_log_and_source(metal: Compiled) -> None:
    src = ADD_ONE.replace("+ 1.0f", "+ GG_FAKE_COMPILE_ERROR")
    with pytest.raises(MetalError) as info:
        metal.compiler.compile(src)
    assert "undeclared identifier 'GG_FAKE_COMPILE_ERROR'" in str(info.value) and src in str(info.value)


def test_missing_kernel_name(metal: Compiled) -> None:
    with pytest.raises(MetalError, match="'other' is not in its compiled library"):
        metal.program("other", metal.compiler.compile(ADD_ONE))


def test_too_many_threads_per_threadgroup(metal: Compiled, fake: fake_metal.Device) -> None:
    fake.max_threads = 256
    program = metal.program("add_one", metal.compiler.compile(ADD_ONE))
    with pytest.raises(MetalError, match="needs 512 threads per threadgroup; this GPU allows 256"):
        program(metal.allocator.alloc(40), metal.allocator.alloc(40), global_size=(1,), local_size=(512,))


def test_failed_command_buffer_raises_at_synchronize(metal: Compiled, fake: fake_metal.Device) -> None:
    program = metal.program("add_one", metal.compiler.compile(ADD_ONE))
    fake.fail_next_command = True
    program(metal.allocator.alloc(40), metal.allocator.alloc(40), global_size=(3,), local_size=(4,))
    with pytest.raises(MetalError, match="kernel add_one failed on the GPU: Execution of the command buffer"):
        metal.synchronize()
    metal.synchronize()  # reported once, then forgotten


def test_failed_command_buffer_raises_when_waited_for(metal: Compiled, fake: fake_metal.Device) -> None:
    program = metal.program("add_one", metal.compiler.compile(ADD_ONE))
    fake.fail_next_command = True
    with pytest.raises(MetalError, match="failed on the GPU"):
        program(metal.allocator.alloc(40), metal.allocator.alloc(40), global_size=(3,), local_size=(4,), wait=True)


def test_tensors_run_through_ops_metal(metal: Compiled, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real MetalRenderer's kernels, launched by ops_metal on the fake (whose GPU is the emulator)."""
    monkeypatch.setitem(Device._devices, "METAL", metal)
    a = np.arange(600, dtype=np.float32).reshape(2, 300) / 100
    x = Tensor(a, device="METAL")
    np.testing.assert_allclose(((x * 2).exp().sum(axis=1)).numpy(), np.exp(a * 2).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose((x @ x.T).numpy(), a @ a.T, rtol=1e-5)
