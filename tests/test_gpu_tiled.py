"""The tiled GPU launch shape for matmul-shaped reductions (glassgrad/codegen/gpudims.py: `matmul_plan`, `_tiled`).

Without a GPU: which kernels take the shape (matmuls, batched matmuls, convolutions, half matmuls; not sums,
softmax, max-reductions or small products), that every global and shared-memory access of the rendered kernel stays
in bounds for every block, thread and loop iteration, the linear program's structure (one loop per level, the
barrier between the tile copy and its use), and 32-bit index narrowing. With a GPU (skipped otherwise): the numbers,
against numpy in float64 and against the CPU backend. (The same kernels run on the emulated Metal device in
tests/metal/test_metal_tiled.py, with real barriers between real threads.)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_schedule import _loop_size, check_access, eval_index

from glassgrad import Context, Tensor, dtypes
from glassgrad.codegen import ProgramSpec, gpudims
from glassgrad.codegen.gpudims import narrow_indices
from glassgrad.kernels import kernels
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp

F32, F16 = dtypes.float32, dtypes.float16


def matmul(m: int, k: int, n: int, dtype=F32) -> Callable[[], Tensor]:  # type: ignore[no-untyped-def]
    return lambda: Tensor.empty(m, k, dtype=dtype) @ Tensor.empty(k, n, dtype=dtype)


TILED: dict[str, Callable[[], Tensor]] = {
    "matmul remainders": matmul(130, 70, 129),
    "matmul exact tiles": matmul(128, 16, 256),
    "matmul short k": matmul(64, 8, 64),
    "half matmul": matmul(128, 24, 72, F16),
    "batched matmul": lambda: Tensor.empty(3, 70, 20) @ Tensor.empty(3, 20, 90),
    "conv2d padded": lambda: Tensor.empty(2, 5, 12, 12).conv2d(Tensor.empty(70, 5, 3, 3), padding=1),
    "linear with bias and relu": lambda: (Tensor.empty(96, 40) @ Tensor.empty(40, 80) + Tensor.empty(80)).relu(),
    "half matmul on tensor cores": matmul(128, 96, 256, F16),
    "narrow rows (32 output channels)": lambda: Tensor.empty(2, 3, 12, 12).conv2d(Tensor.empty(32, 3, 5, 5)),
    "narrow columns with remainders": matmul(130, 24, 40),
    "half matmul 64 columns on tensor cores": matmul(256, 64, 64, F16),
    "half matmul 64 rows on tensor cores": matmul(64, 32, 384, F16),
    "attention's p @ v on tensor cores": lambda: Tensor.empty(2, 3, 256, 128, dtype=dtypes.bfloat16) @
    Tensor.empty(2, 3, 128, 64, dtype=dtypes.bfloat16),
    "half x @ W^T on tensor cores": lambda: Tensor.empty(128, 64, dtype=F16) @ Tensor.empty(192, 64, dtype=F16).T,
    "half dy^T @ x on tensor cores": lambda: Tensor.empty(64, 256, dtype=F16).T @ Tensor.empty(64, 64, dtype=F16),
    "float32 64 columns (a head's p @ v)": lambda: Tensor.empty(2, 3, 200, 128) @ Tensor.empty(2, 3, 128, 64),
    "float32 64 output channels": lambda: Tensor.empty(2, 5, 12, 12).conv2d(Tensor.empty(64, 5, 3, 3), padding=1),
    "float32 64 by 32": matmul(64, 24, 32),
    "float32 256-row tiles (many outputs)": matmul(4096, 16, 4096),
}
NOT_TILED: dict[str, Callable[[], Tensor]] = {
    "small matmul": matmul(32, 64, 32),
    "elementwise product summed": lambda: (Tensor.empty(128, 128) * Tensor.empty(128, 128)).sum(axis=1),
    "max of products": lambda: (Tensor.empty(96, 40, 1) * Tensor.empty(1, 40, 80)).max(axis=1),
    "row sums": lambda: Tensor.empty(512, 512).sum(axis=1),
    "softmax": lambda: Tensor.empty(256, 256).softmax(-1),
}


def cuda_kernels(make: Callable[[], Tensor], arch: str = "sm_80") -> list[ProgramSpec]:
    """The kernels rendered for an sm_80 GPU (mma.sync tensor cores, cp.async) unless `arch` says otherwise: sm_90
    multiplies half tiles with warpgroup MMAs instead (the wgmma tests below)."""
    return kernels(make(), device="CUDA", arch=arch)


def shared_buffer(u: UOp) -> UOp:
    """The DEFINE_LOCAL behind what a shared-memory access names (a BARRIER, an async commit or wait)."""
    while u.op is not Ops.DEFINE_LOCAL:
        u = u.src[0]
    return u


def is_tiled(spec: ProgramSpec) -> bool:
    return any(u.op is Ops.BARRIER for u in spec.uops) and spec.local_size[0] in (256, 128, 64, 32)


@pytest.mark.parametrize("name", TILED)
def test_matmul_shaped_kernels_are_tiled(name: str) -> None:
    specs = cuda_kernels(TILED[name])
    assert is_tiled(specs[-1]), specs[-1].source
    assert "__syncthreads();" in specs[-1].source and "__shared__ __align__(" in specs[-1].source


@pytest.mark.parametrize("name", NOT_TILED)
def test_other_kernels_are_not_tiled(name: str) -> None:
    assert not any(is_tiled(s) for s in cuda_kernels(NOT_TILED[name]))


@pytest.mark.parametrize("name", ["matmul remainders", "half matmul", "batched matmul", "conv2d padded",
                                  "half matmul on tensor cores", "narrow rows (32 output channels)",
                                  "narrow columns with remainders", "half matmul 64 columns on tensor cores",
                                  "half matmul 64 rows on tensor cores", "attention's p @ v on tensor cores",
                                  "half x @ W^T on tensor cores", "half dy^T @ x on tensor cores",
                                  "float32 64 columns (a head's p @ v)", "float32 64 output channels",
                                  "float32 64 by 32"])
def test_every_access_is_in_bounds(name: str) -> None:
    """Every block, thread and iteration: global loads/stores inside their buffers, shared ones inside the tile."""
    t = TILED[name]()
    schedule, _ = create_schedule([t.uop])
    item = schedule[-1]
    spec = kernels(t, device="CUDA")[-1]
    checked = 0
    for u in spec.uops:
        if u.op is Ops.ASYNC_COPY:  # 16 bytes (or one 4-byte element) from global to shared memory: both ends of both
            gate, last = u.src[4:], 0 if u.arg == 4 else 16 // shared_buffer(u).dtype.itemsize - 1
            accesses = [UOp(Ops.LOAD, u.src[2].dtype, (u.src[2], u.src[3] + end, *gate)) for end in (0, last)] + \
                [UOp(Ops.LOAD, u.src[2].dtype, (shared_buffer(u), u.src[1] + end, *gate)) for end in (0, last)]
            for access in accesses:
                buf = access.src[0]
                check_access(access, buf.arg[1] if buf.op is Ops.DEFINE_LOCAL else item.bufs[buf.arg].size, "copy")
            checked += 1
        if u.op is Ops.COPY_OUT:  # 16 bytes from shared to global memory: both ends of both
            for end in (0, 7):
                check_access(UOp(Ops.LOAD, u.src[0].dtype, (u.src[0], u.src[1] + end)), item.bufs[u.src[0].arg].size,
                             "copy out")
                check_access(UOp(Ops.LOAD, u.src[0].dtype, (u.src[2], u.src[3] + end)), shared_buffer(u.src[2]).arg[1],
                             "copy out of shared memory")
            checked += 1
        if u.op not in (Ops.LOAD, Ops.STORE):
            continue
        buf = u.src[0] if u.src[0].op is Ops.DEFINE_GLOBAL else shared_buffer(u)
        size = buf.arg[1] if buf.op is Ops.DEFINE_LOCAL else item.bufs[buf.arg].size
        if u.op is Ops.STORE and len(u.src) == 4:  # a gated store: checked like a load under the same gate
            u = UOp(Ops.LOAD, u.src[2].dtype, (buf, u.src[1], u.src[3]))
        check_access(u, size, f"{spec.name}: {u.op} of {buf.op}")
        checked += 1
    assert checked > 16


def test_one_loop_per_level_and_the_barrier_between_copy_and_use() -> None:
    """64 accumulators share one k loop. Copied through registers (sm_75: no cp.async), the tile copy and its
    barrier sit in the outer k loop, before the inner."""
    from glassgrad.codegen import get_program
    from glassgrad.renderer.cuda import CUDARenderer
    spec = get_program(create_schedule([matmul(256, 64, 256)().uop])[0][-1].ast, CUDARenderer("sm_75"))
    ops = [u.op for u in spec.uops]
    assert ops.count(Ops.RANGE) == 2 and ops.count(Ops.DEFINE_ACC) == 64 and ops.count(Ops.ACCUMULATE) == 64
    outer, inner = (i for i, op in enumerate(ops) if op is Ops.RANGE)
    barrier = ops.index(Ops.BARRIER)
    local_stores = [i for i, u in enumerate(spec.uops) if u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_LOCAL]
    assert outer < min(local_stores) and max(local_stores) < barrier < inner
    assert all(u.op is not Ops.LOAD or u.src[0].op is not Ops.DEFINE_LOCAL for u in spec.uops)  # reads follow it
    assert Ops.ASYNC_COPY not in ops


def test_float32_tiles_are_copied_by_cp_async_a_tile_ahead() -> None:
    """sm_80+: the float32 tiles are copied by cp.async, 16 k a tile, a tile ahead: tile 0 before the k loop; in
    step k, after the wait for tile k and the barrier, tile k + 1, then the products of tile k. A factor read along
    its tile axis (b of a @ b) goes in 16-byte runs, one read along k (a) an element at a time (it is transposed into
    the [k][position] tile). A factor computed in the copy (a float16 one widened, remainders off the tensor cores)
    is copied through registers, 8 k a tile."""
    spec = cuda_kernels(matmul(256, 64, 256))[-1]
    ops = [u.op for u in spec.uops]
    assert ops.count(Ops.RANGE) == 2 and ops.count(Ops.DEFINE_ACC) == 64
    outer, inner = (i for i, op in enumerate(ops) if op is Ops.RANGE)
    assert spec.uops[outer].src[0].arg == 64 // 16 and spec.uops[inner].src[0].arg == 16
    copies = [i for i, op in enumerate(ops) if op is Ops.ASYNC_COPY]
    wait, barrier = ops.index(Ops.ASYNC_WAIT), ops.index(Ops.BARRIER)
    assert sum(i < outer for i in copies) == 8 + 2 and outer < wait < barrier < min(i for i in copies if i > outer)
    assert max(copies) < inner and "cp.async.wait_group 0;" in spec.source
    assert spec.source.count("gg_cp_async4(&") == 2 * 8 and spec.source.count("gg_cp_async(&") == 2 * 2
    assert not any(u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_LOCAL for u in spec.uops)
    widened = cuda_kernels(matmul(130, 24, 40, F16))[-1]
    assert is_tiled(widened) and Ops.ASYNC_COPY not in [u.op for u in widened.uops]


def test_large_float32_products_take_256_row_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 product with enough 256 x 128 tiles to give every multiprocessor two (WIDE_MIN_BLOCKS) takes them:
    16 x 8 outputs a thread (128 accumulators), 8 k a tile in 3 stages (two tiles in flight: wait_group 1). Fewer
    tiles keep 128 x 128 (8 x 8 a thread), as do half products (tensor cores)."""
    wide = cuda_kernels(matmul(4096, 64, 4096))[-1]
    assert wide.global_size[0] == 16 * 32 and wide.local_size[0] == 256
    assert [u.op for u in wide.uops].count(Ops.DEFINE_ACC) == 128 and "cp.async.wait_group 1;" in wide.source
    narrow = cuda_kernels(matmul(4096, 64, 2048))[-1]  # 16 x 16 = 256 wide tiles: too few
    assert narrow.global_size[0] == 32 * 16 and [u.op for u in narrow.uops].count(Ops.DEFINE_ACC) == 64
    monkeypatch.setattr(gpudims, "WIDE_MIN_BLOCKS", 0)
    assert [u.op for u in cuda_kernels(matmul(300, 40, 200))[-1].uops].count(Ops.DEFINE_ACC) == 128
    # (the rows are the axis the output is not contiguous along: 200 of them are too few for a 256-row tile)
    assert [u.op for u in cuda_kernels(matmul(200, 40, 300))[-1].uops].count(Ops.DEFINE_ACC) == 64


@pytest.mark.parametrize("make", [matmul(300, 40, 200), matmul(257, 9, 129),
                                  lambda: Tensor.empty(2, 3, 260, 20) @ Tensor.empty(2, 3, 20, 130),
                                  lambda: Tensor.empty(2, 5, 11, 11).conv2d(Tensor.empty(260, 5, 3, 3), padding=1)],
                         ids=["remainders", "one row past a tile", "batched", "conv"])
def test_wide_float32_tiles_stay_in_bounds(make: Callable[[], Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    """The 256-row tiles (forced on small shapes) with remainders, a batch and a convolution's gathered factor:
    every global and shared access, and both ends of every asynchronous copy, inside its buffer."""
    monkeypatch.setattr(gpudims, "WIDE_MIN_BLOCKS", 0)
    t = make()
    schedule, _ = create_schedule([t.uop])
    spec = kernels(t, device="CUDA")[-1]
    assert [u.op for u in spec.uops].count(Ops.DEFINE_ACC) == 128, spec.name
    sizes = schedule[-1].bufs
    for u in spec.uops:
        if u.op is Ops.ASYNC_COPY:
            gate = u.src[4:]
            check_access(UOp(Ops.LOAD, u.src[2].dtype, (u.src[2], u.src[3], *gate)), sizes[u.src[2].arg].size, "copy")
            check_access(UOp(Ops.LOAD, u.src[2].dtype, (shared_buffer(u), u.src[1], *gate)),
                         shared_buffer(u).arg[1], "copy into shared memory")
        elif u.op in (Ops.LOAD, Ops.STORE):
            buf = u.src[0] if u.src[0].op is Ops.DEFINE_GLOBAL else shared_buffer(u)
            size = buf.arg[1] if buf.op is Ops.DEFINE_LOCAL else sizes[buf.arg].size
            if u.op is Ops.STORE and len(u.src) == 4:
                u = UOp(Ops.LOAD, u.src[2].dtype, (buf, u.src[1], u.src[3]))
            check_access(u, size, f"{spec.name}: {u.op}")


@pytest.mark.parametrize("wide", [False, True])
def test_element_copies_of_a_warp_read_neighbouring_elements(wide: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A factor read along k (a of a @ b) is transposed into its [k][position] tile by 4-byte cp.asyncs. Neighbouring
    threads copy neighbouring k of a row (a warp reads 4 rows' 32-byte runs, and writes 32 different banks); each
    thread copying 4 neighbouring k spread a warp over 16 rows (16 sectors per copy; H200, 4096^3: 38.8 -> 42.5
    TFLOP/s). With 16 k a tile (128-row tiles) two threads share a bank; with 8 (256-row tiles) none do."""
    monkeypatch.setattr(gpudims, "WIDE_MIN_BLOCKS", 0 if wide else 10**9)
    spec = cuda_kernels(matmul(256, 64, 256))[-1]
    copy = next(u for u in spec.uops if u.op is Ops.ASYNC_COPY and u.arg == 4)
    lidx = next(u for u in copy.src[3].toposort() if u.op is Ops.SPECIAL and u.arg[0] == "lidx")
    others = sorted({u for part in (copy.src[1], copy.src[3]) for u in part.toposort()
                     if u.op in (Ops.RANGE, Ops.SPECIAL) and u is not lidx}, key=lambda r: str(r.arg))
    axis_of = {lidx: 0, **{r: i + 1 for i, r in enumerate(others)}}
    ndim = len(axis_of)

    def first_warp(index: UOp) -> np.ndarray:
        values = np.broadcast_to(eval_index(index, axis_of, ndim, {}), tuple(
            _loop_size(r) for r in sorted(axis_of, key=axis_of.__getitem__)))
        return values[(slice(0, 32), *([0] * (ndim - 1)))]
    reads, writes = first_warp(copy.src[3]), first_warp(copy.src[1])
    assert len({int(r) // 8 for r in reads}) == 4  # 32 floats in whole 32-byte sectors (4 rows of 8, or 2 of 16)
    assert len({int(w) % 32 for w in writes}) == (32 if wide else 16)


def test_half_matmuls_with_whole_tiles_use_tensor_cores() -> None:
    """mma.sync on sm_80+, fed by ldmatrix from shared memory; remainders or an older GPU: the float32 tiles."""
    from glassgrad.codegen import get_program
    from glassgrad.renderer.cuda import CUDARenderer
    ast = create_schedule([matmul(256, 64, 384, F16)().uop])[0][-1].ast
    spec = get_program(ast, CUDARenderer("sm_80"))
    ops = [u.op for u in spec.uops]
    assert ops.count(Ops.WMMA) == 32 and ops.count(Ops.FRAGMENT) == 8 and ops.count(Ops.GEP) == 128
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in spec.source and "ldmatrix" in spec.source
    assert spec.source.count("gg_cp_async(&") == 24  # 8 16-byte copies for each of tiles 0 and 1, then tile k+2
    assert "cp.async.wait_group 1;" in spec.source
    one_tile = cuda_kernels(lambda: Tensor.empty(2, 128, 32, dtype=F16) @ Tensor.empty(2, 32, 256, dtype=F16))[-1]
    assert one_tile.source.count("cp.async.commit_group") == 3  # an empty group keeps the wait's count right
    assert Ops.WMMA not in [u.op for u in get_program(ast, CUDARenderer("sm_75")).uops]
    for odd in (matmul(200, 64, 384, F16), matmul(256, 40, 384, F16)):
        assert Ops.WMMA not in [u.op for u in cuda_kernels(odd)[-1].uops]
    bf16 = cuda_kernels(matmul(128, 32, 128, dtypes.bfloat16))[-1].source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in bf16
    bf16_from_float = Tensor.empty(128, 32).cast(dtypes.bfloat16)
    cast = cuda_kernels(lambda: bf16_from_float @ Tensor.empty(32, 128, dtype=dtypes.bfloat16))
    assert "mma.sync" in cast[-1].source and "cp.async" not in cast[-1].source  # a cast is no plain copy


@pytest.mark.parametrize("m,n,wmma", [(256, 64, 16), (64, 384, 16), (64, 64, 8), (128, 128, 32)])
def test_tensor_core_tiles_64_wide_along_an_axis_64_divides(m: int, n: int, wmma: int) -> None:
    """An axis that 64 divides and 128 does not (an attention head: `p @ v`, and the gradients of q, k and v) gets
    a tile 64 wide on the tensor cores, each warp a 64 x 32 (or 32 x 64, or 32 x 32) part: 16 (or 8) mma.sync per
    k step of 16. They ran on float32 tiles before (18 ms of a bf16 GPT-2 step)."""
    spec = cuda_kernels(matmul(m, 64, n, F16))[-1]
    ops = [u.op for u in spec.uops]
    assert ops.count(Ops.WMMA) == wmma and ops.count(Ops.GEP) == 4 * wmma
    assert "mma.sync.aligned.m16n8k16" in spec.source and "gg_cp_async(&" in spec.source
    assert spec.global_size[0] == (m // min(m, 128)) * (n // min(n, 128)) and spec.local_size == (128, 1, 1)


TRANSPOSED = {  # (a's storage is transposed, b's storage is transposed)
    "a @ b": (False, False), "x @ W^T (nn.Linear)": (False, True), "dy^T @ x (a weight gradient)": (True, False),
    "a^T @ b^T": (True, True)}


def transposed_matmul(m: int, k: int, n: int, a_t: bool, b_t: bool, dtype=F16) -> Callable[[], Tensor]:  # type: ignore[no-untyped-def]
    def make() -> Tensor:
        a = Tensor.empty(k, m, dtype=dtype).T if a_t else Tensor.empty(m, k, dtype=dtype)
        return a @ (Tensor.empty(n, k, dtype=dtype).T if b_t else Tensor.empty(k, n, dtype=dtype))
    return make


@pytest.mark.parametrize("name", TRANSPOSED)
def test_tensor_core_tiles_are_stored_the_way_their_factor_is_read(name: str) -> None:
    """Each side of a tensor-core tile is stored [k][position] or [position][k], as its global loads run: every
    16-byte run a thread copies is then contiguous in shared memory as well, so all of them are cp.async (x @ W^T,
    every nn.Linear, copied its weight element by element through registers: 55 TFLOP/s at 8192x768x3072).
    ldmatrix reads a [position][k] side as it is, a [k][position] side transposed."""
    a_t, b_t = TRANSPOSED[name]
    spec = cuda_kernels(transposed_matmul(256, 64, 384, a_t, b_t))[-1]
    assert spec.source.count("gg_cp_async(&") == 24  # 8 16-byte copies per thread for each of 3 tiles
    frags = [u.arg for u in spec.uops if u.op is Ops.FRAGMENT]
    assert frags.count(("row", a_t)) == 4 and frags.count(("col", not b_t)) == 4 and len(frags) == 8
    bf16_round_trip = Tensor.empty(256, 64, dtype=dtypes.bfloat16).float().cast(dtypes.bfloat16)
    spec = cuda_kernels(lambda: bf16_round_trip @ Tensor.empty(384, 64, dtype=dtypes.bfloat16).T)[-1]
    assert spec.source.count("gg_cp_async(&") == 24  # bfloat16 -> float -> bfloat16 is the load itself


def test_tensor_core_fragments_stay_in_shared_memory() -> None:
    """Each lane's ldmatrix row (8 halves from its address) lies inside the shared buffer, 16-byte aligned."""
    spec = cuda_kernels(lambda: Tensor.empty(2, 128, 64, dtype=F16) @ Tensor.empty(2, 64, 256, dtype=F16))[-1]
    frags = [u for u in spec.uops if u.op is Ops.FRAGMENT]
    assert frags
    for u in frags:
        size = shared_buffer(u).arg[1]
        check_access(UOp(Ops.LOAD, F16, (u.src[0], u.src[1] + 7)), size, "ldmatrix row end")
        check_access(UOp(Ops.LOAD, F16, (u.src[0], u.src[1] % 8 + 1_000_000)), 1_000_001, "ldmatrix alignment")


def _all_values(index: UOp) -> np.ndarray:
    """`index` evaluated for every value of the ids and loops it uses (flattened)."""
    ids = sorted({n for n in index.toposort() if n.op in (Ops.RANGE, Ops.SPECIAL)}, key=lambda r: str(r.arg))
    return np.broadcast_to(eval_index(index, {r: i for i, r in enumerate(ids)}, len(ids), {}),
                           tuple(_loop_size(r) for r in ids)).reshape(-1)


STAGED = {  # a tensor-core kernel whose tile leaves shared memory in 16-byte runs: (make, outputs)
    "half matmul": (matmul(256, 64, 384, F16), 256 * 384),
    "64-wide tiles": (matmul(256, 64, 64, F16), 256 * 64),
    "attention's q @ k^T, batched": (lambda: Tensor.empty(2, 3, 128, 64, dtype=dtypes.bfloat16) @
                                     Tensor.empty(2, 3, 128, 64, dtype=dtypes.bfloat16).transpose(-1, -2),
                                     6 * 128 * 128),
    "x @ W^T + bias, relu": (lambda: (transposed_matmul(128, 64, 192, False, True)() + Tensor.empty(192, dtype=F16))
                             .relu(), 128 * 192),
}


@pytest.mark.parametrize("name", STAGED)
def test_tensor_core_outputs_leave_in_16_byte_runs(name: str) -> None:
    """A tensor-core tile's outputs (its epilogue applied) go to shared memory, then out in 16-byte runs
    (COPY_OUT), consecutive lanes along a row: a fragment stored directly writes 4 bytes of each of 8 rows per
    warp instruction (q @ k^T spent 0.46 ms storing 100 M bfloat16 scores). Every output is copied exactly once,
    from 16-byte aligned addresses on both sides."""
    make, outputs = STAGED[name]
    spec = cuda_kernels(make)[-1]
    copies = [u for u in spec.uops if u.op is Ops.COPY_OUT]
    assert copies and "*(uint4*)&data0[" in spec.source
    starts = np.concatenate([_all_values(u.src[1]) for u in copies])
    assert (starts % 8 == 0).all() and np.array_equal(np.sort(starts), np.arange(0, outputs, 8))
    assert all((_all_values(u.src[3]) % 8 == 0).all() for u in copies)
    barriers = [i for i, u in enumerate(spec.uops) if u.op is Ops.BARRIER]
    first_copy = spec.uops.index(copies[0])
    local_stores = [i for i, u in enumerate(spec.uops) if u.op is Ops.STORE and u.src[0].op is Ops.BARRIER]
    assert barriers[-2] < min(local_stores) and max(local_stores) < barriers[-1] < first_copy


@pytest.mark.parametrize("make", [
    lambda: (Tensor.empty(256, 64, dtype=F16) @ Tensor.empty(64, 384, dtype=F16)).float(),  # wider than the tiles
    lambda: (Tensor.empty(2, 256, 64, dtype=F16) @ Tensor.empty(2, 64, 384, dtype=F16)).permute(1, 2, 0).contiguous(),
])
def test_tensor_core_outputs_stored_directly_otherwise(make: Callable[[], Tensor]) -> None:
    """Outputs wider than the factors (float32) or not contiguous along the tile's columns (the batch innermost)
    keep direct stores."""
    spec = cuda_kernels(make)[-1]
    assert "mma.sync" in spec.source and not any(u.op is Ops.COPY_OUT for u in spec.uops)


@pytest.mark.parametrize("a_t,b_t", list(TRANSPOSED.values()), ids=list(TRANSPOSED))
@pytest.mark.parametrize("m,n", [(256, 384), (64, 128), (128, 64), (64, 64)])
def test_half_tiles_on_hopper_are_warpgroup_mmas(m: int, n: int, a_t: bool, b_t: bool) -> None:
    """On sm_90 a half tile copied by cp.async is multiplied by warpgroup MMAs: per 64 rows of the tile one
    m64nN wgmma over its whole width N, each side read by descriptor K-major ([position][k]) or M/N-major
    ([k][position]) as its loads run; the copies' wait fences them for the async proxy, and each k step waits for
    its MMAs before the next refills the tiles. WGMMA=0, or sm_80, keeps mma.sync."""
    make = transposed_matmul(m, 64, n, a_t, b_t)
    spec = cuda_kernels(make, arch="sm_90")[-1]
    rows, cols = min(m, 128), min(n, 128)
    mmas = [u for u in spec.uops if u.op is Ops.WMMA]
    assert len(mmas) == rows // 64 and all(u.arg[:4] == ("wgmma", cols, a_t, not b_t) for u in mmas)
    assert sum(u.op is Ops.GEP for u in spec.uops) == rows // 64 * cols // 2
    assert f"wgmma.mma_async.sync.aligned.m64n{cols}k16.f32.f16.f16" in spec.source
    assert "fence.proxy.async.shared::cta" in spec.source and "mma.sync" not in spec.source
    waits, loop_ends = spec.source.index("wgmma.wait_group.sync.aligned 0"), spec.source.rindex("__syncthreads")
    assert waits < loop_ends  # the MMAs are waited for before the outputs' barrier
    with Context(WGMMA=0):
        assert "mma.sync" in cuda_kernels(make, arch="sm_90")[-1].source
    assert "wgmma" not in cuda_kernels(make, arch="sm_80")[-1].source


def _hardware_address(start: int, pos: np.ndarray, k: np.ndarray, mode: int, leading: int, stride: int) -> np.ndarray:
    """The shared-memory byte a warpgroup MMA reads for element (pos, k) of an operand whose descriptor starts at
    byte `start` (PTX ISA, "matrix descriptor"; the layouts checked on an H200 by scratch probes): 8 x 16-byte core
    matrices, then the swizzle's XOR of the 16-byte chunk bits with the row bits above them."""
    if mode == 2:  # K-major, 64-byte swizzle: rows of 64 bytes, 8-row groups `stride` apart
        x = start + (pos // 8) * stride + (pos % 8) * 64 + (k // 8) * 16 + (k % 8) * 2
        return x ^ (((x >> 7) & 3) << 4)
    assert mode == 1  # M/N-major, 128-byte swizzle: 64 positions a row, 8-k groups `stride` apart, blocks `leading`
    x = start + (pos // 64) * leading + (k // 8) * stride + (k % 8) * 128 + (pos % 64) * 2
    return x ^ (((x >> 7) & 7) << 4)


@pytest.mark.parametrize("k_major", [False, True])
@pytest.mark.parametrize("width", [64, 128])
def test_warpgroup_descriptors_read_what_the_copies_wrote(width: int, k_major: bool) -> None:
    """For every element of both k16 halves of a tile, in every 64-row part (the rows side) or the whole width
    (the columns side), the byte the hardware reads through the descriptor is the byte `_TileAt` put it at."""
    from glassgrad.codegen.gpudims import WGMMA_ATOM, TensorCoreKind, _TileAt
    i32 = dtypes.int32
    kind = TensorCoreKind(F16, 32, 32)
    at = _TileAt(kind, 3, UOp.const(i32, 2), (width, width), (k_major, k_major), atom=WGMMA_ATOM)
    for side in (0, 1):
        (_, mode, leading, stride), step = at.descriptor(side)
        parts = range(0, width, 64) if side == 0 else [0]
        extent = 64 if side == 0 else width
        pos = UOp(Ops.RANGE, i32, (UOp.const(i32, extent),), (0, "global"))
        k = UOp(Ops.RANGE, i32, (UOp.const(i32, 16),), (1, "global"))
        for first in parts:
            start = 2 * int(eval_index(at(side, UOp.const(i32, first), UOp.const(i32, 0)), {}, 0, {}))
            for half in (0, 1):
                index = at(side, pos + UOp.const(i32, first), k + UOp.const(i32, 16 * half))
                ours = 2 * np.broadcast_to(eval_index(index, {pos: 0, k: 1}, 2, {}), (extent, 16))
                theirs = _hardware_address(start + half * step, np.arange(extent)[:, None], np.arange(16)[None, :],
                                           mode, leading, stride)
                assert np.array_equal(ours, theirs), (side, first, half)


def test_warpgroup_kernels_compile_for_sm_90a(nvrtc: Any) -> None:
    """NVRTC builds a kernel with warpgroup MMAs for sm_90a (the CUDA compiler picks it from the source)."""
    for a_t, b_t in TRANSPOSED.values():
        source = cuda_kernels(transposed_matmul(128, 64, 192, a_t, b_t, dtypes.bfloat16), arch="sm_90")[-1].source
        assert "wgmma.mma_async" in source and nvrtc.compile(source)[:4] == b"\x7fELF"


@pytest.mark.parametrize("name", TILED)
def test_tiled_kernels_compile_for_sm_90(name: str, nvrtc: Any) -> None:
    """NVRTC (no GPU needed) accepts every tiled kernel, ldmatrix/mma.sync/cp.async included."""
    assert nvrtc.compile(cuda_kernels(TILED[name])[-1].source)[:4] == b"\x7fELF"


def test_narrow_indices() -> None:
    i = UOp(Ops.RANGE, dtypes.int64, (UOp.const(dtypes.int64, 1000),), (0, "global"))
    buf = UOp(Ops.DEFINE_GLOBAL, F32, (), 0)
    small = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (buf, i * 3, UOp.const(F32, 1.0))),))
    assert all(u.dtype != dtypes.int64 for u in narrow_indices(small).toposort())
    big = UOp(Ops.SINK, dtypes.void, (UOp(Ops.STORE, dtypes.void, (buf, i * 3_000_000, UOp.const(F32, 1.0))),))
    assert narrow_indices(big) is big  # 3e9 does not fit in int32


def test_a_4096_matmul_indexes_in_32_bits() -> None:
    """The scheduler chose int64 (the n^3 broadcast product is large); no index of the kernel reaches 2^31."""
    source = cuda_kernels(matmul(4096, 4096, 4096))[-1].source
    assert "long long" not in source


# ---------------------------------------------------------------- on a GPU


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("m,k,n", [(130, 70, 129), (64, 8, 64), (128, 128, 128), (257, 33, 1000), (1024, 1, 64),
                                   (300, 4096, 200), (32, 300, 1000), (1000, 77, 40), (40, 9, 130), (256, 96, 64),
                                   (64, 40, 300), (64, 24, 32), (200, 1000, 64)])
def test_matmul_on_gpu(cuda: str, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * k + n)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    out = (Tensor(a, device=cuda) @ Tensor(b, device=cuda)).numpy()
    assert relative_error(out, a.astype(np.float64) @ b) < 1e-5


@pytest.mark.parametrize("shape_a,shape_b", [((200, 96), (96, 136)), ((256, 64), (64, 384)), ((512, 1024), (1024, 128)),
                                             ((2, 128, 32), (2, 32, 256)), ((256, 64), (64, 64)), ((64, 96), (96, 384)),
                                             ((64, 32), (32, 64)), ((2, 3, 256, 128), (2, 3, 128, 64)),
                                             ((320, 64), (64, 192))])
def test_half_matmul_on_gpu(cuda: str, shape_a: tuple[int, ...], shape_b: tuple[int, ...]) -> None:
    """Both tiled variants: float32 tiles (remainders) and tensor cores (whole tiles)."""
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal(s, dtype=np.float32).astype(np.float16) for s in (shape_a, shape_b))
    out = (Tensor(a, device=cuda) @ Tensor(b, device=cuda)).numpy()
    assert out.dtype == np.float16 and relative_error(out, a.astype(np.float64) @ b.astype(np.float64)) < 2e-3


@pytest.mark.parametrize("name", TRANSPOSED)
@pytest.mark.parametrize("m,k,n", [(256, 96, 384), (128, 64, 64), (64, 160, 192)])
def test_transposed_half_matmuls_on_gpu(cuda: str, name: str, m: int, k: int, n: int) -> None:
    """Every storage order of both factors, on tensor-core tiles 128 and 64 wide: the values numpy gives."""
    a_t, b_t = TRANSPOSED[name]
    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((k, n), dtype=np.float32).astype(np.float16)
    ta = Tensor(np.ascontiguousarray(a.T), device=cuda).T if a_t else Tensor(a, device=cuda)
    tb = Tensor(np.ascontiguousarray(b.T), device=cuda).T if b_t else Tensor(b, device=cuda)
    out = (ta @ tb).numpy()
    assert relative_error(out, a.astype(np.float64) @ b.astype(np.float64)) < 2e-3


def test_bfloat16_attention_on_gpu(cuda: str) -> None:
    """softmax(q k^T / 8) @ v and its gradients in bfloat16 (autocast's dtypes): the products with a head of 64 run
    on 64-wide tensor-core tiles; values against float64 numpy from the same bfloat16 inputs."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 2, 128, 64), dtype=np.float32) for _ in range(3))
    g = rng.standard_normal((2, 2, 128, 64), dtype=np.float32)
    ts = [Tensor(a, device=cuda, requires_grad=True) for a in (q, k, v)]
    qb, kb, vb = (t.cast(dtypes.bfloat16) for t in ts)
    p = (qb @ kb.transpose(-1, -2)).float().div(8).softmax(-1)
    out = p.cast(dtypes.bfloat16) @ vb
    (out.float() * Tensor(g, device=cuda)).sum().backward()
    q64, k64, v64 = (Tensor(a).cast(dtypes.bfloat16).float().numpy().astype(np.float64) for a in (q, k, v))
    s = q64 @ k64.transpose(0, 1, 3, 2) / 8
    p64 = np.exp(s - s.max(-1, keepdims=True))
    p64 /= p64.sum(-1, keepdims=True)
    assert relative_error(out.float().numpy(), p64 @ v64) < 1e-2
    dp = g @ v64.transpose(0, 1, 3, 2)
    ds = p64 * (dp - (dp * p64).sum(-1, keepdims=True)) / 8
    for t, ref in zip(ts, (ds @ k64, ds.transpose(0, 1, 3, 2) @ q64, p64.transpose(0, 1, 3, 2) @ g)):
        assert t.grad is not None and relative_error(t.grad.numpy(), ref) < 2e-2


@pytest.mark.parametrize("layout", ["plain", "bias relu", "transposed", "columns split and permuted",
                                    "batch innermost"])
def test_tensor_core_epilogues_on_gpu(cuda: str, layout: str) -> None:
    """Outputs staged through shared memory (or, where runs are not contiguous, stored directly) land where numpy
    puts them, with a fused epilogue applied."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((2, 256, 64), dtype=np.float32).astype(np.float16)
    b = rng.standard_normal((2, 64, 384), dtype=np.float32).astype(np.float16)
    bias = rng.standard_normal(384, dtype=np.float32).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    out = Tensor(a, device=cuda) @ Tensor(b, device=cuda)
    if layout == "bias relu":
        out, ref = (out + Tensor(bias, device=cuda)).relu(), np.maximum(ref + bias, 0)
    elif layout == "transposed":
        out, ref = out.transpose(-1, -2).contiguous(), ref.transpose(0, 2, 1)
    elif layout == "columns split and permuted":
        out, ref = out.reshape(2, 256, 48, 8).permute(0, 1, 3, 2).contiguous(), ref.reshape(2, 256, 48, 8)\
            .transpose(0, 1, 3, 2)
    elif layout == "batch innermost":
        out, ref = out.permute(1, 2, 0).contiguous(), ref.transpose(1, 2, 0)
    assert relative_error(out.numpy(), ref) < 2e-3


def test_bfloat16_matmul_on_gpu(cuda: str) -> None:
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((256, 96), dtype=np.float32), rng.standard_normal((96, 128), dtype=np.float32)
    out = (Tensor(a, device=cuda).cast(dtypes.bfloat16) @ Tensor(b, device=cuda).cast(dtypes.bfloat16)).float()
    ref = Tensor(a).cast(dtypes.bfloat16).float().numpy().astype(np.float64) @ \
        Tensor(b).cast(dtypes.bfloat16).float().numpy().astype(np.float64)
    assert relative_error(out.numpy(), ref) < 1e-2


@pytest.mark.parametrize("make", [
    lambda d, x, w: x.conv2d(w, padding=1),
    lambda d, x, w: x.conv2d(w, stride=2),
    lambda d, x, w: (x.reshape(2, 5 * 12, 12).permute(0, 2, 1) @ Tensor.ones(60, 70, device=d)).relu(),
])
def test_conv_and_batched_on_gpu_match_the_cpu(cuda: str, make: Callable[..., Tensor]) -> None:
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 5, 12, 12), dtype=np.float32), rng.standard_normal((70, 5, 3, 3), dtype=np.float32)
    gpu = make(cuda, Tensor(x, device=cuda), Tensor(w, device=cuda)).numpy()
    cpu = make("CPU", Tensor(x, device="CPU"), Tensor(w, device="CPU")).numpy()
    assert relative_error(gpu, cpu.astype(np.float64)) < 1e-5


@pytest.mark.parametrize("batch,cin,cout,size,k", [(64, 32, 32, 24, 5), (128, 32, 64, 10, 3), (32, 1, 32, 28, 5)])
def test_conv_gradients_on_gpu(cuda: str, batch: int, cin: int, cout: int, size: int, k: int) -> None:
    """MNIST's conv gradients (split weight-gradient reductions, narrow 32-channel tiles) against float64 numpy."""
    rng = np.random.default_rng(batch * cout + k)
    x = rng.standard_normal((batch, cin, size, size), dtype=np.float32)
    w = rng.standard_normal((cout, cin, k, k), dtype=np.float32)
    g = rng.standard_normal((batch, cout, size - k + 1, size - k + 1), dtype=np.float32)
    xt, wt = Tensor(x, device=cuda, requires_grad=True), Tensor(w, device=cuda, requires_grad=True)
    out = xt.conv2d(wt)
    (out * Tensor(g, device=cuda)).sum().backward()
    windows = np.lib.stride_tricks.sliding_window_view(x.astype(np.float64), (k, k), axis=(2, 3))
    assert relative_error(out.numpy(), np.einsum("bcyxij,ocij->boyx", windows, w.astype(np.float64))) < 1e-5
    assert relative_error(wt.grad.numpy(), np.einsum("boyx,bcyxij->ocij", g.astype(np.float64), windows)) < 1e-5
    dx = np.zeros(x.shape)
    for i in range(k):
        for j in range(k):
            dx[:, :, i:i + size - k + 1, j:j + size - k + 1] += np.einsum("boyx,oc->bcyx", g.astype(np.float64),
                                                                       w[:, :, i, j].astype(np.float64))
    assert relative_error(xt.grad.numpy(), dx) < 1e-5
