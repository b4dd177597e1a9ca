// PoolPageSource: KvPageSource on the unified page pool (memory/PagePool), so the KV cache
// takes its pages from the one budget shared with adapters and graph arenas.
//
// Each KV page is a one-page pool allocation of content type kKvCache, allocated pinned; the
// source's pin/unpin are the pool's (lock-free) pin/unpin of that allocation, and the page's
// handle is the allocation's generation. The pool evicts an unpinned KV allocation like any
// other, in its score order (KV cache last by default); its EvictionNotice is forwarded to the
// registered KvEvictionHandler before the pool reuses the page. Everything the KvPageSource
// contract asks for holds by the pool's own guarantees: a pin that loses the race with an
// eviction reports a stale ref (kFailedPrecondition), and freeing an evicted page is a stale ref
// too, never a double free.
//
// num_pages_available() counts the pool's free pages (global and thread-cached) plus the
// evictable pages of other content types: pages the pool can hand out without evicting KV.
//
// An optional cap (max_pages_held) bounds the pages the KV cache holds at once, so that a
// deployment can reserve the rest of the budget for adapters and graph arenas, and a test can
// force preemption with a small cache. The cap only bounds the count: page indices still range
// over the whole pool (capacity_pages()), since a KV page can be any pool page.
//
// Thread-safety: every method may be called from any thread. The page table below is guarded by
// a mutex that is never held across a pool call that can evict (allocation), because the pool
// may call on_evict on the allocating thread; the handler is called with the mutex held, so
// that after set_eviction_handler(nullptr) returns no call is in flight.
#pragma once

#include <cstdint>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/kv/kv_page_source.h"
#include "folio/memory/page_pool.h"

namespace folio::kv {

class PoolPageSource final : public KvPageSource, private memory::EvictionListener {
 public:
  // `owner` tags the pool allocations (PageAllocationRequest::owner), e.g. a model's id. The pool
  // must outlive the source. `max_pages_held` <= 0: no cap beyond the pool itself.
  explicit PoolPageSource(memory::PagePool& pool, uint64_t owner = 0, int32_t max_pages_held = 0);
  // Requires: every page was released (the block manager gives its pages back when destroyed).
  ~PoolPageSource() override;
  PoolPageSource(const PoolPageSource&) = delete;
  PoolPageSource& operator=(const PoolPageSource&) = delete;

  int64_t page_bytes() const override { return static_cast<int64_t>(pool_.page_size()); }
  std::byte* base() const override { return pool_.base(); }
  int32_t capacity_pages() const override { return static_cast<int32_t>(pool_.num_pages()); }
  int32_t num_pages_available() const override;

  Result<KvPage> allocate_page() override;
  Status release_page(const KvPage& page) override;
  Status pin(const KvPage& page) override;
  void unpin(const KvPage& page) override;
  void set_eviction_handler(KvEvictionHandler* handler) override;

  // Pages currently held (allocated and neither released nor evicted).
  int32_t num_pages_held() const;
  int32_t max_pages_held() const override { return max_pages_held_; }

 private:
  void on_evict(const memory::EvictionNotice& notice) override;
  // The allocation behind `page` if its handle is current, else an invalid ref.
  memory::AllocationRef current_ref(const KvPage& page) const;

  memory::PagePool& pool_;
  const uint64_t owner_;
  const int32_t max_pages_held_;  // the pool's page count when uncapped

  mutable Mutex mutex_;
  std::vector<memory::AllocationRef> refs_ FOLIO_GUARDED_BY(mutex_);  // [pool pages]
  int32_t num_held_ FOLIO_GUARDED_BY(mutex_) = 0;
  KvEvictionHandler* handler_ FOLIO_GUARDED_BY(mutex_) = nullptr;
};

}  // namespace folio::kv
