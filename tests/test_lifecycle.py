"""Process and thread lifecycles that real programs create: forked children (os.fork, multiprocessing fork and spawn
pools, DataLoader-style workers), several Python threads, interrupts and exceptions mid-step, long loops, several
processes sharing the compile cache. Each scenario that could hang runs in a subprocess with a timeout, so a
regression fails instead of hanging the suite."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from glassgrad import Device

ROOT = pathlib.Path(__file__).resolve().parent.parent
forks = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
cpu_only = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the CPU backend's pools")


def run_script(prelude: str, code: str = "", timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Run `prelude` and `code` (each dedented) in a fresh interpreter (this checkout's glassgrad, on the CPU unless
    `env` says otherwise); its stdout. Fails on a non-zero exit, and on a hang (after `timeout` seconds)."""
    # (on the CPU backend, whatever DEV this suite runs under: a forked child cannot use CUDA, by design)
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "DEV": "CPU", **(env or {})}
    with tempfile.TemporaryDirectory() as tmp:  # (a file, not -c: a spawned child imports the main module)
        script = pathlib.Path(tmp) / "scenario.py"
        script.write_text(textwrap.dedent(prelude) + "\n" + textwrap.dedent(code))
        try:
            proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                                  env=environ, cwd=ROOT)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the scenario hung (no exit within {timeout} s); its output so far:\n{e.stdout!r}\n"
                        f"{e.stderr!r}")
    assert proc.returncode == 0, f"the scenario failed (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


# a child's wait: a hung child is killed after this many seconds and counts as a failure
CHILD = """
import os, signal, sys, time
import numpy as np
from glassgrad import Tensor

def wait_child(pid, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "hung"

def in_child(fn):
    pid = os.fork()
    if pid == 0:
        try:
            fn()
            code = 0
        except BaseException:
            import traceback; traceback.print_exc()
            code = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(code)
    return wait_child(pid)

def graph(x):  # several kernels (a schedule with two or more new kernels goes to the compile threads)
    t = Tensor(x)
    return (((t * 3 + 1).exp().log() @ t).sum(axis=0) + (t.T @ t).max(axis=1)).numpy()

def expected(x):
    return (np.log(np.exp(x * 3 + 1)) @ x).sum(axis=0) + (x.T @ x).max(axis=1)
"""


@forks
def test_fork_child_compiles_and_runs_new_kernels() -> None:
    """The parent compiled kernels on its compile threads; a forked child compiles new ones (the parent's threads do
    not exist there: it hung forever waiting for them)."""
    out = run_script(CHILD, """
    from glassgrad.engine import realize
    a = np.arange(16, dtype=np.float32).reshape(4, 4) / 16
    np.testing.assert_allclose(graph(a), expected(a), rtol=1e-5)
    assert realize._compile_pool is not None  # (the parent's compile threads started)
    def child():
        b = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
        np.testing.assert_allclose(graph(b), expected(b), rtol=1e-5)  # new kernels: compiled in the child
        np.testing.assert_allclose(graph(a), expected(a), rtol=1e-5)  # the parent's kernels: cached
    print("child", in_child(child), "twice", in_child(lambda: (child(), child())))
    np.testing.assert_allclose(graph(a * 2), expected(a * 2), rtol=1e-5)  # and the parent goes on
    """)
    assert out.split() == ["child", "0", "twice", "0"]


@forks
@cpu_only
def test_fork_child_restarts_the_cpu_thread_pool() -> None:
    """A kernel big enough for two threads, run in the parent (the C pool's worker starts) and then in a forked child:
    the child starts a worker of its own (the state it inherited said one was running, so it ran on one thread) and
    computes the same values."""
    out = run_script(CHILD, """
    x = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    def big():
        return (Tensor(x) * 2).sum(axis=1).numpy()
    want = big()
    np.testing.assert_allclose(want, (x * 2).sum(axis=1), rtol=1e-4, atol=1e-3)
    def child():
        before = len(os.listdir("/proc/self/task"))
        got = big()  # (compiled already: no compile threads start here)
        started = len(os.listdir("/proc/self/task")) - before
        assert started >= 1, f"the C pool started {started} workers in the child"
        np.testing.assert_array_equal(got, want)
    print(in_child(child))
    """, env={"THREADS": "2"})
    assert out.split() == ["0"]


@forks
@cpu_only
def test_c_pool_usable_in_a_child_forked_while_a_kernel_ran() -> None:
    """A thread of the parent is inside a C-pool launch (holding the pool's lock) when another thread forks: the
    child's pool starts again from nothing (it deadlocked on the lock no thread of the child would release)."""
    out = run_script(CHILD, """
    import ctypes, threading
    from glassgrad.runtime import ops_cpu
    from glassgrad.device import Device
    Device["CPU"]
    pool = ops_cpu._COMPILER[0][1].get()
    pool.start(1)
    ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong)
    inside = threading.Event()
    def slow(bufs, vals, start, end):  # a "kernel" that takes its time
        inside.set()
        time.sleep(0.5)
    slow_entry = ENTRY(slow)
    hits = []
    fast_entry = ENTRY(lambda bufs, vals, start, end: hits.append(end - start))
    ints = (ctypes.c_longlong * 1)()
    runner = threading.Thread(target=pool.run, args=(ctypes.cast(slow_entry, ctypes.c_void_p), None, ints, 2, 2))
    runner.start()
    inside.wait()
    def child():
        pool.start(1)
        pool.run(ctypes.cast(fast_entry, ctypes.c_void_p), None, ints, 8, 4)
        assert sum(hits) == 8, hits
    print(in_child(child))
    runner.join()
    """)
    assert out.split() == ["0"]


@forks
def test_multiprocessing_fork_and_spawn_pools() -> None:
    """`multiprocessing` pools of both start methods, after the parent has realized tensors (its compile threads
    started): every worker's result equals the parent's. (A DataLoader with workers forks the same way.)"""
    out = run_script("""
    import multiprocessing as mp
    import numpy as np
    from glassgrad import Tensor

    def work(i):
        x = np.arange(24, dtype=np.float32).reshape(4, 6) / 8 + i
        t = Tensor(x)
        return float(((t @ t.T).relu().sum() + t.exp().max(axis=1).sum()).numpy())

    if __name__ == "__main__":
        from glassgrad.engine import realize
        w = Tensor(np.ones((3, 3), np.float32))
        (((w * 3 + 1).exp() @ w).sum(axis=0) + (w.T @ w).max(axis=1)).realize()  # other kernels than the workers'
        assert realize._compile_pool is not None  # (compiled on the compile threads)
        for method in ("fork", "spawn"):
            with mp.get_context(method).Pool(2) as pool:
                got = pool.map_async(work, range(6)).get(timeout=30)
            np.testing.assert_allclose(got, [work(i) for i in range(6)], rtol=1e-6)
            print(method, "ok")
    """)
    assert out.split() == ["fork", "ok", "spawn", "ok"]


@forks
def test_cuda_in_a_forked_child_raises_a_clear_error() -> None:
    """The CUDA driver cannot be used in a child forked after the parent initialised it: every way in (a context, a
    device, an allocation or copy, a launch) raises CUDAForkError saying to use 'spawn', instead of failing deep in
    the driver or hanging. (No GPU needed: the guard is what is tested; the parent's cuInit is simulated.) A child of
    a parent that never initialised CUDA may still use it."""
    pytest.importorskip("cuda.bindings", reason="cuda-bindings is not installed")
    out = run_script(CHILD, """
    from glassgrad.device import Device
    from glassgrad.runtime import ops_cuda

    def untouched_driver():  # a parent that never used CUDA: its child may (no GPU here: "not available")
        try:
            ops_cuda.open_context(0)
        except ops_cuda.CUDAForkError:
            raise
        except RuntimeError:
            pass
    print(in_child(untouched_driver))

    ops_cuda._driver_pid = os.getpid()  # as after this process's cuInit
    ctx = ops_cuda.CUDAContext(0, None, None, "sm_90")
    program = object.__new__(ops_cuda.CUDAProgram)
    ways_in = {"open_context": lambda: ops_cuda.open_context(0), "Device": lambda: Device["CUDA:1"],
               "activate": ctx.activate, "alloc": lambda: ops_cuda.CUDAAllocator(ctx).alloc(64),
               "launch": lambda: program(global_size=(1,))}
    def child():
        for name, way_in in ways_in.items():
            try:
                way_in()
            except ops_cuda.CUDAForkError as e:
                assert "forked" in str(e) and "'spawn'" in str(e), str(e)
            else:
                raise AssertionError(f"{name}: no CUDAForkError")
        print("all raised")
    print(in_child(child))
    """)
    assert out.split() == ["0", "all", "raised", "0"]


# ---------------------------------------------------------------------- Python threads
THREADS = """
import sys, threading, time
sys.setswitchinterval(1e-5)  # (threads switch far more often than by default: a race shows in a short run)
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from glassgrad import Tensor, TinyJit, no_grad
from glassgrad.nn.optim import SGD

def train(seed, steps=15, jit=False):
    rng = np.random.default_rng(seed)
    w1 = Tensor(rng.standard_normal((8, 16)).astype(np.float32) * 0.3, requires_grad=True)
    w2 = Tensor(rng.standard_normal((16, 1)).astype(np.float32) * 0.3, requires_grad=True)
    opt = SGD([w1, w2], lr=0.01, momentum=0.5)
    def step(x, y):
        opt.zero_grad()
        loss = (((x @ w1).relu() @ w2 - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss
    step = TinyJit(step) if jit else step
    losses = []
    with Tensor.train():
        for _ in range(steps):
            n = 4 + seed % 3  # (each thread its own shapes: its own kernels, compiled side by side)
            x = Tensor(rng.standard_normal((n, 8)).astype(np.float32))
            y = Tensor(rng.standard_normal((n, 1)).astype(np.float32))
            losses.append(step(x, y).item())
    return losses
"""


def test_threads_each_training_a_model_match_sequential_runs() -> None:
    """Four threads, each training its own model (eager, then TinyJit; momentum SGD, so assigns and in-place state):
    every thread's losses equal those of the same training run alone."""
    out = run_script(THREADS, """
    for jit in (False, True):
        alone = [train(seed, jit=jit) for seed in range(4)]
        assert np.isfinite(alone).all()
        for _ in range(3):
            with ThreadPoolExecutor(4) as pool:
                together = list(pool.map(lambda seed: train(seed, jit=jit), range(4)))
            np.testing.assert_array_equal(together, alone)
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_random_draws_from_threads_take_each_number_once() -> None:
    """Threads drawing random numbers at once: together they draw exactly the numbers one thread would have (the
    counter ranges neither overlap nor leave gaps), and none raises."""
    out = run_script(THREADS, """
    def draws(count):
        return [Tensor.rand(50).numpy() for _ in range(count)]
    Tensor.manual_seed(7)
    alone = np.sort(np.concatenate(draws(4 * 25)))
    Tensor.manual_seed(7)
    with ThreadPoolExecutor(4) as pool:
        together = np.sort(np.concatenate([d for ds in pool.map(lambda _: draws(25), range(4)) for d in ds]))
    np.testing.assert_array_equal(together, alone)
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_prefetch_thread_while_training_with_dropout() -> None:
    """A loader thread makes and realizes each batch while the main thread trains (dropout draws random numbers;
    eager and TinyJit): the losses equal a run that makes the batches itself."""
    out = run_script(THREADS, """
    import queue
    def run(prefetch, jit):
        Tensor.manual_seed(0)
        rng = np.random.default_rng(0)
        w = Tensor(rng.standard_normal((8, 4)).astype(np.float32) * 0.3, requires_grad=True)
        opt = SGD([w], lr=0.05)
        def step(x):
            opt.zero_grad()
            loss = (x @ w).dropout(0.3).square().mean()
            loss.backward()
            opt.step()
            return loss
        step = TinyJit(step) if jit else step
        batches = [np.random.default_rng(i).standard_normal((6, 8)).astype(np.float32) for i in range(40)]
        ready = queue.Queue(3)
        loader = threading.Thread(target=lambda: [ready.put(Tensor(b).realize() if prefetch else b) for b in batches])
        loader.start()
        losses = []
        with Tensor.train():
            for _ in batches:
                x = ready.get()
                losses.append(step(x if prefetch else Tensor(x).realize()).item())
        loader.join()
        return losses
    for jit in (False, True):
        np.testing.assert_array_equal(run(True, jit), run(False, jit))
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_no_grad_block_in_another_thread() -> None:
    """A `with no_grad()` block open in an evaluation thread while the main thread builds its training graph: the
    main thread's gradients are whole (the block's exit detached the tensors every thread had made meanwhile, and the
    process-wide flag kept the main thread's realizes from recording lineage)."""
    out = run_script(THREADS, """
    entered, built = threading.Event(), threading.Event()
    def evaluate():
        with no_grad():
            entered.set()
            built.wait()
            (Tensor.ones(3) * 2).realize()
    worker = threading.Thread(target=evaluate)
    worker.start()
    entered.wait()
    w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
    assert not Tensor.no_grad  # (the other thread's block)
    h = (w * w).realize()  # realized here: the gradient flows through its lineage
    loss = (h * 3).sum()
    built.set()
    worker.join()
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), [6.0, 12.0, 18.0])
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_train_and_no_grad_blocks_in_threads_leave_the_modes() -> None:
    """Two evaluation threads whose `with Tensor.test():` / `no_grad()` blocks interleave (enter A, enter B, leave A,
    leave B): the main thread's modes are what it set, during and after (a process-wide flag was left at the second
    block's saved value: training off for the rest of the run)."""
    out = run_script(THREADS, """
    Tensor.training = True
    steps = [threading.Event() for _ in range(4)]
    def block(first, last):
        steps[first].wait()
        with Tensor.test(), no_grad():
            assert not Tensor.training and Tensor.no_grad
            steps[first + 1].set()
            steps[last].wait()
        if last + 1 < 4:
            steps[last + 1].set()
    a = threading.Thread(target=block, args=(0, 2))
    b = threading.Thread(target=block, args=(1, 3))
    a.start(); b.start()
    steps[0].set()
    a.join(); b.join()
    assert Tensor.training and not Tensor.no_grad
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_tinyjit_capture_in_one_thread_leaves_other_threads_alone() -> None:
    """A TinyJit captures in one thread while another realizes and reads values: the other thread's kernel is not
    captured (a replay would run it again), and its numpy() does not raise the capture's JitError; it waits."""
    out = run_script(THREADS, """
    from glassgrad import GlobalCounters
    capturing = threading.Event()
    calls = [0]
    @TinyJit
    def f(x):
        y = (x * 2).realize()
        calls[0] += 1
        if calls[0] == 2:  # the capture: let the other thread try now
            capturing.set()
            time.sleep(0.3)
        return y + 1
    other = []
    def elsewhere():
        capturing.wait()
        other.append((Tensor(np.arange(4, dtype=np.float32)) * 5).numpy())
    worker = threading.Thread(target=elsewhere)
    worker.start()
    x = Tensor(np.ones(4, np.float32))
    for _ in range(3):
        f(x)
    worker.join()
    np.testing.assert_array_equal(other[0], np.arange(4) * 5)
    GlobalCounters.reset()
    np.testing.assert_array_equal(f(Tensor(np.full(4, 3.0, np.float32))).numpy(), np.full(4, 7.0))
    assert GlobalCounters.kernel_count == 2, GlobalCounters.kernel_count  # f's two kernels, nothing else
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_allocator_counts_from_threads() -> None:
    """Threads making and dropping tensors (buffers freed in whichever thread drops them last): the live-bytes count
    comes back to where it started."""
    out = run_script(THREADS, """
    from glassgrad import GlobalCounters
    data = np.ones((64, 64), np.float32)
    def churn(_):
        for _ in range(300):
            t = Tensor(data)
            t.realize()
            del t
    before = GlobalCounters.mem_used
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(churn, range(4)))
    import gc; gc.collect()
    assert GlobalCounters.mem_used == before, (GlobalCounters.mem_used, before)
    print("ok")
    """)
    assert out.split() == ["ok"]


def test_nested_no_grad_blocks() -> None:
    """`no_grad()` inside `no_grad()` (an optimizer step inside the caller's block): leaving the inner one raised
    "the truth value of a tensor ... is ambiguous" (the blocks were compared as lists of tensors)."""
    from glassgrad import Tensor, no_grad
    with no_grad():
        a = Tensor([1.0, 2.0]) * 2
        with no_grad():
            b = Tensor([3.0, 4.0]) * 2
        assert Tensor.no_grad
    assert not Tensor.no_grad
    assert a.tolist() == [2.0, 4.0] and b.tolist() == [6.0, 8.0]


# ---------------------------------------------------------------------- the random state's old versions
def _dropout_grad_check(between: object) -> None:
    """A dropout output y = (3w).dropout(0.5) built, then `between()` run (something that advances the random state),
    then a backward: w.grad is y / w (the same mask as y's), in PyTorch as here."""
    from glassgrad import Tensor
    w = Tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], requires_grad=True)
    with Tensor.train():
        y = (w * 3).dropout(0.5)
        loss = (y * 1).sum()
        between(loss)  # type: ignore[operator]
        loss.backward()
    values = y.numpy()
    assert (values == 0).any() and (values != 0).any()  # (seeded: some kept, some dropped)
    np.testing.assert_allclose(w.grad.numpy(), values / w.numpy())


def test_backward_after_reading_a_dropout_loss() -> None:
    """`print(loss.item())` before `loss.backward()` with dropout: the read advanced the random state, and the
    backward, recomputing the mask from the state's old version, raised a stale-read RuntimeError."""
    from glassgrad import Tensor
    Tensor.manual_seed(3)
    _dropout_grad_check(lambda loss: loss.item())


def test_backward_after_another_random_draw() -> None:
    """Another random tensor realized between a dropout forward and its backward (noise for the next step)."""
    from glassgrad import Tensor
    Tensor.manual_seed(4)
    _dropout_grad_check(lambda loss: Tensor.rand(5).realize())


def test_backward_after_a_tinyjit_replay_that_draws() -> None:
    """A TinyJit step that draws random numbers replayed between a dropout forward and its backward: the replay
    realized the lazy loss (it read the state the replay advances) without its lineage, so backward() raised."""
    from glassgrad import Tensor, TinyJit

    @TinyJit
    def noise() -> Tensor:
        return (Tensor.rand(4) + 1).realize()
    for _ in range(3):
        noise()
    Tensor.manual_seed(5)
    _dropout_grad_check(lambda loss: noise())


def test_eager_thread_and_capturing_thread_both_drawing() -> None:
    """Thread A builds a dropout forward; thread B captures a TinyJit step that draws (which advances the shared
    random state); A then differentiates, and B keeps replaying after A's tensors are gone. A's forward was realized
    inside B's capture without its lineage (A's backward raised), and B's capture recorded A's kernels (B's replays
    raised JitError once A's input was gone)."""
    out = run_script(THREADS, """
    built, captured = threading.Event(), threading.Event()
    result = {}
    def eager():
        w = Tensor(np.arange(1, 9, dtype=np.float32), requires_grad=True)
        with Tensor.train():
            y = (w * 3).dropout(0.5)
            loss = (y * 1).sum()
            built.set()
            captured.wait()
            loss.backward()
        result["grad"], result["want"] = w.grad.numpy(), y.numpy() / w.numpy()
    @TinyJit
    def step(x):
        return (x * Tensor.rand(4)).realize()
    def capturing():
        built.wait()
        for _ in range(3):
            step(Tensor(np.ones(4, np.float32)))
        captured.set()
    threads = [threading.Thread(target=eager), threading.Thread(target=capturing)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    np.testing.assert_allclose(result["grad"], result["want"])
    import gc; gc.collect()
    draws = [step(Tensor(np.ones(4, np.float32))).numpy() for _ in range(3)]
    assert len({d.tobytes() for d in draws}) == 3  # fresh numbers on every replay
    print("ok")
    """)
    assert out.split() == ["ok"]


# ---------------------------------------------------------------------- interrupts and exceptions mid-step
INTERRUPTS = """
import _thread
import numpy as np
from glassgrad import Tensor
from glassgrad.engine import realize
from glassgrad.nn.optim import Adam

def trainer():
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((4, 3)).astype(np.float32), requires_grad=True)
    x = Tensor(rng.standard_normal((5, 4)).astype(np.float32))
    opt = Adam([w], lr=0.1)
    def step():
        opt.zero_grad()
        loss = (x @ w).square().mean()
        loss.backward()
        opt.step()
        return loss.item()
    return w, step

class Interrupting:
    # a kernel's C function that, once its launch number comes, raises Ctrl-C's KeyboardInterrupt as a real one
    # arrives: when the call returns (the kernel has run)
    def __init__(self, fn, counter, at):
        self.fn, self.counter, self.at, self.argtypes = fn, counter, at, fn.argtypes
    def __call__(self, *args):
        self.fn(*args)
        self.counter[0] += 1
        if self.counter[0] == self.at:
            _thread.interrupt_main()

def interrupt_at(at):
    counter = [0]
    for kernel in realize._kernel_cache.values():
        program = kernel.program
        if not isinstance(program.fn, Interrupting):
            program.fn = Interrupting(program.fn, counter, at)
        else:
            program.fn.counter, program.fn.at = counter, at
    return counter
"""


def test_ctrl_c_inside_an_optimizer_step() -> None:
    """Ctrl-C arriving during each kernel of an Adam step in turn (the kernel runs; the interrupt is raised when it
    returns): the step's writes that ran are kept, the next steps complete it, and the run ends where an
    uninterrupted one does. (The tensors kept pointing at the versions the finished writes had overwritten: every
    later step raised a stale-read RuntimeError.)"""
    out = run_script(INTERRUPTS, """
    w, step = trainer()
    with Tensor.train():
        want = [step() for _ in range(4)]
        final = w.numpy()
        launches = interrupt_at(0)
        step()
        per_step = launches[0]
        assert per_step >= 4, per_step
        for at in range(1, per_step + 1):
            w, step = trainer()
            step()
            interrupt_at(at)
            try:
                step()
            except KeyboardInterrupt:
                pass
            else:
                raise AssertionError(f"launch {at}: no interrupt")
            interrupt_at(0)
            losses = [step(), step()]
            np.testing.assert_allclose(losses, want[2:], rtol=1e-6)
            np.testing.assert_allclose(w.numpy(), final, rtol=1e-6)
    print("ok", per_step)
    """, env={"THREADS": "1"})
    assert out.split()[0] == "ok"


def test_failed_compile_part_way_through_a_step(tmp_path: pathlib.Path) -> None:
    """The C compiler failing on one batch of a step's kernels (after earlier kernels of the step, in-place writes
    among them, ran): the realize raises the compiler's error, nothing half-written stays in the disk cache, and once
    the compiler works again every later step computes what an uninterrupted run does."""
    out = run_script(INTERRUPTS, """
    import os
    from glassgrad.device import Device
    compiler = Device["CPU"].compiler
    w, step = trainer()
    with Tensor.train():
        want = [step() for _ in range(4)]
    final = w.numpy()
    w, step = trainer()
    with Tensor.train():
        step()
        realize._kernel_cache.clear()  # (the step's kernels compile again, and the third compile fails)
        compiler._memory.clear()
        for name in os.listdir(os.environ["CACHEDIR"] + "/kernels"):
            os.unlink(os.environ["CACHEDIR"] + "/kernels/" + name)
        real = type(compiler)._try_compile
        calls = [0]
        def failing(self, src):
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("the compiler failed")
            return real(self, src)
        type(compiler)._try_compile = failing
        realize.COMPILE_THREADS = 1  # (one kernel after another)
        realize.MAX_BATCH = 1
        try:
            step()
        except RuntimeError as e:
            assert "the compiler failed" in str(e)
        else:
            raise AssertionError("no compile failed")
        type(compiler)._try_compile = real
        np.testing.assert_allclose([step(), step()], want[2:], rtol=1e-6)
        np.testing.assert_allclose(w.numpy(), final, rtol=1e-6)
    leftovers = [n for n in os.listdir(os.environ["CACHEDIR"] + "/kernels") if not n.endswith(".checked")]
    assert not leftovers, leftovers
    print("ok")
    """, env={"CACHEDIR": str(tmp_path), "THREADS": "1"})
    assert out.split() == ["ok"]


def test_tinyjit_captures_again_after_an_exception_in_its_capture() -> None:
    """A jitted step that raises during its capture (the second call: a shape error, then a Ctrl-C): the next call
    captures again, and replays compute the right values."""
    from glassgrad import Tensor, TinyJit
    from glassgrad.engine import realize
    fail = ["shape"]

    @TinyJit
    def f(x: Tensor) -> Tensor:
        y = (x * 2).realize()
        if fail and fail[0] == "shape":
            fail.pop()
            return y.reshape(7)  # (x has 6 elements)
        if fail:
            fail.pop()
            raise KeyboardInterrupt
        return y + 1

    x = Tensor(np.arange(6, dtype=np.float32))
    fail.clear()
    assert f(x).tolist() == [1.0, 3.0, 5.0, 7.0, 9.0, 11.0]  # call 1: eager
    fail.append("shape")
    with pytest.raises(ValueError):
        f(x)  # call 2: its capture raises
    fail.append("interrupt")
    with pytest.raises(KeyboardInterrupt):
        f(x)  # it captures again, and is interrupted
    assert not realize.capture_hooks
    for i in range(3):
        xi = Tensor(np.arange(6, dtype=np.float32) + i)
        np.testing.assert_array_equal(f(xi).numpy(), (np.arange(6) + i) * 2 + 1)
    assert f.captures == 1


# ---------------------------------------------------------------------- long loops
def _live_counts() -> dict[str, int]:
    """What a long loop could pile up: device memory held by buffers, compiled kernels, graph nodes, the realized-node
    and lineage tables, the lazy-tensor registries and the live Python objects."""
    import gc

    import glassgrad.tensor as T
    from glassgrad import GlobalCounters
    from glassgrad.engine import realize
    from glassgrad.schedule import REALIZED
    from glassgrad.uop.ops import UOp
    gc.collect()
    return {"mem_used": GlobalCounters.mem_used, "kernels": len(realize._kernel_cache), "nodes": len(UOp._cache),
            "realized": len(REALIZED._map) + len(REALIZED._assigned), "lineage": len(T.LINEAGE),
            "lazy": sum(len(refs) for _, refs in T._LAZY.lists.values()), "lazy_lists": len(T._LAZY.lists),
            "lazy_gradients": len(T._LAZY_GRADIENTS), "objects": len(gc.get_objects())}


@pytest.mark.parametrize("mode", ["eager", "jit"])
def test_long_training_loop_holds_no_more_as_it_goes(mode: str) -> None:
    """A training loop (dropout, the loss read before backward, an evaluation in no_grad, batches made by a loader
    thread, a second input shape every other step): what is alive after 40 steps is alive after 140, no more (a few
    Python objects aside, made once by whatever ran first at some point: not one per step)."""
    import queue
    import threading

    from glassgrad import Tensor, TinyJit, nn, no_grad
    from glassgrad.nn.optim import Adam
    rng = np.random.default_rng(0)
    l1, l2 = nn.Linear(8, 16), nn.Linear(16, 3)
    opt = Adam(nn.state.get_parameters([l1, l2]), lr=1e-3)

    def step(x: Tensor, y: Tensor) -> Tensor:
        opt.zero_grad()
        loss = l2(l1(x).relu().dropout(0.1)).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
        return loss
    run = TinyJit(step) if mode == "jit" else step
    counts = {}
    for i in range(141):
        ready: queue.Queue[Tensor] = queue.Queue()
        n = 4 + i % 2
        def load(ready: queue.Queue[Tensor] = ready, n: int = n) -> None:
            ready.put(Tensor(rng.standard_normal((n, 8)).astype(np.float32)).realize())
        loader = threading.Thread(target=load)
        loader.start()
        loader.join()
        with Tensor.train():
            loss = run(ready.get(), Tensor(rng.integers(0, 3, n).astype(np.int32)))
            assert np.isfinite(loss.item())
        with no_grad():
            l2(l1(Tensor.randn(2, 8))).argmax(-1).numpy()
        if i in (40, 140):
            counts[i] = _live_counts()
    slack = {"objects": 30}
    grown = {k: (counts[40][k], counts[140][k]) for k in counts[40] if counts[140][k] > counts[40][k] + slack.get(k, 0)}
    assert not grown, f"grew from step 40 to step 140: {grown}"


# ---------------------------------------------------------------------- several processes, one compile cache
CACHE_USER = """
import os, sys
import numpy as np
from glassgrad import Tensor
from glassgrad.device import Device
compiles = [0]
compiler = type(Device["CPU"].compiler)
real = compiler._try_compile
def counted(self, src):
    compiles[0] += 1
    return real(self, src)
compiler._try_compile = counted
x = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
t = Tensor(x)
got = ((t * 2).exp().sum(1) + (t @ t.T).max(1)).numpy()  # (big enough for the thread pool's library too)
want = np.exp(x * 2).sum(1) + (x @ x.T).max(1)
np.testing.assert_allclose(got, want, rtol=2e-4)
from glassgrad.runtime import ops_cpu
assert ops_cpu._COMPILER[0][1].get() is not None  # the C thread pool loaded
print("compiles", compiles[0])
"""


def _fresh_cache(tmp_path: pathlib.Path) -> dict[str, str]:
    """An empty cache directory but for the C compiler's probe (copied: probing again takes many compiler runs)."""
    import shutil

    from glassgrad.helpers import cache_dir
    if (cache_dir() / "ccompiler").is_dir():
        shutil.copytree(cache_dir() / "ccompiler", tmp_path / "ccompiler")
    return {"CACHEDIR": str(tmp_path), "THREADS": "2"}


@cpu_only
def test_damaged_cache_files_are_built_again(tmp_path: pathlib.Path) -> None:
    """Every file of the compile cache cut short (a full disk, a process killed while writing with an older
    version) or overwritten with other bytes of the same length: the next process builds what it needs again and
    computes the right values (a damaged kernel or library failed to load on every run, or could crash)."""
    env = _fresh_cache(tmp_path)
    assert int(run_script(CACHE_USER, env=env).split()[1]) > 0
    assert int(run_script(CACHE_USER, env=env).split()[1]) == 0  # (all from the cache)
    files = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent.name in ("kernels", "lib")]
    assert any(p.name.startswith("pool-") for p in files) and any(p.suffix == ".checked" for p in files)
    for i, path in enumerate(files):
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 3] if i % 2 else bytes(b ^ 0x5A for b in data))
    assert int(run_script(CACHE_USER, env=env).split()[1]) > 0
    assert int(run_script(CACHE_USER, env=env).split()[1]) == 0  # (whole again)


@cpu_only
def test_processes_compiling_into_one_cache_at_once(tmp_path: pathlib.Path) -> None:
    """Four processes (pytest -n, DataLoader workers, two scripts) compile the same kernels into one empty cache at
    once: each computes the right values, no temporary file is left, and a fifth finds everything cached."""
    env = _fresh_cache(tmp_path)
    script = tmp_path / "user.py"
    script.write_text(textwrap.dedent(CACHE_USER))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env}
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=environ, cwd=ROOT) for _ in range(4)]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    assert not [p for p in tmp_path.rglob("*.tmp")]
    assert int(run_script(CACHE_USER, env=env).split()[1]) == 0


# ---------------------------------------------------------------------- deep graphs
def test_deep_graphs_need_no_recursion() -> None:
    """A chain of 20,000 ops and a sum accumulated over 10,000 Python-loop steps, realized and differentiated with
    Python's recursion limit at 200: every walk of the graph is a loop, not a recursion (no RecursionError)."""
    from glassgrad import Tensor
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        x = Tensor(np.full(3, 0.5, np.float32), requires_grad=True)
        y, want, slope = x, np.full(3, 0.5, np.float32), 1.0
        for i in range(20_000):
            if i % 2:
                y, want, slope = y * 1.0001, want * np.float32(1.0001), slope * float(np.float32(1.0001))
            else:
                y, want = y + 0.0001, want + np.float32(0.0001)
        y.sum().backward()
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-4)
        np.testing.assert_allclose(x.grad.numpy(), np.full(3, slope), rtol=1e-4)
        w = Tensor(np.arange(3, dtype=np.float32), requires_grad=True)
        s = Tensor.zeros(3)
        for _ in range(10_000):
            s = s + w
        s.sum().backward()
        np.testing.assert_array_equal(s.numpy(), np.arange(3) * 10_000)
        np.testing.assert_array_equal(w.grad.numpy(), np.full(3, 10_000))
    finally:
        sys.setrecursionlimit(limit)
