"""The op test suite (tests/test_ops.py) on the EMULATED Metal device, a representative subset, in CI.

tests/test_ops.py picks its device when it is imported (`DEV`), so it runs in a child pytest with
`DEV=METAL GLASSGRAD_METAL_EMULATION=1 GLASSGRAD_METAL_SUBSET=2`: every test function runs, parametrized ones with
2 of their cases (tests/metal/metal_plugin.py picks them evenly spaced), except `test_large_tensors`: its
threadgroup reductions over hundreds of groups cost a few thousand barrier rounds, each waking 256 OS threads, which
takes ~17 s alone and over a minute next to the other CI tests. About 175 tests, ~45 s from a cold kernel cache on
2 idle cores, most of it compiling kernels. The whole suite, `test_large_tensors` included, is the command in the
README's Metal section (~2 minutes from a cold cache, under 1 minute warm, with -n 2 on 2 cores).
"""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import metal_emulator
import pytest

pytestmark = metal_emulator.needs_cxx

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_op_suite_subset_on_the_emulated_metal_device() -> None:
    env = {**os.environ, "DEV": "METAL", "GLASSGRAD_METAL_EMULATION": "1", "GLASSGRAD_METAL_SUBSET": "2"}
    env.pop("CHECK_METAL_SYNTAX", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "tests/test_ops.py", "-q", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "-k", "not test_large_tensors"],
                          cwd=ROOT, env=env, capture_output=True, text=True)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))  # type: ignore[union-attr]
    launches = int(re.search(r"emulated Metal device: (\d+) kernel launches", proc.stdout).group(1))  # type: ignore[union-attr]
    assert passed >= 150 and launches >= 500, summary
    assert "failed" not in summary and "error" not in summary, summary
