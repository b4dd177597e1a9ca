// Lifetime analysis and the buffer planner: the planner's invariants checked pair by pair on
// random lifetimes and random graphs (fixed seeds), reuse on chains, alignment, bad requests.
#include "folio/ir/buffer_plan.h"

#include <algorithm>
#include <random>

#include <gtest/gtest.h>

#include "folio/ir/builder.h"
#include "folio/ir/lifetime.h"
#include "folio/ir/verify.h"
#include "random_test_graph.h"
#include "testing/llama_test_graph.h"

namespace folio::ir {
namespace {

// Checks every invariant of `plan` against the lifetimes it was planned from, independently of
// the planner: aligned offsets and sizes, every pair of overlapping lifetimes in disjoint byte
// ranges, peak = highest end <= sum of sizes.
void expect_valid_plan(std::span<const TensorLifetime> lifetimes, const BufferPlan& plan,
                       int64_t alignment) {
  ASSERT_EQ(plan.assignments.size(), lifetimes.size());
  int64_t highest_end = 0;
  int64_t sum = 0;
  for (size_t i = 0; i < lifetimes.size(); ++i) {
    const BufferAssignment* slot = plan.find(lifetimes[i].tensor);
    ASSERT_NE(slot, nullptr);
    EXPECT_EQ(slot->offset % alignment, 0);
    EXPECT_EQ(slot->size, (lifetimes[i].bytes + alignment - 1) / alignment * alignment);
    EXPECT_GE(slot->offset, 0);
    highest_end = std::max(highest_end, slot->offset + slot->size);
    sum += slot->size;
    for (size_t j = i + 1; j < lifetimes.size(); ++j) {
      if (!lifetimes[i].overlaps(lifetimes[j])) continue;
      const BufferAssignment* other = plan.find(lifetimes[j].tensor);
      const bool disjoint =
          slot->offset + slot->size <= other->offset || other->offset + other->size <= slot->offset;
      EXPECT_TRUE(disjoint) << "tensors " << lifetimes[i].tensor.value() << " and "
                            << lifetimes[j].tensor.value() << " are live together and overlap";
    }
  }
  EXPECT_EQ(plan.peak_bytes, highest_end);
  EXPECT_EQ(plan.total_bytes_without_reuse, sum);
  EXPECT_LE(plan.peak_bytes, plan.total_bytes_without_reuse);
}

TEST(LifetimeTest, IntervalsRunFromProducerToLastConsumer) {
  GraphBuilder builder(Phase::kPrefill);
  const TensorId ids = builder.input("ids", DType::kI32, {4}).value();
  const TensorId table = builder.weight("table", DType::kF32, {9, 8}).value();
  const TensorId a = builder.embedding(ids, table, "a").value();  // op 0
  const TensorId b = builder.silu(a, "b").value();                // op 1
  const TensorId c = builder.silu(b, "c").value();                // op 2
  const TensorId d = builder.add(a, c, "d").value();              // op 3
  const TensorId unused = builder.silu(d, "unused").value();      // op 4
  const TensorId e = builder.silu(d, "e").value();                // op 5
  ASSERT_TRUE(builder.mark_output(e).ok());
  const Graph graph = builder.finish().value();
  const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(graph, program_order(graph));
  // Only activations, in tensor id order; the output 'e' lives outside the arena.
  ASSERT_EQ(lifetimes.size(), 5u);
  const std::vector<std::tuple<TensorId, int32_t, int32_t>> expected = {
      {a, 0, 3}, {b, 1, 2}, {c, 2, 3}, {d, 3, 5}, {unused, 4, 4}};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(lifetimes[i].tensor, std::get<0>(expected[i]));
    EXPECT_EQ(lifetimes[i].first, std::get<1>(expected[i]));
    EXPECT_EQ(lifetimes[i].last, std::get<2>(expected[i]));
    EXPECT_EQ(lifetimes[i].bytes, 4 * 8 * 4);
  }
}

TEST(BufferPlanTest, RandomLifetimesNeverShareBytesWhileLive) {
  std::mt19937_64 random(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int count = 1 + static_cast<int>(random() % 60);
    const int64_t alignment = int64_t{1} << (random() % 9);
    std::vector<TensorLifetime> lifetimes;
    for (int index = 0; index < count; ++index) {
      const auto first = static_cast<int32_t>(random() % 50);
      const auto last = first + static_cast<int32_t>(random() % 12);
      const auto bytes = static_cast<int64_t>(random() % 5000);
      lifetimes.push_back({TensorId(index * 3), first, last, bytes});
    }
    Result<BufferPlan> plan = plan_buffers(lifetimes, {alignment});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    expect_valid_plan(lifetimes, *plan, alignment);
    if (HasFailure()) FAIL() << "trial " << trial;
  }
}

TEST(BufferPlanTest, RandomGraphsNeverShareBytesWhileLive) {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    Result<Graph> graph = testing::build_random_test_graph(seed, {.num_ops = 60});
    ASSERT_TRUE(graph.ok()) << graph.status().to_string();
    const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(*graph, program_order(*graph));
    Result<BufferPlan> plan = plan_buffers(lifetimes, {64});
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    expect_valid_plan(lifetimes, *plan, 64);
    EXPECT_LT(plan->peak_bytes, plan->total_bytes_without_reuse) << "seed " << seed;
    if (HasFailure()) FAIL() << "seed " << seed;
  }
}

TEST(BufferPlanTest, ChainReusesTwoSlots) {
  GraphBuilder builder(Phase::kDecode);
  const TensorId ids = builder.input("ids", DType::kI32, {4}).value();
  const TensorId table = builder.weight("table", DType::kF32, {9, 16}).value();
  TensorId x = builder.embedding(ids, table, "x0").value();
  constexpr int kLength = 12;
  for (int step = 1; step < kLength; ++step) x = builder.silu(x, fmt::format("x{}", step)).value();
  const Graph graph = builder.finish().value();
  const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(graph, program_order(graph));
  const BufferPlan plan = plan_buffers(lifetimes, {64}).value();
  expect_valid_plan(lifetimes, plan, 64);
  // Each op needs its input and output; 4 * 16 * 4 = 256 bytes each.
  EXPECT_EQ(plan.peak_bytes, 2 * 256);
  EXPECT_EQ(plan.total_bytes_without_reuse, kLength * 256);
}

TEST(BufferPlanTest, RoundsSizesAndOffsetsToTheAlignment) {
  const std::vector<TensorLifetime> lifetimes = {
      {TensorId(0), 0, 2, 100}, {TensorId(1), 1, 3, 1}, {TensorId(2), 2, 2, 300}};
  const BufferPlan plan = plan_buffers(lifetimes, {256}).value();
  expect_valid_plan(lifetimes, plan, 256);
  EXPECT_EQ(plan.find(TensorId(0))->size, 256);
  EXPECT_EQ(plan.find(TensorId(2))->size, 512);
  EXPECT_EQ(plan.peak_bytes, 1024);  // all three are live at position 2
  EXPECT_EQ(plan.find(TensorId(5)), nullptr);
}

TEST(BufferPlanTest, BestFitFillsTheSmallestSufficientGap) {
  // A (512) and B (128) live early, C (256) spans both; D (128) is placed after A and B die,
  // next to C, in the lowest free range that fits.
  const std::vector<TensorLifetime> lifetimes = {{TensorId(0), 0, 1, 512},
                                                 {TensorId(1), 0, 1, 128},
                                                 {TensorId(2), 0, 5, 256},
                                                 {TensorId(3), 2, 5, 128}};
  const BufferPlan plan = plan_buffers(lifetimes, {64}).value();
  expect_valid_plan(lifetimes, plan, 64);
  EXPECT_EQ(plan.find(TensorId(0))->offset, 0);
  EXPECT_EQ(plan.find(TensorId(2))->offset, 512);
  EXPECT_EQ(plan.find(TensorId(3))->offset, 0);
  EXPECT_EQ(plan.peak_bytes, 512 + 256 + 128);
}

TEST(BufferPlanTest, RejectsBadRequests) {
  const std::vector<TensorLifetime> good = {{TensorId(0), 0, 1, 8}};
  EXPECT_EQ(plan_buffers(good, {0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_buffers(good, {48}).status().code(), StatusCode::kInvalidArgument);
  const std::vector<TensorLifetime> inverted = {{TensorId(0), 3, 1, 8}};
  EXPECT_EQ(plan_buffers(inverted).status().code(), StatusCode::kInvalidArgument);
  const std::vector<TensorLifetime> duplicate = {{TensorId(4), 0, 1, 8}, {TensorId(4), 2, 3, 8}};
  EXPECT_EQ(plan_buffers(duplicate).status().code(), StatusCode::kInvalidArgument);
  const std::vector<TensorLifetime> negative = {{TensorId(0), 0, 1, -8}};
  EXPECT_EQ(plan_buffers(negative).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(plan_buffers({}).value().peak_bytes, 0);
}

// Graph memory grows with the step's shape, not with the model's depth: activations of one layer
// are dead before the next layer's are born, except the residual stream.
TEST(BufferPlanTest, LlamaArenaDoesNotGrowWithDepth) {
  int64_t peak_of_two_layers = 0;
  for (int64_t layers : {2, 4, 8}) {
    folio::testing::LlamaTestGraphConfig config;
    config.model.num_layers = layers;
    const Graph graph = folio::testing::build_llama_test_graph(config).value();
    const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(graph, program_order(graph));
    const BufferPlan plan = plan_buffers(lifetimes).value();
    expect_valid_plan(lifetimes, plan, 64);
    if (layers == 2) peak_of_two_layers = plan.peak_bytes;
    EXPECT_EQ(plan.peak_bytes, peak_of_two_layers) << layers << " layers";
    EXPECT_LT(plan.peak_bytes * 4, plan.total_bytes_without_reuse) << layers << " layers";
  }
}

// The most bytes live at any one position is a lower bound for every plan; on the Llama graph
// (small, and with Llama-3-8B shapes at a 512-token bucket) best fit reaches it exactly.
int64_t live_bytes_lower_bound(std::span<const TensorLifetime> lifetimes, int64_t alignment) {
  int32_t end = 0;
  for (const TensorLifetime& lifetime : lifetimes) end = std::max(end, lifetime.last + 1);
  int64_t bound = 0;
  for (int32_t position = 0; position < end; ++position) {
    int64_t live = 0;
    for (const TensorLifetime& lifetime : lifetimes) {
      if (lifetime.first <= position && position <= lifetime.last) {
        live += (lifetime.bytes + alignment - 1) / alignment * alignment;
      }
    }
    bound = std::max(bound, live);
  }
  return bound;
}

TEST(BufferPlanTest, LlamaArenaMeetsTheLiveBytesLowerBound) {
  folio::testing::LlamaTestGraphConfig llama3_8b;
  llama3_8b.step.num_tokens = 512;
  llama3_8b.step.num_sequence_slots = llama3_8b.step.num_logit_rows = 8;
  llama3_8b.model.num_layers = 32;
  llama3_8b.model.hidden_size = 4096;
  llama3_8b.model.num_heads = 32;  // head_dim 128
  llama3_8b.model.num_kv_heads = 8;
  llama3_8b.model.ffn_size = 14336;
  llama3_8b.model.vocab_size = 128256;
  llama3_8b.max_blocks_per_sequence = 512;
  for (const folio::testing::LlamaTestGraphConfig& config :
       {folio::testing::LlamaTestGraphConfig{}, llama3_8b}) {
    const Graph graph = folio::testing::build_llama_test_graph(config).value();
    const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(graph, program_order(graph));
    const BufferPlan plan = plan_buffers(lifetimes).value();
    expect_valid_plan(lifetimes, plan, 64);
    EXPECT_EQ(plan.peak_bytes, live_bytes_lower_bound(lifetimes, 64)) << config.model.hidden_size;
  }
  // By hand for the 8B shape: during SwiGLU the residual stream (512 x 4096 f32) and gate, up and
  // their product (512 x 14336 f32 each) are live.
  const Graph graph = folio::testing::build_llama_test_graph(llama3_8b).value();
  const BufferPlan plan = plan_buffers(analyze_lifetimes(graph, program_order(graph))).value();
  EXPECT_EQ(plan.peak_bytes, 512 * 4096 * 4 + 3 * 512 * 14336 * 4);
}

}  // namespace
}  // namespace folio::ir
