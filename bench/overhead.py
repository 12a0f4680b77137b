"""Per-call host overhead: what Python costs around tiny kernels (issue 18), on the CPU device by default.

In: `--device`, `--repeat` (timed calls per measurement), `--profile NAME` (cProfile one workload instead, top
entries by internal time), `--json` (one JSON line of the medians, for comparing runs). Out: medians in µs of

  build   µs per op of building a lazy elementwise chain (`t * 1.0001 + 0.0001`, 200 ops), no realize;
  hit1    realize() of a 1-kernel graph whose structure was scheduled before (a schedule-cache hit): the realize
          alone, the graph built before the clock starts;
  hit10   the same for a 10-kernel graph (ten `.contiguous()` stages of elementwise work);
  chain   bench.py's "100-op chain on 16 floats": build 200 ops and realize, per op;
  mlp     one eager training step (no JIT) of a 2-layer MLP (64 -> 128 -> 10, ReLU) with Adam, batch 32, cross
          entropy, loss realized with the update; per step.

PyTorch (CPU, eager) runs the same workloads alongside where they make sense (build+chain: its eager ops; mlp), on
the CPU device only. The host path is the same for every device: the CPU's kernels on 16 floats are all overhead.
On a GPU: `python bench/overhead.py --device CUDA` (glassgrad's columns only).

    python bench/overhead.py
    python bench/overhead.py --profile mlp
    python bench/overhead.py --clock process   # CPU time instead of wall time (a loaded machine)
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable

import numpy as np

from glassgrad import Device, GlobalCounters, Tensor
from glassgrad.nn import Linear, optim

try:
    import torch
except ImportError:  # PyTorch is optional
    torch = None


CLOCK = time.perf_counter  # `--clock process`: the process's CPU time, steadier than wall time on a loaded machine


def median_us(fn: Callable[[], float | None], repeat: int, warmup: int = 3) -> float:
    """Median over `repeat` calls of fn()'s own timing (seconds, when it returns one) or of its time, in µs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = CLOCK()
        inner = fn()
        times.append(inner if inner is not None else CLOCK() - start)
    return statistics.median(times) * 1e6


def chain(t: Tensor, n: int = 100) -> Tensor:
    for _ in range(n):
        t = t * 1.0001 + 0.0001
    return t


def gg_build(device: str) -> Callable[[], float | None]:
    base = Tensor(np.ones(16, np.float32), device=device).realize()
    return lambda: (chain(base), None)[1]


def gg_chain(device: str) -> Callable[[], float | None]:
    base = Tensor(np.ones(16, np.float32), device=device).realize()
    return lambda: (chain(base).realize(), None)[1]


def stages(t: Tensor, n: int) -> Tensor:
    """n kernels: each stage is elementwise work made contiguous."""
    for _ in range(n):
        t = (t * 1.5 + 1.0).contiguous()
    return t


def gg_hit(device: str, kernels: int) -> Callable[[], float | None]:
    """Times realize() alone, on a freshly built graph of a structure realized before."""
    a = Tensor(np.ones(16, np.float32), device=device).realize()
    b = Tensor(np.ones(16, np.float32), device=device).realize()

    def graph() -> Tensor:
        return stages(a * b, kernels) if kernels > 1 else a * b + 1.0

    graph().realize()  # (the result dies: the next graph is new nodes of the same structure)
    GlobalCounters.reset()
    graph().realize()
    if GlobalCounters.kernel_count != kernels:
        raise RuntimeError(f"the {kernels}-kernel graph ran {GlobalCounters.kernel_count} kernels")

    def run() -> float:
        t = graph()
        start = CLOCK()
        t.realize()
        return CLOCK() - start
    return run


def gg_mlp(device: str) -> Callable[[], float | None]:
    rng = np.random.default_rng(0)
    previous = Device.DEFAULT
    Device.DEFAULT = Device.canonicalize(device)
    l1, l2 = Linear(64, 128), Linear(128, 10)
    Device.DEFAULT = previous
    params = [l1.weight, l1.bias, l2.weight, l2.bias]
    opt = optim.Adam([p for p in params if p is not None], lr=1e-3)
    x = Tensor(rng.standard_normal((32, 64), dtype=np.float32), device=device).realize()
    y = Tensor(rng.integers(0, 10, 32).astype(np.int32), device=device).realize()

    def step() -> None:
        with Tensor.train():
            opt.zero_grad()
            loss = l2(l1(x).relu()).sparse_categorical_crossentropy(y).backward()
            loss.realize(*opt.schedule_step())
    return step


def torch_fns() -> dict[str, Callable[[], float | None]]:
    if torch is None:
        return {}
    torch.set_num_threads(1)
    small = torch.ones(16)

    def tchain() -> object:
        t = small
        for _ in range(100):
            t = t * 1.0001 + 0.0001
        return t
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)

    def step() -> None:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
    return {"build": lambda: (tchain(), None)[1], "chain": lambda: (tchain(), None)[1],
            "mlp": lambda: (step(), None)[1]}


PER = {"build": 200, "chain": 200, "hit1": 1, "hit10": 1, "mlp": 1}  # divide the call's time by this


def workloads(device: str) -> dict[str, Callable[[], float | None]]:
    return {"build": gg_build(device), "hit1": gg_hit(device, 1), "hit10": gg_hit(device, 10),
            "chain": gg_chain(device), "mlp": gg_mlp(device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--only", default=None, help="comma-separated workload names")
    parser.add_argument("--profile", default=None, help="cProfile this workload (a name) instead of timing")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                        help="process: CPU time of the process (all its threads), steadier on a loaded machine")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    gg = workloads(args.device)
    names = args.only.split(",") if args.only else list(gg)
    if args.profile:
        fn = gg[args.profile]
        for _ in range(5):
            fn()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.repeat):
            fn()
        profiler.disable()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        return
    tt = torch_fns() if args.device == "CPU" else {}  # (PyTorch's column is its CPU eager mode)
    results: dict[str, dict[str, float]] = {}
    for name in names:
        repeat = max(20, args.repeat // (10 if name == "mlp" else 1))
        row = {"glassgrad": median_us(gg[name], repeat) / PER[name]}
        if name in tt:
            row["torch"] = median_us(tt[name], repeat) / PER[name]
        results[name] = row
    if args.json:
        print(json.dumps({"load": os.getloadavg()[0], "clock": args.clock, **results}))
        return
    print(f"device {args.device}, load {os.getloadavg()[0]:.2f}, {args.clock} clock, medians of {args.repeat} calls "
          "(mlp: /10)")
    units = {"build": "µs/op", "chain": "µs/op", "hit1": "µs/call", "hit10": "µs/call", "mlp": "µs/step"}
    for name, row in results.items():
        torch_text = f"{row['torch']:10.2f}" if "torch" in row else f"{'-':>10}"
        print(f"{name:<6} {row['glassgrad']:10.2f} {torch_text}  {units[name]}")


if __name__ == "__main__":
    main()
