"""The CUDA backend: CUDA C -> CUBIN (NVRTC) -> kernel launch (driver API), through NVIDIA's `cuda-bindings`.

In: CUDA C source from `CUDARenderer` (one `extern "C" __global__` kernel). Out: a callable program that launches
it on a grid of `global_size` blocks of `local_size` threads. Buffers are raw device pointers (`CUdeviceptr`).

`CUDA:n` is GPU n. Each device uses its primary context, made current before every call that needs it, and the
legacy default stream, so copies, kernels and graphs run in the order they were issued. `CUDAGraph` records a run of
launches as one CUDA graph, which a TinyJit replay launches at once (engine/jit.py). NVRTC compiles straight to SASS
(a CUBIN for `sm_XY`), not PTX: a CUBIN from a newer NVRTC loads on an older driver of the same major version.
Every driver and NVRTC status goes through `check`, which raises a `CUDAError` naming the call.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import hashlib
import os
import reprlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

try:
    from cuda.bindings import driver, nvrtc
except ImportError as e:  # glassgrad itself imports fine without it; only Device["CUDA"] needs it
    raise ImportError("the CUDA backend needs NVIDIA's cuda-bindings: pip install 'glassgrad[cuda]'") from e

from glassgrad.device import Allocator, Compiled, Compiler, Launch, ran


class CUDAError(RuntimeError):
    """A driver or NVRTC call that did not succeed; `status` is its CUresult / nvrtcResult."""

    def __init__(self, message: str, status: Any) -> None:
        super().__init__(message)
        self.status = status


_SUCCESS = driver.CUresult.CUDA_SUCCESS
# a launch's statuses when another context than the function's is current (another library set its own)
_OTHER_CONTEXT = (driver.CUresult.CUDA_ERROR_INVALID_CONTEXT, driver.CUresult.CUDA_ERROR_INVALID_HANDLE,
                  driver.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED)


def check(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a cuda-bindings function, raise `CUDAError` unless it succeeded, and return its outputs.

    cuda-bindings returns `(status, *outputs)`: we return None, the one output, or the tuple of them.
    """
    status, *outputs = fn(*args)
    if isinstance(status, nvrtc.nvrtcResult):
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            reason = nvrtc.nvrtcGetErrorString(status)[1].decode()
            raise CUDAError(f"{fn.__name__}{reprlib.repr(args)} failed: {reason}", status)
    elif status != driver.CUresult.CUDA_SUCCESS:
        raise CUDAError(f"{fn.__name__}{reprlib.repr(args)} failed: {driver.CUresult(status).name}", status)
    return None if not outputs else outputs[0] if len(outputs) == 1 else tuple(outputs)


# ---------- NVRTC: found in the nvidia-cuda-nvrtc wheel ----------

def _preload_nvrtc_from_wheels() -> None:
    """Load libnvrtc from an installed nvidia-* wheel (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib) so that
    cuda-bindings' own dlopen of the same soname finds it, even where it does not search the wheels itself."""
    for base in sys.path:
        for lib in sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib", "libnvrtc.so*"))):
            if "builtins" not in lib:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
                return


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor). Loading the library may fail (OSError, or cuda.pathfinder's RuntimeError):
    then we preload it from the wheels and try once more, and finally say how to install it."""
    try:
        return tuple(check(nvrtc.nvrtcVersion))  # type: ignore[return-value]
    except (OSError, RuntimeError):
        _preload_nvrtc_from_wheels()
    try:
        return tuple(check(nvrtc.nvrtcVersion))  # type: ignore[return-value]
    except (OSError, RuntimeError) as e:
        raise RuntimeError(f"NVRTC (CUDA's runtime compiler) not found: pip install nvidia-cuda-nvrtc ({e})") from e


def cuda_include_dirs() -> list[str]:
    """Where cuda_fp16.h and cuda_bf16.h live, for NVRTC's -I: the nvidia-cuda-runtime wheel (found by
    cuda.pathfinder), else $CUDA_HOME or /usr/local/cuda. Empty when neither has them."""
    candidates = [os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]
    try:
        from cuda.pathfinder import find_nvidia_header_directory
        candidates.insert(0, find_nvidia_header_directory("cudart") or "")
    except Exception:  # an older cuda-bindings without cuda.pathfinder
        pass
    return [d for d in candidates if os.path.exists(os.path.join(d, "cuda_fp16.h"))][:1]


# ---------- fork: the driver cannot be used in a process forked from one that initialised it ----------

_driver_pid: int | None = None  # the process whose cuInit succeeded, once one has
_inherited = False  # this process was forked from one that had initialised the driver (set by the at-fork hook)


class CUDAForkError(RuntimeError):
    """CUDA used in a process forked after its parent had initialised the driver (which the driver does not allow)."""


def _note_fork() -> None:
    """After a fork, in the child: from now on CUDA raises here if the parent (or an ancestor) had initialised it."""
    global _inherited
    _inherited = _inherited or _driver_pid is not None


os.register_at_fork(after_in_child=_note_fork)


def check_not_forked() -> None:
    """Raise `CUDAForkError` in a process forked from one that had initialised CUDA: the driver's state (contexts,
    memory, modules) belongs to the parent, and a call here would fail or hang, not work. Checked before every driver
    call that starts something (contexts, memory, copies, compiles' module loads, launches, graphs)."""
    if _inherited:
        raise CUDAForkError(
            f"Cannot use CUDA in a forked subprocess: CUDA was initialised in the parent process (pid {_driver_pid}) "
            f"before this process (pid {os.getpid()}) was forked from it, and the CUDA driver cannot be used after a "
            "fork. Start worker processes with the 'spawn' (or 'forkserver') start method "
            "(multiprocessing.get_context('spawn'), a DataLoader's multiprocessing_context='spawn'), or fork them "
            "before the first use of CUDA.")


# ---------- devices and contexts ----------

@dataclass
class CUDAContext:
    """One GPU: its index, driver handle, primary context and architecture (e.g. 'sm_90')."""
    index: int
    device: Any
    context: Any
    arch: str
    _timing_events: tuple[Any, Any] | None = field(default=None, repr=False)

    def activate(self) -> None:
        check_not_forked()
        check(driver.cuCtxSetCurrent, self.context)

    def synchronize(self) -> None:
        self.activate()
        check(driver.cuCtxSynchronize)

    def timing_events(self) -> tuple[Any, Any]:
        """A (start, end) event pair, created once and reused by every timed launch."""
        if self._timing_events is None:
            flags = driver.CUevent_flags.CU_EVENT_DEFAULT
            self._timing_events = (check(driver.cuEventCreate, flags), check(driver.cuEventCreate, flags))
        return self._timing_events


def _init_driver() -> int:
    """cuInit and the number of GPUs; RuntimeError when there is no driver or no GPU, `CUDAForkError` in a process
    forked from one that had initialised the driver."""
    global _driver_pid
    check_not_forked()
    try:
        check(driver.cuInit, 0)
        count = int(check(driver.cuDeviceGetCount))
    except Exception as e:  # no libcuda.so raises a cuda.pathfinder error, not a CUresult
        raise RuntimeError(f"CUDA is not available: cuInit failed ({e})") from e
    _driver_pid = os.getpid()
    return count


def open_context(index: int) -> CUDAContext:
    """GPU `index`'s `CUDAContext` (`_open_context`, once per GPU); `CUDAForkError` in a forked child, where the
    parent's contexts cannot be used."""
    check_not_forked()
    return _open_context(index)


@functools.cache  # one CUDAContext per GPU (a failure is not cached: the exception propagates)
def _open_context(index: int) -> CUDAContext:
    """Retain GPU `index`'s primary context, make it current and read its compute capability."""
    count = _init_driver()
    if not 0 <= index < count:
        raise RuntimeError(f"CUDA device {index} not found: {count} device{'s' if count != 1 else ''} available")
    dev = check(driver.cuDeviceGet, index)
    context = check(driver.cuDevicePrimaryCtxRetain, dev)
    check(driver.cuCtxSetCurrent, context)
    attr = driver.CUdevice_attribute
    major = check(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
    minor = check(driver.cuDeviceGetAttribute, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
    return CUDAContext(index, dev, context, f"sm_{major}{minor}")


# ---------- memory ----------

class CUDAAllocator(Allocator):
    """Device memory of one GPU. Handles are `CUdeviceptr`s; host copies are synchronous with the host."""

    def __init__(self, ctx: CUDAContext) -> None:
        super().__init__()
        self.ctx = ctx

    def _alloc(self, nbytes: int) -> Any:
        self.ctx.activate()
        try:
            return check(driver.cuMemAlloc, nbytes)
        except CUDAError as e:
            if e.status == driver.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                raise MemoryError(f"CUDA:{self.ctx.index} is out of memory allocating {nbytes} bytes") from e
            raise

    def _release(self, handle: Any, nbytes: int) -> None:
        self.ctx.activate()
        check(driver.cuMemFree, handle)

    def copyin(self, handle: Any, src: memoryview) -> None:
        self.ctx.activate()
        check(driver.cuMemcpyHtoD, handle, src, src.nbytes)

    def copyout(self, dest: memoryview, handle: Any) -> None:
        self.ctx.activate()
        check(driver.cuMemcpyDtoH, dest, handle, dest.nbytes)

    def copy_device(self, dest: Any, src: Any, nbytes: int, src_allocator: CUDAAllocator | None = None) -> None:
        """Copy `nbytes` from `src` to `dest` (on this GPU) without the host. `src_allocator` is the source
        buffer's allocator when it lives on another GPU: then the copy is a peer copy between the contexts."""
        self.ctx.activate()
        if src_allocator is None or src_allocator.ctx.index == self.ctx.index:
            check(driver.cuMemcpyDtoD, dest, src, nbytes)
            return
        src_allocator.ctx.synchronize()  # the source's kernels must have finished writing it
        self.ctx.activate()
        check(driver.cuMemcpyPeer, dest, self.ctx.context, src, src_allocator.ctx.context, nbytes)


# ---------- compiling ----------

class CUDACompiler(Compiler):
    """CUDA C -> CUBIN for one architecture with NVRTC. Works without a GPU when the arch is given."""

    def __init__(self, arch: str = "sm_90") -> None:
        super().__init__()
        self.arch = arch
        # no --use_fast_math: results must match numpy; FMA contraction (NVCC's default) stays on
        self.options = [f"--gpu-architecture={arch}", "--std=c++17", "-default-device",
                        *(f"-I{d}" for d in cuda_include_dirs())]
        major, minor = nvrtc_version()
        self.cache_key = f"cuda {arch} nvrtc {major}.{minor} {' '.join(self.options)}"

    def compile(self, src: str) -> bytes:
        prog = check(nvrtc.nvrtcCreateProgram, src.encode(), b"kernel.cu", 0, [], [])
        try:
            options = [o.encode() for o in self.options_for(src)]
            status, = nvrtc.nvrtcCompileProgram(prog, len(options), options)
            if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
                raise CUDAError(f"NVRTC compile for {self.arch} failed:\n{self._log(prog)}\n--- source ---\n{src}",
                                status)
            binary = b" " * check(nvrtc.nvrtcGetCUBINSize, prog)
            check(nvrtc.nvrtcGetCUBIN, prog, binary)
            return binary
        finally:
            check(nvrtc.nvrtcDestroyProgram, prog)

    def options_for(self, src: str) -> list[str]:
        """NVRTC's options for `src`: a kernel with warpgroup MMAs (wgmma) is built for sm_90a, the target that has
        them (its CUBIN runs on sm_90 GPUs only, which is what rendered it)."""
        if self.arch == "sm_90" and "wgmma." in src:
            return [o.replace("sm_90", "sm_90a") if o.startswith("--gpu-architecture") else o for o in self.options]
        return self.options

    @staticmethod
    def _log(prog: Any) -> str:
        log = b" " * check(nvrtc.nvrtcGetProgramLogSize, prog)
        check(nvrtc.nvrtcGetProgramLog, prog, log)
        return log.rstrip(b"\0").decode(errors="replace").strip()


# ---------- launching ----------

_functions: dict[tuple[int, str, str], Any] = {}  # (GPU, sha256 of the CUBIN, kernel name) -> CUfunction
_modules: dict[tuple[int, str], Any] = {}  # (GPU, sha256 of the CUBIN) -> CUmodule, loaded once


def _load_function(ctx: CUDAContext, name: str, binary: bytes) -> Any:
    digest = hashlib.sha256(binary).hexdigest()
    if (ctx.index, digest, name) not in _functions:
        ctx.activate()
        if (ctx.index, digest) not in _modules:
            _modules[ctx.index, digest] = check(driver.cuModuleLoadData, binary)
        _functions[ctx.index, digest, name] = check(driver.cuModuleGetFunction, _modules[ctx.index, digest],
                                                    name.encode())
    return _functions[ctx.index, digest, name]


def _pad3(dims: tuple[int, ...] | None) -> tuple[int, int, int]:
    dims = tuple(dims or ())
    if len(dims) > 3:
        raise ValueError(f"CUDA launches have at most 3 dimensions, got {dims}")
    x, y, z = (*dims, 1, 1, 1)[:3]
    return int(x), int(y), int(z)


@dataclass
class _KernelParams:
    """A kernel's parameters as the driver takes them: an array of pointers, each to one argument's bytes (the
    buffers' device pointers, then `vals` as 32-bit ints). `address` is valid while this object lives; the driver
    copies the arguments when it is called."""
    values: list[Any]
    pointers: Any

    @staticmethod
    def of(bufs: tuple[Any, ...] | list[Any], vals: tuple[int, ...]) -> _KernelParams:
        values = [ctypes.c_void_p(int(b)) for b in bufs] + [ctypes.c_int32(v) for v in vals]
        return _KernelParams(values, (ctypes.c_void_p * max(len(values), 1))(*map(ctypes.addressof, values)))

    @staticmethod
    def packed(bufs: tuple[Any, ...] | list[Any], vals: tuple[int, ...]) -> Any:
        """The same bytes for one launch, built faster: every argument in an 8-byte slot of one array (a 32-bit
        value in its slot's low bytes, which the driver reads on this little-endian host), and the pointer array
        made from the slots' addresses. Returns (slots, pointers), to be kept alive until the driver has copied
        them (cuLaunchKernel copies them before it returns)."""
        n = len(bufs) + len(vals)
        slots = (ctypes.c_uint64 * max(n, 1))(*[int(b) for b in bufs], *[v & 0xFFFFFFFF for v in vals])
        base = ctypes.addressof(slots)
        return slots, (ctypes.c_void_p * max(n, 1))(*range(base, base + 8 * n, 8))

    def set(self, bufs: tuple[Any, ...] | list[Any], vals: tuple[int, ...]) -> None:
        """New argument values, written in place into the same bytes (the pointer array stays valid)."""
        for holder, value in zip(self.values, [*(int(b) for b in bufs), *vals]):
            holder.value = value

    @property
    def address(self) -> int:
        return ctypes.addressof(self.pointers)


class CUDAProgram:
    """One kernel in a loaded CUBIN. Calling it launches a grid of `global_size` blocks of `local_size` threads,
    with the buffers' device pointers and then `vals` (32-bit ints) as its parameters."""

    def __init__(self, name: str, binary: bytes, ctx: CUDAContext | None = None) -> None:
        self.name = name
        self.ctx = ctx if ctx is not None else open_context(0)
        self.function = _load_function(self.ctx, name, binary)
        self._dims: dict[tuple[Any, Any], tuple[tuple[int, int, int], tuple[int, int, int]]] = {}

    def _remember_dims(self, global_size: tuple[int, ...], local_size: tuple[int, ...] | None) \
            -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """The launch's grid and block as three ints each (checked once per distinct shape)."""
        dims = self._dims[(global_size, local_size)] = (_pad3(global_size), _pad3(local_size))
        return dims

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1,), local_size: tuple[int, ...] | None = None,
                 vals: tuple[int, ...] = (), work: int = 0, wait: bool = False) -> float:
        if _inherited:
            check_not_forked()
        slots, pointers = _KernelParams.packed(bufs, vals)
        if wait:
            self.ctx.activate()
            start, end = self.ctx.timing_events()
            check(driver.cuEventRecord, start, 0)
        try:
            grid, block = self._dims.get((global_size, local_size)) or self._remember_dims(global_size, local_size)
        except TypeError:  # (sizes given as lists: not a key)
            grid, block = _pad3(global_size), _pad3(local_size)
        # (no cuCtxSetCurrent per launch: a function launched while another context is current fails with an
        # invalid-context or invalid-handle status, and is then launched again with its own context made current)
        try:
            status = driver.cuLaunchKernel(self.function, *grid, *block, 0, 0, ctypes.addressof(pointers), 0)[0]
        except BaseException as e:
            ran(e)
            raise
        if status != _SUCCESS:
            if status not in _OTHER_CONTEXT:
                raise CUDAError(f"cuLaunchKernel of {self.name} failed: {driver.CUresult(status).name}", status)
            self.ctx.activate()
            check(driver.cuLaunchKernel, self.function, *grid, *block, 0, 0, ctypes.addressof(pointers), 0)
        del slots
        if not wait:
            return 0.0
        check(driver.cuEventRecord, end, 0)
        check(driver.cuEventSynchronize, end)
        return float(check(driver.cuEventElapsedTime, start, end)) / 1e3


# ---------- graphs ----------

class CUDAGraph:
    """Kernel launches on one GPU recorded once as a CUDA graph and replayed with one `cuGraphLaunch`.

    In: `Launch`es of `CUDAProgram`s of this GPU, in order. Each becomes a kernel node that depends on the node
    before it (a chain: the launches run one after another, as on the stream), and the graph is instantiated once.
    `update(i, launch)` gives node i new parameters in the instantiated graph (`cuGraphExecKernelNodeSetParams`:
    other buffers, grid or Variable values; the kernel stays the same), so a replay with other inputs needs no new
    graph. Calling it launches the graph on the legacy default stream, ordered with every copy and kernel there.
    """

    def __init__(self, ctx: CUDAContext, launches: list[Launch]) -> None:
        if not launches:
            raise ValueError("a CUDA graph needs at least one launch")
        self.ctx = ctx
        ctx.activate()
        self.graph = check(driver.cuGraphCreate, 0)
        self.nodes: list[Any] = []
        self.params: list[_NodeParams] = []  # each node's parameters, reused (changed in place) by `update`
        for launch in launches:
            params = self._node_params(launch)
            before = self.nodes[-1:]
            self.nodes.append(check(driver.cuGraphAddKernelNode, self.graph, before, len(before), params.node))
            self.params.append(params)
        self.executable = check(driver.cuGraphInstantiate, self.graph, 0)

    def _node_params(self, launch: Launch) -> _NodeParams:
        program = launch.program
        if not isinstance(program, CUDAProgram) or program.ctx.index != self.ctx.index:
            raise ValueError(f"a CUDA graph of CUDA:{self.ctx.index} takes this GPU's CUDAPrograms, got {program!r}")
        return _NodeParams.of(program.function, launch)

    def update(self, index: int, launch: Launch) -> None:
        """Node `index` launches `launch` from now on (the same kernel: other buffers, grid or Variable values). The
        node's parameter objects are changed in place (a generation step updates every symbolic kernel per token),
        and the driver copies them."""
        params = self.params[index]
        if getattr(launch.program, "function", None) is not params.function or \
                len(launch.args) + len(launch.vals) != len(params.kernel_params.values):
            params = self.params[index] = self._node_params(launch)
        else:
            params.set(launch)
        self.ctx.activate()
        check(driver.cuGraphExecKernelNodeSetParams, self.executable, self.nodes[index], params.node)

    def __call__(self) -> None:
        self.ctx.activate()
        check(driver.cuGraphLaunch, self.executable, 0)

    def __del__(self) -> None:
        if _inherited:  # (the parent's graph: nothing of it to destroy here)
            return
        try:
            if hasattr(self, "executable"):
                driver.cuGraphExecDestroy(self.executable)
            if hasattr(self, "graph"):
                driver.cuGraphDestroy(self.graph)
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass


@dataclass
class _NodeParams:
    """A kernel node's parameters, with the argument bytes they point at (kept alive until the driver copied them)."""
    node: Any
    kernel_params: _KernelParams
    function: Any  # the kernel (`node.func` gives a new wrapper object each time it is read)

    @staticmethod
    def of(function: Any, launch: Launch) -> _NodeParams:
        kernel_params = _KernelParams.of(launch.args, launch.vals)
        node = driver.CUDA_KERNEL_NODE_PARAMS()
        node.func = function
        node.gridDimX, node.gridDimY, node.gridDimZ = _pad3(launch.global_size)
        node.blockDimX, node.blockDimY, node.blockDimZ = _pad3(launch.local_size)
        node.sharedMemBytes = 0
        node.kernelParams = kernel_params.address
        return _NodeParams(node, kernel_params, function)

    def set(self, launch: Launch) -> None:
        """The same kernel's launch with other arguments and grid: the fields that can change, in place."""
        self.kernel_params.set(launch.args, launch.vals)
        grid = _pad3(launch.global_size)
        if grid != (self.node.gridDimX, self.node.gridDimY, self.node.gridDimZ):
            self.node.gridDimX, self.node.gridDimY, self.node.gridDimZ = grid
        block = _pad3(launch.local_size)
        if block != (self.node.blockDimX, self.node.blockDimY, self.node.blockDimZ):
            self.node.blockDimX, self.node.blockDimY, self.node.blockDimZ = block


# ---------- the backend ----------

def create_renderer(arch: str = "sm_90") -> Any:
    """The CUDA C renderer for GPUs of `arch`; needs neither a GPU nor a driver."""
    from glassgrad.renderer.cuda import CUDARenderer
    return CUDARenderer(arch)


def create_device(name: str) -> Compiled:
    """'CUDA' or 'CUDA:n' -> the backend for GPU n. RuntimeError when there is no driver or no such GPU."""
    base, _, index = name.partition(":")
    if base != "CUDA" or not (index or "0").isdigit():
        raise ValueError(f"the CUDA backend's devices are 'CUDA', 'CUDA:1', ...; got {name!r}")
    ctx = open_context(int(index or 0))
    program = functools.partial(CUDAProgram, ctx=ctx)
    renderer, compiler = create_renderer(ctx.arch), CUDACompiler(ctx.arch)
    if nvrtc_version() < (12, 0):  # sm_90a (warpgroup MMAs) came with CUDA 12; an older NVRTC keeps mma.sync
        renderer.warpgroup_mma = False
    return Compiled(name, CUDAAllocator(ctx), renderer, compiler, program, ctx.synchronize,
                    graph=functools.partial(CUDAGraph, ctx))
