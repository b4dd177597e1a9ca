// Mutex and MutexLock: std::mutex and its scoped lock with clang's thread-safety attributes
// (thread_annotations.h). libstdc++'s std::mutex and std::lock_guard carry none, so a member
// marked FOLIO_GUARDED_BY(mutex_) is only checked when mutex_ is a folio::Mutex locked through
// folio::MutexLock (or Mutex's own lock/try_lock/unlock).
//
// Waiting: MutexLock::wait* take the std::condition_variable itself, so condition variables
// stay std::condition_variable (no condition_variable_any and its extra internal mutex). The
// analysis cannot see into the waits, and it checks a predicate lambda as a function of its
// own: one that reads guarded members says so, `[&]() FOLIO_REQUIRES(mutex_) { ... }`, and the
// wait calls it only with the mutex held, as std::condition_variable::wait does.
//
// Thread-safety: a Mutex is shared by the threads it serializes; a MutexLock belongs to the
// thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "folio/base/thread_annotations.h"

namespace folio {

class FOLIO_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() FOLIO_ACQUIRE() { mutex_.lock(); }
  void unlock() FOLIO_RELEASE() { mutex_.unlock(); }
  [[nodiscard]] bool try_lock() FOLIO_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  friend class MutexLock;  // waits hand the std::mutex to std::condition_variable
  std::mutex mutex_;
};

// Holds a Mutex from construction to destruction.
class FOLIO_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) FOLIO_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  // Takes over a mutex this thread already locked (a successful try_lock) and unlocks it at
  // the end of the scope.
  MutexLock(Mutex& mutex, std::adopt_lock_t) FOLIO_REQUIRES(mutex) : mutex_(mutex) {}
  ~MutexLock() FOLIO_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases the mutex while blocked on `condition` and holds it again on return, also after a
  // spurious wake-up: callers re-check their condition, or pass it as `ready`.
  void wait(std::condition_variable& condition) FOLIO_NO_THREAD_SAFETY_ANALYSIS {
    // The analysis cannot see the unlock inside the wait; the mutex is held again on return.
    with_unique_lock([&](std::unique_lock<std::mutex>& lock) { condition.wait(lock); });
  }

  // Returns once ready() is true; ready() runs with the mutex held.
  template <typename Predicate>
  void wait(std::condition_variable& condition, Predicate ready) FOLIO_NO_THREAD_SAFETY_ANALYSIS {
    // As above; and ready() runs with the mutex held, which its own annotation states.
    with_unique_lock(
        [&](std::unique_lock<std::mutex>& lock) { condition.wait(lock, std::move(ready)); });
  }

  // Returns ready() at the end: true when it became true, false when `timeout` passed first.
  template <typename Rep, typename Period, typename Predicate>
  bool wait_for(std::condition_variable& condition, std::chrono::duration<Rep, Period> timeout,
                Predicate ready) FOLIO_NO_THREAD_SAFETY_ANALYSIS {
    // As for wait().
    bool result = false;
    with_unique_lock([&](std::unique_lock<std::mutex>& lock) {
      result = condition.wait_for(lock, timeout, std::move(ready));
    });
    return result;
  }

  template <typename Clock, typename Duration, typename Predicate>
  bool wait_until(std::condition_variable& condition,
                  std::chrono::time_point<Clock, Duration> deadline,
                  Predicate ready) FOLIO_NO_THREAD_SAFETY_ANALYSIS {
    // As for wait().
    bool result = false;
    with_unique_lock([&](std::unique_lock<std::mutex>& lock) {
      result = condition.wait_until(lock, deadline, std::move(ready));
    });
    return result;
  }

 private:
  // Lends the held std::mutex to `body` as a std::unique_lock, and takes it back, still locked,
  // when body returns or throws (a condition variable relocks before either).
  template <typename Body>
  void with_unique_lock(Body&& body) {
    std::unique_lock<std::mutex> lock(mutex_.mutex_, std::adopt_lock);
    struct Disown {
      std::unique_lock<std::mutex>& lock;
      ~Disown() { lock.release(); }
    } disown{lock};
    body(lock);
  }

  Mutex& mutex_;
};

}  // namespace folio
