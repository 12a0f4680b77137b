"""Behaviours that tinygrad's backend tests (test_dtype, test_setitem, test_jit, test_tensor, test_randomness, ...)
check, held by glassgrad: each one a bug that a tinygrad or PyTorch program could hit."""
from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from test_ops import DEVICE, T, torch

from glassgrad import Tensor, dtypes
from glassgrad.dtype import ALL_DTYPES, to_dtype


# ---------------------------------------------------------------------- dtypes namespace
@pytest.mark.parametrize("alias,numpy_name", [("char", "int8"), ("uchar", "uint8"), ("short", "int16"),
                                              ("ushort", "uint16"), ("uint", "uint32"), ("ulong", "uint64"),
                                              ("long", "int64")])
def test_c_style_dtype_aliases(alias: str, numpy_name: str) -> None:
    dt = getattr(dtypes, alias)
    assert dt.np == np.dtype(numpy_name)
    assert to_dtype(alias) is dt
    assert Tensor([1, 2], dtype=alias, device=DEVICE).numpy().dtype == np.dtype(numpy_name)


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=lambda d: d.name)
def test_dtype_predicates_as_functions(dt) -> None:  # type: ignore[no-untyped-def]
    npdt = np.dtype("float32" if dt is dtypes.bfloat16 else dt.np)
    assert dtypes.is_float(dt) == (npdt.kind == "f") == dt.is_float
    assert dtypes.is_int(dt) == (npdt.kind in "iu") == dt.is_int
    assert dtypes.is_unsigned(dt) == (npdt.kind == "u")
    assert dtypes.is_bool(dt) == (npdt.kind == "b")
    assert (dt in dtypes.floats, dt in dtypes.ints, dt in dtypes.uints, dt in dtypes.sints) == \
        (npdt.kind == "f", npdt.kind in "iu", npdt.kind == "u", npdt.kind == "i")
    assert (dt in dtypes.all) == (dt is not dtypes.void)


def test_finfo() -> None:
    for dt in (dtypes.float16, dtypes.float32, dtypes.float64):
        info = np.finfo(dt.np)
        assert dtypes.finfo(dt) == (info.bits - info.nmant - 1, info.nmant)
    assert dtypes.finfo(dtypes.bfloat16) == (8, 7)
    with pytest.raises(ValueError, match="not a floating point"):
        dtypes.finfo(dtypes.int32)


# ---------------------------------------------------------------------- in-place operators
@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_inplace_operator_on_state_is_replayed_by_tinyjit(op: str) -> None:
    """`x += y` on a realized tensor writes x's buffer (PyTorch's and tinygrad's in-place semantics), so the replays
    of a TinyJit keep updating x; rebinding x to a new graph made every replay recompute from the captured value."""
    from glassgrad import TinyJit
    x = Tensor([1.0, 2.0], device=DEVICE).realize()
    expected = np.array([1.0, 2.0], np.float32)

    @TinyJit
    def step(y: Tensor) -> Tensor:
        nonlocal x
        if op == "add":
            x += y
        elif op == "sub":
            x -= y
        elif op == "mul":
            x *= y
        else:
            x /= y
        return x

    for i in range(5):
        y = np.array([2.0, 0.5 + i], np.float32)
        step(Tensor(y, device=DEVICE))
        expected = {"add": expected + y, "sub": expected - y, "mul": expected * y, "div": expected / y}[op]
        np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6)


# ---------------------------------------------------------------------- TinyJit and in-place writes into inputs
def test_tinyjit_setitem_into_an_input_that_shares_its_buffer() -> None:
    """`Tensor.zeros(6, 6).contiguous().realize()` made in a loop realizes to one shared buffer (equal graphs); a
    setitem into it inside a TinyJit copied it into a buffer of its own during the capture, which the replays kept
    writing as state: from the third call on, the caller's tensor was never written (silently zeros)."""
    from glassgrad import TinyJit

    @TinyJit
    def f(t: Tensor, a: Tensor) -> Tensor:
        t[2:4, 3:5] = a
        return t

    for i in range(1, 6):
        t = Tensor.zeros(6, 6, device=DEVICE).contiguous().realize()
        a = Tensor.full((2, 2), float(i), device=DEVICE).contiguous()
        out = f(t, a)
        expected = np.zeros((6, 6), np.float32)
        expected[2:4, 3:5] = i
        np.testing.assert_equal(t.numpy(), expected)
        assert out is t  # the returned input is this call's tensor


def test_tinyjit_assign_into_a_shared_input_leaves_its_twin_alone() -> None:
    from glassgrad import TinyJit

    @TinyJit
    def f(t: Tensor) -> None:
        t.assign(t + 1).realize()

    for i in range(4):
        t = Tensor.ones(3, device=DEVICE).contiguous().realize()
        twin = Tensor.ones(3, device=DEVICE).contiguous().realize()  # the same graph: the same buffer
        f(t)
        np.testing.assert_equal(t.numpy(), [2.0, 2.0, 2.0], err_msg=f"call {i}")
        np.testing.assert_equal(twin.numpy(), [1.0, 1.0, 1.0], err_msg=f"call {i}")


# ---------------------------------------------------------------------- detach shares storage
def test_setitem_and_assign_through_detach_write_the_tensor() -> None:
    """PyTorch's and tinygrad's `detach()` share the tensor's storage; glassgrad's made a new tensor, so
    `t.detach()[1, 2] = 5` was silently lost."""
    t = Tensor.zeros(3, 3, device=DEVICE).contiguous().realize()
    t.detach()[1, 2] = 5
    t.detach().T[0, 1] = 7  # t[1, 0]
    expected = np.zeros((3, 3), np.float32)
    expected[1, 2], expected[1, 0] = 5, 7
    np.testing.assert_equal(t.numpy(), expected)
    w = Tensor(np.ones(3, np.float32), device=DEVICE, requires_grad=True)
    w.detach().assign(Tensor([1.0, 2.0, 3.0], device=DEVICE)).realize()
    np.testing.assert_equal(w.numpy(), [1.0, 2.0, 3.0])
    (w * w.detach()).sum().backward()  # detach still cuts the gradient
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), [1.0, 2.0, 3.0])


# ---------------------------------------------------------------------- random numbers
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32])
def test_rand_of_a_narrow_float_stays_below_one(dt) -> None:  # type: ignore[no-untyped-def]
    """rand drew 24 bits in float32 and cast: values within half an ulp of 1 rounded up to 1.0 in float16 (8 in
    32768) and bfloat16 (~70), outside PyTorch's [0, 1)."""
    Tensor.manual_seed(0)
    x = Tensor.rand(2, 128, 128, dtype=dt, device=DEVICE)
    assert x.dtype == dt
    v = x.float().numpy()
    assert v.min() >= 0.0 and v.max() < 1.0
    assert (v == 0).any() or dt is dtypes.float32  # the low end is still drawn
    assert abs(v.mean() - 0.5) < 0.01


# ---------------------------------------------------------------------- tinygrad's state flags in Context
def test_context_training_is_tensor_training() -> None:
    """tinygrad 0.14 turns dropout and BatchNorm's batch statistics on with Context(TRAINING=1) (it has no
    Tensor.train()); glassgrad raised KeyError ("no meaning in glassgrad")."""
    from glassgrad import Context, nn
    x = Tensor.ones(4000, device=DEVICE)
    assert not Tensor.training
    with Context(TRAINING=1):
        assert Tensor.training
        dropped = float((x.dropout(0.5) == 0).float().mean().item())
        bn = nn.BatchNorm(3)
        batch = np.random.default_rng(0).standard_normal((8, 3, 2, 2)).astype(np.float32)
        out = bn(Tensor(batch, device=DEVICE)).numpy()
    assert not Tensor.training
    assert 0.45 < dropped < 0.55
    mean, var = batch.mean((0, 2, 3), keepdims=True), batch.var((0, 2, 3), keepdims=True)
    np.testing.assert_allclose(out, (batch - mean) / np.sqrt(var + 1e-5), atol=1e-4)  # batch statistics used
    np.testing.assert_equal(x.dropout(0.5).numpy(), x.numpy())
    with pytest.raises(ZeroDivisionError), Context(TRAINING=1):
        _ = 1 / 0
    assert not Tensor.training  # restored on an exception too


def test_training_reads_on_the_class_and_on_an_instance() -> None:
    """tinygrad's `training` was a class attribute, so `t.training` read it too; here it raised AttributeError (the
    flag was only a metaclass property). Assignment on the class keeps working; on one tensor it raises."""
    from glassgrad import Context
    t = Tensor([1.0], device=DEVICE)
    assert Tensor.training is False and t.training is False
    Tensor.training = True
    try:
        assert Tensor.training is True and t.training is True
        with Tensor.train(False):
            assert not t.training
        assert t.training
    finally:
        Tensor.training = False
    assert not t.training
    with Context(TRAINING=1):
        assert t.training and Tensor([2.0], device=DEVICE).training
    with pytest.raises(AttributeError, match="Tensor.training"):
        t.training = True  # the flag is process-wide
    assert not Tensor.training


# ---------------------------------------------------------------------- bitcast to a dtype of another size
def _random_bytes(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _numpy_bitcast(a: np.ndarray, src: Any, dst: Any) -> np.ndarray:
    """numpy's view of `a`'s bytes (bfloat16 is carried as uint16 bits, numpy has no bfloat16)."""
    store = {dtypes.bfloat16: np.uint16}
    return np.ascontiguousarray(a).view(store.get(dst, dst.np))


BITCAST_PAIRS = [(dtypes.float32, dtypes.uint8), (dtypes.uint8, dtypes.float32), (dtypes.float32, dtypes.float16),
                 (dtypes.int16, dtypes.float64), (dtypes.float64, dtypes.int8), (dtypes.bfloat16, dtypes.uint8),
                 (dtypes.uint8, dtypes.bfloat16), (dtypes.int64, dtypes.uint32), (dtypes.uint16, dtypes.int64),
                 (dtypes.int8, dtypes.int32), (dtypes.bool, dtypes.int16), (dtypes.int32, dtypes.uint16)]


@pytest.mark.parametrize("src,dst", BITCAST_PAIRS, ids=lambda d: d.name)
def test_bitcast_to_another_size_rescales_the_last_dim(src: Any, dst: Any) -> None:
    """tinygrad's rule: float32 (..., n) -> uint8 (..., 4n) and uint8 (..., 8) -> float32 (..., 2); the bytes are
    numpy's `.view(dtype)` of the values (little-endian). Here it raised ValueError (same size only)."""
    n = 8 * 8 // src.itemsize  # 64 bytes a row: divides into every size
    raw = _random_bytes((3, 5, n * src.itemsize))
    if src is dtypes.bool:
        raw = raw & 1
    storage = np.bool_ if src is dtypes.bool else np.uint16 if src is dtypes.bfloat16 else src.np
    a = raw.view(storage)
    t = T(a) if src is not dtypes.bfloat16 else T(a).bitcast(dtypes.bfloat16)
    out = t.bitcast(dst)
    want = _numpy_bitcast(a, src, dst)
    assert out.shape == want.shape == (3, 5, n * src.itemsize // dst.itemsize) and out.dtype == dst
    got = out.bitcast(dtypes.uint16) if dst is dtypes.bfloat16 else out
    assert got.numpy().tobytes() == want.tobytes()  # bit for bit (NaN payloads too)
    back = out.bitcast(src)
    assert (back.bitcast(dtypes.uint16) if src is dtypes.bfloat16 else back).numpy().tobytes() == a.tobytes()


def test_bitcast_of_a_view_and_of_a_computed_tensor() -> None:
    """A lazy tensor has values, not strides: the bitcast of a transposed or computed tensor reads its values in
    row-major order (numpy's view of the contiguous copy)."""
    a = np.arange(24, dtype=np.float32).reshape(4, 6) * 0.5 - 3
    t = T(a)
    np.testing.assert_array_equal(t.T.bitcast(dtypes.uint8).numpy(), np.ascontiguousarray(a.T).view(np.uint8))
    np.testing.assert_array_equal((t * 2)[:, 1:5].bitcast(dtypes.float64).numpy(),
                                  np.ascontiguousarray((a * 2)[:, 1:5]).view(np.float64))
    np.testing.assert_array_equal(Tensor.full((2, 4), 1.0, device=DEVICE).bitcast(dtypes.uint16).numpy(),
                                  np.full((2, 4), 1.0, np.float32).view(np.uint16))
    # an int32 built from bytes and used in arithmetic
    b = _random_bytes((2, 8))
    np.testing.assert_array_equal((T(b).bitcast(dtypes.int32) + 1).numpy(), b.view(np.int32) + 1)


@pytest.mark.parametrize("shape,src,dst", [((3,), dtypes.uint8, dtypes.float32), ((2, 6), dtypes.int16, dtypes.int64),
                                           ((), dtypes.float32, dtypes.uint8), ((5,), dtypes.float16, dtypes.float64)],
                         ids=str)
def test_bitcast_to_another_size_needs_whole_items(shape: tuple[int, ...], src: Any, dst: Any) -> None:
    """The last dim's bytes must divide into the new items (tinygrad raises RuntimeError "unsupported size in
    bitcast"); a 0-d tensor has no last dim to rescale. The error is both a ValueError and a RuntimeError."""
    t = T(np.zeros(shape, src.np))
    for kind in (ValueError, RuntimeError):
        with pytest.raises(kind, match=re.escape(f"bitcast {src!r} -> {dst!r}") + ".*" + re.escape(str(shape))):
            t.bitcast(dst)


@pytest.mark.parametrize("device", ["CUDA", "METAL"])
def test_bitcast_to_another_size_renders_for_gpus(device: str) -> None:
    """The resizing bitcast is integer shifts, masks and same-size bitcasts: it renders for CUDA and Metal."""
    from glassgrad import kernels
    a = T(_random_bytes((4, 16))).bitcast(dtypes.float32) * 2
    out = (a.bitcast(dtypes.uint8) + 1, a.bitcast(dtypes.int64), T(_random_bytes((4, 16))).bitcast(dtypes.float16))
    specs = kernels(*out, device=device)
    assert specs and all(s.source for s in specs)


def test_bitcast_to_another_size_compiles_with_nvrtc(nvrtc: Any) -> None:
    from glassgrad import kernels
    a = T(_random_bytes((4, 16))).bitcast(dtypes.float32)
    for spec in kernels(a.bitcast(dtypes.uint16) + 1, a.bitcast(dtypes.int64), device="CUDA"):
        assert nvrtc.compile_cached(spec.source).startswith(b"\x7fELF"), spec.name


def test_context_default_float_and_int() -> None:
    from glassgrad import Context
    with Context(DEFAULT_FLOAT=dtypes.half, DEFAULT_INT="int64"):
        assert Tensor([1.5], device=DEVICE).dtype == dtypes.half
        assert Tensor.rand(3, device=DEVICE).dtype == dtypes.half
        assert Tensor([1, 2], device=DEVICE).dtype == dtypes.int64
    assert Tensor([1.5], device=DEVICE).dtype == dtypes.float32 and Tensor([1], device=DEVICE).dtype == dtypes.int32
    with pytest.raises(ValueError, match="float dtype"), Context(DEFAULT_FLOAT=dtypes.int8):
        pass
    assert dtypes.default_float == dtypes.float32


def test_default_float_from_the_environment() -> None:
    """`DEFAULT_FLOAT=HALF python x.py` (tinygrad reads it at import, any case) made float16 the default there and was
    ignored here: the program ran in float32. A non-float value raises when glassgrad is imported."""
    import os
    import subprocess
    import sys
    script = "from glassgrad import Tensor, dtypes; print(Tensor([1.5]).dtype, Tensor([1]).dtype, dtypes.default_float)"
    env = {k: v for k, v in os.environ.items() if k not in ("DEFAULT_FLOAT", "DEFAULT_INT")}
    out = subprocess.run([sys.executable, "-c", script], env={**env, "DEFAULT_FLOAT": "HALF", "DEFAULT_INT": "int64"},
                         capture_output=True, text=True)
    assert out.stdout.split() == ["dtypes.float16", "dtypes.int64", "dtypes.float16"], out.stderr
    bad = subprocess.run([sys.executable, "-c", script], env={**env, "DEFAULT_FLOAT": "int8"}, capture_output=True,
                         text=True)
    assert bad.returncode != 0 and "default_float must be a float dtype" in bad.stderr


def test_context_dev_sets_the_default_device() -> None:
    """tinygrad 0.14 sets the default device with `Context(DEV=...)` or `DEV.value = ...` (its Device.DEFAULT setter
    refuses); here Context(DEV=...) raised KeyError 'unknown flag'."""
    from glassgrad import Context, Device
    from glassgrad.helpers import DEV
    before = Device.DEFAULT
    with Context(DEV="cpu:1"):
        assert Device.DEFAULT == "CPU:1" and Tensor([1.0]).device == "CPU:1" and DEV.value == "CPU:1"
        assert DEV.device == "CPU"
    assert Device.DEFAULT == before
    with pytest.raises(ValueError, match="unknown device"), Context(DEV="GPU9"):
        pass
    assert Device.DEFAULT == before
    DEV.value = "CPU:2"
    try:
        assert Tensor([2.0]).device == "CPU:2"
    finally:
        DEV.value = before


def test_top_level_names_of_tinygrad() -> None:
    """tinygrad 0.14's `from tinygrad import UOp, fetch` (UOp for `UOp.variable`, its spelling of a Variable)."""
    from glassgrad import UOp, Variable, fetch
    from glassgrad import nn as gnn
    assert callable(fetch) and gnn.Linear is not None
    v = UOp.variable("start_pos", 1, 16)
    assert v is Variable("start_pos", 1, 16)
    x = Tensor.arange(16).float().realize()
    assert x.shrink(((0, v.bind(5)),)).sum().item() == 10.0


def test_dtype_names_in_any_case() -> None:
    assert to_dtype("HALF") == dtypes.float16 and to_dtype("Float32") == dtypes.float32
    with pytest.raises(Exception, match="unknown dtype"):
        to_dtype("HALFS")


# ---------------------------------------------------------------------- dtypes of results
@pytest.mark.parametrize("a,b", [("int8", "int8"), ("int8", "int16"), ("uint8", "uint8"), ("int16", "int32"),
                                 ("uint8", "int8"), ("int64", "int64")])
def test_integer_matmul_keeps_the_promoted_dtype(a: str, b: str) -> None:
    """int8 @ int16 is int16 in PyTorch and tinygrad (the products' dtype, wrapping on overflow); glassgrad returned
    the widened accumulator (int32) of the sum inside."""
    rng = np.random.default_rng(0)
    x = rng.integers(-100 if a[0] == "i" else 0, 100, (3, 5)).astype(a)
    y = rng.integers(-100 if b[0] == "i" else 0, 100, (5, 2)).astype(b)
    promoted = np.promote_types(a, b)
    out = Tensor(x, device=DEVICE) @ Tensor(y, device=DEVICE)
    assert out.dtype.np == promoted
    np.testing.assert_equal(out.numpy(), (x.astype(np.int64) @ y.astype(np.int64)).astype(promoted))  # wraps
    vec = Tensor(x[0], device=DEVICE).dot(Tensor(y[:, 0], device=DEVICE))
    assert vec.dtype.np == promoted


# ---------------------------------------------------------------------- setitem with tensor or list indices
SETITEM_CASES: list[tuple[str, tuple[int, ...], Any, Any]] = [
    ("tensor rows", (5, 3), lambda T: T([0, 2]), lambda T: T(np.arange(6, dtype=np.float32).reshape(2, 3))),
    ("list rows, scalar", (5, 3), lambda T: [4, 1], lambda T: 7.0),
    ("pairs", (6, 6), lambda T: ([1, 2], [3, 2]), lambda T: 3.0),
    ("tensor and int", (4, 3), lambda T: (T([0, 2]), 0), lambda T: T(np.array([99.0, 88.0], np.float32))),
    ("tensor and slice", (4, 3), lambda T: (T([3, -4]), slice(None, 2)),
     lambda T: T(np.array([[10.0, 20.0], [30.0, 40.0]], np.float32))),
    ("2-d index", (3,), lambda T: T([[0, 1], [2, 0]]), lambda T: T(np.array([[1.0, 2.0], [3.0, 4.0]], np.float32))),
    ("repeated, last wins", (4,), lambda T: [1, 1], lambda T: T(np.array([5.0, 6.0], np.float32))),
    ("broadcast value", (4, 2, 3), lambda T: (slice(None), [1, 0], 2), lambda T: T(np.array([8.0, 9.0], np.float32))),
]


@pytest.mark.parametrize("name,shape,index,value", SETITEM_CASES, ids=[c[0] for c in SETITEM_CASES])
def test_setitem_with_tensor_or_list_indices(name: str, shape: tuple[int, ...], index: Any, value: Any) -> None:
    """t[idx] = v with advanced indices raised NotImplementedError (tinygrad and PyTorch write it)."""
    base = np.random.default_rng(1).standard_normal(shape).astype(np.float32)

    def as_np(x: Any) -> Any:
        return x.numpy() if isinstance(x, Tensor) else x

    def gg(a: Any) -> Tensor:
        return Tensor(np.asarray(a), device=DEVICE)

    t = Tensor(base, device=DEVICE)
    t[index(gg)] = value(gg)
    expected = base.copy()
    idx = index(gg)
    expected[tuple(as_np(i) for i in idx) if isinstance(idx, tuple) else as_np(idx)] = as_np(value(gg))
    np.testing.assert_equal(t.numpy(), expected)
    if torch is not None:
        def tt(a: Any) -> Any:
            return torch.tensor(np.asarray(a))
        ref = torch.tensor(base)
        ref[index(tt)] = value(tt)
        np.testing.assert_equal(t.numpy(), ref.numpy())


def test_setitem_with_indices_errors_and_views() -> None:
    t = Tensor.zeros(4, 3, device=DEVICE).contiguous().realize()
    with pytest.raises((RuntimeError, ValueError), match="cannot be broadcast"):
        t[[0, 1]] = Tensor(np.ones(4, np.float32), device=DEVICE)
    before = t[1]  # a tensor taken before the write keeps its value (value semantics)
    t.T[[2, 0], [1, 1]] = 5.0  # through a view: t[1, 2] and t[1, 0]
    np.testing.assert_equal(t.numpy()[1], [5.0, 0.0, 5.0])
    np.testing.assert_equal(before.numpy(), [0.0, 0.0, 0.0])


# ---------------------------------------------------------------------- copy.deepcopy
def test_deepcopy_of_tensors_and_models() -> None:
    """copy.deepcopy of a lazy tensor crashed (UnknownDTypeError 'void'); of a realized one it duplicated the
    buffer's device handle. Now a copy owns its values, as in PyTorch."""
    import copy

    from glassgrad import nn
    lazy = Tensor.ones(3, 3, device=DEVICE) * 2
    np.testing.assert_equal(copy.deepcopy(lazy).numpy(), np.full((3, 3), 2.0))
    y = Tensor([1.0, 2.0], device=DEVICE).realize()
    z = copy.deepcopy(y)
    y.assign(Tensor([5.0, 5.0], device=DEVICE)).realize()
    np.testing.assert_equal((y.numpy(), z.numpy()), ([5.0, 5.0], [1.0, 2.0]))
    w = Tensor([1.0, 2.0], device=DEVICE, requires_grad=True)
    (w * w).sum().backward()
    w2 = copy.deepcopy(w)
    assert w2.requires_grad and w2.grad is not None
    np.testing.assert_equal(w2.grad.numpy(), [2.0, 4.0])
    layer = nn.Linear(2, 2)
    twin = copy.deepcopy(layer)
    np.testing.assert_equal(twin.weight.numpy(), layer.weight.numpy())
    twin(Tensor.ones(1, 2, device=DEVICE)).sum().backward()  # the copy's parameters are parameters
    assert twin.weight.grad is not None and layer.weight.grad is None


def test_tensor_from_bytes_and_none() -> None:
    """tinygrad's Tensor(b"...") (uint8 bytes) and Tensor(None) (empty) raised TypeError."""
    data = b"abc\x00\xff"
    t = Tensor(data, device=DEVICE)
    assert t.dtype == dtypes.uint8 and t.shape == (5,)
    np.testing.assert_equal(t.numpy(), list(data))
    # with a dtype, the bytes are read as its items (tinygrad's and torch.frombuffer's meaning)
    raw = data + b"\x01\x02\x03"
    np.testing.assert_equal(Tensor(bytearray(raw), dtype=dtypes.int32, device=DEVICE).numpy(),
                            np.frombuffer(raw, "<i4"))
    empty = Tensor(None, device=DEVICE)
    assert empty.shape == (0,) and empty.dtype == dtypes.float32 and empty.numpy().size == 0


def test_backward_without_requires_grad_fills_every_float_tensor_as_tinygrad() -> None:
    """tinygrad 0.14 has no requires_grad: backward() fills .grad of every live float tensor of the graph (its
    docstring's example). glassgrad does so when no tensor of the graph requires grad (where PyTorch raises);
    values against PyTorch with every tensor marked (and the intermediate's grad retained)."""
    xs, ws = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32), np.array([[1.0], [-2.0]], np.float32)
    x, w = Tensor(xs, device=DEVICE), Tensor(ws, device=DEVICE)
    h = x @ w
    (h * h).sum().backward()
    assert x.grad is not None and w.grad is not None and h.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), 2 * xs.T @ (xs @ ws), rtol=1e-6)
    np.testing.assert_allclose(x.grad.numpy(), 2 * (xs @ ws) @ ws.T, rtol=1e-6)
    np.testing.assert_allclose(h.grad.numpy(), 2 * (xs @ ws), rtol=1e-6)
    if torch is not None:
        tx, tw = torch.tensor(xs, requires_grad=True), torch.tensor(ws, requires_grad=True)
        th = tx @ tw
        th.retain_grad()
        (th * th).sum().backward()
        for ours, theirs in ((x, tx), (w, tw), (h, th)):
            np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-6)
    t = Tensor([1.0, 2.0, 3.0, 4.0], device=DEVICE)
    t.sum().backward()
    np.testing.assert_array_equal(t.grad.numpy(), np.ones(4, np.float32))


def test_backward_with_requires_grad_keeps_pytorchs_rule() -> None:
    """Once a tensor of the graph requires grad, only those get .grad (an unmarked input does not)."""
    x = Tensor(np.ones((2, 2), np.float32), device=DEVICE)
    w = Tensor(np.full((2, 2), 3.0, np.float32), device=DEVICE, requires_grad=True)
    frozen = Tensor(np.ones((2, 2), np.float32), device=DEVICE, requires_grad=False)
    (x @ w * frozen).sum().backward()
    assert x.grad is None and frozen.grad is None
    np.testing.assert_array_equal(w.grad.numpy(), np.full((2, 2), 2.0, np.float32))


def test_every_constructor_takes_requires_grad() -> None:
    """tinygrad's constructors pass `requires_grad` (and the *_like ones `device` and `dtype`) through, as PyTorch's
    do: `Tensor.empty(..., requires_grad=True)`, `eye`, `arange`, `linspace`, `zeros_like`, ... used to raise a
    TypeError. Gradients reach them."""
    made = [Tensor.empty(2, 3, requires_grad=True), Tensor.eye(3, requires_grad=True),
            Tensor.arange(4, dtype=dtypes.float32, requires_grad=True), Tensor.linspace(0, 1, 5, requires_grad=True)]
    base = Tensor.ones(2, 3)
    made += [base.zeros_like(requires_grad=True), base.ones_like(requires_grad=True),
             base.full_like(2.0, requires_grad=True), base.rand_like(requires_grad=True),
             base.randn_like(requires_grad=True), base.empty_like(requires_grad=True)]
    assert all(t.requires_grad for t in made)
    assert not Tensor.eye(3).requires_grad and not base.zeros_like().requires_grad
    assert base.ones_like(device="CPU:1").device == "CPU:1"
    assert base.zeros_like(dtype=dtypes.int32).dtype == dtypes.int32
    eye = Tensor.eye(3, requires_grad=True)
    (eye * Tensor([1.0, 2.0, 3.0])).sum().backward()
    assert eye.grad is not None
    np.testing.assert_array_equal(eye.grad.numpy(), np.tile([1.0, 2.0, 3.0], (3, 1)))
    ramp = Tensor.linspace(0, 3, 4, requires_grad=True)
    (ramp * ramp).sum().backward()
    assert ramp.grad is not None
    np.testing.assert_allclose(ramp.grad.numpy(), [0.0, 2.0, 4.0, 6.0])


def test_clone_linear_and_bitwise_take_tinygrads_keywords() -> None:
    """`clone(device=)`, `linear(..., dtype=)` (the matmul's dtype) and the bitwise ops' `reverse=` are in tinygrad
    0.14's signatures; they raised TypeError here."""
    a = Tensor([1.0, 2.0, 3.0])
    copy = a.clone(device="CPU:1")
    assert copy.device == "CPU:1"
    np.testing.assert_array_equal(copy.numpy(), [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(Tensor([6, 5]).bitwise_and(3, reverse=True).numpy(), [2, 1])
    np.testing.assert_array_equal(Tensor([6, 5]).bitwise_or(Tensor([1, 2]), reverse=True).numpy(), [7, 7])
    x, w = np.full((2, 3), 0.5, np.float16), np.full((3, 4), 2.0, np.float16)
    out = Tensor(x).linear(Tensor(w), Tensor(np.ones(4, np.float32)), dtype=dtypes.float32)
    assert out.dtype == dtypes.float32
    np.testing.assert_array_equal(out.numpy(), np.full((2, 4), 4.0))
    assert Tensor(x).linear(Tensor(w)).dtype == dtypes.float16


def test_const_like_takes_tinygrads_dtype() -> None:
    """tinygrad 0.14's `const_like(b, dtype=None)`: the dtype keyword raised TypeError here."""
    t = Tensor([[1.5, 2.5]])
    same = t.const_like(3)
    assert same.dtype == dtypes.float32 and same.tolist() == [[3.0, 3.0]]
    other = t.const_like(3, dtype=dtypes.int8)
    assert other.dtype == dtypes.int8 and other.shape == (1, 2) and other.tolist() == [[3, 3]]
