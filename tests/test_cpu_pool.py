"""The CPU backend's C thread pool: kernels split into chunks over threads give the single-thread results."""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Device, Tensor
from glassgrad.runtime import ops_cpu

pytestmark = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the CPU backend's thread pool")


@pytest.fixture
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_cpu, "THREADS", 2)
    monkeypatch.setattr(ops_cpu, "MIN_WORK_PER_THREAD", 1)  # every kernel with 2+ outer iterations is split


def test_the_pool_builds_and_kernels_have_entry_points(two_threads: None) -> None:
    out = (Tensor(np.ones((64, 64), np.float32)) * 2).sum(axis=1)
    np.testing.assert_array_equal(out.numpy(), np.full(64, 128, np.float32))
    from glassgrad.engine.realize import _kernel_cache
    programs = [k.program for k in _kernel_cache.values() if isinstance(k.program, ops_cpu.CPUProgram)]
    assert programs and all(p.entry is not None for p in programs)
    assert programs[0].pool is not None and programs[0].pool.get() is not None


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 8, 9, 1000])
def test_split_rows_match_numpy(two_threads: None, rows: int) -> None:
    """Any row count: fewer rows than chunks, not a multiple of the chunk count, many."""
    x = np.random.default_rng(rows).standard_normal((rows, 77)).astype(np.float32)
    np.testing.assert_allclose(Tensor(x).softmax(-1).numpy(),
                               np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(
                                   -1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_many_launches_in_a_row(two_threads: None) -> None:
    """Kernel after kernel (the workers find each next job while still spinning): every result is right."""
    t = Tensor(np.arange(4096, dtype=np.float32).reshape(64, 64))
    expected = np.arange(4096, dtype=np.float32).reshape(64, 64)
    for i in range(200):
        t = t + 1
        if i % 50 == 49:
            np.testing.assert_array_equal(t.numpy(), expected + i + 1)


def test_symbolic_sizes_reach_the_kernel_through_the_entry_point(two_threads: None) -> None:
    from glassgrad import Variable
    x = np.random.default_rng(0).standard_normal((16, 40)).astype(np.float32)
    n = Variable("n", 1, 40).bind(33)
    out = (Tensor(x)[:, :n] * 2).contiguous()
    np.testing.assert_allclose(out.numpy(), x[:, :33] * 2, rtol=1e-6)


def test_without_the_c_pool_python_threads_run_the_kernel(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ops_cpu.LazyPool, "get", lambda self: None)
    x = np.random.default_rng(1).standard_normal((50, 30)).astype(np.float32)
    prog_out = (Tensor(x) * 5).sum(axis=1).numpy()
    np.testing.assert_allclose(prog_out, (x * 5).sum(axis=1), rtol=1e-5)
