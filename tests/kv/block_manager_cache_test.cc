// Prefix reuse, eviction, swap and page give-back of the block manager.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "folio/kv/block_manager.h"
#include "folio/kv/fixed_page_source.h"
#include "testing/block_manager_test_util.h"
#include "testing/tokens.h"

namespace folio::kv {
namespace {

using testing::KvContents;
using testing::ManagerSnapshot;

using folio::testing::tokens;

constexpr int32_t kBlockSize = testing::kTinyBlockSize;
constexpr int64_t kBlockBytes = testing::kTinyBlockBytes;

class BlockManagerCacheTest : public testing::BlockManagerFixture {
 protected:
  void make(int32_t num_pages, int32_t blocks_per_page = 4, int32_t swap_blocks = 32) {
    make_manager({num_pages, blocks_per_page, 0.0, swap_blocks, 1024});
  }
};

TEST_F(BlockManagerCacheTest, PrefixHitsHoldTheBytesAFreshPrefillWrites) {
  make(16);
  const std::vector<int32_t> prompt = tokens(40);  // 5 full blocks
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->free(SeqId(1)).ok());
  EXPECT_EQ(manager_->counts().cached, 5);
  const AllocateOutcome hit = prefill(SeqId(2), prompt);
  // The last token's logits must be computed, so its block is not served.
  EXPECT_EQ(hit.num_cached_tokens, 32);
  // A different salt isolates: a fresh prefill of the same tokens.
  const AllocateOutcome fresh = prefill(SeqId(3), prompt, CacheNamespace{0, 7});
  EXPECT_EQ(fresh.num_cached_tokens, 0);
  const KvLayoutNumbers layout = manager_->layout();
  const auto hit_table = table(SeqId(2));
  const auto fresh_table = table(SeqId(3));
  for (int32_t index = 0; index < 5; ++index) {
    EXPECT_NE(hit_table[index], fresh_table[index]);
    EXPECT_EQ(std::memcmp(layout.block_pointer(hit_table[index]),
                          layout.block_pointer(fresh_table[index]), kBlockBytes),
              0)
        << "block " << index;
  }
  const PrefixCacheStats& stats = manager_->prefix_stats();
  EXPECT_EQ(stats.hit_blocks, 4);
  EXPECT_EQ(stats.hit_tokens, 32);
  EXPECT_GE(stats.missed_blocks, 4);  // the first prefill and the salted one
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, DroppedCachedBlocksAreFreeAndNeverHitWhileOwnedOnesStay) {
  make(16);
  const std::vector<int32_t> freed_prompt = tokens(40);  // 5 full blocks
  std::vector<int32_t> held_prompt = tokens(24);         // 3 full blocks, still running
  held_prompt[0] = 4242;
  prefill(SeqId(1), freed_prompt);
  prefill(SeqId(2), held_prompt);
  ASSERT_TRUE(manager_->free(SeqId(1)).ok());
  const BlockCounts before = manager_->counts();
  EXPECT_EQ(before.cached, 5);
  const int64_t evicted_before = manager_->prefix_stats().evicted_blocks;
  Result<int64_t> dropped = manager_->drop_cached_blocks();
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, 5);
  EXPECT_EQ(manager_->counts().cached, 0);
  EXPECT_EQ(manager_->counts().owned, before.owned);
  EXPECT_EQ(manager_->prefix_stats().evicted_blocks, evicted_before + 5);
  manager_->check_invariants();
  EXPECT_EQ(prefill(SeqId(3), freed_prompt).num_cached_tokens, 0);
  // The running sequence's computed blocks stay in the prefix index.
  EXPECT_EQ(prefill(SeqId(4), held_prompt).num_cached_tokens, 16);
  Result<int64_t> none = manager_->drop_cached_blocks();
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, 0);
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, NoReuseAcrossAdaptersSaltsOrDifferentEarlierTokens) {
  make(32);
  const std::vector<int32_t> prompt = tokens(33);  // 4 full blocks + 1 token
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->free(SeqId(1)).ok());
  EXPECT_EQ(prefill(SeqId(2), prompt, CacheNamespace{5, 0}).num_cached_tokens, 0);
  EXPECT_EQ(prefill(SeqId(3), prompt, CacheNamespace{0, 9}).num_cached_tokens, 0);
  std::vector<int32_t> first_differs = prompt;
  first_differs[3] = 9999;  // blocks 1..3 equal, but what precedes them differs
  EXPECT_EQ(prefill(SeqId(4), first_differs).num_cached_tokens, 0);
  std::vector<int32_t> third_differs = prompt;
  third_differs[20] = 9999;
  EXPECT_EQ(prefill(SeqId(5), third_differs).num_cached_tokens, 16);
  EXPECT_EQ(prefill(SeqId(6), prompt).num_cached_tokens, 32);
  for (int32_t seq = 2; seq <= 6; ++seq) {
    const CacheNamespace cache_namespace = seq == 2 ? CacheNamespace{5, 0} : CacheNamespace{};
    const std::vector<int32_t>& used = seq == 4 ? first_differs : seq == 5 ? third_differs : prompt;
    EXPECT_TRUE(KvContents::verify(*manager_, SeqId(seq), used, cache_namespace, 33));
  }
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, RunningSequencesShareComputedBlocksButNotUncomputedOnes) {
  make(16);
  const std::vector<int32_t> prompt = tokens(24);
  ASSERT_TRUE(manager_->allocate(SeqId(1), prompt).ok());  // not computed yet
  EXPECT_EQ(manager_->allocate(SeqId(2), prompt)->num_cached_tokens, 0);
  KvContents::write(*manager_, SeqId(1), prompt, {}, 0, 24);
  ASSERT_TRUE(manager_->mark_computed(SeqId(1), 24).ok());
  EXPECT_EQ(manager_->allocate(SeqId(3), prompt)->num_cached_tokens, 16);
  EXPECT_EQ(table(SeqId(3))[0], table(SeqId(1))[0]);
  EXPECT_EQ(manager_->allocator().ref_count(BlockId(table(SeqId(1))[0])), 2);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(3), prompt, {}, 16));
  // Sequence 2 computed the same blocks separately: they stay unregistered and are freed as
  // FREE, not CACHED, so the index holds one block per key.
  KvContents::write(*manager_, SeqId(2), prompt, {}, 0, 24);
  ASSERT_TRUE(manager_->mark_computed(SeqId(2), 24).ok());
  const int64_t cached_before = manager_->counts().cached;
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  EXPECT_EQ(manager_->counts().cached, cached_before);
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, FreedSequencesEvictTailBlocksFirst) {
  make(2, 4);                                      // 8 blocks, the dummy included
  const std::vector<int32_t> prompt = tokens(56);  // 7 blocks: everything but the dummy
  prefill(SeqId(1), prompt);
  const auto blocks = table(SeqId(1));
  ASSERT_TRUE(manager_->free(SeqId(1)).ok());
  const std::vector<int32_t> expected_lru(blocks.rbegin(), blocks.rend());
  EXPECT_EQ(manager_->allocator().lru_order(), expected_lru);
  prefill(SeqId(2), tokens(8, 7000));
  EXPECT_EQ(table(SeqId(2))[0], blocks.back());
  EXPECT_EQ(manager_->prefix_stats().evicted_blocks, 1);
  prefill(SeqId(3), tokens(8, 8000));
  EXPECT_EQ(table(SeqId(3))[0], blocks[5]);
  // The head of the prompt is still cached.
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  ASSERT_TRUE(manager_->free(SeqId(3)).ok());
  EXPECT_EQ(prefill(SeqId(4), tokens(41)).num_cached_tokens, 40);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(4), tokens(41), {}, 41));
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, PoolPressureEvictsOnlyCachedBlocks) {
  make(6, 4);
  const std::vector<int32_t> running = tokens(24, 1);  // 3 blocks: fills the dummy's page
  prefill(SeqId(1), running);
  const std::vector<int32_t> finished = tokens(64, 500);  // 8 blocks on two more pages
  prefill(SeqId(2), finished);
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  ASSERT_EQ(manager_->counts().cached, 8);
  // Another content type wants the whole pool: it gets the free pages and the cached ones.
  const std::vector<int32_t> taken = source_->take_pages_for_other_owner(6);
  EXPECT_EQ(taken.size(), 5u);
  ASSERT_TRUE(manager_->process_evictions().ok());
  EXPECT_EQ(manager_->counts().cached, 0);
  EXPECT_EQ(manager_->counts().owned, 4);  // the running sequence and the dummy
  EXPECT_EQ(manager_->prefix_stats().evicted_blocks, 8);
  EXPECT_EQ(source_->counts().pinned, 1);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), running, {}, 24));
  manager_->check_invariants();
  // The pool is exhausted now: new sequences wait, appends that need a block fail softly.
  EXPECT_EQ(manager_->allocate(SeqId(3), finished)->admission, Admission::kNoCapacityNow);
  source_->return_pages_of_other_owner(taken);
  EXPECT_EQ(prefill(SeqId(3), finished).num_cached_tokens, 0);
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, FullPoolMakesAllocationReuseOwnCachedBlocksInLruOrder) {
  make(3, 4);                          // the dummy's page + 2 pages
  prefill(SeqId(1), tokens(24, 1));    // fills the dummy's page
  prefill(SeqId(2), tokens(32, 900));  // a whole page
  const auto cached_blocks = table(SeqId(2));
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  ASSERT_EQ(source_->take_pages_for_other_owner(1).size(), 1u);  // the last free page
  prefill(SeqId(3), tokens(8, 5000));
  EXPECT_EQ(table(SeqId(3))[0], cached_blocks.back());  // the LRU's oldest: the tail
  EXPECT_EQ(manager_->counts().cached, 3);
  EXPECT_EQ(source_->counts().other_owner, 1);
  EXPECT_EQ(source_->counts().evictions, 0);
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, SourceEvictingOurPageInsideAllocateIsHandled) {
  make(3, 4);
  prefill(SeqId(1), tokens(24, 1));
  prefill(SeqId(2), tokens(32, 900));
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  ASSERT_EQ(source_->take_pages_for_other_owner(1).size(), 1u);
  // The source claims a page to spare, then makes it by evicting our cached page and hands
  // that very page back: the notice arrives inside allocate_page.
  faulty_->override_available(1);
  const AllocateOutcome outcome = prefill(SeqId(3), tokens(32, 5000));
  faulty_->override_available(-1);
  EXPECT_EQ(outcome.admission, Admission::kAdmitted);
  EXPECT_EQ(source_->counts().evictions, 1);
  EXPECT_EQ(manager_->prefix_stats().evicted_blocks, 4);
  EXPECT_EQ(manager_->counts().cached, 0);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), tokens(24, 1), {}, 24));
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(3), tokens(32, 5000), {}, 32));
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, FailedPageAllocationRollsBackExactly) {
  make(8, 4);
  prefill(SeqId(1), tokens(16, 1));
  prefill(SeqId(2), tokens(16, 300));
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());
  const std::vector<SeqId> seqs{SeqId(1), SeqId(3)};
  const ManagerSnapshot before = ManagerSnapshot::take(*manager_, seqs);
  const auto pool_before = source_->counts();
  faulty_->fail_allocations_after(2);  // two pages arrive, the third allocation fails
  const auto outcome = manager_->allocate(SeqId(3), tokens(200, 7000));
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->admission, Admission::kNoCapacityNow);
  EXPECT_EQ(ManagerSnapshot::take(*manager_, seqs), before);
  EXPECT_EQ(source_->counts().free, pool_before.free);
  manager_->check_invariants();
  faulty_->fail_allocations_after(-1);
  EXPECT_EQ(manager_->allocate(SeqId(3), tokens(200, 7000))->admission, Admission::kAdmitted);
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, EmptyPagesGoBackToTheSource) {
  make(8, 4);
  for (int32_t seq = 0; seq < 5; ++seq) {
    ASSERT_TRUE(manager_->allocate(SeqId(seq), tokens(32, seq * 100)).ok());  // a page each
  }
  EXPECT_EQ(manager_->counts().held_pages, 6);
  for (int32_t seq = 0; seq < 5; ++seq) ASSERT_TRUE(manager_->free(SeqId(seq)).ok());
  // The dummy's page plus one empty page kept as slack (none was computed, so nothing cached).
  EXPECT_EQ(manager_->counts().held_pages, 2);
  EXPECT_EQ(source_->counts().free, 6);
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, SwapOutAndInPreservesBytes) {
  make(8, 4, 16);
  const std::vector<int32_t> prompt = tokens(27, 40);
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->append_slot(SeqId(1), 5).ok());
  std::vector<int32_t> all = prompt;
  all.push_back(5);
  KvContents::write(*manager_, SeqId(1), all, {}, 27, 28);
  const auto swapped = manager_->swap_out(std::vector<SeqId>{SeqId(1)});
  ASSERT_TRUE(swapped.ok());
  EXPECT_EQ(swapped->status, SwapStatus::kSwapped);
  EXPECT_EQ(swapped->num_blocks_copied, 4);
  EXPECT_TRUE(*manager_->is_swapped(SeqId(1)));
  EXPECT_EQ(swap_->num_free(), 12);
  manager_->check_invariants();
  // Overwrite the device memory the sequence had, with other sequences.
  for (int32_t seq = 2; seq < 6; ++seq) prefill(SeqId(seq), tokens(32, seq * 1000));
  for (int32_t seq = 2; seq < 6; ++seq) ASSERT_TRUE(manager_->free(SeqId(seq)).ok());
  const auto back = manager_->swap_in(std::vector<SeqId>{SeqId(1)});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->status, SwapStatus::kSwapped);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), all, {}, 28));
  EXPECT_EQ(swap_->num_free(), 16);
  ASSERT_TRUE(manager_->append_slot(SeqId(1), 6).ok());
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, SwappedForksStaySharedOnTheHost) {
  make(8, 4, 16);
  const std::vector<int32_t> prompt = tokens(20);
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->fork(SeqId(1), SeqId(2)).ok());
  ASSERT_TRUE(manager_->append_slot(SeqId(2), 1).ok());  // copy-on-write of the last block
  const std::vector<SeqId> both{SeqId(1), SeqId(2)};
  const auto out = manager_->swap_out(both);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->num_blocks_copied, 4);  // 2 shared + 2 private last blocks
  manager_->check_invariants();
  ASSERT_EQ(manager_->swap_in(both)->status, SwapStatus::kSwapped);
  EXPECT_EQ(table(SeqId(1))[0], table(SeqId(2))[0]);
  EXPECT_EQ(manager_->allocator().ref_count(BlockId(table(SeqId(1))[0])), 2);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), prompt, {}, 20));
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(2), prompt, {}, 20));
  manager_->check_invariants();
}

TEST_F(BlockManagerCacheTest, SwapOutWithoutHostRoomIsNoCapacityAndChangesNothing) {
  make(8, 4, 2);
  prefill(SeqId(1), tokens(24));
  const std::vector<SeqId> seqs{SeqId(1)};
  const ManagerSnapshot before = ManagerSnapshot::take(*manager_, seqs);
  const auto outcome = manager_->swap_out(seqs);
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->status, SwapStatus::kNoCapacityNow);
  EXPECT_EQ(ManagerSnapshot::take(*manager_, seqs), before);
  EXPECT_EQ(swap_->num_free(), 2);
}

TEST_F(BlockManagerCacheTest, TablesAndSlotMappingPadWithTheDummyBlock) {
  make(8, 4);
  ASSERT_TRUE(manager_->allocate(SeqId(1), tokens(10)).ok());
  ASSERT_TRUE(manager_->allocate(SeqId(2), tokens(3)).ok());
  const int32_t dummy = manager_->dummy_block().value();
  std::vector<int32_t> tables(2 * 4, -5);
  ASSERT_TRUE(manager_->fill_block_tables(std::vector<SeqId>{SeqId(2), SeqId(1)}, 4, tables).ok());
  const auto one = table(SeqId(1));
  const auto two = table(SeqId(2));
  EXPECT_EQ(tables,
            (std::vector<int32_t>{two[0], dummy, dummy, dummy, one[0], one[1], dummy, dummy}));
  std::vector<int32_t> slots(8, -5);
  const std::vector<StepSegment> segments{{SeqId(1), 7, 3}, {SeqId(2), 2, 1}};
  ASSERT_TRUE(manager_->fill_slot_mapping(segments, slots).ok());
  EXPECT_EQ(slots,
            (std::vector<int32_t>{one[0] * 8 + 7, one[1] * 8 + 0, one[1] * 8 + 1, two[0] * 8 + 2,
                                  dummy * 8 + 0, dummy * 8 + 1, dummy * 8 + 2, dummy * 8 + 3}));
}

}  // namespace
}  // namespace folio::kv
