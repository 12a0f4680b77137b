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

import pytest

from glassgrad import Device

ROOT = pathlib.Path(__file__).resolve().parent.parent
forks = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
cpu_only = pytest.mark.skipif(Device.DEFAULT != "CPU", reason="the CPU backend's pools")


def run_script(prelude: str, code: str = "", timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Run `prelude` and `code` (each dedented) in a fresh interpreter (this checkout's glassgrad); its stdout. Fails on
    a non-zero exit, and on a hang (after `timeout` seconds)."""
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               **(env or {})}
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
