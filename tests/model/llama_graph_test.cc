#include "folio/model/llama_graph.h"

#include <algorithm>
#include <ranges>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/ir/dump.h"
#include "folio/ir/verify.h"

namespace folio::model {
namespace {

ir::StepShape small_step() {
  return ir::StepShape{8, 2, 2, ir::StepPhase::kPrefill};
}

// 16 blocks of 16 tokens of `shape`'s attention layers, 4 blocks per sequence.
ir::KvCacheShape small_kv_cache(const LlamaShape& shape) {
  return ir::KvCacheShape{llama_kv_cache_geometry(shape, 16, DType::kF32), 16, 4};
}

// Every weight the graph reads must exist in a generated model file with the same dtype and
// shape (GGUF lists dimensions fastest first, the IR slowest first).
void expect_weights_bind_to_file(const LlamaShape& shape) {
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 7);
  ASSERT_TRUE(writer.ok()) << writer.status();
  Result<std::vector<uint8_t>> bytes = writer->write_to_buffer();
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  Result<gguf::GgufFile> file = gguf::GgufFile::parse_owned(std::move(*bytes));
  ASSERT_TRUE(file.ok()) << file.status();
  Result<ir::Graph> graph = build_llama_step_graph(shape, small_step(), small_kv_cache(shape));
  ASSERT_TRUE(graph.ok()) << graph.status();
  int weights = 0;
  for (const ir::TensorInfo& tensor : graph->tensors()) {
    if (tensor.residency != ir::Residency::kWeight) continue;
    ++weights;
    Result<gguf::GgufTensor> stored = file->tensor(tensor.name);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->dtype, tensor.dtype) << tensor.name;
    std::vector<int64_t> dims(stored->info->dimensions.rbegin(), stored->info->dimensions.rend());
    EXPECT_EQ(dims, std::vector<int64_t>(tensor.shape.dims.begin(),
                                         tensor.shape.dims.begin() + tensor.shape.rank))
        << tensor.name;
  }
  // Embedding, output norm, (output), and 9 per layer (+3 biases for Qwen 2).
  const int per_layer = shape.architecture == LlamaArchitecture::kQwen2 ? 12 : 9;
  EXPECT_EQ(weights, 2 + (shape.tie_embeddings ? 0 : 1) + per_layer * shape.num_layers);
}

TEST(LlamaGraphTest, LlamaWeightsBindToGeneratedFile) {
  LlamaShape shape;
  expect_weights_bind_to_file(shape);
}

TEST(LlamaGraphTest, QuantizedTiedQwenWeightsBindToGeneratedFile) {
  LlamaShape shape;
  shape.architecture = LlamaArchitecture::kQwen2;
  shape.weight_dtype = DType::kQ8_0;
  shape.tie_embeddings = true;
  expect_weights_bind_to_file(shape);
}

TEST(LlamaGraphTest, GraphVerifiesAndHasOneAttentionPerLayer) {
  LlamaShape shape;
  shape.num_layers = 3;
  Result<ir::Graph> graph = build_llama_step_graph(shape, small_step(), small_kv_cache(shape));
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(ir::verify(*graph).ok());
  int attention = 0;
  for (const ir::Op& op : graph->ops()) attention += ir::is_attention(op.kind) ? 1 : 0;
  EXPECT_EQ(attention, 3);
  std::optional<ir::TensorId> logits = graph->find_tensor(ir::kOutputLogits);
  ASSERT_TRUE(logits.has_value());
  EXPECT_EQ(graph->tensor(*logits).residency, ir::Residency::kOutput);
  EXPECT_EQ(graph->tensor(*logits).shape, (ir::Shape{2, shape.vocab_size}));
}

TEST(LlamaGraphTest, RopeStyleFollowsArchitecture) {
  for (LlamaArchitecture architecture : {LlamaArchitecture::kLlama, LlamaArchitecture::kQwen2}) {
    LlamaShape shape;
    shape.architecture = architecture;
    Result<ir::Graph> graph = build_llama_step_graph(shape, small_step(), small_kv_cache(shape));
    ASSERT_TRUE(graph.ok()) << graph.status();
    for (const ir::Op& op : graph->ops()) {
      if (op.kind != ir::OpKind::kRope) continue;
      const auto& rope = std::get<ir::RopeAttributes>(op.attributes);
      EXPECT_EQ(rope.style, architecture == LlamaArchitecture::kQwen2
                                ? kernels::RopeStyle::kNeox
                                : kernels::RopeStyle::kNormal);
    }
  }
}

TEST(LlamaGraphTest, RejectsBadStepShapes) {
  LlamaShape shape;
  ir::StepShape step = small_step();
  step.num_tokens = 0;
  Status status = build_llama_step_graph(shape, step, small_kv_cache(shape)).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("num_tokens"), std::string_view::npos) << status;
  ir::KvCacheShape kv_cache = small_kv_cache(shape);
  kv_cache.geometry.dtype = DType::kQ8_0;
  EXPECT_EQ(build_llama_step_graph(shape, small_step(), kv_cache).status().code(),
            StatusCode::kInvalidArgument);
  kv_cache = small_kv_cache(shape);
  kv_cache.geometry.num_kv_heads += 1;  // a cache made for another model
  EXPECT_EQ(build_llama_step_graph(shape, small_step(), kv_cache).status().code(),
            StatusCode::kInvalidArgument);
  shape.num_heads = 3;  // 64 is not a multiple of 3
  EXPECT_EQ(build_llama_step_graph(shape, small_step(), small_kv_cache(shape)).status().code(),
            StatusCode::kInvalidArgument);
}

// Pipeline stages (LlamaGraphOptions::first_layer, end_layer): the whole model as one explicit
// stage is the default graph; stages of a 4-layer model read and write the residual stream at
// their cuts, hold the KV caches of their layers only and together run the whole graph's ops.
TEST(LlamaGraphTest, StagesSplitTheWholeGraphAtLayerCuts) {
  LlamaShape shape;
  shape.num_layers = 4;
  const ir::StepShape step = small_step();
  Result<ir::Graph> whole = build_llama_step_graph(shape, step, small_kv_cache(shape));
  ASSERT_TRUE(whole.ok()) << whole.status();
  LlamaGraphOptions one_stage;
  one_stage.first_layer = 0;
  one_stage.end_layer = 4;
  Result<ir::Graph> explicit_whole =
      build_llama_step_graph(shape, step, small_kv_cache(shape), one_stage);
  ASSERT_TRUE(explicit_whole.ok()) << explicit_whole.status();
  EXPECT_EQ(ir::dump_graph(*explicit_whole), ir::dump_graph(*whole));

  const std::pair<int64_t, int64_t> ranges[] = {{0, 1}, {1, 3}, {3, 4}};
  std::vector<std::string> stage_ops;
  for (const auto& [first, end] : ranges) {
    LlamaGraphOptions options;
    options.first_layer = first;
    options.end_layer = end;
    ir::KvCacheShape kv_cache = small_kv_cache(shape);
    kv_cache.geometry = llama_stage_kv_cache_geometry(shape, end - first, 16, DType::kF32);
    Result<ir::Graph> graph = build_llama_step_graph(shape, step, kv_cache, options);
    ASSERT_TRUE(graph.ok()) << graph.status();
    EXPECT_TRUE(ir::verify(*graph).ok()) << ir::verify(*graph);
    const bool first_stage = first == 0, last_stage = end == 4;
    EXPECT_EQ(graph->find_tensor(ir::kInputTokenIds).has_value(), first_stage);
    EXPECT_EQ(graph->find_tensor(ir::kInputHidden).has_value(), !first_stage);
    EXPECT_EQ(graph->find_tensor(ir::kInputLogitIndices).has_value(), last_stage);
    EXPECT_EQ(graph->find_tensor(ir::kOutputLogits).has_value(), last_stage);
    if (!first_stage) {
      const ir::TensorInfo& in = graph->tensor(*graph->find_tensor(ir::kInputHidden));
      EXPECT_EQ(in.residency, ir::Residency::kInput);
      EXPECT_EQ(in.dtype, DType::kF32);
      EXPECT_EQ(in.shape, (ir::Shape{step.num_tokens, shape.hidden_size}));
    }
    if (!last_stage) {
      std::optional<ir::TensorId> out = graph->find_tensor(ir::kOutputHidden);
      ASSERT_TRUE(out.has_value());
      EXPECT_EQ(graph->tensor(*out).residency, ir::Residency::kOutput);
      EXPECT_EQ(graph->tensor(*out).shape, (ir::Shape{step.num_tokens, shape.hidden_size}));
    }
    std::vector<std::string> caches;
    for (const ir::TensorInfo& tensor : graph->tensors()) {
      if (tensor.residency == ir::Residency::kKvCache) caches.push_back(tensor.name);
    }
    std::vector<std::string> expected_caches;
    for (int64_t layer = first; layer < end; ++layer) {
      expected_caches.push_back(llama_key_cache_name(layer));
      expected_caches.push_back(llama_value_cache_name(layer));
    }
    std::ranges::sort(caches);
    std::ranges::sort(expected_caches);
    EXPECT_EQ(caches, expected_caches);
    for (const ir::Op& op : graph->ops()) {
      // The hand-over add is the whole graph's residual add of the stage's last layer.
      stage_ops.push_back(op.name == ir::kOutputHidden ? fmt::format("blk.{}.ffn_residual", end - 1)
                                                       : op.name);
    }
  }
  std::vector<std::string> whole_ops;
  for (const ir::Op& op : whole->ops()) whole_ops.push_back(op.name);
  EXPECT_EQ(stage_ops, whole_ops);
}

TEST(LlamaGraphTest, RejectsBadStages) {
  LlamaShape shape;
  shape.num_layers = 4;
  const std::pair<int64_t, int64_t> bad_ranges[] = {{2, 2}, {3, 1}, {-1, 2}, {2, 5}};
  for (const auto& [first, end] : bad_ranges) {
    LlamaGraphOptions options;
    options.first_layer = first;
    options.end_layer = end;
    Status status =
        build_llama_step_graph(shape, small_step(), small_kv_cache(shape), options).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << first << ".." << end;
    EXPECT_NE(status.message().find("not a non-empty range"), std::string_view::npos) << status;
  }
  // A stage's cache holds its layers only: the whole model's cache does not fit [1, 3).
  LlamaGraphOptions options;
  options.first_layer = 1;
  options.end_layer = 3;
  Status status =
      build_llama_step_graph(shape, small_step(), small_kv_cache(shape), options).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("layers [1, 3) need 2"), std::string_view::npos) << status;
}

}  // namespace
}  // namespace folio::model
