// PagePool: operations through an AllocationRef (free, pin, unpin, touch).
//
// Each one validates the ref and changes the allocation's state in a single compare-and-swap of
// its head's PageWord, so "is it still this allocation, in a state that allows this?" and "make
// the change" cannot be separated by another thread's free, eviction or re-allocation (the race
// of seed 001 §6.2). Metadata the operation needs (content type) is read between the acquire
// load and the CAS: a successful CAS proves the word, and so the allocation, did not change in
// between.
#include "folio/memory/page_pool.h"

#include "folio/memory/pool_metrics.h"

namespace folio::memory {

Status PagePool::check_ref(const AllocationRef& ref, std::string_view verb) const {
  if (!ref.is_valid()) {
    return invalid_argument("page pool '{}': {} with an empty AllocationRef", options_.name, verb);
  }
  if (ref.pool_serial_ != serial_ || uint64_t{ref.first_page_} + ref.num_pages_ > num_pages_) {
    return failed_precondition("page pool '{}': {} of pages [{}, +{}) made by another pool",
                               options_.name, verb, ref.first_page_, ref.num_pages_);
  }
  return Status();
}

Status PagePool::stale_ref(const AllocationRef& ref, PageWord current,
                           std::string_view verb) const {
  return failed_precondition(
      "page pool '{}': {} of pages [{}, +{}) generation {}: that allocation was freed or evicted "
      "(page {} is now {}, generation {})",
      options_.name, verb, ref.first_page_, ref.num_pages_, ref.generation_, ref.first_page_,
      page_state_name(current.state()), current.generation());
}

void PagePool::note_pin_contention() {
  pin_contention_.add(1);
  if (metrics_ != nullptr) metrics_->count_pin_contention();
}

Status PagePool::free(const AllocationRef& ref) {
  FOLIO_RETURN_IF_ERROR(check_ref(ref, "free"));
  PageSlot& slot = table_[ref.first_page_];
  uint64_t bits = slot.word.load(std::memory_order_acquire);
  PageWord claimed;
  while (true) {
    claimed = PageWord(bits);
    if (claimed.generation() != ref.generation_ || !claimed.is_committed()) {
      return stale_ref(ref, claimed, "free");
    }
    // acq_rel: the acquire pairs with commit's release store (the metadata read below is the
    // committed one); the release orders everything this thread did with the pages before the
    // claim that hands them back.
    const uint64_t releasing =
        PageWord::make(PageState::kReleasing, claimed.linked(), 0, claimed.generation()).bits();
    if (slot.word.compare_exchange_weak(bits, releasing, std::memory_order_acq_rel,
                                        std::memory_order_acquire)) {
      break;
    }
    note_pin_contention();
  }
  // The allocation is ours alone now: no pin, unpin, touch or eviction accepts kReleasing.
  const int content = slot.content.load(std::memory_order_relaxed);
  const int64_t pages = ref.num_pages_;
  FOLIO_DCHECK(slot.allocation_pages.load(std::memory_order_relaxed) == ref.num_pages_);
  // Not counted as releasing: unlike an eviction (which waits for its listener) this lasts a
  // few instructions, and the hot path saves two counter updates.
  (claimed.pins() > 0 ? pages_pinned_ : pages_unpinned_)[content].add(-pages);
  if (claimed.linked()) {
    MutexLock lock(index_mutex_);
    // The evictor may have dropped it from the index meanwhile (it clears `linked` when it does,
    // under this mutex); whoever clears the bit removes the entry.
    const PageWord now(slot.word.load(std::memory_order_relaxed));
    if (now.linked()) {
      slot.word.store(now.with_linked(false).bits(), std::memory_order_relaxed);
      eviction_index_.remove(ref.first_page_);
    }
  }
  release_pages(ref.first_page_, ref.num_pages_, ref.generation_, /*to_thread_cache=*/true);
  return Status();
}

Status PagePool::pin(const AllocationRef& ref) {
  FOLIO_RETURN_IF_ERROR(check_ref(ref, "pin"));
  PageSlot& slot = table_[ref.first_page_];
  uint64_t bits = slot.word.load(std::memory_order_acquire);
  PageWord before;
  int content = 0;
  while (true) {
    before = PageWord(bits);
    if (before.generation() != ref.generation_ || !before.is_committed()) {
      return stale_ref(ref, before, "pin");
    }
    if (before.pins() == PageWord::kMaxPins) {
      return failed_precondition(
          "page pool '{}': pages [{}, +{}) are pinned {} times, the most "
          "an allocation can hold",
          options_.name, ref.first_page_, ref.num_pages_, before.pins());
    }
    content = slot.content.load(std::memory_order_relaxed);
    // acq_rel: the acquire pairs with commit's release (the caller may now read the pages'
    // contents); the release pairs with the evictor's acquire, which then sees kPinned and
    // leaves the allocation alone.
    if (slot.word.compare_exchange_weak(bits, before.with_pins(before.pins() + 1).bits(),
                                        std::memory_order_acq_rel, std::memory_order_acquire)) {
      break;
    }
    note_pin_contention();
  }
  if (before.pins() == 0) {
    pages_unpinned_[content].add(-static_cast<int64_t>(ref.num_pages_));
    pages_pinned_[content].add(ref.num_pages_);
  }
  return Status();
}

Status PagePool::unpin(const AllocationRef& ref) {
  FOLIO_RETURN_IF_ERROR(check_ref(ref, "unpin"));
  PageSlot& slot = table_[ref.first_page_];
  uint64_t bits = slot.word.load(std::memory_order_acquire);
  PageWord before;
  int content = 0;
  bool bumped = false;
  while (true) {
    before = PageWord(bits);
    if (before.generation() != ref.generation_ || !before.is_committed()) {
      return stale_ref(ref, before, "unpin");
    }
    if (before.pins() == 0) {
      return failed_precondition(
          "page pool '{}': unpin of pages [{}, +{}), which are not pinned; "
          "every unpin must pair with a pin",
          options_.name, ref.first_page_, ref.num_pages_);
    }
    content = slot.content.load(std::memory_order_relaxed);
    if (!bumped) {
      bump_last_use(ref.first_page_);
      bumped = true;
    }
    // acq_rel: the release publishes the last use stored just above (and the caller's writes to
    // the pages) to the evictor, whose acquire load of this word precedes its read of last_use.
    if (slot.word.compare_exchange_weak(bits, before.with_pins(before.pins() - 1).bits(),
                                        std::memory_order_acq_rel, std::memory_order_acquire)) {
      break;
    }
    note_pin_contention();
  }
  if (before.pins() == 1) {
    pages_pinned_[content].add(-static_cast<int64_t>(ref.num_pages_));
    pages_unpinned_[content].add(ref.num_pages_);
    // Now evictable: it must be in the eviction index. It usually still is (entries leave it
    // lazily); if the evictor dropped it while pinned, link it again.
    if (!before.linked()) relink(ref.first_page_, ref.generation_);
  }
  return Status();
}

void PagePool::relink(uint32_t head, uint64_t generation) {
  MutexLock lock(index_mutex_);
  std::atomic<uint64_t>& word = table_[head].word;
  uint64_t bits = word.load(std::memory_order_acquire);
  while (true) {
    const PageWord current(bits);
    // Pinned again, freed or evicted meanwhile: nothing to link (the next unpin will).
    if (current.generation() != generation || current.state() != PageState::kUnpinned ||
        current.linked()) {
      return;
    }
    // acq_rel: a read-modify-write in the word's release sequence; `linked` itself is guarded by
    // index_mutex_. The CAS fails only when a lock-free pin changed the word.
    if (word.compare_exchange_weak(bits, current.with_linked(true).bits(),
                                   std::memory_order_acq_rel, std::memory_order_acquire)) {
      eviction_index_.link(head);
      return;
    }
  }
}

void PagePool::bump_last_use(uint32_t head) {
  // Monotonic (a racing older step never lowers it), so the eviction index's keys stay lower
  // bounds. Relaxed: the value is a hint; the word's release publishes it where it matters.
  std::atomic<uint64_t>& last_use = table_[head].last_use;
  const uint64_t now = step();
  uint64_t seen = last_use.load(std::memory_order_relaxed);
  while (seen < now && !last_use.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
  }
}

Result<PinGuard> PagePool::pin_guard(const AllocationRef& ref) {
  FOLIO_RETURN_IF_ERROR(pin(ref));
  return PinGuard(this, ref);
}

Status PagePool::touch(const AllocationRef& ref) {
  FOLIO_RETURN_IF_ERROR(check_ref(ref, "touch"));
  // Acquire pairs with commit's release, like every validation of a ref.
  const PageWord current(table_[ref.first_page_].word.load(std::memory_order_acquire));
  if (current.generation() != ref.generation_ || !current.is_committed()) {
    return stale_ref(ref, current, "touch");
  }
  // If the allocation is freed and its head page allocated again between the check and this
  // store, the new allocation looks used at the current step: an eviction hint nudged, no state
  // changed (last use is monotonic and never decides correctness).
  bump_last_use(ref.first_page_);
  return Status();
}

}  // namespace folio::memory
