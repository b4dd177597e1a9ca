// Step validation for a KV-parallel member (StepLimits::kv_range_*, dist.md "KV-parallel
// groups"): block tables cover the part of each context the member holds, a token's slot is in
// the member when its position is in the range and -1 otherwise, and -1 may repeat while real
// slots may not.
#include "folio/exec/step_limits.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace folio::exec {
namespace {

using ::testing::HasSubstr;

struct Arrays {
  std::vector<int32_t> token_ids, positions, slot_mapping, query_start, seq_lens, block_tables,
      logit_indices;
  ir::StepBatch batch() const {
    return ir::StepBatch{.token_ids = token_ids,
                         .positions = positions,
                         .slot_mapping = slot_mapping,
                         .query_start = query_start,
                         .seq_lens = seq_lens,
                         .block_tables = block_tables,
                         .logit_indices = logit_indices,
                         .adapter_ids = {},
                         .max_blocks_per_sequence = 2,
                         .adapter_slots = {}};
  }
};

// Member 1 of ranges of 16 tokens with blocks of 8: it holds positions [16, 32) in 2 blocks.
StepLimits member_limits() {
  StepLimits limits;
  limits.max_tokens = 32;
  limits.max_sequences = 2;
  limits.max_logit_rows = 2;
  limits.max_blocks_per_sequence = 2;
  limits.num_kv_blocks = 10;
  limits.block_size = 8;
  limits.vocab_size = 100;
  limits.first_dummy_block = 0;
  limits.num_dummy_blocks = 1;
  limits.kv_range_begin = 16;
  limits.kv_range_end = 32;
  return limits;
}

// A chunk of positions [12, 20) of a sequence of 20 tokens (member 1 holds 16..19 in block 5),
// and a decode at position 6 of a short sequence member 1 holds nothing of.
Arrays member_step() {
  Arrays arrays;
  for (int32_t p = 12; p < 20; ++p) {
    arrays.token_ids.push_back(p);
    arrays.positions.push_back(p);
    arrays.slot_mapping.push_back(p < 16 ? -1 : 5 * 8 + (p - 16));
  }
  arrays.token_ids.push_back(1);
  arrays.positions.push_back(6);
  arrays.slot_mapping.push_back(-1);
  arrays.query_start = {0, 8, 9};
  arrays.seq_lens = {20, 7};
  arrays.block_tables = {5, 0, 0, 0};  // the short sequence's row: dummy blocks, never read
  arrays.logit_indices = {7, 8};
  return arrays;
}

TEST(StepLimitsTest, KvParallelMemberStepIsChecked) {
  const StepLimits limits = member_limits();
  std::vector<int64_t> scratch;
  Arrays arrays = member_step();
  EXPECT_TRUE(validate_step(arrays.batch(), limits, scratch).ok());

  arrays.slot_mapping[5] = -1;  // position 17 is this member's
  Status status = validate_step(arrays.batch(), limits, scratch);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("has slot -1"));

  arrays = member_step();
  arrays.slot_mapping[0] = 3;  // position 12 is another member's
  status = validate_step(arrays.batch(), limits, scratch);
  EXPECT_THAT(std::string(status.message()), HasSubstr("puts it at slot -1"));

  arrays = member_step();
  arrays.block_tables[0] = 0;  // a held block may not be a padding block
  EXPECT_EQ(validate_step(arrays.batch(), limits, scratch).code(), StatusCode::kInvalidArgument);

  // A context past the range is fine (the member holds its range of it); a range wider than
  // the block table is not: positions [16, 24) would need a third block.
  StepLimits wide = limits;
  wide.kv_range_end = 48;
  arrays = member_step();
  arrays.seq_lens[0] = 40;
  for (int32_t i = 0; i < 8; ++i) arrays.positions[static_cast<size_t>(i)] = 32 + i;
  status = validate_step(arrays.batch(), wide, scratch);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("from position 16"));
}

// Without a range, -1 is not a slot.
TEST(StepLimitsTest, WholeSequenceStepRefusesUnwrittenSlots) {
  StepLimits limits = member_limits();
  limits.kv_range_begin = 0;
  limits.kv_range_end = 0;
  limits.max_blocks_per_sequence = 4;
  std::vector<int64_t> scratch;
  Arrays arrays;
  arrays.token_ids = {1, 2};
  arrays.positions = {0, 1};
  arrays.slot_mapping = {24, -1};
  arrays.query_start = {0, 2};
  arrays.seq_lens = {2};
  arrays.block_tables = {3, 0, 0, 0};
  arrays.logit_indices = {1};
  ir::StepBatch batch = arrays.batch();
  batch.max_blocks_per_sequence = 4;
  EXPECT_EQ(validate_step(batch, limits, scratch).code(), StatusCode::kInvalidArgument);
  arrays.slot_mapping[1] = 25;
  batch = arrays.batch();
  batch.max_blocks_per_sequence = 4;
  EXPECT_TRUE(validate_step(batch, limits, scratch).ok());
}

}  // namespace
}  // namespace folio::exec
