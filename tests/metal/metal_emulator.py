"""EMULATED Metal device for tests: MetalRenderer's MSL, compiled as C++ against shim.h, run on CPU threads.

In: nothing (call `install()`, or `create_emulated_device()`). Out: a `Compiled` backend under the name "METAL",
so `Tensor(..., device="METAL")` renders kernels with the real `MetalRenderer` and runs them here:

* the compiler is a C++ compiler (`CXX`, else clang++, else g++): the MSL source is compiled unchanged, with
  `tests/metal` on the include path (its `metal_stdlib` includes `shim.h`) and an entry point `gg_entry` appended
  (`entry_point`), into a shared library;
* a launcher (`launcher.cpp`, compiled once) runs the kernel over the whole grid with one OS thread per Metal
  thread of a threadgroup, `threadgroup_barrier` a real barrier of those threads; a kernel that uses threadgroup
  memory or barriers runs its groups one after another, in lockstep;
* memory is 64-byte-aligned numpy arrays, like the CPU backend (Metal's shared storage mode is host memory too),
  with guard bytes on both sides: a kernel that writes up to `GUARD` bytes outside a buffer is reported.

What this verifies: the MSL text compiles as C++ with Metal's types, address spaces and functions; the kernel's
indexing, thread-id arithmetic, shared-memory reductions and barriers compute the right numbers. What it does not:
that Apple's Metal compiler accepts the source, the precision of Apple's GPU math (the host's libm is used), GPU
memory ordering beyond barriers, or anything about speed. Only a Mac verifies those.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pytest

from glassgrad.device import Allocator, Compiled, Compiler, Device
from glassgrad.helpers import atomic_write, cache_dir
from glassgrad.renderer.metal import MetalRenderer

HERE = pathlib.Path(__file__).resolve().parent
SHIM = HERE / "shim.h"
LAUNCHER = HERE / "launcher.cpp"
KERNEL_NAME = re.compile(r"^kernel void (\w+)\(", re.MULTILINE)
BUFFER_SLOT = re.compile(r"\[\[buffer\((\d+)\)\]\]")
INT_SLOT = re.compile(r"constant int& \w+ \[\[buffer\((\d+)\)\]\]")  # a Variable (symbolic size) argument
SYNCHRONISES = re.compile(r"\bthreadgroup\b|\bthreadgroup_barrier\(")  # threadgroup memory or a barrier


def find_cxx() -> str:
    for candidate in (os.environ.get("CXX"), "clang++", "g++", "c++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise RuntimeError("the emulated Metal device needs a C++ compiler: install g++ or clang++, or set CXX")


def has_cxx() -> bool:
    try:
        find_cxx()
    except RuntimeError:
        return False
    return True


needs_cxx = pytest.mark.skipif(not has_cxx(), reason="no C++ compiler (g++ or clang++): the Metal shim and the "
                                                      "emulator compile MSL as C++")


@functools.cache
def has_float16(cxx: str) -> bool:
    """Whether the C++ compiler has `_Float16` (probed: clang before 15 rejects it on x86-64, gcc 12 has it)."""
    proc = subprocess.run([cxx, "-std=c++17", "-x", "c++", "-c", "-o", os.devnull, "-"],
                          input=b"_Float16 gg_probe(float x) { return static_cast<_Float16>(x); }", capture_output=True)
    return proc.returncode == 0


@functools.cache
def cxx_flags(cxx: str, half_storage: bool | None = None) -> list[str]:
    """Flags that make MSL compile as C++: unknown `[[buffer(n)]]` attributes are ignored, char is signed, and
    `half` is stored as 16 bits where the compiler has no `_Float16` (or when `half_storage` says so)."""
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    attributes = "-Wno-unknown-attributes" if "clang" in version else "-Wno-attributes"
    storage = not has_float16(cxx) if half_storage is None else half_storage
    return ["-std=c++17", "-fsigned-char", attributes, f"-I{HERE}", *(["-DGG_HALF_STORAGE"] if storage else [])]


def syntax_check(source: str, cxx: str | None = None, half_storage: bool | None = None) -> str:
    """Compile MSL source against the shim with -fsyntax-only; the compiler's messages ('' when clean).
    Raises RuntimeError (with the messages and the source) when it does not compile."""
    cxx = cxx or find_cxx()
    proc = subprocess.run([cxx, *cxx_flags(cxx, half_storage), "-fsyntax-only", "-x", "c++", "-"],
                          input=source.encode(), capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"MSL did not compile against the shim ({cxx}):\n{proc.stderr.decode()}\n"
                           f"--- source ---\n{source}")
    return proc.stderr.decode()


def _build(cxx: str, source: str, flags: list[str], libs: tuple[str, ...] = ()) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "lib.so")
        proc = subprocess.run([cxx, *flags, "-x", "c++", "-", "-o", out, *libs], input=source.encode(),
                              capture_output=True)
        if proc.returncode != 0:
            raise RuntimeError(f"emulated Metal compile failed ({cxx}):\n{proc.stderr.decode()}\n"
                               f"--- source ---\n{source}")
        return pathlib.Path(out).read_bytes()


def _load(binary: bytes) -> ctypes.CDLL:
    """dlopen needs a file: keep each library in the cache directory under its hash."""
    path = cache_dir() / "metal-emulator" / f"{hashlib.sha256(binary).hexdigest()}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, binary)
    return ctypes.CDLL(str(path))


class EmulatedMetalCompiler(Compiler):
    """MSL -> a shared library exporting `gg_entry`. The cache key covers the shim, so editing it recompiles."""

    def __init__(self, half_storage: bool | None = None) -> None:
        super().__init__()
        self.cxx = find_cxx()
        self.flags = [*cxx_flags(self.cxx, half_storage), "-O1", "-fPIC", "-shared", "-fwrapv", "-ffp-contract=off",
                      "-fno-math-errno", "-DGG_METAL_EMULATOR", "-pipe"]
        self.libs: tuple[str, ...] = ()
        if sys.platform.startswith("linux"):  # links faster without the C++ runtime, which kernels do not use
            self.flags.append("-nostdlib")
            self.libs = ("-lgcc", "-lm")  # libm, and libgcc's float <-> half conversions
        shim = hashlib.sha256(SHIM.read_bytes()).hexdigest()[:16]
        self.cache_key = f"metal-emulator {self.cxx} {' '.join(self.flags + list(self.libs))} shim {shim}"

    def compile(self, src: str) -> bytes:
        return _build(self.cxx, src + entry_point(src), self.flags, self.libs)


def entry_point(src: str) -> str:
    """C++ appended to a kernel: `gg_entry(buffers, ids, barrier, context)` calls it with buffer i in slot i (an int
    argument's slot points at the int); `gg_lockstep` tells the launcher whether the kernel's threads synchronise."""
    names = KERNEL_NAME.findall(src)
    if len(names) != 1:
        raise RuntimeError(f"expected one `kernel void name(` in the MSL source, found {names}")
    slots = [int(n) for n in BUFFER_SLOT.findall(src)]
    if slots != list(range(len(slots))):
        raise RuntimeError(f"{names[0]}: buffer slots must be 0, 1, 2, ... in order, got {slots}")
    ints = {int(n) for n in INT_SLOT.findall(src)}
    args = ", ".join([*(f"*(int*)buffers[{i}]" if i in ints else f"gg::Buffer{{buffers[{i}]}}" for i in slots),
                      "gid", "lid"])
    return (f"\nextern \"C\" void gg_entry(void** buffers, const unsigned* ids, void (*barrier)(void*), "
            f"void* context) {{\n  uint3 gid, lid;\n  gg::enter(ids, barrier, context, gid, lid);\n"
            f"  {names[0]}({args});\n}}\n"
            f"extern \"C\" const int gg_lockstep = {int(bool(SYNCHRONISES.search(src)))};\n")


@functools.cache
def launcher() -> Any:
    """The compiled launcher.cpp (`gg_launch`), built once per source and compiler."""
    cxx = find_cxx()
    flags = ["-std=c++20", "-O2", "-fPIC", "-shared", "-pthread"]
    key = hashlib.sha256(f"{cxx} {flags}\n{LAUNCHER.read_text()}".encode()).hexdigest()
    path = cache_dir() / "metal-emulator" / f"launcher-{key}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, _build(cxx, LAUNCHER.read_text(), flags))
    fn = ctypes.CDLL(str(path)).gg_launch
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p,
                   ctypes.c_int]
    return fn


GUARD = 256  # bytes before and after each buffer that kernels must leave alone
GUARD_BYTE = 0xA5


class GuardedAllocator(Allocator):
    """64-byte-aligned numpy byte arrays, each between two guard zones of GUARD_BYTE."""

    def _alloc(self, nbytes: int) -> np.ndarray:
        raw = np.full(nbytes + 2 * GUARD + 64, GUARD_BYTE, dtype=np.uint8)
        start = (-(raw.ctypes.data + GUARD)) % 64 + GUARD
        return raw[start:start + nbytes]

    def copyin(self, handle: np.ndarray, src: memoryview) -> None:
        handle[:] = np.frombuffer(src, dtype=np.uint8)

    def copyout(self, dest: memoryview, handle: np.ndarray) -> None:
        np.frombuffer(dest, dtype=np.uint8)[:] = handle


def guards_intact(handle: np.ndarray) -> bool:
    """Are the guard zones around a GuardedAllocator buffer untouched? (True for other arrays: nothing to check.)"""
    raw = handle.base
    if not isinstance(raw, np.ndarray) or raw.base is not None or raw.dtype != np.uint8:
        return True
    start = handle.ctypes.data - raw.ctypes.data
    if start < GUARD:
        return True
    around = np.concatenate([raw[start - GUARD:start], raw[start + handle.nbytes:start + handle.nbytes + GUARD]])
    return bool((around == GUARD_BYTE).all())


def _dims(size: tuple[int, ...] | None) -> Any:
    x, y, z = (*(size or ()), 1, 1, 1)[:3]
    return (ctypes.c_uint * 3)(x, y, z)


class EmulatedMetalProgram:
    """One kernel. Calling it runs `global_size` threadgroups of `local_size` threads (Metal's
    dispatchThreadgroups) and returns the wall time in seconds."""

    MAX_THREADS_PER_GROUP = 1024  # what Apple GPUs allow (maxTotalThreadsPerThreadgroup)
    launches = 0  # kernels run by the emulator in this process, for the test session's summary

    def __init__(self, name: str, binary: bytes) -> None:
        self.name = name
        self.lib = _load(binary)
        self.entry = ctypes.cast(self.lib.gg_entry, ctypes.c_void_p)
        self.lockstep = ctypes.c_int.in_dll(self.lib, "gg_lockstep").value

    def __call__(self, *bufs: np.ndarray, global_size: tuple[int, ...] = (1,),
                 local_size: tuple[int, ...] | None = None, vals: tuple[int, ...] = (), work: int = 0,
                 wait: bool = False) -> float:
        threads = int(np.prod(local_size or (1,)))
        if threads > self.MAX_THREADS_PER_GROUP:
            raise RuntimeError(f"{self.name}: {threads} threads per threadgroup, Metal allows "
                               f"{self.MAX_THREADS_PER_GROUP}")
        ints = [ctypes.c_int32(v) for v in vals]  # after the buffers, as Metal's setBytes would bind them
        pointers = (ctypes.c_void_p * max(len(bufs) + len(ints), 1))(*[b.ctypes.data for b in bufs],
                                                                      *[ctypes.addressof(i) for i in ints])
        error = ctypes.create_string_buffer(512)
        start = time.perf_counter()
        status = launcher()(self.entry, pointers, _dims(global_size), _dims(local_size), self.lockstep, error,
                            len(error))
        if status != 0:
            raise RuntimeError(f"emulated Metal kernel {self.name} failed: {error.value.decode()}")
        EmulatedMetalProgram.launches += 1
        broken = [i for i, b in enumerate(bufs) if not guards_intact(b)]
        if broken:
            raise RuntimeError(f"emulated Metal kernel {self.name} wrote outside buffer(s) {broken}")
        return time.perf_counter() - start


def create_emulated_device(name: str = "METAL") -> Compiled:
    return Compiled(name, GuardedAllocator(), MetalRenderer(), EmulatedMetalCompiler(), EmulatedMetalProgram)


def install(name: str = "METAL") -> Compiled:
    """Register the emulated device as `Device[name]` (replacing a real or earlier one) and return it."""
    device = create_emulated_device(name)
    Device._devices[Device.canonicalize(name)] = device
    return device
