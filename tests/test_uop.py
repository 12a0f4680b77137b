"""The UOp IR: hash-consing, immutability, toposort, tensor-graph shapes and integer value ranges."""
from __future__ import annotations

import gc
import pickle
import sys
import weakref
from typing import Any

import pytest

from glassgrad.device import Buffer
from glassgrad.dtype import dtypes
from glassgrad.uop.ops import Ops, UOp

I32 = dtypes.int32


def c(value: int) -> UOp:
    return UOp.const(I32, value)


def rng(n: int, axis: int = 0) -> UOp:
    return UOp(Ops.RANGE, I32, (c(n),), (axis, "global"))


def bounds(u: UOp) -> tuple[Any, Any]:
    return (u.vmin, u.vmax)


# ---------------------------------------------------------------- hash-consing
class TestHashConsing:
    def test_structurally_equal_nodes_are_one_object(self) -> None:
        a = UOp(Ops.ADD, I32, (c(1), c(2)))
        b = UOp(Ops.ADD, I32, (c(1), c(2)))
        assert a is b
        assert rng(4) + 3 is rng(4) + 3

    def test_different_op_dtype_src_or_arg_give_different_nodes(self) -> None:
        base = UOp(Ops.ADD, I32, (c(1), c(2)))
        assert UOp(Ops.MUL, I32, (c(1), c(2))) is not base
        assert UOp(Ops.ADD, dtypes.int64, (c(1), c(2))) is not base
        assert UOp(Ops.ADD, I32, (c(2), c(1))) is not base
        assert rng(4, 0) is not rng(4, 1)

    def test_zero_and_negative_zero_are_different_constants(self) -> None:
        pos, neg = UOp.const(dtypes.float32, 0.0), UOp.const(dtypes.float32, -0.0)
        assert pos is not neg
        assert str(neg.arg) == "-0.0"
        assert UOp.const(dtypes.float32, -0.0) is neg

    def test_one_vs_float_one_vs_true_are_different_nodes(self) -> None:
        nodes = [UOp(Ops.CONST, I32, (), 1), UOp(Ops.CONST, I32, (), 1.0), UOp(Ops.CONST, I32, (), True)]
        assert len({id(n) for n in nodes}) == 3
        assert [type(n.arg) for n in nodes] == [int, float, bool]
        # and inside tuple arguments too
        assert UOp(Ops.SINK, arg=(1, 0.0)) is not UOp(Ops.SINK, arg=(1, -0.0))
        assert UOp(Ops.SINK, arg=(1, 0.0)) is not UOp(Ops.SINK, arg=(True, 0.0))

    def test_nan_constants_are_shared(self) -> None:
        assert UOp.const(dtypes.float32, float("nan")) is UOp.const(dtypes.float32, float("nan"))

    def test_const_truncates_to_its_dtype(self) -> None:
        assert c(2**31).arg == -(2**31)
        assert UOp.const(dtypes.uint8, 300).arg == 44
        assert UOp.const(dtypes.bool, 5).arg is True
        assert UOp.const(dtypes.float32, 3).arg == 3.0 and isinstance(UOp.const(dtypes.float32, 3).arg, float)

    def test_unreferenced_nodes_are_collected(self) -> None:
        node = UOp(Ops.ADD, I32, (c(123456), c(654321)))
        ref = weakref.ref(node)
        cache_size = len(UOp._cache)
        del node
        gc.collect()
        assert ref() is None
        assert len(UOp._cache) < cache_size
        # building it again gives a fresh, working node
        again = UOp(Ops.ADD, I32, (c(123456), c(654321)))
        assert again.src[0].arg == 123456

    def test_sources_stay_alive_while_a_parent_does(self) -> None:
        parent = UOp(Ops.NEG, I32, (UOp(Ops.ADD, I32, (c(777001), c(777002))),))
        child_ref = weakref.ref(parent.src[0])
        gc.collect()
        assert child_ref() is parent.src[0]

    def test_pickle_round_trip_gives_the_same_node(self) -> None:
        expr = rng(8) * 4 + rng(4, 1)
        assert pickle.loads(pickle.dumps(expr)) is expr


# ---------------------------------------------------------------- immutability
class TestImmutability:
    def test_attributes_cannot_be_set(self) -> None:
        u = c(5)
        for name, value in (("op", Ops.ADD), ("arg", 6), ("src", ()), ("dtype", dtypes.int64), ("new", 1)):
            with pytest.raises(AttributeError):
                setattr(u, name, value)
        assert u.arg == 5 and u.op is Ops.CONST

    def test_a_new_node_is_a_uop_that_refuses_writes_to_every_field(self) -> None:
        """`UOp.__new__` fills a node's fields on a plain instance and then makes it a UOp: every node it returns,
        new or found, is exactly a UOp, and none of its fields (the cached shape, device and range too) can be
        written or deleted afterwards."""
        u = UOp(Ops.ADD, I32, (c(424201), c(424202)))
        assert type(u) is UOp and type(UOp(Ops.ADD, I32, (c(424201), c(424202)))) is UOp
        for name in ("op", "dtype", "src", "arg", "arg_key", "_shape", "_range", "_device"):
            with pytest.raises(AttributeError):
                setattr(u, name, None)
            with pytest.raises(AttributeError):
                delattr(u, name)
        assert u.op is Ops.ADD and u.arg is None and u.vmin == 424201 + 424202

    def test_attributes_cannot_be_deleted(self) -> None:
        u = c(5)
        with pytest.raises(AttributeError):
            del u.arg
        assert u.arg == 5

    def test_replace_builds_a_new_node(self) -> None:
        u = rng(4) + 1
        v = u.replace(op=Ops.MUL)
        assert v is not u and u.op is Ops.ADD and v.op is Ops.MUL and v.src is u.src
        assert u.replace() is u


# ---------------------------------------------------------------- toposort
class TestToposort:
    def test_sources_come_before_users_and_each_node_once(self) -> None:
        r = rng(4)
        a = r + 1
        b = r * 2
        top = a.alu(Ops.MAX, b) + a
        order = top.toposort()
        assert order[-1] is top
        assert len(order) == len(set(order))
        position = {n: i for i, n in enumerate(order)}
        for n in order:
            assert all(position[s] < position[n] for s in n.src)
        assert set(order) == {top, a, b, r, c(4), c(1), c(2), a.alu(Ops.MAX, b)}

    def test_sources_are_visited_in_order(self) -> None:
        x, y = c(10), c(20)
        assert UOp(Ops.ADD, I32, (x, y)).toposort()[:2] == [x, y]
        assert UOp(Ops.ADD, I32, (y, x)).toposort()[:2] == [y, x]

    def test_stop_prunes_the_walk(self) -> None:
        inner = rng(4) + 1
        top = inner * 3
        order = top.toposort(stop=lambda n: n is inner)
        assert inner in order and rng(4) not in order

    def test_deep_chain_does_not_recurse(self) -> None:
        x = rng(4)
        for _ in range(max(5000, sys.getrecursionlimit() * 3)):
            x = UOp(Ops.NEG, I32, (x,))
        order = x.toposort()
        assert order[0] is c(4) and order[-1] is x

    def test_deep_chain_value_range_and_shape_do_not_recurse(self) -> None:
        x = rng(4)
        for i in range(5000):
            x = UOp(Ops.MAX, I32, (x, c(i % 3)))
        assert (x.vmin, x.vmax) == (2, 3)
        t = UOp(Ops.BUFFER, dtypes.float32, (), (Buffer("CPU", 6, dtypes.float32), 0))
        for _ in range(2500):
            t = UOp(Ops.RESHAPE, dtypes.float32, (t,), (2, 3))
            t = UOp(Ops.RESHAPE, dtypes.float32, (t,), (6,))
        assert t.shape == (6,)


# ---------------------------------------------------------------- tensor-graph shapes
def buffer(size: int, dtype=dtypes.float32) -> UOp:  # type: ignore[no-untyped-def]
    return UOp(Ops.BUFFER, dtype, (), (Buffer("CPU", size, dtype), 0))


class TestShapes:
    def test_buffer_and_movement_ops(self) -> None:
        b = buffer(24)
        assert b.shape == (24,)
        x = b.reshape((2, 3, 4))
        assert x.shape == (2, 3, 4) and x.size == 24
        assert x.permute((2, 0, 1)).shape == (4, 2, 3)
        assert x.pad(((1, 0), (0, 2), (3, 3))).shape == (3, 5, 10)
        assert x.shrink(((0, 1), (1, 3), (0, 4))).shape == (1, 2, 4)
        assert x.flip((True, False, True)).shape == (2, 3, 4)
        assert x.reshape((2, 1, 3, 4)).expand((2, 5, 3, 4)).shape == (2, 5, 3, 4)

    def test_no_op_movements_return_the_same_node(self) -> None:
        x = buffer(6).reshape((2, 3))
        assert x.reshape((2, 3)) is x
        assert x.permute((0, 1)) is x
        assert x.pad(((0, 0), (0, 0))) is x
        assert x.shrink(((0, 2), (0, 3))) is x
        assert x.flip((False, False)) is x

    def test_elementwise_reduce_and_cast(self) -> None:
        x = buffer(12).reshape((3, 4))
        y = buffer(12).reshape((3, 4))
        assert x.alu(Ops.ADD, y).shape == (3, 4)
        assert x.alu(Ops.CMPLT, y).shape == (3, 4) and x.alu(Ops.CMPLT, y).dtype == dtypes.bool
        assert x.alu(Ops.CMPLT, y).where(x, y).shape == (3, 4)
        assert x.reduce_axis(Ops.ADD, (1,)).shape == (3, 1)
        assert x.reduce_axis(Ops.MAX, (0, 1)).shape == (1, 1)
        assert x.cast(dtypes.int32).shape == (3, 4)
        assert x.bitcast(dtypes.float16).shape == (3, 8)

    def test_elementwise_nodes_take_known_shape_and_device_from_their_first_source(self) -> None:
        x = buffer(12).reshape((4, 3)).permute((1, 0))
        fresh = x.alu(Ops.ADD, x).alu(Ops.MUL, x)  # made before x's shape is known: computed when asked
        assert fresh._shape is None and fresh.shape == (3, 4) and fresh.device == "CPU"
        y = buffer(12).reshape((4, 3)).permute((1, 0))
        assert y.shape == (3, 4) and y.device == "CPU"
        made = y.alu(Ops.CMPLT, x).where(x, y).cast(dtypes.int32)  # each takes them from its first source
        assert (made._shape, made._device) == ((3, 4), "CPU") and made.shape == (3, 4)
        assert x.reduce_axis(Ops.ADD, (1,))._shape is None  # only elementwise nodes: a reduction's shape differs

    def test_buffers_reshapes_and_expands_know_their_shape_at_construction(self) -> None:
        b = buffer(12)
        assert (b._shape, b._device) == ((12,), "CPU")
        r = b.reshape((3, 4))
        assert (r._shape, r._device) == ((3, 4), "CPU")
        e = r.reshape((3, 1, 4)).expand((3, 2, 4))
        assert (e._shape, e._device) == ((3, 2, 4), "CPU")
        c = UOp(Ops.CONTIGUOUS, dtypes.float32, (e,))
        assert (c._shape, c._device) == ((3, 2, 4), "CPU")

    def test_constants_and_arange(self) -> None:
        const = UOp.const(dtypes.float32, 1.0, "CPU")
        assert const.shape == () and const.device == "CPU"
        assert const.reshape((1, 1)).expand((2, 5)).shape == (2, 5)
        arange = UOp(Ops.ARANGE, I32, (UOp(Ops.DEVICE, dtypes.void, (), "CPU"),), 7)
        assert arange.shape == (7,)

    def test_tensor_shapes_match_numpy(self) -> None:
        np = pytest.importorskip("numpy")
        from glassgrad import Tensor
        a = np.arange(24.0).reshape(2, 3, 4)
        t = Tensor(a)
        assert t.uop.shape == (2, 3, 4)
        assert t.permute(2, 0, 1).uop.shape == np.transpose(a, (2, 0, 1)).shape
        assert t.sum(1).uop.shape == a.sum(1).shape


# ---------------------------------------------------------------- value ranges
class TestValueRanges:
    def test_const_and_range(self) -> None:
        assert bounds(c(-7)) == (-7, -7)
        assert bounds(rng(10)) == (0, 9)
        assert bounds(rng(1)) == (0, 0)

    def test_add_mul_neg(self) -> None:
        r, s = rng(10), rng(4, 1)
        assert bounds(r + s) == (0, 12)
        assert bounds(r + -5) == (-5, 4)
        assert bounds(r * 3) == (0, 27)
        assert bounds(r * -3) == (-27, 0)
        assert bounds((r + -5) * (s + -2)) == (-8, 10)
        assert bounds(-r) == (-9, 0)

    def test_overflow_gives_the_whole_dtype_range(self) -> None:
        r = rng(10)
        assert bounds(r * 1_000_000_000) == (-(2**31), 2**31 - 1)
        assert bounds(r + (2**31 - 5)) == (-(2**31), 2**31 - 1)
        assert bounds(-(r + -(2**31))) == (-(2**31), 2**31 - 1)
        u8 = dtypes.uint8
        assert bounds(UOp(Ops.ADD, u8, (UOp.const(u8, 250), rng(10).cast(u8)))) == (0, 255)

    def test_idiv_and_mod(self) -> None:
        r = rng(10)
        assert bounds(r // 4) == (0, 2)
        assert bounds((r + -9) // 4) == (-2, 0)  # truncation toward zero
        assert bounds(r % 4) == (0, 3)
        assert bounds(r % 16) == (0, 9)
        assert bounds((r + 3) % 16) == (3, 12)
        lo, hi = bounds((r + -5) % 4)
        assert lo <= -3 and hi >= 3  # the remainder takes the dividend's sign
        lo, hi = bounds(r // rng(3, 1))  # a divisor that may be 0 (x/0 is 0) or 1
        assert lo <= 0 and hi >= 9

    def test_max_where_cmplt(self) -> None:
        r, s = rng(10), rng(4, 1)
        assert bounds(r.maximum(5)) == (5, 9)
        assert bounds(r < 10) == (True, True)
        assert bounds(r < 0) == (False, False)
        assert bounds(r < 5) == (False, True)
        assert bounds((r < s).where(r + 20, s)) == (0, 29)

    def test_cast(self) -> None:
        r = rng(10)
        assert bounds(r.cast(dtypes.int64)) == (0, 9)
        assert bounds(r.cast(dtypes.int8)) == (0, 9)
        assert bounds((r * 100).cast(dtypes.int8)) == (-128, 127)
        assert bounds((r < 5).cast(I32)) == (0, 1)
        assert bounds((r < 10).cast(I32)) == (1, 1)
        assert bounds(rng(2).cast(dtypes.bool)) == (False, True)

    def test_float_nodes_have_infinite_range(self) -> None:
        x = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0)
        assert bounds(x) == (float("-inf"), float("inf"))
