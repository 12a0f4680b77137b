"""Per-kernel times of causal bf16 attention forward and backward on a device (DEBUG=2's timings, one step after a
warm-up): which of flash attention's kernels cost what. `python bench/flash_profile.py B H T D`."""
from __future__ import annotations

import sys

import numpy as np

from glassgrad import Device, Tensor, dtypes
from glassgrad.helpers import Context

shape = tuple(int(x) for x in sys.argv[1:5]) if len(sys.argv) >= 5 else (8, 12, 1024, 64)
rng = np.random.default_rng(0)
q, k, v, dout = (Tensor(rng.standard_normal(shape).astype(np.float32)).cast(dtypes.bfloat16).contiguous().realize()
                 for _ in range(4))


def step() -> None:
    out = q.scaled_dot_product_attention(k, v, is_causal=True)
    Tensor.realize(*(out * dout).sum().gradient(q, k, v))


step()
Device[Device.DEFAULT].synchronize()
with Context(DEBUG=2):
    step()
    Device[Device.DEFAULT].synchronize()
