#include "folio/kv/pool_page_source.h"

#include <algorithm>

#include "folio/base/check.h"

namespace folio::kv {

PoolPageSource::PoolPageSource(memory::PagePool& pool, uint64_t owner, int32_t max_pages_held)
    : pool_(pool),
      owner_(owner),
      max_pages_held_(max_pages_held > 0
                          ? std::min(max_pages_held, static_cast<int32_t>(pool.num_pages()))
                          : static_cast<int32_t>(pool.num_pages())),
      refs_(static_cast<size_t>(pool.num_pages())) {}

PoolPageSource::~PoolPageSource() {
  MutexLock lock(mutex_);
  FOLIO_CHECK(num_held_ == 0, "KV page source destroyed while it holds {} pool pages", num_held_);
}

int32_t PoolPageSource::num_pages_available() const {
  const memory::PoolStats stats = pool_.stats();
  int64_t available = stats.pages_free + stats.pages_thread_held;
  for (memory::ContentType content : memory::kAllContentTypes) {
    if (content == memory::ContentType::kKvCache) continue;
    available += stats.per_content[memory::content_index(content)].pages_evictable;
  }
  return static_cast<int32_t>(std::min<int64_t>(available, max_pages_held_ - num_pages_held()));
}

memory::AllocationRef PoolPageSource::current_ref(const KvPage& page) const {
  MutexLock lock(mutex_);
  if (page.page_index < 0 || page.page_index >= static_cast<int32_t>(refs_.size())) return {};
  const memory::AllocationRef& ref = refs_[page.page_index];
  if (!ref.is_valid() || ref.generation() != page.handle.value()) return {};
  return ref;
}

Result<KvPage> PoolPageSource::allocate_page() {
  if (num_pages_held() >= max_pages_held_) {
    // A racing allocation may overshoot by one page per thread; the block manager allocates
    // from one thread, so the cap holds exactly there.
    return resource_exhausted("the KV cache holds its cap of {} pages ({} bytes)", max_pages_held_,
                              int64_t{max_pages_held_} * page_bytes());
  }
  memory::PageAllocationRequest request;
  request.num_pages = 1;
  request.content = memory::ContentType::kKvCache;
  request.pinned = true;
  request.owner = owner_;
  request.listener = this;
  // Not under mutex_: the pool may evict (and call on_evict) on this thread to make room.
  FOLIO_ASSIGN_OR_RETURN(memory::PageAllocation allocation, pool_.allocate(request));
  const memory::AllocationRef ref = allocation.release();
  const int32_t page_index = ref.first_page().value();
  {
    MutexLock lock(mutex_);
    refs_[page_index] = ref;
    ++num_held_;
  }
  return KvPage{KvPageHandle(ref.generation()), page_index, pool_.page_address(ref.first_page())};
}

Status PoolPageSource::release_page(const KvPage& page) {
  memory::AllocationRef ref;
  {
    MutexLock lock(mutex_);
    if (page.page_index >= 0 && page.page_index < static_cast<int32_t>(refs_.size()) &&
        refs_[page.page_index].is_valid() &&
        refs_[page.page_index].generation() == page.handle.value()) {
      ref = refs_[page.page_index];
      refs_[page.page_index] = memory::AllocationRef();
      --num_held_;
    }
  }
  if (!ref.is_valid()) {
    return failed_precondition("KV page {} (handle {}) is not held: it was evicted or released",
                               page.page_index, page.handle);
  }
  // Stale when the pool is evicting it right now: its notice then ends the tenure.
  return pool_.free(ref);
}

Status PoolPageSource::pin(const KvPage& page) {
  const memory::AllocationRef ref = current_ref(page);
  if (!ref.is_valid()) {
    return failed_precondition("KV page {} cannot be pinned: it was evicted or released",
                               page.page_index);
  }
  return pool_.pin(ref);
}

void PoolPageSource::unpin(const KvPage& page) {
  const memory::AllocationRef ref = current_ref(page);
  FOLIO_CHECK(ref.is_valid(), "unpin of KV page {} that is not held", page.page_index);
  // A page is unpinned when its last running block is released: it was used up to this step,
  // which is what the pool's recency term ranks evictable pages by.
  (void)pool_.touch(ref);
  const Status status = pool_.unpin(ref);
  FOLIO_CHECK(status.ok(), "unpin of pinned KV page {} failed: {}", page.page_index, status);
}

void PoolPageSource::set_eviction_handler(KvEvictionHandler* handler) {
  MutexLock lock(mutex_);
  handler_ = handler;
}

int32_t PoolPageSource::num_pages_held() const {
  MutexLock lock(mutex_);
  return num_held_;
}

void PoolPageSource::on_evict(const memory::EvictionNotice& notice) {
  const memory::AllocationRef& ref = notice.allocation;
  const int32_t page_index = ref.first_page().value();
  const KvPage page{KvPageHandle(ref.generation()), page_index,
                    pool_.page_address(ref.first_page())};
  MutexLock lock(mutex_);
  if (refs_[page_index] == ref) {
    refs_[page_index] = memory::AllocationRef();
    --num_held_;
  }
  if (handler_ != nullptr) handler_->on_kv_page_evicted(page);
}

}  // namespace folio::kv
