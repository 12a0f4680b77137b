"""Data-parallel GPT-2 training (examples/gpt2.py `train --devices CPU:0,CPU:1`): replicated weights, the tied
embedding/head included, a row-split batch and all-reduced gradients give the losses of one device, eagerly and
through TinyJit (capture and replay of the collectives)."""
from __future__ import annotations

import importlib.util
import pathlib
from types import ModuleType

import numpy as np
import pytest

from glassgrad import Tensor
from glassgrad.models.gpt2 import GPT2, GPT2Config
from glassgrad.nn import optim
from glassgrad.nn.state import get_parameters

REPO = pathlib.Path(__file__).resolve().parent.parent
D2 = ("CPU:0", "CPU:1")
TINY = GPT2Config(vocab_size=64, n_ctx=16, n_embd=32, n_head=2, n_layer=2)


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpt2_example", REPO / "examples" / "gpt2.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _train(example: ModuleType, devices: tuple[str, ...] | None, jit: bool, batch: int = 4,
           steps: int = 3) -> list[float]:
    """Losses of `steps` AdamW steps of examples/gpt2.py's train step on the tiny config, from one seed."""
    Tensor.manual_seed(0)
    model = GPT2(TINY)
    example.replicate(model, devices)
    opt = optim.AdamW(get_parameters(model), lr=1e-2, weight_decay=0.01)
    step = example.make_train_step(model, opt, jit=jit)
    data = np.random.default_rng(1).integers(0, TINY.vocab_size, 4096).astype(np.uint8)
    rng = np.random.default_rng(2)
    return [float(step(*example.batches(data, batch, TINY.n_ctx, rng, devices)).item()) for _ in range(steps)]


def test_data_parallel_gpt_matches_one_device(example: ModuleType) -> None:
    want = _train(example, None, jit=False)
    np.testing.assert_allclose(_train(example, D2, jit=False), want, rtol=1e-5)
    np.testing.assert_allclose(_train(example, D2, jit=True), want, rtol=1e-5)  # eager, capture, replay


def test_tied_embedding_is_one_replicated_parameter(example: ModuleType) -> None:
    Tensor.manual_seed(0)
    model = GPT2(TINY)
    example.replicate(model, D2)
    params = get_parameters(model)
    assert sum(p is model.wte.weight for p in params) == 1
    assert all(p.device == ("CPU", "CPU:1") for p in params)


def test_devices_from_the_command_line(example: ModuleType) -> None:
    assert example.training_devices(0, "CPU:0,CPU:1", 4) == D2
    assert example.training_devices(3, None, 6) == ("CUDA:0", "CUDA:1", "CUDA:2")
    assert example.training_devices(0, None, 5) == ()
    with pytest.raises(ValueError, match=r"--batch 5 is not divisible by the 2 devices"):
        example.training_devices(0, "CPU:0,CPU:1", 5)
    args = example.parse(["train", "--devices", "CPU:0,CPU:1", "--batch", "4"])
    assert args.train_devices == D2 and args.device == "CPU:0"
    with pytest.raises(SystemExit):
        example.parse(["train", "--gpus", "4", "--batch", "6"])
