// The page metadata table of the page pool: one PageSlot per page, and the packed PageWord that
// carries every piece of a page's state that crosses threads.
//
// Terms:
// - A *head* page is the first page of a free extent (a run of free pages in the global free
//   index), of a thread-held page, or of an allocation (a run of pages handed out together).
//   Every page belongs to exactly one such run, and the run's whole state lives in its head's
//   slot; the other pages of a run (its *interior*) carry nothing but a kFree word. This is what
//   makes a 100-page allocation cost O(1) metadata writes instead of 100.
// - The PageWord of a head is {state, linked, pin count, generation} in one 64-bit atomic, so a
//   state check and a pin-count change are one compare-and-swap, never two steps (the race in
//   seed 001 §6.2, where `pin()` reads the status and then bumps the count separately).
// - The generation counts the allocations a page has headed: it is bumped when an allocation
//   headed by the page is committed. A handle carries the generation it was made with, so a
//   handle to a freed or evicted allocation never matches again (36 bits: a page would have to
//   head 2^36 allocations before a stale handle could match by wrap-around).
// - `linked` says the allocation is in the eviction index. It is set and cleared only under the
//   eviction index's mutex, but lives in the word so that lock-free pins and unpins see it.
//
// Page states and transitions (docs/design/memory.md has the diagram):
//   kFree --prepare--> kReserved --commit--> kPinned | kUnpinned      (rollback: back to kFree)
//   kThreadHeld (a free page held by a thread cache) takes the place of kFree for single pages.
//   kUnpinned <--pin / unpin--> kPinned
//   kPinned | kUnpinned --free--> kReleasing --> kFree | kThreadHeld
//   kUnpinned --evict--> kReleasing --(listener told)--> kFree
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

#include "folio/base/check.h"

namespace folio::memory {

class EvictionListener;

enum class PageState : uint8_t {
  kFree,  // in the global free index (head or interior of a free extent), or interior of any run
  kThreadHeld,  // a single free page held by one thread's cache
  kReserved,    // prepared by two-phase allocation, not yet committed: neither free nor visible
  kUnpinned,    // committed, pin count 0: evictable
  kPinned,      // committed, pin count >= 1: never evicted
  kReleasing,   // being freed by its owner or evicted; handles to it are already stale
};
inline constexpr int kNumPageStates = 6;

std::string_view page_state_name(PageState state);

// Page indices are 32-bit; kNoPage marks "none" in links and tags.
inline constexpr uint32_t kNoPage = UINT32_MAX;

// {state: 3 bits, linked: 1 bit, pins: 24 bits, generation: 36 bits}, low to high.
class PageWord {
 public:
  static constexpr uint32_t kMaxPins = (1u << 24) - 1;
  static constexpr uint64_t kGenerationMask = (uint64_t{1} << 36) - 1;

  constexpr PageWord() = default;
  constexpr explicit PageWord(uint64_t bits) : bits_(bits) {}
  static constexpr PageWord make(PageState state, bool linked, uint32_t pins, uint64_t generation) {
    return PageWord(static_cast<uint64_t>(state) | (uint64_t{linked} << kLinkedShift) |
                    (uint64_t{pins} << kPinsShift) |
                    ((generation & kGenerationMask) << kGenerationShift));
  }

  constexpr uint64_t bits() const { return bits_; }
  constexpr PageState state() const { return static_cast<PageState>(bits_ & 7); }
  constexpr bool linked() const { return (bits_ >> kLinkedShift) & 1; }
  constexpr uint32_t pins() const {
    return static_cast<uint32_t>((bits_ >> kPinsShift) & kMaxPins);
  }
  constexpr uint64_t generation() const { return bits_ >> kGenerationShift; }
  // True for kUnpinned and kPinned: a committed allocation that handles may use.
  constexpr bool is_committed() const {
    return state() == PageState::kUnpinned || state() == PageState::kPinned;
  }

  constexpr PageWord with_state(PageState state) const {
    return make(state, linked(), pins(), generation());
  }
  constexpr PageWord with_linked(bool linked) const {
    return make(state(), linked, pins(), generation());
  }
  constexpr PageWord with_pins(uint32_t pins) const {
    return make(pins == 0 ? PageState::kUnpinned : PageState::kPinned, linked(), pins,
                generation());
  }
  static constexpr uint64_t next_generation(uint64_t generation) {
    return (generation + 1) & kGenerationMask;
  }

  friend constexpr bool operator==(PageWord a, PageWord b) { return a.bits_ == b.bits_; }

 private:
  static constexpr int kLinkedShift = 3;
  static constexpr int kPinsShift = 4;
  static constexpr int kGenerationShift = 28;
  uint64_t bits_ = 0;
};

// One page's metadata. Which fields mean something depends on the page's role (head of an
// allocation, head of a free extent, last page of a free extent, interior); see each field.
// Aligned to a cache line so that threads pinning neighbouring pages do not share one.
struct alignas(64) PageSlot {
  // The PageWord of this page. Meaningful at heads; kFree (with the page's last generation) at
  // interior pages. Hand-offs through it are named where they happen (page_pool*.cc).
  std::atomic<uint64_t> word{0};
  // Step of last use (commit, unpin, touch). Relaxed everywhere: an eviction hint that publishes
  // no other data; the eviction index refreshes its keys from it lazily.
  std::atomic<uint64_t> last_use{0};

  // Allocation head only. Written before commit's release store of `word` and constant until
  // the allocation ends. Atomic (relaxed) because a thread holding a possibly stale handle reads
  // them before its compare-and-swap of `word` proves they belong to its allocation.
  std::atomic<uint32_t> allocation_pages{0};
  std::atomic<uint8_t> content{0};
  // Allocation head only. Written before commit's release store; read only by the thread that
  // moved the allocation to kReleasing (which then owns it alone).
  uint64_t owner = 0;
  EvictionListener* listener = nullptr;

  // Free-extent boundary tags and bin links, guarded by the pool's free mutex
  // (FreeExtentIndex). extent_pages: at the first page of a free extent, its length; 0
  // elsewhere. extent_first: at the last page of a free extent, its first page; kNoPage
  // elsewhere. Tags exist only at current extents' ends, so a freed run finds its free
  // neighbours in O(1).
  uint32_t extent_pages = 0;
  uint32_t extent_first = kNoPage;
  uint32_t free_prev = kNoPage;
  uint32_t free_next = kNoPage;

  // Eviction index position and key, guarded by the pool's eviction index mutex
  // (EvictionIndex). heap_position: index in its class's heap, or kNoPage when not linked.
  // heap_key: a lower bound of last_use, refreshed lazily.
  uint32_t heap_position = kNoPage;
  uint64_t heap_key = 0;
};

// The table itself: a fixed array of slots, one per page of the pool's budget.
class PageTable {
 public:
  explicit PageTable(uint32_t num_pages)
      : num_pages_(num_pages), slots_(std::make_unique<PageSlot[]>(num_pages)) {}

  uint32_t num_pages() const { return num_pages_; }
  // Requires: page < num_pages().
  PageSlot& operator[](uint32_t page) {
    FOLIO_DCHECK(page < num_pages_, "page {} of {}", page, num_pages_);
    return slots_[page];
  }
  const PageSlot& operator[](uint32_t page) const {
    FOLIO_DCHECK(page < num_pages_, "page {} of {}", page, num_pages_);
    return slots_[page];
  }

 private:
  uint32_t num_pages_;
  std::unique_ptr<PageSlot[]> slots_;
};

}  // namespace folio::memory
