"""The CPU kernels built by different C compilers: bench/bench.py run once per compiler (`CC=...`), the compilers
alternating round by round, and each workload's median time per compiler with its ratio to the first.

In: `--cc gcc,clang` (the compilers, the first the reference), `--rounds`, `--suite` and `--only` (passed to
bench.py), `--tree PATH` (run another checkout's glassgrad instead, e.g. a branch point, for before/after). Out: the
table. Each compiler has its own kernel cache entries (the cache key holds the compiler and its flags), so a cold
first round includes compiles: it is a warm-up, not counted, unless `--count-first`.

    python bench/compilers.py --rounds 3
    python bench/compilers.py --suite wide --rounds 2 --cc gcc,clang
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROW = re.compile(r"(.{10,44}?)\s+(\d+\.\d+)ms")


def run_bench(cc: str, tree: pathlib.Path, suite: str, only: str, repeat: int) -> dict[str, float]:
    """One bench.py run with CC=cc: {workload: glassgrad milliseconds}."""
    args = [sys.executable, str(HERE / "bench.py"), "--repeat", str(repeat), "--suite", suite]
    if only:
        args += ["--only", only]
    env = {**os.environ, "CC": cc, "PYTHONPATH": str(tree)}
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True).stdout
    return {m.group(1).strip(): float(m.group(2)) for line in out.splitlines() if (m := ROW.match(line))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cc", default="gcc,clang")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--suite", default="default", choices=("default", "wide"))
    parser.add_argument("--only", default="")
    parser.add_argument("--tree", default=str(HERE.parent))
    parser.add_argument("--count-first", action="store_true")
    args = parser.parse_args()
    compilers = args.cc.split(",")
    times: dict[str, dict[str, list[float]]] = {}
    loads = []
    for round_ in range(args.rounds + (0 if args.count_first else 1)):
        for cc in compilers:
            loads.append(os.getloadavg()[0])
            result = run_bench(cc, pathlib.Path(args.tree), args.suite, args.only, args.repeat)
            if round_ > 0 or args.count_first:
                for name, ms in result.items():
                    times.setdefault(name, {}).setdefault(cc, []).append(ms)
    print(f"{args.rounds} alternating rounds, medians; load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"{'workload':<44}" + "".join(f"{cc:>12}" for cc in compilers) +
          "".join(f"{cc + '/' + compilers[0]:>14}" for cc in compilers[1:]))
    for name, per in times.items():
        med = {cc: statistics.median(per[cc]) for cc in compilers if per.get(cc)}
        cells = "".join(f"{med[cc]:10.3f}ms" if cc in med else f"{'-':>12}" for cc in compilers)
        ratios = "".join(f"{med[cc] / med[compilers[0]]:13.2f}x" if cc in med and compilers[0] in med
                         else f"{'-':>14}" for cc in compilers[1:])
        print(f"{name:<44}{cells}{ratios}")


if __name__ == "__main__":
    main()
