"""glassgrad.models.gpt2 on a tiny config: logits and gradients against a plain-PyTorch GPT-2 with the same weights,
Hugging Face-style safetensors through `from_pretrained`, KV-cached generation against full recomputation (one
JIT capture for every position), and sampling."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch_optional import F, needs_torch, torch

from glassgrad import Tensor, no_grad
from glassgrad.engine import realize
from glassgrad.models.gpt2 import (
    CONFIGS,
    GPT2,
    Generator,
    GPT2Config,
    causal_mask,
    config_from_state,
    glassgrad_to_hf,
    sample,
)
from glassgrad.nn.state import get_parameters, get_state_dict, safe_save

TINY = GPT2Config(vocab_size=61, n_ctx=16, n_embd=32, n_head=4, n_layer=2)
SEQ = 13  # the one sequence length of the full forwards here (kernels compiled once serve every test)
RNG = np.random.default_rng(17)


@pytest.fixture(scope="module")
def model() -> GPT2:
    Tensor.manual_seed(3)
    m = GPT2(TINY)
    with no_grad():  # (with gradients on, a later gradient would follow the assign's lineage to the old version)
        for t in get_parameters(m):  # LayerNorm weights/biases and biases away from 1/0 so they are checked too
            if t.ndim == 1:
                t.assign(Tensor(RNG.standard_normal(t.shape).astype(np.float32) * 0.1) + t).realize()
    return m


def hf_numpy(model: GPT2) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in glassgrad_to_hf(model).items()}


# ---------------------------------------------------------------------- the PyTorch reference
def torch_gpt2(w: dict[str, Any], cfg: GPT2Config, tokens: Any) -> Any:
    """GPT-2 in plain torch ops from HF-layout weights (Conv1D weights (in, out)): logits (B, T, V)."""
    b, t = tokens.shape
    d, nh = cfg.n_embd, cfg.n_head
    x = w["wte.weight"][tokens] + w["wpe.weight"][:t]
    causal = torch.ones(t, t, dtype=torch.bool).tril()

    def ln(h: Any, name: str) -> Any:
        return F.layer_norm(h, (d,), w[f"{name}.weight"], w[f"{name}.bias"], cfg.layer_norm_epsilon)

    for i in range(cfg.n_layer):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (z.reshape(b, t, nh, d // nh).transpose(1, 2) for z in qkv.split(d, dim=-1))
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // nh)
        att = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        x = x + att.transpose(1, 2).reshape(b, t, d) @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        hidden = F.gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + hidden @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


def tokens(b: int, t: int, vocab: int = TINY.vocab_size) -> np.ndarray:
    return RNG.integers(0, vocab, (b, t)).astype(np.int32)


# ---------------------------------------------------------------------- the network
def test_state_dict_has_hugging_faces_names(model: GPT2) -> None:
    names = set(get_state_dict(model))
    assert {"wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias", "h.1.ln_2.bias", "h.0.attn.c_attn.weight",
            "h.0.attn.c_proj.bias", "h.1.mlp.c_fc.weight", "h.1.mlp.c_proj.weight"} <= names
    assert len(names) == 4 + 12 * TINY.n_layer
    assert sum(t.numel() for t in get_parameters(model)) == TINY.num_params()
    assert get_state_dict(model)["h.0.attn.c_attn.weight"].shape == (3 * TINY.n_embd, TINY.n_embd)


def test_gpt2_init_statistics() -> None:
    cfg = GPT2Config(vocab_size=512, n_ctx=64, n_embd=128, n_head=2, n_layer=8)
    Tensor.manual_seed(0)
    sd = get_state_dict(GPT2(cfg))
    assert abs(sd["wte.weight"].numpy().std() - 0.02) < 0.001
    assert abs(sd["h.3.mlp.c_fc.weight"].numpy().std() - 0.02) < 0.001
    assert abs(sd["h.3.mlp.c_proj.weight"].numpy().std() - 0.02 / math.sqrt(16)) < 0.0005
    assert abs(sd["h.3.attn.c_proj.weight"].numpy().std() - 0.02 / math.sqrt(16)) < 0.0005
    assert not sd["h.3.attn.c_attn.bias"].numpy().any() and (sd["ln_f.weight"].numpy() == 1).all()


def test_published_configs() -> None:
    assert round(CONFIGS["gpt2"].num_params() / 1e6) == 124
    assert round(CONFIGS["gpt2-medium"].num_params() / 1e6) == 355
    assert round(CONFIGS["gpt2-large"].num_params() / 1e6) == 774
    assert round(CONFIGS["gpt2-xl"].num_params() / 1e6) == 1558
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPT2Config(n_embd=30, n_head=4)


@needs_torch
def test_logits_match_pytorch(model: GPT2) -> None:
    x = tokens(2, SEQ)
    ours = model(Tensor(x)).numpy()
    w = {k: torch.tensor(v) for k, v in hf_numpy(model).items()}
    ref = torch_gpt2(w, TINY, torch.tensor(x, dtype=torch.long)).numpy()
    assert ours.shape == (2, SEQ, TINY.vocab_size)
    np.testing.assert_allclose(ours, ref, atol=1e-5, rtol=1e-5)


@needs_torch
def test_loss_gradients_match_pytorch(model: GPT2) -> None:
    x, y = tokens(2, SEQ), tokens(2, SEQ)
    loss = model(Tensor(x)).sparse_categorical_crossentropy(Tensor(y))
    names = list(get_state_dict(model))
    grads = loss.gradient(*get_state_dict(model).values())
    w = {k: torch.tensor(v, requires_grad=True) for k, v in hf_numpy(model).items()}
    logits = torch_gpt2(w, TINY, torch.tensor(x, dtype=torch.long))
    ref_loss = F.cross_entropy(logits.reshape(-1, TINY.vocab_size), torch.tensor(y, dtype=torch.long).reshape(-1))
    ref_loss.backward()
    np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-5)
    for name, g in zip(names, grads):
        ref = w[name].grad.numpy()
        ref = ref.T if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")) else ref
        np.testing.assert_allclose(g.numpy(), ref, atol=2e-6, rtol=1e-4, err_msg=name)


def test_causal_mask_with_an_offset() -> None:
    expected = np.arange(5)[None, :] <= np.arange(3)[:, None] + 2
    np.testing.assert_array_equal(causal_mask(3, 2).numpy(), expected)


def test_bad_token_shapes_and_positions(model: GPT2) -> None:
    with pytest.raises(ValueError, match="batch, time"):
        model(Tensor(np.zeros(4, np.int32)))
    with pytest.raises(ValueError, match="exceed n_ctx"):
        model(Tensor(np.zeros((1, TINY.n_ctx + 1), np.int32)))


# ---------------------------------------------------------------------- weights
def write_hf_checkpoint(model: GPT2, folder: Path, with_config: bool) -> Path:
    """model.safetensors as Hugging Face's GPT2LMHeadModel writes it: `transformer.` prefix, Conv1D weights
    (in, out), a tied lm_head.weight, the old attn.bias mask buffers; config.json if asked."""
    tensors = {f"transformer.{k}": Tensor(v) for k, v in hf_numpy(model).items()}
    tensors["lm_head.weight"] = Tensor(model.wte.weight.numpy())
    c = model.config
    for i in range(c.n_layer):
        tensors[f"transformer.h.{i}.attn.bias"] = Tensor(np.tril(np.ones((1, 1, c.n_ctx, c.n_ctx), np.float32)))
    path = folder / "model.safetensors"
    safe_save(tensors, path, metadata={"format": "pt"})
    if with_config:
        (folder / "config.json").write_text(json.dumps({
            "model_type": "gpt2", "vocab_size": c.vocab_size, "n_positions": c.n_ctx, "n_embd": c.n_embd,
            "n_head": c.n_head, "n_layer": c.n_layer, "layer_norm_epsilon": c.layer_norm_epsilon}))
    return path


def test_from_pretrained_round_trip(model: GPT2, tmp_path: Path) -> None:
    path = write_hf_checkpoint(model, tmp_path, with_config=True)
    loaded = GPT2.from_pretrained(tmp_path)  # a folder: its model.safetensors and config.json
    assert loaded.config == TINY
    for name, t in get_state_dict(model).items():
        np.testing.assert_array_equal(get_state_dict(loaded)[name].numpy(), t.numpy(), err_msg=name)
    x = tokens(1, SEQ)
    np.testing.assert_allclose(loaded(Tensor(x)).numpy(), model(Tensor(x)).numpy(), atol=1e-6)
    assert GPT2.from_pretrained(path).config == TINY


def test_save_pretrained_keeps_the_config(model: GPT2, tmp_path: Path) -> None:
    """n_head of TINY cannot be inferred from shapes (32 // 64): it comes from the file's metadata."""
    model.save_pretrained(tmp_path / "tiny.safetensors")
    loaded = GPT2.from_pretrained(tmp_path / "tiny.safetensors")
    assert loaded.config == TINY
    np.testing.assert_array_equal(loaded.h[1].mlp.c_fc.weight.numpy(), model.h[1].mlp.c_fc.weight.numpy())


def test_from_pretrained_infers_the_config(tmp_path: Path) -> None:
    cfg = GPT2Config(vocab_size=40, n_ctx=8, n_embd=128, n_head=2, n_layer=3)
    Tensor.manual_seed(1)
    model = GPT2(cfg)
    loaded = GPT2.from_pretrained(write_hf_checkpoint(model, tmp_path, with_config=False))
    assert loaded.config == cfg
    np.testing.assert_array_equal(loaded.h[2].attn.c_attn.weight.numpy(), model.h[2].attn.c_attn.weight.numpy())


def test_from_pretrained_rejects_other_files(tmp_path: Path) -> None:
    safe_save({"weight": Tensor(np.ones((2, 2), np.float32))}, tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="not a GPT-2 checkpoint"):
        GPT2.from_pretrained(tmp_path / "x.safetensors")
    with pytest.raises(ValueError, match="wte"):
        config_from_state({})


# ---------------------------------------------------------------------- generation
@pytest.mark.parametrize("batch", [1, 2])
def test_cached_generation_equals_full_recomputation(model: GPT2, batch: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy tokens and logits from the KV cache equal those of the full forward (no cache) over the sequence: the
    model is causal, so position t of one full forward is what recomputing everything up to token t gives (tested
    against PyTorch above). The per-token step is captured once: after its first two calls no kernel is rendered,
    at any position. Batch 1 passes the token as a bound Variable, batch 2 as a tensor."""
    prompt, n = tokens(batch, 3), SEQ - 3
    gen = Generator(model, batch=batch, max_context=TINY.n_ctx)
    rendered: list[int] = []
    render = realize._render

    def counting_render(device: str, ast: Any) -> Any:
        rendered.append(gen.step.captures)
        return render(device, ast)

    monkeypatch.setattr(realize, "_render", counting_render)
    out = gen.generate(prompt, n)
    assert gen.step.captures == 1 and rendered and not any(rendered), "a kernel was compiled after the capture"
    monkeypatch.setattr(realize, "_render", render)
    full = model(Tensor(out.astype(np.int32))).numpy()  # (B, SEQ, V)
    np.testing.assert_array_equal(out[:, 3:], full[:, 2:-1].argmax(-1))
    # the cached logits themselves, position by position (a fresh prefill overwrites the cache from 0)
    cached = [gen.prefill(out[:, :3])] + [gen.next_logits(out[:, pos], pos) for pos in range(3, SEQ)]
    np.testing.assert_allclose(np.stack(cached, 1), full[:, 2:], atol=1e-5, rtol=1e-5)
    assert gen.step.captures == 1


def test_generation_limits(model: GPT2) -> None:
    gen = Generator(model, max_context=8)
    with pytest.raises(ValueError, match="exceed max_context 8"):
        gen.generate(tokens(1, 4), 5)
    with pytest.raises(ValueError, match="prompt must be"):
        gen.generate(tokens(2, 4), 1)


def test_sampling() -> None:
    logits = RNG.standard_normal((3, 50)).astype(np.float32)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(sample(logits, 0.0), logits.argmax(-1))
    np.testing.assert_array_equal(sample(logits, 1.0, top_k=1, rng=rng), logits.argmax(-1))
    top3 = np.argsort(logits, -1)[:, -3:]
    draws = np.stack([sample(logits, 2.0, top_k=3, rng=rng) for _ in range(200)])
    for row in range(3):
        assert set(draws[:, row]) == set(top3[row])  # only (and, with 200 draws at T=2, all of) the top 3
    # temperature: frequencies follow softmax(logits / T)
    two = np.array([[0.0, 1.0]], np.float32)
    freq = np.mean([sample(two, 0.5, rng=rng)[0] for _ in range(4000)])
    assert abs(freq - 1 / (1 + math.exp(-2))) < 0.03
