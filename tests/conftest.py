"""Test-session hooks. `CHECK_CUDA_COMPILE=1`: also compile every kernel the tests run as CUDA
(tests/cuda_compile_check.py; run it without xdist so the final count covers the whole run). Every test: PyTorch's
max pools refuse windows wholly in the padding, whose backward writes past its buffer (tests/torch_pool_net.py)."""
from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch_pool_net

if os.environ.get("CHECK_CUDA_COMPILE"):
    import cuda_compile_check

    cuda_compile_check.install()

    def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
        cuda_compile_check.pytest_terminal_summary(terminalreporter)

# GLASSGRAD_METAL_EMULATION=1: Device["METAL"] is the EMULATED Metal device of tests/metal/metal_emulator.py (the
# real MetalRenderer's MSL, compiled as C++ and run on CPU threads); with DEV=METAL the op suite runs on it.
# CHECK_METAL_SYNTAX=1: also compile every kernel the tests run as MSL against tests/metal/shim.h (-fsyntax-only).
# Both live in tests/metal/metal_plugin.py.
if os.environ.get("GLASSGRAD_METAL_EMULATION") == "1" or os.environ.get("CHECK_METAL_SYNTAX"):


    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "metal"))
    import metal_plugin

    metal_plugin.install()

    def pytest_configure(config: pytest.Config) -> None:
        config.pluginmanager.register(metal_plugin, "glassgrad-metal")


# GLASSGRAD_TEST_MULTI_IN_USE=1: every realize goes through the multi-device lowering (`multi.lower`), as it does in a
# process once any tensor was sharded; single-device programs must behave the same (a JIT capture's random-state
# advance once wrote into a kept copy of the state there, so every replay drew the same numbers)
if os.environ.get("GLASSGRAD_TEST_MULTI_IN_USE") == "1":
    from glassgrad import multi as _multi
    _multi._IN_USE[0] = True


@pytest.fixture(scope="module")
def cuda() -> str:
    """"CUDA", for tests that run kernels on a GPU; they skip, with the reason, where no GPU can be used."""
    from glassgrad.device import Device
    try:
        Device["CUDA"]
    except (RuntimeError, ImportError) as e:
        pytest.skip(f"no usable CUDA GPU: {e}")
    return "CUDA"


@pytest.fixture(scope="module")
def nvrtc() -> Any:
    """A `CUDACompiler` for sm_90 (NVRTC: no GPU needed); tests skip, with the reason, where NVRTC is missing."""
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")
    from glassgrad.runtime.ops_cuda import CUDACompiler
    try:
        return CUDACompiler("sm_90")
    except RuntimeError as e:
        pytest.skip(f"NVRTC is not available: {e}")


@pytest.fixture(autouse=True)
def _torch_max_pools_checked() -> None:
    """PyTorch's max pools refuse windows wholly in the padding, whose backward corrupts the heap
    (tests/torch_pool_net.py); installed once PyTorch is imported."""
    torch_pool_net.install()


@pytest.fixture(autouse=True)
def _reference_generators_seeded() -> None:
    """PyTorch's and numpy's global generators start every test from seed 0: a test that builds a PyTorch model to
    compare against draws the same initial weights whatever ran before it in the worker. (Unseeded, the seq2seq
    parity test drew other weights in each test order, and for some draws a weight whose gradient is far below
    Adam's eps moved 3e-5 differently: float32 rounding of that gradient, amplified by Adam, not a glassgrad bug.)"""
    import numpy as np
    np.random.seed(0)
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(0)


@pytest.fixture
def literal_constants() -> Any:
    """Kernels keep their float constants as literals (`LIFT_CONSTANTS=0`): for tests that run a schedule's kernel
    ASTs by hand (their own launch, without the item's `var_vals`, which carry lifted constants' values)."""
    from glassgrad.helpers import Context
    with Context(LIFT_CONSTANTS=0):
        yield
