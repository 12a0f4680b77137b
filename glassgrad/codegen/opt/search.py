"""`BEAM=n`: search the legal opts of a kernel by timing candidates on the device, keep the fastest, cache it.

In: a kernel AST and a device name. Out: the list of `Opt`s to apply. Each round extends every kernel of the beam
by one more legal action, compiles the new candidates in parallel (the C compiler runs in subprocesses), runs each
on random inputs, drops any whose output differs from the unoptimised kernel's on the same inputs, times the rest
(best of a few runs) and keeps the `n` fastest; it stops when a round finds nothing faster. The winner is written
to `<cache dir>/beam/<hash of device, compiler, width, kernel>.json`, so the next run pays nothing
(`IGNORE_BEAM_CACHE=1`, as in tinygrad: search again, and write the new winner).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from glassgrad.codegen import ProgramSpec, get_program, optimize_ast
from glassgrad.codegen.opt import KernelOptError, Opt, OptOps
from glassgrad.codegen.opt.heuristic import hand_coded_optimizations
from glassgrad.codegen.opt.kernel import Kernel
from glassgrad.device import Buffer, Compiled, Device
from glassgrad.dtype import DType
from glassgrad.helpers import ALLOW_TF32, CACHELEVEL, DEBUG, IGNORE_BEAM_CACHE, atomic_write, cache_dir, kernel_flags
from glassgrad.uop.ops import Ops, UOp

UPCAST_AMOUNTS = (0, 2, 3, 4, 8, 16, 32)
UNROLL_AMOUNTS = (0, 2, 4, 8)
LOCAL_AMOUNTS = (0, 2, 4, 8, 16, 32, 64, 128, 256)  # threads of a work-group along an output axis (GPUs)
GROUP_AMOUNTS = (0, 16, 32, 64, 128, 256)            # threads sharing a reduce axis (GPUs)
PADTO_AMOUNTS = (4, 8, 16)  # an output axis padded to a multiple of a vector width, for the UPCAST after it (CPUs)
TIMING_RUNS = 3
MAX_ROUNDS = 6


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
    a candidate forgets to write is caught."""
    rng = np.random.default_rng(seed)
    arrays = []
    outputs = stored_buffers(ast)
    for index, (dtype, size) in sorted(buffer_sizes(ast).items()):
        if index in outputs:
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
                outputs: Sequence[int] = (0,)) -> tuple[float, list[np.ndarray]]:
    """Run a compiled candidate on fresh copies of `inputs`: (best time of a few runs, what the first run wrote to
    the buffers numbered `outputs`)."""
    program = dev.program(spec.name, binary)
    bufs = [Buffer(dev.name, a.size, dtype).copyin(a) for dtype, a in inputs]
    handles = [b.handle for b in bufs]
    kwargs: dict[str, Any] = {"global_size": spec.global_size, "local_size": spec.local_size, "work": spec.work,
                              "wait": True}
    first = program(*handles, **kwargs)
    out = [bufs[i].numpy() for i in outputs]
    return min([first, *(program(*handles, **kwargs) for _ in range(TIMING_RUNS - 1))]), out


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
    flags = f"\nflags {kernel_flags()}" if any(kernel_flags()) else ""  # (the default keeps its old keys)
    key = hashlib.sha256(f"{dev.name}\n{dev.compiler.cache_key}\n{width}{flags}\n{ast}".encode()).hexdigest()
    return cache_dir() / "beam" / f"{key}.json"


def beam_search(ast: UOp, device: str, width: int) -> list[Opt]:
    dev = Device[device]
    if any(u.op is Ops.DEFINE_VAR for u in ast.toposort()):  # symbolic sizes: no one launch to time
        return hand_coded_optimizations(Kernel(optimize_ast(ast, dev.renderer), dev.renderer))
    path = _cache_path(ast, dev, width)
    if CACHELEVEL >= 1 and not IGNORE_BEAM_CACHE and path.exists():
        return [Opt(OptOps[op], axis, amount) for op, axis, amount in json.loads(path.read_text())]
    best = _search(ast, dev, width)
    if CACHELEVEL >= 1:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps([[o.op.name, o.axis, o.amount] for o in best]).encode())
    return best


def _search(ast: UOp, dev: Compiled, width: int) -> list[Opt]:
    inputs, outputs = random_inputs(ast), stored_buffers(ast)
    base = get_program(ast, dev.renderer, [])
    reference_time, reference = run_program(dev, base, dev.compiler.compile(base.source), inputs, outputs)
    start = Kernel(optimize_ast(ast, dev.renderer), dev.renderer)
    beam = [Candidate([], base, reference_time)]
    seen = {base.source}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for _ in range(MAX_ROUNDS):
            fresh = _extend(beam, start, ast, dev, seen)
            binaries = list(pool.map(_compile_or_none(dev), (c.spec.source for c in fresh)))
            for cand, binary in zip(fresh, binaries):
                if binary is None:
                    continue
                seconds, out = run_program(dev, cand.spec, binary, inputs, outputs)
                if _agrees(out, reference):
                    cand.seconds = seconds
                elif DEBUG >= 1:
                    print(f"BEAM: {cand.opts} computes a different result; dropped")
            ranked = sorted([*beam, *(c for c in fresh if c.seconds < float("inf"))], key=lambda c: c.seconds)[:width]
            if ranked[0] is beam[0] or not fresh:
                break
            beam = ranked
    if DEBUG >= 1:
        print(f"BEAM {base.name}: {reference_time * 1e6:.1f} us -> {beam[0].seconds * 1e6:.1f} us with {beam[0].opts}")
    return beam[0].opts


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
