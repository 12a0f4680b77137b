"""Long-k products with few tiles on a GPU (weight gradients `a.T @ b`), split in two stages or not: kernel times.

In: `--variant` one of `outermost` (the scheduler's rule: the parts are the first stage's outermost axis),
`innermost` (the parts as the first stage's innermost axis, the rule before stop 32), `none` (no split) or `torch`
(PyTorch's `x.T @ y`, cuBLAS), `--repeat`. Out: per shape (M x K x N, dtype) the median summed kernel time (device
events) and TFLOP/s, then each kernel of one call (DEBUG=2's lines). Each variant patches the scheduler's module
constants, so run one variant per process:

    for v in torch outermost innermost none; do python bench/split_k.py --variant $v; done
"""
from __future__ import annotations

import argparse
import contextlib
import io
import statistics

import glassgrad.schedule as scheduler
from glassgrad import Context, Device, GlobalCounters, Tensor, dtypes
from glassgrad.dtype import DType
from glassgrad.uop.ops import UOp

SHAPES: list[tuple[int, int, int, DType]] = [
    (768, 8192, 3072, dtypes.bfloat16), (3072, 8192, 768, dtypes.bfloat16), (768, 8192, 2304, dtypes.bfloat16),
    (768, 8192, 768, dtypes.bfloat16), (512, 4096, 2048, dtypes.float32), (2048, 4096, 512, dtypes.float32),
    (512, 4096, 1536, dtypes.float32)]


def _parts_innermost() -> None:
    rule = scheduler._split_parts

    def innermost(u: UOp) -> tuple[int, bool] | None:
        parts = rule(u)
        return None if parts is None else (parts[0], False)
    scheduler._split_parts = innermost


def _torch(repeat: int) -> None:
    import torch

    from bench import torch_gpu_time  # (bench/ is the script's directory)
    for m, k, n, dt in SHAPES:
        tdt = torch.bfloat16 if dt == dtypes.bfloat16 else torch.float32
        x, y = torch.randn(k, m, device="cuda", dtype=tdt), torch.randn(k, n, device="cuda", dtype=tdt)
        t = torch_gpu_time(lambda: x.T @ y, repeat)  # noqa: B023 (timed in this iteration)
        print(f"torch     {dt.name:8s} {m}x{k}x{n}: {t * 1e6:7.1f} us {2 * m * n * k / t / 1e12:6.1f} TFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", choices=["outermost", "innermost", "none", "torch"], default="outermost")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    if args.variant == "torch":
        return _torch(args.repeat)
    if args.variant == "innermost":
        _parts_innermost()
    if args.variant == "none":
        scheduler.GPU_BUSY_BLOCKS, scheduler.GPU_MIN_BLOCKS = 0, 0
    for m, k, n, dt in SHAPES:
        a = Tensor.randn(k, m, device="CUDA").cast(dt).realize()
        b = Tensor.randn(k, n, device="CUDA").cast(dt).realize()

        def product() -> None:
            (a.T @ b).realize()  # noqa: B023 (called in this iteration)
        for _ in range(3):
            product()
        times = []
        for _ in range(args.repeat):
            GlobalCounters.reset()
            with Context(TIMING=1):
                product()
            times.append(GlobalCounters.time_sum_s)
        lines = io.StringIO()
        with contextlib.redirect_stdout(lines), Context(DEBUG=2):
            product()
            Device["CUDA"].synchronize()
        t = statistics.median(times)
        print(f"{args.variant:9s} {dt.name:8s} {m}x{k}x{n}: {t * 1e6:7.1f} us {2 * m * n * k / t / 1e12:6.1f} TFLOP/s")
        for line in lines.getvalue().splitlines():
            if "***" in line:
                print("     ", line.strip()[:150])


if __name__ == "__main__":
    main()
