"""glassgrad/tensor_linalg.py (einsum, sort, argsort, topk, qr, svd) and the data/device methods of Tensor (data,
replace, to_, shard, shard_, contiguous_backward).

Forward results are checked against numpy (always) and PyTorch (when importable); gradients against PyTorch, or
against finite differences when it is missing. QR and SVD are checked by their defining properties
(reconstruction, orthogonality, triangularity) and singular values against numpy's.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_ops_extra import check_grad, rand, torch

from glassgrad import Device, Tensor, dtypes

RNG = np.random.default_rng(11)


# ---------------------------------------------------------------------- einsum
EINSUM = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),  # implicit output: ik
    ("ii->", [(3, 3)]),  # trace
    ("ii->i", [(3, 3)]),  # diagonal
    ("ii", [(3, 3)]),  # implicit: trace
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->ji", [(2, 3)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),  # broadcast batch dims
    ("i...->...", [(3, 2, 4)]),
    ("...", [(2, 3)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
    ("i,i->", [(4,), (4,)]),
    ("iij->j", [(3, 3, 2)]),
    ("ij,ij,ij->i", [(2, 3), (2, 3), (2, 3)]),
    (" i j , j k -> i k ", [(2, 3), (3, 2)]),
    ("i,->i", [(3,), ()]),
]


@pytest.mark.parametrize("formula,shapes", EINSUM, ids=[f for f, _ in EINSUM])
def test_einsum(formula: str, shapes: list[tuple[int, ...]]) -> None:
    xs = [rand(*s) for s in shapes]
    got = Tensor.einsum(formula, *[Tensor(x) for x in xs])
    ref = np.einsum(formula.replace(" ", ""), *xs)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got.numpy(), ref, rtol=1e-5, atol=1e-5)
    if torch is not None:
        np.testing.assert_allclose(got.numpy(), torch.einsum(formula, *[torch.tensor(x) for x in xs]).numpy(),
                                   rtol=1e-5, atol=1e-5)
        check_grad(lambda *ts: Tensor.einsum(formula, *ts), lambda *ts: torch.einsum(formula, *ts), *xs)


def test_einsum_dtype_and_errors() -> None:
    x = Tensor([[1, 2], [3, 4]])
    assert Tensor.einsum("ij,jk->ik", x, x).tolist() == [[7, 10], [15, 22]]
    assert Tensor.einsum("ij->", x, dtype=dtypes.float32).dtype == dtypes.float32
    with pytest.raises(ValueError, match="2 operands"):
        Tensor.einsum("ij,jk->ik", x)
    with pytest.raises(ValueError, match="names 3 dims"):
        Tensor.einsum("ijk->i", x)
    with pytest.raises(ValueError, match="sizes 2 and 3"):
        Tensor.einsum("ij,jk->ik", x, Tensor(rand(3, 3)))
    with pytest.raises(ValueError, match="distinct letters"):
        Tensor.einsum("ij->iq", x)


# ---------------------------------------------------------------------- sort, argsort, topk
@pytest.mark.parametrize("shape,dim", [((7,), -1), ((3, 5), 1), ((3, 5), 0), ((2, 3, 16), -1), ((2, 9, 3), 1)])
@pytest.mark.parametrize("descending", [False, True])
def test_sort(shape: tuple[int, ...], dim: int, descending: bool) -> None:
    x = RNG.integers(0, 5, shape).astype(np.float32)  # many ties: the result must be stable
    values, idx = Tensor(x).sort(dim, descending)
    order = np.argsort(-x if descending else x, axis=dim, kind="stable")
    np.testing.assert_array_equal(idx.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, order, dim))
    assert idx.dtype == dtypes.int32
    np.testing.assert_array_equal(Tensor(x).argsort(dim, descending).numpy(), order)
    if torch is not None:
        tv, ti = torch.sort(torch.tensor(x), dim=dim, descending=descending, stable=True)
        np.testing.assert_array_equal(idx.numpy(), ti.numpy())
        xf = rand(*shape)
        check_grad(lambda t: t.sort(dim, descending)[0], lambda t: torch.sort(t, dim, descending)[0], xf)


def test_sort_ints_infinities_and_edges() -> None:
    ints = np.array([5, -2147483648, 2147483647, 0, 3], np.int32)
    np.testing.assert_array_equal(Tensor(ints).sort()[0].numpy(), np.sort(ints))
    np.testing.assert_array_equal(Tensor(ints).sort(descending=True)[0].numpy(), np.sort(ints)[::-1])
    inf = np.array([np.inf, 1.0, -np.inf, np.inf, 0.0], np.float32)  # real infinities sort before the padding
    np.testing.assert_array_equal(Tensor(inf).argsort().numpy(), np.argsort(inf, kind="stable"))
    values, idx = Tensor(3.0).sort()
    assert values.item() == 3.0 and idx.item() == 0
    assert Tensor.zeros(2, 0).sort(-1)[0].shape == (2, 0)
    assert Tensor(rand(4, 1)).sort(-1)[1].tolist() == [[0]] * 4
    x = rand(5, 3)
    np.testing.assert_array_equal(Tensor(x).T.sort(-1)[0].numpy(), np.sort(x.T, -1))  # non-contiguous input
    with pytest.raises(IndexError):
        Tensor(x).sort(2)


@pytest.mark.parametrize("n,k", [(10, 3), (10, 10), (300, 5), (300, 200), (33, 0)])
@pytest.mark.parametrize("largest", [True, False])
def test_topk(n: int, k: int, largest: bool) -> None:
    x = RNG.integers(0, 50, (3, n)).astype(np.float32)
    values, idx = Tensor(x).topk(k, largest=largest)
    order = np.argsort(-x if largest else x, axis=-1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, order, -1))
    assert values.shape == idx.shape == (3, k)
    if torch is not None and k:
        xf = rand(2, n)  # no ties: PyTorch's tie order is unspecified
        tv, ti = torch.topk(torch.tensor(xf), k, largest=largest)
        np.testing.assert_array_equal(Tensor(xf).topk(k, largest=largest)[1].numpy(), ti.numpy())
        check_grad(lambda t: t.topk(k, largest=largest)[0], lambda t: torch.topk(t, k, largest=largest)[0], xf)


def test_topk_dims_nan_and_errors() -> None:
    x = rand(4, 6, 5)
    values, idx = Tensor(x).topk(2, dim=1)
    order = np.argsort(-x, axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(idx.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, order, 1))
    nan = Tensor([1.0, np.nan, 3.0, -np.inf]).topk(2)  # NaN counts as the largest, as in PyTorch
    assert nan[1].tolist() == [1, 2]
    low = Tensor([-np.inf, -np.inf, 2.0]).topk(3)  # -inf values are never confused with taken ones
    assert low[1].tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match="out of range"):
        Tensor(x).topk(7, dim=1)
    with pytest.raises(NotImplementedError, match="sorted_"):
        Tensor(x).topk(2, sorted_=False)


@pytest.mark.parametrize("n", [5, 8, 13, 40])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_topk_with_nan(n: int, descending: bool) -> None:
    """NaN sorts as the largest value (last ascending, first descending; numpy, PyTorch). A comparison with NaN is
    false, so one NaN left the bitonic network's output unsorted ([1, nan, 3, -inf] came back as it was), and
    topk(largest=False) picked NaN as the smallest."""
    rng = np.random.default_rng(n)
    x = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, 2.5, -3.0], np.float32), (3, n))
    x[:, 1] = np.nan
    values, idx = Tensor(x).sort(-1, descending)
    # ascending: numpy's stable order (NaN last); descending: NaN first, then the numbers largest first, ties in order
    order = np.argsort(np.where(np.isnan(x), -np.inf, -x) if descending else x, axis=-1, kind="stable")
    if descending:
        order = np.stack([np.concatenate([np.flatnonzero(np.isnan(r)), o[~np.isnan(r[o])]]) for r, o in zip(x, order)])
    np.testing.assert_array_equal(idx.numpy(), order)
    np.testing.assert_array_equal(values.numpy(), np.take_along_axis(x, order, -1))
    for k in (1, n // 2, n):
        top = Tensor(x).topk(k, largest=descending)
        np.testing.assert_array_equal(top[0].numpy(), np.take_along_axis(x, order[:, :k], -1))
    if torch is not None:
        tv, ti = torch.sort(torch.tensor(x), dim=-1, descending=descending, stable=True)
        np.testing.assert_array_equal(idx.numpy(), ti.numpy())
        for k in (1, n // 2, n):
            np.testing.assert_array_equal(Tensor(x).topk(k, largest=descending)[0].numpy(),
                                          torch.topk(torch.tensor(x), k, largest=descending)[0].numpy())
    assert Tensor([1.0, np.nan, 3.0, -np.inf]).sort()[0].numpy().tolist()[:3] == [-np.inf, 1.0, 3.0]


def test_topk_for_sampling_vocab() -> None:
    """topk along the vocabulary of (B, vocab) logits, as a GPT sampler calls it."""
    logits = RNG.standard_normal((2, 8192)).astype(np.float32)
    values, idx = Tensor(logits).topk(40)
    np.testing.assert_array_equal(idx.numpy(), np.argsort(-logits, -1, kind="stable")[:, :40])


# ---------------------------------------------------------------------- qr and svd
@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3), (1, 1), (6, 2)])
def test_qr(shape: tuple[int, ...]) -> None:
    a = rand(*shape)
    q, r = Tensor(a).qr()
    m, n = shape[-2:]
    assert q.shape == (*shape[:-2], m, m) and r.shape == shape
    qn, rn = q.numpy(), r.numpy()
    np.testing.assert_allclose(qn @ rn, a, atol=1e-5)
    np.testing.assert_allclose(np.swapaxes(qn, -1, -2) @ qn, np.broadcast_to(np.eye(m), qn.shape), atol=1e-5)
    np.testing.assert_array_equal(rn, np.triu(rn))
    ref_r = np.linalg.qr(a, mode="complete")[1]  # unique up to the signs of R's rows
    np.testing.assert_allclose(np.abs(rn), np.abs(ref_r), atol=1e-5)


def test_qr_rank_deficient_and_errors() -> None:
    a = np.array([[1.0, 2.0], [2.0, 4.0], [0.0, 0.0]], np.float32)
    q, r = Tensor(a).qr()
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-6)
    zero_q, zero_r = Tensor.zeros(3, 2).qr()
    assert np.isfinite(zero_q.numpy()).all() and (zero_r.numpy() == 0).all()
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor([1.0, 2.0]).qr()


@pytest.mark.parametrize("shape", [(4, 4), (5, 3), (3, 5), (2, 4, 3), (6, 1), (3, 3, 3)])
@pytest.mark.parametrize("full_matrices", [True, False])
def test_svd(shape: tuple[int, ...], full_matrices: bool) -> None:
    a = rand(*shape)
    u, s, vh = Tensor(a).svd(full_matrices)
    un, sn, vhn = u.numpy(), s.numpy(), vh.numpy()
    ref_u, ref_s, ref_vh = np.linalg.svd(a, full_matrices=full_matrices)
    assert un.shape == ref_u.shape and sn.shape == ref_s.shape
    np.testing.assert_allclose(sn, ref_s, rtol=1e-4, atol=1e-5)
    k = min(shape[-2:])
    recon = (un[..., :, :k] * sn[..., None, :]) @ vhn[..., :k, :]
    np.testing.assert_allclose(recon, a, atol=1e-4)
    for mat in (un, np.swapaxes(vhn, -1, -2)):
        eye = np.swapaxes(mat, -1, -2) @ mat
        np.testing.assert_allclose(eye, np.broadcast_to(np.eye(eye.shape[-1]), eye.shape), atol=1e-4)
    assert (np.diff(sn, axis=-1) <= 1e-6).all()  # descending


def test_svd_errors() -> None:
    with pytest.raises(ValueError, match="at least 2 dims"):
        Tensor([1.0]).svd()


# ---------------------------------------------------------------------- data, replace, devices
def test_data() -> None:
    x = rand(2, 3)
    view = Tensor(x).data()
    assert isinstance(view, memoryview) and view.shape == (2, 3) and view.format == "f"
    assert view.tolist() == x.tolist()
    assert Tensor([1, 2]).data().format in ("i", "l") and Tensor(5).data().shape == ()
    assert Tensor.zeros(0, 2).data().nbytes == 0
    with pytest.raises(TypeError, match="bfloat16"):
        Tensor([1.0], dtype=dtypes.bfloat16).data()


def test_replace() -> None:
    t = Tensor([1.0, 2.0])
    other = Tensor([3, 4])
    assert t.replace(other) is t and t.tolist() == [3, 4] and t.dtype == dtypes.int32
    with pytest.raises(ValueError, match="shape"):
        t.replace(Tensor([1.0, 2.0, 3.0]))
    with pytest.raises(TypeError, match="Tensor"):
        t.replace([1, 2])  # type: ignore[arg-type]


def test_to_in_place_and_shard() -> None:
    t = Tensor([1.0, 2.0], requires_grad=True)
    (t * 2).sum().backward()
    assert t.to_(Device.DEFAULT) is t and t.grad is not None and t.grad.tolist() == [2.0, 2.0]
    s = t.shard((Device.DEFAULT,), axis=0)
    assert s.device == t.device and s.tolist() == [1.0, 2.0]
    u = Tensor([5.0])
    assert u.shard_((Device.DEFAULT,)) is u and u.tolist() == [5.0]
    with pytest.raises(ValueError, match="twice"):
        t.shard((Device.DEFAULT, Device.DEFAULT))
    with pytest.raises(TypeError, match="tuple of devices"):
        t.shard(Device.DEFAULT)  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        t.shard((Device.DEFAULT,), axis=3)


def test_contiguous_backward() -> None:
    x = rand(3, 4)
    a = Tensor(x, requires_grad=True)
    out = a.contiguous_backward()
    np.testing.assert_array_equal(out.numpy(), x)
    (a.contiguous_backward().T * Tensor(np.arange(12, dtype=np.float32).reshape(4, 3))).sum().backward()
    assert a.grad is not None
    np.testing.assert_array_equal(a.grad.numpy(), np.arange(12, dtype=np.float32).reshape(4, 3).T)


def test_nbytes_is_a_method() -> None:
    assert Tensor.zeros(3, 4).nbytes() == 48 and Tensor([1, 2], dtype=dtypes.int64).nbytes() == 16
