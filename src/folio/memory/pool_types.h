// The vocabulary of the page pool's API: page ids, allocation references, allocation requests,
// eviction listeners and the pool's options. The pool itself is in page_pool.h.
//
// - PageId: a page's index in the pool; page p lives at PagePool::base() + p * page_size().
// - AllocationRef: names one allocation (a run of pages handed out together) as {first page,
//   length, generation, pool}. It is a plain value, copied freely, and only the pool makes one.
//   Once the allocation is freed or evicted the ref is *stale*: every pool call with it returns
//   kFailedPrecondition and changes nothing, even after its pages are allocated again.
// - EvictionListener: the owner of an allocation, told before the pool evicts it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "folio/base/strong_id.h"
#include "folio/memory/content_type.h"
#include "folio/memory/eviction_index.h"
#include "folio/memory/free_extent_index.h"

namespace folio::metrics {
class Registry;
}

namespace folio::memory {

struct PageIdTag {};
using PageId = StrongId<PageIdTag, int32_t>;

class AllocationRef {
 public:
  // An invalid ref; every pool call with it is kInvalidArgument.
  AllocationRef() = default;

  bool is_valid() const { return num_pages_ != 0; }
  PageId first_page() const { return PageId(static_cast<int32_t>(first_page_)); }
  int64_t num_pages() const { return num_pages_; }
  uint64_t generation() const { return generation_; }

  friend bool operator==(const AllocationRef&, const AllocationRef&) = default;

 private:
  friend class PagePool;
  AllocationRef(uint32_t first_page, uint32_t num_pages, uint64_t generation, uint64_t pool_serial)
      : first_page_(first_page),
        num_pages_(num_pages),
        generation_(generation),
        pool_serial_(pool_serial) {}

  uint32_t first_page_ = 0;
  uint32_t num_pages_ = 0;
  uint64_t generation_ = 0;
  uint64_t pool_serial_ = 0;
};

struct EvictionNotice {
  AllocationRef allocation;  // already stale: the pool rejects it from now on
  uint64_t owner = 0;        // PageAllocationRequest::owner
  ContentType content = ContentType::kTemporary;
  uint64_t step = 0;  // the pool's step at eviction
};

// Told before an allocation's pages are taken back, so the owner can drop its references to
// them (the KV cache drops the page's cached blocks from its hash table). Called on the thread
// that triggered the eviction (an allocation, or PagePool::evict()), with no pool lock held but
// with the pool's eviction serialized: it must be thread-safe, quick, and must not allocate from
// or evict in the same pool (that is kFailedPrecondition). Freeing, pinning, unpinning and
// touching other allocations is allowed. The listener must outlive the allocations it listens to.
class EvictionListener {
 public:
  virtual void on_evict(const EvictionNotice& notice) = 0;

 protected:
  ~EvictionListener() = default;
};

struct PageAllocationRequest {
  int64_t num_pages = 1;  // contiguous pages; 1 .. the pool's num_pages
  ContentType content = ContentType::kTemporary;
  // Start with one pin, so the caller can fill the pages before they become evictable; undo it
  // with unpin(). An unpinned allocation may be evicted at any moment.
  bool pinned = true;
  // Passed back to the listener; the pool does not interpret it (a sequence or adapter id).
  uint64_t owner = 0;
  EvictionListener* listener = nullptr;  // may be null: the owner then learns from stale refs
};

struct PagePoolOptions {
  // Metrics label `pool`, and the name in messages.
  std::string name = "pool";
  // A power of two from 4 KiB to 4 MiB and a multiple of the VirtualMemory's granularity.
  size_t page_size = size_t{2} << 20;
  // The budget: pages with physical memory behind them. Required (> 0, < 2^31).
  int64_t num_pages = 0;
  // Address space reserved for the pool, in pages (>= num_pages; 0 means num_pages). Pages
  // beyond the budget are reserved but not mapped.
  int64_t reserved_pages = 0;
  FitPolicy fit_policy = FitPolicy::kBestFit;
  // Eviction with hysteresis (seed 001 §7.3): when an allocation would take the pages outside
  // the free index above high_watermark * num_pages, unpinned allocations are evicted until
  // that is back at or below low_watermark * num_pages. 0 < low <= high <= 1. With high = 1
  // eviction starts only when a request does not fit, and still goes down to the low watermark;
  // with low = high = 1 it evicts just enough for the request.
  double high_watermark = 0.90;
  double low_watermark = 0.80;
  // Single free pages each thread keeps (seed 001 §12: 16); 0 turns thread caches off.
  int thread_cache_pages = 16;
  EvictionWeights eviction_weights;
  std::array<int, kNumContentTypes> content_priority = kDefaultContentPriority;
  // Export statistics here (metric names `folio_pool_*`, labelled pool=name); may be null. The
  // registry must outlive the pool.
  metrics::Registry* metrics = nullptr;
  // Time one allocation in this many per thread for the latency histogram (a clock read costs
  // a good part of an allocation); 1 times every allocation.
  int latency_sample_period = 64;
};

}  // namespace folio::memory
