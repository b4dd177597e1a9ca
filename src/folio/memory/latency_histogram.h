// LatencyHistogram: the page pool's allocation latency, in fixed power-of-two buckets from 32 ns
// to about 1 ms, updated lock-free. Relaxed atomics: each count is a statistic standing on its
// own and publishes no other data.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "folio/memory/pool_stats.h"

namespace folio::memory {

class LatencyHistogram {
 public:
  static constexpr int kNumBounds = 16;
  static constexpr double kFirstBoundNs = 32;

  // Upper bound of bucket i: 32 ns * 2^i.
  static double upper_bound_ns(int bucket);
  void observe(double nanoseconds);
  LatencyHistogramSnapshot snapshot() const;

 private:
  std::array<std::atomic<int64_t>, kNumBounds + 1> counts_{};
  std::atomic<int64_t> samples_{0};
  std::atomic<double> sum_ns_{0};
};

}  // namespace folio::memory
