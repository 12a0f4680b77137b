"""ALLOW_TF32=1: float32 matmuls and convolutions on the tensor cores (mma.sync m16n8k8 .tf32), opt-in.

Without a GPU: the setting changes the rendered CUDA source only when set, only for float32 tiled kernels on sm_80+
(half, non-tiled, CPU and Metal kernels are the same with and without it); it is part of every key of built kernels
(the kernel cache, BEAM's disk cache, the JIT's captures); every shared/global access stays in bounds; NVRTC
compiles the kernels for sm_90; and an emulation of the kernel (`emulate`: the copies into shared memory, each
lane's fragment registers, and a model of mma.sync m16n8k8 written from the PTX ISA's fragment layout) computes the
matmul / convolution of the tf32-rounded inputs. A wrong fragment index, swizzle, stage or output position gives
wrong numbers there.

With a GPU (`DEV=CUDA python -m pytest tests/test_tf32.py`; skipped otherwise): matmuls (4096^2, odd shapes,
batched), a convolution and its gradients against float64 numpy within TF32's error bound, and closer to numpy on
tf32-rounded inputs than to numpy on the inputs themselves, and bit-different from the default (exact float32)
kernels: the test cannot pass by not using TF32.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_schedule import check_access

import glassgrad.codegen as codegen
from glassgrad import Tensor, TinyJit, dtypes
from glassgrad.codegen import get_program
from glassgrad.engine import realize
from glassgrad.helpers import ALLOW_TF32, WGMMA, Context, kernel_flags
from glassgrad.kernels import kernels
from glassgrad.renderer.cuda import CUDARenderer
from glassgrad.schedule import ScheduleItem, create_schedule
from glassgrad.uop.ops import Ops, UOp

TF32_MMA = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
F16 = dtypes.float16


def cuda_source(make: Callable[[], Tensor], tf32: bool, arch: str = "sm_90") -> str:
    with Context(ALLOW_TF32=int(tf32)):
        return "\n".join(s.source for s in kernels(make(), device="CUDA", arch=arch))


def matmul(m: int, k: int, n: int, dtype: Any = dtypes.float32) -> Callable[[], Tensor]:
    return lambda: Tensor.empty(m, k, dtype=dtype) @ Tensor.empty(k, n, dtype=dtype)


def conv(batch: int, cin: int, cout: int, size: int) -> Callable[[], Tensor]:
    return lambda: Tensor.empty(batch, cin, size, size).conv2d(Tensor.empty(cout, cin, 3, 3), padding=1)


# ---------------------------------------------------------------- the setting, without a GPU


def test_the_flag_is_glassgrads_and_off_by_default() -> None:
    if int(ALLOW_TF32):
        pytest.skip("ALLOW_TF32 is set in this environment")
    with Context(ALLOW_TF32=1):
        assert kernel_flags()[0] == 1
    assert kernel_flags()[0] == 0
    default = kernel_flags()
    with Context(WGMMA=1 - int(WGMMA)):  # the other flag that changes the kernels built: part of every cache's key
        assert kernel_flags() != default


@pytest.mark.parametrize("make", [matmul(256, 64, 256), matmul(1000, 77, 1023), conv(2, 16, 64, 12),
                                  lambda: Tensor.empty(3, 200, 96) @ Tensor.empty(3, 96, 136),
                                  lambda: Tensor.empty(64, 256).T @ Tensor.empty(64, 128)])
def test_the_setting_changes_float32_tiled_kernels_only_when_set(make: Callable[[], Tensor]) -> None:
    default, tf32 = cuda_source(make, False), cuda_source(make, True)
    assert TF32_MMA not in default and "cvt.rna.tf32.f32" not in default and "mma.sync" not in default
    assert TF32_MMA in tf32 and "cvt.rna.tf32.f32" in tf32 and "ldmatrix" not in tf32


def test_an_older_gpu_ignores_it() -> None:
    """Without tensor cores (sm_75) the float32 tiles stay."""
    make = matmul(256, 64, 256)
    assert cuda_source(make, True, "sm_75") == cuda_source(make, False, "sm_75")
    assert "mma.sync" not in cuda_source(make, True, "sm_75")


@pytest.mark.parametrize("make", [
    matmul(256, 64, 384, F16),                      # half on tensor cores (m16n8k16): unchanged
    matmul(200, 40, 384, F16),                      # half with remainders: float32 tiles of widened halves
    matmul(128, 32, 128, dtypes.bfloat16),
    matmul(32, 64, 32),                              # too small to tile
    lambda: Tensor.empty(2, 3, 12, 12).conv2d(Tensor.empty(32, 3, 5, 5)),  # 32 channels: a narrow tile
    lambda: Tensor.empty(512, 512).sum(axis=1),
    lambda: Tensor.empty(256, 256).softmax(-1),
    lambda: (Tensor.empty(96, 40, 1) * Tensor.empty(1, 40, 80)).max(axis=1),
    lambda: Tensor.empty(128, 128) + 1,
])
def test_other_kernels_are_unaffected(make: Callable[[], Tensor]) -> None:
    assert cuda_source(make, True) == cuda_source(make, False)
    assert TF32_MMA not in cuda_source(make, True)


@pytest.mark.parametrize("device", ["CPU", "METAL"])
def test_cpu_and_metal_ignore_it(device: str) -> None:
    for make in (matmul(256, 64, 256), conv(2, 16, 64, 12)):
        sources = []
        for flag in (0, 1):
            with Context(ALLOW_TF32=flag):
                sources.append([s.source for s in kernels(make(), device=device)])
        assert sources[0] == sources[1]


def test_the_kernel_cache_and_beam_keys_depend_on_it() -> None:
    from glassgrad.codegen.opt.search import _cache_path
    from glassgrad.device import Device
    ast = create_schedule([(Tensor.empty(128, 64) @ Tensor.empty(64, 128)).uop])[0][-1].ast
    keys, paths = [], []
    for flag in (0, 1):
        with Context(ALLOW_TF32=flag):
            keys.append(realize.kernel_key("CPU", ast))
            paths.append(_cache_path(ast, Device["CPU"], 2))
    assert keys[0] != keys[1] and paths[0] != paths[1]


def test_switching_it_builds_the_kernel_again() -> None:
    """The kernel cache never hands out a kernel built under the other setting (here on the CPU: the same source,
    rendered again, then compiled from the compile cache)."""
    built: list[tuple[UOp, int]] = []
    original = realize._render

    def spy(device: str, ast: UOp) -> Any:
        built.append((ast, int(ALLOW_TF32)))
        return original(device, ast)
    a, b = np.ones((70, 33), np.float32), np.ones((33, 90), np.float32)
    realize._render = spy  # type: ignore[assignment]
    try:
        for flag in (0, 1, 0):
            with Context(ALLOW_TF32=flag):
                np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b)
    finally:
        realize._render = original  # type: ignore[assignment]
    flags = [flag for _, flag in built]
    assert len({ast for ast, _ in built}) == 1 and flags.count(1) == 1 and flags.count(0) <= 1  # 0 again: cached


def test_the_jit_captures_per_setting() -> None:
    calls = []

    @TinyJit
    def step(x: Tensor) -> Tensor:
        calls.append(int(ALLOW_TF32))
        return (x @ x).realize()
    x = Tensor(np.eye(40, dtype=np.float32))
    for _ in range(3):
        step(x)
    with Context(ALLOW_TF32=1):
        step(x)  # a new signature: runs the function, no replay of the default capture
    assert calls == [0, 0, 1]


# ---------------------------------------------------------------- emulation of the tf32 kernel


def tf32_round(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero (finite values)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def mma_m16n8k8(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One warp's mma.sync m16n8k8 .tf32 as the PTX ISA lays out its fragments (g = lane/4, t = lane%4):
    a (4, 32): A[g][t], A[g+8][t], A[g][t+4], A[g+8][t+4]; b (2, 32): B[t][g], B[t+4][g];
    result (4, 32): D[g][2t], D[g][2t+1], D[g+8][2t], D[g+8][2t+1] of D = A @ B (16 x 8 times 8 x 8)."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    A, B = np.full((16, 8), np.nan), np.full((8, 8), np.nan)
    A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4] = a
    B[t, g], B[t + 4, g] = b
    assert not np.isnan(A).any() and not np.isnan(B).any()  # every element held by one lane
    D = A @ B
    return np.stack([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]])


_ALU: dict[Ops, Callable[..., Any]] = {
    Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.NEG: np.negative, Ops.MAX: np.maximum,
    Ops.IDIV: lambda a, b: a // b,  # (indices are never negative: C's division and Python's agree)
    Ops.MOD: lambda a, b: a % b, Ops.CMPLT: np.less, Ops.CMPNE: np.not_equal, Ops.CMPEQ: np.equal,
    Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.WHERE: np.where,
}


class Emulator:
    """Evaluates a tensor-core tiled kernel (gpudims' output) for one block at a time, all 128 threads at once."""

    def __init__(self, sink: UOp, grid: int, threads: int, bufs: dict[int, np.ndarray]) -> None:
        self.sink, self.grid, self.threads, self.bufs = sink, grid, threads, bufs
        nodes = sink.toposort()
        self.reduces = [u for u in nodes if u.op is Ops.REDUCE]
        self.k_outer, self.k_inner = self.reduces[0].src[1:]
        assert all(r.src[1:] == (self.k_outer, self.k_inner) and r.src[0].op is Ops.WMMA for r in self.reduces)
        self.smem = next(u for u in nodes if u.op is Ops.DEFINE_LOCAL)
        self.copies = [u for u in nodes if u.op is Ops.ASYNC_COPY or
                       (u.op is Ops.STORE and u.src[0] is self.smem)]
        self.bidx = next(u for u in nodes if u.op is Ops.SPECIAL and u.arg[0] == "bidx")
        self.lidx = next(u for u in nodes if u.op is Ops.SPECIAL and u.arg[0] == "lidx")

    def value(self, u: UOp, env: dict[UOp, Any]) -> Any:
        if u in env:
            return env[u]
        if u.op is Ops.CONST:
            out: Any = np.asarray(u.arg, dtype=np.float64 if u.dtype.is_float else
                                  np.bool_ if u.dtype.is_bool else np.int64)
        elif u.op is Ops.LOAD:
            assert u.src[0].op is Ops.DEFINE_GLOBAL, "shared memory is read through fragments only"
            index = np.broadcast_to(self.value(u.src[1], env), (self.threads,))
            gate = np.broadcast_to(self.value(u.src[2], env), (self.threads,)) if len(u.src) == 3 else \
                np.ones(self.threads, np.bool_)
            buf = self.bufs[u.src[0].arg]
            out = np.where(gate, buf[np.where(gate, index, 0)].astype(np.float64), 0.0)
        elif u.op is Ops.CAST:
            inner = self.value(u.src[0], env)
            out = np.asarray(inner).astype(np.float64 if u.dtype.is_float else np.bool_ if u.dtype.is_bool
                                           else np.int64)
        elif u.op in _ALU:
            out = _ALU[u.op](*(self.value(s, env) for s in u.src))
        else:
            raise AssertionError(f"the emulator does not know {u.op}")
        env[u] = out
        return out

    def copy(self, smem: np.ndarray, u: UOp, env: dict[UOp, Any]) -> None:
        lanes = np.ones(self.threads, np.bool_)
        if u.op is Ops.STORE:
            index = np.broadcast_to(self.value(u.src[1], env), (self.threads,))
            smem[index] = np.broadcast_to(self.value(u.src[2], env), (self.threads,))
            return
        _, at, buf, index, *gate = u.src
        if gate:
            lanes = np.broadcast_to(self.value(gate[0], env), (self.threads,))
        at_v = np.broadcast_to(self.value(at, env), (self.threads,))
        index_v = np.broadcast_to(self.value(index, env), (self.threads,))
        if u.arg == 4:  # one float; src-size 0 where the gate is off: zeros, nothing read
            smem[at_v] = np.where(lanes, self.bufs[buf.arg][np.where(lanes, index_v, 0)], 0.0)
            return
        for e in range(4):  # 16 bytes: 4 floats from global index to shared index, skipped where the gate is off
            smem[at_v[lanes] + e] = self.bufs[buf.arg][index_v[lanes] + e]

    def run(self, out: np.ndarray) -> None:
        lanes = np.arange(self.threads)
        for block in range(self.grid):
            base = {self.bidx: np.int64(block), self.lidx: lanes}
            smem = np.full(self.smem.arg[1], np.nan)  # unwritten shared memory read by a fragment: NaN results
            before = [u for u in self.copies if self.k_outer not in u.toposort()]
            for u in before:  # the copies issued before the k loop (cp.async's first stages)
                self.copy(smem, u, dict(base))
            acc = {r: np.zeros((4, self.threads)) for r in self.reduces}
            for k in range(self.k_outer.src[0].arg):
                env = {**base, self.k_outer: np.int64(k)}
                for u in self.copies:
                    if u not in before:
                        self.copy(smem, u, env)
                for kk in range(self.k_inner.src[0].arg):
                    inner = {**env, self.k_inner: np.int64(kk)}
                    for r in self.reduces:
                        acc[r] += self.mma(r.src[0], smem, inner)
            results = {UOp(Ops.GEP, dtypes.float32, (r,), e): acc[r][e] for r in self.reduces for e in range(4)}
            for store in (s for s in self.sink.src if s.op is Ops.STORE):  # (the sink also lists its buffers)
                env = {**base, **results}
                index = np.broadcast_to(self.value(store.src[1], env), (self.threads,))
                gate = np.broadcast_to(self.value(store.src[3], env), (self.threads,)) if len(store.src) == 4 \
                    else np.ones(self.threads, np.bool_)
                out[index[gate]] = np.broadcast_to(self.value(store.src[2], env), (self.threads,))[gate]

    def mma(self, wmma: UOp, smem: np.ndarray, env: dict[UOp, Any]) -> np.ndarray:
        row, col = wmma.src
        assert row.arg == ("row", False) and col.arg == ("col", True)
        assert len(row.src) == 5 and len(col.src) == 3 and wmma.arg == 0

        def registers(frag: UOp) -> np.ndarray:
            indices = [np.broadcast_to(self.value(i, env), (self.threads,)) for i in frag.src[1:]]
            return np.stack([tf32_round(smem[i].astype(np.float32)).astype(np.float64) for i in indices])
        a, b = registers(row), registers(col)
        return np.concatenate([mma_m16n8k8(a[:, w:w + 32], b[:, w:w + 32]) for w in range(0, self.threads, 32)], 1)


COPIES = {"16-byte": "gg_cp_async(&", "4-byte": "gg_cp_async4(&", "registers": "__syncthreads();"}


def _render_tf32(ast: UOp) -> tuple[Any, list[Any]]:
    """The kernel rendered for sm_90 with ALLOW_TF32=1, and what gpu_dims returned while making it (the AST it
    launches, the grid and the block)."""
    captured = []
    original = codegen.gpu_dims

    def spy(*args: Any, **kwargs: Any) -> Any:
        captured.append(original(*args, **kwargs))
        return captured[-1]
    codegen.gpu_dims = spy  # type: ignore[assignment]
    try:
        with Context(ALLOW_TF32=1):
            spec = get_program(ast, CUDARenderer("sm_90"))
    finally:
        codegen.gpu_dims = original  # type: ignore[assignment]
    return spec, captured


def emulate_tf32(t: Tensor, copies: str) -> np.ndarray:
    """Render `t`'s one kernel for sm_90 with ALLOW_TF32=1 and run the emulation of it on `t`'s inputs. `copies`:
    how the kernel must copy its tiles (a key of COPIES), so each path is known to be the one emulated."""
    schedule, _ = create_schedule([t.uop])
    assert len(schedule) == 1
    item: ScheduleItem = schedule[0]
    spec, captured = _render_tf32(item.ast)
    assert TF32_MMA in spec.source and COPIES[copies] in spec.source
    assert copies != "registers" or "cp.async" not in spec.source
    sink, (grid, _, _), (threads, _, _) = captured[-1]
    bufs = {i: b.numpy() for i, b in enumerate(item.bufs) if i > 0}
    out = np.full(item.bufs[0].size, np.nan)
    Emulator(sink, grid, threads, bufs).run(out)
    return out.reshape(t.shape)


def check_tf32(out: np.ndarray, exact: np.ndarray, rounded: np.ndarray, bound: np.ndarray) -> None:
    """`out` matches the float64 result on tf32-rounded inputs (`rounded`: the products of tf32 values are exact
    in float32, so only the float32 accumulation differs), and the exact one within TF32's bound (`bound` = |a||b|:
    each product off by at most 2^-10 of it), and is several times closer to `rounded` than to `exact`: the factors
    were rounded (an exact float32 kernel would be closer to `exact`)."""
    assert np.isfinite(out).all()
    assert np.abs(out - rounded).max() <= 1e-4 * np.abs(rounded).max()
    assert (np.abs(out - exact) <= 2.0 ** -10 * bound + 1e-4 * np.abs(exact).max()).all()
    assert np.linalg.norm(out - exact) > 5 * np.linalg.norm(out - rounded)


@pytest.mark.parametrize("m,k,n,copies", [(256, 32, 256, "16-byte"),  # whole tiles: 3 stages
                                          (130, 20, 200, "4-byte"),   # remainders everywhere: zero-filled
                                          (64, 77, 129, "4-byte")])
def test_emulated_tf32_matmul(m: int, k: int, n: int, copies: str) -> None:
    rng = np.random.default_rng(m + k + n)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    out = emulate_tf32(Tensor(a) @ Tensor(b), copies)
    ra, rb = tf32_round(a).astype(np.float64), tf32_round(b).astype(np.float64)
    check_tf32(out, a.astype(np.float64) @ b, ra @ rb, np.abs(a).astype(np.float64) @ np.abs(b))


def test_emulated_tf32_computed_factor() -> None:
    """A factor computed on the fly (relu) is copied through registers, double-buffered."""
    rng = np.random.default_rng(11)
    a, b = rng.standard_normal((130, 40), dtype=np.float32), rng.standard_normal((40, 200), dtype=np.float32)
    out = emulate_tf32(Tensor(a, device="CPU").relu() @ Tensor(b, device="CPU"), "registers")  # (a GPU stores relu)
    ra = np.maximum(a, 0)
    check_tf32(out, ra.astype(np.float64) @ b, tf32_round(ra).astype(np.float64) @ tf32_round(b),
               np.abs(ra).astype(np.float64) @ np.abs(b))


def test_emulated_tf32_transposed_and_batched() -> None:
    """A transposed factor (4-byte copies into the [row][k] tile) and a batch axis."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, 48, 128), dtype=np.float32), rng.standard_normal((2, 48, 192), dtype=np.float32)
    out = emulate_tf32(Tensor(a).permute(0, 2, 1) @ Tensor(b), "4-byte")
    at = a.transpose(0, 2, 1)
    check_tf32(out, at.astype(np.float64) @ b, tf32_round(at).astype(np.float64) @ tf32_round(b),
               np.abs(at).astype(np.float64) @ np.abs(b))


def conv_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 conv2d, padding 1, stride 1."""
    k = w.shape[-1]
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (k, k), axis=(2, 3))
    return np.einsum("bcyxij,ocij->boyx", windows, w.astype(np.float64), optimize=True)


def test_emulated_tf32_conv() -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((2, 8, 10, 10), dtype=np.float32), rng.standard_normal((64, 8, 3, 3), dtype=np.float32)
    out = emulate_tf32(Tensor(x).conv2d(Tensor(w), padding=1), "4-byte")
    check_tf32(out, conv_reference(x, w), conv_reference(tf32_round(x), tf32_round(w)),
               conv_reference(np.abs(x), np.abs(w)))


def test_the_emulated_mma_model_catches_a_wrong_layout() -> None:
    """The model of mma.sync is itself checked: registers filled from A and B by the PTX layout give A @ B; the
    same registers read with the b-fragment's rows swapped do not."""
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((16, 8)), rng.standard_normal((8, 8))
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    a = np.stack([A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4]])
    b = np.stack([B[t, g], B[t + 4, g]])
    D = A @ B
    expected = np.stack([D[g, 2 * t], D[g, 2 * t + 1], D[g + 8, 2 * t], D[g + 8, 2 * t + 1]])
    np.testing.assert_allclose(mma_m16n8k8(a, b), expected)
    assert not np.allclose(mma_m16n8k8(a, b[::-1]), expected)


# ---------------------------------------------------------------- rendered kernels: bounds and NVRTC

def conv_gradients() -> list[Tensor]:
    """Both gradients of a 64 -> 128 channel convolution (matmul-shaped: tf32 too; with 32 channels the input
    gradient's tile would be narrow and stay float32)."""
    x, w = Tensor.empty(16, 64, 20, 20).requires_grad_(), Tensor.empty(128, 64, 3, 3).requires_grad_()
    out = x.conv2d(w, padding=1)
    (out * Tensor.empty(*out.shape)).sum().backward()
    return [x.grad, w.grad]  # type: ignore[list-item]


RENDERED: dict[str, Callable[[], Tensor | list[Tensor]]] = {
    "4096 matmul": matmul(4096, 4096, 4096),
    "odd matmul": matmul(1000, 77, 1023),
    "batched": lambda: Tensor.empty(3, 200, 96) @ Tensor.empty(3, 96, 136),
    "conv 64x64x56^2 -> 128 3x3": conv(8, 64, 128, 56),
    "conv gradients": conv_gradients,
}


def tf32_kernels(make: Callable[[], Tensor | list[Tensor]]) -> list[tuple[ScheduleItem, Any]]:
    made = make()
    schedule, _ = create_schedule([t.uop for t in (made if isinstance(made, list) else [made])])
    with Context(ALLOW_TF32=1):
        return [(item, get_program(item.ast, CUDARenderer("sm_90"))) for item in schedule
                if item.ast.op is not Ops.COPY]


@pytest.mark.parametrize("name", ["odd matmul", "batched", "conv 64x64x56^2 -> 128 3x3"])
def test_every_tf32_access_is_in_bounds(name: str) -> None:
    (item, spec), = [(i, s) for i, s in tf32_kernels(RENDERED[name]) if TF32_MMA in s.source]
    checked = 0
    for u in spec.uops:
        if u.op is Ops.FRAGMENT:  # each register's shared element
            for index in u.src[1:]:
                check_access(UOp(Ops.LOAD, dtypes.float32, (u.src[0], index)), _shared(u).arg[1], "fragment")
                checked += 1
        elif u.op is Ops.ASYNC_COPY:  # 16 bytes (skipped where gated off), or 4 (zeros written where gated off)
            gate, ends = u.src[4:], ((0,) if u.arg == 4 else (0, 3))
            for end in ends:
                check_access(UOp(Ops.LOAD, u.src[2].dtype, (u.src[2], u.src[3] + end, *gate)),
                             item.bufs[u.src[2].arg].size, "async copy from global")
                check_access(UOp(Ops.LOAD, dtypes.float32, (_shared(u), u.src[1] + end,
                                                            *(gate if u.arg != 4 else ()))),
                             _shared(u).arg[1], "async copy to shared")
            checked += 1
        elif u.op in (Ops.LOAD, Ops.STORE):
            buf = u.src[0] if u.src[0].op is Ops.DEFINE_GLOBAL else _shared(u)
            size = buf.arg[1] if buf.op is Ops.DEFINE_LOCAL else item.bufs[buf.arg].size
            if u.op is Ops.STORE and len(u.src) == 4:
                u = UOp(Ops.LOAD, u.src[2].dtype, (buf, u.src[1], u.src[3]))
            check_access(u, size, f"{u.op}")
            checked += 1
    assert checked > 16


def _shared(u: UOp) -> UOp:
    while u.op is not Ops.DEFINE_LOCAL:
        u = u.src[0]
    return u


@pytest.mark.parametrize("name", RENDERED)
def test_tf32_kernels_compile_for_sm_90(name: str, nvrtc: Any) -> None:
    made = RENDERED[name]()
    with Context(ALLOW_TF32=1):
        specs = kernels(*(made if isinstance(made, list) else [made]), device="CUDA")
    tf32 = [s for s in specs if TF32_MMA in s.source]
    assert len(tf32) == (2 if name == "conv gradients" else 1)
    for spec in specs:
        assert nvrtc.compile(spec.source)[:4] == b"\x7fELF"


def test_how_the_tiles_are_copied() -> None:
    """16-byte cp.async for whole tiles of plain contiguous factors; 4-byte cp.async (zero-filled where gated off)
    for remainders, a pad's zeros, odd strides or a view starting one float in (16-byte copies need 16-byte
    aligned addresses). A computed factor is stored by a kernel of its own first (the scheduler's
    `_computed_tile_operands`), so the matmul's tiles copy it with cp.async too."""
    whole = cuda_source(matmul(256, 64, 256), True)
    assert "gg_cp_async(&" in whole and "gg_cp_async4" not in whole and "cp.async.wait_group 1;" in whole
    big = Tensor.empty(256, 65)
    for gathered in (lambda: big[:, 1:] @ Tensor.empty(64, 256), matmul(1000, 77, 1023), conv(2, 16, 64, 12)):
        source = cuda_source(gathered, True)
        assert TF32_MMA in source and "gg_cp_async4(&" in source and "gg_cp_async(&" not in source
    with Context(ALLOW_TF32=1):
        first, product = kernels(Tensor.empty(130, 64).relu() @ Tensor.empty(64, 200), device="CUDA", arch="sm_90")
    assert first.name.startswith("E_") and TF32_MMA not in first.source
    assert TF32_MMA in product.source and "cp.async" in product.source and "? 0.0f :" not in product.source
    assert "? 0.0f :" in first.source  # the relu


# ---------------------------------------------------------------- on a GPU


def run_both(cuda: str, make: Callable[..., Tensor], *arrays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the default float32 result, the ALLOW_TF32=1 one) of `make(*tensors)` on the GPU."""
    outs = []
    for flag in (0, 1):
        with Context(ALLOW_TF32=flag):
            outs.append(make(*(Tensor(a, device=cuda) for a in arrays)).numpy().astype(np.float64))
    return outs[0], outs[1]


@pytest.mark.parametrize("shape_a,shape_b", [((4096, 4096), (4096, 4096)), ((1000, 77), (77, 1023)),
                                             ((4, 300, 200), (4, 200, 520)), ((512, 2048), (2048, 64))])
def test_tf32_matmul_on_gpu(cuda: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape_a) + sum(shape_b))
    a, b = rng.standard_normal(shape_a, dtype=np.float32), rng.standard_normal(shape_b, dtype=np.float32)
    exact_f32, out = run_both(cuda, lambda x, y: x @ y, a, b)
    exact = a.astype(np.float64) @ b
    check_tf32(out, exact, tf32_round(a).astype(np.float64) @ tf32_round(b), np.abs(a).astype(np.float64) @ np.abs(b))
    assert not np.array_equal(out, exact_f32)
    assert np.linalg.norm(exact_f32 - exact) < np.linalg.norm(out - exact) / 20  # the default stays exact float32


def test_tf32_conv_on_gpu(cuda: str) -> None:
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 64, 56, 56), dtype=np.float32)
    w = rng.standard_normal((128, 64, 3, 3), dtype=np.float32)
    exact_f32, out = run_both(cuda, lambda xt, wt: xt.conv2d(wt, padding=1), x, w)
    check_tf32(out, conv_reference(x, w), conv_reference(tf32_round(x), tf32_round(w)),
               conv_reference(np.abs(x), np.abs(w)))
    assert not np.array_equal(out, exact_f32)


def test_tf32_conv_gradients_on_gpu(cuda: str) -> None:
    """The backward kernels (weight and input gradients, also matmul-shaped) within TF32's error of float64."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((16, 64, 20, 20), dtype=np.float32)
    w = rng.standard_normal((128, 64, 3, 3), dtype=np.float32)
    g = rng.standard_normal((16, 128, 20, 20), dtype=np.float32)
    grads = []
    for flag in (0, 1):
        with Context(ALLOW_TF32=flag):
            xt, wt = Tensor(x, device=cuda, requires_grad=True), Tensor(w, device=cuda, requires_grad=True)
            (xt.conv2d(wt, padding=1) * Tensor(g, device=cuda)).sum().backward()
            grads.append((xt.grad.numpy().astype(np.float64), wt.grad.numpy().astype(np.float64)))
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    dw = np.einsum("boyx,bcyxij->ocij", g.astype(np.float64), windows, optimize=True)
    (exact_dx, exact_dw), (dx, dw_tf32) = grads
    assert np.linalg.norm(exact_dw - dw) / np.linalg.norm(dw) < 1e-5
    assert 1e-5 < np.linalg.norm(dw_tf32 - dw) / np.linalg.norm(dw) < 2e-3
    assert 1e-5 < np.linalg.norm(dx - exact_dx) / np.linalg.norm(exact_dx) < 2e-3  # (the default: float32-exact)


def test_fragment_reads_and_async_writes_are_free_of_bank_conflicts() -> None:
    """Each register of a fragment: the 32 lanes of a warp read 32 distinct banks (4-byte words mod 32); each
    cp.async of a warp writes every 16-byte chunk of a 128-byte line once per 8 lanes. (Speed, not results: the
    emulation above checks the numbers whatever the swizzle.)"""
    t = Tensor(np.zeros((256, 32), np.float32)) @ Tensor(np.zeros((32, 256), np.float32))
    item = create_schedule([t.uop])[0][-1]
    _, captured = _render_tf32(item.ast)
    sink, (grid, _, _), (threads, _, _) = captured[-1]
    emu = Emulator(sink, grid, threads, {})
    nodes = sink.toposort()
    frags = [u for u in nodes if u.op is Ops.FRAGMENT]
    copies = [u for u in nodes if u.op is Ops.ASYNC_COPY]
    assert len(frags) == 12 and copies
    for k in range(2):
        for kk in range(2):
            env: dict[UOp, Any] = {emu.bidx: np.int64(1), emu.lidx: np.arange(threads), emu.k_outer: np.int64(k),
                                   emu.k_inner: np.int64(kk)}
            for frag in frags:
                for index in frag.src[1:]:
                    banks = np.broadcast_to(emu.value(index, env), (threads,)) % 32
                    assert all(len(set(banks[w:w + 32])) == 32 for w in range(0, threads, 32)), frag.arg
            for copy in copies:
                chunks = np.broadcast_to(emu.value(copy.src[1], env), (threads,)) // 4 % 8
                assert all(len(set(chunks[w:w + 8])) == 8 for w in range(0, threads, 8))
