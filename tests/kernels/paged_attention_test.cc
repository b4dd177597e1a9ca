// Paged attention against an independent double-precision reference (dense K/V per sequence,
// softmax(q K^T) V), over random batches that mix decodes, chunked prefills and whole prefills,
// with random non-contiguous block tables, GQA, several block sizes, f32 and f16 caches and
// padding tokens; on every SIMD path. Thread-count determinism and capture/replay are in
// paged_attention_concurrency_test.cc.
#include "folio/kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "attention_test_util.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

using Config = std::tuple<SimdPath, int /*gqa ratio*/, int /*block size*/, DType>;

class PagedAttentionTest : public ::testing::TestWithParam<Config> {};

TEST_P(PagedAttentionTest, MatchesReferenceOnMixedBatches) {
  const auto [path, ratio, block_size, dtype] = GetParam();
  ScopedSimdPath scoped(path);
  AttentionShape shape;
  shape.num_heads = 8;
  shape.num_kv_heads = 8 / ratio;
  shape.block_size = block_size;
  shape.dtype = dtype;
  // Head sizes with and without a partial vector on each path.
  shape.head_dim = block_size == 8 ? 40 : block_size == 16 ? 64 : 128;
  shape.extra_query_columns = ratio == 2 ? 2 * shape.num_kv_heads * shape.head_dim : 0;
  constexpr int32_t kMaxContext = 150;
  const int32_t max_blocks = (kMaxContext + block_size - 1) / block_size;
  AttentionHarness harness(shape, /*max_sequences=*/10, max_blocks, /*num_tokens=*/48,
                           /*workspace_threads=*/2);
  ThreadPool pool(2);
  std::mt19937 rng(ratio * 1000 + block_size * 10 + static_cast<int>(dtype));
  for (int step = 0; step < 2; ++step) {
    harness.load_step(rng, random_batch(rng, kMaxContext, harness.num_tokens() - 3));
    expect_matches_reference(run_attention_eager(pool, harness), harness,
                             "step " + std::to_string(step));
  }
}

std::string config_name(const ::testing::TestParamInfo<Config>& info) {
  const auto [path, ratio, block_size, dtype] = info.param;
  return std::string(cpu::simd_path_name(path)) + "_gqa" + std::to_string(ratio) + "_block" +
         std::to_string(block_size) + "_" + std::string(dtype_name(dtype));
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionTest,
                         ::testing::Combine(::testing::ValuesIn(supported_simd_paths()),
                                            ::testing::Values(1, 2, 4),
                                            ::testing::Values(8, 16, 32),
                                            ::testing::Values(DType::kF32, DType::kF16)),
                         config_name);

TEST(PagedAttentionOptionsTest, SlidingWindowAndExplicitScaleMatchReference) {
  AttentionShape shape;
  shape.num_kv_heads = 2;
  shape.sliding_window = 7;
  shape.scale = 0.3f;
  AttentionHarness harness(shape, 8, 10, 40, 2);
  ThreadPool pool(2);
  std::mt19937 rng(7);
  harness.load_step(rng, {{40, 1}, {33, 9}, {5, 5}, {100, 1}});
  expect_matches_reference(run_attention_eager(pool, harness), harness,
                           "sliding window 7, scale 0.3");
}

// Gemma 2's attention: a soft cap of 0.5 bends most scaled scores (|s| up to a few units), so
// an uncapped kernel misses the reference by far more than the tolerance.
TEST(PagedAttentionOptionsTest, LogitSoftCapWithSlidingWindowMatchesReference) {
  AttentionShape shape;
  shape.num_kv_heads = 2;
  shape.sliding_window = 7;
  shape.scale = 0.5f;
  shape.logit_soft_cap = 0.5f;
  AttentionHarness harness(shape, 8, 10, 40, 2);
  ThreadPool pool(2);
  std::mt19937 rng(9);
  harness.load_step(rng, {{40, 1}, {33, 9}, {5, 5}, {100, 1}});
  expect_matches_reference(run_attention_eager(pool, harness), harness,
                           "soft cap 0.5, sliding window 7");
  AttentionShape uncapped = shape;
  uncapped.logit_soft_cap = 0.0f;
  AttentionHarness plain(uncapped, 8, 10, 40, 2);
  std::mt19937 same_rng(9);
  plain.load_step(same_rng, {{40, 1}, {33, 9}, {5, 5}, {100, 1}});
  const std::vector<float> capped = run_attention_eager(pool, harness);
  const std::vector<float> uncapped_output = run_attention_eager(pool, plain);
  double largest_difference = 0;
  for (size_t i = 0; i < capped.size(); ++i) {
    largest_difference =
        std::max(largest_difference, std::abs(double{capped[i]} - uncapped_output[i]));
  }
  EXPECT_GT(largest_difference, 1e-2) << "the cap must change the output";
}

TEST(PagedAttentionOptionsTest, LongContextSpanningManyBlocks) {
  AttentionShape shape;
  shape.num_heads = 4;
  shape.num_kv_heads = 1;
  shape.head_dim = 128;
  shape.block_size = 16;
  AttentionHarness harness(shape, 2, 64, 4, 2);
  ThreadPool pool(2);
  std::mt19937 rng(11);
  harness.load_step(rng, {{1000, 1}, {777, 2}});
  expect_matches_reference(run_attention_eager(pool, harness), harness, "contexts 1000 and 777");
}

TEST(PagedAttentionOptionsTest, StepWithNoSequencesWritesZeros) {
  AttentionHarness harness(AttentionShape{}, 4, 4, 6, 1);
  ThreadPool pool(1);
  std::mt19937 rng(3);
  harness.load_step(rng, {});
  const std::vector<float> output = run_attention_eager(pool, harness);
  for (float value : output) ASSERT_EQ(value, 0.0f);
}

TEST(PagedAttentionDeathTest, AbortsWhenStepOverflowsItsBuffers) {
  AttentionHarness harness(AttentionShape{}, 2, 4, 8, 1);
  std::mt19937 rng(5);
  harness.load_step(rng, {{3, 3}});
  std::vector<float> output = harness.make_output();
  cpu::PagedAttentionArguments arguments = harness.arguments(output.data());
  const int32_t too_many = 3;
  arguments.num_sequences = &too_many;
  EXPECT_DEATH(cpu::paged_attention_body(arguments, 0, 1, 0), "3 sequences, room for 2");
  const int32_t one = 1;
  const int32_t too_long[2] = {65, 0};  // 4 blocks of 16 hold 64 tokens
  arguments.num_sequences = &one;
  arguments.seq_lens = too_long;
  EXPECT_DEATH(cpu::paged_attention_body(arguments, 0, 1, 0), "context length 65");
}

}  // namespace
}  // namespace folio::kernels::testing
