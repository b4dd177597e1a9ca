#include "folio/memory/latency_histogram.h"

#include <cmath>

namespace folio::memory {

double LatencyHistogram::upper_bound_ns(int bucket) {
  return std::ldexp(kFirstBoundNs, bucket);
}

void LatencyHistogram::observe(double nanoseconds) {
  int bucket = 0;
  while (bucket < kNumBounds && nanoseconds > upper_bound_ns(bucket)) ++bucket;
  counts_[bucket].fetch_add(1, std::memory_order_relaxed);
  samples_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(nanoseconds, std::memory_order_relaxed);
}

LatencyHistogramSnapshot LatencyHistogram::snapshot() const {
  LatencyHistogramSnapshot snapshot;
  for (int bucket = 0; bucket < kNumBounds; ++bucket) {
    snapshot.upper_bounds_ns.push_back(upper_bound_ns(bucket));
  }
  for (const std::atomic<int64_t>& count : counts_) {
    snapshot.counts.push_back(count.load(std::memory_order_relaxed));
  }
  snapshot.samples = samples_.load(std::memory_order_relaxed);
  snapshot.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  return snapshot;
}

}  // namespace folio::memory
