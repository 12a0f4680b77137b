"""The CPU backend's worker threads, in C: one kernel's outer loop split into chunks that threads claim as they go.

In: a kernel's uniform entry point (`<name>_entry(bufs, vals, start, end)`, which `ClangRenderer` writes next to
every kernel), its buffer addresses and int arguments, the outer loop's size and a thread count. Out: the kernel has
run over the whole loop when `run` returns.

Why C and why chunks: a Python thread pool costs tens of microseconds per launch (a future, a queue, the GIL handed
back and forth), and on a shared machine a half given to a thread that the OS does not schedule for a few
milliseconds makes the whole kernel wait for it. Here the calling thread and the workers take chunks from one atomic
counter (several per thread), so a late worker just finds fewer chunks left; workers spin briefly for the next kernel
(launch latency of a few microseconds when kernels follow each other) and then sleep on a condition variable, so an
idle process uses no CPU. Where it does not build (no pthreads), `LazyPool.get` returns None and the
backend keeps its Python thread pool.
"""
from __future__ import annotations

import ctypes
import os
import threading
import weakref
from collections.abc import Callable

POOL_SOURCE = r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

typedef void (*gg_entry)(void* const* bufs, const long long* vals, long long start, long long end);

#if defined(__x86_64__) || defined(__i386__)
#define GG_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define GG_PAUSE() __asm__ __volatile__("yield")
#else
#define GG_PAUSE() ((void)0)
#endif

/* The current kernel: written by the caller while no worker is inside (see gg_pool_run), then published by making
   `generation` even. */
static gg_entry job_fn;
static void* const* job_bufs;
static const long long* job_vals;
static long long job_outer, job_chunks;
static atomic_llong job_next;   /* the next chunk to claim */
static atomic_llong job_done;   /* chunks finished */

static atomic_uint generation;  /* odd while the caller writes a job, even when one is published */
static atomic_int inside;       /* workers between checking the generation and leaving the job */
static pthread_mutex_t wake_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int sleepers;
static int started;
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;

static int spin_rounds = 20000;  /* about 50-100 us of pause instructions before a worker sleeps */

static void run_chunks(void) {
  for (;;) {
    long long c = atomic_fetch_add(&job_next, 1);
    if (c >= job_chunks) return;
    long long lo = job_outer * c / job_chunks, hi = job_outer * (c + 1) / job_chunks;
    if (hi > lo) job_fn(job_bufs, job_vals, lo, hi);
    atomic_fetch_add(&job_done, 1);
  }
}

static void* worker(void* arg) {
  (void)arg;
  unsigned seen = atomic_load(&generation);
  for (;;) {
    unsigned g = atomic_load(&generation);
    for (int i = 0; i < spin_rounds && (g == seen || (g & 1u)); i++) {
      GG_PAUSE();
      g = atomic_load(&generation);
    }
    if (g == seen || (g & 1u)) {
      pthread_mutex_lock(&wake_lock);
      sleepers++;
      while ((g = atomic_load(&generation)) == seen || (g & 1u)) pthread_cond_wait(&wake, &wake_lock);
      sleepers--;
      pthread_mutex_unlock(&wake_lock);
    }
    seen = g;
    atomic_fetch_add(&inside, 1);
    if (atomic_load(&generation) == g) run_chunks();  /* else the caller is already writing the next job */
    atomic_fetch_sub(&inside, 1);
  }
  return 0;
}

/* Start workers until there are `count`; returns how many there are. */
int gg_pool_start(int count) {
  pthread_mutex_lock(&run_lock);
  while (started < count) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 8u << 20);  /* kernels keep staging buffers on the stack */
    int err = pthread_create(&t, &attr, worker, 0);
    pthread_attr_destroy(&attr);
    if (err) break;
    pthread_detach(t);
    started++;
  }
  int n = started;
  pthread_mutex_unlock(&run_lock);
  return n;
}

/* Run fn over [0, outer) in `chunks` parts, shared by the calling thread and the workers; returns when all ran. */
void gg_pool_run(gg_entry fn, void* const* bufs, const long long* vals, long long outer, long long chunks) {
  pthread_mutex_lock(&run_lock);
  atomic_fetch_add(&generation, 1);                   /* odd: workers arriving now leave at once */
  while (atomic_load(&inside) > 0) GG_PAUSE();        /* a worker still leaving the last job */
  job_fn = fn; job_bufs = bufs; job_vals = vals; job_outer = outer; job_chunks = chunks;
  atomic_store(&job_next, 0);
  atomic_store(&job_done, 0);
  pthread_mutex_lock(&wake_lock);
  atomic_fetch_add(&generation, 1);                   /* even: published */
  if (sleepers) pthread_cond_broadcast(&wake);
  pthread_mutex_unlock(&wake_lock);
  run_chunks();
  for (long long i = 0; atomic_load(&job_done) < chunks; i++) {  /* chunks a worker is still running */
    if (i < 100000) GG_PAUSE(); else sched_yield();
  }
  pthread_mutex_unlock(&run_lock);
}

/* In a forked child, where only the forking thread exists: no workers, none inside a job or asleep, no job being
   written, and the mutexes and condition variable made new (a parent's thread may have held a mutex at the fork, and
   the condition counts the parent's sleepers, whom a broadcast could wait for). The next gg_pool_start starts new
   workers. */
void gg_pool_after_fork(void) {
  started = 0;
  sleepers = 0;
  atomic_store(&inside, 0);
  atomic_store(&generation, (atomic_load(&generation) + 1u) & ~1u);
  pthread_mutex_init(&run_lock, 0);
  pthread_mutex_init(&wake_lock, 0);
  pthread_cond_init(&wake, 0);
}
"""

class CPool:
    """The loaded pool: `start(n)` makes n worker threads (besides the caller); `run(...)` launches one kernel."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        self.lib.gg_pool_start.argtypes = [ctypes.c_int]
        self.lib.gg_pool_start.restype = ctypes.c_int
        self.run = self.lib.gg_pool_run
        self.run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
        self.run.restype = None
        self.lib.gg_pool_after_fork.restype = None
        self.workers = 0

    def start(self, workers: int) -> int:
        if workers > self.workers:
            self.workers = self.lib.gg_pool_start(workers)
        return self.workers

    def after_fork(self) -> None:
        """In a forked child: the parent's workers are gone; the pool's state is reset so `start` makes new ones."""
        self.lib.gg_pool_after_fork()
        self.workers = 0


class LazyPool:
    """The pool, built the first time a kernel wants threads: by `build()` (the backend's compiler, with its cache),
    loaded by `load(binary)`. `get()` is None for good if building fails (the backend then uses Python threads)."""

    def __init__(self, build: Callable[[str], bytes], load: Callable[[bytes], ctypes.CDLL]) -> None:
        self._build, self._load = build, load
        self._pool: CPool | None = None
        self._tried = False
        self._lock = threading.Lock()
        _LAZY_POOLS.add(self)

    def after_fork(self) -> None:
        """In a forked child: a new lock (a parent's thread may have held it at the fork), the loaded pool reset."""
        self._lock = threading.Lock()
        if self._pool is not None:
            self._pool.after_fork()

    def get(self) -> CPool | None:
        if not self._tried:
            with self._lock:
                if not self._tried:
                    try:
                        self._pool = CPool(self._load(self._build(POOL_SOURCE)))
                    except Exception:  # no pthreads, a compiler error: Python threads instead
                        self._pool = None
                    self._tried = True
        return self._pool


_LAZY_POOLS: weakref.WeakSet[LazyPool] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for pool in list(_LAZY_POOLS):
        pool.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
