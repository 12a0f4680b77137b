"""Symbolic shapes: `Variable(name, min, max).bind(n)` in slices, shrink, reshape, elementwise ops and reductions.

Every result is checked against numpy at several bound values; the central promise is that one compiled kernel
serves every value (the Variable is a kernel argument, its value travels as the schedule item's `var_vals`).
Errors: binding outside the range, unbound Variables, bounds that do not fit every value, unsupported ops.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgrad import Device, Tensor, TinyJit, Variable, kernels
from glassgrad.codegen import ProgramSpec
from glassgrad.engine import realize
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops
from glassgrad.uop.sint import sint_add, sint_equal, sint_eval, sint_max, sint_mul, unbind

RNG = np.random.default_rng(0)
X = RNG.standard_normal((10, 6)).astype(np.float32)
SIZES = [1, 3, 7, 10]


@pytest.fixture
def x() -> Tensor:
    return Tensor(X).realize()


def test_variable_and_bind() -> None:
    v = Variable("i", 1, 10)
    assert v.op is Ops.DEFINE_VAR and (v.vmin, v.vmax) == (1, 10)
    b = v.bind(4)
    assert b.op is Ops.BIND and b is v.bind(4)  # hash-consed: the same binding is the same node
    assert (b.vmin, b.vmax) == (1, 10)  # a bound size still ranges over every value (the kernel serves them all)
    assert sint_eval(sint_mul(b, 3)) == 12 and sint_max(sint_mul(b, 3)) == 30
    assert sint_equal(sint_mul(b, 3), sint_mul(3, b))
    kernel_form, values = unbind(sint_mul(b, 3))
    assert values == {"i": 4} and all(u.op is not Ops.BIND for u in kernel_form.toposort())
    assert sint_eval(kernel_form, {"i": 5}) == 15 and sint_eval(sint_add(kernel_form, 2), {"i": 1}) == 5
    with pytest.raises(RuntimeError, match="needs a value for the Variable 'i'"):
        sint_eval(kernel_form)


@pytest.mark.parametrize("value", [0, 11, -1])
def test_bind_outside_the_range_is_an_error(value: int) -> None:
    with pytest.raises(ValueError, match=r"Variable 'i' takes values in \[1, 10\]; cannot bind it to"):
        Variable("i", 1, 10).bind(value)


@pytest.mark.parametrize("args, error", [
    (("1x", 1, 4), ValueError), (("data0", 1, 4), ValueError), (("start", 1, 4), ValueError),
    (("int", 1, 4), ValueError), (("n", 5, 4), ValueError), (("n", -1, 4), ValueError), (("n", 1.0, 4), TypeError)])
def test_bad_variables(args: tuple, error: type[Exception]) -> None:
    with pytest.raises(error, match="Variable"):
        Variable(*args)


def test_bind_needs_an_int() -> None:
    with pytest.raises(TypeError, match="only be bound to an int"):
        Variable("i", 1, 10).bind(2.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="for Variables"):
        Variable("i", 1, 10).bind(2).bind(3)


@pytest.mark.parametrize("n", SIZES)
def test_slice_and_shrink(x: Tensor, n: int) -> None:
    v = Variable("i", 1, 10).bind(n)
    np.testing.assert_array_equal(x[:v].numpy(), X[:n])
    np.testing.assert_array_equal(x.shrink(((0, v), None)).numpy(), X[:n])
    np.testing.assert_array_equal(x[:, :Variable("j", 1, 6).bind(min(n, 6))].numpy(), X[:, :min(n, 6)])
    assert x[:v].shape[0] is v and x[:v].shape[1] == 6


@pytest.mark.parametrize("n", [1, 4, 8])
def test_slices_with_variable_expressions(x: Tensor, n: int) -> None:
    v = Variable("i", 1, 8).bind(n)
    np.testing.assert_array_equal(x[v:v + 2].numpy(), X[n:n + 2])
    np.testing.assert_array_equal(x[1:v + 1].numpy(), X[1:n + 1])
    np.testing.assert_array_equal(x[:v][1:].numpy(), X[:n][1:])
    np.testing.assert_array_equal(x[:v][0].numpy(), X[0])
    np.testing.assert_array_equal(x[:v].flip(0).numpy(), X[:n][::-1])
    np.testing.assert_array_equal(x[:v].T.numpy(), X[:n].T)


@pytest.mark.parametrize("n", SIZES)
def test_elementwise_and_reductions(x: Tensor, n: int) -> None:
    v = Variable("i", 1, 10).bind(n)
    a, ref = x[:v], X[:n]
    np.testing.assert_allclose((a * 2 + 1).relu().numpy(), np.maximum(ref * 2 + 1, 0), rtol=1e-6)
    np.testing.assert_allclose(a.sum().numpy(), ref.sum(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a.sum(axis=0).numpy(), ref.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.sum(axis=1).numpy(), ref.sum(1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.mean().numpy(), ref.mean(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(a.mean(axis=0).numpy(), ref.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a.max(axis=0).numpy(), ref.max(0))
    np.testing.assert_array_equal(a.min().numpy(), ref.min())
    np.testing.assert_allclose(a.var(axis=0).numpy(), ref.var(0, ddof=1) if n > 1 else np.full(6, np.nan), rtol=1e-4,
                               atol=1e-6)
    np.testing.assert_allclose(a.std().numpy(), ref.std(ddof=1), rtol=1e-4)
    e = np.exp(ref - ref.max(0))
    np.testing.assert_allclose(a.softmax(axis=0).numpy(), e / e.sum(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose((a @ Tensor(X[:6, :4])).numpy(), ref @ X[:6, :4], rtol=1e-5, atol=1e-5)


def test_two_variables(x: Tensor) -> None:
    rows, cols = Variable("rows", 1, 10), Variable("cols", 1, 6)
    for n, m in [(2, 5), (9, 1), (10, 6)]:
        a = x[:rows.bind(n), :cols.bind(m)]
        np.testing.assert_allclose((a + a).sum(axis=1).numpy(), (X[:n, :m] * 2).sum(1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 5, 10])
def test_symbolic_reshape(n: int) -> None:
    flat = Tensor(X.reshape(-1)).realize()
    v = Variable("i", 1, 10).bind(n)
    rows = flat[:v * 6].reshape(v, 6)
    np.testing.assert_array_equal(rows.numpy(), X[:n])
    np.testing.assert_array_equal(rows.reshape(v * 6).numpy(), X[:n].reshape(-1))
    np.testing.assert_allclose(rows.reshape(v, 2, 3).sum(axis=2).numpy(), X[:n].reshape(n, 2, 3).sum(2), rtol=1e-6,
                               atol=1e-6)
    np.testing.assert_array_equal(rows.reshape(v, 6, 1).numpy(), X[:n, :, None])


def test_mismatched_symbolic_reshape_is_an_error(x: Tensor) -> None:
    v = Variable("i", 1, 10).bind(3)
    with pytest.raises(ValueError, match=r"cannot reshape symbolic shape \(i=3, 6\) into \(i=3, 5\)"):
        x[:v].reshape(v, 5)
    with pytest.raises(ValueError, match="no -1"):
        x[:v].reshape(-1)


@pytest.mark.parametrize("n", [2, 9])
def test_realized_symbolic_tensor(x: Tensor, n: int) -> None:
    v = Variable("i", 1, 10).bind(n)
    a = (x[:v] * 3).realize()
    buf = a.uop.base.arg[0]
    assert buf.size == 10 * 6  # sized for the largest value
    np.testing.assert_allclose(a.numpy(), X[:n] * 3, rtol=1e-6)
    np.testing.assert_allclose((a + 1).sum(axis=1).numpy(), (X[:n] * 3 + 1).sum(1), rtol=1e-5, atol=1e-5)
    assert a.tolist() == (X[:n] * 3).tolist()


@pytest.mark.usefixtures("literal_constants")
def test_one_kernel_serves_every_size(x: Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    """Realizing with the Variable bound to 3 and then to 7 compiles one kernel; both results are right."""
    v = Variable("once", 1, 10)  # a name no other test uses: its kernel is not in the cache yet
    outs = [(x[:v.bind(n)] * 2).sum(axis=1) for n in (3, 7)]
    items = [create_schedule([o.uop])[0] for o in outs]
    assert [len(i) for i in items] == [1, 1]
    assert items[0][0].ast is items[1][0].ast  # the same kernel AST: the size is a DEFINE_VAR, not a constant
    assert [i[0].var_vals for i in items] == [{"once": 3}, {"once": 7}]
    compiler = Device[x.device].compiler
    sources: list[str] = []
    compile_cached = compiler.compile_cached
    monkeypatch.setattr(compiler, "compile_cached", lambda src: sources.append(src) or compile_cached(src))
    cached = len(realize._kernel_cache)
    for out, n in zip(outs, (3, 7)):
        np.testing.assert_allclose(out.numpy(), (X[:n] * 2).sum(1), rtol=1e-5, atol=1e-6)
    assert len(sources) == 1 and len(realize._kernel_cache) == cached + 1
    for n in (1, 10):  # and it keeps serving: no compile for other values
        np.testing.assert_allclose((x[:v.bind(n)] * 2).sum(axis=1).numpy(), (X[:n] * 2).sum(1), rtol=1e-5, atol=1e-6)
    assert len(sources) == 1


def test_kernel_takes_the_variable_as_an_int_argument(x: Tensor) -> None:
    (spec,) = kernels(x[:Variable("i", 1, 10).bind(4)].sum(axis=1), device="CPU")
    assert spec.vars == ("i",) and spec.name == "r_i_6"
    assert "const int i, long long start, long long end)" in spec.source
    launch = spec.at({"i": 4})
    assert launch.global_size == (4,) and launch.work == 4 * 6 and launch.flops == 4 * 6
    with pytest.raises(RuntimeError, match=r"needs values for the Variables \['i'\]"):
        spec.at({})


def _gpu_kernels(n: int, device: str) -> list[ProgramSpec]:
    """Symbolic kernels of every GPU shape: flat elementwise, per-thread reduction, grouped reductions (over a
    symbolic length, and a constant one into a symbolic number of groups: the Variable only sizes the grid)."""
    big, wide = Tensor.empty(2000, 6), Tensor.empty(2000, 512)
    v = Variable("i", 1, 2000).bind(n)
    rows = Tensor.empty(2, 2000)
    outs = [big[:v] * 2, big[:v].sum(axis=0), big[:v].sum(axis=1), big[:v].sum(), big[:v].softmax(0),
            big[:v].softmax(1), rows[:, :v].sum(axis=1), rows[:, :v].softmax(1), Tensor.zeros(2, v).sum(axis=1),
            wide[:v].sum(axis=1)]
    return [spec for o in outs for spec in kernels(o, device=device)]


@pytest.mark.parametrize("n", [1, 300, 2000])
@pytest.mark.usefixtures("literal_constants")
def test_gpu_kernels_take_the_variable(n: int) -> None:
    cuda, metal = _gpu_kernels(n, "CUDA"), _gpu_kernels(n, "METAL")
    assert all(s.vars == ("i",) and "const int i)" in s.source for s in cuda)
    assert all(s.vars == ("i",) and "constant int& i [[buffer(" in s.source for s in metal)
    flat = cuda[0]  # one thread per element, a grid evaluated at launch, the real count checked in the kernel
    assert flat.at({"i": n}).global_size == ((n * 6 + 255) // 256, 1, 1) and "if (gidx0 >= (i * 6)) return;" in \
        flat.source
    assert cuda[-1].at({"i": n}).global_size == (n, 1, 1)  # one group per row


def test_gpu_kernels_compile_with_nvrtc(nvrtc: Any) -> None:
    for spec in _gpu_kernels(7, "CUDA"):
        assert nvrtc.compile(spec.source).startswith(b"\x7fELF"), spec.source


@pytest.mark.parametrize("make, error, match", [
    (lambda x: x[:Variable("i", 1, 10)], ValueError, "Variable i is not bound"),
    (lambda x: x.shrink(((0, Variable("i", 1, 11).bind(3)), None)), ValueError, "do not fit dimension 10"),
    (lambda x: x[Variable("i", 0, 10).bind(3):Variable("i", 0, 10).bind(3) + 1], ValueError, "do not fit"),
    (lambda x: x[:Variable("i", 1, 10).bind(3):2], IndexError, "step 1"),
    (lambda x: x[:Variable("i", 1, 10).bind(3)][-1], IndexError, "must be in"),
    (lambda x: x[:Variable("i", 1, 10).bind(3)][3], IndexError, "must be in"),
    (lambda x: x.pad(((0, Variable("i", 1, 10).bind(3)), None), mode="reflect"), NotImplementedError, "constant"),
    (lambda x: x.pad(((0, 2 - Variable("i", 1, 10).bind(3)), None)), ValueError, "negative for some values"),
    (lambda x: x.pad(((-1, Variable("i", 1, 10).bind(3)), None)), NotImplementedError, "negative"),
    (lambda x: Tensor.zeros(10, 6)[:Variable("i", 1, 10).bind(3)].assign(x[:3]), NotImplementedError, "assign with"),
    (lambda x: x[:Variable("i", 1, 10).bind(3)][[0, 1]], NotImplementedError, "indexing a symbolic"),
    (lambda x: Tensor.rand(Variable("i", 1, 10).bind(3)), NotImplementedError, "only supported by full/zeros/ones"),
    (lambda x: Tensor.empty(Variable("i", 1, 10).bind(3), 2), NotImplementedError, "only supported by full"),
    (lambda x: x[:Variable("i", 1, 10).bind(3)].argmax(0), NotImplementedError, "arange"),
])
def test_unsupported_and_wrong_uses_are_clear_errors(x: Tensor, make, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make(x)


@pytest.mark.parametrize("n", [1, 4, 10])
def test_symbolic_cat_and_pad_against_numpy(x: Tensor, n: int) -> None:
    """cat along a symbolic dim and pad by symbolic amounts (used to raise NotImplementedError): the values of a
    symbolic-length slice joined to the whole, then padded back to a fixed length."""
    v = Variable("i", 1, 10).bind(n)
    data = x.numpy()
    joined = x[:v].cat(x * 2)
    assert sint_eval(joined.shape[0]) == n + 10
    np.testing.assert_array_equal(joined.numpy(), np.concatenate([data[:n], data * 2]))
    padded = joined.pad(((1, 20 - v), None), value=-1.0)
    assert padded.shape == (31, 6)
    expect = np.full((31, 6), -1.0, np.float32)
    expect[1:n + 11] = np.concatenate([data[:n], data * 2])
    np.testing.assert_array_equal(padded.numpy(), expect)


def test_a_variable_bound_to_two_values_in_one_kernel_is_an_error(x: Tensor) -> None:
    v = Variable("i", 1, 10)
    with pytest.raises(ValueError, match="bound to two values"):
        (x[:v.bind(3)].sum() + x[:v.bind(4)].sum()).realize()
    with pytest.raises(ValueError, match="two different Variables are named 'i'"):
        (x[:v.bind(3)].sum() + x[:Variable("i", 1, 9).bind(3)].sum()).realize()


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 10), lo=st.integers(0, 3), axis=st.sampled_from([None, 0, 1]))
def test_random_bounds_against_numpy(n: int, lo: int, axis: int | None) -> None:
    """Slices [lo, lo+n) of a (13, 6) tensor, reduced along a random axis, for any n the Variable allows."""
    data = np.arange(13 * 6, dtype=np.float32).reshape(13, 6) % 7
    v = Variable("n", 1, 10).bind(n)
    out = (Tensor(data)[lo:lo + v] * 2 - 1).sum(axis=axis)
    np.testing.assert_array_equal(out.numpy(), (data[lo:lo + n] * 2 - 1).sum(axis=axis))


@pytest.mark.parametrize("n", [1, 6, 10])
def test_full_zeros_ones_of_a_symbolic_shape(x: Tensor, n: int) -> None:
    v = Variable("i", 1, 10).bind(n)
    np.testing.assert_array_equal((Tensor.ones(v, 6) + x[:v]).numpy(), 1 + X[:n])
    np.testing.assert_array_equal(Tensor.full(v, 7).numpy(), np.full(n, 7))
    np.testing.assert_array_equal(Tensor.zeros(2, v).sum(axis=1).numpy(), np.zeros(2))


@pytest.mark.parametrize("n", [1, 6, 10])
def test_pad_of_a_symbolic_shape(x: Tensor, n: int) -> None:
    v = Variable("i", 1, 10).bind(n)
    np.testing.assert_array_equal(x[:v].pad(((1, 2), (0, 1))).numpy(), np.pad(X[:n], ((1, 2), (0, 1))))
    np.testing.assert_array_equal(x[:v].pad(((1, 0), None), value=5.0).numpy(),
                                  np.pad(X[:n], ((1, 0), (0, 0)), constant_values=5.0))


@pytest.mark.parametrize("n", [1, 6, 10])
def test_gradient_through_a_symbolic_shrink(n: int) -> None:
    """d/dx sum(x[:v] * w[:v]) is w in the first n rows and 0 below: the shrink's gradient pads by 10 - v."""
    x = Tensor(X, requires_grad=True)
    w = Tensor(X * 2 + 1)
    v = Variable("i", 1, 10).bind(n)
    (x[:v] * w[:v]).sum().backward()
    assert x.grad is not None and x.grad.shape == (10, 6)
    expected = np.zeros_like(X)
    expected[:n] = X[:n] * 2 + 1
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_tinyjit_with_a_symbolic_tensor_argument() -> None:
    """A bound Variable in a tensor argument's shape is keyed on its unbound form: one capture serves every value,
    its replays pass each call's value as the kernels' int argument."""
    v = Variable("pos", 1, 10)
    body_calls = 0

    def step(x: Tensor) -> Tensor:
        nonlocal body_calls
        body_calls += 1
        return (x * 2).sum(axis=1)

    jitted = TinyJit(step)
    for n in (3, 3, 3, 3, 7, 7, 7, 3, 10, 1):
        data = RNG.standard_normal((10, 6)).astype(np.float32)
        full = Tensor(data).realize()
        out = jitted(full[:v.bind(n)].contiguous())
        assert out.shape == (v.bind(n),)
        np.testing.assert_allclose(out.numpy(), (data[:n] * 2).sum(1), rtol=1e-5, atol=1e-5)
    assert jitted.captures == 1 and body_calls == 2  # eager, capture, then replays for every value


def test_tinyjit_one_capture_for_every_value_of_a_variable_argument() -> None:
    """A function over x[:v], v passed bound to 3, 5, 7, 2: numpy's results each time, from one capture (the body runs
    twice: eagerly, then captured), and no kernel compiled after the first call."""
    v = Variable("n", 1, 10)
    body_calls = 0
    rendered: list[object] = []
    render = realize._render

    def counting_render(device: str, ast: object) -> ProgramSpec:
        rendered.append(ast)
        return render(device, ast)  # type: ignore[arg-type]

    def step(x: Tensor, n: object) -> tuple[Tensor, Tensor]:
        nonlocal body_calls
        body_calls += 1
        head = x[:n]
        return (head * 2 + 1).sum(axis=1), (head.exp() * 0.5).mean()

    jitted = TinyJit(step)
    realize._render = counting_render  # type: ignore[assignment]
    try:
        for i, n in enumerate((3, 5, 7, 2)):
            data = RNG.standard_normal((10, 6)).astype(np.float32)
            rows, mean = jitted(Tensor(data).realize(), v.bind(n))
            assert rows.shape == (v.bind(n),)
            np.testing.assert_allclose(rows.numpy(), (data[:n] * 2 + 1).sum(1), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(mean.numpy(), (np.exp(data[:n]) * 0.5).mean(), rtol=1e-5)
            if i == 0:
                first_call = len(rendered)
    finally:
        realize._render = render  # type: ignore[assignment]
    assert body_calls == 2 and jitted.captures == 1
    assert len(rendered) == first_call and len(set(map(id, rendered))) == len(rendered)


def test_tinyjit_refuses_a_variable_bound_to_two_values_in_one_call() -> None:
    from glassgrad.engine.jit import JitError
    v = Variable("k", 1, 10)
    jitted = TinyJit(lambda x, n: x[:n].sum())
    x = Tensor(X).realize()
    with pytest.raises(JitError, match="'k' is bound to 4 and 3"):
        jitted(x[:v.bind(4)].contiguous(), v.bind(3))


def test_index_by_a_bound_variable() -> None:
    """`t[v]` (tinygrad's stunning_mnist: `X_samp[vi.bind(i)]`) selects like an int: values, a later dim, the
    gradient into the selected row, and a range that does not fit the dim is refused."""
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = Variable("row", 0, 3)
    for i in range(4):
        np.testing.assert_array_equal(Tensor(a)[v.bind(i)].numpy(), a[i])
        np.testing.assert_array_equal(Tensor(a)[v.bind(i), 2:4].numpy(), a[i, 2:4])
        np.testing.assert_array_equal(Tensor(a)[:, v.bind(i)].numpy(), a[:, i])
    w = Tensor(a, requires_grad=True)
    (w[v.bind(2)] * 2).sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), np.where(np.arange(4)[:, None] == 2, 2.0, 0.0) * np.ones((4, 6)))
    with pytest.raises(ValueError, match="do not fit"):
        Tensor(a)[Variable("far", 0, 5).bind(1)]


def test_arange_to_a_symbolic_stop_and_a_causal_mask() -> None:
    """gpt2.py's mask: `Tensor.full((1, 1, n, start_pos + n), -inf).triu(start_pos + 1)` with start_pos a bound
    Variable: arange up to a symbolic stop (the arange of the largest count, shrunk), triu with a symbolic size
    and diagonal. Values for several bindings against numpy."""
    v = Variable("start_pos", 0, 10)
    for n in (0, 3, 7):
        b = v.bind(n)
        np.testing.assert_array_equal(Tensor.arange(b + 2).numpy(), np.arange(n + 2))
        np.testing.assert_array_equal(Tensor.arange(1, b + 3, 2).numpy(), np.arange(1, n + 3, 2))
        mask = Tensor.full((1, 1, 2, b + 2), float("-inf")).triu(b + 1).numpy()
        np.testing.assert_array_equal(mask, np.triu(np.full((1, 1, 2, n + 2), -np.inf), n + 1))
    with pytest.raises(NotImplementedError, match="int step > 0"):
        Tensor.arange(0, v.bind(3), 0.5)


def test_a_max_under_a_causal_mask_over_a_symbolic_row() -> None:
    """`where(causal, s, -inf).max(-1)` with a batch and a symbolic row length: the CPU kernel wrote the masked value
    out in each of its four uses in the max's SIMD loop, and gcc 12 (-march=x86-64-v3) vectorised that into NaN
    flags where no NaN was (rows of 9 or more came out NaN). Values as numpy's."""
    s = RNG.standard_normal((2, 40, 40)).astype(np.float32)
    for n in (3, 17, 40):
        v = Variable("i", 1, 40).bind(n)
        causal = Tensor.arange(v).reshape(v, 1) >= Tensor.arange(v).reshape(1, v)
        out = causal.where(Tensor(s)[:, :v, :v], -np.inf).max(-1).numpy()
        np.testing.assert_array_equal(out, np.where(np.tril(np.ones((n, n), bool)), s[:, :n, :n], -np.inf).max(-1))


def test_causal_attention_over_a_symbolic_length() -> None:
    """`scaled_dot_product_attention(is_causal=True)` with query and key of a symbolic length (a prompt of varying
    length): the causal mask's reshape used -1, which a symbolic reshape refuses (ValueError). Values as numpy's."""
    q, k, w = (RNG.standard_normal((2, 40, 64)).astype(np.float32) for _ in range(3))
    for n in (3, 17, 40):
        v = Variable("i", 1, 40).bind(n)
        out = Tensor(q)[:, :v].scaled_dot_product_attention(Tensor(k)[:, :v], Tensor(w)[:, :v], is_causal=True)
        scores = np.where(np.tril(np.ones((n, n), bool)), q[:, :n] @ k[:, :n].transpose(0, 2, 1) / 8, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        np.testing.assert_allclose(out.numpy(), p / p.sum(-1, keepdims=True) @ w[:, :n], rtol=1e-4, atol=1e-5)


def test_tinyjit_leaves_a_symbolic_input_in_its_own_buffer() -> None:
    """The JIT copies an input that shares its buffer into one of its own before the capture; a symbolic-shaped
    input must not be copied (its copy was a Buffer sized by a symbolic expression: this call's value only, and a
    later replay wrote past it; the test suite crashed in the garbage collector)."""
    import gc

    from glassgrad.device import Buffer
    v = Variable("pos", 1, 10)
    jitted = TinyJit(lambda x: (x * 2).sum(axis=1))
    for n in (3, 3, 3, 7, 10):
        full = Tensor(np.ones((10, 6), np.float32)).realize()
        np.testing.assert_allclose(jitted(full[:v.bind(n)].contiguous()).numpy(), np.full(n, 12.0, np.float32))
    assert all(isinstance(b.size, int) for b in gc.get_objects() if type(b) is Buffer)
