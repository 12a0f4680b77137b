"""Rendering needs no backend package: `glassgrad.kernels(..., device="CUDA"/"METAL")` with numpy alone.

Each test runs a fresh Python in which only the standard library, numpy and glassgrad can be imported (an import
hook refuses everything else: cuda-bindings, NVRTC's wheels, PyObjC, pytest, and glassgrad's CUDA and Metal runtime
modules), as on a laptop with the base install. With `CC` naming a compiler that does not exist, the machine has no
usable C compiler either: tensors and rendering still work, and realizing on the CPU says what is missing.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parent.parent

BLOCK_IMPORTS = """
import importlib.abc, sys

class NumpyAlone(importlib.abc.MetaPathFinder):
    blocked = ("glassgrad.runtime.ops_cuda", "glassgrad.runtime.ops_metal")
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if name in self.blocked or top not in (*sys.stdlib_module_names, "numpy", "glassgrad"):
            raise ImportError(f"{name} is not installed here (numpy alone)")
        return None

sys.meta_path.insert(0, NumpyAlone())
"""


def run_alone(code: str, tmp_path: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "CACHEDIR": str(tmp_path), "PYTHONPATH": str(REPO), **env}
    full_env.pop("DEV", None)
    return subprocess.run([sys.executable, "-c", BLOCK_IMPORTS + textwrap.dedent(code)], capture_output=True,
                          text=True, env=full_env, timeout=300)


RENDER = """
import numpy as np
from glassgrad import Tensor, dtypes, kernels

a, b = Tensor.rand(256, 256).cast(dtypes.half), Tensor.rand(256, 256).cast(dtypes.half)
out = ((a @ b).float().relu() + 1).sum(axis=1)
cuda = kernels(out, device="CUDA")
assert cuda and all('extern "C" __global__' in k.source for k in cuda), [k.source for k in cuda]
assert any("wgmma.mma_async" in k.source for k in cuda)  # sm_90 by default: warpgroup MMAs for the half matmul
ampere = kernels(out, device="CUDA", arch="sm_80")
assert any("mma.sync" in k.source for k in ampere) and not any("wgmma" in k.source for k in ampere)
old = kernels(out, device="CUDA", arch="sm_75")
assert old and not any("mma" in k.source for k in old)
metal = kernels(out, device="METAL")
assert metal and all("kernel void" in k.source and "metal_stdlib" in k.source for k in metal)
blocked = [m for m in sys.modules if m.split(".")[0] in ("cuda", "Metal", "objc", "nvidia")
           or m in ("glassgrad.runtime.ops_cuda", "glassgrad.runtime.ops_metal")]
assert not blocked, blocked
print("rendered", len(cuda), len(metal))
"""


def test_cuda_and_metal_kernels_render_with_numpy_alone(tmp_path: pathlib.Path) -> None:
    proc = run_alone(RENDER, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("rendered")


def test_rendering_needs_no_c_compiler_either(tmp_path: pathlib.Path) -> None:
    missing = str(tmp_path / "no-such-cc")
    code = RENDER + f"""
from glassgrad.runtime.ccompiler import CCompilerError
cpu = kernels(out)  # the CPU's kernels render as portable C (no compiler to probe)
assert cpu and not any("_Float16" in k.source for k in cpu)
try:
    out.numpy()
except CCompilerError as e:
    assert {missing!r} in str(e) and "not found" in str(e), e
    print("raised")
"""
    proc = run_alone(code, tmp_path, CC=missing)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["rendered", proc.stdout.split()[1], proc.stdout.split()[2], "raised"]
