"""A FAKE of the few PyObjC `Metal` objects glassgrad/runtime/ops_metal.py calls, for tests on machines without a Mac.

In: nothing; `make_module()` returns a module to put in `sys.modules["Metal"]`. Out: objects that record every call
(`FakeMetal.log`) and, when a kernel is dispatched, actually run it: the "GPU" is the emulator of metal_emulator.py
(MSL compiled as C++ against shim.h), reading and writing the fake buffers' bytes. So a test can check what
ops_metal asks of Metal (argument order, buffer indices and offsets, launch sizes, waits) and that the results are
right. Errors can be injected: a source containing `GG_FAKE_COMPILE_ERROR` fails to compile; `fail_next_command`
makes the next committed command buffer report an error. Nothing here knows how real Metal behaves beyond its API.
"""
from __future__ import annotations

import types
from collections import namedtuple
from typing import Any

import numpy as np
from metal_emulator import EmulatedMetalCompiler, EmulatedMetalProgram

MTLSize = namedtuple("MTLSize", ["width", "height", "depth"])


class NSError:
    def __init__(self, text: str) -> None:
        self.text = text

    def localizedDescription(self) -> str:
        return self.text


class Contents:
    def __init__(self, memory: np.ndarray) -> None:
        self.memory = memory

    def as_buffer(self, count: int) -> memoryview:
        return self.memory.data[:count]


class Buffer:
    def __init__(self, nbytes: int) -> None:
        self.memory = np.zeros(nbytes, dtype=np.uint8)

    def contents(self) -> Contents:
        return Contents(self.memory)

    def length(self) -> int:
        return self.memory.size


class CompileOptions:
    def __init__(self) -> None:
        self.fast_math = True  # Metal's default

    @classmethod
    def new(cls) -> CompileOptions:
        return cls()

    def setFastMathEnabled_(self, enabled: bool) -> None:
        self.fast_math = enabled


class Function:
    def __init__(self, library: Library, name: str) -> None:
        self.library, self.name = library, name


class Library:
    def __init__(self, src: str, binary: bytes) -> None:
        self.src, self.binary = src, binary

    def newFunctionWithName_(self, name: str) -> Function | None:
        return Function(self, name) if f"kernel void {name}(" in self.src else None


class Pipeline:
    def __init__(self, function: Function, max_threads: int) -> None:
        self.program = EmulatedMetalProgram(function.name, function.library.binary)
        self.max_threads = max_threads

    def maxTotalThreadsPerThreadgroup(self) -> int:
        return self.max_threads


class Encoder:
    def __init__(self, command: CommandBuffer) -> None:
        self.command = command
        self.pipeline: Pipeline | None = None
        self.buffers: dict[int, tuple[Buffer, int]] = {}
        self.ints: dict[int, int] = {}  # setBytes of 4 bytes: an int argument (a Variable, a lifted constant)
        self.dispatch: tuple[MTLSize, MTLSize] | None = None

    def setComputePipelineState_(self, pipeline: Pipeline) -> None:
        self.command.device.log.append(("setComputePipelineState", pipeline))
        self.pipeline = pipeline

    def setBuffer_offset_atIndex_(self, buffer: Buffer, offset: int, index: int) -> None:
        self.command.device.log.append(("setBuffer", buffer, offset, index))
        self.buffers[index] = (buffer, offset)

    def setBytes_length_atIndex_(self, data: bytes, length: int, index: int) -> None:
        self.command.device.log.append(("setBytes", data, length, index))
        assert length == 4, "glassgrad binds 32-bit ints with setBytes"
        self.ints[index] = int.from_bytes(data[:4], "little", signed=True)

    def dispatchThreadgroups_threadsPerThreadgroup_(self, groups: MTLSize, threads: MTLSize) -> None:
        self.command.device.log.append(("dispatch", groups, threads))
        self.dispatch = (groups, threads)

    def endEncoding(self) -> None:
        self.command.device.log.append(("endEncoding",))

    def run(self) -> None:
        assert self.pipeline is not None and self.dispatch is not None, "dispatch without a pipeline"
        views = [self.buffers[i][0].memory[self.buffers[i][1]:] for i in range(len(self.buffers))]
        assert sorted(self.ints) == list(range(len(views), len(views) + len(self.ints))), "ints follow the buffers"
        groups, threads = self.dispatch
        self.pipeline.program(*views, global_size=tuple(groups), local_size=tuple(threads),
                              vals=tuple(self.ints[i] for i in sorted(self.ints)))


class CommandBuffer:
    def __init__(self, device: Device) -> None:
        self.device = device
        self.encoders: list[Encoder] = []
        self.committed = self.completed = False
        self._error: NSError | None = None

    def computeCommandEncoder(self) -> Encoder:
        self.encoders.append(Encoder(self))
        return self.encoders[-1]

    def commit(self) -> None:
        self.device.log.append(("commit",))
        self.committed = True
        if self.device.fail_next_command:
            self.device.fail_next_command = False
            self._error = NSError("Execution of the command buffer was aborted due to an error (fake)")
            return
        for encoder in self.encoders:  # the "GPU" runs it now; the host learns of it only by waiting
            encoder.run()

    def waitUntilCompleted(self) -> None:
        assert self.committed, "waiting for a command buffer that was never committed hangs on Metal"
        self.device.log.append(("waitUntilCompleted",))
        self.completed = True

    def error(self) -> NSError | None:
        return self._error

    def GPUStartTime(self) -> float:
        return 10.0

    def GPUEndTime(self) -> float:
        return 10.25


class CommandQueue:
    def __init__(self, device: Device) -> None:
        self.device = device

    def commandBuffer(self) -> CommandBuffer:
        command = CommandBuffer(self.device)
        self.device.command_buffers.append(command)
        return command


class Device:
    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.command_buffers: list[CommandBuffer] = []
        self.compiled_sources: list[str] = []
        self.options: list[CompileOptions] = []
        self.fail_next_command = False
        self.max_threads = 1024
        self.compiler = EmulatedMetalCompiler()

    def newCommandQueue(self) -> CommandQueue:
        return CommandQueue(self)

    def newBufferWithLength_options_(self, nbytes: int, options: int) -> Buffer:
        self.log.append(("newBuffer", nbytes, options))
        return Buffer(nbytes)

    def newLibraryWithSource_options_error_(self, src: str, options: CompileOptions,
                                            error: None) -> tuple[Library | None, NSError | None]:
        self.compiled_sources.append(src)
        self.options.append(options)
        if "GG_FAKE_COMPILE_ERROR" in src:
            return None, NSError("program_source:3:5: error: use of undeclared identifier 'GG_FAKE_COMPILE_ERROR'")
        return Library(src, self.compiler.compile(src)), None

    def newComputePipelineStateWithFunction_error_(self, function: Function,
                                                   error: None) -> tuple[Pipeline | None, NSError | None]:
        return Pipeline(function, self.max_threads), None


def make_module() -> tuple[types.ModuleType, Device]:
    """A fake `Metal` module and the one device its MTLCreateSystemDefaultDevice returns."""
    device = Device()
    module = types.ModuleType("Metal")
    module.MTLResourceStorageModeShared = 0  # type: ignore[attr-defined]
    module.MTLSize = MTLSize  # type: ignore[attr-defined]
    module.MTLCompileOptions = CompileOptions  # type: ignore[attr-defined]
    module.MTLCreateSystemDefaultDevice = lambda: device  # type: ignore[attr-defined]
    return module, device
