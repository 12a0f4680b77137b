"""Benchmark: glassgrad against numpy (and PyTorch when installed), in the same run, as ratios.

In: `--device` (default CPU), `--repeat`. Out: a table with the median time of each workload per library and the
ratio (>1 means glassgrad is faster). Absolute times on shared machines drift; ratios from one run do not.

    python bench/bench.py
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from glassgrad import Device, Tensor

try:
    import torch
except ImportError:  # PyTorch is optional
    torch = None


def timeit(fn: Callable[[], object], repeat: int, warmup: int = 2) -> float:
    """Median wall time of fn() in seconds, after warm-up calls (which also compile kernels)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@dataclass
class Workload:
    name: str
    unit: str        # what `amount` counts: "GFLOP" or "GB"
    amount: float    # work per call, for throughput
    glassgrad: Callable[[], object]
    numpy: Callable[[], object]
    torch: Callable[[], object] | None


def make_workloads(device: str) -> list[Workload]:
    rng = np.random.default_rng(0)

    def arr(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32)

    def gg(a: np.ndarray) -> Tensor:
        return Tensor(a, device=device).realize()

    def tt(a: np.ndarray) -> object:
        return torch.from_numpy(a) if torch is not None else None

    work: list[Workload] = []
    n = 1024
    a, b = arr(n, n), arr(n, n)
    ga, gb = gg(a), gg(b)
    ta, tb = tt(a), tt(b)
    work.append(Workload("matmul 1024x1024", "GFLOP", 2 * n**3 / 1e9, lambda: (ga @ gb).realize(),
                         lambda: a @ b, (lambda: ta @ tb) if torch else None))

    m = 4 * 1024 * 1024
    x, y, z = arr(m), arr(m), arr(m)
    gx, gy, gz = gg(x), gg(y), gg(z)
    tx, ty, tz = tt(x), tt(y), tt(z)
    work.append(Workload("(a*b+c).relu() 4M", "GB", 4 * m * 4 / 1e9, lambda: (gx * gy + gz).relu().realize(),
                         lambda: np.maximum(x * y + z, 0), (lambda: (tx * ty + tz).relu()) if torch else None))

    s = arr(2048, 2048)
    gs, ts = gg(s), tt(s)
    work.append(Workload("sum(axis=1) 2048x2048", "GB", s.nbytes / 1e9, lambda: gs.sum(axis=1).realize(),
                         lambda: s.sum(axis=1), (lambda: ts.sum(dim=1)) if torch else None))

    sm = arr(1024, 2048)
    gsm, tsm = gg(sm), tt(sm)

    def np_softmax() -> np.ndarray:
        e = np.exp(sm - sm.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    work.append(Workload("softmax 1024x2048", "GB", 2 * sm.nbytes / 1e9, lambda: gsm.softmax(-1).realize(),
                         np_softmax, (lambda: torch.softmax(tsm, dim=-1)) if torch else None))

    small = arr(16)
    gsmall, tsmall = gg(small), tt(small)

    def chain_gg() -> object:
        t = gsmall
        for _ in range(100):
            t = t * 1.0001 + 0.0001
        return t.realize()

    def chain_np() -> object:
        t = small
        for _ in range(100):
            t = t * np.float32(1.0001) + np.float32(0.0001)
        return t

    def chain_torch() -> object:
        t = tsmall
        for _ in range(100):
            t = t * 1.0001 + 0.0001
        return t
    work.append(Workload("100-op chain on 16 floats", "op", 200, chain_gg, chain_np, chain_torch if torch else None))
    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=Device.DEFAULT)
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"device {args.device}; numpy {np.__version__}; torch {torch.__version__ if torch else 'not installed'}")
    header = f"{'workload':<28} {'glassgrad':>11} {'numpy':>11} {'torch':>11} {'vs numpy':>9} {'vs torch':>9}"
    print(header)
    print("-" * len(header))
    for w in make_workloads(args.device):
        t_gg = timeit(w.glassgrad, args.repeat)
        t_np = timeit(w.numpy, args.repeat)
        t_torch = timeit(w.torch, args.repeat) if w.torch is not None else None
        torch_col = f"{t_torch * 1e3:9.3f}ms" if t_torch else f"{'-':>11}"
        torch_ratio = f"{t_torch / t_gg:8.2f}x" if t_torch else f"{'-':>9}"
        print(f"{w.name:<28} {t_gg * 1e3:9.3f}ms {t_np * 1e3:9.3f}ms {torch_col} {t_np / t_gg:8.2f}x {torch_ratio}")
    print("ratios are other-library time / glassgrad time: above 1.00x glassgrad is faster")


if __name__ == "__main__":
    main()
