"""The CPU backend: C source -> shared library (system C compiler) -> ctypes call, split over threads.

In: C source from `ClangRenderer` (one function per kernel whose last two arguments are the [start, end) slice
of its outermost loop). Out: a callable program. `CC` picks the compiler (default: the first of gcc, clang and cc
that builds a kernel); `runtime/ccompiler.py` probes what it can do, and the renderer is made to match.
Buffers are 64-byte-aligned numpy byte arrays, so host copies are plain memcpy.

`CPU_BUFFER_GUARD=1` (a debugging aid, read when the CPU device is created) allocates every buffer with 64 bytes of
a known pattern directly before and after its data (`runtime/cpu_guard.py`) and checks the guards of the buffers a
kernel was given after each launch, and of the buffer copied after each copyin/copyout: a kernel that wrote outside
a buffer raises `BufferGuardError` at that launch, naming the kernel (with its source when launched by
`engine/realize.py`), the argument and the byte offset, where otherwise glibc might abort much later (`free():
invalid next size`) or nothing at all be seen. Off, the plain allocator and program classes run: no cost.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import platform
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from glassgrad.device import Allocator, Compiled, Compiler, ran
from glassgrad.helpers import CACHELEVEL, atomic_write, cache_dir, getenv, read_checked, write_checked
from glassgrad.renderer.cstyle import ClangRenderer, opt_level_of
from glassgrad.runtime.ccompiler import OPT_FLAG, CCompilerError, CCompilerInfo, find_c_compiler
from glassgrad.runtime.cpu_guard import check_guards, guarded_alloc, release
from glassgrad.runtime.cpu_pool import LazyPool

# id(handle) -> (the handle, its address), for every handle an allocator made and has not released: a launch looks
# the addresses up instead of asking ctypes for each. The entry holds its array, so the id cannot be reused while
# the entry exists.
_ADDRESSES: dict[int, tuple[np.ndarray, int]] = {}


class CPUAllocator(Allocator):
    def _alloc(self, nbytes: int) -> np.ndarray:
        raw = np.empty(nbytes + 64, dtype=np.uint8)
        offset = (-raw.ctypes.data) % 64
        handle = raw[offset:offset + nbytes]
        _ADDRESSES[id(handle)] = (handle, _address(handle))
        return handle

    def _release(self, handle: np.ndarray, nbytes: int) -> None:
        _ADDRESSES.pop(id(handle), None)

    # (a buffer living in a memory plan's block has a handle that may be longer than the buffer: copy its bytes only)
    def copyin(self, handle: np.ndarray, src: memoryview) -> None:
        handle[:src.nbytes] = np.frombuffer(src, dtype=np.uint8)

    def copyout(self, dest: memoryview, handle: np.ndarray) -> None:
        np.frombuffer(dest, dtype=np.uint8)[:] = handle[:dest.nbytes]


class GuardedCPUAllocator(CPUAllocator):
    """`CPU_BUFFER_GUARD=1`: each buffer between guard bytes, checked around each host copy (`runtime/cpu_guard.py`)."""

    def _alloc(self, nbytes: int) -> np.ndarray:
        handle = guarded_alloc(nbytes)
        _ADDRESSES[id(handle)] = (handle, _address(handle))
        return handle

    def _release(self, handle: np.ndarray, nbytes: int) -> None:
        _ADDRESSES.pop(id(handle), None)
        release(handle)

    def copyin(self, handle: np.ndarray, src: memoryview) -> None:
        check_guards((handle,), "a copy into the buffer (damaged before it)")
        super().copyin(handle, src)
        check_guards((handle,), "a copy into the buffer")

    def copyout(self, dest: memoryview, handle: np.ndarray) -> None:
        check_guards((handle,), "a copy out of the buffer (damaged before it)")
        super().copyout(dest, handle)


class ClangCompiler(Compiler):
    """Compiles a kernel's C source to a shared library's bytes, with the flags its compiler's probe found
    (`runtime/ccompiler.py`). Without a usable C compiler the CPU device still exists (tensors can be made and their
    kernels rendered, e.g. as CUDA by `glassgrad.kernels`); compiling then raises the `CCompilerError` that says why."""
    batches = True

    def __init__(self, info: CCompilerInfo | None = None) -> None:
        super().__init__()
        self.info: CCompilerInfo | None = info
        self.error: CCompilerError | None = None
        if info is None:
            try:
                self.info = find_c_compiler()
            except CCompilerError as e:
                self.error = e
        self.cc = self.info.path if self.info else ""
        self.flags = list(self.info.flags) if self.info else []
        self.libs = list(self.info.libs) if self.info else []
        identity = f"{self.info.path} {self.info.version}" if self.info else "(no C compiler)"
        self.cache_key = f"cpu {identity} {platform.machine()} {platform.node()} {' '.join(self.flags + self.libs)}"

    def renderer(self) -> ClangRenderer:
        """The C renderer for what this compiler can do (its half type, its SIMD pragmas); portable C without one."""
        if self.info is None:
            return ClangRenderer()
        return ClangRenderer(native_half=self.info.native_half, omp_simd=self.info.omp_simd,
                             vector_bytes=self.info.vector_bytes, max_lanes="-mllvm" in self.info.flags,
                             family=self.info.family)

    def describe(self) -> str:
        return self.info.describe() if self.info else "no C compiler"

    def flags_for(self, level: int | None) -> list[str]:
        """The flags a kernel of optimisation `level` is built with: the probed flags with their `-O2` replaced by
        `-O<level>` (an OPTLEVEL opt's choice, read from the kernel's first line); None: the probed flags."""
        if level is None:
            return self.flags
        if OPT_FLAG not in self.flags:  # (the probe's flags always start with BASE_FLAGS)
            raise RuntimeError(f"the CPU compiler's flags {self.flags} have no {OPT_FLAG} to replace by -O{level}")
        return [f"-O{level}" if flag == OPT_FLAG else flag for flag in self.flags]

    def batch_groups(self, sources: list[str]) -> list[list[str]]:
        """The kernels of each optimisation level (a compiler run has one), in the order their levels first occur."""
        groups: dict[int | None, list[str]] = {}
        for src in sources:
            groups.setdefault(opt_level_of(src), []).append(src)
        return list(groups.values())

    def _try_compile(self, src: str) -> tuple[bytes | None, str]:
        """(the shared library, or None if the compiler failed; the compiler's messages). Safe to call from several
        threads at once: each call has its own process and temporary directory. The flags are those of the
        optimisation level the source's first line asks for (the first kernel's, for a batch: `batch_groups` puts
        kernels of one level together)."""
        if self.error is not None:
            raise self.error
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "kernel.so")
            proc = subprocess.run([self.cc, *self.flags_for(opt_level_of(src)), "-x", "c", "-", "-o", out,
                                   *self.libs], input=src.encode(), capture_output=True)
            if proc.returncode != 0:
                return None, proc.stderr.decode(errors="replace")
            with open(out, "rb") as f:
                return f.read(), proc.stderr.decode(errors="replace")

    def compile_batch(self, sources: list[str]) -> bytes | None:
        """All the kernels in one shared library: the sources one after another in one C file (their helpers, such
        as float16's conversions, are guarded so that a second copy is skipped). None for kernels of several
        optimisation levels (`batch_groups` keeps them apart)."""
        if len(self.batch_groups(sources)) > 1:
            return None
        return self._try_compile("\n".join(sources))[0]

    def compile(self, src: str) -> bytes:
        binary, messages = self._try_compile(src)
        if binary is None:
            raise RuntimeError(f"C compile failed ({self.describe()}):\n{messages}\n--- source ---\n{src}")
        return binary


_POOL: ThreadPoolExecutor | None = None
THREADS = getenv("THREADS", os.cpu_count() or 1)
# below this much work per thread, a thread costs more than it saves. Measured on the 2-core development machine, a
# matmul of 262144 multiply-adds (MLP sizes) ran 18 us on one thread; on two, 16 us when the worker was spinning from
# the kernel before and 32 us when it had to be woken (an eager step's parallel kernels are far apart: the workers
# sleep), while the worker's spin after each one cost the process ~100 us of CPU time. From about 1M, two threads win
# whether woken or not (4M: 201 -> 143 us woken, 109 spinning)
MIN_WORK_PER_THREAD = 1 << 18
CHUNKS_PER_THREAD = 4  # parts of the outer loop per thread: a thread the OS runs late leaves its parts to the others
# ctypes calls a C function with at most 1024 arguments: a kernel taking more (Tensor.cat of 2,000 tensors, a sum of a
# list of them) is called through its `_entry`, which takes the buffers and values as two arrays
MAX_DIRECT_ARGS = 1000
_ENTRY_TYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong)


def _pool() -> ThreadPoolExecutor:
    """The Python thread pool, for kernels without a C entry point or where the C pool does not build."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="glassgrad-cpu")
    return _POOL


def _forget_pool() -> None:
    """In a forked child: the parent's threads do not exist here, so the next launch that wants them makes a new pool
    (work given to the parent's would never be done). The C pool resets itself (`runtime/cpu_pool.py`)."""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


def _load_library(binary: bytes) -> ctypes.CDLL:
    """dlopen needs a file: keep it in the cache directory, or (CACHELEVEL=0) in a temporary file removed at once."""
    if CACHELEVEL < 1:
        with tempfile.NamedTemporaryFile(suffix=".so") as f:
            f.write(binary)
            f.flush()
            return ctypes.CDLL(f.name)  # the mapping outlives the unlinked file
    path = cache_dir() / "lib" / f"{hashlib.sha256(binary).hexdigest()}.so"
    if str(path) not in _CHECKED_LIBRARIES and not _holds(path, binary):  # (missing, or damaged: written again whole,
        path.parent.mkdir(parents=True, exist_ok=True)                     # then renamed into place)
        atomic_write(path, binary)
    _CHECKED_LIBRARIES.add(str(path))
    return ctypes.CDLL(str(path))


_CHECKED_LIBRARIES: set[str] = set()  # the library files this process found whole (a batch's, once for its kernels)


def _holds(path: pathlib.Path, binary: bytes) -> bool:
    """Whether the file at `path` is `binary` (a library cut short or damaged on disk must not be loaded)."""
    try:
        return path.stat().st_size == len(binary) and path.read_bytes() == binary
    except OSError:
        return False


def _address(handle: np.ndarray) -> int:
    """The address of a buffer's memory (a ctypes view of the array: several times cheaper than `handle.ctypes`)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(handle))  # type: ignore[arg-type]  # (an ndarray is a buffer)


def _addresses(handles: tuple[np.ndarray, ...]) -> list[int]:
    """The addresses of the handles' memory: known since allocation (`_ADDRESSES`), else asked of ctypes."""
    try:  # (every launch: the handles are nearly always the allocator's)
        return [_ADDRESSES[id(h)][1] for h in handles]
    except KeyError:
        return [known[1] if (known := _ADDRESSES.get(id(h))) is not None else _address(h) for h in handles]


class CPUProgram:
    """One compiled kernel. Calling it runs the outer loop's range, split across threads when there is enough work.
    The C function takes the buffers, then `vals` (Variable values, symbolic sizes) as ints, then the [start, end)
    of its outer loop; `<name>_entry` takes them as two arrays, which the C thread pool (`runtime/cpu_pool.py`)
    calls for any kernel."""

    def __init__(self, name: str, binary: bytes, pool: LazyPool | None = None) -> None:
        self.name = name
        self.lib = _load_library(binary)
        self.fn = getattr(self.lib, name)
        self.fn.restype = None
        self.typed = False  # whether fn's argument types are set (on the first call)
        self.pool = pool
        self.entry = ctypes.cast(getattr(self.lib, f"{name}_entry"), ctypes.c_void_p).value \
            if hasattr(self.lib, f"{name}_entry") else None

    def __call__(self, *bufs: np.ndarray, global_size: tuple[int, ...] = (1,), local_size: Any = None,
                 vals: tuple[int, ...] = (), work: int = 0, wait: bool = False) -> float:
        fn = self.fn
        outer = global_size[0] if global_size else 1
        # (a tiny kernel, the most common launch, decides on one thread with one comparison)
        threads = 1 if work < 2 * MIN_WORK_PER_THREAD else max(1, min(THREADS, outer, work // MIN_WORK_PER_THREAD))
        if len(bufs) + len(vals) + 2 > MAX_DIRECT_ARGS:
            return self._call_entry(bufs, vals, outer, threads)
        if not self.typed:  # the first call fixes the C argument types, so every call passes plain ints
            fn.argtypes = [ctypes.c_void_p] * len(bufs) + [ctypes.c_int32] * len(vals) + [ctypes.c_int64] * 2
            self.typed = True
        start = time.perf_counter()
        if threads == 1:
            try:  # (every launch: _addresses, inline; the handles are nearly always the allocator's)
                addresses = [_ADDRESSES[id(h)][1] for h in bufs]
            except KeyError:
                addresses = _addresses(bufs)
            try:
                fn(*addresses, *vals, 0, outer)
            except BaseException as e:
                ran(e)
                raise
        elif self.entry is not None and self.pool is not None and (pool := self.pool.get()) is not None:
            pool.start(threads - 1)
            pointers = (ctypes.c_void_p * len(bufs))(*_addresses(bufs))
            ints = (ctypes.c_longlong * max(1, len(vals)))(*vals)
            try:
                pool.run(self.entry, pointers, ints, outer, min(outer, threads * CHUNKS_PER_THREAD))
            except BaseException as e:
                ran(e)
                raise
        else:
            self._python_threads(_addresses(bufs) + list(vals), outer, threads)
        return time.perf_counter() - start

    def _call_entry(self, bufs: tuple[np.ndarray, ...], vals: tuple[int, ...], outer: int, threads: int) -> float:
        """A launch with too many arguments for a ctypes call: through `<name>_entry` (arrays of the buffers'
        addresses and of the values), on the C thread pool when there is one and the work is worth it."""
        if self.entry is None:
            raise RuntimeError(f"CPU kernel {self.name} takes {len(bufs)} buffers and {len(vals)} values, more than a "
                               f"ctypes call can pass ({MAX_DIRECT_ARGS}), and has no _entry function")
        start = time.perf_counter()
        addresses = (ctypes.c_void_p * len(bufs))(*_addresses(bufs))
        ints = (ctypes.c_longlong * max(1, len(vals)))(*vals)
        if threads > 1 and self.pool is not None and (pool := self.pool.get()) is not None:
            pool.start(threads - 1)
            try:
                pool.run(self.entry, addresses, ints, outer, min(outer, threads * CHUNKS_PER_THREAD))
            except BaseException as e:
                ran(e)
                raise
        else:
            entry = _ENTRY_TYPE(self.entry)
            try:
                entry(ctypes.addressof(addresses), ctypes.addressof(ints), 0, outer)
            except BaseException as e:
                ran(e)
                raise
        return time.perf_counter() - start

    def _python_threads(self, args: list[int], outer: int, threads: int) -> None:
        bounds = [outer * i // threads for i in range(threads + 1)]
        run = functools.partial(self.fn, *args)
        # the calling thread runs the first part itself (ctypes releases the GIL): one hand-off fewer to wait for
        futures = [_pool().submit(run, lo, hi) for lo, hi in zip(bounds[1:-1], bounds[2:]) if hi > lo]
        run(bounds[0], bounds[1])
        for f in futures:
            f.result()


class GuardedCPUProgram(CPUProgram):
    """`CPU_BUFFER_GUARD=1`: after each launch the guards of every buffer it was given are checked, so a kernel that
    wrote outside one raises `BufferGuardError` naming it (`runtime/cpu_guard.py`)."""

    def __call__(self, *bufs: np.ndarray, global_size: tuple[int, ...] = (1,), local_size: Any = None,
                 vals: tuple[int, ...] = (), work: int = 0, wait: bool = False) -> float:
        check_guards(bufs, f"something before CPU kernel {self.name} (found at its launch)")
        seconds = super().__call__(*bufs, global_size=global_size, local_size=local_size, vals=vals, work=work,
                                   wait=wait)
        check_guards(bufs, f"CPU kernel {self.name}")
        return seconds


def _build_pool(compiler: ClangCompiler, src: str) -> bytes:
    """The thread pool's library, built by the kernels' compiler (kept in the cache directory, so once per machine;
    not through the kernel cache, whose compiles tests count)."""
    key = hashlib.sha256(f"{compiler.cache_key}\n{src}".encode()).hexdigest()
    path = cache_dir() / "lib" / f"pool-{key}.checked"  # (not .so: an older version loads those raw)
    if CACHELEVEL >= 1 and (binary := read_checked(path)) is not None:
        return binary
    binary = compiler.compile(src)
    if CACHELEVEL >= 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_checked(path, binary)
    return binary


_COMPILER: list[tuple[ClangCompiler, LazyPool | None]] = []  # one compiler and pool for every CPU device


def create_device(name: str) -> Compiled:
    """'CPU' or 'CPU:n': the CPU (its kernels raise CCompilerError when no C compiler can build them). 'CPU:1',
    'CPU:2', ... are further devices on the same processor, with memory of their own (host memory, kept apart): a
    tensor sharded over ('CPU:0', 'CPU:1') runs the multi-device code paths without a GPU (glassgrad/multi.py).
    They share one compiler (and its caches) and one thread pool."""
    base, _, index = name.partition(":")
    if base != "CPU" or not (index or "0").isdigit():
        raise ValueError(f"the CPU backend's devices are 'CPU', 'CPU:1', ...; got {name!r}")
    if not _COMPILER:
        compiler = ClangCompiler()
        pool = LazyPool(functools.partial(_build_pool, compiler), _load_library) if compiler.info is not None else None
        _COMPILER.append((compiler, pool))
    compiler, pool = _COMPILER[0]
    if getenv("CPU_BUFFER_GUARD", 0):
        return Compiled(name, GuardedCPUAllocator(), compiler.renderer(), compiler,
                        functools.partial(GuardedCPUProgram, pool=pool))
    return Compiled(name, CPUAllocator(), compiler.renderer(), compiler, functools.partial(CPUProgram, pool=pool))


def create_renderer() -> ClangRenderer:
    """The C renderer for this machine's C compiler (probed: see `runtime/ccompiler.py`)."""
    return ClangCompiler().renderer()
