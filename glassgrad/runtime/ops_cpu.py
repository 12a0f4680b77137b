"""The CPU backend: C source -> shared library (system C compiler) -> ctypes call, split over threads.

In: C source from `ClangRenderer` (one function per kernel whose last two arguments are the [start, end) slice
of its outermost loop). Out: a callable program. `CC` picks the compiler (default: clang, else gcc, else cc).
Buffers are 64-byte-aligned numpy byte arrays, so host copies are plain memcpy.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from glassgrad.device import Allocator, Compiled, Compiler
from glassgrad.helpers import CACHELEVEL, atomic_write, cache_dir, getenv
from glassgrad.renderer.cstyle import ClangRenderer


class CPUAllocator(Allocator):
    def _alloc(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 64
        return raw[offset:offset + nbytes]

    def copyin(self, handle: np.ndarray, src: memoryview) -> None:
        handle[:] = np.frombuffer(src, dtype=np.uint8)

    def copyout(self, dest: memoryview, handle: np.ndarray) -> None:
        np.frombuffer(dest, dtype=np.uint8)[:] = handle


def find_c_compiler() -> str:
    for candidate in (os.environ.get("CC"), "clang", "gcc", "cc"):
        if candidate and shutil.which(candidate):
            return candidate
    raise RuntimeError("no C compiler found for the CPU backend: install clang or gcc, or set CC")


class ClangCompiler(Compiler):
    """Compiles a kernel's C source to a shared library's bytes."""
    flags = ["-O2", "-march=native", "-fPIC", "-shared", "-fwrapv", "-ffp-contract=off", "-fno-math-errno",
             "-fopenmp-simd"]

    def __init__(self) -> None:
        super().__init__()
        self.cc = find_c_compiler()
        self.libs = ["-lm"]
        if self._try_compile(VECTOR_MATH_PROBE, ["-DGG_VECTOR_MATH"], ["-lmvec", "-lm"])[0] is not None:
            self.flags = [*self.flags, "-DGG_VECTOR_MATH"]  # glibc's SIMD exp2f/log2f/sinf (libmvec) are usable
            self.libs = ["-lmvec", "-lm"]
        version = subprocess.run([self.cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
        self.cache_key = f"cpu {self.cc} {version} {platform.machine()} {platform.node()} {' '.join(self.flags)}"

    def _try_compile(self, src: str, extra_flags: list[str], libs: list[str]) -> tuple[bytes | None, str]:
        """(the shared library, or None if the compiler failed; the compiler's messages). Safe to call from several
        threads at once: each call has its own process and temporary directory."""
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "kernel.so")
            proc = subprocess.run([self.cc, *self.flags, *extra_flags, "-x", "c", "-", "-o", out, *libs],
                                  input=src.encode(), capture_output=True)
            if proc.returncode != 0:
                return None, proc.stderr.decode()
            with open(out, "rb") as f:
                return f.read(), proc.stderr.decode()

    batches = True

    def compile_batch(self, sources: list[str]) -> bytes | None:
        """All the kernels in one shared library: the sources one after another in one C file. A source with
        file-local (`static`) helpers would define them twice, so such batches are left to `compile`."""
        if any("static " in src for src in sources):
            return None
        return self._try_compile("\n".join(sources), [], self.libs)[0]

    def compile(self, src: str) -> bytes:
        binary, messages = self._try_compile(src, [], self.libs)
        if binary is None:
            raise RuntimeError(f"C compile failed ({self.cc}):\n{messages}\n--- source ---\n{src}")
        return binary


VECTOR_MATH_PROBE = """#include <math.h>
float exp2f(float) __attribute__((simd("notinbranch")));
void probe(float* restrict out, const float* restrict in) { for (int i = 0; i < 64; i++) out[i] = exp2f(in[i]); }
"""


_POOL: ThreadPoolExecutor | None = None
THREADS = getenv("THREADS", os.cpu_count() or 1)
MIN_WORK_PER_THREAD = 1 << 15  # below this much work, a thread costs more than it saves


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="glassgrad-cpu")
    return _POOL


def _load_library(binary: bytes) -> ctypes.CDLL:
    """dlopen needs a file: keep it in the cache directory, or (CACHELEVEL=0) in a temporary file removed at once."""
    if CACHELEVEL < 1:
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(binary)
            f.flush()
            return ctypes.CDLL(f.name)  # the mapping outlives the unlinked file
    path = cache_dir() / "lib" / f"{hashlib.sha256(binary).hexdigest()}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, binary)
    return ctypes.CDLL(str(path))


def _address(handle: np.ndarray) -> int:
    """The address of a buffer's memory (a ctypes view of the array: several times cheaper than `handle.ctypes`)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(handle))  # type: ignore[arg-type]  # (an ndarray is a buffer)


class CPUProgram:
    """One compiled kernel. Calling it runs the outer loop's range split evenly across threads. The C function takes
    the buffers, then `vals` (Variable values, symbolic sizes) as ints, then the [start, end) of its outer loop."""

    def __init__(self, name: str, binary: bytes) -> None:
        self.name = name
        self.lib = _load_library(binary)
        self.fn = getattr(self.lib, name)
        self.fn.restype = None

    def __call__(self, *bufs: np.ndarray, global_size: tuple[int, ...] = (1,), local_size: Any = None,
                 vals: tuple[int, ...] = (), work: int = 0, wait: bool = False) -> float:
        if self.fn.argtypes is None:  # the first call fixes the C argument types, so every call passes plain ints
            self.fn.argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int32] * len(vals) + [ctypes.c_int64] * 2
        args = [_address(b) for b in bufs] + list(vals)
        outer = global_size[0] if global_size else 1
        threads = max(1, min(THREADS, outer, work // MIN_WORK_PER_THREAD))
        start = time.perf_counter()
        if threads == 1:
            self.fn(*args, 0, outer)
        else:
            bounds = [outer * i // threads for i in range(threads + 1)]
            run = functools.partial(self.fn, *args)
            # the calling thread runs the first part itself (ctypes releases the GIL): one hand-off fewer to wait for
            futures = [_pool().submit(run, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:]) if hi > lo]
            run(bounds[0], bounds[1])
            for f in futures:
                f.result()
        return time.perf_counter() - start


def create_device(name: str) -> Compiled:
    if name != "CPU":
        raise ValueError(f"the CPU backend has one device, 'CPU'; got {name!r}")
    return Compiled(name, CPUAllocator(), ClangRenderer(), ClangCompiler(), CPUProgram)


def create_renderer() -> ClangRenderer:
    return ClangRenderer()
