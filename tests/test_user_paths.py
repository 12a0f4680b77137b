"""PyTorch users' habits that must give PyTorch's answers: gradients of detached leaves, `requires_grad` of results,
torch-style shape calls, and the torch names added for them. Values against numpy (always) and PyTorch (when
installed); gradients against PyTorch or central finite differences."""
from __future__ import annotations

import pytest
from torch_optional import torch

from glassgrad import Tensor


# ---------------------------------------------------------------------- detach() and .grad
def test_leaf_reached_only_through_detach_keeps_grad_none() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    w = Tensor([4.0, 5.0, 6.0], requires_grad=True)
    ((x.detach() * 2).sum() + (w * 3).sum()).backward()
    assert x.grad is None
    assert w.grad is not None and w.grad.tolist() == [3.0, 3.0, 3.0]


def test_leaf_behind_a_comparison_keeps_grad_none() -> None:
    x = Tensor([1.0, -2.0, 3.0], requires_grad=True)
    w = Tensor([4.0, 5.0, 6.0], requires_grad=True)
    ((x > 0).float().sum() + (w * x.detach()).sum()).backward()
    assert x.grad is None
    assert w.grad is not None and w.grad.tolist() == [1.0, -2.0, 3.0]


def test_leaf_used_with_a_zero_gradient_gets_zeros() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * 0).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [0.0, 0.0, 0.0]


def test_leaf_used_both_ways_gets_the_attached_gradient() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    (x * x.detach()).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [1.0, 2.0, 3.0]  # d/dx of x*c is c, not 2x


def test_backward_with_only_detached_leaves_raises_as_torch() -> None:
    x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="detach"):
        (x.detach() * 2).sum().backward()
    assert x.grad is None
    if torch is not None:
        tx = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        with pytest.raises(RuntimeError):
            (tx.detach() * 2).sum().backward()


def test_tinygrad_style_backward_still_fills_every_tensor() -> None:
    t = Tensor([1.0, 2.0])
    (t.detach() * t).sum().backward()  # no requires_grad anywhere: tinygrad's rule
    assert t.grad is not None and t.grad.tolist() == [1.0, 2.0]
