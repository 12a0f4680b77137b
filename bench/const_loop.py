"""Eager loop with a Python float that changes every step: glassgrad (lifted constants on/off) against PyTorch.

`python bench/const_loop.py` (`DEV=CUDA` for the GPU) prints ms a step of `(x * s + i).relu().sum().item()` on a
256 x 256 tensor, s and i new each step. With LIFT_CONSTANTS=0 each step builds and compiles a kernel; lifted
(the default), the kernel and the schedule are reused (docs/ARCHITECTURE.md, "Constants as kernel parameters").
"""
from __future__ import annotations

import os
import time

import numpy as np

from glassgrad import Tensor
from glassgrad.helpers import Context

DEV = os.environ.get("DEV", "CPU")
X = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32)


def glassgrad_step_ms(x: Tensor, steps: int, lift: int) -> float:
    """ms a step; each (lift, step) gives values no earlier call used, so nothing is found in a cache by value."""
    with Context(LIFT_CONSTANTS=lift):
        start = time.perf_counter()
        for i in range(steps):
            (x * (0.5 + 0.001 * i + 0.1 * lift + 1e-5 * steps) + i).relu().sum().item()
        return (time.perf_counter() - start) / steps * 1e3


def torch_step_ms(steps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    tx = torch.from_numpy(X).to("cuda" if DEV == "CUDA" else "cpu")
    start = time.perf_counter()
    for i in range(steps):
        (tx * (0.5 + 0.001 * i) + i).relu().sum().item()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    x = Tensor(X, device=DEV).realize()
    glassgrad_step_ms(x, 3, 1)
    literal, lifted = glassgrad_step_ms(x, 10, 0), glassgrad_step_ms(x, 200, 1)
    print(f"{DEV}: literal constants {literal:.2f} ms a step, lifted {lifted:.3f} ms a step")
    if (reference := torch_step_ms(200)) is not None:
        print(f"PyTorch: {reference:.3f} ms a step")


if __name__ == "__main__":
    main()
