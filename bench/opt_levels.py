"""The C compiler's -O2 against -O3, kernel by kernel: the measurements behind the heuristic's OPTLEVEL rule.

In: the workloads of bench/shapes.py and the wide suite (bench/wide.py), plus bench.py's conv2d, row sum and MNIST
training step (`--only` filters by name), on the CPU with the compiler `CC` names. Every distinct kernel they run
gets the heuristic's tile; its source is built once at each level (an `OPTLEVEL` opt, `runtime/ops_cpu.py`'s
flags), and the builds run on the same random inputs (`codegen/opt/search.py`'s) one after another, `--rounds` rounds,
each round the best of 3 calls, on one thread (the kernel's whole outer loop in the calling thread) timed by that
thread's CPU clock:
a loaded machine's time slicing does not count. Both builds must write the same outputs (the level changes no value:
the flags keep -ffp-contract=off and no -ffast-math); a difference is printed as DIFF.

Out: per kernel its median time at each level, the speed-up of -O3 (-O2 time / -O3 time: above 1.00 -O3 is faster),
the level the heuristic picks for it (`codegen/opt/heuristic.py`, `_level_for_kind`) and the kernel's kind as the rule
sees it; then the geometric mean of the speed-ups, and of the heuristic's choice against -O2 everywhere.

`--whole` times each workload's glassgrad call instead, under CPU_OPT_LEVEL=0 (the heuristic's level for each
kernel), 2 and 3 (every kernel at that level) in rotating rounds, by the process's CPU time (`--clock wall` for wall
time): whether the per-kernel choice makes any workload slower than -O2 everywhere (what glassgrad built before).

    PYTHONPATH=. python bench/opt_levels.py [--rounds 7] [--only conv] [--kernel r_16]
    CC=clang PYTHONPATH=. python bench/opt_levels.py
    THREADS=1 PYTHONPATH=. python bench/opt_levels.py --whole --rounds 9
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shapes import all_work  # noqa: E402
from wide import Maker, Pair, wide_pairs  # noqa: E402

from bench import mnist_glassgrad_step  # noqa: E402
from glassgrad import Context, Device  # noqa: E402
from glassgrad.codegen import ProgramSpec, get_program, kernel_ast  # noqa: E402
from glassgrad.codegen.opt import Opt, OptOps  # noqa: E402
from glassgrad.codegen.opt.heuristic import _level_for_kind, hand_coded_optimizations  # noqa: E402
from glassgrad.codegen.opt.kernel import Kernel  # noqa: E402
from glassgrad.codegen.opt.search import random_inputs, stored_buffers, test_values  # noqa: E402
from glassgrad.device import Buffer  # noqa: E402
from glassgrad.engine import realize  # noqa: E402
from glassgrad.schedule import ScheduleItem  # noqa: E402
from glassgrad.uop.ops import UOp  # noqa: E402

LEVELS = (2, 3)


def bench_pairs(m: Maker) -> list[Pair]:
    """bench.py's CPU rows of issue 18 that these levels are for, the conv2d and the row sum; and its MNIST training
    step (5x5 and 3x3 convolutions, their gradients, batch norm, max-pools, Adam) at batch 128."""
    x, w = m.pair(16, 32, 32, 32), m.pair(64, 32, 3, 3)
    s = m.pair(2048, 2048)
    return [Pair("bench conv2d 16x32x32^2->64 3x3", lambda: x[0].conv2d(w[0], padding=1).realize(), lambda: None),
            Pair("bench sum(axis=1) 2048^2", lambda: s[0].sum(axis=1).realize(), lambda: None),
            Pair("MNIST train step b128", mnist_glassgrad_step(128, "CPU"), lambda: None)]


def kernels_of(work: Callable[[], object]) -> list[UOp]:
    """The ASTs of the kernels one call of `work` runs (seen through the realize hooks a TinyJit capture uses)."""
    seen: list[UOp] = []

    def hook(item: ScheduleItem) -> None:
        if item.ast.op not in realize.NOT_KERNELS:
            seen.append(item.ast)
    realize.capture_hooks.append(hook)
    try:
        work()
    finally:
        realize.capture_hooks.remove(hook)
    return seen


def builds(ast: UOp) -> tuple[dict[int, ProgramSpec], int, Kernel]:
    """The kernel with the heuristic's tile at each level, the level the heuristic picks, and its tiled Kernel."""
    renderer = Device["CPU"].renderer
    start = Kernel(kernel_ast(ast, renderer), renderer)
    with Context(CPU_OPT_LEVEL=2):  # (the tile alone: no OPTLEVEL)
        tile = hand_coded_optimizations(start.copy())
    tiled = start.copy().apply_opts(tile)
    specs = {level: get_program(ast, renderer, tile + ([Opt(OptOps.OPTLEVEL, 0, level)] if level != 2 else []))
             for level in LEVELS}
    return specs, _level_for_kind(tiled), tiled


def time_levels(ast: UOp, specs: dict[int, ProgramSpec], rounds: int) -> tuple[dict[int, float], bool]:
    """Median (over rounds) of the best of 3 single-thread calls of each level's build; whether their outputs agree."""
    dev = Device["CPU"]
    inputs, outputs = random_inputs(ast), stored_buffers(ast)
    programs = {level: dev.program(spec.name, dev.compiler.compile(spec.source)) for level, spec in specs.items()}
    results: dict[int, list[Any]] = {}
    times: dict[int, list[float]] = {level: [] for level in specs}
    bufs = {level: [Buffer("CPU", a.size, dtype).copyin(a) for dtype, a in inputs] for level in specs}
    vals = test_values(specs[LEVELS[0]])  # (lifted constants: 1.5 each, as BEAM runs them)
    for level, program in programs.items():
        spec = specs[level]
        program(*[b.handle for b in bufs[level]], global_size=spec.global_size, vals=vals, work=0)
        results[level] = [bufs[level][i].numpy() for i in outputs]
    first = results[LEVELS[0]]
    same = all(all(a.tobytes() == b.tobytes() for a, b in zip(first, r)) for r in results.values())
    for _ in range(rounds):
        for level, program in programs.items():
            handles, spec = [b.handle for b in bufs[level]], specs[level]
            best = float("inf")
            for _ in range(3):
                start = time.thread_time()
                program(*handles, global_size=spec.global_size, vals=vals, work=0)
                best = min(best, time.thread_time() - start)
            times[level].append(best)
    return {level: statistics.median(t) for level, t in times.items()}, same


def whole_workloads(work: list[Pair], rounds: int, clock: Callable[[], float]) -> None:
    """`--whole`: each workload's glassgrad call under CPU_OPT_LEVEL=0 (the heuristic's level per kernel), =2 and =3
    (every kernel at that level), in rotating order round by round (the kernel cache keys on the setting, so each
    has its own kernels); the median of each, and the speed of the per-kernel choice against each fixed level."""
    settings = (0, 2, 3)
    print(f"{'workload':<46} {'per kernel':>10} {'all -O2':>10} {'all -O3':>10}  vs -O2  vs -O3  (median ms)")
    ratios: dict[int, list[float]] = {2: [], 3: []}
    for pair in work:
        times: dict[int, list[float]] = {level: [] for level in settings}
        for level in settings:
            with Context(CPU_OPT_LEVEL=level):
                pair.glassgrad()
                pair.glassgrad()
        for r in range(rounds):
            for i in range(len(settings)):
                level = settings[(r + i) % len(settings)]
                with Context(CPU_OPT_LEVEL=level):
                    start = clock()
                    pair.glassgrad()
                    times[level].append(clock() - start)
        med = {level: statistics.median(t) for level, t in times.items()}
        for level in (2, 3):
            ratios[level].append(med[level] / med[0])
        print(f"{pair.name[:46]:<46} {med[0] * 1e3:10.3f} {med[2] * 1e3:10.3f} {med[3] * 1e3:10.3f} "
              f"{med[2] / med[0]:6.2f}x {med[3] / med[0]:6.2f}x", flush=True)
    for level in (2, 3):
        if ratios[level]:
            print(f"geometric mean speed of the per-kernel levels against -O{level} everywhere: "
                  f"{math.exp(statistics.mean(map(math.log, ratios[level]))):.3f}x")


def describe(k: Kernel) -> str:
    """What the rule reads of a kernel, in short."""
    return " ".join(f"{r.arg[1][0]}{r.src[0].arg}" for r in k.axes if r.src[0].op.name == "CONST")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--only", default="", help="workloads whose name contains this (any case)")
    parser.add_argument("--kernel", default="", help="only kernels whose name starts with this")
    parser.add_argument("--min-us", type=float, default=20.0, help="skip kernels faster than this at -O2")
    parser.add_argument("--whole", action="store_true", help="time whole workloads under each CPU_OPT_LEVEL instead")
    parser.add_argument("--clock", default="process", choices=("wall", "process"),
                        help="--whole's clock: the process's CPU time (default; THREADS=1 for a loaded machine), or "
                             "wall time")
    args = parser.parse_args()
    load = os.getloadavg()
    timing = f"whole workloads, {args.clock} clock" if args.whole else "kernels on one thread, thread CPU time"
    print(f"CC={os.environ.get('CC', 'default')} ({Device['CPU'].compiler.describe()}); load {load[0]:.1f} "
          f"{load[1]:.1f} {load[2]:.1f}; {args.rounds} rounds, {timing}")
    m = Maker("CPU")
    work = [p for p in bench_pairs(m) + all_work() + wide_pairs("CPU") if args.only.lower() in p.name.lower()]
    if args.whole:
        whole_workloads(work, args.rounds, time.process_time if args.clock == "process" else time.perf_counter)
        load = os.getloadavg()
        print(f"load at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
        return
    done: set[str] = set()
    speedups, chosen = [], []
    print(f"{'workload':<44} {'kernel':<30} {'-O2 ms':>8} {'-O3 ms':>8} {'O3 speed':>8} pick  axes")
    for pair in work:
        with Context(CPU_OPT_LEVEL=2):
            asts = kernels_of(pair.glassgrad)
        for ast in asts:
            specs, pick, tiled = builds(ast)
            if specs[2].source in done or not specs[2].name.startswith(args.kernel):
                continue
            done.add(specs[2].source)
            times, same = time_levels(ast, specs, args.rounds)
            if times[2] * 1e6 < args.min_us:
                continue
            speed = times[2] / times[3]
            speedups.append(speed)
            chosen.append(times[2] / times[pick])
            print(f"{pair.name[:44]:<44} {specs[2].name[:30]:<30} {times[2] * 1e3:8.3f} {times[3] * 1e3:8.3f} "
                  f"{speed:7.2f}x  -O{pick} {describe(tiled)}{'' if same else '  DIFF'}", flush=True)
    load = os.getloadavg()
    if speedups:
        print(f"{len(speedups)} kernels; geometric mean speed of -O3 against -O2: "
              f"{math.exp(statistics.mean(map(math.log, speedups))):.3f}x, of the heuristic's pick: "
              f"{math.exp(statistics.mean(map(math.log, chosen))):.3f}x; load at the end {load[0]:.1f} {load[1]:.1f} "
              f"{load[2]:.1f}")


if __name__ == "__main__":
    main()
