// FreeExtentIndex against an independent reference: a vector<bool> of free pages, from which the
// maximal free runs are recomputed after every operation.
#include "folio/memory/free_extent_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace folio::memory {
namespace {

// Maximal runs of free pages, first page -> length.
std::map<uint32_t, uint32_t> runs_of(const std::vector<bool>& free) {
  std::map<uint32_t, uint32_t> runs;
  uint32_t page = 0;
  while (page < free.size()) {
    if (!free[page]) {
      ++page;
      continue;
    }
    uint32_t end = page;
    while (end < free.size() && free[end]) ++end;
    runs[page] = end - page;
    page = end;
  }
  return runs;
}

std::map<uint32_t, uint32_t> extents_of(const FreeExtentIndex& index) {
  std::map<uint32_t, uint32_t> extents;
  index.for_each_extent([&](uint32_t first, uint32_t pages) { extents[first] = pages; });
  return extents;
}

TEST(FreeExtentIndexTest, BinsAreExactUpTo64ThenQuarterPowersOfTwo) {
  EXPECT_EQ(FreeExtentIndex::bin_of(1), 0);
  EXPECT_EQ(FreeExtentIndex::bin_of(64), 63);
  EXPECT_EQ(FreeExtentIndex::bin_of(65), 64);
  EXPECT_EQ(FreeExtentIndex::bin_of(79), 64);
  EXPECT_EQ(FreeExtentIndex::bin_of(80), 65);
  EXPECT_EQ(FreeExtentIndex::bin_of(127), 67);
  EXPECT_EQ(FreeExtentIndex::bin_of(128), 68);
  EXPECT_LT(FreeExtentIndex::bin_of(UINT32_MAX), FreeExtentIndex::kNumBins);
  for (uint32_t pages = 2; pages < 100000; ++pages) {
    ASSERT_GE(FreeExtentIndex::bin_of(pages), FreeExtentIndex::bin_of(pages - 1)) << pages;
  }
}

TEST(FreeExtentIndexTest, FreedRunMergesWithBothNeighbours) {
  PageTable table(16);
  FreeExtentIndex index(table, FitPolicy::kBestFit);
  index.insert(0, 4);
  index.insert(8, 8);
  index.check_invariants();
  EXPECT_EQ(index.num_extents(), 2u);
  index.insert(4, 4);
  index.check_invariants();
  EXPECT_EQ(index.num_extents(), 1u);
  EXPECT_EQ(index.largest_extent(), 16u);
  EXPECT_EQ(index.free_pages(), 16u);
}

TEST(FreeExtentIndexTest, BestFitTakesTheShortestExtentThatHoldsTheRequest) {
  PageTable table(40);
  FreeExtentIndex index(table, FitPolicy::kBestFit);
  // Free runs of 5 (at 0), 3 (at 10), 8 (at 20), 2 (at 30), separated by used pages.
  index.insert(0, 5);
  index.insert(10, 3);
  index.insert(20, 8);
  index.insert(30, 2);
  EXPECT_EQ(index.take(3), 10u);
  EXPECT_EQ(index.take(4), 0u);  // the 5-run; its last page stays free
  EXPECT_EQ(index.take(6), 20u);
  EXPECT_EQ(index.take(9), kNoPage);
  index.check_invariants();
  EXPECT_EQ(index.free_pages(), 1u + 2u + 2u);
}

TEST(FreeExtentIndexTest, BestFitSearchesARangedBinForTheTightestExtent) {
  PageTable table(400);
  FreeExtentIndex best(table, FitPolicy::kBestFit);
  // 70 and 66 pages share the bin [65, 80); 66 is inserted first, so 70 heads the bin's list.
  best.insert(0, 66);
  best.insert(100, 70);
  EXPECT_EQ(best.take(65), 0u);
}

TEST(FreeExtentIndexTest, FirstFitTakesTheFirstExtentFoundWithoutSearching) {
  PageTable table(400);
  FreeExtentIndex first(table, FitPolicy::kFirstFit);
  first.insert(0, 66);
  first.insert(100, 70);
  EXPECT_EQ(first.take(65), 100u);
  first.check_invariants();
}

TEST(FreeExtentIndexTest, SinglePagesComeFromTheShortestExtentsFirst) {
  PageTable table(64);
  FreeExtentIndex index(table, FitPolicy::kBestFit);
  index.insert(0, 32);
  index.insert(40, 1);
  index.insert(50, 2);
  std::vector<uint32_t> pages;
  EXPECT_EQ(index.take_single_pages(4, pages), 4u);
  EXPECT_EQ(pages, (std::vector<uint32_t>{40, 50, 51, 0}));
  index.check_invariants();
  EXPECT_EQ(index.largest_extent(), 31u);
}

TEST(FreeExtentIndexTest, TakingAndReinsertingRebuildsTheSameExtent) {
  PageTable table(64);
  FreeExtentIndex index(table, FitPolicy::kBestFit);
  index.insert(0, 10);
  index.insert(20, 44);
  const auto before = extents_of(index);
  const uint32_t first = index.take(7);
  ASSERT_NE(first, kNoPage);
  index.insert(first, 7);
  EXPECT_EQ(extents_of(index), before);
}

// Random takes and frees, checked after every step against the reference runs: the extents are
// exactly the maximal free runs, a take fails only when no run is long enough, and best fit picks
// a run of the shortest sufficient length.
void run_randomized(FitPolicy policy, uint32_t seed) {
  constexpr uint32_t kPages = 512;
  PageTable table(kPages);
  FreeExtentIndex index(table, policy);
  std::vector<bool> free(kPages, true);
  index.insert(0, kPages);
  std::vector<std::pair<uint32_t, uint32_t>> taken;
  std::mt19937 random(seed);
  for (int step = 0; step < 3000; ++step) {
    const bool do_take = taken.empty() || random() % 100 < 55;
    if (do_take) {
      const uint32_t want = random() % 4 == 0 ? 1 + random() % 100 : 1 + random() % 6;
      const auto runs = runs_of(free);
      uint32_t shortest_fit = UINT32_MAX;
      for (const auto& [start, length] : runs) {
        if (length >= want) shortest_fit = std::min(shortest_fit, length);
      }
      const uint32_t first = index.take(want);
      if (shortest_fit == UINT32_MAX) {
        ASSERT_EQ(first, kNoPage) << "step " << step;
      } else {
        ASSERT_NE(first, kNoPage) << "step " << step;
        ASSERT_TRUE(runs.count(first)) << "took from the middle of a run at step " << step;
        ASSERT_GE(runs.at(first), want);
        if (policy == FitPolicy::kBestFit) {
          ASSERT_EQ(runs.at(first), shortest_fit);
        }
        for (uint32_t page = first; page < first + want; ++page) free[page] = false;
        taken.emplace_back(first, want);
      }
    } else {
      const size_t which = random() % taken.size();
      const auto [first, pages] = taken[which];
      taken.erase(taken.begin() + static_cast<ptrdiff_t>(which));
      index.insert(first, pages);
      for (uint32_t page = first; page < first + pages; ++page) free[page] = true;
    }
    index.check_invariants();
    ASSERT_EQ(extents_of(index), runs_of(free)) << "step " << step;
  }
}

TEST(FreeExtentIndexTest, RandomizedBestFitMatchesReference) {
  for (uint32_t seed : {1u, 2u, 3u}) run_randomized(FitPolicy::kBestFit, seed);
}

TEST(FreeExtentIndexTest, RandomizedFirstFitMatchesReference) {
  for (uint32_t seed : {4u, 5u}) run_randomized(FitPolicy::kFirstFit, seed);
}

}  // namespace
}  // namespace folio::memory
