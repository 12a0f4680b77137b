"""The symbolic simplifier: one test per rule, typical index expressions, and hypothesis property tests.

The property tests build random integer expressions over a few RANGE variables and check, for every assignment of
the variables, that `simplify` keeps the value (C semantics: truncating division, C remainder, x/0 == 0, wrapping
ints) and that every node's value lies inside its [vmin, vmax]. The reference evaluator here is written on its own
(numpy, one array element per assignment); it shares no code with the simplifier's constant folding.
"""
from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from glassgrad.dtype import DType, dtypes
from glassgrad.uop.ops import GroupOp, Ops, UOp
from glassgrad.uop.symbolic import simplify

I32, U32 = dtypes.int32, dtypes.uint32
INT_MIN, INT_MAX = -(2**31), 2**31 - 1


def c(value: int, dtype: DType = I32) -> UOp:
    return UOp.const(dtype, value)


def rng(n: int, axis: int = 0) -> UOp:
    return UOp(Ops.RANGE, I32, (c(n),), (axis, "global"))


# ---------------------------------------------------------------- reference evaluator
def wrap(v: np.ndarray, dtype: DType) -> np.ndarray:
    """Reduce int64 values to what `dtype` holds (two's complement wraparound)."""
    bits = 8 * dtype.itemsize
    if dtype.is_unsigned:
        return v % (1 << bits)
    return (v + (1 << (bits - 1))) % (1 << bits) - (1 << (bits - 1))


def c_divmod(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """C's truncating `/` and `%`, with x/0 == x%0 == 0 (results before wrapping)."""
    zero = b == 0
    safe = np.where(zero, 1, b)
    q = np.abs(a) // np.abs(safe)
    q = np.where((a < 0) != (safe < 0), -q, q)
    r = a - safe * q
    return np.where(zero, 0, q), np.where(zero, 0, r)


def storage(dtype: DType) -> type:
    """numpy element type for values of `dtype`: Python ints (object) for 64-bit types, so nothing overflows."""
    return np.bool_ if dtype.is_bool else (object if dtype.itemsize == 8 else np.int64)


def eval_node(u: UOp, srcs: list[np.ndarray], env: dict[UOp, np.ndarray], n: int) -> np.ndarray:
    op, dt = u.op, u.dtype
    if op is Ops.CONST:
        return np.full(n, u.arg, dtype=storage(dt))
    if op is Ops.RANGE:
        return env[u]
    if op is Ops.CAST:
        return (srcs[0] != 0).astype(np.bool_) if dt.is_bool else wrap(srcs[0].astype(storage(dt)), dt)
    if op is Ops.WHERE:
        return np.where(srcs[0], srcs[1], srcs[2])
    if op in GroupOp.Comparison:
        a, b = srcs
        return (a < b if op is Ops.CMPLT else (a != b if op is Ops.CMPNE else a == b)).astype(np.bool_)
    if dt.is_bool:
        srcs = [x.astype(np.bool_) for x in srcs]
        bool_ops: dict[Ops, Callable[..., np.ndarray]] = {
            Ops.ADD: np.logical_or, Ops.OR: np.logical_or, Ops.MAX: np.logical_or, Ops.MUL: np.logical_and,
            Ops.AND: np.logical_and, Ops.XOR: np.logical_xor, Ops.NEG: np.logical_not}
        return bool_ops[op](*srcs)
    int_ops: dict[Ops, Callable[..., np.ndarray]] = {
        Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.NEG: np.negative, Ops.MAX: np.maximum,
        Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor,
        Ops.IDIV: lambda a, b: c_divmod(a, b)[0], Ops.MOD: lambda a, b: c_divmod(a, b)[1]}
    srcs = [x.astype(storage(dt)) if x.dtype != np.bool_ else x for x in srcs]
    with np.errstate(over="ignore"):  # int64 products wrap mod 2**64, which keeps them right mod 2**32
        return wrap(int_ops[op](*srcs), dt)


def evaluate(root: UOp, env: dict[UOp, np.ndarray], n: int) -> dict[UOp, np.ndarray]:
    """The value of every node under `root`, for each of the `n` assignments in `env`."""
    values: dict[UOp, np.ndarray] = {}
    for u in root.toposort():
        values[u] = eval_node(u, [values[s] for s in u.src], env, n)
    return values


def all_assignments(variables: list[UOp]) -> tuple[dict[UOp, np.ndarray], int]:
    grids = np.array(list(itertools.product(*(range(v.src[0].arg) for v in variables))), dtype=np.int64)
    return {v: grids[:, i] for i, v in enumerate(variables)}, len(grids)


def check_ranges(values: dict[UOp, np.ndarray]) -> None:
    for u, v in values.items():
        if (u.dtype.is_int or u.dtype.is_bool) and len(v):
            assert u.vmin <= v.min() and v.max() <= u.vmax, f"values {v.min()}..{v.max()} outside " \
                f"[{u.vmin}, {u.vmax}] of\n{u}"


def check_simplify(expr: UOp, variables: list[UOp]) -> UOp:
    env, n = all_assignments(variables)
    before = evaluate(expr, env, n)
    simple = simplify(expr)
    after = evaluate(simple, env, n)
    check_ranges(before)
    check_ranges(after)
    bad = np.nonzero(before[expr] != after[simple])[0]
    if len(bad):
        at = {f"r{v.arg[0]}": int(env[v][bad[0]]) for v in variables}
        pytest.fail(f"simplify changed the value at {at}: {before[expr][bad[0]]} -> {after[simple][bad[0]]}\n"
                    f"original:\n{expr}\nsimplified:\n{simple}")
    assert simplify(simple) is simple, "simplify should reach a fixed point"
    return simple


# ---------------------------------------------------------------- random expressions
BIG = [INT_MIN, INT_MIN + 1, -(2**30), 2**30, INT_MAX - 1, INT_MAX, 65536, 1_000_000_007]


def const_values(dtype: DType) -> st.SearchStrategy[int]:
    small = st.integers(-8, 16) if not dtype.is_unsigned else st.integers(0, 16)
    big = st.sampled_from(BIG) if not dtype.is_unsigned else st.sampled_from([2**32 - 1, 2**31, 2**31 - 1, 65536])
    if dtype.itemsize == 8:
        big = st.sampled_from(BIG + [-(2**63), 2**63 - 1, 2**62, 3 * 2**40])
    lo, hi = (dtype.min, dtype.max)
    return st.one_of(small, small, small, big, st.integers(lo, hi))  # type: ignore[arg-type]


@st.composite
def int_expr(draw: st.DrawFn, variables: list[UOp], dtype: DType, depth: int) -> UOp:
    def var() -> UOp:
        v = draw(st.sampled_from(variables))
        return v if dtype == I32 else v.cast(dtype)

    def sub(d: int = depth - 1) -> UOp:
        return draw(int_expr(variables, dtype, d))

    if depth <= 0 or draw(st.integers(0, 5)) == 0:
        return var() if draw(st.booleans()) else c(draw(const_values(dtype)), dtype)
    kind = draw(st.sampled_from(["add", "add", "sub", "mul_c", "mul_c", "mul", "div_c", "div_c", "mod_c", "mod_c",
                                 "div_k", "mod_k", "div", "mod", "max", "neg", "where", "cast", "index", "index"]))
    small_pos = st.integers(1, 12)
    any_divisor = st.one_of(st.integers(-6, 12), const_values(dtype))  # zero and negative ones too
    if kind == "add":
        return sub() + sub()
    if kind == "sub":
        return sub() - sub()
    if kind == "mul_c":
        return sub() * c(draw(const_values(dtype)), dtype)
    if kind == "mul":
        return sub() * sub()
    if kind == "div_c":
        return sub() // c(draw(small_pos), dtype)
    if kind == "mod_c":
        return sub() % c(draw(small_pos), dtype)
    if kind == "div_k":
        return sub() // c(draw(any_divisor), dtype)
    if kind == "mod_k":
        return sub() % c(draw(any_divisor), dtype)
    if kind == "div":
        return sub() // sub(depth - 2)
    if kind == "mod":
        return sub() % sub(depth - 2)
    if kind == "max":
        return sub().maximum(sub())
    if kind == "neg":
        return -sub()
    if kind == "where":
        return draw(bool_expr(variables, dtype, depth - 1)).where(sub(), sub())
    if kind == "cast":
        return draw(bool_expr(variables, dtype, depth - 1)).cast(dtype)
    # an index-like expression: a*k + b with small k, then divided or reduced by a constant
    k = c(draw(small_pos), dtype)
    inner = sub() * k + sub()
    return inner // c(draw(small_pos), dtype) if draw(st.booleans()) else inner % c(draw(small_pos), dtype)


@st.composite
def bool_expr(draw: st.DrawFn, variables: list[UOp], dtype: DType, depth: int) -> UOp:
    def sub() -> UOp:
        return draw(int_expr(variables, dtype, depth - 1))
    kind = draw(st.sampled_from(["lt", "lt", "ne", "eq", "and", "or", "not", "const"]))
    if kind == "lt":
        return sub() < sub()
    if kind == "ne":
        return sub().ne(sub())
    if kind == "eq":
        return sub().eq(sub())
    if kind == "const" or depth <= 1:
        return UOp.const(dtypes.bool, draw(st.booleans()))
    a, b = draw(bool_expr(variables, dtype, depth - 1)), draw(bool_expr(variables, dtype, depth - 1))
    if kind == "and":
        return a.alu(Ops.AND, b)
    if kind == "or":
        return a.alu(Ops.ADD, b)  # bool ADD is "or"
    return UOp(Ops.NEG, dtypes.bool, (a,))  # bool NEG is "not"


@st.composite
def problems(draw: st.DrawFn, dtype: DType = I32, depth: int = 4) -> tuple[UOp, list[UOp]]:
    sizes = draw(st.lists(st.integers(1, 16), min_size=1, max_size=3))
    variables = [rng(s, i) for i, s in enumerate(sizes)]
    return draw(int_expr(variables, dtype, depth)), variables


def examples(n: int) -> int:
    """`n` hypothesis examples, times SYMBOLIC_EXAMPLES_SCALE (default 1): `SYMBOLIC_EXAMPLES_SCALE=20 pytest
    tests/test_symbolic.py -k Properties --hypothesis-seed=N` is a longer hunt than the default run."""
    return n * int(os.environ.get("SYMBOLIC_EXAMPLES_SCALE", "1"))


PROPERTY = settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])


class TestProperties:
    @PROPERTY
    @given(problems())
    def test_simplify_keeps_int32_values_and_ranges_are_sound(self, problem: tuple[UOp, list[UOp]]) -> None:
        check_simplify(*problem)

    @settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems(U32, depth=3))
    def test_simplify_keeps_uint32_values_and_ranges_are_sound(self, problem: tuple[UOp, list[UOp]]) -> None:
        check_simplify(*problem)

    @settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(problems(dtypes.int64, depth=3))
    def test_simplify_keeps_int64_values_and_ranges_are_sound(self, problem: tuple[UOp, list[UOp]]) -> None:
        check_simplify(*problem)

    @settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def test_comparisons_keep_their_values(self, data: st.DataObject) -> None:
        sizes = data.draw(st.lists(st.integers(1, 16), min_size=1, max_size=3))
        variables = [rng(s, i) for i, s in enumerate(sizes)]
        expr = data.draw(bool_expr(variables, I32, 4)).cast(I32)
        check_simplify(expr, variables)

    @settings(max_examples=examples(300), deadline=None)
    @given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.data())
    def test_reshape_index_round_trip_simplifies_to_the_flat_index(self, shape: list[int],
                                                                   data: st.DataObject) -> None:
        """Unflattening the flat index of a shape and flattening it again in another shape gives the flat index."""
        variables = [rng(s, i) for i, s in enumerate(shape)]
        flat = c(0)
        for v, s in zip(variables, shape):
            flat = flat * s + v
        total = math.prod(shape)
        divisors = [d for d in range(1, total + 1) if total % d == 0]
        split = data.draw(st.sampled_from(divisors))  # view the flat index as (total//split, split)
        outer, inner = flat // split, flat % split
        rebuilt = check_simplify(outer * split + inner, variables)
        assert rebuilt is simplify(flat)


# ---------------------------------------------------------------- constant folding
class TestConstantFolding:
    @pytest.mark.parametrize("a, b, q, r", [(7, 2, 3, 1), (-7, 2, -3, -1), (7, -2, -3, 1), (-7, -2, 3, -1),
                                            (5, 0, 0, 0), (-5, 0, 0, 0), (INT_MIN, -1, INT_MIN, 0)])
    def test_int_division_has_c_semantics(self, a: int, b: int, q: int, r: int) -> None:
        assert simplify(c(a) // c(b)) is c(q)
        assert simplify(c(a) % c(b)) is c(r)

    def test_ints_wrap(self) -> None:
        assert simplify(c(INT_MAX) + c(1)) is c(INT_MIN)
        assert simplify(c(65536) * c(65536)) is c(0)
        assert simplify(-c(INT_MIN)) is c(INT_MIN)
        assert simplify(c(0, U32) - c(1, U32)) is c(2**32 - 1, U32)
        assert simplify(c(200, dtypes.uint8) + c(100, dtypes.uint8)) is UOp.const(dtypes.uint8, 44)

    def test_64_bit_ints_wrap(self) -> None:
        i64, u64 = dtypes.int64, dtypes.uint64
        big = UOp.const(i64, 2**62)
        assert simplify(big * big) is UOp.const(i64, 0)
        assert simplify(big * UOp.const(i64, 3)) is UOp.const(i64, -(2**62))
        assert simplify(UOp.const(u64, 2**63) * UOp.const(u64, 2)) is UOp.const(u64, 0)
        assert simplify(UOp.const(i64, 1).alu(Ops.SHL, UOp.const(i64, 63))) is UOp.const(i64, -(2**63))
        assert UOp.const(u64, -1).arg == 2**64 - 1

    def test_comparisons_max_where(self) -> None:
        assert simplify(c(3) < c(4)) is UOp.const(dtypes.bool, True)
        assert simplify(c(3).ne(c(3))) is UOp.const(dtypes.bool, False)
        assert simplify(c(3).eq(c(3))) is UOp.const(dtypes.bool, True)
        assert simplify(c(-3).maximum(c(2))) is c(2)
        assert simplify(UOp.const(dtypes.bool, False).where(c(1), c(2))) is c(2)

    def test_bool_ops_fold_as_the_renderer_computes_them(self) -> None:
        t, f = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)
        assert simplify(UOp(Ops.NEG, dtypes.bool, (t,))) is f  # rendered as !x
        assert simplify(UOp(Ops.NEG, dtypes.bool, (f,))) is t
        assert simplify(t.alu(Ops.ADD, t)) is t  # rendered as ||
        assert simplify(t.alu(Ops.MUL, f)) is f  # rendered as &&

    def test_float_folding_rounds_in_the_dtype(self) -> None:
        a, b = UOp.const(dtypes.float32, 0.1), UOp.const(dtypes.float32, 0.2)
        assert simplify(a + b).arg == float(np.float32(0.1) + np.float32(0.2))
        assert simplify(UOp.const(dtypes.float32, 1.0).alu(Ops.FDIV, UOp.const(dtypes.float32, 0.0))).arg == math.inf
        nan = UOp.const(dtypes.float32, math.nan)
        assert simplify(nan.maximum(UOp.const(dtypes.float32, 1.0))).op is Ops.MAX  # NaN handling is the device's

    def test_float_identities_that_do_not_hold_are_left_alone(self) -> None:
        x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
        assert simplify(x + UOp.const(dtypes.float32, 0.0)).op is Ops.ADD  # -0.0 + 0.0 is 0.0
        assert simplify(x * UOp.const(dtypes.float32, 0.0)).op is Ops.MUL  # inf * 0 is nan
        assert simplify(x % UOp.const(dtypes.float32, 1.0)).op is Ops.MOD  # fmod(2.5, 1) is 0.5
        assert simplify(x * UOp.const(dtypes.float32, 1.0)) is x

    def test_float_modulo_by_one_runs_on_the_device(self) -> None:
        from glassgrad import Tensor
        np.testing.assert_allclose((Tensor([2.5, -1.25]) % 1).numpy(), np.array([2.5, -1.25]) % 1)

    def test_casts(self) -> None:
        f = dtypes.float32
        assert simplify(UOp.const(f, -2.7).cast(I32)) is c(-2)  # C truncates toward zero
        assert simplify(UOp.const(f, 2.7).cast(I32)) is c(2)
        assert simplify(UOp.const(f, math.inf).cast(I32)).op is Ops.CAST  # undefined in C: left to the device
        assert simplify(UOp.const(f, 1e20).cast(I32)).op is Ops.CAST
        assert simplify(UOp.const(f, -1.0).cast(U32)).op is Ops.CAST
        assert simplify(c(300).cast(dtypes.uint8)) is UOp.const(dtypes.uint8, 44)
        assert simplify(c(7).cast(f)) is UOp.const(f, 7.0)
        assert simplify(UOp.const(f, 0.5).cast(dtypes.bool)) is UOp.const(dtypes.bool, True)
        assert simplify(UOp.const(dtypes.bool, True).cast(I32)) is c(1)
        r = rng(4)
        assert simplify(UOp(Ops.CAST, I32, (r,))) is r  # a cast to the same dtype is a no-op


# ---------------------------------------------------------------- identities
class TestIdentities:
    def test_add_mul_div_mod(self) -> None:
        y = UOp(Ops.LOAD, I32, (UOp(Ops.DEFINE_GLOBAL, I32, (), 0), c(0)))  # an int of unknown value
        assert simplify(y + 0) is y
        assert simplify(y * 1) is y
        assert simplify(c(1) * y) is y
        assert simplify(y * 0) is c(0)
        assert simplify(y // 1) is y
        assert simplify(y % 1) is c(0)
        assert simplify(y // 0) is c(0)  # x/0 is 0, as the renderer guards it
        assert simplify(y % 0) is c(0)
        assert simplify(UOp(Ops.NEG, I32, (UOp(Ops.NEG, I32, (y,)),))) is y

    def test_where_and_and(self) -> None:
        r = rng(8)
        cond = r < 4
        a, b = r + 1, r * 2
        t, f = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)
        assert simplify(t.where(a, b)) is simplify(a)
        assert simplify(f.where(a, b)) is simplify(b)
        assert simplify(cond.where(a, a)) is simplify(a)
        assert simplify(cond.alu(Ops.AND, t)) is cond
        assert simplify(cond.alu(Ops.AND, f)) is f
        assert simplify(cond.alu(Ops.AND, cond)) is cond

    def test_max_with_ordered_ranges(self) -> None:
        r, s = rng(8), rng(4, 1)
        assert simplify((r + 8).maximum(s)) is simplify(r + 8)
        assert simplify(s.maximum(r + 4)) is simplify(r + 4)
        assert simplify(r.maximum(0)) is r

    def test_neg_of_an_int_is_a_product(self) -> None:
        r = rng(8)
        assert simplify(-r) is r * -1
        assert simplify(r - r) is c(0)


# ---------------------------------------------------------------- value ranges
class TestRangeFolding:
    def test_comparisons_that_are_always_true_or_false_fold(self) -> None:
        r, s = rng(16), rng(4, 1)
        t, f = UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, False)
        assert simplify(r < 16) is t
        assert simplify(r < 0) is f
        assert simplify(r * 4 + s < 64) is t
        assert simplify((r + 16).ne(s)) is t
        assert simplify((r + 16).eq(s)) is f
        assert simplify(r < 8).op is Ops.CMPLT

    def test_div_and_mod_by_a_larger_constant(self) -> None:
        r = rng(16)
        assert simplify(r // 16) is c(0)
        assert simplify(r % 16) is r
        assert simplify(r % 17) is r
        assert simplify((r + 3) // 32) is c(0)

    def test_where_on_a_condition_that_folds(self) -> None:
        r = rng(16)
        assert simplify((r < 16).where(r, r + 1)) is r


# ---------------------------------------------------------------- sums
class TestSums:
    def test_like_terms_merge(self) -> None:
        r, s = rng(8), rng(4, 1)
        assert simplify(r + r) is r * 2
        assert simplify(r * 2 + r * 3) is r * 5
        assert simplify(r * 2 + c(3) * r) is r * 5
        assert simplify((r + 1) + (s + 2)) is r + s + 3
        assert simplify(r + s - r) is s
        assert simplify((r * 2) * 3) is r * 6

    def test_div_mod_recombine(self) -> None:
        r = rng(64)
        assert simplify((r // 4) * 4 + r % 4) is r
        assert simplify(r % 4 + (r // 4) * 4) is r
        assert simplify((r // 4) * 12 + (r % 4) * 3) is r * 3
        y = UOp(Ops.LOAD, I32, (UOp(Ops.DEFINE_GLOBAL, I32, (), 0), c(0)))
        assert simplify((y // 4) * 4 + y % 4) is y  # C's / and % recombine for negative values too
        assert simplify((y // 0) * 0 + y % 0).op is not Ops.LOAD  # ...but not for a zero divisor

    def test_sums_are_a_fixed_point(self) -> None:
        r, s = rng(8), rng(4, 1)
        once = simplify(r * 3 + s + 7)
        assert simplify(once) is once


# ---------------------------------------------------------------- division and modulo of index expressions
class TestIndexExpressions:
    def test_split_and_merge_of_dimensions(self) -> None:
        r0, r1 = rng(8, 0), rng(4, 1)
        assert simplify((r0 * 4 + r1) // 4) is r0
        assert simplify((r0 * 4 + r1) % 4) is r1
        assert simplify((r1 + r0 * 4) // 4) is r0
        assert simplify((r0 * 4 + r1 + 8) // 4) is r0 + 2

    def test_recombine_is_the_identity(self) -> None:
        x = rng(100)
        assert simplify((x // 4) * 4 + x % 4) is x

    def test_nested_division_and_modulo(self) -> None:
        r = rng(100)
        assert simplify((r // 2) // 3) is r // 6
        assert simplify((r % 8) % 4) is r % 4
        assert simplify((r % 12) % 8).op is Ops.MOD and simplify((r % 12) % 8).src[0] is r % 12

    def test_common_factor(self) -> None:
        r = rng(100)
        assert simplify((r * 2 + 4) // 6) is (r + 2) // 3
        assert simplify((r * 2) % 6) is (r % 3) * 2

    def test_coefficient_split_into_quotient_and_remainder(self) -> None:
        r = rng(100)
        assert simplify((r * 6) // 4) is r + r // 2  # 6r = 4r + 2r
        k, o = rng(5), rng(24, 1)  # a convolution window: element o of row k of a (5, 28+1) view of a repeated row
        assert simplify((k * 29 + o) // 28) is k
        assert simplify((k * 29 + o) % 28) is k + o

    def test_partial_quotient(self) -> None:
        r0, r1 = rng(8, 0), rng(8, 1)
        assert simplify((r0 * 4 + r1) // 4) is r0 + r1 // 4
        assert simplify((r0 * 4 + r1) % 4) is r1 % 4

    def test_three_dimensional_index(self) -> None:
        a, b, d = rng(2, 0), rng(3, 1), rng(5, 2)
        flat = (a * 3 + b) * 5 + d
        assert simplify(flat // 15) is a
        assert simplify((flat // 5) % 3) is b
        assert simplify(flat % 5) is d

    def test_transposed_sum_kernel_still_computes(self) -> None:
        from glassgrad import Tensor
        out = Tensor(np.arange(12.0).reshape(3, 4)).T.sum(0).numpy()
        np.testing.assert_array_equal(out, [6.0, 22.0, 38.0])


# ---------------------------------------------------------------- deep graphs
class TestDeepGraphs:
    def test_deep_chains_simplify_without_recursion_errors(self) -> None:
        r = rng(8)
        x = r
        for i in range(5000):  # +1, -1, *1, max(., 0), //1: each five steps give r back
            x = [x + 1, x - 1, x * 1, x.maximum(c(0)), x // 1][i % 5]
        assert simplify(x) is r
        for i in range(5000):
            x = x.maximum(c(i % 5))
        assert simplify(x) is r.maximum(c(4))

    def test_long_sums(self) -> None:
        variables = [rng(2, i) for i in range(1200)]
        x = variables[0]
        for v in variables[1:]:
            x = x + v
        out = simplify(x + 0)
        assert out.vmax == 1200


# ---------------------------------------------------------------- remainders that wrap, and gated loads
class TestWrappedRemainders:
    """x % d where x = d*q + r and r may be negative: a bound on the remainder becomes a bound on r, and inside a
    load whose gate implies 0 <= r < d, x % d is r and x // d is q (how a convolution's gradient is indexed)."""

    def test_bound_on_a_window_remainder_becomes_a_bound_on_the_position(self) -> None:
        k, p = rng(5, 0), rng(24, 1)
        gate = check_simplify(((k * 24 + p) % 25) < c(20), [k, p])
        assert not any(u.op in (Ops.MOD, Ops.IDIV) for u in gate.toposort()), gate

    @given(st.integers(-40, 40), st.integers(-40, 40), st.integers(0, 60), st.integers(2, 30), st.integers(1, 30),
           st.integers(1, 8), st.integers(1, 8))
    @settings(max_examples=examples(300), deadline=None)
    def test_remainder_bounds_keep_their_value(self, a: int, b: int, k: int, d: int, bound: int, n0: int,
                                               n1: int) -> None:
        r0, r1 = rng(n0, 0), rng(n1, 1)
        check_simplify(((r0 * a + r1 * b + k) % d) < c(bound), [r0, r1])

    def _gated_load(self, idx: UOp, gate: UOp) -> UOp:
        buf = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)
        return UOp(Ops.LOAD, dtypes.float32, (buf, idx, gate))

    def check_gated(self, idx: UOp, gate: UOp, variables: list[UOp]) -> UOp:
        """The simplified load reads the same element wherever its gate holds, and has the same gate."""
        load = simplify(self._gated_load(idx, gate))
        if load.op is Ops.CONST:  # a gate that never holds
            assert not evaluate(gate, *all_assignments(variables))[gate].any()
            return load
        env, n = all_assignments(variables)
        new_gate = load.src[2] if len(load.src) == 3 else c(1, dtypes.bool)  # a gate that always holds is dropped
        before, after = evaluate(self._pair(idx, gate), env, n), evaluate(self._pair(load.src[1], new_gate), env, n)
        on = before[gate]
        np.testing.assert_array_equal(on, after[new_gate])
        np.testing.assert_array_equal(before[idx][on], after[load.src[1]][on])
        return load

    def _pair(self, idx: UOp, gate: UOp) -> UOp:
        return gate.where(idx, idx)  # one root over both, for the evaluator

    def test_the_gate_turns_the_window_index_into_a_difference(self) -> None:
        k, p = rng(5, 0), rng(24, 1)
        flat = k * 24 + p  # the gradient of a 20-wide window over 24 positions, reached through reshapes
        gate = (flat % 25) < c(20)
        load = self.check_gated((flat // 25) * 20 + flat % 25, gate, [k, p])
        assert not any(u.op in (Ops.MOD, Ops.IDIV) for u in load.src[1].toposort()), load.src[1]

    @given(st.integers(-30, 30), st.integers(-30, 30), st.integers(0, 40), st.integers(2, 26), st.integers(1, 26),
           st.integers(1, 7), st.integers(1, 7), st.integers(1, 9))
    @settings(max_examples=examples(300), deadline=None)
    def test_gated_indices_keep_their_value(self, a: int, b: int, k: int, d: int, bound: int, n0: int, n1: int,
                                            row: int) -> None:
        r0, r1 = rng(n0, 0), rng(n1, 1)
        flat = r0 * a + r1 * b + k
        gate = (c(-1) < flat).alu(Ops.AND, (flat % d) < c(bound))
        self.check_gated((flat // d) * row + flat % d, gate, [r0, r1])


@pytest.mark.parametrize("src,mid,folds", [
    (dtypes.bfloat16, dtypes.float32, True), (dtypes.float16, dtypes.float32, True),
    (dtypes.float32, dtypes.float64, True), (dtypes.int8, dtypes.int32, True), (dtypes.uint8, dtypes.int16, True),
    (dtypes.uint16, dtypes.uint32, True), (dtypes.int16, dtypes.float32, True), (dtypes.uint8, dtypes.bfloat16, True),
    (dtypes.bool, dtypes.float32, True), (dtypes.int32, dtypes.float64, True),
    (dtypes.float32, dtypes.float16, False), (dtypes.float32, dtypes.bfloat16, False),
    (dtypes.float16, dtypes.bfloat16, False), (dtypes.int32, dtypes.int8, False), (dtypes.int16, dtypes.uint8, False),
    (dtypes.int32, dtypes.float32, False), (dtypes.float32, dtypes.int32, False), (dtypes.int16, dtypes.float16, False),
])
def test_cast_round_trip_folds_only_when_exact(src: DType, mid: DType, folds: bool) -> None:
    """cast(cast(x, mid), x.dtype) is x exactly when `mid` holds every value of x's dtype (a bfloat16 value read
    as float and cast back: a tensor-core tile copy of it is then a plain load). Narrowing or lossy round trips
    stay, and numpy agrees that they lose values."""
    x = UOp(Ops.LOAD, src, (UOp(Ops.DEFINE_GLOBAL, src, (), (0, 16)), c(0)))
    out = simplify(x.cast(mid).cast(src))
    assert (out is x) == folds
    if not folds and src.fmt is not None and mid.fmt is not None:  # (numpy has no bfloat16)
        info = np.finfo(src.np) if src.is_float else np.iinfo(src.np)
        values = np.array([info.min, info.max, 1 + (info.eps if src.is_float else 0)], dtype=src.np)  # type: ignore[union-attr]
        with np.errstate(all="ignore"):
            assert not np.array_equal(values.astype(mid.np).astype(src.np), values)


# ---------------------------------------------------------------- a memo shared by the simplifications of one kernel
def test_shared_simplify_gives_what_each_simplify_gives_alone() -> None:
    """Inside `shared_simplify()` the calls share one memo (codegen simplifies each copied element's index, all
    built from the same parts): the results are the nodes each call gives alone, nested uses share the outer memo,
    and the memo is gone after the outermost exit."""
    from glassgrad.uop import symbolic
    a, b = rng(64), rng(32, 1)
    base = (a * 8 + b) // 4 + (a * 8 + b) % 4
    exprs = [base + c(i) for i in range(6)] + [(base + c(3)) % c(8), base * c(2) - base]
    alone = [simplify(e) for e in exprs]
    with symbolic.shared_simplify():
        first = symbolic._SHARED.get()
        assert first is not None
        assert [simplify(e) for e in exprs] == alone
        with symbolic.shared_simplify():
            assert symbolic._SHARED.get() is first
            assert [simplify(e) for e in reversed(exprs)] == alone[::-1]
        assert symbolic._SHARED.get() is first and simplify(base) in first.values()
    assert symbolic._SHARED.get() is None


def test_int_less_equal_is_one_comparison_and_where_reads_it_swapped() -> None:
    """Tensor's `x <= y` is `(x < y) | (x == y)`: for ints one comparison, `not (y < x)`, and a WHERE over it swaps
    its branches instead of negating (a causal mask's test per score). Floats keep both comparisons (NaN)."""
    x, y = (UOp(Ops.DEFINE_VAR, dtypes.int32, (), (n, -2**31, 2**31 - 1)) for n in ("x", "y"))
    le = x.alu(Ops.CMPLT, y).alu(Ops.OR, x.alu(Ops.CMPEQ, y))
    masked = UOp(Ops.WHERE, dtypes.float32, (le, UOp.const(dtypes.float32, 1.5), UOp.const(dtypes.float32, -math.inf)))
    out = simplify(masked)
    assert out.op is Ops.WHERE and out.src[0].op is Ops.CMPLT and out.src[0].src == (y, x)
    assert out.src[1].arg == -math.inf and out.src[2].arg == 1.5
    assert sum(u.op in GroupOp.Comparison for u in out.toposort()) == 1
    f, g = (UOp(Ops.DEFINE_VAR, dtypes.float32, (), (n, -1.0, 1.0)) for n in ("f", "g"))
    fle = simplify(f.alu(Ops.CMPLT, g).alu(Ops.OR, f.alu(Ops.CMPEQ, g)))
    assert fle.op is Ops.OR


@pytest.mark.parametrize("dtype", ["int32", "int64", "uint8", "float32"])
def test_less_equal_values_at_the_extremes(dtype: str) -> None:
    from glassgrad import Tensor
    info = np.iinfo(dtype) if dtype != "float32" else None
    vals = [info.min, info.min + 1, 0, 1, info.max - 1, info.max] if info else [-np.inf, -1.0, 0.0, 1.0, np.inf, np.nan]
    a = np.array([[v] for v in vals], dtype=dtype)
    b = np.array([vals], dtype=dtype)
    ta, tb = Tensor(a), Tensor(b)
    np.testing.assert_array_equal((ta <= tb).numpy(), a <= b)
    np.testing.assert_array_equal((ta >= tb).numpy(), a >= b)
    np.testing.assert_array_equal((ta <= tb).where(ta, tb).numpy(), np.where(a <= b, a, b))
