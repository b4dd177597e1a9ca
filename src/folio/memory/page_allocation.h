// RAII handles of the page pool (seed 001 §10.2):
// - PageAllocation owns one committed allocation and frees it when destroyed.
// - PinGuard holds one pin of an allocation and unpins it when destroyed.
// - PreparedAllocation owns the pages reserved by the first phase of a two-phase allocation and
//   rolls them back when destroyed without being committed.
//
// A handle names its allocation through an AllocationRef, so a handle that outlives its
// allocation (evicted, or freed through another ref) is stale, not dangerous: its calls return
// kFailedPrecondition and its destructor does nothing. Every handle must be destroyed (or
// released) before its pool.
//
// Thread-safety: a handle is a value owned by one thread at a time; the pool calls it makes are
// thread-safe, so distinct handles to one allocation may be used from different threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "folio/base/result.h"
#include "folio/base/status.h"
#include "folio/memory/pool_types.h"

namespace folio::memory {

class PagePool;
class ThreadCache;

class PinGuard {
 public:
  PinGuard() = default;
  PinGuard(PinGuard&& other) noexcept;
  PinGuard& operator=(PinGuard&& other) noexcept;
  PinGuard(const PinGuard&) = delete;
  PinGuard& operator=(const PinGuard&) = delete;
  // Unpins; a failure (the allocation was freed meanwhile, so the pin is gone with it) is
  // ignored, since there is nothing left to undo.
  ~PinGuard();

  bool holds_pin() const { return pool_ != nullptr; }
  const AllocationRef& allocation() const { return ref_; }
  // Unpins now and returns PagePool::unpin's answer; the guard holds nothing afterwards.
  Status release();

 private:
  friend class PagePool;
  PinGuard(PagePool* pool, AllocationRef ref) : pool_(pool), ref_(ref) {}

  PagePool* pool_ = nullptr;
  AllocationRef ref_;
};

class PageAllocation {
 public:
  PageAllocation() = default;
  PageAllocation(PageAllocation&& other) noexcept;
  PageAllocation& operator=(PageAllocation&& other) noexcept;
  PageAllocation(const PageAllocation&) = delete;
  PageAllocation& operator=(const PageAllocation&) = delete;
  // Frees the allocation unless it was evicted or freed already (then does nothing).
  ~PageAllocation();

  bool is_valid() const { return pool_ != nullptr; }
  const AllocationRef& ref() const { return ref_; }
  PageId first_page() const { return ref_.first_page(); }
  int64_t num_pages() const { return ref_.num_pages(); }
  size_t size_bytes() const;
  // The first byte of the first page (a device address for device pools). Read or write the
  // bytes only while the allocation is pinned: an unpinned allocation may be evicted.
  std::byte* data() const;

  Status pin() const;
  Status unpin() const;
  Result<PinGuard> pin_guard() const;
  Status touch() const;
  // Frees now: PagePool::free's answer. The handle is empty afterwards either way.
  Status free();
  // Gives up ownership without freeing; the caller frees with PagePool::free(ref).
  AllocationRef release();

 private:
  friend class PagePool;
  PageAllocation(PagePool* pool, AllocationRef ref) : pool_(pool), ref_(ref) {}

  PagePool* pool_ = nullptr;
  AllocationRef ref_;
};

class PreparedAllocation {
 public:
  PreparedAllocation() = default;
  PreparedAllocation(PreparedAllocation&& other) noexcept;
  PreparedAllocation& operator=(PreparedAllocation&& other) noexcept;
  PreparedAllocation(const PreparedAllocation&) = delete;
  PreparedAllocation& operator=(const PreparedAllocation&) = delete;
  // Rolls back when still pending.
  ~PreparedAllocation();

  // True until committed or rolled back.
  bool is_pending() const { return pool_ != nullptr; }
  PageId first_page() const { return PageId(static_cast<int32_t>(first_page_)); }
  int64_t num_pages() const { return num_pages_; }
  // The reserved bytes, to fill before commit publishes them.
  std::byte* data() const;
  // True when preparing took more than free pages: it emptied the thread caches into the free
  // index or evicted allocations. Rollback returns the reserved pages exactly where they came
  // from, but cannot undo those.
  bool made_room() const { return made_room_; }

 private:
  friend class PagePool;

  PagePool* pool_ = nullptr;
  uint32_t first_page_ = 0;
  uint32_t num_pages_ = 0;
  PageAllocationRequest request_;
  // The thread cache the page came from (compared, never dereferenced), or null for the free
  // index.
  const ThreadCache* cache_ = nullptr;
  bool made_room_ = false;
};

}  // namespace folio::memory
