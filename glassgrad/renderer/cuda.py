"""CUDA C for NVIDIA GPUs: the shared C-style renderer with CUDA's spelling.

In: a linear program after `codegen.gpudims` (SPECIAL thread ids, GROUP_REDUCE). Out: one
`extern "C" __global__ void __launch_bounds__(L) name(...)` kernel, compiled by NVRTC in the CUDA runtime.
What differs from C: the kernel prefix and `__restrict__` parameters, `blockIdx`/`threadIdx`, `__shared__` arrays
with `__syncthreads()`, `half`/`__nv_bfloat16` from NVRTC's built-in headers (math on them still runs in float32,
as on the CPU, so results agree across devices), infinities without <math.h>, and bitcasts through a union.
"""
from __future__ import annotations

from glassgrad.dtype import DType, dtypes
from glassgrad.renderer.cstyle import CStyleLanguage, float32_compute
from glassgrad.uop.ops import UOp

_BITCAST_HELPER = ("template <class T, class F> __device__ __forceinline__ T gg_bitcast(F x) "
                   "{ union { F f; T t; } u; u.f = x; return u.t; }")


class CUDARenderer(CStyleLanguage):
    device = "CUDA"
    has_local = True
    extra_matcher = float32_compute
    barrier = "__syncthreads();"
    type_names = {**CStyleLanguage.type_names, dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16"}

    def group_id(self) -> str:
        return "blockIdx.x"

    def local_id(self) -> str:
        return "threadIdx.x"

    def render_global_range(self, index: int, var: str, size: str, dtype: str) -> str:
        return "#pragma unroll\n  " + super().render_global_range(index, var, size, dtype)

    def render_local_array(self, dtype: DType, name: str, size: int) -> str:
        # 16-byte aligned: four neighbouring floats at a multiple of 4 then load as one 128-bit access
        return f"__shared__ __align__(16) {self.render_dtype(dtype)} {name}[{size}];"

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

    def render_kernel(self, name: str, params: list[str], body: list[str], local_size: int = 1) -> str:
        text = "\n".join(body)
        headers = []
        if "half" in text or "half" in " ".join(params):
            headers.append("#include <cuda_fp16.h>")
        if "__nv_bfloat16" in text or "__nv_bfloat16" in " ".join(params):
            headers.append("#include <cuda_bf16.h>")
        if "gg_bitcast" in text:
            headers.append(_BITCAST_HELPER)
        return "\n".join([*headers, f'extern "C" __global__ void __launch_bounds__({local_size}) {name}('
                          f'{", ".join(params)}) {{', *body, "}", ""])
