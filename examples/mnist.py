"""Train tinygrad's `beautiful_mnist` CNN with glassgrad: the project's main job.

In: MNIST from `--data DIR` / $MNIST_DIR / the cache / a download (glassgrad.nn.datasets.mnist); when only the 10,000
test images are found (as in this repo's CI, under ../shared/data/mnist), they are split 8,000 train / 2,000 test;
with no MNIST at all, scikit-learn's bundled 8x8 digits (upscaled to 28x28) stand in, and it says so.
Out: a progress bar with the loss and the test accuracy, and optionally the weights (`--save model.safetensors`).
The train step is a `TinyJit` (JIT=0 runs it eagerly).

    python examples/mnist.py                      # 70 steps of batch 512, Adam
    python examples/mnist.py --device CUDA --save mnist.safetensors
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np

from glassgrad import Device, Tensor, TinyJit, nn, no_grad
from glassgrad.nn import datasets, optim, state

REPO = pathlib.Path(__file__).resolve().parent.parent
SHARED_MNIST = REPO.parent / "shared" / "data" / "mnist"


class Model:
    """Conv 1->32 5x5, Conv 32->32 5x5, BatchNorm, maxpool, Conv 32->64 3x3, Conv 64->64 3x3, BatchNorm, maxpool,
    Linear 576->10 (tinygrad's beautiful_mnist)."""

    def __init__(self) -> None:
        self.layers: list[Callable[[Tensor], Tensor]] = [
            nn.Conv2d(1, 32, 5), Tensor.relu, nn.Conv2d(32, 32, 5), Tensor.relu, nn.BatchNorm(32), Tensor.max_pool2d,
            nn.Conv2d(32, 64, 3), Tensor.relu, nn.Conv2d(64, 64, 3), Tensor.relu, nn.BatchNorm(64), Tensor.max_pool2d,
            lambda x: x.flatten(1), nn.Linear(576, 10)]

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def load_data(folder: str | None) -> tuple[Data, str]:
    """(x_train, y_train, x_test, y_test) as numpy, images uint8 (N, 1, 28, 28), and a line saying what they are."""
    places = [p for p in (folder, os.environ.get("MNIST_DIR")) if p] or [None]
    for place in places:
        try:
            xtr, ytr, xte, yte = (t.numpy() for t in datasets.mnist(directory=place))
            return (xtr, ytr, xte, yte), f"MNIST: {len(xtr)} train, {len(xte)} test images"
        except (RuntimeError, ValueError, OSError):
            pass
    for place in [*(p for p in places if p), str(SHARED_MNIST)]:
        try:
            x, y = (t.numpy() for t in datasets.mnist_test(place))
        except (RuntimeError, ValueError, OSError):
            continue
        return (x[:8000], y[:8000], x[8000:], y[8000:]), \
            f"MNIST test set only ({place}): training on 8,000 images, testing on the other 2,000"
    return digits_fallback(), "no MNIST files and no network: training on scikit-learn's 8x8 digits instead"


def digits_fallback() -> Data:
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("no MNIST found and scikit-learn is not installed: pip install -e '.[examples]' or pass --data")
    digits = load_digits()
    images = (digits.images / 16.0 * 255).astype(np.uint8)                   # (N, 8, 8), 0..255
    big = np.kron(images, np.ones((1, 3, 3), np.uint8))                      # 24x24
    big = np.pad(big, ((0, 0), (2, 2), (2, 2)))[:, None]                     # (N, 1, 28, 28)
    labels = digits.target.astype(np.uint8)
    order = np.random.default_rng(0).permutation(len(big))
    big, labels = big[order], labels[order]
    split = int(len(big) * 0.8)
    return big[:split], labels[:split], big[split:], labels[split:]


# data parallel (--gpus N, --devices CPU:0,CPU:1): batches are split by rows over these devices, weights replicated
DEVICES: tuple[str, ...] | None = None


def placed(t: Tensor) -> Tensor:
    """A batch on the training devices: split by rows over DEVICES when there are several."""
    return t.shard(DEVICES, axis=0) if DEVICES else t


def to_input(images: np.ndarray) -> Tensor:
    return placed(Tensor(images.astype(np.float32) / 255.0))


def accuracy(model: Model, images: np.ndarray, labels: np.ndarray, chunk: int = 1000) -> float:
    correct = 0
    with no_grad(), Tensor.test():
        for i in range(0, len(images), chunk):
            pred = model(to_input(images[i:i + chunk])).argmax(1).numpy()
            correct += int((pred == labels[i:i + chunk]).sum())
    return correct / len(images)


def progress(steps: int) -> Iterable[int]:
    try:
        from tqdm import trange
        return trange(steps)
    except ImportError:
        return range(steps)


@Tensor.train()
def train_step(model: Model, opt: optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    """One Adam step on a batch, written as tinygrad's beautiful_mnist writes it: forward, backward, and the loss
    realized together with the update (one schedule)."""
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y).backward()
    return loss.realize(*opt.schedule_step())


def train_step_fn(model: Model, opt: optim.Optimizer) -> Callable[[Tensor, Tensor], Tensor]:
    """`train_step` as a TinyJit (beautiful_mnist's `@TinyJit @Tensor.train() def step()`): from the third call on,
    its kernels are replayed without Python building or scheduling the graph. The returned loss is overwritten by
    the next call."""
    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        return train_step(model, opt, x, y)
    return step


def train(model: Model, data: Data, steps: int, batch: int, lr: float, eval_every: int = 10) -> float:
    x_train, y_train, x_test, y_test = data
    opt = optim.Adam(state.get_parameters(model), lr=lr)
    train_step = train_step_fn(model, opt)
    rng = np.random.default_rng(1337)
    test_acc = float("nan")
    bar = progress(steps)
    start = time.perf_counter()
    for step in bar:
        idx = rng.integers(0, len(x_train), batch)
        loss = train_step(to_input(x_train[idx]), placed(Tensor(y_train[idx].astype(np.int32))))
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            test_acc = accuracy(model, x_test, y_test)
        message = f"loss {loss.item():6.3f} test accuracy {test_acc * 100:5.2f}%"
        if hasattr(bar, "set_description"):
            bar.set_description(message)
        elif (step + 1) % eval_every == 0:
            print(f"step {step + 1:4d}  {message}  ({time.perf_counter() - start:.1f}s)")
    return test_acc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=70)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--data", default=None, help="folder with the MNIST idx files (.gz or not)")
    parser.add_argument("--device", default=None, help="CPU (default), CUDA, METAL")
    parser.add_argument("--save", default=None, help="write the trained weights here (safetensors)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus", type=int, default=0, help="data parallel over CUDA:0..N-1 (batch split by rows)")
    parser.add_argument("--devices", default=None, help="data parallel over these devices, e.g. CPU:0,CPU:1")
    args = parser.parse_args()
    global DEVICES
    if args.gpus > 1 or args.devices:
        DEVICES = tuple(args.devices.split(",")) if args.devices else tuple(f"CUDA:{i}" for i in range(args.gpus))
        args.device = args.device or DEVICES[0]
    if args.device:
        Device.DEFAULT = Device.canonicalize(args.device)  # parameters and inputs are made there
    Tensor.manual_seed(args.seed)
    data, description = load_data(args.data)
    print(f"{description}; device {Device.DEFAULT}")
    model = Model()
    if DEVICES:
        for p in state.get_parameters(model):
            p.shard_(DEVICES)  # replicated: every device holds the weights, the gradients are all-reduced
        print(f"data parallel over {DEVICES}")
    acc = train(model, data, args.steps, args.batch, args.lr)
    print(f"test accuracy after {args.steps} steps of batch {args.batch}: {acc * 100:.2f}%")
    if args.save:
        state.safe_save(state.get_state_dict(model), args.save)
        print(f"saved the weights to {args.save}")


if __name__ == "__main__":
    main()
