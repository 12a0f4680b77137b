"""The wide suite: untuned workloads (odd sizes, batch 1, strided and permuted inputs, small models), glassgrad
against PyTorch, for checking that a speed-up generalises beyond the default suite's named kernels.

In: a device (`CPU` or `CUDA`), rounds per workload, a name filter. Out: a table with each workload's median
glassgrad and PyTorch time per call and the ratio (PyTorch time / glassgrad time: above 1.00x glassgrad is faster),
then the geometric mean of the ratios. glassgrad and PyTorch calls alternate round by round, so a machine whose
speed drifts (shared, loaded) slows both alike. CUDA rows synchronise both libraries after every call; without
PyTorch, or on CUDA without a GPU, the suite prints why and exits cleanly.

    python bench/bench.py --suite wide [--device CUDA] [--only softmax] [--repeat 15]
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad import Device, Tensor

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # PyTorch is optional; this suite needs it
    torch = None


@dataclass
class Pair:
    """One workload: a glassgrad call and the PyTorch call computing the same thing (each returns after its work)."""
    name: str
    glassgrad: Callable[[], object]
    torch: Callable[[], object]


class Maker:
    """Random inputs, as realized glassgrad tensors and PyTorch tensors holding the same numbers."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.tdev = "cuda" if device.upper().startswith("CUDA") else "cpu"
        self.rng = np.random.default_rng(0)

    def array(self, *shape: int, scale: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)

    def pair(self, *shape: int, scale: float = 1.0, grad: bool = False) -> tuple[Tensor, Any]:
        a = self.array(*shape, scale=scale)
        g = Tensor(a, device=self.device, requires_grad=grad).realize()
        t = torch.from_numpy(a).to(self.tdev).requires_grad_(grad)
        return g, t

    def ints(self, high: int, *shape: int) -> tuple[Tensor, Any]:
        a = self.rng.integers(0, high, shape).astype(np.int32)
        return Tensor(a, device=self.device).realize(), torch.from_numpy(a).long().to(self.tdev)


def grads_gg(loss: Tensor, params: list[Tensor]) -> None:
    for p in params:
        p.grad = None
    loss.backward()
    Tensor.realize_all(loss, *[p.grad for p in params if p.grad is not None])


def grads_torch(loss: Any, params: list[Any]) -> None:
    for p in params:
        p.grad = None
    loss.backward()


def transformer_pairs(m: Maker) -> list[Pair]:
    """A pre-norm transformer block (LayerNorm, 4-head causal attention, GELU MLP) at width 128, sequence 64, batch 4:
    forward and backward of the sum of its output."""
    b, t, c, heads = 4, 64, 128, 4
    x = m.pair(b, t, c)
    names = ("wqkv", "wo", "w1", "w2")
    shapes = ((c, 3 * c), (c, c), (c, 4 * c), (4 * c, c))
    weights = {n: m.pair(*s, scale=s[0] ** -0.5, grad=True) for n, s in zip(names, shapes)}
    ln = {n: m.pair(c, scale=0.1, grad=True) for n in ("g1", "b1", "g2", "b2")}

    def block(lib: int, xx: Any) -> Any:
        w = {n: v[lib] for n, v in weights.items()}
        p = {n: v[lib] for n, v in ln.items()}
        norm = (lambda z, g, bb: z.layernorm(-1) * (1 + g) + bb) if lib == 0 else \
            (lambda z, g, bb: F.layer_norm(z, (c,)) * (1 + g) + bb)
        qkv = norm(xx, p["g1"], p["b1"]) @ w["wqkv"]
        q, k, v = (qkv[:, :, i * c:(i + 1) * c].reshape(b, t, heads, c // heads).transpose(1, 2) for i in range(3))
        if lib == 0:
            att = q.scaled_dot_product_attention(k, v, is_causal=True)
        else:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = xx + att.transpose(1, 2).reshape(b, t, c) @ w["wo"]
        up = norm(h, p["g2"], p["b2"]) @ w["w1"]
        act = up.gelu() if lib == 0 else F.gelu(up, approximate="tanh")
        return h + act @ w["w2"]

    params_gg = [v[0] for v in (*weights.values(), *ln.values())]
    params_t = [v[1] for v in (*weights.values(), *ln.values())]
    return [Pair(f"transformer block fwd+bwd b{b} t{t} c{c}",
                 lambda: grads_gg(block(0, x[0]).sum(), params_gg),
                 lambda: grads_torch(block(1, x[1]).sum(), params_t))]


def cnn_pairs(m: Maker) -> list[Pair]:
    """A small CNN of shapes unlike MNIST's: 8 x 3x64x64 images, a 5x5 stride-2 conv, a 1x1 conv, a 3x3 stride-2
    conv, global average pool, a linear layer; forward and backward of the mean cross-entropy."""
    x = m.pair(8, 3, 64, 64)
    w1, w2, w3 = m.pair(24, 3, 5, 5, scale=0.2, grad=True), m.pair(48, 24, 1, 1, scale=0.2, grad=True), \
        m.pair(64, 48, 3, 3, scale=0.05, grad=True)
    fc = m.pair(64, 10, scale=0.1, grad=True)
    labels = m.ints(10, 8)

    def gg() -> None:
        h = x[0].conv2d(w1[0], stride=2, padding=2).relu().conv2d(w2[0]).relu()
        h = h.conv2d(w3[0], stride=2, padding=1).relu().mean((2, 3))
        grads_gg((h @ fc[0]).cross_entropy(labels[0]), [w1[0], w2[0], w3[0], fc[0]])

    def tt() -> None:
        h = F.relu(F.conv2d(F.relu(F.conv2d(x[1], w1[1], stride=2, padding=2)), w2[1]))
        h = F.relu(F.conv2d(h, w3[1], stride=2, padding=1)).mean((2, 3))
        grads_torch(F.cross_entropy(h @ fc[1], labels[1]), [w1[1], w2[1], w3[1], fc[1]])
    return [Pair("CNN fwd+bwd 8x3x64x64 5x5s2,1x1,3x3s2", gg, tt)]


def wide_pairs(device: str) -> list[Pair]:
    """The suite's workloads, in a fixed order."""
    m = Maker(device)
    work: list[Pair] = []

    a, b = m.pair(1000, 77), m.pair(77, 1023)
    work.append(Pair("matmul 1000x77 @ 77x1023", lambda: (a[0] @ b[0]).realize(), lambda: a[1] @ b[1]))
    v, w, bias = m.pair(1, 1024), m.pair(1024, 1000), m.pair(1000)
    work.append(Pair("GEMV linear 1x1024 -> 1000 (+bias)", lambda: (v[0] @ w[0] + bias[0]).realize(),
                     lambda: v[1] @ w[1] + bias[1]))
    at, bt = m.pair(1023, 513), m.pair(1023, 257)
    work.append(Pair("matmul A.T @ B (1023 reduced, 513x257)", lambda: (at[0].permute(1, 0) @ bt[0]).realize(),
                     lambda: at[1].permute(1, 0) @ bt[1]))
    col, row, bb = m.pair(1000, 1), m.pair(1, 1023), m.pair(1023)
    work.append(Pair("broadcast (col*row+bias).tanh() 1000x1023",
                     lambda: (col[0] * row[0] + bb[0]).tanh().realize(), lambda: (col[1] * row[1] + bb[1]).tanh()))
    big = m.pair(2048, 2048)
    work.append(Pair("strided x[:, ::2]*2+1 2048x2048", lambda: (big[0][:, ::2] * 2 + 1).realize(),
                     lambda: big[1][:, ::2] * 2 + 1))
    p = m.pair(1000, 1023)
    work.append(Pair("permute+add x.T + 1 1000x1023", lambda: (p[0].permute(1, 0) + 1).realize(),
                     lambda: (p[1].permute(1, 0) + 1).contiguous()))
    work.append(Pair("sum(axis=0) 1000x1023", lambda: p[0].sum(axis=0).realize(), lambda: p[1].sum(dim=0)))
    work.append(Pair("sum(axis=1) 1000x1023", lambda: p[0].sum(axis=1).realize(), lambda: p[1].sum(dim=1)))
    img = m.pair(32, 64, 28, 28)
    work.append(Pair("mean over (0,2,3) 32x64x28x28", lambda: img[0].mean((0, 2, 3)).realize(),
                     lambda: img[1].mean((0, 2, 3))))
    work.append(Pair("layernorm 1000x1023", lambda: p[0].layernorm(-1).realize(),
                     lambda: F.layer_norm(p[1], (1023,))))
    s77 = m.pair(4096, 77)
    work.append(Pair("softmax rows of 77 (4096x77)", lambda: s77[0].softmax(-1).realize(),
                     lambda: s77[1].softmax(-1)))
    s1000 = m.pair(1000, 1000)
    work.append(Pair("softmax rows of 1000 (1000x1000)", lambda: s1000[0].softmax(-1).realize(),
                     lambda: s1000[1].softmax(-1)))
    work.append(Pair("softmax(axis=0) 1000x1000", lambda: s1000[0].softmax(0).realize(),
                     lambda: s1000[1].softmax(0)))
    table, idx = m.pair(8192, 256), m.ints(8192, 1000)
    work.append(Pair("embedding 1000 of 8192x256", lambda: idx[0].embedding(table[0]).realize(),
                     lambda: F.embedding(idx[1], table[1])))
    logits, labels = m.pair(64, 8192), m.ints(8192, 64)
    work.append(Pair("cross-entropy b64 vocab 8192", lambda: logits[0].cross_entropy(labels[0]).realize(),
                     lambda: F.cross_entropy(logits[1], labels[1])))
    one, cw = m.pair(1, 3, 224, 224), m.pair(32, 3, 3, 3)
    work.append(Pair("conv2d batch 1 3x224x224->32 3x3 s2", lambda: one[0].conv2d(cw[0], stride=2).realize(),
                     lambda: F.conv2d(one[1], cw[1], stride=2)))
    work.append(Pair("gelu 1000x1023", lambda: p[0].gelu().realize(), lambda: F.gelu(p[1], approximate="tanh")))
    work += transformer_pairs(m)
    work += cnn_pairs(m)
    return work


def _timed(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def compare(pair: Pair, rounds: int, gg_sync: Callable[[], None], torch_sync: Callable[[], None],
            warmup: int = 2) -> tuple[float, float]:
    """(glassgrad, PyTorch) median seconds per call, the two alternating round by round after warm-up calls."""
    for _ in range(warmup):
        _timed(pair.glassgrad, gg_sync)
        _timed(pair.torch, torch_sync)
    gg, tt = [], []
    for _ in range(rounds):
        gg.append(_timed(pair.glassgrad, gg_sync))
        tt.append(_timed(pair.torch, torch_sync))
    return statistics.median(gg), statistics.median(tt)


def run_wide(device: str, rounds: int, only: str = "") -> None:
    """Print the wide suite's table for `device` (or why it cannot run here)."""
    if torch is None:
        print("the wide suite compares against PyTorch, which is not installed: skipped")
        return
    cuda = device.upper().startswith("CUDA")
    if cuda and not torch.cuda.is_available():
        print(f"the wide suite on {device} needs a CUDA GPU for PyTorch; none here: skipped")
        return
    try:
        dev = Device[device]
    except Exception as e:  # no driver, no NVRTC: say so and stop, never crash
        print(f"glassgrad's {device} device is not available ({type(e).__name__}: {e}): skipped")
        return
    torch_sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    print(f"wide suite, device {device}; torch {torch.__version__} ({torch.get_num_threads()} threads); "
          f"{rounds} alternating rounds, medians")
    header = f"{'workload':<42} {'glassgrad':>11} {'torch':>11} {'torch/gg':>9}"
    print(header)
    print("-" * len(header))
    ratios = []
    for pair in wide_pairs(device):
        if only.lower() not in pair.name.lower():
            continue
        try:
            t_gg, t_torch = compare(pair, rounds, dev.synchronize, torch_sync)
        except Exception as e:  # a failing workload is reported (and left out of the mean), the rest still run
            print(f"{pair.name:<42} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80]}", flush=True)
            continue
        ratios.append(t_torch / t_gg)
        print(f"{pair.name:<42} {t_gg * 1e3:9.3f}ms {t_torch * 1e3:9.3f}ms {ratios[-1]:8.2f}x", flush=True)
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"{f'geometric mean of the {len(ratios)} ratios':<66} {geomean:8.2f}x")
    print("ratios are PyTorch time / glassgrad time: above 1.00x glassgrad is faster")
