"""Data-parallel training throughput (MNIST images/s, GPT-2 tokens/s) at 1, 2, 4, 8 GPUs, glassgrad and PyTorch.

glassgrad: sharded batch, replicated weights, NCCL all-reduce; against PyTorch DDP-style training in the same run.

In: the GPUs of this machine (CUDA), `nccl4py` for glassgrad's all-reduce, PyTorch (optional) for the comparison.
Out: two tables per GPU count, with the scaling efficiency against one GPU (throughput at n / (n x throughput at
1)): MNIST images/s (a small CNN, Adam), and GPT-2 tokens/s of bench/gpt.py's train step (forward, backward, AdamW;
`--gpt full`: vocab 8192, context 256, width 512, 8 heads, 6 layers; `--gpt small`: its CPU sizes). Both keep the
global batch fixed (split by rows over the GPUs: strong scaling); a GPT batch that the GPU count does not divide is
skipped with a message. GPU counts above what the machine has are skipped with a message; on a machine without
CUDA the script says so and exits 0.

    python bench/multigpu.py [--steps 20] [--batch 256] [--gpt full|small|none] [--gpt-batch 16]
    python bench/multigpu.py --cpu 2 --gpt small --steps 2   # CPU:0..N-1 in place of GPUs: checks the code paths

PyTorch: true DistributedDataParallel needs one process per GPU;
here it is timed as single-process data parallel (`torch.nn.DataParallel`), which is what one Python process can do,
and labelled so.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench/gpt.py: the GPT sizes and PyTorch model


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


def device_names(kind: str, n: int) -> tuple[str, ...]:
    """CUDA:0..n-1 (or CPU:0..n-1 with --cpu); the default device becomes the first."""
    from glassgrad.device import Device
    Device.DEFAULT = Device.canonicalize(f"{kind}:0")
    return tuple(f"{kind}:{i}" for i in range(n))


def glassgrad_mnist(n: int, batch: int, steps: int, kind: str = "CUDA") -> float:
    from glassgrad import Tensor, TinyJit, nn
    from glassgrad.nn import optim
    from glassgrad.nn.state import get_parameters
    devices = device_names(kind, n)
    model: list[Any] = [nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5), nn.Linear(64 * 20 * 20, 10)]
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


def gpt_sizes(name: str) -> Any:
    """bench/gpt.py's `Sizes` (its train config, batch and context) for --gpt full|small."""
    import gpt as gpt_bench
    return gpt_bench.FULL if name == "full" else gpt_bench.SMALL


def glassgrad_gpt(n: int, size: str, batch: int, steps: int, kind: str = "CUDA") -> float:
    """Tokens/s of bench/gpt.py's glassgrad train step (a TinyJit of forward, backward, AdamW) with the parameters
    replicated on n devices and each batch split by rows."""
    import gpt as gpt_bench
    sizes = gpt_sizes(size)
    devices = device_names(kind, n)
    step = gpt_bench.gg_train_step(sizes.train, batch, sizes.context, devices[0], devices)

    def one() -> float:
        return float(step().item())  # type: ignore[attr-defined]
    return batch * sizes.context / time_steps(one, steps)


def torch_gpt(n: int, size: str, batch: int, steps: int, device: str = "cuda") -> float | None:
    """Tokens/s of bench/gpt.py's PyTorch GPT-2 train step (eager, AdamW), under torch.nn.DataParallel for n > 1."""
    try:
        import torch
    except ImportError:
        return None
    import gpt as gpt_bench
    sizes = gpt_sizes(size)

    def data_parallel(model: Any) -> Any:
        return torch.nn.DataParallel(model, device_ids=list(range(n))) if n > 1 else model
    step = gpt_bench.torch_train_step(sizes.train, batch, sizes.context, device, data_parallel)

    def one() -> float:
        return float(step().item())  # type: ignore[attr-defined]
    return batch * sizes.context / time_steps(one, steps)


Timer = Callable[[int], float | None]


def table(title: str, unit: str, counts: Sequence[int], available: int, ours: Timer, theirs: Timer,
          divides: int | None = None) -> None:
    """One row per device count: glassgrad's and PyTorch DataParallel's throughput and scaling against one device.
    Counts above `available`, or that do not divide the batch `divides`, are skipped with a message."""
    print(f"\n{title}")
    print(f"{'GPUs':>4} | {'glassgrad ' + unit:>17} {'scaling':>8} | {'torch DataParallel ' + unit:>26} {'scaling':>8}")
    base: dict[str, float] = {}
    for n in counts:
        if n > available:
            print(f"{n:>4} | skipped: this machine has {available} device{'s' if available != 1 else ''}")
            continue
        if divides is not None and divides % n:
            print(f"{n:>4} | skipped: the batch {divides} is not divisible by {n} devices (--gpt-batch)")
            continue
        mine, other = ours(n), theirs(n)
        assert mine is not None
        base.setdefault("ours", mine)
        if other is not None:
            base.setdefault("torch", other)
        torch_text = f"{other:26.0f} {other / (n * base['torch']):8.2f}" if other is not None else \
            f"{'(no torch / no CUDA)':>26} {'':>8}"
        print(f"{n:>4} | {mine:17.0f} {mine / (n * base['ours']):8.2f} | {torch_text}")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per row (after two warm-up steps)")
    parser.add_argument("--batch", type=int, default=256, help="MNIST images per step (split over the GPUs)")
    parser.add_argument("--gpt", default="full", choices=("full", "small", "none"),
                        help="bench/gpt.py's train sizes for the GPT-2 table (none: MNIST only)")
    parser.add_argument("--gpt-batch", type=int, default=None,
                        help="GPT-2 sequences per step, split over the GPUs (default: bench/gpt.py's batch)")
    parser.add_argument("--cpu", type=int, default=0, metavar="N",
                        help="use CPU:0..N-1 instead of GPUs (glassgrad only; checks the code, times nothing useful)")
    args = parser.parse_args(argv)
    if args.gpt_batch is not None and args.gpt_batch <= 0:
        parser.error(f"--gpt-batch must be positive, got {args.gpt_batch}")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    kind, available = ("CPU", args.cpu) if args.cpu else ("CUDA", gpu_count())
    if available == 0:
        print("bench/multigpu.py: no CUDA GPU here; run it on a machine with 1-8 GPUs (and pip install "
              "'glassgrad[cuda,multigpu]'), or pass --cpu 2 to check it on CPU devices.")
        return
    if kind == "CPU":
        print(f"CPU:0..{available - 1} stand in for GPUs (a check of the code paths; the numbers mean little)")
    if kind == "CUDA":
        from glassgrad.runtime.nccl import nccl_available
        if available > 1 and not nccl_available():
            print("nccl4py is not installed: the all-reduce goes through the host (pip install 'glassgrad[multigpu]')",
                  file=sys.stderr)
    no_torch: Timer = lambda n: None  # noqa: E731
    counts = (1, 2, 4, 8)
    table(f"MNIST CNN, batch {args.batch}", "img/s", counts, available,
          lambda n: glassgrad_mnist(n, args.batch, args.steps, kind),
          (lambda n: torch_mnist(n, args.batch, args.steps)) if kind == "CUDA" else no_torch)
    if args.gpt == "none":
        return
    sizes = gpt_sizes(args.gpt)
    c, batch = sizes.train, args.gpt_batch or sizes.batch
    table(f"GPT-2 train step ({args.gpt}: L{c.n_layer} d{c.n_embd} V{c.vocab_size}), batch {batch}x{sizes.context}",
          "tok/s", counts, available, lambda n: glassgrad_gpt(n, args.gpt, batch, args.steps, kind),
          (lambda n: torch_gpt(n, args.gpt, batch, args.steps)) if kind == "CUDA" else no_torch, divides=batch)


if __name__ == "__main__":
    main()
