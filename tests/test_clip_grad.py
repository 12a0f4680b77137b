"""`glassgrad.nn.utils.clip_grad_norm_` / `clip_grad_value_`, PyTorch's gradient clipping (`torch.nn.utils`),
against PyTorch when installed and numpy always."""
from __future__ import annotations

import math

import numpy as np
import pytest
from torch_optional import torch

from glassgrad import Tensor, TinyJit, nn


def _params_with_grads(seed: int = 0) -> tuple[list[Tensor], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (4,), (5, 1, 2)]]
    params = [Tensor(np.zeros(g.shape, np.float32)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = Tensor(g)
    return params, grads


@pytest.mark.parametrize("max_norm, norm_type", [(0.5, 2.0), (100.0, 2.0), (1.0, 1.0), (0.3, math.inf), (2.0, 3)])
def test_clip_grad_norm_matches_numpy_and_torch(max_norm: float, norm_type: float) -> None:
    params, grads = _params_with_grads()
    flat = np.concatenate([g.ravel() for g in grads]).astype(np.float64)
    want_norm = np.abs(flat).max() if norm_type == math.inf else (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)
    coef = min(1.0, max_norm / (want_norm + 1e-6))
    norm = nn.utils.clip_grad_norm_(params, max_norm, norm_type)
    assert norm.item() == pytest.approx(want_norm, rel=1e-5)
    for p, g in zip(params, grads):
        assert p.grad is not None
        np.testing.assert_allclose(p.grad.numpy(), g * coef, rtol=1e-5, atol=1e-7)
    if torch is not None:
        tp = [torch.zeros(g.shape, requires_grad=True) for g in grads]
        for t, g in zip(tp, grads):
            t.grad = torch.from_numpy(g.copy())
        assert norm.item() == pytest.approx(torch.nn.utils.clip_grad_norm_(tp, max_norm, norm_type).item(), rel=1e-5)
        for p, t in zip(params, tp):
            assert p.grad is not None
            np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-7)


def test_clip_grad_norm_skips_params_without_grad_and_takes_one_tensor() -> None:
    params, grads = _params_with_grads(1)
    lone = Tensor(np.zeros(2, np.float32))
    assert nn.utils.clip_grad_norm_([*params, lone], 1e9).item() == pytest.approx(
        float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))), rel=1e-5)
    assert lone.grad is None
    assert nn.utils.clip_grad_norm_(params[1], 0.1).item() == pytest.approx(float(np.linalg.norm(grads[1])), rel=1e-5)
    assert params[1].grad is not None and np.linalg.norm(params[1].grad.numpy()) == pytest.approx(0.1, rel=1e-4)
    assert nn.utils.clip_grad_norm_([lone], 1.0).item() == 0.0


def test_clip_grad_norm_errors() -> None:
    params, _ = _params_with_grads()
    params[0].grad = Tensor(np.full((3, 4), np.inf, np.float32))
    with pytest.raises(RuntimeError, match="inf"):
        nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    with pytest.raises(ValueError, match="norm_type"):
        nn.utils.clip_grad_norm_(params, 1.0, norm_type=0)
    with pytest.raises(TypeError, match="Tensors"):
        nn.utils.clip_grad_norm_([np.zeros(2)], 1.0)  # type: ignore[list-item]


def test_clip_grad_value_clamps_each_gradient() -> None:
    params, grads = _params_with_grads(2)
    nn.utils.clip_grad_value_(params, 0.4)
    for p, g in zip(params, grads):
        assert p.grad is not None
        np.testing.assert_array_equal(p.grad.numpy(), np.clip(g, -0.4, 0.4))


def test_clipped_training_step_under_tinyjit_equals_eager() -> None:
    """The clipping is lazy, so it fuses into the optimiser's step and replays under TinyJit."""
    rng = np.random.default_rng(3)
    init = rng.standard_normal((4, 3)).astype(np.float32)
    batches = [rng.standard_normal((5, 4)).astype(np.float32) * (i + 1) for i in range(4)]

    def run(jit: bool) -> np.ndarray:
        w = Tensor(init.copy())
        opt = nn.optim.SGD([w], lr=0.1)

        def step(x: Tensor) -> Tensor:
            with Tensor.train():
                opt.zero_grad()
                (x @ w).square().sum().backward()
                norm = nn.utils.clip_grad_norm_([w], 1.0)
                opt.step()
            return norm.realize()
        fn = TinyJit(step) if jit else step
        for b in batches:
            fn(Tensor(b))
        return w.numpy()
    np.testing.assert_allclose(run(True), run(False), rtol=1e-6)
