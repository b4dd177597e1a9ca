// The properties the graph executor relies on, under several threads (this binary also runs
// under ThreadSanitizer): paged attention gives bit-identical results for any thread count, and
// a captured launch follows the step metadata present at replay time.
#include <cstring>
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
  const std::vector<float> expected = run_attention_eager(one, harness);
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    const std::vector<float> output = run_attention_eager(pool, harness);
    EXPECT_EQ(std::memcmp(output.data(), expected.data(), output.size() * sizeof(float)), 0)
        << threads << " threads";
  }
}

// Prefill steps of several 16-token tiles per sequence, split between threads at any item:
// slices begin and end inside a kv group and inside a sequence's run of tiles.
TEST_P(PagedAttentionDeterminismTest, LongPromptsBitIdenticalForAnyThreadCount) {
  ScopedSimdPath scoped(GetParam());
  AttentionShape shape;
  shape.num_kv_heads = 4;
  shape.num_heads = 12;
  shape.head_dim = 64;
  AttentionHarness harness(shape, 3, 10, 150, /*workspace_threads=*/4);
  std::mt19937 rng(31);
  harness.load_step(rng, {{97, 97}, {150, 41}, {3, 1}});
  ThreadPool one(1);
  const std::vector<float> expected = run_attention_eager(one, harness);
  expect_matches_reference(expected, harness, "one thread");
  for (int threads : {2, 3, 4}) {
    ThreadPool pool(threads);
    const std::vector<float> output = run_attention_eager(pool, harness);
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
    const std::vector<float> eager = run_attention_eager(pool, harness);
    EXPECT_EQ(std::memcmp(replay_output.data(), eager.data(), eager.size() * sizeof(float)), 0)
        << "step " << i;
    expect_matches_reference(replay_output, harness, "replayed step " + std::to_string(i));
  }
  EXPECT_EQ(stream.num_replayed_kernels(), steps.size());
}

INSTANTIATE_TEST_SUITE_P(AllPaths, PagedAttentionDeterminismTest,
                         ::testing::ValuesIn(supported_simd_paths()), simd_path_test_name);

// A recorded launch keeps the SIMD path it was made with, so switching the active path (tests
// and benchmarks do) never changes what a replay computes.
TEST(PagedAttentionReplayTest, CapturedLaunchKeepsItsSimdPath) {
  AttentionHarness harness(AttentionShape{}, 4, 8, 16, 2);
  std::mt19937 rng(6);
  harness.load_step(rng, {{100, 1}, {40, 9}});
  ThreadPool pool(2);
  device::HostStream stream(pool);
  std::vector<float> replay_output = harness.make_output();
  std::vector<float> portable_output;
  {
    ScopedSimdPath portable(SimdPath::kPortable);
    stream.begin_capture();
    cpu::paged_attention(stream, harness.arguments(replay_output.data()));
    portable_output = run_attention_eager(pool, harness);
  }
  const device::HostGraph graph = stream.end_capture();
  ASSERT_EQ(graph.num_kernels(), 1u);  // the eager launch above ran on its own stream
  ScopedSimdPath best(cpu::best_simd_path());
  stream.replay(graph);
  EXPECT_EQ(std::memcmp(replay_output.data(), portable_output.data(),
                        portable_output.size() * sizeof(float)),
            0);
}

}  // namespace
}  // namespace folio::kernels::testing
