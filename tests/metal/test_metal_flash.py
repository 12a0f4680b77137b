"""Flash attention's kernels on a GPU without tensor cores (the generic launch shapes: a work-group per output
whose threads split the outer reduction, each computing the scores it needs in a loop of its own): run on the
EMULATED Metal device. A scores reduction nested in the outer one was grouped across the threads too (each thread
summed a different slice of a different score), which gave wrong gradients from 256 keys on.
"""
from __future__ import annotations

import sys
from pathlib import Path

import metal_emulator
import numpy as np
import pytest

from glassgrad.device import Compiled
from glassgrad.helpers import Context

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_flash_attention import expected, inputs, run  # noqa: E402

pytestmark = metal_emulator.needs_cxx


@pytest.mark.parametrize("mask", ["additive"])
def test_forced_flash_on_metal(emulated: Compiled, mask: str) -> None:
    arrays = inputs((1, 1, 256, 2), (1, 1, 256, 2), seed=4)
    with Context(FLASH_ATTENTION=1):
        got = run(arrays, mask, device="METAL")
    for g, e, name in zip(got, expected(arrays, mask), ("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5, err_msg=name)
