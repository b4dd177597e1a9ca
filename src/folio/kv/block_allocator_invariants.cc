// BlockAllocator::check_invariants: the O(capacity) walk behind the invariants listed in
// block_allocator.h, used by tests after every operation and by debug builds.
#include "folio/base/check.h"
#include "folio/kv/block_allocator.h"

namespace folio::kv {

void BlockAllocator::check_page(int32_t page_index, std::span<const int32_t> expected_ref_counts,
                                BlockCounts& counts) const {
  const PageSlot& page = pages_[page_index];
  const int32_t first = page_index * blocks_per_page_;
  if (!page.held) {
    for (int32_t block = first; block < first + blocks_per_page_; ++block) {
      FOLIO_CHECK(blocks_[block].state == BlockState::kUnbacked, "block {} of unheld page", block);
      FOLIO_CHECK(expected_ref_counts[block] == 0, "a table holds block {} of an unheld page",
                  block);
    }
    FOLIO_CHECK(page.list == PageList::kNone && !page.pinned);
    return;
  }
  ++counts.held_pages;
  counts.pinned_pages += page.pinned ? 1 : 0;
  counts.total += blocks_per_page_;
  int32_t num_free = 0, num_owned = 0, num_cached = 0;
  for (int32_t block = first; block < first + blocks_per_page_; ++block) {
    const BlockSlot& slot = blocks_[block];
    FOLIO_CHECK(slot.ref_count == expected_ref_counts[block],
                "block {} has {} references but {} tables hold it", block, slot.ref_count,
                expected_ref_counts[block]);
    counts.shared += slot.ref_count > 1 ? 1 : 0;
    switch (slot.state) {
      case BlockState::kUnbacked:
        FOLIO_UNREACHABLE("block {} of a held page is unbacked", block);
      case BlockState::kFree:
        FOLIO_CHECK(slot.ref_count == 0 && !slot.registered, "free block {} in use", block);
        ++num_free;
        break;
      case BlockState::kOwned:
        FOLIO_CHECK(slot.ref_count >= 1, "owned block {} without references", block);
        ++num_owned;
        break;
      case BlockState::kCached:
        FOLIO_CHECK(slot.ref_count == 0 && slot.registered, "cached block {} bad", block);
        ++num_cached;
        break;
    }
  }
  FOLIO_CHECK(
      num_free == page.num_free && num_owned == page.num_owned && num_cached == page.num_cached,
      "page {} counters are off", page_index);
  FOLIO_CHECK(num_free + num_owned + num_cached == blocks_per_page_);
  int64_t listed = 0;
  for (int32_t block = page.free_blocks.front(); block >= 0; block = page.free_blocks.next(block)) {
    FOLIO_CHECK(page_of(block) == page_index && blocks_[block].state == BlockState::kFree,
                "block {} on page {}'s free list", block, page_index);
    ++listed;
  }
  FOLIO_CHECK(listed == num_free && page.free_blocks.size() == num_free);
  if (!page.doomed) {
    FOLIO_CHECK(page.pinned == (num_owned > 0), "page {} pinned {} with {} owned blocks",
                page_index, page.pinned, num_owned);
    FOLIO_CHECK(page.list == page_list_for(page), "page {} on the wrong list", page_index);
  }
  counts.free += num_free;
  counts.owned += num_owned;
  counts.cached += num_cached;
}

std::vector<int32_t> BlockAllocator::lru_order() const {
  std::vector<int32_t> order;
  for (int32_t block = lru_.front(); block >= 0; block = lru_.next(block)) order.push_back(block);
  return order;
}

void BlockAllocator::check_invariants(std::span<const int32_t> expected_ref_counts) const {
  FOLIO_CHECK(!in_transaction_, "check_invariants() inside a transaction");
  FOLIO_CHECK(static_cast<int64_t>(expected_ref_counts.size()) == capacity_blocks());
  BlockCounts counts;
  for (int32_t page_index = 0; page_index < capacity_pages_; ++page_index) {
    check_page(page_index, expected_ref_counts, counts);
  }
  FOLIO_CHECK(counts.total == counts_.total && counts.free == counts_.free &&
                  counts.owned == counts_.owned && counts.cached == counts_.cached &&
                  counts.shared == counts_.shared && counts.held_pages == counts_.held_pages &&
                  counts.pinned_pages == counts_.pinned_pages,
              "block counts are off: walked {}/{}/{}/{} shared {} held {}, recorded {}/{}/{}/{} "
              "shared {} held {}",
              counts.total, counts.free, counts.owned, counts.cached, counts.shared,
              counts.held_pages, counts_.total, counts_.free, counts_.owned, counts_.cached,
              counts_.shared, counts_.held_pages);
  FOLIO_CHECK(counts_.free + counts_.owned + counts_.cached == counts_.total);
  int64_t lru_length = 0;
  for (int32_t block = lru_.front(); block >= 0; block = lru_.next(block)) {
    FOLIO_CHECK(blocks_[block].state == BlockState::kCached, "block {} on the LRU", block);
    ++lru_length;
  }
  FOLIO_CHECK(lru_length == counts_.cached && lru_.size() == counts_.cached);
  int64_t num_registered = 0;
  for (const BlockSlot& slot : blocks_) num_registered += slot.registered ? 1 : 0;
  FOLIO_CHECK(num_registered == static_cast<int64_t>(prefix_index_.size()),
              "{} registered blocks but {} index entries", num_registered, prefix_index_.size());
  for (const auto& [hash, block] : prefix_index_) {
    const BlockSlot& slot = blocks_[block];
    FOLIO_CHECK(slot.registered && block_keys_[block].hash == hash,
                "index entry for block {} is stale", block);
    FOLIO_CHECK(slot.state == BlockState::kOwned || slot.state == BlockState::kCached);
  }
  for (int list = 0; list < kNumPageLists; ++list) {
    int64_t on_list = 0;
    for (const PageSlot& page : pages_) on_list += static_cast<int>(page.list) == list ? 1 : 0;
    FOLIO_CHECK(list == 0 || on_list == page_lists_[list].size(), "page list {} is off", list);
  }
}

}  // namespace folio::kv
