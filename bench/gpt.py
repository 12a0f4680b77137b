"""GPT-2 workloads, glassgrad against PyTorch in the same run: a training step, cached generation, attention alone.

In: `--device CPU|CUDA` (default CPU), `--repeat N` (timed rounds, default 5), `--small` / `--full` sizes (default:
small on CPU, full elsewhere); on CPU both libraries use `THREADS` threads (glassgrad's flag, default all cores).
Out: a table with the median time per call of each workload for glassgrad and PyTorch, throughput, and the ratio
(PyTorch time / glassgrad time: > 1 means glassgrad is faster). Everything is fp32 but the two mixed-precision
train rows. `--only a,b` runs just those workloads (train, train_bf16, train_fp16, generate, attention,
attention_bf16). Absolute times on shared machines drift; ratios from one run do not.

  * train step: forward, backward and AdamW on a GPT-2 (full: vocab 8192, context 256, width 512, 8 heads, 6 layers,
    batch 16). glassgrad: a TinyJit step (examples/gpt2.py's); PyTorch: eager, the same architecture with
    F.scaled_dot_product_attention(is_causal=True).
  * train_bf16: the same step in mixed precision, fp32 parameters and AdamW, bfloat16 compute (full: GPT-2 124M with
    its vocab padded to 50304 as nanoGPT does, so the LM head is whole 128-tiles for tensor cores; batch 8, context
    1024; small: the small train config). glassgrad: the forward under `amp.autocast(dtypes.bfloat16)`; PyTorch:
    eager under `torch.autocast(device, torch.bfloat16)`.
  * train_fp16: the small train config in float16 with loss scaling on both sides (`amp.GradScaler`,
    `torch.amp.GradScaler`), on any device.
  * cached generation: tokens/s of one-token steps at batch 1 with a KV cache, positions 32..32+N, the logits copied
    to the host each step (full: GPT-2 124M, random weights, a 1024-position cache). glassgrad: `Generator`
    (a TinyJit step at a bound start_pos); PyTorch: eager, preallocated caches written by slicing.
  * attention: causal softmax(q k^T / sqrt(d)) v forward and backward for q, k, v (full: batch 16, 8 heads, 256
    positions, head dim 64). PyTorch twice: F.scaled_dot_product_attention (its fused kernels) and the same math
    spelled out (matmul, mask, softmax, matmul), which is what glassgrad computes.
  * attention_bf16: the same in bfloat16 at GPT-2 124M's sizes (full: batch 8, 12 heads, 1024 positions, head dim
    64): glassgrad's flash attention on CUDA (codegen/chained.py) against PyTorch's flash SDPA.

    python bench/gpt.py --small              # a couple of minutes on a small CPU
    python bench/gpt.py --device CUDA --repeat 10
    python bench/gpt.py --device CUDA --only train_bf16   # GPT-2 124M bf16 train step against torch.autocast
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad import Device, Tensor, TinyJit, amp, dtypes
from glassgrad.dtype import DType
from glassgrad.models.gpt2 import GPT2, Generator, GPT2Config
from glassgrad.nn import optim
from glassgrad.nn.state import get_parameters

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # PyTorch is optional: glassgrad's column alone
    torch = None


@dataclass(frozen=True)
class Sizes:
    train: GPT2Config
    batch: int
    context: int
    generate: GPT2Config
    gen_cache: int
    gen_tokens: int
    attention: tuple[int, int, int, int]  # batch, heads, positions, head dim
    attention_bf16: tuple[int, int, int, int]
    mixed: GPT2Config      # the bf16 train row
    mixed_batch: int
    mixed_context: int


FULL = Sizes(train=GPT2Config(vocab_size=8192, n_ctx=256, n_embd=512, n_head=8, n_layer=6), batch=16, context=256,
             generate=GPT2Config(), gen_cache=1024, gen_tokens=64, attention=(16, 8, 256, 64),
             attention_bf16=(8, 12, 1024, 64),
             mixed=GPT2Config(vocab_size=50304), mixed_batch=8, mixed_context=1024)
SMALL = Sizes(train=GPT2Config(vocab_size=512, n_ctx=64, n_embd=128, n_head=4, n_layer=2), batch=8, context=64,
              generate=GPT2Config(vocab_size=2048, n_ctx=256, n_embd=256, n_head=4, n_layer=4), gen_cache=256,
              gen_tokens=32, attention=(4, 4, 64, 32), attention_bf16=(2, 4, 256, 64),
              mixed=GPT2Config(vocab_size=512, n_ctx=64, n_embd=128, n_head=4, n_layer=2), mixed_batch=8,
              mixed_context=64)
WORKLOADS = ("train", "train_bf16", "train_fp16", "generate", "attention", "attention_bf16")


def median_time(step: Callable[[], object], sync: Callable[[], None], repeat: int, calls: int = 1,
                warmup: int = 3) -> float:
    """Median over `repeat` rounds of the seconds per call, each round `calls` calls then a sync."""
    for _ in range(warmup):  # glassgrad's TinyJit: eager, capture, first replay
        step()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            step()
        sync()
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


# ---------------------------------------------------------------------- glassgrad
def gg_train_step(cfg: GPT2Config, batch: int, context: int, device: str,
                  devices: tuple[str, ...] = (), dtype: DType = dtypes.float32) -> Callable[[], object]:
    """glassgrad's TinyJit train step on two fixed batches, alternated. With several `devices` (bench/multigpu.py):
    data parallel, the parameters replicated on each and every batch split by rows. dtype bfloat16/float16: the
    forward under amp.autocast (float16 with amp.GradScaler), parameters and AdamW float32."""
    Tensor.manual_seed(0)
    model = GPT2(cfg)
    params = get_parameters(model)
    for p in params if len(devices) > 1 else ():
        p.shard_(devices)
    opt = optim.AdamW(params, lr=1e-4)
    half = dtype in amp.HALF_DTYPES
    scaler = amp.GradScaler(device=device) if dtype == dtypes.float16 else None
    rng = np.random.default_rng(0)
    data = [Tensor(rng.integers(0, cfg.vocab_size, (batch, context + 1)).astype(np.int32), device=device).realize()
            for _ in range(2)]

    def place(t: Tensor) -> Tensor:
        return t.shard(devices, axis=0).realize() if len(devices) > 1 else t.realize()
    pairs = [(place(d[:, :-1].contiguous()), place(d[:, 1:].contiguous())) for d in data]

    @TinyJit
    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        with amp.autocast(dtype if half else dtypes.bfloat16, enabled=half):
            loss = model(x).sparse_categorical_crossentropy(y)
        if scaler is None:
            return loss.backward().realize(*opt.schedule_step())
        scaler.scale(loss).backward()
        return loss.realize(*scaler.schedule_step(opt), *scaler.schedule_update())

    calls = 0

    def run() -> object:
        nonlocal calls
        calls += 1
        return step(*pairs[calls % 2])
    return run


def gg_generation(cfg: GPT2Config, cache: int, tokens: int) -> Callable[[], object]:
    """One call generates `tokens` tokens greedily from position 32 (after a 32-token prompt run once here)."""
    Tensor.manual_seed(0)
    gen = Generator(GPT2(cfg), batch=1, max_context=cache)
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 32))
    first = gen.prefill(prompt).argmax(-1)

    def run() -> object:
        tok = first
        for pos in range(32, 32 + tokens):
            tok = gen.next_logits(tok, pos).argmax(-1)
        return tok
    return run


def gg_attention(shape: tuple[int, int, int, int], device: str, dtype: Any = dtypes.float32) -> Callable[[], object]:
    rng = np.random.default_rng(0)
    inputs = [Tensor(rng.standard_normal(shape).astype(np.float32), device=device).cast(dtype).contiguous().realize()
              for _ in range(4)]

    @TinyJit
    def step(q: Tensor, k: Tensor, v: Tensor, dout: Tensor) -> list[Tensor]:
        out = q.scaled_dot_product_attention(k, v, is_causal=True)
        return (out * dout).sum().gradient(q, k, v)

    return lambda: step(*inputs)


# ---------------------------------------------------------------------- PyTorch
def torch_gpt2(cfg: GPT2Config, device: str) -> Any:
    """The same GPT-2 as torch modules (nn.Linear, nn.LayerNorm, F.scaled_dot_product_attention), tied head."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = cfg.n_embd
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: Any, cache: tuple[Any, Any] | None = None, pos: int = 0) -> Any:
            b, t, d = x.shape
            q, k, v = (z.view(b, t, cfg.n_head, -1).transpose(1, 2) for z in self.c_attn(self.ln_1(x)).split(d, -1))
            if cache is None:
                att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                cache[0][:, :, pos:pos + t], cache[1][:, :, pos:pos + t] = k, v
                att = F.scaled_dot_product_attention(q, cache[0][:, :, :pos + t], cache[1][:, :, :pos + t],
                                                     is_causal=t > 1)
            x = x + self.c_proj(att.transpose(1, 2).reshape(b, t, d))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.n_ctx, cfg.n_embd)
            self.h = nn.ModuleList(Block() for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)

        def forward(self, idx: Any, caches: list[tuple[Any, Any]] | None = None, pos: int = 0) -> Any:
            x = self.wte(idx) + self.wpe.weight[pos:pos + idx.shape[1]]
            for i, block in enumerate(self.h):
                x = block(x, None if caches is None else caches[i], pos)
            return self.ln_f(x) @ self.wte.weight.T

    return Model().to(device)


def torch_sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def torch_train_step(cfg: GPT2Config, batch: int, context: int, device: str,
                     wrap: Callable[[Any], Any] | None = None, dtype: str = "float32") -> Callable[[], object]:
    """PyTorch's eager AdamW step on a fixed batch; `wrap` wraps the model (bench/multigpu.py: DataParallel). dtype
    bfloat16/float16: the forward and loss under torch.autocast (float16 with torch.amp.GradScaler), fp32 params."""
    torch.manual_seed(0)
    model = torch_gpt2(cfg, device)
    net = wrap(model) if wrap is not None else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    data = torch.randint(0, cfg.vocab_size, (batch, context + 1), device=device)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    half = dtype != "float32"
    scaler = torch.amp.GradScaler(device) if dtype == "float16" else None

    def step() -> object:
        opt.zero_grad()
        with torch.autocast(device, getattr(torch, dtype) if half else torch.bfloat16, enabled=half):
            loss = F.cross_entropy(net(x).reshape(-1, cfg.vocab_size), y.reshape(-1))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        return loss
    return step


def torch_generation(cfg: GPT2Config, cache: int, tokens: int, device: str) -> Callable[[], object]:
    torch.manual_seed(0)
    model = torch_gpt2(cfg, device).eval()
    shape = (1, cfg.n_head, cache, cfg.n_embd // cfg.n_head)
    caches = [(torch.zeros(shape, device=device), torch.zeros(shape, device=device)) for _ in range(cfg.n_layer)]
    prompt = torch.randint(0, cfg.vocab_size, (1, 32), device=device)
    with torch.no_grad():
        first = int(model(prompt, caches, 0)[0, -1].cpu().numpy().argmax())

    def run() -> object:
        tok = first
        with torch.no_grad():
            for pos in range(32, 32 + tokens):
                logits = model(torch.tensor([[tok]], device=device), caches, pos)[0, -1].cpu().numpy()
                tok = int(logits.argmax())
        return tok
    return run


def torch_attention(shape: tuple[int, int, int, int], device: str, fused: bool, dtype: Any = None
                    ) -> Callable[[], object]:
    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(shape, generator=gen).to(device, dtype or torch.float32) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = torch.ones(shape[2], shape[2], dtype=torch.bool, device=device).tril()

    def step() -> object:
        if fused:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(shape[-1])
            out = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v
        return torch.autograd.grad(out, (q, k, v), dout)
    return step


# ---------------------------------------------------------------------- the table
def train_flops(cfg: GPT2Config, tokens: int, context: int) -> float:
    """6 * params (matmuls, forward and backward) + attention's 12 * layers * context * width, per token."""
    matmul_params = cfg.n_layer * 12 * cfg.n_embd ** 2 + cfg.vocab_size * cfg.n_embd
    return tokens * (6 * matmul_params + 12 * cfg.n_layer * context * cfg.n_embd)


def attention_flops(shape: tuple[int, int, int, int]) -> float:
    b, h, t, d = shape
    return 3 * 2 * 2 * b * h * t * t * d  # two matmuls forward, four backward (no causal skipping counted)


def row(name: str, gg: float, tt: float | None, amount: float, unit: str, per: str = "call") -> None:
    rate = lambda s: f"{amount / s:10.1f} {unit}"  # noqa: E731
    torch_part = f"{tt * 1e3:10.2f} ms {rate(tt)}  {tt / gg:6.2f}x" if tt else f"{'-':>13} {'-':>17}  {'-':>7}"
    print(f"{name:<34} {gg * 1e3:10.2f} ms {rate(gg)}  {torch_part}   (per {per})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="CPU")
    parser.add_argument("--repeat", type=int, default=5)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="small sizes (the default on CPU)")
    size.add_argument("--full", action="store_true", help="the full sizes (the default elsewhere)")
    parser.add_argument("--only", default=",".join(WORKLOADS), help=f"comma-separated subset of {','.join(WORKLOADS)}")
    args = parser.parse_args()
    only = {w.strip() for w in args.only.split(",") if w.strip()}
    if not only or only - set(WORKLOADS):
        parser.error(f"--only: unknown workload(s) {sorted(only - set(WORKLOADS))}; choose from {WORKLOADS}")
    device = Device.canonicalize(args.device)
    Device.DEFAULT = device
    sizes = SMALL if args.small or (device == "CPU" and not args.full) else FULL
    tdev = "cuda" if device == "CUDA" else "cpu"
    have_torch = torch is not None and (tdev == "cpu" or torch.cuda.is_available())
    if have_torch and tdev == "cpu":  # the same number of threads for both (glassgrad's THREADS, default all cores)
        from glassgrad.runtime.ops_cpu import THREADS
        torch.set_num_threads(THREADS)
        print(f"CPU threads: {THREADS} for each library (THREADS=n sets it)")
    gg_sync, t_sync = Device[device].synchronize, (torch_sync(tdev) if have_torch else None)
    print(f"glassgrad on {device}, PyTorch {torch.__version__ if have_torch else '(not available)'} on {tdev}; "
          f"fp32 unless named; medians of {args.repeat} rounds; ratio = PyTorch time / glassgrad time "
          "(> 1: glassgrad faster)")
    print(f"{'workload':<34} {'glassgrad':>13} {'':>17}  {'PyTorch':>13} {'':>17}  {'ratio':>7}")

    trains = {"train": (sizes.train, sizes.batch, sizes.context, dtypes.float32),
              "train_bf16": (sizes.mixed, sizes.mixed_batch, sizes.mixed_context, dtypes.bfloat16),
              "train_fp16": (SMALL.train, SMALL.batch, SMALL.context, dtypes.float16)}
    for name, (c, b, t, dt) in trains.items():
        if name in only:
            train_row(c, b, t, dt, device, tdev, args.repeat, gg_sync, t_sync if have_torch else None)
    if "generate" in only:
        generate_row(sizes, device, tdev, args.repeat, gg_sync, t_sync if have_torch else None)
    if "attention" in only:
        attention_row(sizes.attention, device, tdev, args.repeat, gg_sync, t_sync if have_torch else None)
    if "attention_bf16" in only:
        attention_row(sizes.attention_bf16, device, tdev, args.repeat, gg_sync, t_sync if have_torch else None,
                      half=True)


def train_row(c: GPT2Config, b: int, t: int, dt: DType, device: str, tdev: str, repeat: int,
              gg_sync: Callable[[], None], t_sync: Callable[[], None] | None) -> None:
    gg = median_time(gg_train_step(c, b, t, device, dtype=dt), gg_sync, repeat)
    tt = median_time(torch_train_step(c, b, t, tdev, dtype=dt.name), t_sync, repeat) if t_sync else None
    label = "" if dt == dtypes.float32 else f" {dt.name}"
    row(f"train{label} L{c.n_layer} d{c.n_embd} V{c.vocab_size} b{b}x{t}", gg, tt, train_flops(c, b * t, t) / 1e9,
        "GFLOP/s", "step")


def generate_row(sizes: Sizes, device: str, tdev: str, repeat: int, gg_sync: Callable[[], None],
                 t_sync: Callable[[], None] | None) -> None:
    g, n = sizes.generate, sizes.gen_tokens
    gg = median_time(gg_generation(g, sizes.gen_cache, n), gg_sync, repeat, warmup=1)
    tt = median_time(torch_generation(g, sizes.gen_cache, n, tdev), t_sync, repeat, warmup=1) if t_sync else None
    row(f"generate {g.num_params() / 1e6:.0f}M b1, {n} tokens", gg / n, tt / n if tt else None, 1, "tok/s", "token")


def attention_row(a: tuple[int, int, int, int], device: str, tdev: str, repeat: int, gg_sync: Callable[[], None],
                  t_sync: Callable[[], None] | None, half: bool = False) -> None:
    """Causal attention forward and backward; `half`: in bfloat16 (glassgrad's flash kernels where they apply,
    against PyTorch's flash SDPA)."""
    dtype, torch_dtype = (dtypes.bfloat16, torch.bfloat16 if torch is not None else None) if half else \
        (dtypes.float32, None)
    gg = median_time(gg_attention(a, device, dtype), gg_sync, repeat, calls=3)
    fl = attention_flops(a) / 1e9
    name = f"attention{' bf16' if half else ''} fwd+bwd {'x'.join(map(str, a))}"
    if t_sync:
        row(name, gg, median_time(torch_attention(a, tdev, False, torch_dtype), t_sync, repeat, calls=3), fl,
            "GFLOP/s")
        row("  vs PyTorch's fused sdpa", gg,
            median_time(torch_attention(a, tdev, True, torch_dtype), t_sync, repeat, calls=3), fl, "GFLOP/s")
    else:
        row(name, gg, None, fl, "GFLOP/s")


if __name__ == "__main__":
    main()
