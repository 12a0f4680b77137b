"""Which kernels of one MNIST training step take the time: run the step a few times, then once with every kernel
timed, and print the kernels by time (the top `--top`), with their shape, opts and GFLOP/s.

    python bench/kernel_profile.py [--batch 128] [--top 15]
"""
from __future__ import annotations

import argparse
import pathlib
import sys

from glassgrad import Context, Device
from glassgrad.engine import realize

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench import mnist_step_fns  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    step, _ = mnist_step_fns(args.batch, Device.DEFAULT)
    for _ in range(2):
        step()
    rows: list[tuple[float, str, str, float]] = []
    original = realize.run_item

    def timed(item: realize.ScheduleItem) -> None:
        before = realize.GlobalCounters.time_sum_s
        ops = realize.GlobalCounters.global_ops
        original(item)
        seconds = realize.GlobalCounters.time_sum_s - before
        if item.ast.op is not realize.Ops.COPY:
            kernel = realize.compile_kernel(item.bufs[0].device, item.ast)
            flops = realize.GlobalCounters.global_ops - ops
            rows.append((seconds, kernel.spec.name, " ".join(map(repr, kernel.spec.opts)), flops / seconds / 1e9))
    realize.run_item = timed  # type: ignore[assignment]
    with Context(TIMING=1):
        step()
    realize.run_item = original  # type: ignore[assignment]
    total = sum(r[0] for r in rows)
    print(f"{len(rows)} kernels, {total * 1e3:.1f} ms in kernels")
    for seconds, name, opts, gflops in sorted(rows, reverse=True)[:args.top]:
        print(f"{seconds * 1e3:8.2f} ms {100 * seconds / total:5.1f}% {gflops:7.1f} GFLOP/s  {name:<28} {opts}")


if __name__ == "__main__":
    main()
