"""Fixtures of the Metal tests: `emulated`, the EMULATED Metal device (tests/metal/metal_emulator.py) installed as
"METAL" for one test."""
from __future__ import annotations

import metal_emulator
import pytest

from glassgrad.device import Compiled, Device


@pytest.fixture
def emulated(monkeypatch: pytest.MonkeyPatch) -> Compiled:
    device = metal_emulator.create_emulated_device()
    monkeypatch.setitem(Device._devices, "METAL", device)
    return device
