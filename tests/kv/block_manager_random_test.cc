// Randomized operation sequences with fixed seeds, checking the block manager's invariants after
// every operation and the KV bytes of every resident sequence every few operations.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "random_workload.h"
#include "testing/kv_test_util.h"

namespace folio::kv {
namespace {

struct RandomConfig {
  uint32_t seed;
  int32_t block_size;
  int32_t blocks_per_page;
  int32_t num_pages;
  double watermark;
};

class BlockManagerRandomTest : public ::testing::TestWithParam<RandomConfig> {};

TEST_P(BlockManagerRandomTest, InvariantsHoldAfterEveryOperation) {
  const RandomConfig config = GetParam();
  const ir::KvCacheGeometry geometry = testing::tiny_geometry(config.block_size);
  FixedPageSource source(geometry.block_bytes() * config.blocks_per_page, config.num_pages);
  HostSwapSpace swap(geometry.block_bytes(), 24);
  HostKvBlockCopier copier;
  BlockManagerOptions options;
  options.geometry = geometry;
  options.max_context_tokens = 96;
  options.watermark = config.watermark;
  auto manager = BlockManager::create(options, source, copier, &swap);
  ASSERT_TRUE(manager.ok()) << manager.status().to_string();
  testing::RandomWorkload workload(**manager, config.seed);
  std::mt19937 pressure(config.seed * 7 + 1);
  std::vector<int32_t> other_owner_pages;
  for (int operation = 0; operation < 3000; ++operation) {
    // Now and then another content type takes pages (evicting unpinned KV pages) or gives
    // them back.
    if (operation % 50 == 25) {
      if (other_owner_pages.empty()) {
        other_owner_pages = source.take_pages_for_other_owner(1 + pressure() % 3);
      } else {
        source.return_pages_of_other_owner(other_owner_pages);
        other_owner_pages.clear();
      }
    }
    ASSERT_TRUE(workload.step()) << "operation " << operation;
    ASSERT_TRUE((*manager)->process_evictions().ok());
    (*manager)->check_invariants();
    if (operation % 10 == 0) {
      ASSERT_TRUE(workload.verify_contents()) << "operation " << operation;
    }
  }
  ASSERT_TRUE(workload.verify_contents());
  // The workload must have exercised admission both ways and the prefix cache.
  EXPECT_GT(workload.num_admitted(), 100);
  EXPECT_GT(workload.num_refused(), 0);
  EXPECT_GT((*manager)->prefix_stats().hit_blocks, 0);
  EXPECT_GT((*manager)->prefix_stats().evicted_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Seeds, BlockManagerRandomTest,
    ::testing::Values(RandomConfig{1, 8, 4, 10, 0.0}, RandomConfig{2, 8, 1, 40, 0.05},
                      RandomConfig{3, 16, 2, 12, 0.01}, RandomConfig{4, 16, 3, 8, 0.0},
                      RandomConfig{5, 32, 2, 8, 0.05}, RandomConfig{6, 8, 8, 5, 0.0}));

}  // namespace
}  // namespace folio::kv
