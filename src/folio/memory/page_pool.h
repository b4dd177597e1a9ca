// PagePool: Folio's unified page pool (seed 001), the one memory budget from which KV cache
// pages, LoRA adapter weights and graph arenas are all allocated.
//
// Storage: one reserved AddressRange of the device's VirtualMemory with one PhysicalMemory
// mapped at its start, so page p lives at base() + p * page_size() and at byte physical_offset(p)
// of physical_memory() (the graph executor maps those physical pages into views of its own).
// The same code serves host and device memory; only the VirtualMemory differs.
//
// Allocations are runs of contiguous pages with a content type, an owner and an optional
// EvictionListener. Each has a pin count: pinned allocations are never evicted; unpinned ones
// are evicted, whole, in score order (eviction_index.h) when an allocation cannot be met
// otherwise, or when it would take the pool above its high watermark (then down to the low
// watermark: hysteresis). The owner's listener is told before the pages go. Pins protect
// against eviction only: the owner may free a pinned allocation, and its outstanding pins are
// then stale.
//
// Two-phase allocation (seed 001 §8.4): prepare() reserves pages (kReserved: counted as used,
// never evicted, invisible to handles); commit() publishes them with release semantics and
// returns the handle; rollback() puts them back exactly where they came from.
//
// Errors: "no capacity right now" is kResourceExhausted, returned only when even eviction cannot
// make room, with a message counting free, evictable and pinned pages. A stale or foreign
// AllocationRef (freed, evicted, double free, unpin below zero) is kFailedPrecondition and
// changes nothing. Bad options or requests are kInvalidArgument.
//
// Thread-safety: every method may be called from any thread. Pin, unpin and touch are one
// compare-and-swap on the page's word, lock-free (except an unpin to zero of an allocation the
// evictor dropped from its index while pinned: that one relinks it under the index mutex);
// single-page allocate and free of pinned allocations take only the calling thread's cache lock
// in the common case. Locks, in the order they nest: eviction mutex
// (serializes evictors, held while listeners run), thread cache registry, a thread cache, free
// mutex (free index); the eviction index mutex never nests with another (but for the debug walks,
// check_invariants and debug_state, which take it after the free mutex).
//
// Invariants (check_invariants() walks them): every page belongs to exactly one run (free
// extent, thread-held page or allocation) and has exactly one state; the per-state and per-content
// counts add up to num_pages(); runs never overlap; every unpinned allocation is in the eviction
// index; pinned allocations are never evicted.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/device/virtual_memory.h"
#include "folio/memory/eviction_index.h"
#include "folio/memory/free_extent_index.h"
#include "folio/memory/latency_histogram.h"
#include "folio/memory/page_allocation.h"
#include "folio/memory/page_table.h"
#include "folio/memory/pool_stats.h"
#include "folio/memory/pool_types.h"
#include "folio/memory/striped_counter.h"
#include "folio/memory/thread_cache.h"

namespace folio::memory {

class PoolMetrics;

// Everything that defines the pool's state, for tests that check an operation changed nothing
// (rollback). Fields are the meaningful ones only: allocation fields at allocation heads.
struct PoolDebugState {
  struct Page {
    uint64_t word = 0;
    uint32_t extent_pages = 0;
    uint32_t extent_first = 0;
    uint32_t allocation_pages = 0;
    uint8_t content = 0;
    uint64_t owner = 0;
    uint64_t last_use = 0;
    friend bool operator==(const Page&, const Page&) = default;
  };
  std::vector<Page> pages;
  std::vector<std::vector<uint32_t>> thread_caches;         // each cache's pages, oldest first
  std::vector<std::pair<uint32_t, uint32_t>> free_extents;  // (first, pages), sorted
  std::vector<uint32_t> eviction_index;                     // heads, sorted
  std::vector<int64_t> counters;
  friend bool operator==(const PoolDebugState&, const PoolDebugState&) = default;
};

class PagePool final : private ThreadCacheHome {
 public:
  // Reserves the address range, creates and maps the physical memory. `vm` must outlive the
  // pool. kInvalidArgument for bad options (each message names the option and its range).
  static Result<std::unique_ptr<PagePool>> create(device::VirtualMemory& vm,
                                                  PagePoolOptions options);
  // Requires: no allocation is live (every PageAllocation and PreparedAllocation is gone);
  // aborts with the counts otherwise, since live handles would point at a dead pool.
  ~PagePool();
  PagePool(const PagePool&) = delete;
  PagePool& operator=(const PagePool&) = delete;

  // ---- Allocation -------------------------------------------------------------------------
  // prepare() + commit() in one step (without the intermediate kReserved state).
  Result<PageAllocation> allocate(const PageAllocationRequest& request);
  // Reserves request.num_pages contiguous pages. kResourceExhausted when they cannot be found
  // even after emptying the thread caches and evicting everything evictable.
  Result<PreparedAllocation> prepare(const PageAllocationRequest& request);
  // Publishes a prepared allocation (release: a thread that later pins or frees it through the
  // returned ref sees everything written to the pages and metadata before commit).
  // kFailedPrecondition when `prepared` is not pending in this pool.
  Result<PageAllocation> commit(PreparedAllocation&& prepared);
  // Returns the reserved pages to where they came from (the same thread cache when called on
  // the preparing thread, else the free index, merging as before).
  Status rollback(PreparedAllocation&& prepared);
  // Ends the allocation, pinned or not; its pins become stale. kFailedPrecondition when `ref`
  // is stale (double free, evicted) or from another pool.
  Status free(const AllocationRef& ref);

  // ---- Pins and use -----------------------------------------------------------------------
  // kFailedPrecondition when stale; unpin() also when the pin count is already 0.
  Status pin(const AllocationRef& ref);
  Status unpin(const AllocationRef& ref);
  Result<PinGuard> pin_guard(const AllocationRef& ref);
  // Marks the allocation used at the current step (its recency for eviction).
  Status touch(const AllocationRef& ref);
  // The step counter that last use is measured in; the engine advances it once per step.
  uint64_t advance_step() { return step_.fetch_add(1, std::memory_order_relaxed) + 1; }
  uint64_t step() const { return step_.load(std::memory_order_relaxed); }

  // ---- Eviction ---------------------------------------------------------------------------
  // Evicts whole unpinned allocations in score order until at least num_pages pages are
  // evicted or nothing evictable is left; returns the pages evicted.
  Result<int64_t> evict(int64_t num_pages);
  // Moves every thread-held page back to the free index (to defragment, or before checks).
  void flush_thread_caches();

  // ---- Storage ----------------------------------------------------------------------------
  std::byte* base() const { return range_.base; }
  size_t page_size() const { return options_.page_size; }
  int64_t num_pages() const { return num_pages_; }
  // Requires: 0 <= page < num_pages().
  std::byte* page_address(PageId page) const;
  const device::AddressRange& address_range() const { return range_; }
  const device::PhysicalMemory& physical_memory() const { return memory_; }
  // Requires: 0 <= page < num_pages().
  size_t physical_offset(PageId page) const;
  device::VirtualMemory& virtual_memory() const { return vm_; }
  const PagePoolOptions& options() const { return options_; }

  // ---- Introspection ----------------------------------------------------------------------
  PoolStats stats() const;
  // One page's row of the metadata table. O(runs below the page); for tests and tools.
  Result<PageInfo> page_info(PageId page) const;
  // FOLIO_CHECKs every invariant; O(pages). Meant for a quiescent pool (tests call it after
  // each operation); with concurrent operations in flight it may see transient states.
  void check_invariants() const;
  PoolDebugState debug_state() const;

 private:
  struct Reservation {
    uint32_t first = kNoPage;
    const ThreadCache* cache = nullptr;
    bool made_room = false;
  };

  PagePool(device::VirtualMemory& vm, PagePoolOptions options, device::AddressRange range,
           device::PhysicalMemory memory);

  // page_pool.cc: reservation paths.
  Status validate_request(const PageAllocationRequest& request, std::string_view verb) const;
  Result<Reservation> reserve(uint32_t pages, bool refill_thread_cache);
  uint32_t refill_and_pop(ThreadCache& cache);
  Result<Reservation> reserve_from_free_index(uint32_t pages);
  uint32_t take_from_free_index(uint32_t pages);
  int64_t drain_thread_caches();
  Status exhausted(uint32_t pages);
  AllocationRef publish(uint32_t first, uint32_t pages, const PageAllocationRequest& request);
  void release_pages(uint32_t first, uint32_t pages, uint64_t generation, bool to_thread_cache);
  void insert_into_free_index(const std::vector<uint32_t>& single_pages);
  void return_pages_at_thread_exit(const std::vector<uint32_t>& pages) override;
  bool thread_caches_enabled() const { return options_.thread_cache_pages > 0; }

  // page_pool_handles.cc: refs.
  Status check_ref(const AllocationRef& ref, std::string_view verb) const;
  Status stale_ref(const AllocationRef& ref, PageWord current, std::string_view verb) const;
  void relink(uint32_t head, uint64_t generation);
  void bump_last_use(uint32_t head);

  // page_pool_introspection.cc. Requires: free_mutex_ held. Calls visit(first, pages, word) for
  // each run (free extent, thread-held page, allocation) from page 0 up, checking that the runs
  // tile the table.
  void walk_runs(FunctionRef<void(uint32_t first, uint32_t pages, PageWord word)> visit) const
      FOLIO_REQUIRES(free_mutex_);
  struct RunCensus;
  // Requires: free_mutex_ and index_mutex_ held. cache_of[page] >= 0 for thread-thread-held pages.
  RunCensus take_census(const std::vector<int>& cache_of) const
      FOLIO_REQUIRES(free_mutex_, index_mutex_);
  void check_counters(const RunCensus& census, int64_t held_by_thread_caches) const
      FOLIO_REQUIRES(free_mutex_);

  // page_pool_eviction.cc.
  // Requires: eviction_mutex_ held. Evicts the lowest-scored allocation; returns its pages, or
  // 0 when nothing is evictable.
  int64_t evict_one() FOLIO_REQUIRES(eviction_mutex_);
  // Evicts down to the low watermark when taking `pages` more from the free index would cross
  // the high one. Returns the pages evicted.
  int64_t evict_for_watermark(uint32_t pages);
  // Evicts until a run of `pages` can be taken; returns its first page or kNoPage.
  uint32_t evict_until_taken(uint32_t pages, int64_t* evicted);
  int64_t evictable_pages() const;
  bool in_own_eviction_listener() const;
  void note_pin_contention();

  device::VirtualMemory& vm_;
  const PagePoolOptions options_;
  const device::AddressRange range_;
  const device::PhysicalMemory memory_;
  const uint32_t num_pages_;
  // Unique per pool for the process's lifetime; carried by refs to reject foreign ones.
  const uint64_t serial_;

  PageTable table_;
  std::atomic<uint64_t> step_{0};

  mutable Mutex free_mutex_;
  FreeExtentIndex free_index_ FOLIO_GUARDED_BY(free_mutex_);
  // free_index_.free_pages(), stored under free_mutex_ and read without it (watermarks, stats).
  // Relaxed: a statistic; decisions made on it re-check under the mutex.
  std::atomic<int64_t> free_pages_{0};

  mutable Mutex index_mutex_;
  EvictionIndex eviction_index_ FOLIO_GUARDED_BY(index_mutex_);
  Mutex eviction_mutex_;

  ThreadCacheRegistry thread_caches_;

  // Statistics (striped_counter.h for their memory order).
  StripedCounter pages_reserved_;
  StripedCounter pages_releasing_;
  std::array<StripedCounter, kNumContentTypes> pages_pinned_;
  std::array<StripedCounter, kNumContentTypes> pages_unpinned_;
  std::array<std::atomic<int64_t>, kNumContentTypes> evictions_{};
  std::array<std::atomic<int64_t>, kNumContentTypes> pages_evicted_{};
  StripedCounter allocations_;
  StripedCounter pin_contention_;
  std::atomic<int64_t> failed_allocations_{0};
  std::atomic<int64_t> thread_cache_drains_{0};
  LatencyHistogram allocation_latency_;
  // Null unless PagePoolOptions::metrics is set. Declared last: goes first.
  std::unique_ptr<PoolMetrics> metrics_;
};

}  // namespace folio::memory
