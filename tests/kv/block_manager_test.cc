#include "folio/kv/block_manager.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>

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

class BlockManagerTest : public testing::BlockManagerFixture {
 protected:
  void make(int32_t num_pages, int32_t blocks_per_page = 4, double watermark = 0.0,
            int32_t swap_blocks = 32, int32_t max_context = 256) {
    make_manager({num_pages, blocks_per_page, watermark, swap_blocks, max_context});
  }
};

TEST_F(BlockManagerTest, CreateRejectsBadGeometryAndBlocksLargerThanAPage) {
  FixedPageSource source(1024, 4);
  HostKvBlockCopier copier;
  BlockManagerOptions options;
  options.geometry = testing::tiny_geometry(8);
  options.max_context_tokens = 64;
  options.geometry.block_size = 12;
  EXPECT_EQ(BlockManager::create(options, source, copier).status().code(),
            StatusCode::kInvalidArgument);
  options.geometry = testing::tiny_geometry(32);  // 1024-byte blocks fit exactly
  EXPECT_TRUE(BlockManager::create(options, source, copier).ok());
  options.geometry.head_dim = 8;  // 2048-byte blocks do not fit 1024-byte pages
  const Status status = BlockManager::create(options, source, copier).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("does not fit a page"), std::string_view::npos);
  options.geometry = testing::tiny_geometry(8);
  options.watermark = 1.5;
  EXPECT_EQ(BlockManager::create(options, source, copier).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(BlockManagerTest, TablesCoverCeilOfTokensOverBlockSize) {
  make(8);
  const int32_t lengths[] = {1, 8, 9, 17};
  for (int32_t index = 0; index < 4; ++index) {
    const auto prompt = tokens(lengths[index]);
    const auto outcome = manager_->allocate(SeqId(index), prompt);
    ASSERT_TRUE(outcome.ok());
    EXPECT_EQ(outcome->admission, Admission::kAdmitted);
    EXPECT_EQ(table(SeqId(index)).size(), static_cast<size_t>((lengths[index] + 7) / 8));
    manager_->check_invariants();
  }
  std::vector<int32_t> all;
  for (int32_t index = 0; index < 4; ++index) {
    for (int32_t block : table(SeqId(index))) all.push_back(block);
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end()) << "a block is in two tables";
  EXPECT_EQ(std::count(all.begin(), all.end(), manager_->dummy_block().value()), 0);
  const KvLayoutNumbers layout = manager_->layout();
  EXPECT_EQ(layout.blocks_per_page, 4);
  EXPECT_EQ(layout.block_bytes, kBlockBytes);
  EXPECT_EQ(layout.base, source_->base());
}

TEST_F(BlockManagerTest, AppendSlotReturnsSlotsAndGrowsAtBlockBoundaries) {
  make(8);
  ASSERT_TRUE(manager_->allocate(SeqId(1), tokens(7)).ok());
  auto outcome = manager_->append_slot(SeqId(1), 5);
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->status, AppendStatus::kAppended);
  EXPECT_EQ(outcome->slot, int64_t{table(SeqId(1))[0]} * kBlockSize + 7);
  EXPECT_EQ(table(SeqId(1)).size(), 1u);
  outcome = manager_->append_slot(SeqId(1), 6);
  ASSERT_TRUE(outcome.ok());
  ASSERT_EQ(table(SeqId(1)).size(), 2u);
  EXPECT_EQ(outcome->slot, int64_t{table(SeqId(1))[1]} * kBlockSize);
  EXPECT_FALSE(outcome->copy_on_write.has_value());
  EXPECT_EQ(*manager_->num_tokens(SeqId(1)), 9);
  manager_->check_invariants();
}

// 4 pages of 4 blocks = 16 blocks, one of them the dummy; the watermark keeps 4 obtainable.
TEST_F(BlockManagerTest, WatermarkRefusesNewSequencesButNotAppends) {
  make(4, 4, 0.25);
  ASSERT_EQ(manager_->watermark_blocks(), 4);
  ASSERT_EQ(manager_->allocate(SeqId(1), tokens(64))->admission, Admission::kAdmitted);  // 8
  ASSERT_EQ(manager_->allocate(SeqId(2), tokens(24))->admission, Admission::kAdmitted);  // 3
  // 4 blocks left: one more block would leave 3 < 4.
  EXPECT_EQ(manager_->can_allocate(8), Admission::kNoCapacityNow);
  const auto refused = manager_->allocate(SeqId(3), tokens(8));
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->admission, Admission::kNoCapacityNow);
  EXPECT_FALSE(manager_->contains(SeqId(3)));
  // Appends may use the reserve down to the last block.
  int32_t new_blocks = 0;
  for (int32_t step = 0; step < 100; ++step) {
    const auto before = table(SeqId(2)).size();
    const auto outcome = manager_->append_slot(SeqId(2), step);
    ASSERT_TRUE(outcome.ok());
    if (outcome->status == AppendStatus::kNoCapacityNow) break;
    new_blocks += table(SeqId(2)).size() > before ? 1 : 0;
  }
  EXPECT_EQ(new_blocks, 4);
  EXPECT_EQ(manager_->counts().free, 0);
  manager_->check_invariants();
}

TEST_F(BlockManagerTest, SequenceLargerThanCapacityNeverFits) {
  make(2, 4);  // 7 usable blocks
  EXPECT_EQ(manager_->can_allocate(64), Admission::kNeverFits);
  const auto outcome = manager_->allocate(SeqId(1), tokens(64));
  ASSERT_TRUE(outcome.ok());
  EXPECT_EQ(outcome->admission, Admission::kNeverFits);
  EXPECT_EQ(manager_->allocate(SeqId(1), tokens(56))->admission, Admission::kAdmitted);
}

TEST_F(BlockManagerTest, BadInputReturnsErrorsNamingTheCauseAndChangesNothing) {
  make(8, 4, 0.0, 32, 32);
  prefill(SeqId(1), tokens(12));
  prefill(SeqId(2), tokens(9, 500));
  ASSERT_EQ(manager_->swap_out(std::vector<SeqId>{SeqId(2)})->status, SwapStatus::kSwapped);
  const std::vector<SeqId> seqs{SeqId(1), SeqId(2), SeqId(3)};
  const ManagerSnapshot before = ManagerSnapshot::take(*manager_, seqs);
  const auto expect_error = [&](Status status, StatusCode code, std::string_view words) {
    EXPECT_EQ(status.code(), code) << status.to_string();
    EXPECT_NE(status.message().find(words), std::string_view::npos) << status.to_string();
    EXPECT_EQ(ManagerSnapshot::take(*manager_, seqs), before) << status.to_string();
    manager_->check_invariants();
  };
  expect_error(manager_->allocate(SeqId(3), tokens(33)).status(), StatusCode::kOutOfRange,
               "context limit");
  expect_error(manager_->allocate(SeqId(3), {}).status(), StatusCode::kInvalidArgument,
               "no tokens");
  expect_error(manager_->allocate(SeqId(1), tokens(4)).status(), StatusCode::kAlreadyExists,
               "sequence 1");
  expect_error(manager_->free(SeqId(3)), StatusCode::kNotFound, "sequence 3");
  expect_error(manager_->append_slot(SeqId(3), 1).status(), StatusCode::kNotFound, "sequence 3");
  expect_error(manager_->append_slot(SeqId(2), 1).status(), StatusCode::kFailedPrecondition,
               "swapped out");
  expect_error(manager_->block_table(SeqId(2)).status(), StatusCode::kFailedPrecondition,
               "swapped out");
  expect_error(manager_->fork(SeqId(3), SeqId(4)), StatusCode::kNotFound, "sequence 3");
  expect_error(manager_->fork(SeqId(1), SeqId(2)), StatusCode::kAlreadyExists, "sequence 2");
  expect_error(manager_->mark_computed(SeqId(1), 13), StatusCode::kOutOfRange, "sequence 1");
  expect_error(manager_->mark_computed(SeqId(1), 3), StatusCode::kOutOfRange, "sequence 1");
  expect_error(manager_->swap_in(std::vector<SeqId>{SeqId(1)}).status(),
               StatusCode::kFailedPrecondition, "resident");
  expect_error(manager_->swap_out(std::vector<SeqId>{SeqId(2)}).status(),
               StatusCode::kFailedPrecondition, "swapped out");
  expect_error(manager_->swap_out(std::vector<SeqId>{SeqId(1), SeqId(1)}).status(),
               StatusCode::kInvalidArgument, "twice");
  std::vector<int32_t> small(3);
  expect_error(manager_->fill_block_tables(std::vector<SeqId>{SeqId(1)}, 1, small),
               StatusCode::kOutOfRange, "sequence 1");
  expect_error(manager_->fill_slot_mapping(std::vector<StepSegment>{{SeqId(1), 10, 5}}, small),
               StatusCode::kOutOfRange, "sequence 1");
  // Append up to the context limit, then one more.
  for (int32_t token = 0; token < 20; ++token)
    ASSERT_TRUE(manager_->append_slot(SeqId(1), token).ok());
  const ManagerSnapshot full = ManagerSnapshot::take(*manager_, seqs);
  const Status over = manager_->append_slot(SeqId(1), 0).status();
  EXPECT_EQ(over.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(ManagerSnapshot::take(*manager_, seqs), full);
  // Freeing twice.
  ASSERT_TRUE(manager_->free(SeqId(1)).ok());
  const Status twice = manager_->free(SeqId(1));
  EXPECT_EQ(twice.code(), StatusCode::kNotFound);
  EXPECT_NE(twice.message().find("already freed"), std::string_view::npos);
  manager_->check_invariants();
}

TEST_F(BlockManagerTest, ForkSharesBlocksUntilCopyOnWrite) {
  make(8);
  std::vector<int32_t> prompt = tokens(12);  // one full block, one holding 4 tokens
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->fork(SeqId(1), SeqId(2)).ok());
  EXPECT_EQ(table(SeqId(1)), table(SeqId(2)));
  for (int32_t block : table(SeqId(1)))
    EXPECT_EQ(manager_->allocator().ref_count(BlockId(block)), 2);
  manager_->check_invariants();

  const int32_t shared_last = table(SeqId(1)).back();
  const auto outcome = manager_->append_slot(SeqId(2), 77);
  ASSERT_TRUE(outcome.ok());
  ASSERT_TRUE(outcome->copy_on_write.has_value());
  EXPECT_EQ(outcome->copy_on_write->source, shared_last);
  EXPECT_EQ(outcome->copy_on_write->destination, table(SeqId(2)).back());
  EXPECT_NE(table(SeqId(2)).back(), shared_last);
  EXPECT_EQ(table(SeqId(1)).back(), shared_last);
  EXPECT_EQ(table(SeqId(1)).front(), table(SeqId(2)).front());  // the full block stays shared
  EXPECT_EQ(manager_->pending_copies().size(), 1u);
  manager_->check_invariants();
  ASSERT_TRUE(manager_->apply_pending_copies().ok());
  std::vector<int32_t> child = prompt;
  child.push_back(77);
  KvContents::write(*manager_, SeqId(2), child, {}, 12, 13);
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(2), child, {}, 13));
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(1), prompt, {}, 12));
  // The parent's last block is private again: appending writes in place.
  const auto parent_append = manager_->append_slot(SeqId(1), 78);
  ASSERT_TRUE(parent_append.ok());
  EXPECT_FALSE(parent_append->copy_on_write.has_value());
  EXPECT_EQ(parent_append->slot, int64_t{shared_last} * kBlockSize + 4);
  manager_->check_invariants();
}

TEST_F(BlockManagerTest, SiblingsCopyOnWriteRunsAsOneBatch) {
  make(8);
  const std::vector<int32_t> prompt = tokens(5);
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->fork(SeqId(1), SeqId(2)).ok());
  ASSERT_TRUE(manager_->fork(SeqId(1), SeqId(3)).ok());
  for (int32_t seq = 1; seq <= 3; ++seq) ASSERT_TRUE(manager_->append_slot(SeqId(seq), seq).ok());
  // Two of the three holders copy; the last one left holds the original.
  EXPECT_EQ(manager_->pending_copies().size(), 2u);
  const int before = copier_.num_batches;
  ASSERT_TRUE(manager_->apply_pending_copies().ok());
  EXPECT_EQ(copier_.num_batches, before + 1);
  EXPECT_EQ(copier_.last_batch.size(), 2u);
  for (int32_t seq = 1; seq <= 3; ++seq) {
    EXPECT_TRUE(KvContents::verify(*manager_, SeqId(seq), prompt, {}, 5));
  }
  manager_->check_invariants();
}

TEST_F(BlockManagerTest, ChainedCopyOnWriteNeverReadsABlockWrittenInTheSameBatch) {
  make(8);
  const std::vector<int32_t> prompt = tokens(5);
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->fork(SeqId(1), SeqId(2)).ok());
  ASSERT_TRUE(manager_->append_slot(SeqId(2), 1).ok());  // copy X -> Y queued
  ASSERT_TRUE(manager_->fork(SeqId(2), SeqId(3)).ok());  // Y shared
  ASSERT_TRUE(manager_->append_slot(SeqId(3), 2).ok());  // Y -> Z needs Y's bytes first
  for (const BlockCopy& copy : manager_->pending_copies()) {
    for (const BlockCopy& other : manager_->pending_copies()) {
      EXPECT_NE(copy.source, other.destination);
    }
  }
  ASSERT_TRUE(manager_->apply_pending_copies().ok());
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(3), prompt, {}, 5));
  manager_->check_invariants();
}

TEST_F(BlockManagerTest, FreedCopyTargetIsCopiedBeforeItsBlockIsReused) {
  make(8);
  const std::vector<int32_t> prompt = tokens(5);
  prefill(SeqId(1), prompt);
  ASSERT_TRUE(manager_->fork(SeqId(1), SeqId(2)).ok());
  const auto appended = manager_->append_slot(SeqId(2), 9);
  ASSERT_TRUE(appended.ok() && appended->copy_on_write.has_value());
  const int32_t target = appended->copy_on_write->destination;
  ASSERT_TRUE(manager_->free(SeqId(2)).ok());  // the queued copy's target is free again
  const std::vector<int32_t> other = tokens(3, 900);
  prefill(SeqId(3), other);
  ASSERT_EQ(table(SeqId(3))[0], target) << "the test needs the target block to be reused";
  // The stale copy must have run before the block changed hands, not after the new owner wrote.
  EXPECT_TRUE(manager_->pending_copies().empty());
  ASSERT_TRUE(manager_->apply_pending_copies().ok());
  EXPECT_TRUE(KvContents::verify(*manager_, SeqId(3), other, {}, 3));
  manager_->check_invariants();
}

}  // namespace
}  // namespace folio::kv
