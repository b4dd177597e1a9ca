// The attention split: structure (N attention ops -> N + 1 pieces covering every op once, in
// order), the crossing sets against a brute-force recount, and planning with pinned crossings.
#include "folio/ir/split.h"

#include <algorithm>
#include <set>

#include <gtest/gtest.h>

#include "folio/ir/buffer_plan.h"
#include "folio/ir/builder.h"
#include "folio/ir/verify.h"
#include "random_test_graph.h"
#include "testing/llama_test_graph.h"

namespace folio::ir {
namespace {

int count_attention(const Graph& graph) {
  return static_cast<int>(std::count_if(graph.ops().begin(), graph.ops().end(),
                                        [](const Op& op) { return is_attention(op.kind); }));
}

void expect_well_formed(const Graph& graph, std::span<const OpId> order,
                        const PiecewiseSplit& split) {
  const int attention = count_attention(graph);
  EXPECT_EQ(split.num_pieces, attention + 1);
  EXPECT_EQ(split.num_eager, attention);
  ASSERT_EQ(split.segments.size(), static_cast<size_t>(2 * attention + 1));
  std::vector<OpId> covered;
  int32_t position = 0;
  for (size_t index = 0; index < split.segments.size(); ++index) {
    const Segment& segment = split.segments[index];
    EXPECT_EQ(segment.kind, index % 2 == 0 ? SegmentKind::kPiece : SegmentKind::kEager);
    EXPECT_EQ(segment.begin, position);
    EXPECT_EQ(segment.end - segment.begin, static_cast<int32_t>(segment.ops.size()));
    for (OpId id : segment.ops) {
      EXPECT_EQ(is_attention(graph.op(id).kind), segment.kind == SegmentKind::kEager);
      EXPECT_EQ(split.segment_of_position[static_cast<size_t>(position)],
                static_cast<int32_t>(index));
      ++position;
    }
    if (segment.kind == SegmentKind::kEager) {
      EXPECT_EQ(segment.ops.size(), 1u);
    }
    covered.insert(covered.end(), segment.ops.begin(), segment.ops.end());
  }
  EXPECT_EQ(covered, std::vector<OpId>(order.begin(), order.end()));
}

// Recounts live_in / live_out / live_through of every segment from the definitions.
void expect_crossings_match_definitions(const Graph& graph, const PiecewiseSplit& split) {
  const auto segment_of = [&](OpId id) {
    for (size_t index = 0; index < split.segments.size(); ++index) {
      const auto& ops = split.segments[index].ops;
      if (std::find(ops.begin(), ops.end(), id) != ops.end()) return static_cast<int>(index);
    }
    return -1;
  };
  std::vector<std::set<TensorId>> in(split.segments.size()), out(split.segments.size()),
      through(split.segments.size());
  for (const TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency != Residency::kActivation) continue;
    int producer = -1;
    std::set<int> readers;
    for (const Op& op : graph.ops()) {
      if (std::find(op.outputs.begin(), op.outputs.end(), tensor.id) != op.outputs.end()) {
        producer = segment_of(op.id);
      }
      if (std::find(op.inputs.begin(), op.inputs.end(), tensor.id) != op.inputs.end()) {
        readers.insert(segment_of(op.id));
      }
    }
    for (int reader : readers) {
      if (reader == producer) continue;
      in[static_cast<size_t>(reader)].insert(tensor.id);
      out[static_cast<size_t>(producer)].insert(tensor.id);
    }
    if (readers.empty()) continue;
    for (int segment = producer + 1; segment < *readers.rbegin(); ++segment) {
      if (!readers.contains(segment)) through[static_cast<size_t>(segment)].insert(tensor.id);
    }
  }
  for (size_t index = 0; index < split.segments.size(); ++index) {
    const Segment& segment = split.segments[index];
    EXPECT_EQ(std::set<TensorId>(segment.live_in.begin(), segment.live_in.end()), in[index]);
    EXPECT_EQ(std::set<TensorId>(segment.live_out.begin(), segment.live_out.end()), out[index]);
    EXPECT_EQ(std::set<TensorId>(segment.live_through.begin(), segment.live_through.end()),
              through[index]);
  }
}

// Every activation crossing a boundary keeps its slot to itself over all the segments it
// touches: no activation live anywhere in those segments shares a byte with it.
void expect_crossings_never_reused(const Graph& graph, const PiecewiseSplit& split,
                                   std::span<const TensorLifetime> lifetimes,
                                   const BufferPlan& plan) {
  for (const TensorLifetime& crossing : lifetimes) {
    const int32_t from = split.segment_of_position[static_cast<size_t>(crossing.first)];
    const int32_t to = split.segment_of_position[static_cast<size_t>(crossing.last)];
    if (from == to) continue;
    const int32_t begin = split.segments[static_cast<size_t>(from)].begin;
    const int32_t end = split.segments[static_cast<size_t>(to)].end;
    const BufferAssignment* slot = plan.find(crossing.tensor);
    for (const TensorLifetime& other : lifetimes) {
      if (other.tensor == crossing.tensor || other.last < begin || other.first >= end) continue;
      const BufferAssignment* other_slot = plan.find(other.tensor);
      const bool disjoint = slot->offset + slot->size <= other_slot->offset ||
                            other_slot->offset + other_slot->size <= slot->offset;
      EXPECT_TRUE(disjoint) << "'" << graph.tensor(crossing.tensor).name << "' crosses segments "
                            << from << ".." << to << " but shares bytes with '"
                            << graph.tensor(other.tensor).name << "'";
    }
  }
}

TEST(SplitTest, LlamaGraphSplitsIntoPiecesAroundEachAttention) {
  folio::testing::LlamaTestGraphConfig config;
  config.model.num_layers = 3;
  const Graph graph = folio::testing::build_llama_test_graph(config).value();
  const std::vector<OpId> order = program_order(graph);
  const PiecewiseSplit split = split_at_attention(graph, order);
  expect_well_formed(graph, order, split);
  expect_crossings_match_definitions(graph, split);
  ASSERT_EQ(split.num_pieces, 4);
  // Attention reads the rotated query from the piece before it and hands its output to the next
  // piece, which also receives the residual stream.
  const auto id = [&](const char* name) { return graph.find_tensor(name).value(); };
  const Segment& attention = split.segments[1];
  EXPECT_EQ(attention.live_in, std::vector<TensorId>{id("blk.0.q_rope")});
  EXPECT_EQ(attention.live_out, std::vector<TensorId>{id("blk.0.attention")});
  EXPECT_EQ(attention.live_through, std::vector<TensorId>{id("embed")});
  EXPECT_EQ(split.segments[2].live_in, (std::vector<TensorId>{id("embed"), id("blk.0.attention")}));
  EXPECT_EQ(split.segments[2].live_out,
            (std::vector<TensorId>{id("blk.0.ffn_residual"), id("blk.1.q_rope")}));
  EXPECT_TRUE(split.segments.back().live_out.empty());
}

TEST(SplitTest, RandomGraphsGiveNPlusOnePiecesCoveringEveryOpOnce) {
  int max_attention = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    const Graph graph =
        testing::build_random_test_graph(seed, {.num_ops = 50, .attention_percent = 35}).value();
    const std::vector<OpId> order = program_order(graph);
    const PiecewiseSplit split = split_at_attention(graph, order);
    expect_well_formed(graph, order, split);
    expect_crossings_match_definitions(graph, split);
    max_attention = std::max(max_attention, count_attention(graph));
    if (HasFailure()) FAIL() << "seed " << seed;
  }
  EXPECT_GE(max_attention, 3);
}

TEST(SplitTest, ConsecutiveAndLeadingEagerOpsLeaveEmptyPieces) {
  const Graph graph = folio::testing::build_llama_test_graph().value();
  const std::vector<OpId> order = program_order(graph);
  // Run every op eagerly: each is its own eager segment with an empty piece on both sides.
  const PiecewiseSplit split = split_graph(graph, order, [](const Op&) { return true; });
  EXPECT_EQ(split.num_eager, graph.num_ops());
  EXPECT_EQ(split.num_pieces, graph.num_ops() + 1);
  for (size_t index = 0; index < split.segments.size(); index += 2) {
    EXPECT_TRUE(split.segments[index].empty());
  }
  const PiecewiseSplit none = split_graph(graph, order, [](const Op&) { return false; });
  ASSERT_EQ(none.segments.size(), 1u);
  EXPECT_EQ(none.segments[0].ops.size(), static_cast<size_t>(graph.num_ops()));
  EXPECT_TRUE(none.segments[0].live_in.empty());
}

// Without pinning, a crossing activation's slot is still its own from producer to last consumer,
// across every boundary in between.
TEST(SplitTest, PlainPlanNeverReusesACrossingTensorWhileItIsLive) {
  for (uint64_t seed = 200; seed < 230; ++seed) {
    const Graph graph =
        testing::build_random_test_graph(seed, {.num_ops = 60, .attention_percent = 30}).value();
    const std::vector<OpId> order = program_order(graph);
    const PiecewiseSplit split = split_at_attention(graph, order);
    const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(graph, order);
    const BufferPlan plan = plan_buffers(lifetimes).value();
    int num_crossing = 0;
    for (const TensorLifetime& crossing : lifetimes) {
      if (split.segment_of_position[static_cast<size_t>(crossing.first)] ==
          split.segment_of_position[static_cast<size_t>(crossing.last)]) {
        continue;
      }
      ++num_crossing;
      const BufferAssignment* slot = plan.find(crossing.tensor);
      for (const TensorLifetime& other : lifetimes) {
        if (other.tensor == crossing.tensor || !other.overlaps(crossing)) continue;
        const BufferAssignment* other_slot = plan.find(other.tensor);
        EXPECT_TRUE(slot->offset + slot->size <= other_slot->offset ||
                    other_slot->offset + other_slot->size <= slot->offset)
            << graph.tensor(crossing.tensor).name << " and " << graph.tensor(other.tensor).name;
      }
    }
    EXPECT_GT(num_crossing, 0) << "seed " << seed;
    if (HasFailure()) FAIL() << "seed " << seed;
  }
}

TEST(SplitTest, PinnedCrossingTensorsAreNeverReusedAcrossTheBoundary) {
  std::vector<Graph> graphs;
  graphs.push_back(folio::testing::build_llama_test_graph().value());
  for (uint64_t seed = 100; seed < 130; ++seed) {
    graphs.push_back(
        testing::build_random_test_graph(seed, {.num_ops = 60, .attention_percent = 30}).value());
  }
  for (const Graph& graph : graphs) {
    const std::vector<OpId> order = program_order(graph);
    const PiecewiseSplit split = split_at_attention(graph, order);
    const std::vector<TensorLifetime> lifetimes = analyze_lifetimes(graph, order);
    const std::vector<TensorLifetime> pinned = pin_across_segments(lifetimes, split);
    const BufferPlan plan = plan_buffers(pinned).value();
    expect_crossings_never_reused(graph, split, lifetimes, plan);
    // Pinning only widens lifetimes.
    for (size_t index = 0; index < lifetimes.size(); ++index) {
      EXPECT_LE(pinned[index].first, lifetimes[index].first);
      EXPECT_GE(pinned[index].last, lifetimes[index].last);
    }
    if (HasFailure()) FAIL() << "graph of " << graph.num_ops() << " ops";
  }
}

}  // namespace
}  // namespace folio::ir
