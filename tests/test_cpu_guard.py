"""CPU_BUFFER_GUARD: guard bytes around CPU buffers catch a kernel (or copy) that writes outside a buffer, at once
and by name; normal work under the guard is silent and gives the same numbers."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from glassgrad import Device, Tensor
from glassgrad.runtime import cpu_guard, ops_cpu
from glassgrad.runtime.cpu_guard import GUARD_BYTES, BufferGuardError

pytestmark = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the CPU backend's buffers")

# data0[i] = data1[i] + 1 over [start, end + extra): `extra` elements past the outer loop's end, and `before`
# elements before its start (a kernel indexing one element too far either way)
KERNEL = """
void {name}(float* restrict data0, const float* restrict data1, int extra, int before, long long start,
            long long end) {{
  for (long long i = start - before; i < end + extra; i++) data0[i] = data1[i < end ? i : 0] + 1.0f;
}}
void {name}_entry(void* const* gg_bufs, const long long* gg_vals, long long start, long long end) {{
  {name}((float*)gg_bufs[0], (const float*)gg_bufs[1], (int)gg_vals[0], (int)gg_vals[1], start, end);
}}
"""


def _program(name: str) -> ops_cpu.GuardedCPUProgram:
    Device["CPU"]  # (makes the shared compiler and pool)
    compiler, pool = ops_cpu._COMPILER[0]
    return ops_cpu.GuardedCPUProgram(name, compiler.compile(KERNEL.format(name=name)), pool=pool)


def _buffers(n: int) -> tuple[ops_cpu.GuardedCPUAllocator, np.ndarray, np.ndarray]:
    allocator = ops_cpu.GuardedCPUAllocator()
    out, inp = allocator.alloc(4 * n), allocator.alloc(4 * n)
    allocator.copyin(inp, memoryview(np.arange(n, dtype=np.float32).view(np.uint8)))
    return allocator, out, inp


@pytest.mark.parametrize("n", [1, 7, 17, 1021])
def test_in_bounds_kernel_is_silent(n: int) -> None:
    allocator, out, inp = _buffers(n)
    _program(f"gg_guard_ok_{n}")(out, inp, global_size=(n,), vals=(0, 0), work=n)
    result = np.empty(n, np.float32)
    allocator.copyout(memoryview(result.view(np.uint8)), out)
    np.testing.assert_array_equal(result, np.arange(n, dtype=np.float32) + 1)


@pytest.mark.parametrize("n", [1, 7, 16, 1021])
def test_one_element_past_the_end_is_caught(n: int) -> None:
    _, out, inp = _buffers(n)
    with pytest.raises(BufferGuardError) as info:
        _program("gg_guard_past_end")(out, inp, global_size=(n,), vals=(1, 0), work=n)
    e = info.value
    assert (e.kernel, e.argument, e.nbytes, e.offset, e.damaged) == ("CPU kernel gg_guard_past_end", 0, 4 * n, 4 * n, 4)
    assert "gg_guard_past_end" in str(e) and f"byte {4 * n}" in str(e)
    cpu_guard.check_guards((out, inp), "nothing")  # the damage is reported once: the guard is whole again


def test_one_element_before_the_start_is_caught() -> None:
    _, out, inp = _buffers(5)
    with pytest.raises(BufferGuardError) as info:
        _program("gg_guard_before")(out, inp, global_size=(5,), vals=(0, 1), work=5)
    assert (info.value.argument, info.value.offset) == (0, -4) and "4 bytes before its start" in str(info.value)


def test_caught_on_the_thread_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split over the C pool's threads (the last chunk writes past the end) the write is caught as on one thread."""
    monkeypatch.setattr(ops_cpu, "THREADS", 2)
    monkeypatch.setattr(ops_cpu, "MIN_WORK_PER_THREAD", 1)
    _, out, inp = _buffers(1000)
    program = _program("gg_guard_pool")
    assert program.entry is not None
    with pytest.raises(BufferGuardError) as info:
        program(out, inp, global_size=(1000,), vals=(3, 0), work=1000)
    assert (info.value.offset, info.value.damaged) == (4000, 12)


def test_damage_is_found_at_the_next_copy() -> None:
    """Damage by something other than a checked launch (a stray thread, a foreign library) shows at the next copy."""
    allocator, out, _ = _buffers(3)
    ctypes.memset(out.ctypes.data + out.nbytes + GUARD_BYTES - 1, 0, 1)  # the last guard byte
    with pytest.raises(BufferGuardError) as info:
        allocator.copyout(memoryview(np.empty(3, np.float32).view(np.uint8)), out)
    assert info.value.offset == 12 + GUARD_BYTES - 1 and "copy out" in info.value.kernel


def test_buffers_are_aligned_and_guards_adjacent() -> None:
    for nbytes in (1, 3, 4, 63, 64, 65, 4096):
        handle = cpu_guard.guarded_alloc(nbytes)
        assert handle.ctypes.data % 64 == 0 and handle.nbytes == nbytes
        # the byte after the last one is the guard's first
        after = (ctypes.c_uint8 * GUARD_BYTES).from_address(handle.ctypes.data + nbytes)
        before = (ctypes.c_uint8 * GUARD_BYTES).from_address(handle.ctypes.data - GUARD_BYTES)
        guarded = cpu_guard._GUARDED[id(handle)]
        assert bytes(after) == guarded.after_pattern.tobytes() and bytes(before) == guarded.before_pattern.tobytes()
        assert bytes(after) != bytes(before)
        cpu_guard.release(handle)
        assert not cpu_guard.is_guarded(handle)


def test_a_launch_through_the_engine_names_source_and_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_item` adds the kernel's C source and the Buffer to the error a guarded program raises."""
    from glassgrad.engine import realize
    from glassgrad.schedule import create_schedule
    x = Tensor(np.ones(5, np.float32)).realize() * 3
    item = [i for i in create_schedule([x.uop])[0] if i.ast.op.name == "SINK"][-1]
    kernel = realize.compile_kernel(item.bufs[0].device, item.ast)

    def damaged(*bufs: np.ndarray, **kwargs: object) -> float:
        raise BufferGuardError(f"CPU kernel {kernel.spec.name}", 0, 20, 20, 4, b"\0\0\0\0")
    monkeypatch.setattr(kernel, "program", damaged)
    with pytest.raises(BufferGuardError) as info:
        realize.run_item(item)
    assert info.value.source == kernel.spec.source and kernel.spec.name in str(info.value)
    assert info.value.buffer is not None and "<Buffer CPU 5 float32" in info.value.buffer


GUARDED_WORK = """
import numpy as np
from glassgrad import Tensor
from glassgrad.device import Device
from glassgrad.runtime import cpu_guard
assert type(Device["CPU"].allocator).__name__ == "GuardedCPUAllocator"
rng = np.random.default_rng(0)
for n in (1, 7, 17, 77, 257, 1021):
    a, b = rng.standard_normal((n, 17)).astype(np.float32), rng.standard_normal((17, 3)).astype(np.float32)
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(Tensor(a).flip(0)[::2].sum(1).numpy(), a[::-1][::2].sum(1), rtol=1e-4, atol=1e-4)
    h = a.astype(np.float16)
    np.testing.assert_allclose(Tensor(h).max(1).numpy(), h.max(1))
    i = (a * 10).astype(np.int32)
    padded = np.pad(i, ((1, 0), (0, 2)))
    np.testing.assert_array_equal(Tensor(i).pad(((1, 0), (0, 2))).cumsum(1).numpy(), padded.cumsum(1))
x = rng.standard_normal((2, 3, 17, 17)).astype(np.float32)
w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
t = Tensor(x, requires_grad=True)
t.conv2d(Tensor(w), padding=1, stride=2).max_pool2d(2).sum().backward()
assert t.grad.numpy().shape == x.shape
assert Tensor(np.zeros((0, 5), np.float32)).sum(0).numpy().tolist() == [0.0] * 5
assert cpu_guard._GUARDED, "buffers were guarded"
print("ok")
"""


def test_normal_work_under_the_guard_is_silent() -> None:
    """A subprocess with CPU_BUFFER_GUARD=1 (read when the device is made): matmuls, strided and flipped sums,
    float16, int32 cumsum over a pad, a convolution's backward, an empty reduction; all guarded, none caught."""
    env = {**os.environ, "CPU_BUFFER_GUARD": "1"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(GUARDED_WORK)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
