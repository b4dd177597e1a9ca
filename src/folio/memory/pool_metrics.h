// PoolMetrics: the page pool's statistics in the metrics registry (seed 001 §11), every series
// labelled pool=<PagePoolOptions::name>.
//
// Read at render time (gauge functions over PagePool::stats()):
//   folio_pool_pages{state}                  pages per state (free, thread_held, reserved, ...)
//   folio_pool_bytes_in_use{content}         committed bytes per content type
//   folio_pool_bytes_pinned{content}, folio_pool_bytes_evictable{content}
//   folio_pool_capacity_bytes, folio_pool_utilization, folio_pool_fragmentation_ratio
// Updated when they happen (counters and a histogram):
//   folio_pool_evictions_total{content}, folio_pool_evicted_bytes_total{content}
//   folio_pool_pin_contention_total          compare-and-swap retries in pin/unpin/free
//   folio_pool_failed_allocations_total      kResourceExhausted answers
//   folio_pool_allocation_latency_seconds    sampled (PagePoolOptions::latency_sample_period)
//
// Lifetime: made by the pool when PagePoolOptions::metrics is set and destroyed with it; the
// destructor removes the gauge functions, after which the registry never calls into the pool
// again. Counters stay in the registry (a registry keeps every metric it handed out). The
// registry must outlive the pool.
//
// Thread-safety: the count_* and observe_* methods may be called from any thread (lock-free).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/memory/content_type.h"

namespace folio::memory {

class PagePool;

class PoolMetrics {
 public:
  // Registers every series. kAlreadyExists (or the registry's error) when another live pool
  // with the same name already exports to this registry; nothing stays registered on failure.
  static Result<std::unique_ptr<PoolMetrics>> create(metrics::Registry& registry,
                                                     const PagePool& pool);
  ~PoolMetrics();
  PoolMetrics(const PoolMetrics&) = delete;
  PoolMetrics& operator=(const PoolMetrics&) = delete;

  void count_eviction(ContentType content, double bytes);
  void count_pin_contention() { pin_contention_->increment(); }
  void count_failed_allocation() { failed_allocations_->increment(); }
  void observe_allocation_latency(double nanoseconds) {
    allocation_latency_->observe(nanoseconds * 1e-9);
  }

 private:
  PoolMetrics(metrics::Registry& registry, std::string pool_name);
  Status register_all(const PagePool& pool);
  Status register_state_gauges(const PagePool& pool);
  Status register_content_series(const PagePool& pool);
  Status add_gauge_function(const std::string& name, const std::string& help,
                            metrics::Labels labels, std::function<double()> read);
  metrics::Labels labels(std::string name = {}, std::string value = {}) const;

  metrics::Registry& registry_;
  const std::string pool_name_;
  std::vector<std::pair<std::string, metrics::Labels>> gauge_functions_;
  std::array<metrics::Counter*, kNumContentTypes> evictions_{};
  std::array<metrics::Counter*, kNumContentTypes> evicted_bytes_{};
  metrics::Counter* pin_contention_ = nullptr;
  metrics::Counter* failed_allocations_ = nullptr;
  metrics::Histogram* allocation_latency_ = nullptr;
};

}  // namespace folio::memory
