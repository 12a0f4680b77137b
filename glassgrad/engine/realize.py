"""Running a schedule: compile its new kernels (several at once), allocate buffers, launch, and count.

In: `ScheduleItem`s from the scheduler. Out: filled buffers. `GlobalCounters` adds up kernels, FLOPs, bytes and
time; `DEBUG=2` prints a line per kernel (name, size, time, GFLOP/s, GB/s), `DEBUG=4` its source.
"""
from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, ClassVar

from glassgrad.codegen import ProgramSpec, get_program
from glassgrad.codegen.opt.search import beam_search
from glassgrad.device import Buffer, Device
from glassgrad.engine.collectives import allreduce
from glassgrad.helpers import BEAM, DEBUG, NOOPT, TIMING, getenv, kernel_flags
from glassgrad.runtime.cpu_guard import BufferGuardError
from glassgrad.schedule import CachedSchedule, ScheduleItem, find_schedule, view_versions
from glassgrad.uop.ops import OP_ALLREDUCE, OP_COPY, Ops, UOp
from glassgrad.uop.params import size_vars
from glassgrad.uop.sint import sint_eval


class _Counters(type):
    @property
    def mem_used(cls) -> int:
        """Bytes the buffers of every opened device hold now (tinygrad's `GlobalCounters.mem_used`; hlb_cifar10
        prints it): the allocators' `live_bytes`, blocks kept for reuse not counted."""
        return sum(dev.allocator.live_bytes for dev in Device._devices.values())


class GlobalCounters(metaclass=_Counters):
    """Totals since the last `reset()`: kernels launched, FLOPs, bytes moved, seconds spent in kernels; and
    `mem_used`, the bytes the devices' buffers hold now."""
    kernel_count: ClassVar[int] = 0
    global_ops: ClassVar[int] = 0
    global_mem: ClassVar[int] = 0
    time_sum_s: ClassVar[float] = 0.0

    @staticmethod
    def reset() -> None:
        GlobalCounters.kernel_count = GlobalCounters.global_ops = GlobalCounters.global_mem = 0
        GlobalCounters.time_sum_s = 0.0


@dataclass
class CompiledKernel:
    spec: ProgramSpec
    program: Any
    # (flops, work) of every launch, for a kernel without Variables (symbolic sizes): evaluated once, not per launch
    fixed: tuple[int, int] | None = field(init=False)

    def __post_init__(self) -> None:
        fixed = not size_vars(self.spec.vars)  # (lifted constants are parameters, not sizes)
        self.fixed = (sint_eval(self.spec.flops), sint_eval(self.spec.work)) if fixed else None


KernelKey = tuple[str, UOp, tuple[int, ...]]
_kernel_cache: dict[KernelKey, CompiledKernel] = {}  # (device, ast, the codegen flags it was built under)
NOT_KERNELS = (Ops.COPY, Ops.ALLREDUCE)  # schedule items the runtime moves data for, without a compiled kernel


def _render(device: str, ast: UOp) -> ProgramSpec:
    opts = beam_search(ast, device, int(BEAM)) if BEAM and not NOOPT else None
    spec = get_program(ast, Device[device].renderer, opts)
    if DEBUG >= 4:
        print(spec.source)
    return spec


def kernel_key(device: str, ast: UOp) -> KernelKey:
    """The kernel cache's key: a kernel built with other codegen flags (ALLOW_TF32) is another kernel."""
    return (device, ast, kernel_flags())


def compile_kernel(device: str, ast: UOp) -> CompiledKernel:
    key = kernel_key(device, ast)
    if key not in _kernel_cache:
        spec = _render(device, ast)
        dev = Device[device]
        _kernel_cache[key] = CompiledKernel(spec, dev.program(spec.name, dev.compiler.compile_cached(spec.source)))
    return _kernel_cache[key]


COMPILE_THREADS = max(1, getenv("COMPILE_THREADS", os.cpu_count() or 1))
MAX_BATCH = 16  # kernels per compiler run: more would leave the pool idle while the codegen catches up
_compile_pool: tuple[int, ThreadPoolExecutor] | None = None  # (its thread count, the pool)


def _pool() -> ThreadPoolExecutor:
    """The compile threads: `COMPILE_THREADS` of them (made again if that setting changed)."""
    global _compile_pool
    if _compile_pool is None or _compile_pool[0] != COMPILE_THREADS:
        if _compile_pool is not None:
            _compile_pool[1].shutdown(wait=True)
        pool = ThreadPoolExecutor(max_workers=COMPILE_THREADS, thread_name_prefix="glassgrad-compile")
        _compile_pool = (COMPILE_THREADS, pool)
    return _compile_pool[1]


def _forget_compile_pool() -> None:
    """In a forked child: the parent's compile threads do not exist here (a future given to their pool would never
    finish, and the child hang), so the next compile makes a new pool."""
    global _compile_pool
    _compile_pool = None


os.register_at_fork(after_in_child=_forget_compile_pool)


def _distinct_name(spec: ProgramSpec, taken: set[str], device: str) -> ProgramSpec:
    """`spec`, or the same kernel rendered under a name not in `taken`: its name with a hash of its source added,
    so the new source (the compile cache's key) depends on the kernel alone, not on what else is in its batch."""
    if spec.name not in taken:
        return spec
    name = f"{spec.name}_{hashlib.sha256(spec.source.encode()).hexdigest()[:8]}"
    return spec.renamed(name, Device[device].renderer)


@dataclass
class _Job:
    """One compile on the pool: the sources it builds (for one device) and their binaries to come."""
    device: str
    sources: list[str]
    binaries: Future[list[bytes]]


class Compiles:
    """The compiles `compile_schedule` started. `ready(item)` waits for the job building the item's kernel and puts
    the kernels of that job into the kernel cache; `finish()` waits for the rest (dropping those not started yet)."""

    def __init__(self) -> None:
        self.kernels: dict[tuple[str, str], list[tuple[UOp, ProgramSpec]]] = {}  # (device, source) -> its kernels
        self.source_of: dict[tuple[str, UOp], str] = {}  # (device, ast) of a kernel not in the kernel cache yet
        self.jobs: dict[tuple[str, str], _Job] = {}  # (device, source) -> the job building it

    def ready(self, item: ScheduleItem) -> None:
        key = (item.bufs[0].device, item.ast)
        if item.ast.op in NOT_KERNELS or key not in self.source_of:
            return  # compiled before, or (a schedule's only new kernel) compiled in place when it runs
        job = self.jobs[(key[0], self.source_of[key])]
        for source, binary in zip(job.sources, job.binaries.result()):
            for ast, spec in self.kernels[(job.device, source)]:
                program = Device[job.device].program(spec.name, binary)
                _kernel_cache[kernel_key(job.device, ast)] = CompiledKernel(spec, program)
                del self.source_of[(job.device, ast)]

    def finish(self) -> None:
        if not self.jobs:
            return
        futures = [job.binaries for job in self.jobs.values()]
        for future in futures:
            future.cancel()  # only those still queued are cancelled
        wait(futures)


_NO_COMPILES = Compiles()  # what compile_schedule returns when it starts nothing (never changed: it has no jobs)


def compile_schedule(schedule: list[ScheduleItem]) -> Compiles:
    """Start compiling every kernel of `schedule` that is not compiled yet, several at once.

    Codegen is Python and runs here, one kernel after another. The rendered sources go, in batches, to a pool of
    `COMPILE_THREADS` threads (default: one per core), so the compilers run side by side and alongside the codegen
    of the kernels after them (with one thread too), and (see `run_schedule`) alongside the kernels of the batches
    already built. A batch is one compiler run where the backend can build several kernels in one binary
    (`Compiler.compile_batch`: the C compiler), so process start-up and linking are paid once per batch. Kernels
    that render to the same source are compiled once. Kernels in a batch need distinct names: a kernel whose name is
    taken in its batch is renamed (`_distinct_name`). A schedule with one new kernel is left to `compile_kernel`.
    If the codegen fails, the compiles already started are finished (the queued ones dropped) before the error is
    raised, so no compiler runs on after this returns."""
    todo: dict[tuple[str, UOp], None] = {}
    flags = kernel_flags()
    for item in schedule:  # (every realize: kernel_key's keys, made inline)
        if item.ast.op not in NOT_KERNELS and (item.bufs[0].device, item.ast, flags) not in _kernel_cache:
            todo[(item.bufs[0].device, item.ast)] = None
    if len(todo) < 2:
        return _NO_COMPILES
    compiles = Compiles()
    pool = _pool()
    batch_size = min(MAX_BATCH, -(-len(todo) // COMPILE_THREADS))  # enough batches for every thread
    batches: dict[str, list[ProgramSpec]] = {}  # device -> the batch being filled

    def submit(device: str) -> None:
        sources = [spec.source for spec in batches.pop(device)]
        job = _Job(device, sources, pool.submit(Device[device].compiler.compile_cached_many, sources))
        compiles.jobs.update(((device, source), job) for source in sources)

    try:
        for device, ast in todo:
            spec = _render(device, ast)
            if (device, spec.source) not in compiles.kernels and Device[device].compiler.batches:
                spec = _distinct_name(spec, {other.name for other in batches.get(device, [])}, device)
            compiles.source_of[(device, ast)] = spec.source
            if (device, spec.source) in compiles.kernels:
                compiles.kernels[(device, spec.source)].append((ast, spec))
                continue
            compiles.kernels[(device, spec.source)] = [(ast, spec)]
            batches.setdefault(device, []).append(spec)
            if len(batches[device]) == (batch_size if Device[device].compiler.batches else 1):
                submit(device)
        for device in list(batches):
            submit(device)
    except BaseException:
        compiles.finish()
        raise
    return compiles


def count_launch(name: str, seconds: float, flops: int, nbytes: int, extra: str = "", launches: int = 1,
                 work: int | None = None) -> None:
    """Add one launch (a kernel or a copy; or a graph of `launches` kernels) to `GlobalCounters`; `DEBUG=2` prints
    its line (`work`: a kernel's loop iterations, printed as its size)."""
    GlobalCounters.kernel_count += launches
    GlobalCounters.global_ops += flops
    GlobalCounters.global_mem += nbytes
    GlobalCounters.time_sum_s += seconds
    if DEBUG.value >= 2:
        if work is not None:
            extra = f"size {work}"
        print(f"*** {GlobalCounters.kernel_count:4d} {name:<32s} {extra:<20s} {seconds * 1e6:9.2f} us "
              f"{flops / max(seconds, 1e-9) / 1e9:8.2f} GFLOP/s {nbytes / max(seconds, 1e-9) / 1e9:8.2f} GB/s")


def run_copy(dest: Buffer, src: Buffer) -> None:
    """Copy between buffers: device to device when both backends can (CUDA -> CUDA), else through the host."""
    dest_alloc, src_alloc = Device[dest.device].allocator, Device[src.device].allocator
    start = time.perf_counter()
    if type(dest_alloc) is type(src_alloc) and hasattr(dest_alloc, "copy_device"):
        dest_alloc.copy_device(dest.handle, src.handle, dest.nbytes, src_allocator=src_alloc)
        if DEBUG >= 2:
            Device[dest.device].synchronize()
    else:
        dest.copyin(src.numpy())
    seconds = time.perf_counter() - start
    count_launch(f"copy {src.device}->{dest.device}", seconds, 0, dest.nbytes, f"{dest.nbytes} bytes")


def run_allreduce(op: Ops, bufs: Sequence[Buffer]) -> None:
    """An ALLREDUCE item: `bufs` is the n outputs, then the n inputs (one of each per device)."""
    start = time.perf_counter()
    n = len(bufs) // 2
    allreduce(op, list(bufs[n:]), list(bufs[:n]))
    nbytes = sum(b.nbytes for b in bufs)
    count_launch(f"allreduce {op.name.lower()} x{n}", time.perf_counter() - start, 0, nbytes,
                 f"{bufs[0].nbytes} bytes")


# While a TinyJit captures a step, it listens here: every item run is passed to each hook (glassgrad/engine/jit.py).
capture_hooks: list[Callable[[ScheduleItem], None]] = []


def run_schedule(schedule: list[ScheduleItem]) -> None:
    """Run the items in order. Each kernel runs as soon as its batch is compiled, while later batches still compile.
    Whatever happens, every compile started here has finished when this returns or raises; on an exception (a
    Ctrl-C, a failed compile) the writes of the items not run go on it (`note_unfinished`)."""
    compiles = compile_schedule(schedule)
    done = 0
    try:
        for item in schedule:
            if compiles.jobs:
                compiles.ready(item)
            run_item(item)
            for buf, version in item.writes:
                buf.version = max(buf.version, version)
            done += 1
            for hook in capture_hooks:
                hook(item)
    except BaseException as e:
        note_unfinished(e, [item.writes for item in schedule], done)
        raise
    finally:
        compiles.finish()


def note_unfinished(e: BaseException, writes: list[tuple[tuple[Buffer, int], ...]], done: int) -> None:
    """`e` was raised while running items whose writes are `writes`, after `done` of them finished. The item then in
    progress finished too if its kernel call had returned (`e.glassgrad_ran`, set by the backend: a Ctrl-C is
    raised after the C call it arrived during): its versions are recorded here. The writes of the items that did
    not run go on `e` as `glassgrad_unwritten`, for `schedule_and_run` to keep the results that were computed."""
    if getattr(e, "glassgrad_ran", False) and done < len(writes):
        for buf, version in writes[done]:
            buf.version = max(buf.version, version)
        done += 1
    e.glassgrad_unwritten = {w for item_writes in writes[done:] for w in item_writes}  # type: ignore[attr-defined]


def _keep_finished(e: BaseException, views: dict[UOp, UOp]) -> None:
    """On `e` (see `note_unfinished`): `glassgrad_views`, the views of `views` whose buffers were written (a
    realize records those: a later one reads them instead of recomputing them from versions overwritten since)."""
    unwritten = getattr(e, "glassgrad_unwritten", None)
    if unwritten is not None:
        e.glassgrad_views = {node: view for node, view in views.items()  # type: ignore[attr-defined]
                             if unwritten.isdisjoint(view_versions(view))}


def run_item(item: ScheduleItem) -> None:
    run_ast(item.ast, item.bufs, item.var_vals)


def run_ast(ast: UOp, bufs: Sequence[Buffer], var_vals: dict[str, int], kernel: CompiledKernel | None = None) -> None:
    """Run one item's work on `bufs`: a copy, an all-reduce, or a kernel (`kernel` when the caller has it, else
    from the kernel cache, compiled on a miss)."""
    op = ast.op
    if op is OP_COPY:
        run_copy(*bufs)
        return
    if op is OP_ALLREDUCE:
        run_allreduce(ast.arg[0], bufs)
        return
    if kernel is None:
        device = bufs[0].device
        kernel = _kernel_cache.get((device, ast, kernel_flags())) or compile_kernel(device, ast)  # (kernel_key's key)
    launch(kernel, bufs, var_vals)


def launch(kernel: CompiledKernel, bufs: Sequence[Buffer], var_vals: dict[str, int], nbytes: int = -1) -> None:
    """Run a compiled kernel on `bufs` (output first) with the Variables' values, and count it (`nbytes`: the
    buffers' bytes, where the caller knows them: a cached schedule's template)."""
    # (every launch: a buffer's handle is nearly always made already, read without the property's call)
    handles = [h if (h := b._handle) is not None else b.handle for b in bufs]
    vals: tuple[int, ...] = ()
    if kernel.fixed is not None:  # (nearly every kernel: no Variables, nothing to evaluate per launch)
        spec, (flops, work) = kernel.spec, kernel.fixed
        if spec.vars:  # lifted constants (uop/params.py)
            vals = tuple(var_vals[name] for name in spec.vars)
    else:
        spec = kernel.spec.at(var_vals)  # symbolic sizes: this launch's
        vals = tuple(var_vals[name] for name in spec.vars)
        flops, work = sint_eval(spec.flops), sint_eval(spec.work)
    debug = DEBUG.value
    try:
        seconds = kernel.program(*handles, global_size=spec.global_size, local_size=spec.local_size, vals=vals,
                                 work=work, wait=debug >= 2 or bool(TIMING.value))
    except BufferGuardError as e:  # (CPU_BUFFER_GUARD=1: a write outside a buffer; say which kernel and buffer)
        buf = bufs[e.argument]
        e.attach(spec.source, repr(buf) + (f" in the memory of {buf.block!r}" if buf.block else ""))
        raise
    if nbytes < 0:
        nbytes = 0
        for b in bufs:
            nbytes += b.size * b.dtype.itemsize
    if debug >= 2:
        count_launch(spec.name, seconds or 0.0, flops, nbytes, "", work=work)
    else:  # (count_launch without its DEBUG line: every launch)
        GlobalCounters.kernel_count += 1
        GlobalCounters.global_ops += flops
        GlobalCounters.global_mem += nbytes
        GlobalCounters.time_sum_s += seconds or 0.0


def schedule_and_run(outs: list[UOp]) -> dict[UOp, UOp]:
    """Schedule the graph of `outs` and run it; returns `create_schedule`'s views. A graph whose structure the
    schedule cache holds is replayed (`replay`: its template's kernels launched on this graph's buffers, without
    ScheduleItems), unless something watches the items: a TinyJit capture (`capture_hooks`), `DEBUG>=2` or `TIMING`
    (which `run_schedule` serves)."""
    found = find_schedule(outs)
    if isinstance(found, CachedSchedule):
        if not capture_hooks and DEBUG.value < 2 and not TIMING.value and \
                (views := replay(found)) is not None:
            return views
        found = found.instantiate()
    schedule, views = found
    try:
        run_schedule(schedule)
    except BaseException as e:
        _keep_finished(e, views)
        raise
    return views


def replay(hit: CachedSchedule) -> dict[UOp, UOp] | None:
    """Run a cache hit as `run_schedule` runs its instantiated items, in the same order with the same buffers,
    versions and counts, but from the template: each item's kernel launched on the buffers in its references, each
    write's version recorded on its buffer. Returns the views `instantiate` would, or None (nothing run) when a
    kernel is not in the kernel cache (cleared, or other codegen flags): `run_schedule` then compiles it."""
    template, flags = hit.template, kernel_flags()
    bufs, base_version = template.bind(hit.key)
    kernels: list[CompiledKernel | None] = []
    for ast, refs, _, _, _ in template.items:
        if ast.op in NOT_KERNELS:
            kernels.append(None)
        elif (kernel := _kernel_cache.get((bufs[refs[0]].device, ast, flags))) is not None:
            kernels.append(kernel)
        else:
            return None
    values = hit.key.values()
    lifted = bool(template.param_slots)  # (else each item's var_vals are the template's own: no call per item)
    item_bytes = template.item_bytes or (-1,) * len(template.items)
    done = 0
    try:
        for i, ((ast, refs, _, writes, var_vals), kernel) in enumerate(zip(template.items, kernels)):
            item_bufs = [bufs[r] for r in refs]
            if lifted:
                var_vals = template.var_vals(i, values)
            if kernel is not None:  # (run_ast's kernel case, without its call)
                launch(kernel, item_bufs, var_vals, item_bytes[i])
            else:
                run_ast(ast, item_bufs, var_vals)
            for ref, offset in writes:
                buf, version = bufs[ref], base_version[ref] + offset
                if buf.version < version:
                    buf.version = version
            done += 1
    except BaseException as e:
        note_unfinished(e, [tuple((bufs[r], base_version[r] + k) for r, k in item[3]) for item in template.items], done)
        _keep_finished(e, template.views_for(bufs, base_version, hit.nodes, hit.outs))
        raise
    return template.views_for(bufs, base_version, hit.nodes, hit.outs)
