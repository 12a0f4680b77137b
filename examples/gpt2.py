"""Train a byte-level GPT-2 on the Python standard library's source, offline, and generate text with a KV cache.

    python examples/gpt2.py train --steps 300 --save stdlib.safetensors --plot loss.png
    python examples/gpt2.py train --gpus 2 --batch 32   # data parallel (or --devices CPU:0,CPU:1)
    python examples/gpt2.py train --device CUDA --dtype bfloat16   # mixed precision (float16: with loss scaling)
    python examples/gpt2.py generate --load stdlib.safetensors --prompt "def " --temperature 0.8 --top-k 40
    python examples/gpt2.py generate --weights gpt2/model.safetensors --prompt "Hello"   # Hugging Face's GPT-2

train. In: every `*.py` file under `sysconfig.get_paths()["stdlib"]` (site-/dist-packages left out), sorted by path;
every 20th file is held out. Out: a tqdm bar with the training loss, the held-out loss every `--eval-every` steps,
the loss curve printed at the end (and drawn into `--plot FILE` when matplotlib is installed), the weights
(`--save`, safetensors in Hugging Face's layout with the config in the metadata). Vocabulary: the 256 byte values.
The step is tinygrad's beautiful_mnist step: a TinyJit of forward, backward and the AdamW update. Data parallel
with `--gpus N` (CUDA:0..N-1) or `--devices CPU:0,CPU:1`: every parameter replicated on each device (the tied
embedding/head too), each batch split by rows, the gradients all-reduced, the same AdamW step on every device;
`--batch` must be a multiple of the device count. Mixed precision with `--dtype bfloat16|float16`: the parameters and
AdamW stay float32, the forward runs under `glassgrad.amp.autocast` (matmuls in the half dtype, on tensor cores on
CUDA), and float16 scales the loss with `amp.GradScaler` (a step with an inf/NaN gradient is skipped on the device).

generate. In: `--load` (a model saved by `train`) or `--weights` (Hugging Face GPT-2's model.safetensors, with
its config.json beside it or inferred); or `--random CONFIG` for untrained weights. Out: the prompt and its
continuation, and the tokens/s of the cached steps. GPT-2 text is tokenized with tiktoken when installed; without
it, the prompt is encoded byte by byte into GPT-2's single-byte tokens and decoded with the vocab.json beside the
weights when there is one (byte-level BPE without merges: valid input, but not how GPT-2 saw text in training).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import sysconfig
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from glassgrad import Device, Tensor, TinyJit, amp, dtypes, no_grad
from glassgrad.dtype import DType, to_dtype
from glassgrad.models.gpt2 import CONFIGS, GPT2, Generator, GPT2Config
from glassgrad.nn import optim
from glassgrad.nn.state import get_parameters


# ---------------------------------------------------------------------- data
def stdlib_files() -> list[pathlib.Path]:
    """The standard library's .py files, sorted by their path below it (the same order on every run)."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages"}
    return sorted((f for f in root.rglob("*.py") if f.is_file() and not skip & set(f.relative_to(root).parts)),
                  key=lambda f: f.relative_to(root).as_posix())


def load_corpus(held_out_every: int = 20) -> tuple[np.ndarray, np.ndarray, str]:
    """(train bytes, held-out bytes) as uint8 arrays, files joined by blank lines, and a line describing them."""
    files = stdlib_files()
    if len(files) < held_out_every:
        sys.exit(f"found only {len(files)} .py files under {sysconfig.get_paths()['stdlib']}")
    parts: tuple[list[bytes], list[bytes]] = ([], [])
    for i, f in enumerate(files):
        parts[i % held_out_every == 0].append(f.read_bytes() + b"\n\n")
    train, held = (np.frombuffer(b"".join(p), np.uint8) for p in parts)
    return train, held, (f"{len(files)} stdlib files: {train.size / 1e6:.1f} MB train, {held.size / 1e6:.1f} MB "
                         f"held out (every {held_out_every}th file)")


Devices = tuple[str, ...] | None  # data parallel over these devices; None: one device (Device.DEFAULT)


def batches(data: np.ndarray, batch: int, context: int, rng: np.random.Generator,
            devices: Devices = None) -> tuple[Tensor, Tensor]:
    """Random windows: inputs (batch, context) and the next bytes (batch, context), int32; split by rows over
    `devices` when given."""
    starts = rng.integers(0, data.size - context - 1, batch)
    windows = np.stack([data[s:s + context + 1] for s in starts]).astype(np.int32)
    return placed(Tensor(windows[:, :-1]), devices), placed(Tensor(windows[:, 1:]), devices)


# ---------------------------------------------------------------------- data parallel
def training_devices(gpus: int, devices: str | None, batch: int) -> tuple[str, ...]:
    """The devices named by `--devices a,b,...`, else by `--gpus N` (CUDA:0..N-1); () when neither. The batch is
    split evenly: with several devices, a batch that is not a multiple of their count raises ValueError naming both
    (glassgrad itself would split it unevenly, leaving devices idle for part of every step)."""
    if gpus < 0:
        raise ValueError(f"--gpus must be >= 0, got {gpus}")
    names = tuple(d.strip() for d in devices.split(",") if d.strip()) if devices else \
        tuple(f"CUDA:{i}" for i in range(gpus))
    if len(names) > 1 and batch % len(names):
        raise ValueError(f"--batch {batch} is not divisible by the {len(names)} devices {','.join(names)}: "
                         f"pass a multiple of {len(names)}")
    return names


def replicate(model: GPT2, devices: Devices) -> None:
    """Every parameter (the tied wte once) copied to each of `devices`, in place: gradients of the replicated
    weights are then sums over a row-split batch, which glassgrad all-reduces."""
    if devices:
        for p in get_parameters(model):
            p.shard_(devices)


def placed(t: Tensor, devices: Devices) -> Tensor:
    """A batch on the training devices: split by rows over several, as is on one."""
    return t.shard(devices, axis=0) if devices else t


# ---------------------------------------------------------------------- training
def make_train_step(model: GPT2, opt: optim.Optimizer, jit: bool = True, dtype: DType = dtypes.float32,
                    scaler: amp.GradScaler | None = None) -> Callable[[Tensor, Tensor], Tensor]:
    """tinygrad's beautiful_mnist step: forward, backward and the optimiser update, all realized together; a TinyJit
    unless jit=False. On several devices (replicated parameters, row-split x and y) it is the same code. dtype
    float16/bfloat16: the forward under `amp.autocast(dtype)`; with a `scaler`, the loss is scaled, and the update
    skipped and the scale lowered when a gradient is not finite (all on the device, inside the same realize)."""
    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        with amp.autocast(dtype if dtype in amp.HALF_DTYPES else dtypes.bfloat16, enabled=dtype in amp.HALF_DTYPES):
            loss = model(x).sparse_categorical_crossentropy(y)
        if scaler is None:
            return loss.backward().realize(*opt.schedule_step())
        scaler.scale(loss).backward()
        return loss.realize(*scaler.schedule_step(opt), *scaler.schedule_update())
    return TinyJit(step) if jit else step


def training_precision(name: str, devices: Devices) -> tuple[DType, amp.GradScaler | None]:
    """`--dtype` -> (compute dtype, loss scaler): float16 gets PyTorch's default GradScaler, the others none."""
    dtype = to_dtype(name)
    if dtype not in (dtypes.float32, *amp.HALF_DTYPES):
        raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {name}")
    if dtype != dtypes.float16:
        return dtype, None
    if devices:
        raise ValueError("--dtype float16 (loss scaling) is not supported with several devices yet; use bfloat16")
    return dtype, amp.GradScaler()


def evaluate(model: GPT2, data: np.ndarray, batch: int, context: int, batches_n: int = 4,
             devices: Devices = None, dtype: DType = dtypes.float32) -> float:
    """Mean loss on `batches_n` fixed windows of `data` (the same windows every time), computed in `dtype`."""
    rng = np.random.default_rng(0)
    losses = []
    half = dtype in amp.HALF_DTYPES
    with no_grad(), Tensor.test(), amp.autocast(dtype if half else dtypes.bfloat16, enabled=half):
        for _ in range(batches_n):
            x, y = batches(data, batch, context, rng, devices)
            losses.append(float(model(x).sparse_categorical_crossentropy(y).item()))
    return float(np.mean(losses))


def progress(steps: int) -> Iterable[int]:
    try:
        from tqdm import trange
        return trange(steps)
    except ImportError:
        return range(steps)


def train(args: argparse.Namespace) -> None:
    train_data, held_data, description = load_corpus()
    print(description)
    Tensor.manual_seed(args.seed)
    model = GPT2.from_pretrained(args.load) if args.load else GPT2(byte_config(args))
    c = model.config
    if c.vocab_size != 256 or args.context > c.n_ctx:
        sys.exit(f"train needs a byte-level model (vocab 256) with n_ctx >= --context; this one is {c}")
    print(f"model: {c.n_layer} layers, width {c.n_embd}, {c.n_head} heads, context {args.context}, "
          f"{c.num_params() / 1e6:.2f}M params; device {Device.DEFAULT}")
    devices: Devices = args.train_devices
    replicate(model, devices)
    if devices:
        print(f"data parallel over {','.join(devices)}: {args.batch // len(devices)} rows of each batch per device")
    opt = optim.AdamW(get_parameters(model), lr=args.lr, weight_decay=args.weight_decay)
    dtype, scaler = training_precision(args.dtype, devices)
    if dtype != dtypes.float32:
        print(f"mixed precision: {dtype.name} compute, float32 parameters and AdamW" +
              (", loss scaling (GradScaler)" if scaler else ""))
    step = make_train_step(model, opt, dtype=dtype, scaler=scaler)
    rng = np.random.default_rng(args.seed)
    curve: list[tuple[int, float, float | None]] = []
    bar = progress(args.steps)
    start = time.perf_counter()
    for i in bar:
        loss = float(step(*batches(train_data, args.batch, args.context, rng, devices)).item())
        held = evaluate(model, held_data, args.batch, args.context, devices=devices, dtype=dtype) \
            if (i + 1) % args.eval_every == 0 or i + 1 == args.steps else None
        curve.append((i + 1, loss, held))
        if hasattr(bar, "set_description"):
            bar.set_description(f"loss {loss:.3f}" + (f" held-out {held:.3f}" if held is not None else ""))
    elapsed = time.perf_counter() - start
    print_curve(curve, args.batch * args.context, elapsed)
    if scaler is not None:
        print(f"loss scale at the end: {scaler.get_scale():g}")
    if args.plot:
        plot_curve(curve, args.plot)
    if args.save:
        model.save_pretrained(args.save)
        print(f"saved the weights to {args.save}")


def byte_config(args: argparse.Namespace) -> GPT2Config:
    base = CONFIGS[args.config]
    return GPT2Config(vocab_size=256, n_ctx=max(base.n_ctx, args.context), n_embd=args.width or base.n_embd,
                      n_head=args.heads or base.n_head, n_layer=args.layers or base.n_layer)


def print_curve(curve: Sequence[tuple[int, float, float | None]], tokens_per_step: int, elapsed: float) -> None:
    """The loss curve as a table: training loss averaged over each stretch between held-out evaluations."""
    print(f"{'step':>6} {'train loss':>11} {'held-out':>9}   (nats per byte; uniform over 256 bytes: 5.545)")
    since = 0
    for i, (step, _, held) in enumerate(curve):
        if held is not None:
            mean = np.mean([loss for _, loss, _ in curve[since:i + 1]])
            print(f"{step:6d} {mean:11.3f} {held:9.3f}")
            since = i + 1
    print(f"{len(curve)} steps in {elapsed:.1f} s ({len(curve) * tokens_per_step / elapsed:,.0f} tokens/s)")


def plot_curve(curve: Sequence[tuple[int, float, float | None]], path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib is not installed: no plot written to {path}")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _, _ in curve], [loss for _, loss, _ in curve], label="train", alpha=0.6)
    held = [(s, h) for s, _, h in curve if h is not None]
    ax.plot([s for s, _ in held], [h for _, h in held], "o-", label="held out")
    ax.set(xlabel="step", ylabel="loss (nats per byte)", title="byte-level GPT-2 on the Python stdlib")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"loss curve written to {path}")


# ---------------------------------------------------------------------- tokenizers
class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """Bytes are tokens (vocab 256)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode(errors="replace")


def gpt2_byte_order() -> list[int]:
    """GPT-2's tokens 0..255 are the 256 bytes in this order: the printable ones first (`bytes_to_unicode`)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    return printable + [b for b in range(256) if b not in set(printable)]


class GPT2ByteFallback:
    """GPT-2's vocabulary without tiktoken: text in as single-byte tokens; ids out through vocab.json when found."""

    def __init__(self, vocab_json: pathlib.Path | None) -> None:
        order = gpt2_byte_order()
        self.byte_to_id = {b: i for i, b in enumerate(order)}
        char_to_byte = {chr(b if i < 188 else 256 + i - 188): b for i, b in enumerate(order)}
        self.id_to_bytes: dict[int, bytes] = {i: bytes([b]) for i, b in enumerate(order)}
        if vocab_json is not None and vocab_json.is_file():
            for piece, i in json.loads(vocab_json.read_text()).items():
                self.id_to_bytes[int(i)] = bytes(char_to_byte.get(ch, ord("?")) for ch in piece)

    def encode(self, text: str) -> list[int]:
        return [self.byte_to_id[b] for b in text.encode()]

    def decode(self, ids: Sequence[int]) -> str:
        return b"".join(self.id_to_bytes.get(int(i), f"<{int(i)}>".encode()) for i in ids).decode(errors="replace")


def tokenizer_for(config: GPT2Config, weights: str | None) -> Tokenizer:
    if config.vocab_size == 256:
        return ByteTokenizer()
    try:
        import tiktoken
        return tiktoken.get_encoding("gpt2")  # type: ignore[no-any-return]
    except Exception:  # not installed, or its BPE files cannot be fetched offline
        vocab = pathlib.Path(weights).parent / "vocab.json" if weights else None
        print("tiktoken unavailable: prompt encoded byte by byte" +
              (", decoded with vocab.json" if vocab and vocab.is_file() else ", no vocab.json: ids >= 256 as <id>"))
        return GPT2ByteFallback(vocab)


# ---------------------------------------------------------------------- generation
def generate(args: argparse.Namespace) -> None:
    Tensor.manual_seed(args.seed)
    source = args.load or args.weights
    model = GPT2.from_pretrained(source) if source else GPT2(args.random)
    tok = tokenizer_for(model.config, args.weights)
    prompt = tok.encode(args.prompt) or [0]
    context = min(model.config.n_ctx, args.max_context or len(prompt) + args.max_new)
    gen = Generator(model, batch=1, max_context=max(2, context))
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    out = gen.generate([prompt], args.max_new, args.temperature, args.top_k, rng)
    elapsed = time.perf_counter() - start
    print(tok.decode(out[0].tolist()))
    print(f"--- {args.max_new} tokens in {elapsed:.2f} s, including the prompt and the first (compiling) steps")
    timed_generation(gen, out[0], args)


def timed_generation(gen: Generator, seq: np.ndarray, args: argparse.Namespace) -> None:
    """tokens/s of the replayed step alone, over the positions just generated."""
    gen.prefill(seq[None, :len(seq) - args.max_new])
    positions = range(len(seq) - args.max_new, len(seq) - 1)
    if len(positions) < 3:
        return
    start = time.perf_counter()
    for pos in positions:
        gen.next_logits(seq[pos:pos + 1], pos)
    elapsed = time.perf_counter() - start
    print(f"cached steps: {len(positions) / elapsed:.1f} tokens/s (batch 1, {Device.DEFAULT})")


# ---------------------------------------------------------------------- command line
def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a byte-level GPT-2 on the stdlib's source")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--context", type=int, default=128)
    t.add_argument("--config", default="byte-small", choices=sorted(CONFIGS), help="sizes (vocab becomes 256)")
    t.add_argument("--width", type=int, default=None)
    t.add_argument("--heads", type=int, default=None)
    t.add_argument("--layers", type=int, default=None)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--weight-decay", type=float, default=0.01)
    t.add_argument("--eval-every", type=int, default=50)
    t.add_argument("--load", default=None, help="continue from a model saved by train")
    t.add_argument("--save", default=None, help="write the weights here (safetensors)")
    t.add_argument("--plot", default=None, help="draw the loss curve into this PNG (needs matplotlib)")
    t.add_argument("--gpus", type=int, default=0, help="data parallel over CUDA:0..N-1 (batch split by rows)")
    t.add_argument("--devices", default=None, help="data parallel over these devices, e.g. CPU:0,CPU:1")
    t.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="compute dtype (parameters and AdamW stay float32; float16 scales the loss)")
    g = sub.add_parser("generate", help="sample text with a KV cache")
    g.add_argument("--load", default=None, help="a model saved by train")
    g.add_argument("--weights", default=None, help="Hugging Face GPT-2 model.safetensors (or its folder)")
    g.add_argument("--random", default="byte-small", choices=sorted(CONFIGS), help="untrained, when no weights")
    g.add_argument("--prompt", default="def ")
    g.add_argument("--max-new", type=int, default=100)
    g.add_argument("--max-context", type=int, default=None)
    g.add_argument("--temperature", type=float, default=0.8)
    g.add_argument("--top-k", type=int, default=40)
    for p in (t, g):
        p.add_argument("--device", default=None, help="CPU (default), CUDA, METAL")
        p.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.train_devices = None  # data parallel: several devices; one named device is just --device
    if args.command == "train":
        try:
            names = training_devices(args.gpus, args.devices, args.batch)
        except ValueError as e:
            parser.error(str(e))
        args.device = args.device or (names[0] if names else None)  # parameters and batches are made there
        args.train_devices = names if len(names) > 1 else None
        if args.dtype == "float16" and args.train_devices:
            parser.error("--dtype float16 (loss scaling) is not supported with several devices yet; use bfloat16")
    return args


def main(argv: Sequence[str] | None = None) -> Any:
    args = parse(argv)
    if args.device:
        Device.DEFAULT = Device.canonicalize(args.device)
    return train(args) if args.command == "train" else generate(args)


if __name__ == "__main__":
    main()
