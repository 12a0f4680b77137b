"""A zoo of small models as users write them (glassgrad.nn layers and Tensor ops, the way tinygrad's examples and a
PyTorch user would), each with a PyTorch twin holding the same weights: the forward output, the loss, every
parameter's gradient, and every state entry (parameters and BatchNorm's running statistics) after 3 optimiser steps
must agree. Sizes are small and shapes odd (batch 1, 7x7 and 13x13 images, 3/5/17 channels).

Every tensor is created on glassgrad's default device, so `DEV=CUDA` (or `DEV=METAL` with the emulator) runs the
whole zoo there. Without PyTorch the file skips.

Two things that look like bugs and are not: a bias whose gradient is exactly 0 in exact arithmetic (before a
BatchNorm or InstanceNorm, an attention key's, a score before a softmax) gets rounding noise of either sign in both
libraries, which Adam's m / sqrt(v) turns into full-size steps; such biases are left out. And over several steps
float32 rounding can flip a max-pool or ReLU decision (PyTorch in float32 and float64 part the same way), after which
the trajectories differ: the wider ResNet takes one step."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from torch_optional import F, torch

from glassgrad import Tensor, nn
from glassgrad.nn.state import get_parameters, get_state_dict

pytestmark = pytest.mark.skipif(torch is None, reason="PyTorch not installed")
tnn: Any = torch.nn if torch is not None else None
TorchModule: Any = tnn.Module if tnn is not None else object

FWD_RTOL, GRAD_RTOL = 1e-5, 1e-4


# ---------------------------------------------------------------------- harness
def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _randn(*shape: int, seed: int = 0) -> np.ndarray:
    return _rng(seed).standard_normal(shape).astype(np.float32)


def _close(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> None:
    """allclose with an atol scaled to the reference's magnitude (a gradient entry that cancels to ~0 is compared to
    the tensor's scale, not to itself)."""
    scale = float(np.abs(want).max()) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale + 1e-7, err_msg=what)


def _load(model: Any, tmodel: Any, rename: Callable[[str], str] = lambda k: k) -> None:
    """Copy the PyTorch twin's state into the glassgrad model (the keys must be the same sets)."""
    ours = get_state_dict(model)
    theirs = {rename(k): v for k, v in tmodel.state_dict().items()}
    assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
    for name, value in theirs.items():
        ours[name].assign(Tensor(value.detach().numpy().copy(), dtype=ours[name].dtype)).realize()


def _compare_state(model: Any, tmodel: Any, rtol: float, rename: Callable[[str], str] = lambda k: k) -> None:
    ours = get_state_dict(model)
    for name, value in tmodel.state_dict().items():
        _close(ours[rename(name)].numpy(), value.detach().numpy(), rtol, f"state {name}")


def _compare_grads(model: Any, tmodel: Any, rename: Callable[[str], str] = lambda k: k) -> None:
    ours = get_state_dict(model)
    for name, p in tmodel.named_parameters():
        mine = ours[rename(name)]
        if p.grad is None:
            assert mine.grad is None or not np.any(mine.grad.numpy()), name
            continue
        assert mine.grad is not None, f"no gradient for {name}"
        _close(mine.grad.numpy(), p.grad.numpy(), GRAD_RTOL, f"grad {name}")


def _torch_in(x: Any) -> Any:
    return torch.from_numpy(x.copy()) if isinstance(x, np.ndarray) else x


def _ours_in(x: Any) -> Any:
    return Tensor(x) if isinstance(x, np.ndarray) else x


def train_and_compare(model: Any, tmodel: Any, inputs: Sequence[Any], fwd: Callable[..., Tensor],
                      tfwd: Callable[..., Any], loss: Callable[..., Tensor], tloss: Callable[..., Any],
                      targets: Sequence[Any], make_opt: Callable[[list[Tensor]], Any],
                      make_topt: Callable[[Any], Any], steps: int = 3, clip: float | None = None,
                      sched: tuple[Callable[[Any], Any], Callable[[Any], Any]] | None = None,
                      rename: Callable[[str], str] = lambda k: k, rtol: float = GRAD_RTOL) -> None:
    """`steps` training steps of both models, PyTorch habits (zero_grad, forward, loss, backward, [clip], step,
    [schedule step]). Step 0 compares the output, the loss and every gradient; every step compares the loss (and the
    clipped norm); at the end every state entry must agree."""
    _load(model, tmodel, rename)
    params = get_parameters(model)
    opt, topt = make_opt(params), make_topt(tmodel.parameters())
    scheds = (sched[0](opt), sched[1](topt)) if sched else None
    tmodel.train()
    xs, txs = [_ours_in(x) for x in inputs], [_torch_in(x) for x in inputs]
    ys, tys = [_ours_in(y) for y in targets], [_torch_in(y) for y in targets]
    for step in range(steps):
        topt.zero_grad()
        tout = tfwd(tmodel, *txs)
        tl = tloss(tout, *tys)
        tl.backward()
        tnorm = torch.nn.utils.clip_grad_norm_(tmodel.parameters(), clip).item() if clip is not None else None
        with Tensor.train():
            opt.zero_grad()
            out = fwd(model, *xs)
            lv = loss(out, *ys)
            lv.backward()
            norm = nn.utils.clip_grad_norm_(params, clip).item() if clip is not None else None
            if step == 0:
                _close(out.numpy(), tout.detach().numpy(), FWD_RTOL * 10, "forward output")
                _compare_grads(model, tmodel, rename)
            opt.step()
        topt.step()
        if scheds:
            scheds[0].step()
            scheds[1].step()
        assert lv.item() == pytest.approx(tl.item(), rel=FWD_RTOL * 10, abs=1e-6), f"loss at step {step}"
        if clip is not None:
            assert norm == pytest.approx(tnorm, rel=1e-4), f"gradient norm at step {step}"
    _compare_state(model, tmodel, rtol, rename)


def _eval_compare(model: Any, tmodel: Any, inputs: Sequence[Any], fwd: Callable[..., Tensor],
                  tfwd: Callable[..., Any]) -> None:
    tmodel.eval()
    with torch.no_grad():
        want = tfwd(tmodel, *[_torch_in(x) for x in inputs]).numpy()
    with Tensor.test():
        got = fwd(model, *[_ours_in(x) for x in inputs]).numpy()
    _close(got, want, FWD_RTOL * 10, "eval forward")


def _call(m: Any, *xs: Any) -> Any:
    return m(*xs)


def _ce(out: Tensor, y: Tensor) -> Tensor:
    return out.cross_entropy(y)


def _tce(out: Any, y: Any) -> Any:
    return F.cross_entropy(out, y)


def _mse(out: Tensor, y: Tensor) -> Tensor:
    return ((out - y) ** 2).mean()


def _tmse(out: Any, y: Any) -> Any:
    return F.mse_loss(out, y)


def _labels(n: int, classes: int, seed: int = 1) -> np.ndarray:
    return _rng(seed).integers(0, classes, n).astype(np.int64)


# ---------------------------------------------------------------------- ResNet-style CNN
class Block:
    """conv-BN-ReLU-conv-BN plus a shortcut (a strided 1x1 conv + BN where the shape changes), then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = [nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)] \
            if stride != 1 or cin != cout else []

    def __call__(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv2(self.bn1(self.conv1(x)).relu()))
        return (out + (x.sequential(self.down) if self.down else x)).relu()


class ResNet:
    def __init__(self, cin: int, width: int, classes: int) -> None:
        self.conv = nn.Conv2d(cin, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.layers = [Block(width, width, 1), Block(width, 2 * width, 2)]
        self.fc = nn.Linear(2 * width, classes)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn(self.conv(x)).relu().max_pool2d(3, 2, padding=1)
        return self.fc(x.sequential(self.layers).mean((2, 3)))


if torch is not None:
    class TBlock(tnn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.down = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)) \
                if stride != 1 or cin != cout else tnn.Sequential()

        def forward(self, x: Any) -> Any:
            out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(out + self.down(x))

    class TResNet(tnn.Module):
        def __init__(self, cin: int, width: int, classes: int) -> None:
            super().__init__()
            self.conv = tnn.Conv2d(cin, width, 3, padding=1, bias=False)
            self.bn = tnn.BatchNorm2d(width)
            self.layers = tnn.Sequential(TBlock(width, width, 1), TBlock(width, 2 * width, 2))
            self.fc = tnn.Linear(2 * width, classes)

        def forward(self, x: Any) -> Any:
            x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, padding=1)
            return self.fc(self.layers(x).mean((2, 3)))


@pytest.mark.parametrize("batch, cin, hw, width", [(2, 3, 13, 5), (1, 17, 7, 4), (3, 5, 8, 3)])
def test_resnet_trains_then_evaluates_like_torch(batch: int, cin: int, hw: int, width: int) -> None:
    torch.manual_seed(0)
    x, y = _randn(batch, cin, hw, hw), _labels(batch, 3)
    model, tmodel = ResNet(cin, width, 3), TResNet(cin, width, 3)
    train_and_compare(model, tmodel, [x], _call, _call, _ce, _tce, [y],
                      lambda p: nn.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3),
                      lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-3))
    _eval_compare(model, tmodel, [_randn(batch, cin, hw, hw, seed=5)], _call, _call)


# ---------------------------------------------------------------------- UNet-ish encoder/decoder
class UNet:
    """Two avg-pool downsamplings, a bilinear upsampling back to the skip's size, a ConvTranspose2d upsampling (and
    a nearest resize where the size is odd), channel concat skips."""

    def __init__(self, cin: int, c: int) -> None:
        self.enc1 = nn.Conv2d(cin, c, 3, padding=1)
        self.enc2 = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.mid = nn.Conv2d(2 * c, 2 * c, 3, padding=1)
        self.dec2 = nn.Conv2d(4 * c, c, 3, padding=1)
        self.up1 = nn.ConvTranspose2d(c, c, 2, stride=2)
        self.dec1 = nn.Conv2d(2 * c, c, 3, padding=1)
        self.head = nn.Conv2d(c, 1, 1)

    def __call__(self, x: Tensor) -> Tensor:
        e1 = self.enc1(x).relu()
        e2 = self.enc2(e1.avg_pool2d(2)).relu()
        m = self.mid(e2.avg_pool2d(2)).relu()
        u2 = m.interpolate(size=e2.shape[-2:], mode="bilinear")
        d2 = self.dec2(u2.cat(e2, dim=1)).relu()
        u1 = self.up1(d2)
        if u1.shape[-2:] != e1.shape[-2:]:
            u1 = u1.interpolate(size=e1.shape[-2:], mode="nearest")
        return self.head(self.dec1(Tensor.cat(u1, e1, dim=1)).relu())


if torch is not None:
    class TUNet(tnn.Module):
        def __init__(self, cin: int, c: int) -> None:
            super().__init__()
            self.enc1 = tnn.Conv2d(cin, c, 3, padding=1)
            self.enc2 = tnn.Conv2d(c, 2 * c, 3, padding=1)
            self.mid = tnn.Conv2d(2 * c, 2 * c, 3, padding=1)
            self.dec2 = tnn.Conv2d(4 * c, c, 3, padding=1)
            self.up1 = tnn.ConvTranspose2d(c, c, 2, stride=2)
            self.dec1 = tnn.Conv2d(2 * c, c, 3, padding=1)
            self.head = tnn.Conv2d(c, 1, 1)

        def forward(self, x: Any) -> Any:
            e1 = F.relu(self.enc1(x))
            e2 = F.relu(self.enc2(F.avg_pool2d(e1, 2)))
            m = F.relu(self.mid(F.avg_pool2d(e2, 2)))
            u2 = F.interpolate(m, size=e2.shape[-2:], mode="bilinear")
            d2 = F.relu(self.dec2(torch.cat([u2, e2], 1)))
            u1 = self.up1(d2)
            if u1.shape[-2:] != e1.shape[-2:]:
                u1 = F.interpolate(u1, size=e1.shape[-2:], mode="nearest")
            return self.head(F.relu(self.dec1(torch.cat([u1, e1], 1))))


@pytest.mark.parametrize("batch, cin, hw, c", [(2, 3, 8, 4), (1, 5, 13, 3), (2, 17, 7, 2)])
def test_unet_trains_like_torch(batch: int, cin: int, hw: int, c: int) -> None:
    torch.manual_seed(1)
    x, y = _randn(batch, cin, hw, hw), _randn(batch, 1, hw, hw, seed=2)
    train_and_compare(UNet(cin, c), TUNet(cin, c), [x], _call, _call, _mse, _tmse, [y],
                      lambda p: nn.optim.Adam(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2))


# ---------------------------------------------------------------------- recurrent nets unrolled in Python
class LSTM:
    def __init__(self, nin: int, hidden: int, classes: int) -> None:
        self.hidden = hidden
        self.ih, self.hh = nn.Linear(nin, 4 * hidden), nn.Linear(hidden, 4 * hidden)
        self.fc = nn.Linear(hidden, classes)

    def __call__(self, x: Tensor) -> Tensor:
        h = c = Tensor.zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            i, f, g, o = (self.ih(x[:, t]) + self.hh(h)).chunk(4, dim=1)
            c = f.sigmoid() * c + i.sigmoid() * g.tanh()
            h = o.sigmoid() * c.tanh()
        return self.fc(h)


class GRU:
    def __init__(self, nin: int, hidden: int, classes: int) -> None:
        self.hidden = hidden
        self.ih, self.hh = nn.Linear(nin, 3 * hidden), nn.Linear(hidden, 3 * hidden)
        self.fc = nn.Linear(hidden, classes)

    def __call__(self, x: Tensor) -> Tensor:
        h = Tensor.zeros(x.shape[0], self.hidden)
        for t in range(x.shape[1]):
            xr, xz, xn = self.ih(x[:, t]).chunk(3, dim=1)
            hr, hz, hn = self.hh(h).chunk(3, dim=1)
            r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
            h = (1 - z) * (xn + r * hn).tanh() + z * h
        return self.fc(h)


class CellLSTM:
    """glassgrad's own nn.LSTMCell stepped over the sequence; compared against torch.nn.LSTM (keys without _l0)."""

    def __init__(self, nin: int, hidden: int, classes: int) -> None:
        self.cell, self.fc = nn.LSTMCell(nin, hidden), nn.Linear(hidden, classes)

    def __call__(self, x: Tensor) -> Tensor:
        hc = None
        for t in range(x.shape[1]):
            hc = self.cell(x[:, t], hc)
        assert hc is not None
        return self.fc(hc[0])


if torch is not None:
    class TLSTM(tnn.Module):
        def __init__(self, nin: int, hidden: int, classes: int) -> None:
            super().__init__()
            self.hidden = hidden
            self.ih, self.hh, self.fc = tnn.Linear(nin, 4 * hidden), tnn.Linear(hidden, 4 * hidden), \
                tnn.Linear(hidden, classes)

        def forward(self, x: Any) -> Any:
            h = c = torch.zeros(x.shape[0], self.hidden)
            for t in range(x.shape[1]):
                i, f, g, o = (self.ih(x[:, t]) + self.hh(h)).chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
            return self.fc(h)

    class TGRU(tnn.Module):
        def __init__(self, nin: int, hidden: int, classes: int) -> None:
            super().__init__()
            self.hidden = hidden
            self.ih, self.hh, self.fc = tnn.Linear(nin, 3 * hidden), tnn.Linear(hidden, 3 * hidden), \
                tnn.Linear(hidden, classes)

        def forward(self, x: Any) -> Any:
            h = torch.zeros(x.shape[0], self.hidden)
            for t in range(x.shape[1]):
                xr, xz, xn = self.ih(x[:, t]).chunk(3, dim=1)
                hr, hz, hn = self.hh(h).chunk(3, dim=1)
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                h = (1 - z) * torch.tanh(xn + r * hn) + z * h
            return self.fc(h)

    class TCellLSTM(tnn.Module):
        def __init__(self, nin: int, hidden: int, classes: int) -> None:
            super().__init__()
            self.cell, self.fc = tnn.LSTM(nin, hidden, batch_first=True), tnn.Linear(hidden, classes)

        def forward(self, x: Any) -> Any:
            return self.fc(self.cell(x)[0][:, -1])


_RNNS = {"lstm": (LSTM, "TLSTM"), "gru": (GRU, "TGRU"), "lstmcell": (CellLSTM, "TCellLSTM")}


@pytest.mark.parametrize("kind, batch", [("lstm", 3), ("gru", 1), ("lstmcell", 2)])
def test_rnn_sequence_classifier_trains_like_torch(kind: str, batch: int) -> None:
    torch.manual_seed(2)
    ours, theirs = _RNNS[kind]
    model, tmodel = ours(5, 7, 3), globals()[theirs](5, 7, 3)
    x, y = _randn(batch, 12, 5), _labels(batch, 3)
    train_and_compare(model, tmodel, [x], _call, _call, _ce, _tce, [y],
                      lambda p: nn.optim.Adam(p, lr=2e-2), lambda p: torch.optim.Adam(p, lr=2e-2),
                      rename=lambda k: k.replace("_l0", ""))


# ---------------------------------------------------------------------- transformer encoder and causal decoder
class Attention:
    def __init__(self, dim: int, heads: int) -> None:
        self.heads = heads  # the key has no bias (as Whisper's): its gradient is 0 up to rounding noise, which Adam
        # would turn into full-size steps of either sign
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def __call__(self, x: Tensor, pad: Tensor | None = None, causal: bool = False) -> Tensor:
        b, t, d = x.shape
        q, k, v = (f(x).reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for f in (self.q, self.k, self.v))
        if causal:
            out = q.scaled_dot_product_attention(k, v, is_causal=True)
        else:
            att = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            if pad is not None:
                att = att.masked_fill(pad.reshape(b, 1, 1, t), float("-inf"))
            out = att.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(b, t, d))


class EncoderBlock:
    def __init__(self, dim: int, heads: int) -> None:
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(dim), Attention(dim, heads), nn.LayerNorm(dim)
        self.fc1, self.fc2, self.drop = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim), nn.Dropout(0.0)

    def __call__(self, x: Tensor, pad: Tensor | None = None, causal: bool = False) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x), pad, causal))
        return x + self.drop(self.fc2(self.fc1(self.ln2(x)).gelu(approximate="none")))


class Classifier:
    """Token embedding + a learned position table, one encoder block, mean over the unpadded tokens."""

    def __init__(self, vocab: int, dim: int, heads: int, seq: int, classes: int) -> None:
        self.tok, self.pos = nn.Embedding(vocab, dim), Tensor.randn(seq, dim) * 0.1
        self.block, self.ln, self.fc = EncoderBlock(dim, heads), nn.LayerNorm(dim), nn.Linear(dim, classes)

    def __call__(self, idx: Tensor, pad: Tensor) -> Tensor:
        x = self.ln(self.block(self.tok(idx) + self.pos, pad))
        keep = (~pad).float().unsqueeze(-1)
        return self.fc((x * keep).sum(1) / keep.sum(1))


class Decoder:
    """A causal decoder whose output projection is the token embedding (tied weights)."""

    def __init__(self, vocab: int, dim: int, heads: int, seq: int) -> None:
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks, self.ln = [EncoderBlock(dim, heads) for _ in range(2)], nn.LayerNorm(dim)

    def __call__(self, idx: Tensor) -> Tensor:
        x = self.tok(idx) + self.pos(Tensor.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x, causal=True)
        return self.ln(x) @ self.tok.weight.T


if torch is not None:
    class TAttention(tnn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.q, self.k, self.v = tnn.Linear(dim, dim), tnn.Linear(dim, dim, bias=False), tnn.Linear(dim, dim)
            self.proj = tnn.Linear(dim, dim)

        def forward(self, x: Any, pad: Any = None, causal: bool = False) -> Any:
            b, t, d = x.shape
            q, k, v = (f(x).reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for f in (self.q, self.k, self.v))
            if causal:
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
                if pad is not None:
                    att = att.masked_fill(pad.reshape(b, 1, 1, t), float("-inf"))
                out = att.softmax(-1) @ v
            return self.proj(out.transpose(1, 2).reshape(b, t, d))

    class TEncoderBlock(tnn.Module):
        def __init__(self, dim: int, heads: int) -> None:
            super().__init__()
            self.ln1, self.attn, self.ln2 = tnn.LayerNorm(dim), TAttention(dim, heads), tnn.LayerNorm(dim)
            self.fc1, self.fc2, self.drop = tnn.Linear(dim, 2 * dim), tnn.Linear(2 * dim, dim), tnn.Dropout(0.0)

        def forward(self, x: Any, pad: Any = None, causal: bool = False) -> Any:
            x = x + self.drop(self.attn(self.ln1(x), pad, causal))
            return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

    class TClassifier(tnn.Module):
        def __init__(self, vocab: int, dim: int, heads: int, seq: int, classes: int) -> None:
            super().__init__()
            self.tok, self.pos = tnn.Embedding(vocab, dim), tnn.Parameter(torch.randn(seq, dim) * 0.1)
            self.block, self.ln, self.fc = TEncoderBlock(dim, heads), tnn.LayerNorm(dim), tnn.Linear(dim, classes)

        def forward(self, idx: Any, pad: Any) -> Any:
            x = self.ln(self.block(self.tok(idx) + self.pos, pad))
            keep = (~pad).float().unsqueeze(-1)
            return self.fc((x * keep).sum(1) / keep.sum(1))

    class TDecoder(tnn.Module):
        def __init__(self, vocab: int, dim: int, heads: int, seq: int) -> None:
            super().__init__()
            self.tok, self.pos = tnn.Embedding(vocab, dim), tnn.Embedding(seq, dim)
            self.blocks = tnn.ModuleList([TEncoderBlock(dim, heads) for _ in range(2)])
            self.ln = tnn.LayerNorm(dim)

        def forward(self, idx: Any) -> Any:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x, causal=True)
            return self.ln(x) @ self.tok.weight.T


@pytest.mark.parametrize("batch", [3, 1])
def test_transformer_encoder_with_padding_mask_trains_like_torch(batch: int) -> None:
    torch.manual_seed(3)
    seq, vocab = 6, 11
    idx = _rng(4).integers(0, vocab, (batch, seq)).astype(np.int64)
    lengths = [seq, 3, 5][:batch] if batch > 1 else [4]
    pad = np.arange(seq)[None, :] >= np.array(lengths)[:, None]
    model, tmodel = Classifier(vocab, 8, 2, seq, 3), TClassifier(vocab, 8, 2, seq, 3)
    train_and_compare(model, tmodel, [idx, pad], _call, _call, _ce, _tce, [_labels(batch, 3)],
                      lambda p: nn.optim.AdamW(p, lr=1e-2), lambda p: torch.optim.AdamW(p, lr=1e-2))


def _lm_loss(logits: Tensor, y: Tensor) -> Tensor:
    return logits.reshape(-1, logits.shape[-1]).cross_entropy(y.reshape(-1))


def _tlm_loss(logits: Any, y: Any) -> Any:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@pytest.mark.parametrize("batch, seq", [(2, 7), (1, 5)])
def test_causal_decoder_with_tied_embeddings_trains_like_torch(batch: int, seq: int) -> None:
    torch.manual_seed(4)
    vocab = 13
    tokens = _rng(5).integers(0, vocab, (batch, seq + 1)).astype(np.int64)
    train_and_compare(Decoder(vocab, 8, 2, seq), TDecoder(vocab, 8, 2, seq), [tokens[:, :-1].copy()], _call, _call,
                      _lm_loss, _tlm_loss, [tokens[:, 1:].copy()],
                      lambda p: nn.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
                      lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1))


# ---------------------------------------------------------------------- MLPs and optimisers
class MLP:
    def __init__(self, sizes: Sequence[int]) -> None:
        self.layers = [nn.Linear(a, b) for a, b in zip(sizes, sizes[1:])]

    def __call__(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = layer(x).silu()
        return self.layers[-1](x)


if torch is not None:
    class TMLP(tnn.Module):
        def __init__(self, sizes: Sequence[int]) -> None:
            super().__init__()
            self.layers = tnn.ModuleList([tnn.Linear(a, b) for a, b in zip(sizes, sizes[1:])])

        def forward(self, x: Any) -> Any:
            for layer in self.layers[:-1]:
                x = F.silu(layer(x))
            return self.layers[-1](x)


_OPTIMIZERS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "adamw": (lambda p: nn.optim.AdamW(p, lr=3e-2, weight_decay=0.05),
              lambda p: torch.optim.AdamW(p, lr=3e-2, weight_decay=0.05)),
    "sgd_nesterov": (lambda p: nn.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
                     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    "adam_amsgrad": (lambda p: nn.optim.Adam(p, lr=3e-2, amsgrad=True, weight_decay=1e-2),
                     lambda p: torch.optim.Adam(p, lr=3e-2, amsgrad=True, weight_decay=1e-2)),
    "adamw_amsgrad": (lambda p: nn.optim.AdamW(p, lr=3e-2, amsgrad=True),
                      lambda p: torch.optim.AdamW(p, lr=3e-2, amsgrad=True)),
}
_SCHEDULES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]] | None] = {
    "none": None,
    "cosine": (lambda o: nn.lr.CosineAnnealingLR(o, T_max=4),
               lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 4)),
    "onecycle": (lambda o: nn.lr.OneCycleLR(o, max_lr=5e-2, total_steps=5),
                 lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=5e-2, total_steps=5)),
    "step": (lambda o: nn.lr.StepLR(o, step_size=2, gamma=0.3),
             lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.3)),
}


@pytest.mark.parametrize("opt, schedule, clip", [("adamw", "onecycle", 0.5), ("adamw", "cosine", None),
                                                 ("sgd_nesterov", "cosine", 1.0), ("adam_amsgrad", "none", 0.3),
                                                 ("adamw_amsgrad", "onecycle", None), ("sgd_nesterov", "onecycle", 2.0),
                                                 ("adam_amsgrad", "step", None)])
def test_mlp_optimizers_clipping_and_schedules_match_torch(opt: str, schedule: str, clip: float | None) -> None:
    torch.manual_seed(5)
    x, y = _randn(9, 5), _randn(9, 3, seed=3)
    make_opt, make_topt = _OPTIMIZERS[opt]
    train_and_compare(MLP([5, 17, 17, 3]), TMLP([5, 17, 17, 3]), [x], _call, _call, _mse, _tmse, [y], make_opt,
                      make_topt, steps=4, clip=clip, sched=_SCHEDULES[schedule])


# ---------------------------------------------------------------------- separable / dilated / 1-d convs, odd losses
class SeparableNet:
    def __init__(self, cin: int, c: int, classes: int) -> None:
        self.stem = nn.Conv2d(cin, c, 3, padding=1)
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c)
        self.pw = nn.Conv2d(c, c, 1)
        self.dil = nn.Conv2d(c, c, 3, padding=2, dilation=2)
        self.grouped = nn.Conv2d(c, 2 * c, 3, stride=2, groups=c, bias=False)
        self.fc = nn.Linear(2 * c, classes)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.stem(x).relu6()
        x = self.pw(self.dw(x)).relu() + x
        x = self.dil(x).leaky_relu(0.1)
        return self.fc(self.grouped(x).mean((2, 3)))


class TextCNN:
    """Embedding, Conv1d over the sequence (a dilated one too), and a mean-pooled Embedding bag beside it."""

    def __init__(self, vocab: int, dim: int, c: int, classes: int) -> None:
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv1d(dim, c, 3, padding=1)
        self.conv2 = nn.Conv1d(c, c, 3, padding=2, dilation=2)
        self.fc = nn.Linear(c + dim, classes)

    def __call__(self, idx: Tensor) -> Tensor:
        e = self.emb(idx)
        h = self.conv2(self.conv(e.permute(0, 2, 1)).tanh()).relu().max(-1)
        return self.fc(h.cat(e.mean(1), dim=1))


if torch is not None:
    class TSeparableNet(tnn.Module):
        def __init__(self, cin: int, c: int, classes: int) -> None:
            super().__init__()
            self.stem = tnn.Conv2d(cin, c, 3, padding=1)
            self.dw = tnn.Conv2d(c, c, 3, padding=1, groups=c)
            self.pw = tnn.Conv2d(c, c, 1)
            self.dil = tnn.Conv2d(c, c, 3, padding=2, dilation=2)
            self.grouped = tnn.Conv2d(c, 2 * c, 3, stride=2, groups=c, bias=False)
            self.fc = tnn.Linear(2 * c, classes)

        def forward(self, x: Any) -> Any:
            x = F.relu6(self.stem(x))
            x = F.relu(self.pw(self.dw(x))) + x
            x = F.leaky_relu(self.dil(x), 0.1)
            return self.fc(self.grouped(x).mean((2, 3)))

    class TTextCNN(tnn.Module):
        def __init__(self, vocab: int, dim: int, c: int, classes: int) -> None:
            super().__init__()
            self.emb = tnn.Embedding(vocab, dim)
            self.conv = tnn.Conv1d(dim, c, 3, padding=1)
            self.conv2 = tnn.Conv1d(c, c, 3, padding=2, dilation=2)
            self.fc = tnn.Linear(c + dim, classes)

        def forward(self, idx: Any) -> Any:
            e = self.emb(idx)
            h = F.relu(self.conv2(torch.tanh(self.conv(e.permute(0, 2, 1))))).amax(-1)
            return self.fc(torch.cat([h, e.mean(1)], 1))


def _focal(out: Tensor, y: Tensor, gamma: float = 2.0) -> Tensor:
    logp = out.log_softmax(1)
    picked = (logp * y.one_hot(out.shape[1])).sum(1)
    return (-((1 - picked.exp()) ** gamma) * picked).mean()


def _tfocal(out: Any, y: Any, gamma: float = 2.0) -> Any:
    logp = F.log_softmax(out, 1).gather(1, y[:, None])[:, 0]
    return (-((1 - logp.exp()) ** gamma) * logp).mean()


_LOSSES = {"focal": (_focal, _tfocal),
           "smooth": (lambda o, y: o.cross_entropy(y, label_smoothing=0.1),
                      lambda o, y: F.cross_entropy(o, y, label_smoothing=0.1))}


@pytest.mark.parametrize("batch, cin, hw, c, lossname", [(2, 3, 13, 5, "focal"), (1, 17, 7, 5, "smooth"),
                                                         (3, 5, 7, 3, "smooth")])
def test_separable_dilated_grouped_convs_train_like_torch(batch: int, cin: int, hw: int, c: int,
                                                          lossname: str) -> None:
    torch.manual_seed(6)
    loss, tloss = _LOSSES[lossname]
    train_and_compare(SeparableNet(cin, c, 3), TSeparableNet(cin, c, 3), [_randn(batch, cin, hw, hw)], _call, _call,
                      loss, tloss, [_labels(batch, 3)], lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.9),
                      lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))


@pytest.mark.parametrize("batch, seq, lossname", [(4, 9, "focal"), (1, 12, "smooth")])
def test_text_cnn_with_embedding_mean_pool_trains_like_torch(batch: int, seq: int, lossname: str) -> None:
    torch.manual_seed(7)
    loss, tloss = _LOSSES[lossname]
    idx = _rng(8).integers(0, 17, (batch, seq)).astype(np.int64)
    train_and_compare(TextCNN(17, 6, 5, 3), TTextCNN(17, 6, 5, 3), [idx], _call, _call, loss, tloss,
                      [_labels(batch, 3)], lambda p: nn.optim.Adam(p, lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2))


# ---------------------------------------------------------------------- GAN with transposed convs and BatchNorm
class Generator:
    def __init__(self, nz: int, c: int) -> None:
        self.up0 = nn.ConvTranspose2d(nz, 2 * c, 3, 1, 0, bias=False)
        self.bn0 = nn.BatchNorm2d(2 * c)
        self.up1 = nn.ConvTranspose2d(2 * c, c, 4, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.up2 = nn.ConvTranspose2d(c, 1, 3, 2, 1, output_padding=1)

    def __call__(self, z: Tensor) -> Tensor:
        x = self.bn0(self.up0(z)).relu()
        return self.up2(self.bn1(self.up1(x)).relu()).tanh()  # 1x1 -> 3x3 -> 6x6 -> 12x12


class Discriminator:
    def __init__(self, c: int) -> None:
        self.conv0 = nn.Conv2d(1, c, 4, 2, 1)
        self.conv1 = nn.Conv2d(c, 2 * c, 4, 2, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(2 * c)
        self.fc = nn.Linear(2 * c * 9, 1)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.conv0(x).leaky_relu(0.2)
        return self.fc(self.bn1(self.conv1(x)).leaky_relu(0.2).flatten(1))


class GAN:
    def __init__(self, nz: int, c: int) -> None:
        self.g, self.d = Generator(nz, c), Discriminator(c)

    def __call__(self, z: Tensor, real: Tensor) -> Tensor:
        return self.d(self.g(z).cat(real, dim=0))


if torch is not None:
    class TGenerator(tnn.Module):
        def __init__(self, nz: int, c: int) -> None:
            super().__init__()
            self.up0 = tnn.ConvTranspose2d(nz, 2 * c, 3, 1, 0, bias=False)
            self.bn0 = tnn.BatchNorm2d(2 * c)
            self.up1 = tnn.ConvTranspose2d(2 * c, c, 4, 2, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(c)
            self.up2 = tnn.ConvTranspose2d(c, 1, 3, 2, 1, output_padding=1)

        def forward(self, z: Any) -> Any:
            x = F.relu(self.bn0(self.up0(z)))
            return torch.tanh(self.up2(F.relu(self.bn1(self.up1(x)))))

    class TDiscriminator(tnn.Module):
        def __init__(self, c: int) -> None:
            super().__init__()
            self.conv0 = tnn.Conv2d(1, c, 4, 2, 1)
            self.conv1 = tnn.Conv2d(c, 2 * c, 4, 2, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(2 * c)
            self.fc = tnn.Linear(2 * c * 9, 1)

        def forward(self, x: Any) -> Any:
            x = F.leaky_relu(self.conv0(x), 0.2)
            return self.fc(F.leaky_relu(self.bn1(self.conv1(x)), 0.2).flatten(1))

    class TGAN(tnn.Module):
        def __init__(self, nz: int, c: int) -> None:
            super().__init__()
            self.g, self.d = TGenerator(nz, c), TDiscriminator(c)

        def forward(self, z: Any, real: Any) -> Any:
            return self.d(torch.cat([self.g(z), real], 0))


def _bce(out: Tensor, y: Tensor) -> Tensor:
    return out.binary_crossentropy_logits(y)


def _tbce(out: Any, y: Any) -> Any:
    return F.binary_cross_entropy_with_logits(out, y)


@pytest.mark.parametrize("batch", [1, 3])
def test_gan_with_transposed_convs_trains_like_torch(batch: int) -> None:
    torch.manual_seed(8)
    z, real = _randn(batch, 5, 1, 1), np.tanh(_randn(batch, 1, 12, 12, seed=3))
    y = np.concatenate([np.zeros((batch, 1)), np.ones((batch, 1))]).astype(np.float32)
    model, tmodel = GAN(5, 3), TGAN(5, 3)
    train_and_compare(model, tmodel, [z, real], _call, _call, _bce, _tbce, [y],
                      lambda p: nn.optim.Adam(p, lr=2e-3, betas=(0.5, 0.999)),
                      lambda p: torch.optim.Adam(p, lr=2e-3, betas=(0.5, 0.999)))
    _eval_compare(model, tmodel, [_randn(2, 5, 1, 1, seed=9), real[:1].repeat(2, 0)], _call, _call)


# ---------------------------------------------------------------------- norms and pools beyond BatchNorm2d
class NormPoolNet:
    """Conv1d + BatchNorm1d (cumulative momentum=None) over sequences, then as images: GroupNorm, InstanceNorm,
    max_pool2d with ceil_mode, avg_pool2d with padding not counted, bilinear align_corners upsampling, BatchNorm1d
    over features."""

    def __init__(self, cin: int, c: int, classes: int) -> None:
        self.conv1d = nn.Conv1d(cin, c, 3, padding=1, bias=False)  # (a bias before a BatchNorm has gradient 0)
        self.bn1d = nn.BatchNorm1d(c, momentum=None)
        self.conv = nn.Conv2d(c, 2 * c, 3, padding=1)
        self.gn = nn.GroupNorm(2, 2 * c)
        self.conv2 = nn.Conv2d(2 * c, c, 3, padding=1, bias=False)
        self.inorm = nn.InstanceNorm(c)
        self.fc1 = nn.Linear(c, 9, bias=False)
        self.bnf = nn.BatchNorm1d(9)
        self.fc2 = nn.Linear(9, classes)

    def __call__(self, x: Tensor) -> Tensor:
        b, cin, h, w = x.shape
        s = self.bn1d(self.conv1d(x.reshape(b, cin, h * w))).relu()
        img = s.reshape(b, -1, h, w)
        img = self.gn(self.conv(img)).gelu().max_pool2d(2, ceil_mode=True)
        img = self.inorm(self.conv2(img)).relu().avg_pool2d(3, 1, padding=1, count_include_pad=False)
        img = img.interpolate(scale_factor=2, mode="bilinear", align_corners=True)
        return self.fc2(self.bnf(self.fc1(img.mean((2, 3)))).relu())


if torch is not None:
    class TNormPoolNet(tnn.Module):
        def __init__(self, cin: int, c: int, classes: int) -> None:
            super().__init__()
            self.conv1d = tnn.Conv1d(cin, c, 3, padding=1, bias=False)
            self.bn1d = tnn.BatchNorm1d(c, momentum=None)
            self.conv = tnn.Conv2d(c, 2 * c, 3, padding=1)
            self.gn = tnn.GroupNorm(2, 2 * c)
            self.conv2 = tnn.Conv2d(2 * c, c, 3, padding=1, bias=False)
            self.inorm = tnn.InstanceNorm2d(c, affine=True)
            self.fc1 = tnn.Linear(c, 9, bias=False)
            self.bnf = tnn.BatchNorm1d(9)
            self.fc2 = tnn.Linear(9, classes)

        def forward(self, x: Any) -> Any:
            b, cin, h, w = x.shape
            s = F.relu(self.bn1d(self.conv1d(x.reshape(b, cin, h * w))))
            img = s.reshape(b, -1, h, w)
            img = F.max_pool2d(F.gelu(self.gn(self.conv(img)), approximate="tanh"), 2, ceil_mode=True)
            img = F.avg_pool2d(F.relu(self.inorm(self.conv2(img))), 3, 1, padding=1, count_include_pad=False)
            img = F.interpolate(img, scale_factor=2, mode="bilinear", align_corners=True)
            return self.fc2(F.relu(self.bnf(self.fc1(img.mean((2, 3))))))


@pytest.mark.parametrize("batch, cin, hw, c", [(4, 3, 7, 3), (5, 5, 13, 2)])
def test_norms_and_pools_train_then_evaluate_like_torch(batch: int, cin: int, hw: int, c: int) -> None:
    torch.manual_seed(9)
    x = _randn(batch, cin, hw, hw)
    model, tmodel = NormPoolNet(cin, c, 3), TNormPoolNet(cin, c, 3)
    train_and_compare(model, tmodel, [x], _call, _call, _ce, _tce, [_labels(batch, 3)],
                      lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.5),
                      lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5))
    _eval_compare(model, tmodel, [_randn(1, cin, hw, hw, seed=4)], _call, _call)


# ---------------------------------------------------------------------- a TinyJit training step
def test_jitted_resnet_step_trains_like_torch() -> None:
    """The ResNet's whole step (forward, backward, SGD) under TinyJit: 4 steps (run, capture, 2 replays) on new
    batches, then the same state as PyTorch."""
    from glassgrad import TinyJit
    torch.manual_seed(10)
    model, tmodel = ResNet(3, 4, 3), TResNet(3, 4, 3)
    _load(model, tmodel)
    opt = nn.optim.SGD(get_parameters(model), lr=0.1, momentum=0.9, nesterov=True)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1, momentum=0.9, nesterov=True)

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = model(x).cross_entropy(y)
            loss.backward()
            opt.step()
        return loss

    for i in range(4):
        x, y = _randn(2, 3, 9, 9, seed=20 + i), _labels(2, 3, seed=30 + i)
        topt.zero_grad()
        tl = F.cross_entropy(tmodel(torch.from_numpy(x)), torch.from_numpy(y))
        tl.backward()
        topt.step()
        assert step(Tensor(x), Tensor(y)).item() == pytest.approx(tl.item(), rel=1e-4), f"loss at step {i}"
    _compare_state(model, tmodel, GRAD_RTOL)


# ---------------------------------------------------------------------- wider layers (other kernel shapes)
@pytest.mark.parametrize("batch, seq, dim", [(4, 33, 64), (1, 17, 48)])
def test_wider_transformer_classifier_trains_like_torch(batch: int, seq: int, dim: int) -> None:
    """Sizes past the SIMD width and the register tiles: 33 and 17 tokens, 48 and 64 features, 4 heads."""
    torch.manual_seed(11)
    idx = _rng(12).integers(0, 50, (batch, seq)).astype(np.int64)
    lengths = _rng(13).integers(1, seq + 1, batch)
    pad = np.arange(seq)[None, :] >= lengths[:, None]
    train_and_compare(Classifier(50, dim, 4, seq, 5), TClassifier(50, dim, 4, seq, 5), [idx, pad], _call, _call,
                      _ce, _tce, [_labels(batch, 5)], lambda p: nn.optim.SGD(p, lr=0.1, momentum=0.9),
                      lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))


@pytest.mark.parametrize("batch, hw", [(8, 32), (5, 19)])
def test_wider_resnet_trains_like_torch(batch: int, hw: int) -> None:
    torch.manual_seed(12)
    x, y = _randn(batch, 3, hw, hw), _labels(batch, 10)
    model, tmodel = ResNet(3, 16, 10), TResNet(3, 16, 10)
    # one step: over more steps float32 rounding (PyTorch's too) can flip a max-pool or ReLU decision, after which
    # the two trajectories part (PyTorch in float32 vs float64 part the same way here)
    train_and_compare(model, tmodel, [x], _call, _call, _ce, _tce, [y],
                      lambda p: nn.optim.SGD(p, lr=0.05, momentum=0.9),
                      lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
                      steps=1)
    _eval_compare(model, tmodel, [_randn(batch, 3, hw, hw, seed=5)], _call, _call)


# ---------------------------------------------------------------------- ViT with a class token and einsum attention
class ViT:
    """Patch embedding by a strided conv (padded to cover 13x13), a class token, einsum attention, pre-norm blocks
    applied twice with the same weights (ALBERT-style sharing), an L2 penalty on every weight in the loss."""

    def __init__(self, cin: int, dim: int, patch: int, heads: int, classes: int) -> None:
        self.patch = nn.Conv2d(cin, dim, patch, stride=patch, padding=1)
        self.cls = Tensor.randn(1, 1, dim) * 0.02
        self.ln1, self.ln2, self.ln = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = [nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)]
        self.head, self.heads = nn.Linear(dim, classes), heads

    def attend(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).unbind(2)
        att = Tensor.einsum("bqhd,bkhd->bhqk", q, k) * (d // self.heads) ** -0.5
        return self.proj(Tensor.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v).reshape(b, t, d))

    def __call__(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = self.cls.expand(x.shape[0], -1, -1).cat(x, dim=1)
        for _ in range(2):
            x = x + self.attend(self.ln1(x))
            x = x + self.mlp[1](self.mlp[0](self.ln2(x)).hardswish())
        return self.head(self.ln(x)[:, 0])


if torch is not None:
    class TViT(tnn.Module):
        def __init__(self, cin: int, dim: int, patch: int, heads: int, classes: int) -> None:
            super().__init__()
            self.patch = tnn.Conv2d(cin, dim, patch, stride=patch, padding=1)
            self.cls = tnn.Parameter(torch.randn(1, 1, dim) * 0.02)
            self.ln1, self.ln2, self.ln = tnn.LayerNorm(dim), tnn.LayerNorm(dim), tnn.LayerNorm(dim)
            self.qkv, self.proj = tnn.Linear(dim, 3 * dim), tnn.Linear(dim, dim)
            self.mlp = tnn.ModuleList([tnn.Linear(dim, 2 * dim), tnn.Linear(2 * dim, dim)])
            self.head, self.heads = tnn.Linear(dim, classes), heads

        def attend(self, x: Any) -> Any:
            b, t, d = x.shape
            q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).unbind(2)
            att = torch.einsum("bqhd,bkhd->bhqk", q, k) * (d // self.heads) ** -0.5
            return self.proj(torch.einsum("bhqk,bkhd->bqhd", att.softmax(-1), v).reshape(b, t, d))

        def forward(self, x: Any) -> Any:
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
            for _ in range(2):
                x = x + self.attend(self.ln1(x))
                x = x + self.mlp[1](F.hardswish(self.mlp[0](self.ln2(x))))
            return self.head(self.ln(x)[:, 0])


@pytest.mark.parametrize("batch, hw", [(2, 13), (1, 7)])
def test_vit_with_shared_blocks_and_l2_penalty_trains_like_torch(batch: int, hw: int) -> None:
    torch.manual_seed(13)
    model, tmodel = ViT(3, 8, 4, 2, 3), TViT(3, 8, 4, 2, 3)
    ours_params = get_parameters(model)
    train_and_compare(model, tmodel, [_randn(batch, 3, hw, hw)], _call, _call,
                      lambda o, y: o.cross_entropy(y) + 1e-3 * sum(p.square().sum() for p in ours_params),
                      lambda o, y: F.cross_entropy(o, y) + 1e-3 * sum(p.square().sum() for p in tmodel.parameters()),
                      [_labels(batch, 3)], lambda p: nn.optim.AdamW(p, lr=5e-3),
                      lambda p: torch.optim.AdamW(p, lr=5e-3))


# ---------------------------------------------------------------------- bidirectional GRU tagger, padded sequences
class BiGRUTagger:
    """Embedding, a GRU run forwards and over the flipped sequence, per-step outputs stacked, attention pooling
    (softmax over time with the padding masked to -inf) added to every step, per-token CE ignoring the padding."""

    def __init__(self, vocab: int, dim: int, hidden: int, tags: int) -> None:
        self.emb = nn.Embedding(vocab, dim)
        self.fw, self.bw = GRU(dim, hidden, 1), GRU(dim, hidden, 1)
        self.score, self.out = nn.Linear(2 * hidden, 1, bias=False), nn.Linear(2 * hidden, tags)  # (softmax: no bias)

    @staticmethod
    def run(cell: GRU, x: Tensor) -> Tensor:
        h, outs = Tensor.zeros(x.shape[0], cell.hidden), []
        for t in range(x.shape[1]):
            xr, xz, xn = cell.ih(x[:, t]).chunk(3, dim=1)
            hr, hz, hn = cell.hh(h).chunk(3, dim=1)
            r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
            h = (1 - z) * (xn + r * hn).tanh() + z * h
            outs.append(h)
        return Tensor.stack(*outs, dim=1)

    def __call__(self, idx: Tensor, pad: Tensor) -> Tensor:
        e = self.emb(idx)
        h = self.run(self.fw, e).cat(self.run(self.bw, e.flip(1)).flip(1), dim=2)
        w = self.score(h).squeeze(-1).masked_fill(pad, float("-inf")).softmax(1)
        pooled = (w.unsqueeze(-1) * h).sum(1, keepdim=True)
        return self.out(h + pooled).transpose(1, 2)  # (B, tags, T), as cross_entropy wants


if torch is not None:
    class TBiGRUTagger(tnn.Module):
        def __init__(self, vocab: int, dim: int, hidden: int, tags: int) -> None:
            super().__init__()
            self.emb = tnn.Embedding(vocab, dim)
            self.fw, self.bw = TGRU(dim, hidden, 1), TGRU(dim, hidden, 1)
            self.score, self.out = tnn.Linear(2 * hidden, 1, bias=False), tnn.Linear(2 * hidden, tags)

        @staticmethod
        def run(cell: Any, x: Any) -> Any:
            h, outs = torch.zeros(x.shape[0], cell.hidden), []
            for t in range(x.shape[1]):
                xr, xz, xn = cell.ih(x[:, t]).chunk(3, dim=1)
                hr, hz, hn = cell.hh(h).chunk(3, dim=1)
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                h = (1 - z) * torch.tanh(xn + r * hn) + z * h
                outs.append(h)
            return torch.stack(outs, 1)

        def forward(self, idx: Any, pad: Any) -> Any:
            e = self.emb(idx)
            h = torch.cat([self.run(self.fw, e), self.run(self.bw, e.flip(1)).flip(1)], 2)
            w = self.score(h).squeeze(-1).masked_fill(pad, float("-inf")).softmax(1)
            pooled = (w.unsqueeze(-1) * h).sum(1, keepdim=True)
            return self.out(h + pooled).transpose(1, 2)


def test_bidirectional_gru_tagger_trains_like_torch() -> None:
    """The GRUs' own fc layers are unused (their gradients must stay None in both)."""
    torch.manual_seed(14)
    batch, seq = 3, 8
    idx = _rng(15).integers(1, 20, (batch, seq)).astype(np.int64)
    lengths = np.array([8, 5, 7])
    pad = np.arange(seq)[None, :] >= lengths[:, None]
    tags = np.where(pad, -100, _rng(16).integers(0, 4, (batch, seq))).astype(np.int64)
    model, tmodel = BiGRUTagger(20, 6, 5, 4), TBiGRUTagger(20, 6, 5, 4)
    used = [p for k, p in get_state_dict(model).items() if ".fc." not in k]
    train_and_compare(model, tmodel, [idx, pad], _call, _call,
                      lambda o, y: o.cross_entropy(y, ignore_index=-100), lambda o, y: F.cross_entropy(o, y), [tags],
                      lambda p: nn.optim.Adam(used, lr=1e-2),
                      lambda p: torch.optim.Adam([q for k, q in tmodel.named_parameters() if ".fc." not in k], lr=1e-2))


# ---------------------------------------------------------------------- mixture of experts with top-k routing
class MoE:
    """A softmax gate, top-2 experts per token (topk, renormalised), experts run densely and gathered, a
    load-balancing auxiliary loss, and an SE-style squeeze-excite gate on the features."""

    def __init__(self, dim: int, experts: int, hidden: int) -> None:
        self.gate = nn.Linear(dim, experts, bias=False)
        self.w1 = [nn.Linear(dim, hidden) for _ in range(experts)]
        self.w2 = [nn.Linear(hidden, dim) for _ in range(experts)]
        self.se1, self.se2 = nn.Linear(dim, 3), nn.Linear(3, dim)
        self.experts = experts

    def __call__(self, x: Tensor) -> tuple[Tensor, Tensor]:
        probs = self.gate(x).softmax(-1)  # (N, E)
        top, which = probs.topk(2, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        outs = Tensor.stack(*[w2(w1(x).silu()) for w1, w2 in zip(self.w1, self.w2)], dim=1)  # (N, E, D)
        picked = outs.gather(1, which.unsqueeze(-1).expand(-1, -1, x.shape[-1]))  # (N, 2, D)
        y = (top.unsqueeze(-1) * picked).sum(1)
        y = y * self.se2(self.se1(y.mean(0, keepdim=True)).relu()).sigmoid()
        load = which.one_hot(self.experts).float().sum(1).mean(0)  # tokens per expert (no gradient)
        return y, (load * probs.mean(0)).sum() * self.experts


if torch is not None:
    class TMoE(tnn.Module):
        def __init__(self, dim: int, experts: int, hidden: int) -> None:
            super().__init__()
            self.gate = tnn.Linear(dim, experts, bias=False)
            self.w1 = tnn.ModuleList([tnn.Linear(dim, hidden) for _ in range(experts)])
            self.w2 = tnn.ModuleList([tnn.Linear(hidden, dim) for _ in range(experts)])
            self.se1, self.se2 = tnn.Linear(dim, 3), tnn.Linear(3, dim)
            self.experts = experts

        def forward(self, x: Any) -> Any:
            probs = self.gate(x).softmax(-1)
            top, which = probs.topk(2, dim=-1)
            top = top / top.sum(-1, keepdim=True)
            outs = torch.stack([w2(F.silu(w1(x))) for w1, w2 in zip(self.w1, self.w2)], 1)
            picked = outs.gather(1, which.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
            y = (top.unsqueeze(-1) * picked).sum(1)
            y = y * torch.sigmoid(self.se2(F.relu(self.se1(y.mean(0, keepdim=True)))))
            load = F.one_hot(which, self.experts).float().sum(1).mean(0)
            return y, (load * probs.mean(0)).sum() * self.experts


def test_mixture_of_experts_trains_like_torch() -> None:
    torch.manual_seed(15)
    x, y = _randn(11, 6), _randn(11, 6, seed=3)
    train_and_compare(MoE(6, 4, 5), TMoE(6, 4, 5), [x], lambda m, x: m(x)[0].cat(m(x)[1].reshape(1, 1).expand(1, 6)),
                      lambda m, x: torch.cat([m(x)[0], m(x)[1].reshape(1, 1).expand(1, 6)]),
                      lambda o, y: ((o[:-1] - y) ** 2).mean() + 0.01 * o[-1, 0],
                      lambda o, y: F.mse_loss(o[:-1], y) + 0.01 * o[-1, 0], [y],
                      lambda p: nn.optim.SGD(p, lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1))


# ---------------------------------------------------------------------- metric learning
class Embedder:
    """A conv encoder with reflect padding, a hand-written LayerNorm (var, unbiased=False), F.normalize'd
    embeddings; InfoNCE over the cosine-similarity matrix (logsumexp) plus a triplet margin loss."""

    def __init__(self, cin: int, c: int, dim: int) -> None:
        self.conv = nn.Conv2d(cin, c, 3, padding=1, padding_mode="reflect")
        self.conv2 = nn.Conv2d(c, c, 3, stride=2, padding=1, padding_mode="replicate")
        self.g, self.b = Tensor.ones(c), Tensor.zeros(c)
        self.fc = nn.Linear(c, dim)

    def __call__(self, x: Tensor) -> Tensor:
        h = self.conv2(self.conv(x).elu()).mean((2, 3))
        h = (h - h.mean(-1, keepdim=True)) / (h.var(-1, keepdim=True, correction=0) + 1e-5).sqrt() * self.g + self.b
        return self.fc(h.softplus()).normalize(dim=-1)


if torch is not None:
    class TEmbedder(tnn.Module):
        def __init__(self, cin: int, c: int, dim: int) -> None:
            super().__init__()
            self.conv = tnn.Conv2d(cin, c, 3, padding=1, padding_mode="reflect")
            self.conv2 = tnn.Conv2d(c, c, 3, stride=2, padding=1, padding_mode="replicate")
            self.g, self.b = tnn.Parameter(torch.ones(c)), tnn.Parameter(torch.zeros(c))
            self.fc = tnn.Linear(c, dim)

        def forward(self, x: Any) -> Any:
            h = self.conv2(F.elu(self.conv(x))).mean((2, 3))
            h = (h - h.mean(-1, keepdim=True)) / (h.var(-1, keepdim=True, unbiased=False) + 1e-5).sqrt() * self.g \
                + self.b
            return F.normalize(self.fc(F.softplus(h)), dim=-1)


def _contrastive(z: Any, _: Any, lib: str = "ours") -> Any:
    """InfoNCE over the anchors' (first half) similarities to the positives (second half), temperature 0.2, plus a
    triplet loss with the next sample's positive as the negative (margin 0.5). Written once for both libraries."""
    n = z.shape[0] // 2
    a, p = z[:n], z[n:]
    sim = (a @ p.T) / 0.2
    diag = (sim * Tensor.eye(n)).sum(-1) if lib == "ours" else sim.diagonal()
    nce = (sim.logsumexp(-1) - diag).mean()
    d_pos, d_neg = ((a - p) ** 2).sum(-1), ((a - p.roll(1, 0)) ** 2).sum(-1)
    return nce + (d_pos - d_neg + 0.5).relu().mean()


@pytest.mark.parametrize("n, hw", [(4, 7), (3, 13)])
def test_metric_learning_trains_like_torch(n: int, hw: int) -> None:
    torch.manual_seed(16)
    x = _randn(2 * n, 5, hw, hw)
    x[n:] = x[:n] + 0.3 * _randn(n, 5, hw, hw, seed=9)
    train_and_compare(Embedder(5, 4, 6), TEmbedder(5, 4, 6), [x], _call, _call,
                      lambda z, y: _contrastive(z, y), lambda z, y: _contrastive(z, y, "torch"), [np.zeros(1)],
                      lambda p: nn.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                      lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True))


# ---------------------------------------------------------------------- float64 models
@pytest.mark.parametrize("name", ["resnet", "unet", "vit", "norms"])
def test_float64_model_matches_torch_double(name: str) -> None:
    """`dtypes.default_float = float64` (tinygrad's switch) makes a float64 model: its forward and gradients must
    match PyTorch's double model to double precision. The norm layers' weights were float32 whatever the default
    (so a BatchNorm or LayerNorm computed in float32: 3e-7 off), and linear interpolation's weights were float32
    (bilinear upsampling 3e-7 off)."""
    from glassgrad import Device, dtypes
    if Device.DEFAULT == "METAL":
        pytest.skip("Metal has no float64")
    torch.manual_seed(17)
    rng = _rng(18)
    old, old_torch = dtypes.default_float, torch.get_default_dtype()
    dtypes.default_float = dtypes.float64
    torch.set_default_dtype(torch.float64)
    try:
        if name == "resnet":
            model, tmodel, inputs = ResNet(3, 4, 3), TResNet(3, 4, 3), [rng.standard_normal((2, 3, 9, 9))]
        elif name == "unet":
            model, tmodel, inputs = UNet(3, 2), TUNet(3, 2), [rng.standard_normal((2, 3, 7, 7))]
        elif name == "vit":
            model, tmodel, inputs = ViT(3, 8, 4, 2, 3), TViT(3, 8, 4, 2, 3), [rng.standard_normal((2, 3, 9, 9))]
        else:  # (not the encoder: exact GELU's erf is float32-accurate, also for float64; see special._erf)
            model, tmodel, inputs = NormPoolNet(3, 3, 3), TNormPoolNet(3, 3, 3), [rng.standard_normal((3, 3, 7, 7))]
        _load(model, tmodel)
        assert all(t.dtype == dtypes.float64 for t in get_parameters(model) if t.dtype.is_float)
        nn.optim.SGD(get_parameters(model))  # (requires_grad on: the ViT's raw class token is not a layer's)
        with Tensor.train():
            out = model(*[Tensor(x) for x in inputs])
            out.square().mean().backward()
        tout = tmodel(*[torch.from_numpy(x) for x in inputs])
        tout.square().mean().backward()
    finally:
        dtypes.default_float = old
        torch.set_default_dtype(old_torch)
    np.testing.assert_allclose(out.numpy(), tout.detach().numpy(), rtol=1e-12, atol=1e-13)
    ours = get_state_dict(model)
    for key, p in tmodel.named_parameters():
        grad = ours[key].grad
        assert grad is not None and grad.dtype == dtypes.float64, key
        _close(grad.numpy(), p.grad.numpy(), 1e-11, f"grad {key}")


@pytest.mark.parametrize("align_corners", [False, True])
def test_float64_bilinear_resize_is_double_precise(align_corners: bool) -> None:
    """A float64 linear resize took its weights in float32 (3e-7 relative off PyTorch's double result)."""
    from glassgrad import Device
    if Device.DEFAULT == "METAL":
        pytest.skip("Metal has no float64")
    x = _rng(19).standard_normal((2, 3, 7, 5))
    got = Tensor(x).interpolate(size=(11, 9), mode="bilinear", align_corners=align_corners)
    want = F.interpolate(torch.from_numpy(x), size=(11, 9), mode="bilinear", align_corners=align_corners)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-13, atol=1e-14)
