"""Random numbers drawn on the device (`Tensor.rand/randn/randint/uniform/normal`, dropout): ranges, moments,
reproducibility by seed, independence of consecutive draws, shapes and dtypes, and the generator's state handling."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor, dtypes
from glassgrad.tensor import _RNG


def test_uniform_and_normal_moments() -> None:
    Tensor.manual_seed(3)
    u = Tensor.rand(200_000).numpy()
    assert u.dtype == np.float32 and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.std() - (1 / 12) ** 0.5) < 0.005
    n = Tensor.randn(200_000).numpy()
    assert abs(n.mean()) < 0.01 and abs(n.std() - 1) < 0.01
    assert abs(np.mean(np.abs(n) < 1) - 0.6827) < 0.01
    assert np.isfinite(n).all()


def test_randint_covers_its_range_evenly() -> None:
    Tensor.manual_seed(4)
    r = Tensor.randint(100_000, low=-3, high=7).numpy()
    assert r.dtype == np.int32 and r.min() == -3 and r.max() == 6
    counts = np.bincount(r + 3)
    assert counts.min() > 9_500 and counts.max() < 10_500
    with pytest.raises(ValueError, match="low < high"):
        Tensor.randint(3, low=5, high=5)


def test_same_seed_same_numbers_and_consecutive_draws_differ() -> None:
    Tensor.manual_seed(11)
    a, b = Tensor.rand(64), Tensor.rand(64)
    first = (a.numpy(), b.numpy())
    assert not np.array_equal(*first)
    Tensor.manual_seed(11)
    again = (Tensor.rand(64).numpy(), Tensor.rand(64).numpy())
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    Tensor.manual_seed(12)
    assert not np.array_equal(Tensor.rand(64).numpy(), first[0])


def test_a_draw_keeps_its_numbers_after_later_draws() -> None:
    """A lazy random tensor is a value: drawing more (which advances the generator in place) does not change it."""
    Tensor.manual_seed(0)
    x = Tensor.rand(16)
    y = Tensor.rand(16).realize()
    first = x.numpy()
    for _ in range(3):
        Tensor.rand(8).realize()
    np.testing.assert_array_equal(x.numpy(), first)
    assert not np.array_equal(first, y.numpy())


def test_shapes_dtypes_and_empty_draws() -> None:
    assert Tensor.rand(2, 3, dtype=dtypes.float16).dtype == dtypes.float16
    assert Tensor.randn((4, 5)).shape == (4, 5)
    assert Tensor.rand(0, 3).numpy().shape == (0, 3)
    w = Tensor.uniform(3, 4, low=-2, high=-1, requires_grad=True)
    assert w.requires_grad and ((w.numpy() >= -2) & (w.numpy() < -1)).all()
    assert abs(Tensor.normal(50_000, mean=3, std=0.5).numpy().std() - 0.5) < 0.01


def test_an_advance_left_pending_is_applied_once() -> None:
    """A realize that failed after queueing the generator's advance leaves it pending; the next one applies it (no
    recursion, no repeated numbers)."""
    Tensor.manual_seed(5)
    a = Tensor.rand(4)
    pending = _RNG.advances()  # queued, never realized (as after an exception inside realize)
    assert pending
    b = Tensor.rand(4)
    Tensor.realize_all(a, b)
    assert not np.array_equal(a.numpy(), b.numpy())


def test_dropout_masks_and_scales() -> None:
    Tensor.manual_seed(2)
    with Tensor.train():
        out = Tensor.ones(100_000).dropout(0.25).numpy()
    assert set(np.unique(out)) == {0.0, np.float32(1 / 0.75)}
    assert abs((out == 0).mean() - 0.25) < 0.01
