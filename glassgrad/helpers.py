"""Small shared helpers: environment flags (tinygrad's names), `prod`, `Context`, cache directory.

In: environment variables such as DEBUG, NOOPT, BEAM, CACHEDIR, CACHELEVEL. Out: typed accessors for them.
"""
from __future__ import annotations

import contextlib
import functools
import getpass
import hashlib
import math
import os
import pathlib
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """Read an environment flag, converted to the type of `default`."""
    value = os.environ.get(key)
    if value is None:
        return default
    return type(default)(value)


class ContextVar:
    """A flag that reads its start value from the environment and can be overridden with `Context`."""
    _registry: dict[str, ContextVar] = {}

    def __init__(self, key: str, default: int) -> None:
        self.key = key
        self.value: int = getenv(key, default)
        ContextVar._registry[key] = self

    def __bool__(self) -> bool:
        return bool(self.value)

    def __ge__(self, other: int) -> bool:
        return self.value >= other

    def __gt__(self, other: int) -> bool:
        return self.value > other

    def __int__(self) -> int:
        return self.value

    def __lt__(self, other: int) -> bool:
        return self.value < other

    def __le__(self, other: int) -> bool:
        return self.value <= other


class ThreadModeVar(ContextVar):
    """A flag that a with-block sets for the thread that opened it (`push`/`pop`, as `with Tensor.train():`), the way
    PyTorch's grad mode is per thread: outside such a block a thread reads (and writes) the process-wide value;
    inside one, the block's (writing it, `Context(TRAINING=0)` inside `with Tensor.train():`, changes the block's).
    Blocks of two threads then neither see each other nor, entered and left interleaved, leave the flag changed."""

    def __init__(self, key: str, default: int) -> None:
        self._blocks = threading.local()
        self._shared = 0
        super().__init__(key, default)

    def _open(self) -> list[int]:
        blocks: list[int] | None = getattr(self._blocks, "values", None)
        if blocks is None:
            blocks = self._blocks.values = []
        return blocks

    @property  # type: ignore[override]
    def value(self) -> int:
        blocks: list[int] | None = getattr(self._blocks, "values", None)
        return blocks[-1] if blocks else self._shared

    @value.setter
    def value(self, value: int) -> None:
        blocks: list[int] | None = getattr(self._blocks, "values", None)
        if blocks:
            blocks[-1] = value
        else:
            self._shared = value

    def push(self, value: int) -> None:
        """Open a block of this thread, with `value`."""
        self._open().append(value)

    def pop(self) -> None:
        """Close this thread's innermost block."""
        self._open().pop()


DEBUG = ContextVar("DEBUG", 0)
NOOPT = ContextVar("NOOPT", 0)
BEAM = ContextVar("BEAM", 0)  # search this many kernels wide for the fastest opts (timed on the device, cached)
CACHELEVEL = ContextVar("CACHELEVEL", 2)
JIT = ContextVar("JIT", 1)  # JIT=0: TinyJit functions run eagerly on every call
CUDAGRAPH = ContextVar("CUDAGRAPH", 1)  # CUDAGRAPH=0: TinyJit replays launch kernel by kernel, not as device graphs
MEMPLAN = ContextVar("MEMPLAN", 1)  # intermediates of a schedule share memory when their lifetimes do not overlap
# float32 constants become kernel parameters (uop/params.py): a changed Python number reuses the built kernel
LIFT_CONSTANTS = ContextVar("LIFT_CONSTANTS", 1)
SCACHE = ContextVar("SCACHE", 1)  # reuse the schedule of a graph with the structure of one seen before
TIMING = ContextVar("TIMING", 0)  # time every kernel on the device (adds a sync per kernel); DEBUG>=2 implies it
IGNORE_BEAM_CACHE = ContextVar("IGNORE_BEAM_CACHE", 0)  # BEAM searches again instead of reading its disk cache
# the C compiler's optimisation level of the CPU kernels the heuristic optimises: 0 (default) the heuristic's choice per
# kernel (an OPTLEVEL opt, codegen/opt/heuristic.py), 2 or 3 that level for every one (to measure one against the other)
CPU_OPT_LEVEL = ContextVar("CPU_OPT_LEVEL", 0)
BEAM_BUDGET = ContextVar("BEAM_BUDGET", 60)  # seconds one kernel's BEAM search may take; then the best so far wins
# float32 matmuls and convolutions on a GPU with tensor cores (sm_80+) round their factors to TensorFloat-32 (10
# mantissa bits; float32 range and accumulation): several times faster, ~1e-3 relative error. Opt-in, as in tinygrad
ALLOW_TF32 = ContextVar("ALLOW_TF32", 0)
# training mode: dropout drops, BatchNorm uses (and updates) batch statistics, Optimizer.step is allowed. tinygrad's
# `Context(TRAINING=1)`; `Tensor.training` and `with Tensor.train():` read and set this same flag (a train() block's
# value is its thread's: ThreadModeVar)
TRAINING = ThreadModeVar("TRAINING", 0)
# scaled_dot_product_attention without a T x T buffer: softmax(s) @ v spelled exp(s - logsumexp(s)) @ v, whose scores
# the scheduler recomputes inside the kernels that reduce over them (`schedule._chained`). 1: everywhere, 0: never,
# -1 (default): where a GPU renders those kernels on its tensor cores (codegen/gpudims.py, "chained")
FLASH_ATTENTION = ContextVar("FLASH_ATTENTION", -1)
# half/bfloat16 tensor-core tiles on Hopper (sm_90) as warpgroup MMAs (wgmma, compiled for sm_90a) instead of mma.sync;
# WGMMA=0 keeps mma.sync (to compare them)
WGMMA = ContextVar("WGMMA", 1)
# tinygrad's flags that only choose how tinygrad computes a result, not the result: FUSE_OPTIM (an optimiser's state in
# one buffer; glassgrad's step is one schedule anyway, as its optimisers' `fused=`) and WINO (Winograd convolutions).
# tinygrad's example programs set them for speed (beautiful_cifar.py, hlb_cifar10.py): accepted, with no effect here
FUSE_OPTIM = ContextVar("FUSE_OPTIM", 0)
WINO = ContextVar("WINO", 0)


def codegen_flags() -> tuple[int, ...]:
    """The flags that change how codegen renders a kernel with given opts (ALLOW_TF32, WGMMA): part of BEAM's disk
    cache key (its other key parts are the search width and the kernel)."""
    return (int(ALLOW_TF32), int(WGMMA))


def kernel_flags() -> tuple[int, ...]:
    """The flags that change the kernel codegen builds for an AST (read when the kernel is built): `codegen_flags`
    and the choice of opts (the heuristic's CPU_OPT_LEVEL, BEAM's width, NOOPT). Part of the key of every cache of
    built kernels (engine/realize.py's, the JIT's captures), so that switching one (`with Context(BEAM=2):`) never
    reuses a kernel built under the other setting. The compile cache is keyed by the source, which they change."""
    # (codegen_flags' two, then the opts'; read as `.value`, not through `int()`'s call of `__int__`, which returns the
    # value: equal keys either way, and every launch of a cached schedule asks for these. Only in-memory keys use it)
    return (ALLOW_TF32.value, WGMMA.value, CPU_OPT_LEVEL.value, BEAM.value, NOOPT.value)

# tinygrad's flags that glassgrad has under another name: tinygrad's name -> (glassgrad's, value conversion)
FLAG_ALIASES: dict[str, tuple[str, Callable[[int], int]]] = {
    "NO_MEMORY_PLANNER": ("MEMPLAN", lambda v: int(not v)),
}
# tinygrad's flags (tinygrad/helpers.py) that mean nothing here: other backends, features glassgrad does not have
TINYGRAD_ONLY_FLAGS = frozenset({
    "IMAGE", "FLOAT16", "OPENPILOT_HACKS", "JIT_BATCH_SIZE", "CAPTURING", "TRACEMETA", "NO_COLOR",
    "TC", "TC_SELECT", "TC_OPT", "TRANSCENDENTAL", "NOLOCALS", "SPLIT_REDUCEOP", "LRU", "RING", "ALL2ALL",
    "ALLREDUCE_CAST", "VALIDATE_WITH_CPU", "DISABLE_FAST_IDIV", "ALLOW_DEVICE_USAGE", "MAX_BUFFER_SIZE",
    "MAX_KERNEL_BUFFERS", "EMULATED_DTYPES", "CAPTURE_PROCESS_REPLAY",
    "NUM_CPU_THREADS", "NULL_ALLOW_COPYOUT", "VIZ", "PARALLEL", "PROFILE", "SPEC", "CHECK_OOB", "PCONTIG",
    "DEBUG_RANGEIFY", "TUPLE_ORDER", "CCACHE", "USE_ATOMICS", "DISALLOW_BROADCAST",
})


# tinygrad's flags that stand for Python state here: name -> (read it, set it), registered by the module owning the
# state: DEFAULT_FLOAT/DEFAULT_INT are `dtypes.default_*` (dtype.py), DEV is `Device.DEFAULT` (device.py). (TRAINING is
# a flag of its own, above.)
STATE_FLAGS: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {}


class _DefaultDevice:
    """tinygrad's `DEV` flag object: `DEV.value = "CUDA"` sets the default device, `DEV.value` / `DEV.device` read
    it (the name: glassgrad has no compile targets to list)."""

    @property
    def value(self) -> str:
        return str(STATE_FLAGS["DEV"][0]())

    @value.setter
    def value(self, name: str) -> None:
        STATE_FLAGS["DEV"][1](name)

    @property
    def device(self) -> str:
        return self.value.split(":")[0]

    def __repr__(self) -> str:
        return self.value


DEV = _DefaultDevice()


def _resolve_flag(key: str, value: Any) -> tuple[str, Any]:
    """A flag name given to Context -> (glassgrad's flag, its value); KeyError naming the flag if it has none."""
    if key in STATE_FLAGS:
        return key, value
    if key in FLAG_ALIASES:
        name, convert = FLAG_ALIASES[key]
        return name, convert(value)
    if key in ContextVar._registry:
        return key, value
    if key in TINYGRAD_ONLY_FLAGS:
        raise KeyError(f"flag {key!r} is one of tinygrad's, but has no meaning in glassgrad; glassgrad's flags: "
                       f"{sorted(ContextVar._registry)}")
    raise KeyError(f"unknown flag {key!r}; known: {sorted(ContextVar._registry)}")


@contextlib.contextmanager
def Context(**flags: Any) -> Iterator[None]:
    """Temporarily set flags: `with Context(DEBUG=2): ...`. tinygrad's names for glassgrad's flags work too
    (NO_MEMORY_PLANNER=1 is MEMPLAN=0; TRAINING=1 is `Tensor.training`; DEFAULT_FLOAT=dtypes.half is
    `dtypes.default_float`); a tinygrad flag with no meaning here raises a KeyError that says so."""
    resolved = [_resolve_flag(key, value) for key, value in flags.items()]  # all checked before any is set
    old: dict[str, Any] = {}
    try:
        for key, value in resolved:
            if key in STATE_FLAGS:
                read, write = STATE_FLAGS[key]
                old.setdefault(key, read())
                write(value)
            else:
                old.setdefault(key, ContextVar._registry[key].value)
                ContextVar._registry[key].value = value
        yield
    finally:
        for key, value in old.items():
            if key in STATE_FLAGS:
                STATE_FLAGS[key][1](value)
            else:
                ContextVar._registry[key].value = value


def shape_args(first: Any, rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """The dims of a `f(shape, *args)` call, tinygrad's signature: `f((2, 3))`, `f([2, 3])`, `f(2, 3)` and
    `f(shape=(2, 3))` all give (2, 3)."""
    return tuple(first) if isinstance(first, (tuple, list)) and not rest else (first, *rest)


def prod(xs: Iterable[int]) -> int:
    return math.prod(xs)


def cache_dir() -> pathlib.Path:
    """Where compiled kernels are kept: $CACHEDIR, else ~/.cache/glassgrad."""
    base = os.environ.get("CACHEDIR") or os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")),
                                                      "glassgrad")
    path = pathlib.Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write a file so that readers see either nothing or all of it (safe for two processes, or threads, at once):
    a temporary file of this process and thread, renamed over `path`. A failed write (a full disk) leaves no
    temporary file behind."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_CHECKED = b"glassgrad checked 1\n"  # a checked cache file: this line, the SHA-256 of the data, the data


def write_checked(path: pathlib.Path, data: bytes) -> None:
    """`atomic_write` of `data` with its SHA-256 in front, for `read_checked`."""
    atomic_write(path, _CHECKED + hashlib.sha256(data).digest() + data)


def read_checked(path: pathlib.Path) -> bytes | None:
    """The data `write_checked` stored at `path`; None when there is none, or what is there is not whole (cut short
    by a full disk or a killed writer of an older version, damaged, or of another format): that file is removed, and
    the caller builds the data again (loading a damaged shared library raised OSError on every run, or could crash)."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    start = len(_CHECKED) + 32
    if raw.startswith(_CHECKED) and hashlib.sha256(raw[start:]).digest() == raw[len(_CHECKED):start]:
        return raw[start:]
    path.unlink(missing_ok=True)
    return None


# ---------------------------------------------------------------------- threads and forks
# glassgrad's process-wide state (the realized-node table, lineage, pending assigns and gradients, the random state,
# buffer versions, the kernel and schedule caches, a TinyJit capture's hooks) changes only under this lock: a
# realize, backward(), assign(), a random draw and a TinyJit call each hold it from start to end, so several threads
# can use glassgrad at once (building graphs side by side; each of these steps runs whole, one at a time). Re-entrant:
# these steps call each other. A fork waits for the step in progress (so the child never inherits one half done).
GLOBAL_LOCK = threading.RLock()
os.register_at_fork(before=GLOBAL_LOCK.acquire, after_in_parent=GLOBAL_LOCK.release,
                    after_in_child=GLOBAL_LOCK.release)

FnType = TypeVar("FnType", bound=Callable[..., Any])


def locked(fn: FnType) -> FnType:
    """`fn`, run holding `GLOBAL_LOCK`."""
    @functools.wraps(fn)
    def run_locked(*args: Any, **kwargs: Any) -> Any:
        with GLOBAL_LOCK:
            return fn(*args, **kwargs)
    return run_locked  # type: ignore[return-value]


def normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    """Turn a possibly negative axis into a positive one, with a clear error when out of range."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise TypeError(f"{name} must be an int, got {type(axis).__name__}")
    lo, hi = (-ndim, ndim - 1) if ndim > 0 else (-1, 0)
    if not lo <= axis <= hi:
        raise IndexError(f"{name} {axis} is out of range for a tensor with {ndim} dimensions (expected {lo}..{hi})")
    return axis % max(ndim, 1)


# ---------------------------------------------------------------------- tinygrad's small conveniences
_COLORS = ("black", "red", "green", "yellow", "blue", "magenta", "cyan", "white")


def colored(text: str, color: str | None, background: bool = False) -> str:
    """`text` in an ANSI terminal colour (tinygrad's helper; a `bright_` prefix is the bright variant)."""
    if color is None:
        return text
    bright = color.startswith("bright_")
    name = color.removeprefix("bright_")
    if name not in _COLORS:
        raise ValueError(f"colored: unknown colour {color!r}; one of {', '.join(_COLORS)} (optionally bright_)")
    code = _COLORS.index(name) + (60 if bright else 0) + (40 if background else 30)
    return f"\u001b[{code}m{text}\u001b[0m"


class _PlainRange:
    """`trange` without tqdm: the same iteration, `set_description` prints nothing."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n

    def set_description(self, desc: str) -> None:
        pass


def trange(n: int, **kwargs: Any) -> Any:
    """`range(n)` with a progress bar (tqdm's, when installed; tinygrad's helper)."""
    try:
        from tqdm import trange as tqdm_trange
    except ImportError:
        return _PlainRange(n)
    return tqdm_trange(n, **kwargs)


def partition(items: Iterable[Any], keep: Callable[[Any], bool]) -> tuple[list[Any], list[Any]]:
    """Split `items` in two lists, those where `keep(item)` is true and the others, each in order."""
    chosen: list[Any] = []
    rest: list[Any] = []
    for item in items:
        (chosen if keep(item) else rest).append(item)
    return chosen, rest


def flatten(nested: Iterable[Iterable[Any]]) -> list[Any]:
    """One level of nesting removed: [[1, 2], [3]] -> [1, 2, 3]."""
    return [item for inner in nested for item in inner]


def dedup(items: Iterable[Any]) -> list[Any]:
    """The items without repeats, first occurrence kept, in order (items must be hashable)."""
    return list(dict.fromkeys(items))


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def get_child(obj: Any, key: str) -> Any:
    """Follow a dotted path of attributes, list indices and dict keys: get_child(model, "layers.0.weight")."""
    for part in key.split("."):
        if isinstance(obj, (list, tuple)) and part.isdigit():
            obj = obj[int(part)]
        elif isinstance(obj, dict):
            obj = obj[part]
        else:
            obj = getattr(obj, part)
    return obj


class Timing(contextlib.ContextDecorator):
    """`with Timing("step: "):` prints the wall time of the block in ms (tinygrad's helper); `on_exit(ns)` may
    return extra text to append, `enabled=False` prints nothing."""

    def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True) -> None:
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
        self.start = 0

    def __enter__(self) -> Timing:
        self.start = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter_ns() - self.start
        if self.enabled:
            print(f"{self.prefix}{elapsed * 1e-6:6.2f} ms" + (self.on_exit(elapsed) if self.on_exit else ""))



class Profiling(contextlib.ContextDecorator):
    """`with Profiling():` runs the block under cProfile and prints the top `frac` of functions by `sort` (tinygrad's
    helper); `fn` also dumps the stats to that file, `enabled=False` profiles nothing."""

    def __init__(self, enabled: bool = True, sort: str = "cumtime", frac: float = 0.2, fn: str | None = None,
                 ts: float = 1) -> None:
        import cProfile
        self.enabled, self.sort, self.frac, self.fn = enabled, sort, frac, fn
        self.profile = cProfile.Profile()

    def __enter__(self) -> Profiling:
        if self.enabled:
            self.profile.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.profile.disable()
        if self.fn:
            self.profile.dump_stats(self.fn)
        import pstats
        stats = pstats.Stats(self.profile).strip_dirs().sort_stats(self.sort)
        stats.print_stats(self.frac)


class _PlainProgress:
    """`tqdm` without the tqdm package: the same iteration and methods, nothing printed."""

    def __init__(self, iterable: Iterable[Any] | None = None, desc: str = "", total: int | None = None,
                 **_: Any) -> None:
        self.iterable, self.desc, self.n = iterable, desc, 0
        self.total = total if total is not None else getattr(iterable, "__len__", lambda: 0)()

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("tqdm: iterating needs an iterable (tqdm(total=n) is updated by hand)")
        for item in self.iterable:
            yield item
            self.n += 1

    def __len__(self) -> int:
        return self.total

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        pass


def tqdm(iterable: Iterable[Any] | None = None, **kwargs: Any) -> Any:
    """A progress bar over `iterable` (tinygrad's helper): tqdm's when installed, else one that prints nothing."""
    try:
        from tqdm import tqdm as tqdm_bar
    except ImportError:
        return _PlainProgress(iterable, **kwargs)
    return tqdm_bar(iterable, **kwargs)


def profile_marker(name: str, color: str = "gray") -> None:
    """tinygrad's marker in its profiler's timeline; glassgrad has no such timeline, so it records nothing."""


OSX = sys.platform == "darwin"


def temp(x: str, append_user: bool = False) -> str:
    """A path in the system's temporary folder (tinygrad's helper), with the user's name appended if asked."""
    name = f"{x}.{getpass.getuser()}" if append_user else x
    return (pathlib.Path(tempfile.gettempdir()) / name).as_posix()


def ceildiv(num: int, amt: int) -> int:
    """num / amt rounded up."""
    return -(num // -amt)


def argfix(*x: Any) -> tuple[Any, ...]:
    """`f(1, 2)` and `f((1, 2))` alike: a single tuple or list argument is unpacked (tinygrad's helper)."""
    if x and isinstance(x[0], (tuple, list)):
        if len(x) != 1:
            raise ValueError(f"bad arguments {x}: a tuple or list must be the only argument")
        return tuple(x[0])
    return x


def all_same(items: Sequence[Any]) -> bool:
    """Whether every item equals the first (True for none)."""
    return all(x == items[0] for x in items)


def all_int(items: Iterable[Any]) -> bool:
    """Whether every item is a Python int (a shape without symbolic sizes)."""
    return all(isinstance(s, int) for s in items)


def unwrap(x: Any) -> Any:
    """`x`, which must not be None."""
    if x is None:
        raise ValueError("unwrap: the value is None")
    return x


def pluralize(st: str, cnt: int) -> str:
    """'1 kernel', '3 kernels'."""
    return f"{cnt} {st}" + ("" if cnt == 1 else "s")

def _open_url(url: str, headers: dict[str, str]) -> Any:
    """A readable response for `url` (tests replace this to serve bytes without a network)."""
    import urllib.request
    return urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "glassgrad", **headers}),
                                  timeout=60)


def fetch(url: str, name: str | os.PathLike[str] | None = None, subdir: str | None = None, gunzip: bool = False,
          allow_caching: bool = True, headers: dict[str, str] | None = None,
          sha256: str | None = None) -> pathlib.Path:
    """tinygrad's download helper: the local path of `url`'s contents, downloaded once.

    A `url` starting with "/" or "." is a local path and is returned as it is. Otherwise the file is kept in
    `cache_dir()/downloads[/subdir]` under `name` (default: the MD5 of the URL; ".gunzip" appended when `gunzip`
    decompresses it on the way), or at `name` itself when it is a path. A cached copy is reused unless
    `allow_caching` is False or its SHA-256 is not `sha256`. The download goes to a temporary file renamed into
    place only when it is complete (and matches `sha256`, else ValueError), so a failed one leaves nothing behind."""
    import gzip
    import hashlib
    import tempfile
    if url.startswith(("/", ".")):
        return pathlib.Path(url)
    if name is not None and (isinstance(name, os.PathLike) or "/" in name):
        path = pathlib.Path(name)
    else:
        leaf = str(name) if name is not None else hashlib.md5(url.encode()).hexdigest()
        path = cache_dir() / "downloads" / (subdir or "") / (leaf + (".gunzip" if gunzip else ""))
    if path.is_file() and allow_caching and \
            (sha256 is None or hashlib.sha256(path.read_bytes()).hexdigest() == sha256):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        try:
            with _open_url(url, headers or {}) as response:
                source = gzip.GzipFile(fileobj=response) if gunzip else response
                while chunk := source.read(1 << 16):
                    digest.update(chunk)
                    tmp.write(chunk)
            tmp.close()
            if sha256 is not None and digest.hexdigest() != sha256:
                raise ValueError(f"fetch({url!r}): SHA-256 {digest.hexdigest()} is not the expected {sha256}")
            os.replace(tmp.name, path)
        finally:
            if os.path.exists(tmp.name):
                os.unlink(tmp.name)
    return path


def __getattr__(name: str) -> Any:
    """`from glassgrad.helpers import GlobalCounters`, where tinygrad keeps it (its benchmarks and tests import it from
    there); it lives in engine/realize.py, which imports this module, so it is looked up on first use."""
    if name == "GlobalCounters":
        from glassgrad.engine.realize import GlobalCounters
        return GlobalCounters
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
