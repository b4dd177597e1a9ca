#include "folio/memory/free_extent_index.h"

#include <algorithm>
#include <bit>

namespace folio::memory {

FreeExtentIndex::FreeExtentIndex(PageTable& table, FitPolicy policy)
    : table_(table), policy_(policy) {
  bin_heads_.fill(kNoPage);
}

int FreeExtentIndex::bin_of(uint32_t pages) {
  FOLIO_DCHECK(pages > 0);
  if (pages <= kNumExactBins) return static_cast<int>(pages) - 1;
  const int log2 = std::bit_width(pages) - 1;  // >= 6
  const int quarter = static_cast<int>((pages >> (log2 - 2)) & 3);
  return kNumExactBins + (log2 - 6) * 4 + quarter;
}

void FreeExtentIndex::link(uint32_t first, uint32_t pages) {
  PageSlot& head = table_[first];
  head.extent_pages = pages;
  table_[first + pages - 1].extent_first = first;
  const int bin = bin_of(pages);
  head.free_prev = kNoPage;
  head.free_next = bin_heads_[bin];
  if (head.free_next != kNoPage) table_[head.free_next].free_prev = first;
  bin_heads_[bin] = first;
  nonempty_bins_[bin / 64] |= uint64_t{1} << (bin % 64);
  free_pages_ += pages;
  ++num_extents_;
}

void FreeExtentIndex::unlink(uint32_t first) {
  PageSlot& head = table_[first];
  const uint32_t pages = head.extent_pages;
  FOLIO_DCHECK(pages > 0, "page {} is not the head of a free extent", first);
  const int bin = bin_of(pages);
  if (head.free_prev != kNoPage) {
    table_[head.free_prev].free_next = head.free_next;
  } else {
    bin_heads_[bin] = head.free_next;
    if (head.free_next == kNoPage) nonempty_bins_[bin / 64] &= ~(uint64_t{1} << (bin % 64));
  }
  if (head.free_next != kNoPage) table_[head.free_next].free_prev = head.free_prev;
  head.free_prev = kNoPage;
  head.free_next = kNoPage;
  head.extent_pages = 0;
  table_[first + pages - 1].extent_first = kNoPage;
  free_pages_ -= pages;
  --num_extents_;
}

void FreeExtentIndex::carve(uint32_t first, uint32_t pages) {
  const uint32_t length = table_[first].extent_pages;
  FOLIO_DCHECK(length >= pages);
  unlink(first);
  if (length > pages) link(first + pages, length - pages);
}

void FreeExtentIndex::insert(uint32_t first, uint32_t pages) {
  FOLIO_DCHECK(pages > 0 && uint64_t{first} + pages <= table_.num_pages());
  uint32_t start = first;
  uint32_t length = pages;
  if (first > 0) {
    const uint32_t before = table_[first - 1].extent_first;
    if (before != kNoPage) {
      length += table_[before].extent_pages;
      unlink(before);
      start = before;
    }
  }
  const uint32_t end = first + pages;
  if (end < table_.num_pages() && table_[end].extent_pages > 0) {
    length += table_[end].extent_pages;
    unlink(end);
  }
  link(start, length);
}

int FreeExtentIndex::next_nonempty_bin(int from) const {
  for (int word = from / 64; word < static_cast<int>(nonempty_bins_.size()); ++word) {
    uint64_t bits = nonempty_bins_[word];
    if (word == from / 64) bits &= ~uint64_t{0} << (from % 64);
    if (bits != 0) return word * 64 + std::countr_zero(bits);
  }
  return -1;
}

uint32_t FreeExtentIndex::search_ranged_bin(int bin, uint32_t pages) const {
  uint32_t chosen = kNoPage;
  uint32_t chosen_length = UINT32_MAX;
  for (uint32_t page = bin_heads_[bin]; page != kNoPage; page = table_[page].free_next) {
    const uint32_t length = table_[page].extent_pages;
    if (length < pages) continue;
    if (policy_ == FitPolicy::kFirstFit) return page;
    if (length < chosen_length || (length == chosen_length && page < chosen)) {
      chosen = page;
      chosen_length = length;
    }
  }
  return chosen;
}

uint32_t FreeExtentIndex::take(uint32_t pages) {
  FOLIO_DCHECK(pages > 0);
  for (int bin = next_nonempty_bin(bin_of(pages)); bin >= 0; bin = next_nonempty_bin(bin + 1)) {
    // Every extent of an exact bin at or above the request's own holds it.
    const uint32_t chosen = bin < kNumExactBins ? bin_heads_[bin] : search_ranged_bin(bin, pages);
    if (chosen != kNoPage) {
      carve(chosen, pages);
      return chosen;
    }
  }
  return kNoPage;
}

uint32_t FreeExtentIndex::take_single_pages(uint32_t max_pages, std::vector<uint32_t>& out) {
  uint32_t taken = 0;
  while (taken < max_pages) {
    const int bin = next_nonempty_bin(0);
    if (bin < 0) break;
    const uint32_t first = bin_heads_[bin];
    const uint32_t count = std::min(table_[first].extent_pages, max_pages - taken);
    carve(first, count);
    for (uint32_t page = first; page < first + count; ++page) out.push_back(page);
    taken += count;
  }
  return taken;
}

uint32_t FreeExtentIndex::largest_extent() const {
  for (int word = static_cast<int>(nonempty_bins_.size()) - 1; word >= 0; --word) {
    if (nonempty_bins_[word] == 0) continue;
    const int bin = word * 64 + 63 - std::countl_zero(nonempty_bins_[word]);
    if (bin < kNumExactBins) return static_cast<uint32_t>(bin) + 1;
    uint32_t largest = 0;
    for (uint32_t page = bin_heads_[bin]; page != kNoPage; page = table_[page].free_next) {
      largest = std::max(largest, table_[page].extent_pages);
    }
    return largest;
  }
  return 0;
}

void FreeExtentIndex::for_each_extent(
    FunctionRef<void(uint32_t first, uint32_t pages)> visit) const {
  for (int bin = 0; bin < kNumBins; ++bin) {
    for (uint32_t page = bin_heads_[bin]; page != kNoPage; page = table_[page].free_next) {
      visit(page, table_[page].extent_pages);
    }
  }
}

void FreeExtentIndex::check_invariants() const {
  const uint32_t num_pages = table_.num_pages();
  std::vector<uint8_t> is_head(num_pages, 0);
  std::vector<uint8_t> is_last(num_pages, 0);
  uint64_t pages_seen = 0;
  uint32_t extents_seen = 0;
  for (int bin = 0; bin < kNumBins; ++bin) {
    const bool marked = (nonempty_bins_[bin / 64] >> (bin % 64)) & 1;
    FOLIO_CHECK(marked == (bin_heads_[bin] != kNoPage), "bin {} bitmap disagrees with list", bin);
    uint32_t previous = kNoPage;
    for (uint32_t page = bin_heads_[bin]; page != kNoPage; page = table_[page].free_next) {
      FOLIO_CHECK(page < num_pages && !is_head[page], "bin {} list broken at page {}", bin, page);
      const PageSlot& head = table_[page];
      FOLIO_CHECK(head.free_prev == previous, "bin {}: page {} has a wrong back link", bin, page);
      const uint32_t length = head.extent_pages;
      FOLIO_CHECK(length > 0 && uint64_t{page} + length <= num_pages, "extent at {} has length {}",
                  page, length);
      FOLIO_CHECK(bin_of(length) == bin, "extent {}+{} sits in bin {}", page, length, bin);
      FOLIO_CHECK(table_[page + length - 1].extent_first == page, "extent {}: tail tag", page);
      is_head[page] = 1;
      is_last[page + length - 1] = 1;
      pages_seen += length;
      ++extents_seen;
      FOLIO_CHECK(extents_seen <= num_extents_, "more extents in bins than counted");
      previous = page;
    }
  }
  FOLIO_CHECK(pages_seen == free_pages_ && extents_seen == num_extents_,
              "counted {} pages in {} extents, bins hold {} in {}", free_pages_, num_extents_,
              pages_seen, extents_seen);
  for (uint32_t page = 0; page < num_pages; ++page) {
    FOLIO_CHECK((table_[page].extent_pages > 0) == static_cast<bool>(is_head[page]),
                "page {}: stray head tag", page);
    FOLIO_CHECK((table_[page].extent_first != kNoPage) == static_cast<bool>(is_last[page]),
                "page {}: stray tail tag", page);
    // Maximal extents: an extent never ends right where another begins.
    if (is_last[page] && page + 1 < num_pages) {
      FOLIO_CHECK(!is_head[page + 1], "free extents meet at page {} without merging", page + 1);
    }
  }
}

}  // namespace folio::memory
