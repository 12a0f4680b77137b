"""`glassgrad.kernels(*tensors, device=None)`: the kernels realizing `tensors` would run, without running them.

In: lazy tensors (and optionally another device to render for). Out: a list of `ProgramSpec`s, each with `.name`,
`.source`, `.global_size`, `.local_size`. Nothing is compiled, allocated or executed, so with device="CUDA" or
"METAL" this shows the GPU code on any machine: only the renderer of that backend is used.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.device import Buffer, Device
from glassgrad.dtype import dtypes
from glassgrad.renderer.cstyle import CStyleLanguage
from glassgrad.schedule import create_schedule
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import PatternMatcher, UPat, graph_rewrite

if TYPE_CHECKING:
    from glassgrad.tensor import Tensor


def renderer_for(device: str) -> CStyleLanguage:
    """The renderer of a backend, without opening the device (no driver needed)."""
    module = importlib.import_module(f"glassgrad.runtime.ops_{Device.canonicalize(device).split(':')[0].lower()}")
    return module.create_renderer()


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


def kernels(*tensors: Tensor, device: str | None = None) -> list[ProgramSpec]:
    target = Device.canonicalize(device) if device is not None else None
    uops = [t.uop for t in tensors]
    if target is not None:  # all at once: a buffer or node the tensors share stays one buffer or node
        uops = list(_retarget(UOp(Ops.SINK, dtypes.void, tuple(uops)), target).src)
    schedule, _ = create_schedule(uops)
    out = []
    for item in schedule:
        if item.ast.op is Ops.COPY:
            continue
        out.append(get_program(item.ast, renderer_for(item.bufs[0].device)))
    return out
