"""Behaviours that tinygrad's own unit tests (test/backend/test_tensor.py, test_nn.py, test_optim.py, test_jit.py,
test/unit/*.py of the snapshot) found wrong or missing here, each checked against numpy and, when it is importable,
PyTorch. docs/TINYGRAD_PARITY.md "tinygrad's unit tests" lists the files run and their outcome."""
from __future__ import annotations

import numpy as np
import pytest
from torch_optional import torch

from glassgrad import Tensor


# ---------------------------------------------------------------------- gradient leaves are their own nodes
def test_equal_constant_leaves_get_their_own_gradients() -> None:
    """Two `Tensor.zeros(3, requires_grad=True)` were one (hash-consed) node, so each got the sum of both
    gradients: w.grad and b.grad were both x + 1."""
    x_np = np.array([1.0, 2.0, 3.0], np.float32)
    w = Tensor.zeros(3, requires_grad=True)
    b = Tensor.zeros(3, requires_grad=True)
    (w * Tensor(x_np) + b).sum().backward()
    assert w.grad is not None and b.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), x_np)
    np.testing.assert_allclose(b.grad.numpy(), np.ones(3, np.float32))
    if torch is not None:
        tw, tb = torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)
        (tw * torch.tensor(x_np) + tb).sum().backward()
        np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy())
        np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy())


@pytest.mark.parametrize("make", [lambda: Tensor(3.5, requires_grad=True),
                                  lambda: Tensor.full((), 3.5, requires_grad=True),
                                  lambda: Tensor.ones(()).mul(3.5).requires_grad_()])
def test_equal_scalar_leaves_each_get_one(make) -> None:  # type: ignore[no-untyped-def]
    """tinygrad's test_const_backward_pass with PyTorch's requires_grad: d(w1 + w2)/dw1 = 1, not 2."""
    w1, w2 = make(), make()
    w1.add(w2).backward()
    assert w1.grad is not None and w2.grad is not None
    assert (w1.grad.item(), w2.grad.item()) == (1.0, 1.0)


def test_equal_leaves_in_a_product() -> None:
    """d(w1 * w2)/dw1 = w2: with one shared node it was w1 + w2."""
    w1, w2 = Tensor.ones(2, requires_grad=True), Tensor.ones(2, requires_grad=True)
    (w1 * w2 * Tensor([2.0, 3.0])).sum().backward()
    assert w1.grad is not None and w2.grad is not None
    np.testing.assert_allclose(w1.grad.numpy(), [2.0, 3.0])
    np.testing.assert_allclose(w2.grad.numpy(), [2.0, 3.0])


def test_requires_grad_on_a_result_keeps_the_chain() -> None:
    """`h = (p * 2).requires_grad_()` is PyTorch's non-leaf: the gradient still reaches p (h is not cut off
    into a buffer of its own)."""
    p = Tensor([1.0, 2.0], requires_grad=True)
    h = (p * 2).requires_grad_()
    (h * h).sum().backward()
    assert p.grad is not None
    np.testing.assert_allclose(p.grad.numpy(), 8 * np.array([1.0, 2.0]))


def test_a_leaf_with_a_gradient_flag_keeps_its_value() -> None:
    w = Tensor.arange(6).reshape(2, 3).float().requires_grad_()
    np.testing.assert_array_equal(w.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3))
    (w * w).sum().backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), 2 * np.arange(6, dtype=np.float32).reshape(2, 3))


# ---------------------------------------------------------------------- clone
def test_clones_of_equal_constants_are_separate_tensors() -> None:
    """tinygrad's test_const_backward_pass itself: `Tensor(3.5).clone()` twice, tinygrad's backward (no
    requires_grad): each clone gets d(w1 + w2)/dw = 1 (tinygrad's clone allocates a buffer; `contiguous()` of two
    equal graphs was one node, so both got 2)."""
    w1, w2 = Tensor(3.5).clone(), Tensor(3.5).clone()
    w1.add(w2).backward()
    assert w1.grad is not None and w2.grad is not None
    assert (w1.grad.item(), w2.grad.item()) == (1.0, 1.0)


def test_clone_is_differentiable_and_a_copy() -> None:
    x_np = np.array([1.0, -2.0, 3.0], np.float32)
    x = Tensor(x_np, requires_grad=True)
    c = x.clone()
    (c * c).sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), 2 * x_np)
    np.testing.assert_array_equal(c.numpy(), x_np)
    x.assign(Tensor.zeros(3)).realize()  # the clone has its own storage
    np.testing.assert_array_equal(c.numpy(), x_np)
    if torch is not None:
        tx = torch.tensor(x_np, requires_grad=True)
        tc = tx.clone()
        (tc * tc).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())


# ---------------------------------------------------------------------- bad input (test/backend/test_edgecases.py)
def test_repeat_with_a_negative_count_raises() -> None:
    """`repeat(-1, 2)` gave shape (1, 6): expand read -1 as "keep this size". numpy's tile and PyTorch raise."""
    with pytest.raises(RuntimeError, match="non-negative"):
        Tensor([1, 2, 3]).repeat(-1, 2)
    with pytest.raises(ValueError):
        Tensor([1, 2, 3]).repeat(2, -3)
    np.testing.assert_array_equal(Tensor([1, 2, 3]).repeat(0, 2).numpy(), np.tile([1, 2, 3], (0, 2)))
    if torch is not None:
        with pytest.raises(RuntimeError):
            torch.tensor([1, 2, 3]).repeat(-1, 2)


@pytest.mark.parametrize("op", ["max", "min", "argmax", "argmin"])
def test_reducing_nothing_raises_what_pytorch_programs_catch(op: str) -> None:
    """PyTorch raises RuntimeError (tinygrad's test catches that); glassgrad's ValueError stays catchable too."""
    for caught in (RuntimeError, ValueError):
        with pytest.raises(caught, match="empty"):
            getattr(Tensor([]), op)()


# ---------------------------------------------------------------------- Tensor of a bound Variable
def test_tensor_of_a_bound_variable_is_its_value() -> None:
    """tinygrad's `Tensor(v.bind(3))` (test_arange's test_index_variable, test_tensor_variable): a 0-d int32 tensor
    holding the bound value; it crashed (a node without a device)."""
    from glassgrad import Variable
    data = np.arange(20, dtype=np.float32).reshape(10, 2)
    v = Variable("v", 0, 9)
    t = Tensor(v.bind(3))
    assert t.shape == () and t.item() == 3
    np.testing.assert_array_equal(Tensor(data)[t].numpy(), data[3])
    assert Tensor(Variable("u", 1, 10).bind(2) + 1).item() == 3
    np.testing.assert_allclose((Tensor(v.bind(4)) * 2.5).numpy(), 10.0)
    with pytest.raises(ValueError, match="not bound"):
        Tensor(Variable("w", 0, 3))


# ---------------------------------------------------------------------- assign (test/unit/test_assign.py)
VIEWS_OF_W = {"itself": (lambda w: w, lambda a: a), "reshaped": (lambda w: w.reshape(2, 1).reshape(2), lambda a: a),
              "flipped": (lambda w: w.flip(0), lambda a: a[::-1]), "sliced": (lambda w: w[0:2], lambda a: a)}


@pytest.mark.parametrize("view", list(VIEWS_OF_W))
def test_reading_a_tensor_after_its_copy_was_overwritten(view: str) -> None:
    """`t.assign(w)` recorded w's own node as realized in t's buffer; after a second write to t, reading `w + 0`
    raised "reads ... as it was before an assign overwrote it" (a target network copied from the online one, then
    updated: the online weights could no longer be read)."""
    of_tensor, of_array = VIEWS_OF_W[view]
    w_np = np.array([1.0, 2.0], np.float32)
    w = Tensor(w_np)
    t = Tensor([0.0, 0.0])
    t.assign(of_tensor(w)).realize()
    t.assign(t + 1).realize()
    np.testing.assert_array_equal((of_tensor(w) + 0).numpy(), of_array(w_np))
    np.testing.assert_array_equal(t.numpy(), of_array(w_np) + 1)


def test_reads_between_pending_writes_keep_their_values() -> None:
    """tinygrad's test_pending_assign_chain_preserves_intermediate_reads (PyTorch's values too): x in a buffer the
    scheduler made (not one of its own), each read taken between lazy writes."""
    x = Tensor([0.0]).contiguous().realize()
    y0 = x + 0
    x.assign(x + 1)
    y1 = x + 0
    x.assign(x + 1)
    y2 = x + 0
    x.assign(x + 1)
    assert [y0.item(), y1.item(), y2.item(), x.item()] == [0.0, 1.0, 2.0, 3.0]


def test_writes_through_slices_of_one_computed_buffer() -> None:
    """tinygrad's TestPartialAssignToSharedBuffer: every slice of a zeros buffer incremented lazily, then realized
    together (it raised the same stale-read error)."""
    big = Tensor.zeros(50).contiguous().realize()
    views = [big[i * 10:(i + 1) * 10].reshape(2, 5) for i in range(5)]
    for v in views:
        v.assign(v + 1)
    Tensor.realize(*views)
    for v in views:
        np.testing.assert_array_equal(v.numpy(), np.ones((2, 5), np.float32))
    np.testing.assert_array_equal(big.numpy(), np.ones(50, np.float32))


# ---------------------------------------------------------------------- comparing bound Variables
def test_comparing_a_bound_variable_is_decided_by_its_range() -> None:
    """`v < 5` returned a UOp, and `if v < 5:` took the branch whatever v was (an object is truthy); `v > 0` raised
    TypeError (test_assign's test_assign_kv_cache, copied from LLaMA: `... if start_pos > 0 else xk`)."""
    from glassgrad import Variable
    v = Variable("start_pos", 1, 8).bind(6)
    assert bool(v > 0) and bool(v >= 1) and bool(v < 9) and bool(v <= 8)
    assert not bool(v <= 0) and not bool(v > 8) and not bool(v < 1) and not bool(v >= 9)
    assert bool(v + 1 > 1)
    with pytest.raises(TypeError, match="start_pos"):  # 6 < 5 for this binding, not for every value of the range
        bool(v < 5)
    with pytest.raises(TypeError, match="start_pos"):
        bool(v > 3)


def test_the_same_slice_write_on_a_fresh_buffer_after_the_first_was_overwritten() -> None:
    """tinygrad's test_lazy_sum_between_writes, lazy then eager: the second `t[:3].assign(1.0)` on a fresh zeros
    buffer (the same node as the first, by hash-consing) builds the same value node, which was recorded as held by
    the first buffer at a version written over since: it raised instead of computing it again."""
    for realize_each in (False, True):
        t = Tensor.zeros(6).contiguous().realize()
        s0 = t.sum()
        t[:3].assign(1.0)
        s1 = t.sum()
        if realize_each:
            Tensor.realize(s0, s1, t)
        t[3:].assign(2.0)
        s2 = t.sum()
        assert [s0.item(), s1.item(), s2.item()] == [0.0, 3.0, 9.0]
        np.testing.assert_array_equal(t.numpy(), np.array([1, 1, 1, 2, 2, 2], np.float32))


# ---------------------------------------------------------------------- setitem and gradients (test_setitem.py)
@pytest.mark.parametrize("requires_grad", [None, True])
def test_gradient_reaches_a_realized_tensor_written_by_setitem(requires_grad: bool | None) -> None:
    """tinygrad's TestWithGrad.test_set_backward with a realized source: `z[:] = x` keeps x's buffer as the pending
    write's value, which the graph holds as it is (not through x's lineage); backward() did not find x there, and
    x.grad stayed None (tinygrad's rule) where d(2 * sum(z))/dx is 2 everywhere."""
    x_np = np.arange(16, dtype=np.float32).reshape(4, 4)
    x = Tensor(x_np, requires_grad=requires_grad).mul(1).realize() if requires_grad is None else \
        Tensor(x_np, requires_grad=True)
    z = Tensor.ones(4, 4)
    z[:] = x
    (z * 2).sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), np.full((4, 4), 2.0, np.float32))
    np.testing.assert_array_equal(z.numpy(), x_np)


def test_a_bound_variable_on_the_left_of_a_tensor() -> None:
    """tinygrad's test_variable_mul_tensor: `v * t` raised "int() needs a tensor with one element" (the UOp tried to
    make a constant of the tensor); it now defers to the tensor, as `t * v` (numpy gives the same)."""
    from glassgrad import Variable
    v = Variable("a", 1, 10).bind(2)
    t_np = np.array([1, 2, 3], np.int32)
    t = Tensor(t_np)
    np.testing.assert_array_equal((v * t).numpy(), 2 * t_np)
    np.testing.assert_array_equal((v + t).numpy(), 2 + t_np)
    np.testing.assert_array_equal((v - t).numpy(), 2 - t_np)
    np.testing.assert_array_equal((v < t).numpy(), 2 < t_np)
    np.testing.assert_array_equal((v >= t).numpy(), 2 >= t_np)


# ---------------------------------------------------------------------- random (test/unit/test_randomness.py)
def test_uniform_with_an_int_dtype_takes_every_integer_equally() -> None:
    """`Tensor.uniform(n, low=-3, high=3, dtype=int32)` truncated toward 0 after adding low: 0 came twice as often
    and -3 never (numpy's randint(-3, 3) and tinygrad's floored draw: each of -3..2 with probability 1/6)."""
    from glassgrad import dtypes
    Tensor.manual_seed(0)
    a = Tensor.uniform(60000, low=-3, high=3, dtype=dtypes.int32).numpy()
    values, counts = np.unique(a, return_counts=True)
    np.testing.assert_array_equal(values, np.arange(-3, 3))
    assert counts.min() > 0.9 * 10000 and counts.max() < 1.1 * 10000, counts
    b = Tensor.uniform(20000, low=0.5, high=2.5, dtype=dtypes.int32).numpy()  # floor of U[0.5, 2.5): 0, 1 or 2
    np.testing.assert_array_equal(np.unique(b), [0, 1, 2])
    assert 0.2 < (b == 0).mean() < 0.3  # P(floor = 0) = 0.5 / 2


def test_random_constructors_refuse_bad_bounds() -> None:
    """tinygrad's test_normal, test_uniform, test_randint: a negative std, low > high, and float randint bounds
    were accepted (randint truncated 0.1 to 0). PyTorch raises for the first two as well."""
    with pytest.raises(ValueError, match="std"):
        Tensor.normal(3, 4, mean=0, std=-1)
    with pytest.raises(ValueError, match="low"):
        Tensor.uniform(3, 4, low=5.0, high=3.0)
    with pytest.raises(TypeError, match="ints"):
        Tensor.randint(3, 4, low=0.1, high=3)
    assert Tensor.randint(3, low=np.int64(2), high=3).tolist() == [2, 2, 2]
    if torch is not None:
        with pytest.raises(RuntimeError):
            torch.empty(3).normal_(0, -1)
        with pytest.raises(RuntimeError):
            torch.empty(3).uniform_(5.0, 3.0)


@pytest.mark.parametrize("requires_grad", [None, True])
def test_setitem_into_a_lazy_random_tensor_keeps_the_value_differentiable(requires_grad: bool | None) -> None:
    """tinygrad's test_set_item_to_scalar_tensor (PyTorch's result too): `z = Tensor.randn(m, n); z[:, 0] = w;
    z.sum().backward()` gives w.grad = m. Realizing z for the write advanced the random state, which realized the
    merged value built before it (it reads that state), and the pending write held it as a leaf: w.grad was None,
    silently, also with requires_grad=True."""
    z = Tensor.randn(4, 3)
    w = Tensor([1.0], requires_grad=requires_grad)
    z[:, 0] = w
    z.sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), [4.0])
    np.testing.assert_array_equal(z.numpy()[:, 0], np.ones(4, np.float32))
    if torch is not None:
        tz, tw = torch.randn(4, 3), torch.tensor([1.0], requires_grad=True)
        tz[:, 0] = tw
        tz.sum().backward()
        np.testing.assert_array_equal(w.grad.numpy(), tw.grad.numpy())


def test_gradient_reaches_a_lazy_random_tensor_written_by_setitem() -> None:
    """tinygrad's test_set_backward as written: `z[:] = Tensor.rand(8, 8)`, tinygrad's backward (no
    requires_grad): x.grad is all ones."""
    z, x = Tensor.ones(8, 8), Tensor.rand(8, 8)
    z[:] = x
    z.sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), np.ones((8, 8), np.float32))


# ---------------------------------------------------------------------- TinyJit replays (test/unit/test_jit*.py)
def test_jit_output_fed_back_as_input() -> None:
    """`h = step(h)` (an RNN loop): from the first replay the input was the capture's own output buffer, which the
    kernel overwrote while still reading it: tanh(h @ W) was wrong by ~1 from the third call on. An input that is a
    buffer the replay writes is now copied first (tinygrad's test_multiple_outputs_same_intermediate too)."""
    from glassgrad import TinyJit
    w_np = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32) * 0.5
    w = Tensor(w_np)

    @TinyJit
    def step(h: Tensor) -> Tensor:
        return (h @ w).tanh().realize()
    h, h_np = Tensor.ones(1, 8).contiguous().realize(), np.ones((1, 8), np.float32)
    for _ in range(6):
        h, h_np = step(h), np.tanh(h_np @ w_np)
        np.testing.assert_allclose(h.numpy(), h_np, rtol=1e-5, atol=1e-6)

    @TinyJit
    def shift(buf: Tensor, frame: Tensor) -> tuple[Tensor, Tensor]:
        new = buf[1:].cat(frame, dim=0)
        return new.contiguous(), new[:1].contiguous()
    buf = Tensor([[0], [1], [2]]).contiguous().realize()
    for i in range(5):
        expected = buf.numpy()[1, 0]
        buf, first = shift(buf, Tensor([[10 + i]]).contiguous().realize())
        assert first.item() == expected


def test_jit_results_kept_from_earlier_calls_keep_their_values() -> None:
    """`kept.append((f(x) * 2).realize())`: the returned tensor is the same node every replay, so `* 2` of it was
    found already computed (the first replay's buffer) and every later call got that value: [4, 8, 8, 8, 8].
    Copies (`clone()`) too: tinygrad's test_output_buffer_workaround gave [2, 4, 4]."""
    from glassgrad import TinyJit

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x.sum().realize()
    kept, clones, lazy = [], [], []
    for i in range(1, 6):
        kept.append((f(Tensor([i, i])) * 2).realize())
        clones.append(f(Tensor([i, i])).clone().realize())
        lazy.append(f(Tensor([i, i])) + 0)  # lazy: realized before the next replay overwrites what it reads
    assert [k.item() for k in kept] == [4 * i for i in range(1, 6)]
    assert [c.item() for c in clones] == [2 * i for i in range(1, 6)]
    assert [t.item() for t in lazy] == [2 * i for i in range(1, 6)]


def test_jit_takes_equal_inputs_made_separately() -> None:
    """tinygrad's test_jitbeam_triggers_beam: `a, b = Tensor.ones(10, 10).contiguous().realize(), <the same>` are
    one buffer here (equal graphs), and the JIT refused them as inputs sharing a buffer; a tensor passed twice is
    still refused."""
    from glassgrad import TinyJit
    from glassgrad.engine.jit import JitError

    @TinyJit
    def add(a: Tensor, b: Tensor) -> Tensor:
        return (a + b).realize()
    for i in range(4):
        a = Tensor.full((10, 10), float(i)).contiguous().realize()
        b = Tensor.full((10, 10), float(i)).contiguous().realize()
        np.testing.assert_array_equal(add(a, b).numpy(), np.full((10, 10), 2.0 * i, np.float32))
    with pytest.raises(JitError, match="share one buffer"):
        add(a, a)


# ---------------------------------------------------------------------- Tensor(bytes) (test/unit/test_tensor_data.py)
def test_tensor_of_bytes_reads_them_as_the_dtype() -> None:
    """tinygrad's test_float_bytes: `Tensor(struct.pack("ff", 0.234, 0.8585), dtype=float32)` is the two floats
    (torch.frombuffer's reading); it was the 8 bytes, each cast to a float (178.0, 157.0, ...)."""
    import struct

    from glassgrad import dtypes
    raw = struct.pack("ff", 0.234, 0.8585)
    t = Tensor(raw, dtype=dtypes.float32)
    assert t.shape == (2,)
    np.testing.assert_array_equal(t.numpy(), np.frombuffer(raw, np.float32))
    np.testing.assert_array_equal(Tensor(b"\x01\x02\x03\x04", dtype=dtypes.int16).numpy(),
                                  np.frombuffer(b"\x01\x02\x03\x04", "<i2"))
    np.testing.assert_array_equal(Tensor(b"\x01\x02\x03\x04").numpy(), [1, 2, 3, 4])  # uint8 by default
    bf16 = (np.array([1.5, -2.25], np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    np.testing.assert_array_equal(Tensor(bf16, dtype=dtypes.bfloat16).numpy(), [1.5, -2.25])
    with pytest.raises(ValueError, match="whole number"):
        Tensor(b"\x01\x02\x03", dtype=dtypes.float32)
    if torch is not None:
        np.testing.assert_array_equal(t.numpy(), torch.frombuffer(bytearray(raw), dtype=torch.float32).numpy())


# ---------------------------------------------------------------------- dtype promotion (test/unit/test_dtype_weak.py)
def test_int64_with_uint64_promotes_to_the_default_float() -> None:
    """They meet only at a float; the lattice's lowest was float16, so `int64 + uint64` of 70000 overflowed to inf
    and sin(2) lost 3 digits (tinygrad: its weak float, the default float; numpy gives float64, JAX float32). A
    concrete float among the operands still decides (float16 stays float16)."""
    from glassgrad import Context, dtypes
    from glassgrad.dtype import least_upper_dtype
    i64, u64 = Tensor([70000], dtype=dtypes.int64), Tensor([3], dtype=dtypes.uint64)
    total = i64 + u64
    assert total.dtype == dtypes.float32 and total.item() == 70003.0
    assert abs((Tensor([-1], dtype=dtypes.int64) + Tensor([3], dtype=dtypes.uint64)).sin().item() - np.sin(2)) < 1e-6
    assert least_upper_dtype(dtypes.int64, dtypes.uint64, dtypes.float16) == dtypes.float16
    assert least_upper_dtype(dtypes.int64, dtypes.float16) == dtypes.float16
    assert least_upper_dtype(dtypes.int8, dtypes.uint8) == dtypes.int16
    with Context(DEFAULT_FLOAT=dtypes.float16):
        assert least_upper_dtype(dtypes.int64, dtypes.uint64) == dtypes.float16


def test_setitem_into_a_computed_tensor_still_differentiates_into_its_source() -> None:
    """tinygrad's test_set_nonleaf_backward and test_set_overlapping_backward (PyTorch's values): the target of the
    write is not realized first unless random draws are involved (see the test above), so the gradient reaches x
    through the kept elements of z = x * 2."""
    x = Tensor([1.0, 2.0, 3.0, 4.0])
    z = x * 2
    z[:2] = Tensor([10.0, 20.0])
    z.sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 0.0, 2.0, 2.0])
    z, a, b = Tensor.zeros(6), Tensor.ones(4).contiguous(), Tensor.ones(4) * 2
    z[:4] = a
    z[2:] = b
    z.sum().backward()
    assert a.grad is not None and b.grad is not None
    np.testing.assert_array_equal(a.grad.numpy(), [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(b.grad.numpy(), np.ones(4, np.float32))
    if torch is not None:
        tx = torch.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        tz = tx * 2
        tz[:2] = torch.tensor([10.0, 20.0])
        tz.sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


# ---------------------------------------------------------------------- gradient targets (test/unit/test_gradient.py)
def test_gradient_refuses_int_and_bare_constant_targets() -> None:
    """tinygrad's test_non_float_tensor_raise and test_const_target_raise. An int target got zeros; a bare constant
    target got a wrong number: `(Tensor(2.0) * 2.0).gradient(Tensor(2.0))` was 4, since the scalar 2.0 is the same
    node (d(c * c)/dc = 2c). PyTorch raises for the int target too."""
    x = Tensor([1, 2, 3])
    with pytest.raises(RuntimeError, match="float"):
        x.sum().gradient(x)
    with pytest.raises(RuntimeError, match="float"):
        x.float().sum().gradient(x)
    c = Tensor(2.0)
    with pytest.raises(RuntimeError, match="constant"):
        (c * 2.0).gradient(c)
    w = Tensor(2.0, requires_grad=True)  # a buffer of its own: the right answer
    assert (w * 2.0).gradient(w)[0].item() == 2.0
    assert (Tensor(2.0).clone() * 2.0).sum().gradient(w)[0].item() == 0.0


def test_backward_skips_bare_constants_as_tinygrad() -> None:
    """tinygrad's test_bare_const_skipped_by_backward: a bare constant gets no .grad from tinygrad's backward (its
    node is shared: `w * 3.0` with w = Tensor(3.0) is c * c, and w.grad was 6, not 3)."""
    w, x = Tensor(3.0), Tensor([1.0, 2.0])
    (w * 3.0 + x).sum().backward()
    assert w.grad is None
    assert x.grad is not None and x.grad.tolist() == [1.0, 1.0]


def test_a_float_index_raises_index_error() -> None:
    """tinygrad's test_index: `t[0.0]` raised TypeError only; numpy and PyTorch raise IndexError (a program's
    `except IndexError` missed it). glassgrad's error is both."""
    t = Tensor([1.0, 2.0])
    for caught in (IndexError, TypeError):
        with pytest.raises(caught, match="invalid index"):
            t[0.0]
    with pytest.raises(IndexError):
        np.array([1.0, 2.0])[0.0]  # type: ignore[index]


def test_bool_gather_index_and_item_deletion_raise() -> None:
    """tinygrad's test_gather_invalid: a bool index was accepted (read as positions 0 and 1; PyTorch raises); and
    test_index: `del t[0]` raised AttributeError('__delitem__'), where PyTorch and numpy raise TypeError."""
    from glassgrad import dtypes
    t = Tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 1, 4))
    index = t.argsort(dim=0)
    np.testing.assert_array_equal(t.gather(0, index).numpy(), np.take_along_axis(t.numpy(), index.numpy(), 0))
    with pytest.raises(RuntimeError, match="int tensor"):
        t.gather(0, index.cast(dtypes.bool))
    with pytest.raises(TypeError, match="deletion"):
        del t[0]
    if torch is not None:
        with pytest.raises(RuntimeError):
            torch.zeros(2, 3).gather(0, torch.zeros(2, 3, dtype=torch.bool))
        with pytest.raises(TypeError):
            del torch.zeros(2)[0]


def test_a_write_through_a_same_size_bitcast_reaches_the_source() -> None:
    """tinygrad's test_assign_bitcast: `a.bitcast(uint32).assign(bits)` left `a` as it was (the bitcast was a
    new tensor, and the write went into a buffer of its own): silently no write. A same-size bitcast is a view now,
    as PyTorch's `view(dtype)`."""
    from glassgrad import dtypes
    bits = np.array([4.0, 3.0, 2.0, 1.0], np.float32).view(np.uint32)
    a = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    a.bitcast(dtypes.uint32).assign(Tensor(bits)).realize()
    np.testing.assert_array_equal(a.numpy(), [4.0, 3.0, 2.0, 1.0])
    b = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    b.bitcast(dtypes.uint32).bitcast(dtypes.int32).assign(Tensor(bits.view(np.int32)))
    np.testing.assert_array_equal(b.numpy(), [4.0, 3.0, 2.0, 1.0])
    c = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
    c[0:2].bitcast(dtypes.uint32).assign(Tensor(bits[:2])).realize()
    np.testing.assert_array_equal(c.numpy(), [4.0, 3.0, 3.0, 4.0])
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(Tensor(x).bitcast(dtypes.int32).numpy(), x.view(np.int32))
    if torch is not None:
        ta = torch.tensor([1.0, 2.0, 3.0, 4.0])
        ta.view(torch.int32).copy_(torch.from_numpy(bits.view(np.int32)))
        np.testing.assert_array_equal(a.numpy(), ta.numpy())


# ---------------------------------------------------------------------- second round: more of tinygrad's test files
@pytest.mark.parametrize("make", [lambda: Tensor.ones(3) + 1, lambda: Tensor.arange(3).float(),
                                  lambda: Tensor.linspace(0, 1, 3)])
def test_backward_skips_equal_tensors_computed_from_constants_alone(make) -> None:  # type: ignore[no-untyped-def]
    """test/unit/test_function.py's test_grad_fxn_tuple: `x = Tensor.ones(3).contiguous()` and an equal y were one
    (hash-consed) node, and tinygrad's backward rule gave each the sum of both gradients (x.grad = y.grad = 3 for
    `x * 1 + y * 2`). Two live tensors sharing such a node are skipped as a bare constant is (no .grad, not a wrong
    one); a tensor that reads memory beside them still gets its gradient, and one such tensor alone gets its own."""
    x, y, a = make(), make(), Tensor([1.0, 1.0, 1.0])
    (x * 1 + y * 2 + a * 4).sum().backward()
    assert x.grad is None and y.grad is None
    assert a.grad is not None and a.grad.tolist() == [4.0, 4.0, 4.0]
    with pytest.raises(RuntimeError, match="constants alone"):
        (x * 1 + y * 2).sum().gradient(x)
    del y
    (x * 3).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [3.0, 3.0, 3.0]
    assert (x * 5).sum().gradient(x)[0].tolist() == [5.0, 5.0, 5.0]


@pytest.mark.parametrize("realize", [False, True])
def test_contiguous_constant_tensors_get_their_own_gradients(realize: bool) -> None:
    """test_function.py's test_grad_fxn_tuple and TestFunctionGrad: `Tensor.ones(3).contiguous()` made twice was one
    hash-consed node (and, realized, one shared buffer), so backward gave neither a gradient. contiguous() of a
    constants-only graph now makes a buffer of its own, as tinygrad's does: each gets its own gradient."""
    x, y, ref = (Tensor.ones(3, 3).contiguous() for _ in range(3))
    if realize:
        Tensor.realize(x, y, ref)
    assert x.uop is not y.uop
    ((x @ (y * 2)) - ref * 3).square().mean().backward()
    assert x.grad is not None and y.grad is not None and ref.grad is not None
    if torch is not None:
        tx, ty, tref = (torch.ones(3, 3, requires_grad=True) for _ in range(3))
        ((tx @ (ty * 2)) - tref * 3).square().mean().backward()
        for t, tt in ((x, tx), (y, ty), (ref, tref)):
            np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(x.numpy(), np.ones((3, 3), np.float32))  # the values are unchanged


def test_constant_tensors_with_requires_grad_get_their_own_gradients() -> None:
    """The way to differentiate such tensors (the skip's message says so): requires_grad=True gives each a buffer."""
    x, y = Tensor.ones(3) + 1, Tensor.ones(3) + 1
    x.requires_grad, y.requires_grad = True, True
    (x * 1 + y * 2).sum().backward()
    assert x.grad is not None and y.grad is not None
    assert (x.grad.tolist(), y.grad.tolist()) == ([1.0] * 3, [2.0] * 3)


DEVICES_2 = ("CPU:0", "CPU:1")


def test_backward_reaches_sharded_tensors_without_requires_grad() -> None:
    """test_function.py's test_data_parallel_backward: tinygrad's backward rule (no tensor marked requires_grad)
    left out tensors on several devices, so `(x @ w).sum().backward()` with x sharded raised 'no tensor of this
    computation can take a gradient'."""
    x_np = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.float32)
    w_np = np.array([[1, 2], [3, 4]], np.float32)
    x = Tensor(x_np).shard(DEVICES_2, axis=0)
    w = Tensor(w_np).shard(DEVICES_2, axis=None).realize()
    (x @ w).sum().backward()
    assert x.grad is not None and w.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.ones((4, 2)) @ w_np.T)
    np.testing.assert_allclose(w.grad.numpy(), x_np.T @ np.ones((4, 2)))


def test_equal_sharded_leaves_get_their_own_gradients() -> None:
    """The sibling of the first test of this file on several devices: two `Tensor.ones(4, 2).shard(...)` marked
    requires_grad were one node, so each got the sum of both gradients (3 and 3, not 1 and 2)."""
    x = Tensor.ones(4, 2).shard(DEVICES_2, axis=0)
    y = Tensor.ones(4, 2).shard(DEVICES_2, axis=0)
    x.requires_grad, y.requires_grad = True, True
    (x * 1 + y * 2).sum().backward()
    assert x.grad is not None and y.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.ones((4, 2)))
    np.testing.assert_allclose(y.grad.numpy(), np.full((4, 2), 2.0))


def test_no_grad_cuts_sharded_results_from_autograd() -> None:
    """A sharded result computed inside no_grad() kept its graph, so a later backward through it reached the leaf:
    x.grad was 1 + 3 = 4 instead of 1 (as PyTorch's no_grad, the result is a constant)."""
    from glassgrad import no_grad
    x_np = np.arange(8, dtype=np.float32).reshape(4, 2)
    x = Tensor(x_np).shard(DEVICES_2, axis=0)
    x.requires_grad = True
    with no_grad():
        z = x * 3
    (z + x).sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), np.ones((4, 2)))
    np.testing.assert_allclose((z @ Tensor.ones(2, 3).shard(DEVICES_2)).numpy(), (x_np * 3) @ np.ones((2, 3)))


def test_tensor_of_a_path_reads_the_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """test/unit/test_disk_tensor.py's TestPathTensor and test_tar.py: `Tensor(pathlib.Path(fn))` (tinygrad's DISK
    tensor of a file; `tar_extract(Tensor(path))`) raised 'cannot make a tensor from PosixPath'. It is the file's
    bytes (uint8, or read as `dtype`'s items), on the requested device; a missing file raises FileNotFoundError."""
    import pathlib
    import tarfile

    from glassgrad import dtypes
    from glassgrad.nn.state import tar_extract
    data = np.arange(100, dtype=np.uint8).tobytes()
    fn = tmp_path / "data.bin"
    fn.write_bytes(data)
    t = Tensor(fn)
    assert (t.shape, t.dtype) == ((100,), dtypes.uint8)
    np.testing.assert_array_equal(t.numpy(), np.frombuffer(data, np.uint8))
    np.testing.assert_array_equal(Tensor(fn, dtype=dtypes.int16).numpy(), np.frombuffer(data, np.int16))
    assert Tensor(fn, device="CPU").device == "CPU"
    (tmp_path / "empty.bin").touch()
    assert Tensor(tmp_path / "empty.bin").shape == (0,)
    with pytest.raises(FileNotFoundError):
        Tensor(tmp_path / "missing.bin")
    with pytest.raises(ValueError, match="whole number"):
        Tensor(fn, dtype=dtypes.float64)  # 100 bytes are not whole 8-byte items
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        tar.add(fn, arcname="data.bin")
    np.testing.assert_array_equal(tar_extract(Tensor(pathlib.Path(tmp_path / "a.tar")))["data.bin"].numpy(),
                                  np.frombuffer(data, np.uint8))


def test_tensor_of_a_list_of_bytes_is_their_byte_values() -> None:
    """test/unit/test_hashing.py: `Tensor([b"abc", b"abc", b"def"], dtype=dtypes.uint8)` (a batch of messages)
    raised 'ragged or mixed nested list'. Each bytes in a list is the list of its byte values (tinygrad's reading;
    a lone `Tensor(b"...")` stays raw memory)."""
    from glassgrad import dtypes
    t = Tensor([b"abc", b"abc", b"def"], dtype=dtypes.uint8)
    assert (t.shape, t.dtype) == ((3, 3), dtypes.uint8)
    assert t.tolist() == [list(b"abc"), list(b"abc"), list(b"def")]
    assert Tensor([[b"ab"], [b"cd"]], dtype=dtypes.float32).tolist() == [[[97.0, 98.0]], [[99.0, 100.0]]]
    with pytest.raises(ValueError, match="ragged"):
        Tensor([b"ab", b"c"])


def test_get_state_dict_takes_tinygrad_tensor_type() -> None:
    """test_disk_tensor.py's test_shared_storage walks a torch object with `get_state_dict(obj, tensor_type=
    torch.Tensor)`; the keyword was refused (TypeError)."""
    from glassgrad.nn import Linear
    from glassgrad.nn.state import get_state_dict
    model = {"layer": Linear(2, 3), "scale": Tensor([1.0]), "n": 3}
    assert sorted(get_state_dict(model, tensor_type=Tensor)) == ["layer.bias", "layer.weight", "scale"]
    assert get_state_dict(model, prefix="m.") == {f"m.{k}": v for k, v in get_state_dict(model).items()}
    if torch is not None:
        both = {"t": torch.zeros(2), "inner": [torch.ones(1)], "g": Tensor([1.0])}
        found = get_state_dict(both, tensor_type=torch.Tensor)
        assert sorted(found) == ["inner.0", "t"] and all(isinstance(v, torch.Tensor) for v in found.values())


def test_one_variable_bound_to_two_values_raises_runtime_error() -> None:
    """test/backend/test_stunning.py's test_indexing_two_bind: `a[v.bind(12)].cat(a[v.bind(76)])` raised ValueError
    only; tinygrad raises RuntimeError ("bind mismatch on ..."). The error is both now."""
    from glassgrad import Variable
    a = Tensor.arange(1000).reshape(100, 10).contiguous()
    v = Variable("i", 0, 99)
    for caught in (RuntimeError, ValueError):
        with pytest.raises(caught, match="bind mismatch"):
            a[v.bind(12)].cat(a[v.bind(76)]).tolist()


def test_jit_takes_equal_sharded_inputs_made_separately() -> None:
    """test/unit/test_multitensor.py's test_multi_tensor_jit_param: `Tensor.ones(256).contiguous().realize()` twice,
    each sharded, realized into one shared buffer per device, and TinyJit refused them ('inputs #0 and #1 share
    one buffer'), as it did on one device before (the test above)."""
    from glassgrad import TinyJit

    @TinyJit
    def add(a: Tensor, b: Tensor) -> Tensor:
        return (a + b * 2).realize()

    for i in range(4):
        a = Tensor.full((4,), float(i)).contiguous().realize().shard(DEVICES_2, 0).realize()
        b = Tensor.full((4,), float(i)).contiguous().realize().shard(DEVICES_2, 0).realize()
        np.testing.assert_allclose(add(a, b).numpy(), np.full(4, 3.0 * i))
        np.testing.assert_allclose((a.numpy(), b.numpy()), np.full((2, 4), float(i)))
    with pytest.raises(Exception, match="share one buffer"):
        add(a, a)


def test_tinygrads_top_level_names_import() -> None:
    """test/unit/test_gguf.py does `from tinygrad import fetch` (tinygrad 0.14 exports it beside Tensor); glassgrad
    had it only as `helpers.fetch`. Every public name of tinygrad 0.14's `__init__` but UOp (an internal whose
    API glassgrad does not mimic) imports."""
    import glassgrad
    from glassgrad import helpers
    for name in ("Tensor", "TinyJit", "function", "Variable", "dtypes", "GlobalCounters", "fetch", "Context",
                 "getenv", "Device"):
        assert hasattr(glassgrad, name), name
    assert glassgrad.fetch is helpers.fetch


def test_setitem_into_a_lazy_sharded_random_tensor_keeps_the_value_differentiable() -> None:
    """The sibling of test_setitem_into_a_lazy_random_tensor_keeps_the_value_differentiable on several devices: the
    check for a target that draws random numbers looked only at the target's own device, which a sharded tensor
    has not (it is a tuple), so `z = Tensor.randn(4, 3).shard(...); z[:, 0] = w` left w.grad None."""
    w = Tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
    z = Tensor.randn(4, 3).shard(DEVICES_2, axis=0)
    z[:, 0] = w.shard(DEVICES_2, axis=0)
    (z * 2).sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), [2.0] * 4)
    assert z.numpy()[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_clones_of_a_sharded_tensor_are_separate_tensors() -> None:
    """The sibling of test_clones_of_equal_constants_are_separate_tensors on several devices: clone() there was
    contiguous(), so two clones of one sharded tensor were one node; tinygrad's backward rule gave each the sum of
    both gradients (3 and 3 for `x * 1 + y * 2`), and a write into one was a write into the other's buffer."""
    a = Tensor([1.0, 2.0, 3.0, 4.0]).shard(DEVICES_2, axis=0)
    x, y = a.clone(), a.clone()
    (x * 1 + y * 2).sum().backward()
    assert x.grad is not None and y.grad is not None and a.grad is not None
    assert (x.grad.tolist(), y.grad.tolist(), a.grad.tolist()) == ([1.0] * 4, [2.0] * 4, [3.0] * 4)
    x[0:2] = Tensor([9.0, 9.0]).shard(DEVICES_2)
    assert (x.tolist(), y.tolist(), a.tolist()) == ([9.0, 9.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0])
    uneven = (Tensor.arange(8).float().shard(("CPU:0", "CPU:1", "CPU:2"), axis=0) * 2).clone()
    assert uneven.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]


def _backward_of_equal_constants() -> None:
    a, b = Tensor.ones(10, 10), Tensor.ones(10, 10)
    (a + b).mean().backward()


def test_backward_after_failed_ones_keeps_randn_leaves_differentiable() -> None:
    """tinygrad's test/unit/test_call.py, run in one process: after `(Tensor.ones(10, 10) + Tensor.ones(10, 10))
    .mean().backward()` raised twice (its frames kept alive by the failures, as a test runner keeps them), a plain
    `randn` matmul's backward raised 'reads <Buffer ... uint64> as it was before an assign overwrote it'. The
    second backward had taken the first's root (the same node) as a target and realized its `.grad` of ones; that
    realized 1.0 then matched the constant 1.0 inside `randn` and became a target too, so the gradient was traced
    back into the random generator's overwritten state. Now the root's twin is skipped as a shared constant node,
    and a realized tensor is a target through its lineage only when that lineage reads memory."""
    kept: list[RuntimeError] = []
    for _ in range(2):
        try:
            _backward_of_equal_constants()
        except RuntimeError as e:  # (kept: its traceback holds the frames' tensors alive)
            kept.append(e)
    a, b, c, ref = Tensor.randn(4, 8), Tensor.randn(8, 12), Tensor.randn(12, 16), Tensor.randn(4, 16)
    Tensor.realize(a, b, c, ref)
    out = (a @ b) @ c
    (out - ref).square().mean().backward()
    out.realize(a.grad, b.grad, c.grad)
    assert a.grad is not None
    a_np, b_np, c_np, ref_np = a.numpy(), b.numpy(), c.numpy(), ref.numpy()
    d_out = 2 * (a_np @ b_np @ c_np - ref_np) / ref_np.size
    np.testing.assert_allclose(a.grad.numpy(), d_out @ (b_np @ c_np).T, rtol=1e-4, atol=1e-5)
    assert len(kept) == 2 and all("no tensor" in str(e) for e in kept)
