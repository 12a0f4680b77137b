"""More small models as users write them, with random weights and tiny sizes: an EfficientNet/MobileNet block
(depthwise conv, SiLU, squeeze-excitation, BatchNorm), YOLO pieces (conv+BN+SiLU, SPPF max pools, nearest
upsampling, channel concatenation), a UNet with GroupNorm, a timestep embedding and attention over positions, a ViT
(patch conv, class token, learned positions, both GELUs), and a Whisper-style encoder fed a log-mel spectrogram made
with matmuls. Odd spatial sizes, batch size 1 and 77 tokens on purpose.

With PyTorch installed, each model trains a couple of steps next to the same model in PyTorch with the same weights:
losses, every gradient, every updated state entry (BatchNorm's running statistics too) and the eval-mode output must
agree. Without it, the numpy checks still run: the gradient along a random direction of the weights against a
central difference of the loss, the mel spectrogram against numpy, and the habits (save/load, no_grad, schedules)
against closed forms.

In: nothing. Out: pytest results."""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch_optional import F, needs_torch, torch

from glassgrad import Tensor, nn, no_grad
from glassgrad.nn import lr as schedules
from glassgrad.nn.state import get_parameters, get_state_dict, load_state_dict, safe_load, safe_save


# ---------------------------------------------------------------------- helpers
def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _load_torch_weights(model: Any, torch_module: Any) -> None:
    """Copy a PyTorch module's state (parameters and buffers) into a glassgrad model with the same keys."""
    ours, theirs = get_state_dict(model), torch_module.state_dict()
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))
    for name, value in theirs.items():
        ours[name].assign(Tensor(value.detach().numpy().copy()).cast(ours[name].dtype)).realize()


def _train_like_torch(model: Any, torch_module: Any, x: np.ndarray, loss: Callable[[Tensor], Tensor],
                      torch_loss: Callable[[Any], Any], adam: bool, steps: int = 2, atol: float = 1e-4) -> None:
    """`steps` training steps of both models from the same weights (Adam or SGD with momentum), then one eval-mode
    forward of each. Compared: the first step's gradients, every loss, the final state and the eval output. With
    Adam, entries whose gradient is ~0 in exact arithmetic (an attention key's bias, a bias feeding a training-mode
    BatchNorm) are left out of the final state: Adam divides their rounding noise by its own size."""
    _load_torch_weights(model, torch_module)
    params = get_parameters(model)
    opt = nn.optim.Adam(params, lr=1e-2) if adam else nn.optim.SGD(params, lr=1e-2, momentum=0.9)
    topt = torch.optim.Adam(torch_module.parameters(), lr=1e-2) if adam else \
        torch.optim.SGD(torch_module.parameters(), lr=1e-2, momentum=0.9)
    torch_module.train()
    ours, named = get_state_dict(model), dict(torch_module.named_parameters())
    first_grads: dict[str, np.ndarray] = {}
    for step in range(steps):
        topt.zero_grad()
        expected = torch_loss(torch_module(torch.tensor(x)))
        expected.backward()
        with Tensor.train():
            opt.zero_grad()
            got = loss(model(Tensor(x)))
            got.backward()
            if step == 0:
                Tensor.realize_all(*[ours[k].grad for k in named])  # (one schedule for all of them)
                for name, p in named.items():
                    first_grads[name] = p.grad.numpy().copy()
                    np.testing.assert_allclose(ours[name].grad.numpy(), first_grads[name], atol=atol, rtol=1e-3,
                                               err_msg=f"gradient of {name}")
            opt.step()
        topt.step()
        assert got.item() == pytest.approx(expected.item(), rel=1e-4, abs=atol), f"loss of step {step}"
    Tensor.realize_all(*ours.values())
    for name, value in torch_module.state_dict().items():
        keep = np.abs(first_grads[name]) >= 1e-6 if adam and name in first_grads else np.ones(value.shape, bool)
        np.testing.assert_allclose(ours[name].numpy()[keep], value.double().numpy()[keep], atol=atol, rtol=1e-3,
                                   err_msg=f"state {name}")
    torch_module.eval()
    with torch.no_grad():
        expected_out = torch_module(torch.tensor(x)).numpy()
    with Tensor.test():
        np.testing.assert_allclose(model(Tensor(x)).numpy(), expected_out, atol=atol, rtol=1e-3)


def _check_directional_gradient(model: Any, x: np.ndarray, loss: Callable[[Tensor], Tensor],
                                eps: float = 1e-2) -> None:
    """numpy only (no PyTorch): in eval mode (deterministic), the gradient's dot product with a random direction d
    of all parameters against (L(w + eps d) - L(w - eps d)) / (2 eps), in float64 on the host."""
    params = [p for p in get_parameters(model) if p.requires_grad is not False]
    for p in params:  # what an optimiser does: a plain `Tensor.randn` (ViT's class token) is then trained too
        p.requires_grad = True
    with Tensor.test():
        for p in params:
            p.grad = None
        value = loss(model(Tensor(x)))
        value.backward()
        grads = [np.zeros(p.shape) if p.grad is None else p.grad.numpy().astype(np.float64) for p in params]
        w0 = [p.numpy().copy() for p in params]
        rng = np.random.default_rng(7)
        dirs = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
        norm = math.sqrt(sum(float((d.astype(np.float64) ** 2).sum()) for d in dirs))
        dirs = [d / np.float32(norm) for d in dirs]
        sides = []
        for sign in (1, -1):
            with no_grad():
                for p, w, d in zip(params, w0, dirs):
                    p.assign(Tensor(w + sign * eps * d)).realize()
            sides.append(float(loss(model(Tensor(x))).item()))
        with no_grad():
            for p, w in zip(params, w0):
                p.assign(Tensor(w)).realize()
    analytic = sum(float((g * d).sum()) for g, d in zip(grads, dirs))
    numeric = (sides[0] - sides[1]) / (2 * eps)
    assert analytic == pytest.approx(numeric, rel=3e-2, abs=1e-3), (analytic, numeric)


# ---------------------------------------------------------------------- EfficientNet / MobileNet block
class MBConv:
    """Inverted residual: 1x1 expand + BN + SiLU, depthwise 3x3 (groups = channels) + BN + SiLU, squeeze-excitation
    (global average pool, 1x1 convs, sigmoid gate), 1x1 project + BN, residual when the shape allows. (N, cin, H, W)
    -> (N, cout, H/stride, W/stride)."""

    def __init__(self, cin: int, cout: int, expand: int, stride: int) -> None:
        ce = cin * expand
        self.expand_conv = nn.Conv2d(cin, ce, 1, bias=False) if expand != 1 else None
        self.bn0 = nn.BatchNorm2d(ce) if expand != 1 else None
        self.depthwise = nn.Conv2d(ce, ce, 3, stride=stride, padding=1, groups=ce, bias=False)
        self.bn1 = nn.BatchNorm2d(ce)
        squeezed = max(1, cin // 4)
        self.se_reduce, self.se_expand = nn.Conv2d(ce, squeezed, 1), nn.Conv2d(squeezed, ce, 1)
        self.project = nn.Conv2d(ce, cout, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.residual = stride == 1 and cin == cout

    def __call__(self, inputs: Tensor) -> Tensor:
        x = inputs
        if self.expand_conv is not None and self.bn0 is not None:
            x = self.bn0(self.expand_conv(x)).swish()
        x = self.bn1(self.depthwise(x)).swish()
        s = x.avg_pool2d(kernel_size=x.shape[2:])  # squeeze: (N, C, 1, 1)
        x = x * self.se_expand(self.se_reduce(s).swish()).sigmoid()
        x = self.bn2(self.project(x))
        return x + inputs if self.residual else x


class EfficientNetish:
    """Stem conv (stride 2) + BN + SiLU, two MBConv blocks, mean pool, linear head: (N, 3, H, W) -> (N, 5)."""

    def __init__(self) -> None:
        self.stem, self.bn = nn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8)
        self.blocks = [MBConv(8, 12, 4, 2), MBConv(12, 12, 3, 1)]
        self.head = nn.Linear(12, 5)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.bn(self.stem(x)).silu().sequential(self.blocks)
        return self.head(x.mean((2, 3)))


if torch is not None:
    tnn = torch.nn

    class TorchMBConv(tnn.Module):
        def __init__(self, cin: int, cout: int, expand: int, stride: int) -> None:
            super().__init__()
            ce = cin * expand
            self.expand_conv = tnn.Conv2d(cin, ce, 1, bias=False) if expand != 1 else None
            self.bn0 = tnn.BatchNorm2d(ce) if expand != 1 else None
            self.depthwise = tnn.Conv2d(ce, ce, 3, stride=stride, padding=1, groups=ce, bias=False)
            self.bn1 = tnn.BatchNorm2d(ce)
            squeezed = max(1, cin // 4)
            self.se_reduce, self.se_expand = tnn.Conv2d(ce, squeezed, 1), tnn.Conv2d(squeezed, ce, 1)
            self.project = tnn.Conv2d(ce, cout, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.residual = stride == 1 and cin == cout

        def forward(self, inputs: Any) -> Any:
            x = inputs
            if self.expand_conv is not None:
                x = F.silu(self.bn0(self.expand_conv(x)))
            x = F.silu(self.bn1(self.depthwise(x)))
            s = F.adaptive_avg_pool2d(x, 1)
            x = x * torch.sigmoid(self.se_expand(F.silu(self.se_reduce(s))))
            x = self.bn2(self.project(x))
            return x + inputs if self.residual else x

    class TorchEfficientNetish(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem, self.bn = tnn.Conv2d(3, 8, 3, stride=2, padding=1, bias=False), tnn.BatchNorm2d(8)
            self.blocks = tnn.Sequential(TorchMBConv(8, 12, 4, 2), TorchMBConv(12, 12, 3, 1))
            self.head = tnn.Linear(12, 5)

        def forward(self, x: Any) -> Any:
            return self.head(self.blocks(F.silu(self.bn(self.stem(x)))).mean((2, 3)))


_LABELS = np.array([1, 3, 0, 4])


def test_efficientnet_block_trains_like_torch() -> None:
    """31x29 images: depthwise convs with stride 2 on odd sizes, SE gating, BatchNorm in train and then eval mode."""
    x = _rand(3, 3, 31, 29)
    model = EfficientNetish()
    if torch is None:
        _check_directional_gradient(model, x, lambda o: o.sparse_categorical_crossentropy(Tensor(_LABELS[:3])))
        return
    _train_like_torch(model, TorchEfficientNetish(), x,
                      lambda o: o.sparse_categorical_crossentropy(Tensor(_LABELS[:3])),
                      lambda o: F.cross_entropy(o, torch.tensor(_LABELS[:3])), adam=False)


# ---------------------------------------------------------------------- YOLO pieces
class ConvBNSiLU:
    """conv (padding k//2, no bias) + BatchNorm (YOLO's eps and momentum) + SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1) -> None:
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3, momentum=0.03)

    def __call__(self, x: Tensor) -> Tensor:
        return self.bn(self.conv(x)).silu()


class Yoloish:
    """Two strided ConvBNSiLU, SPPF (a max pool of kernel 5, stride 1, padding 2, applied three times in a row,
    the four maps concatenated), nearest upsampling back to the earlier map, concatenation, a 1x1 detection conv:
    (N, 3, H, W) -> (N, 7, ceil(H/2), ceil(W/2)). `upsample`: "size" (interpolate to the skip's size) or "scale"
    (PyTorch's scale_factor=2)."""

    def __init__(self, upsample: str) -> None:
        self.upsample = upsample
        self.c1, self.c2 = ConvBNSiLU(3, 8, 3, 2), ConvBNSiLU(8, 8, 3, 2)
        self.sppf_in, self.sppf_out = ConvBNSiLU(8, 4), ConvBNSiLU(16, 8)
        self.merge, self.detect = ConvBNSiLU(16, 8, 3), nn.Conv2d(8, 7, 1)

    def __call__(self, x: Tensor) -> Tensor:
        a = self.c1(x)
        b = self.sppf_in(self.c2(a))
        y1 = b.max_pool2d(5, stride=1, padding=2)
        y2 = y1.max_pool2d(5, stride=1, padding=2)
        b = self.sppf_out(b.cat(y1, y2, y2.max_pool2d(5, stride=1, padding=2), dim=1))
        if self.upsample == "size":
            up = b.interpolate(size=a.shape[2:], mode="nearest")
        else:
            up = b.interpolate(scale_factor=2.0, mode="nearest")
        return self.detect(self.merge(Tensor.cat(up, a, dim=1)))


if torch is not None:
    class TorchConvBNSiLU(tnn.Module):
        def __init__(self, cin: int, cout: int, k: int = 1, stride: int = 1) -> None:
            super().__init__()
            self.conv = tnn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)
            self.bn = tnn.BatchNorm2d(cout, eps=1e-3, momentum=0.03)

        def forward(self, x: Any) -> Any:
            return F.silu(self.bn(self.conv(x)))

    class TorchYoloish(tnn.Module):
        def __init__(self, upsample: str) -> None:
            super().__init__()
            self.upsample = upsample
            self.c1, self.c2 = TorchConvBNSiLU(3, 8, 3, 2), TorchConvBNSiLU(8, 8, 3, 2)
            self.sppf_in, self.sppf_out = TorchConvBNSiLU(8, 4), TorchConvBNSiLU(16, 8)
            self.merge, self.detect = TorchConvBNSiLU(16, 8, 3), tnn.Conv2d(8, 7, 1)
            self.pool = tnn.MaxPool2d(5, 1, 2)

        def forward(self, x: Any) -> Any:
            a = self.c1(x)
            b = self.sppf_in(self.c2(a))
            y1 = self.pool(b)
            y2 = self.pool(y1)
            b = self.sppf_out(torch.cat([b, y1, y2, self.pool(y2)], 1))
            up = F.interpolate(b, size=a.shape[2:]) if self.upsample == "size" else F.interpolate(b, scale_factor=2.0)
            return self.detect(self.merge(torch.cat([up, a], 1)))


@pytest.mark.parametrize("upsample, shape", [("size", (1, 3, 31, 29)), ("scale", (2, 3, 16, 12))])
def test_yolo_pieces_train_like_torch(upsample: str, shape: tuple[int, ...]) -> None:
    """SPPF's stride-1 max pools, two ways of upsampling (PyTorch's `scale_factor=` was a TypeError), batch 1."""
    x = _rand(*shape)
    model = Yoloish(upsample)
    if torch is None:
        _check_directional_gradient(model, x, lambda o: (o.sigmoid() * o).mean())
        return
    _train_like_torch(model, TorchYoloish(upsample), x, lambda o: (o.sigmoid() * o).mean(),
                      lambda o: (o.sigmoid() * o).mean(), adam=False)


# ---------------------------------------------------------------------- UNet / stable diffusion
def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """Sinusoidal embedding of (N,) timesteps -> (N, dim): cos then sin of t * 10000^(-i/half)."""
    half = dim // 2
    freqs = (-math.log(10000) * Tensor.arange(half) / half).exp()
    args = t.reshape(-1, 1).float() * freqs.reshape(1, -1)
    return args.cos().cat(args.sin(), dim=-1)


class ResBlock:
    """GroupNorm + SiLU + conv, the timestep embedding added per channel, again, plus a (1x1 conv) skip."""

    def __init__(self, cin: int, cout: int, emb: int) -> None:
        self.norm1, self.conv1 = nn.GroupNorm(4, cin), nn.Conv2d(cin, cout, 3, padding=1)
        self.emb = nn.Linear(emb, cout)
        self.norm2, self.conv2 = nn.GroupNorm(4, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def __call__(self, x: Tensor, e: Tensor) -> Tensor:
        h = self.conv1(self.norm1(x).silu()) + self.emb(e.silu())[:, :, None, None]
        h = self.conv2(self.norm2(h).silu())
        return h + (x if self.skip is None else self.skip(x))


class SpatialAttention:
    """Self-attention over the H*W positions (1x1 conv to q, k, v; 2 heads; scaled_dot_product_attention, no mask)."""

    def __init__(self, channels: int) -> None:
        self.norm, self.qkv, self.proj = nn.GroupNorm(4, channels), nn.Conv2d(channels, 3 * channels, 1), \
            nn.Conv2d(channels, channels, 1)

    def __call__(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, 2, c // 2, h * w).permute(1, 0, 2, 4, 3)
        out = q.scaled_dot_product_attention(k, v)  # (b, heads, h*w, c/heads)
        return x + self.proj(out.permute(0, 1, 3, 2).reshape(b, c, h, w))


class UNetish:
    """One level down (strided conv), attention in the middle, bilinear upsampling to the skip's size and
    concatenation: (N, 3, H, W), timesteps (N,) -> (N, 3, H, W)."""

    def __init__(self, timesteps: np.ndarray) -> None:
        self.timesteps = timesteps
        self.time1, self.time2 = nn.Linear(16, 32), nn.Linear(32, 32)
        self.conv_in = nn.Conv2d(3, 8, 3, padding=1)
        self.down1, self.down = ResBlock(8, 8, 32), nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.down2, self.mid = ResBlock(8, 16, 32), SpatialAttention(16)
        self.up = ResBlock(16 + 8, 8, 32)
        self.norm_out, self.conv_out = nn.GroupNorm(4, 8), nn.Conv2d(8, 3, 3, padding=1)

    def __call__(self, x: Tensor) -> Tensor:
        e = self.time2(self.time1(timestep_embedding(Tensor(self.timesteps), 16)).silu())
        h1 = self.down1(self.conv_in(x), e)
        h = self.mid(self.down2(self.down(h1), e))
        h = self.up(h.interpolate(size=h1.shape[2:], mode="bilinear").cat(h1, dim=1), e)
        return self.conv_out(self.norm_out(h).silu())


if torch is not None:
    def torch_timestep_embedding(t: Any, dim: int) -> Any:
        half = dim // 2
        args = t[:, None].float() * torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half)
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    class TorchResBlock(tnn.Module):
        def __init__(self, cin: int, cout: int, emb: int) -> None:
            super().__init__()
            self.norm1, self.conv1 = tnn.GroupNorm(4, cin), tnn.Conv2d(cin, cout, 3, padding=1)
            self.emb = tnn.Linear(emb, cout)
            self.norm2, self.conv2 = tnn.GroupNorm(4, cout), tnn.Conv2d(cout, cout, 3, padding=1)
            self.skip = tnn.Conv2d(cin, cout, 1) if cin != cout else None

        def forward(self, x: Any, e: Any) -> Any:
            h = self.conv1(F.silu(self.norm1(x))) + self.emb(F.silu(e))[:, :, None, None]
            h = self.conv2(F.silu(self.norm2(h)))
            return h + (x if self.skip is None else self.skip(x))

    class TorchSpatialAttention(tnn.Module):
        def __init__(self, channels: int) -> None:
            super().__init__()
            self.norm, self.qkv = tnn.GroupNorm(4, channels), tnn.Conv2d(channels, 3 * channels, 1)
            self.proj = tnn.Conv2d(channels, channels, 1)

        def forward(self, x: Any) -> Any:
            b, c, h, w = x.shape
            q, k, v = self.qkv(self.norm(x)).reshape(b, 3, 2, c // 2, h * w).permute(1, 0, 2, 4, 3)
            out = F.scaled_dot_product_attention(q, k, v)
            return x + self.proj(out.permute(0, 1, 3, 2).reshape(b, c, h, w))

    class TorchUNetish(tnn.Module):
        def __init__(self, timesteps: np.ndarray) -> None:
            super().__init__()
            self.timesteps = timesteps
            self.time1, self.time2 = tnn.Linear(16, 32), tnn.Linear(32, 32)
            self.conv_in = tnn.Conv2d(3, 8, 3, padding=1)
            self.down1, self.down = TorchResBlock(8, 8, 32), tnn.Conv2d(8, 8, 3, stride=2, padding=1)
            self.down2, self.mid = TorchResBlock(8, 16, 32), TorchSpatialAttention(16)
            self.up = TorchResBlock(16 + 8, 8, 32)
            self.norm_out, self.conv_out = tnn.GroupNorm(4, 8), tnn.Conv2d(8, 3, 3, padding=1)

        def forward(self, x: Any) -> Any:
            e = self.time2(F.silu(self.time1(torch_timestep_embedding(torch.tensor(self.timesteps), 16))))
            h1 = self.down1(self.conv_in(x), e)
            h = self.mid(self.down2(self.down(h1), e))
            h = self.up(torch.cat([F.interpolate(h, size=h1.shape[2:], mode="bilinear"), h1], 1), e)
            return self.conv_out(F.silu(self.norm_out(h)))


def test_timestep_embedding_matches_numpy() -> None:
    t = np.array([0, 3, 977])
    args = t[:, None] * np.exp(-math.log(10000) * np.arange(8) / 8)[None]
    np.testing.assert_allclose(timestep_embedding(Tensor(t), 16).numpy(),
                               np.concatenate([np.cos(args), np.sin(args)], 1), atol=2e-4)


def test_unet_trains_like_torch() -> None:
    """9x7 images (a 5x4 middle: 20 positions to attend over), two timesteps, Adam."""
    x, target, timesteps = _rand(2, 3, 9, 7), _rand(2, 3, 9, 7, seed=1), np.array([3, 977])
    model = UNetish(timesteps)
    if torch is None:
        _check_directional_gradient(model, x, lambda o: (o - Tensor(target)).square().mean())
        return
    _train_like_torch(model, TorchUNetish(timesteps), x, lambda o: (o - Tensor(target)).square().mean(),
                      lambda o: F.mse_loss(o, torch.tensor(target)), adam=True)


# ---------------------------------------------------------------------- ViT
class ViTBlock:
    """Pre-LayerNorm transformer block: fused qkv, 2 heads, written-out attention, MLP with GELU (`approximate`)."""

    def __init__(self, dim: int, approximate: str) -> None:
        self.approximate = approximate
        self.ln1, self.ln2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def __call__(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1) / math.sqrt(d // 2)).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.fc2(self.fc1(self.ln2(x)).gelu(approximate=self.approximate))


class ViTish:
    """Patch embedding by a strided conv, a class token, learned positions, one block with tanh GELU and one with
    the exact one, a head on the class token and the mean of the patch tokens: (N, 3, H, W) -> (N, 4)."""

    def __init__(self, image: tuple[int, int], patch: int, dim: int = 16) -> None:
        tokens = (image[0] // patch) * (image[1] // patch)
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = Tensor.randn(1, 1, dim)
        self.pos = Tensor.randn(1, tokens + 1, dim) * 0.02
        self.blocks = [ViTBlock(dim, "tanh"), ViTBlock(dim, "none")]
        self.norm, self.head = nn.LayerNorm(dim, eps=1e-6), nn.Linear(2 * dim, 4)

    def __call__(self, x: Tensor) -> Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = self.cls.expand(x.shape[0], -1, -1).cat(x, dim=1) + self.pos
        x = self.norm(x.sequential(self.blocks))
        return self.head(x[:, 0].cat(x[:, 1:].mean(1), dim=-1))


if torch is not None:
    class TorchViTBlock(tnn.Module):
        def __init__(self, dim: int, approximate: str) -> None:
            super().__init__()
            self.approximate = approximate
            self.ln1, self.ln2 = tnn.LayerNorm(dim, eps=1e-6), tnn.LayerNorm(dim, eps=1e-6)
            self.qkv, self.proj = tnn.Linear(dim, 3 * dim), tnn.Linear(dim, dim)
            self.fc1, self.fc2 = tnn.Linear(dim, 2 * dim), tnn.Linear(2 * dim, dim)

        def forward(self, x: Any) -> Any:
            b, n, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, 2, d // 2).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-2, -1) / math.sqrt(d // 2)).softmax(-1)
            x = x + self.proj((att @ v).transpose(1, 2).reshape(b, n, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate=self.approximate))

    class TorchViTish(tnn.Module):
        def __init__(self, image: tuple[int, int], patch: int, dim: int = 16) -> None:
            super().__init__()
            tokens = (image[0] // patch) * (image[1] // patch)
            self.patch = tnn.Conv2d(3, dim, patch, stride=patch)
            self.cls = tnn.Parameter(torch.randn(1, 1, dim))
            self.pos = tnn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
            self.blocks = tnn.Sequential(TorchViTBlock(dim, "tanh"), TorchViTBlock(dim, "none"))
            self.norm, self.head = tnn.LayerNorm(dim, eps=1e-6), tnn.Linear(2 * dim, 4)

        def forward(self, x: Any) -> Any:
            x = self.patch(x).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
            x = self.norm(self.blocks(x))
            return self.head(torch.cat([x[:, 0], x[:, 1:].mean(1)], -1))


def test_vit_trains_like_torch() -> None:
    """46x29 images in 4x4 patches: 11 x 7 = 77 patch tokens (the last rows and columns dropped by the conv), a
    class token, label smoothing, Adam."""
    x, labels = _rand(2, 3, 46, 29), np.array([1, 3])
    model = ViTish((46, 29), 4)

    def loss(o: Tensor) -> Tensor:
        return o.sparse_categorical_crossentropy(Tensor(labels), label_smoothing=0.1)
    if torch is None:
        _check_directional_gradient(model, x, loss)
        return
    _train_like_torch(model, TorchViTish((46, 29), 4), x, loss,
                      lambda o: F.cross_entropy(o, torch.tensor(labels), label_smoothing=0.1), adam=True)


# ---------------------------------------------------------------------- Whisper-style audio encoder
N_FFT, HOP, N_MELS = 32, 8, 10


def _mel_filters() -> np.ndarray:
    return np.abs(np.random.default_rng(5).standard_normal((N_MELS, N_FFT // 2 + 1))).astype(np.float32)


def _windowed_dft() -> tuple[np.ndarray, np.ndarray]:
    """(N_FFT, N_FFT/2 + 1) real and imaginary DFT matrices with the periodic Hann window folded in."""
    n, k = np.arange(N_FFT), np.arange(N_FFT // 2 + 1)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / N_FFT)
    angle = 2 * np.pi * np.outer(n, k) / N_FFT
    return (window[:, None] * np.cos(angle)).astype(np.float32), (-window[:, None] * np.sin(angle)).astype(np.float32)


def log_mel(audio: Tensor) -> Tensor:
    """Whisper's log-mel spectrogram, the STFT done by matmuls: (N, samples) -> (N, N_MELS, samples // HOP). Reflect
    padding, frames by unfold, power, mel filters, log10 of the clamped power, floor at max - 8, scaled."""
    cos, sin = _windowed_dft()
    frames = audio.pad((N_FFT // 2, N_FFT // 2), mode="reflect").unfold(-1, N_FFT, HOP)  # (N, T, N_FFT)
    power = ((frames @ Tensor(cos)).square() + (frames @ Tensor(sin)).square())[:, :-1]
    logs = (power @ Tensor(_mel_filters()).T).clamp(min_=1e-10).log10()
    logs = logs.maximum(logs.max() - 8.0)
    return ((logs + 4.0) / 4.0).transpose(1, 2)


def _np_log_mel(audio: np.ndarray) -> np.ndarray:
    cos, sin = _windowed_dft()
    x = np.pad(audio.astype(np.float64), ((0, 0), (N_FFT // 2, N_FFT // 2)), mode="reflect")
    frames = np.stack([x[:, i * HOP:i * HOP + N_FFT] for i in range(1 + (x.shape[1] - N_FFT) // HOP)], 1)
    power = ((frames @ cos) ** 2 + (frames @ sin) ** 2)[:, :-1]
    logs = np.log10(np.maximum(power @ _mel_filters().T.astype(np.float64), 1e-10))
    return ((np.maximum(logs, logs.max() - 8.0) + 4) / 4).transpose(0, 2, 1)


def _sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's fixed positional embedding: (length, channels), sin then cos of log-spaced timescales."""
    inc = np.log(10000) / (channels // 2 - 1)
    scaled = np.arange(length)[:, None] * np.exp(-inc * np.arange(channels // 2))[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


class AudioEncoder:
    """log-mel, conv1d + GELU, conv1d with stride 2 + GELU, fixed sinusoidal positions (a buffer), one attention
    layer (keys without bias, as Whisper's), ln_post: (N, samples) -> (N, ceil(samples // HOP / 2), 16)."""

    def __init__(self, dim: int = 16, context: int = 48) -> None:
        self.conv1 = nn.Conv1d(N_MELS, dim, 3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, 3, stride=2, padding=1)
        self.positional_embedding = Tensor(_sinusoids(context, dim), requires_grad=False)
        self.ln, self.query, self.key, self.value = nn.LayerNorm(dim), nn.Linear(dim, dim), \
            nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim)
        self.out, self.ln_post = nn.Linear(dim, dim), nn.LayerNorm(dim)

    def __call__(self, audio: Tensor) -> Tensor:
        x = self.conv1(log_mel(audio)).gelu(approximate="none")
        x = self.conv2(x).gelu(approximate="none").permute(0, 2, 1)
        x = x + self.positional_embedding[:x.shape[1]]
        b, n, d = x.shape
        h = self.ln(x)
        q, k, v = [t.reshape(b, n, 2, d // 2).transpose(1, 2) for t in (self.query(h), self.key(h), self.value(h))]
        x = x + self.out(q.scaled_dot_product_attention(k, v).transpose(1, 2).reshape(b, n, d))
        return self.ln_post(x)


if torch is not None:
    def torch_log_mel(audio: Any) -> Any:
        spec = torch.stft(audio, N_FFT, HOP, window=torch.hann_window(N_FFT), return_complex=True)
        mel = torch.tensor(_mel_filters()) @ spec[..., :-1].abs() ** 2
        logs = torch.clamp(mel, min=1e-10).log10()
        return (torch.maximum(logs, logs.max() - 8.0) + 4.0) / 4.0

    class TorchAudioEncoder(tnn.Module):
        def __init__(self, dim: int = 16, context: int = 48) -> None:
            super().__init__()
            self.conv1 = tnn.Conv1d(N_MELS, dim, 3, padding=1)
            self.conv2 = tnn.Conv1d(dim, dim, 3, stride=2, padding=1)
            self.register_buffer("positional_embedding", torch.tensor(_sinusoids(context, dim)))
            self.ln, self.query, self.key, self.value = tnn.LayerNorm(dim), tnn.Linear(dim, dim), \
                tnn.Linear(dim, dim, bias=False), tnn.Linear(dim, dim)
            self.out, self.ln_post = tnn.Linear(dim, dim), tnn.LayerNorm(dim)

        def forward(self, audio: Any) -> Any:
            x = F.gelu(self.conv1(torch_log_mel(audio)))
            x = F.gelu(self.conv2(x)).permute(0, 2, 1)
            x = x + self.positional_embedding[:x.shape[1]]
            b, n, d = x.shape
            h = self.ln(x)
            q, k, v = [t.reshape(b, n, 2, d // 2).transpose(1, 2) for t in (self.query(h), self.key(h), self.value(h))]
            x = x + self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d))
            return self.ln_post(x)


def _audio(batch: int, samples: int) -> np.ndarray:
    audio = _rand(batch, samples) * 0.1
    audio[:, :3 * HOP] = 0  # silence: the clamp at 1e-10 and the max - 8 floor both bite
    return audio


@pytest.mark.parametrize("batch, samples", [(2, 37 * HOP - 3), (1, 77 * HOP)])
def test_log_mel_spectrogram_by_matmul(batch: int, samples: int) -> None:
    audio = _audio(batch, samples)
    got = log_mel(Tensor(audio)).numpy()
    np.testing.assert_allclose(got, _np_log_mel(audio), atol=1e-4)
    if torch is not None:
        np.testing.assert_allclose(got, torch_log_mel(torch.tensor(audio)).numpy(), atol=1e-4)


def test_audio_encoder_trains_like_torch() -> None:
    """77 frames of one clip -> 39 positions after the stride-2 conv; exact GELU; Adam."""
    audio = _audio(1, 77 * HOP)
    model = AudioEncoder()

    def loss(o: Any) -> Any:
        return o.square().mean() + o[:, :, 0].mean()
    if torch is None:
        _check_directional_gradient(model, audio, loss)
        return
    _train_like_torch(model, TorchAudioEncoder(), audio, loss, loss, adam=True, atol=2e-4)


# ---------------------------------------------------------------------- habits around the models
def _clip_grad_norm(params: Sequence[Tensor], max_norm: float, style: str) -> Tensor:
    """Gradient clipping by global norm, written by hand as users do; returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    total = sum((g.float() ** 2).sum() for g in grads).sqrt()  # type: ignore[union-attr]
    coef = (max_norm / (total + 1e-6)).clamp(max_=1.0)
    for p in params:
        if p.grad is None:
            continue
        if style == "rebind":
            p.grad = p.grad * coef
        else:
            p.grad.mul_(coef)
    return total


def _np_schedule(name: str, base: float, steps: int) -> list[float]:
    """PyTorch's closed forms for the lrs after 1..steps scheduler steps."""
    if name == "cosine":
        return [base * (1 + math.cos(math.pi * t / 4)) / 2 for t in range(1, steps + 1)]
    return [base * 0.5 ** t for t in range(1, steps + 1)]  # StepLR(step_size=1, gamma=0.5)


@pytest.mark.parametrize("clip_style, schedule", [("rebind", "cosine"), ("mul_", "step")])
def test_habits_clip_schedule_save_load_no_grad(clip_style: str, schedule: str, tmp_path: Path) -> None:
    """A training loop with `Tensor.training` switched by hand, hand-written global-norm clipping (two ways of
    writing the gradient back), an lr schedule, then batch-1 inference under no_grad and a safetensors round trip
    into a fresh model (BatchNorm's int64 num_batches_tracked included)."""
    x, labels = _rand(2, 3, 17, 15), _LABELS[:2]
    model = EfficientNetish()
    tmodel = TorchEfficientNetish() if torch is not None else None
    if tmodel is not None:
        _load_torch_weights(model, tmodel)
    params = get_parameters(model)
    opt = nn.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    sched = schedules.CosineAnnealingLR(opt, T_max=4) if schedule == "cosine" else \
        schedules.StepLR(opt, step_size=1, gamma=0.5)
    lrs, norms, losses = [], [], []
    for _ in range(3):
        Tensor.training = True
        try:
            opt.zero_grad()
            loss = model(Tensor(x)).sparse_categorical_crossentropy(Tensor(labels))
            loss.backward()
            norms.append(_clip_grad_norm(params, 0.5, clip_style).item())
            opt.step()
            sched.step()
        finally:
            Tensor.training = False
        losses.append(loss.item())
        lrs.append(sched.get_last_lr()[0])
    np.testing.assert_allclose(lrs, _np_schedule(schedule, 0.05, 3), rtol=1e-6)
    assert all(np.isfinite(losses)) and all(n > 0 for n in norms)
    with no_grad():
        single = model(Tensor(x[:1]))
    assert not single.requires_grad
    path = tmp_path / "model.safetensors"
    safe_save(get_state_dict(model), path)
    fresh = EfficientNetish()
    load_state_dict(fresh, safe_load(path))
    assert fresh.bn.num_batches_tracked is not None and fresh.bn.num_batches_tracked.item() == 3
    with Tensor.test():
        np.testing.assert_array_equal(fresh(Tensor(x[:1])).numpy(), single.numpy())
    if tmodel is None:
        return
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=4) if schedule == "cosine" else \
        torch.optim.lr_scheduler.StepLR(topt, step_size=1, gamma=0.5)
    for step in range(3):
        topt.zero_grad()
        tloss = F.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(labels))
        tloss.backward()
        assert norms[step] == pytest.approx(torch.nn.utils.clip_grad_norm_(tmodel.parameters(), 0.5).item(),
                                            rel=1e-4)
        topt.step()
        tsched.step()
        assert losses[step] == pytest.approx(tloss.item(), rel=1e-4)
    tmodel.eval()
    with torch.no_grad():
        np.testing.assert_allclose(single.numpy(), tmodel(torch.tensor(x[:1])).numpy(), atol=1e-4)


# ---------------------------------------------------------------------- regressions found by these models
def _np_nearest(x: np.ndarray, scale: float, exact: bool) -> np.ndarray:
    """1-d nearest resizing of the last dim with PyTorch's scale_factor rule: source floor((o [+ 0.5]) / scale)."""
    out = math.floor(x.shape[-1] * scale)
    pos = np.arange(out, dtype=np.float32) + np.float32(0.5 if exact else 0.0)
    src = np.minimum(np.floor(pos * np.float32(1 / scale)), x.shape[-1] - 1).astype(np.int64)
    return x[..., src]


@pytest.mark.parametrize("size, scale, mode", [(11, 1.5, "nearest"), (7, 2.1, "nearest"), (3, 1.2, "nearest"),
                                               (13, 0.7, "nearest-exact"), (5, 3.3, "nearest-exact")])
def test_interpolate_scale_factor_1d(size: int, scale: float, mode: str) -> None:
    """`interpolate(scale_factor=...)` (PyTorch's spelling, as in `F.interpolate(x, scale_factor=2)`) was a
    TypeError. PyTorch's sources are at o / scale, not o * in/out: with in * scale not an integer they differ (7 at
    2.1 -> 14 outputs, output 2 reads 0 and not 1), and a scale that keeps the size (3 at 1.2) still moves them."""
    x = _rand(2, 3, size)
    got = Tensor(x).interpolate(scale_factor=scale, mode=mode).numpy()
    np.testing.assert_array_equal(got, _np_nearest(x, scale, mode == "nearest-exact"))
    if torch is not None:
        np.testing.assert_array_equal(got, F.interpolate(torch.tensor(x), scale_factor=scale, mode=mode).numpy())


@pytest.mark.parametrize("scale", [1.2, 2.1, (1.5, 0.7), (2.0, 1.0), 0.45])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "bilinear"])
def test_interpolate_scale_factor_2d_matches_torch(scale: Any, mode: str) -> None:
    """2-d (4-d input): PyTorch's nearest kernel copies when the size is unchanged and halves the index when it
    doubles, whatever the scale (its 1-d and 3-d kernels do not); the linear modes copy an unchanged size."""
    x = _rand(2, 3, 5, 7)
    got = Tensor(x).interpolate(scale_factor=scale, mode=mode)
    scales = (scale, scale) if isinstance(scale, float) else scale
    assert got.shape == (2, 3, math.floor(5 * scales[0]), math.floor(7 * scales[1]))
    if mode == "nearest" and scales == (2.0, 1.0):
        np.testing.assert_array_equal(got.numpy(), x.repeat(2, axis=2))
    if torch is not None:
        np.testing.assert_allclose(got.numpy(), F.interpolate(torch.tensor(x), scale_factor=scale, mode=mode).numpy(),
                                   atol=1e-6)
        xi = (np.abs(x) * 60).astype(np.uint8)
        np.testing.assert_array_equal(Tensor(xi).interpolate(scale_factor=scale, mode=mode).numpy(),
                                      F.interpolate(torch.tensor(xi), scale_factor=scale, mode=mode).numpy())


def test_interpolate_scale_factor_errors() -> None:
    x = Tensor.zeros(1, 1, 5)
    for kwargs in ({}, {"size": 3, "scale_factor": 2.0}, {"scale_factor": 0.0}, {"scale_factor": -1.0},
                   {"scale_factor": float("nan")}, {"scale_factor": True}, {"scale_factor": 0.1}):
        with pytest.raises(ValueError, match="interpolate"):
            x.interpolate(**kwargs)


def test_hardtanh_gradient_is_zero_at_both_ends() -> None:
    """hardtanh was clip, whose gradient passes at x == min_val and x == max_val; PyTorch's (and relu6's here) is
    0 there, 1 strictly inside."""
    x = Tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 0.5], requires_grad=True)
    out = x.hardtanh()
    out.sum().backward()
    assert x.grad is not None
    np.testing.assert_array_equal(out.numpy(), [-1, -1, 0, 1, 1, 0.5])
    np.testing.assert_array_equal(x.grad.numpy(), [0, 0, 1, 0, 0, 1])
    if torch is not None:
        tx = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0, 0.5], requires_grad=True)
        F.hardtanh(tx).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())


@needs_torch
def test_torch_saved_state_dict_loads_into_the_model(tmp_path: Path) -> None:
    """`torch.save(model.state_dict())` (BatchNorm's int64 num_batches_tracked included) read with torch_load and
    loaded by name: the eval-mode outputs agree."""
    from glassgrad.nn.state import torch_load
    tmodel = TorchEfficientNetish()
    with torch.no_grad():
        tmodel(torch.tensor(_rand(2, 3, 15, 13, seed=3)))  # running statistics moved off their start
    torch.save(tmodel.state_dict(), tmp_path / "model.pt")
    model = EfficientNetish()
    load_state_dict(model, torch_load(str(tmp_path / "model.pt")))
    x = _rand(1, 3, 15, 13)
    tmodel.eval()
    with torch.no_grad(), Tensor.test():
        np.testing.assert_allclose(model(Tensor(x)).numpy(), tmodel(torch.tensor(x)).numpy(), atol=1e-5)


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
@pytest.mark.parametrize("layer, shape, padding, stride", [(nn.Conv2d, (2, 4, 9, 7), (1, 2), 2),
                                                           (nn.Conv1d, (1, 4, 11), 3, 1)])
def test_conv_padding_mode(padding_mode: str, layer: Any, shape: tuple[int, ...], padding: Any, stride: int) -> None:
    """`nn.Conv2d(..., padding_mode="reflect")` (PyTorch's; style-transfer and pix2pix generators) was a TypeError.
    The padding is filled by `Tensor.pad`'s mode of that name, then the convolution runs unpadded."""
    x = _rand(*shape)
    conv = layer(4, 6, 3, stride=stride, padding=padding, padding_mode=padding_mode, groups=2)
    xt = Tensor(x, requires_grad=True)
    out = conv(xt)
    mode = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}[padding_mode]
    pads = [(p, p) for p in ((padding,) if isinstance(padding, int) else padding)]
    padded = np.pad(x, [(0, 0), (0, 0), *pads], mode=mode)
    expected = (Tensor(padded).conv2d(conv.weight, conv.bias, groups=2, stride=stride)).numpy()
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-5)
    if torch is None:
        return
    tconv = getattr(torch.nn, layer.__name__)(4, 6, 3, stride=stride, padding=padding, padding_mode=padding_mode,
                                              groups=2)
    _load_torch_weights(conv, tconv)
    tx = torch.tensor(x, requires_grad=True)
    tout = tconv(tx)
    (conv(xt) ** 2).sum().backward()
    (tout ** 2).sum().backward()
    np.testing.assert_allclose(conv(xt).numpy(), tout.detach().numpy(), atol=1e-5)
    assert xt.grad is not None and conv.weight.grad is not None
    np.testing.assert_allclose(xt.grad.numpy(), tx.grad.numpy(), atol=1e-4)
    np.testing.assert_allclose(conv.weight.grad.numpy(), tconv.weight.grad.numpy(), atol=1e-4)


def test_conv_padding_mode_errors() -> None:
    with pytest.raises(ValueError, match="padding_mode"):
        nn.Conv2d(2, 2, 3, padding=1, padding_mode="mirror")
    with pytest.raises(Exception, match="reflect|pad"):
        nn.Conv1d(2, 2, 3, padding=4, padding_mode="reflect")(Tensor.zeros(1, 2, 3))  # reflect needs pad < size
