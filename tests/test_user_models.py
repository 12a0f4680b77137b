"""Small models as a new user writes them (tinygrad-style layers, optimisers, `Tensor.train()`, TinyJit; PyTorch
habits such as `loss.item()` after `opt.step()`), each checked against a numpy forward (always) and against the same
model in PyTorch with the same weights (gradients and a few optimiser steps, when PyTorch is installed). Every test
here is the regression test of a bug such a program found."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from torch_optional import torch

from glassgrad import Tensor, nn
from glassgrad.nn.state import get_parameters, get_state_dict


# ---------------------------------------------------------------------- helpers
def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _load_torch_weights(model: Any, torch_module: Any) -> None:
    """Copy a PyTorch module's state into a glassgrad model with the same keys (every key must be in both)."""
    ours, theirs = get_state_dict(model), torch_module.state_dict()
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for name, value in theirs.items():
        ours[name].assign(Tensor(value.detach().numpy().copy())).realize()


def _assert_state_matches(model: Any, torch_module: Any, atol: float = 1e-5) -> None:
    ours = get_state_dict(model)
    for name, value in torch_module.state_dict().items():
        np.testing.assert_allclose(ours[name].numpy(), value.detach().numpy(), atol=atol, rtol=1e-4, err_msg=name)


def _train_both(model: Any, torch_module: Any, loss: Callable[[Any], Any], torch_loss: Callable[[Any], Any],
                make_opt: Callable[[list[Tensor]], Any], make_torch_opt: Callable[[Any], Any], steps: int = 3) -> None:
    """`steps` steps of each model on its loss (PyTorch habits: zero_grad, backward, step, then item()); the losses
    and finally every state entry must agree."""
    opt, topt = make_opt(get_parameters(model)), make_torch_opt(torch_module.parameters())
    for _ in range(steps):
        topt.zero_grad()
        expected = torch_loss(torch_module)
        expected.backward()
        topt.step()
        with Tensor.train():
            opt.zero_grad()
            got = loss(model)
            got.backward()
            opt.step()
        assert got.item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-6)
    _assert_state_matches(model, torch_module)


# ---------------------------------------------------------------------- recurrent cells
@pytest.mark.parametrize("rows, cols", [(2, 17), (3, 18), (2, 23), (7, 31)])
def test_column_sum_of_a_row_of_17_to_31_lanes(rows: int, cols: int) -> None:
    """A column sum 17..31 wide (a Linear(., 18)'s bias gradient) became one row of SIMD lanes with no output loop
    left, and the register-tile heuristic then asked for the outermost output loop: IndexError at compile time."""
    a = _rand(rows, cols)
    np.testing.assert_allclose(Tensor(a).sum(0).numpy(), a.sum(0), atol=1e-5)



@pytest.mark.parametrize("shape, op", [((2, 3, 257), "max"), ((5, 4, 101), "min"), ((5, 2, 1021), "sum"),
                                       ((2, 4, 1021), "max")])
def test_reduction_over_the_first_axis_of_a_padded_row(shape: tuple[int, ...], op: str) -> None:
    """max(0) of (2, 3, 257) gave -inf everywhere (and sum(0) of (5, 2, 1021) zeros): gcc 12's -O2 rebased the
    register tile's accumulators on the output pointer in the loop of masked stores, then dropped the accumulation as
    a dead store. Found as softmax(0) giving NaN on a (100, 3, 257) tensor."""
    a = _rand(*shape)
    np.testing.assert_allclose(getattr(Tensor(a), op)(0).numpy(), getattr(a, op)(0), atol=1e-5, rtol=1e-5)

class _GRU:
    """A hand-written GRU unrolled over time, (T, B, I) -> (T, B, 2): gates by chunk and split."""

    def __init__(self, inputs: int, hidden: int) -> None:
        self.hidden = hidden
        self.ih, self.hh, self.out = nn.Linear(inputs, 3 * hidden), nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, 2)

    def __call__(self, x: Tensor) -> Tensor:
        h = Tensor.zeros(x.shape[1], self.hidden)
        outs = []
        for t in range(x.shape[0]):
            h = _gru_step(self.ih(x[t]), self.hh(h), h, self.hidden)
            outs.append(h)
        return self.out(Tensor.stack(*outs))


def _gru_step(gi: Any, gh: Any, h: Any, hidden: int) -> Any:
    """One GRU update from the input and hidden projections (glassgrad or torch tensors alike)."""
    ir, iz, i_n = gi.chunk(3, 1)
    hr, hz, h_n = gh.split(hidden, dim=1)
    r, z = (ir + hr).sigmoid(), (iz + hz).sigmoid()
    return (1 - z) * (i_n + r * h_n).tanh() + z * h


def _np_gru(params: dict[str, np.ndarray], x: np.ndarray, hidden: int) -> np.ndarray:
    sigmoid = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h, outs = np.zeros((x.shape[1], hidden), np.float64), []
    for t in range(x.shape[0]):
        gi = x[t] @ params["ih.weight"].T + params["ih.bias"]
        gh = h @ params["hh.weight"].T + params["hh.bias"]
        r = sigmoid(gi[:, :hidden] + gh[:, :hidden])
        z = sigmoid(gi[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
        n = np.tanh(gi[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
        h = (1 - z) * n + z * h
        outs.append(h)
    return np.stack(outs) @ params["out.weight"].T + params["out.bias"]


def test_hand_written_gru_trains_like_torch() -> None:
    """A GRU of hidden size 6 on a batch of 3: its 18-wide bias gradients hit the column-sum crash above."""
    hidden = 6
    model = _GRU(7, hidden)
    x = _rand(3, 3, 7).transpose(1, 0, 2)  # (T, B, I), fed as a permuted view
    params = {k: v.numpy().astype(np.float64) for k, v in get_state_dict(model).items()}
    xt = Tensor(np.ascontiguousarray(x.transpose(1, 0, 2))).permute(1, 0, 2)
    np.testing.assert_allclose(model(xt).numpy(), _np_gru(params, x, hidden), atol=1e-5)
    with Tensor.train():
        opt = nn.optim.SGD(get_parameters(model), lr=0.1)
        opt.zero_grad()
        model(xt).square().mean().backward()
        opt.step()
    assert model.hh.bias.grad is not None and model.hh.bias.grad.shape == (3 * hidden,)
    if torch is None:
        return
    tmodel = _TorchGRU(7, hidden)
    _load_torch_weights(model, tmodel)
    tx = torch.tensor(x)
    _train_both(model, tmodel, lambda m: m(xt).square().mean(), lambda m: m(tx).square().mean(),
                lambda p: nn.optim.AdamW(p, lr=0.01, weight_decay=0.1),
                lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1), steps=2)


if torch is not None:
    class _TorchGRU(torch.nn.Module):
        def __init__(self, inputs: int, hidden: int) -> None:
            super().__init__()
            self.hidden = hidden
            self.ih, self.hh = torch.nn.Linear(inputs, 3 * hidden), torch.nn.Linear(hidden, 3 * hidden)
            self.out = torch.nn.Linear(hidden, 2)

        def forward(self, x: Any) -> Any:
            h, outs = torch.zeros(x.shape[1], self.hidden), []
            for t in range(x.shape[0]):
                h = _gru_step(self.ih(x[t]), self.hh(h), h, self.hidden)
                outs.append(h)
            return self.out(torch.stack(outs))


# ---------------------------------------------------------------------- losses
def _np_cross_entropy(logits: np.ndarray, y: np.ndarray, weight: np.ndarray | None, ignore_index: int | None,
                      smoothing: float, reduction: str) -> np.ndarray:
    """PyTorch's cross_entropy of (N, C) logits against class indices, with class weights and ignore_index."""
    shifted = logits - logits.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    wc = np.ones(logits.shape[1], logits.dtype) if weight is None else weight
    keep = np.ones(y.shape, bool) if ignore_index is None else y != ignore_index
    safe = np.where(keep, y, 0)
    picked = np.take_along_axis(logp, safe[:, None], 1)[:, 0]
    sample_weight = wc[safe] * keep
    loss = -((1 - smoothing) * picked * sample_weight + smoothing * (logp * wc).mean(1) * keep)
    return {"mean": loss.sum() / sample_weight.sum(), "sum": loss.sum(), "none": loss}[reduction]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted, ignore_index, smoothing", [(False, -100, 0.0), (True, None, 0.0),
                                                               (True, -100, 0.1), (False, 3, 0.2)])
def test_cross_entropy_weight_and_ignore_index(weighted: bool, ignore_index: int | None, smoothing: float,
                                               reduction: str) -> None:
    """PyTorch's `weight=` and `ignore_index=` (padding labels of -100 in a sequence model's targets) were
    TypeErrors. Without them the loss is tinygrad's: -100 is then no class, not an ignored one."""
    logits, classes = _rand(9, 7), 7
    y = np.random.default_rng(1).integers(0, classes, 9)
    y[[0, 4]] = -100 if ignore_index == -100 else 3
    weight = np.linspace(0.5, 2.0, classes, dtype=np.float32) if weighted else None
    x = Tensor(logits, requires_grad=True)
    loss = x.cross_entropy(Tensor(y), reduction=reduction, label_smoothing=smoothing,
                           weight=None if weight is None else Tensor(weight), ignore_index=ignore_index)
    expected = _np_cross_entropy(logits, y, weight, ignore_index, smoothing, reduction)
    np.testing.assert_allclose(loss.numpy(), expected, atol=1e-5, rtol=1e-5)
    if torch is None:
        return
    tx = torch.tensor(logits, requires_grad=True)
    tloss = torch.nn.functional.cross_entropy(tx, torch.tensor(y), None if weight is None else torch.tensor(weight),
                                              ignore_index=-100 if ignore_index is None else ignore_index,
                                              reduction=reduction, label_smoothing=smoothing)
    loss.sum().backward()
    tloss.sum().backward()
    assert x.grad is not None
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-6)



# ---------------------------------------------------------------------- optimisers
def _np_adam(w0: np.ndarray, grads: np.ndarray, lr: float, b1: float, b2: float, weight_decay: float,
             decoupled: bool) -> np.ndarray:
    """PyTorch's Adam (AdamW with `decoupled`) in float64, bias corrections exact."""
    p, m, v = w0.astype(np.float64), np.zeros(w0.shape), np.zeros(w0.shape)
    for t, g in enumerate(grads.astype(np.float64), start=1):
        g = g if decoupled else g + weight_decay * p
        p = p * (1 - lr * weight_decay) if decoupled else p
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        p = p - lr / (1 - b1 ** t) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + 1e-8)
    return p


def _run_adam(opt_class: Any, grads: np.ndarray, w: Tensor, **kwargs: Any) -> np.ndarray:
    opt = opt_class([w], **kwargs)
    for g in grads:
        w.grad = Tensor(g)
        with Tensor.train():
            opt.step()
    return w.numpy()


@pytest.mark.parametrize("decoupled", [False, True])
def test_adam_bias_correction_is_float32_exact(decoupled: bool) -> None:
    """1 - b2**t was taken in float32, where b2 = 0.999 is 0.99900001: the correction was 1.3e-5 off and every step
    6e-6 too short, 4e-6 off PyTorch after 5 steps of lr 0.1 (PyTorch takes the power in double)."""
    rng = np.random.default_rng(0)
    w0, grads = rng.standard_normal(64).astype(np.float32), rng.standard_normal((5, 64)).astype(np.float32)
    got = _run_adam(nn.optim.AdamW if decoupled else nn.optim.Adam, grads, Tensor(w0), lr=0.1, weight_decay=0.1)
    np.testing.assert_allclose(got, _np_adam(w0, grads, 0.1, 0.9, 0.999, 0.1, decoupled), atol=5e-7, rtol=0)


@pytest.mark.parametrize("opt_class", ["Adam", "AdamW"])
def test_adam_takes_torch_betas_keyword(opt_class: str) -> None:
    """`Adam(params, lr, betas=(0.9, 0.98))`, PyTorch's spelling of tinygrad's b1, b2, was a TypeError."""
    rng = np.random.default_rng(1)
    w0, grads = rng.standard_normal(16).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)
    got = _run_adam(getattr(nn.optim, opt_class), grads, Tensor(w0), lr=0.05, betas=(0.8, 0.98), weight_decay=0.01)
    np.testing.assert_allclose(got, _np_adam(w0, grads, 0.05, 0.8, 0.98, 0.01, opt_class == "AdamW"), atol=5e-7)
