"""Benchmark: the MNIST CNN's first training steps from a cold kernel cache, and the steps after them.

In: `--batch` (default 128), `--steps` (steps timed after the first), `--threads` (COMPILE_THREADS values to
compare, default "1 0": one compiler at a time, then the default of one per core). Out: a row per setting with the
first step's time (codegen + compiling every kernel + running), its CPU time (compiler processes included) and the
compiler processes' share of it, the second step's time (the schedule cache's first hit) and the median of the later
ones. Each setting runs in a fresh subprocess with an empty CACHEDIR, so no kernel is in memory or on disk when it
starts; the rows come from one run, so compare them as ratios.

    python bench/cold_start.py
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def child(batch: int, steps: int) -> None:
    """Time the steps in this process (run by the parent with a fresh CACHEDIR) and print them as JSON."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench import mnist_step_fns
    step, _ = mnist_step_fns(batch, "CPU")
    times = []
    for _ in range(steps + 1):
        start, cpu_start, compiler_start = time.perf_counter(), cpu_seconds(), compiler_seconds()
        step()
        times.append(time.perf_counter() - start)
        if len(times) == 1:
            first_cpu, first_compiler = cpu_seconds() - cpu_start, compiler_seconds() - compiler_start
    print(json.dumps([first_cpu, first_compiler, *times]))


def compiler_seconds() -> float:
    """CPU time of this process's finished children (the C compiler processes), user + system."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return children.ru_utime + children.ru_stime


def cpu_seconds() -> float:
    """CPU time of this process and its finished children, user + system."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime + compiler_seconds()


def run_cold(batch: int, steps: int, threads: int) -> list[float]:
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "CACHEDIR": cache, "PYTHONPATH": str(ROOT)}
        if threads > 0:
            env["COMPILE_THREADS"] = str(threads)
        else:
            env.pop("COMPILE_THREADS", None)
        proc = subprocess.run([sys.executable, __file__, "--child", "--batch", str(batch), "--steps", str(steps)],
                              env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 0])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.batch, args.steps)
        return
    print(f"MNIST CNN, batch {args.batch}, CPU ({os.cpu_count()} cores), empty CACHEDIR per row")
    header = (f"{'COMPILE_THREADS':<16} {'first step':>11} {'(its CPU)':>10} {'(compilers)':>12} {'second':>9} "
              f"{'later (median)':>15}")
    print(header)
    print("-" * len(header))
    for threads in args.threads:
        first_cpu, first_compiler, *times = run_cold(args.batch, args.steps, threads)
        later = statistics.median(times[2:]) if len(times) > 2 else float("nan")
        label = str(threads) if threads > 0 else f"default ({os.cpu_count()})"
        print(f"{label:<16} {times[0]:10.2f}s {first_cpu:9.2f}s {first_compiler:11.2f}s {times[1]:8.2f}s "
              f"{later:14.2f}s")
    print("first step: codegen + compiling every kernel + running; its CPU time includes the compiler processes, so "
          "CPU above wall means compiles ran side by side")


if __name__ == "__main__":
    main()
