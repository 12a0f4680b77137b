"""GPT-2 (Radford et al., 2019) exactly as published, Hugging Face's weights, and KV-cached generation.

In: token ids, an int tensor (B, T) with T <= n_ctx. Out: logits (B, T, vocab_size), float32, lazy.

Mixed precision: run the model under `glassgrad.amp.autocast(dtypes.bfloat16)` (or float16). The parameters stay
float32; the linear layers, the attention matmuls and the LM head compute in the half dtype (tensor cores on CUDA),
while the embeddings, the residual stream, the LayerNorms, the attention softmax and the returned logits are float32.

The network: token embedding `wte` + position embedding `wpe`; `n_layer` pre-LayerNorm blocks, each
`x + attn(ln_1(x))` then `x + mlp(ln_2(x))`, where attention is causal multi-head self-attention with the three
projections fused in one `c_attn` (n_embd -> 3*n_embd) and an output `c_proj`, and the MLP is `c_fc` (n_embd ->
4*n_embd), GELU (tanh approximation, as GPT-2 uses), `c_proj`; a final `ln_f`; the LM head is `wte` itself (tied).
Attribute names follow Hugging Face's `GPT2Model`, so `get_state_dict(model)` gives its keys (`wte.weight`,
`h.0.attn.c_attn.weight`, ...). Linear weights are stored (out, in) as in `nn.Linear`; HF's Conv1D stores them
(in, out), so `GPT2.from_pretrained` transposes those four per block.

Random init is GPT-2's: every Linear weight and both embeddings ~ N(0, 0.02), biases 0, LayerNorms 1 and 0, and the
two residual projections (`attn.c_proj`, `mlp.c_proj`) ~ N(0, 0.02 / sqrt(2 * n_layer)).

Generation (`Generator`): per-layer key and value caches (B, n_head, max_context, head_dim), allocated once and
written in place with `assign`. The prompt runs once through the plain forward (any length). Every later token is
one call of a `TinyJit` step whose position is the bound `Variable("start_pos", 1, max_context - 1)`: the cache is
read up to `start_pos + 1` (a symbolic length), so one captured set of kernels serves every position. Sampling
(greedy, temperature, top-k) happens on the host from the step's logits, with a numpy generator.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from glassgrad import amp, nn
from glassgrad.engine.jit import TinyJit
from glassgrad.nn.state import get_state_dict, load_state_dict, safe_load, safe_load_metadata, safe_save
from glassgrad.tensor import Tensor, no_grad
from glassgrad.uop.ops import UOp
from glassgrad.uop.sint import Variable

__all__ = ["GPT2Config", "CONFIGS", "GPT2", "KVCache", "Generator", "sample"]

Position = int | UOp  # a position in the sequence: an int, or a bound Variable (inside the generation step)


@dataclass(frozen=True)
class GPT2Config:
    """Sizes of a GPT-2 (Hugging Face's names). head_dim = n_embd // n_head."""
    vocab_size: int = 50257
    n_ctx: int = 1024           # HF: n_positions, the number of position embeddings
    n_embd: int = 768
    n_head: int = 12
    n_layer: int = 12
    layer_norm_epsilon: float = 1e-5

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"GPT2Config.{f.name} must be positive, got {getattr(self, f.name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPT2Config: n_embd {self.n_embd} must be a multiple of n_head {self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def num_params(self) -> int:
        """Parameters, counting the tied wte once."""
        d, L = self.n_embd, self.n_layer
        per_block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
        return self.vocab_size * d + self.n_ctx * d + L * per_block + 2 * d


CONFIGS: dict[str, GPT2Config] = {
    "gpt2": GPT2Config(),                                                    # 124M
    "gpt2-medium": GPT2Config(n_embd=1024, n_head=16, n_layer=24),           # 355M
    "gpt2-large": GPT2Config(n_embd=1280, n_head=20, n_layer=36),            # 774M
    "gpt2-xl": GPT2Config(n_embd=1600, n_head=25, n_layer=48),               # 1558M
    "byte-small": GPT2Config(vocab_size=256, n_ctx=256, n_embd=256, n_head=8, n_layer=4),  # 3.3M, for examples
    "byte-tiny": GPT2Config(vocab_size=256, n_ctx=128, n_embd=128, n_head=4, n_layer=2),   # 0.45M, for tests
}

_METADATA_KEY = "glassgrad.gpt2.config"  # save_pretrained's config, as JSON, in the safetensors metadata
_CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


# ---------------------------------------------------------------------- layers
def _param(shape: tuple[int, ...], std: float | None) -> Tensor:
    """A realized parameter in a buffer of its own: N(0, std), zeros for std=0, uninitialised for None."""
    if std is None:
        return Tensor.empty(*shape)
    if std == 0:
        return Tensor(np.zeros(shape, np.float32))
    return Tensor.normal(*shape, std=std)


class Linear:
    """y = x @ weight.T + bias; weight (n_out, n_in) ~ N(0, std), bias (n_out,) zeros (GPT-2's init). Under autocast
    computed (and returned) in the half dtype."""

    def __init__(self, n_in: int, n_out: int, std: float | None) -> None:
        self.weight = _param((n_out, n_in), std)
        self.bias = _param((n_out,), None if std is None else 0.0)

    def __call__(self, x: Tensor) -> Tensor:
        return amp.linear(x, self.weight.T, self.bias)


class Embedding:
    """A (rows, dim) table ~ N(0, std)."""

    def __init__(self, rows: int, dim: int, std: float | None) -> None:
        self.weight = _param((rows, dim), std)


def causal_mask(queries: int, start_pos: int) -> Tensor:
    """(queries, start_pos + queries) bool: query i (at position start_pos + i) may see keys 0..start_pos + i.
    TODO(merge): `Tensor.ones(...).tril(start_pos)` once Tensor.tril lands."""
    rows = Tensor.arange(queries).reshape(queries, 1) + start_pos
    return rows >= Tensor.arange(start_pos + queries).reshape(1, start_pos + queries)


class KVCache:
    """Keys and values of every layer, each (batch, n_head, max_context, head_dim), allocated once (zeros) and
    written in place. `write` puts T new positions at start_pos and returns the cached ones up to start_pos + T."""

    def __init__(self, config: GPT2Config, batch: int, max_context: int) -> None:
        if not 2 <= max_context <= config.n_ctx:
            raise ValueError(f"KVCache: max_context must be in [2, n_ctx={config.n_ctx}], got {max_context}")
        self.max_context = max_context
        shape = (batch, config.n_head, max_context, config.head_dim)
        self.keys = [Tensor(np.zeros(shape, np.float32)) for _ in range(config.n_layer)]
        self.values = [Tensor(np.zeros(shape, np.float32)) for _ in range(config.n_layer)]
        self.positions = Tensor(np.arange(max_context, dtype=np.int32))  # read at a symbolic start_pos

    def tensors(self) -> list[Tensor]:
        return [*self.keys, *self.values]

    def write(self, layer: int, k: Tensor, v: Tensor, start_pos: Position) -> tuple[Tensor, Tensor]:
        """Store k, v (B, H, T, Dh) at positions [start_pos, start_pos + T) (an assign into a slice of the cache,
        which writes the cache's buffer in place); return the layer's keys and values (B, H, start_pos + T, Dh). With
        a symbolic start_pos, T must be 1: one kernel serves every position."""
        self._check(k.shape[2], start_pos)
        cache_k, cache_v = self.keys[layer], self.values[layer]
        end = start_pos + k.shape[2]
        cache_k[:, :, start_pos:end].assign(k.cast(cache_k.dtype))  # (under autocast k and v are half)
        cache_v[:, :, start_pos:end].assign(v.cast(cache_v.dtype))
        return cache_k[:, :, :end], cache_v[:, :, :end]

    def _check(self, t: int, start_pos: Position) -> None:
        """The positions [start_pos, start_pos + t) must fit the cache; a symbolic start_pos writes one at a time."""
        if isinstance(start_pos, UOp):
            if t != 1:
                raise ValueError(f"KVCache.write: a symbolic start_pos writes one position at a time, got {t}")
        elif not 0 <= start_pos <= self.max_context - t:
            raise ValueError(f"KVCache.write: positions [{start_pos}, {start_pos + t}) do not fit max_context "
                             f"{self.max_context}")


class Attention:
    """Causal multi-head self-attention: fused q/k/v projection `c_attn`, output projection `c_proj`."""

    def __init__(self, config: GPT2Config, std: float | None, proj_std: float | None) -> None:
        self.n_head, self.head_dim = config.n_head, config.head_dim
        self.c_attn = Linear(config.n_embd, 3 * config.n_embd, std)
        self.c_proj = Linear(config.n_embd, config.n_embd, proj_std)

    def __call__(self, x: Tensor, start_pos: Position = 0, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        b, t, d = x.shape
        qkv = self.c_attn(x).reshape(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # each (B, H, T, Dh)
        if cache is None:
            mask = None if isinstance(start_pos, int) and start_pos == 0 else causal_mask(t, _as_int(start_pos))
            out = amp.attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        else:
            k, v = cache.write(layer, k, v, start_pos)
            mask = None if t == 1 else causal_mask(t, _as_int(start_pos))
            out = amp.attention(q, k, v, attn_mask=mask)
        return self.c_proj(out.permute(0, 2, 1, 3).reshape(b, t, d))


def _as_int(start_pos: Position) -> int:
    if isinstance(start_pos, UOp):
        raise ValueError("GPT2: several tokens at a symbolic start_pos are not supported; pass one token")
    return start_pos


class MLP:
    """c_proj(gelu_tanh(c_fc(x))), hidden size 4 * n_embd."""

    def __init__(self, config: GPT2Config, std: float | None, proj_std: float | None) -> None:
        self.c_fc = Linear(config.n_embd, 4 * config.n_embd, std)
        self.c_proj = Linear(4 * config.n_embd, config.n_embd, proj_std)

    def __call__(self, x: Tensor) -> Tensor:
        return self.c_proj(self.c_fc(x).gelu())  # glassgrad's gelu is the tanh approximation


class Block:
    """x + attn(ln_1(x)), then + mlp(ln_2(x))."""

    def __init__(self, config: GPT2Config, std: float | None, proj_std: float | None) -> None:
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = Attention(config, std, proj_std)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config, std, proj_std)

    def __call__(self, x: Tensor, start_pos: Position, cache: KVCache | None, layer: int) -> Tensor:
        h = x + self.attn(self.ln_1(x), start_pos, cache, layer)
        return h + self.mlp(self.ln_2(h))


# ---------------------------------------------------------------------- the model
class GPT2:
    """GPT-2. `model(tokens)` gives logits; `GPT2.from_pretrained(path)` loads Hugging Face's safetensors."""

    def __init__(self, config: GPT2Config | str = "gpt2", init: bool = True) -> None:
        """init=False leaves the parameters uninitialised (to be loaded)."""
        self.config = CONFIGS[config] if isinstance(config, str) else config
        c = self.config
        std, proj_std = (0.02, 0.02 / math.sqrt(2 * c.n_layer)) if init else (None, None)
        self.wte = Embedding(c.vocab_size, c.n_embd, std)
        self.wpe = Embedding(c.n_ctx, c.n_embd, std)
        self.h = [Block(c, std, proj_std) for _ in range(c.n_layer)]
        self.ln_f = nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon)

    def __call__(self, tokens: Tensor) -> Tensor:
        return self.forward(tokens)

    def forward(self, tokens: Tensor | UOp, start_pos: Position = 0, cache: KVCache | None = None) -> Tensor:
        """Logits (B, T, vocab) of tokens (B, T) at positions start_pos.., or of one token given as a bound Variable
        (batch 1, T 1). With a cache, keys and values are stored in it and attention reads all positions so far.
        The logits are float32 under autocast too (computed in the half dtype, then cast, as PyTorch's autocast
        leaves them to a float32 loss)."""
        x = self.embed(tokens, start_pos)
        for i, block in enumerate(self.h):
            x = block(x, start_pos, cache, i)
        return amp.matmul(self.ln_f(x), self.wte.weight.T).cast(self.wte.weight.dtype)  # the LM head is wte (tied)

    def embed(self, tokens: Tensor | UOp, start_pos: Position) -> Tensor:
        """Token + position embeddings (B, T, n_embd)."""
        d = self.config.n_embd
        if isinstance(tokens, UOp):  # one token id as a bound Variable: read its row, no one-hot over the vocab
            tok, t = self.wte.weight[tokens:tokens + 1].reshape(1, 1, d), 1
        else:
            if tokens.ndim != 2:
                raise ValueError(f"GPT2: tokens must be (batch, time), got shape {tokens.shape}")
            tok, t = tokens.embedding(self.wte.weight), tokens.shape[1]
        if isinstance(start_pos, int) and not 0 <= start_pos <= self.config.n_ctx - t:
            raise ValueError(f"GPT2: positions [{start_pos}, {start_pos + t}) exceed n_ctx {self.config.n_ctx}")
        return tok + self.wpe.weight[start_pos:start_pos + t]

    # ------------------------------------------------------------------ weights
    @staticmethod
    def from_pretrained(path: str | os.PathLike[str], config: GPT2Config | str | None = None) -> GPT2:
        """Load Hugging Face's GPT-2 weights from a local `model.safetensors` (or a folder holding one). The config
        is `config`, else the one `save_pretrained` put in the file's metadata, else the `config.json` beside the
        file, else inferred from the shapes (head_dim 64, as in every published GPT-2)."""
        file = pathlib.Path(path)
        if file.is_dir():
            file = file / "model.safetensors"
        state = hf_to_glassgrad(safe_load(file))
        if config is None:
            config = _config_from_metadata(file) or _config_from_json(file.parent / "config.json") or \
                config_from_state(state)
        model = GPT2(config, init=False)
        load_state_dict(model, state)
        return model

    def save_pretrained(self, path: str | os.PathLike[str]) -> None:
        """Write the weights as Hugging Face lays them out (Conv1D weights (in, out)), the config in the metadata,
        so `from_pretrained` (or HF's loader, given a config.json) reads them back."""
        config = json.dumps(asdict(self.config))
        safe_save(glassgrad_to_hf(self), path, metadata={"format": "pt", _METADATA_KEY: config})


def hf_to_glassgrad(weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """Hugging Face's GPT-2 keys and layouts -> this model's: drop the `transformer.` prefix, the tied `lm_head`
    and the attention-mask buffers (`attn.bias`, `attn.masked_bias`), transpose the Conv1D weights."""
    out: dict[str, Tensor] = {}
    for key, value in weights.items():
        key = key.removeprefix("transformer.")
        if key == "lm_head.weight" or re.fullmatch(r"h\.\d+\.attn\.(masked_)?bias", key):
            continue
        out[key] = value.T if key.endswith(_CONV1D_WEIGHTS) else value
    return out


def glassgrad_to_hf(model: GPT2) -> dict[str, Tensor]:
    """The inverse of `hf_to_glassgrad`: this model's tensors under HF's names, Conv1D weights (in, out)."""
    return {k: (v.T.contiguous() if k.endswith(_CONV1D_WEIGHTS) else v) for k, v in get_state_dict(model).items()}


def config_from_state(state: dict[str, Tensor]) -> GPT2Config:
    """A config that fits a state dict's shapes (n_head = n_embd // 64, as in all published GPT-2s)."""
    missing = [k for k in ("wte.weight", "wpe.weight") if k not in state]
    if missing:
        raise ValueError(f"GPT2: the weights have no {', '.join(missing)}: not a GPT-2 checkpoint")
    vocab, n_embd = state["wte.weight"].shape
    layers = {int(m.group(1)) for k in state if (m := re.match(r"h\.(\d+)\.", k))}
    return GPT2Config(vocab_size=vocab, n_ctx=state["wpe.weight"].shape[0], n_embd=n_embd,
                      n_head=max(1, n_embd // 64), n_layer=len(layers))


def _config_from_metadata(path: pathlib.Path) -> GPT2Config | None:
    raw = safe_load_metadata(path).get("__metadata__", {}).get(_METADATA_KEY)
    return None if raw is None else GPT2Config(**json.loads(raw))


def _config_from_json(path: pathlib.Path) -> GPT2Config | None:
    if not path.is_file():
        return None
    raw: dict[str, Any] = json.loads(path.read_text())
    names = {"vocab_size": "vocab_size", "n_positions": "n_ctx", "n_embd": "n_embd", "n_head": "n_head",
             "n_layer": "n_layer", "layer_norm_epsilon": "layer_norm_epsilon"}
    return GPT2Config(**{ours: raw[theirs] for theirs, ours in names.items() if theirs in raw})


# ---------------------------------------------------------------------- generation
def sample(logits: np.ndarray, temperature: float = 1.0, top_k: int | None = None,
           rng: np.random.Generator | None = None) -> np.ndarray:
    """One token id per row of logits (B, V): argmax for temperature <= 0, else a draw from
    softmax(logits / temperature) restricted to the top_k largest logits. Done on the host with numpy.
    TODO(merge): could move on device with Tensor.topk and a multinomial."""
    if temperature <= 0:
        return logits.argmax(-1)
    rng = rng or np.random.default_rng()
    scaled = logits.astype(np.float64) / temperature
    if top_k is not None and 0 < top_k < scaled.shape[-1]:
        kth = np.partition(scaled, -top_k, axis=-1)[:, -top_k, None]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    probs = np.exp(scaled - scaled.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs])


class Generator:
    """Text generation from a GPT2 with a KV cache. The prompt runs eagerly; each further token is one replay of a
    TinyJit'd step at the bound position `start_pos` (one capture serves every position)."""

    def __init__(self, model: GPT2, batch: int = 1, max_context: int | None = None) -> None:
        self.model, self.batch = model, batch
        self.cache = KVCache(model.config, batch, max_context or model.config.n_ctx)
        self.start_pos = Variable("start_pos", 1, self.cache.max_context - 1)
        self.token = Variable("token", 0, model.config.vocab_size - 1)
        self.step = TinyJit(self._step)

    def _step(self, tokens: Tensor | UOp, start_pos: UOp) -> Tensor:
        logits = self.model.forward(tokens, start_pos, self.cache)[:, -1, :]
        logits.realize(*self.cache.tensors())
        return logits

    def prefill(self, tokens: np.ndarray) -> np.ndarray:
        """Run the prompt (B, T) from position 0, filling the cache; the last position's logits (B, V)."""
        with no_grad():
            logits = self.model.forward(Tensor(tokens.astype(np.int32)), 0, self.cache)[:, -1, :]
            return logits.realize(*self.cache.tensors()).numpy()

    def next_logits(self, tokens: np.ndarray, position: int) -> np.ndarray:
        """Logits (B, V) of one token per row (B,) at `position` (>= 1), reading the cache before it."""
        with no_grad():
            arg: Tensor | UOp = self.token.bind(int(tokens[0])) if self.batch == 1 else \
                Tensor(tokens.astype(np.int32).reshape(-1, 1))
            return self.step(arg, self.start_pos.bind(position)).numpy()

    def generate(self, prompt: list[list[int]] | np.ndarray, max_new_tokens: int, temperature: float = 0.0,
                 top_k: int | None = None, rng: np.random.Generator | None = None) -> np.ndarray:
        """Prompt (B, T) int ids -> (B, T + max_new_tokens): the prompt followed by the sampled tokens."""
        toks = np.asarray(prompt, dtype=np.int64)
        if toks.ndim != 2 or toks.shape[0] != self.batch or toks.shape[1] < 1:
            raise ValueError(f"Generator.generate: prompt must be (batch={self.batch}, T>=1), got {toks.shape}")
        if toks.shape[1] + max_new_tokens > self.cache.max_context:
            raise ValueError(f"Generator.generate: {toks.shape[1]} prompt + {max_new_tokens} new tokens exceed "
                             f"max_context {self.cache.max_context}")
        out = [toks]
        if max_new_tokens <= 0:
            return toks
        logits = self.prefill(toks)
        for i in range(max_new_tokens):
            nxt = sample(logits, temperature, top_k, rng)
            out.append(nxt.reshape(-1, 1))
            if i + 1 < max_new_tokens:
                logits = self.next_logits(nxt, toks.shape[1] + i)
        return np.concatenate(out, axis=1)
