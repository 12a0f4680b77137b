"""The EMULATED Metal device (tests/metal/metal_emulator.py, shim.h, launcher.cpp) does what Metal promises.

Hand-written MSL kernels check the emulator itself: threadgroup memory is shared by the threads of a group and
`threadgroup_barrier` orders them; thread and group ids over 3-D grids; a kernel whose threads miss a barrier is an
error, not a hang; the shim's half/bfloat conversions, `as_type` and constants. Then a few tensors run end to end
through the real MetalRenderer on the emulated device. (The whole op suite: tests/metal/test_metal_suite.py.)
"""
from __future__ import annotations

import metal_emulator
import numpy as np
import pytest

from glassgrad import Tensor, Variable, dtypes
from glassgrad.device import Compiled

pytestmark = metal_emulator.needs_cxx

HEADER = "#include <metal_stdlib>\nusing namespace metal;\n"
IDS = "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]"
IN_OUT = "device float* data0 [[buffer(0)]], const device float* data1 [[buffer(1)]]"

# each group reverses its 64 elements through threadgroup memory: wrong without sharing or without the barrier
REVERSE = HEADER + f"""kernel void reverse({IN_OUT}, {IDS}) {{
  threadgroup float tile[64];
  tile[lid.x] = data1[gid.x * 64 + lid.x];
  threadgroup_barrier(mem_flags::mem_threadgroup);
  data0[gid.x * 64 + lid.x] = tile[63 - lid.x];
}}
"""

# every thread writes where it is: group and thread ids, all three dimensions
WHERE_AM_I = HEADER + f"""kernel void where_am_i(device uint* data0 [[buffer(0)]], {IDS}) {{
  uint local = (lid.z * 2 + lid.y) * 4 + lid.x;
  uint group = (gid.z * 3 + gid.y) * 2 + gid.x;
  data0[(group * 16 + local) * 2] = group;
  data0[(group * 16 + local) * 2 + 1] = local;
}}
"""

# thread 0 leaves before the barrier the others wait at: undefined behaviour on Metal
DIVERGENT = HEADER + f"""kernel void divergent(device float* data0 [[buffer(0)]], {IDS}) {{
  if (lid.x == 0) return;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  data0[lid.x] = 1.0f;
}}
"""

# one element too far
PAST_THE_END = HEADER + f"""kernel void past_the_end(device float* data0 [[buffer(0)]], {IDS}) {{
  data0[lid.x + 1] = 1.0f;
}}
"""

CONVERSIONS = HEADER + f"""kernel void conversions({IN_OUT}, device uint* data2 [[buffer(2)]], {IDS}) {{
  float x = data1[lid.x];
  data0[lid.x] = (float)((half)(x));
  data0[32 + lid.x] = (float)((bfloat)(x));
  data2[lid.x] = as_type<uint>(x);
  if (lid.x == 0) {{ data0[64] = INFINITY; data0[65] = -INFINITY; data0[66] = NAN; }}
}}
"""


# half -> float of every bit pattern and back, and float -> half of a spread of values
HALVES = HEADER + f"""kernel void halves(device float* data0 [[buffer(0)]], device ushort* data1 [[buffer(1)]],
                                 const device ushort* data2 [[buffer(2)]], device ushort* data3 [[buffer(3)]],
                                 const device float* data4 [[buffer(4)]], {IDS}) {{
  uint i = gid.x * 256 + lid.x;
  float f = (float)(as_type<half>(data2[i]));
  data0[i] = f;
  data1[i] = as_type<ushort>((half)(f));
  data3[i] = as_type<ushort>((half)(data4[i]));
}}
"""


def run(src: str, name: str, arrays: list[np.ndarray], grid: tuple[int, ...], block: tuple[int, ...],
        half_storage: bool | None = None) -> None:
    """Run a kernel on copies of `arrays` in the emulator's guarded buffers, then copy the results back.
    `half_storage`: compile the shim's `half` as 16-bit storage (True) or `_Float16` (False); None: as probed."""
    allocator = metal_emulator.GuardedAllocator()
    buffers = [allocator.alloc(a.nbytes) for a in arrays]
    for buffer, a in zip(buffers, arrays):
        allocator.copyin(buffer, a.view(np.uint8).reshape(-1).data)
    binary = metal_emulator.EmulatedMetalCompiler(half_storage).compile(src)
    metal_emulator.EmulatedMetalProgram(name, binary)(*buffers, global_size=grid, local_size=block)
    for buffer, a in zip(buffers, arrays):
        allocator.copyout(a.view(np.uint8).reshape(-1).data, buffer)


def test_threadgroup_memory_and_barrier() -> None:
    data = np.arange(64 * 20, dtype=np.float32)
    out = np.zeros_like(data)
    for _ in range(5):  # repeated: a race would show up as a wrong element sooner or later
        run(REVERSE, "reverse", [out, data], (20,), (64,))
        np.testing.assert_array_equal(out, data.reshape(20, 64)[:, ::-1].reshape(-1))


def test_group_and_thread_ids_in_three_dimensions() -> None:
    out = np.full(2 * 3 * 2 * 16 * 2, 999, dtype=np.uint32)
    run(WHERE_AM_I, "where_am_i", [out], (2, 3, 2), (4, 2, 2))
    pairs = out.reshape(12, 16, 2)
    np.testing.assert_array_equal(pairs[..., 0], np.repeat(np.arange(12)[:, None], 16, axis=1))
    np.testing.assert_array_equal(pairs[..., 1], np.repeat(np.arange(16)[None, :], 12, axis=0))


def test_a_missed_barrier_is_an_error_not_a_hang() -> None:
    with pytest.raises(RuntimeError, match="reached threadgroup_barrier between 0 and 1 times"):
        run(DIVERGENT, "divergent", [np.zeros(8, np.float32)], (1,), (8,))


def test_a_write_past_the_end_is_reported() -> None:
    with pytest.raises(RuntimeError, match=r"past_the_end wrote outside buffer\(s\) \[0\]"):
        run(PAST_THE_END, "past_the_end", [np.zeros(8, np.float32)], (1,), (8,))
    out = np.zeros(9, np.float32)
    run(PAST_THE_END, "past_the_end", [out], (1,), (8,))  # with room for it: fine
    np.testing.assert_array_equal(out, [0] + [1] * 8)


def test_too_many_threads_per_group() -> None:
    with pytest.raises(RuntimeError, match="2048 threads per threadgroup, Metal allows 1024"):
        run(DIVERGENT, "divergent", [np.zeros(8, np.float32)], (1,), (2048,))


def test_half_bfloat_bitcast_and_constants() -> None:
    x = np.array([1.0, 1 / 3, -2.5e-3, 65504.0, 70000.0, 1.00390625, 1.01171875, 3.0e38] + [0.5] * 24,
                 dtype=np.float32)
    out, bits = np.zeros(67, np.float32), np.zeros(32, np.uint32)
    run(CONVERSIONS, "conversions", [out, x, bits], (1,), (32,))
    with np.errstate(over="ignore"):  # 70000 and 3e38 become inf in half, as in numpy
        np.testing.assert_array_equal(out[:32], x.astype(np.float16).astype(np.float32))
    # bfloat: round to nearest even on the upper 16 bits (1.00390625 is a tie: rounds down to 1.0)
    upper = x.view(np.uint32).astype(np.uint64)
    expected = (((upper + 0x7FFF + ((upper >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    np.testing.assert_array_equal(out[32:64], expected)
    assert out[32 + 5] == 1.0 and out[32 + 6] == 1.015625
    np.testing.assert_array_equal(bits, x.view(np.uint32))
    assert out[64] == np.inf and out[65] == -np.inf and np.isnan(out[66])


@pytest.mark.parametrize("half_storage", [True, False], ids=["16-bit storage", "_Float16"])
def test_the_shim_converts_half_exactly(half_storage: bool) -> None:
    """Both forms of the shim's `half` (16 bits where the compiler has no `_Float16`, as clang 14 on x86-64) give
    numpy's values: every bit pattern to float and back, and float32 values rounded to nearest even (ties,
    subnormals, overflow past 65504, infinities, NaNs)."""
    cxx = metal_emulator.find_cxx()
    if not half_storage and not metal_emulator.has_float16(cxx):
        pytest.skip(f"{cxx} has no _Float16 (the 16-bit storage case covers this compiler)")
    bits = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore", over="ignore"):
        halves = bits.view(np.float16)
        finite = np.unique(halves[np.isfinite(halves)].astype(np.float64))
        mids = ((finite[:-1] + finite[1:]) / 2).astype(np.float32)  # ties, exact in float32
        spread = np.concatenate([mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(-np.inf)),
                                 np.array([np.inf, -np.inf, np.nan, 65520.0, 1e30, 2.0 ** -25, 0.0, -0.0], np.float32)])
        spread = np.resize(spread, 1 << 16)
        expected_float = halves.astype(np.float32)
        expected_half = spread.astype(np.float16).view(np.uint16)
    as_float, back, rounded = np.zeros(1 << 16, np.float32), np.zeros(1 << 16, np.uint16), np.zeros(1 << 16, np.uint16)
    run(HALVES, "halves", [as_float, back, bits, rounded, spread], (256,), (256,), half_storage=half_storage)
    nan = np.isnan(expected_float)
    np.testing.assert_array_equal(as_float.view(np.uint32)[~nan], expected_float.view(np.uint32)[~nan])
    assert np.isnan(as_float[nan]).all()
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert np.isnan(back[nan].view(np.float16)).all()
    spread_nan = np.isnan(spread)
    np.testing.assert_array_equal(rounded[~spread_nan], expected_half[~spread_nan])
    assert np.isnan(rounded[spread_nan].view(np.float16)).all()


def test_tensors_on_the_emulated_device(emulated: Compiled) -> None:
    a = np.random.default_rng(0).uniform(-2, 2, (37, 700)).astype(np.float32)
    x = Tensor(a, device="METAL")
    np.testing.assert_allclose(x.sum(axis=1).numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-4)  # threadgroup reduction
    np.testing.assert_allclose(x.max().numpy(), a.max())
    m = x[:6, :300]  # a small matmul: 36 outputs, one threadgroup reduction each
    np.testing.assert_allclose((m @ m.T).numpy(), a[:6, :300] @ a[:6, :300].T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(x.half().exp().numpy(), np.exp(a.astype(np.float16)), rtol=2e-3)
    b = Tensor(a, device="METAL").cast(dtypes.bfloat16)
    np.testing.assert_allclose(b.cast(dtypes.float32).numpy(), a, rtol=1 / 128)
    n = Tensor(np.array([1.0, np.nan, 3.0], np.float32), device="METAL")
    assert np.isnan(n.max().numpy())
    i = Tensor(np.array([2 ** 40, -7], np.int64), device="METAL")
    np.testing.assert_array_equal((i * 3 // 2).numpy(), np.array([2 ** 40, -7]) * 3 // 2)


def test_symbolic_shapes_on_the_emulated_device(emulated: Compiled) -> None:
    """A Variable is a `constant int&` argument after the buffers: one kernel serves every bound value."""
    a = np.random.default_rng(1).uniform(-2, 2, (700, 300)).astype(np.float32)
    x = Tensor(a, device="METAL").realize()
    v = Variable("i", 1, 700)
    for n in (1, 300, 700):  # flat kernel, per-thread loops, threadgroup reductions over and into symbolic sizes
        rows = x[:v.bind(n)]
        np.testing.assert_allclose((rows * 2).numpy(), a[:n] * 2)
        np.testing.assert_allclose(rows.sum(axis=0).numpy(), a[:n].sum(axis=0), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(rows.sum(axis=1).numpy(), a[:n].sum(axis=1), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(rows.sum().numpy(), a[:n].sum(), rtol=1e-5, atol=1e-2)


def test_a_kernel_of_more_inputs_than_metal_allows_is_split(emulated: Compiled) -> None:
    """Metal takes 31 buffers per kernel. An elementwise sum of 40 buffers fused into one kernel of 41 buffers, which
    the renderer refused (RuntimeError); so did an LSTM's backward unrolled over 12 steps (56 buffers), and a
    kernel that merged the extra outputs the split made. Now the scheduler stores partial sums to stay under the
    limit (the outputs merged into one kernel count too)."""
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((3, 5)).astype(np.float32) for _ in range(40)]
    ts = [Tensor(a, device="METAL").realize() for a in arrays]
    total = ts[0]
    for t in ts[1:]:
        total = total + t * 0.5
    np.testing.assert_allclose(total.numpy(), arrays[0] + 0.5 * sum(arrays[1:]), rtol=1e-5, atol=1e-5)
    # three sums of 13 buffers multiplied: two of the three must be stored for the product's kernel to fit
    sums = [sum(ts[13 * k + 1:13 * k + 14], ts[0]) for k in range(3)]
    want = np.prod([arrays[0] + sum(arrays[13 * k + 1:13 * k + 14]) for k in range(3)], axis=0)
    np.testing.assert_allclose((sums[0] * sums[1] * sums[2]).numpy(), want, rtol=1e-4, atol=1e-4)
    # an LSTM cell unrolled over 12 steps: its gate gradients read every step's saved values
    weights = [rng.standard_normal((4, 16)).astype(np.float32) * 0.3 for _ in range(2)]
    xs = rng.standard_normal((12, 3, 4)).astype(np.float32)

    def lstm_grads(device: str) -> list[np.ndarray]:
        w, u = (Tensor(a, device=device, requires_grad=True) for a in weights)
        h = c = Tensor.zeros(3, 4, device=device)
        for t in range(12):
            i, f, g, o = (Tensor(xs[t], device=device) @ w + h @ u).chunk(4, dim=1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * c.tanh()
        h.sum().backward()
        assert w.grad is not None and u.grad is not None
        return [w.grad.numpy(), u.grad.numpy()]
    for got, want in zip(lstm_grads("METAL"), lstm_grads("CPU")):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
