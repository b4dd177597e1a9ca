#include "folio/kv/block_allocator.h"

#include <gtest/gtest.h>

#include <vector>

#include "folio/kv/fixed_page_source.h"

namespace folio::kv {
namespace {

constexpr int32_t kBlockSize = 8;

class BlockAllocatorTest : public ::testing::Test {
 protected:
  BlockAllocatorTest() : source_(1024, 4), allocator_(source_, 4, kBlockSize) {}

  std::vector<int32_t> expected_references() const {
    std::vector<int32_t> references(static_cast<size_t>(allocator_.capacity_blocks()), 0);
    for (BlockId block : owned_) ++references[block.value()];
    return references;
  }

  // Acquires with the given candidates; returns the hit count (or -1 without capacity).
  int32_t acquire(const AcquireRequest& request, bool commit = true) {
    std::vector<BlockId> blocks;
    int32_t num_hits = 0;
    allocator_.begin();
    if (allocator_.acquire(request, blocks, num_hits) != AcquireStatus::kAcquired) {
      allocator_.rollback();
      return -1;
    }
    if (!commit) {
      allocator_.rollback();
      return num_hits;
    }
    allocator_.commit();
    owned_.insert(owned_.end(), blocks.begin(), blocks.end());
    return num_hits;
  }

  FixedPageSource source_;
  BlockAllocator allocator_;
  std::vector<BlockId> owned_;
};

// The hash is only a key: a candidate must also match the stored tokens, parent key and
// namespace, so a 64-bit collision costs a miss, never another sequence's KV.
TEST_F(BlockAllocatorTest, HitsAreVerifiedBeyondTheHash) {
  AcquireRequest two;
  two.num_blocks = 2;
  ASSERT_EQ(acquire(two), 0);
  const BlockId block = owned_[0];
  std::vector<int32_t> tokens(kBlockSize, 3);
  const uint64_t hash = 0x1234;  // any value: the allocator does not recompute it
  ASSERT_TRUE(allocator_.register_block(block, hash, 77, tokens, CacheNamespace{2, 5}));
  // One block per key: a second block with the same key stays unregistered.
  EXPECT_FALSE(allocator_.register_block(owned_[1], hash, 77, tokens, CacheNamespace{2, 5}));
  EXPECT_FALSE(allocator_.is_registered(owned_[1]));
  ASSERT_TRUE(allocator_.release_reference(owned_[1]));
  EXPECT_EQ(allocator_.state(owned_[1]), BlockState::kFree);
  owned_.clear();
  ASSERT_TRUE(allocator_.release_reference(block));
  EXPECT_EQ(allocator_.state(block), BlockState::kCached);
  allocator_.check_invariants(expected_references());

  const uint64_t candidates[] = {hash};
  AcquireRequest request;
  request.hit_candidates = candidates;
  request.candidate_tokens = tokens;
  request.parent_hash = 77;
  request.cache_namespace = CacheNamespace{2, 5};
  request.num_blocks = 1;
  EXPECT_EQ(acquire(request, /*commit=*/false), 1);
  std::vector<int32_t> other_tokens = tokens;
  other_tokens[7] = 4;
  AcquireRequest wrong = request;
  wrong.candidate_tokens = other_tokens;
  EXPECT_EQ(acquire(wrong, false), 0);
  wrong = request;
  wrong.parent_hash = 78;
  EXPECT_EQ(acquire(wrong, false), 0);
  wrong = request;
  wrong.cache_namespace = CacheNamespace{2, 6};
  EXPECT_EQ(acquire(wrong, false), 0);
  wrong.cache_namespace = CacheNamespace{3, 5};
  EXPECT_EQ(acquire(wrong, false), 0);
  // Nothing was committed: the block is still cached, and the stats count nothing.
  EXPECT_EQ(allocator_.state(block), BlockState::kCached);
  EXPECT_EQ(allocator_.stats().queried_blocks, 0);
  allocator_.check_invariants(expected_references());
  EXPECT_EQ(acquire(request), 1);
  EXPECT_EQ(owned_.back(), block);
  EXPECT_EQ(allocator_.stats().hit_blocks, 1);
  allocator_.check_invariants(expected_references());
}

TEST_F(BlockAllocatorTest, WatermarkCountsPagesTheSourceCanStillGive) {
  // 4 pages x 4 blocks, nothing held yet.
  EXPECT_EQ(allocator_.num_obtainable_blocks(), 16);
  AcquireRequest request;
  request.num_blocks = 12;
  request.watermark_blocks = 5;
  EXPECT_EQ(acquire(request), -1);
  EXPECT_EQ(allocator_.counts().held_pages, 0) << "a refused acquisition takes no page";
  request.watermark_blocks = 4;
  EXPECT_EQ(acquire(request), 0);
  EXPECT_EQ(allocator_.counts().owned, 12);
  EXPECT_EQ(allocator_.counts().held_pages, 3);
  allocator_.check_invariants(expected_references());
}

TEST_F(BlockAllocatorTest, PagesArePinnedExactlyWhileTheyHoldOwnedBlocks) {
  AcquireRequest request;
  request.num_blocks = 5;  // one full page and one block of a second
  ASSERT_EQ(acquire(request), 0);
  EXPECT_EQ(source_.counts().pinned, 2);
  for (BlockId block : owned_) allocator_.release_reference(block);
  owned_.clear();
  EXPECT_EQ(source_.counts().pinned, 0);
  EXPECT_EQ(source_.counts().unpinned, 2);
  allocator_.release_surplus_pages(0);
  EXPECT_EQ(source_.counts().free, 4);
  EXPECT_EQ(allocator_.counts().held_pages, 0);
  allocator_.check_invariants(expected_references());
}

}  // namespace
}  // namespace folio::kv
