// StepBatch's KV-parallel member view: a member sees the shared step with its own slots and
// block tables, and no group.
#include "folio/ir/step_batch.h"

#include <gtest/gtest.h>

#include <vector>

namespace folio::ir {
namespace {

TEST(StepBatchTest, AKvMemberViewSwapsInThatMembersSlotsAndBlockTablesOnly) {
  const std::vector<int32_t> tokens = {5, 6, 7}, positions = {30, 31, 32}, query_start = {0, 3},
                             seq_lens = {33}, logit_indices = {2};
  const std::vector<int32_t> member0_slots = {30, 31, -1}, member0_tables = {0, 1, 2, 3};
  const std::vector<int32_t> member1_slots = {-1, -1, 8}, member1_tables = {9, 4, 4, 4};
  const std::vector<KvMemberArrays> members = {
      {.slot_mapping = member0_slots, .block_tables = member0_tables},
      {.slot_mapping = member1_slots, .block_tables = member1_tables}};
  const StepBatch batch{.token_ids = tokens,
                        .positions = positions,
                        .slot_mapping = member0_slots,
                        .query_start = query_start,
                        .seq_lens = seq_lens,
                        .block_tables = member0_tables,
                        .logit_indices = logit_indices,
                        .adapter_ids = {},
                        .max_blocks_per_sequence = 4,
                        .kv_members = members};
  ASSERT_EQ(batch.num_kv_members(), 2);
  const StepBatch second = batch.for_kv_member(1);
  EXPECT_EQ(second.slot_mapping.data(), member1_slots.data());
  EXPECT_EQ(second.block_tables.data(), member1_tables.data());
  EXPECT_EQ(second.num_kv_members(), 0);
  EXPECT_EQ(second.token_ids.data(), tokens.data());
  EXPECT_EQ(second.positions.data(), positions.data());
  EXPECT_EQ(second.max_blocks_per_sequence, 4);
  EXPECT_EQ(second.phase(), StepPhase::kPrefill);
  EXPECT_EQ(batch.for_kv_member(0).slot_mapping.data(), member0_slots.data());
}

TEST(StepBatchDeathTest, AMemberOutsideTheGroupIsAnInvariantViolation) {
  const StepBatch batch{};
  EXPECT_DEATH((void)batch.for_kv_member(0), "member 0 of 0");
}

}  // namespace
}  // namespace folio::ir
