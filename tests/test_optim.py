"""Optimisers and learning-rate schedules: numbers against PyTorch (when installed) and numpy references (always),
a flat graph and a constant kernel count over many steps, and the errors a user can run into."""
from __future__ import annotations

import gc
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from test_tensor_extra import _np_newton_schulz

from glassgrad import Device, GlobalCounters, Tensor, dtypes, no_grad
from glassgrad.engine import realize as engine_realize
from glassgrad.nn.lr import CosineAnnealingLR, OneCycleLR, StepLR
from glassgrad.nn.optim import LAMB, LARS, SGD, Adam, AdamW, Muon, Optimizer, OptimizerGroup
from glassgrad.uop.ops import UOp

SHAPES = [(4, 8), (8,), (8, 3)]  # w1, b1, w2
STEPS = 10
TOL = 1e-5


# ---------------------------------------------------------------------- the small model, three ways
def _init(seed: int = 0) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in SHAPES]
    x = rng.standard_normal((16, 4)).astype(np.float32)
    y = rng.standard_normal((16, 3)).astype(np.float32)
    return params, x, y


def _gg_loss(ps: list[Tensor], x: Tensor, y: Tensor) -> Tensor:
    w1, b1, w2 = ps
    return ((x @ w1 + b1).relu() @ w2 - y).square().mean()


def _numpy_grads(ps: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """Hand-written backward of mean((relu(x @ w1 + b1) @ w2 - y)**2)."""
    w1, b1, w2 = ps
    h = x @ w1 + b1
    a = np.maximum(h, 0)
    d_out = 2 * (a @ w2 - y) / y.size
    d_h = (d_out @ w2.T) * (h > 0)
    return [x.T @ d_h, d_h.sum(0), a.T @ d_out]


def _torch_grads(ps: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    torch = pytest.importorskip("torch")
    tp = [torch.tensor(p, requires_grad=True) for p in ps]
    loss = ((torch.tensor(x) @ tp[0] + tp[1]).relu() @ tp[2] - torch.tensor(y)).square().mean()
    loss.backward()
    return [t.grad.numpy() for t in tp]


def _train_and_compare(make_opt: Callable[[list[Tensor]], Optimizer],
                       reference_step: Callable[[list[np.ndarray], list[np.ndarray]], list[np.ndarray]],
                       grads_of: Callable[..., list[np.ndarray]] = _numpy_grads, tol: float = TOL) -> None:
    """Train the glassgrad model STEPS steps; after each, its params must equal the reference's within `tol`."""
    init, x, y = _init()
    ps = [Tensor(p.copy()) for p in init]
    opt = make_opt(ps)
    ref = [p.copy() for p in init]
    with Tensor.train():
        for step in range(STEPS):
            opt.zero_grad()
            _gg_loss(ps, Tensor(x), Tensor(y)).backward()
            opt.step()
            ref = reference_step(ref, grads_of(ref, x, y))
            for i, (p, r) in enumerate(zip(ps, ref)):
                np.testing.assert_allclose(p.numpy(), r, atol=tol, rtol=tol, err_msg=f"param {i} after step {step + 1}")


def _torch_reference(torch_opt: Callable[..., Any]) -> Callable[[list[np.ndarray], list[np.ndarray]], list[np.ndarray]]:
    """A reference step that runs a real torch.optim optimizer (its state persists between calls)."""
    torch = pytest.importorskip("torch")
    state: dict[str, Any] = {}

    def step(ps: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        if "params" not in state:
            state["params"] = [torch.tensor(p, requires_grad=True) for p in ps]
            state["opt"] = torch_opt(state["params"])
        for tp, g in zip(state["params"], grads):
            tp.grad = torch.tensor(g)
        state["opt"].step()
        return [tp.detach().numpy().copy() for tp in state["params"]]
    return step


# ---------------------------------------------------------------------- numpy reference optimisers
class NumpySGD:
    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False) -> None:
        self.lr, self.momentum, self.wd, self.nesterov = lr, momentum, weight_decay, nesterov
        self.buf: list[np.ndarray] | None = None

    def __call__(self, ps: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        grads = [g + self.wd * p for p, g in zip(ps, grads)]
        if self.momentum:
            first = self.buf is None
            self.buf = [g.copy() if first else self.momentum * b + g for b, g in zip(self.buf or grads, grads)]
            grads = [g + self.momentum * b for g, b in zip(grads, self.buf)] if self.nesterov else self.buf
        return [(p - self.lr * g).astype(np.float32) for p, g in zip(ps, grads)]


class _NumpyMoments:
    """Shared state of the Adam-family references: first/second moments and the step count, in float32."""

    def __init__(self, lr: float, b1: float, b2: float, eps: float, weight_decay: float) -> None:
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, b1, b2, eps, weight_decay
        self.m: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.t = 0

    def __call__(self, ps: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        if not self.m:
            self.m, self.v = [np.zeros_like(p) for p in ps], [np.zeros_like(p) for p in ps]
        self.t += 1
        return [self.update(i, p, g).astype(np.float32) for i, (p, g) in enumerate(zip(ps, grads))]

    def moments(self, i: int, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g
        self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g * g
        return self.m[i], self.v[i]

    def update(self, i: int, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class NumpyAdam(_NumpyMoments):
    """PyTorch's Adam / AdamW formulas, in float32."""

    def __init__(self, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                 decoupled: bool = False) -> None:
        super().__init__(lr, b1, b2, eps, weight_decay)
        self.decoupled = decoupled

    def update(self, i: int, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        if self.decoupled:
            p = p * np.float32(1 - self.lr * self.wd)
        else:
            g = g + np.float32(self.wd) * p
        m, v = self.moments(i, g)
        bc1, bc2 = 1 - self.b1 ** self.t, 1 - self.b2 ** self.t
        denom = np.sqrt(v) / math.sqrt(bc2) + self.eps
        return p - (self.lr / bc1) * m / denom


class NumpyLAMB(_NumpyMoments):
    """tinygrad's LAMB: trust ratio ||p|| / ||update|| (1 when either is 0); adam=True drops the ratio."""

    def __init__(self, lr: float, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0,
                 adam: bool = False) -> None:
        super().__init__(lr, b1, b2, eps, weight_decay)
        self.adam = adam

    def update(self, i: int, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        m, v = self.moments(i, g)
        m_hat, v_hat = m / (1 - self.b1 ** self.t), v / (1 - self.b2 ** self.t)
        up = m_hat / (np.sqrt(v_hat) + self.eps) + self.wd * p
        ratio = 1.0
        if not self.adam:
            w_norm, up_norm = np.linalg.norm(p), np.linalg.norm(up)
            ratio = w_norm / up_norm if w_norm > 0 and up_norm > 0 else 1.0
        return p - self.lr * ratio * up


# ---------------------------------------------------------------------- against PyTorch
SGD_CASES: dict[str, dict[str, Any]] = {
    "plain": {"lr": 0.1},
    "momentum": {"lr": 0.05, "momentum": 0.9},
    "nesterov": {"lr": 0.05, "momentum": 0.9, "nesterov": True},
    "weight_decay": {"lr": 0.1, "weight_decay": 0.1},
    "momentum_weight_decay": {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.05, "nesterov": True},
}


@pytest.mark.parametrize("case", list(SGD_CASES))
def test_sgd_matches_torch(case: str) -> None:
    torch = pytest.importorskip("torch")
    kw = SGD_CASES[case]
    _train_and_compare(lambda ps: SGD(ps, **kw), _torch_reference(lambda tp: torch.optim.SGD(tp, **kw)))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_torch(weight_decay: float) -> None:
    torch = pytest.importorskip("torch")
    _train_and_compare(lambda ps: Adam(ps, lr=0.01, weight_decay=weight_decay),
                       _torch_reference(lambda tp: torch.optim.Adam(tp, lr=0.01, weight_decay=weight_decay)))


@pytest.mark.parametrize("weight_decay", [0.01, 0.5])
def test_adamw_matches_torch(weight_decay: float) -> None:
    torch = pytest.importorskip("torch")
    _train_and_compare(lambda ps: AdamW(ps, lr=0.01, b1=0.8, b2=0.99, weight_decay=weight_decay),
                       _torch_reference(lambda tp: torch.optim.AdamW(tp, lr=0.01, betas=(0.8, 0.99),
                                                                     weight_decay=weight_decay)))


@pytest.mark.parametrize("decoupled, weight_decay", [(False, 0.0), (False, 0.1), (True, 0.05)])
def test_amsgrad_matches_torch(decoupled: bool, weight_decay: float) -> None:
    """PyTorch's `amsgrad=True` (the running max of the second moment in the denominator) was a TypeError. b2 = 0.5
    lets the second moment fall as the gradients shrink, so the max differs from it within these steps."""
    torch = pytest.importorskip("torch")
    ours, theirs = (AdamW, torch.optim.AdamW) if decoupled else (Adam, torch.optim.Adam)
    kw = {"lr": 0.02, "weight_decay": weight_decay, "amsgrad": True}
    _train_and_compare(lambda ps: ours(ps, b1=0.8, b2=0.5, **kw),
                       _torch_reference(lambda tp: theirs(tp, betas=(0.8, 0.5), **kw)))


def test_amsgrad_keeps_the_largest_second_moment() -> None:
    """The denominator uses max(v) over the steps: a big gradient then small ones leave v_max at the big one."""
    p = Tensor(np.zeros(3, np.float32))
    plain, ams = Adam([p], lr=0.1, b2=0.5), Adam([Tensor(np.zeros(3, np.float32))], lr=0.1, b2=0.5, amsgrad=True)
    with Tensor.train():
        for g in (10.0, 1.0, 1.0):
            for opt in (plain, ams):
                opt.params[0].grad = Tensor(np.full(3, g, np.float32))
                opt.step()
    np.testing.assert_allclose(ams.v_max[0].numpy(), np.full(3, 50.0), rtol=1e-6)  # (1 - 0.5) * 10**2
    assert ams.v[0].numpy()[0] < 50.0 and abs(ams.params[0].numpy()[0]) < abs(plain.params[0].numpy()[0])


@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1}, {"adam": True}])
def test_lamb_matches_reference_with_torch_gradients(kw: dict[str, Any]) -> None:
    pytest.importorskip("torch")  # torch has no LAMB: torch computes the gradients, the update is NumpyLAMB
    _train_and_compare(lambda ps: LAMB(ps, lr=0.01, **kw), NumpyLAMB(lr=0.01, **kw), grads_of=_torch_grads)


def test_numpy_references_agree_with_torch() -> None:
    """The references used when torch is absent are themselves checked against torch."""
    torch = pytest.importorskip("torch")
    init, x, y = _init()
    for tg, ng in zip(_torch_grads(init, x, y), _numpy_grads(init, x, y)):
        np.testing.assert_allclose(ng, tg, atol=1e-6, rtol=1e-5)
    Step = Callable[[list[np.ndarray], list[np.ndarray]], list[np.ndarray]]
    refs: list[tuple[Step, Callable[..., Any]]] = [
        (NumpySGD(0.05, 0.9, 0.05, True), lambda tp: torch.optim.SGD(tp, 0.05, 0.9, weight_decay=0.05, nesterov=True)),
        (NumpyAdam(0.01, weight_decay=0.1), lambda tp: torch.optim.Adam(tp, 0.01, weight_decay=0.1)),
        (NumpyAdam(0.01, weight_decay=0.1, decoupled=True), lambda tp: torch.optim.AdamW(tp, 0.01, weight_decay=0.1))]
    for numpy_step, torch_opt in refs:
        ours, theirs, torch_step = init, init, _torch_reference(torch_opt)
        for _ in range(STEPS):
            ours = numpy_step(ours, _numpy_grads(ours, x, y))
            theirs = torch_step(theirs, _numpy_grads(theirs, x, y))
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, atol=TOL, rtol=TOL)


# ---------------------------------------------------------------------- against numpy (no torch needed)
@pytest.mark.parametrize("case", list(SGD_CASES))
def test_sgd_matches_numpy(case: str) -> None:
    kw = SGD_CASES[case]
    _train_and_compare(lambda ps: SGD(ps, **kw), NumpySGD(**kw))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adam_matches_numpy(weight_decay: float) -> None:
    _train_and_compare(lambda ps: Adam(ps, lr=0.01, weight_decay=weight_decay),
                       NumpyAdam(0.01, weight_decay=weight_decay))


def test_adamw_matches_numpy() -> None:
    _train_and_compare(lambda ps: AdamW(ps, lr=0.01, weight_decay=0.2), NumpyAdam(0.01, weight_decay=0.2,
                                                                                  decoupled=True))


@pytest.mark.parametrize("kw", [{}, {"weight_decay": 0.1}, {"adam": True}])
def test_lamb_matches_numpy(kw: dict[str, Any]) -> None:
    _train_and_compare(lambda ps: LAMB(ps, lr=0.01, **kw), NumpyLAMB(lr=0.01, **kw))


def test_lamb_trust_ratio_is_one_for_zero_weights() -> None:
    w = Tensor(np.zeros(4, np.float32))
    opt = LAMB([w], lr=0.1)
    with Tensor.train():
        (w * Tensor(np.array([1, 2, 3, 4], np.float32))).sum().backward()
        opt.step()
    expected = NumpyLAMB(0.1)([np.zeros(4, np.float32)], [np.array([1, 2, 3, 4], np.float32)])[0]
    np.testing.assert_allclose(w.numpy(), expected, atol=TOL)
    assert np.all(np.isfinite(w.numpy())) and np.all(w.numpy() < 0)


# ---------------------------------------------------------------------- LARS, Muon, SGD(classic=True): tinygrad's rules
class NumpyLARS:
    """tinygrad's LARS restated in numpy (float64 Newton-Schulz): the flags that also make its SGD and Muon."""

    def __init__(self, lr: float, momentum: float = 0.9, weight_decay: float = 1e-4, ns_steps: int = 0,
                 ns_coefficients: tuple[float, ...] | None = None, nesterov: bool = False, classic: bool = True,
                 pre_wd: bool = True, tcoef: float = 0.001) -> None:
        self.lr, self.momentum, self.wd, self.ns = lr, momentum, weight_decay, (ns_steps, ns_coefficients)
        self.nesterov, self.classic, self.pre_wd, self.tcoef = nesterov, classic, pre_wd, tcoef
        self.b: list[np.ndarray] = []

    def __call__(self, ps: list[np.ndarray], grads: list[np.ndarray]) -> list[np.ndarray]:
        self.b = self.b or [np.zeros_like(p) for p in ps]
        return [(p - self.step(i, p, g)).astype(np.float32) for i, (p, g) in enumerate(zip(ps, grads))]

    def ratio(self, p: np.ndarray, g: np.ndarray) -> float:
        w_norm, g_norm = np.linalg.norm(p), np.linalg.norm(g)
        if self.tcoef == 0 or w_norm == 0 or g_norm == 0:
            return 1.0
        return float(self.tcoef * w_norm / (g_norm + self.wd * w_norm))

    def step(self, i: int, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        scale = self.ratio(p, g) * self.lr
        g = g + self.wd * p if self.pre_wd else g
        g = g * scale if self.classic else g
        if self.momentum:
            self.b[i] = self.momentum * self.b[i] + g
            g = g + self.momentum * self.b[i] if self.nesterov else self.b[i]
        if self.ns[1]:
            g = _np_newton_schulz(g.reshape(g.shape[0], -1), self.ns[0], self.ns[1]).reshape(g.shape)
        g = g if self.classic else g * scale
        return g if self.pre_wd else g + self.wd * self.lr * p


LARS_CASES: dict[str, dict[str, Any]] = {
    "defaults": {"lr": 0.1},
    "nesterov_big_tcoef": {"lr": 0.05, "momentum": 0.8, "weight_decay": 0.01, "nesterov": True, "tcoef": 0.1},
    "popular_no_momentum": {"lr": 0.1, "momentum": 0.0, "classic": False, "tcoef": 0.02},
    "post_wd": {"lr": 0.05, "weight_decay": 0.05, "pre_wd": False, "classic": False},
}


@pytest.mark.parametrize("case", list(LARS_CASES))
def test_lars_matches_numpy(case: str) -> None:
    kw = LARS_CASES[case]
    _train_and_compare(lambda ps: LARS(ps, **kw), NumpyLARS(**kw))


MUON_CASES: dict[str, dict[str, Any]] = {
    "defaults": {"lr": 0.02},
    "no_nesterov_no_decay": {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.0, "nesterov": False},
    "three_steps_cubic": {"lr": 0.01, "ns_steps": 3, "ns_coefficients": (1.5, -0.5)},
}


@pytest.mark.parametrize("case", list(MUON_CASES))
def test_muon_matches_numpy(case: str) -> None:
    """tinygrad's Muon = LARS(momentum=0.95, weight_decay=0.1, ns_steps=5, Muon's quintic, nesterov, classic=False,
    pre_wd=False, tcoef=0): each update (momentum, Nesterov) orthogonalised as a (rows, -1) matrix, times lr, plus
    weight_decay*lr*p. The reference orthogonalises in float64."""
    kw = MUON_CASES[case]
    defaults = dict(momentum=0.95, weight_decay=0.1, ns_steps=5, ns_coefficients=(3.4445, -4.775, 2.0315),
                    nesterov=True)
    ref = NumpyLARS(**{**defaults, **kw}, classic=False, pre_wd=False, tcoef=0.0)
    _train_and_compare(lambda ps: Muon(ps, **kw), ref)


def test_muon_matches_torch_muon_on_wide_matrices() -> None:
    """torch.optim.Muon (2.9+) on matrices with rows <= cols (its lr adjustment is then 1): the same update up to
    torch's bfloat16 Newton-Schulz and its momentum dampening (a factor 1-momentum that the normalisation removes)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon needs PyTorch 2.9 or later")
    rng = np.random.default_rng(3)
    init = [rng.standard_normal(s).astype(np.float32) for s in [(4, 8), (3, 3)]]
    ps, tps = [Tensor(p.copy()) for p in init], [torch.tensor(p.copy(), requires_grad=True) for p in init]
    opt, t_opt = Muon(ps, lr=0.05), torch.optim.Muon(tps, lr=0.05)
    with Tensor.train():
        for step in range(3):
            grads = [rng.standard_normal(p.shape).astype(np.float32) for p in init]
            for p, tp, g in zip(ps, tps, grads):
                p.grad, tp.grad = Tensor(g), torch.tensor(g)
            opt.step()
            t_opt.step()
            for p, tp in zip(ps, tps):  # bfloat16 in torch's iteration: about 1% of each lr-sized update
                np.testing.assert_allclose(p.numpy(), tp.detach().numpy(), atol=2e-3 * (step + 1), rtol=0)


@pytest.mark.parametrize("case", ["momentum", "nesterov", "momentum_weight_decay"])
def test_sgd_classic_matches_numpy(case: str) -> None:
    """tinygrad's SGD(classic=True): lr scales the gradient before the momentum (LARS with tcoef=0, pre_wd)."""
    kw = SGD_CASES[case]
    ref = NumpyLARS(kw["lr"], kw.get("momentum", 0.0), kw.get("weight_decay", 0.0), nesterov=kw.get("nesterov", False),
                    classic=True, tcoef=0.0)
    _train_and_compare(lambda ps: SGD(ps, **kw, classic=True), ref)


def test_muon_and_lars_errors_and_tinygrad_keywords() -> None:
    w = Tensor(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="0-d"):
        Muon([w, Tensor(np.float32(1.0))])
    with pytest.raises(ValueError, match="fused"):
        Muon([w], fused=True)
    with pytest.raises(ValueError, match="momentum"):
        LARS([w], momentum=-1)
    with pytest.raises(ValueError, match="device='CPU.*params are on"):
        Adam([w], device="CPU:1" if w.device != "CPU:1" else "CPU")
    assert isinstance(Muon([w]), LARS)
    for opt in (SGD([w], device=w.device, fused=True), Adam([w], fused=False), AdamW([w], device=w.device),
                LAMB([w], fused=True), LARS([w], device=w.device)):
        assert opt.device == w.device


# ---------------------------------------------------------------------- a flat graph, constant kernels
def _kernel_counts(opt_factory: Callable[[list[Tensor]], Optimizer], steps: int) -> tuple[list[int], list[Tensor],
                                                                                             Optimizer, list[int]]:
    init, x, y = _init()
    ps = [Tensor(p.copy()) for p in init]
    opt = opt_factory(ps)
    counts, compiled = [], []
    with Tensor.train():
        for _ in range(steps):
            GlobalCounters.reset()
            opt.zero_grad()
            _gg_loss(ps, Tensor(x), Tensor(y)).backward()
            opt.step()
            counts.append(GlobalCounters.kernel_count)
            compiled.append(len(engine_realize._kernel_cache))
    return counts, ps, opt, compiled


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "lamb"])
def test_graph_stays_flat_and_kernels_per_step_constant(name: str) -> None:
    factory: dict[str, Callable[[list[Tensor]], Optimizer]] = {
        "sgd_momentum": lambda ps: SGD(ps, lr=0.01, momentum=0.9),
        "adam": lambda ps: Adam(ps, lr=1e-3),
        "lamb": lambda ps: LAMB(ps, lr=1e-3, weight_decay=0.01)}
    counts, ps, opt, compiled = _kernel_counts(factory[name], 200)
    assert len(set(counts[1:])) == 1, f"kernels per step changed: {sorted(set(counts[1:]))}"
    assert compiled[-1] == compiled[1], "kernels were compiled after the second step"
    for t in [*ps, *opt.state(), opt.lr]:
        assert len(t.uop.toposort()) <= 3, t.uop  # a buffer (and a reshape): no history
    assert all(np.all(np.isfinite(p.numpy())) for p in ps)


def test_memory_stays_constant_over_steps() -> None:
    """Live graph nodes do not grow over steps (with a schedule, and the loss read every step)."""
    init, x, y = _init()
    ps = [Tensor(p.copy()) for p in init]
    opt = Adam(ps, lr=0.01)
    sched = CosineAnnealingLR(opt, T_max=50)
    live = []
    with Tensor.train():
        for step in range(150):
            opt.zero_grad()
            loss = _gg_loss(ps, Tensor(x), Tensor(y))
            loss.backward()
            with no_grad():  # the loss is realized with the step: afterwards it would read the updated params
                Tensor.realize_all(loss, *opt.schedule_step())
            sched.step()
            loss.item()
            if step in (49, 149):
                del loss
                gc.collect()
                live.append(sum(type(o) is UOp for o in gc.get_objects()))  # type(): no __class__ lookups
    assert live[1] <= live[0], f"live UOps grew from {live[0]} to {live[1]}"


def test_adam_kernels_per_step() -> None:
    counts, _, _, _ = _kernel_counts(lambda ps: Adam(ps, lr=1e-3), 3)
    # forward and backward (4 matmul/bias reductions, 3 grads), the step count and its two bias corrections (an
    # expm1 each, worth a buffer of one element), then per param: m, v and the param (one kernel storing all three
    # on a CPU; three on a GPU, whose elementwise kernels store one output each)
    assert counts[1] == counts[2] <= (18 if Device.DEFAULT == "CPU" else 21)


def test_step_writes_into_the_same_buffers() -> None:
    init, x, y = _init()
    ps = [Tensor(p.copy()) for p in init]
    opt = Adam(ps)
    before = [p.uop.base.arg[0] for p in [*ps, *opt.m, *opt.v, opt.t]]
    with Tensor.train():
        for _ in range(3):
            opt.zero_grad()
            _gg_loss(ps, Tensor(x), Tensor(y)).backward()
            opt.step()
    assert [p.uop.base.arg[0] for p in [*ps, *opt.m, *opt.v, opt.t]] == before
    assert opt.t.item() == 3


# ---------------------------------------------------------------------- lr as a tensor
def test_changing_lr_changes_no_kernel() -> None:
    w = Tensor(np.ones(8, np.float32))
    opt = SGD([w], lr=0.5)
    with Tensor.train():
        for lr, expected in [(0.5, 0.5), (0.25, 0.25), (0.125, 0.125)]:
            opt.lr.assign(Tensor(np.array(lr, np.float32))).realize()
            if lr == 0.25:
                compiled = len(engine_realize._kernel_cache)
            before = w.numpy().copy()
            opt.zero_grad()
            w.sum().backward()
            opt.step()
            np.testing.assert_allclose(before - w.numpy(), expected)
    assert len(engine_realize._kernel_cache) == compiled


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("value", ["float", "tensor"])
def test_setting_lr_writes_into_its_buffer(value: str, jit: bool) -> None:
    """`opt.lr = 0.1` (a hand-written warmup) raised AttributeError at step() ('float' object has no attribute
    'reshape'), and `opt.lr = Tensor([0.1])` left a TinyJit replaying the old buffer's lr. Both write the value into
    the lr tensor, which keeps its identity and shape, and no new kernel is compiled."""
    from glassgrad import TinyJit
    w = Tensor(np.ones(4, np.float32))
    opt = SGD([w], lr=1.0)
    lr_tensor = opt.lr

    def step() -> Tensor:
        opt.zero_grad()
        w.sum().backward()
        opt.step()
        return w
    run = TinyJit(step) if jit else step
    lrs = [0.5, 0.25, 0.125, 0.0625]
    with Tensor.train():
        for i, lr in enumerate(lrs):
            opt.lr = lr if value == "float" else Tensor([lr])
            if i == 2:
                compiled = len(engine_realize._kernel_cache)
            run()
    assert opt.lr is lr_tensor and opt.lr.shape == (1,)
    assert len(engine_realize._kernel_cache) == compiled
    np.testing.assert_allclose(w.numpy(), 1 - sum(lrs))
    with pytest.raises(ValueError, match="lr must be"):
        opt.lr = "0.1"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="one element"):
        opt.lr = Tensor([0.1, 0.2])


def test_lr_tensor_is_shared() -> None:
    lr = Tensor(np.array([0.5], np.float32))
    w = Tensor(np.ones(3, np.float32))
    opt = SGD([w], lr=lr)
    assert opt.lr is lr
    with Tensor.train():
        w.sum().backward()
        opt.step()
    np.testing.assert_allclose(w.numpy(), 0.5)


# ---------------------------------------------------------------------- several optimisers at once
def test_optimizer_group_steps_in_one_schedule() -> None:
    init, x, y = _init()
    results = []
    for grouped in (False, True):
        ps = [Tensor(p.copy()) for p in init]
        a, s = Adam(ps[:2], lr=0.01), SGD(ps[2:], lr=0.1, momentum=0.9)
        group = OptimizerGroup(a, s)
        assert group[0] is a and group.params == ps
        with Tensor.train():
            for _ in range(3):
                group.zero_grad()
                _gg_loss(ps, Tensor(x), Tensor(y)).backward()
                if grouped:
                    group.step()
                else:  # the grads read the params lazily: compute them all before the first update
                    Tensor.realize_all(*[p.grad for p in ps if p.grad is not None])
                    a.step()
                    s.step()
        results.append([p.numpy() for p in ps])
    for p_sep, p_grp in zip(*results):
        np.testing.assert_allclose(p_grp, p_sep, atol=1e-6)


# ---------------------------------------------------------------------- parameter handling
def test_zero_grad_sets_grad_to_none() -> None:
    w = Tensor(np.ones(3, np.float32))
    opt = SGD([w])
    w.sum().backward()
    assert w.grad is not None
    opt.zero_grad()
    assert w.grad is None


def test_param_without_grad_raises_naming_it() -> None:
    used, unused = Tensor(np.ones(3, np.float32)), Tensor(np.ones((2, 5), np.float32))
    opt = SGD([used, unused], lr=0.1)
    with Tensor.train():
        used.sum().backward()
        with pytest.raises(RuntimeError, match=r"param 1 \(shape \(2, 5\).*no gradient"):
            opt.step()


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
                                  lambda ps: AdamW(ps, lr=0.05, weight_decay=0.1),
                                  lambda ps: LAMB(ps, lr=0.05)], ids=["sgd", "adamw", "lamb"])
def test_a_param_frozen_after_the_optimizer_was_made_is_skipped(make: Callable[[list[Tensor]], Optimizer]) -> None:
    """Fine-tuning as PyTorch users write it: `p.requires_grad = False` for the first layer after two steps, the
    optimizer unchanged. step() raised 'has no gradient ... set requires_grad=False' though it was set. Now the
    frozen param and its own state keep their values, and the others train as if it were a constant."""
    init, x, y = _init()
    ps = [Tensor(p.copy()) for p in init]
    opt = make(ps)
    with Tensor.train():
        for step in range(4):
            if step == 2:
                ps[0].requires_grad = False
                frozen = ps[0].numpy().copy()
                state = [t.numpy().copy() for t in opt._param_state(0)]
            opt.zero_grad()
            _gg_loss(ps, Tensor(x), Tensor(y)).backward()
            opt.step()
    np.testing.assert_array_equal(ps[0].numpy(), frozen)
    for before, t in zip(state, opt._param_state(0)):
        np.testing.assert_array_equal(t.numpy(), before)
    assert len(state) == (1 if isinstance(opt, SGD) else 2)
    torch = pytest.importorskip("torch")
    if isinstance(opt, LAMB):
        return  # torch has no LAMB
    tp = [torch.tensor(p.copy(), requires_grad=True) for p in init]
    topt = torch.optim.SGD(tp, lr=0.1, momentum=0.9, weight_decay=0.01) if isinstance(opt, SGD) else \
        torch.optim.AdamW(tp, lr=0.05, weight_decay=0.1)
    for step in range(4):
        if step == 2:
            tp[0].requires_grad_(False)
        topt.zero_grad()
        ((torch.tensor(x) @ tp[0] + tp[1]).relu() @ tp[2] - torch.tensor(y)).square().mean().backward()
        topt.step()
    for ours, theirs in zip(ps, tp):
        np.testing.assert_allclose(ours.numpy(), theirs.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_non_float_param_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"param 1 .*int32.*floating-point"):
        SGD([Tensor(np.ones(2, np.float32)), Tensor(np.ones(2, np.int32))])


def test_requires_grad_none_becomes_true_and_false_is_a_buffer() -> None:
    w, frozen = Tensor(np.ones(3, np.float32)), Tensor(np.ones(3, np.float32), requires_grad=False)
    counter = Tensor(np.zeros(1, np.int32), requires_grad=False)  # a non-float buffer is fine if not trained
    opt = SGD([w, frozen, counter], lr=0.1)
    assert w.requires_grad is True and frozen.requires_grad is False
    assert opt.params == [w] and opt.buffers == [frozen, counter]
    with Tensor.train():
        (w * frozen).sum().backward()
        opt.step()
    np.testing.assert_allclose(w.numpy(), 0.9)
    np.testing.assert_allclose(frozen.numpy(), 1.0)


def test_step_needs_training_mode() -> None:
    w = Tensor(np.ones(3, np.float32))
    opt = SGD([w])
    w.sum().backward()
    with Tensor.train(False), pytest.raises(RuntimeError, match="Tensor.training"):
        opt.step()


def test_lazy_params_get_buffers_of_their_own() -> None:
    b1, b2 = Tensor.zeros(4), Tensor.zeros(4)  # the same lazy graph node until the optimizer copies them
    opt = SGD([b1, b2], lr=1.0)
    with Tensor.train():
        (b1 * 1 + b2 * 2).sum().backward()
        opt.step()
    np.testing.assert_allclose(b1.numpy(), -1.0)
    np.testing.assert_allclose(b2.numpy(), -2.0)


def test_params_sharing_a_buffer_get_buffers_of_their_own() -> None:
    """Another tensor over the very same buffer is not its owner: it writes a copy, so an update of one never
    changes the other (it was refused as a shared buffer before the owner was tracked)."""
    w = Tensor(np.ones(4, np.float32))
    other = Tensor(w.uop)
    opt = SGD([w, other], lr=0.5)
    assert w.uop.base.arg[0] is not other.uop.base.arg[0]
    w.grad, other.grad = Tensor(np.full(4, 1, np.float32)), Tensor(np.full(4, 2, np.float32))
    with Tensor.train():
        opt.step()
    np.testing.assert_array_equal(w.numpy(), np.full(4, 0.5))
    np.testing.assert_array_equal(other.numpy(), np.zeros(4))


def test_duplicate_params_are_stepped_once() -> None:
    w = Tensor(np.ones(3, np.float32))
    opt = SGD([w, w], lr=0.1)
    assert opt.params == [w]


@pytest.mark.parametrize("bad", [
    lambda: SGD([]), lambda: SGD([Tensor(np.ones(2, np.float32))], lr=-1.0),
    lambda: SGD([Tensor(np.ones(2, np.float32))], momentum=-0.1),
    lambda: SGD([Tensor(np.ones(2, np.float32))], nesterov=True),
    lambda: Adam([Tensor(np.ones(2, np.float32))], b1=1.0),
    lambda: Adam([Tensor(np.ones(2, np.float32))], lr=Tensor(np.ones(3, np.float32))),
    lambda: SGD([Tensor(np.ones(2, np.float32), requires_grad=False)])])
def test_bad_arguments_raise_value_error(bad: Callable[[], Any]) -> None:
    with pytest.raises(ValueError):
        bad()


def test_half_params_keep_float32_state() -> None:
    w = Tensor(np.ones(4, np.float16))
    opt = Adam([w], lr=0.01)
    assert opt.m[0].dtype == dtypes.float32 and opt.lr.dtype == dtypes.float32
    with Tensor.train():
        w.sum().backward()
        opt.step()
    assert w.dtype == dtypes.float16
    np.testing.assert_allclose(w.numpy(), 0.99, atol=1e-3)


# ---------------------------------------------------------------------- learning-rate schedules
def _onecycle_closed_form(e: int, max_lr: float = 1.0, total: int = 20, pct: float = 0.3) -> float:
    initial, warm_end = max_lr / 25, pct * total - 1
    final = initial / 1e4
    if e <= warm_end:
        frac, start, end = e / warm_end, initial, max_lr
    else:
        frac, start, end = (e - warm_end) / (total - 1 - warm_end), max_lr, final
    return end + (start - end) * (1 + math.cos(math.pi * frac)) / 2


SCHEDULES: dict[str, tuple[Callable[[Optimizer], Any], Callable[[int], float], int]] = {
    "step": (lambda o: StepLR(o, step_size=3, gamma=0.5), lambda e: 0.1 * 0.5 ** (e // 3), 20),
    "cosine": (lambda o: CosineAnnealingLR(o, T_max=7, eta_min=0.01),
               lambda e: 0.01 + (0.1 - 0.01) * (1 + math.cos(math.pi * e / 7)) / 2, 25),
    "onecycle": (lambda o: OneCycleLR(o, max_lr=1.0, total_steps=20), _onecycle_closed_form, 20),
}


def _schedule_values(name: str) -> list[float]:
    make, _, epochs = SCHEDULES[name]
    opt = SGD([Tensor(np.ones(2, np.float32))], lr=0.1)
    sched = make(opt)
    values = []
    for _ in range(epochs + 1):
        values.append(sched.get_last_lr()[0])
        assert opt.lr.item() == pytest.approx(values[-1], rel=1e-6, abs=1e-12)  # written into the lr tensor
        if len(values) <= epochs:
            sched.step()
    return values


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_match_closed_forms(name: str) -> None:
    closed = SCHEDULES[name][1]
    values = _schedule_values(name)
    assert values == pytest.approx([closed(e) for e in range(len(values))], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_schedules_match_torch(name: str) -> None:
    torch = pytest.importorskip("torch")
    opt = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    sched = {"step": lambda: torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5),
             "cosine": lambda: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7, eta_min=0.01),
             "onecycle": lambda: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1.0, total_steps=20,
                                                                     cycle_momentum=False)}[name]()
    expected = []
    for _ in range(SCHEDULES[name][2] + 1):
        expected.append(sched.get_last_lr()[0])
        opt.step()
        if len(expected) <= SCHEDULES[name][2]:
            sched.step()
    assert _schedule_values(name) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def _train_with_schedule(w: Tensor, opt: Any, sched: Any, loss: Any, steps: int) -> int:
    """Run `steps` steps of opt on loss(w) with `sched` stepped after each; returns the kernels compiled after the
    first two (a schedule's new values must not need a new kernel)."""
    with Tensor.train():
        for step in range(steps):
            if step == 2:
                compiled = len(engine_realize._kernel_cache)
            opt.zero_grad()
            loss(w).backward()
            opt.step()
            sched.step()
    return len(engine_realize._kernel_cache) - compiled


def test_schedule_step_changes_no_kernel_and_trains_with_new_lr() -> None:
    w = Tensor(np.zeros(2, np.float32))
    opt = SGD([w], lr=1.0)
    assert _train_with_schedule(w, opt, StepLR(opt, step_size=1, gamma=0.5), lambda w: w.sum(), 4) == 0
    np.testing.assert_allclose(w.numpy(), -(1 + 0.5 + 0.25 + 0.125))


def test_onecycle_refuses_to_step_past_total_steps() -> None:
    sched = OneCycleLR(SGD([Tensor(np.ones(2, np.float32))]), max_lr=0.1, total_steps=3)
    for _ in range(3):
        sched.step()
    with pytest.raises(ValueError, match="total_steps is 3"):
        sched.step()


def test_onecycle_starts_at_max_lr_over_div_factor() -> None:
    opt = SGD([Tensor(np.ones(2, np.float32))], lr=123.0)
    OneCycleLR(opt, max_lr=0.5, total_steps=10, div_factor=5)
    assert opt.lr.item() == pytest.approx(0.1)


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.1),
                                  lambda ps: AdamW(ps, lr=0.1), lambda ps: LAMB(ps, lr=0.1)],
                         ids=["sgd", "adam", "adamw", "lamb"])
def test_steps_scheduled_without_realizing_match_eager_steps(make: Callable[[list[Tensor]], Optimizer]) -> None:
    """`opt.schedule_step()` three times with nothing realized in between (tinygrad's stunning_mnist style): the
    state (Adam's step count `t`, the moments) is written again while its last write is pending. Same losses and
    weights as realizing every step. (Adam once failed inside the scheduler here: the count's last write had
    recorded lineage, which the next backward substituted into the pending write's target.)"""
    _check_lazy_steps_match_eager_steps(make, steps=3)


def _check_lazy_steps_match_eager_steps(make: Callable[[list[Tensor]], Optimizer], steps: int,
                                        read_at: int | None = None) -> None:
    """Three losses of a 3-element param, with `steps` optimizer steps between them, eager (`opt.step()`, the loss
    realized) and lazy (`opt.schedule_step()`, nothing realized; the gradient of loss `read_at` realized before its
    step): the same losses and final weights."""
    results = []
    for lazy in (False, True):
        w = Tensor([1.0, -2.0, 0.5], requires_grad=True)
        opt = make([w])
        losses = []
        with Tensor.train():
            for i in range(3):
                opt.zero_grad()
                losses.append(((w * w).sum() + w.sum()).backward())
                if lazy and i == read_at:
                    assert w.grad is not None
                    w.grad.realize()
                if i < steps:
                    if lazy:
                        opt.schedule_step()
                    else:
                        opt.step()
                        losses[-1].realize()
        results.append(([loss.item() for loss in losses], w.numpy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-6)


def test_optimizer_state_records_no_lineage() -> None:
    """State is never differentiated: it is marked requires_grad=False, so its writes keep no graph alive."""
    w = Tensor([1.0, 2.0], requires_grad=True)
    opt = Adam([w])
    assert all(s.requires_grad is False for s in opt.state())


def test_lr_has_tinygrads_shape_and_a_scheduler_written_for_tinygrad_drives_it() -> None:
    """`opt.lr` is a (1,) tensor as in tinygrad: tinygrad's extra/lr_scheduler.py reads `opt.lr.numpy()[0]` and
    writes `opt.lr.assign(<(1,) tensor>)`. Such a write changes the next step; a 0-d param keeps its shape."""
    w, s = Tensor([1.0, 2.0], requires_grad=True), Tensor(3.0, requires_grad=True)
    opt = SGD([w, s], lr=0.1)
    assert opt.lr.shape == (1,) and opt.lr.numpy()[0] == pytest.approx(0.1)
    with Tensor.train():
        for lr in (0.1, 0.5):
            opt.lr.assign(Tensor([lr])).realize()
            opt.zero_grad()
            ((w * w).sum() + s * s).backward()
            opt.step()
    np.testing.assert_allclose(w.numpy(), [0.0, 0.0], atol=1e-7)  # (1 - 2 * 0.1) then (1 - 2 * 0.5) times w
    assert s.shape == () and s.item() == pytest.approx(0.0, abs=1e-6)


ONECYCLE_OPTS: dict[str, tuple[Callable[[list[Tensor]], Optimizer], Callable[[Any, Any], Any], str]] = {
    "sgd": (lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda torch, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
            "momentum"),
    "sgd-no-momentum": (lambda ps: SGD(ps, lr=0.1), lambda torch, ps: torch.optim.SGD(ps, lr=0.1), "momentum"),
    "nesterov": (lambda ps: SGD(ps, lr=0.1, momentum=0.5, nesterov=True),
                 lambda torch, ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, nesterov=True), "momentum"),
    "adam": (lambda ps: Adam(ps, lr=0.1), lambda torch, ps: torch.optim.Adam(ps, lr=0.1), "b1"),
    "adamw": (lambda ps: AdamW(ps, lr=0.1, weight_decay=0.1),
              lambda torch, ps: torch.optim.AdamW(ps, lr=0.1, weight_decay=0.1), "b1"),
}


def _torch_momentum(opt: Any, name: str) -> float:
    group = opt.param_groups[0]
    return float(group["betas"][0] if name == "b1" else group["momentum"])


@pytest.mark.parametrize("three_phase, strategy", [(False, "cos"), (True, "linear")])
@pytest.mark.parametrize("which", list(ONECYCLE_OPTS))
def test_onecycle_cycles_momentum_as_torch(which: str, three_phase: bool, strategy: str) -> None:
    """OneCycleLR's default cycle_momentum=True: the momentum (SGD) or beta1 (Adam) moves from 0.95 down to 0.85 and
    back, step by step as in PyTorch, and the steps use it (the weights match torch's after every step)."""
    torch = pytest.importorskip("torch")
    make, make_torch, name = ONECYCLE_OPTS[which]
    w0 = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    w, tw = Tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
    opt, topt = make([w]), make_torch(torch, [tw])
    kw: dict[str, Any] = {"max_lr": 0.5, "total_steps": 12, "three_phase": three_phase, "anneal_strategy": strategy}
    sched, tsched = OneCycleLR(opt, **kw), torch.optim.lr_scheduler.OneCycleLR(topt, **kw)
    with Tensor.train():
        for step in range(12):
            assert getattr(opt, name) == pytest.approx(_torch_momentum(topt, name), rel=1e-12), step
            assert sched.get_last_lr()[0] == pytest.approx(tsched.get_last_lr()[0], rel=1e-9)
            opt.zero_grad()
            topt.zero_grad()
            ((w * w * w).sum() + w.sum()).backward()
            ((tw * tw * tw).sum() + tw.sum()).backward()
            opt.step()
            topt.step()
            np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-4, atol=5e-5, err_msg=f"step {step}")
            sched.step()
            tsched.step()


def test_onecycle_momentum_cycle_compiles_no_kernel_per_step() -> None:
    w = Tensor(np.zeros(3, np.float32), requires_grad=True)
    opt = Adam([w], lr=0.1)
    sched = OneCycleLR(opt, max_lr=0.5, total_steps=8)
    assert _train_with_schedule(w, opt, sched, lambda w: (w * w).sum(), 8) == 0


def test_onecycle_momentum_options() -> None:
    opt = SGD([Tensor(np.ones(2, np.float32))], lr=0.1, momentum=0.3)
    OneCycleLR(opt, max_lr=1.0, total_steps=10, cycle_momentum=False)
    assert opt.momentum == 0.3
    sched = OneCycleLR(opt, max_lr=1.0, epochs=2, steps_per_epoch=5, base_momentum=0.5, max_momentum=0.7)
    assert sched.total_steps == 10 and opt.momentum == pytest.approx(0.7)
    with pytest.raises(ValueError, match="total_steps"):
        OneCycleLR(opt, max_lr=1.0)
    with pytest.raises(ValueError, match="anneal_strategy"):
        OneCycleLR(opt, max_lr=1.0, total_steps=3, anneal_strategy="exp")


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9), lambda ps: Adam(ps, lr=0.1)],
                         ids=["sgd_momentum", "adam"])
@pytest.mark.parametrize("read_at", [1, 2])
def test_lazy_steps_with_a_gradient_read_in_between(make: Callable[[list[Tensor]], Optimizer], read_at: int) -> None:
    """Steps scheduled without realizing, and the gradient of step `read_at` read before its step: the gradients'
    graph (lineage put back for a backward through realized values) once held a second copy of the pending write
    that the loss reads, and a schedule holding both wrote it twice: the next loss and the weights came out as if
    updated twice, silently. Same losses and weights as eager steps."""
    _check_lazy_steps_match_eager_steps(make, steps=2, read_at=read_at)
