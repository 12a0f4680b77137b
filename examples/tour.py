"""A tour of glassgrad: one fused kernel, then a real model trained with autograd.

In: optionally `--data DIR` holding MNIST's `t10k-images-idx3-ubyte.gz` / `t10k-labels-idx1-ubyte.gz`
(default: ../shared/data/mnist next to the repo, then $MNIST_DIR). Out: printed kernels, loss and test accuracy.

    python examples/tour.py

1. `(a*b+c).relu()` becomes a single C kernel (printed), checked against numpy.
2. A two-layer MLP trained by SGD on the 10,000 MNIST test images (8,000 train / 2,000 held out), or on synthetic
   blobs when no MNIST files are found.
"""
from __future__ import annotations

import argparse
import gzip
import os
import pathlib
import time

import numpy as np

import glassgrad
from glassgrad import GlobalCounters, Tensor


def show_fusion() -> None:
    a, b, c = (Tensor.randn(4, 4) for _ in range(3))
    out = (a * b + c).relu()
    kernel, = glassgrad.kernels(out)
    print(f"(a*b+c).relu() is one kernel, {kernel.name}:\n{kernel.source.split('void ', 1)[1]}")
    expected = np.maximum(a.numpy() * b.numpy() + c.numpy(), 0)
    assert np.allclose(out.numpy(), expected), "fused kernel disagrees with numpy"


def find_mnist(arg: str | None) -> pathlib.Path | None:
    here = pathlib.Path(__file__).resolve().parent.parent
    for candidate in (arg, os.environ.get("MNIST_DIR"), here.parent / "shared" / "data" / "mnist"):
        if candidate and (pathlib.Path(candidate) / "t10k-images-idx3-ubyte.gz").exists():
            return pathlib.Path(candidate)
    return None


def load_mnist(folder: pathlib.Path) -> tuple[np.ndarray, np.ndarray]:
    with gzip.open(folder / "t10k-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784).astype(np.float32) / 255.0
    with gzip.open(folder / "t10k-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int32)
    return images, labels


def synthetic(n: int = 10000) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, n).astype(np.int32)
    centers = rng.standard_normal((10, 784)).astype(np.float32)
    return centers[labels] + rng.standard_normal((n, 784)).astype(np.float32) * 2.0, labels


def train(images: np.ndarray, labels: np.ndarray, steps: int, batch: int) -> float:
    Tensor.manual_seed(0)
    x_train, y_train = images[:8000], labels[:8000]
    x_test, y_test = Tensor(images[8000:]), labels[8000:]
    w1 = (Tensor.randn(784, 128) * (2 / 784) ** 0.5).requires_grad_()
    b1 = Tensor.zeros(128).requires_grad_()
    w2 = (Tensor.randn(128, 10) * (2 / 128) ** 0.5).requires_grad_()
    b2 = Tensor.zeros(10).requires_grad_()
    params = [w1, b1, w2, b2]
    for p in params:
        p.realize()
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        idx = rng.integers(0, len(x_train), batch)
        x, y = Tensor(x_train[idx]), Tensor(y_train[idx])
        loss = (x @ w1 + b1).relu().matmul(w2).add(b2).cross_entropy(y)
        grads = loss.gradient(*params)
        with glassgrad.no_grad():  # SGD, written in place; the loss is realized in the same schedule
            Tensor.realize_all(loss, *(p.assign(p.detach() - 0.1 * g) for p, g in zip(params, grads)))
        if step % 50 == 0 or step == steps:
            print(f"step {step:4d}  loss {loss.item():.4f}  ({time.perf_counter() - start:.1f}s)")
    logits = (x_test @ w1 + b1).relu() @ w2 + b2
    return float((logits.argmax(1).numpy() == y_test).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description="glassgrad tour: a fused kernel, then an MLP trained on MNIST")
    parser.add_argument("--data", default=None, help="folder with the MNIST t10k-*.gz files")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    show_fusion()
    folder = find_mnist(args.data)
    if folder is None:
        print("no MNIST files found (--data, $MNIST_DIR, ../shared/data/mnist): training on synthetic blobs instead")
        images, labels = synthetic()
    else:
        print(f"training a 784-128-10 MLP on MNIST from {folder} (8,000 train / 2,000 test)")
        images, labels = load_mnist(folder)
    GlobalCounters.reset()
    accuracy = train(images, labels, args.steps, args.batch)
    print(f"test accuracy {accuracy * 100:.2f}%  ({GlobalCounters.kernel_count} kernels run)")


if __name__ == "__main__":
    main()
