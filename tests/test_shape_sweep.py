"""Shape sweep: the CPU kernels on workloads nobody tuned for, at sizes large enough to take the optimiser's real
paths (register tiles, padded odd axes, staged windows, thread splits), forward and gradient.

test_shape_fuzz.py draws small shapes (under 60k elements) at random; this file names the workload classes a user
brings: CNN layers of other shapes (stride 2, padding, dilation, groups, 1x1, depthwise, batch 1), transformer
blocks, matmuls of odd sizes (1000, 77, 3, 1) and of transposed/permuted/strided operands, reductions over each
axis, softmax and layernorm on odd widths, and a few float16 and int32 cases. The reference is PyTorch in float64
when installed (forward and gradient), else numpy in float64 (forward; the gradient tests skip, saying why).

In: nothing (seeded random inputs). Out: pass/fail per case. `SHAPE_SWEEP=big` adds larger sizes (slower; for
hunting, e.g. `SHAPE_SWEEP=big CC=clang pytest tests/test_shape_sweep.py -n 2`).
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from torch_optional import F, needs_torch, torch

from glassgrad import Tensor

BIG = os.environ.get("SHAPE_SWEEP", "") == "big"
Fn = Callable[..., Any]


@dataclass(frozen=True)
class Case:
    """One workload: input shapes, the glassgrad call and the same computation in PyTorch (`tt`) and numpy (`np_`,
    None: PyTorch only). `grad`: also compare the gradients of every float input. `dtype`: the inputs' dtype."""
    name: str
    shapes: tuple[tuple[int, ...], ...]
    gg: Fn
    tt: Fn
    np_: Fn | None = None
    grad: bool = True
    dtype: str = "float32"
    tol: float = 2e-4
    ints: tuple[int, ...] = field(default=())  # positions of int64 inputs (indices) in `shapes`, values < 10


def _inputs(case: Case, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for i, shape in enumerate(case.shapes):
        if i in case.ints:
            out.append(rng.integers(0, 10, shape).astype(np.int32))
        elif case.dtype.startswith("int"):
            out.append(rng.integers(-5, 6, shape).astype(case.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(case.dtype))
    return out


# ---------------------------------------------------------------------- numpy references (float64)
def np_conv(x: np.ndarray, w: np.ndarray, stride: int = 1, padding: int = 0, dilation: int = 1,
            groups: int = 1) -> np.ndarray:
    """PyTorch's conv2d in float64 numpy: one einsum per kernel tap."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, cin, h, wd = x.shape
    cout, cig, kh, kw = w.shape
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, cout, oh, ow))
    cog = cout // groups
    for g in range(groups):
        xs, ws = x[:, g * cig:(g + 1) * cig], w[g * cog:(g + 1) * cog]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                           j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
                out[:, g * cog:(g + 1) * cog] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def np_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def np_layernorm(x: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


# ---------------------------------------------------------------------- the cases
def matmul_cases() -> list[Case]:
    mm = [(1000, 77, 1023), (77, 1000, 3), (1, 1024, 1000), (3, 1, 5), (1, 1, 1), (33, 257, 1), (128, 128, 96)]
    if BIG:
        mm += [(1023, 1023, 1023), (4, 4096, 77), (777, 3, 1001)]
    cases = [Case(f"matmul {m}x{k}@{k}x{n}", ((m, k), (k, n)), lambda a, b: a @ b, lambda a, b: a @ b,
                  lambda a, b: a @ b) for m, k, n in mm]
    cases += [
        Case("x.T @ y 77x1000 -> 1000x3", ((77, 1000), (77, 3)), lambda a, b: a.T @ b, lambda a, b: a.T @ b,
             lambda a, b: a.T @ b),
        Case("x @ W.T 100x77 W 1000x77", ((100, 77), (1000, 77)), lambda a, b: a @ b.T, lambda a, b: a @ b.T,
             lambda a, b: a @ b.T),
        Case("x.T @ y.T 513x257", ((257, 513), (65, 257)), lambda a, b: a.T @ b.T, lambda a, b: a.T @ b.T,
             lambda a, b: a.T @ b.T),
        Case("batched (2,77,33)@(33,65)", ((2, 77, 33), (33, 65)), lambda a, b: a @ b, lambda a, b: a @ b,
             lambda a, b: a @ b),
        Case("batched (3,1,17,29)@(5,29,31)", ((3, 1, 17, 29), (5, 29, 31)), lambda a, b: a @ b,
             lambda a, b: a @ b, lambda a, b: a @ b),
        Case("strided x[::2, 1::3] @ y[::3]", ((200, 300), (300, 64)), lambda a, b: a[::2, 1::3] @ b[::3],
             lambda a, b: a[::2, 1::3] @ b[::3], lambda a, b: a[::2, 1::3] @ b[::3]),
        Case("permuted (x.permute(2,0,1).contiguous() @ y)", ((17, 77, 3), (17, 9)),
             lambda a, b: a.permute(2, 1, 0).contiguous() @ b, lambda a, b: a.permute(2, 1, 0).contiguous() @ b,
             lambda a, b: a.transpose(2, 1, 0) @ b),
        Case("linear batch1 1x1x1024 -> 1000 + bias", ((1, 1, 1024), (1000, 1024), (1000,)),
             lambda a, w, c: a @ w.T + c, lambda a, w, c: a @ w.T + c, lambda a, w, c: a @ w.T + c),
        Case("matmul float16 100x77@77x129", ((100, 77), (77, 129)), lambda a, b: a @ b, lambda a, b: a @ b,
             lambda a, b: a @ b, grad=False, dtype="float16", tol=2e-2),
        Case("matmul int32 77x33@33x1000", ((77, 33), (33, 1000)), lambda a, b: a @ b, lambda a, b: a @ b,
             lambda a, b: a @ b, grad=False, dtype="int32", tol=0),
    ]
    return cases


def reduce_cases() -> list[Case]:
    shapes: list[tuple[int, ...]] = [(7, 77, 33), (1000, 3), (3, 1000), (1, 1023), (1023, 1), (16, 32, 9, 9)]
    if BIG:
        shapes += [(1000, 1023), (32, 64, 28, 28), (3, 1, 4097)]
    cases = []
    for shape in shapes:
        for axis in [*range(len(shape)), None]:
            ax = axis if axis is not None else tuple(range(len(shape)))
            cases.append(Case(f"sum axis={axis} {shape}", (shape,), lambda a, ax=ax: a.sum(ax),
                              lambda a, ax=ax: a.sum(ax), lambda a, ax=ax: a.sum(ax)))
            cases.append(Case(f"max axis={axis} {shape}", (shape,), lambda a, ax=ax: a.max(ax),
                              lambda a, ax=ax: a.amax(ax), lambda a, ax=ax: a.max(ax)))
        d = int(np.argmax(shape))  # (an axis of one element has no variance)
        cases.append(Case(f"mean/var/std {shape}", (shape,),
                          lambda a, d=d: a.mean(0).sum() + a.var(d) + a.std(d).sum(),
                          lambda a, d=d: a.mean(0).sum() + a.var(d) + a.std(d).sum(),
                          lambda a, d=d: a.mean(0).sum() + a.var(d, ddof=1) + a.std(d, ddof=1).sum()))
        cases.append(Case(f"argmax each axis {shape}", (shape,),
                          lambda a: sum(a.argmax(i).sum() for i in range(a.ndim)),
                          lambda a: sum(a.argmax(i).sum() for i in range(a.ndim)),
                          lambda a: sum(a.argmax(i).sum() for i in range(a.ndim)), grad=False, tol=0))
    cases += [
        Case("sum of permuted (7,77,33).permute(2,0,1) axis 1", ((7, 77, 33),),
             lambda a: a.permute(2, 0, 1).sum(1), lambda a: a.permute(2, 0, 1).sum(1),
             lambda a: a.transpose(2, 0, 1).sum(1)),
        Case("sum of strided x[::3, 1::2] axis 0", ((300, 401),), lambda a: a[::3, 1::2].sum(0),
             lambda a: a[::3, 1::2].sum(0), lambda a: a[::3, 1::2].sum(0)),
        Case("sum int32 (77,1000) axis 0 and 1", ((77, 1000),), lambda a: a.sum(0).sum() + a.sum(1).max(),
             lambda a: a.sum(0).sum() + a.sum(1).max(), lambda a: a.sum(0).sum() + a.sum(1).max(),
             grad=False, dtype="int32", tol=0),
        Case("max int32 (33,1023) axis 1", ((33, 1023),), lambda a: a.max(1), lambda a: a.amax(1),
             lambda a: a.max(1), grad=False, dtype="int32", tol=0),
        Case("sum float16 (77,1000) axis 1", ((77, 1000),), lambda a: a.sum(1), lambda a: a.sum(1),
             lambda a: a.sum(1), grad=False, dtype="float16", tol=2e-2),
        Case("cumsum axis 1 (7,1000)", ((7, 1000),), lambda a: a.cumsum(1), lambda a: a.cumsum(1),
             lambda a: a.cumsum(1)),
    ]
    return cases


def norm_cases() -> list[Case]:
    widths = [1, 3, 77, 1000, 1023] + ([4097] if BIG else [])
    cases = []
    for w in widths:
        rows = max(1, min(64, 20000 // w))
        cases += [
            Case(f"softmax rows of {w} ({rows}x{w})", ((rows, w),), lambda a: a.softmax(-1),
                 lambda a: a.softmax(-1), lambda a: np_softmax(a, -1)),
            Case(f"softmax axis 0 ({w}x{rows})", ((w, rows),), lambda a: a.softmax(0), lambda a: a.softmax(0),
                 lambda a: np_softmax(a, 0)),
            Case(f"log_softmax rows of {w}", ((rows, w),), lambda a: a.log_softmax(-1),
                 lambda a: a.log_softmax(-1), lambda a: np.log(np_softmax(a, -1))),
            Case(f"layernorm rows of {w} ({rows}x{w})", ((rows, w),), lambda a: a.layernorm(-1),
                 lambda a: F.layer_norm(a, (a.shape[-1],)), np_layernorm),
        ]
    cases += [
        Case("layernorm affine (2,77,96)", ((2, 77, 96), (96,), (96,)),
             lambda a, g, b: a.layernorm(-1) * g + b, lambda a, g, b: F.layer_norm(a, (96,), g, b),
             lambda a, g, b: np_layernorm(a) * g + b),
        Case("softmax float16 rows of 77", ((50, 77),), lambda a: a.softmax(-1), lambda a: a.softmax(-1),
             lambda a: np_softmax(a, -1), grad=False, dtype="float16", tol=5e-3),
        Case("softmax of permuted (3,77,33).permute(0,2,1) rows", ((3, 77, 33),),
             lambda a: a.permute(0, 2, 1).softmax(-1), lambda a: a.permute(0, 2, 1).softmax(-1),
             lambda a: np_softmax(a.transpose(0, 2, 1), -1)),
        Case("cross-entropy b3 vocab 1000", ((3, 1000), (3,)), lambda a, y: a.cross_entropy(y),
             lambda a, y: F.cross_entropy(a, y.long()), None, ints=(1,)),
    ]
    return cases


def conv_cases() -> list[Case]:
    # (batch, cin, h, w, cout, k, stride, padding, dilation, groups)
    specs = [
        (1, 3, 33, 33, 16, 3, 2, 1, 1, 1),     # stride 2, batch 1, odd size
        (2, 3, 32, 32, 8, 7, 2, 3, 1, 1),      # a ResNet-style stem
        (2, 16, 17, 17, 24, 1, 1, 0, 1, 1),    # 1x1
        (1, 16, 15, 15, 32, 1, 2, 0, 1, 1),    # 1x1 stride 2 (a downsample shortcut)
        (2, 12, 19, 19, 12, 3, 1, 1, 1, 12),   # depthwise
        (1, 32, 14, 14, 32, 3, 2, 1, 1, 32),   # depthwise stride 2
        (2, 8, 16, 16, 12, 3, 1, 2, 2, 2),     # dilation 2, groups 2
        (1, 6, 21, 23, 9, 5, 1, 2, 1, 3),      # 5x5, groups 3, non-square
        (3, 4, 9, 9, 5, 3, 3, 0, 1, 1),        # stride 3
        (2, 5, 8, 8, 7, 3, 1, 0, 3, 1),        # dilation 3
        (1, 1, 1, 1, 3, 1, 1, 0, 1, 1),        # everything 1
        (4, 32, 8, 8, 64, 3, 1, 1, 1, 1),      # a deeper layer
    ]
    if BIG:
        specs += [(8, 64, 28, 28, 128, 3, 2, 1, 1, 1), (1, 3, 224, 224, 32, 3, 2, 1, 1, 1),
                  (4, 96, 28, 28, 96, 3, 1, 1, 1, 96), (2, 256, 7, 7, 512, 1, 1, 0, 1, 1)]
    cases = []
    for n, cin, h, w, cout, k, s, p, d, g in specs:
        kw = dict(stride=s, padding=p, dilation=d, groups=g)
        cases.append(Case(f"conv2d {n}x{cin}x{h}x{w}->{cout} k{k} s{s} p{p} d{d} g{g}",
                          ((n, cin, h, w), (cout, cin // g, k, k), (cout,)),
                          lambda x, wt, b, kw=kw: x.conv2d(wt, b, **kw),
                          lambda x, wt, b, kw=kw: F.conv2d(x, wt, b, **kw),
                          lambda x, wt, b, kw=kw: np_conv(x, wt, **kw) + b.reshape(1, -1, 1, 1)))
    cases += [
        Case("conv2d of strided input x[:, :, ::2, ::2]", ((2, 4, 34, 34), (8, 4, 3, 3), (8,)),
             lambda x, wt, b: x[:, :, ::2, ::2].conv2d(wt, b, padding=1),
             lambda x, wt, b: F.conv2d(x[:, :, ::2, ::2], wt, b, padding=1),
             lambda x, wt, b: np_conv(x[:, :, ::2, ::2], wt, padding=1) + b.reshape(1, -1, 1, 1)),
        Case("conv2d of NHWC input permuted", ((2, 13, 11, 6), (10, 6, 3, 3), (10,)),
             lambda x, wt, b: x.permute(0, 3, 1, 2).conv2d(wt, b, stride=2, padding=1),
             lambda x, wt, b: F.conv2d(x.permute(0, 3, 1, 2), wt, b, stride=2, padding=1),
             lambda x, wt, b: np_conv(x.transpose(0, 3, 1, 2), wt, stride=2, padding=1) + b.reshape(1, -1, 1, 1)),
        Case("max_pool2d 3x3 s2 p1 (2,8,17,17)", ((2, 8, 17, 17),),
             lambda x: x.max_pool2d(3, 2, padding=1), lambda x: F.max_pool2d(x, 3, 2, padding=1)),
        Case("avg_pool2d 3 s2 (1,5,15,15)", ((1, 5, 15, 15),), lambda x: x.avg_pool2d(3, 2),
             lambda x: F.avg_pool2d(x, 3, 2)),
        Case("conv_transpose2d s2 p1 (2,8,7,7)->4", ((2, 8, 7, 7), (8, 4, 3, 3)),
             lambda x, wt: x.conv_transpose2d(wt, stride=2, padding=1, output_padding=1),
             lambda x, wt: F.conv_transpose2d(x, wt, stride=2, padding=1, output_padding=1)),
        Case("conv2d float16 (1,8,15,15)->16 s2", ((1, 8, 15, 15), (16, 8, 3, 3)),
             lambda x, wt: x.conv2d(wt, stride=2, padding=1), lambda x, wt: F.conv2d(x, wt, stride=2, padding=1),
             lambda x, wt: np_conv(x, wt, stride=2, padding=1), grad=False, dtype="float16", tol=2e-2),
    ]
    return cases


def _gg_bn(x: Any, g: Any, b: Any) -> Any:
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3), correction=0)
    return (x - mean.reshape(1, -1, 1, 1)) * (var.reshape(1, -1, 1, 1) + 1e-5).rsqrt() * g.reshape(1, -1, 1, 1) \
        + b.reshape(1, -1, 1, 1)


def _cnn(conv: Fn, pool: Fn, bn: Fn) -> Fn:
    """A small CNN unlike MNIST's: stem 5x5 s2, batch norm, max pool, depthwise 3x3, 1x1, global average pool."""
    def net(x: Any, w1: Any, g: Any, b: Any, w2: Any, w3: Any, fc: Any) -> Any:
        h = bn(conv(x, w1, stride=2, padding=2), g, b).relu()
        h = pool(h)
        h = conv(h, w2, padding=1, groups=12).relu()
        h = conv(h, w3).relu().mean((2, 3))
        return h @ fc
    return net


def _transformer(ln: Fn, gelu: Fn, sdpa: Fn, b: int, t: int, c: int, heads: int) -> Fn:
    """A pre-norm transformer block (LayerNorm, causal attention, GELU MLP)."""
    def block(x: Any, wqkv: Any, wo: Any, w1: Any, w2: Any, g: Any) -> Any:
        qkv = ln(x, g) @ wqkv
        q, k, v = (qkv[:, :, i * c:(i + 1) * c].reshape(b, t, heads, c // heads).transpose(1, 2) for i in range(3))
        h = x + sdpa(q, k, v).transpose(1, 2).reshape(b, t, c) @ wo
        return h + gelu(ln(h, g) @ w1) @ w2
    return block


def model_cases() -> list[Case]:
    cnn_shapes = ((1, 3, 37, 37), (12, 3, 5, 5), (12,), (12,), (12, 1, 3, 3), (20, 12, 1, 1), (20, 10))
    cases = [Case("CNN batch 1 3x37x37 5x5s2,bn,pool,dw3x3,1x1", cnn_shapes,
                  _cnn(lambda x, w, **kw: x.conv2d(w, **kw), lambda h: h.max_pool2d(2), _gg_bn),
                  _cnn(lambda x, w, **kw: F.conv2d(x, w, **kw), lambda h: F.max_pool2d(h, 2),
                       lambda x, g, b: F.batch_norm(x, None, None, g, b, training=True)))]
    tshapes = [(1, 77, 96, 3), (2, 17, 64, 4)] + ([(4, 128, 192, 6)] if BIG else [])
    for b, t, c, heads in tshapes:
        shapes = ((b, t, c), (c, 3 * c), (c, c), (c, 4 * c), (4 * c, c), (c,))
        cases.append(Case(f"transformer block b{b} t{t} c{c} h{heads}", shapes,
                          _transformer(lambda z, g: z.layernorm(-1) * g, lambda z: z.gelu(),
                                       lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
                                       b, t, c, heads),
                          _transformer(lambda z, g: F.layer_norm(z, (z.shape[-1],)) * g,
                                       lambda z: F.gelu(z, approximate="tanh"),
                                       lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                       b, t, c, heads), tol=5e-4))
    return cases


def elementwise_cases() -> list[Case]:
    return [
        Case("x.T + y (1000x77)", ((1000, 77), (77, 1000)), lambda a, b: a.T + b, lambda a, b: a.T + b,
             lambda a, b: a.T + b),
        Case("x.permute(2,0,1).contiguous() * 2 (3,77,1000)", ((3, 77, 100),),
             lambda a: a.permute(2, 0, 1).contiguous() * 2, lambda a: a.permute(2, 0, 1).contiguous() * 2,
             lambda a: a.transpose(2, 0, 1) * 2),
        Case("x[::2, ::3].exp() + x[1::2, ::3] (1000x77)", ((1000, 77),),
             lambda a: a[::2, ::3].exp() + a[1::2, ::3], lambda a: a[::2, ::3].exp() + a[1::2, ::3],
             lambda a: np.exp(a[::2, ::3]) + a[1::2, ::3]),
        Case("flip + broadcast (77,1)*(1,1000) tanh", ((77, 1), (1, 1000)),
             lambda a, b: (a.flip(0) * b).tanh(), lambda a, b: (a.flip(0) * b).tanh(),
             lambda a, b: np.tanh(a[::-1] * b)),
        Case("gelu 3x1023", ((3, 1023),), lambda a: a.gelu(), lambda a: F.gelu(a, approximate="tanh")),
        Case("int32 (x.T * 3 + y) // 2 (77x33)", ((33, 77), (77, 33)), lambda a, b: (a.T * 3 + b) // 2,
             lambda a, b: torch.div(a.T * 3 + b, 2, rounding_mode="floor"), lambda a, b: (a.T * 3 + b) // 2,
             grad=False, dtype="int32", tol=0),
    ]


CASES = matmul_cases() + reduce_cases() + norm_cases() + conv_cases() + model_cases() + elementwise_cases()


# ---------------------------------------------------------------------- checking
def _close(name: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    if tol == 0:
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    bad = ~np.isfinite(want64)
    np.testing.assert_array_equal(~np.isfinite(got64), bad, err_msg=f"{name}: non-finite values differ")
    got64, want64 = np.where(bad, 0.0, got64), np.where(bad, 0.0, want64)
    scale = max(1.0, float(np.abs(want64).max(initial=0.0)))
    err = float(np.abs(got64 - want64).max(initial=0.0))
    assert err <= tol * scale, \
        f"{name}: max error {err:.3g} (scale {scale:.3g}, tolerance {tol * scale:.3g})"


def _torch_reference(case: Case, arrays: Sequence[np.ndarray], seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """PyTorch's output and (for `case.grad`) the gradients of sum(out * r) for a seeded random r, in float64."""
    ts = []
    for i, a in enumerate(arrays):
        t = torch.from_numpy(a.astype(np.float64) if a.dtype.kind == "f" else a.astype(np.int64))
        if case.dtype.startswith("int") and i not in case.ints:
            t = torch.from_numpy(a)
        ts.append(t.requires_grad_(case.grad and i not in case.ints))
    out = case.tt(*ts)
    if not case.grad:
        return out.detach().numpy(), []
    r = torch.from_numpy(np.asarray(np.random.default_rng(seed + 1).standard_normal(tuple(out.shape))))
    (out * r).sum().backward()
    return out.detach().numpy(), [t.grad.numpy() for i, t in enumerate(ts) if i not in case.ints]


def _glassgrad(case: Case, arrays: Sequence[np.ndarray], seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    ts = [Tensor(a, requires_grad=case.grad and i not in case.ints) for i, a in enumerate(arrays)]
    out = case.gg(*ts)
    if not case.grad:
        return out.numpy(), []
    r = Tensor(np.asarray(np.random.default_rng(seed + 1).standard_normal(out.shape)).astype(np.float32))
    (out * r).sum().backward()
    grads = [t.grad for i, t in enumerate(ts) if i not in case.ints]
    assert all(g is not None for g in grads), f"{case.name}: an input got no gradient"
    return out.numpy(), [g.numpy() for g in grads if g is not None]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forward(case: Case) -> None:
    arrays = _inputs(case, 0)
    got, _ = _glassgrad(Case(**{**case.__dict__, "grad": False}), arrays, 0)
    if torch is not None:
        want, _ = _torch_reference(Case(**{**case.__dict__, "grad": False}), arrays, 0)
    elif case.np_ is not None:
        want = np.asarray(case.np_(*(a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays)))
    else:
        pytest.skip("no numpy reference for this case and PyTorch is not installed")
    _close(case.name, got, np.asarray(want).astype(got.dtype) if case.tol == 0 else want, case.tol)
    if torch is not None and case.np_ is not None and case.tol:  # the numpy reference agrees too
        ref = np.asarray(case.np_(*(a.astype(np.float64) if a.dtype.kind == "f" else a for a in arrays)))
        _close(case.name + " (numpy)", got, ref, case.tol)


GRAD_CASES = [c for c in CASES if c.grad]


@needs_torch
@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.name for c in GRAD_CASES])
def test_gradient(case: Case) -> None:
    arrays = _inputs(case, 0)
    got_out, got = _glassgrad(case, arrays, 0)
    want_out, want = _torch_reference(case, arrays, 0)
    _close(case.name, got_out, want_out, case.tol)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        _close(f"{case.name} d/d input {i}", g, w, case.tol * 5)


# ---------------------------------------------------------------------- drawn sizes near the tile widths
# sizes one either side of the register tiles' multiples (8, 16, 32, 64, 128, 256) and of nothing in particular
EDGE_SIZES = (1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 33, 48, 63, 65, 77, 100, 127, 129, 255, 257)
SWEEP_EXAMPLES = 300 if BIG else 12


def _sweep_settings(examples: int) -> Any:
    from hypothesis import HealthCheck, settings
    return settings(deadline=None, max_examples=SWEEP_EXAMPLES * examples // 12, derandomize=not BIG,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large], print_blob=True)


def _layout(a: np.ndarray, how: str) -> tuple[np.ndarray, Callable[[Any], Any]]:
    """An array stored another way and the view that gives `a` back from it: as is, transposed (x.T), every other
    row (x[::2]), or its rows flipped (x.flip(0))."""
    if how == "T":
        return np.ascontiguousarray(a.T), lambda t: t.T
    if how == "step":
        base = np.zeros((a.shape[0] * 2, a.shape[1]), a.dtype)
        base[::2] = a
        return base, lambda t: t[::2]
    if how == "flip":
        return np.ascontiguousarray(a[::-1]), lambda t: t.flip(0)
    return a, lambda t: t


def _hypothesis_test(make: Callable[[Any], Fn]) -> Fn:
    from hypothesis import given
    from hypothesis import strategies as st
    return given(st.data())(make(st))


def _matmul_sweep(st: Any) -> Fn:
    def test(data: Any) -> None:
        m, k, n = (data.draw(st.sampled_from(EDGE_SIZES)) for _ in range(3))
        la, lb = data.draw(st.sampled_from(("", "T", "step", "flip"))), data.draw(st.sampled_from(("", "T", "step")))
        rng = np.random.default_rng(m * 10007 + k * 101 + n)
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        (sa, va), (sb, vb) = _layout(a, la), _layout(b, lb)
        got = (va(Tensor(sa)) @ vb(Tensor(sb))).relu().numpy()
        _close(f"({m}x{k} {la}) @ ({k}x{n} {lb})", got, np.maximum(a.astype(np.float64) @ b, 0), 2e-4)
    return test


def _conv_sweep(st: Any) -> Fn:
    def test(data: Any) -> None:
        groups = data.draw(st.sampled_from((1, 1, 2, 3)))
        cin = groups * data.draw(st.sampled_from((1, 3, 8, 17)))
        cout = groups * data.draw(st.sampled_from((1, 5, 16, 24)))
        k, s, d = (data.draw(st.sampled_from(v)) for v in ((1, 2, 3, 5), (1, 1, 2, 3), (1, 1, 2)))
        p = data.draw(st.integers(0, k // 2 + 1))
        h, w = (data.draw(st.sampled_from((d * (k - 1) + 1, 9, 16, 17, 31))) for _ in range(2))
        n = data.draw(st.sampled_from((1, 2, 3)))
        rng = np.random.default_rng(cin * 1009 + cout * 31 + h * 7 + w)
        x = rng.standard_normal((n, cin, h, w)).astype(np.float32)
        wt = rng.standard_normal((cout, cin // groups, k, k)).astype(np.float32)
        got = Tensor(x).conv2d(Tensor(wt), stride=s, padding=p, dilation=d, groups=groups).numpy()
        want = np_conv(x, wt, stride=s, padding=p, dilation=d, groups=groups)
        _close(f"conv n{n} {cin}->{cout} {h}x{w} k{k} s{s} p{p} d{d} g{groups}", got, want, 2e-4)
    return test


def _reduce_sweep(st: Any) -> Fn:
    def test(data: Any) -> None:
        shape = tuple(data.draw(st.sampled_from(EDGE_SIZES)) for _ in range(data.draw(st.integers(1, 3))))
        axis = data.draw(st.sampled_from([*range(len(shape)), None]))
        op = data.draw(st.sampled_from(("sum", "max", "softmax", "layernorm")))
        x = np.random.default_rng(sum(shape) * 13 + len(shape)).standard_normal(shape).astype(np.float32)
        t, ax = Tensor(x), (axis if axis is not None else -1)
        if op == "sum":
            got, want = t.sum(axis).numpy(), x.astype(np.float64).sum(axis)
        elif op == "max":
            got, want = t.max(axis).numpy(), x.max(axis)
        elif op == "softmax":
            got, want = t.softmax(ax).numpy(), np_softmax(x.astype(np.float64), ax)
        else:
            got = t.layernorm(ax).numpy()
            x64 = np.moveaxis(x.astype(np.float64), ax, -1)
            want = np.moveaxis(np_layernorm(x64), -1, ax)
        _close(f"{op} axis {axis} of {shape}", np.asarray(got), np.asarray(want), 2e-4)
    return test


test_sweep_matmul = _sweep_settings(12)(_hypothesis_test(_matmul_sweep))
test_sweep_conv = _sweep_settings(12)(_hypothesis_test(_conv_sweep))
test_sweep_reduce = _sweep_settings(12)(_hypothesis_test(_reduce_sweep))
