"""Codegen: a kernel AST -> a `ProgramSpec` (source text, launch size, cost estimates).

In: `SINK(STORE(...))` from the scheduler, and the target device's renderer. Out: the rendered source.
Steps: symbolic simplification -> the renderer's own rewrite rules (e.g. float16 math in float32) ->
simplification again -> linearisation into loops -> rendering.
"""
from __future__ import annotations

from dataclasses import dataclass

from glassgrad.codegen.linearize import estimate_flops, linearize
from glassgrad.helpers import prod
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
    program = linearize(ast)
    name = kernel_name(ast)
    source = renderer.render(name, program)
    ranges = [u for u in program if u.op is Ops.RANGE]
    global_ranges = [r.src[0].arg for r in ranges if r.arg[1] == "global"]
    work = prod(r.src[0].arg for r in ranges)
    global_size = (global_ranges[0],) if global_ranges else (1,)
    return ProgramSpec(name, source, global_size, None, estimate_flops(ast), work, tuple(program))
