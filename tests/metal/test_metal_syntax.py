"""Every kind of MSL kernel MetalRenderer writes compiles as C++ against tests/metal/shim.h (-fsyntax-only).

The kernels come from `glassgrad.kernels(..., device="METAL")` (rendering only: nothing runs) for expressions that
cover every ALU op, every dtype MSL has, casts and bitcasts, all reductions (per-thread loops and threadgroup
reductions), movement ops, gathers, int64 indexing and special constants; the test asserts that coverage from the
kernels' own UOps. This checks the MSL text against a C++ model of Metal (shim.h): types, address spaces, function
names, `as_type`, barriers. It cannot check what only Apple's compiler knows. For every kernel the op test suite
makes, run `CHECK_METAL_SYNTAX=1 pytest tests/test_ops.py` (tests/metal/metal_plugin.py).
"""
from __future__ import annotations

import pathlib
import subprocess
from collections.abc import Callable

import metal_emulator
import numpy as np
import pytest

from glassgrad import Tensor, dtypes, kernels
from glassgrad.codegen import ProgramSpec
from glassgrad.dtype import ALL_DTYPES, DType
from glassgrad.renderer.metal import MetalDTypeError, MetalRenderer
from glassgrad.uop.ops import GroupOp, Ops

pytestmark = metal_emulator.needs_cxx

METAL_DTYPES = [d for d in ALL_DTYPES if d != dtypes.float64]
INTS = [d for d in METAL_DTYPES if d.is_int]
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32]


def t(shape: tuple[int, ...], dtype: DType = dtypes.float32) -> Tensor:
    return Tensor.empty(*shape, dtype=dtype)


def per_dtype(dt: DType) -> list[Tensor]:
    a, b = t((4, 5), dt), t((4, 5), dt)
    out = [a + b, a * b, a.max(axis=1), a.sum(axis=0), a.cast(dtypes.float32), t((4, 5)).cast(dt),
           (a < b).where(a, b), a == b, a != b, a.reshape(5, 4).permute(1, 0).pad(((1, 1), (0, 2))).flip(0),
           a[1:3, ::2], a.expand(3, 4, 5).contiguous(), a.prod(axis=0)]
    if dt.is_int:
        out += [a // b, a % b, a & b, a | b, a ^ b, a << 1, a >> 1, -a if not dt.is_unsigned else ~a]
    if dt.is_float:
        out += [a.exp(), a.log(), a.sin(), a.sqrt(), a.reciprocal(), a / b, a ** b, a.trunc(), a % b, -a]
    if dt.itemsize in (2, 4, 8) and dt != dtypes.bool:
        same_size = next(d for d in METAL_DTYPES if d.itemsize == dt.itemsize and d != dt)
        out.append(a.bitcast(same_size))
    return out


def composites() -> list[Tensor]:
    x, w = t((33, 300)), t((300, 17))
    i = Tensor.empty(7, dtype=dtypes.int32)
    big = Tensor.empty(3, 2 ** 30, dtype=dtypes.uint8)  # indices past 2**31: int64 (long) index math
    return [x @ w, x.sum(), x.max(), x.sum(axis=1), x.softmax(-1), x.log_softmax(0), x.argmax(1), x.cumsum(1),
            x[i], x.std(), x.var(axis=1), x.gelu(), x.sigmoid(), x.tanh(), x.relu(), x.abs(), x.floor(), x.round(),
            x.clip(-1, 1), x.cat(x, dim=0), x.half().sum(axis=1), x.cast(dtypes.bfloat16).mean(),
            t((2, 3, 8, 8)).reshape(2, 3, 4, 2, 4, 2).max(axis=(3, 5)), big + 1, big.sum(axis=1),
            x * float("inf"), x.maximum(float("-inf")), x + float("nan"), i * (-2 ** 31),
            Tensor.empty(4, dtype=dtypes.int64) * (-2 ** 63), Tensor.arange(10), Tensor.eye(4),
            Tensor.empty(5, dtype=dtypes.bool).logical_not(), x[:, 3:-4:2].flip(1).pad(((0, 0), (2, 3)))]


def all_kernels() -> list[ProgramSpec]:
    tensors = [y for dt in METAL_DTYPES for y in per_dtype(dt)] + composites()
    return [k for y in tensors for k in kernels(y, device="METAL")]


@pytest.fixture(scope="module")
def programs() -> list[ProgramSpec]:
    return all_kernels()


def compile_all(sources: list[str], folder: pathlib.Path,
                half_storage: bool | None = None) -> subprocess.CompletedProcess[str]:
    """One compiler run, one file per kernel: -fsyntax-only checks each as its own translation unit. `half_storage`:
    the shim's `half` as 16-bit storage (True), `_Float16` (False), or as the compiler's probe found (None)."""
    files = []
    for n, src in enumerate(sources):
        files.append(folder / f"kernel{n}.metal")
        files[-1].write_text(src)
    cxx = metal_emulator.find_cxx()
    return subprocess.run([cxx, *metal_emulator.cxx_flags(cxx, half_storage), "-fsyntax-only", "-x", "c++",
                           *map(str, files)], capture_output=True, text=True)


def test_every_op_and_dtype_is_covered(programs: list[ProgramSpec]) -> None:
    uops = [u for p in programs for u in p.uops]
    ops = {u.op for u in uops}
    assert GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.GROUP_REDUCE} <= ops, GroupOp.ALU - ops
    assert {u.arg[0] for u in uops if u.op is Ops.SPECIAL} == {"gidx", "bidx", "lidx"}
    assert {u.arg for u in uops if u.op is Ops.ACCUMULATE} == {Ops.ADD, Ops.MUL, Ops.MAX}
    assert {u.dtype for u in uops if u.op is Ops.DEFINE_GLOBAL} == set(METAL_DTYPES)
    assert any(u.dtype == dtypes.int64 for u in uops if u.op is Ops.SPECIAL)


@pytest.mark.parametrize("half_storage", [None, True], ids=["as probed", "half as 16 bits"])
def test_all_kernels_compile_against_the_shim(programs: list[ProgramSpec], tmp_path: pathlib.Path,
                                              half_storage: bool | None) -> None:
    """With the shim's `half` as the compiler allows, and as 16-bit storage (explicit conversions only, as for a
    compiler without `_Float16`): the renderer converts half through float, never implicitly."""
    sources = sorted({p.source for p in programs})
    assert len(sources) >= 250
    proc = compile_all(sources, tmp_path, half_storage)
    assert proc.returncode == 0, proc.stderr[:5000]
    print(f"{len(sources)} distinct MSL kernels compiled against tests/metal/shim.h")


def test_msl_spelling(programs: list[ProgramSpec]) -> None:
    for p in programs:
        src = p.source
        assert src.startswith("#include <metal_stdlib>\nusing namespace metal;\nkernel void ")
        assert "long long" not in src and "double" not in src and "restrict" not in src
        assert "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]" in src
        if "threadgroup_barrier" in src:  # shared arrays are declared first, at the kernel's outer scope
            assert src.splitlines()[3].startswith("  threadgroup ")


@pytest.mark.parametrize("broken", [
    ("float val0 = ", "double val0 = "),                               # MSL has no double
    ("precise::exp2(", "exp2f("),                                      # nor C's float functions
    ("threadgroup_barrier(mem_flags::mem_threadgroup)", "__syncthreads()"),
    ("as_type<int>", "gg_bitcast<int>"),
])
def test_the_shim_rejects_what_msl_lacks(broken: tuple[str, str], tmp_path: pathlib.Path) -> None:
    x = t((300, 600))
    candidates = [k.source for y in (x.exp(), x.sum(axis=1), x.bitcast(dtypes.int32))
                  for k in kernels(y, device="METAL")]
    src = next(s for s in candidates if broken[0] in s)
    assert compile_all([src], tmp_path).returncode == 0
    assert compile_all([src.replace(*broken)], tmp_path).returncode != 0


@pytest.mark.parametrize("make", [lambda: t((3,), dtypes.float64) + 1, lambda: t((3,)).cast(dtypes.float64),
                                  lambda: Tensor(np.ones(3)).sum()])
def test_float64_is_a_clear_error(make: Callable[[], Tensor]) -> None:
    with pytest.raises(MetalDTypeError, match="METAL cannot compute with dtypes.float64"):
        kernels(make(), device="METAL")


def test_more_buffers_than_metal_allows_are_split_or_a_clear_error() -> None:
    """A sum of 40 buffers is split into kernels of at most 31 buffers by the scheduler (it was one kernel of 41,
    refused); a kernel of too many buffers that reaches the renderer anyway is a clear error."""
    parts = [t((2,)) for _ in range(40)]
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    assert all(len(k.source.split("[[buffer(")) - 1 <= 31 for k in kernels(total, device="METAL"))
    with pytest.raises(RuntimeError, match="needs 41 buffers; Metal allows 31"):
        MetalRenderer().render_kernel("k", [f"device float* data{i} [[buffer({i})]]" for i in range(41)], [])
    assert kernels(Tensor.cat(*parts[:30]), device="METAL")  # 31 buffers: fine
    # a cat of many tensors joins them in groups (Tensor.cat), so no kernel reads more than 16 of them
    assert all(len(k.source.split("[[buffer(")) - 1 <= 17 for k in kernels(Tensor.cat(*parts), device="METAL"))
