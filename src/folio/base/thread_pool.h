// ThreadPool: a fixed set of worker threads for two kinds of work.
//
// - parallel_for(num_tasks, fn): fork-join data parallelism for kernels. The caller takes part,
//   so a pool of N threads has N-1 workers. Idle workers spin briefly before sleeping, because a
//   decode step issues one parallel_for every few microseconds and waking a sleeping thread costs
//   more than that. One parallel_for runs at a time per pool; concurrent callers are serialized
//   (also those that run inline), and a parallel_for issued from inside one of this pool's tasks
//   runs inline on the calling thread with that task's thread_index. A task of pool A may call
//   pool B's parallel_for (it waits its turn on B), but not in a cycle: a task of B then calling
//   A's parallel_for would wait on A's running job forever.
// - submit(task): fire-and-forget background work (loading, copying), run by the same workers
//   when no parallel_for is in progress.
//
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "folio/base/function_ref.h"
#include "folio/base/mutex.h"

namespace folio {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means no workers, everything runs inline.
  // Requires: num_threads >= 1.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs task(task_index, thread_index) for every task_index in [0, num_tasks), spread over the
  // pool's threads; returns when all have finished. thread_index is in [0, num_threads()) and
  // identifies the running thread (for per-thread scratch space): no two tasks run at the same
  // time with the same thread_index.
  void parallel_for(int64_t num_tasks,
                    FunctionRef<void(int64_t task_index, int thread_index)> task);

  // Splits [0, num_items) into ranges of at least `grain` items, at most a few per thread, and
  // runs body(begin, end, thread_index) on each.
  void parallel_range(int64_t num_items, int64_t grain,
                      FunctionRef<void(int64_t begin, int64_t end, int thread_index)> body);

  std::future<void> submit(std::function<void()> task);

  // The number of threads a default pool uses: FOLIO_NUM_THREADS if set, else hardware threads.
  static int default_num_threads();

 private:
  void worker_loop(int thread_index);
  // Claims and runs tasks of the current job until none is left.
  void run_tasks(int thread_index);
  bool has_unclaimed_task() const;

  std::vector<std::thread> workers_;

  // Serializes parallel_for callers; job_task_ and job_generation_ are written only while
  // it is held.
  Mutex job_mutex_;
  uint32_t job_generation_ FOLIO_GUARDED_BY(job_mutex_) = 0;
  FunctionRef<void(int64_t, int)>* job_task_ = nullptr;

  // The current job in one word: generation (20 bits) | task count (22 bits) | next task (22
  // bits). Claiming a task is one CAS on the whole word, so a worker holding a stale view of an
  // older job can never claim a task of a newer one (barring 2^20 jobs passing between its load
  // and its CAS). The caller publishes a job by storing the word with seq_cst (release part:
  // publishes job_task_; seq_cst part: orders it against a sleeper's num_sleeping_ increment);
  // workers claim with an acq_rel CAS whose acquire pairs with that release.
  std::atomic<uint64_t> job_cursor_{0};
  // Tasks finished in the current job. Workers add with release after running a task; the
  // caller reads with acquire until it equals the task count, so every task's writes are
  // visible to the caller when parallel_for returns, and no worker touches job_task_ after.
  std::atomic<int64_t> job_completed_{0};

  // Sleeping and background tasks.
  Mutex sleep_mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> background_tasks_ FOLIO_GUARDED_BY(sleep_mutex_);
  bool stopping_ FOLIO_GUARDED_BY(sleep_mutex_) = false;
  // Workers inside wake_.wait. Incremented (seq_cst) before a sleeper re-checks for work; the
  // caller reads it (seq_cst) after publishing a job: one of the two sees the other.
  std::atomic<int> num_sleeping_{0};
};

}  // namespace folio
