"""Bad input raises a clear Python exception that names the shapes, dtypes or axes involved.

Each case is (description, callable, exception type, regex the message must match). The callables build their
tensors on the device under test (`Device.DEFAULT`). Nothing here needs PyTorch.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from glassgrad import Device, Tensor, dtypes

DEVICE = Device.DEFAULT


def T(data: Any, **kwargs: Any) -> Tensor:
    return Tensor(data, device=DEVICE, **kwargs)


def ones(*shape: int) -> Tensor:
    return T(np.ones(shape, np.float32))


def esc(text: str) -> str:
    return re.escape(text)


CASES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    # broadcasting
    ("add broadcast", lambda: ones(2, 3) + ones(4), ValueError, esc("(2, 3) and (4,)")),
    ("mul broadcast 3d", lambda: ones(2, 3, 4) * ones(3, 3), ValueError, esc("(2, 3, 4) and (3, 3)")),
    ("where broadcast", lambda: T([True, False]).where(ones(3), 0.0), ValueError, esc("(2,) and (3,)")),
    ("expand", lambda: ones(2, 3).expand(4, 3), ValueError, esc("(2, 3) to (4, 3)")),
    ("expand fewer dims", lambda: ones(2, 3).expand(3), ValueError, esc("(3,)") + ".*" + esc("(2, 3)")),
    ("inplace changes shape", lambda: ones(3).__iadd__(ones(2, 3)), ValueError, esc("(3,) to (2, 3)")),
    # reshape family
    ("reshape count", lambda: ones(2, 3).reshape(4, 2), ValueError, esc("(2, 3)") + ".*" + esc("(4, 2)")),
    ("reshape -1 does not divide", lambda: ones(2, 3).reshape(-1, 4), ValueError,
     esc("(2, 3)") + ".*" + esc("(-1, 4)")),
    ("reshape two -1", lambda: ones(2, 3).reshape(-1, -1), ValueError, esc("(-1, -1)")),
    ("reshape negative", lambda: ones(2, 3).reshape(-2, -3), ValueError, esc("(-2, -3)")),
    ("reshape float dim", lambda: ones(2, 3).reshape(2.0, 3), TypeError, esc("(2.0, 3)")),
    ("unflatten", lambda: ones(2, 6).unflatten(1, (4, 2)), ValueError, esc("(4, 2)") + ".*6"),
    ("view", lambda: ones(2, 3).view(5), ValueError, esc("(2, 3)") + ".*" + esc("(5,)")),
    # axes
    ("sum axis", lambda: ones(2, 3).sum(2), IndexError, "axis 2 .* 2 dimensions"),
    ("sum negative axis", lambda: ones(2, 3).sum(-3), IndexError, "axis -3 .* 2 dimensions"),
    ("sum axis twice", lambda: ones(2, 3).sum((1, -1)), ValueError, esc("(1, -1)") + " names a dimension twice"),
    ("sum axis float", lambda: ones(2, 3).sum(1.0), TypeError, "axis must be an int.*float"),
    ("max axis", lambda: ones(2, 3).max(5), IndexError, "axis 5 .* 2 dimensions"),
    ("mean axis tuple", lambda: ones(2, 3).mean((0, 2)), IndexError, "axis 2 .* 2 dimensions"),
    ("argmax axis", lambda: ones(2, 3).argmax(2), IndexError, "axis 2 .* 2 dimensions"),
    ("softmax axis", lambda: ones(2, 3).softmax(2), IndexError, "axis 2 .* 2 dimensions"),
    ("log_softmax axis", lambda: ones(2, 3).log_softmax(-3), IndexError, "axis -3 .* 2 dimensions"),
    ("cumsum axis", lambda: ones(2, 3).cumsum(2), IndexError, "axis 2 .* 2 dimensions"),
    ("var axis", lambda: ones(2, 3).var(4), IndexError, "axis 4 .* 2 dimensions"),
    ("flip axis", lambda: ones(2, 3).flip(2), IndexError, "axis 2 .* 2 dimensions"),
    ("transpose axis", lambda: ones(2, 3).transpose(0, 2), IndexError, "axis 2 .* 2 dimensions"),
    ("permute repeats", lambda: ones(2, 3).permute(0, 0), ValueError, esc("(0, 0)") + ".*2 dimensions"),
    ("permute short", lambda: ones(2, 3).permute(0), ValueError, esc("(0,)") + ".*2 dimensions"),
    ("squeeze dim", lambda: ones(2, 3).squeeze(3), IndexError, "axis 3 .* 2 dimensions"),
    ("unsqueeze dim", lambda: ones(2, 3).unsqueeze(4), IndexError, "axis 4 .* 3 dimensions"),
    ("flatten dim", lambda: ones(2, 3).flatten(3), IndexError, "axis 3 .* 2 dimensions"),
    ("cat dim", lambda: ones(2, 3).cat(ones(2, 3), dim=2), IndexError, "dim 2 .* 2 dimensions"),
    ("size dim", lambda: ones(2, 3).size(2), IndexError, "dim 2 .* 2 dimensions"),
    ("max over empty axis", lambda: ones(2, 0).max(1), ValueError, esc("(2, 0)") + ".*axis 1"),
    ("argmax over empty axis", lambda: ones(2, 0).argmax(1), ValueError, esc("(2, 0)") + ".*axis 1"),
    # matmul
    ("matmul inner", lambda: ones(2, 3) @ ones(4, 5), ValueError, esc("(2, 3) @ (4, 5)") + ".*3 != 4"),
    ("matmul vector", lambda: ones(3) @ ones(4), ValueError, esc("(3,) @ (4,)")),
    ("matmul 0-d", lambda: ones(2, 3) @ T(1.0), ValueError, esc("(2, 3) and ()")),
    ("matmul batch", lambda: ones(2, 2, 3) @ ones(3, 3, 4), ValueError, esc("(2,) and (3,)") + ".*" +
     esc("(2, 2, 3) @ (3, 3, 4)")),
    ("matmul list", lambda: ones(2).matmul([1.0, 2.0]), TypeError, "list"),
    # dtypes
    ("float and", lambda: ones(2) & ones(2), TypeError, "float32"),
    ("float or scalar", lambda: ones(2) | 1, TypeError, "float32"),
    ("float xor", lambda: T([1.5]) ^ T([1]), TypeError, "float32"),
    ("float invert", lambda: ~T([1.0], dtype=dtypes.float16), TypeError, "float16"),
    ("float shift", lambda: T([1.0]) << 1, TypeError, "float32"),
    ("bad dtype name", lambda: T([1]).cast("float33"), TypeError, "'float33'.*float32"),
    ("bad dtype in constructor", lambda: T([1], dtype="flaot32"), TypeError, "'flaot32'"),
    ("bad dtype in zeros", lambda: Tensor.zeros(2, dtype="int3", device=DEVICE), TypeError, "'int3'"),
    ("requires_grad on ints", lambda: T([1, 2], requires_grad=True), RuntimeError, "int32"),
    ("bitcast size", lambda: T([1, 2, 3], dtype=dtypes.int16).bitcast(dtypes.float32), RuntimeError,
     r"int16 -> dtypes.float32 .*\(3,\)"),
    ("one_hot of floats", lambda: T([1.0]).one_hot(3), TypeError, "float32"),
    ("subtract bools", lambda: T([True]) - T([False]), TypeError, "bool"),
    ("numpy complex", lambda: T(np.array([1j], np.complex64)), TypeError, "complex64"),
    ("numpy strings", lambda: T(np.array(["a"])), TypeError, "<U1"),
    # indexing
    ("index out of range", lambda: ones(2, 3)[0, 3], IndexError, "index 3 .* dimension 1 with size 3"),
    ("negative index out of range", lambda: ones(2, 3)[-3], IndexError, "index -3 .* dimension 0 with size 2"),
    ("list index out of range", lambda: ones(2, 3)[:, [0, 5]], IndexError, "index 5 .* dimension 1 with size 3"),
    ("negative list index", lambda: ones(2, 3)[[-3]], IndexError, "index -3 .* dimension 0 with size 2"),
    ("index into 0-d", lambda: T(1.0)[0], IndexError, "dimension 0: 1 were given"),
    ("too many indices", lambda: ones(2, 3)[0, 0, 0], IndexError, "dimension 2: 3 were given" + ".*" + esc("(2, 3)")),
    ("too many with None", lambda: ones(2)[None, 0, 1], IndexError, "dimension 1: 2 were given"),
    ("two ellipses", lambda: ones(2, 3)[..., ...], IndexError, "single ellipsis"),
    ("float index", lambda: ones(2, 3)[1.5], TypeError, "float"),
    ("string index", lambda: ones(2, 3)["a"], TypeError, "str"),
    ("float tensor index", lambda: ones(2, 3)[T([1.0])], IndexError, "float32"),
    ("float list index", lambda: ones(2, 3)[[0.5, 1.0]], IndexError, "float64"),
    ("bool index", lambda: ones(2, 3)[True], TypeError, "boolean"),
    ("bool mask shape", lambda: ones(2, 3)[T([True, False, True])], IndexError,
     esc("boolean index of shape (3,) does not match the indexed dims (2,)")),
    ("slice step zero", lambda: ones(2, 3)[::0], ValueError, "step cannot be zero"),
    ("slice float bound", lambda: ones(2, 3)[0.5:], TypeError, "slice"),
    ("index shapes", lambda: ones(2, 3)[[0, 1], [0, 1, 2]], IndexError, esc("[(2,), (3,)]")),
    ("setitem advanced", lambda: ones(2, 3).__setitem__(T([0, 1]), T([1.0, 2.0, 3.0, 4.0])), ValueError,
     esc("shape (4,) cannot be broadcast to the indexed shape (2, 3)")),
    ("setitem broadcast", lambda: ones(2, 3).__setitem__(0, T([1.0, 2.0])), ValueError, esc("(2,)")),
    ("gather index dims", lambda: ones(2, 3).gather(0, T([0, 1])), ValueError, "2 dims.*int32 " + esc("(2,)")),
    ("gather float index", lambda: ones(2, 3).gather(0, T([[0.0]])), ValueError, "float32"),
    ("gather index too big", lambda: ones(2, 3).gather(0, T([[0, 1, 1, 1]])), ValueError, esc("(1, 4)") + ".*" +
     esc("(2, 3)")),
    ("scatter reduce", lambda: ones(2, 3).scatter(0, T([[0]]), 1.0, reduce="max"), ValueError, "'max'"),
    # devices and construction
    ("bad device name", lambda: Tensor([1], device="TPU"), ValueError, "'TPU'"),
    ("bad device index", lambda: Tensor([1], device="CPU:x"), ValueError, "'CPU:x'"),
    ("bad device in to", lambda: ones(2).to("GPUX"), ValueError, "'GPUX'"),
    ("ragged list", lambda: T([[1, 2], [3]]), ValueError, "ragged"),
    ("ragged deep", lambda: T([[[1.0], [2.0]], [[3.0]]]), ValueError, "ragged"),
    ("ragged numpy arrays", lambda: T([np.array([1]), np.array([1, 2])]), ValueError, "ragged"),
    ("string element", lambda: T([1, "a"]), TypeError, "str"),
    ("int beyond int64", lambda: T(2**70), OverflowError, "1180591620717411303424 does not fit int64"),
    ("list beyond int64", lambda: T([1, 2**70]), OverflowError, "int64"),
    ("list beyond dtype", lambda: T([300], dtype=dtypes.int8), OverflowError, "int8.*300"),
    ("dict", lambda: T({"a": 1}), TypeError, "dict"),
    ("tensor of tensor", lambda: T(ones(2)), TypeError, "detach"),
    ("negative shape", lambda: Tensor.zeros(-1, 2, device=DEVICE), ValueError, esc("(-1, 2)")),
    ("float shape", lambda: Tensor.ones(2.5, device=DEVICE), ValueError, esc("(2.5,)")),
    ("arange step 0", lambda: Tensor.arange(0, 5, 0, device=DEVICE), ValueError, "step"),
    ("linspace steps", lambda: Tensor.linspace(0, 1, -1, device=DEVICE), ValueError, "-1"),
    ("randint range", lambda: Tensor.randint(3, low=5, high=2, device=DEVICE), ValueError, "low=5, high=2"),
    ("add string", lambda: ones(2) + "a", TypeError, "str"),
    ("add None", lambda: ones(2) + None, TypeError, "NoneType"),
    ("add list", lambda: ones(2) + [1.0, 2.0], TypeError, "list"),
    # scalars out of tensors
    ("item on many", lambda: T([1, 2]).item(), ValueError, esc("(2,)")),
    ("item on empty", lambda: ones(0).item(), ValueError, esc("(0,)")),
    ("bool on many", lambda: bool(T([1, 2])), RuntimeError, "2 elements"),
    ("len of 0-d", lambda: len(T(1)), TypeError, "0-d"),
    # movement and composites
    ("pad pairs", lambda: ones(2, 3).pad(((0, 0), (0, 0), (1, 1))), ValueError, r"dimension \(2\), got 3"),
    ("pad flat odd", lambda: ones(2, 3).pad((1,)), ValueError, esc("(1,)")),
    ("pad mode", lambda: ones(2, 3).pad(((1, 1), (1, 1)), mode="mirror"), NotImplementedError, "'mirror'"),
    ("shrink out of range", lambda: ones(2, 3).shrink(((0, 3), (0, 3))), ValueError, esc("(2, 3)")),
    ("shrink reversed", lambda: ones(2, 3).shrink(((1, 0), None)), ValueError, esc("(1, 0)")),
    ("shrink count", lambda: ones(2, 3).shrink(((0, 1),)), ValueError, "2"),
    ("cat shapes", lambda: ones(2, 3).cat(ones(2, 4), dim=0), ValueError, esc("[(2, 3), (2, 4)]")),
    ("cat ndim", lambda: ones(2, 3).cat(ones(3)), ValueError, esc("[(2, 3), (3,)]")),
    ("stack shapes", lambda: Tensor.stack(ones(2, 3), ones(3, 2)), ValueError, esc("[(2, 3), (3, 2)]")),
    ("stack nothing", lambda: Tensor.stack(), ValueError, "at least one"),
    ("split sizes", lambda: ones(4, 3).split([1, 2]), ValueError, esc("[1, 2]") + ".*size 4"),
    ("split size zero", lambda: ones(4, 3).split(0), ValueError, "positive, got 0"),
    ("chunk zero", lambda: ones(4, 3).chunk(0), ValueError, "positive, got 0"),
    ("repeat counts", lambda: ones(2, 3).repeat(2), ValueError, esc("(2,)")),
    ("cross_entropy shapes", lambda: ones(2, 3).cross_entropy(T([0, 1, 2])), ValueError, esc("(2, 3)") + ".*" +
     esc("(3,)")),
    ("sparse ce labels", lambda: ones(2, 3).sparse_categorical_crossentropy(T([0.0, 1.0])), ValueError,
     "float32 " + esc("(2,)")),
    ("loss reduction", lambda: ones(2, 3).cross_entropy(T([0, 1]), reduction="avg"), ValueError, "'avg'"),
    ("dropout p", lambda: ones(2, 3).dropout(1.5), ValueError, "1.5"),
    ("div rounding", lambda: T([1]).div(T([2]), rounding_mode="round"), ValueError, "'round'"),
    ("clip without bounds", lambda: ones(2).clip(), ValueError, "min_ or max_"),
    ("a method as operand", lambda: ones(2) * ones(2).exp, TypeError, esc("t.exp is a method: call it, t.exp()")),
    ("PyTorch's .data", lambda: ones(2) * 0.1 + ones(2).data, TypeError, "not PyTorch's .data attribute"),
]


@pytest.mark.parametrize("name, fn, exc, match", CASES, ids=[c[0] for c in CASES])
def test_error(name: str, fn: Callable[[], Any], exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        fn()


def test_backward_errors() -> None:
    x = T(np.ones((2, 3), np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match=esc("shape (2, 3)") + ".*gradient="):
        x.exp().backward()
    with pytest.raises(ValueError, match=esc("(3,)") + ".*" + esc("(2, 3)")):
        x.exp().backward(ones(3))
    frozen = T(np.ones((2, 3), np.float32), requires_grad=False)  # (held: a PyTorch program's graph)
    with pytest.raises(RuntimeError, match="no tensor of this computation can take a gradient"):
        frozen.sum().backward()
    with pytest.raises(RuntimeError, match="no tensor of this computation can take a gradient"):
        T(np.ones((2, 3), np.int32)).sum().backward()
    with pytest.raises(RuntimeError, match=esc("(2, 3)")):
        x.exp().gradient(x)
    with pytest.raises(ValueError, match=esc("(3,)") + ".*" + esc("(2, 3)")):
        x.exp().gradient(x, gradient=ones(3))


def test_errors_leave_no_partial_state() -> None:
    """A failed op raises before building anything: the tensors involved still work afterwards."""
    a = ones(2, 3)
    with pytest.raises(ValueError):
        a + ones(4)
    np.testing.assert_array_equal((a + 1).numpy(), np.full((2, 3), 2.0))


def test_lazy_index_tensor_out_of_range_selects_nothing() -> None:
    """Entries of a lazy index Tensor are not checked (that would need computing them): out of range gives 0."""
    a = T(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(a[T([0, 7])].numpy(), [[0.0, 1.0, 2.0], [0.0, 0.0, 0.0]])
