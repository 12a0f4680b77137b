"""The matmuls of a GPT training step by operand layout, on a GPU: glassgrad against PyTorch (cuBLAS).

A linear layer's three products read their operands in three layouts: the forward `x @ W.T` (both factors
contiguous along the reduced axis, "NT"), the input gradient `g @ W` (the second factor contiguous across the
outputs, "NN") and the weight gradient `g.T @ x` (both factors strided along the reduced axis, "TN"). A fourth row
per shape reads the gradient as float32 and converts it in the tile copies (`g32.cast(bf16) @ W`), as a step does
when the gradient reaching a half product is a float32 one cast down.

In: `--repeat` (calls timed per row, on the device: events around the kernels); `--dtype float32` for
bench/gpt.py's fp32 small config's shapes (4096 tokens, width 512, vocabulary 8192) and 4096^3, in float32 with
TF32 off on both sides (default: bfloat16, GPT-2 124M's shapes). Out: one line per shape and layout: median ms,
TFLOP/s, PyTorch's ms and TFLOP/s for the same layout, and the error relative to PyTorch's result.

    python bench/matmul_layouts.py [--dtype float32]
"""
from __future__ import annotations

import argparse

import numpy as np

from bench import gpu_kernel_time, torch_gpu_time  # (bench/ is the script's directory)
from glassgrad import Tensor, dtypes

# (M, K, N) of x @ W.T for GPT-2 124M's linear layers at batch 8 x 1024 tokens (c_attn, c_proj, c_fc, mlp c_proj)
SHAPES = [(8192, 768, 2304), (8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768)]
# ... of the fp32 small config at batch 16 x 256 tokens (c_attn, c_proj, c_fc, mlp c_proj, the tied head), and 4096^3
SHAPES_FP32 = [(4096, 512, 1536), (4096, 512, 512), (4096, 512, 2048), (4096, 2048, 512), (4096, 512, 8192),
               (4096, 4096, 4096)]


def one_shape(m: int, k: int, n: int, runs: int, half: bool = True) -> None:
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    flops = 2 * m * k * n
    rng = np.random.default_rng(0)
    xs, ws, gs = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (n, k), (m, n)))
    bf = dtypes.bfloat16 if half else dtypes.float32
    x, w, g = (Tensor(a, device="CUDA").cast(bf).realize() for a in (xs, ws, gs))
    g32 = Tensor(gs, device="CUDA").realize()
    tx, tw, tg = (torch.from_numpy(a).cuda().to(torch.bfloat16 if half else torch.float32) for a in (xs, ws, gs))
    tg32 = torch.from_numpy(gs).cuda()
    rows = {"NT x@W.T": (lambda: x @ w.T, lambda: tx @ tw.T),
            "NN g@W": (lambda: g @ w, lambda: tg @ tw),
            "TN g.T@x": (lambda: g.T @ x, lambda: tg.T @ tx)}
    if half:
        rows["NN g32->bf16 @W"] = (lambda: g32.cast(bf) @ w, lambda: tg32.bfloat16() @ tw)
    for name, (ours, theirs) in rows.items():
        ref = theirs().float().cpu().numpy()
        err = float(np.linalg.norm(ours().float().numpy() - ref) / np.linalg.norm(ref))
        # (nothing computed above is kept: a live result of the same graph would be reused, not recomputed)
        ms = gpu_kernel_time(lambda f=ours: f().realize(), runs) * 1e3  # type: ignore[misc]
        tms = torch_gpu_time(theirs, runs) * 1e3
        print(f"{name:16s} {m}x{k}x{n}: {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s | torch {tms:7.3f} ms "
              f"{flops / tms / 1e9:6.1f} TFLOP/s | {tms / ms:4.2f}x  rel. error {err:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    args = parser.parse_args()
    half = args.dtype == "bfloat16"
    for shape in SHAPES if half else SHAPES_FP32:
        one_shape(*shape, runs=args.repeat, half=half)


if __name__ == "__main__":
    main()
