// Paged attention against an independent double-precision reference (dense K/V per sequence,
// softmax(q K^T) V), over random batches that mix decodes, chunked prefills and whole prefills,
// with random non-contiguous block tables, GQA, several block sizes, f32 and f16 caches and
// padding tokens; on every SIMD path. Then the properties the engine relies on: bit-identical
// results for any thread count, and a captured launch that follows new step metadata on replay.
#include "folio/kernels/cpu/paged_attention.h"

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "attention_test_harness.h"
#include "folio/base/thread_pool.h"
#include "folio/device/host_stream.h"
#include "kernel_test_util.h"

namespace folio::kernels::testing {
namespace {

// Tolerances against the double reference. Values are in [-1, 1]; the output is a convex
// combination of V rows, so an absolute bound fits. f32 rounding in the dot products, the
// polynomial exp and the accumulation stay below 4e-7 (measured); the f16 cache's rounding is
// already in the reference (it reads the stored values), so both cache types share the bound.
constexpr double kAbsoluteTolerance = 2e-6;
constexpr double kRelativeTolerance = 2e-6;

// A random step: decodes, chunks of longer prefills, and whole prefills, in random order.
std::vector<SequenceSpec> random_batch(std::mt19937& rng, int32_t max_context, int32_t max_tokens) {
  std::uniform_int_distribution<int32_t> context(1, max_context);
  std::vector<SequenceSpec> batch;
  int32_t tokens = 0;
  const auto add = [&](SequenceSpec spec) {
    if (tokens + spec.query_length > max_tokens) return;
    batch.push_back(spec);
    tokens += spec.query_length;
  };
  for (int i = 0; i < 4; ++i) add({context(rng), 1});  // decodes
  for (int i = 0; i < 2; ++i) {                        // chunked prefill: context > query
    const int32_t length = std::max(2, context(rng));
    add({length, std::uniform_int_distribution<int32_t>(1, std::min(length - 1, 12))(rng)});
  }
  const int32_t prompt = std::uniform_int_distribution<int32_t>(1, 20)(rng);
  add({prompt, prompt});  // a whole prefill
  std::shuffle(batch.begin(), batch.end(), rng);
  return batch;
}

std::vector<float> run_eager(ThreadPool& pool, AttentionHarness& harness) {
  device::HostStream stream(pool);
  std::vector<float> output = harness.make_output();
  cpu::paged_attention(stream, harness.arguments(output.data()));
  return output;
}

void expect_matches_reference(const std::vector<float>& output, AttentionHarness& harness,
                              const std::string& what) {
  expect_near_all(output, harness.reference(), kAbsoluteTolerance, kRelativeTolerance, what);
}

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
    expect_matches_reference(run_eager(pool, harness), harness, "step " + std::to_string(step));
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
  expect_matches_reference(run_eager(pool, harness), harness, "sliding window 7, scale 0.3");
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
  expect_matches_reference(run_eager(pool, harness), harness, "contexts 1000 and 777");
}

TEST(PagedAttentionOptionsTest, StepWithNoSequencesWritesZeros) {
  AttentionHarness harness(AttentionShape{}, 4, 4, 6, 1);
  ThreadPool pool(1);
  std::mt19937 rng(3);
  harness.load_step(rng, {});
  const std::vector<float> output = run_eager(pool, harness);
  for (float value : output) ASSERT_EQ(value, 0.0f);
}

class PagedAttentionDeterminismTest : public ::testing::TestWithParam<SimdPath> {};

TEST_P(PagedAttentionDeterminismTest, BitIdenticalForAnyThreadCount) {
  ScopedSimdPath scoped(GetParam());
  AttentionShape shape;
  shape.num_kv_heads = 2;
  shape.dtype = DType::kF16;
  AttentionHarness harness(shape, 12, 12, 64, /*workspace_threads=*/4);
  std::mt19937 rng(99);
  harness.load_step(rng, random_batch(rng, 180, 60));
  ThreadPool one(1);
  const std::vector<float> expected = run_eager(one, harness);
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    const std::vector<float> output = run_eager(pool, harness);
    EXPECT_EQ(std::memcmp(output.data(), expected.data(), output.size() * sizeof(float)), 0)
        << threads << " threads";
  }
}

// The graph executor captures the launch once and replays it after rewriting the step buffers.
// A replay must therefore compute with the values present at replay time: the same bits as an
// eager launch over the new values, and the reference's answer.
TEST_P(PagedAttentionDeterminismTest, CapturedLaunchFollowsNewStepMetadataOnReplay) {
  ScopedSimdPath scoped(GetParam());
  AttentionShape shape;
  shape.num_kv_heads = 4;
  shape.block_size = 8;
  AttentionHarness harness(shape, /*max_sequences=*/8, /*max_blocks_per_sequence=*/20,
                           /*num_tokens=*/32, /*workspace_threads=*/2);
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::vector<float> replay_output = harness.make_output();
  std::mt19937 rng(2024);
  harness.load_step(rng, {{30, 1}, {12, 12}});
  stream.begin_capture();
  cpu::paged_attention(stream, harness.arguments(replay_output.data()));
  const device::HostGraph graph = stream.end_capture();
  ASSERT_EQ(graph.num_kernels(), 1u);

  const std::vector<std::vector<SequenceSpec>> steps = {
      {{31, 1}, {13, 1}, {150, 1}},         // decode only, more sequences
      {{64, 20}, {1, 1}, {90, 3}, {7, 7}},  // mixed, different lengths and tables
      {},                                   // nothing but padding
      {{160, 1}, {2, 1}, {3, 1}, {4, 1}, {5, 1}, {6, 1}, {7, 1}, {8, 8}},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    harness.load_step(rng, steps[i]);
    std::fill(replay_output.begin(), replay_output.end(), std::nanf(""));
    stream.replay(graph);
    const std::vector<float> eager = run_eager(pool, harness);
    EXPECT_EQ(std::memcmp(replay_output.data(), eager.data(), eager.size() * sizeof(float)), 0)
        << "step " << i;
    expect_matches_reference(replay_output, harness, "replayed step " + std::to_string(i));
  }
  EXPECT_EQ(stream.num_replayed_kernels(), steps.size());
}

INSTANTIATE_TEST_SUITE_P(AllPaths, PagedAttentionDeterminismTest,
                         ::testing::ValuesIn(supported_simd_paths()), simd_path_test_name);

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
  arguments.context_lengths = too_long;
  EXPECT_DEATH(cpu::paged_attention_body(arguments, 0, 1, 0), "context length 65");
}

}  // namespace
}  // namespace folio::kernels::testing
