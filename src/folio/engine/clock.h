// Clock: the engine's source of time, injected so tests can advance it by hand (STYLE.md: "a
// clock you advance by hand").
//
// The engine reads it for request arrival (aging, starvation), time to first token and time
// per output token. Time is a monotonic count of nanoseconds from an arbitrary origin.
//
// Thread-safety: now() may be called from any thread; ManualClock::advance() too.
#pragma once

#include <atomic>
#include <chrono>

namespace folio::engine {

using Duration = std::chrono::nanoseconds;
// Monotonic; only differences between two readings of one clock mean anything.
using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual TimePoint now() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  TimePoint now() const override {
    return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now());
  }
};

// Stands still until advanced.
class ManualClock final : public Clock {
 public:
  TimePoint now() const override {
    // Relaxed: the reading is a value standing on its own; nothing else is published with it.
    return TimePoint(Duration(nanoseconds_.load(std::memory_order_relaxed)));
  }
  // Requires: by >= 0 (the clock is monotonic).
  void advance(Duration by) { nanoseconds_.fetch_add(by.count(), std::memory_order_relaxed); }

 private:
  std::atomic<Duration::rep> nanoseconds_{0};
};

inline double to_seconds(Duration duration) {
  return std::chrono::duration<double>(duration).count();
}

}  // namespace folio::engine
