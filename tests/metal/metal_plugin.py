"""A pytest plugin for checking the Metal backend without a Mac (tests/conftest.py loads and registers it).

In: the environment. Out: hooks into the test session.

* `GLASSGRAD_METAL_EMULATION=1`: `Device["METAL"]` becomes the EMULATED Metal device of `metal_emulator.py`, so
  `DEV=METAL GLASSGRAD_METAL_EMULATION=1 pytest tests/test_ops.py` runs the op suite through the real
  `MetalRenderer` and the emulator. A test that fails only because a kernel needs float64 (`MetalDTypeError`:
  MSL has no double, and the renderer says so by design) is reported as skipped, with that error as the reason.
* `CHECK_METAL_SYNTAX=1`: every kernel the engine compiles, for whatever device, is also rendered by
  `MetalRenderer` and compiled against `shim.h` with -fsyntax-only; a compile error fails the test that made the
  kernel, with the compiler's messages and the source. The count of distinct kernels checked is printed at the end
  (run without xdist for a count over the whole run).
* `GLASSGRAD_METAL_SUBSET=n`: run at most n cases of each parametrized test (evenly spaced over its parameter list;
  unparametrized tests all run), the representative subset CI runs on the emulator (tests/metal/test_metal_suite.py).
"""
from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import metal_emulator
import pytest

from glassgrad.codegen import get_program
from glassgrad.engine import realize
from glassgrad.renderer.metal import MetalDTypeError, MetalRenderer

EMULATION = os.environ.get("GLASSGRAD_METAL_EMULATION") == "1"
SYNTAX_CHECK = bool(os.environ.get("CHECK_METAL_SYNTAX"))
SUBSET = int(os.environ.get("GLASSGRAD_METAL_SUBSET", "0"))
checked: set[str] = set()
not_expressible: set[Any] = set()  # kernel ASTs that need float64


def install() -> None:
    if EMULATION:
        metal_emulator.install()
    if SYNTAX_CHECK:
        wrap_render()


def wrap_render() -> None:
    """Syntax-check the MSL of every kernel the engine renders (`realize._render`: the one step of every compile, a
    lone kernel's `compile_kernel`, a schedule's batched `compile_schedule` and a TinyJit capture alike)."""
    renderer = MetalRenderer()
    original = realize._render

    def render_and_check(device: str, ast: Any) -> Any:
        try:
            spec = get_program(ast, renderer)
        except MetalDTypeError:
            not_expressible.add(ast)
        else:
            if spec.source not in checked:
                metal_emulator.syntax_check(spec.source)
                checked.add(spec.source)
        return original(device, ast)

    realize._render = render_and_check  # type: ignore[assignment]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if EMULATION and report.failed and call.excinfo is not None and call.excinfo.errisinstance(MetalDTypeError):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {call.excinfo.value}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SUBSET <= 0:
        return
    cases: dict[str, list[pytest.Item]] = {}
    for item in items:
        cases.setdefault(f"{item.path}::{getattr(item, 'originalname', item.name)}", []).append(item)
    keep: set[pytest.Item] = set()
    for group in cases.values():
        step = max(1, len(group) / SUBSET)
        keep.update(group[int(i * step)] for i in range(min(SUBSET, len(group))))
    config.hook.pytest_deselected(items=[item for item in items if item not in keep])
    items[:] = [item for item in items if item in keep]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if EMULATION:
        terminalreporter.write_line(f"emulated Metal device: {metal_emulator.EmulatedMetalProgram.launches} kernel "
                                    f"launches in this process (0 in the controller of an xdist run)")
    if SYNTAX_CHECK:
        terminalreporter.write_line(f"Metal syntax check: {len(checked)} distinct MSL kernels compiled against "
                                    f"tests/metal/shim.h; {len(not_expressible)} kernels need float64 (MSL has none: "
                                    f"MetalDTypeError)")
