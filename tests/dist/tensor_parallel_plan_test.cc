// The tensor-parallel plan (dist/tensor_parallel_plan.h): bytes per rank from the ranks' graphs
// against the whole model's, memory limits, legality, and the placement choice of the cost
// model.
#include <gtest/gtest.h>

#include "folio/dist/tensor_parallel_plan.h"
#include "folio/ir/step_graph.h"
#include "folio/model/llama_graph.h"

namespace folio::dist {
namespace {

model::LlamaShape test_shape() {
  model::LlamaShape shape;
  shape.num_layers = 4;
  shape.hidden_size = 128;
  shape.num_heads = 8;
  shape.num_kv_heads = 4;
  shape.ffn_size = 256;
  shape.vocab_size = 1024;
  shape.weight_dtype = DType::kQ8_0;
  return shape;
}

std::vector<PipelineWorker> workers(int count, std::optional<int64_t> memory = std::nullopt) {
  std::vector<PipelineWorker> list;
  for (int w = 0; w < count; ++w) list.push_back({fmt::format("w{}", w), memory});
  return list;
}

TEST(TensorParallelPlanTest, RanksSplitTheMatricesAndReplicateTheRest) {
  const model::LlamaShape shape = test_shape();
  Result<TensorParallelPlan> two = plan_tensor_parallel(shape, workers(2), {.kv_tokens = 100});
  ASSERT_TRUE(two.ok()) << two.status();
  Result<TensorParallelPlan> four = plan_tensor_parallel(shape, workers(4), {.kv_tokens = 100});
  ASSERT_TRUE(four.ok()) << four.status();
  ASSERT_EQ(two->ranks.size(), 2u);
  // The split matrices: per layer q, o (hidden x hidden), k, v (hidden x hidden / 2), gate, up,
  // down (hidden x ffn), q8_0 (34 bytes per 32 values).
  const int64_t per_layer = (2 * 128 * 128 + 2 * 64 * 128 + 3 * 256 * 128) / 32 * 34;
  int64_t split_total = 0;
  for (const TensorParallelRankPlan& rank : two->ranks) {
    split_total += rank.split_weight_bytes;
    EXPECT_EQ(rank.weight_bytes - rank.split_weight_bytes,
              two->whole_model_weight_bytes - shape.num_layers * per_layer);
    // f16 KV of the rank's 2 KV heads of 16 dimensions, keys and values, every layer.
    EXPECT_EQ(rank.kv_bytes_per_token, 2 * shape.num_layers * 2 * 16 * 2);
    EXPECT_EQ(rank.kv_bytes, 100 * rank.kv_bytes_per_token);
    EXPECT_LT(rank.decode_bytes_read, two->whole_model_weight_bytes);
  }
  EXPECT_EQ(split_total, shape.num_layers * per_layer);
  EXPECT_EQ(two->ranks[1].first_head, 4);
  EXPECT_EQ(two->ranks[1].end_kv_head, 4);
  EXPECT_EQ(four->ranks[3].first_ffn, 192);
  EXPECT_EQ(two->all_reduces_per_step, 2 * shape.num_layers);
  EXPECT_EQ(two->reduced_bytes_per_token, 8 * 128 * 4);
  EXPECT_EQ(two->wire_bytes_per_token, 8 * 128 * 4);           // 2 (n - 1) / n = 1
  EXPECT_EQ(four->wire_bytes_per_token, 8 * 128 * 4 * 3 / 2);  // 2 * 3 / 4
  EXPECT_EQ(four->messages_per_all_reduce, 6);
  const std::string text = two->to_string();
  EXPECT_NE(text.find("tensor parallel over 2 ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("w1"), std::string::npos) << text;
}

TEST(TensorParallelPlanTest, RefusesIllegalSplitsAndRanksOverTheirMemory) {
  const model::LlamaShape shape = test_shape();
  const Result<TensorParallelPlan> three = plan_tensor_parallel(shape, workers(3), {});
  EXPECT_EQ(three.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(three.status().message().find("rank counts that split this model: 2, 4"),
            std::string_view::npos)
      << three.status();
  EXPECT_EQ(plan_tensor_parallel(shape, workers(0), {}).status().code(),
            StatusCode::kInvalidArgument);
  const Result<TensorParallelPlan> small = plan_tensor_parallel(shape, workers(2, 1000), {});
  EXPECT_EQ(small.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(small.status().message().find("worker w0 declares 1000"), std::string_view::npos)
      << small.status();
}

TEST(TensorParallelPlanTest, AutoChoosesByTheCostModelAndSaysWhy) {
  const model::LlamaShape shape = test_shape();
  Result<PipelineModelCost> cost = llama_pipeline_cost(shape, DType::kF16, 64);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const Result<PipelinePlan> pipeline = plan_pipeline(*cost, workers(2), {});
  ASSERT_TRUE(pipeline.ok()) << pipeline.status();
  const Result<TensorParallelPlan> tensor = plan_tensor_parallel(shape, workers(2), {});
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  // Slow memory and a fast link: streaming half the matrices at once wins.
  Result<PlacementChoice> fast_link = choose_placement(pipeline, tensor,
                                                       {.memory_bytes_per_second = 1e6,
                                                        .link_latency_seconds = 1e-9,
                                                        .link_bytes_per_second = 1e12});
  ASSERT_TRUE(fast_link.ok()) << fast_link.status();
  EXPECT_EQ(fast_link->placement, Placement::kTensor) << fast_link->reason;
  EXPECT_LT(*fast_link->tensor_seconds_per_token, *fast_link->pipeline_seconds_per_token);
  // A slow link: 18 messages per token against 4 lose.
  Result<PlacementChoice> slow_link = choose_placement(pipeline, tensor,
                                                       {.memory_bytes_per_second = 1e10,
                                                        .link_latency_seconds = 1e-3,
                                                        .link_bytes_per_second = 1e9});
  ASSERT_TRUE(slow_link.ok()) << slow_link.status();
  EXPECT_EQ(slow_link->placement, Placement::kPipeline) << slow_link->reason;
  EXPECT_NE(slow_link->reason.find("with a pipeline"), std::string::npos) << slow_link->reason;
  // An illegal split leaves the pipeline, saying why.
  const Result<TensorParallelPlan> illegal = plan_tensor_parallel(shape, workers(3), {});
  Result<PlacementChoice> only_pipeline = choose_placement(pipeline, illegal, {});
  ASSERT_TRUE(only_pipeline.ok());
  EXPECT_EQ(only_pipeline->placement, Placement::kPipeline);
  EXPECT_NE(only_pipeline->reason.find("not possible"), std::string::npos);
  EXPECT_EQ(
      choose_placement(Result<PipelinePlan>(invalid_argument("no")), illegal, {}).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_placement("auto").value(), Placement::kAuto);
  EXPECT_EQ(parse_placement("dp").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace folio::dist
