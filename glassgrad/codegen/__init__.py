"""Codegen: a kernel AST -> a `ProgramSpec` (source text, launch size, cost estimates).

In: `SINK(STORE(...))` from the scheduler, and the target device's renderer. Out: the rendered source.
Steps: symbolic simplification -> the renderer's own rewrite rules (e.g. float16 math in float32) ->
simplification again -> linearisation into loops -> rendering.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from glassgrad.codegen.gpudims import gpu_dims
from glassgrad.codegen.linearize import estimate_flops, linearize, loop_iterations, range_size
from glassgrad.codegen.opt import Opt
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.codegen.polyphase import polyphase
from glassgrad.codegen.stage import stage_gated_loads, stage_row_values
from glassgrad.helpers import ALLOW_TF32, NOOPT, WGMMA
from glassgrad.renderer.cstyle import CStyleLanguage
from glassgrad.schedule.indexing import kernel_name
from glassgrad.uop.ops import Ops, UOp
from glassgrad.uop.pattern import graph_rewrite
from glassgrad.uop.sint import render_sint, sint, sint_eval
from glassgrad.uop.symbolic import shared_simplify, simplify


@dataclass(frozen=True)
class ProgramSpec:
    """A rendered kernel: what `glassgrad.kernels()` returns and what a runtime compiles and launches.

    With symbolic sizes, `vars` names the kernel's int parameters (after the buffers, in this order), and
    `global_size`, `flops` and `work` may be expressions of them: `at(var_vals)` gives the spec for one launch."""
    name: str
    source: str
    global_size: tuple[sint, ...]
    local_size: tuple[int, ...] | None
    flops: sint
    work: sint  # loop iterations in all, used to decide how many CPU threads to use (0: one thread must run it all)
    uops: tuple[UOp, ...]
    vars: tuple[str, ...] = ()
    opts: tuple[Opt, ...] = ()  # the optimisations applied
    opt_level: int | None = None  # the compiler optimisation level an OPTLEVEL opt chose (in the source's first line)

    def __repr__(self) -> str:
        sizes = [render_sint(g) for g in self.global_size]
        grid = "(" + ", ".join(sizes) + ("," if len(sizes) == 1 else "") + ")"
        return f"<Kernel {self.name} global={grid} local={self.local_size}>"

    def renamed(self, name: str, renderer: CStyleLanguage) -> ProgramSpec:
        """The same kernel rendered under another name (to share one compiler run with a kernel of its name)."""
        return replace(self, name=name, source=renderer.with_opt_level(renderer.render(name, list(self.uops)),
                                                                       self.opt_level))

    def at(self, var_vals: dict[str, int]) -> ProgramSpec:
        """This spec with its symbolic sizes evaluated for the given Variable values."""
        missing = [v for v in self.vars if v not in var_vals]
        if missing:
            raise RuntimeError(f"kernel {self.name} needs values for the Variables {missing}; got {sorted(var_vals)}")
        return replace(self, global_size=tuple(sint_eval(g, var_vals) for g in self.global_size),
                       flops=sint_eval(self.flops, var_vals), work=sint_eval(self.work, var_vals))


def optimize_ast(ast: UOp, renderer: CStyleLanguage) -> UOp:
    ast = simplify(ast)
    if renderer.extra_matcher is not None:
        ast = simplify(graph_rewrite(ast, renderer.extra_matcher))
    return ast


def _loops_for_opts(ast: UOp, renderer: CStyleLanguage) -> UOp:
    """A simplified AST's loops as the opts see them: on a CPU, a sum over taps gated by a stride's congruence runs
    only the taps that pass (`codegen/polyphase.py`: its output loops split by phase)."""
    return ast if renderer.has_local else polyphase(ast)


def kernel_ast(ast: UOp, renderer: CStyleLanguage) -> UOp:
    """The AST whose axes the opts of `get_program` (a BEAM search's, a test's) refer to."""
    return _loops_for_opts(optimize_ast(ast, renderer), renderer)


def outer_loop_splits(ast: UOp, outer: UOp) -> bool:
    """Whether the CPU may split loop `outer` over threads: yes, unless the kernel adds into data-dependent places
    (a scatter's STORE arg=ADD, done without atomics) where two iterations of `outer` could add to one element.
    They cannot when the store's index is `c*outer + low + high`, nothing else depending on `outer`, with low's
    span below |c| and every term of high a multiple of some M above |c|*(size-1) + low's span (mixed radix: the
    embedding gradient's `16*d0 + d1 + 512*row`, split along the blocks d0 of its width). Else: one thread."""
    return all(_distinct_outer(u.src[1], outer) for u in ast.toposort() if u.op is Ops.STORE and u.arg is Ops.ADD)


def _distinct_outer(index: UOp, outer: UOp) -> bool:
    terms = _sum_terms(index)
    mine = [t for t in terms if outer in t.toposort()]
    rest = sorted((_coefficient(t) + (int(t.vmax) - int(t.vmin),) for t in terms
                   if outer not in t.toposort() and t.op is not Ops.CONST), key=lambda c: c[0])
    if len(mine) != 1 or outer.src[0].op is not Ops.CONST:
        return False
    stride, base = _coefficient(mine[0])
    if base is not outer or stride == 0:
        return False
    reach = stride * (outer.src[0].arg - 1)
    for split in range(len(rest) + 1):  # the terms of the smallest coefficients are `low`
        low_span = sum(span for _, _, span in rest[:split])
        multiple = math.gcd(*(c for c, _, _ in rest[split:])) if split < len(rest) else 0
        if low_span < stride and (split == len(rest) or multiple > reach + low_span):
            return True
    return False


def _sum_terms(u: UOp) -> list[UOp]:
    return [t for s in u.src for t in _sum_terms(s)] if u.op is Ops.ADD else [u]


def _coefficient(u: UOp) -> tuple[int, UOp]:
    """(|c|, x) for a term c*x with a constant c, else (1, u)."""
    if u.op is Ops.MUL:
        for a, b in (u.src, u.src[::-1]):
            if b.op is Ops.CONST and isinstance(b.arg, int):
                return abs(b.arg), a
    return 1, u


def get_program(ast: UOp, renderer: CStyleLanguage, opts: list[Opt] | None = None) -> ProgramSpec:
    """`opts`: the optimisations to apply (from a BEAM search, or a test), on the axes of `kernel_ast(ast)`; None:
    the hand-written heuristic's, or none with NOOPT=1. The name, FLOPs and work are the AST's before polyphase
    splits its loops (a stride-2 input gradient keeps its name, and counts the taps that its gate skips)."""
    with shared_simplify():  # one kernel's simplifications share their work
        return _get_program(ast, renderer, opts)


def _get_program(ast: UOp, renderer: CStyleLanguage, opts: list[Opt] | None) -> ProgramSpec:
    ast = optimize_ast(ast, renderer)
    name = kernel_name(ast)
    flops = estimate_flops(ast)
    work = loop_iterations(ast)
    kernel = Kernel(_loops_for_opts(ast, renderer), renderer)
    if opts is None:
        opts = [] if NOOPT else hand_coded_optimizations(kernel)
    kernel.apply_opts(opts)
    ast, upcast = kernel.ast, kernel.upcast
    local_size: tuple[int, ...] | None = None
    global_size: tuple[sint, ...]
    if renderer.has_local:  # GPUs: loops become threads and work-groups
        ast, global_size, local_size = gpu_dims(ast, kernel.local_order, tensor_cores=renderer.tensor_cores,
                                                tf32=bool(ALLOW_TF32),
                                                warpgroup=getattr(renderer, "warpgroup_mma", False) and bool(WGMMA))
    else:  # CPUs: the outermost loop is split across threads by the runtime
        ast = stage_row_values(stage_gated_loads(ast, upcast))
        global_ranges = sorted((r for r in ast.toposort() if r.op is Ops.RANGE and r.arg[1] == "global"),
                               key=lambda r: r.arg[0])
        global_size = (range_size(global_ranges[0]),) if global_ranges else (1,)
        if global_ranges and not outer_loop_splits(ast, global_ranges[0]):
            work = 0  # one thread runs the whole outer loop (see `outer_loop_splits`)
    program = linearize(ast, upcast)
    source = renderer.with_opt_level(renderer.render(name, program), kernel.opt_level)
    variables = tuple(u.arg[0] for u in program if u.op is Ops.DEFINE_VAR)
    return ProgramSpec(name, source, global_size, local_size, flops, work, tuple(program), variables, tuple(opts),
                       kernel.opt_level)
