"""CUDA C for NVIDIA GPUs: the shared C-style renderer with CUDA's spelling.

In: a linear program after `codegen.gpudims` (SPECIAL thread ids, GROUP_REDUCE). Out: one
`extern "C" __global__ void __launch_bounds__(L) name(...)` kernel, compiled by NVRTC in the CUDA runtime.
What differs from C: the kernel prefix and `__restrict__` parameters, `blockIdx`/`threadIdx`, `__shared__` arrays
with `__syncthreads()`, `half`/`__nv_bfloat16` from NVRTC's built-in headers (math on them still runs in float32,
as on the CPU, so results agree across devices), infinities without <math.h>, and bitcasts through a union.
"""
from __future__ import annotations

import re

from glassgrad.dtype import DType, dtypes
from glassgrad.renderer.cstyle import CStyleLanguage, float32_compute
from glassgrad.uop.ops import UOp

_BITCAST_HELPER = ("template <class T, class F> __device__ __forceinline__ T gg_bitcast(F x) "
                   "{ union { F f; T t; } u; u.f = x; return u.t; }")


# tensor cores (sm_80+): ldmatrix loads a warp's 16 x 16 fragment from shared memory (each lane names one row); mma.sync
# multiplies a 16 x 16 row fragment by a 16 x 8 column fragment into 4 float32 accumulators per lane
_MMA_HELPERS = """\
__device__ __forceinline__ void gg_ldmatrix(unsigned* r, const void* p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void gg_ldmatrix_trans(unsigned* r, const void* p) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}"""
_ASYNC_HELPERS = """\
__device__ __forceinline__ void gg_cp_async(void* dst, const void* src) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(d), "l"(src) : "memory");
}"""
# one 4-byte element; src-size 0 reads nothing and writes zeros (a pad's zeros, past a tile's end)
_ASYNC_ELEMENT_HELPER = """\
__device__ __forceinline__ void gg_cp_async4(void* dst, const void* src, bool full) {
  unsigned d = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"(d), "l"(src), "r"(full ? 4 : 0) : "memory");
}"""
_MMA = """\
__device__ __forceinline__ void gg_mma_{name}(float* c, const unsigned* a, const unsigned* b) {{
  asm("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}}"""
# two floats rounded to nearest-even into one register of a half fragment, the first in the low 16 bits
_PACK_BF16 = """\
__device__ __forceinline__ unsigned gg_pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); return *(unsigned*)&v;
}"""
_PACK_F16 = """\
__device__ __forceinline__ unsigned gg_pack_f16(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi); return *(unsigned*)&v;
}"""
_MMA_TYPES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}

# Hopper's warpgroup MMA (sm_90a): the 4 warps of a warpgroup multiply a 64 x k16 tile by a k16 x n tile, both read from
# shared memory through 64-bit descriptors (the start address, the byte offsets between 8 x 16-byte core matrices
# along the two axes, the swizzle mode), into n/2 float32 accumulators per thread (warp w holds rows 16w..16w+15,
# laid out per 8 columns as mma.sync's m16n8 accumulators)
_WGMMA_DESC = """\
__device__ __forceinline__ unsigned long long gg_wgmma_desc(const void* p, unsigned leading, unsigned stride,
                                                           unsigned mode) {
  unsigned a = (unsigned)__cvta_generic_to_shared(p);
  return (unsigned long long)((a & 0x3FFFF) >> 4) | ((unsigned long long)((leading & 0x3FFFF) >> 4) << 16) |
         ((unsigned long long)((stride & 0x3FFFF) >> 4) << 32) | ((unsigned long long)mode << 62);
}"""


def _wgmma_name(n: int, t: str, trans_a: bool, trans_b: bool) -> str:
    return f"gg_wgmma_n{n}_{t}_{int(trans_a)}{int(trans_b)}"


def _wgmma_helper(n: str, t: str, trans_a: str, trans_b: str) -> str:
    """`gg_wgmma_n{n}_{t}_{a}{b}(acc, a, b, step_a, step_b)`: acc += two m64n{n}k16 products (k 0-15 at the
    descriptors, k 16-31 at the descriptors plus the steps, in 16-byte units), issued and committed, not waited for
    (`render_warpgroup_wait`). a, b: whether the row side is M-major and the column side N-major (else K-major)."""
    regs = int(n) // 2
    outs = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    acc = ",".join(f"%{i}" for i in range(regs))
    mma = (f'"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{t}.{t} {{{acc}}}, %{regs}, %{regs + 1}, 1, 1, 1, '
           f'{trans_a}, {trans_b};"')
    return f"""\
__device__ __forceinline__ void {_wgmma_name(int(n), t, trans_a == "1", trans_b == "1")}(float* d, unsigned long long a,
    unsigned long long b, unsigned step_a, unsigned step_b) {{
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
  asm volatile({mma} : {outs} : "l"(a), "l"(b));
  asm volatile({mma} : {outs} : "l"(a + step_a), "l"(b + step_b));
}}"""
# an atomic add of an 8- or 16-bit int: a compare-and-swap loop on the aligned 32-bit word holding it (the other
# bytes written back as they were; CUDA allocations are 256-byte aligned, so the word is inside the allocation)
_NARROW_ATOMIC_ADD = """\
template <class T> __device__ __forceinline__ void gg_atomic_add_narrow(T* p, int v) {
  unsigned* word = (unsigned*)((unsigned long long)p & ~3ull);
  unsigned shift = (unsigned)((unsigned long long)p & 3ull) * 8u;
  unsigned mask = (sizeof(T) == 1 ? 0xffu : 0xffffu) << shift;
  unsigned old = *word, seen;
  do {
    seen = old;
    unsigned sum = (((seen & mask) >> shift) + (unsigned)v) << shift;
    old = atomicCAS(word, seen, (seen & ~mask) | (sum & mask));
  } while (old != seen);
}"""
# float32 on the tensor cores (ALLOW_TF32=1): each fragment element is a float rounded to TensorFloat-32 (cvt.rna:
# to nearest, ties away), m16n8k8 multiplies a 16 x 8 row fragment (4 registers) by an 8 x 8 column fragment (2)
_TF32_HELPERS = """\
__device__ __forceinline__ unsigned gg_tf32(float x) {
  unsigned r; asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x)); return r;
}
__device__ __forceinline__ void gg_mma_tf32(float* c, const unsigned* a, const unsigned* b) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}"""


# the types __shfl_xor_sync moves (cuda_fp16.h and cuda_bf16.h add the halves)
_SHUFFLED = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
                       dtypes.float16, dtypes.bfloat16})


class CUDARenderer(CStyleLanguage):
    device = "CUDA"
    has_local = True
    extra_matcher = float32_compute
    barrier = "__syncthreads();"
    vector_runs = True

    def __init__(self, arch: str = "sm_90") -> None:
        """`arch`: the GPU architecture the kernels are for ('sm_90', 'sm_80', 'sm_90a'): a target detail given
        here (by the open GPU, or `kernels(..., arch=)`), never asked of a driver, so rendering needs no GPU."""
        if not isinstance(arch, str) or re.fullmatch(r"sm_\d+a?", arch) is None:
            raise ValueError(f"a CUDA architecture looks like 'sm_90' or 'sm_80'; got {arch!r}")
        self.arch = arch
        # mma.sync m16n8k16 (halves) and m16n8k8 (tf32, ALLOW_TF32=1), ldmatrix
        self.tensor_cores = int(arch.removeprefix("sm_").rstrip("a")) >= 80
        # Hopper's warpgroup MMAs (wgmma: sm_90a, which only sm_90 GPUs run; codegen/gpudims.py uses them unless
        # WGMMA=0)
        self.warpgroup_mma = arch.removeprefix("sm_").rstrip("a") == "90"

    type_names = {**CStyleLanguage.type_names, dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16"}
    abs_functions = {dtypes.float32: "fabsf", dtypes.float64: "fabs"}

    def group_id(self) -> str:
        return "blockIdx.x"

    def local_id(self) -> str:
        return "threadIdx.x"

    def render_global_range(self, index: int, var: str, size: str, dtype: str) -> str:
        return "#pragma unroll\n  " + super().render_global_range(index, var, size, dtype)

    def render_aligned_array(self, dtype: DType, name: str, size: int) -> str:
        return f"__align__(16) {self.render_dtype(dtype)} {name}[{size}];"

    def render_local_array(self, dtype: DType, name: str, size: int) -> str:
        # 16-byte aligned: four neighbouring floats at a multiple of 4 then load as one 128-bit access; a tile buffer
        # (4 KB or more) 1024-byte aligned: a warpgroup MMA's swizzle follows the address bits of its rows
        align = 1024 if size * dtype.itemsize >= 4096 else 16
        return f"__shared__ __align__({align}) {self.render_dtype(dtype)} {name}[{size}];"

    def render_param(self, u: UOp, writes: bool) -> str:
        return f"{'' if writes else 'const '}{self.render_dtype(u.dtype)}* __restrict__ data{u.arg}"

    def render_const(self, value: int | float | bool, dtype: DType) -> str:
        if dtype.is_float and value != value:
            return self.render_cast("__int_as_float(0x7fc00000)", dtypes.float32, dtype)
        if dtype.is_float and value in (float("inf"), float("-inf")):
            text = f"{'-' if value < 0 else ''}__int_as_float(0x7f800000)"
            return text if dtype == dtypes.float32 else self.render_cast(text, dtypes.float32, dtype)
        return super().render_const(value, dtype)

    def render_cast(self, x: str, src: DType, dst: DType) -> str:
        # half/bfloat16 convert through float: their constructors from ints are not always available
        if dst in (dtypes.float16, dtypes.bfloat16) and src != dtypes.float32:
            x, src = f"(float)({x})", dtypes.float32
        if src in (dtypes.float16, dtypes.bfloat16) and dst != dtypes.float32:
            x, src = f"(float)({x})", dtypes.float32
        return f"(({self.render_dtype(dst)})({x}))"

    def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
        return f"gg_bitcast<{self.render_dtype(dst)}>({x})"

    # atomicAdd: float, double (sm_60+), int, unsigned, unsigned long long (int64 adds as its two's complement bits),
    # __half (sm_70+), __nv_bfloat16 (sm_80+); 8- and 16-bit ints by a compare-and-swap on their aligned 32-bit word
    scatter_dtypes = frozenset({dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int32,
                                dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.int8, dtypes.uint8, dtypes.int16,
                                dtypes.uint16})

    def render_store_add(self, buf: str, index: str, value: str, dtype: DType) -> str:
        needs = {dtypes.float16: 70, dtypes.bfloat16: 80, dtypes.float64: 60}.get(dtype, 0)
        if int(self.arch.removeprefix("sm_").rstrip("a")) < needs:
            raise NotImplementedError(f"an atomic add of {dtype} (a scatter: the gradient of an embedding, gather or "
                                      f"indexing) needs sm_{needs} or newer; this kernel is for {self.arch}")
        if dtype.is_int and dtype.itemsize < 4:
            return f"gg_atomic_add_narrow(&{buf}[{index}], (int)({value}));"
        if dtype in (dtypes.int64, dtypes.uint64):
            return f"atomicAdd((unsigned long long*)&{buf}[{index}], (unsigned long long)({value}));"
        return f"atomicAdd(&{buf}[{index}], {value});"

    def render_fragment_acc(self, name: str, size: int) -> str:
        if size == 4:
            return f"float {name}[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};"
        return f"float {name}[{size}]; for (int i = 0; i < {size}; i++) {name}[i] = 0.0f;"

    def render_descriptor(self, name: str, buf: str, index: str, arg: tuple) -> str:
        _, mode, leading, stride = arg
        return f"unsigned long long {name} = gg_wgmma_desc(&{buf}[{index}], {leading}, {stride}, {mode});"

    def render_warpgroup_wait(self) -> str:
        return 'asm volatile("wgmma.commit_group.sync.aligned;\\n wgmma.wait_group.sync.aligned 0;" ::: "memory");'


    def render_fragment(self, name: str, buf: str, indices: list[str], kind: tuple[str, bool], dtype: DType) -> str:
        if dtype == dtypes.float32:  # tf32: every register from its own shared element
            values = ", ".join(f"gg_tf32({buf}[{i}])" for i in indices)
            return f"unsigned {name}[{len(indices)}] = {{{values}}};"
        return f"unsigned {name}[4]; gg_ldmatrix{'_trans' if kind[1] else ''}({name}, &{buf}[{indices[0]}]);"

    def render_packed_fragment(self, name: str, values: list[str], dtype: DType) -> str:
        """Registers a0..a3 of an m16n8k16 row fragment, each two float values rounded to `dtype` (the first in the
        low half): what a 16 x 16 block of float accumulators becomes as the next product's row factor."""
        pack = "gg_pack_bf16" if dtype == dtypes.bfloat16 else "gg_pack_f16"
        regs = ", ".join(f"{pack}({values[2 * i]}, {values[2 * i + 1]})" for i in range(len(values) // 2))
        return f"unsigned {name}[{len(values) // 2}] = {{{regs}}};"

    def render_mma(self, acc: str, row_frag: str, col_frag: str, arg: int | tuple, dtype: DType) -> str:
        if isinstance(arg, tuple):  # a warpgroup MMA: k 32 as two m64nNk16, the second at the descriptors' steps
            _, n, trans_a, trans_b, step_a, step_b = arg
            return (f"{_wgmma_name(n, _MMA_TYPES[dtype], trans_a, trans_b)}({acc}, {row_frag}, {col_frag}, "
                    f"{step_a >> 4}, {step_b >> 4});")
        if dtype == dtypes.float32:
            return f"gg_mma_tf32({acc}, {row_frag}, {col_frag});"
        return f"gg_mma_{_MMA_TYPES[dtype]}({acc}, {row_frag}, {col_frag} + {2 * arg});"

    def render_async_copy(self, smem: str, index: str, buf: str, buf_index: str) -> str:
        return f"gg_cp_async(&{smem}[{index}], &{buf}[{buf_index}]);"

    def render_async_copy_element(self, smem: str, index: str, buf: str, buf_index: str, gate: str | None) -> str:
        if gate is None:
            return f"gg_cp_async4(&{smem}[{index}], &{buf}[{buf_index}], true);"
        return f"gg_cp_async4(&{smem}[{index}], &{buf}[{gate} ? {buf_index} : 0], {gate});"

    def render_shuffle_xor(self, value: str, mask: int) -> str:
        return f"__shfl_xor_sync(0xffffffffu, {value}, {mask})"

    def render_group_reduce(self, u: UOp, args: list[str], smem: str, result: str) -> list[str]:
        """A group of at most 32 threads lies inside one warp (its threads are consecutive and aligned: the group
        loop is the innermost thread index): it combines with register shuffles (lane ^ s, s = G/2 ... 1), no shared
        memory and no barrier. Every lane of the warp takes part, so the work-group must fill whole warps."""
        _, size, threads = u.arg
        if size > 32 or threads % 32 or u.dtype not in _SHUFFLED:
            return super().render_group_reduce(u, args, smem, result)
        other, dtype = f"{result}_lane", self.render_dtype(u.dtype)  # (each lane shuffles once per step)
        return [f"{dtype} {result} = {args[0]};", f"for (int s = {size // 2}; s > 0; s >>= 1) {{",
                f"  {dtype} {other} = __shfl_xor_sync(0xffffffffu, {result}, s);",
                f"  {result} = {self.render_combine(result, other, u.arg[0], u.dtype)};", "}"]

    def render_copy_out(self, buf: str, index: str, smem: str, smem_index: str) -> str:
        return f"*(uint4*)&{buf}[{index}] = *(const uint4*)&{smem}[{smem_index}];"

    def render_async_commit(self) -> str:
        return 'asm volatile("cp.async.commit_group;" ::: "memory");'

    def render_async_wait(self, pending: int | tuple[int, bool]) -> str:
        count, proxy_fence = pending if isinstance(pending, tuple) else (pending, False)
        if proxy_fence:  # what cp.async wrote (the generic proxy) is next read by warpgroup MMAs (the async proxy)
            return (f'asm volatile("cp.async.wait_group {count};\\n fence.proxy.async.shared::cta;" ::: '
                    '"memory");')
        return f'asm volatile("cp.async.wait_group {count};" ::: "memory");'

    def render_kernel(self, name: str, params: list[str], body: list[str], local_size: int = 1) -> str:
        text = "\n".join(body)
        headers = []
        if "half" in text or "half" in " ".join(params) or "gg_pack_f16(" in text:
            headers.append("#include <cuda_fp16.h>")
        if "__nv_bfloat16" in text or "__nv_bfloat16" in " ".join(params) or "gg_pack_bf16(" in text:
            headers.append("#include <cuda_bf16.h>")
        if "gg_atomic_add_narrow" in text:
            headers.append(_NARROW_ATOMIC_ADD)
        if "gg_bitcast" in text:
            headers.append(_BITCAST_HELPER)
        if "gg_cp_async(" in text:
            headers.append(_ASYNC_HELPERS)
        if "gg_cp_async4(" in text:
            headers.append(_ASYNC_ELEMENT_HELPER)
        if "gg_ldmatrix" in text:
            headers.append(_MMA_HELPERS)
        if "gg_pack_bf16(" in text:
            headers.append(_PACK_BF16)
        if "gg_pack_f16(" in text:
            headers.append(_PACK_F16)
        if "gg_tf32" in text:
            headers.append(_TF32_HELPERS)
        headers += [_MMA.format(name=t, t=t) for t in _MMA_TYPES.values() if f"gg_mma_{t}(" in text]
        if "gg_wgmma_desc(" in text:
            headers.append(_WGMMA_DESC)
        headers += [_wgmma_helper(*key) for key in sorted(set(re.findall(r"gg_wgmma_n(\d+)_(\w+?)_(\d)(\d)\(",
                                                                             text)))]
        return "\n".join([*headers, f'extern "C" __global__ void __launch_bounds__({local_size}) {name}('
                          f'{", ".join(params)}) {{', *body, "}", ""])
