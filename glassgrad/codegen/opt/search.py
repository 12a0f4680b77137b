"""`BEAM=n`: search the legal opts of a kernel by timing candidates on the device, keep the fastest, cache it.

In: a kernel AST and a device name. Out: the list of `Opt`s to apply. Each round extends every kernel of the beam
by one more legal action, compiles the new candidates in parallel (the C compiler runs in subprocesses), runs each
on random inputs, drops any whose output differs from the unoptimised kernel's on the same inputs, times the rest
(best of a few runs) and keeps the `n` fastest; it stops when a round finds nothing faster. The winner is written
to `<cache dir>/beam/<hash of device, compiler, width, kernel>.json`, so the next run pays nothing
(`IGNORE_BEAM_CACHE=1`, as in tinygrad: search again, and write the new winner).

The heuristic's opts are a candidate from the start (timed and verified like the others), so the search never
returns a kernel slower than the heuristic's on its own timing; a winner other than the heuristic's kernel must
also beat it in CONFIRM_ROUNDS more rounds of the two run in turn (a loaded machine's noise otherwise let a lucky
candidate win). `BEAM_BUDGET` (seconds, default 60) bounds one
kernel's search: once spent, no more candidates are compiled or timed and the fastest so far wins. A candidate whose
first run is over SLOW times the best so far is not timed again.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad.codegen import ProgramSpec, get_program, kernel_ast
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.device import Buffer, Compiled, Device
from glassgrad.dtype import DType
from glassgrad.helpers import (
    ALLOW_TF32,
    BEAM_BUDGET,
    CACHELEVEL,
    CPU_OPT_LEVEL,
    DEBUG,
    IGNORE_BEAM_CACHE,
    atomic_write,
    cache_dir,
    codegen_flags,
)
from glassgrad.uop.ops import Ops, UOp, pretty
from glassgrad.uop.params import PARAM_PREFIX, float_bits, is_const_param

UPCAST_AMOUNTS = (0, 2, 3, 4, 8, 16, 32)
UNROLL_AMOUNTS = (0, 2, 4, 8)
LOCAL_AMOUNTS = (0, 2, 4, 8, 16, 32, 64, 128, 256)  # threads of a work-group along an output axis (GPUs)
GROUP_AMOUNTS = (0, 4, 8, 16, 32, 64, 128, 256)      # threads sharing a reduce axis (GPUs; with LOCAL: per output)
PADTO_AMOUNTS = (4, 8, 16)  # an output axis padded to a multiple of a vector width, for the UPCAST after it (CPUs)
TIMING_RUNS = 3
SLOW = 3.0  # a candidate whose first run takes this many times the best time so far is not timed again
MAX_ROUNDS = 6
CONFIRM_ROUNDS = 5  # rounds of the winner and the heuristic's kernel in turn before the winner replaces it


def actions(k: Kernel) -> list[Opt]:
    """Every action worth trying next (some will not fit: `Kernel.apply_opt` rejects them)."""
    out = [Opt(OptOps.UPCAST, axis, amount) for axis in k.axes_of("global") for amount in UPCAST_AMOUNTS]
    out += [Opt(OptOps.UNROLL, axis, amount) for axis in k.axes_of("reduce") for amount in UNROLL_AMOUNTS]
    global_axes = k.axes_of("global")
    out += [Opt(OptOps.SWAP, a, b) for a in global_axes for b in global_axes if a < b]
    if k.renderer.has_local:  # the launch shape: work-group threads along output axes, or sharing a reduction
        out += [Opt(OptOps.LOCAL, axis, amount) for axis in global_axes for amount in LOCAL_AMOUNTS]
        out += [Opt(OptOps.GROUP, axis, amount) for axis in k.axes_of("reduce") for amount in GROUP_AMOUNTS]
    else:  # odd sizes (1023, 77): padded to a multiple of the UPCAST that the next round may try
        out += [Opt(OptOps.PADTO, axis, amount) for axis in global_axes for amount in PADTO_AMOUNTS]
    # the C compiler's optimisation level (the CPU's -O2 or -O3; `Kernel.apply_opt` rejects the kernel's own)
    out += [Opt(OptOps.OPTLEVEL, 0, level) for level in k.renderer.opt_levels]
    return out


def buffer_sizes(ast: UOp) -> dict[int, tuple[DType, int]]:
    """{buffer index: (dtype, elements)} large enough for every index the kernel can form."""
    sizes: dict[int, tuple[DType, int]] = {}
    for u in ast.toposort():
        if u.op in (Ops.LOAD, Ops.STORE):
            buf, index = u.src[0], u.src[1]
            old = sizes.get(buf.arg, (buf.dtype, 1))[1]
            sizes[buf.arg] = (buf.dtype, max(old, int(index.vmax) + 1))
    return sizes


def stored_buffers(ast: UOp) -> list[int]:
    """The indices of the buffers the kernel writes (its outputs: 0, and more for a kernel of several outputs)."""
    return sorted({u.src[0].arg for u in ast.toposort() if u.op is Ops.STORE and u.src[0].op is Ops.DEFINE_GLOBAL})


def random_inputs(ast: UOp, seed: int = 0) -> list[tuple[DType, np.ndarray]]:
    """Contents for every buffer of the kernel: random values, the outputs poisoned (NaN, or -1s) so that an element
    a candidate forgets to write is caught; the output of a scatter (a STORE arg=ADD) zeros, as its schedule's fill
    kernel leaves it (candidates then differ only by the order of the adds: float rounding, within `_agrees`)."""
    rng = np.random.default_rng(seed)
    arrays = []
    outputs = stored_buffers(ast)
    adds = {u.src[0].arg for u in ast.toposort() if u.op is Ops.STORE and u.arg is Ops.ADD}
    for index, (dtype, size) in sorted(buffer_sizes(ast).items()):
        if index in adds:  # a scatter adds into its output, which its schedule fills with zeros first
            data = np.zeros(size, dtype.np)
        elif index in outputs:
            data = np.full(size, np.nan if dtype.is_float else -1).astype(dtype.np)
        elif dtype.is_float:
            data = rng.standard_normal(size).astype(dtype.np)
        elif dtype.is_bool:
            data = rng.random(size) < 0.5
        else:
            data = rng.integers(0, 4, size).astype(dtype.np)
        arrays.append((dtype, np.asarray(data)))
    return arrays


@dataclass
class Candidate:
    opts: list[Opt]
    spec: ProgramSpec
    seconds: float = float("inf")


def run_program(dev: Compiled, spec: ProgramSpec, binary: bytes, inputs: list[tuple[DType, np.ndarray]],
                outputs: Sequence[int] = (0,), best: float = float("inf"),
                vals: tuple[int, ...] | None = None) -> tuple[float, list[np.ndarray]]:
    """Run a compiled candidate on fresh copies of `inputs`: (best time of a few runs, what the first run wrote to
    the buffers numbered `outputs`). A first run over SLOW x `best` is the only one. `vals`: the kernel's int
    parameters (`spec.vars`: its lifted constants' bits; a kernel with symbolic sizes is not run here)."""
    if vals is None and spec.vars:
        raise ValueError(f"kernel {spec.name} takes the parameters {spec.vars}: pass their values as `vals`")
    program = dev.program(spec.name, binary)
    bufs = [Buffer(dev.name, a.size, dtype).copyin(a) for dtype, a in inputs]
    handles = [b.handle for b in bufs]
    kwargs: dict[str, Any] = {"global_size": spec.global_size, "local_size": spec.local_size, "work": spec.work,
                              "wait": True, "vals": vals or ()}
    first = program(*handles, **kwargs)
    out = [bufs[i].numpy() for i in outputs]
    runs = 1 if first > SLOW * best else TIMING_RUNS
    return min([first, *(program(*handles, **kwargs) for _ in range(runs - 1))]), out


def test_values(spec: ProgramSpec) -> tuple[int, ...]:
    """Values for a candidate's lifted constants (uop/params.py; BEAM has the AST, not the values): 1.5 for each,
    the same for every candidate of one kernel, so they still compute the same outputs."""
    return tuple(float_bits(1.5) for name in spec.vars if name.startswith(PARAM_PREFIX))


def _agrees(outs: list[np.ndarray], references: list[np.ndarray]) -> bool:
    return all(_agrees_one(out, reference) for out, reference in zip(outs, references))


def _agrees_one(out: np.ndarray, reference: np.ndarray) -> bool:
    if out.dtype.kind == "f":
        scale = max(1.0, float(np.nanmax(np.abs(reference), initial=0.0)))
        # ALLOW_TF32: the reference (no opts) may be a tf32 kernel and a candidate an exact one, or the other way
        rtol, atol = (1e-2, 3e-3) if ALLOW_TF32 else (1e-3, 1e-4)
        return bool(np.allclose(out, reference, rtol=rtol, atol=atol * scale, equal_nan=True))
    return bool(np.array_equal(out, reference))


def _cache_path(ast: UOp, dev: Compiled, width: int) -> Any:
    """The disk cache's file for `ast`'s search: keyed by the whole graph, every node (`repr(ast)` abbreviates a graph
    of more than 40 nodes to its root and node count, so kernels of one size shared a file and got each other's opts:
    a KernelOptError, or another kernel's tiling)."""
    flags = f"\nflags {codegen_flags()}" if any(codegen_flags()) else ""  # (the default keeps its old keys)
    # a renderer with optimisation levels: searched since OPTLEVEL was added (winners from before it are not reused),
    # and the heuristic's candidate depends on CPU_OPT_LEVEL
    if dev.renderer.opt_levels:
        flags += f"\nopt levels {dev.renderer.opt_levels} heuristic {int(CPU_OPT_LEVEL)}"
    graph = pretty(ast, max_nodes=len(ast.toposort()))
    key = hashlib.sha256(f"{dev.name}\n{dev.compiler.cache_key}\n{width}{flags}\n{graph}".encode()).hexdigest()
    return cache_dir() / "beam" / f"{key}.json"


def beam_search(ast: UOp, device: str, width: int) -> list[Opt]:
    dev = Device[device]
    if any(u.op is Ops.DEFINE_VAR and not is_const_param(u) for u in ast.toposort()):  # symbolic sizes: no one launch
        return hand_coded_optimizations(Kernel(kernel_ast(ast, dev.renderer), dev.renderer))
    path = _cache_path(ast, dev, width)
    if CACHELEVEL >= 1 and not IGNORE_BEAM_CACHE and path.exists():
        try:
            return [Opt(OptOps[op], axis, amount) for op, axis, amount in json.loads(path.read_text())]
        except (OSError, ValueError, KeyError, TypeError):  # cut short or damaged: searched (and written) again
            pass
    best = _search(ast, dev, width)
    if CACHELEVEL >= 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps([[o.op.name, o.axis, o.amount] for o in best]).encode())
    return best


def _search(ast: UOp, dev: Compiled, width: int) -> list[Opt]:
    deadline = time.monotonic() + int(BEAM_BUDGET)
    inputs, outputs = random_inputs(ast), stored_buffers(ast)
    base = get_program(ast, dev.renderer, [])
    reference_time, reference = run_program(dev, base, dev.compiler.compile(base.source), inputs, outputs,
                                             vals=test_values(base))
    start = Kernel(kernel_ast(ast, dev.renderer), dev.renderer)
    beam = [Candidate([], base, reference_time)]
    seen = {base.source}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        fresh = _heuristic_candidate(start, ast, dev, seen)
        heuristic = fresh[0] if fresh else beam[0]
        seeding = bool(fresh)  # a first round of the heuristic's kernel alone, then MAX_ROUNDS of actions
        fresh = fresh or _extend(beam, start, ast, dev, seen)
        for _ in range(MAX_ROUNDS + seeding):
            if not fresh or time.monotonic() > deadline:
                break
            _time_candidates(fresh, beam[0].seconds, pool, dev, inputs, outputs, reference, deadline)
            ranked = sorted([*beam, *(c for c in fresh if c.seconds < float("inf"))], key=lambda c: c.seconds)[:width]
            if ranked[0] is beam[0] and not seeding:
                break
            beam, seeding = ranked, False
            fresh = _extend(beam, start, ast, dev, seen)
    if beam[0] is not heuristic and heuristic.seconds < float("inf"):
        beam[0] = _confirmed(beam[0], heuristic, dev, inputs, outputs)
    if DEBUG >= 1:
        spent = "" if time.monotonic() <= deadline else f" (BEAM_BUDGET of {int(BEAM_BUDGET)} s spent)"
        print(f"BEAM {base.name}: {reference_time * 1e6:.1f} us -> {beam[0].seconds * 1e6:.1f} us with "
              f"{beam[0].opts}{spent}")
    return beam[0].opts


def _confirmed(winner: Candidate, heuristic: Candidate, dev: Compiled, inputs: list[tuple[DType, np.ndarray]],
               outputs: list[int]) -> Candidate:
    """The search's winner, or the heuristic's kernel when the winner is not faster in CONFIRM_ROUNDS more rounds of
    the two run in turn (best of each): on a loaded machine a candidate's few timed runs can catch a quiet moment
    the heuristic's did not, and BEAM then kept a kernel slower than the heuristic's (softmax of rows of 1000:
    0.63 ms against 0.38, a row sum of 77 0.35 against 0.20, at load average 20-130)."""
    programs = [(c, dev.compiler.compile(c.spec.source)) for c in (winner, heuristic)]
    best = {id(c): float("inf") for c, _ in programs}  # (the search's own times left out: one of them was lucky)
    for _ in range(CONFIRM_ROUNDS):
        for cand, binary in programs:
            seconds, _ = run_program(dev, cand.spec, binary, inputs, outputs, vals=test_values(cand.spec))
            best[id(cand)] = min(best[id(cand)], seconds)
    return winner if best[id(winner)] < best[id(heuristic)] else heuristic


def _heuristic_candidate(start: Kernel, ast: UOp, dev: Compiled, seen: set[str]) -> list[Candidate]:
    """The hand-written heuristic's kernel, the search's first candidate (none when it is the unoptimised one)."""
    opts = hand_coded_optimizations(start.copy())
    spec = get_program(ast, dev.renderer, opts)
    if spec.source in seen:
        return []
    seen.add(spec.source)
    return [Candidate(list(opts), spec)]


def _time_candidates(fresh: list[Candidate], best: float, pool: ThreadPoolExecutor, dev: Compiled,
                     inputs: list[tuple[DType, np.ndarray]], outputs: list[int], reference: list[np.ndarray],
                     deadline: float) -> None:
    """Compile the candidates in parallel, then run, verify and time each until the deadline: a candidate that
    computes something else than the unoptimised kernel, or is not timed, keeps an infinite time."""
    binaries = pool.map(_compile_or_none(dev), (c.spec.source for c in fresh))
    for cand, binary in zip(fresh, binaries):
        if binary is None or time.monotonic() > deadline:
            continue
        seconds, out = run_program(dev, cand.spec, binary, inputs, outputs, best, test_values(cand.spec))
        if _agrees(out, reference):
            cand.seconds = seconds
            best = min(best, seconds)
        elif DEBUG >= 1:
            print(f"BEAM: {cand.opts} computes a different result; dropped")


def _extend(beam: list[Candidate], start: Kernel, ast: UOp, dev: Compiled, seen: set[str]) -> list[Candidate]:
    fresh = []
    for cand in beam:
        k = start.copy().apply_opts(cand.opts)
        for action in actions(k):
            try:
                k.copy().apply_opt(action)
            except KernelOptError:
                continue
            spec = get_program(ast, dev.renderer, [*cand.opts, action])
            if spec.source not in seen:
                seen.add(spec.source)
                fresh.append(Candidate([*cand.opts, action], spec))
    return fresh


def _compile_or_none(dev: Compiled) -> Callable[[str], bytes | None]:
    def compile_one(source: str) -> bytes | None:
        try:
            return dev.compiler.compile(source)
        except RuntimeError:
            return None
    return compile_one
