"""PyTorch for the tests that compare against it, when it is installed: `torch` and `F` (torch.nn.functional), or
None for both, and `needs_torch`, a skip mark for tests that cannot run without it. CI has no PyTorch: the numpy
references and finite differences still check everything there."""
from __future__ import annotations

from typing import Any

import pytest

torch: Any
F: Any
try:
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)  # tiny tensors: threads only compete with the other pytest worker and with the compiler
except ImportError:
    torch = None
    F = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch not installed")
