"""The host-overhead fast paths give what the general paths give.

`Tensor._binary` makes the node itself when both operands already agree (a tensor of the same shape, dtype and
device; a Python scalar whose constant needs no cast); `_binary_general` goes through `_broadcasted` (device check,
broadcasting, dtype promotion). Nodes are hash-consed, so "the same node" is identity. The values are checked against
numpy too, for scalars of every Python type with int, bool, float and half tensors, broadcasting and 0-d tensors.
"""
from __future__ import annotations

import numpy as np
import pytest

from glassgrad import Tensor, dtypes
from glassgrad.dtype import to_dtype
from glassgrad.uop.ops import Ops

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # float16 + 2**40 is inf

BINARY = [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE]
NUMPY = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.CMPLT: np.less, Ops.CMPEQ: np.equal,
         Ops.CMPNE: np.not_equal}
SHAPES = [(), (1,), (5,), (3, 4), (2, 1, 4)]
DTYPES = ["float32", "float16", "int32", "int64", "bool"]
SCALARS = [0.5, -0.0, 0.0, 1.0001, float("nan"), float("-inf"), 3, 0, True, False, 2**40]


def make(shape: tuple[int, ...], dtype: str, seed: int = 0) -> tuple[Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.integers(-3, 4, size=shape)
    array = (values > 0) if dtype == "bool" else values.astype(dtype)
    return Tensor(array), np.asarray(array)


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scalar", SCALARS)
@pytest.mark.parametrize("reverse", [False, True])
def test_scalar_operand_fast_path_is_the_general_path(op: Ops, dtype: str, scalar: object, reverse: bool) -> None:
    x, _ = make((3, 4), dtype)
    try:
        general = x._binary_general(op, scalar, reverse)  # type: ignore[arg-type]
    except Exception as e:  # the fast path must raise the same way
        with pytest.raises(type(e)):
            x._binary(op, scalar, reverse)  # type: ignore[arg-type]
        return
    fast = x._binary(op, scalar, reverse)  # type: ignore[arg-type]
    assert fast.uop is general.uop
    assert fast.dtype == general.dtype


@pytest.mark.parametrize("op", BINARY)
@pytest.mark.parametrize("dtypes_", [("float32", "float32"), ("int32", "int32"), ("bool", "bool"),
                                     ("float16", "float16"), ("int32", "float32"), ("bool", "int64"),
                                     ("float16", "float32")])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((), ()), ((3, 4), (4,)), ((1,), (5,)), ((2, 1, 4), (3, 1)),
                                    ((), (3,))])
@pytest.mark.parametrize("reverse", [False, True])
def test_tensor_operand_fast_path_is_the_general_path(op: Ops, dtypes_: tuple[str, str],
                                                      shapes: tuple[tuple[int, ...], tuple[int, ...]],
                                                      reverse: bool) -> None:
    (x, xa), (y, ya) = make(shapes[0], dtypes_[0], 1), make(shapes[1], dtypes_[1], 2)
    fast = x._binary(op, y, reverse)
    general = x._binary_general(op, y, reverse)
    assert fast.uop is general.uop
    if op not in (Ops.ADD, Ops.CMPLT):  # (the same node: the values of two ops stand for the rest)
        return
    a, b = (ya, xa) if reverse else (xa, ya)
    expected = NUMPY[op](a, b)
    got = fast.numpy()
    assert got.shape == expected.shape
    if op in (Ops.CMPLT, Ops.CMPEQ, Ops.CMPNE):
        assert fast.dtype == dtypes.bool
    np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64), rtol=1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scalar", SCALARS)
def test_scalar_operands_match_numpy_promotion(dtype: str, scalar: object) -> None:
    """PyTorch's scalar promotion (a Python float makes an int or bool tensor the default float; an int makes a
    bool tensor the default int; a scalar never widens a tensor of its kind), and the values."""
    x, xa = make((5,), dtype)
    got = (x + scalar) if not isinstance(scalar, bool) or dtype == "bool" else (x * scalar)  # (bool + bool is or)
    if isinstance(scalar, float):
        want = x.dtype if x.dtype.is_float else dtypes.default_float
    elif isinstance(scalar, bool):
        want = x.dtype
    elif dtype == "bool":
        want = dtypes.int64 if scalar >= 2**31 else dtypes.int32
    else:
        want = x.dtype
    assert got.dtype == want
    if isinstance(scalar, int) and not isinstance(scalar, bool) and scalar >= 2**31 and not want.itemsize == 8:
        return  # wraps in the tensor's dtype (as PyTorch does): no numpy reference without its own wrapping rules
    np_dtype = want.np
    operand = np.asarray(scalar).astype(np_dtype)
    if dtype == "bool" and isinstance(scalar, bool):
        ref = xa | scalar
    elif isinstance(scalar, bool):
        ref = xa.astype(np_dtype) * operand
    else:
        ref = xa.astype(np_dtype) + operand  # computed in the result's dtype, as the kernel does
    np.testing.assert_allclose(got.numpy().astype(np.float64), ref.astype(np.float64), rtol=1e-6)


def test_mismatched_devices_still_raise() -> None:
    x = Tensor(np.ones(4, np.float32))
    y = Tensor(np.ones(4, np.float32), device="CPU:1")
    with pytest.raises(RuntimeError, match="different devices"):
        x + y


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("other", [*SCALARS, "same", "broadcast", "float32"])
@pytest.mark.parametrize("reverse", [False, True])
def test_sub_and_div_fast_paths_are_the_general_paths(dtype: str, other: object, reverse: bool) -> None:
    """`sub` and `div` make their nodes directly for an operand `_broadcasted` would leave as it is; the nodes are
    those of `_sub_general` / `_div_general` (or both raise alike)."""
    x, _ = make((3, 4), dtype)
    if other == "same":
        other = make((3, 4), dtype, 1)[0]
    elif other == "broadcast":
        other = make((4,), dtype, 1)[0]
    elif other == "float32":
        other = make((3, 4), "float32", 1)[0]
    for fast_fn, general_fn in ((Tensor.sub, Tensor._sub_general), (Tensor.div, Tensor._div_general)):
        try:
            general = general_fn(x, other, reverse)  # type: ignore[arg-type]
        except Exception as e:
            with pytest.raises(type(e)):
                fast_fn(x, other, reverse)  # type: ignore[arg-type]
            continue
        fast = fast_fn(x, other, reverse)  # type: ignore[arg-type]
        assert fast.uop is general.uop and fast.dtype == general.dtype


def operand(kind: object, dtype: str) -> object:
    """A where/bitwise operand: a scalar as it is, or a tensor named by its kind."""
    if kind == "same":
        return make((3, 4), dtype, 1)[0]
    if kind == "broadcast":
        return make((4,), dtype, 1)[0]
    if kind == "float32":
        return make((3, 4), "float32", 1)[0]
    return kind


WHERE_OPERANDS = [0.5, -0.0, 0, 1, True, float("nan"), 2**40, "same", "broadcast", "float32"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x", WHERE_OPERANDS)
@pytest.mark.parametrize("y", WHERE_OPERANDS)
@pytest.mark.parametrize("cond", ["bool", "int32", "broadcast"])
def test_where_fast_path_is_the_general_path(dtype: str, x: object, y: object, cond: str) -> None:
    """`where` makes its node directly when `_where_general` would cast, broadcast and promote nothing; the node is
    the general path's (or both raise alike), and its values are numpy's."""
    c, ca = make((4,) if cond == "broadcast" else (3, 4), "bool" if cond == "broadcast" else cond, 5)
    x_, y_ = operand(x, dtype), operand(y, dtype)
    if isinstance(x, str) and isinstance(y, str):  # (two tensors: one of the test's dtype, the other as named)
        x_ = make((3, 4), dtype, 1)[0]
    try:
        general = c._where_general(x_, y_)  # type: ignore[arg-type]
    except Exception as e:
        with pytest.raises(type(e)):
            c.where(x_, y_)  # type: ignore[arg-type]
        return
    fast = c.where(x_, y_)  # type: ignore[arg-type]
    assert fast.uop is general.uop and fast.dtype == general.dtype
    if not isinstance(x_, Tensor) or not isinstance(y_, Tensor) or fast.dtype.is_float:
        # (a Python scalar as a 0-d array of its own kind: numpy versions differ on a Python int that the other
        # operand's dtype cannot hold, 2**40 beside int32; some raise OverflowError in np.where)
        xa = x_.numpy() if isinstance(x_, Tensor) else np.asarray(x_)
        ya = y_.numpy() if isinstance(y_, Tensor) else np.asarray(y_)
        with np.errstate(all="ignore"):
            want = np.broadcast_to(np.where(ca.astype(bool), xa, ya), fast.shape).astype(fast.dtype.np)  # type: ignore
        np.testing.assert_array_equal(fast.numpy(), want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("other", [*SCALARS, "same", "broadcast", "float32"])
@pytest.mark.parametrize("op", [Ops.AND, Ops.OR, Ops.XOR])
@pytest.mark.parametrize("reverse", [False, True])
def test_bitwise_fast_path_is_the_general_path(dtype: str, other: object, op: Ops, reverse: bool) -> None:
    """`&`, `|`, `^` make their node directly for an operand `_broadcasted` would leave as it is (`x <= 0` is
    `(x < 0) | (x == 0)`: every relu); the node is `_bitwise_general`'s, or both raise alike."""
    x, _ = make((3, 4), dtype)
    other_ = operand(other, dtype)
    try:
        general = x._bitwise_general(op, other_, reverse)  # type: ignore[arg-type]
    except Exception as e:
        with pytest.raises(type(e)):
            x._bitwise(op, other_, reverse)  # type: ignore[arg-type]
        return
    fast = x._bitwise(op, other_, reverse)  # type: ignore[arg-type]
    assert fast.uop is general.uop and fast.dtype == general.dtype


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8", "int64", "float32", "float16", "bool"])
@pytest.mark.parametrize("n", [0, 1, 7, 100])
def test_arange_from_zero_is_the_index_with_numpy_values(dtype: str, n: int) -> None:
    """`arange(n)` (start 0, step 1) is the index node itself (cast when another dtype is asked for), without the
    general path's `* step + start`: the same values as numpy's, and as the general path's (start -0 + 0 is 0)."""
    if dtype == "bool" and n > 2:
        n = 2
    if dtype in ("int8", "uint8") and n > 100:
        n = 100
    t = Tensor.arange(n, dtype=dtype)
    assert t.dtype is to_dtype(dtype)
    node = t.uop
    while node.op is Ops.CAST:
        node = node.src[0]
    assert node.op is Ops.ARANGE
    np.testing.assert_array_equal(t.numpy(), np.arange(n).astype(dtype))
    np.testing.assert_array_equal(Tensor.arange(0, n, 1, dtype=dtype).numpy(), np.arange(n).astype(dtype))
    general = (Tensor.arange(1, n + 1, dtype="int64") - 1).cast(dtype)  # the same values, built another way
    np.testing.assert_array_equal(general.numpy(), t.numpy())


ATTACHED_GRAPHS = {
    "detach_beside": lambda x, w: (x * w.detach() + w).sum(),
    "shared_behind_and_beside": lambda x, w: ((x * w).exp().detach() * (x * w)).sum(),
    "nested": lambda x, w: ((x + w.detach()).detach() * w + (x * 2).detach()).sum(),
    "root_detached": lambda x, w: (x * w).sum().detach(),  # (only the root attached)
    "softmax_ce": lambda x, w: (x @ w.reshape(4, 1) - (x @ w.reshape(4, 1)).max().detach()).exp().sum().log(),
}


@pytest.mark.parametrize("name", list(ATTACHED_GRAPHS))
def test_attached_nodes_are_the_toposort_stopped_at_detach(name: str) -> None:
    """`_attached_nodes` (the nodes a gradient may reach) sweeps backward's node list instead of walking the graph
    again: the same set as the walk that stops at DETACH nodes."""
    from glassgrad.tensor import _attached_nodes
    x, w = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) / 10), Tensor(np.ones(4, np.float32))
    root = ATTACHED_GRAPHS[name](x, w).uop
    order = root.toposort()
    assert any(n.op is Ops.DETACH for n in order)
    expected = set(root.toposort(stop=lambda n: n.op is Ops.DETACH))
    assert _attached_nodes(root, order, set(order)) == expected


MATMUL_SHAPES = [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)),
                 ((1, 4), (4, 1)), ((0, 4), (4, 3)), ((3, 0), (0, 2))]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES)
def test_matmul_direct_node_is_the_general_paths(dtype: str, sa: tuple[int, ...], sb: tuple[int, ...]) -> None:
    """`matmul` of two float matrices (or broadcast batches) makes its node without intermediate Tensors; it is the
    node of the general spelling, so kernels, caches and gradients are those of the general path."""
    a, b = Tensor.empty(*sa, dtype=dtype), Tensor.empty(*sb, dtype=dtype)
    general = (a.unsqueeze(-2) * b.transpose(-1, -2).unsqueeze(-3)).sum(-1)
    assert (a @ b).uop is general.uop


@pytest.mark.parametrize("sa, sb, kinds", [
    ((3, 4), (4, 5), ("int32", "int32")), ((3, 4), (4, 5), ("float16", "float32")),
    ((4,), (4, 5), ("float32", "float32")), ((3, 4), (4,), ("float32", "float32")),
    ((2, 3, 4), (2, 4, 5), ("int8", "int8"))])
def test_matmul_general_cases_keep_their_values(sa: tuple[int, ...], sb: tuple[int, ...], kinds: tuple[str, str]
                                                ) -> None:
    rng = np.random.default_rng(1)
    x, y = (rng.integers(-3, 4, size=s).astype(d) for s, d in zip((sa, sb), kinds))
    got = (Tensor(x) @ Tensor(y)).numpy()
    want = x @ y
    assert got.dtype == want.dtype and np.array_equal(got, want)


def test_matmul_errors_are_the_general_paths() -> None:
    with pytest.raises(Exception, match="inner dims 4 != 3"):
        Tensor.empty(2, 4) @ Tensor.empty(3, 5)
    with pytest.raises(Exception, match="cannot be broadcast"):
        Tensor.empty(2, 3, 4) @ Tensor.empty(5, 4, 6)


@pytest.mark.parametrize("shape", [(2, 3, 9, 11), (1, 1, 5, 5), (2, 4, 7), (1, 2, 6, 5, 4), (3, 8)])
def test_windows_node_is_the_tensor_paths(shape: tuple[int, ...]) -> None:
    """A convolution's (and pool's) sliding windows are made on the nodes (`tensor_nn._window_nodes`), without a
    Tensor per movement op; they are the node of the Tensor spelling, and a window that does not fit raises the
    Tensor path's error. Every kernel, stride and dilation up to 5, 3, 2."""
    import itertools

    import glassgrad.tensor_nn as tn
    dims = {4: 2, 3: 1, 5: 3, 2: 1}[len(shape)]
    for k, s, d in itertools.product((1, 2, 3, 5), (1, 2, 3), (1, 2)):
        t = Tensor.empty(*shape)
        args = ((k,) * dims, (s,) * dims, (d,) * dims)
        outcomes = []
        for direct in (True, False):
            saved = tn._window_nodes
            if not direct:
                tn._window_nodes = lambda *a: None  # type: ignore[assignment]
            try:
                outcomes.append(t._windows(*args).uop)
            except Exception as e:  # noqa: BLE001 (the same error either way)
                outcomes.append(str(e))
            finally:
                tn._window_nodes = saved
        assert outcomes[0] is outcomes[1] or outcomes[0] == outcomes[1], (k, s, d)


REDUCE_SHAPES = [(), (1,), (5,), (3, 4), (2, 1, 4), (2, 3, 0)]
AXES: list[object] = [None, 0, 1, 2, -1, -2, -3, 3, -4, (0,), (0, -1), (1, 0), [2], (), (0, 0), True, 1.0]


def _reduce_general(t: Tensor, axis: object, keepdim: bool) -> Tensor:
    """`Tensor._reduce`'s spelling before its fast paths: the axes checked one by one, the keepdim node made by
    `reshape`, the result by `reshape` with all its checks."""
    from glassgrad.helpers import normalize_axis
    if axis is None:
        axes: tuple[int, ...] = tuple(range(t.ndim))
    elif not isinstance(axis, (int, tuple, list)):
        raise TypeError("axis type")
    else:
        norm = tuple(normalize_axis(a, t.ndim) for a in ((axis,) if isinstance(axis, int) else tuple(axis)))
        if len(set(norm)) != len(norm):
            raise ValueError("axis twice")
        axes = tuple(sorted(norm)) if t.ndim else ()
    kept = tuple(1 if i in axes else s for i, s in enumerate(t.shape))
    out = Tensor(t.uop.reduce_axis(Ops.ADD, axes)) if axes else Tensor(t.uop)
    out = out if out.shape == kept else out.reshape(kept)
    return out if keepdim else out.reshape(tuple(s for i, s in enumerate(t.shape) if i not in axes))


@pytest.mark.parametrize("shape", REDUCE_SHAPES)
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reduce_fast_paths_are_the_general_path(shape: tuple[int, ...], axis: object, keepdim: bool) -> None:
    """`_resolve_axes` answers one valid int axis directly and `_reduce` makes the result's reshape node without
    `reshape`'s checks: the same node (and a view of the reduction, as `reshape` makes), and the same error kind
    for an axis out of range, repeated, a bool or a float."""
    t = Tensor.empty(*shape)
    try:
        general = _reduce_general(t, axis, keepdim)
    except Exception as e:  # the fast path must raise too (a TypeError, an IndexError or a ShapeError)
        with pytest.raises((TypeError, IndexError, ValueError)):
            t._reduce(Ops.ADD, axis, keepdim)  # type: ignore[arg-type]
        assert isinstance(e, (TypeError, IndexError, ValueError))
        return
    fast = t._reduce(Ops.ADD, axis, keepdim)  # type: ignore[arg-type]
    assert fast.uop is general.uop and fast.shape == general.shape
    assert (fast._view_of is None) == (general._view_of is None)
    if not shape:  # (numpy has no axis 0 of a 0-d array; PyTorch and glassgrad reduce nothing there)
        return
    values = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    np.testing.assert_allclose(Tensor(values).sum(axis, keepdim=keepdim).numpy(),  # type: ignore[arg-type]
                               values.sum(axis if not isinstance(axis, list) else tuple(axis), keepdims=keepdim))


def test_least_upper_dtype_memo_follows_the_default_float() -> None:
    """`least_upper_dtype` remembers its answers, keyed with the default float, which is its answer for ints that
    meet only at a float: a memo without it answered float32 after `DEFAULT_FLOAT` changed. Every memoised answer
    is the computed one, for every pair and triple of dtypes under two default floats."""
    import itertools

    from glassgrad import Context
    from glassgrad.dtype import _LEAST_UPPER, least_upper_dtype
    assert least_upper_dtype(dtypes.int64, dtypes.uint64) == dtypes.float32  # (now memoised)
    with Context(DEFAULT_FLOAT=dtypes.float16):
        assert least_upper_dtype(dtypes.int64, dtypes.uint64) == dtypes.float16
        assert (Tensor([1], dtype=dtypes.int64) + Tensor([2], dtype=dtypes.uint64)).dtype == dtypes.float16
    assert least_upper_dtype(dtypes.int64, dtypes.uint64) == dtypes.float32
    all_dtypes = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
                  dtypes.int64, dtypes.uint64, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
    for default in (dtypes.float32, dtypes.float16):
        with Context(DEFAULT_FLOAT=default):
            for ds in [*itertools.product(all_dtypes, repeat=2), *itertools.combinations(all_dtypes, 3)]:
                remembered = least_upper_dtype(*ds)
                _LEAST_UPPER.clear()
                assert least_upper_dtype(*ds) is remembered, ds


@pytest.mark.parametrize("arg", [(Ops.ADD, (0, 1)), ((0, 1), (2, 3)), (3, (4,), 5), ((),), (Ops.MAX, ())])
def test_arg_key_of_tuples_of_int_tuples_is_the_tuple(arg: tuple[object, ...]) -> None:
    """`_arg_key` of a tuple whose tuples hold ints only (a reduction's (op, axes), a pad's pairs) is the tuple
    itself, found without recursion, as the recursive rule finds it."""
    from glassgrad.uop.ops import _arg_key, _tuple_key
    assert _arg_key(arg) is arg and _tuple_key(arg) is arg


@pytest.mark.parametrize("pair", [((Ops.ADD, (0.0,)), (Ops.ADD, (-0.0,))), (((1,), (True,)), ((1,), (1,))),
                                  (((1,), (1.0,)), ((1,), (1,))), ((0, (1, (2,))), (0, (1, (2.0,)))),
                                  ((1, True), (1, 1)), (((0, 1), (2, False)), ((0, 1), (2, 0)))])
def test_arg_key_tells_floats_bools_and_ints_apart_inside_tuples(pair: tuple[object, object]) -> None:
    """Arguments that are equal in Python but not the same constant (0.0 and -0.0, 1 and 1.0 and True), nested in
    tuples next to tuples of ints, have different keys, so hash-consing keeps their nodes apart."""
    from glassgrad.dtype import dtypes as dt
    from glassgrad.uop.ops import UOp, _arg_key
    a, b = pair
    assert a == b and _arg_key(a) != _arg_key(b)
    assert UOp(Ops.PAD, dt.void, (), a) is not UOp(Ops.PAD, dt.void, (), b)
