"""Tensor.assign: in-place writes into a tensor's own buffer, with the ordering hazards they bring."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import GlobalCounters, Tensor


def _buffer(t: Tensor) -> object:
    return t.uop.base.arg[0]


def test_assign_writes_in_place_into_the_same_buffer() -> None:
    p = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
    buf = _buffer(p)
    p.assign(p - 0.5).realize()
    np.testing.assert_array_equal(p.numpy(), np.arange(6, dtype=np.float32).reshape(2, 3) - 0.5)
    assert _buffer(p) is buf


def test_assign_is_one_kernel_for_elementwise_updates() -> None:
    p, g = Tensor.rand(32, 32).realize(), Tensor.rand(32, 32).realize()
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


def test_reading_a_version_overwritten_by_assign_raises() -> None:
    """A lazy graph built on a buffer's old contents cannot be computed once an assign overwrote them: error, not
    silently new numbers."""
    r = Tensor(np.arange(3, dtype=np.float32)).realize()
    old = r * 1
    r.assign(r * 10).realize()
    with pytest.raises(RuntimeError, match="before an assign overwrote it"):
        old.numpy()


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


def test_a_second_assign_while_the_first_is_pending() -> None:
    p = Tensor(np.zeros(3, np.float32))
    buf = _buffer(p)
    p.assign(p + 1)
    p.assign(p + 1)
    np.testing.assert_array_equal(p.numpy(), [2, 2, 2])
    assert _buffer(p) is buf
