#include "folio/model/llama_graph.h"

#include <algorithm>
#include <ranges>
#include <vector>

#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/gguf/gguf_writer.h"
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

}  // namespace
}  // namespace folio::model
