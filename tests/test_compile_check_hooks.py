"""The compile-check plugins (CHECK_CUDA_COMPILE=1: tests/cuda_compile_check.py; CHECK_METAL_SYNTAX=1:
tests/metal/metal_plugin.py) see every kernel the engine builds. They wrapped `realize.compile_kernel`, which only a
schedule's lone new kernel goes through: a schedule with two or more new kernels is compiled in batches by
`compile_schedule` (and TinyJit imports compile_kernel by name), so most kernels of a test run were never checked
(a softmax-matmul-sum and a var: 0 of their 6 kernels). Here the hooks are installed with recording stand-ins for
NVRTC and the MSL syntax check, and must have seen each kernel the schedules render."""
from __future__ import annotations

import os
import sys
from typing import Any

import cuda_compile_check
import numpy as np
import pytest

from glassgrad import Tensor
from glassgrad.engine import realize

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "metal"))
import metal_plugin  # noqa: E402


class RecordingCompiler:
    def __init__(self) -> None:
        self.sources: list[str] = []

    def compile_cached(self, source: str) -> bytes:
        self.sources.append(source)
        return b"\x7fELF"


def _rendered(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record the ASTs the engine renders from here on (below the hook that is installed next)."""
    asts: list[Any] = []
    original = realize._render
    monkeypatch.setattr(realize, "_render", lambda device, ast: asts.append(ast) or original(device, ast))
    return asts


def _fresh_kernels(rows: int) -> None:
    """A schedule of several kernels no earlier test has built (a shape of its own): compile_schedule batches them."""
    x = Tensor(np.random.default_rng(0).standard_normal((rows, 41)).astype(np.float32))
    assert np.isfinite(((x.softmax(1) @ x.T).sum(0) + x.var(0).sum()).numpy()).all()


def test_cuda_compile_check_sees_batched_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    asts = _rendered(monkeypatch)
    compiler = RecordingCompiler()
    monkeypatch.setattr(cuda_compile_check, "_checked", set())
    cuda_compile_check.install(compiler)
    _fresh_kernels(113)
    assert len(set(asts)) >= 3
    assert len(compiler.sources) >= len(set(asts)) and all('extern "C" __global__' in s for s in compiler.sources)


def test_metal_syntax_check_sees_batched_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    asts = _rendered(monkeypatch)
    sources: list[str] = []
    monkeypatch.setattr(metal_plugin.metal_emulator, "syntax_check", lambda source: sources.append(source) or "")
    monkeypatch.setattr(metal_plugin, "checked", set())
    metal_plugin.wrap_render()
    _fresh_kernels(117)
    assert len(set(asts)) >= 3
    assert len(sources) >= len(set(asts)) and all("kernel void" in s for s in sources)
