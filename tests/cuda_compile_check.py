"""A pytest plugin: also compile every kernel the tests run as CUDA, with NVRTC, for sm_90 (no GPU needed).

Enabled with `CHECK_CUDA_COMPILE=1` (tests/conftest.py loads it). Each time the engine renders a new kernel for
the device under test (`realize._render`: the one step every compile takes, a lone kernel through
`compile_kernel` or a schedule's batch through `compile_schedule`, a TinyJit capture too), the same kernel AST is
rendered by `CUDARenderer` and compiled to an sm_90 CUBIN; a compile error fails the test that produced the kernel,
with NVRTC's log and the source. At the end the number of distinct kernels compiled is printed, so a run that
checked nothing is visible.
"""
from __future__ import annotations

from typing import Any

import pytest

from glassgrad.codegen import get_program
from glassgrad.engine import realize

_checked: set[str] = set()


def _compiler() -> Any:
    from glassgrad.runtime.ops_cuda import CUDACompiler
    return CUDACompiler("sm_90")


def install(compiler: Any = None) -> None:
    """Wrap `realize._render` (`compiler`: NVRTC for sm_90 unless given; anything with `compile_cached`)."""
    compiler = compiler or _compiler()
    from glassgrad.renderer.cuda import CUDARenderer
    renderer = CUDARenderer()
    original = realize._render

    def render_and_check(device: str, ast: Any) -> Any:
        spec = get_program(ast, renderer)
        if spec.source not in _checked:
            binary = compiler.compile_cached(spec.source)
            if not binary.startswith(b"\x7fELF"):
                raise RuntimeError(f"NVRTC did not produce a CUBIN for {spec.name}")
            _checked.add(spec.source)
        return original(device, ast)

    realize._render = render_and_check  # type: ignore[assignment]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:  # called from conftest.py
    terminalreporter.write_line(f"CUDA compile check: {len(_checked)} distinct kernels compiled to sm_90 CUBIN")
