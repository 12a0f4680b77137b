"""API parity with tinygrad's `Tensor`: every public method, staticmethod and property of tinygrad's Tensor (the
lists below are literals, taken from tinygrad's tensor.py and its mixins, public names only) exists on glassgrad's
Tensor, or is in DELIBERATELY_ABSENT with the reason (docs/TINYGRAD_PARITY.md explains the groups). A name removed
by mistake, or one added to glassgrad without taking it off the absent list, fails here.

It also checks issue 14's rule: a function that tinygrad defines with `self` first can be called both ways,
`a.f(b)` and `Tensor.f(a, b)`, with one result; so none of them may be a staticmethod here (a static `stack` made
`a.stack(b)` drop `a`).
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from glassgrad import Tensor

TINYGRAD_METHODS = (
    "abs", "acos", "acosh", "add", "all", "allclose", "alu", "any", "argmax", "argmin", "argsort", "as_param",
    "asin", "asinh", "assign", "atan", "atanh", "avg_pool2d", "backward", "batchnorm", "bfloat16",
    "binary_crossentropy", "binary_crossentropy_logits", "bitcast", "bitwise_and", "bitwise_not", "bitwise_or",
    "bitwise_xor", "bool", "call", "callify", "cast", "cat", "ceil", "celu", "chunk", "clamp", "clip", "clone",
    "const_like", "contiguous", "contiguous_backward", "conv2d", "conv_transpose2d", "copysign", "cos", "cosh",
    "cross_entropy", "cummax", "cummin", "cumprod", "cumsum", "custom_kernel", "data", "decode_hevc_frame",
    "detach", "diag", "diagonal", "div", "dot", "double", "dropout", "element_size", "elu", "empty_like", "eq",
    "erf", "exp", "exp2", "expand", "flatten", "flip", "float", "floor", "fmod", "full_like", "gather", "gelu",
    "gradient", "half", "hardsigmoid", "hardswish", "hardtanh", "hash", "image_conv2d", "image_dot", "int",
    "interpolate", "is_floating_point", "is_param_", "isclose", "isfinite", "isinf", "isnan", "item", "keccak",
    "layernorm", "leaky_relu", "lerp", "linear", "linear_with_vars", "log", "log10", "log2", "log_softmax",
    "logaddexp", "logcumsumexp", "logical_not", "logsigmoid", "logsumexp", "long", "lshift", "masked_fill",
    "masked_select", "matmul", "max", "max_numel", "max_pool2d", "max_unpool2d", "maximum", "mean", "meshgrid",
    "min", "minimum", "mish", "mod", "mul", "multinomial", "nbytes", "ne", "neg", "newton_schulz", "nll_loss",
    "nonzero", "normalize", "numel", "numpy", "one_hot", "ones_like", "pad", "pad_to", "permute", "pow", "prod",
    "qr", "quick_gelu", "rand_like", "randn_like", "realize", "rearrange", "reciprocal", "relu", "relu6",
    "repeat", "repeat_interleave", "replace", "reshape", "roll", "round", "rshift", "rsqrt",
    "scaled_dot_product_attention", "scatter", "scatter_reduce", "schedule_linear", "selu", "sequential", "shard",
    "shard_", "shard_like", "short", "shrink", "shrink_to", "sigmoid", "sign", "silu", "sin", "sinh", "size",
    "softmax", "softmin", "softplus", "softsign", "sort", "sparse_categorical_crossentropy", "split", "sqrt",
    "square", "squeeze", "stack", "std", "std_mean", "sub", "sum", "svd", "swish", "tan", "tanh", "threefry",
    "to", "to_", "tolist", "topk", "transpose", "tril", "triu", "trunc", "ufix", "unflatten", "unfold",
    "unsqueeze", "uprod", "usum", "var", "var_mean", "view", "where", "zeros_like",
)
TINYGRAD_STATIC = (
    "arange", "const", "einsum", "empty", "eye", "from_blob", "from_url", "full", "glorot_uniform", "invalids",
    "kaiming_normal", "kaiming_uniform", "linspace", "manual_seed", "normal", "ones", "rand", "randint", "randn",
    "random_bits", "randperm", "scaled_uniform", "uniform", "zeros",
)
TINYGRAD_PROPERTIES = (
    "T", "device", "dtype", "grad", "is_param", "max_shape", "ndim", "shape", "uop",
)

_INTERNAL = "tinygrad internals (its UOp/function/linearizer API), not part of glassgrad's design"
DELIBERATELY_ABSENT: dict[str, str] = {
    "alu": _INTERNAL, "call": _INTERNAL, "callify": _INTERNAL, "custom_kernel": _INTERNAL, "ufix": _INTERNAL,
    "linear_with_vars": _INTERNAL, "schedule_linear": _INTERNAL, "invalids": _INTERNAL, "const": _INTERNAL,
    "uprod": _INTERNAL, "usum": _INTERNAL, "as_param": _INTERNAL,
    "max_numel": _INTERNAL + " (symbolic-shape bookkeeping)", "max_shape": _INTERNAL + " (symbolic-shape bookkeeping)",
    "image_conv2d": "tinygrad's Qualcomm image-texture path; glassgrad has no image dtypes",
    "image_dot": "tinygrad's Qualcomm image-texture path; glassgrad has no image dtypes",
    "decode_hevc_frame": "hardware video decoding (tinygrad's NV/AMD HEVC path); no such device here",
    "from_blob": "wraps a raw pointer without a copy; glassgrad's buffers are owned by its allocators",
    "from_url": "downloads; glassgrad keeps network access out of Tensor (use nn.state / datasets)",
    "hash": "tinygrad's keccak-based content hash; needs keccak first",
    "keccak": "a SHA-3 kernel built from uint64 bit ops; out of scope for now",
    "threefry": "tinygrad's Threefry RNG; glassgrad's device generator is a different counter-based hash (Tensor.rand)",
    "shard_like": "multi-device tensors are issue 19",
}
ALL_NAMES = sorted({*TINYGRAD_METHODS, *TINYGRAD_STATIC, *TINYGRAD_PROPERTIES})


def _kind(name: str) -> str:
    """How glassgrad's Tensor defines `name`: function, staticmethod, classmethod, property or a slot."""
    for cls in Tensor.__mro__:
        if name in cls.__dict__:
            return type(cls.__dict__[name]).__name__
    return "missing"


def test_the_lists_are_tinygrads() -> None:
    """The literals hold public names only, each once (a guard against a hand-edit gone wrong)."""
    assert len(ALL_NAMES) == len(TINYGRAD_METHODS) + len(TINYGRAD_STATIC) + len(TINYGRAD_PROPERTIES) >= 250
    assert not any(n.startswith("_") for n in ALL_NAMES)
    assert set(DELIBERATELY_ABSENT) <= set(ALL_NAMES)


@pytest.mark.parametrize("name", [n for n in ALL_NAMES if n not in DELIBERATELY_ABSENT])
def test_tinygrad_name_exists(name: str) -> None:
    assert hasattr(Tensor, name), f"Tensor.{name} (tinygrad API) is missing; add it or list it in DELIBERATELY_ABSENT"


@pytest.mark.parametrize("name", sorted(DELIBERATELY_ABSENT))
def test_absent_list_is_current(name: str) -> None:
    assert not hasattr(Tensor, name), f"Tensor.{name} exists now: take it off DELIBERATELY_ABSENT"


@pytest.mark.parametrize("name", [n for n in TINYGRAD_METHODS if n not in DELIBERATELY_ABSENT])
def test_methods_are_not_static(name: str) -> None:
    """tinygrad's `self`-first functions bind the first argument of `Tensor.f(a, ...)` as self."""
    assert _kind(name) in ("function", "property", "member_descriptor"), \
        f"Tensor.{name} is a {_kind(name)}; tinygrad's is a method, so a.{name}(...) would drop a"


@pytest.mark.parametrize("name", [n for n in TINYGRAD_STATIC if n not in DELIBERATELY_ABSENT])
def test_static_functions_need_no_instance(name: str) -> None:
    assert _kind(name) in ("staticmethod", "classmethod"), f"Tensor.{name} must be callable on the class"


# ---------------------------------------------------------------------- both call forms, one result
def _rand(*shape: int) -> Tensor:
    return Tensor(np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32))


def _cond() -> Tensor:
    return Tensor(np.array([[True, False, True], [False, True, True]]))


a, b, c = _rand(2, 3), _rand(2, 3) * 2, _rand(2, 3) * 3
BOTH_WAYS: list[tuple[str, Callable[[], Any], Callable[[], Any], tuple[int, ...]]] = [
    ("stack", lambda: a.stack(b, c, dim=1), lambda: Tensor.stack(a, b, c, dim=1), (2, 3, 3)),
    ("stack list", lambda: a.stack(b), lambda: Tensor.stack([a, b]), (2, 2, 3)),
    ("cat", lambda: a.cat(b, c, dim=1), lambda: Tensor.cat(a, b, c, dim=1), (2, 9)),
    ("where", lambda: _cond().where(a, b), lambda: Tensor.where(_cond(), a, b), (2, 3)),
    ("meshgrid", lambda: Tensor([1, 2]).meshgrid(Tensor([3, 4, 5]))[1],
     lambda: Tensor.meshgrid(Tensor([1, 2]), Tensor([3, 4, 5]))[1], (2, 3)),
    ("einsum", lambda: a.einsum("ij,kj->ik", a, b), lambda: Tensor.einsum("ij,kj->ik", [a, b]), (2, 2)),
    ("matmul", lambda: a.matmul(b.T), lambda: Tensor.matmul(a, b.T), (2, 2)),
    ("dot", lambda: a.dot(b.T), lambda: Tensor.dot(a, b.T), (2, 2)),
    ("maximum", lambda: a.maximum(b), lambda: Tensor.maximum(a, b), (2, 3)),
    ("add", lambda: a.add(b), lambda: Tensor.add(a, b), (2, 3)),
    ("lerp", lambda: a.lerp(b, c), lambda: Tensor.lerp(a, b, c), (2, 3)),
    ("logaddexp", lambda: a.logaddexp(b), lambda: Tensor.logaddexp(a, b), (2, 3)),
    ("copysign", lambda: a.copysign(b), lambda: Tensor.copysign(a, b), (2, 3)),
    ("masked_fill", lambda: a.masked_fill(_cond(), 0.0), lambda: Tensor.masked_fill(a, _cond(), 0.0), (2, 3)),
    ("isclose", lambda: a.isclose(b), lambda: Tensor.isclose(a, b), (2, 3)),
    ("eq", lambda: a.eq(b), lambda: Tensor.eq(a, b), (2, 3)),
    ("cross_entropy", lambda: a.cross_entropy(Tensor([0, 2])), lambda: Tensor.cross_entropy(a, Tensor([0, 2])), ()),
    ("scaled_dot_product_attention", lambda: a.scaled_dot_product_attention(b, c),
     lambda: Tensor.scaled_dot_product_attention(a, b, c), (2, 3)),
    ("max_pool2d", lambda: _rand(1, 1, 4, 4).max_pool2d(), lambda: Tensor.max_pool2d(_rand(1, 1, 4, 4)), (1, 1, 2, 2)),
    ("gather", lambda: a.gather(1, Tensor([[0], [2]])), lambda: Tensor.gather(a, 1, Tensor([[0], [2]])), (2, 1)),
    ("sort", lambda: a.sort(1)[0], lambda: Tensor.sort(a, 1)[0], (2, 3)),
    ("topk", lambda: a.topk(2)[1], lambda: Tensor.topk(a, 2)[1], (2, 2)),
]


@pytest.mark.parametrize("name,method_form,class_form,shape", BOTH_WAYS, ids=[x[0] for x in BOTH_WAYS])
def test_both_call_forms_agree(name: str, method_form: Callable[[], Any], class_form: Callable[[], Any],
                               shape: tuple[int, ...]) -> None:
    x, y = method_form(), class_form()
    assert x.shape == y.shape == shape
    np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_stack_method_keeps_self() -> None:
    """Issue 14: `a.stack(b, dim=1)` stacks a and b (it used to drop a and return shape (2, 1, 3))."""
    x, y = Tensor([[1, 2, 3], [4, 5, 6]]), Tensor([[7, 8, 9], [10, 11, 12]])
    assert x.stack(y, dim=1).tolist() == np.stack([x.numpy(), y.numpy()], 1).tolist()
    with pytest.raises(ValueError, match="one shape"):
        x.stack(Tensor([1, 2]))


def test_einsum_is_static_like_tinygrad() -> None:
    """tinygrad's einsum is a classmethod: called on an instance, the instance is not an operand."""
    sig = inspect.signature(Tensor.einsum)
    assert list(sig.parameters)[:2] == ["formula", "operands"]


# ---------------------------------------------------------------------- tinygrad.nn, nn.optim, nn.state
TINYGRAD_NN: dict[str, tuple[str, ...]] = {  # public names of tinygrad 0.14's nn/__init__.py, optim.py and state.py
    "nn": ("BatchNorm", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d",
           "Embedding", "GroupNorm", "InstanceNorm", "LSTMCell", "LayerNorm", "LayerNorm2d", "Linear", "RMSNorm",
           "optim", "state", "datasets"),
    "nn.optim": ("Adam", "AdamW", "LAMB", "LARS", "Muon", "Optimizer", "OptimizerGroup", "SGD"),
    "nn.state": ("TensorIO", "accept_filename", "fs_load", "fs_store", "get_parameters", "get_state_dict",
                 "inverse_safe_dtypes", "load_state_dict", "safe_dtypes", "safe_load", "safe_load_metadata",
                 "safe_save", "tar_extract", "torch_load", "zip_extract"),
}
_TINYFS = "tinygrad's tinyfs storage device (content-addressed chunks on tinybox machines); glassgrad has none"
NN_DELIBERATELY_ABSENT: dict[str, str] = {"nn.state.fs_store": _TINYFS, "nn.state.fs_load": _TINYFS}
NN_NAMES = sorted(f"{module}.{name}" for module, names in TINYGRAD_NN.items() for name in names)


def _nn_lookup(qualified: str) -> bool:
    import importlib
    module, name = qualified.rsplit(".", 1)
    return hasattr(importlib.import_module(f"glassgrad.{module}"), name)


@pytest.mark.parametrize("qualified", [n for n in NN_NAMES if n not in NN_DELIBERATELY_ABSENT])
def test_tinygrad_nn_name_exists(qualified: str) -> None:
    assert _nn_lookup(qualified), f"glassgrad.{qualified} (tinygrad's nn API) is missing; add it or list it in " \
        "NN_DELIBERATELY_ABSENT"


@pytest.mark.parametrize("qualified", sorted(NN_DELIBERATELY_ABSENT))
def test_nn_absent_list_is_current(qualified: str) -> None:
    assert not _nn_lookup(qualified), f"glassgrad.{qualified} exists now: take it off NN_DELIBERATELY_ABSENT"
