"""Per-kernel GPU times of one TinyJit'd MNIST CNN training step (examples/mnist.py's model, Adam).

In: `--device` (default CUDA), `--batch` (default 512), `--steps` (replays timed, default 5), `--top` (rows shown).
Out: the kernels of one step, slowest first: name, launch grid x block, median time over the replays (device
events, as DEBUG=2 prints them), GFLOP/s, GB/s and share of the step's kernel time; then the step's kernel total.

    python bench/gpu_step.py --device CUDA --batch 512
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import statistics

from bench import mnist_glassgrad_step
from glassgrad import Context

LINE = re.compile(r"\*\*\*\s+\d+\s+(\S+)\s+\(jit\)\s+([\d.]+) us\s+([\d.]+) GFLOP/s\s+([\d.]+) GB/s")


def step_kernel_times(device: str, batch: int, steps: int) -> list[tuple[str, float, float, float]]:
    """(name, median microseconds, GFLOP/s, GB/s) of each kernel of a replayed step, in launch order."""
    step = mnist_glassgrad_step(batch, device, jit=True)
    for _ in range(3):  # eager, capture, first replay (compiles are done by then)
        step()
    runs: list[list[tuple[str, float, float, float]]] = []
    for _ in range(steps):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), Context(DEBUG=2):
            step()
        runs.append([(m[1], float(m[2]), float(m[3]), float(m[4])) for m in LINE.finditer(out.getvalue())])
    if not runs[0] or any(len(r) != len(runs[0]) for r in runs):
        raise RuntimeError("the replays launched different kernels: is the step jitted?")
    rows = []
    for i, (name, _, _, _) in enumerate(runs[0]):
        us = statistics.median(r[i][1] for r in runs)
        scale = statistics.median(r[i][1] for r in runs) / max(runs[0][i][1], 1e-9)
        rows.append((name, us, runs[0][i][2] / scale, runs[0][i][3] / scale))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CUDA")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    rows = step_kernel_times(args.device, args.batch, args.steps)
    total = sum(r[1] for r in rows)
    print(f"MNIST train step, batch {args.batch}, {args.device}: {len(rows)} kernels, {total / 1e3:.2f} ms of kernel "
          f"time (median of {args.steps} replays)")
    header = f"{'#':>3} {'kernel':<32} {'us':>10} {'GFLOP/s':>9} {'GB/s':>8} {'share':>6}"
    print(header)
    print("-" * len(header))
    order = sorted(range(len(rows)), key=lambda i: -rows[i][1])
    for i in order[:args.top]:
        name, us, gflops, gbs = rows[i]
        print(f"{i:3d} {name:<32} {us:10.1f} {gflops:9.1f} {gbs:8.1f} {us / total * 100:5.1f}%")


if __name__ == "__main__":
    main()
