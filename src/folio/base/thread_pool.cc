#include "folio/base/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "folio/base/check.h"

namespace folio {
namespace {

// The pool whose parallel_for task this thread is running (null outside tasks) and the
// thread_index it runs it as. A nested parallel_for on the same pool runs inline, instead of
// deadlocking on job_mutex_, and keeps that index, so per-thread scratch stays private.
thread_local const ThreadPool* tls_task_pool = nullptr;
thread_local int tls_task_thread_index = 0;

// Marks this thread as running tasks of `pool` as `thread_index` for its lifetime.
class TaskScope {
 public:
  TaskScope(const ThreadPool* pool, int thread_index)
      : outer_pool_(tls_task_pool), outer_thread_index_(tls_task_thread_index) {
    tls_task_pool = pool;
    tls_task_thread_index = thread_index;
  }
  ~TaskScope() {
    tls_task_pool = outer_pool_;
    tls_task_thread_index = outer_thread_index_;
  }
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;

 private:
  const ThreadPool* outer_pool_;
  int outer_thread_index_;
};

// Spins this many times checking for a new job before a worker goes to sleep.
constexpr int kSpinIterations = 20000;

constexpr int kFieldBits = 22;
constexpr uint64_t kFieldMask = (uint64_t{1} << kFieldBits) - 1;
constexpr uint64_t kGenerationMask = (uint64_t{1} << (64 - 2 * kFieldBits)) - 1;

uint64_t next_task(uint64_t cursor) {
  return cursor & kFieldMask;
}
uint64_t task_limit(uint64_t cursor) {
  return (cursor >> kFieldBits) & kFieldMask;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

int ThreadPool::default_num_threads() {
  if (const char* value = std::getenv("FOLIO_NUM_THREADS")) {
    const int parsed = std::atoi(value);
    if (parsed >= 1) return parsed;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

ThreadPool::ThreadPool(int num_threads) {
  FOLIO_CHECK(num_threads >= 1, "thread pool needs at least one thread, got {}", num_threads);
  workers_.reserve(num_threads - 1);
  for (int i = 1; i < num_threads; ++i) {
    workers_.emplace_back([this, i] { worker_loop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    MutexLock lock(sleep_mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

bool ThreadPool::has_unclaimed_task() const {
  const uint64_t cursor = job_cursor_.load(std::memory_order_seq_cst);
  return next_task(cursor) < task_limit(cursor);
}

void ThreadPool::run_tasks(int thread_index) {
  uint64_t cursor = job_cursor_.load(std::memory_order_acquire);
  while (next_task(cursor) < task_limit(cursor)) {
    // Acquire pairs with the caller's publishing store, making job_task_ visible.
    if (!job_cursor_.compare_exchange_weak(cursor, cursor + 1, std::memory_order_acq_rel,
                                           std::memory_order_acquire)) {
      continue;
    }
    {
      TaskScope scope(this, thread_index);
      (*job_task_)(static_cast<int64_t>(next_task(cursor)), thread_index);
    }
    // Release: publishes the task's writes to the caller's acquire load of job_completed_.
    job_completed_.fetch_add(1, std::memory_order_release);
    cursor = job_cursor_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int64_t num_tasks,
                              FunctionRef<void(int64_t task_index, int thread_index)> task) {
  if (num_tasks <= 0) return;
  if (tls_task_pool == this) {
    // Nested in one of this pool's tasks: the outer job holds job_mutex_ and this thread's
    // index is its own, so run inline under the same index.
    const int thread_index = tls_task_thread_index;
    for (int64_t i = 0; i < num_tasks; ++i) task(i, thread_index);
    return;
  }
  // Even the inline cases below hold job_mutex_: thread_index 0 belongs to whichever caller
  // holds it, and two unserialized callers would both run as 0.
  MutexLock job_lock(job_mutex_);
  if (workers_.empty() || num_tasks == 1) {
    TaskScope scope(this, 0);
    for (int64_t i = 0; i < num_tasks; ++i) task(i, 0);
    return;
  }
  FOLIO_CHECK(static_cast<uint64_t>(num_tasks) <= kFieldMask,
              "parallel_for over {} tasks; split the work into fewer, larger tasks", num_tasks);

  job_generation_ = static_cast<uint32_t>((job_generation_ + 1) & kGenerationMask);
  job_task_ = &task;
  job_completed_.store(0, std::memory_order_relaxed);
  const uint64_t cursor = (uint64_t{job_generation_} << (2 * kFieldBits)) |
                          (static_cast<uint64_t>(num_tasks) << kFieldBits);
  job_cursor_.store(cursor, std::memory_order_seq_cst);
  if (num_sleeping_.load(std::memory_order_seq_cst) > 0) {
    // Taking the mutex orders this notify after a sleeper's last check of the cursor.
    MutexLock lock(sleep_mutex_);
    wake_.notify_all();
  }

  run_tasks(0);
  // Acquire: pairs with each worker's release increment, so all tasks' writes are visible.
  while (job_completed_.load(std::memory_order_acquire) < num_tasks) cpu_relax();
}

void ThreadPool::parallel_range(
    int64_t num_items, int64_t grain,
    FunctionRef<void(int64_t begin, int64_t end, int thread_index)> body) {
  if (num_items <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t max_tasks = static_cast<int64_t>(num_threads()) * 4;
  const int64_t num_tasks = std::clamp<int64_t>(num_items / grain, 1, max_tasks);
  const int64_t chunk = (num_items + num_tasks - 1) / num_tasks;
  parallel_for(num_tasks, [&](int64_t task_index, int thread_index) {
    const int64_t begin = task_index * chunk;
    const int64_t end = std::min(num_items, begin + chunk);
    if (begin < end) body(begin, end, thread_index);
  });
}

std::future<void> ThreadPool::submit(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  std::future<void> future = packaged.get_future();
  if (workers_.empty()) {
    packaged();
    return future;
  }
  {
    MutexLock lock(sleep_mutex_);
    background_tasks_.push_back(std::move(packaged));
  }
  wake_.notify_one();
  return future;
}

void ThreadPool::worker_loop(int thread_index) {
  while (true) {
    // Spin for a new job first: cheaper than a sleep/wake round trip for back-to-back kernels.
    for (int spin = 0; spin < kSpinIterations; ++spin) {
      if (has_unclaimed_task()) break;
      cpu_relax();
    }
    if (has_unclaimed_task()) {
      run_tasks(thread_index);
      continue;
    }

    std::packaged_task<void()> background;
    {
      MutexLock lock(sleep_mutex_);
      num_sleeping_.fetch_add(1, std::memory_order_seq_cst);
      lock.wait(wake_, [&]() FOLIO_REQUIRES(sleep_mutex_) {
        return stopping_ || !background_tasks_.empty() || has_unclaimed_task();
      });
      num_sleeping_.fetch_sub(1, std::memory_order_relaxed);
      if (has_unclaimed_task()) continue;
      if (background_tasks_.empty()) {
        // Either stopping with nothing left to run, or woken for a job whose last task was
        // claimed between the wait's check and this one: that worker must sleep again, not exit.
        if (stopping_) return;
        continue;
      }
      background = std::move(background_tasks_.front());
      background_tasks_.pop_front();
    }
    background();
  }
}

}  // namespace folio
