// PagePool: eviction. One thread evicts at a time (eviction_mutex_), so victims are chosen in
// a single score order and a listener is never re-entered; other threads keep allocating,
// pinning and freeing meanwhile. A victim is claimed by one compare-and-swap from kUnpinned (pin
// count 0) to kReleasing under the eviction index mutex: a concurrent pin either lands first
// (the claim fails and the victim is skipped) or finds kReleasing and reports a stale ref. So a
// page under a live pin is never evicted, and the owner's later free of an evicted allocation is
// a stale-ref error, not a double free (the races of seed 001 §7.1 and §10.2).
#include "folio/memory/page_pool.h"

#include "folio/memory/pool_metrics.h"

namespace folio::memory {
namespace {
// The pool whose listener this thread is running, to refuse re-entry (which would deadlock on
// the eviction mutex) with an error instead.
thread_local const PagePool* t_listener_pool = nullptr;
}  // namespace

bool PagePool::in_own_eviction_listener() const {
  return t_listener_pool == this;
}

int64_t PagePool::evictable_pages() const {
  int64_t total = 0;
  for (const StripedCounter& counter : pages_unpinned_) total += counter.sum();
  return total;
}

int64_t PagePool::evict_one() {
  uint32_t head = kNoPage;
  uint64_t generation = 0;
  {
    MutexLock lock(index_mutex_);
    while (true) {
      head = eviction_index_.select_victim(step());
      if (head == kNoPage) return 0;
      std::atomic<uint64_t>& word = table_[head].word;
      uint64_t bits = word.load(std::memory_order_acquire);
      const PageWord current(bits);
      if (current.state() != PageState::kUnpinned || current.pins() != 0) continue;
      // acq_rel: the acquire pairs with the release of the commit or unpin that made the
      // allocation evictable (its metadata and owner are read below); the release orders the
      // claim before the pages are handed back. Fails when a lock-free pin got there first.
      const uint64_t claimed =
          PageWord::make(PageState::kReleasing, false, 0, current.generation()).bits();
      if (word.compare_exchange_strong(bits, claimed, std::memory_order_acq_rel)) {
        generation = current.generation();
        eviction_index_.remove(head);
        break;
      }
    }
  }
  const PageSlot& slot = table_[head];
  const uint32_t pages = slot.allocation_pages.load(std::memory_order_relaxed);
  const int content = slot.content.load(std::memory_order_relaxed);
  pages_unpinned_[content].add(-static_cast<int64_t>(pages));
  pages_releasing_.add(pages);
  if (slot.listener != nullptr) {
    EvictionNotice notice;
    notice.allocation = AllocationRef(head, pages, generation, serial_);
    notice.owner = slot.owner;
    notice.content = static_cast<ContentType>(content);
    notice.step = step();
    const PagePool* outer = t_listener_pool;
    t_listener_pool = this;
    slot.listener->on_evict(notice);
    t_listener_pool = outer;
  }
  release_pages(head, pages, generation, /*to_thread_cache=*/false);
  pages_releasing_.add(-static_cast<int64_t>(pages));
  evictions_[content].fetch_add(1, std::memory_order_relaxed);
  pages_evicted_[content].fetch_add(pages, std::memory_order_relaxed);
  if (metrics_ != nullptr) {
    metrics_->count_eviction(static_cast<ContentType>(content),
                             static_cast<double>(pages) * static_cast<double>(page_size()));
  }
  return pages;
}

int64_t PagePool::evict_for_watermark(uint32_t pages) {
  const auto used_after = [&] {
    return static_cast<double>(num_pages_ - free_pages_.load(std::memory_order_relaxed) + pages);
  };
  if (used_after() <= options_.high_watermark * num_pages_) return 0;
  if (in_own_eviction_listener()) return 0;
  // A request that even evicting everything evictable could not fit fails without evicting.
  if (free_pages_.load(std::memory_order_relaxed) + evictable_pages() < pages) return 0;
  // Another thread evicting already brings the pool down; do not queue behind it.
  if (!eviction_mutex_.try_lock()) return 0;
  MutexLock lock(eviction_mutex_, std::adopt_lock);
  const double low = options_.low_watermark * num_pages_;
  int64_t evicted = 0;
  while (used_after() > low) {
    const int64_t pages_evicted = evict_one();
    if (pages_evicted == 0) break;
    evicted += pages_evicted;
  }
  return evicted;
}

uint32_t PagePool::evict_until_taken(uint32_t pages, int64_t* evicted) {
  *evicted = 0;
  MutexLock lock(eviction_mutex_);
  // Evicting cannot help when even every evictable page would not be enough: fail without
  // throwing anything away.
  if (free_pages_.load(std::memory_order_relaxed) + evictable_pages() < pages) {
    return take_from_free_index(pages);
  }
  while (true) {
    const uint32_t first = take_from_free_index(pages);
    if (first != kNoPage) return first;
    const int64_t pages_evicted = evict_one();
    if (pages_evicted == 0) return kNoPage;
    *evicted += pages_evicted;
  }
}

Result<int64_t> PagePool::evict(int64_t num_pages) {
  if (num_pages < 0) {
    return invalid_argument("page pool '{}': evict of {} pages", options_.name, num_pages);
  }
  if (in_own_eviction_listener()) {
    return failed_precondition(
        "page pool '{}': evict called from inside one of its eviction "
        "listeners",
        options_.name);
  }
  MutexLock lock(eviction_mutex_);
  int64_t evicted = 0;
  while (evicted < num_pages) {
    const int64_t pages_evicted = evict_one();
    if (pages_evicted == 0) break;
    evicted += pages_evicted;
  }
  return evicted;
}

}  // namespace folio::memory
