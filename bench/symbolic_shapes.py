"""Benchmark: a growing context with int sizes (a kernel per size) against a bound Variable (one kernel for all).

In: `--steps` (context lengths 1..steps), `--device`. Out: for each way, the compiles, the total time of the first
pass over all lengths (compiling included) and the median time per step of a second pass (everything compiled),
and the ratios int/Variable (>1 means the Variable is faster); the warm steps of the two ways alternate, so they
see the same machine load. The disk cache is off (CACHELEVEL=0), so every new kernel really compiles.
The workload is an attention read: softmax(q . K[:n]) weighted sum of V[:n].

    python bench/symbolic_shapes.py
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

os.environ["CACHELEVEL"] = "0"  # before glassgrad reads it: every kernel it has not seen compiles

import numpy as np  # noqa: E402

from glassgrad import Tensor, Variable  # noqa: E402
from glassgrad.engine import realize  # noqa: E402


def attend(q: Tensor, keys: Tensor, values: Tensor, n: object) -> Tensor:
    """The attention of one query over the first n cached positions (n: an int or a bound Variable)."""
    k, v = keys[:n], values[:n]  # type: ignore[misc]
    weights = (k @ q).softmax(axis=0)
    return (weights.reshape(-1 if isinstance(n, int) else n, 1) * v).sum(axis=0)  # type: ignore[arg-type]


def first_pass(step: Callable[[int], Tensor], lengths: list[int]) -> tuple[float, int]:
    """Seconds to run every length once, compiling as needed, and how many kernels were compiled."""
    compiled = len(realize._kernel_cache)
    start = time.perf_counter()
    for n in lengths:
        step(n).numpy()
    return time.perf_counter() - start, len(realize._kernel_cache) - compiled


def warm_steps(ways: dict[str, Callable[[int], Tensor]], lengths: list[int], rounds: int) -> dict[str, float]:
    """Median seconds per step once everything is compiled; the ways alternate step by step (same machine load)."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):
        for n in lengths:
            for name, step in ways.items():
                start = time.perf_counter()
                step(n).numpy()
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    keys = Tensor(rng.standard_normal((args.steps, args.dim), dtype=np.float32), device=args.device).realize()
    values = Tensor(rng.standard_normal((args.steps, args.dim), dtype=np.float32), device=args.device).realize()
    q = Tensor(rng.standard_normal(args.dim, dtype=np.float32), device=args.device).realize()
    position = Variable("pos", 1, args.steps)
    lengths = list(range(1, args.steps + 1))
    ways: dict[str, Callable[[int], Tensor]] = {
        "int sizes": lambda n: attend(q, keys, values, n),
        "Variable": lambda n: attend(q, keys, values, position.bind(n)),
    }
    first = {name: first_pass(step, lengths) for name, step in ways.items()}
    warm = warm_steps(ways, lengths, args.rounds)
    for name in ways:
        seconds, compiles = first[name]
        print(f"{name:10s} compiles {compiles:4d}   first pass {seconds:8.3f} s   "
              f"per step after {warm[name] * 1e3:7.3f} ms")
    for n in (1, args.steps // 2, args.steps):  # the two ways agree
        np.testing.assert_allclose(ways["int sizes"](n).numpy(), ways["Variable"](n).numpy(), rtol=1e-5, atol=1e-5)
    print(f"ratio int/Variable: first pass {first['int sizes'][0] / first['Variable'][0]:.1f}x, "
          f"per warm step {warm['int sizes'] / warm['Variable']:.2f}x")

if __name__ == "__main__":
    main()
