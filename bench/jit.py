"""TinyJit on the MNIST CNN train step (examples/mnist.py): step time eager vs replayed, the Python overhead of a
replay, and the peak device memory of a step eagerly (without and with the memory planner: MEMPLAN=0/1), replayed
without the planner, and replayed with it.

In: `--batch` (default 128), `--device` (default CPU), `--repeat`, `--model mlp` (a small MLP instead of the CNN: a
step of tiny kernels, where eager time is mostly Python). Out: one table. The Python overhead of a replay is
its wall time minus the time spent inside kernels (`GlobalCounters.time_sum_s`, TIMING=1), as a share of the step.
Peak memory is the allocator's `peak_bytes` during one step, above what was live before the model was made
(so it counts parameters, optimiser state, inputs and intermediates).

    python bench/jit.py
    python bench/jit.py --model mlp --batch 32
"""
from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import numpy as np

from bench import mnist_example
from glassgrad import Context, Device, GlobalCounters, Tensor, TinyJit, nn
from glassgrad.nn import optim, state


class MLP:
    """A small model whose step is Python-bound when run eagerly (many tiny kernels)."""

    def __init__(self) -> None:
        self.layers = [nn.Linear(784, 128), nn.BatchNorm(128), Tensor.relu, nn.Linear(128, 10)]

    def __call__(self, x: Tensor) -> Tensor:
        return x.flatten(1).sequential(self.layers)


def make_step(batch: int, device: str, mode: str, model_name: str) -> Callable[[], Tensor]:
    """mode: 'eager' / 'eager-unplanned' (MEMPLAN=0), 'jit' (memory planned) or 'jit-unplanned'; model_name: 'cnn'
    (examples/mnist.py) or 'mlp'."""
    example = mnist_example()
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((batch, 1, 28, 28), dtype=np.float32), device=device).realize()
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32), device=device).realize()
    previous, Device.DEFAULT = Device.DEFAULT, Device.canonicalize(device)
    model = example.Model() if model_name == "cnn" else MLP()
    opt = optim.Adam(state.get_parameters(model))
    Device.DEFAULT = previous
    jitted: TinyJit[Tensor] = example.train_step_fn(model, opt)
    jitted.plan_memory = mode != "jit-unplanned"

    def eager() -> Tensor:
        return example.train_step(model, opt, x, y)

    def step() -> Tensor:
        with Context(MEMPLAN=int(mode != "eager-unplanned")):
            loss = eager() if mode.startswith("eager") else jitted(x, y)
        Device[device].synchronize()
        return loss
    return step


def measure(batch: int, device: str, mode: str, model_name: str, repeat: int) -> tuple[float, float, int]:
    """(median wall seconds, median seconds outside kernels, peak bytes of one step)."""
    allocator = Device[device].allocator
    gc.collect()
    before = allocator.live_bytes
    step = make_step(batch, device, mode, model_name)
    for _ in range(3):  # eager, capture, then replays
        step()
    allocator.reset_peak()
    step()
    peak = allocator.peak_bytes - before
    walls, overheads = [], []
    for _ in range(repeat):
        GlobalCounters.reset()
        with Context(TIMING=1):
            start = time.perf_counter()
            step()
            wall = time.perf_counter() - start
        walls.append(wall)
        overheads.append(wall - GlobalCounters.time_sum_s)
    return statistics.median(walls), statistics.median(overheads), peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--device", default=Device.DEFAULT)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--model", choices=("cnn", "mlp"), default="cnn", help="mlp: a small, Python-bound step")
    args = parser.parse_args()
    print(f"MNIST {args.model.upper()} train step, batch {args.batch}, device {args.device}, TIMING=1")
    header = f"{'mode':<16} {'step':>10} {'outside kernels':>24} {'peak memory':>12}"
    print(header)
    print("-" * len(header))
    results = {}
    for mode in ("eager-unplanned", "eager", "jit-unplanned", "jit"):
        wall, overhead, peak = measure(args.batch, args.device, mode, args.model, args.repeat)
        results[mode] = (wall, peak)
        print(f"{mode:<16} {wall * 1e3:8.1f}ms {overhead * 1e3:10.2f}ms = {overhead / wall * 100:5.1f}% "
              f"{peak / 2**20:9.1f}MiB")
    print(f"replay vs eager step time: {results['eager'][0] / results['jit'][0]:.2f}x faster; planner: eager peak "
          f"{results['eager'][1] / results['eager-unplanned'][1]:.2f}x of unplanned, replay peak "
          f"{results['jit'][1] / results['jit-unplanned'][1]:.2f}x of unplanned, "
          f"{results['jit'][1] / results['eager'][1]:.2f}x of (planned) eager")


if __name__ == "__main__":
    main()
