"""Weight-gradient matmuls dW = g^T x over B x T tokens on a GPU: glassgrad against PyTorch (cuBLAS, TF32 off).

In: nothing (CUDA and PyTorch must be there). Out: one line per shape and way of writing it: `matmul` (the tokens
flattened, `g.T @ x`), `autograd` (the product reduced over both token axes, as autograd writes it) and `torch`:
the median time of 20 calls, TFLOP/s and the largest error relative to numpy's.

    python bench/weight_grad.py
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from glassgrad import Device, Tensor

SHAPES = [(16, 256, 1536, 512), (16, 256, 2048, 512), (16, 256, 512, 2048), (16, 256, 512, 512),
          (8, 1024, 768, 768), (8, 1024, 3072, 768), (64, 49, 256, 256)]


def median_ms(fn: Callable[[], object], sync: Callable[[], None], runs: int = 20) -> float:
    fn()
    sync()
    times = []
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def one_shape(b: int, t: int, o: int, i: int) -> None:
    """The three lines of one shape."""
    import torch
    flops = 2 * b * t * o * i
    g = Tensor.randn(b, t, o, device="CUDA").realize()
    x = Tensor.randn(b, t, i, device="CUDA").realize()
    ref = g.numpy().reshape(-1, o).T @ x.numpy().reshape(-1, i)
    ways = {"matmul": lambda: (g.permute(2, 0, 1).reshape(o, b * t) @ x.reshape(b * t, i)).realize(),
            "autograd": lambda: (g.reshape(b, t, o, 1) * x.reshape(b, t, 1, i)).sum((0, 1)).realize()}
    for name, fn in ways.items():
        err = float(np.abs(fn().numpy() - ref).max() / np.abs(ref).max())
        ms = median_ms(fn, Device["CUDA"].synchronize)
        print(f"{name:8s} B{b} T{t} {o}x{i}: {ms:.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s  rel. error {err:.1e}")
    tg, tx = torch.randn(b * t, o, device="cuda"), torch.randn(b * t, i, device="cuda")
    ms = median_ms(lambda: tg.T @ tx, torch.cuda.synchronize)
    print(f"{'torch':8s} B{b} T{t} {o}x{i}: {ms:.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s")


def main() -> None:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    for shape in SHAPES:
        one_shape(*shape)


if __name__ == "__main__":
    main()
