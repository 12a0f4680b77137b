"""Half matmuls on a Hopper GPU with and without warpgroup MMAs, against PyTorch (cuBLAS), in one process.

In: `--repeat` (timed calls per figure, median; device events around the kernels). Out: per dtype (float16,
bfloat16) and shape (4096^3 and GPT-2 124M's MLP products at 8192 tokens, M x K x N) the TFLOP/s of `a @ b` (NN),
`a @ b.T` (NT) and `a.T @ b` (TN) with WGMMA=0 (mma.sync) and WGMMA=1 (wgmma), and PyTorch's NN.

    python bench/wgmma_compare.py [--repeat 7]
"""
from __future__ import annotations

import argparse

from bench import gpu_kernel_time, torch_gpu_time  # (bench/ is the script's directory)
from glassgrad import Context, Tensor, dtypes

SHAPES = [(4096, 4096, 4096), (8192, 768, 3072), (8192, 3072, 768), (768, 8192, 3072)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    import torch
    for dt, tdt in ((dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)):
        for m, k, n in SHAPES:
            def half(*shape: int) -> Tensor:
                return Tensor.randn(*shape, device="CUDA").cast(dt).realize()  # noqa: B023 (called at once)
            a, b, bt, at = half(m, k), half(k, n), half(n, k), half(k, m)
            flop, row = 2 * m * n * k, []
            products = {"NN": lambda: (a @ b).realize(), "NT": lambda: (a @ bt.T).realize(),  # noqa: B023
                        "TN": lambda: (at.T @ b).realize()}  # noqa: B023 (each timed in this iteration)
            for name, fn in products.items():
                for wgmma in (0, 1):
                    with Context(WGMMA=wgmma):
                        row.append(f"{name} {wgmma} {flop / gpu_kernel_time(fn, args.repeat) / 1e12:5.0f}")
            ta, tb = torch.randn(m, k, device="cuda", dtype=tdt), torch.randn(k, n, device="cuda", dtype=tdt)
            ref = flop / torch_gpu_time(lambda: ta @ tb, args.repeat) / 1e12  # noqa: B023
            print(f"{dt.name:8s} {m}x{k}x{n}  " + "  ".join(row) + f"  | torch NN {ref:5.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
