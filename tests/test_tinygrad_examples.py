"""The patterns of tinygrad's example programs (examples/*.py, run with only their imports changed), each reduced to
a few lines and checked against numpy: the ones that failed or differed here, so they stay fixed."""
from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest
from test_ops import DEVICE, rand

from glassgrad import Tensor, TinyJit, nn


def _softmax_xent_step(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float) -> tuple[float, np.ndarray]:
    """numpy: the mean cross-entropy of softmax(x @ w.T) against labels y, and w after one SGD step on it."""
    logits = x.astype(np.float64) @ w.T.astype(np.float64)
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    p[np.arange(len(y)), y] -= 1
    return float(loss), (w - lr * (p.T @ x) / len(y)).astype(np.float32)


@pytest.mark.parametrize("drawn", ["images", "labels", "both"])
def test_jitted_step_gathers_from_a_data_set_drawn_with_rand(drawn: str) -> None:
    """A data set made with Tensor.randn/randint and realized before a TinyJit training step that draws its
    minibatch indices inside (minrf.py and beautiful_mnist.py on synthetic data). Realized tensors keep the graph that
    made them for autograd; the capture hides earlier results, so it recomputed the set from the random generator's
    state, which later draws had overwritten, and raised "reads ... as it was before an assign overwrote it"."""
    Tensor.manual_seed(1)
    rng = np.random.default_rng(0)
    x = Tensor.randn(32, 4, device=DEVICE).realize() if drawn != "labels" else \
        Tensor(rng.standard_normal((32, 4)).astype(np.float32), device=DEVICE)
    y = Tensor.randint(32, high=3, device=DEVICE).realize() if drawn != "images" else \
        Tensor(rng.integers(0, 3, 32).astype(np.int32), device=DEVICE)
    w_np = rand((3, 4), seed=2)
    w = Tensor(w_np, device=DEVICE, requires_grad=True)
    opt = nn.optim.SGD([w], lr=0.5)

    @TinyJit
    def step() -> tuple[Tensor, Tensor]:
        samples = Tensor.randint(8, high=32, device=DEVICE)
        opt.zero_grad()
        loss = (x[samples] @ w.T).sparse_categorical_crossentropy(y[samples])
        loss.backward()
        opt.step()
        return loss.realize(), samples.realize()

    x_np, y_np = x.numpy(), y.numpy()
    with Tensor.train():
        for _ in range(5):  # eager, capture, three replays
            loss, samples = step()
            idx = samples.numpy()
            want_loss, w_np = _softmax_xent_step(w_np, x_np[idx], y_np[idx], 0.5)
            np.testing.assert_allclose(loss.item(), want_loss, rtol=1e-5)
            np.testing.assert_allclose(w.numpy(), w_np, rtol=1e-5, atol=1e-6)


def test_speed_only_flags_are_accepted() -> None:
    """beautiful_cifar.py enters `Context(DEFAULT_FLOAT=dtypes.half, FUSE_OPTIM=1)` and hlb_cifar10.py imports WINO
    and sets it with `Context(WINO=...)`: flags that choose how tinygrad computes, not what. They are accepted (and
    restored on exit); a flag that would change results here still raises."""
    from glassgrad.helpers import FUSE_OPTIM, WINO, Context
    with Context(FUSE_OPTIM=1, WINO=1):
        assert FUSE_OPTIM.value == 1 and WINO.value == 1
        out = (Tensor([[1.0, 2.0]], device=DEVICE) @ Tensor([[3.0], [4.0]], device=DEVICE)).item()
    assert out == 11.0 and FUSE_OPTIM.value == 0 and WINO.value == 0
    with pytest.raises(KeyError, match="IMAGE"):
        with Context(IMAGE=2):
            pass


def test_fetch_downloads_once_into_the_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """tinygrad's examples import `fetch` from helpers at the top (mamba.py, gpt2.py, llama.py): without it they
    could not even run a model built with random weights. It downloads a URL once, gunzips on request, checks an
    optional SHA-256 and leaves no partial file behind."""
    import gzip
    import hashlib
    import io

    from glassgrad import helpers
    served: list[str] = []
    payload = b"weights" * 1000

    def serve(url: str, headers: dict[str, str]) -> io.BytesIO:
        served.append(url)
        return io.BytesIO(gzip.compress(payload) if url.endswith(".gz") else payload)
    monkeypatch.setenv("CACHEDIR", str(tmp_path))
    monkeypatch.setattr(helpers, "_open_url", serve)
    path = helpers.fetch("https://example.invalid/model.bin")
    assert path.read_bytes() == payload and path.parent == tmp_path / "downloads"
    assert helpers.fetch("https://example.invalid/model.bin") == path and len(served) == 1  # cached
    unzipped = helpers.fetch("https://example.invalid/data.gz", gunzip=True, subdir="sets")
    assert unzipped.read_bytes() == payload and unzipped.name.endswith(".gunzip") and unzipped.parent.name == "sets"
    good = hashlib.sha256(payload).hexdigest()
    assert helpers.fetch("https://example.invalid/w", name="w.bin", sha256=good).read_bytes() == payload
    with pytest.raises(ValueError, match="SHA-256"):
        helpers.fetch("https://example.invalid/v", name="v.bin", sha256="0" * 64)
    assert not (tmp_path / "downloads" / "v.bin").exists()
    assert sorted(p.name for p in (tmp_path / "downloads").iterdir()) == sorted([path.name, "sets", "w.bin"])
    assert helpers.fetch("./local/file.bin") == pathlib.Path("./local/file.bin")


def test_global_counters_from_helpers() -> None:
    """tinygrad keeps GlobalCounters in helpers (hlb_cifar10.py's extra/bench_log.py imports it from there)."""
    from glassgrad import GlobalCounters as top
    from glassgrad.helpers import GlobalCounters
    assert GlobalCounters is top
    with pytest.raises(ImportError):
        from glassgrad.helpers import NotAHelper  # type: ignore[attr-defined]  # noqa: F401


def test_global_counters_mem_used_counts_live_buffers() -> None:
    """hlb_cifar10 prints `GlobalCounters.mem_used / 1e9` every step: the bytes the devices' buffers hold now."""
    import gc

    from glassgrad import GlobalCounters
    gc.collect()  # (an earlier test's cyclic garbage, freed by a collection mid-test, would move the count)
    gc.disable()
    try:
        before = GlobalCounters.mem_used
        t = Tensor.ones(1000, 250, device=DEVICE).contiguous().realize()
        assert GlobalCounters.mem_used - before == 1000 * 250 * 4
        del t
        assert GlobalCounters.mem_used == before
    finally:
        gc.enable()


def test_private_pool_gives_every_window_as_tinygrad_does() -> None:
    """hlb_cifar10's whitening takes its patches with tinygrad's private `Tensor._pool((h, w))`: every window over
    the last dims, (..., *out, *kernel), no padding, stride and dilation 1 unless given. Values against numpy's
    sliding windows, the patches' layout, a gradient (each input counted once per window holding it), bad sizes."""
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 7)).astype(np.float32)
    windows = np.lib.stride_tricks.sliding_window_view(x, (3, 2), axis=(2, 3))
    np.testing.assert_array_equal(Tensor(x)._pool((3, 2)).numpy(), windows)
    strided = np.lib.stride_tricks.sliding_window_view(x, (3, 5), axis=(2, 3))[:, :, ::2, ::2, :, ::2]
    np.testing.assert_array_equal(Tensor(x)._pool((3, 3), stride=2, dilation=(1, 2)).numpy(), strided)
    patches = Tensor(x)._pool((3, 3)).permute(1, 4, 5, 0, 3, 2).reshape(3 * 3 * 3, -1)
    expected = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3)).transpose(1, 4, 5, 0, 3, 2)
    np.testing.assert_array_equal(patches.numpy(), expected.reshape(27, -1))
    t = Tensor(x, requires_grad=True)
    (grad,) = t._pool((3, 2)).sum().gradient(t)
    count = np.lib.stride_tricks.sliding_window_view(np.zeros((8, 7)), (3, 2)).shape[:2]
    ones = np.zeros((8, 7))
    for i in range(count[0]):
        for j in range(count[1]):
            ones[i:i + 3, j:j + 2] += 1
    np.testing.assert_array_equal(grad.numpy(), np.broadcast_to(ones, x.shape))
    with pytest.raises(ValueError, match="larger than the input"):
        Tensor(x)._pool((9, 2))
