"""Float constants as kernel parameters (glassgrad/uop/params.py): a loop that changes a Python number builds one
kernel, and every value computes what the literal would (the float32's exact bits), on every backend's renderer."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_ops import DEVICE

from glassgrad import Tensor, TinyJit, Variable, dtypes
from glassgrad.codegen import get_program
from glassgrad.device import Device
from glassgrad.engine import realize
from glassgrad.helpers import Context
from glassgrad.renderer.cuda import CUDARenderer
from glassgrad.renderer.metal import MetalRenderer
from glassgrad.schedule import SCHEDULE_CACHE, create_schedule
from glassgrad.uop.params import PARAM_PREFIX, float_bits, lift_constants

RNG = np.random.default_rng(0)
X = RNG.standard_normal((33, 65), dtype=np.float32)
# values a user's loop produces: ordinary, negative, tiny, huge, subnormal, and integers (`x + i`)
VALUES = [0.37, -2.5, 1e-30, 3.4e38, 1e-42, 3.0, 7.0, -1e-7]


def assert_float32_equal(got: np.ndarray, want: np.ndarray) -> None:
    """numpy's float32 values: to the bit on the CPU (its C is built with -ffp-contract=off); elsewhere a GPU compiler
    fuses a * b + c into one FMA (one rounding where numpy has two), so within a few ulps of the operands."""
    if DEVICE == "CPU":
        np.testing.assert_array_equal(got, want)
    else:
        scale = max(1.0, float(np.nanmax(np.abs(want), initial=0)))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * scale)


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sources the default device's compiler builds from now on."""
    compiler = Device[DEVICE].compiler
    sources: list[str] = []
    for name in ("compile_cached", "compile_cached_many"):
        original = getattr(compiler, name)
        monkeypatch.setattr(compiler, name, lambda src, original=original: sources.append(src) or original(src))
    return sources


def test_a_changing_python_float_builds_one_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """`(x * s + i).relu()` with s and i changing every step: the first step compiles, no later one does,
    and each step's values are numpy's in float32 (the same multiply and add, to the bit)."""
    x = Tensor(X, device=DEVICE).realize()
    (x * 0.123 + 0.5).relu().numpy()  # (the kernel of this structure, built once)
    sources = _compiles(monkeypatch)
    for i, s in enumerate(VALUES):
        got = (x * s + (i + 2)).relu().numpy()
        with np.errstate(over="ignore"):
            want = np.maximum(X * np.float32(s) + np.float32(i + 2), 0)
        assert_float32_equal(got, want)
    assert sources == [], f"{len(sources)} kernels compiled for new constants"


def test_parameters_hold_the_constants_bits() -> None:
    """Equal constants share one parameter; each parameter's value is its float32's bits."""
    x = Tensor(X, device=DEVICE).realize()
    (item,) = create_schedule([(x * 0.37 + 0.37).maximum(-2.5).uop])[0]
    params = {k: v for k, v in item.var_vals.items() if k.startswith(PARAM_PREFIX)}
    assert sorted(params.values()) == sorted([float_bits(0.37), float_bits(-2.5)])
    assert float_bits(-2.5) < 0 and float_bits(1e-42) == 714  # (signed 32-bit; a subnormal keeps its bits)


@pytest.mark.parametrize("special", [0.0, 1.0, -1.0, math.inf, -math.inf, math.nan])
def test_special_constants_stay_literals(special: float) -> None:
    """0, ±1, ±inf and NaN stay in the kernel's source: the simplifier's identities and a mask's -inf read them."""
    x = Tensor(X, device=DEVICE).realize()
    (item,) = create_schedule([(x.maximum(special) * 3.5).uop])[0]
    assert [k for k in item.var_vals if k.startswith(PARAM_PREFIX)] == [PARAM_PREFIX + "0"]  # 3.5 only
    with np.errstate(invalid="ignore"):
        want = np.maximum(X, np.float32(special)) * np.float32(3.5)
    np.testing.assert_array_equal((Tensor(X, device=DEVICE).maximum(special) * 3.5).numpy(), want)


def test_other_dtypes_keep_literals() -> None:
    """Only float32 constants are lifted: an int's, a half's and a double's stay in the source."""
    for dtype in (dtypes.int32, dtypes.float16):
        t = Tensor(np.arange(12).reshape(3, 4), device=DEVICE).cast(dtype)
        (item,) = create_schedule([(t * 3 + 5).uop])[0][-1:]
        assert not any(k.startswith(PARAM_PREFIX) for k in item.var_vals), dtype
        np.testing.assert_array_equal((t * 3 + 5).numpy(), np.arange(12).reshape(3, 4) * 3 + 5)


def test_symbolic_size_and_constants_in_one_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bound Variable (a size) and lifted constants are both int parameters: one kernel for every value of each."""
    x = Tensor(X, device=DEVICE).realize()
    v = Variable("rows_cp", 1, 33)
    (x[:v.bind(5)] * 0.25 + 1.5).sum(1).numpy()
    sources = _compiles(monkeypatch)
    for n, s in [(3, 0.37), (33, -4.0), (1, 2.75)]:
        got = (x[:v.bind(n)] * s + 1.5).sum(1).numpy()
        np.testing.assert_allclose(got, (X[:n] * np.float32(s) + np.float32(1.5)).sum(1), rtol=1e-5, atol=1e-5)
    assert sources == []


def test_jit_replays_the_captured_constants() -> None:
    """A TinyJit step with a constant inside (an SGD step's learning rate) replays it; one with the Python float as
    an argument gives each call's value."""
    w_np = X[:4, :8].copy()
    w = Tensor(w_np, device=DEVICE).realize()

    @TinyJit
    def step(g: Tensor) -> Tensor:
        w.assign(w - 0.05 * g).realize()
        return w

    expected = w_np.copy()
    for k in range(4):
        g_np = np.full((4, 8), k + 1, np.float32)
        step(Tensor(g_np, device=DEVICE))
        expected = expected - np.float32(0.05) * g_np
        np.testing.assert_allclose(w.numpy(), expected, rtol=1e-6)

    @TinyJit
    def scaled(x: Tensor, s: float) -> Tensor:
        return (x * s).realize()

    x = Tensor(X, device=DEVICE).realize()
    for s in [1.5, 2.5, -0.3, 4.0]:
        assert_float32_equal(scaled(x, s).numpy(), X * np.float32(s))


def test_beam_searches_a_kernel_with_parameters() -> None:
    """BEAM times candidates with test values for the parameters and keeps one that computes the right thing."""
    with Context(BEAM=1, IGNORE_BEAM_CACHE=1):
        got = (Tensor(X, device=DEVICE) * 0.61 - 0.25).exp().sum(0).numpy()
    np.testing.assert_allclose(got, np.exp(X * np.float32(0.61) - np.float32(0.25)).sum(0), rtol=1e-5)


def test_nested_reductions_keep_literals() -> None:
    """A kernel whose reduction runs inside another's loop (flash attention's chained kernels, whose mask proofs read
    constants) keeps them as literals; a softmax (a max, then a sum over a loop of its own) lifts them."""
    q = Tensor(RNG.standard_normal((1, 2, 64, 16), dtype=np.float32), device=DEVICE)
    with Context(FLASH_ATTENTION=1):
        schedule, _ = create_schedule([q.scaled_dot_product_attention(q, q, is_causal=True).uop])
    nested = [i for i in schedule if realize.NOT_KERNELS and i.ast.op.name == "SINK" and
              any(r.op.name == "REDUCE" and any(n.op.name == "REDUCE" and n is not r for n in r.src[0].toposort())
                  for r in i.ast.toposort())]
    assert nested and all(not any(k.startswith(PARAM_PREFIX) for k in i.var_vals) for i in nested)
    softmax, _ = create_schedule([Tensor(X, device=DEVICE).softmax(1).uop])
    assert any(k.startswith(PARAM_PREFIX) for i in softmax for k in i.var_vals)


def test_lift_constants_off() -> None:
    with Context(LIFT_CONSTANTS=0):
        (item,) = create_schedule([(Tensor(X, device=DEVICE) * 0.37).uop])[0]
    assert item.var_vals == {}


def test_a_variable_cannot_take_a_parameters_name() -> None:
    with pytest.raises(ValueError, match="reserved"):
        Variable(PARAM_PREFIX + "0", 1, 10)


def _lifted_ast() -> tuple[Any, dict[str, int]]:
    u = (Tensor.empty(64, 64, device="CPU") * 0.37 + 2.5).exp().sum(1).uop
    with Context(LIFT_CONSTANTS=0):
        literal = create_schedule([u])[0][-1].ast
    return lift_constants(literal)


def test_gpu_renderers_take_parameters_as_ints(nvrtc: Any) -> None:
    """CUDA: each parameter is an int argument reinterpreted as a float; the source compiles for sm_90."""
    ast, params = _lifted_ast()
    spec = get_program(ast, CUDARenderer(), None)
    assert spec.vars == tuple(sorted(params)) and "const int gg_const0" in spec.source
    assert "gg_bitcast<float>(gg_const0)" in spec.source
    nvrtc.compile(spec.source)


def test_metal_renders_parameters() -> None:
    ast, params = _lifted_ast()
    spec = get_program(ast, MetalRenderer(), None)
    assert spec.vars == tuple(sorted(params)) and "as_type<float>" in spec.source


def test_room_limits_the_parameters() -> None:
    """Where a device limits a kernel's arguments (Metal: 31 for buffers, Variables and parameters), the constants
    past the room stay literals; the first ones in the AST's order are lifted."""
    ast, params = _lifted_ast()
    with Context(LIFT_CONSTANTS=0):
        literal = create_schedule([(Tensor.empty(64, 64, device="CPU") * 0.37 + 2.5).exp().sum(1).uop])[0][-1].ast
    assert len(params) >= 2
    some, few = lift_constants(literal, room=1)
    assert len(few) == 1 and lift_constants(literal, room=0) == (literal, {})
    assert sum(u.op.name == "CONST" and u.dtype == dtypes.float32 for u in some.toposort()) >= 1


FLOATS = st.floats(width=32, allow_nan=False, allow_infinity=False)
OPS = ["add", "sub", "rsub", "mul", "maximum", "minimum", "where"]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(OPS), FLOATS), min_size=1, max_size=6))
def test_lifted_chains_are_numpy_to_the_bit(chain: list[tuple[str, float]]) -> None:
    """Chains of exactly rounded float32 ops with random constants (subnormal, huge, negative, integral): each
    result is what the literal kernel gives, bit for bit (numpy's, on the CPU)."""
    _check_chain(chain, 1.0)


def _chain(chain: list[tuple[str, float]], scale: float) -> tuple[Tensor, np.ndarray]:
    x_np = X[:3, :17]
    got, want = Tensor(x_np, device=DEVICE), x_np.copy()
    with np.errstate(all="ignore"):
        for op, c in chain:
            c = float(np.float32(c * scale))
            c32 = np.float32(c)
            if op == "add":
                got, want = got + c, want + c32
            elif op == "sub":
                got, want = got - c, want - c32
            elif op == "rsub":
                got, want = c - got, c32 - want
            elif op == "mul":
                got, want = got * c, want * c32
            elif op == "maximum":
                got, want = got.maximum(c), np.maximum(want, c32)
            elif op == "minimum":
                got, want = got.minimum(c), np.minimum(want, c32)
            else:
                got, want = (got > c).where(got, c), np.where(want > c32, want, c32)
    return got, want.astype(np.float32)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(OPS), st.floats(-1e6, 1e6, width=32)), min_size=1, max_size=6),
       st.sampled_from([0.5, -3.0, 1.25, 7.0]))
def test_the_schedule_of_one_structure_serves_other_values(chain: list[tuple[str, float]], scale: float) -> None:
    """The same chain with other constants (from the third set, a schedule-cache hit: `param_slots` give each
    parameter its graph constant's new value): numpy's values, bit for bit."""
    for s in (1.0, scale, 2.5 * scale):  # (the third: a hit on the template the second made, when one serves all)
        _check_chain(chain, s)


def _check_chain(chain: list[tuple[str, float]], scale: float) -> None:
    """The chain's values: numpy's to the bit on the CPU; elsewhere (FMA contraction), the literal kernels' values,
    to the bit."""
    got, want = _chain(chain, scale)
    if DEVICE == "CPU":
        np.testing.assert_array_equal(got.numpy(), want)
    else:
        with Context(LIFT_CONSTANTS=0):
            literal, _ = _chain(chain, scale)
            expected = literal.numpy()
        np.testing.assert_array_equal(got.numpy(), expected)


def test_a_new_value_hits_the_schedule_cache() -> None:
    """From the third value on, a step is a schedule-cache hit: no scheduling, no codegen. (The first value's
    schedule is cached for that value; the second probes whether one schedule serves every value.)"""
    x = Tensor(X, device=DEVICE).realize()
    hits = SCHEDULE_CACHE.hits
    for s in (0.3, 0.31, -2.0, 5.5, 0.3):
        np.testing.assert_allclose((x * s - 0.7).exp().numpy(), np.exp(X * np.float32(s) - np.float32(0.7)),
                                   rtol=1e-5)  # (a GPU's exp2f is within 2 ulps)
    assert SCHEDULE_CACHE.hits == hits + 3


def test_a_constant_equal_to_a_structures_constant_is_kept_apart() -> None:
    """`(x * c).mean()` with c = 1/n, the mean's own constant: in the first schedule the two are one parameter. The
    probe schedule tells them apart, so the structure is cached per value and c = 0.5 next gives c's answer."""
    x_np = X[:8, :8]
    x = Tensor(x_np, device=DEVICE).realize()
    for c in (1 / 64, 0.5, 1 / 64, 3.0):
        np.testing.assert_allclose((x * c).mean().numpy(), (x_np * np.float32(c)).mean(), rtol=1e-5, atol=1e-7)


def test_flash_kernels_are_cached_per_value() -> None:
    """Chained kernels keep their constants as literals, so attention with another scale is another schedule."""
    q_np = RNG.standard_normal((1, 2, 64, 16), dtype=np.float32)
    q = Tensor(q_np, device=DEVICE).realize()
    for scale in (0.25, 0.125, 0.3):
        with Context(FLASH_ATTENTION=1):
            got = q.scaled_dot_product_attention(q, q, is_causal=True, scale=scale).numpy()
        s = q_np @ q_np.transpose(0, 1, 3, 2) * scale + np.triu(np.full((64, 64), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(got, (p / p.sum(-1, keepdims=True)) @ q_np, rtol=1e-4, atol=1e-5)


def test_a_jit_capture_on_a_hit_takes_the_new_values() -> None:
    """A TinyJit captures the items of a schedule-cache hit whose constants differ from the cached schedule's."""
    x = Tensor(X, device=DEVICE).realize()
    (x * 0.3 + 0.2).realize()  # the structure, cached with 0.3 and 0.2

    @TinyJit
    def f(t: Tensor) -> Tensor:
        return (t * 0.7 + 0.9).realize()

    for _ in range(4):
        assert_float32_equal(f(x).numpy(), X * np.float32(0.7) + np.float32(0.9))
