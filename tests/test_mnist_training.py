"""End-to-end training: the examples/mnist.py CNN learns real MNIST digits, and its weights survive a save/load.

Uses the real 10,000-image MNIST test set in ../shared/data/mnist (skipped when absent): 8,000 images train, the
other 2,000 are held out. Marked slow; CI runs it.
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

import numpy as np
import pytest

from glassgrad import Tensor, no_grad
from glassgrad.nn import state

REPO = pathlib.Path(__file__).resolve().parent.parent
MNIST_DIR = REPO.parent / "shared" / "data" / "mnist"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mnist_example", REPO / "examples" / "mnist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["mnist_example"] = module
    spec.loader.exec_module(module)
    return module


needs_mnist = pytest.mark.skipif(not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").exists(),
                                 reason=f"the MNIST test set is not at {MNIST_DIR}")


@pytest.mark.slow
@needs_mnist
def test_cnn_reaches_95_percent_on_held_out_mnist() -> None:
    example = _example()
    data, description = example.load_data(str(MNIST_DIR))
    assert "8,000" in description
    Tensor.manual_seed(0)
    model = example.Model()
    accuracy = example.train(model, data, steps=60, batch=128, lr=0.002, eval_every=60)
    assert accuracy >= 0.95, f"held-out accuracy {accuracy:.4f} after 60 steps"


@needs_mnist
def test_save_load_gives_identical_predictions(tmp_path: pathlib.Path) -> None:
    example = _example()
    (x_train, y_train, _, _), _ = example.load_data(str(MNIST_DIR))
    Tensor.manual_seed(1)
    model = example.Model()
    example.train(model, (x_train[:512], y_train[:512], x_train[:64], y_train[:64]), steps=2, batch=32, lr=0.001,
                  eval_every=100)
    path = tmp_path / "model.safetensors"
    state.safe_save(state.get_state_dict(model), str(path))
    restored = example.Model()
    state.load_state_dict(restored, state.safe_load(str(path)))
    images = example.to_input(x_train[:100])
    with no_grad(), Tensor.test():
        expected, got = model(images).numpy(), restored(images).numpy()
    np.testing.assert_array_equal(got, expected)
    assert set(state.get_state_dict(restored)) == set(state.get_state_dict(model))
