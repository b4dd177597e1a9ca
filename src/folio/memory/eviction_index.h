// EvictionIndex: finds the page pool's next eviction victim without scanning every page.
//
// The score (seed 001 §7.1; lower is evicted first):
//   score = w_recency / (now - last_use + 1) + w_size * pages / num_pages + w_priority * priority
// with the seed's weights 0.6 / 0.2 / 0.2 by default, `now` and `last_use` in steps of the
// pool's step counter (not clock reads), `pages` the allocation's length and `priority` its
// content type's (1 = evict first ... 5 = evict last).
//
// Structure: allocations are evicted whole, so the index holds allocations (by head page), in
// one class per (content type, floor(log2(pages))). Each class is a binary min-heap keyed by
// last use. Within a class the priority term is constant and the size term varies by less than
// a factor of two, so the class minimum by last use is the class minimum by score up to that
// size term; the victim is the lowest-scored of the class minima, found by looking at the top of
// each non-empty class (at most 5 * 32, in practice a few). So the index is exact across
// classes and exact LRU within a class; it may prefer an older allocation over a slightly
// smaller, slightly newer one of the same content type and size class.
//
// Laziness: pins, unpins and touches update only the PageWord and last_use atomics, never the
// index (they are lock-free). A heap key is therefore a lower bound of its allocation's last use,
// and the index may hold pinned allocations. select_victim() repairs the top of a class before
// using it: an entry that is no longer unpinned is dropped (clearing `linked` in its word, so
// its next unpin links it again), and an entry whose last_use moved past its key is re-keyed and
// sifted down. Each repair consumes one pin or touch, so the cost is amortized O(log n) per
// operation, and an entry popped with key == last_use is the class's true LRU allocation,
// because every other entry's last use is at least its key.
//
// Thread-safety: none; the pool calls every method with its eviction index mutex held. Words are
// changed here only by compare-and-swap, since lock-free pins and unpins race with it.
// Invariants (check_invariants): each heap satisfies the heap property on (key, page); every
// entry's heap_position is its index; every entry's word has `linked` set, and every word with
// `linked` set is in exactly one heap (the pool checks the second half); keys never exceed
// last_use.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "folio/memory/content_type.h"
#include "folio/memory/page_table.h"

namespace folio::memory {

struct EvictionWeights {
  double recency = 0.6;
  double size = 0.2;
  double priority = 0.2;
};

class EvictionIndex {
 public:
  EvictionIndex(PageTable& table, EvictionWeights weights,
                std::array<int, kNumContentTypes> content_priority);
  EvictionIndex(const EvictionIndex&) = delete;
  EvictionIndex& operator=(const EvictionIndex&) = delete;

  // Adds the allocation headed at `head`, keyed by its current last_use.
  // Requires: not in the index; its content and allocation_pages are set.
  void link(uint32_t head);
  // Requires: in the index.
  void remove(uint32_t head);
  bool contains(uint32_t head) const { return table_[head].heap_position != kNoPage; }
  uint32_t size() const { return size_; }

  // The head of the lowest-scored unpinned allocation at step `now`, or kNoPage when none is.
  // The victim stays in the index: the caller claims it by compare-and-swap of its word and then
  // calls remove(), or calls select_victim() again if the claim lost a race with a pin.
  uint32_t select_victim(uint64_t now);

  // The score defined above.
  double score(uint64_t last_use, uint32_t pages, ContentType content, uint64_t now) const;
  // How far select_victim()'s choice may be from the exact minimum score for an allocation of
  // `pages` pages: the size term's spread within its class.
  double size_class_slack(uint32_t pages) const;

  // FOLIO_CHECKs the invariants above and returns the number of entries. O(entries).
  uint32_t check_invariants() const;

 private:
  static constexpr int kNumSizeClasses = 32;
  using Heap = std::vector<uint32_t>;

  static int size_class_of(uint32_t pages);
  Heap& heap_of(uint32_t head);
  // (key, page) order: the heap's comparison.
  bool before(uint32_t a, uint32_t b) const;
  void place(Heap& heap, size_t position, uint32_t head);
  void sift_up(Heap& heap, size_t position);
  void sift_down(Heap& heap, size_t position);
  void remove_at(Heap& heap, size_t position);
  // Repairs the top of a class as described above; returns it, or kNoPage when it empties.
  uint32_t repaired_top(int content, int size_class);

  PageTable& table_;
  const EvictionWeights weights_;
  const std::array<int, kNumContentTypes> content_priority_;
  std::array<std::array<Heap, kNumSizeClasses>, kNumContentTypes> heaps_;
  // Bit k of nonempty_[c] is set when heaps_[c][k] is not empty.
  std::array<uint32_t, kNumContentTypes> nonempty_{};
  uint32_t size_ = 0;
};

}  // namespace folio::memory
