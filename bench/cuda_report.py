"""What the CUDA compiler made of glassgrad's kernels for the GPU benchmark's workloads (no GPU needed).

In: nothing (or workload names as arguments). Out: per kernel its launch shape, ptxas's resource report (registers,
spills, shared memory) and a histogram of the memory and math instructions: PTX from NVRTC always, SASS too when
`cuobjdump` is on the PATH (e.g. on the GPU machine).

    python bench/cuda_report.py matmul conv
"""
from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

from cuda.bindings import nvrtc

import glassgrad as gg
from glassgrad import Tensor, dtypes
from glassgrad.runtime.ops_cuda import CUDACompiler, check

WORKLOADS: dict[str, Callable[[], Tensor]] = {
    "matmul": lambda: Tensor.empty(4096, 4096) @ Tensor.empty(4096, 4096),
    "matmul_half": lambda: Tensor.empty(4096, 4096, dtype=dtypes.float16) @ Tensor.empty(4096, 4096,
                                                                                         dtype=dtypes.float16),
    "conv": lambda: Tensor.empty(64, 64, 56, 56).conv2d(Tensor.empty(128, 64, 3, 3), padding=1),
    "sum": lambda: Tensor.empty(8192, 8192).sum(axis=1),
    "softmax": lambda: Tensor.empty(8192, 8192).softmax(-1),
}
PTX_OPS = r"(ld\.shared[.\w]*|ld\.global[.\w]*|st\.shared[.\w]*|st\.global[.\w]*|fma\.rn\.f32|mma[.\w]*|bar\.sync)"
SASS_OPS = r"\b(LDS[.\w]*|LDG[.\w]*|STS[.\w]*|STG[.\w]*|FFMA|HMMA[.\w]*|LDL[.\w]*|STL[.\w]*|BAR[.\w]*|LDSM[.\w]*)\b"


def compile_with_report(src: str) -> tuple[str, str, bytes]:
    """(ptxas log, PTX, CUBIN) for one kernel."""
    prog = check(nvrtc.nvrtcCreateProgram, src.encode(), b"kernel.cu", 0, [], [])
    options = [o.encode() for o in CUDACompiler("sm_90").options] + [b"--ptxas-options=-v"]
    status, = nvrtc.nvrtcCompileProgram(prog, len(options), options)
    log = b" " * check(nvrtc.nvrtcGetProgramLogSize, prog)
    check(nvrtc.nvrtcGetProgramLog, prog, log)
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(log.decode())
    ptx = b" " * check(nvrtc.nvrtcGetPTXSize, prog)
    check(nvrtc.nvrtcGetPTX, prog, ptx)
    cubin = b" " * check(nvrtc.nvrtcGetCUBINSize, prog)
    check(nvrtc.nvrtcGetCUBIN, prog, cubin)
    return log.decode(errors="replace"), ptx.decode(errors="replace"), cubin


def sass_histogram(cubin: bytes) -> collections.Counter[str] | None:
    if shutil.which("cuobjdump") is None:
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run(["cuobjdump", "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return collections.Counter(re.findall(SASS_OPS, sass))


def main() -> None:
    names = sys.argv[1:] or list(WORKLOADS)
    for name in names:
        for spec in gg.kernels(WORKLOADS[name](), device="CUDA"):
            log, ptx, cubin = compile_with_report(spec.source)
            print(f"{name}: {spec}")
            for line in log.splitlines():
                if "Used" in line or "spill" in line:
                    print("   ", line.split(":", 1)[-1].strip().strip("\x00"))
            print("    PTX: ", dict(collections.Counter(re.findall(PTX_OPS, ptx))))
            sass = sass_histogram(cubin)
            if sass is not None:
                print("    SASS:", dict(sass))


if __name__ == "__main__":
    main()
