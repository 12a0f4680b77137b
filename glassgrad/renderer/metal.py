"""Metal Shading Language (MSL) for Apple GPUs: the shared C-style renderer with Metal's spelling.

In: a linear program after `codegen.gpudims` (SPECIAL thread ids, GROUP_REDUCE). Out: one MSL source file,
`#include <metal_stdlib>` and a single `kernel void name(...)`, compiled at run time by `runtime/ops_metal.py`.

What differs from C and CUDA:
* parameters live in address spaces with explicit argument slots: `device float* data0 [[buffer(0)]]`, inputs
  `const device float* data1 [[buffer(1)]]`; the thread ids are parameters too (`uint3 gid
  [[threadgroup_position_in_grid]]`, `uint3 lid [[thread_position_in_threadgroup]]`), not built-in variables;
* shared memory is `threadgroup float smem0[256];` (declared at the top of the kernel, which MSL requires) and the
  barrier is `threadgroup_barrier(mem_flags::mem_threadgroup)`;
* type names: `char uchar short ushort int uint long ulong half bfloat float`. MSL has no `double`: float64 raises
  `MetalDTypeError` when a kernel needs it. `long` is 64 bits (MSL has no `long long`), so int64 constants end in `l`;
* math functions are overloaded, so there are no `f` suffixes, and they are written `precise::exp2` etc.: under fast
  math (Metal's default) `exp2`, `log2`, `sin`, `sqrt`, `pow` and `fmod` may be less accurate than the op tests
  allow (the runtime also turns fast math off, which keeps `x != x` NaN checks and division exact);
* half/bfloat math runs in float32 (`float32_compute`, as on the other backends); conversions go through float;
* bitcasts are `as_type<T>(x)`;
* a kernel takes at most 31 buffers (Metal's argument table); more raise a clear error when rendering;
* a Variable (symbolic size) is `constant int& name [[buffer(n)]]` after the buffers, set with `setBytes`.
"""
from __future__ import annotations

from glassgrad.dtype import DType, dtypes
from glassgrad.renderer.cstyle import CStyleLanguage, float32_compute
from glassgrad.uop.ops import Ops, UOp

_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)


class MetalDTypeError(TypeError):
    """A dtype the Metal Shading Language cannot express (float64)."""


MAX_BUFFERS = 31  # entries in a Metal kernel's buffer argument table


class MetalRenderer(CStyleLanguage):
    device = "METAL"
    has_local = True
    max_buffers = MAX_BUFFERS
    extra_matcher = float32_compute
    barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
    type_names = {
        dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short",
        dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long",
        dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.bfloat16: "bfloat", dtypes.float32: "float"}
    abs_functions = {dtypes.float32: "fabs", dtypes.float16: "fabs"}  # (metal::fabs: overloaded, exact)
    float_functions = {Ops.SQRT: "precise::sqrt", Ops.EXP2: "precise::exp2", Ops.LOG2: "precise::log2",
                       Ops.SIN: "precise::sin", Ops.TRUNC: "trunc", Ops.POW: "precise::pow",
                       Ops.MOD: "precise::fmod"}

    def render_dtype(self, dtype: DType) -> str:
        if dtype not in self.type_names:
            raise MetalDTypeError(f"METAL cannot compute with {dtype}: the Metal Shading Language has no "
                                  f"{'double' if dtype == dtypes.float64 else dtype.name} type. "
                                  f"Cast to float32 first, or use the CPU or CUDA device.")
        return self.type_names[dtype]

    def float_function(self, op: Ops, dtype: DType) -> str:
        return self.float_functions[op]  # overloaded for float and half: no suffix

    # ---------- thread ids and shared memory ----------
    def group_id(self) -> str:
        return "gid.x"

    def local_id(self) -> str:
        return "lid.x"

    def render_local_array(self, dtype: DType, name: str, size: int) -> str:
        return f"threadgroup {self.render_dtype(dtype)} {name}[{size}];"

    # ---------- contiguous runs as 16-byte accesses (cstyle's `VectorRun`) ----------
    vector_runs = True

    def render_vector_copy(self, dst: str, src: str, nbytes: int, load: bool) -> str:
        """As CUDA's, with MSL's address spaces on both pointers: a global buffer is `device`, the register array
        `thread`."""
        kind = {4: "uint", 8: "uint2", 16: "uint4"}[nbytes]
        to, frm = ("thread", "device") if load else ("device", "thread")
        return f"*({to} {kind}*)({dst}) = *(const {frm} {kind}*)({src});"

    def render_aligned_array(self, dtype: DType, name: str, size: int) -> str:
        return f"alignas(16) {self.render_dtype(dtype)} {name}[{size}];"

    # ---------- values ----------
    def render_const(self, value: int | float | bool, dtype: DType) -> str:
        if dtype.is_bool or dtype.is_float:
            return super().render_const(value, dtype)  # INFINITY and NAN are defined by metal_stdlib
        text = f"{int(value)}{ {dtypes.int64: 'l', dtypes.uint64: 'ul', dtypes.uint32: 'u'}.get(dtype, '')}"
        if dtype in (dtypes.int32, dtypes.int64) and value == dtype.min:
            text = f"({int(value) + 1}{'l' if dtype == dtypes.int64 else ''}-1)"  # the literal itself would overflow
        return text if dtype in (dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64) else \
            f"(({self.render_dtype(dtype)}){text})"

    def render_cast(self, x: str, src: DType, dst: DType) -> str:
        # half and bfloat convert to and from other types through float (bfloat has no integer conversions)
        if dst in _LOW_PRECISION and src != dtypes.float32:
            x, src = f"(float)({x})", dtypes.float32
        if src in _LOW_PRECISION and dst != dtypes.float32:
            x = f"(float)({x})"
        return f"(({self.render_dtype(dst)})({x}))"

    def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
        return f"as_type<{self.render_dtype(dst)}>({x})"

    # Metal's atomics add 32-bit values: atomic_float (Metal 3), atomic_int, atomic_uint
    scatter_dtypes = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})
    _ATOMIC_TYPES = {dtypes.float32: "atomic_float", dtypes.int32: "atomic_int", dtypes.uint32: "atomic_uint"}

    def render_store_add(self, buf: str, index: str, value: str, dtype: DType) -> str:
        if dtype not in self._ATOMIC_TYPES:
            raise MetalDTypeError(f"METAL has no atomic add of {dtype} (a scatter: the gradient of an embedding, "
                                  "gather or indexing); use float32 or int32")
        return (f"atomic_fetch_add_explicit((device {self._ATOMIC_TYPES[dtype]}*)&{buf}[{index}], {value}, "
                f"memory_order_relaxed);")

    # ---------- the kernel ----------
    def render_param(self, u: UOp, writes: bool) -> str:
        return f"{'' if writes else 'const '}device {self.render_dtype(u.dtype)}* data{u.arg} [[buffer({u.arg})]]"

    def render_var_param(self, u: UOp, slot: int) -> str:
        return f"constant int& {u.arg[0]} [[buffer({slot})]]"  # the runtime sets it with setBytes

    def render_kernel(self, name: str, params: list[str], body: list[str], local_size: int = 1) -> str:
        if len(params) > MAX_BUFFERS:
            raise RuntimeError(f"METAL kernel {name} needs {len(params)} buffers; Metal allows {MAX_BUFFERS} per "
                               f"kernel (realize some inputs first, e.g. cat fewer tensors at a time)")
        # MSL allows threadgroup variables only at the kernel's outermost scope: move their declarations there
        shared = ["  " + line.strip() for line in body if line.strip().startswith("threadgroup ")]
        rest = [line for line in body if not line.strip().startswith("threadgroup ")]
        ids = ["uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]"]
        return "\n".join(["#include <metal_stdlib>", "using namespace metal;",
                          f"kernel void {name}({', '.join([*params, *ids])}) {{", *shared, *rest, "}", ""])
