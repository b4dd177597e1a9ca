// The page pool evicting unpinned KV pages from another thread while the scheduler thread runs
// the block manager: the manager must only ever lose CACHED and FREE blocks, and must never
// read or write a page after the pool took it. The other thread scribbles over every page it
// takes, so a page taken while it still held an owned block would show up as wrong KV bytes
// (and as a data race under ThreadSanitizer). Not a benchmark.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "kv_test_util.h"
#include "random_workload.h"

namespace folio::kv {
namespace {

TEST(BlockManagerConcurrencyTest, PoolEvictionFromAnotherThreadTakesOnlyUnpinnedPages) {
  const KvCacheGeometry geometry = testing::tiny_geometry(8);
  FixedPageSource source(geometry.block_bytes() * 2, 24);
  HostSwapSpace swap(geometry.block_bytes(), 24);
  HostKvBlockCopier copier;
  BlockManagerOptions options;
  options.geometry = geometry;
  options.max_context_tokens = 96;
  auto manager = BlockManager::create(options, source, copier, &swap);
  ASSERT_TRUE(manager.ok()) << manager.status().to_string();

  // Set (release) by the scheduler thread when it is done; read (acquire) by the other owner.
  std::atomic<bool> done{false};
  std::atomic<int64_t> pages_taken{0};
  std::thread other_owner([&] {
    std::mt19937 random(99);
    while (!done.load(std::memory_order_acquire)) {
      std::vector<int32_t> pages = source.take_pages_for_other_owner(4 + random() % 12);
      for (int32_t page : pages) {
        std::memset(source.base() + page * source.page_bytes(), 0xAB,
                    static_cast<size_t>(source.page_bytes()));
      }
      pages_taken.fetch_add(static_cast<int64_t>(pages.size()), std::memory_order_relaxed);
      std::this_thread::sleep_for(std::chrono::microseconds(50 + random() % 200));
      source.return_pages_of_other_owner(pages);
    }
  });

  testing::RandomWorkload workload(**manager, 2024, /*concurrent_evictions=*/true);
  int failed_at = -1;
  for (int operation = 0; operation < 1500 && failed_at < 0; ++operation) {
    if (!workload.step()) failed_at = operation;
    (*manager)->check_invariants();
    if (operation % 5 == 0 && !workload.verify_contents()) failed_at = operation;
  }
  done.store(true, std::memory_order_release);
  other_owner.join();
  ASSERT_EQ(failed_at, -1);
  ASSERT_TRUE((*manager)->process_evictions().ok());
  (*manager)->check_invariants();
  EXPECT_TRUE(workload.verify_contents());
  EXPECT_GT(pages_taken.load(), 0);
  // How often the race was actually exercised depends on scheduling; recorded, not asserted.
  ::testing::Test::RecordProperty("kv_pages_evicted", static_cast<int>(source.counts().evictions));
  ::testing::Test::RecordProperty("cached_blocks_evicted",
                                  static_cast<int>((*manager)->prefix_stats().evicted_blocks));
}

}  // namespace
}  // namespace folio::kv
