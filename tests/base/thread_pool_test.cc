// ThreadPool under concurrency: every task runs exactly once, thread indices are in range and
// never shared by two running tasks, nested and concurrent callers, background tasks, and
// shutdown. Not a benchmark; sizes are kept small so the binary stays fast under TSAN.
#include "folio/base/thread_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace folio {
namespace {

// Records which thread indices are running a task right now; two tasks with the same index at
// the same time would corrupt per-thread scratch space, so that is counted as a collision.
class IndexOwnership {
 public:
  explicit IndexOwnership(int num_threads) : busy_(static_cast<size_t>(num_threads)) {}
  void enter(int thread_index) {
    if (busy_[static_cast<size_t>(thread_index)].exchange(true, std::memory_order_acq_rel)) {
      collisions_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void leave(int thread_index) {
    busy_[static_cast<size_t>(thread_index)].store(false, std::memory_order_release);
  }
  int collisions() const { return collisions_.load(); }

 private:
  std::vector<std::atomic<bool>> busy_;
  std::atomic<int> collisions_{0};
};

void spin_briefly(int iterations) {
  std::atomic<int> sink{0};
  for (int i = 0; i < iterations; ++i) sink.fetch_add(1, std::memory_order_relaxed);
}

TEST(ThreadPoolTest, EveryIndexRunsExactlyOnceForManySizes) {
  for (int num_threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(num_threads);
    EXPECT_EQ(pool.num_threads(), num_threads);
    for (int64_t num_tasks : {0, 1, 2, 3, 7, 64, 1000, 4097}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(num_tasks));
      std::atomic<int> out_of_range{0};
      pool.parallel_for(num_tasks, [&](int64_t task_index, int thread_index) {
        runs[static_cast<size_t>(task_index)].fetch_add(1, std::memory_order_relaxed);
        if (thread_index < 0 || thread_index >= num_threads) out_of_range.fetch_add(1);
      });
      for (int64_t i = 0; i < num_tasks; ++i) {
        ASSERT_EQ(runs[static_cast<size_t>(i)].load(), 1)
            << "task " << i << " of " << num_tasks << " on " << num_threads << " threads";
      }
      EXPECT_EQ(out_of_range.load(), 0);
    }
  }
}

TEST(ThreadPoolTest, TaskWritesAreVisibleWhenParallelForReturns) {
  ThreadPool pool(4);
  std::vector<int64_t> squares(5000);  // plain ints: the join must publish them
  for (int round = 0; round < 20; ++round) {
    pool.parallel_for(static_cast<int64_t>(squares.size()),
                      [&](int64_t i, int) { squares[static_cast<size_t>(i)] = i * i + round; });
    for (size_t i = 0; i < squares.size(); ++i) {
      ASSERT_EQ(squares[i], static_cast<int64_t>(i * i) + round);
    }
  }
}

TEST(ThreadPoolTest, ParallelRangeCoversEveryItemOnce) {
  ThreadPool pool(3);
  for (int64_t num_items : {1, 2, 5, 100, 12345}) {
    for (int64_t grain : {0, 1, 7, 1000, 100000}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(num_items));
      pool.parallel_range(num_items, grain, [&](int64_t begin, int64_t end, int thread_index) {
        EXPECT_LT(begin, end);
        EXPECT_GE(thread_index, 0);
        EXPECT_LT(thread_index, 3);
        for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
      });
      for (auto& count : seen) ASSERT_EQ(count.load(), 1) << num_items << " / " << grain;
    }
  }
}

// Spins until `count` reaches `target` or a generous deadline passes; says which.
bool wait_for_count(const std::atomic<int>& count, int target) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (count.load() < target) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(ThreadPoolTest, NestedParallelForRunsInlineWithTheOuterThreadIndex) {
  ThreadPool pool(4);
  IndexOwnership ownership(4);
  std::vector<std::atomic<int>> runs(64 * 16);
  std::atomic<int> wrong_thread{0};
  std::atomic<int> outer_started{0};
  pool.parallel_for(64, [&](int64_t outer, int outer_index) {
    // The first tasks wait for each other, so nested calls run on several threads at once
    // (otherwise one fast thread may claim every outer task).
    if (outer_started.fetch_add(1) < 2 && !wait_for_count(outer_started, 2)) {
      wrong_thread.fetch_add(1000);
    }
    const std::thread::id outer_thread = std::this_thread::get_id();
    pool.parallel_for(16, [&](int64_t inner, int inner_index) {
      if (std::this_thread::get_id() != outer_thread || inner_index != outer_index) {
        wrong_thread.fetch_add(1);
      }
      ownership.enter(inner_index);
      spin_briefly(200);
      ownership.leave(inner_index);
      runs[static_cast<size_t>(outer * 16 + inner)].fetch_add(1);
    });
  });
  for (auto& count : runs) ASSERT_EQ(count.load(), 1);
  EXPECT_EQ(wrong_thread.load(), 0);
  EXPECT_EQ(ownership.collisions(), 0);
}

TEST(ThreadPoolTest, ConcurrentCallersAreSerializedAndNeverShareAThreadIndex) {
  // A pool of 1 runs every call inline, and 1-task calls run inline on any pool: those must
  // still wait their turn, since they run as thread index 0 like every other caller.
  for (int num_threads : {1, 3}) {
    ThreadPool pool(num_threads);
    IndexOwnership ownership(num_threads);
    std::atomic<int> failures{0};
    std::vector<std::thread> callers;
    for (int caller = 0; caller < 4; ++caller) {
      callers.emplace_back([&, caller] {
        std::mt19937 rng(static_cast<uint32_t>(caller));
        for (int call = 0; call < 150; ++call) {
          const int64_t num_tasks = rng() % 4 == 0 ? 1 : 2 + static_cast<int64_t>(rng() % 30);
          std::vector<int> hits(static_cast<size_t>(num_tasks), 0);
          pool.parallel_for(num_tasks, [&](int64_t task_index, int thread_index) {
            ownership.enter(thread_index);
            ++hits[static_cast<size_t>(task_index)];
            spin_briefly(100);
            ownership.leave(thread_index);
          });
          for (int hit : hits) {
            if (hit != 1) failures.fetch_add(1);
          }
        }
      });
    }
    for (std::thread& caller : callers) caller.join();
    EXPECT_EQ(failures.load(), 0) << num_threads << " threads";
    EXPECT_EQ(ownership.collisions(), 0) << num_threads << " threads";
  }
}

TEST(ThreadPoolTest, SubmitRunsTasksAndFulfilsFutures) {
  ThreadPool pool(3);
  std::atomic<int> done{0};
  std::vector<std::future<void>> futures;
  for (int i = 0; i < 100; ++i) {
    futures.push_back(pool.submit([&] { done.fetch_add(1); }));
  }
  // Background work interleaves with parallel_for calls from this thread.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, [&](int64_t i, int) { sum.fetch_add(i); });
  for (auto& future : futures) future.get();
  EXPECT_EQ(done.load(), 100);
  EXPECT_EQ(sum.load(), 4950);
}

TEST(ThreadPoolTest, BackgroundTaskMayCallParallelFor) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> runs(100);
  pool.submit([&] {
        pool.parallel_for(100, [&](int64_t i, int) { runs[static_cast<size_t>(i)].fetch_add(1); });
      })
      .get();
  for (auto& count : runs) EXPECT_EQ(count.load(), 1);
}

TEST(ThreadPoolTest, PoolOfOneThreadRunsEverythingOnTheCaller) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  int runs = 0;  // plain int: everything runs on this thread
  pool.parallel_for(10, [&](int64_t, int thread_index) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(thread_index, 0);
    ++runs;
  });
  EXPECT_EQ(runs, 10);
  std::future<void> future = pool.submit([&] {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    ++runs;
  });
  // Submitted work ran before submit returned.
  EXPECT_EQ(future.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(runs, 11);
}

TEST(ThreadPoolTest, DestructionCompletesPendingBackgroundTasks) {
  std::atomic<int> done{0};
  {
    ThreadPool pool(3);
    for (int i = 0; i < 40; ++i) {
      pool.submit([&] {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        done.fetch_add(1);
      });
    }
  }
  EXPECT_EQ(done.load(), 40);
}

// After many jobs, some started while workers slept, every worker must still be alive: N-1
// background tasks that wait for each other only finish if N-1 workers run them at once.
TEST(ThreadPoolTest, AllWorkersStayAliveAcrossSleepAndWake) {
  constexpr int kNumThreads = 4;
  std::atomic<int> arrived{0};  // these outlive the pool, whose tasks use them
  std::atomic<int> met{0};
  ThreadPool pool(kNumThreads);
  std::mt19937 rng(7);
  for (int job = 0; job < 300; ++job) {
    const int work = static_cast<int>(rng() % 2000);
    pool.parallel_for(2 + static_cast<int64_t>(rng() % 4),
                      [&](int64_t, int) { spin_briefly(work); });
    // Now and then pause long enough for the workers to stop spinning and sleep.
    if (job % 3 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::vector<std::future<void>> futures;
  for (int i = 0; i < kNumThreads - 1; ++i) {
    futures.push_back(pool.submit([&] {
      arrived.fetch_add(1);
      if (wait_for_count(arrived, kNumThreads - 1)) met.fetch_add(1);
    }));
  }
  // A generous bound turns a lost worker into a failure instead of a hang.
  for (auto& future : futures) {
    ASSERT_EQ(future.wait_for(std::chrono::seconds(60)), std::future_status::ready)
        << "a background task never ran: every worker is gone";
  }
  EXPECT_EQ(met.load(), kNumThreads - 1) << "the tasks did not run at once: a worker is gone";
}

}  // namespace
}  // namespace folio
