// Pipeline placement (dist/pipeline_plan.h): costs against the IR's own totals, the balanced
// split against a brute force over every split, memory limits, and the errors.
#include "folio/dist/pipeline_plan.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "folio/ir/cost.h"
#include "folio/model/llama_graph.h"

namespace folio::dist {
namespace {

model::LlamaShape eight_layers() {
  model::LlamaShape shape;
  shape.num_layers = 8;
  return shape;
}

// The model's decode and prefill graphs, as llama_pipeline_cost builds them.
ir::Graph whole_graph(const model::LlamaShape& shape, ir::StepPhase phase, int32_t tokens) {
  const int32_t blocks = (tokens + 15) / 16;
  const ir::KvCacheShape kv_cache{model::llama_kv_cache_geometry(shape, 16, DType::kF32),
                                  blocks + 1, blocks};
  Result<ir::Graph> graph =
      model::build_llama_step_graph(shape, ir::StepShape{tokens, 1, 1, phase}, kv_cache);
  EXPECT_TRUE(graph.ok()) << graph.status();
  return std::move(graph).value();
}

PipelineLayerCost sum(const PipelineModelCost& cost) {
  PipelineLayerCost total = cost.entry;
  total += cost.exit;
  for (const PipelineLayerCost& layer : cost.layers) total += layer;
  return total;
}

TEST(PipelinePlanTest, CostsAddUpToTheGraphsTotals) {
  const model::LlamaShape shape = eight_layers();
  Result<PipelineModelCost> cost = llama_pipeline_cost(shape, DType::kF16, 64);
  ASSERT_TRUE(cost.ok()) << cost.status();
  ASSERT_EQ(cost->layers.size(), 8u);
  const PipelineLayerCost total = sum(*cost);
  const ir::Graph decode = whole_graph(shape, ir::StepPhase::kDecode, 1);
  EXPECT_EQ(total.decode_bytes_read, ir::weight_bytes_read(decode));
  int64_t weights = 0;
  for (const ir::TensorInfo& tensor : decode.tensors()) {
    if (tensor.residency == ir::Residency::kWeight) weights += tensor.bytes();
  }
  EXPECT_EQ(total.weight_bytes, weights);  // untied: every weight in exactly one part
  EXPECT_EQ(total.prefill_flops,
            ir::total_cost(whole_graph(shape, ir::StepPhase::kPrefill, 64)).total.flops);
  // f16 KV: K and V of 2 heads of 16 per layer.
  EXPECT_EQ(cost->layers[3].kv_bytes_per_token, 2 * 2 * 16 * 2);
  EXPECT_EQ(cost->hidden_bytes_per_token, 64 * 4);
  // Identical layers cost the same; the exit holds the LM head, the entry one embedding row.
  EXPECT_EQ(cost->layers[0].decode_bytes_read, cost->layers[7].decode_bytes_read);
  EXPECT_EQ(cost->exit.weight_bytes, 512 * 64 * 4 + 64 * 4);  // output.weight + output_norm
  EXPECT_EQ(cost->entry.weight_bytes, 512 * 64 * 4);
  EXPECT_EQ(cost->entry.decode_bytes_read, 64 * 4);
}

// The smallest largest stage cost over every split of `cost` into `workers` non-empty ranges,
// by enumeration (the reference the dynamic program is checked against).
int64_t brute_force_best(const PipelineModelCost& cost, int64_t workers, PipelineBalance balance,
                         const std::vector<std::optional<int64_t>>& memory, int64_t kv_tokens) {
  const auto layers = static_cast<int64_t>(cost.layers.size());
  int64_t best = std::numeric_limits<int64_t>::max();
  std::vector<int64_t> bounds = {0};
  std::function<void(int64_t)> extend = [&](int64_t next) {
    if (static_cast<int64_t>(bounds.size()) == workers) {
      bounds.push_back(layers);
      int64_t largest = 0;
      bool fits = true;
      for (size_t s = 0; s + 1 < bounds.size(); ++s) {
        PipelineLayerCost stage;
        for (int64_t l = bounds[s]; l < bounds[s + 1]; ++l) {
          stage += cost.layers[static_cast<size_t>(l)];
        }
        if (s == 0) stage += cost.entry;
        if (s + 2 == bounds.size()) stage += cost.exit;
        const int64_t bytes = stage.weight_bytes + stage.kv_bytes_per_token * kv_tokens;
        if (memory[s] && bytes > *memory[s]) fits = false;
        largest = std::max(largest, balance == PipelineBalance::kDecode ? stage.decode_bytes_read
                                                                        : stage.prefill_flops);
      }
      if (fits) best = std::min(best, largest);
      bounds.pop_back();
      return;
    }
    for (int64_t cut = next; cut < layers; ++cut) {
      bounds.push_back(cut);
      extend(cut + 1);
      bounds.pop_back();
    }
  };
  extend(1);
  return best;
}

TEST(PipelinePlanTest, SplitIsTheBestOfEverySplit) {
  model::LlamaShape shape = eight_layers();
  shape.ffn_size = 256;
  Result<PipelineModelCost> cost = llama_pipeline_cost(shape, DType::kF32, 128);
  ASSERT_TRUE(cost.ok()) << cost.status();
  for (PipelineBalance balance : {PipelineBalance::kDecode, PipelineBalance::kPrefill}) {
    for (int64_t workers = 1; workers <= 5; ++workers) {
      std::vector<PipelineWorker> group;
      for (int64_t w = 0; w < workers; ++w) group.push_back({fmt::format("w{}", w), {}});
      Result<PipelinePlan> plan = plan_pipeline(*cost, group, {balance, 1024});
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->stages.size(), static_cast<size_t>(workers));
      int64_t next = 0, largest = 0;
      for (size_t s = 0; s < plan->stages.size(); ++s) {
        const PipelineStagePlan& stage = plan->stages[s];
        EXPECT_EQ(stage.worker, group[s].name);
        EXPECT_EQ(stage.first_layer, next);
        EXPECT_GT(stage.end_layer, stage.first_layer);
        EXPECT_EQ(stage.kv_bytes, (stage.end_layer - stage.first_layer) * 2 * 2 * 16 * 4 * 1024);
        EXPECT_EQ(stage.memory_bytes, stage.cost.weight_bytes + stage.kv_bytes);
        next = stage.end_layer;
        largest = std::max(largest, plan->stage_cost(stage));
      }
      EXPECT_EQ(next, 8);
      const std::vector<std::optional<int64_t>> unlimited(static_cast<size_t>(workers));
      EXPECT_EQ(largest, brute_force_best(*cost, workers, balance, unlimited, 1024))
          << pipeline_balance_name(balance) << " over " << workers << " workers";
    }
  }
}

TEST(PipelinePlanTest, DecodeBalanceOfTwoWorkersCutsInTheMiddle) {
  // 8 equal layers and an LM head smaller than one layer: 4 + 4 (a cut at 5 leaves the first
  // stage 5 layers, more than 3 layers and the head).
  Result<PipelineModelCost> cost = llama_pipeline_cost(eight_layers(), DType::kF32, 64);
  ASSERT_TRUE(cost.ok()) << cost.status();
  ASSERT_LT(cost->exit.decode_bytes_read, cost->layers[0].decode_bytes_read);
  const std::vector<PipelineWorker> workers = {{"a", {}}, {"b", {}}};
  Result<PipelinePlan> plan = plan_pipeline(*cost, workers, {PipelineBalance::kDecode, 0});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].end_layer, 4);
  const std::string table = plan->to_string();
  EXPECT_NE(table.find("0-3"), std::string::npos) << table;
  EXPECT_NE(table.find("4-7"), std::string::npos) << table;
  EXPECT_NE(table.find("256 bytes per token"), std::string::npos) << table;
}

TEST(PipelinePlanTest, MemoryLimitsMoveLayersToTheLargerWorker) {
  Result<PipelineModelCost> cost = llama_pipeline_cost(eight_layers(), DType::kF32, 64);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const int64_t kv_tokens = 4096;
  const int64_t layer_bytes =
      cost->layers[0].weight_bytes + cost->layers[0].kv_bytes_per_token * kv_tokens;
  // Worker a holds the embedding and two layers at most.
  const int64_t small = cost->entry.weight_bytes + 2 * layer_bytes + layer_bytes / 2;
  const std::vector<PipelineWorker> workers = {{"a", small}, {"b", {}}};
  Result<PipelinePlan> plan = plan_pipeline(*cost, workers, {PipelineBalance::kDecode, kv_tokens});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->stages[0].end_layer, 2);
  EXPECT_LE(plan->stages[0].memory_bytes, small);
  const std::vector<std::optional<int64_t>> memory = {small, std::nullopt};
  EXPECT_EQ(std::max(plan->stage_cost(plan->stages[0]), plan->stage_cost(plan->stages[1])),
            brute_force_best(*cost, 2, PipelineBalance::kDecode, memory, kv_tokens));
}

TEST(PipelinePlanTest, ShardThatCannotFitIsAnError) {
  Result<PipelineModelCost> cost = llama_pipeline_cost(eight_layers(), DType::kF32, 64);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const PipelineLayerCost total = sum(*cost);
  const int64_t kv_tokens = 1024;
  const int64_t needed = total.weight_bytes + total.kv_bytes_per_token * kv_tokens;
  // Together the workers hold two thirds of what the model needs.
  const std::vector<PipelineWorker> workers = {{"a", needed / 3}, {"b", needed / 3}};
  Result<PipelinePlan> plan = plan_pipeline(*cost, workers, {PipelineBalance::kDecode, kv_tokens});
  ASSERT_EQ(plan.status().code(), StatusCode::kResourceExhausted) << plan.status();
  const std::string_view message = plan.status().message();
  EXPECT_NE(message.find("does not fit 2 workers"), std::string_view::npos) << message;
  EXPECT_NE(message.find(", b "), std::string_view::npos) << message;  // each budget
  EXPECT_NE(message.find("Add workers or memory"), std::string_view::npos) << message;
  // The same workers with all the model needs each.
  const std::vector<PipelineWorker> larger = {{"a", needed}, {"b", needed}};
  EXPECT_TRUE(plan_pipeline(*cost, larger, {PipelineBalance::kDecode, kv_tokens}).ok());
}

TEST(PipelinePlanTest, RejectsMoreWorkersThanLayersAndNoWorkers) {
  model::LlamaShape shape;  // 2 layers
  Result<PipelineModelCost> cost = llama_pipeline_cost(shape, DType::kF32, 16);
  ASSERT_TRUE(cost.ok()) << cost.status();
  const std::vector<PipelineWorker> three = {{"a", {}}, {"b", {}}, {"c", {}}};
  Status status = plan_pipeline(*cost, three, {}).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("use at most 2 workers"), std::string_view::npos) << status;
  EXPECT_EQ(plan_pipeline(*cost, {}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(llama_pipeline_cost(shape, DType::kF32, 0).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace folio::dist
