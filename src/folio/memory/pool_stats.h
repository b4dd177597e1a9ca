// PoolStats: a snapshot of the page pool's statistics (seed 001 §11), and PageInfo: one page's
// row of the metadata table. Both are values; PagePool::stats() and page_info() make them.
//
// Counters are read without stopping other threads, so under concurrent use a snapshot may mix
// moments (a page counted pinned in one field and unpinned in another); with the pool quiescent
// every identity below holds exactly, and PagePool::check_invariants() verifies them.
//   pages_free + pages_thread_held + pages_reserved + pages_unpinned + pages_pinned
//     + pages_releasing == num_pages
//   pages_unpinned == sum of per_content[c].pages_evictable, likewise pinned
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "folio/memory/content_type.h"
#include "folio/memory/page_table.h"
#include "folio/memory/pool_types.h"

namespace folio::memory {

struct ContentStats {
  int64_t pages_in_use = 0;     // committed: pinned + evictable
  int64_t pages_pinned = 0;     // in allocations with pin count >= 1
  int64_t pages_evictable = 0;  // in allocations with pin count 0
  int64_t evictions = 0;        // allocations evicted so far
  int64_t pages_evicted = 0;
};

// Allocation latency, sampled (PagePoolOptions::latency_sample_period); non-cumulative counts,
// counts[i] for latencies <= upper_bounds_ns[i] (and > the previous bound); the last count is
// everything above the last bound.
struct LatencyHistogramSnapshot {
  std::vector<double> upper_bounds_ns;
  std::vector<int64_t> counts;  // upper_bounds_ns.size() + 1
  int64_t samples = 0;
  double sum_ns = 0;
};

struct PoolStats {
  size_t page_size = 0;
  int64_t num_pages = 0;
  uint64_t step = 0;

  int64_t pages_free = 0;         // in the global free index
  int64_t pages_thread_held = 0;  // free, held by thread caches
  int64_t pages_reserved = 0;     // prepared, not committed
  int64_t pages_unpinned = 0;     // evictable
  int64_t pages_pinned = 0;
  int64_t pages_releasing = 0;  // being evicted right now (their listener runs)

  // (num_pages - pages_free - pages_thread_held) / num_pages.
  double utilization = 0;
  // The longest free run, and largest_free_extent / pages_free (1 when nothing is free): the
  // seed's fragmentation ratio.
  int64_t largest_free_extent = 0;
  double fragmentation_ratio = 1;

  std::array<ContentStats, kNumContentTypes> per_content{};

  int64_t allocations = 0;         // committed, including through allocate()
  int64_t failed_allocations = 0;  // kResourceExhausted answers
  int64_t evictions = 0;           // allocations evicted, all content types
  int64_t pages_evicted = 0;
  int64_t pin_contention = 0;       // compare-and-swap retries in pin/unpin/free/touch
  int64_t thread_cache_drains = 0;  // times every thread cache was emptied to meet a request
  LatencyHistogramSnapshot allocation_latency;
};

struct PageInfo {
  PageState state = PageState::kFree;
  // The run the page belongs to: a free extent, a thread-held page, or an allocation.
  PageId run_first_page;
  int64_t run_pages = 0;
  // Allocation fields, meaningful for kReserved, kUnpinned, kPinned, kReleasing.
  ContentType content = ContentType::kTemporary;
  uint32_t pin_count = 0;
  uint64_t last_use = 0;
  uint64_t owner = 0;
  uint64_t generation = 0;
};

}  // namespace folio::memory
