"""Codegen: a kernel AST -> a `ProgramSpec` (source text, launch size, cost estimates).

In: `SINK(STORE(...))` from the scheduler, and the target device's renderer. Out: the rendered source.
Steps: symbolic simplification -> the renderer's own rewrite rules (e.g. float16 math in float32) ->
simplification again -> linearisation into loops -> rendering.
"""
from __future__ import annotations

from dataclasses import dataclass

from glassgrad.codegen.gpudims import gpu_dims
from glassgrad.codegen.linearize import estimate_flops, linearize
from glassgrad.codegen.upcast import choose_upcast
from glassgrad.helpers import NOOPT, prod
from glassgrad.renderer.cstyle import CStyleLanguage
from glassgrad.schedule.indexing import kernel_name
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import graph_rewrite
from glassgrad.uop.symbolic import simplify


@dataclass(frozen=True)
class ProgramSpec:
    """A rendered kernel: what `glassgrad.kernels()` returns and what a runtime compiles and launches."""
    name: str
    source: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    flops: int
    work: int  # loop iterations in all, used to decide how many CPU threads to use
    uops: tuple[UOp, ...]

    def __repr__(self) -> str:
        return f"<Kernel {self.name} global={self.global_size} local={self.local_size}>"


def optimize_ast(ast: UOp, renderer: CStyleLanguage) -> UOp:
    ast = simplify(ast)
    if renderer.extra_matcher is not None:
        ast = simplify(graph_rewrite(ast, renderer.extra_matcher))
    return ast


def get_program(ast: UOp, renderer: CStyleLanguage) -> ProgramSpec:
    ast = optimize_ast(ast, renderer)
    name = kernel_name(ast)
    flops = estimate_flops(ast)
    ranges = [u for u in ast.toposort() if u.op is Ops.RANGE]
    work = prod(r.src[0].arg for r in ranges)
    local_size: tuple[int, ...] | None = None
    global_size: tuple[int, ...]
    if renderer.has_local:  # GPUs: loops become threads and work-groups
        ast, global_size, local_size = gpu_dims(ast, tensor_cores=renderer.tensor_cores)
        upcast: tuple[UOp, ...] = ()
    else:  # CPUs: the outermost loop is split across threads by the runtime; one output dim may be upcast
        ast, upcast = choose_upcast(ast) if not NOOPT else (ast, ())
        global_ranges = sorted((r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "global"),
                               key=lambda r: r.arg[0])
        global_size = (global_ranges[0].src[0].arg,) if global_ranges else (1,)
    program = linearize(ast, upcast)
    source = renderer.render(name, program)
    return ProgramSpec(name, source, global_size, local_size, flops, work, tuple(program))
