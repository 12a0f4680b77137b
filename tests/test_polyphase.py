"""Polyphase (codegen/polyphase.py): a sum over taps gated by a stride's congruence runs only the taps that pass.

Forward and gradient checks of strided convolutions, transposed convolutions and pools against PyTorch (and a
numpy reference where PyTorch is absent), over strides, paddings, dilations, kernel sizes (smaller than the stride
too), groups and uneven sizes, in 1-D, 2-D and 3-D; that the kernels run the taps that pass only; and the pieces:
the exact division the rewrite relies on (hypothesis), the scheduler's stored shrink, the padded rows."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glassgrad import Tensor, kernels
from glassgrad.dtype import dtypes
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.symbolic import simplify
from tests.torch_optional import F, needs_torch, torch

RNG = np.random.default_rng(0)


def _reduce_taps(t: Tensor) -> int:
    """The iterations of the reduce loops of the (last) kernel computing `t` on the CPU (the pass is the CPU's; with
    DEV=CUDA the tensors live on the GPU): the taps it runs per output."""
    spec = kernels(t, device="CPU")[-1]
    sizes = [u.src[0].arg for u in spec.uops if u.op is Ops.RANGE and u.arg[1] in ("reduce", "unroll")]
    return int(np.prod(sizes))


def _torch_conv(n: int) -> Any:
    return {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[n]


def _check_conv(xs: tuple[int, ...], ws: tuple[int, ...], **kw: Any) -> None:
    """conv's output, input gradient and weight gradient through relu against PyTorch."""
    x, w = RNG.standard_normal(xs).astype(np.float32), RNG.standard_normal(ws).astype(np.float32)
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = xt.conv2d(wt, **kw)
    g = RNG.standard_normal(out.shape).astype(np.float32)
    (out * Tensor(g)).relu().sum().backward()
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    to = _torch_conv(len(xs) - 2)(tx, tw, **kw)
    (to * torch.tensor(g)).relu().sum().backward()
    np.testing.assert_allclose(out.numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert xt.grad is not None and wt.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


SIZES_2D = [(9, 9), (33, 31), (8, 7)]


@needs_torch
@pytest.mark.parametrize("size,kernel,stride,padding", [
    (s, k, st_, p) for s, k, st_, p in itertools.product(SIZES_2D, (1, 2, 3, 5), (2, 3), (0, 1, 2))
    if s[0] + 2 * p >= k and s[1] + 2 * p >= k])
def test_strided_conv_2d(size: tuple[int, int], kernel: int, stride: int, padding: int) -> None:
    _check_conv((2, 3, *size), (4, 3, kernel, kernel), stride=stride, padding=padding)


@needs_torch
@pytest.mark.parametrize("xs,ws,kw", [
    ((2, 4, 17, 15), (6, 2, 3, 3), dict(stride=2, padding=1, groups=2)),
    ((2, 6, 13, 11), (6, 2, 3, 3), dict(stride=3, padding=2, groups=3)),
    ((2, 4, 17, 15), (6, 4, 3, 3), dict(stride=2, padding=1, dilation=2)),  # gcd(2, 2): not split, still right
    ((2, 4, 17, 15), (6, 4, 3, 3), dict(stride=3, padding=2, dilation=2)),  # tap coefficient -2 = 1 mod 3
    ((2, 4, 17, 15), (6, 4, 3, 3), dict(stride=(2, 3), padding=(1, 2), dilation=(1, 2))),
    ((2, 3, 17), (4, 3, 3), dict(stride=2, padding=1)),
    ((2, 3, 23), (4, 3, 7), dict(stride=3, padding=3)),
    ((2, 3, 9, 8, 7), (4, 3, 3, 3, 3), dict(stride=2, padding=1)),
    ((2, 3, 9, 8, 7), (4, 3, 3, 2, 1), dict(stride=(2, 3, 2), padding=(1, 0, 2))),
])
def test_strided_conv_other_shapes(xs: tuple[int, ...], ws: tuple[int, ...], kw: dict[str, Any]) -> None:
    _check_conv(xs, ws, **kw)


@pytest.mark.parametrize("kernel,stride,padding,taps", [(3, 2, 1, 2 * 2), (5, 2, 2, 3 * 3), (5, 3, 2, 2 * 2),
                                                        (4, 2, 1, 2 * 2), (7, 3, 3, 3 * 3)])
def test_input_gradient_runs_the_taps_that_pass(kernel: int, stride: int, padding: int, taps: int) -> None:
    """A stride-s input gradient sums over ceil(K/s) taps per dim, not K (6 output channels each)."""
    xt = Tensor(RNG.standard_normal((2, 4, 16, 16)).astype(np.float32), requires_grad=True)
    w = Tensor(RNG.standard_normal((6, 4, kernel, kernel)).astype(np.float32))
    xt.conv2d(w, stride=stride, padding=padding).sum().backward()
    assert xt.grad is not None
    assert _reduce_taps(xt.grad) == 6 * taps


def test_input_gradient_matches_numpy() -> None:
    """Without PyTorch: the stride-2 input gradient against a numpy scatter of the products (kernel 3, pad 1, 9x7)."""
    x = RNG.standard_normal((2, 3, 9, 7)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    xt = Tensor(x, requires_grad=True)
    out = xt.conv2d(Tensor(w), stride=2, padding=1)
    g = RNG.standard_normal(out.shape).astype(np.float32)
    (out * Tensor(g)).sum().backward()
    padded = np.zeros((2, 3, 11, 9), np.float32)
    for oy, ox, ky, kx in itertools.product(range(out.shape[2]), range(out.shape[3]), range(3), range(3)):
        padded[:, :, 2 * oy + ky, 2 * ox + kx] += np.einsum("no,oc->nc", g[:, :, oy, ox], w[:, :, ky, kx])
    assert xt.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), padded[:, :, 1:-1, 1:-1], rtol=1e-4, atol=1e-4)


@needs_torch
@pytest.mark.parametrize("size,kernel,stride,padding,out_pad,dilation,groups", [
    ((9, 8), 3, 2, 1, 0, 1, 1), ((7, 7), 4, 2, 1, 0, 1, 1), ((8, 9), 3, 3, 0, 1, 1, 1), ((5, 6), 3, 2, 1, 1, 2, 1),
    ((6, 5), 5, 3, 2, 2, 1, 2), ((4, 7), 2, 3, 0, 0, 1, 1), ((5, 5), 1, 2, 0, 1, 1, 1)])
def test_strided_conv_transpose(size: tuple[int, int], kernel: int, stride: int, padding: int, out_pad: int,
                                dilation: int, groups: int) -> None:
    x = RNG.standard_normal((2, 4, *size)).astype(np.float32)
    w = RNG.standard_normal((4, 6 // groups, kernel, kernel)).astype(np.float32)
    kw: dict[str, Any] = dict(stride=stride, padding=padding, output_padding=out_pad, dilation=dilation,
                              groups=groups)
    xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = xt.conv_transpose2d(wt, **kw)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    to = F.conv_transpose2d(tx, tw, **kw)
    g = RNG.standard_normal(to.shape).astype(np.float32)
    (out * Tensor(g)).sum().backward()
    (to * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), to.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert xt.grad is not None and wt.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(wt.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)


def test_conv_transpose_runs_the_inputs_that_exist() -> None:
    """A stride-2 transposed convolution (kernel 3) sums over 2 x 2 taps per output, not the dilated input's 3 x 3."""
    x = Tensor(RNG.standard_normal((2, 4, 8, 8)).astype(np.float32))
    w = Tensor(RNG.standard_normal((4, 5, 3, 3)).astype(np.float32))
    assert _reduce_taps(x.conv_transpose2d(w, stride=2, padding=1)) == 4 * 2 * 2


@needs_torch
@pytest.mark.parametrize("shape,kernel,stride,padding,dilation", [
    ((2, 3, 9, 9), 3, 2, 1, 1), ((2, 3, 33, 31), 3, 2, 0, 1), ((2, 3, 10, 11), 5, 3, 2, 1), ((2, 3, 9, 10), 3, 2, 1, 2),
    ((2, 3, 11, 9), (3, 2), (2, 1), (1, 0), 1), ((2, 3, 8, 8), 2, 3, 0, 1)])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_strided_pool_backward(shape: tuple[int, ...], kernel: Any, stride: Any, padding: Any, dilation: int,
                               kind: str) -> None:
    if kind == "avg" and dilation != 1:
        pytest.skip("avg_pool2d has no dilation in PyTorch")
    x = RNG.standard_normal(shape).astype(np.float32)
    xt, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out: Any
    if kind == "max":
        out, to = xt.max_pool2d(kernel, stride, dilation=dilation, padding=padding), \
            F.max_pool2d(tx, kernel, stride, dilation=dilation, padding=padding)
    else:
        out, to = xt.avg_pool2d(kernel, stride, padding=padding), F.avg_pool2d(tx, kernel, stride, padding=padding)
    g = RNG.standard_normal(to.shape).astype(np.float32)
    (out * Tensor(g)).sum().backward()
    (to * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), to.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert xt.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


@needs_torch
def test_pool_backward_1d_and_3d() -> None:
    x1 = RNG.standard_normal((2, 3, 17)).astype(np.float32)
    x3 = RNG.standard_normal((2, 3, 7, 8, 9)).astype(np.float32)
    for x, ours, theirs in ((x1, lambda t: t.max_pool2d((3,), (2,), padding=(1,)),
                             lambda t: F.max_pool1d(t, 3, 2, padding=1)),
                            (x3, lambda t: t.avg_pool2d((3, 3, 3), (2, 2, 2), padding=1),
                             lambda t: F.avg_pool3d(t, 3, 2, padding=1))):
        xt, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        out, to = ours(xt), theirs(tx)
        g = RNG.standard_normal(to.shape).astype(np.float32)
        (out * Tensor(g)).sum().backward()
        (to * torch.tensor(g)).sum().backward()
        assert xt.grad is not None
        np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_padded_input_gradient_stores_the_shrink() -> None:
    """A padded input's gradient read by two kernels is stored without the pad's border (schedule: `_shrunk_view`):
    no (2, 4, 12, 12) kernel for a 10 x 10 input padded by 1."""
    x = RNG.standard_normal((2, 4, 10, 10)).astype(np.float32)
    w1 = RNG.standard_normal((4, 4, 1, 1)).astype(np.float32)
    w2 = RNG.standard_normal((6, 4, 3, 3)).astype(np.float32)
    xt, w1t, w2t = (Tensor(a, requires_grad=True) for a in (x, w1, w2))
    xt.conv2d(w1t).relu().conv2d(w2t, stride=2, padding=1).sum().backward()
    assert xt.grad is not None and w1t.grad is not None
    names = [spec.name for spec in kernels(xt.grad, w1t.grad)]
    assert not any("_12_12" in name for name in names), names
    padded = np.pad(np.maximum(np.einsum("nchw,oc->nohw", x, w1[:, :, 0, 0]), 0), ((0, 0), (0, 0), (1, 1), (1, 1)))
    grad_h = np.zeros_like(padded)  # the sum's gradient folded onto the padded input, then cut and masked by relu
    for oy, ox in itertools.product(range(5), range(5)):
        grad_h[:, :, 2 * oy:2 * oy + 3, 2 * ox:2 * ox + 3] += w2.sum(0)
    grad_h = grad_h[:, :, 1:-1, 1:-1] * (padded[:, :, 1:-1, 1:-1] > 0)
    np.testing.assert_allclose(xt.grad.numpy(), np.einsum("nohw,oc->nchw", grad_h, w1[:, :, 0, 0]), rtol=1e-4,
                               atol=1e-4)


def _numpy_conv1d_grads(x: np.ndarray, w: np.ndarray, g: np.ndarray, stride: int, padding: int,
                        dilation: int) -> tuple[np.ndarray, np.ndarray]:
    """The output of a 1-D conv and its input gradient for the incoming gradient g, by the definition."""
    n, _, size = x.shape
    padded = np.pad(x, ((0, 0), (0, 0), (padding, padding)))
    out_size = (size + 2 * padding - dilation * (w.shape[2] - 1) - 1) // stride + 1
    out = np.zeros((n, w.shape[0], out_size), np.float32)
    grad = np.zeros_like(padded)
    for o, k in itertools.product(range(out_size), range(w.shape[2])):
        at = o * stride + k * dilation
        out[:, :, o] += padded[:, :, at] @ w[:, :, k].T
        grad[:, :, at] += g[:, :, o] @ w[:, :, k]
    return out, grad[:, :, padding:padding + size]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 19), st.integers(1, 6), st.integers(1, 4), st.integers(0, 3), st.integers(1, 3))
def test_strided_conv1d_gradient_by_definition(size: int, kernel: int, stride: int, padding: int,
                                               dilation: int) -> None:
    """Any size, kernel, stride, padding and dilation (hypothesis): the output and input gradient of a 1-D conv
    against the definition (numpy, no PyTorch needed)."""
    if size + 2 * padding < dilation * (kernel - 1) + 1:
        return
    rng = np.random.default_rng(size * 1000 + kernel * 100 + stride * 10 + padding)
    x = rng.standard_normal((2, 3, size)).astype(np.float32)
    w = rng.standard_normal((4, 3, kernel)).astype(np.float32)
    xt = Tensor(x, requires_grad=True)
    out = xt.conv2d(Tensor(w), stride=stride, padding=padding, dilation=dilation)
    g = rng.standard_normal(out.shape).astype(np.float32)
    (out * Tensor(g)).sum().backward()
    want_out, want_grad = _numpy_conv1d_grads(x, w, g, stride, padding, dilation)
    np.testing.assert_allclose(out.numpy(), want_out, rtol=1e-4, atol=1e-4)
    assert xt.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), want_grad, rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- the exact division the rewrite relies on
def _rng(size: int, i: int) -> UOp:
    return UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, size),), (i, "global"))


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 7), st.lists(st.tuples(st.integers(-40, 40), st.integers(1, 9)), min_size=1, max_size=3),
       st.integers(-50, 50), st.sampled_from([1, 1, 1, 2**20, 2**29]))
def test_exact_multiple_divides_exactly(d: int, terms: list[tuple[int, int]], const: int, scale: int) -> None:
    """(d*a) // d == a and (d*a) % d == 0 for a sum of any sign (C's truncating division), and a sum that may wrap
    is left alone: checked against the values at every point of the loops."""
    loops = [_rng(size, i) for i, (_, size) in enumerate(terms)]
    expr = UOp.const(dtypes.int32, d * const * scale)
    for loop, (coef, _) in zip(loops, terms):
        expr = expr + loop * UOp.const(dtypes.int32, d * coef * scale)
    for op in (Ops.IDIV, Ops.MOD):
        node = UOp(op, dtypes.int32, (expr, UOp.const(dtypes.int32, d)))
        simple = simplify(node)
        for point in itertools.product(*(range(size) for _, size in terms)):
            env = dict(zip(loops, point))
            wrapped = _wrap(d * const * scale + sum(d * c * scale * v for (c, _), v in zip(terms, point)))
            want = _c_div(wrapped, d) if op is Ops.IDIV else wrapped - d * _c_div(wrapped, d)
            assert _evaluate(simple, env) == want, (node, simple, point)


def _c_div(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _wrap(v: int) -> int:
    return (v + 2**31) % 2**32 - 2**31


def _evaluate(u: UOp, env: dict[UOp, int]) -> int:
    """An int32 expression's value with C semantics (truncating division, wrapping arithmetic)."""
    if u in env:
        return env[u]
    if u.op is Ops.CONST:
        return int(u.arg)
    a = [_evaluate(s, env) for s in u.src]
    if u.op is Ops.ADD:
        return _wrap(a[0] + a[1])
    if u.op is Ops.MUL:
        return _wrap(a[0] * a[1])
    if u.op is Ops.IDIV:
        return 0 if a[1] == 0 else _wrap(_c_div(a[0], a[1]))
    if u.op is Ops.MOD:
        return 0 if a[1] == 0 else a[0] - a[1] * _c_div(a[0], a[1])
    if u.op is Ops.NEG:
        return _wrap(-a[0])
    raise AssertionError(f"no evaluator for {u.op}")
