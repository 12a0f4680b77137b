"""The optimiser walk of docs/OPTIMIZER.md: one 1024x1024 fp32 matmul on the CPU, from the unoptimised kernel to the
final one, one opt at a time, with the generated inner loop and the time after each step.

In: `--n` (matrix size), `--repeat`. Out: markdown on stdout: per step the opts, the kernel's innermost loops, the
median time, GFLOP/s, and numpy's time for the same product, measured in the same rounds (all cores for both).

    python bench/matmul_walk.py > /tmp/walk.md
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from glassgrad import Tensor
from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.codegen.opt import Opt, OptOps
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.device import Device
from glassgrad.runtime import ops_cpu
from glassgrad.schedule import create_schedule

STEPS: list[tuple[str, list[Opt]]] = [
    ("unoptimised (NOOPT=1): i, j outside, the k reduction innermost", []),
    ("UPCAST j by 16: 16 output columns inside the k loop, one SIMD lane each",
     [Opt(OptOps.UPCAST, 1, 16)]),
    ("UPCAST i by 4: a 4x16 register tile, each loaded vector of b used 4 times",
     [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 4)]),
    ("UPCAST i by 8 instead: an 8x16 tile (8 AVX-512 accumulators) -- the heuristic's choice",
     [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8)]),
    ("+ SWAP i, j: column blocks outermost, so one 64 KB panel of b stays in L2 across the rows",
     [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.SWAP, 0, 1)]),
    ("+ UNROLL k by 2: two accumulator lanes per output (twice the registers, shorter dependency chains)",
     [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 2, 2)]),
]


def median_time(fn: object, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def inner_loops(source: str) -> str:
    """The kernel from the reduction loop (the first loop with an accumulator before it) to its end."""
    lines = source.splitlines()
    start = next((i for i, line in enumerate(lines) if "acc0" in line), 0)
    body = lines[start:]
    end = next((i for i, line in enumerate(body) if line.strip().startswith("data0[")), len(body) - 1)
    indent = min(len(line) - len(line.lstrip()) for line in body[:end + 1] if line.strip())
    return "\n".join(line[indent:] for line in body[:end + 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    n = args.n
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    (item,), _ = create_schedule([(ta @ tb).uop])
    dev = Device["CPU"]
    handles = [buf.handle for buf in item.bufs]
    expected = a @ b
    heuristic = hand_coded_optimizations(Kernel(item.ast, dev.renderer))
    print(f"Machine: {ops_cpu.THREADS} threads; the heuristic picks {heuristic}.\n")
    runs, sources = [], []
    for title, opts in STEPS:
        spec: ProgramSpec = get_program(item.ast, dev.renderer, opts)
        program = dev.program(spec.name, dev.compiler.compile_cached(spec.source))

        def run(spec: ProgramSpec = spec, program: object = program) -> None:
            program(*handles, global_size=spec.global_size, work=spec.work)  # type: ignore[operator]
        run()
        error = float(np.abs(item.bufs[0].numpy().reshape(n, n) - expected).max())
        assert error < 1e-2, f"{title}: wrong result (max error {error})"
        runs.append(run)
        sources.append((title, inner_loops(spec.source)))
    # rounds of every step and numpy in turn, so that a change in the machine's load hits all of them alike
    times: list[list[float]] = [[] for _ in range(len(STEPS) + 1)]
    for _ in range(args.repeat):
        for i, fn in enumerate([*runs, lambda: a @ b]):
            times[i].append(median_time(fn, 1))
    numpy_seconds = statistics.median(times[-1])
    numpy_rate = 2 * n**3 / numpy_seconds / 1e9
    print(f"numpy (all cores, same rounds): {numpy_seconds * 1e3:.1f} ms, {numpy_rate:.1f} GFLOP/s\n")
    print("| step | opts | time | GFLOP/s | numpy time / ours |\n|---|---|---|---|---|")
    for (title, opts), step_times in zip(STEPS, times):
        seconds = statistics.median(step_times)
        print(f"| {title} | `{' '.join(map(repr, opts)) or '-'}` | {seconds * 1e3:.1f} ms | "
              f"{2 * n**3 / seconds / 1e9:.1f} | {numpy_seconds / seconds:.2f}x |")
    for title, loops in sources:
        print(f"\n**{title}**\n\n```c\n{loops}\n```")


if __name__ == "__main__":
    main()
