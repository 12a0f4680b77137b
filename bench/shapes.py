"""Hidden-style CPU workloads: glassgrad's heuristic, glassgrad with BEAM=2, and PyTorch, timed in one process.

Issue 18 asks, on workloads nobody tuned for (CNN layers of other shapes, transformer pieces, odd sizes, batch 1,
transposed/permuted/strided operands, reductions over each axis, softmax/layernorm on odd widths, convolutions with
stride, padding, dilation, groups, 1x1 and depthwise): BEAM=2 at least as fast as the heuristic, the heuristic at
least 0.8x BEAM's speed, and how far both are from PyTorch.

How: every workload runs once per configuration first (compiling; BEAM=2 searches each new kernel, `BEAM_BUDGET`
seconds at most, and caches the winner on disk), then `--rounds` rounds in which the three configurations run one
call each, in an order that rotates round by round, so a machine whose load drifts slows all three alike. The two
glassgrad configurations are one process with `Context(BEAM=...)`: the kernel cache keys on BEAM, so each has its
own kernels. PyTorch gets as many threads as glassgrad's CPU device (`THREADS`, default the core count) and
`OMP_WAIT_POLICY=PASSIVE` (unless set), so its threads do not spin on the cores during glassgrad's calls.
`--clock process` times CPU time instead of wall time: with `THREADS=1`, a comparison that a loaded machine's time
slicing does not disturb (with threads it also counts the workers' spinning).

Out: per workload the minimum and median time of each configuration, heuristic/BEAM and heuristic/PyTorch speed
ratios (time of the other / time of the heuristic: above 1.00 the heuristic is faster), and the load average.

    PYTHONPATH=. python bench/shapes.py [--rounds 15] [--only conv] [--budget 20] [--cachedir DIR] [--json F]
    THREADS=1 PYTHONPATH=. python bench/shapes.py --clock process
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from wide import Maker, Pair, grads_gg, grads_torch  # noqa: E402  (bench/ is the script's directory)

from glassgrad import Context  # noqa: E402


def matmul_work(m: Maker) -> list[Pair]:
    out = []
    for (rows, k, cols) in ((1000, 77, 1023), (1000, 1000, 1000), (3, 1000, 77), (308, 384, 1536)):
        a, b = m.pair(rows, k), m.pair(k, cols)
        out.append(Pair(f"matmul {rows}x{k} @ {k}x{cols}", lambda a=a, b=b: (a[0] @ b[0]).realize(),
                        lambda a=a, b=b: a[1] @ b[1]))
    v, w = m.pair(1, 1024), m.pair(1000, 1024)
    out.append(Pair("linear batch 1: 1x1024 @ W.T (1000x1024)", lambda: (v[0] @ w[0].T).realize(),
                    lambda: v[1] @ w[1].T))
    at, bt = m.pair(1023, 513), m.pair(1023, 257)
    out.append(Pair("x.T @ y (1023 reduced, 513x257)", lambda: (at[0].T @ bt[0]).realize(), lambda: at[1].T @ bt[1]))
    x, wt = m.pair(308, 384), m.pair(1536, 384)
    out.append(Pair("x @ W.T 308x384 @ (1536x384).T", lambda: (x[0] @ wt[0].T).realize(), lambda: x[1] @ wt[1].T))
    q, kk = m.pair(24, 77, 64), m.pair(24, 77, 64)
    out.append(Pair("attention scores (24,77,64) @ k.T", lambda: (q[0] @ kk[0].transpose(-1, -2)).realize(),
                    lambda: q[1] @ kk[1].transpose(-1, -2)))
    big = m.pair(2048, 2048)
    y = m.pair(683, 77)
    out.append(Pair("strided x[::3, ::2] @ y (683x1024 @ ...)", lambda: (big[0][::3, ::2][:, :77] @ y[0].T).realize(),
                    lambda: big[1][::3, ::2][:, :77] @ y[1].T))
    return out


def layout_work(m: Maker) -> list[Pair]:
    img = m.pair(32, 64, 28, 28)
    big = m.pair(2048, 2048)
    return [
        Pair("permute(0,2,3,1).contiguous() 32x64x28x28", lambda: img[0].permute(0, 2, 3, 1).contiguous().realize(),
             lambda: img[1].permute(0, 2, 3, 1).contiguous()),
        Pair("x[::2, ::3] * 2 + 1 (2048^2)", lambda: (big[0][::2, ::3] * 2 + 1).realize(),
             lambda: big[1][::2, ::3] * 2 + 1),
        Pair("x.T + x (2048^2)", lambda: (big[0].T + big[0]).realize(), lambda: big[1].T + big[1]),
    ]


def reduce_work(m: Maker) -> list[Pair]:
    x = m.pair(32, 512, 77)
    out = [Pair(f"sum axis {ax} of 32x512x77", lambda ax=ax: x[0].sum(ax).realize(), lambda ax=ax: x[1].sum(ax))
           for ax in (0, 1, 2)]
    out.append(Pair("max axis 1 of 32x512x77", lambda: x[0].max(1).realize(), lambda: x[1].amax(1)))
    img = m.pair(32, 64, 28, 28)
    out.append(Pair("mean over (0,2,3) 32x64x28x28", lambda: img[0].mean((0, 2, 3)).realize(),
                    lambda: img[1].mean((0, 2, 3))))
    col = m.pair(1000, 1023)
    out.append(Pair("sum axis 0 of 1000x1023", lambda: col[0].sum(0).realize(), lambda: col[1].sum(0)))
    return out


def norm_work(m: Maker) -> list[Pair]:
    out = []
    for rows, width in ((4096, 77), (1000, 1000), (512, 1023), (64, 30000)):
        x = m.pair(rows, width)
        out.append(Pair(f"softmax rows of {width} ({rows}x{width})", lambda x=x: x[0].softmax(-1).realize(),
                        lambda x=x: x[1].softmax(-1)))
    x = m.pair(1000, 1000)
    out.append(Pair("softmax axis 0 (1000x1000)", lambda: x[0].softmax(0).realize(), lambda: x[1].softmax(0)))
    for rows, width in ((4096, 77), (1000, 1023), (308, 384)):
        x = m.pair(rows, width)
        out.append(Pair(f"layernorm {rows}x{width}", lambda x=x: x[0].layernorm(-1).realize(),
                        lambda x=x, w=width: F.layer_norm(x[1], (w,))))
    return out


def conv_work(m: Maker) -> list[Pair]:
    # (batch, cin, size, cout, kernel, stride, padding, dilation, groups)
    specs = [(8, 64, 28, 128, 3, 2, 1, 1, 1), (8, 256, 14, 64, 1, 1, 0, 1, 1), (8, 96, 28, 96, 3, 1, 1, 1, 96),
             (4, 32, 32, 32, 3, 1, 2, 2, 1), (4, 64, 28, 64, 3, 1, 1, 1, 4), (1, 3, 224, 64, 7, 2, 3, 1, 1),
             (1, 64, 56, 64, 3, 1, 1, 1, 1), (8, 64, 30, 128, 1, 2, 0, 1, 1), (2, 32, 33, 48, 5, 1, 2, 1, 1)]
    out = []
    for n, cin, size, cout, k, s, p, d, g in specs:
        x, w = m.pair(n, cin, size, size), m.pair(cout, cin // g, k, k)
        kw = dict(stride=s, padding=p, dilation=d, groups=g)
        out.append(Pair(f"conv {n}x{cin}x{size}^2->{cout} k{k} s{s} p{p} d{d} g{g}",
                        lambda x=x, w=w, kw=kw: x[0].conv2d(w[0], **kw).realize(),
                        lambda x=x, w=w, kw=kw: F.conv2d(x[1], w[1], **kw)))
    x, w = m.pair(8, 64, 28, 28, grad=True), m.pair(128, 64, 3, 3, grad=True)
    out.append(Pair("conv 8x64x28^2->128 s2 backward (dx, dw)",
                    lambda: grads_gg(x[0].conv2d(w[0], stride=2, padding=1).sum(), [x[0], w[0]]),
                    lambda: grads_torch(F.conv2d(x[1], w[1], stride=2, padding=1).sum(), [x[1], w[1]])))
    xd, wd = m.pair(8, 96, 28, 28, grad=True), m.pair(96, 1, 3, 3, grad=True)
    out.append(Pair("depthwise 8x96x28^2 backward (dx, dw)",
                    lambda: grads_gg(xd[0].conv2d(wd[0], padding=1, groups=96).sum(), [xd[0], wd[0]]),
                    lambda: grads_torch(F.conv2d(xd[1], wd[1], padding=1, groups=96).sum(), [xd[1], wd[1]])))
    pool = m.pair(8, 64, 56, 56)
    out.append(Pair("max_pool2d 3x3 s2 p1 8x64x56^2", lambda: pool[0].max_pool2d(3, 2, padding=1).realize(),
                    lambda: F.max_pool2d(pool[1], 3, 2, padding=1)))
    return out


def model_work(m: Maker) -> list[Pair]:
    b, t, c, heads = 2, 77, 192, 3
    x = m.pair(b, t, c)
    ws = [m.pair(*s) for s in ((c, 3 * c), (c, c), (c, 4 * c), (4 * c, c))]

    def block(lib: int) -> Any:
        wqkv, wo, w1, w2 = (w[lib] for w in ws)
        xx = x[lib]
        ln = (lambda z: z.layernorm(-1)) if lib == 0 else (lambda z: F.layer_norm(z, (c,)))
        qkv = ln(xx) @ wqkv
        q, k, v = (qkv[:, :, i * c:(i + 1) * c].reshape(b, t, heads, c // heads).transpose(1, 2) for i in range(3))
        att = q.scaled_dot_product_attention(k, v, is_causal=True) if lib == 0 else \
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = xx + att.transpose(1, 2).reshape(b, t, c) @ wo
        up = ln(h) @ w1
        return h + (up.gelu() if lib == 0 else F.gelu(up, approximate="tanh")) @ w2
    return [Pair(f"transformer block forward b{b} t{t} c{c}", lambda: block(0).realize(), lambda: block(1))]


def all_work() -> list[Pair]:
    m = Maker("CPU")
    return matmul_work(m) + layout_work(m) + reduce_work(m) + norm_work(m) + conv_work(m) + model_work(m)


CONFIGS = ("heuristic", "beam2", "torch")


CLOCK: Callable[[], float] = time.perf_counter


def call(work: Pair, config: str) -> float:
    """One timed call of `work` under `config` (seconds of CLOCK)."""
    if config == "torch":
        start = CLOCK()
        work.torch()
        return CLOCK() - start
    with Context(BEAM=2 if config == "beam2" else 0):
        start = CLOCK()
        work.glassgrad()
        return CLOCK() - start


def kernels_differing(work: Pair) -> tuple[int, int]:
    """(kernels whose BEAM=2 source differs from the heuristic's, kernels BEAM=2 built) for one call of each."""
    from glassgrad.engine import realize
    call(work, "heuristic")
    before = set(realize._kernel_cache)
    call(work, "beam2")
    beam = [key for key in realize._kernel_cache if key not in before]
    heuristic = [realize._kernel_cache.get((dev, ast, (*flags[:-2], 0, flags[-1]))) for dev, ast, flags in beam]
    differ = sum(1 for key, h in zip(beam, heuristic)
                 if h is None or h.spec.source != realize._kernel_cache[key].spec.source)
    return differ, len(beam)


def measure(work: Pair, rounds: int, configs: tuple[str, ...] = CONFIGS) -> tuple[dict[str, list[float]],
                                                                                  tuple[int, int]]:
    """Each configuration's call times over `rounds` rotating rounds, after two warm-up calls each; and (kernels
    whose BEAM=2 source differs from the heuristic's, kernels), (0, 0) without BEAM=2."""
    differ = kernels_differing(work) if "beam2" in configs else (0, 0)
    for config in configs:
        for _ in range(2):
            call(work, config)
    times: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(rounds):
        for i in range(len(configs)):
            config = configs[(r + i) % len(configs)]
            times[config].append(call(work, config))
    for config in CONFIGS:
        times.setdefault(config, [float("nan")])
    return times, differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", default="", help="workloads whose name contains this (any case)")
    parser.add_argument("--budget", type=int, default=20, help="BEAM_BUDGET: seconds of search per kernel")
    parser.add_argument("--cachedir", default="", help="CACHEDIR for this run (BEAM's winners and compiled kernels)")
    parser.add_argument("--json", default="", help="also write the times here")
    parser.add_argument("--no-beam", action="store_true", help="time the heuristic and PyTorch only")
    parser.add_argument("--clock", default="wall", choices=("wall", "process"),
                        help="process: CPU time of the whole process (with THREADS=1, what a loaded machine's "
                             "time slicing does not change; with threads it counts every thread's work)")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    if args.cachedir:
        os.environ["CACHEDIR"] = args.cachedir
    from glassgrad.runtime.ops_cpu import THREADS
    torch.set_num_threads(int(THREADS))
    load = os.getloadavg()
    print(f"glassgrad THREADS={THREADS}, torch {torch.__version__} threads={torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, CC={os.environ.get('CC', 'default')}; "
          f"load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}; {args.rounds} rotating rounds, {args.clock} clock")
    head = f"{'workload':<46} {'heuristic':>18} {'BEAM=2':>18} {'torch':>18} {'h/BEAM':>7} {'h/torch':>7} differ"
    print(head + "\n" + "-" * len(head))
    print(f"{'':<46} {'min / median ms':>18}")
    rows = []
    with Context(BEAM_BUDGET=args.budget):
        for work in all_work():
            if args.only.lower() not in work.name.lower():
                continue
            configs = tuple(c for c in CONFIGS if not (args.no_beam and c == "beam2"))
            t, (differ, kernels) = measure(work, args.rounds, configs)
            mins = {c: min(v) for c, v in t.items()}
            meds = {c: statistics.median(v) for c, v in t.items()}
            cols = " ".join(f"{mins[c] * 1e3:8.3f}/{meds[c] * 1e3:8.3f}" for c in CONFIGS)
            print(f"{work.name:<46} {cols} {mins['beam2'] / mins['heuristic']:6.2f}x "
                  f"{mins['torch'] / mins['heuristic']:6.2f}x {differ:>3}/{kernels:<3}", flush=True)
            rows.append({"name": work.name, "times": t, "differ": differ, "kernels": kernels})
    load = os.getloadavg()
    print("differ: kernels whose BEAM=2 source differs from the heuristic's / kernels built (0: the same kernels, and "
          "their ratio is noise)")
    print(f"ratios from the minimums: time of BEAM=2 (or PyTorch) / time of the heuristic; load at the end "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if rows:
        for other in ("beam2", "torch"):
            g = math.exp(statistics.mean(math.log(min(r["times"][other]) / min(r["times"]["heuristic"]))
                                         for r in rows))
            print(f"geometric mean heuristic speed / {other}: {g:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)


if __name__ == "__main__":
    main()
