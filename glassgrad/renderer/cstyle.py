"""Rendering: a linear UOp program -> C-family source text.

In: the list from `codegen.linearize` and a kernel name. Out: the kernel's source. `CStyleLanguage` holds
everything the C-like languages share (expressions, loops, accumulators, constants); a backend's renderer
overrides only what differs: the function signature, type names, math function names, the outer-loop
convention, and `extra_matcher`, rewrite rules run before linearising (e.g. compute float16 in float32).

Single-use arithmetic is inlined into its consumer (unless the consumer is inside a loop the value is not, or the
expression would be more than MAX_INLINE_DEPTH operations deep); loads, accumulators and shared values get named
variables (`val3`, `acc0`, `alu7`), so the printed kernel reads like hand-written C.
"""
from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.uop.ops import GroupOp, Ops, UOp, dtype_bounds
from glassgrad.uop.pattern import PatternMatcher, UPat, substitute
from glassgrad.uop.symbolic import simplify

_LOW_PRECISION = (dtypes.float16, dtypes.bfloat16)
_NARROW_INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16)  # C promotes these to int in arithmetic
# an operand that may be repeated in the text as it is: a variable, an element of an array or a number
_PLAIN_OPERAND = re.compile(r"[A-Za-z_]\w*(\[\w+\])?|-?[0-9.]+[fF]?")


def _negated(y: UOp, x: UOp) -> bool:
    """Whether y is -x: NEG(x), or the form float32_compute gave it, CAST(NEG(CAST(x, float32)), x's dtype)."""
    if y.op is Ops.NEG:
        return y.src[0] is x
    return y.op is Ops.CAST and y.src[0].op is Ops.NEG and y.src[0].src[0].op is Ops.CAST and \
        y.src[0].src[0].src[0] is x


def _compute_in_float32(u: UOp) -> UOp | None:
    """float16/bfloat16 arithmetic -> cast the inputs to float32, compute, cast the result back."""
    if u.op is Ops.WHERE:
        return None
    if u.op is Ops.MAX and u.dtype in _LOW_PRECISION and (_negated(u.src[1], u.src[0]) or
                                                          _negated(u.src[0], u.src[1])):
        # max(x, -x) (Tensor.abs) stays max(xf, -xf) on the one float32 value, so the renderers' abs function takes
        # it: the select they fall back on gives abs(+0) = -0
        x = u.src[0] if _negated(u.src[1], u.src[0]) else u.src[1]
        xf = x.cast(dtypes.float32)
        return UOp(Ops.MAX, dtypes.float32, (xf, UOp(Ops.NEG, dtypes.float32, (xf,)))).cast(u.dtype)
    srcs = tuple(s.cast(dtypes.float32) if s.dtype in _LOW_PRECISION else s for s in u.src)
    if srcs == u.src:
        return None
    out_dtype = dtypes.bool if u.op in GroupOp.Comparison else dtypes.float32
    result = UOp(u.op, out_dtype, srcs, u.arg)
    return result if out_dtype == u.dtype else result.cast(u.dtype)


def _reduce_in_float32(u: UOp) -> UOp | None:
    return UOp(Ops.REDUCE, dtypes.float32, (u.src[0].cast(dtypes.float32), *u.src[1:]), u.arg).cast(u.dtype)


# float16/bfloat16 are storage types for the C backend: all math on them happens in float32
float32_compute = PatternMatcher([
    (UPat(GroupOp.ALU, name="u"), _compute_in_float32),
    (UPat(Ops.REDUCE, dtype=_LOW_PRECISION, name="u"), _reduce_in_float32),
])


# An inlined expression at most this many operations deep; a deeper one gets a variable. clang (and so Apple's Metal
# compiler) stops at 256 nested brackets, and an operation adds a few (a cast two or three, a bitcast four): a chain
# of 1000 fused multiply-adds, inlined whole, did not compile.
MAX_INLINE_DEPTH = 40


class CStyleLanguage:
    """The shared part of the C, CUDA and Metal renderers."""
    device = ""
    has_local = False
    tensor_cores = False  # matrix-multiply-accumulate units a tiled matmul can use (FRAGMENT/WMMA ops)
    extra_matcher: PatternMatcher | None = None
    type_names: dict[DType, str] = {
        dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
        dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
        dtypes.uint64: "unsigned long long", dtypes.float16: "half", dtypes.bfloat16: "bfloat16",
        dtypes.float32: "float", dtypes.float64: "double"}
    float_functions: dict[Ops, str] = {Ops.SQRT: "sqrt", Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin",
                                       Ops.TRUNC: "trunc", Ops.POW: "pow", Ops.MOD: "fmod"}
    # the compiler optimisation levels an OPTLEVEL opt may choose (none: the backend's compiler has one setting), and
    # the level of a kernel without one
    opt_levels: tuple[int, ...] = ()
    default_opt_level = 0

    def with_opt_level(self, source: str, level: int | None) -> str:
        """A rendered kernel's source, marked to be built at optimisation `level` (None: the compiler's default)."""
        if level is None:
            return source
        raise NotImplementedError(f"{type(self).__name__} has no optimisation levels")

    def supported_dtypes(self) -> set[DType]:
        """The dtypes this device's kernels can compute with (tinygrad's `renderer.supported_dtypes()`, which its
        stable diffusion code asks before casting to float16): every one the language has a type for."""
        return set(self.type_names)

    # ---------- pieces a backend overrides ----------
    def render_dtype(self, dtype: DType) -> str:
        return self.type_names[dtype]

    def float_function(self, op: Ops, dtype: DType) -> str:
        return self.float_functions[op] + ("f" if dtype == dtypes.float32 else "")

    def render_kernel(self, name: str, params: list[str], body: list[str], local_size: int = 1) -> str:
        """Wrap the body in the language's kernel signature. `local_size`: threads per work-group (GPUs)."""
        raise NotImplementedError

    def render_global_range(self, index: int, var: str, size: str, dtype: str) -> str:
        return f"for ({dtype} {var} = 0; {var} < {size}; {var}++) {{"

    def global_loop_pragma(self, program: list[UOp], position: int) -> str:
        """A line before the output loop opened at program[position] (none by default)."""
        return ""

    def render_cast(self, x: str, src: DType, dst: DType) -> str:
        return f"(({self.render_dtype(dst)})({x}))"

    def loop_var_type(self, dtype: DType) -> str:
        return self.render_dtype(dtype)

    def reduce_loop_pragma(self, program: list[UOp], position: int, names: dict[UOp, str]) -> str:
        """A line to put before the reduce loop opened at program[position] (e.g. a vectorisation hint)."""
        return ""

    simd_max = False  # a float max over an innermost loop may be a SIMD reduction with a NaN flag (see `_simd_max`)
    # contiguous runs of an innermost upcast loop's loads and stores move as 16-byte vectors (see `VectorRun`)
    vector_runs = False

    def render_vector_copy(self, dst: str, src: str, nbytes: int, load: bool) -> str:
        """Copy `nbytes` (4, 8 or 16, aligned to that) from the address `src` to the address `dst` as one access;
        `load`: from a global buffer into a register array (else the other way)."""
        kind = {4: "unsigned int", 8: "uint2", 16: "uint4"}[nbytes]
        return f"*({kind}*)({dst}) = *(const {kind}*)({src});"

    def render_aligned_array(self, dtype: DType, name: str, size: int) -> str:
        return f"{self.render_dtype(dtype)} {name}[{size}] __attribute__((aligned(16)));"

    wide_index_type: str | None = None  # a 64-bit type for int32 index variables (see `var_type`), if any

    def _widened(self, u: UOp) -> bool:
        return self.wide_index_type is not None and u.dtype == dtypes.int32 and _cannot_wrap(u)

    def var_type(self, u: UOp) -> str:
        """The type of a variable holding `u`. An int32 value the simplifier proved cannot wrap (an index: its range
        is narrower than int32's) may be held in 64 bits: its value is the same, and the C compiler then sees
        `base + i` as contiguous instead of a 32-bit truncation that could wrap (a gather)."""
        return self.wide_index_type if self._widened(u) and self.wide_index_type else self.render_dtype(u.dtype)

    acc_row_align = 1  # elements: rows of an accumulator tile start at multiples of this

    def render_acc_array(self, dtype: DType, name: str, size: int) -> str:
        return f"{self.render_dtype(dtype)} {name}[{size}];"

    def upcast_loop_pragma(self, loop: UOp, lanes: bool) -> str:
        """A line before an upcast or unrolled loop: these are short, with a constant trip count, and are meant to be
        unrolled into registers. `lanes`: its iterations are independent and it is innermost (SIMD lanes)."""
        return "#pragma unroll"

    def stage_loop_pragma(self, lanes: bool) -> str:
        """A line before a loop of a staging copy (`codegen/stage.py`); `lanes`: it is the innermost one."""
        return ""

    def lane_chunks(self, size: int) -> list[int]:
        """How many iterations each of the loops a SIMD lane loop of `size` iterations is written as takes."""
        return [size]

    def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
        return f"(((union {{ {self.render_dtype(src)} a; {self.render_dtype(dst)} b; }}){{.a = {x}}}).b)"

    fused_accumulate = False  # a sum of products accumulates with a fused multiply-add (`render_fma`)

    def _fused_product(self, u: UOp, uses: Counter[UOp], inlined: dict[UOp, int]) -> UOp | None:
        """The product a float sum accumulates, `acc + x * y`, when it may become `fma(x, y, acc)`: the product is
        used once and written inline (so it is computed nowhere else), in the accumulator's float type."""
        product = u.src[1]
        if not self.fused_accumulate or u.arg is not Ops.ADD or u.dtype not in (dtypes.float32, dtypes.float64):
            return None
        if product.op is not Ops.MUL or product.dtype != u.dtype or uses[product] != 1 or product not in inlined:
            return None
        return product

    def render_fma(self, x: str, y: str, acc: str, dtype: DType) -> str:
        """x * y + acc, rounded once."""
        raise NotImplementedError

    # dtypes a STORE arg=ADD (a scatter's `buf[i] += v` at a data-dependent index) can add; others keep the one-hot sum
    scatter_dtypes: frozenset[DType] = frozenset()
    max_buffers: int | None = None  # buffers one kernel may take (the scheduler splits kernels to fit); None: no limit

    def render_shuffle_xor(self, value: str, mask: int) -> str:
        """The value `value` of lane (this lane ^ mask) of the warp (SHUFFLE_XOR: chained kernels only)."""
        raise NotImplementedError(f"{type(self).__name__} has no warp shuffles")

    def render_copy_out(self, buf: str, index: str, smem: str, smem_index: str) -> str:
        """A 16-byte run from shared memory into `buf` (COPY_OUT: tensor-core kernels only)."""
        raise NotImplementedError(f"{type(self).__name__} has no 16-byte copies out of shared memory")

    def render_store_add(self, buf: str, index: str, value: str, dtype: DType) -> str:
        """`buf[index] += value` as one statement; on GPUs an atomic add (other threads may add to the element)."""
        raise NotImplementedError(f"{type(self).__name__} cannot add {dtype} at a data-dependent index")

    # ---------- shared rendering ----------
    def render_const(self, value: int | float | bool, dtype: DType) -> str:
        if dtype.is_bool:
            return "1" if value else "0"
        if dtype.is_float:
            if math.isnan(value):
                text = "NAN"
            elif math.isinf(value):
                text = "INFINITY" if value > 0 else "(-INFINITY)"
            else:
                text = repr(float(value)) + ("f" if dtype != dtypes.float64 else "")
            return text if dtype in (dtypes.float32, dtypes.float64) else self.render_cast(text, dtypes.float32, dtype)
        suffix = {dtypes.int64: "ll", dtypes.uint64: "ull", dtypes.uint32: "u"}.get(dtype, "")
        if dtype in (dtypes.int64, dtypes.int32) and value == dtype.min:
            return f"({value + 1}{suffix}-1)"
        text = f"{value}{suffix}"
        return text if dtype in (dtypes.int32, dtypes.int64, dtypes.uint32, dtypes.uint64) else \
            f"(({self.render_dtype(dtype)}){text})"

    def render_alu(self, u: UOp, a: list[str]) -> str:
        op, dt = u.op, u.src[0].dtype
        if op is Ops.NEG:
            return f"(!{a[0]})" if dt.is_bool else f"(-{a[0]})"
        if op is Ops.RECIP:
            return f"(1.0{'f' if dt != dtypes.float64 else ''}/{a[0]})"
        if op in (Ops.SQRT, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.TRUNC, Ops.POW) or (op is Ops.MOD and dt.is_float):
            return f"{self.float_function(op, dt)}({', '.join(a)})"
        if op in (Ops.IDIV, Ops.MOD) and not _safe_divisor(u.src[1]):
            symbol = "/" if op is Ops.IDIV else "%"
            # x/0 and INT_MIN/-1 trap in C: division by zero gives 0 here, as in constant folding
            minus_one = "" if dt.is_unsigned else f"{a[1]} == -1 ? {'-' if op is Ops.IDIV else '0*'}{a[0]} : "
            return f"({a[1]} == 0 ? 0 : {minus_one}{a[0]} {symbol} {a[1]})"
        if op is Ops.MAX and (absolute := self._render_abs(u, a)) is not None:
            return absolute
        if op is Ops.MAX:
            nan_check = f" || {a[0]} != {a[0]}" if dt.is_float else ""
            return f"(({a[0]} > {a[1]}{nan_check}) ? {a[0]} : {a[1]})"
        if op is Ops.WHERE:
            return f"({a[0]} ? {a[1]} : {a[2]})"
        symbols = {Ops.ADD: "+", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<",
                   Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<",
                   Ops.SHR: ">>"}
        if dt.is_bool and op in (Ops.ADD, Ops.MUL):
            return f"({a[0]} {'||' if op is Ops.ADD else '&&'} {a[1]})"
        return f"({a[0]} {symbols[op]} {a[1]})"

    def render_copy_select(self, u: UOp, a: list[str]) -> str | None:
        """A select in a staging copy's loops, when the language writes it otherwise than `c ? x : y` (None: it
        does not)."""
        return None

    abs_functions: dict[DType, str] = {}  # dtype -> the language's absolute value, for `max(x, -x)`

    def _render_abs(self, u: UOp, a: list[str]) -> str | None:
        """`max(x, -x)` (Tensor.abs) as the language's absolute-value function where it has one for the dtype: the
        same value (NaN stays NaN, and abs(+0) is +0, where the select gave -0), and one instruction that gcc
        vectorises inside longer selects (GELU's tanh: a nested select there left the whole loop scalar, 3x slower)."""
        x, y = u.src
        function = self.abs_functions.get(u.dtype)
        if function is None:
            return None
        if y.op is Ops.NEG and y.src[0] is x:
            return f"{function}({a[0]})"
        if x.op is Ops.NEG and x.src[0] is y:
            return f"{function}({a[1]})"
        return None

    def render_combine(self, acc: str, value: str, op: Ops, dtype: DType) -> str:
        """One step of a reduction: acc (op) value. MAX keeps a NaN once it has seen one, as numpy does."""
        if op is Ops.MAX:
            nan_check = f" || {value} != {value}" if dtype.is_float else ""
            return f"({value} > {acc}{nan_check}) ? {value} : {acc}"
        return f"{acc} {'+' if op is Ops.ADD else '*'} {value}"

    def render_accumulate(self, acc: str, value: str, op: Ops, dtype: DType) -> str:
        return f"{acc} = {self.render_combine(acc, value, op, dtype)};"

    # ---------- GPU pieces (used by renderers with has_local) ----------
    barrier = ""

    def group_id(self) -> str: raise NotImplementedError  # noqa: E704
    def local_id(self) -> str: raise NotImplementedError  # noqa: E704

    def render_local_array(self, dtype: DType, name: str, size: int) -> str:
        raise NotImplementedError

    def render_special(self, u: UOp, name: str, limit: str | None = None) -> list[str]:
        """Declare a GPU id: `gidx` (global thread index, with an early return past the end), `bidx`, `lidx`.
        `limit`: a symbolic thread count (the arg's size is then its largest value), always checked."""
        kind, size, local = u.arg
        dt = self.render_dtype(u.dtype)
        if kind == "gidx":
            lines = [f"{dt} {name} = ({dt}){self.group_id()} * {local} + {self.local_id()};"]
            if limit is not None:
                return lines + [f"if ({name} >= {limit}) return;"]
            return lines + ([f"if ({name} >= {size}) return;"] if size % local else [])
        return [f"{dt} {name} = {self.group_id() if kind == 'bidx' else self.local_id()};"]

    def render_fragment_acc(self, name: str, size: int) -> str:
        """`size` float32 accumulators of one thread's share of a tensor-core tile, zeroed."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor cores")

    def render_descriptor(self, name: str, buf: str, index: str, arg: tuple) -> str:
        """A warpgroup MMA's matrix descriptor `name` of the tile starting at element `index` of shared buffer `buf`
        (FRAGMENT arg ("desc", swizzle mode, leading byte offset, stride byte offset))."""
        raise NotImplementedError(f"{type(self).__name__} has no warpgroup MMAs")

    def render_warpgroup_wait(self) -> str:
        """Wait until this thread's warpgroup MMAs are done: their accumulators readable, their shared tiles free."""
        raise NotImplementedError(f"{type(self).__name__} has no warpgroup MMAs")

    def render_fragment(self, name: str, buf: str, indices: list[str], kind: tuple[str, bool], dtype: DType) -> str:
        """A warp's fragment `name` from shared buffer `buf`: one index per lane (ldmatrix), or one per register."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor cores")

    def render_packed_fragment(self, name: str, values: list[str], dtype: DType) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no tensor-core fragments")

    def render_mma(self, acc: str, row_frag: str, col_frag: str, arg: int | tuple, dtype: DType) -> str:
        """`acc` += row fragment x column fragment: WMMA's arg is which half of a column fragment (mma.sync), or
        ("wgmma", n, row side M-major, column side N-major, row step, column step) for a warpgroup MMA of
        descriptors."""
        raise NotImplementedError(f"{type(self).__name__} has no tensor cores")

    def render_async_copy(self, smem: str, index: str, buf: str, buf_index: str) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous copies")

    def render_async_copy_element(self, smem: str, index: str, buf: str, buf_index: str, gate: str | None) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous copies")

    def render_async_commit(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous copies")

    def render_async_wait(self, pending: int | tuple[int, bool]) -> str:
        raise NotImplementedError(f"{type(self).__name__} has no asynchronous copies")

    def render_group_reduce(self, u: UOp, args: list[str], smem: str, result: str) -> list[str]:
        """Combine the group's partial results in shared memory (a tree: G/2, G/4, ... 1), leave it in `result`.
        `args`: the partial result, the thread's index in its group and the work-group's thread id; arg (op, G,
        threads): with several groups in a work-group each combines its own segment of G slots."""
        op, size, threads = u.arg
        partial, group = args[0], args[1]
        slot = args[2] if threads != size else group
        combined = self.render_combine(f"{smem}[{slot}]", f"{smem}[{slot} + s]", op, u.dtype)
        first = f"{slot} - {group}" if threads != size else "0"
        return [self.render_local_array(u.dtype, smem, threads), f"{smem}[{slot}] = {partial};", self.barrier,
                f"for (int s = {size // 2}; s > 0; s >>= 1) {{", f"  if ({group} < s) {smem}[{slot}] = {combined};",
                f"  {self.barrier}", "}", f"{self.render_dtype(u.dtype)} {result} = {smem}[{first}];"]

    def render(self, name: str, program: list[UOp]) -> str:
        uses = Counter(s for u in program for s in u.src)
        # a select's operands appear twice in its text (`a > b ? a : b`): inlined, a tree of maxes (a chained
        # kernel's row max of 16 values) doubled its text per level; they get variables instead
        uses.update(s for u in program if u.op is Ops.MAX and u.dtype.is_float for s in u.src)
        hoisted = _hoisted_values(program)
        names: dict[UOp, str] = {}
        counters: Counter[str] = Counter()
        body: list[str] = []
        params: list[str] = []
        depth = 1
        global_index = 0
        widened: set[UOp] = set()  # int32 index values held in 64-bit variables
        split_loops: dict[UOp, int] = {}  # SIMD lane loops written as several loops: where their lines start
        nan_flags: dict[UOp, tuple[UOp, str]] = {}  # a SIMD max's loop -> (its accumulator, its NaN flag's name)
        warpgroup_pending = False  # warpgroup MMAs issued since the last wait
        nesting: dict[UOp, int] = {}  # inlined expressions: how many operations deep they are
        copying = 0  # open loops of staging copies (codegen/stage.py): their float selects may be bitwise
        open_loops: list[UOp] = []  # the loops open at this point, innermost last
        from_zero: set[UOp] = set()  # ... those whose index starts at 0 (the outermost one starts at `start`)

        def new_name(prefix: str) -> str:
            counters[prefix] += 1
            return f"{prefix}{counters[prefix] - 1}"

        def line(text: str) -> None:
            body.append("  " * depth + text)

        def ref(s: UOp) -> str:
            if s.op is Ops.RANGE:
                return f"ridx{s.arg[0]}"
            return self.render_const(s.arg, s.dtype) if s.op is Ops.CONST else names[s]

        outputs = {u.src[0] for u in program if u.op in (Ops.STORE, Ops.COPY_OUT) and u.src[0].op is Ops.DEFINE_GLOBAL}
        runs = vector_runs(program) if self.vector_runs else {}
        run_arrays: dict[UOp, str] = {}  # a vectorised load or store -> the register array of its run
        stores_after: dict[UOp, list[str]] = {}  # a loop -> the vector stores written after it

        def open_runs(loop: UOp) -> None:
            """Before an upcast loop: a register array per run; each load's run is filled by vector loads."""
            firsts: dict[UOp, str] = {}
            for access, run in runs.items():
                if run.loop is not loop:
                    continue
                if run.first not in firsts:
                    firsts[run.first] = new_name("run")
                    line(f"{self.render_dtype(run.first.dtype)} {firsts[run.first]} = "
                         f"{self._expression(run.first, names)};")
                array = run_arrays[access] = new_name("vec")
                line(self.render_aligned_array(access.src[0].dtype, array, run.lanes))
                buf, first = names[access.src[0]], firsts[run.first]
                for offset in range(0, run.lanes, run.chunk):
                    at, held = f"&{buf}[{first}{f' + {offset}' if offset else ''}]", f"&{array}[{offset}]"
                    copy = self.render_vector_copy(*((held, at) if access.op is Ops.LOAD else (at, held)),
                                                   run.chunk * access.src[0].dtype.itemsize, access.op is Ops.LOAD)
                    (line(copy) if access.op is Ops.LOAD else stores_after.setdefault(loop, []).append(copy))

        for position, u in enumerate(program):
            # what a barrier or a commit orders (STOREs, copies) has no value; a wait's loop index is only its scope
            a = [ref(s) for s in (u.src if u.op not in _ORDERING else u.src[:1])]
            if u.op is Ops.DEFINE_GLOBAL:
                names[u] = f"data{u.arg}"
                params.append(self.render_param(u, writes=u.arg == 0 or u in outputs))
            elif u.op is Ops.DEFINE_VAR:  # a symbolic size's Variable: an int parameter after the buffers
                names[u] = u.arg[0]
                params.append(self.render_var_param(u, len(params)))
            elif u.op is Ops.CONST:
                pass  # constants are written where they are used
            elif u.op is Ops.RANGE:
                names[u] = f"ridx{u.arg[0]}"
                open_loops.append(u)
                if u.arg[1] != "global" or global_index > 0:
                    from_zero.add(u)
                if u.arg[1] == "global":
                    if pragma := self.global_loop_pragma(program, position):
                        line(pragma)
                    line(self.render_global_range(global_index, names[u], a[0], self.loop_var_type(u.dtype)))
                    global_index += 1
                elif u.arg[1] in ("upcast", "unroll", "stage"):
                    copying += u.arg[1] == "stage"
                    lanes = _independent_lanes(program, position)
                    pragma = self.upcast_loop_pragma(u, lanes) if u.arg[1] != "stage" else self.stage_loop_pragma(lanes)
                    if lanes and u.arg[1] != "stage" and len(self.lane_chunks(u.src[0].arg)) > 1:
                        split_loops[u] = len(body)  # rendered once, then repeated per chunk at its ENDRANGE
                    open_runs(u)
                    if pragma:
                        line(pragma)
                    line(f"for ({self.loop_var_type(u.dtype)} {names[u]} = 0; {names[u]} < {a[0]}; {names[u]}++) {{")
                elif self.simd_max and (max_acc := _simd_max(program, position)) is not None:
                    flag = new_name("nan")
                    nan_flags[u] = (max_acc.src[0], flag)
                    # OpenMP's max identity may be the lowest finite value (clang's) rather than -inf: a row of -infs
                    # would then come out as -FLT_MAX, so the start value is kept and restored if no element is above
                    # -inf (and NaNs are flagged apart). The flag starts set when the accumulator already holds a
                    # NaN (from an earlier pass of an outer loop): OpenMP's max combine would drop it
                    acc_name = names[max_acc.src[0]]
                    line(f"int {flag} = {acc_name} != {acc_name}, {flag}_above = 0; "
                         f"{self.render_dtype(max_acc.dtype)} {flag}_start = {acc_name};")
                    line(f"#pragma omp simd reduction(max:{acc_name}) reduction(|:{flag}) reduction(|:{flag}_above)")
                    line(f"for ({self.loop_var_type(u.dtype)} {names[u]} = 0; {names[u]} < {a[0]}; {names[u]}++) {{")
                else:
                    pragma = self.reduce_loop_pragma(program, position, names)
                    if pragma:
                        line(pragma)
                    line(f"for ({self.loop_var_type(u.dtype)} {names[u]} = 0; {names[u]} < {a[0]}; {names[u]}++) {{")
                depth += 1
            elif u.op is Ops.ENDRANGE:
                if warpgroup_pending:  # a loop step's warpgroup MMAs end inside it: the next step refills their tiles
                    line(self.render_warpgroup_wait())
                    warpgroup_pending = False
                depth -= 1
                if u.src[0] in open_loops:
                    open_loops.remove(u.src[0])
                copying -= u.src[0].arg[1] == "stage"
                line("}")
                for copy in stores_after.pop(u.src[0], []):
                    line(copy)
                if u.src[0] in nan_flags:
                    acc_node, flag = nan_flags.pop(u.src[0])
                    line(f"if (!{flag}_above) {names[acc_node]} = {flag}_start;")
                    line(f"if ({flag}) {names[acc_node]} = NAN;")
                if u.src[0] in split_loops:
                    start = split_loops.pop(u.src[0])
                    body[start:] = _chunked_loop(body[start:], self.lane_chunks(u.src[0].src[0].arg))
            elif u.op is Ops.DEFINE_ACC and u.arg.src[0].op is Ops.WMMA:  # a warp's fragment of accumulators
                names[u] = names[u.arg] = new_name("acc")
                mma_arg = u.arg.src[0].arg
                line(self.render_fragment_acc(names[u], mma_arg[1] // 2 if isinstance(mma_arg, tuple) else 4))
            elif u.op is Ops.ACCUMULATE and u.src[1].op is Ops.WMMA:  # a chain of them: each adds into the fragment
                chain = [u.src[1]]
                while len(chain[-1].src) == 3:
                    chain.append(chain[-1].src[2])
                for mma in reversed(chain):
                    line(self.render_mma(a[0], names[mma.src[0]], names[mma.src[1]], mma.arg, mma.src[0].dtype))
                    warpgroup_pending = warpgroup_pending or isinstance(mma.arg, tuple)
            elif u.op is Ops.WMMA:
                names[u] = ""  # rendered by its ACCUMULATE
            elif u.op is Ops.FRAGMENT and u.arg[0] == "desc":  # a warpgroup MMA's shared tile, by address
                names[u] = new_name("desc")
                line(self.render_descriptor(names[u], a[0], a[1], u.arg))
            elif u.op is Ops.FRAGMENT and u.arg[0] == "pack":  # a row fragment from float values (its registers)
                names[u] = new_name("frag")
                line(self.render_packed_fragment(names[u], a, u.dtype))
            elif u.op is Ops.FRAGMENT:
                names[u] = new_name("frag")
                line(self.render_fragment(names[u], a[0], a[1:], u.arg, u.dtype))
            elif u.op is Ops.GEP:
                names[u] = f"{a[0]}[{u.arg}]"
            elif u.op is Ops.ASYNC_COPY and u.arg == 4:  # one element, zeros where the gate is off
                line(self.render_async_copy_element(a[0], a[1], a[2], a[3], a[4] if len(a) == 5 else None))
            elif u.op is Ops.ASYNC_COPY:
                line(f"{'if (' + a[4] + ') ' if len(a) == 5 else ''}{self.render_async_copy(a[0], a[1], a[2], a[3])}")
            elif u.op in (Ops.ASYNC_COMMIT, Ops.ASYNC_WAIT):  # they yield the shared buffer
                names[u] = a[0]
                line(self.render_async_commit() if u.op is Ops.ASYNC_COMMIT else self.render_async_wait(u.arg))
            elif u.op is Ops.DEFINE_ACC and len(u.src) > 1:  # an accumulator per combination of the upcast loops
                acc, loops = new_name("acc"), u.src[1:]
                row = loops[-1].src[0].arg
                if len(loops) > 1:  # every row of the tile starts aligned
                    row = -(-row // self.acc_row_align) * self.acc_row_align
                size = math.prod(r.src[0].arg for r in loops[:-1]) * row
                line(self.render_acc_array(u.dtype, acc, size))
                line(f"for (int i = 0; i < {size}; i++) {acc}[i] = {a[0]};")
                names[u] = names[u.arg] = f"{acc}[{_flat_index(loops, row)}]"
            elif u.op is Ops.DEFINE_ACC:
                names[u] = names[u.arg] = new_name("acc")
                line(f"{self.render_dtype(u.dtype)} {names[u]} = {a[0]};")
            elif u.op is Ops.ACCUMULATE and any(acc is u.src[0] for acc, _ in nan_flags.values()):
                flag = next(f for acc, f in nan_flags.values() if acc is u.src[0])
                # the value is named once, not written out in each of its four uses: gcc 12 (-O2 -march=x86-64-v3
                # -fopenmp-simd -fno-trapping-math) vectorised the repeated select of a causal mask over a symbolic
                # row length into NaN flags where no NaN was (`softmax` of masked scores came out NaN from row 9 on)
                value = new_name("max")
                line(f"{self.render_dtype(u.src[1].dtype)} {value} = {a[1]}; {a[0]} = {value} > {a[0]} ? {value} : "
                     f"{a[0]}; {flag} |= {value} != {value}; {flag}_above |= {value} > -INFINITY;")
            elif u.op is Ops.ACCUMULATE and (fma := self._fused_product(u, uses, nesting)) is not None:
                line(f"{a[0]} = {self.render_fma(ref(fma.src[0]), ref(fma.src[1]), a[0], u.dtype)};")
            elif u.op is Ops.ACCUMULATE:
                value = a[1]
                if u.arg is Ops.MAX and not _PLAIN_OPERAND.fullmatch(value):
                    # a max's select reads its value three times (`(v > acc || v != v) ? v : acc`): an expression is
                    # named once, as in the SIMD max above, so it is neither written out (nor computed) three times
                    value = new_name("max")
                    line(f"{self.render_dtype(u.src[1].dtype)} {value} = {a[1]};")
                line(self.render_accumulate(a[0], value, u.arg, u.dtype))
            elif u.op in (Ops.LOAD, Ops.STORE) and u in run_arrays:  # a lane of a vector run
                lane = f"{run_arrays[u]}[{names[runs[u].loop]}]"
                if u.op is Ops.LOAD:
                    names[u] = new_name("val")
                    line(f"{self.render_dtype(u.dtype)} {names[u]} = {lane};")
                else:
                    line(f"{lane} = {a[2]};")
            elif u.op is Ops.LOAD:
                names[u] = new_name("val")
                load = f"{a[0]}[{a[1]}]" if len(a) == 3 else self._subscript(a[0], a[1], u.src[1], open_loops,
                                                                              from_zero, ref)
                if len(a) == 3:
                    load = f"({a[2]} ? {load} : {self.render_const(0, u.dtype)})"
                line(f"{self.render_dtype(u.dtype)} {names[u]} = {load};")
            elif u.op is Ops.STORE and u.arg is Ops.ADD:  # a scatter's accumulating store (schedule/scatter.py)
                line(f"{'if (' + a[3] + ') ' if len(a) == 4 else ''}"
                     f"{self.render_store_add(a[0], a[1], a[2], u.src[2].dtype)}")
            elif u.op is Ops.STORE:
                line(f"{'if (' + a[3] + ') ' if len(a) == 4 else ''}{a[0]}[{a[1]}] = {a[2]};")
            elif u.op is Ops.COPY_OUT:
                line(self.render_copy_out(a[0], a[1], a[2], a[3]))
            elif u.op is Ops.SHUFFLE_XOR:
                names[u] = new_name("lane")
                line(f"{self.render_dtype(u.dtype)} {names[u]} = {self.render_shuffle_xor(a[0], u.arg)};")
            elif u.op is Ops.SPECIAL:
                names[u] = new_name(u.arg[0])
                for text in self.render_special(u, names[u], a[0] if a else None):
                    line(text)
            elif u.op is Ops.DEFINE_LOCAL:
                names[u] = new_name("smem")
                line(self.render_local_array(u.dtype, names[u], u.arg[1]))
            elif u.op is Ops.BARRIER:  # the shared buffer, readable once every thread has written its part
                names[u] = a[0]
                if u.arg != "stage":  # a CPU staging buffer is the thread's own: nothing to wait for
                    line(self.barrier)
            elif u.op is Ops.GROUP_REDUCE:
                names[u] = new_name("red")
                for text in self.render_group_reduce(u, a, new_name("smem"), names[u]):
                    line(text)
            elif u.op in GroupOp.ALU or u.op in (Ops.CAST, Ops.BITCAST):
                if not self._widened(u):  # 32-bit arithmetic that may wrap gets 32-bit operands
                    a = [f"(({self.render_dtype(s.dtype)}){x})" if s in widened else x for x, s in zip(a, u.src)]
                if u.op is Ops.CAST:
                    expr = self.render_cast(a[0], u.src[0].dtype, u.dtype)
                elif u.op is Ops.BITCAST:
                    expr = self.render_bitcast(a[0], u.src[0].dtype, u.dtype)
                elif u.op is Ops.WHERE and copying and (select := self.render_copy_select(u, a)) is not None:
                    expr = select
                else:
                    expr = self.render_alu(u, a)
                    if u.dtype in _NARROW_INTS and u.op not in GroupOp.Comparison:
                        expr = f"(({self.render_dtype(u.dtype)}){expr})"  # C computes in int: wrap like numpy
                depth = 1 + max((nesting.get(s, 0) for s in u.src), default=0)
                if uses[u] == 1 and u not in hoisted and depth <= MAX_INLINE_DEPTH:
                    names[u] = expr
                    nesting[u] = depth
                else:
                    names[u] = new_name("alu")
                    if self._widened(u):
                        widened.add(u)
                    line(f"{self.var_type(u)} {names[u]} = {expr};")
            else:
                raise RuntimeError(f"{type(self).__name__} cannot render {u.op}")
        local_size = max((u.arg[2] for u in program if u.op is Ops.SPECIAL), default=1)
        return self.render_kernel(name, params, body, local_size)

    def render_param(self, u: UOp, writes: bool) -> str:
        return f"{'' if writes else 'const '}{self.render_dtype(u.dtype)}* restrict data{u.arg}"

    split_strided_base = False  # see `_subscript`

    def _subscript(self, buf: str, rendered: str, index: UOp, open_loops: list[UOp], from_zero: set[UOp],
                   ref: Callable[[UOp], str]) -> str:
        """A load's `buf[index]`; with `split_strided_base`, a strided read (2 or more elements apart along the
        innermost
        open loop, which starts at 0) is written `(buf + base)[step]`: `base` the index's terms that do not move
        along that loop, `step` those that do. Built with -fwrapv, clang cannot tell that `base + 2 * i` does not
        wrap, so its vectoriser could not treat the access as strided and gathered each lane (`x[:, ::2] * 2 + 1`,
        2048x2048: 4.5x gcc's time); `buf + base` is the address at the loop's first iteration, inside the buffer
        whenever the read is (a read under a mask, whose index may lie outside when masked off, is not split; stores
        are left as they are: a strided store is a scatter either way)."""
        plain = f"{buf}[{rendered}]"
        if not self.split_strided_base or not open_loops or index.op is not Ops.ADD:
            return plain
        loop = open_loops[-1]
        stride = index_stride(index, loop)
        if loop not in from_zero or stride is None or abs(stride) < 2:
            return plain
        terms, todo = [], [index]
        while todo:
            term = todo.pop()
            if term.op is Ops.ADD and index_stride(term, loop) != 0 and index_stride(term, loop) is not None:
                todo.extend(reversed(term.src))
            else:
                terms.append(term)
        moving = [t for t in terms if index_stride(t, loop) != 0]
        fixed = [t for t in terms if index_stride(t, loop) == 0]
        if not fixed or not all(t is loop or (t.op is Ops.MUL and t.src[0] is loop and t.src[1].op is Ops.CONST)
                                for t in moving):
            return plain
        return f"({buf} + ({' + '.join(map(ref, fixed))}))[{' + '.join(map(ref, moving))}]"

    def _expression(self, u: UOp, names: dict[UOp, str]) -> str:
        """`u` written out whole from thread ids, loop indices and Variables (an index computed before the loop it
        belongs to: none of its operations has a variable there yet)."""
        if u.op is Ops.CONST:
            return self.render_const(u.arg, u.dtype)
        if u.op in (Ops.SPECIAL, Ops.RANGE, Ops.DEFINE_VAR):
            return names[u]
        a = [self._expression(s, names) for s in u.src]
        return self.render_cast(a[0], u.src[0].dtype, u.dtype) if u.op is Ops.CAST else self.render_alu(u, a)

    def render_var_param(self, u: UOp, slot: int) -> str:
        """A Variable's parameter (`slot`: its position in the parameter list)."""
        return f"const int {u.arg[0]}"


@dataclass(frozen=True)
class VectorRun:
    """A load or store inside an innermost upcast loop that reads or writes `lanes` consecutive elements from
    `first` (one per iteration, in order), `first` a multiple of `chunk`: it moves as lanes / chunk vector accesses
    of `chunk` elements (16 bytes, or 4 or 8 for a short run), through a register array the loop indexes."""
    loop: UOp
    first: UOp
    lanes: int
    chunk: int


def vector_runs(program: list[UOp]) -> dict[UOp, VectorRun]:
    """The ungated loads and stores of global buffers inside innermost upcast loops that run contiguously along the
    loop from an aligned first element (buffers start 256-byte aligned; views are offsets in the index)."""
    runs: dict[UOp, VectorRun] = {}
    if any(u.op in _SHAPED_BY_GPUDIMS for u in program):
        return runs  # (tiled and grouped kernels stage their loads themselves)
    opened = Counter(u for u in program if u.op is Ops.RANGE)
    open_loop: UOp | None = None
    defined: set[UOp] = set()
    for u in program:
        if u.op in (Ops.SPECIAL, Ops.DEFINE_VAR):
            defined.add(u)
        if u.op is Ops.RANGE:
            defined.add(u)
            # (an upcast loop opened twice, inside a reduction and again for the store after it, is one UOp: its
            # runs, rendered around the loop, would be rendered around both)
            open_loop = u if u.arg[1] == "upcast" and u.src[0].op is Ops.CONST and opened[u] == 1 else None
        elif u.op is Ops.ENDRANGE:
            open_loop = None
        elif open_loop is not None and u.op in (Ops.LOAD, Ops.STORE) and u.src[0].op is Ops.DEFINE_GLOBAL and \
                len(u.src) == (2 if u.op is Ops.LOAD else 3) and u.arg is None:
            run = _vector_run(u, open_loop, defined)
            if run is not None:
                runs[u] = run
    return runs


def _vector_run(access: UOp, loop: UOp, defined: set[UOp]) -> VectorRun | None:
    lanes, itemsize = loop.src[0].arg, access.src[0].dtype.itemsize
    nbytes = lanes * itemsize
    chunk_bytes = 16 if nbytes % 16 == 0 else nbytes if nbytes in (4, 8) else 0
    if not chunk_bytes or index_stride(access.src[1], loop) != 1:
        return None
    chunk = chunk_bytes // itemsize
    first = simplify(substitute(access.src[1], {loop: UOp.const(loop.dtype, 0)}))
    leaves = [n for n in first.toposort() if not n.src and n.op is not Ops.CONST]
    if any(n not in defined or n is loop for n in leaves) or \
            any(n.op not in GroupOp.ALU and n.op not in (Ops.CAST, Ops.CONST, Ops.SPECIAL, Ops.RANGE, Ops.DEFINE_VAR)
                for n in first.toposort()):
        return None
    aligned = simplify(first % UOp.const(first.dtype, chunk))
    return VectorRun(loop, first, lanes, chunk) if aligned.op is Ops.CONST and aligned.arg == 0 else None


def index_stride(index: UOp, loop: UOp) -> int | None:
    """How far `index` moves when `loop` advances by one, if that is a constant (None if not affine in it)."""
    return index_strides(index).get(loop, 0)


@functools.lru_cache(maxsize=8192)  # asked of each load along each loop around it; UOps are hash-consed
def index_strides(index: UOp) -> dict[UOp, int | None]:
    """`index_stride` along every loop (RANGE) that `index` depends on, from one walk over the index (shared
    between callers: do not modify it)."""
    strides: dict[UOp, dict[UOp, int | None]] = {}
    for u in index.toposort():
        inner = [strides[s] for s in u.src]
        if u.op is Ops.RANGE:
            strides[u] = {u: 1}
        elif not any(inner):
            strides[u] = {}
        elif u.op is Ops.ADD:
            a, b = inner
            strides[u] = {r: _add_strides(a.get(r, 0), b.get(r, 0)) for r in {**a, **b}}
        elif u.op is Ops.MUL and u.src[1].op is Ops.CONST:
            strides[u] = {r: None if n is None else n * u.src[1].arg for r, n in inner[0].items()}
        elif u.op is Ops.CAST:
            strides[u] = inner[0]
        else:
            strides[u] = {r: None for moves in inner for r in moves}
    return strides[index]


def _add_strides(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else a + b


# gcc 12.2 vectorises an outer loop around a read that runs backwards wrongly (seen: the sum of a flipped 4x2 block
# gave 38, not 28, at -O2: the inner loop of two taps was unrolled, and the outer loop vectorised with a reversed group
# of loads). A kernel in which some loop reads backwards and could become such an innermost loop (it has no SIMD
# loop inside it) is compiled without gcc's loop vectoriser. That also stops `#pragma omp simd` loops from being
# vectorised (gcc 12 vectorises them only with the vectoriser on), which is why it is not done for every kernel, nor
# for one whose backward reads are all in loops around a SIMD loop (a convolution's input gradient reads its incoming
# gradient at h - kh: 20x slower without vectors).
_NO_AUTO_VECTORIZER = ('#if defined(__GNUC__) && !defined(__clang__)\n'
                       '__attribute__((optimize("no-tree-loop-vectorize")))\n#endif')


def _reads_backwards_unvectorised(program: list[UOp], simd: set[UOp]) -> bool:
    """Whether some load's index goes down as a loop goes up (a flip) where that loop is a SIMD loop (in `simd`) or
    has none inside it."""
    for position, loop in enumerate(program):
        if loop.op is not Ops.RANGE:
            continue
        body = program[position + 1:_loop_end(program, position)]
        if (loop in simd or not any(u in simd for u in body)) and \
                any((index_stride(u.src[1], loop) or 0) < 0 for u in body if u.op is Ops.LOAD):
            return True
    return False


def _loop_end(program: list[UOp], position: int) -> int:
    loop = program[position]
    return next(i for i in range(position + 1, len(program)) if program[i].op is Ops.ENDRANGE and
                program[i].src[0] is loop)


# A kernel whose loop bodies run at most this many times in all is compiled by gcc without optimisation: it runs
# for a few microseconds either way (launching it costs more), and its compile costs about a third of an -O2 one.
TINY_KERNEL_ITERATIONS = 4096
_UNOPTIMISED = ('#if defined(__GNUC__) && !defined(__clang__)\n'
                '__attribute__((optimize("O0")))\n#endif')


def _loop_iterations(program: list[UOp]) -> int | None:
    """How many times loop bodies run in all (each loop counted once per run of the loops around it); None when a
    loop's trip count is symbolic."""
    total, nest = 0, [1]
    for u in program:
        if u.op is Ops.RANGE:
            if u.src[0].op is not Ops.CONST:
                return None
            nest.append(nest[-1] * u.src[0].arg)
            total += nest[-1]
        elif u.op is Ops.ENDRANGE:
            nest.pop()
    return total


_ORDERING = (Ops.BARRIER, Ops.ASYNC_COMMIT, Ops.ASYNC_WAIT)
_SHAPED_BY_GPUDIMS = (Ops.DEFINE_LOCAL, Ops.BARRIER, Ops.WMMA, Ops.FRAGMENT, Ops.ASYNC_COPY, Ops.COPY_OUT,
                      Ops.GROUP_REDUCE)


def _simd_accumulate(program: list[UOp], position: int) -> UOp | None:
    """The sum or product accumulated in the loop opened at program[position], if the loop can be a SIMD reduction:
    innermost, with only contiguous, loop-invariant or non-affine loads (strided loads would become slow gathers;
    a non-affine one, a max-pool gradient's `x // 2`, is a gather either way, and the vector sum still wins:
    MNIST's batch-norm gradient sums over a max-pool's gradient 2.2 -> 1.5 ms)."""
    loop = program[position]
    for u in program[position + 1:]:
        if u.op is Ops.RANGE:
            return None  # not the innermost loop
        if u.op is Ops.LOAD and index_stride(u.src[1], loop) not in (0, 1, None):
            return None
        if u.op is Ops.ACCUMULATE:
            return u if u.arg in (Ops.ADD, Ops.MUL) else None
    return None


def _simd_max(program: list[UOp], position: int) -> UOp | None:
    """The float32/float64 max accumulated into a scalar in the loop opened at program[position], if it can be a SIMD
    reduction (innermost, loads as `_simd_accumulate` allows, the loop's only accumulation). The C renderer then
    writes `acc = v > acc ? v : acc` under `omp simd reduction(max:acc)` and a flag `nan |= v != v` beside it, and
    sets acc to NaN after the loop if the flag is set: numpy's NaN propagation, vectorised, for rows that no lane
    count divides (77 or 1023 columns). The select with its NaN check inline is a dependency gcc will not reorder."""
    loop = program[position]
    if loop.arg[1] != "reduce":
        return None
    found = None
    for u in program[position + 1:]:
        if u.op is Ops.RANGE:
            return None
        if u.op is Ops.LOAD and index_stride(u.src[1], loop) not in (0, 1, None):
            return None
        if u.op is Ops.ACCUMULATE:
            if found is not None or u.arg is not Ops.MAX or u.dtype not in (dtypes.float32, dtypes.float64) or \
                    len(u.src[0].src) > 1:
                return None
            found = u
        if u.op is Ops.ENDRANGE and u.src[0] is loop:
            return found
    return None


def _simd_loops(program: list[UOp]) -> set[UOp]:
    """The loops the C renderer marks `#pragma omp simd`: independent upcast lanes, the innermost loops of staging
    copies, and SIMD reductions."""
    out: set[UOp] = set()
    for position, u in enumerate(program):
        if u.op is not Ops.RANGE or u.arg[1] == "global":
            continue
        if _independent_lanes(program, position) if u.arg[1] in ("upcast", "unroll", "stage") else \
                _simd_accumulate(program, position) is not None:
            out.add(u)
    return out


def _cannot_wrap(u: UOp) -> bool:
    """Whether u's value range is narrower than its dtype's (the simplifier then knows it is computed exactly)."""
    return (u.vmin, u.vmax) != dtype_bounds(u.dtype)


def _independent_lanes(program: list[UOp], position: int) -> bool:
    """Whether the loop opened at program[position] can run as SIMD lanes: it has no loop inside it, and nothing in
    it accumulates across its iterations (every accumulator it adds to has one element per iteration)."""
    loop = program[position]
    for u in program[position + 1:]:
        if u.op is Ops.RANGE:
            return False
        if u.op is Ops.ACCUMULATE and loop not in u.src[0].src[1:]:
            return False
        if u.op is Ops.STORE and u.arg is Ops.ADD and not _distinct_adds(u, loop):
            return False
        if u.op is Ops.ENDRANGE and u.src[0] is loop:
            return True
    return True


def _distinct_adds(store: UOp, loop: UOp) -> bool:
    """Whether an accumulating store (a scatter's) adds to a different element in each iteration of `loop` while
    the other loops stand still: its index moves by a constant other than 0 along it (affine: nothing that depends
    on the loop is data-dependent), so SIMD lanes over the loop never add to one element together."""
    return index_stride(store.src[1], loop) not in (0, None)


def _hoisted_values(program: list[UOp]) -> set[UOp]:
    """Values the linearizer placed outside a loop that their consumer is inside: they get a variable where they
    are computed (inlined into the consumer they would be computed on every iteration: a batch norm's
    `1/sqrt(var + eps)` per element of a max-pool, 3.7 -> 0.5 ms)."""
    depth_at: dict[UOp, int] = {}
    depth = 0
    for u in program:
        if u.op is Ops.ENDRANGE:
            depth -= 1
        depth_at[u] = depth
        if u.op is Ops.RANGE:
            depth += 1
    return {s for u in program for s in u.src if depth_at.get(s, depth_at[u]) < depth_at[u]}


def _elementwise_lanes(program: list[UOp], position: int) -> bool:
    """Whether the output loop opened at program[position] is an innermost elementwise loop whose iterations are
    independent: no loop or accumulator inside, each store moves along it (a different element per iteration),
    a stored buffer is read only where the same iteration writes, and nothing is read backwards (see
    `_reads_backwards_unvectorised`)."""
    loop = program[position]
    stores: list[UOp] = []
    loads: list[UOp] = []
    for u in program[position + 1:]:
        if u.op in (Ops.RANGE, Ops.DEFINE_ACC, Ops.ACCUMULATE, Ops.BARRIER):
            return False
        if u.op is Ops.ENDRANGE and u.src[0] is loop:
            break
        if u.op is Ops.STORE:
            stores.append(u)
        elif u.op is Ops.LOAD:
            loads.append(u)
    if not stores or any(index_stride(st.src[1], loop) in (0, None) for st in stores):
        return False
    written = {st.src[0]: st.src[1] for st in stores}
    return all((ld.src[0] not in written or written[ld.src[0]] is ld.src[1]) and
               (index_stride(ld.src[1], loop) or 0) >= 0 for ld in loads)


def _chunked_loop(lines: list[str], chunks: list[int]) -> list[str]:
    """A rendered loop `[pragma,] for (T v = 0; v < n; v++) {, body..., }` repeated once per chunk of its range:
    `for (T v = 0; v < 16; v++)`, `for (T v = 16; v < 20; v++)`, ... (the body's names are local to each copy)."""
    header = next(i for i, text in enumerate(lines) if text.lstrip().startswith("for ("))
    indent, text = lines[header][:len(lines[header]) - len(lines[header].lstrip())], lines[header].lstrip()
    var_type, var = text[len("for ("):].split(" = ")[0].rsplit(" ", 1)
    out, start = [], 0
    for chunk in chunks:
        out += lines[:header] + [f"{indent}for ({var_type} {var} = {start}; {var} < {start + chunk}; {var}++) {{"]
        out += lines[header + 1:]
        start += chunk
    return out


def _flat_index(loops: tuple[UOp, ...], row: int) -> str:
    """C text for the row-major position of a combination of loop indices, ((r0*s1)+r1)*row+r2, where the last
    loop's rows are `row` long (its size, or more for alignment)."""
    text = f"ridx{loops[0].arg[0]}"
    for r in loops[1:]:
        text = f"({text}*{row if r is loops[-1] else r.src[0].arg}+ridx{r.arg[0]})"
    return text


def _safe_divisor(d: UOp) -> bool:
    return d.op is Ops.CONST and d.arg not in (0, -1)


# Helpers are guarded so that a batch of kernels in one C file (`ClangCompiler.compile_batch`) defines them once.
_BF16_HELPERS = """\
#ifndef GG_BF16_HELPERS
#define GG_BF16_HELPERS
static inline float gg_bf16_to_f32(unsigned short x) {
  union { unsigned int i; float f; } u = { (unsigned int)x << 16 };
  return u.f;
}
static inline unsigned short gg_f32_to_bf16(float f) {
  union { float f; unsigned int i; } u = { f };
  if (f != f) return 0x7fc0;
  return (unsigned short)((u.i + 0x7fff + ((u.i >> 16) & 1)) >> 16);
}
#endif
"""

# float16 stored as its 16 bits, for compilers without `_Float16` (clang 14 on x86-64). The conversions are exact and
# give the native type's bits: half -> float is exact (a NaN is made quiet, as F16C's vcvtph2ps does); float and
# double -> half round to nearest, ties to even, straight from the source value (no rounding through float first),
# with overflow to infinity at 65520 and NaNs kept quiet with their top payload bits.
_F16_HELPERS = """\
#ifndef GG_F16_HELPERS
#define GG_F16_HELPERS
static inline float gg_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  union { unsigned int i; float f; } u;
  if (exponent == 0) {  /* zero or subnormal: mantissa * 2^-24, exact in float */
    u.f = (float)mantissa * 0x1p-24f;
    u.i |= sign;
    return u.f;
  }
  u.i = sign | (exponent == 31 ? 0x7f800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0u)
                               : ((exponent + 112u) << 23) | (mantissa << 13));
  return u.f;
}
static inline unsigned short gg_f64_to_f16(double d) {
  union { double d; unsigned long long i; } u = { d };
  unsigned short sign = (unsigned short)((u.i >> 48) & 0x8000u);
  unsigned long long a = u.i & 0x7fffffffffffffffull;
  if (a > 0x7ff0000000000000ull) return sign | 0x7e00u | (unsigned short)((a >> 42) & 0x1ffu);  /* NaN */
  if (a >= 0x40effe0000000000ull) return sign | 0x7c00u;  /* 65520 and more (a tie rounds to even: inf) */
  if (a >= 0x3f10000000000000ull) {  /* a normal half (2^-14 and more): rebias the exponent, round 52 -> 10 bits */
    unsigned long long m = a - 0x3f00000000000000ull;
    return sign | (unsigned short)((m + 0x1ffffffffffull + ((m >> 42) & 1u)) >> 42);
  }
  if (a <= 0x3e60000000000000ull) return sign;  /* 2^-25 or less: zero (2^-25 is a tie with 0) */
  {  /* a subnormal half: the value in units of 2^-24, rounded */
    int shift = 1051 - (int)(a >> 52);
    unsigned long long mantissa = (a & 0xfffffffffffffull) | 0x10000000000000ull;
    unsigned long long q = mantissa >> shift, r = mantissa & ((1ull << shift) - 1), tie = 1ull << (shift - 1);
    return sign | (unsigned short)(q + (r > tie || (r == tie && (q & 1u))));
  }
}
static inline unsigned short gg_f32_to_f16(float f) { return gg_f64_to_f16((double)f); }
#endif
"""


# a fused multiply-add where the target has the instruction (x86's FMA3, ARM's), else a multiply and an add: the
# library function would be a call per step. clang gets `x * y + acc` under `fp contract(on)` (LLVM's fmuladd,
# which it fuses wherever the target has FMA): its loop vectoriser takes an fmuladd chain as a sum, not the fma
# builtin's (a layernorm's sum of squares, `#pragma omp simd reduction(+)`, stayed scalar: 5.6x gcc's time)
_FMA_HELPERS = """#ifndef GG_FMAF
#if defined(__clang__) && (defined(__FMA__) || defined(__ARM_FEATURE_FMA))
static inline float gg_fmaf(float x, float y, float acc) {
#pragma clang fp contract(on)
  return x * y + acc;
}
static inline double gg_fma(double x, double y, double acc) {
#pragma clang fp contract(on)
  return x * y + acc;
}
#define GG_FMAF(x, y, acc) gg_fmaf(x, y, acc)
#define GG_FMA(x, y, acc) gg_fma(x, y, acc)
#elif defined(__FMA__) || defined(__ARM_FEATURE_FMA) || defined(__FP_FAST_FMAF)
#define GG_FMAF(x, y, acc) __builtin_fmaf(x, y, acc)
#define GG_FMA(x, y, acc) __builtin_fma(x, y, acc)
#else
#define GG_FMAF(x, y, acc) ((x) * (y) + (acc))
#define GG_FMA(x, y, acc) ((x) * (y) + (acc))
#endif
#endif
"""

# a select of float bits by a mask: the value `c ? x : y` is, without a branch (see ClangRenderer.render_copy_select)
_SELECT_HELPERS = """static inline float gg_selectf(int c, float x, float y) {
  unsigned a, b, m = 0u - (unsigned)(c != 0);
  __builtin_memcpy(&a, &x, 4); __builtin_memcpy(&b, &y, 4); a = (a & m) | (b & ~m); __builtin_memcpy(&x, &a, 4);
  return x;
}
static inline double gg_select(int c, double x, double y) {
  unsigned long long a, b, m = 0ull - (unsigned long long)(c != 0);
  __builtin_memcpy(&a, &x, 8); __builtin_memcpy(&b, &y, 8); a = (a & m) | (b & ~m); __builtin_memcpy(&x, &a, 8);
  return x;
}
"""

# glibc's libmvec has SIMD versions of these: declaring them `simd` lets gcc vectorise loops that call them
_VECTOR_MATH = {fn: f'float {fn}(float) __attribute__((simd("notinbranch")));' for fn in ("exp2f", "log2f", "sinf")}


# LLVM's loop vectoriser calls a vector math library only by the names it knows, and LLVM 14 knows glibc's libmvec for
# sin, cos, exp, log and pow, not for the exp2f and log2f the kernels call; it knows Intel's SVML names for all of
# them. So where the compiler takes -fveclib=SVML (clang; `runtime/ccompiler.py` probes it and then defines
# GG_SVML_LIBMVEC), a loop of `exp2f` calls `__svml_exp2f16` on 16 lanes, and the kernel defines that name as glibc's
# libmvec function of the same width (`_ZGVeN16v_exp2f`, the one gcc calls: the same numbers with either compiler),
# or as two calls of half the width where the machine has no registers that wide. Hidden: each kernel library has
# its own. (Kernels calling these functions only.)
SVML_FUNCTIONS = (("exp2", 1), ("log2", 1), ("sin", 1), ("pow", 2))


def _svml_wrapper(fn: str, args: int, ctype: str, lanes: int, isa: str | None) -> str:
    """`__svml_<fn><lanes>` for one libmvec function and width: glibc's variant for the ISA letter `isa` (b: SSE,
    c: AVX, d: AVX2, e: AVX-512), or None: two calls of the wrapper of half the width."""
    suffix = "f" if ctype == "float" else ""
    vtype, half = f"gg_{ctype}{lanes}", f"gg_{ctype}{lanes // 2}"
    name = f"__svml_{fn}{suffix}{lanes}"
    params = ", ".join(f"{vtype} {v}" for v in "xy"[:args])
    if isa is not None:
        variant = f"_ZGV{isa}N{lanes}{'v' * args}_{fn}{suffix}"
        return (f"{vtype} {variant}({', '.join([vtype] * args)});\n"
                f"GG_HIDDEN {vtype} {name}({params}) {{ return {variant}({', '.join('xy'[:args])}); }}")
    copies = " ".join(f"{half} {v}h[2]; __builtin_memcpy({v}h, &{v}, sizeof {v});" for v in "xy"[:args])
    calls = " ".join(f"xh[{i}] = __svml_{fn}{suffix}{lanes // 2}({', '.join(f'{v}h[{i}]' for v in 'xy'[:args])});"
                     for i in range(2))
    return f"GG_HIDDEN {vtype} {name}({params}) {{ {copies} {calls} __builtin_memcpy(&x, xh, sizeof x); return x; }}"


def _svml_wrappers() -> str:
    lines = ["#if defined(GG_SVML_LIBMVEC) && defined(__x86_64__) && !defined(GG_SVML_WRAPPERS)",
             "#define GG_SVML_WRAPPERS", '#define GG_HIDDEN __attribute__((visibility("hidden")))']
    for ctype, size in (("float", 4), ("double", 8)):
        lines += [f"typedef {ctype} gg_{ctype}{b // size} __attribute__((vector_size({b})));" for b in (16, 32, 64)]
    for fn, args in SVML_FUNCTIONS:
        for ctype, size in (("float", 4), ("double", 8)):
            small, mid, wide = (b // size for b in (16, 32, 64))
            lines.append(_svml_wrapper(fn, args, ctype, small, "b"))
            lines += ["#if defined(__AVX2__)", _svml_wrapper(fn, args, ctype, mid, "d"), "#elif defined(__AVX__)",
                      _svml_wrapper(fn, args, ctype, mid, "c"), "#else", _svml_wrapper(fn, args, ctype, mid, None),
                      "#endif", "#if defined(__AVX512F__)", _svml_wrapper(fn, args, ctype, wide, "e"), "#else",
                      _svml_wrapper(fn, args, ctype, wide, None), "#endif"]
    return "\n".join([*lines, "#endif"])


SVML_WRAPPERS = _svml_wrappers()


def _calls_svml_function(text: str) -> bool:
    return any(f"{fn}{suffix}(" in text for fn, _ in SVML_FUNCTIONS for suffix in ("f", ""))


def opt_level_line(level: int) -> str:
    """The first line of a CPU kernel's source built at `-O<level>` (an OPTLEVEL opt): the C compiler
    (`runtime/ops_cpu.py`) reads it back with `opt_level_of` and builds the kernel with that level. A comment, so
    the source compiles alike without it; in the source, so every cache keyed by the source (the compile cache, BEAM's
    candidates, the batches of one compiler run) tells the levels apart."""
    return f"/* glassgrad: built with -O{level} */"


_OPT_LEVEL_LINE = re.compile(r"/\* glassgrad: built with -O(\d) \*/\n")


def opt_level_of(source: str) -> int | None:
    """The optimisation level `opt_level_line` asked for at the start of `source`, else None (the default)."""
    found = _OPT_LEVEL_LINE.match(source)
    return int(found.group(1)) if found else None


class ClangRenderer(CStyleLanguage):
    """C for the CPU backend. The outermost loop runs over [start, end) so the runtime can split it over threads."""
    device = "CPU"
    opt_levels = (2, 3)  # gcc's and clang's -O2 (the default, `runtime/ccompiler.py` BASE_FLAGS) and -O3
    default_opt_level = 2
    extra_matcher = float32_compute
    type_names = {**CStyleLanguage.type_names, dtypes.float16: "unsigned short", dtypes.bfloat16: "unsigned short"}

    def __init__(self, native_half: bool = False, omp_simd: bool = True, vector_bytes: int = 64,
                 max_lanes: bool = True, family: str = "") -> None:
        """What the C compiler can do (`runtime/ccompiler.py` probes it; the defaults build with any C99 compiler):
        `native_half`: float16 is `_Float16`, else its 16 bits (`unsigned short`) converted by exact helpers;
        `omp_simd`: the compiler takes `-fopenmp-simd`, so loops get `#pragma omp simd` hints; `vector_bytes`: the
        width of the SIMD registers it targets (64: AVX-512, 32: AVX2), which sizes the optimiser's register tiles;
        `max_lanes`: a row max needs accumulator lanes of less than a register (8, 4) to vectorise (clang 14 leaves
        its NaN-aware select scalar without them; gcc vectorises the plain loop, 4x faster than with them); `family`:
        'gcc' or 'clang' ('' another or none), whose measured optimisation levels the heuristic picks by kernel kind."""
        self.native_half = native_half
        self.omp_simd = omp_simd
        self.vector_bytes = vector_bytes
        self.max_lanes = max_lanes
        self.family = family
        self.type_names = {**self.type_names, dtypes.float16: "_Float16" if native_half else "unsigned short"}

    def __repr__(self) -> str:
        return f"ClangRenderer(native_half={self.native_half}, omp_simd={self.omp_simd}, " \
            f"vector_bytes={self.vector_bytes}, max_lanes={self.max_lanes}, family={self.family!r})"

    wide_index_type = "long long"
    split_strided_base = True

    abs_functions = {dtypes.float32: "fabsf", dtypes.float64: "fabs"}

    # sums of products (matmuls, convolutions) accumulate with one rounding, as BLAS does: the kernels are built with
    # -ffp-contract=off so that elementwise `a*b+c` rounds like numpy, which would otherwise also keep a reduction's
    # multiply and add apart (two instructions and a register more per step: a 1024^2 matmul 1.37x slower on AVX2)
    fused_accumulate = True

    def render_fma(self, x: str, y: str, acc: str, dtype: DType) -> str:
        return f"GG_FMA{'F' if dtype == dtypes.float32 else ''}({x}, {y}, {acc})"

    def render_copy_select(self, u: UOp, a: list[str]) -> str | None:
        """A staging copy's float select of a value or zero (a ReLU's gradient, `x <= 0 ? 0 : g`) is written as a
        select of bits by a mask (the same value, NaNs and signed zeros included): gcc 12 does not vectorise
        `c ? 0 : g` with g invariant in the loop and c reading a masked load (a ReLU's gradient times a pooled
        gradient, `x <= 0 ? 0 : g / 256`, over a padded input: "no vectype for .MASK_LOAD"), and compiled the scalar
        loop it left with a branch, mispredicted on a ReLU's signs (a stride-2 input gradient: 16 -> 6 ms). Bitwise,
        the copy is vectorised, and a copy left scalar (a gather) has no branch. Other selects stay `c ? x : y` (a
        causal mask's `-inf` under an `exp2f` of a row's values: gcc vectorised the call only with the ternary)."""
        if not any(s.op is Ops.CONST and s.arg == 0 for s in u.src[1:]):
            return None
        if u.dtype == dtypes.float32:
            return f"gg_selectf({a[0]}, {a[1]}, {a[2]})"
        return f"gg_select({a[0]}, {a[1]}, {a[2]})" if u.dtype == dtypes.float64 else None

    def loop_var_type(self, dtype: DType) -> str:
        return "long long"  # index values fit the AST's dtype; 64-bit loop variables give gcc simpler addressing

    @property
    def simd_max(self) -> bool:  # type: ignore[override]
        return self.omp_simd

    def reduce_loop_pragma(self, program: list[UOp], position: int, names: dict[UOp, str]) -> str:
        """Innermost sum/product loops may be reordered (vectorised) by the compiler: OpenMP SIMD says so for this
        loop alone, instead of -ffast-math for the whole file (which would also break NaN and inf handling)."""
        acc = _simd_accumulate(program, position) if self.omp_simd else None
        return "" if acc is None else f"#pragma omp simd reduction({'+' if acc.arg is Ops.ADD else '*'}:" \
            f"{names[acc.src[0]]})"

    # 64-byte rows: gcc 12 has been seen to use aligned vector moves on a row of an unaligned tile (a segfault)
    acc_row_align = 16

    def render_acc_array(self, dtype: DType, name: str, size: int) -> str:
        return f"{self.render_dtype(dtype)} {name}[{size}] __attribute__((aligned(64)));"

    def upcast_loop_pragma(self, loop: UOp, lanes: bool) -> str:
        """The innermost upcast loop becomes SIMD lanes (its iterations are independent: an accumulator or an output
        each); the loops around it, and the loop combining a reduction's lanes, are unrolled whole so the
        accumulators live in registers instead of memory."""
        if lanes:
            return "#pragma omp simd" if self.omp_simd else ""
        return f"#pragma GCC unroll {loop.src[0].arg}"

    def stage_loop_pragma(self, lanes: bool) -> str:
        return "#pragma omp simd" if lanes and self.omp_simd else ""

    def global_loop_pragma(self, program: list[UOp], position: int) -> str:
        """An innermost elementwise loop is SIMD lanes: at -O2, gcc 12's cheapest cost model does not vectorise a
        loop that needs a remainder (20 iterations) or gathers (the `x // 2` index of a max-pool's gradient), which
        `omp simd` overrides (MNIST's batch-norm and max-pool gradient kernel: 4.5 -> 2.1 ms)."""
        return "#pragma omp simd" if self.omp_simd and _elementwise_lanes(program, position) else ""

    def lane_chunks(self, size: int) -> list[int]:
        """Whole registers of 16 floats, then 8 and 4 (a ymm, an xmm register), then the last 1-3 lanes: gcc
        vectorises a 20-lane loop as 16 lanes plus a scalar loop over the last 4, with their accumulators in memory
        (a 5x5 conv with 20 output columns: 4x slower than as a loop of 16 and a loop of 4)."""
        chunks = [size - size % 16] if size >= 16 else []
        rest = size % 16
        for width in (8, 4):
            if rest >= width:
                chunks.append(width)
                rest -= width
        return chunks + ([rest] if rest else [])

    def render_local_array(self, dtype: DType, name: str, size: int) -> str:
        """A staging buffer on the thread's stack, read through a `restrict` pointer: gcc then knows that its
        reads do not touch the accumulators, and keeps those in registers (through the array itself it does not)."""
        return (f"{self.render_dtype(dtype)} {name}_[{size}] __attribute__((aligned(64))); "
                f"{self.render_dtype(dtype)}* restrict {name} = {name}_;")

    # the CPU adds without atomics: its kernels split the outer loop over threads only where no two threads add to one
    # element (codegen/__init__.py), and SIMD lanes only where each lane adds to its own (`_distinct_adds`)
    scatter_dtypes = frozenset({dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
                                dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32,
                                dtypes.float64})

    def render_store_add(self, buf: str, index: str, value: str, dtype: DType) -> str:
        """Float16 and bfloat16 add in float32 (the value rounded once, as the one-hot sum's float32 accumulator
        would round each step); narrow ints wrap like numpy's."""
        target = f"{buf}[{index}]"
        if dtype in (dtypes.float16, dtypes.bfloat16):
            old, add = self.render_cast(target, dtype, dtypes.float32), self.render_cast(value, dtype, dtypes.float32)
            total = f"({old} + {add})"
            return f"{target} = {self.render_cast(total, dtypes.float32, dtype)};"
        if dtype.itemsize < 4:
            return f"{target} = ({self.render_dtype(dtype)})({target} + {value});"
        return f"{target} += {value};"

    def render_global_range(self, index: int, var: str, size: str, dtype: str) -> str:
        if index == 0:
            return f"for ({dtype} {var} = start; {var} < end; {var}++) {{"
        return super().render_global_range(index, var, size, dtype)

    def render_const(self, value: int | float | bool, dtype: DType) -> str:
        """A float16 constant is its exact half value (numpy's rounding of the Python float, straight to half): the
        native type gets it as a float literal, which converts exactly; the 16-bit storage gets its bits."""
        if dtype != dtypes.float16:
            return super().render_const(value, dtype)
        with np.errstate(over="ignore"):  # a constant past 65504 is infinity in float16
            half = np.float16(value)
        if self.native_half:
            return super().render_const(float(half), dtype)
        return f"((unsigned short)0x{int(half.view(np.uint16)):04x})"

    def render_cast(self, x: str, src: DType, dst: DType) -> str:
        """Casts from and to the types stored as 16 bits go through float (and, to float16, from double too: one
        rounding from the source value, as the native type and numpy do)."""
        if src == dst:
            return x
        stored = (dtypes.bfloat16,) if self.native_half else (dtypes.bfloat16, dtypes.float16)
        if src in stored:
            x, src = f"gg_{'bf16' if src == dtypes.bfloat16 else 'f16'}_to_f32({x})", dtypes.float32
            if dst == dtypes.float32:
                return x
        if dst == dtypes.bfloat16:
            return f"gg_f32_to_bf16((float)({x}))"
        if dst in stored:
            return f"gg_f32_to_f16({x})" if src == dtypes.float32 else f"gg_f64_to_f16((double)({x}))"
        return super().render_cast(x, src, dst)

    def render(self, name: str, program: list[UOp]) -> str:
        source = super().render(name, program)
        iterations = _loop_iterations(program)
        if iterations is not None and iterations <= TINY_KERNEL_ITERATIONS:
            return source.replace(f"void {name}(", f"{_UNOPTIMISED}\nvoid {name}(", 1)
        if not _reads_backwards_unvectorised(program, _simd_loops(program)):
            return source
        return source.replace(f"void {name}(", f"{_NO_AUTO_VECTORIZER}\nvoid {name}(", 1)

    def with_opt_level(self, source: str, level: int | None) -> str:
        """The source headed by `opt_level_line` (none for the default level: its source is the one it always was)."""
        if level is None or level == self.default_opt_level:
            return source
        if level not in self.opt_levels:
            raise ValueError(f"the CPU's optimisation levels are {self.opt_levels}, not {level!r}")
        return f"{opt_level_line(level)}\n{source}"

    def render_kernel(self, name: str, params: list[str], body: list[str], local_size: int = 1) -> str:
        signature = ", ".join([*params, "long long start", "long long end"])
        text = "\n".join(body)
        helpers = [_BF16_HELPERS.rstrip()] if "gg_bf16" in text or "gg_f32_to_bf16" in text else []
        if "gg_f16" in text or "_to_f16(" in text:
            helpers.append(_F16_HELPERS.rstrip())
        vector_math = [decl for fn, decl in _VECTOR_MATH.items() if any(f"{fn}(" in line for line in body)]
        if vector_math:  # the CPU compiler defines GG_VECTOR_MATH when glibc's libmvec can be linked
            helpers = ["#ifdef GG_VECTOR_MATH", *vector_math, "#endif", *helpers]
        if _calls_svml_function(text):
            helpers.append(SVML_WRAPPERS)
        if "GG_FMA" in text:
            helpers.append(_FMA_HELPERS.rstrip())
        if "gg_select" in text:
            helpers.append(_SELECT_HELPERS.rstrip())
        return "\n".join(["#include <math.h>", "#include <stdbool.h>", *helpers, "",
                          f"void {name}({signature}) {{", *body, "}", _entry_point(name, params), ""])


def _entry_point(name: str, params: list[str]) -> str:
    """`<name>_entry(bufs, vals, start, end)`: the kernel behind one signature for every kernel, so the runtime's C
    thread pool (`runtime/cpu_pool.py`) can call any of them: buffer i is `bufs[i]`, int argument j is `vals[j]`."""
    args, n_bufs, n_vals = [], 0, 0
    for param in params:
        ctype, _ = param.rsplit(" ", 1)
        ctype = ctype.replace(" restrict", "").replace("const int", "int")
        if ctype.endswith("*"):
            args.append(f"({ctype})gg_bufs[{n_bufs}]")
            n_bufs += 1
        else:
            args.append(f"({ctype})gg_vals[{n_vals}]")
            n_vals += 1
    call = ", ".join([*args, "start", "end"])
    return (f"void {name}_entry(void* const* gg_bufs, const long long* gg_vals, long long start, long long end) {{\n"
            f"  (void)gg_bufs; (void)gg_vals;\n  {name}({call});\n}}")

