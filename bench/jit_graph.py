"""TinyJit replays with and without device graphs (CUDA graphs), in the same run: time per replayed step.

In: `--device` (default CUDA), `--batch` (MNIST batch, default 512), `--links` (kernels of the launch-bound step,
default 100), `--rounds`. Out: a table of the median time per step for each workload, replayed kernel by kernel
(`CUDAGRAPH=0`) and as graphs (`CUDAGRAPH=1`), their ratio, the kernels per step, and PyTorch's eager MNIST step
(same model, Adam) when PyTorch is installed.

Workloads: examples/mnist.py's CNN train step (Adam), and a launch-bound step: a chain of `--links` tiny kernels
(16 floats each). Each round runs `steps` replays and then synchronizes; the two modes alternate round by round,
on one capture (the flag is read at every replay), so drift hits both alike.

    python bench/jit_graph.py --device CUDA
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench import mnist_glassgrad_step, mnist_step_fns
from glassgrad import Context, Device, GlobalCounters, Tensor, TinyJit


def chain_step(device: str, links: int) -> Callable[[], object]:
    """A jitted step of `links` kernels, each a multiply-add on 16 floats, with a new input each call."""
    @TinyJit
    def chain(x: Tensor) -> Tensor:
        for i in range(links):
            x = (x * 0.999 + i * 1e-3).contiguous()
        return x

    inputs = [Tensor(np.full(16, float(i), np.float32), device=device).realize() for i in range(2)]
    calls = 0

    def step() -> object:
        nonlocal calls
        calls += 1
        return chain(inputs[calls % 2])
    return step


def per_step(step: Callable[[], object], device: str, steps: int) -> float:
    """Seconds per step over `steps` steps, the device synchronized at the end."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
    Device[device].synchronize()
    return (time.perf_counter() - start) / steps


def compare(step: Callable[[], object], device: str, steps: int, rounds: int) -> tuple[float, float, int]:
    """(seconds per step kernel by kernel, seconds per step as graphs, kernels per step)."""
    for _ in range(3):  # eager, capture, first replay (records the graphs)
        step()
    times: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(rounds):
        for flag in (0, 1):
            with Context(CUDAGRAPH=flag):
                times[flag].append(per_step(step, device, steps))
    GlobalCounters.reset()
    step()
    return statistics.median(times[0]), statistics.median(times[1]), GlobalCounters.kernel_count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CUDA")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--links", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if Device[args.device].graph is None:
        print(f"note: {args.device} has no graphs; both columns launch kernel by kernel")
    rows = [(f"MNIST train step b{args.batch}",
             compare(mnist_glassgrad_step(args.batch, args.device, jit=True), args.device, 5, args.rounds)),
            (f"chain of {args.links} tiny kernels", compare(chain_step(args.device, args.links), args.device, 50,
                                                             args.rounds))]
    print(f"TinyJit replay per step on {args.device}, median of {args.rounds} rounds")
    header = f"{'workload':<30} {'CUDAGRAPH=0':>12} {'CUDAGRAPH=1':>12} {'speedup':>8} {'kernels':>8}"
    print(header)
    print("-" * len(header))
    for name, (by_kernel, graph, kernels) in rows:
        print(f"{name:<30} {by_kernel * 1e3:10.3f}ms {graph * 1e3:10.3f}ms {by_kernel / graph:7.2f}x "
              f"{kernels:8d}")
    _, torch_step = mnist_step_fns(args.batch, args.device)
    if torch_step is not None:
        for _ in range(3):
            torch_step()
        t_torch = statistics.median(per_step(torch_step, args.device, 5) for _ in range(args.rounds))
        graph_mnist = rows[0][1][1]
        print(f"{'PyTorch eager MNIST step':<30} {t_torch * 1e3:10.3f}ms   (glassgrad with graphs / torch time: "
              f"{graph_mnist / t_torch:.2f}x)")


if __name__ == "__main__":
    main()
