"""`glassgrad.kernels(*tensors, device=None, arch=None)`: the kernels realizing `tensors` would run, without running
them.

In: lazy tensors (and optionally another device to render for, and for CUDA the GPU architecture). Out: a list of
`ProgramSpec`s, each with `.name`, `.source`, `.global_size`, `.local_size`. Nothing is compiled, allocated or
executed, so with device="CUDA" or "METAL" this shows the GPU code on any machine with numpy alone: only the
renderer of that backend is used, and renderers import no runtime (no cuda-bindings, no NVRTC, no PyObjC, no
driver). Target details come from arguments or defaults, not from a driver: CUDA renders for `arch` (default
`sm_90`, or the GPU's own when that device is open), the CPU for the C compiler it would use (probed).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.device import Buffer, Device
from glassgrad.dtype import dtypes
from glassgrad.renderer.cstyle import ClangRenderer, CStyleLanguage
from glassgrad.renderer.cuda import CUDARenderer
from glassgrad.renderer.metal import MetalRenderer
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor


RENDERERS: dict[str, type[CStyleLanguage]] = {"CPU": ClangRenderer, "CUDA": CUDARenderer, "METAL": MetalRenderer}
DEFAULT_CUDA_ARCH = "sm_90"


def renderer_class(device: str) -> type[CStyleLanguage]:
    """The renderer type of a device ('CUDA:1' -> CUDARenderer), for what its class says (`has_local`)."""
    return RENDERERS[Device.canonicalize(device).split(":")[0]]


def renderer_for(device: str, arch: str | None = None) -> CStyleLanguage:
    """The renderer that writes `device`'s kernels, without opening a GPU: an open device's own (a CUDA GPU's
    architecture); for the CPU, its device's (for the C compiler it probed; with none usable, portable C); CUDA for
    `arch` (default sm_90); Metal. `arch` is for CUDA only."""
    name = Device.canonicalize(device)
    kind = renderer_class(name)
    if arch is not None:
        if kind is not CUDARenderer:
            raise ValueError(f"arch={arch!r} is a CUDA target; {name} has no architecture to choose")
        return CUDARenderer(arch)
    if (opened := Device.opened(name)) is not None:
        return opened.renderer  # type: ignore[no-any-return]
    if kind is ClangRenderer:
        return Device[name].renderer  # type: ignore[no-any-return]
    return CUDARenderer(DEFAULT_CUDA_ARCH) if kind is CUDARenderer else kind()


def _retarget(u: UOp, device: str) -> UOp:
    """The same graph, with every device and buffer moved to `device` (buffers are never allocated)."""
    moved: dict[int, Buffer] = {}

    def move_buffer(x: UOp) -> UOp | None:
        buf = x.arg[0]
        if buf.device == device:
            return None
        if id(buf) not in moved:
            moved[id(buf)] = Buffer(device, buf.size, buf.dtype)
        return x.replace(arg=(moved[id(buf)], x.arg[1]))

    pm = PatternMatcher([
        (UPat(Ops.DEVICE, name="x"), lambda x: x.replace(arg=device) if x.arg != device else None),
        (UPat(Ops.BUFFER, name="x"), move_buffer),
    ])
    return graph_rewrite(u, pm)


def kernels(*tensors: Tensor, device: str | None = None, arch: str | None = None) -> list[ProgramSpec]:
    """The kernels realizing `tensors` would run (on their device, or rendered for `device`); `arch`: the CUDA
    architecture to render for (`sm_80`, ...; default: the open GPU's, else sm_90)."""
    target = Device.canonicalize(device) if device is not None else None
    uops = [t.uop for t in tensors]
    if target is not None:  # all at once: a buffer or node the tensors share stays one buffer or node
        uops = list(_retarget(UOp(Ops.SINK, dtypes.void, tuple(uops)), target).src)
    schedule, _ = create_schedule(uops)
    out = []
    for item in schedule:
        if item.ast.op in (Ops.COPY, Ops.ALLREDUCE):
            continue
        out.append(get_program(item.ast, renderer_for(item.bufs[0].device, arch)))
    return out
