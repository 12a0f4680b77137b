// launcher.cpp -- TEST-ONLY part of the emulated Metal device (see metal_emulator.py). C++20.
//
// In:  a kernel compiled against shim.h with GG_METAL_EMULATOR (its `gg_entry` function), the buffers, the grid
//      size in threadgroups, the threadgroup size in threads, and whether the kernel synchronises its threads
//      (uses threadgroup memory or threadgroup_barrier).
// Out: the kernel has run for every thread of the grid; 0, or -1 with a message in `error`.
//
// One OS thread per Metal thread of a threadgroup: OS thread t plays thread t of every group, so the threads of a
// group really run concurrently and `threadgroup_barrier` blocks each of them until all of its group have reached
// it. The threads live in a pool that outlives a launch (creating 256 threads costs ~10 ms).
// A kernel that synchronises runs its groups in lockstep, one group at a time: the shim's threadgroup arrays are
// function-static, i.e. one array shared by the threads of the running group. A kernel that does not lets each
// thread run through all groups on its own (its threads never interact, as on a GPU).
// A thread that returns from the kernel stops being waited for, so a kernel whose threads do not all reach the same
// barriers does not hang; the launcher counts each thread's barriers and reports such a kernel as an error,
// because on a Metal GPU it is undefined behaviour.
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <semaphore>
#include <thread>
#include <vector>

typedef void (*Entry)(void** buffers, const unsigned* ids, void (*barrier)(void*), void* context);

namespace {

// A reusable barrier for a changing number of threads. Waiting threads sleep on an atomic (a futex).
class Barrier {
 public:
  // `last` runs in the last thread to arrive, before any waiting thread is released
  template <class F> void wait(F last) {
    unsigned seen;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = phase_.load();
      if (++arrived_ >= expected_) {
        last();
        release();
        return;
      }
    }
    while (phase_.load() == seen) phase_.wait(seen);
  }
  void wait() { wait([] {}); }

  // a thread that has finished: the others no longer wait for it
  void leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    --expected_;
    if (arrived_ > 0 && arrived_ >= expected_) release();
  }

  void reset(int count) {  // only while no thread is waiting
    expected_ = count;
    arrived_ = 0;
  }

 private:
  void release() {
    arrived_ = 0;
    phase_.fetch_add(1);
    phase_.notify_all();
  }

  std::mutex mutex_;
  int expected_ = 0;
  int arrived_ = 0;
  std::atomic<unsigned> phase_{0};
};

struct Launch {
  Entry entry;
  void** buffers;
  unsigned grid[3];
  unsigned block[3];
  int threads;
  bool lockstep;
  Barrier in_group;        // threadgroup_barrier
  Barrier between_groups;  // lockstep: group g+1 starts when every thread has finished group g
  std::vector<long> barriers_reached;
  bool failed = false;
  char message[512] = {0};
};

struct ThreadContext {
  Launch* launch;
  int thread;
};

void on_threadgroup_barrier(void* context) {
  ThreadContext* ctx = static_cast<ThreadContext*>(context);
  ++ctx->launch->barriers_reached[ctx->thread];
  ctx->launch->in_group.wait();
}

// after a group, in the last thread to finish it: every thread must have reached the same number of barriers
void check_group(Launch& launch, unsigned long group) {
  long low = launch.barriers_reached[0], high = low;
  for (long n : launch.barriers_reached) {
    low = n < low ? n : low;
    high = n > high ? n : high;
  }
  if (low != high && !launch.failed) {
    std::snprintf(launch.message, sizeof launch.message,
                  "threadgroup %lu: its threads reached threadgroup_barrier between %ld and %ld times (every thread "
                  "of a group must reach every barrier; on Metal this is undefined behaviour)", group, low, high);
    launch.failed = true;
  }
  for (long& n : launch.barriers_reached) n = 0;
  launch.in_group.reset(launch.threads);
}

void run_thread(Launch& launch, int t) {
  const unsigned* grid = launch.grid;
  const unsigned* block = launch.block;
  const unsigned long groups = static_cast<unsigned long>(grid[0]) * grid[1] * grid[2];
  ThreadContext ctx{&launch, t};
  for (unsigned long g = 0; g < groups; g++) {
    const unsigned ids[6] = {static_cast<unsigned>(g % grid[0]), static_cast<unsigned>(g / grid[0] % grid[1]),
                             static_cast<unsigned>(g / grid[0] / grid[1]), t % block[0], t / block[0] % block[1],
                             t / block[0] / block[1]};
    launch.entry(launch.buffers, ids, on_threadgroup_barrier, &ctx);
    if (!launch.lockstep) continue;
    launch.in_group.leave();
    launch.between_groups.wait([&] { check_group(launch, g); });
    if (launch.failed) return;
  }
}

// OS threads that stay alive between launches; worker t runs Metal thread t of each group
class Pool {
 public:
  void run(Launch& launch) {
    while (static_cast<int>(workers_.size()) < launch.threads) add_worker();
    launch_ = &launch;
    remaining_.store(launch.threads);
    for (int t = 0; t < launch.threads; t++) workers_[t]->start.release();
    for (int left = remaining_.load(); left != 0; left = remaining_.load()) remaining_.wait(left);
  }

 private:
  struct Worker {
    std::binary_semaphore start{0};
    std::thread thread;
  };

  void add_worker() {
    int t = static_cast<int>(workers_.size());
    workers_.push_back(std::make_unique<Worker>());
    Worker* worker = workers_.back().get();  // stays put when the vector grows
    worker->thread = std::thread([this, worker, t] { work(*worker, t); });
    worker->thread.detach();  // the pool lives until the process exits
  }

  void work(Worker& worker, int t) {
    for (;;) {
      worker.start.acquire();
      run_thread(*launch_, t);
      if (remaining_.fetch_sub(1) == 1) remaining_.notify_all();
    }
  }

  std::vector<std::unique_ptr<Worker>> workers_;
  Launch* launch_ = nullptr;
  std::atomic<int> remaining_{0};
};

}  // namespace

extern "C" int gg_launch(Entry entry, void** buffers, const unsigned* grid, const unsigned* block, int lockstep,
                         char* error, int error_size) {
  static std::mutex one_launch_at_a_time;
  static Pool* pool = new Pool();  // never destroyed: its threads are blocked in acquire() at exit
  std::lock_guard<std::mutex> lock(one_launch_at_a_time);
  Launch launch{entry, buffers, {grid[0], grid[1], grid[2]}, {block[0], block[1], block[2]},
                static_cast<int>(block[0] * block[1] * block[2]), lockstep != 0, {}, {}, {}};
  launch.barriers_reached.assign(launch.threads, 0);
  launch.in_group.reset(launch.threads);
  launch.between_groups.reset(launch.threads);
  pool->run(launch);
  if (launch.failed) std::snprintf(error, error_size, "%s", launch.message);
  return launch.failed ? -1 : 0;
}
