#include "folio/memory/pool_metrics.h"

#include "folio/base/log.h"
#include "folio/memory/latency_histogram.h"
#include "folio/memory/page_pool.h"

namespace folio::memory {

PoolMetrics::PoolMetrics(metrics::Registry& registry, std::string pool_name)
    : registry_(registry), pool_name_(std::move(pool_name)) {}

Result<std::unique_ptr<PoolMetrics>> PoolMetrics::create(metrics::Registry& registry,
                                                         const PagePool& pool) {
  std::unique_ptr<PoolMetrics> result(new PoolMetrics(registry, pool.options().name));
  // On failure the destructor removes the gauge functions registered so far.
  FOLIO_RETURN_IF_ERROR(result->register_all(pool));
  return result;
}

PoolMetrics::~PoolMetrics() {
  for (const auto& [name, labels] : gauge_functions_) {
    if (Status removed = registry_.remove_gauge_function(name, labels); !removed.ok()) {
      log::error("page pool '{}': removing metric {}: {}", pool_name_, name, removed);
    }
  }
}

metrics::Labels PoolMetrics::labels(std::string name, std::string value) const {
  metrics::Labels result = {{"pool", pool_name_}};
  if (!name.empty()) result.emplace_back(std::move(name), std::move(value));
  return result;
}

Status PoolMetrics::add_gauge_function(const std::string& name, const std::string& help,
                                       metrics::Labels labels, std::function<double()> read) {
  FOLIO_RETURN_IF_ERROR(registry_.gauge_function(name, help, labels, std::move(read)));
  gauge_functions_.emplace_back(name, std::move(labels));
  return Status();
}

Status PoolMetrics::register_all(const PagePool& pool) {
  FOLIO_RETURN_IF_ERROR(register_state_gauges(pool));
  FOLIO_RETURN_IF_ERROR(register_content_series(pool));
  const PagePool* source = &pool;
  FOLIO_RETURN_IF_ERROR(add_gauge_function(
      "folio_pool_capacity_bytes", "Bytes of the page pool's budget.", labels(),
      [source] { return static_cast<double>(source->num_pages()) * source->page_size(); }));
  FOLIO_RETURN_IF_ERROR(add_gauge_function("folio_pool_utilization",
                                           "Fraction of the page pool's pages not free.", labels(),
                                           [source] { return source->stats().utilization; }));
  FOLIO_RETURN_IF_ERROR(
      add_gauge_function("folio_pool_fragmentation_ratio",
                         "Longest free run over free pages (1 when nothing is fragmented).",
                         labels(), [source] { return source->stats().fragmentation_ratio; }));
  FOLIO_ASSIGN_OR_RETURN(
      pin_contention_,
      registry_.counter("folio_pool_pin_contention_total",
                        "Compare-and-swap retries in pin, unpin and free.", labels()));
  FOLIO_ASSIGN_OR_RETURN(failed_allocations_,
                         registry_.counter("folio_pool_failed_allocations_total",
                                           "Allocations refused for lack of pages.", labels()));
  std::vector<double> bounds;
  for (int bucket = 0; bucket < LatencyHistogram::kNumBounds; ++bucket) {
    bounds.push_back(LatencyHistogram::upper_bound_ns(bucket) * 1e-9);
  }
  FOLIO_ASSIGN_OR_RETURN(
      allocation_latency_,
      registry_.histogram("folio_pool_allocation_latency_seconds",
                          "Page pool allocation latency (sampled).", bounds, labels()));
  return Status();
}

Status PoolMetrics::register_state_gauges(const PagePool& pool) {
  const PagePool* source = &pool;
  const std::pair<PageState, int64_t PoolStats::*> states[] = {
      {PageState::kFree, &PoolStats::pages_free},
      {PageState::kThreadHeld, &PoolStats::pages_thread_held},
      {PageState::kReserved, &PoolStats::pages_reserved},
      {PageState::kUnpinned, &PoolStats::pages_unpinned},
      {PageState::kPinned, &PoolStats::pages_pinned},
      {PageState::kReleasing, &PoolStats::pages_releasing}};
  for (const auto& [state, field] : states) {
    FOLIO_RETURN_IF_ERROR(add_gauge_function(
        "folio_pool_pages", "Pages of the page pool in each state.",
        labels("state", std::string(page_state_name(state))),
        [source, field = field] { return static_cast<double>(source->stats().*field); }));
  }
  return Status();
}

Status PoolMetrics::register_content_series(const PagePool& pool) {
  const PagePool* source = &pool;
  const auto page_bytes = static_cast<double>(pool.page_size());
  const std::pair<const char*, int64_t ContentStats::*> per_content[] = {
      {"folio_pool_bytes_in_use", &ContentStats::pages_in_use},
      {"folio_pool_bytes_pinned", &ContentStats::pages_pinned},
      {"folio_pool_bytes_evictable", &ContentStats::pages_evictable}};
  for (ContentType content : kAllContentTypes) {
    const std::string content_name(content_type_name(content));
    for (const auto& [name, field] : per_content) {
      FOLIO_RETURN_IF_ERROR(add_gauge_function(
          name, "Bytes of the page pool's committed allocations, by content type.",
          labels("content", content_name), [source, field = field, content, page_bytes] {
            return page_bytes *
                   static_cast<double>(source->stats().per_content[content_index(content)].*field);
          }));
    }
    FOLIO_ASSIGN_OR_RETURN(
        evictions_[content_index(content)],
        registry_.counter("folio_pool_evictions_total", "Allocations the page pool evicted.",
                          labels("content", content_name)));
    FOLIO_ASSIGN_OR_RETURN(
        evicted_bytes_[content_index(content)],
        registry_.counter("folio_pool_evicted_bytes_total", "Bytes the page pool evicted.",
                          labels("content", content_name)));
  }
  return Status();
}

void PoolMetrics::count_eviction(ContentType content, double bytes) {
  evictions_[content_index(content)]->increment();
  evicted_bytes_[content_index(content)]->increment(bytes);
}

}  // namespace folio::memory
