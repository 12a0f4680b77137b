"""Devices, buffers and the compile cache.

In: a device name ('CPU', 'CUDA', 'CUDA:1', 'METAL'; `DEV` picks the default). Out: the `Compiled` device for it
(allocator, renderer, compiler, program class), and `Buffer`s of memory on it.

A backend is a module `glassgrad.runtime.ops_<name>` that defines `create_device(name) -> Compiled`.
"""
from __future__ import annotations

import hashlib
import importlib
import itertools
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from glassgrad.dtype import DType, dtypes
from glassgrad.helpers import CACHELEVEL, GLOBAL_LOCK, STATE_FLAGS, cache_dir, read_checked, write_checked


class Allocator:
    """Device memory: alloc/free plus host copies. Freed blocks are kept and reused by size (an LRU cache).

    Accounting: `live_bytes` is the memory held by buffers now (blocks in the reuse cache do not count),
    `peak_bytes` the most it has been since the last `reset_peak()`. Safe from several threads (a buffer is freed in
    whichever thread drops it last): the counts and the reuse cache change under a lock of the allocator's own."""

    def __init__(self) -> None:
        self._free: defaultdict[int, list[Any]] = defaultdict(list)
        self.live_bytes = 0
        self.peak_bytes = 0
        # re-entrant: a garbage collection inside (a new list for a size) may free a buffer in this very thread
        self._lock = threading.RLock()

    def alloc(self, nbytes: int) -> Any:
        with self._lock:
            live = self.live_bytes = self.live_bytes + nbytes
            if live > self.peak_bytes:
                self.peak_bytes = live
            if free := self._free.get(nbytes):
                return free.pop()
        try:
            return self._alloc(nbytes)
        except MemoryError:
            self.clear_cache()
            return self._alloc(nbytes)

    def free(self, handle: Any, nbytes: int) -> None:
        with self._lock:
            self.live_bytes -= nbytes
            self._free[nbytes].append(handle)

    def reset_peak(self) -> None:
        """Start measuring the peak again from what is live now."""
        self.peak_bytes = self.live_bytes

    def clear_cache(self) -> None:
        with self._lock:
            free, self._free = self._free, defaultdict(list)
        for nbytes, handles in free.items():
            for h in handles:
                self._release(h, nbytes)

    # backends implement these
    def _alloc(self, nbytes: int) -> Any: raise NotImplementedError  # noqa: E704
    def _release(self, handle: Any, nbytes: int) -> None: pass  # noqa: E704
    def copyin(self, handle: Any, src: memoryview) -> None: raise NotImplementedError  # noqa: E704
    def copyout(self, dest: memoryview, handle: Any) -> None: raise NotImplementedError  # noqa: E704


class Compiler:
    """Source -> binary, cached in memory and on disk (CACHEDIR; CACHELEVEL=0 turns the disk cache off)."""
    cache_key: str = "base"
    batches: bool = False  # whether `compile_batch` can build several kernels in one binary

    def __init__(self) -> None:
        self._memory: dict[str, bytes] = {}

    def compile(self, src: str) -> bytes:
        raise NotImplementedError

    def compile_batch(self, sources: list[str]) -> bytes | None:
        """One binary holding the kernels of all `sources` (whose kernels have distinct names), or None if these
        cannot be built together (then each source is compiled on its own). Compilers with `batches` implement it."""
        return None

    def batch_groups(self, sources: list[str]) -> list[list[str]]:
        """The sources split into the groups one `compile_batch` can build together (all of them, unless the compiler
        builds some sources with other flags: the CPU's kernels of another optimisation level)."""
        return [sources]

    def _key(self, src: str) -> str:
        return hashlib.sha256(f"{self.cache_key}\n{src}".encode()).hexdigest()

    def _cached(self, key: str) -> bytes | None:
        """The binary of `key` from memory, else from disk (checked whole: `read_checked`), else None."""
        if key not in self._memory:
            if CACHELEVEL < 1 or (binary := read_checked(cache_dir() / "kernels" / f"{key}.checked")) is None:
                return None
            self._memory[key] = binary
        return self._memory[key]

    def _store(self, key: str, binary: bytes) -> None:
        if CACHELEVEL >= 1:  # (several processes may write one key at once: each file is written whole, then renamed)
            path = cache_dir() / "kernels" / f"{key}.checked"  # (not .bin: an older version reads those raw)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_checked(path, binary)
        self._memory[key] = binary

    def compile_cached(self, src: str) -> bytes:
        key = self._key(src)
        binary = self._cached(key)
        if binary is None:
            binary = self.compile(src)
            self._store(key, binary)
        return binary

    def compile_cached_many(self, sources: list[str]) -> list[bytes]:
        """`compile_cached` of each source. The ones not cached yet are built by one `compile_batch` where the
        compiler can (one per `batch_groups` group): for a C compiler, starting the process and linking cost more than
        a small kernel's code, so one run for several kernels saves most of the time. Each source's cache entry is
        then that shared binary."""
        missing = [src for src in sources if self._cached(self._key(src)) is None]
        for group in self.batch_groups(missing) if len(missing) > 1 else []:
            if len(group) > 1 and (binary := self.compile_batch(group)) is not None:
                for src in group:
                    self._store(self._key(src), binary)
        return [self.compile_cached(src) for src in sources]


def ran(e: BaseException) -> None:
    """For `e`, raised by a line whose only call is a kernel's launch (a C call): a Ctrl-C (KeyboardInterrupt, or
    SystemExit from a signal handler) arriving during the call is raised when it returns, so the kernel has run, and
    `e` is marked so (`glassgrad_ran`: engine/realize.py `note_unfinished` then counts the kernel's writes as done,
    and a later realize does not run an in-place update a second time). An `Exception` is the call's own failure."""
    if not isinstance(e, Exception):
        e.glassgrad_ran = True  # type: ignore[attr-defined]


@dataclass(slots=True)
class Launch:
    """One kernel launch: a compiled program, its buffer handles, its grid, its Variable values and its work (the
    CPU splits work over threads by it). Calling it launches the program; `wait` times it on the device."""
    program: Any
    args: list[Any]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    vals: tuple[int, ...] = ()
    work: int = 0

    def __call__(self, wait: bool = False) -> float:
        return self.program(*self.args, global_size=self.global_size, local_size=self.local_size, vals=self.vals,
                            work=self.work, wait=wait) or 0.0

    def same_as(self, other: Launch) -> bool:
        """The same program on the same handles (by identity: the same memory), grid and values."""
        return (self.program is other.program and self.global_size == other.global_size and self.vals == other.vals
                and self.local_size == other.local_size and len(self.args) == len(other.args)
                and all(a is b for a, b in zip(self.args, other.args)))


class LaunchGraph(Protocol):
    """Kernel launches of one device recorded once and run as one (a CUDA graph): calling it runs them all, in order;
    `update(i, launch)` changes launch i (same program; new handles, grid or values) for the next calls."""

    def __call__(self) -> None: ...  # noqa: E704
    def update(self, index: int, launch: Launch) -> None: ...  # noqa: E704


@dataclass
class Compiled:
    """Everything glassgrad needs from one backend. `graph` (None where the backend has none) records launches as
    one `LaunchGraph`; TinyJit replays consecutive kernels through it (engine/jit.py)."""
    name: str
    allocator: Allocator
    renderer: Any  # glassgrad.renderer.cstyle.CStyleLanguage
    compiler: Compiler
    program: Callable[..., Any]  # (name, binary) -> callable program
    synchronize: Callable[[], None] = field(default=lambda: None)
    graph: Callable[[list[Launch]], LaunchGraph] | None = None


_CANONICAL: dict[str, str] = {}  # a device name -> its canonical form, for the names seen


# tinygrad's (older) way of naming the default device, `CUDA=1 python train.py`, and the device each flag means here
# (tinygrad's NV is its own NVIDIA driver: the same GPUs; CLANG and LLVM were its CPU compilers)
DEVICE_FLAGS = {"CUDA": "CUDA", "NV": "CUDA", "METAL": "METAL", "CPU": "CPU", "CLANG": "CPU", "LLVM": "CPU"}


def default_device(environ: Mapping[str, str]) -> str:
    """The default device an environment asks for: `DEV` (tinygrad 0.14's name), else the one device flag set to 1
    (`CUDA=1`, `METAL=1`, `CPU=1`, ...: what older tinygrad programs and their READMEs say), else CPU. Flags that
    disagree with each other or with DEV raise ValueError: running on another device than the one asked for, silently,
    would be the worst answer."""
    set_flags = [name for name in DEVICE_FLAGS if environ.get(name, "").strip() == "1"]
    flagged = {DEVICE_FLAGS[name] for name in set_flags}
    names = ", ".join(f"{name}=1" for name in set_flags)
    if (dev := environ.get("DEV")):
        if flagged and flagged != {_DeviceRegistry.canonicalize(dev).split(":")[0]}:
            raise ValueError(f"DEV={dev} and {names} name different default devices: set only one")
        return dev
    if len(flagged) > 1:
        raise ValueError(f"{names} name different default devices: set only one (or DEV=...)")
    return flagged.pop() if flagged else "CPU"


class _DeviceRegistry:
    """`Device['CPU']` gives the Compiled backend, created on first use. `Device.DEFAULT` is $DEV, else the device of
    a tinygrad-style flag (`CUDA=1`), else CPU (`default_device`)."""

    def __init__(self) -> None:
        self._devices: dict[str, Compiled] = {}
        self.DEFAULT: str = self.canonicalize(default_device(os.environ))

    @staticmethod
    def canonicalize(name: str) -> str:
        if type(name) is str and (known := _CANONICAL.get(name)) is not None:  # (every Buffer asks)
            return known
        if not isinstance(name, str) or not name:
            raise ValueError(f"device must be a non-empty string like 'CPU' or 'CUDA:1', got {name!r}")
        base, _, index = name.partition(":")
        base = base.upper()
        if base not in ("CPU", "CUDA", "METAL", "CLANG"):
            raise ValueError(f"unknown device {name!r}; glassgrad knows CPU, CUDA and METAL")
        base = "CPU" if base == "CLANG" else base
        if index and not index.isdigit():
            raise ValueError(f"device index in {name!r} must be a number, as in 'CUDA:1'")
        canonical = _CANONICAL[name] = base if not index or index == "0" else f"{base}:{index}"
        return canonical

    def opened(self, name: str) -> Compiled | None:
        """The device if it has been created already, else None (nothing is opened)."""
        return self._devices.get(self.canonicalize(name))

    def __getitem__(self, name: str) -> Compiled:
        name = self.canonicalize(name)
        if name not in self._devices:
            with GLOBAL_LOCK:  # (two threads asking at once get one device)
                if name not in self._devices:
                    module = importlib.import_module(f"glassgrad.runtime.ops_{name.split(':')[0].lower()}")
                    self._devices[name] = module.create_device(name)
        return self._devices[name]


Device = _DeviceRegistry()


def _new_allocator_locks() -> None:
    """In a forked child: the allocators' locks made new (a parent's thread may have held one at the fork)."""
    for dev in Device._devices.values():
        dev.allocator._lock = threading.RLock()


os.register_at_fork(after_in_child=_new_allocator_locks)


def _set_default(name: str) -> None:
    Device.DEFAULT = Device.canonicalize(name)


# tinygrad 0.14's spelling of a default device for a while: `with Context(DEV="CUDA")` (and `DEV.value = ...`)
STATE_FLAGS["DEV"] = (lambda: Device.DEFAULT, _set_default)


def canonical_devices(device: str | tuple[str, ...] | list[str]) -> Any:
    """A device name in canonical form ('cpu:0' -> 'CPU'), or for a tuple/list of several names the tuple of their
    canonical forms (a tensor on several devices); a tuple of one name is that name. Raises ValueError for an empty
    tuple, a name repeated, or an unknown device."""
    if not isinstance(device, (tuple, list)):
        return Device.canonicalize(device)
    names = tuple(Device.canonicalize(d) for d in device)
    if not names:
        raise ValueError("a tuple of devices must name at least one device")
    if len(set(names)) != len(names):
        raise ValueError(f"devices {tuple(device)} name one device twice")
    return names[0] if len(names) == 1 else names


class Buffer:
    """`size` elements of `dtype` in the memory of `device`. Memory is allocated on first use, returned on delete.
    A buffer can instead live in the memory of another (`share`): a memory plan's block, which buffers whose
    lifetimes do not overlap use one after another (engine/memory.py)."""

    serials = itertools.count()  # creation order (a TinyJit tells the buffers made before its capture from those after)

    def __init__(self, device: str, size: int, dtype: DType, owned: bool = False) -> None:
        self.serial = next(Buffer.serials)
        self.device = Device.canonicalize(device)
        self.size = size
        self.dtype = dtype
        self._handle: Any = None
        self.version = 0     # how many in-place writes (assigns) have run on it
        self.owned = owned   # made for one tensor (data, empty, assign target), not shared by equal graphs
        self.block: Buffer | None = None  # the buffer whose memory this one uses, if any

    def share(self, block: Buffer) -> None:
        """Use `block`'s memory (from its start) instead of memory of its own."""
        if self._handle is not None or block.device != self.device or block.nbytes < self.nbytes:
            raise ValueError(f"{self} cannot live in {block}: it has memory already, or the block is too small or "
                             "on another device")
        self.block = block

    def __repr__(self) -> str:
        return f"<Buffer {self.device} {self.size} {self.dtype.name}{' allocated' if self.is_allocated else ''}>"

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_allocated(self) -> bool:
        return self._handle is not None

    @property
    def handle(self) -> Any:
        if self._handle is None:
            if self.block is not None:
                self._handle = self.block.handle
            else:
                self._handle = self._allocator().alloc(max(self.nbytes, 1))
        return self._handle

    def _allocator(self) -> Allocator:
        """The device's allocator (`device` is canonical: the registry's table, its lookup only for a device not
        opened yet; every allocation and free asks)."""
        return (Device._devices.get(self.device) or Device[self.device]).allocator

    def __del__(self) -> None:
        if self._handle is not None and self.block is None:
            try:
                self._allocator().free(self._handle, max(self.nbytes, 1))
            except Exception:  # interpreter shutdown: nothing to give back to
                pass

    def copyin(self, data: np.ndarray) -> Buffer:
        array = np.ascontiguousarray(data)
        if array.nbytes != self.nbytes:
            raise ValueError(f"copyin of {array.nbytes} bytes into a buffer of {self.nbytes} bytes")
        if self.nbytes:
            Device[self.device].allocator.copyin(self.handle, memoryview(array.reshape(-1).view(np.uint8)))  # type: ignore[arg-type]
        return self

    def numpy(self) -> np.ndarray:
        """The buffer's contents as a flat numpy array (bfloat16 comes back as its uint16 bits)."""
        out = np.empty(self.size, dtype=self.dtype.np if self.dtype != dtypes.void else np.uint8)
        if self.nbytes:
            Device[self.device].allocator.copyout(memoryview(out.view(np.uint8)), self.handle)  # type: ignore[arg-type]
        return out
