#include "folio/memory/page_allocation.h"

#include <utility>

#include "folio/memory/page_pool.h"

namespace folio::memory {

// ---- PinGuard -------------------------------------------------------------------------------

PinGuard::PinGuard(PinGuard&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), ref_(other.ref_) {}

PinGuard& PinGuard::operator=(PinGuard&& other) noexcept {
  if (this != &other) {
    release().ignore();
    pool_ = std::exchange(other.pool_, nullptr);
    ref_ = other.ref_;
  }
  return *this;
}

PinGuard::~PinGuard() {
  release().ignore();
}

Status PinGuard::release() {
  if (pool_ == nullptr) return Status();
  return std::exchange(pool_, nullptr)->unpin(ref_);
}

// ---- PageAllocation -------------------------------------------------------------------------

PageAllocation::PageAllocation(PageAllocation&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), ref_(other.ref_) {}

PageAllocation& PageAllocation::operator=(PageAllocation&& other) noexcept {
  if (this != &other) {
    free().ignore();
    pool_ = std::exchange(other.pool_, nullptr);
    ref_ = other.ref_;
  }
  return *this;
}

// A stale ref means the pool evicted the allocation (its listener was told) or it was freed
// through a released copy of the ref: either way nothing is left to free.
PageAllocation::~PageAllocation() {
  free().ignore();
}

size_t PageAllocation::size_bytes() const {
  return pool_ == nullptr ? 0 : static_cast<size_t>(ref_.num_pages()) * pool_->page_size();
}

std::byte* PageAllocation::data() const {
  return pool_ == nullptr ? nullptr : pool_->page_address(ref_.first_page());
}

Status PageAllocation::pin() const {
  if (pool_ == nullptr) return failed_precondition("pin of an empty PageAllocation");
  return pool_->pin(ref_);
}

Status PageAllocation::unpin() const {
  if (pool_ == nullptr) return failed_precondition("unpin of an empty PageAllocation");
  return pool_->unpin(ref_);
}

Result<PinGuard> PageAllocation::pin_guard() const {
  if (pool_ == nullptr) return failed_precondition("pin of an empty PageAllocation");
  return pool_->pin_guard(ref_);
}

Status PageAllocation::touch() const {
  if (pool_ == nullptr) return failed_precondition("touch of an empty PageAllocation");
  return pool_->touch(ref_);
}

Status PageAllocation::free() {
  if (pool_ == nullptr) return Status();
  return std::exchange(pool_, nullptr)->free(ref_);
}

AllocationRef PageAllocation::release() {
  pool_ = nullptr;
  return ref_;
}

// ---- PreparedAllocation ---------------------------------------------------------------------

PreparedAllocation::PreparedAllocation(PreparedAllocation&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)),
      first_page_(other.first_page_),
      num_pages_(other.num_pages_),
      request_(other.request_),
      cache_(other.cache_),
      made_room_(other.made_room_) {}

PreparedAllocation& PreparedAllocation::operator=(PreparedAllocation&& other) noexcept {
  if (this != &other) {
    if (pool_ != nullptr) pool_->rollback(std::move(*this)).ignore();
    pool_ = std::exchange(other.pool_, nullptr);
    first_page_ = other.first_page_;
    num_pages_ = other.num_pages_;
    request_ = other.request_;
    cache_ = other.cache_;
    made_room_ = other.made_room_;
  }
  return *this;
}

PreparedAllocation::~PreparedAllocation() {
  if (pool_ != nullptr) pool_->rollback(std::move(*this)).ignore();
}

std::byte* PreparedAllocation::data() const {
  return pool_ == nullptr ? nullptr
                          : pool_->page_address(PageId(static_cast<int32_t>(first_page_)));
}

}  // namespace folio::memory
