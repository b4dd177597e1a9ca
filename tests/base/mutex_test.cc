// Mutex and MutexLock: mutual exclusion, try_lock, adopting a lock, and the condition-variable
// waits (woken by a notify, timing out, a predicate that reads guarded state). The members
// here are annotated, so the thread-safety build also checks this file's own locking when it
// compiles tests. Not a benchmark; small sizes keep it fast under TSAN.
#include "folio/base/mutex.h"

#include <chrono>
#include <condition_variable>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "folio/base/thread_annotations.h"

namespace folio {
namespace {

class Counter {
 public:
  void add(int amount) {
    MutexLock lock(mutex_);
    value_ += amount;
  }
  int value() const {
    MutexLock lock(mutex_);
    return value_;
  }

 private:
  mutable Mutex mutex_;
  int value_ FOLIO_GUARDED_BY(mutex_) = 0;
};

TEST(MutexTest, MutexLockSerializesIncrementsFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kIncrements = 2000;
  Counter counter;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) counter.add(1);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counter.value(), kThreads * kIncrements);
}

// Whether another thread could take `mutex` right now (taking and at once dropping it).
bool free_for_another_thread(Mutex& mutex) {
  bool taken = false;
  // std::mutex::try_lock from the owning thread is undefined, so ask from another thread.
  std::thread([&] {
    if (mutex.try_lock()) {
      taken = true;
      mutex.unlock();
    }
  }).join();
  return taken;
}

TEST(MutexTest, TryLockFailsWhileAnotherThreadHoldsTheMutex) {
  Mutex mutex;
  bool free_while_held = true;
  {
    MutexLock lock(mutex);
    free_while_held = free_for_another_thread(mutex);
  }
  EXPECT_FALSE(free_while_held);
  EXPECT_TRUE(free_for_another_thread(mutex));
}

TEST(MutexTest, AdoptingLockUnlocksAtScopeEnd) {
  Mutex mutex;
  if (mutex.try_lock()) {
    MutexLock lock(mutex, std::adopt_lock);
  } else {
    FAIL() << "try_lock of a free mutex failed";
  }
  EXPECT_TRUE(free_for_another_thread(mutex));
}

// A one-shot flag under a mutex, the shape the engine's and server's waits take.
class Gate {
 public:
  void open() {
    {
      MutexLock lock(mutex_);
      open_ = true;
    }
    opened_.notify_all();
  }
  void wait_open() {
    MutexLock lock(mutex_);
    lock.wait(opened_, [&]() FOLIO_REQUIRES(mutex_) { return open_; });
  }
  bool wait_open_for(std::chrono::milliseconds timeout) {
    MutexLock lock(mutex_);
    return lock.wait_for(opened_, timeout, [&]() FOLIO_REQUIRES(mutex_) { return open_; });
  }
  bool wait_open_until(std::chrono::steady_clock::time_point deadline) {
    MutexLock lock(mutex_);
    return lock.wait_until(opened_, deadline, [&]() FOLIO_REQUIRES(mutex_) { return open_; });
  }
  // The plain wait, looping on spurious wake-ups; returns holding the lock (checked by reading).
  void wait_open_looping() {
    MutexLock lock(mutex_);
    while (!open_) lock.wait(opened_);
    EXPECT_TRUE(open_);
  }

 private:
  Mutex mutex_;
  std::condition_variable opened_;
  bool open_ FOLIO_GUARDED_BY(mutex_) = false;
};

TEST(MutexTest, WaitReturnsOnceAnotherThreadOpensTheGate) {
  Gate gate;
  std::thread opener([&] { gate.open(); });
  gate.wait_open();
  opener.join();
  gate.wait_open_looping();
}

TEST(MutexTest, WaitForTimesOutWhenNobodyOpens) {
  Gate gate;
  EXPECT_FALSE(gate.wait_open_for(std::chrono::milliseconds(5)));
  EXPECT_FALSE(gate.wait_open_until(std::chrono::steady_clock::now()));
}

TEST(MutexTest, WaitForReturnsTrueWhenOpenedInTime) {
  Gate gate;
  std::thread opener([&] { gate.open(); });
  // Bounded, generous: the opener runs at once; the bound only keeps a bug from hanging CI.
  EXPECT_TRUE(gate.wait_open_for(std::chrono::seconds(30)));
  opener.join();
  EXPECT_TRUE(gate.wait_open_until(std::chrono::steady_clock::now()));
}

TEST(MutexTest, WaitHoldsTheMutexAgainOnReturn) {
  Mutex mutex;
  std::condition_variable changed;
  bool ready = false;  // under mutex
  bool free_after_wait = true;
  std::thread opener([&] {
    {
      MutexLock lock(mutex);
      ready = true;
    }
    changed.notify_all();
  });
  {
    MutexLock lock(mutex);
    lock.wait(changed, [&] { return ready; });
    opener.join();
    free_after_wait = free_for_another_thread(mutex);
  }
  EXPECT_FALSE(free_after_wait);
}

}  // namespace
}  // namespace folio
