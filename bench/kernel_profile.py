"""Which kernels of one training step take the time: run the step a few times, then once with every kernel timed,
and print the kernels by time (the top `--top`), with their shape, opts and GFLOP/s, and the time per kernel kind.

In: `--workload mnist` (examples/mnist.py's CNN, Adam, `--batch`), `cnn` (bench/wide.py's small CNN with strided
convolutions: forward and backward, batch 8), `gpt` (bench/gpt.py's training step, AdamW; `--small` for its small
sizes), `gpt_bf16` (its bfloat16 GPT-2 124M row) or `generate` (one token of bench/gpt.py's cached generation), on
the default device (`DEV=CUDA`). `--rounds N` times the step N times and gives each kernel its median. Out: the
table. The step runs eagerly (a TinyJit replay runs its kernels as one CUDA graph, which cannot be timed kernel by
kernel). `--dump NAME,NAME --out DIR` also writes the
source of each distinct kernel of those names (a name can stand for several kernels of one shape) to
DIR/NAME_HASH.src, headed by its count, mean time, opts and launch: what to read when a kernel is slow.

    python bench/kernel_profile.py [--batch 128] [--top 15]
    THREADS=1 python bench/kernel_profile.py --workload cnn --rounds 5
    DEV=CUDA python bench/kernel_profile.py --workload gpt --top 30
    DEV=CUDA python bench/kernel_profile.py --workload gpt_bf16 --dump r_8_1024_768_3072 --out /tmp/kernels
"""
from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys
from collections.abc import Callable

import numpy as np

from glassgrad import Context, Device, Tensor
from glassgrad.engine import realize

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench import mnist_step_fns  # noqa: E402


def gpt_step(small: bool, mixed: bool = False) -> Callable[[], object]:
    """bench/gpt.py's training step (its sizes), eager: forward, backward and AdamW on a fixed batch. `mixed`: its
    train_bf16 row (GPT-2 124M, batch 8 x 1024, the forward under `amp.autocast(bfloat16)`)."""
    from gpt import FULL, SMALL

    from glassgrad import amp, dtypes
    from glassgrad.models.gpt2 import GPT2
    from glassgrad.nn import optim
    from glassgrad.nn.state import get_parameters
    sizes = SMALL if small else FULL
    config, batch, context = (sizes.mixed, sizes.mixed_batch, sizes.mixed_context) if mixed else \
        (sizes.train, sizes.batch, sizes.context)
    Tensor.manual_seed(0)
    model = GPT2(config)
    opt = optim.AdamW(get_parameters(model), lr=1e-4)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, (batch, context + 1))
    x, y = Tensor(tokens[:, :-1].astype(np.int32)).realize(), Tensor(tokens[:, 1:].astype(np.int32)).realize()

    def step() -> object:
        with Tensor.train():
            opt.zero_grad()
            with amp.autocast(dtypes.bfloat16, enabled=mixed):
                loss = model(x).sparse_categorical_crossentropy(y)
            return loss.backward().realize(*opt.schedule_step())
    return step


def generate_step(small: bool) -> Callable[[], object]:
    """bench/gpt.py's cached generation (batch 1, its sizes): one token's step at position 40 after a 32-token
    prompt, eager (JIT=0: the TinyJit step runs as plain calls), at a bound `start_pos` as the replay runs it."""
    from gpt import FULL, SMALL

    from glassgrad.models.gpt2 import GPT2, Generator
    sizes = SMALL if small else FULL
    Tensor.manual_seed(0)
    gen = Generator(GPT2(sizes.generate), batch=1, max_context=sizes.gen_cache)
    token = gen.prefill(np.random.default_rng(0).integers(0, sizes.generate.vocab_size, (1, 32))).argmax(-1)

    def step() -> object:
        with Context(JIT=0):
            return gen.next_logits(token, 40)
    return step


def cnn_step() -> Callable[[], object]:
    """bench/wide.py's CNN row without PyTorch: 8 x 3x64x64 images, a 5x5 stride-2 conv, a 1x1 conv, a 3x3 stride-2
    conv, global average pool, a linear layer; forward and backward of the mean cross-entropy."""
    rng = np.random.default_rng(0)

    def param(*shape: int, scale: float, grad: bool = True) -> Tensor:
        a = (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)
        return Tensor(a, requires_grad=grad).realize()
    x = param(8, 3, 64, 64, scale=1.0, grad=False)
    w1, w2, w3, fc = param(24, 3, 5, 5, scale=0.2), param(48, 24, 1, 1, scale=0.2), param(64, 48, 3, 3, scale=0.05), \
        param(64, 10, scale=0.1)
    labels = Tensor(rng.integers(0, 10, 8).astype(np.int32)).realize()

    def step() -> object:
        for p in (w1, w2, w3, fc):
            p.grad = None
        h = x.conv2d(w1, stride=2, padding=2).relu().conv2d(w2).relu()
        h = h.conv2d(w3, stride=2, padding=1).relu().mean((2, 3))
        loss = (h @ fc).cross_entropy(labels)
        loss.backward()
        return Tensor.realize_all(loss, *[p.grad for p in (w1, w2, w3, fc) if p.grad is not None])
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--workload", choices=("mnist", "cnn", "gpt", "gpt_bf16", "generate"), default="mnist")
    parser.add_argument("--rounds", type=int, default=1, help="time the step this many times: each kernel's median")
    parser.add_argument("--small", action="store_true", help="gpt, generate: bench/gpt.py's small sizes")
    parser.add_argument("--dump", default="", help="comma-separated kernel names whose sources to write to --out")
    parser.add_argument("--out", default=".", help="the folder --dump writes to")
    args = parser.parse_args()
    dump = {name for name in args.dump.split(",") if name}
    sources: dict[tuple[str, str], tuple[realize.ProgramSpec, list[float]]] = {}
    steps = {"mnist": lambda: mnist_step_fns(args.batch, Device.DEFAULT)[0], "cnn": cnn_step,
             "gpt": lambda: gpt_step(args.small),
             "gpt_bf16": lambda: gpt_step(args.small, mixed=True),
             "generate": lambda: generate_step(args.small)}
    step = steps[args.workload]()
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
            if kernel.spec.name in dump:
                key = (kernel.spec.name, hashlib.sha256(kernel.spec.source.encode()).hexdigest()[:6])
                sources.setdefault(key, (kernel.spec, []))[1].append(seconds)
    realize.run_item = timed  # type: ignore[assignment]
    runs: list[list[tuple[float, str, str, float]]] = []
    with Context(TIMING=1):
        for _ in range(max(1, args.rounds)):
            rows.clear()
            step()
            runs.append(list(rows))
    realize.run_item = original  # type: ignore[assignment]
    rows = [_median_row(list(group)) for group in zip(*runs)]  # each kernel, by its place in the step
    total = sum(r[0] for r in rows)
    print(f"{len(rows)} kernels, {total * 1e3:.1f} ms in kernels")
    for seconds, name, opts, gflops in sorted(rows, reverse=True)[:args.top]:
        print(f"{seconds * 1e3:8.2f} ms {100 * seconds / total:5.1f}% {gflops:7.1f} GFLOP/s  {name:<28} {opts}")
    names: dict[str, list[float]] = {}
    for seconds, name, _, _ in rows:
        names.setdefault(name, []).append(seconds)
    print("by name (the top ones): " + ", ".join(
        f"{name} {len(ts)}x {sum(ts) * 1e3:.2f} ms" for name, ts in
        sorted(names.items(), key=lambda item: -sum(item[1]))[:args.top]))
    kinds: dict[str, list[float]] = {}
    for seconds, name, _, _ in rows:  # E_ elementwise, r_ reductions; the size names the shape
        kinds.setdefault(name.split("_")[0], []).append(seconds)
    print("by kind: " + ", ".join(f"{kind} {len(ts)} kernels {sum(ts) * 1e3:.2f} ms" for kind, ts in kinds.items()))
    write_sources(sources, pathlib.Path(args.out))


def _median_row(group: list[tuple[float, str, str, float]]) -> tuple[float, str, str, float]:
    """A kernel's row from the round that timed it at its median."""
    return sorted(group)[len(group) // 2]


def write_sources(sources: dict[tuple[str, str], tuple[realize.ProgramSpec, list[float]]], out: pathlib.Path) -> None:
    """Each dumped kernel's source to out/NAME_HASH.src, headed by its count, mean time, opts and launch."""
    for (name, digest), (spec, times) in sorted(sources.items()):
        head = f"{name} {digest}: x{len(times)}, mean {1e3 * sum(times) / len(times):.3f} ms, opts {spec.opts}, " \
            f"global {spec.global_size}, local {getattr(spec, 'local_size', None)}"
        print("wrote", out / f"{name}_{digest}.src", "-", head)
        (out / f"{name}_{digest}.src").write_text(f"// {head}\n{spec.source}")


if __name__ == "__main__":
    main()
