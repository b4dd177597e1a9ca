// FreeExtentIndex: the page pool's global free list, as maximal runs of free pages ("extents")
// kept in segregated size bins.
//
// Bins: one per exact length for lengths 1..64 (where almost every request falls: single KV
// pages, adapters of 1-8 pages); above that, four bins per power of two (lengths [2^k, 2^k *
// 1.25), [2^k * 1.25, 2^k * 1.5), ...), 168 bins in all, with a bitmap of the non-empty ones.
// Each bin is an intrusive doubly linked list threaded through the extents' head slots, so the
// index allocates nothing. Boundary tags at both ends of every extent (PageSlot::extent_pages,
// extent_first) let a freed run merge with its free neighbours in O(1): no two extents are ever
// adjacent.
//
// Fit policies (seed 001 §5.2):
// - kBestFit (default): the shortest extent that holds the request. In an exact bin every
//   extent fits exactly; in a ranged bin the bin is searched for the shortest fit (lowest first
//   page on ties). The search touches one bin, whose extents are all longer than 64 pages, so it
//   visits at most num_pages / 64 entries and in practice a handful.
// - kFirstFit: the first extent found that holds the request, walking the bins from the
//   request's own upwards and each bin's list from its head; no search for the tightest fit.
//   ("First" in bin order, not in address order: an address-ordered first fit would have to
//   walk all extents below the first fit.)
// Both take the request from the front of the chosen extent, so that rolling back a reservation
// (inserting the run again) rebuilds the very extent it came from.
//
// Thread-safety: none; the pool calls it with its free mutex held.
// Invariants (check_invariants): tags exist exactly at current extents' ends; every extent is in
// the bin of its length; the bitmap marks exactly the non-empty bins; no two extents are
// adjacent; free_pages() and num_extents() equal the sums over the bins.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "folio/base/function_ref.h"
#include "folio/memory/page_table.h"

namespace folio::memory {

enum class FitPolicy { kBestFit, kFirstFit };

class FreeExtentIndex {
 public:
  FreeExtentIndex(PageTable& table, FitPolicy policy);
  FreeExtentIndex(const FreeExtentIndex&) = delete;
  FreeExtentIndex& operator=(const FreeExtentIndex&) = delete;

  // Adds the run [first, first + pages) and merges it with the extents right before and after.
  // Requires: pages > 0, the run is inside the table and none of its pages is in the index.
  void insert(uint32_t first, uint32_t pages);

  // Removes `pages` pages from the front of the extent the fit policy picks and returns the
  // first of them, or kNoPage when no extent is that long.
  uint32_t take(uint32_t pages);

  // Removes up to max_pages single pages, from the shortest extents first (keeping long extents
  // for range requests), and appends them to `out`. Returns how many were taken.
  uint32_t take_single_pages(uint32_t max_pages, std::vector<uint32_t>& out);

  uint64_t free_pages() const { return free_pages_; }
  uint32_t num_extents() const { return num_extents_; }
  // Length of the longest extent; 0 when nothing is free.
  uint32_t largest_extent() const;
  FitPolicy policy() const { return policy_; }

  // Calls visit(first, pages) for every extent, in no particular order.
  void for_each_extent(FunctionRef<void(uint32_t first, uint32_t pages)> visit) const;

  // FOLIO_CHECKs every invariant listed above; O(pages).
  void check_invariants() const;

  // The bin a run of `pages` pages lives in (exposed for tests).
  static int bin_of(uint32_t pages);
  static constexpr int kNumExactBins = 64;
  static constexpr int kNumBins = kNumExactBins + 26 * 4;

 private:
  void link(uint32_t first, uint32_t pages);
  void unlink(uint32_t first);
  // Removes the extent at `first` and gives back its tail beyond `pages` pages.
  void carve(uint32_t first, uint32_t pages);
  // First non-empty bin >= from, or -1.
  int next_nonempty_bin(int from) const;
  // In ranged bin `bin`, the extent the policy picks for `pages` pages, or kNoPage.
  uint32_t search_ranged_bin(int bin, uint32_t pages) const;

  PageTable& table_;
  const FitPolicy policy_;
  std::array<uint32_t, kNumBins> bin_heads_;
  std::array<uint64_t, (kNumBins + 63) / 64> nonempty_bins_{};
  uint64_t free_pages_ = 0;
  uint32_t num_extents_ = 0;
};

}  // namespace folio::memory
