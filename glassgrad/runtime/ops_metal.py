"""The Metal backend: MSL source -> MTLLibrary -> compute pipeline -> dispatch on an Apple GPU, through PyObjC.

In: Metal Shading Language from `MetalRenderer` (one `kernel void`). Out: a callable program that encodes one
`dispatchThreadgroups` of `global_size` threadgroups of `local_size` threads. Buffers are `MTLBuffer`s in shared
storage (CPU and GPU see the same memory): host copies go through the buffer's `contents()`.

Launches are asynchronous: a program commits its command buffer and returns; `synchronize()` (and every host copy)
waits for the committed ones and raises `MetalError` if one failed. With `wait=True` (DEBUG>=2) a launch waits and
returns the GPU time (`GPUEndTime - GPUStartTime`). Fast math is turned off so NaN checks and division stay exact.

Needs macOS and `pyobjc-framework-Metal` (`pip install 'glassgrad[metal]'`); `create_renderer()` works anywhere.
Honest status: this file has been run only against a fake of the Metal API (tests/metal/test_metal_runtime.py);
the kernels it runs are checked by compiling them as C++ and by an emulator (tests/metal/), never on a Mac.
"""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

from glassgrad.device import Allocator, Compiled, Compiler
from glassgrad.helpers import prod


class MetalError(RuntimeError):
    """A Metal call that failed: a compile error, a missing kernel, or a command buffer that did not complete."""


def _import_metal() -> Any:
    try:
        import Metal  # type: ignore[import-not-found]
    except ImportError as e:
        raise RuntimeError("METAL needs macOS with pyobjc-framework-Metal: pip install 'glassgrad[metal]'") from e
    return Metal


def _describe(error: Any) -> str:
    return str(error.localizedDescription()) if error is not None else "unknown error"


@dataclass
class MetalContext:
    """One GPU: the MTLDevice, its command queue, compiled libraries and pipelines, and launches not yet waited for."""
    Metal: Any
    device: Any
    queue: Any
    libraries: dict[str, Any] = field(default_factory=dict)  # sha256 of the source -> MTLLibrary
    pipelines: dict[tuple[str, str], Any] = field(default_factory=dict)  # (sha256, kernel name) -> pipeline state
    in_flight: list[tuple[str, Any]] = field(default_factory=list)  # (kernel name, committed command buffer)

    def synchronize(self) -> None:
        pending, self.in_flight = self.in_flight, []
        for name, command_buffer in pending:
            command_buffer.waitUntilCompleted()
            check_command_buffer(command_buffer, name)

    def library(self, src: str) -> Any:
        """The compiled library of `src`, built once per source."""
        key = hashlib.sha256(src.encode()).hexdigest()
        if key not in self.libraries:
            options = self.Metal.MTLCompileOptions.new()
            options.setFastMathEnabled_(False)
            library, error = self.device.newLibraryWithSource_options_error_(src, options, None)
            if library is None:
                raise MetalError(f"Metal compile failed: {_describe(error)}\n--- source ---\n{src}")
            self.libraries[key] = library
        return self.libraries[key]

    def pipeline(self, src: str, name: str) -> Any:
        key = (hashlib.sha256(src.encode()).hexdigest(), name)
        if key not in self.pipelines:
            function = self.library(src).newFunctionWithName_(name)
            if function is None:
                raise MetalError(f"kernel {name!r} is not in its compiled library\n--- source ---\n{src}")
            pipeline, error = self.device.newComputePipelineStateWithFunction_error_(function, None)
            if pipeline is None:
                raise MetalError(f"could not make a compute pipeline for {name}: {_describe(error)}")
            self.pipelines[key] = pipeline
        return self.pipelines[key]


def check_command_buffer(command_buffer: Any, name: str) -> None:
    error = command_buffer.error()
    if error is not None:
        raise MetalError(f"kernel {name} failed on the GPU: {_describe(error)}")


class MetalAllocator(Allocator):
    """Shared-storage MTLBuffers. Host copies wait for running kernels first (they may use the buffer)."""

    def __init__(self, ctx: MetalContext) -> None:
        super().__init__()
        self.ctx = ctx

    def _alloc(self, nbytes: int) -> Any:
        buffer = self.ctx.device.newBufferWithLength_options_(nbytes, self.ctx.Metal.MTLResourceStorageModeShared)
        if buffer is None:
            raise MemoryError(f"METAL could not allocate {nbytes} bytes")
        return buffer

    def copyin(self, handle: Any, src: memoryview) -> None:
        self.ctx.synchronize()
        handle.contents().as_buffer(src.nbytes)[:] = src.cast("B")

    def copyout(self, dest: memoryview, handle: Any) -> None:
        self.ctx.synchronize()
        dest.cast("B")[:] = handle.contents().as_buffer(dest.nbytes)


class MetalCompiler(Compiler):
    """Checks that the source compiles (raising MetalError with the log and the source) and returns it as the
    "binary": the program builds its library from the source, once per process (see `MetalContext.library`)."""
    cache_key = "metal source"

    def __init__(self, ctx: MetalContext) -> None:
        super().__init__()
        self.ctx = ctx

    def compile(self, src: str) -> bytes:
        self.ctx.library(src)
        return src.encode()


def _size(Metal: Any, dims: tuple[int, ...] | None) -> Any:
    x, y, z = (*(dims or ()), 1, 1, 1)[:3]
    return Metal.MTLSize(int(x), int(y), int(z))


class MetalProgram:
    """One kernel. Calling it dispatches `global_size` threadgroups of `local_size` threads; buffer i is bound at
    index i (offset 0), then `vals` as 32-bit ints."""

    def __init__(self, name: str, binary: bytes, ctx: MetalContext) -> None:
        self.name = name
        self.ctx = ctx
        self.pipeline = ctx.pipeline(binary.decode(), name)

    def __call__(self, *bufs: Any, global_size: tuple[int, ...] = (1,), local_size: tuple[int, ...] | None = None,
                 vals: tuple[int, ...] = (), work: int = 0, wait: bool = False) -> float:
        threads, limit = prod(local_size or (1,)), self.pipeline.maxTotalThreadsPerThreadgroup()
        if threads > limit:
            raise MetalError(f"{self.name} needs {threads} threads per threadgroup; this GPU allows {limit} for it")
        command_buffer = self.ctx.queue.commandBuffer()
        encoder = command_buffer.computeCommandEncoder()
        encoder.setComputePipelineState_(self.pipeline)
        for index, buffer in enumerate(bufs):
            encoder.setBuffer_offset_atIndex_(buffer, 0, index)
        for index, value in enumerate(vals, start=len(bufs)):
            encoder.setBytes_length_atIndex_(struct.pack("<i", value), 4, index)
        Metal = self.ctx.Metal
        encoder.dispatchThreadgroups_threadsPerThreadgroup_(_size(Metal, global_size), _size(Metal, local_size))
        encoder.endEncoding()
        command_buffer.commit()
        if not wait:
            self.ctx.in_flight.append((self.name, command_buffer))
            return 0.0
        command_buffer.waitUntilCompleted()
        check_command_buffer(command_buffer, self.name)
        return float(command_buffer.GPUEndTime() - command_buffer.GPUStartTime())


def create_renderer() -> Any:
    """The MSL renderer; needs neither macOS nor PyObjC."""
    from glassgrad.renderer.metal import MetalRenderer
    return MetalRenderer()


def open_context() -> MetalContext:
    Metal = _import_metal()
    device = Metal.MTLCreateSystemDefaultDevice()
    if device is None:
        raise RuntimeError("METAL: MTLCreateSystemDefaultDevice found no GPU")
    return MetalContext(Metal, device, device.newCommandQueue())


def create_device(name: str) -> Compiled:
    """'METAL' -> the backend for the system's default GPU. RuntimeError off macOS or without PyObjC's Metal."""
    if name != "METAL":
        raise ValueError(f"the Metal backend has one device, 'METAL'; got {name!r}")
    ctx = open_context()
    return Compiled(name, MetalAllocator(ctx), create_renderer(), MetalCompiler(ctx),
                    lambda kernel, binary: MetalProgram(kernel, binary, ctx), ctx.synchronize)
