"""glassgrad.amp: autocast (half compute over float32 masters) and GradScaler (PyTorch's loss scaling, decided on the
device), the optimisers' device-side skip, a small GPT-2 in bfloat16/float16 against float32, TinyJit against eager,
and the bfloat16 training step's kernels rendered for CUDA: every one compiles for sm_90 (NVRTC, no GPU needed) and
the linear layers' matmuls take the tensor-core path (mma)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from torch_optional import needs_torch, torch

from glassgrad import Tensor, TinyJit, amp, dtypes, kernels, nn
from glassgrad.models.gpt2 import GPT2, GPT2Config
from glassgrad.nn import optim
from glassgrad.nn.state import get_parameters

HALVES = [dtypes.bfloat16, dtypes.float16]
TINY = GPT2Config(vocab_size=64, n_ctx=16, n_embd=32, n_head=4, n_layer=2)
RNG = np.random.default_rng(5)


def rounded(a: np.ndarray, dt: Any) -> np.ndarray:
    """a rounded to float16/bfloat16 (through glassgrad's own cast, checked elsewhere against numpy's bits)."""
    return Tensor(a.astype(np.float32)).cast(dt).float().numpy()


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


# ---------------------------------------------------------------------- autocast
def test_autocast_context_nests_and_restores() -> None:
    assert amp.compute_dtype() is None
    with amp.autocast(dtypes.bfloat16):
        assert amp.compute_dtype() == dtypes.bfloat16
        with amp.autocast(dtypes.float16):
            assert amp.compute_dtype() == dtypes.float16
            with amp.autocast(enabled=False):
                assert amp.compute_dtype() is None
            assert amp.compute_dtype() == dtypes.float16
        assert amp.compute_dtype() == dtypes.bfloat16
    assert amp.compute_dtype() is None

    @amp.autocast("float16")
    def inside() -> Any:
        return amp.compute_dtype()
    assert inside() == dtypes.float16 and amp.compute_dtype() is None


def test_autocast_rejects_other_dtypes() -> None:
    for bad in (dtypes.float32, dtypes.int32, "float64"):
        with pytest.raises(ValueError, match="float16 or bfloat16"):
            amp.autocast(bad)


@pytest.mark.parametrize("dt", HALVES)
def test_linear_forward_and_grads(dt: Any) -> None:
    """Under autocast: out = round(round(x) @ round(w) + round(b)) in the half dtype; the float32 inputs' grads are
    float32, and equal the half-precision chain rule's (dout rounded, products accumulated in float32)."""
    x, w, b = (RNG.standard_normal(s).astype(np.float32) for s in ((5, 24), (24, 7), (7,)))
    dout = RNG.standard_normal((5, 7)).astype(np.float32)
    tx, tw, tb = (Tensor(a, requires_grad=True) for a in (x, w, b))
    with amp.autocast(dt):
        out = amp.linear(tx, tw, tb)
    assert out.dtype == dt
    (out.float() * Tensor(dout)).sum().backward()
    assert tx.grad is not None and tw.grad is not None and tb.grad is not None
    assert tx.grad.dtype == tw.grad.dtype == tb.grad.dtype == dtypes.float32
    xr, wr, br = rounded(x, dt), rounded(w, dt), rounded(b, dt)
    tol = 1e-2 if dt == dtypes.bfloat16 else 2e-3
    assert rel_err(out.float().numpy(), xr @ wr + br) < tol
    dr = rounded(dout, dt)
    assert rel_err(tx.grad.numpy(), dr @ wr.T) < tol
    assert rel_err(tw.grad.numpy(), xr.T @ dr) < tol
    assert rel_err(tb.grad.numpy(), dr.sum(0)) < tol
    # outside autocast the same call is Tensor.linear, in float32
    np.testing.assert_allclose(amp.linear(Tensor(x), Tensor(w), Tensor(b)).numpy(), x @ w + b, rtol=1e-5, atol=1e-5)


def test_matmul_keeps_ints_and_casts_floats() -> None:
    a = RNG.standard_normal((4, 8)).astype(np.float32)
    with amp.autocast(dtypes.bfloat16):
        out = amp.matmul(Tensor(a), Tensor(a.T.copy()))
    assert out.dtype == dtypes.bfloat16
    ar = rounded(a, dtypes.bfloat16)
    assert rel_err(out.float().numpy(), ar @ ar.T) < 1e-2


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


@pytest.mark.parametrize("dt", HALVES)
@pytest.mark.parametrize("kind", ["causal", "bool", "float", "none"])
def test_attention_matches_float32(dt: Any, kind: str) -> None:
    q, k, v = (RNG.standard_normal((2, 3, 6, 8)).astype(np.float32) for _ in range(3))
    tril = np.tril(np.ones((6, 6), bool))
    mask: Tensor | None = None
    if kind == "bool":
        mask = Tensor(tril)
    elif kind == "float":
        mask = Tensor(np.where(tril, 0.0, -np.inf).astype(np.float32))
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    with amp.autocast(dt):
        out = amp.attention(tq, tk, tv, attn_mask=mask, is_causal=kind == "causal")
    assert out.dtype == dt
    want = attention_ref(q, k, v, None if kind == "none" else tril)
    tol = 3e-2 if dt == dtypes.bfloat16 else 5e-3
    assert rel_err(out.float().numpy(), want) < tol
    # gradients flow back to the float32 q, k, v as float32, close to float32 attention's
    out.float().sum().backward()
    rq, rk, rv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    rq.scaled_dot_product_attention(rk, rv, is_causal=kind != "none").sum().backward()
    for got, ref in ((tq, rq), (tk, rk), (tv, rv)):
        assert got.grad is not None and ref.grad is not None and got.grad.dtype == dtypes.float32
        assert rel_err(got.grad.numpy(), ref.grad.numpy()) < 4 * tol


def test_attention_rejects_mask_and_causal() -> None:
    q = Tensor.ones(1, 2, 4)
    with amp.autocast(dtypes.bfloat16), pytest.raises(ValueError, match="not both"):
        amp.attention(q, q, q, attn_mask=Tensor.ones(2, 2).cast(dtypes.bool), is_causal=True)


def test_nn_linear_under_autocast() -> None:
    layer = nn.Linear(12, 5)
    x = Tensor(RNG.standard_normal((3, 12)).astype(np.float32))
    with amp.autocast(dtypes.bfloat16):
        out = layer(x)
    assert out.dtype == dtypes.bfloat16 and layer.weight.dtype == dtypes.float32
    assert layer(x).dtype == dtypes.float32
    assert rel_err(out.float().numpy(), layer(x).numpy()) < 1e-2


# ---------------------------------------------------------------------- a small GPT-2
@pytest.fixture(scope="module")
def gpt() -> GPT2:
    Tensor.manual_seed(11)
    return GPT2(TINY)


def tokens(b: int = 2, t: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, (b, t + 1)).astype(np.int32)


def loss_and_grads(model: GPT2, data: np.ndarray, dt: Any | None) -> tuple[np.ndarray, float, list[np.ndarray]]:
    params = get_parameters(model)
    for p in params:
        p.grad = None
        p.requires_grad_(True)
    with amp.autocast(dt or dtypes.bfloat16, enabled=dt is not None):
        logits = model(Tensor(data[:, :-1]))
    assert logits.dtype == dtypes.float32
    loss = logits.sparse_categorical_crossentropy(Tensor(data[:, 1:]))
    loss.backward()
    grads = []
    for p in params:
        assert p.grad is not None and p.grad.dtype == dtypes.float32 and p.dtype == dtypes.float32
        grads.append(p.grad.numpy())
    return logits.numpy(), float(loss.item()), grads


@pytest.mark.parametrize("dt", HALVES)
def test_gpt2_half_matches_float32(gpt: GPT2, dt: Any) -> None:
    data = tokens()
    ref_logits, ref_loss, ref_grads = loss_and_grads(gpt, data, None)
    logits, loss, grads = loss_and_grads(gpt, data, dt)
    assert not np.array_equal(logits, ref_logits)  # it did compute in the half dtype
    tol = 2e-2 if dt == dtypes.bfloat16 else 3e-3
    assert rel_err(logits, ref_logits) < tol
    assert abs(loss - ref_loss) < tol * abs(ref_loss)
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) < 10 * tol, f"{g.shape}: {rel_err(g, r)}"


@needs_torch
def test_gpt2_bf16_close_to_torch_autocast(gpt: GPT2) -> None:
    """PyTorch's autocast on the same weights and the same (explicit) ops: the logits agree to bfloat16's precision
    at least as well as either agrees with float32."""
    data = tokens(seed=1)
    w = {k: torch.tensor(v.numpy()) for k, v in nn.state.get_state_dict(gpt).items()}
    idx = torch.tensor(data[:, :-1], dtype=torch.long)

    def torch_forward() -> Any:
        b, t = idx.shape
        x = w["wte.weight"][idx] + w["wpe.weight"][:t]
        nh, d = TINY.n_head, TINY.n_embd
        F = torch.nn.functional
        for i in range(TINY.n_layer):
            p = f"h.{i}."
            h = F.layer_norm(x, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"])
            qkv = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
            q, k, v = (z.view(b, t, nh, -1).transpose(1, 2) for z in qkv.split(d, -1))
            s = (q @ k.transpose(-1, -2)).float() / math.sqrt(d // nh)
            s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
            a = (s.softmax(-1).to(v.dtype) @ v).transpose(1, 2).reshape(b, t, d)
            x = x + F.linear(a, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
            h = F.layer_norm(x, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"])
            h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")
            x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
        return (F.layer_norm(x, (d,), w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T).float()

    with torch.autocast("cpu", torch.bfloat16):
        want = torch_forward().numpy()
    with amp.autocast(dtypes.bfloat16):
        got = gpt(Tensor(data[:, :-1])).numpy()
    exact = gpt(Tensor(data[:, :-1])).numpy()
    assert rel_err(got, want) < 2e-2
    assert rel_err(got, want) < 2 * max(rel_err(got, exact), rel_err(want, exact))


def train_steps(dt: Any | None, steps: int, jit: bool, scaler: amp.GradScaler | None = None,
                seed: int = 4) -> list[float]:
    """Losses of `steps` AdamW steps on one fixed batch (fresh model), as examples/gpt2.py's step does them."""
    Tensor.manual_seed(seed)
    model = GPT2(TINY)
    opt = optim.AdamW(get_parameters(model), lr=3e-3)

    @Tensor.train()
    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        with amp.autocast(dt or dtypes.bfloat16, enabled=dt is not None):
            loss = model(x).sparse_categorical_crossentropy(y)
        if scaler is None:
            loss.backward()
            return loss.realize(*opt.schedule_step())
        scaler.scale(loss).backward()
        return loss.realize(*scaler.schedule_step(opt), *scaler.schedule_update())
    run = TinyJit(step) if jit else step
    data = tokens(4, 12, seed=2)
    x, y = Tensor(data[:, :-1]).realize(), Tensor(data[:, 1:]).realize()
    return [float(run(x, y).item()) for _ in range(steps)]


def test_bf16_training_lowers_the_loss() -> None:
    losses = train_steps(dtypes.bfloat16, 8, jit=True)
    assert losses[-1] < losses[0] - 0.5, losses
    ref = train_steps(None, 8, jit=True)
    assert abs(losses[-1] - ref[-1]) < 0.1 * ref[0], (losses, ref)


def test_fp16_scaled_training_jit_matches_eager() -> None:
    eager_scaler, jit_scaler = amp.GradScaler(growth_interval=3), amp.GradScaler(growth_interval=3)
    eager = train_steps(dtypes.float16, 6, jit=False, scaler=eager_scaler)
    jitted = train_steps(dtypes.float16, 6, jit=True, scaler=jit_scaler)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
    assert eager[-1] < eager[0] - 0.5
    assert eager_scaler.state_dict() == jit_scaler.state_dict()
    assert jit_scaler.get_scale() == 2.0 ** 16 * 2 ** 2  # no inf in 6 steps: grown at steps 3 and 6


# ---------------------------------------------------------------------- GradScaler
def scripted_inputs() -> list[np.ndarray]:
    """One input per step; steps 2, 3 and 8 make a gradient infinite or NaN."""
    out = [RNG.standard_normal(6).astype(np.float32) for _ in range(11)]
    out[2][1], out[3][4], out[8][0] = np.inf, np.nan, -np.inf
    return out


def run_glassgrad_scaler(inputs: list[np.ndarray], jit: bool, start: np.ndarray | None = None,
                         **kw: Any) -> tuple[list[float], list[np.ndarray]]:
    w = Tensor(np.linspace(-1, 1, 6).astype(np.float32) if start is None else start, requires_grad=True)
    opt = optim.Adam([w], lr=0.1)
    scaler = amp.GradScaler(**kw)

    @Tensor.train()
    def step(x: Tensor) -> Tensor:
        opt.zero_grad()
        loss = (w * x).sum() + (w * w).sum()
        scaler.scale(loss).backward()
        return loss.realize(*scaler.schedule_step(opt), *scaler.schedule_update())
    run = TinyJit(step) if jit else step
    scales, weights = [], []
    for a in inputs:
        run(Tensor(a).realize())
        scales.append(scaler.get_scale())
        weights.append(w.numpy().copy())
    return scales, weights


def hand_scales(bad: set[int], steps: int, init: float, interval: int) -> list[float]:
    scale, good, out = init, 0, []
    for i in range(steps):
        if i in bad:
            scale, good = scale * 0.5, 0
        else:
            good += 1
            if good == interval:
                scale, good = scale * 2, 0
        out.append(scale)
    return out


@pytest.mark.parametrize("jit", [False, True])
def test_scaler_follows_pytorch_semantics(jit: bool) -> None:
    inputs = scripted_inputs()
    scales, weights = run_glassgrad_scaler(inputs, jit, init_scale=2.0 ** 10, growth_interval=2)
    assert scales == hand_scales({2, 3, 8}, len(inputs), 2.0 ** 10, 2)
    # a skipped step changes nothing: not the weights, not Adam's moments or step count (the next step shows it)
    np.testing.assert_array_equal(weights[2], weights[1])
    np.testing.assert_array_equal(weights[3], weights[1])
    np.testing.assert_array_equal(weights[8], weights[7])
    assert np.isfinite(np.stack(weights)).all()
    if torch is not None:
        tw = torch.tensor(np.linspace(-1, 1, 6).astype(np.float32), requires_grad=True)
        topt = torch.optim.Adam([tw], lr=0.1)
        tscaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
        for i, a in enumerate(inputs):
            topt.zero_grad()
            loss = (tw * torch.tensor(a)).sum() + (tw * tw).sum()
            tscaler.scale(loss).backward()
            tscaler.step(topt)
            tscaler.update()
            assert tscaler.get_scale() == scales[i], i
            np.testing.assert_allclose(weights[i], tw.detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=f"step {i}")


def test_scaler_never_grows_to_infinity() -> None:
    zeros = np.zeros(6, np.float32)  # a zero loss: every gradient is 0, finite at any scale
    scales, _ = run_glassgrad_scaler([zeros] * 3, False, zeros, init_scale=2.0 ** 126, growth_interval=1)
    assert scales == [2.0 ** 127] * 3


def test_scaler_unscale_then_clip() -> None:
    """unscale_ replaces .grad with the true gradient (before clipping, as in PyTorch); a second unscale_ in one
    iteration is an error; step() does not unscale twice."""
    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    opt = optim.SGD([w], lr=1.0)
    scaler = amp.GradScaler(init_scale=8.0)
    with Tensor.train():
        scaler.scale((w * Tensor([1.0, 2.0, 3.0])).sum()).backward()
        scaler.unscale_(opt)
        assert w.grad is not None
        np.testing.assert_array_equal(w.grad.numpy(), [1, 2, 3])
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
    np.testing.assert_array_equal(w.numpy(), [0, -1, -2])
    with pytest.raises(RuntimeError, match="no step since the last update"):
        scaler.update()


def test_scaler_disabled_is_a_pass_through() -> None:
    w = Tensor(np.ones(2, np.float32), requires_grad=True)
    opt = optim.SGD([w], lr=0.5)
    scaler = amp.GradScaler(enabled=False)
    with Tensor.train():
        loss = (w * 3).sum()
        assert scaler.scale(loss) is loss
        loss.backward()
        scaler.step(opt)
        scaler.update()
    np.testing.assert_array_equal(w.numpy(), [-0.5, -0.5])
    assert scaler.get_scale() == 1.0


def test_scaler_rejects_bad_arguments() -> None:
    for kw in ({"init_scale": 0.0}, {"init_scale": math.inf}, {"growth_factor": 1.0}, {"backoff_factor": 1.0},
               {"growth_interval": 0}, {"growth_interval": 2.5}):
        with pytest.raises(ValueError):
            amp.GradScaler(**kw)
    w = Tensor(np.ones(2, np.float32), requires_grad=True)
    with pytest.raises(RuntimeError, match="no gradient"):
        amp.GradScaler().unscale_(optim.SGD([w], lr=0.1))


def test_scaler_state_dict_round_trip() -> None:
    a = amp.GradScaler(init_scale=64.0, growth_interval=5)
    b = amp.GradScaler()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() == {"scale": 64.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                                                 "growth_interval": 5, "_growth_tracker": 0}


# ---------------------------------------------------------------------- the optimisers' skip
@pytest.mark.parametrize("make", [lambda p: optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
                                  lambda p: optim.Adam(p, lr=0.1), lambda p: optim.AdamW(p, lr=0.1),
                                  lambda p: optim.LAMB(p, lr=0.1)], ids=["sgd", "adam", "adamw", "lamb"])
def test_optimizer_skip(make: Any) -> None:
    """skip=True leaves params and state as they were; skip=False is the plain step, bit for bit."""
    start = RNG.standard_normal((2, 3)).astype(np.float32)
    grad = RNG.standard_normal((2, 3)).astype(np.float32)

    def run(skips: list[bool | None]) -> tuple[np.ndarray, list[np.ndarray]]:
        w = Tensor(start.copy(), requires_grad=True)
        opt = make([w])
        with Tensor.train():
            for s in skips:
                w.grad = Tensor(grad)
                Tensor.realize_all(*opt.schedule_step(None if s is None else Tensor(s)))
        return w.numpy(), [t.numpy() for t in opt.state()]
    plain, plain_state = run([None, None])
    kept, kept_state = run([None, True, None])
    unskipped, unskipped_state = run([False, False])
    np.testing.assert_array_equal(kept, plain)
    np.testing.assert_array_equal(unskipped, plain)
    for a, b, c in zip(kept_state, plain_state, unskipped_state):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(c, b)
    with pytest.raises(ValueError, match="one-element"):
        w = Tensor(start.copy(), requires_grad=True)
        w.grad = Tensor(grad)
        with Tensor.train():
            make([w]).schedule_step(Tensor([True, False]))


# ---------------------------------------------------------------------- CUDA kernels of the bfloat16 step
def test_bf16_train_step_cuda_kernels(nvrtc: Any) -> None:
    """The whole bfloat16 training step (forward, backward, AdamW) rendered for CUDA: every kernel compiles for
    sm_90, and each linear layer's matmuls (forward, input gradient, weight gradient; also the LM head and q @ k^T)
    run on tensor cores. Sizes are whole 128-tiles, as GPT-2 124M's are (with its vocab padded to 50304)."""
    cfg = GPT2Config(vocab_size=256, n_ctx=128, n_embd=128, n_head=2, n_layer=1)
    b, t = 1, 128
    Tensor.manual_seed(0)
    model = GPT2(cfg)
    opt = optim.AdamW(get_parameters(model), lr=1e-3)
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t + 1)).astype(np.int32)
    with Tensor.train():
        with amp.autocast(dtypes.bfloat16):
            loss = model(Tensor(data[:, :-1])).sparse_categorical_crossentropy(Tensor(data[:, 1:]))
        loss.backward()
        updates = opt.schedule_step()
        specs = kernels(loss, *updates, device="CUDA")
        Tensor.realize_all(loss, *updates)  # and it runs (on the CPU)
    assert np.isfinite(loss.item())
    for spec in specs:
        binary = nvrtc.compile_cached(spec.source)
        assert binary.startswith(b"\x7fELF"), spec.name
    mma = {s.name for s in specs if "mma.sync" in s.source or "wgmma.mma_async" in s.source}
    d, v, rows = cfg.n_embd, cfg.vocab_size, b * t
    linears = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d), (v, d)]  # (out, in): c_attn, c_proj, c_fc, proj, head
    expected = {f"r_{rows}_{n}_{k}" for n, k in linears[1:]} | {f"r_{rows}_{k}_{n}" for n, k in linears} | \
        {f"r_{n}_{k}_{rows}" for n, k in linears} | {f"r_{cfg.n_head}_{t}_{t}_{cfg.head_dim}"}
    # c_attn's forward writes q, k and v in the heads' layout (3, heads, t, head_dim) that q @ k^T and p @ v read
    expected.add(f"r_3_{cfg.n_head}_{t}_{cfg.head_dim}_{d}")
    names = {s.name for s in specs}
    assert expected <= names, f"kernel names changed: {sorted(expected - names)} not in {sorted(names)}"
    assert expected <= mma, f"not on tensor cores: {sorted(expected - mma)}"


# ---------------------------------------------------------------------- activations on half tensors
ACTIVATIONS: dict[str, tuple[Any, Any]] = {  # name: (glassgrad, float64 reference)
    "gelu": (lambda t: t.gelu(), lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    "gelu exact": (lambda t: t.gelu(approximate="none"),
                   lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))),
    "sigmoid": (lambda t: t.sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    "tanh": (lambda t: t.tanh(), np.tanh),
    "silu": (lambda t: t.silu(), lambda x: x / (1 + np.exp(-x))),
    "softplus": (lambda t: t.softplus(), lambda x: np.log1p(np.exp(x))),
    "elu": (lambda t: t.elu(), lambda x: np.where(x > 0, x, np.expm1(x))),
    "mish": (lambda t: t.mish(), lambda x: x * np.tanh(np.log1p(np.exp(x)))),
    "erf": (lambda t: t.erf(), np.vectorize(math.erf)),
}


@pytest.mark.parametrize("dt", HALVES, ids=str)
@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activations_on_half_tensors_round_once(name: str, dt: Any) -> None:
    """An activation of a float16/bfloat16 tensor is computed in float32 and rounded once, as PyTorch's kernels do:
    within one ulp of the exact value rounded (rounded after every op, about half of the values of a bf16 GELU were
    off by up to several ulps), and the gradient likewise."""
    fn, ref = ACTIVATIONS[name]
    x = rounded(np.linspace(-4, 4, 801), dt).astype(np.float32)
    t = Tensor(x).cast(dt)
    out = fn(t)
    assert out.dtype == dt
    exact = ref(x.astype(np.float64))
    ulp = 2.0 ** -(7 if dt == dtypes.bfloat16 else 10)
    assert np.all(np.abs(out.float().numpy() - exact) <= ulp * np.maximum(np.abs(exact), 2.0 ** -14) + 1e-30)
    if torch is not None and name in ("gelu", "sigmoid", "tanh", "silu"):
        tdt = torch.bfloat16 if dt == dtypes.bfloat16 else torch.float16
        tx = torch.tensor(x).to(tdt).requires_grad_()
        tout = {"gelu": lambda v: torch.nn.functional.gelu(v, approximate="tanh"), "sigmoid": torch.sigmoid,
                "tanh": torch.tanh, "silu": torch.nn.functional.silu}[name](tx)
        np.testing.assert_array_equal(out.float().numpy(), tout.float().detach().numpy())  # bit for bit
    if torch is not None and name in ("gelu", "silu"):  # (PyTorch's sigmoid and tanh gradients use the rounded output)
        tdt = torch.bfloat16 if dt == dtypes.bfloat16 else torch.float16
        tx = torch.tensor(x).to(tdt).requires_grad_()
        tout = torch.nn.functional.gelu(tx, approximate="tanh") if name == "gelu" else torch.nn.functional.silu(tx)
        g = rounded(np.cos(x), dt)
        tout.backward(torch.tensor(g).to(tdt))
        leaf = Tensor(x).cast(dt).realize()
        leaf.requires_grad = True
        (fn(leaf).float() * Tensor(g)).sum().backward()
        assert leaf.grad is not None
        diff = np.abs(leaf.grad.float().numpy() - tx.grad.float().numpy())
        assert np.all(diff <= 2 * ulp * np.maximum(np.abs(tx.grad.float().numpy()), 2.0 ** -14))


@pytest.mark.parametrize("dt", HALVES, ids=str)
@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp", "layernorm"])
def test_row_ops_on_half_tensors_compute_in_float32(name: str, dt: Any) -> None:
    """softmax, log_softmax, logsumexp and layernorm of a float16/bfloat16 tensor are computed in float32 and rounded
    once (PyTorch's half kernels): within one ulp of the float64 value rounded (op by op in bf16, most of a
    softmax's values were off). An explicit `dtype=` still computes in that dtype."""
    x = rounded(RNG.standard_normal((16, 300)) * 3, dt).astype(np.float64)
    m = x.max(-1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(-1, keepdims=True))
    centered = x - x.mean(-1, keepdims=True)
    exact = {"softmax": np.exp(x - lse), "log_softmax": x - lse, "logsumexp": lse[:, 0],
             "layernorm": centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + 1e-5)}[name]
    out = getattr(Tensor(x.astype(np.float32)).cast(dt), name)(-1)
    assert out.dtype == dt
    ulp = 2.0 ** -(7 if dt == dtypes.bfloat16 else 10)
    assert np.all(np.abs(out.float().numpy() - exact) <= ulp * np.abs(exact) + 1e-6)
    if name == "softmax":
        assert Tensor(x.astype(np.float32)).cast(dt).softmax(-1, dtype=dtypes.float32).dtype == dtypes.float32
