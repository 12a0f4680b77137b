"""Tensor.assign: in-place writes into a tensor's own buffer, with the ordering hazards they bring."""
from __future__ import annotations

import contextlib
import gc
import weakref
from typing import Any

import numpy as np
import pytest

from glassgrad import GlobalCounters, Tensor, dtypes, no_grad
from glassgrad.helpers import Context


def _buffer(t: Tensor) -> object:
    return t.uop.base.arg[0]


def test_assign_writes_in_place_into_the_same_buffer() -> None:
    p = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
    buf = _buffer(p)
    p.assign(p - 0.5).realize()
    np.testing.assert_array_equal(p.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) - 0.5)
    assert _buffer(p) is buf


def test_assign_is_one_kernel_for_elementwise_updates() -> None:
    rng = np.random.default_rng(0)
    p, g = (Tensor(rng.random((32, 32), dtype=np.float32)) for _ in range(2))
    GlobalCounters.reset()
    p.assign(p - 0.1 * g).realize()
    assert GlobalCounters.kernel_count == 1


def test_assign_of_a_permutation_of_itself_uses_a_temporary() -> None:
    q = Tensor(np.arange(9, dtype=np.float32).reshape(3, 3)).realize()
    buf = _buffer(q)
    q.assign(q.T).realize()
    np.testing.assert_array_equal(q.numpy(), np.arange(9, dtype=np.float32).reshape(3, 3).T)
    assert _buffer(q) is buf


def test_assign_of_a_shifted_self() -> None:
    x = Tensor(np.arange(5, dtype=np.float32)).realize()
    x.assign(x.flip(0) + x).realize()
    np.testing.assert_array_equal(x.numpy(), np.full(5, 4, np.float32))


def test_readers_of_the_old_value_run_before_the_write() -> None:
    r = Tensor(np.arange(3, dtype=np.float32)).realize()
    old_sum = r.sum()
    r.assign(r * 10)
    Tensor.realize_all(r, old_sum)
    assert old_sum.item() == 3.0
    np.testing.assert_array_equal(r.numpy(), [0, 10, 20])
    Tensor.realize_all(old_sum)


def test_reads_after_assign_see_the_new_value() -> None:
    r = Tensor(np.ones(4, dtype=np.float32)).realize()
    r.assign(r + 1)
    doubled = r * 2
    np.testing.assert_array_equal(doubled.numpy(), np.full(4, 4, np.float32))


def test_assign_to_an_unrealized_tensor_gives_it_a_buffer() -> None:
    z = Tensor.zeros(3)
    z.assign(z + 1)
    z.assign(z + 1)
    np.testing.assert_array_equal(z.numpy(), [2, 2, 2])


def test_assign_broadcasts_scalars_and_casts() -> None:
    x = Tensor(np.zeros(3, dtype=np.int32)).realize()
    x.assign(7).realize()
    np.testing.assert_array_equal(x.numpy(), [7, 7, 7])
    x.assign(Tensor([1.9, 2.2, -3.7])).realize()
    np.testing.assert_array_equal(x.numpy(), [1, 2, -3])
    assert x.dtype == Tensor([1]).dtype


def test_assign_rejects_bad_shapes() -> None:
    x = Tensor.zeros(2, 3).realize()
    with pytest.raises(ValueError, match=r"\(4,\).*\(2, 3\)"):
        x.assign(Tensor.zeros(4))


def test_gradient_flows_through_assign_value() -> None:
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = Tensor.zeros(3).realize()
    y.assign(w * 2)
    y.sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), [2, 2, 2])


def test_many_steps_keep_the_graph_small() -> None:
    """An SGD-like loop: after each realized assign the tensor is a plain buffer again (no growing graph)."""
    p = Tensor.rand(16).realize()
    for _ in range(200):
        p.assign(p * 0.99 + 0.01).realize()
    assert len(p.uop.toposort()) <= 2


def test_a_lazy_tensor_keeps_its_value_when_its_input_is_assigned() -> None:
    """A tensor means the value it had when it was built: a lazy graph on a buffer's old contents is computed
    before the assign overwrites them (in the same schedule), not with the new numbers and not with an error."""
    r = Tensor(np.arange(3, dtype=np.float32)).realize()
    old = r * 1
    r.assign(r * 10).realize()
    np.testing.assert_array_equal(old.numpy(), [0, 1, 2])
    np.testing.assert_array_equal(r.numpy(), [0, 10, 20])


def test_a_gradient_needing_overwritten_contents_raises() -> None:
    """What truly cannot be honoured: a backward through a result realized before an in-place write to one of its
    inputs needs that input's old contents, which are gone (PyTorch raises here too). A clear error, not new numbers."""
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    s = Tensor([1.0, 1.0, 1.0]).realize()
    y = (w * s).sum().realize()
    s.assign(s * 2).realize()
    with pytest.raises(RuntimeError, match="before an assign overwrote it"):
        y.backward()
        assert w.grad is not None
        w.grad.numpy()


def test_equal_graphs_do_not_share_an_assigned_buffer() -> None:
    """Two Tensor.zeros(4) are one graph node and realize to one buffer; assigning to one must not change the other."""
    z1, z2 = Tensor.zeros(4).realize(), Tensor.zeros(4).realize()
    z1.assign(z1 + 1).realize()
    np.testing.assert_array_equal(z1.numpy(), np.ones(4, np.float32))
    np.testing.assert_array_equal(z2.numpy(), np.zeros(4, np.float32))


def test_assigns_that_read_each_others_old_values() -> None:
    """w's new value reads b's old one and vice versa (every optimiser step): one goes through a temporary."""
    w, b = Tensor([1.0, 2.0]).realize(), Tensor([10.0, 20.0]).realize()
    w_buf, b_buf = _buffer(w), _buffer(b)
    new_w, new_b = w + b.flip(0), b - w.flip(0)
    w.assign(new_w)
    b.assign(new_b)
    Tensor.realize_all(w, b)
    np.testing.assert_array_equal(w.numpy(), [21.0, 12.0])
    np.testing.assert_array_equal(b.numpy(), [8.0, 19.0])
    assert _buffer(w) is w_buf and _buffer(b) is b_buf


def _kernels_of(*tensors: Tensor) -> int:
    GlobalCounters.reset()
    Tensor.realize_all(*tensors)
    return GlobalCounters.kernel_count


def test_in_place_writes_read_by_another_in_place_write_are_one_kernel() -> None:
    """An optimizer's shape: p's update reads the new moments m and v; the kernel updating p writes m and v in place
    too, and each holds the value it would have on its own."""
    rng = np.random.default_rng(0)
    p0, m0, v0, g0 = (rng.random(37, dtype=np.float32) for _ in range(4))
    p, m, v = (Tensor(a).realize() for a in (p0, m0, v0))
    g = Tensor(g0).realize()
    bufs = [_buffer(t) for t in (p, m, v)]
    m.assign(m * 0.9 + g * 0.1)
    v.assign(v * 0.99 + g * g * 0.01)
    p.assign(p - 0.5 * m / (v.sqrt() + 1e-3))
    assert _kernels_of(p, m, v) == 1
    m1, v1 = m0 * np.float32(0.9) + g0 * np.float32(0.1), v0 * np.float32(0.99) + g0 * g0 * np.float32(0.01)
    np.testing.assert_allclose(m.numpy(), m1, rtol=1e-6)
    np.testing.assert_allclose(v.numpy(), v1, rtol=1e-6)
    np.testing.assert_allclose(p.numpy(), p0 - 0.5 * m1 / (np.sqrt(v1) + 1e-3), rtol=1e-5)
    assert [_buffer(t) for t in (p, m, v)] == bufs


def test_an_in_place_write_reading_other_elements_of_its_buffer_is_not_merged() -> None:
    """m's new value reads m reversed: written in place by p's kernel, a thread would read an element another has
    already overwritten; it keeps its own route (a temporary) and the values stay right."""
    m0, p0 = np.arange(8, dtype=np.float32), np.ones(8, np.float32)
    m, p = Tensor(m0).realize(), Tensor(p0).realize()
    m.assign(m.flip(0) + 1)
    p.assign(p + m)
    Tensor.realize_all(p, m)
    np.testing.assert_array_equal(m.numpy(), m0[::-1] + 1)
    np.testing.assert_array_equal(p.numpy(), p0 + m0[::-1] + 1)


def test_a_merged_in_place_write_waits_for_the_readers_of_the_old_value() -> None:
    """`total` reads m before its write and p's update reads both: the reduction runs first, then the one kernel
    writing m and p."""
    m0, p0 = np.arange(6, dtype=np.float32), np.full(6, 2.0, np.float32)
    m, p = Tensor(m0).realize(), Tensor(p0).realize()
    total = m.sum()
    m.assign(m + 1)
    p.assign(p * m + total)
    Tensor.realize_all(p, m)
    np.testing.assert_array_equal(m.numpy(), m0 + 1)
    np.testing.assert_array_equal(p.numpy(), p0 * (m0 + 1) + m0.sum())


def test_in_place_writes_chained_across_buffers() -> None:
    """a's new value is b's old plus one, and b's new value reads a's new one: one kernel writes both."""
    a, b = Tensor([1.0, 2.0, 3.0]).realize(), Tensor([10.0, 20.0, 30.0]).realize()
    a.assign(b + 1)
    b.assign(a * 2)
    assert _kernels_of(a, b) == 1
    np.testing.assert_array_equal(a.numpy(), [11.0, 21.0, 31.0])
    np.testing.assert_array_equal(b.numpy(), [22.0, 42.0, 62.0])


def test_a_second_assign_while_the_first_is_pending() -> None:
    p = Tensor(np.zeros(3, np.float32))
    buf = _buffer(p)
    p.assign(p + 1)
    p.assign(p + 1)
    np.testing.assert_array_equal(p.numpy(), [2, 2, 2])
    assert _buffer(p) is buf


# ---------------------------------------------------------------------- an assign realized inside a larger graph
# `y = x * 2` after `x.assign(...)` realizes the assign as part of y's schedule; x (and any graph holding the ASSIGN
# node) must then read the target buffer at its new version, not compute the write again from the old one. Each
# case runs three times, so that with the schedule cache on, the later rounds take the cached schedule.

@pytest.mark.parametrize("scache", [0, 1])
def test_assign_realized_through_a_reader(scache: int) -> None:
    with Context(SCACHE=scache):
        for _ in range(3):
            x = Tensor([1.0, 2.0]).realize()
            buf = _buffer(x)
            x.assign(x + 1)
            y = x * 2
            y.realize()
            GlobalCounters.reset()
            np.testing.assert_array_equal(x.numpy(), [2, 3])
            assert GlobalCounters.kernel_count == 0 and _buffer(x) is buf
            np.testing.assert_array_equal(y.numpy(), [4, 6])
            x.realize()
            assert GlobalCounters.kernel_count == 0


@pytest.mark.parametrize("scache", [0, 1])
def test_two_chained_assigns_realized_through_a_reader(scache: int) -> None:
    with Context(SCACHE=scache):
        for _ in range(3):
            a, b = Tensor([1.0, 2.0]).realize(), Tensor([0.0, 0.0]).realize()
            a.assign(a + 1)
            b.assign(a * 10)
            c = a + b
            np.testing.assert_array_equal(c.numpy(), [22, 33])
            GlobalCounters.reset()
            np.testing.assert_array_equal(a.numpy(), [2, 3])
            np.testing.assert_array_equal(b.numpy(), [20, 30])
            assert GlobalCounters.kernel_count == 0
            a.assign(a + b).realize()  # the next assign starts from the new version
            np.testing.assert_array_equal(a.numpy(), [22, 33])


@pytest.mark.parametrize("scache", [0, 1])
def test_assign_read_through_a_view(scache: int) -> None:
    with Context(SCACHE=scache):
        for _ in range(3):
            x = Tensor(np.arange(6, dtype=np.float32)).realize()
            x.assign(x * 2)
            tail = x.reshape(2, 3)[:, 1:]
            np.testing.assert_array_equal(tail.numpy(), [[2, 4], [8, 10]])
            GlobalCounters.reset()
            np.testing.assert_array_equal(x.numpy(), np.arange(6) * 2)
            assert GlobalCounters.kernel_count == 0
            np.testing.assert_array_equal(x.reshape(3, 2).numpy(), (np.arange(6) * 2).reshape(3, 2))


@pytest.mark.parametrize("scache", [0, 1])
def test_a_graph_holding_the_assign_node_after_its_tensor_is_gone(scache: int) -> None:
    """Only a lazy graph still holds the ASSIGN node: it reads the assign's result from the buffer."""
    with Context(SCACHE=scache):
        for _ in range(3):
            x = Tensor([1.0, 2.0]).realize()
            x.assign(x + 1)
            y, later = x * 2, x + 3
            del x
            y.realize()
            GlobalCounters.reset()
            np.testing.assert_array_equal(later.numpy(), [5, 6])
            assert GlobalCounters.kernel_count == 1


def test_gradient_through_an_assign_realized_by_a_reader() -> None:
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = Tensor.zeros(3).realize()
    y.assign(w * 2)
    (y * 1).realize()
    y.sum().backward()
    assert w.grad is not None
    np.testing.assert_array_equal(w.grad.numpy(), [2, 2, 2])


def test_a_realized_assign_node_is_not_kept_alive() -> None:
    """REALIZED keeps an ASSIGN's view while the node lives; nothing may keep the node alive in return."""
    x = Tensor([1.0, 2.0]).realize()
    x.assign(x + 1)
    node = weakref.ref(x.uop)
    y = x * 2
    y.realize()
    del y
    gc.collect()
    assert node() is None
    np.testing.assert_array_equal(x.numpy(), [2, 3])


def test_state_assigned_inside_a_jit_and_read_by_the_result() -> None:
    from glassgrad.engine.jit import TinyJit
    state = Tensor([1.0, 2.0]).realize()

    @TinyJit
    def step(a: Tensor) -> Tensor:
        state.assign(state + a)
        return state * 2

    for i in range(1, 6):
        np.testing.assert_array_equal(step(Tensor([1.0, 1.0])).numpy(), [2 * (1 + i), 2 * (2 + i)])
        np.testing.assert_array_equal(state.numpy(), [1 + i, 2 + i])


# ---------------------------------------------------------------------- assign through views, __setitem__
def test_assign_into_a_slice_writes_the_tensor_it_was_taken_from() -> None:
    """`c[:, 2:3].assign(x)` writes into c (as a PyTorch view shares its base's storage), never into a lost copy."""
    c = Tensor.zeros(2, 8, 3).contiguous().realize()
    expected = np.zeros((2, 8, 3), np.float32)
    c[:, 2:3].assign(Tensor.ones(2, 1, 3)).realize()
    expected[:, 2:3] = 1
    np.testing.assert_array_equal(c.numpy(), expected)


@pytest.mark.parametrize("index", [(slice(1, 3),), (0, slice(None, None, 2)), (Ellipsis, 1), (slice(None, None, -1),),
                                   (slice(1, None), slice(0, 2)), (-1,), (slice(None), None, 2)])
def test_setitem_matches_numpy(index: Any) -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 5)).astype(np.float32)
    t = Tensor(base.copy())
    expected = base.copy()
    target_shape = expected[index].shape
    value = rng.standard_normal(target_shape).astype(np.float32)
    expected[index] = value
    t[index] = Tensor(value)
    np.testing.assert_array_equal(t.numpy(), expected)


def test_setitem_scalar_broadcast_and_bool_mask() -> None:
    t = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    t[1] = 7
    t[t > 9] = -1
    expected = np.arange(12, dtype=np.float32).reshape(3, 4)
    expected[1] = 7
    expected[expected > 9] = -1
    np.testing.assert_array_equal(t.numpy(), expected)


def test_assign_through_permute_and_reshape_views() -> None:
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    t.T[1].assign(Tensor([7.0, 8.0]))
    t.reshape(6)[5:].assign(Tensor([9.0]))
    np.testing.assert_array_equal(t.numpy(), [[0, 7, 2], [3, 8, 9]])


def test_a_realized_view_still_writes_into_its_parent() -> None:
    """A view that was realized (its node became a buffer) still writes through to the tensor it shows: assign,
    setitem and an in-place operator, of a view and of a view of a view. Program fuzz: `v = t[::-1]; v.realize();
    v.assign(v + 1)` raised "internal error: a view's node is not a chain of movement ops over its parent's"."""
    t = Tensor(np.array([1.5, 2.5], np.float32))
    v = t[::-1]
    v.realize()
    v.assign(v + 1)
    np.testing.assert_array_equal(t.numpy(), [2.5, 3.5])
    np.testing.assert_array_equal(v.numpy(), [3.5, 2.5])
    t = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    col = t.T[1]
    col.realize()
    col[0] = 9
    np.testing.assert_array_equal(t.numpy(), [[0, 9, 2], [3, 4, 5]])
    row = t.reshape(6)[3:]
    row.realize()
    row += 1
    np.testing.assert_array_equal(t.numpy(), [[0, 9, 2], [4, 5, 6]])
    np.testing.assert_array_equal(row.numpy(), [4, 5, 6])


def test_a_view_taken_before_a_slice_write_keeps_its_value() -> None:
    """Value semantics still hold for other tensors: a lazy copy of the slice built before the write keeps the old
    numbers; the view written through shows the new ones."""
    c = Tensor(np.zeros((2, 4), np.float32))
    before = c[0] + 0
    row = c[0]
    row.assign(Tensor.ones(4))
    np.testing.assert_array_equal(before.numpy(), np.zeros(4))
    np.testing.assert_array_equal(row.numpy(), np.ones(4))
    np.testing.assert_array_equal(c.numpy(), [[1, 1, 1, 1], [0, 0, 0, 0]])


def test_assign_through_a_broadcast_view_raises() -> None:
    c = Tensor.zeros(3).contiguous().realize()
    with pytest.raises(RuntimeError, match="broadcast"):
        c.reshape(1, 3).expand(2, 3).assign(Tensor.ones(2, 3))
    c[Tensor([0, 2])] = 1.0  # a setitem with a tensor index scatters (tests/test_tinygrad_compat.py)
    np.testing.assert_equal(c.numpy(), [1.0, 0.0, 1.0])


def test_slice_assign_with_a_variable_position_in_a_jit() -> None:
    """A KV cache's write: `cache[:, pos:pos+1].assign(k)` with a bound Variable, replayed by a TinyJit."""
    from glassgrad import Variable
    from glassgrad.engine.jit import TinyJit
    cache = Tensor.zeros(2, 8, 3).contiguous().realize()
    pos = Variable("pos", 0, 7)

    @TinyJit
    def write(k: Tensor, p: Any) -> Tensor:
        cache[:, p:p + 1].assign(k)
        return cache.sum(axis=(0, 2)).realize()

    expected = np.zeros((2, 8, 3), np.float32)
    for i in range(5):
        out = write(Tensor.full((2, 1, 3), float(i + 1)), pos.bind(i))
        expected[:, i] = i + 1
        np.testing.assert_array_equal(out.numpy(), expected.sum(axis=(0, 2)))
    np.testing.assert_array_equal(cache.numpy(), expected)


@pytest.mark.parametrize("under_no_grad", [False, True], ids=["realize", "realize_under_no_grad"])
def test_gradient_to_a_param_whose_pending_update_was_realized_after_the_forward(under_no_grad: bool) -> None:
    """`w.assign(...)` (a lazy optimizer step), a forward built on it, then the update realized before backward
    (under no_grad, as BatchNorm's forward realizes the last step's statistics, which realizes the weight update and
    the forward that reads it): w stays a leaf whose gradient is x^T, and the forward keeps its value."""
    w = Tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    x = Tensor([[1.0, 1.0]])
    w.assign(w * 2)
    h = x @ w
    with no_grad() if under_no_grad else contextlib.nullcontext():
        w.realize()
    y = h.sum()
    y.backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), [[1.0, 1.0], [1.0, 1.0]])
    assert y.item() == 20.0


def test_a_state_written_every_step_and_read_by_a_loss() -> None:
    """`c.assign(c + 1)` each step (a counter, a running value) while a loss reads c: the write realized by the next
    one records lineage; the next backward must not substitute it into the pending write (which once made the
    scheduler fail on an ASSIGN into an expression) nor recompute c from the version the write replaced."""
    c = Tensor([1.0])
    w = Tensor([2.0], requires_grad=True)
    for expected in (2.0, 3.0, 4.0):
        c.assign(c + 1)
        w.grad = None
        (w * c).sum().backward()
        assert w.grad is not None
        assert w.grad.numpy().tolist() == [expected]
        assert c.numpy().tolist() == [expected]


def test_assign_takes_data_as_tinygrad_does() -> None:
    """`w.assign(numpy_array)` / `w.assign([[...]])` write that data (in w's dtype), as tinygrad's assign makes a
    Tensor of it; it once went to `Tensor.full` and built a broken graph that failed deep in the scheduler, which
    now raises a TypeError for a non-scalar fill value."""
    w = Tensor.zeros(2, 2).contiguous().realize()
    w.assign(np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(w.numpy(), [[1, 2], [3, 4]])
    assert w.dtype == dtypes.float32
    buf = _buffer(w)
    w.assign([[5.0, 6.0], [7.0, 8.0]])
    np.testing.assert_array_equal(w.numpy(), [[5, 6], [7, 8]])
    assert _buffer(w) is buf
    w.assign(np.float32(3))
    np.testing.assert_array_equal(w.numpy(), [[3, 3], [3, 3]])
    with pytest.raises(TypeError, match="fill_value must be a scalar"):
        Tensor.full((2,), np.array([1.0, 2.0]))


def test_inplace_operators_write_the_buffer_and_through_views() -> None:
    """`x += 1` writes x's own buffer (an alias taken before keeps seeing x, a tensor built from x before keeps its
    value), and `v += 1` on a view `v = x[1:3]` writes x, as in PyTorch."""
    x = Tensor([1.0, 2.0, 3.0, 4.0]).contiguous().realize()
    before = x * 1
    x += 1
    buf = _buffer(x.realize())
    x *= 2
    assert _buffer(x.realize()) is buf
    np.testing.assert_array_equal(x.numpy(), [4, 6, 8, 10])
    np.testing.assert_array_equal(before.numpy(), [1, 2, 3, 4])
    v = x[1:3]
    v += 1
    np.testing.assert_array_equal(v.numpy(), [7, 9])
    np.testing.assert_array_equal(x.numpy(), [4, 7, 9, 10])


def test_pending_writes_are_found_among_many_assign_targets() -> None:
    """A realize looks only at the assign targets whose write is pending (`_PENDING_ASSIGNS`), not at every one:
    with many settled targets around, a lazy reader of a version that a pending write overwrites still keeps the
    value it had, whichever tensor's realize runs the write, and a target stops being pending once written."""
    from glassgrad.tensor import _pending_assigns
    settled = [Tensor(np.full(3, i, np.float32)).realize() for i in range(20)]
    for t in settled:
        t.assign(t + 1).realize()
    w = Tensor(np.arange(3, dtype=np.float32)).realize()
    w.assign(w + 1).realize()
    reader = w * 2  # reads version 1 of w's buffer
    w.assign(w + 10)
    assert _pending_assigns() == [w]
    (Tensor(np.ones(3, np.float32)) + 1).realize()  # an unrelated realize leaves the write pending
    assert _pending_assigns() == [w]
    settled[0].assign(settled[0] * 3).realize()
    assert _pending_assigns() == [w]
    w.realize()
    assert _pending_assigns() == []
    np.testing.assert_array_equal(reader.numpy(), (np.arange(3) + 1) * 2)
    np.testing.assert_array_equal(w.numpy(), np.arange(3) + 11)
    np.testing.assert_array_equal(settled[0].numpy(), np.full(3, 3.0))


def test_a_pending_write_taken_over_by_replace_is_still_ordered_after_its_readers() -> None:
    """`replace` can give an assign target another target's pending ASSIGN node: it then counts as pending too,
    and realizing it runs the write after the lazy readers of the old version (they keep their values)."""
    a = Tensor(np.zeros(3, np.float32)).realize()
    a.assign(a + 1).realize()  # a is an assign target
    b = Tensor(np.arange(3, dtype=np.float32)).realize()
    b.assign(b + 1).realize()
    old = b + 0.5  # reads b's version 1
    b.assign(b * 4)
    a.replace(b)
    a.realize()
    np.testing.assert_array_equal(old.numpy(), np.arange(3) + 1.5)
    np.testing.assert_array_equal(a.numpy(), (np.arange(3) + 1) * 4)
    np.testing.assert_array_equal(b.numpy(), (np.arange(3) + 1) * 4)


@pytest.mark.parametrize("op", ["sum", "max", "prod", "sum_no_axes", "cumsum", "reshape", "expand", "squeeze", "t",
                                "ellipsis", "floor_int", "abs_uint8", "round_int"])
def test_an_op_that_changes_nothing_keeps_its_value_after_an_assign(op: str) -> None:
    """`y = x.sum()` of a 0-d x (and other ops whose result equals their input) was x itself, so `x.assign(...)`
    changed y too: a tensor means the value it had when built (program fuzz: `v2 = v0.sum(); v0.assign(v0 + v0)`
    gave v2 the new value). Movement ops give a view (writes go through, as PyTorch's), the others a new tensor."""
    base = np.array([3, 1], np.uint8) if op == "abs_uint8" else np.array([3, -1], np.int32) if op.endswith("int") \
        else np.array(0.5, np.float32) if op in ("sum", "max", "prod", "cumsum", "squeeze", "ellipsis") \
        else np.array([0.5, 1.5], np.float32)
    x = Tensor(base)
    y = {"sum": lambda: x.sum(), "max": lambda: x.max(), "prod": lambda: x.prod(), "sum_no_axes": lambda: x.sum(()),
         "cumsum": lambda: x.cumsum(0), "reshape": lambda: x.reshape(2), "expand": lambda: x.expand(2),
         "squeeze": lambda: x.squeeze(0), "t": lambda: x.t(), "ellipsis": lambda: x[...],
         "floor_int": lambda: x.floor(), "abs_uint8": lambda: x.abs(), "round_int": lambda: x.round()}[op]()
    assert y is not x
    x.assign(x + x)
    np.testing.assert_array_equal(y.numpy(), base)
    np.testing.assert_array_equal(x.numpy(), base + base)
    y2 = {"reshape": lambda: x.reshape(2), "floor_int": lambda: x.floor()}.get(op)
    if y2 is not None:  # and a write into the result: through the view into x, never into x for a new value
        z = y2()
        z.assign(z + 1)
        np.testing.assert_array_equal(x.numpy(), 2 * base + (1 if op == "reshape" else 0))


@pytest.mark.parametrize("asked", ["b_x_a", "x_a"])
def test_a_node_computed_into_a_buffer_that_is_then_overwritten_keeps_its_value(asked: str) -> None:
    """`a = -x; b = -x` (one node); `a.assign(a + 1)` first computes -x into a's new buffer, which also stands for b.
    Realizing a's write and x's together left b naming the overwritten version: "reads ... as it was before an
    assign overwrote it" (program fuzz). b keeps -x."""
    x = Tensor(np.float32(0.5))
    a, b = -x, -x
    a.assign(a + 1)
    x.assign(x + 1)
    Tensor.realize(*((b, x, a) if asked == "b_x_a" else (x, a)))
    np.testing.assert_array_equal(b.numpy(), -0.5)
    np.testing.assert_array_equal(a.numpy(), 0.5)
    np.testing.assert_array_equal(x.numpy(), 1.5)


@pytest.mark.parametrize("shape", [(), (1,), (3,), (4, 5)])
@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_a_kernel_reads_a_buffer_before_another_output_overwrites_it(shape: tuple[int, ...], dtype: Any) -> None:
    """`b = -x` realized with `x.assign(x - x)`: for ints x - x folds to 0, so the store into x read nothing and the
    one kernel of both outputs stored x's 0 before loading x for b, which came out 0 (program fuzz: silently
    wrong). A kernel loads every buffer it writes before its first store."""
    x = Tensor(np.full(shape, 4, dtype))
    b = -x
    x.assign(x - x)
    Tensor.realize(b, x)
    np.testing.assert_array_equal(b.numpy(), np.full(shape, -4, dtype))
    np.testing.assert_array_equal(x.numpy(), np.zeros(shape, dtype))


@pytest.mark.parametrize("how", ["assign", "setitem", "contiguous"])
def test_a_tensor_realized_into_another_ones_buffer_does_not_write_it(how: str) -> None:
    """`a = -x; a.assign(x)` computes -x into a's new buffer first; `c = -x` (the same node) realized then is a view
    of a's buffer, and c's own write claimed that buffer too: two writes of one version ("internal error: two
    kernels of one schedule write version 2", program fuzz). Only a buffer's owner writes it in place."""
    x = Tensor(np.array([4, 5], np.int32))
    a = (-x).contiguous() if how == "contiguous" else -x
    a.assign(x)
    c = ((-x).contiguous() if how == "contiguous" else -x).realize()
    if how == "setitem":
        c[0] = 9
    else:
        c.assign(c * 10)
    np.testing.assert_array_equal(a.numpy(), [4, 5])
    np.testing.assert_array_equal(c.numpy(), [9, -5] if how == "setitem" else [-40, -50])
    np.testing.assert_array_equal(x.numpy(), [4, 5])


def test_a_result_equal_to_its_input_does_not_write_the_input() -> None:
    """`y = x.sum()` of a 0-d x shares x's buffer: an assign to y writes a buffer of y's own."""
    x = Tensor(np.float32(0.5))
    y = x.sum()
    y.assign(y * 4)
    np.testing.assert_array_equal(x.numpy(), 0.5)
    np.testing.assert_array_equal(y.numpy(), 2.0)


@pytest.mark.parametrize("make", ["reshape", "reshape_same", "sum_no_axes", "detach", "add"])
@pytest.mark.parametrize("together", [False, True])
def test_a_view_of_a_pending_assign_keeps_its_value_after_the_next_assign(make: str, together: bool) -> None:
    """`x.assign(v); y = x.reshape(1, 1); x.assign(x + 4)`: y is a reshape of the first assign, which the second
    assign's own-buffer step realizes; y then ran no kernel and named x's buffer, and showed the second value
    (8, not 4), silently. Same for `x.sum(())` of a pending assign realized with the next one (program fuzz)."""
    x = Tensor(np.array([1], np.int32))
    x.assign(Tensor(np.array([4], np.int32)))
    y = {"reshape": lambda: x.reshape(1, 1), "reshape_same": lambda: x.reshape(1), "sum_no_axes": lambda: x.sum(()),
         "detach": lambda: x.detach(), "add": lambda: x + 0}[make]()
    x.assign(x + 4)
    if together:
        Tensor.realize(y, x)
    else:
        x.realize()
    np.testing.assert_array_equal(y.numpy().reshape(-1), [4])
    np.testing.assert_array_equal(x.numpy(), [8])
