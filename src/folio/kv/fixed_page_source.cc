#include "folio/kv/fixed_page_source.h"

#include <new>

#include "folio/base/check.h"

namespace folio::kv {

namespace {
constexpr std::align_val_t kAlignment{64};
}  // namespace

FixedPageSource::FixedPageSource(int64_t page_bytes, int32_t capacity_pages)
    : page_bytes_(page_bytes),
      capacity_pages_(capacity_pages),
      pages_(capacity_pages),
      num_free_(capacity_pages) {
  FOLIO_CHECK(page_bytes > 0 && page_bytes % 64 == 0,
              "page size {} is not a positive multiple of 64", page_bytes);
  FOLIO_CHECK(capacity_pages > 0, "a page source needs at least one page");
  base_ = static_cast<std::byte*>(::operator new(
      static_cast<size_t>(page_bytes) * static_cast<size_t>(capacity_pages), kAlignment));
}

FixedPageSource::~FixedPageSource() {
  ::operator delete(base_, kAlignment);
}

int32_t FixedPageSource::num_pages_available() const {
  return num_free_.load(std::memory_order_relaxed);
}

KvPageHandle FixedPageSource::handle_of(int32_t page_index) const {
  return KvPageHandle((uint64_t{pages_[page_index].generation} << 32) |
                      static_cast<uint32_t>(page_index));
}

int32_t FixedPageSource::current_index(const KvPage& page) const {
  if (page.page_index < 0 || page.page_index >= capacity_pages_) return -1;
  if (page.handle != handle_of(page.page_index)) return -1;
  return page.page_index;
}

int32_t FixedPageSource::claim_page_locked() {
  int32_t victim = -1;
  for (int32_t index = 0; index < capacity_pages_; ++index) {
    const PageSlot& slot = pages_[index];
    if (slot.state == PageState::kFree) {
      num_free_.fetch_sub(1, std::memory_order_relaxed);
      return index;
    }
    if (slot.state == PageState::kUnpinned &&
        (victim < 0 || slot.last_unpinned < pages_[victim].last_unpinned)) {
      victim = index;
    }
  }
  if (victim < 0) return -1;
  // The eviction decision: once the state leaves kUnpinned, pin() of this page fails.
  pages_[victim].state = PageState::kFree;
  const KvPage evicted{handle_of(victim), victim, base_ + victim * page_bytes_};
  ++pages_[victim].generation;
  ++evictions_;
  if (handler_ != nullptr) handler_->on_kv_page_evicted(evicted);
  return victim;
}

Result<KvPage> FixedPageSource::allocate_page() {
  MutexLock lock(mutex_);
  const int32_t index = claim_page_locked();
  if (index < 0) {
    return resource_exhausted(
        "all {} pages of the KV page source are pinned or taken by other owners", capacity_pages_);
  }
  PageSlot& slot = pages_[index];
  ++slot.generation;
  slot.state = PageState::kPinned;
  return KvPage{handle_of(index), index, base_ + index * page_bytes_};
}

Status FixedPageSource::release_page(const KvPage& page) {
  MutexLock lock(mutex_);
  const int32_t index = current_index(page);
  if (index < 0 || pages_[index].state == PageState::kFree ||
      pages_[index].state == PageState::kOtherOwner) {
    return failed_precondition("KV page {} (handle {}) is not held: it was evicted or released",
                               page.page_index, page.handle);
  }
  pages_[index].state = PageState::kFree;
  ++pages_[index].generation;
  num_free_.fetch_add(1, std::memory_order_relaxed);
  return Status();
}

Status FixedPageSource::pin(const KvPage& page) {
  MutexLock lock(mutex_);
  const int32_t index = current_index(page);
  if (index < 0 || pages_[index].state != PageState::kUnpinned) {
    return failed_precondition("KV page {} cannot be pinned: it was evicted or is already pinned",
                               page.page_index);
  }
  pages_[index].state = PageState::kPinned;
  return Status();
}

void FixedPageSource::unpin(const KvPage& page) {
  MutexLock lock(mutex_);
  const int32_t index = current_index(page);
  FOLIO_CHECK(index >= 0 && pages_[index].state == PageState::kPinned,
              "unpin of KV page {} that is not pinned by its holder", page.page_index);
  pages_[index].state = PageState::kUnpinned;
  pages_[index].last_unpinned = ++tick_;
}

void FixedPageSource::set_eviction_handler(KvEvictionHandler* handler) {
  MutexLock lock(mutex_);
  handler_ = handler;
}

std::vector<int32_t> FixedPageSource::take_pages_for_other_owner(int32_t num_pages) {
  MutexLock lock(mutex_);
  std::vector<int32_t> taken;
  while (static_cast<int32_t>(taken.size()) < num_pages) {
    const int32_t index = claim_page_locked();
    if (index < 0) break;
    ++pages_[index].generation;
    pages_[index].state = PageState::kOtherOwner;
    taken.push_back(index);
  }
  return taken;
}

void FixedPageSource::return_pages_of_other_owner(std::span<const int32_t> page_indices) {
  MutexLock lock(mutex_);
  for (int32_t index : page_indices) {
    FOLIO_CHECK(
        index >= 0 && index < capacity_pages_ && pages_[index].state == PageState::kOtherOwner,
        "page {} is not held by the other owner", index);
    pages_[index].state = PageState::kFree;
    num_free_.fetch_add(1, std::memory_order_relaxed);
  }
}

FixedPageSource::Counts FixedPageSource::counts() const {
  MutexLock lock(mutex_);
  Counts counts;
  for (const PageSlot& slot : pages_) {
    switch (slot.state) {
      case PageState::kFree:
        ++counts.free;
        break;
      case PageState::kPinned:
        ++counts.pinned;
        break;
      case PageState::kUnpinned:
        ++counts.unpinned;
        break;
      case PageState::kOtherOwner:
        ++counts.other_owner;
        break;
    }
  }
  counts.evictions = evictions_;
  FOLIO_CHECK(counts.free == num_free_.load(std::memory_order_relaxed));
  return counts;
}

}  // namespace folio::kv
