"""Guard bytes around CPU buffers: out-of-bounds writes found at the launch that made them (`CPU_BUFFER_GUARD=1`).

In: buffer sizes to allocate (`guarded_alloc`), and after each kernel launch or host copy the handles it touched
(`check_guards`). Out: numpy byte arrays (the handles) whose memory has `GUARD_BYTES` of a known pattern directly
before and after it, and a `BufferGuardError` naming the kernel (or copy), the argument, the buffer's size and the
byte offset of the first damaged guard byte relative to the buffer's start, when a pattern has changed.

Why: a kernel storing past the end of a small host buffer usually lands in the 64 bytes of alignment slack that the
plain allocator leaves (`ops_cpu.CPUAllocator`), and only sometimes in malloc's bookkeeping, where glibc notices it
much later (`free(): invalid next size`), far from the kernel that did it. Here the guards start at the first byte
past the data, so every such write is seen, and at once. The runtime uses this module only when the flag is set
(`ops_cpu.create_device` then picks the guarded allocator and program classes), so it costs nothing otherwise.

The guard sees writes within 64 bytes of a buffer, not reads or stack arrays. For those, the kernels can be built
with AddressSanitizer: `CC` naming a script that runs `clang -fsanitize=address "$@"`, the process started with
`LD_PRELOAD=<clang's libclang_rt.asan-x86_64.so> ASAN_OPTIONS=detect_leaks=0` (the alignment slack of the plain
allocator is then not poisoned: a write into it goes unseen). For corruption outside glassgrad's buffers (a
library's), glibc's checking allocator aborts at the first free of a damaged block:
`LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GUARD_BYTES = 64  # before and after every buffer: a 64-byte vector store past the end stays inside the guard
ALIGN = 64
# the guard patterns: windows of fixed random bytes, a different one before and after each buffer and from one
# buffer to the next (a kernel that copies an element from before one buffer to before another, or from one's end
# to another's, still changes what it writes over)
_PATTERNS = np.random.default_rng(0x5EED).integers(1, 256, 64 * GUARD_BYTES, dtype=np.uint8).reshape(64, GUARD_BYTES)
_count = [0]


def _next_patterns() -> tuple[np.ndarray, np.ndarray]:
    _count[0] += 1
    k = 2 * _count[0]
    return _PATTERNS[k % len(_PATTERNS)], _PATTERNS[(k + 1) % len(_PATTERNS)]


@dataclass(frozen=True)
class _Guarded:
    """One guarded allocation: the whole block (kept alive here), its two guards and what each should hold."""
    raw: np.ndarray
    before: np.ndarray
    after: np.ndarray
    before_pattern: np.ndarray
    after_pattern: np.ndarray


# id(handle) -> its guards, for every guarded handle allocated and not released (the entry keeps the handle's block
# alive, so the id is not reused while it is here)
_GUARDED: dict[int, _Guarded] = {}


class BufferGuardError(RuntimeError):
    """A guard byte changed: something wrote outside a buffer. `kernel` is the kernel's name (or the copy's),
    `argument` the buffer's position among its arguments, `nbytes` the buffer's size, `offset` the first damaged
    byte counted from the buffer's start (negative: before it), `damaged` how many guard bytes changed. `source` (the
    kernel's C source) and `buffer` (a description of the Buffer) are filled in by the caller when known."""

    def __init__(self, kernel: str, argument: int, nbytes: int, offset: int, damaged: int, found: bytes) -> None:
        self.kernel, self.argument, self.nbytes = kernel, argument, nbytes
        self.offset, self.damaged, self.found = offset, damaged, found
        self.source: str | None = None
        self.buffer: str | None = None
        super().__init__()

    def attach(self, source: str | None = None, buffer: str | None = None) -> BufferGuardError:
        """Add what the launching code knows (the kernel's source, the Buffer at `argument`)."""
        self.source = self.source or source
        self.buffer = self.buffer or buffer
        return self

    def __str__(self) -> str:
        where = f"{-self.offset} bytes before its start" if self.offset < 0 else \
            f"byte {self.offset} (its last byte is {self.nbytes - 1})"
        text = (f"{self.kernel} wrote outside argument {self.argument} (data{self.argument}, {self.nbytes} bytes"
                f"{', ' + self.buffer if self.buffer else ''}): first damaged guard byte at {where}; "
                f"{self.damaged} guard bytes changed, starting {self.found.hex(' ')}")
        return text + (f"\n--- source ---\n{self.source}" if self.source else "")


def guarded_alloc(nbytes: int) -> np.ndarray:
    """`nbytes` of uninitialised memory, 64-byte aligned, with guard patterns directly before and after it."""
    raw = np.empty(ALIGN + 2 * GUARD_BYTES + nbytes, dtype=np.uint8)
    start = GUARD_BYTES + (-(raw.ctypes.data + GUARD_BYTES)) % ALIGN
    handle = raw[start:start + nbytes]
    guarded = _Guarded(raw, raw[start - GUARD_BYTES:start], raw[start + nbytes:start + nbytes + GUARD_BYTES],
                       *_next_patterns())
    guarded.before[:] = guarded.before_pattern
    guarded.after[:] = guarded.after_pattern
    _GUARDED[id(handle)] = guarded
    return handle


def release(handle: np.ndarray) -> None:
    """Forget a handle's guards (its memory goes back to numpy). A damaged guard is reported first."""
    check_guards((handle,), "the release of a buffer")
    _GUARDED.pop(id(handle), None)


def is_guarded(handle: np.ndarray) -> bool:
    return id(handle) in _GUARDED


def check_guards(handles: tuple[np.ndarray, ...], what: str) -> None:
    """Raise `BufferGuardError` for the first handle (of those `guarded_alloc` made) whose guards changed, naming
    `what` (a kernel's name, a copy). The damaged guard is restored first, so the damage is reported once."""
    for argument, handle in enumerate(handles):
        guarded = _GUARDED.get(id(handle))
        if guarded is None:
            continue
        for guard, pattern, base in ((guarded.before, guarded.before_pattern, -GUARD_BYTES),
                                     (guarded.after, guarded.after_pattern, handle.nbytes)):
            changed = np.flatnonzero(guard != pattern)
            if len(changed):
                first = int(changed[0])
                found = guard[first:first + 16].tobytes()
                guard[:] = pattern
                raise BufferGuardError(what, argument, handle.nbytes, base + first, len(changed), found)
