// KV-parallel attention (issue 15, slice 6): each member's partial paged attention over its range
// of key positions, merged by log-sum-exp (attention_merge.h), equals attention over the whole
// sequence, checked against the independent double-precision reference for many splits of the
// positions (ranges of one block up to the whole context, ranges past every query, empty
// members), with mixed decode/prefill batches, GQA, f32/f16 caches, sliding windows and soft
// caps, on every SIMD path. Also: the merge of a single part is that part; rows no part saw merge
// to zeros, never NaN; two parts match the closed form in double.
#include "folio/kernels/cpu/attention_merge.h"

#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "attention_test_util.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "folio/kernels/cpu/paged_attention.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// Runs every member of a split of positions into ranges of `range` tokens (the last member's
// range is open-ended: members past the longest context hold nothing), packs each partial as
// the exchange does and merges them.
std::vector<float> run_kv_parallel(ThreadPool& pool, AttentionHarness& harness, int32_t range,
                                   int32_t num_members, std::vector<float>* merged_lse = nullptr) {
  const AttentionShape& shape = harness.shape();
  const int64_t tokens = harness.num_tokens();
  const int64_t output_elements = tokens * shape.num_heads * shape.head_dim;
  const int64_t part_elements =
      cpu::attention_partial_elements(tokens, shape.num_heads, shape.head_dim);
  std::vector<float> partials(static_cast<size_t>(part_elements * num_members),
                              std::numeric_limits<float>::quiet_NaN());
  device::HostStream stream(pool);
  for (int32_t member = 0; member < num_members; ++member) {
    float* part = partials.data() + member * part_elements;
    const int64_t begin = int64_t{member} * range;
    const int64_t end = member + 1 == num_members ? 0 : begin + range;
    cpu::paged_attention(stream,
                         harness.member_arguments(part, part + output_elements, begin, end));
  }
  std::vector<float> output = harness.make_output();
  std::vector<float> lse(static_cast<size_t>(tokens * shape.num_heads), 0.0f);
  cpu::attention_merge(stream, cpu::AttentionMergeArguments{
                                   .partials = partials.data(),
                                   .output = output.data(),
                                   .lse = lse.data(),
                                   .num_parts = num_members,
                                   .num_tokens = static_cast<int32_t>(tokens),
                                   .num_heads = shape.num_heads,
                                   .head_dim = shape.head_dim,
                               });
  if (merged_lse != nullptr) *merged_lse = lse;
  return output;
}

struct SplitCase {
  const char* name;
  int32_t gqa_ratio;
  int32_t block_size;
  DType dtype;
  int32_t sliding_window;
  float logit_soft_cap;
};

// gtest prints the case by its name (its bytes otherwise).
void PrintTo(const SplitCase& test, std::ostream* out) {
  *out << test.name;
}

class KvParallelAttentionTest : public ::testing::TestWithParam<SplitCase> {};

TEST_P(KvParallelAttentionTest, MergedPartialsEqualWholeAttentionForEverySplit) {
  const SplitCase& test = GetParam();
  AttentionShape shape;
  shape.num_heads = 8;
  shape.num_kv_heads = 8 / test.gqa_ratio;
  shape.block_size = test.block_size;
  shape.head_dim = 64;
  shape.dtype = test.dtype;
  shape.sliding_window = test.sliding_window;
  shape.logit_soft_cap = test.logit_soft_cap;
  constexpr int32_t kMaxContext = 150;
  const int32_t max_blocks = (kMaxContext + test.block_size - 1) / test.block_size;
  AttentionHarness harness(shape, /*max_sequences=*/10, max_blocks, /*num_tokens=*/48,
                           /*workspace_threads=*/2);
  ThreadPool pool(2);
  std::mt19937 rng(test.block_size * 100 + test.gqa_ratio * 7 + test.sliding_window);
  // Every SIMD path the CPU runs, one step each after the first (the partial's scores and
  // accumulation are VectorOps'; its range clipping and log-sum-exp are portable code).
  const std::vector<SimdPath> paths = supported_simd_paths();
  for (int step = 0; step < 2 + static_cast<int>(paths.size()); ++step) {
    ScopedSimdPath scoped(paths[static_cast<size_t>(step) % paths.size()]);
    harness.load_step(rng, random_batch(rng, kMaxContext, harness.num_tokens() - 3));
    const std::vector<double> expected = harness.reference();
    // From one block per member (ten members) to one member holding everything, and a split
    // with more members than the longest context needs (the last ones hold nothing).
    for (const int32_t blocks_per_member : {1, 2, 3, 5, 10}) {
      const int32_t range = blocks_per_member * test.block_size;
      for (const int32_t members : {(kMaxContext + range - 1) / range, 2, 1}) {
        if (members < 1) continue;
        const std::string what = "step " + std::to_string(step) + ", " + std::to_string(members) +
                                 " members of " + std::to_string(range) + " tokens";
        expect_near_all(run_kv_parallel(pool, harness, range, members), expected,
                        2 * kAttentionAbsoluteTolerance, 2 * kAttentionRelativeTolerance, what);
      }
    }
  }
}

std::string split_case_name(const ::testing::TestParamInfo<SplitCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KvParallelAttentionTest,
    ::testing::Values(SplitCase{"f32_block16", 1, 16, DType::kF32, 0, 0.0f},
                      SplitCase{"f16_gqa4_block8", 4, 8, DType::kF16, 0, 0.0f},
                      SplitCase{"f32_gqa2_block32", 2, 32, DType::kF32, 0, 0.0f},
                      SplitCase{"f32_window40_block8", 1, 8, DType::kF32, 40, 0.0f},
                      SplitCase{"f32_softcap_block16", 2, 16, DType::kF32, 0, 5.0f}),
    split_case_name);

// A member whose range lies after every query's position (or beyond every context) sees no key:
// zero output and -inf log-sum-exp for every row, padding rows included; the whole range's
// log-sum-exp equals the double reference's.
TEST(KvParallelAttentionTest, MemberPastEveryQueryIsNeutral) {
  AttentionShape shape;
  shape.num_heads = 4;
  shape.num_kv_heads = 2;
  shape.head_dim = 32;
  shape.block_size = 16;
  AttentionHarness harness(shape, /*max_sequences=*/4, /*max_blocks_per_sequence=*/8,
                           /*num_tokens=*/16, /*workspace_threads=*/2);
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::mt19937 rng(5);
  harness.load_step(rng, {{40, 1}, {20, 5}, {7, 7}});
  std::vector<float> output = harness.make_output();
  std::vector<float> lse(static_cast<size_t>(16 * shape.num_heads), 0.0f);
  cpu::paged_attention(stream, harness.member_arguments(output.data(), lse.data(), 48, 96));
  for (const float value : output) ASSERT_EQ(value, 0.0f);
  for (const float value : lse) ASSERT_EQ(value, kNegativeInfinity);

  // Positions [32, 64): only the first sequence's decode (position 39) sees keys there.
  cpu::paged_attention(stream, harness.member_arguments(output.data(), lse.data(), 32, 64));
  for (int32_t token = 0; token < 16; ++token) {
    for (int32_t head = 0; head < shape.num_heads; ++head) {
      const float value = lse[static_cast<size_t>(token * shape.num_heads + head)];
      if (token == 0) {
        EXPECT_TRUE(std::isfinite(value)) << "token 0 head " << head;
      } else {
        EXPECT_EQ(value, kNegativeInfinity) << "token " << token << " head " << head;
      }
    }
  }
}

// The merge alone: one part is returned as it is (weight exp(0) = 1); parts that saw nothing
// are neutral wherever they stand; a row no part saw is zeros with -inf, not NaN; and the
// two-part merge matches the closed form in double.
TEST(AttentionMergeTest, NeutralPartsAndFullyMaskedRows) {
  constexpr int32_t kTokens = 3, kHeads = 2, kHeadDim = 4;
  constexpr int64_t kOutputs = int64_t{kTokens} * kHeads * kHeadDim;
  constexpr int64_t kPart = cpu::attention_partial_elements(kTokens, kHeads, kHeadDim);
  std::mt19937 rng(9);
  std::vector<float> parts(3 * kPart);
  const std::vector<float> values = random_floats(rng, parts.size(), -1.0f, 1.0f);
  std::copy(values.begin(), values.end(), parts.begin());
  // Part 0 saw nothing anywhere; part 1 saw every row but token 2's; part 2 saw token 0 only.
  for (int64_t row = 0; row < kTokens * kHeads; ++row) {
    const int64_t token = row / kHeads;
    parts[static_cast<size_t>(kOutputs + row)] = kNegativeInfinity;
    parts[static_cast<size_t>(kPart + kOutputs + row)] = token < 2 ? 0.5f + row : kNegativeInfinity;
    parts[static_cast<size_t>(2 * kPart + kOutputs + row)] =
        token == 0 ? 2.0f - row : kNegativeInfinity;
  }
  for (int64_t i = 0; i < kOutputs; ++i) parts[static_cast<size_t>(i)] = 0.0f;
  for (int64_t i = 2 * kHeads * kHeadDim; i < kOutputs; ++i) {  // zeros where nothing was seen
    parts[static_cast<size_t>(kPart + i)] = 0.0f;
  }
  for (int64_t i = kHeads * kHeadDim; i < kOutputs; ++i)
    parts[static_cast<size_t>(2 * kPart + i)] = 0.0f;

  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::vector<float> output(kOutputs, std::numeric_limits<float>::quiet_NaN());
  std::vector<float> lse(kTokens * kHeads, 0.0f);
  cpu::attention_merge(stream, cpu::AttentionMergeArguments{.partials = parts.data(),
                                                            .output = output.data(),
                                                            .lse = lse.data(),
                                                            .num_parts = 3,
                                                            .num_tokens = kTokens,
                                                            .num_heads = kHeads,
                                                            .head_dim = kHeadDim});
  for (int64_t row = 0; row < kTokens * kHeads; ++row) {
    const int64_t token = row / kHeads;
    const float* merged = output.data() + row * kHeadDim;
    const float* one = parts.data() + kPart + row * kHeadDim;
    const float* two = parts.data() + 2 * kPart + row * kHeadDim;
    if (token == 2) {
      for (int32_t d = 0; d < kHeadDim; ++d) EXPECT_EQ(merged[d], 0.0f);
      EXPECT_EQ(lse[static_cast<size_t>(row)], kNegativeInfinity);
      continue;
    }
    if (token == 1) {  // part 1 alone
      for (int32_t d = 0; d < kHeadDim; ++d) EXPECT_EQ(merged[d], one[d]) << "row " << row;
      EXPECT_EQ(lse[static_cast<size_t>(row)], 0.5f + row);
      continue;
    }
    const double l1 = 0.5 + row, l2 = 2.0 - row;
    const double total = std::exp(l1) + std::exp(l2);
    for (int32_t d = 0; d < kHeadDim; ++d) {
      const double expected = (std::exp(l1) * one[d] + std::exp(l2) * two[d]) / total;
      EXPECT_NEAR(merged[d], expected, 1e-6) << "row " << row << " d " << d;
    }
    EXPECT_NEAR(lse[static_cast<size_t>(row)], std::log(total), 1e-6);
  }
}

}  // namespace
}  // namespace folio::kernels::testing
