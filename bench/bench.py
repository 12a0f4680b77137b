"""Benchmark: glassgrad against numpy (and PyTorch when installed), in the same run, as ratios.

In: `--device` (default CPU), `--repeat`, `--only`, `--suite` (`default`, or `wide`: untuned workloads against
PyTorch, in `bench/wide.py`). Out: a table with the median time of each workload per library and the
ratio (>1 means glassgrad is faster). Absolute times on shared machines drift; ratios from one run do not.

    python bench/bench.py
    python bench/bench.py --suite wide [--device CUDA]
    python bench/bench.py --device CUDA --only TF32     # float32 on the tensor cores, both sides (ALLOW_TF32=1)
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad import Context, Device, GlobalCounters, Tensor

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


def mnist_example() -> Any:
    """examples/mnist.py as a module."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "mnist.py"
    spec = importlib.util.spec_from_file_location("mnist_example", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def mnist_glassgrad_step(batch: int, device: str, jit: bool = False) -> Callable[[], Tensor]:
    """One Adam training step of examples/mnist.py's CNN on a fixed random batch; `jit`: the example's TinyJit step."""
    from glassgrad.nn import optim, state
    example = mnist_example()
    rng = np.random.default_rng(0)
    images = rng.random((batch, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, batch).astype(np.int32)
    previous = Device.DEFAULT
    Device.DEFAULT = Device.canonicalize(device)
    model = example.Model()
    opt = optim.Adam(state.get_parameters(model))
    Device.DEFAULT = previous
    x, y = Tensor(images, device=device).realize(), Tensor(labels, device=device).realize()
    jitted = example.train_step_fn(model, opt)

    def eager_step() -> Tensor:
        return example.train_step(model, opt, x, y)

    def step() -> Tensor:
        loss = jitted(x, y) if jit else eager_step()
        Device[device].synchronize()
        return loss
    return step


def mnist_step_fns(batch: int, device: str) -> tuple[Callable[[], object], Callable[[], object] | None]:
    """One Adam training step of examples/mnist.py's CNN, in glassgrad and (when installed) in PyTorch."""
    rng = np.random.default_rng(0)
    images = rng.random((batch, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, batch).astype(np.int32)
    glassgrad_step = mnist_glassgrad_step(batch, device)
    if torch is None:
        return glassgrad_step, None
    tdev = "cuda" if device.upper().startswith("CUDA") else "cpu"
    tmodel = torch.nn.Sequential(
        torch.nn.Conv2d(1, 32, 5), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 5), torch.nn.ReLU(),
        torch.nn.BatchNorm2d(32), torch.nn.MaxPool2d(2), torch.nn.Conv2d(32, 64, 3), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3), torch.nn.ReLU(), torch.nn.BatchNorm2d(64), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(576, 10)).to(tdev)
    topt = torch.optim.Adam(tmodel.parameters())
    tx, ty = torch.from_numpy(images).to(tdev), torch.from_numpy(labels).long().to(tdev)

    def torch_step() -> object:
        topt.zero_grad()
        loss = torch.nn.functional.cross_entropy(tmodel(tx), ty)
        loss.backward()
        topt.step()
        if tdev == "cuda":
            torch.cuda.synchronize()
        return loss.item()
    return glassgrad_step, torch_step


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

    cx, cw = arr(16, 32, 32, 32), arr(64, 32, 3, 3)
    gcx, gcw = gg(cx), gg(cw)
    tcx, tcw = tt(cx), tt(cw)
    conv_flops = 2 * 16 * 64 * 32 * 32 * 32 * 3 * 3 / 1e9
    work.append(Workload("conv2d 16x32x32x32->64 3x3", "GFLOP", conv_flops,
                         lambda: gcx.conv2d(gcw, padding=1).realize(), lambda: None,
                         (lambda: torch.nn.functional.conv2d(tcx, tcw, padding=1)) if torch else None))

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
    gg_step, torch_step = mnist_step_fns(128, device)
    work.append(Workload("MNIST CNN train step b128", "step", 1, gg_step, lambda: None, torch_step))
    work.append(Workload("MNIST train step b128 (TinyJit)", "step", 1, mnist_glassgrad_step(128, device, jit=True),
                         lambda: None, torch_step))
    return work


# ---------------------------------------------------------------- GPU
def gpu_kernel_time(fn: Callable[[], object], repeat: int) -> float:
    """Median summed kernel time of one call of fn(), timed on the device with events (TIMING=1)."""
    times = []
    for i in range(repeat + 2):
        GlobalCounters.reset()
        with Context(TIMING=1):
            fn()
        if i >= 2:  # the first calls compile
            times.append(GlobalCounters.time_sum_s)
    return statistics.median(times)


def torch_gpu_time(fn: Callable[[], object], repeat: int) -> float:
    assert torch is not None
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def gpu_rows(device: str, repeat: int, only: str = "") -> list[tuple[str, str, float, float, float]]:
    """(name, unit, amount, glassgrad seconds, torch seconds) for the CUDA issue's workloads (those whose name
    contains `only`, case-insensitive)."""
    assert torch is not None, "the GPU benchmark compares against PyTorch: install it"
    rng = np.random.default_rng(0)
    rows = []

    def pair(*shape: int, dtype: str = "float32") -> tuple[Tensor, object]:
        a = rng.standard_normal(shape, dtype=np.float32)
        return Tensor(a, device=device).cast(dtype).realize(), torch.from_numpy(a).cuda().to(getattr(torch, dtype))

    def want(name: str) -> bool:
        return only.lower() in name.lower()

    n = 4096
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False  # float32 against float32 (the conv row and the MNIST step too)
    for dt in ("float32", "float16"):
        if not want(f"matmul {n} {dt}"):
            continue
        (ga, ta), (gb, tb) = pair(n, n, dtype=dt), pair(n, n, dtype=dt)
        t_gg = gpu_kernel_time(lambda ga=ga, gb=gb: (ga @ gb).realize(), repeat)
        t_torch = torch_gpu_time(lambda ta=ta, tb=tb: ta @ tb, repeat)
        rows.append((f"matmul {n} {dt}", "TFLOP/s", 2 * n**3 / 1e12, t_gg, t_torch))
    if want("conv2d"):
        (gi, ti), (gw, tw) = pair(64, 64, 56, 56), pair(128, 64, 3, 3)
        rows.append(("conv2d 64x64x56^2->128 3x3", "TFLOP/s", 2 * 64 * 128 * 56 * 56 * 64 * 9 / 1e12,
                     gpu_kernel_time(lambda: gi.conv2d(gw, padding=1).realize(), repeat),
                     torch_gpu_time(lambda: torch.nn.functional.conv2d(ti, tw, padding=1), repeat)))
    rows += tf32_rows(pair, want, repeat)
    m = 64 * 1024 * 1024
    # each row is timed only when asked for (with BEAM=n, every kernel that runs is searched)
    if want("(a*b+c).relu() 64M") or want("a*2 64M"):
        (gx, tx), (gy, ty), (gz, tz) = pair(m), pair(m), pair(m)
        if want("(a*b+c).relu() 64M"):
            rows.append(("(a*b+c).relu() 64M", "GB/s", 4 * m * 4 / 1e9,
                         gpu_kernel_time(lambda: (gx * gy + gz).relu().realize(), repeat),
                         torch_gpu_time(lambda: (tx * ty + tz).relu(), repeat)))
        if want("a*2 64M"):
            rows.append(("a*2 64M", "GB/s", 2 * m * 4 / 1e9, gpu_kernel_time(lambda: (gx * 2).realize(), repeat),
                         torch_gpu_time(lambda: tx * 2, repeat)))
        rows.append(("(torch d2d copy 64M)", "GB/s", 2 * m * 4 / 1e9, float("nan"),
                     torch_gpu_time(lambda: ty.copy_(tx), repeat)))
    if want("sum(axis=1) 8192^2") or want("softmax 8192^2"):
        gs, ts = pair(8192, 8192)
        if want("sum(axis=1) 8192^2"):
            rows.append(("sum(axis=1) 8192^2", "GB/s", 8192 * 8192 * 4 / 1e9,
                         gpu_kernel_time(lambda: gs.sum(axis=1).realize(), repeat),
                         torch_gpu_time(lambda: ts.sum(dim=1), repeat)))
        if want("softmax 8192^2"):
            rows.append(("softmax 8192^2", "GB/s", 2 * 8192 * 8192 * 4 / 1e9,
                         gpu_kernel_time(lambda: gs.softmax(-1).realize(), repeat),
                         torch_gpu_time(lambda: torch.softmax(ts, dim=-1), repeat)))
    if want("MNIST train step b512"):
        gg_step, torch_step = mnist_step_fns(512, device)
        assert torch_step is not None
        t_torch = timeit(torch_step, repeat)
        rows.append(("MNIST train step b512", "steps/s", 1.0, timeit(gg_step, repeat), t_torch))
        rows.append(("MNIST train step b512 (TinyJit)", "steps/s", 1.0,
                     timeit(mnist_glassgrad_step(512, device, jit=True), repeat), t_torch))
    return [row for row in rows if want(row[0])]


def tf32_rows(pair: Callable[..., tuple[Tensor, Any]], want: Callable[[str], bool],
              repeat: int) -> list[tuple[str, str, float, float, float]]:
    """The float32 matmul and conv rows again with TF32 on both sides: glassgrad's ALLOW_TF32=1 against PyTorch with
    `torch.backends.cuda.matmul.allow_tf32` / `torch.backends.cudnn.allow_tf32` (cuDNN's default) on."""
    assert torch is not None
    rows = []
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        with Context(ALLOW_TF32=1):  # read when the kernels are built, inside the timed calls' first runs
            if want("matmul 4096 float32 TF32"):
                (ga, ta), (gb, tb) = pair(4096, 4096), pair(4096, 4096)
                rows.append(("matmul 4096 float32 TF32", "TFLOP/s", 2 * 4096**3 / 1e12,
                             gpu_kernel_time(lambda: (ga @ gb).realize(), repeat),
                             torch_gpu_time(lambda: ta @ tb, repeat)))
            if want("conv2d 64x64x56^2->128 3x3 TF32"):
                (gi, ti), (gw, tw) = pair(64, 64, 56, 56), pair(128, 64, 3, 3)
                rows.append(("conv2d 64x64x56^2->128 3x3 TF32", "TFLOP/s", 2 * 64 * 128 * 56 * 56 * 64 * 9 / 1e12,
                             gpu_kernel_time(lambda: gi.conv2d(gw, padding=1).realize(), repeat),
                             torch_gpu_time(lambda: torch.nn.functional.conv2d(ti, tw, padding=1), repeat)))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    return rows


def print_gpu(device: str, repeat: int, only: str = "") -> None:
    print(f"device {device}; torch {torch.__version__ if torch else '-'}; kernel times from device events")
    header = f"{'workload':<32} {'glassgrad':>12} {'torch':>12} {'unit':>8} {'glassgrad/torch':>16}"
    print(header)
    print("-" * len(header))
    for name, unit, amount, t_gg, t_torch in gpu_rows(device, repeat, only):
        rate_gg, rate_torch = amount / t_gg if t_gg == t_gg else float("nan"), amount / t_torch
        print(f"{name:<32} {rate_gg:12.2f} {rate_torch:12.2f} {unit:>8} {rate_gg / rate_torch:15.2f}x")
    print("throughput (higher is better); the last column is glassgrad's share of PyTorch's throughput")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=Device.DEFAULT)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--only", default="", help="run only the workloads whose name contains this (any case)")
    parser.add_argument("--suite", default="default", choices=("default", "wide"),
                        help="default: the issue's named workloads; wide: untuned workloads against PyTorch")
    args = parser.parse_args()
    if torch is not None:
        torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.suite == "wide":
        from wide import run_wide  # bench/ is the script's directory, so on sys.path
        run_wide(args.device, args.repeat, args.only)
        return
    if args.device.upper().startswith("CUDA"):
        print_gpu(args.device, args.repeat, args.only)
        return
    print(f"device {args.device}; numpy {np.__version__}; torch {torch.__version__ if torch else 'not installed'}")
    header = f"{'workload':<32} {'glassgrad':>11} {'numpy':>11} {'torch':>11} {'vs numpy':>9} {'vs torch':>9}"
    print(header)
    print("-" * len(header))
    for w in make_workloads(args.device):
        if args.only.lower() not in w.name.lower():
            continue
        t_gg = timeit(w.glassgrad, args.repeat)
        t_np = timeit(w.numpy, args.repeat) if not w.name.startswith(("MNIST", "conv2d")) else float("nan")
        t_torch = timeit(w.torch, args.repeat) if w.torch is not None else None
        torch_col = f"{t_torch * 1e3:9.3f}ms" if t_torch else f"{'-':>11}"
        torch_ratio = f"{t_torch / t_gg:8.2f}x" if t_torch else f"{'-':>9}"
        np_col = f"{t_np * 1e3:9.3f}ms" if t_np == t_np else f"{'-':>11}"
        np_ratio = f"{t_np / t_gg:8.2f}x" if t_np == t_np else f"{'-':>9}"
        print(f"{w.name:<32} {t_gg * 1e3:9.3f}ms {np_col} {torch_col} {np_ratio} {torch_ratio}")
    print("ratios are other-library time / glassgrad time: above 1.00x glassgrad is faster")


if __name__ == "__main__":
    main()
