// FixedPageSource: a KvPageSource over one heap allocation of a fixed number of pages, for
// tests, benchmarks and tools that run the KV cache without the page pool (memory/).
//
// It behaves like a small page pool with a single KV owner plus an anonymous "other owner":
// allocate_page() hands out free pages, and when none is free it evicts the least recently
// unpinned KV page (telling the eviction handler first), as the pool does under pressure.
// take_pages_for_other_owner() simulates another content type's allocation (adapters, graph
// arenas): it takes free pages, evicting unpinned KV pages if it must.
//
// Page states: FREE -> PINNED <-> UNPINNED -> (evicted) FREE. Handles carry a generation that
// changes on every allocation, so a handle that outlived its page is stale, not a corruption.
//
// Thread-safety: every method may be called from any thread (one mutex). The eviction handler
// is called with the mutex held; it must not call back into the source.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "folio/base/mutex.h"
#include "folio/kv/kv_page_source.h"

namespace folio::kv {

class FixedPageSource final : public KvPageSource {
 public:
  // Requires: page_bytes > 0 and a multiple of 64; capacity_pages > 0.
  FixedPageSource(int64_t page_bytes, int32_t capacity_pages);
  ~FixedPageSource() override;
  FixedPageSource(const FixedPageSource&) = delete;
  FixedPageSource& operator=(const FixedPageSource&) = delete;

  int64_t page_bytes() const override { return page_bytes_; }
  std::byte* base() const override { return base_; }
  int32_t capacity_pages() const override { return capacity_pages_; }
  int32_t num_pages_available() const override;

  Result<KvPage> allocate_page() override;
  Status release_page(const KvPage& page) override;
  Status pin(const KvPage& page) override;
  void unpin(const KvPage& page) override;
  void set_eviction_handler(KvEvictionHandler* handler) override;

  // Takes up to `num_pages` pages for another owner, evicting unpinned KV pages when no page is
  // free; returns the indices of the pages it took (their bytes are the caller's until given
  // back).
  std::vector<int32_t> take_pages_for_other_owner(int32_t num_pages);
  // Gives back pages taken by take_pages_for_other_owner.
  void return_pages_of_other_owner(std::span<const int32_t> page_indices);

  struct Counts {
    int32_t free = 0;
    int32_t pinned = 0;
    int32_t unpinned = 0;
    int32_t other_owner = 0;
    int64_t evictions = 0;  // KV pages taken back since construction
  };
  Counts counts() const;

 private:
  enum class PageState : uint8_t { kFree, kPinned, kUnpinned, kOtherOwner };
  struct PageSlot {
    PageState state = PageState::kFree;
    uint32_t generation = 0;
    uint64_t last_unpinned = 0;  // tick of the last unpin, for LRU eviction
  };

  KvPageHandle handle_of(int32_t page_index) const FOLIO_REQUIRES(mutex_);
  // Index of the page `page` names if its handle is current, else -1.
  int32_t current_index(const KvPage& page) const FOLIO_REQUIRES(mutex_);
  // Finds a free page, evicting the least recently unpinned KV page if none is; -1 if neither.
  int32_t claim_page_locked() FOLIO_REQUIRES(mutex_);

  const int64_t page_bytes_;
  const int32_t capacity_pages_;
  std::byte* base_ = nullptr;

  mutable Mutex mutex_;
  std::vector<PageSlot> pages_ FOLIO_GUARDED_BY(mutex_);
  KvEvictionHandler* handler_ FOLIO_GUARDED_BY(mutex_) = nullptr;
  uint64_t tick_ FOLIO_GUARDED_BY(mutex_) = 0;
  int64_t evictions_ FOLIO_GUARDED_BY(mutex_) = 0;
  // Pages in state kFree; written under mutex_, read without it by num_pages_available (a hint,
  // as the interface allows), so relaxed.
  std::atomic<int32_t> num_free_{0};
};

}  // namespace folio::kv
