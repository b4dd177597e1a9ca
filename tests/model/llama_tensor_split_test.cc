// The legality of tensor splits (llama_tensor_split.h) and the graph of one rank
// (LlamaGraphOptions::tensor_split): whole heads, whole FFN features, no quantization block cut
// by a row split; each rank's graph has the rank's shapes and one all_reduce_sum after every
// row-split projection.
#include <string>

#include <gtest/gtest.h>

#include "folio/ir/graph.h"
#include "folio/model/llama_graph.h"
#include "folio/model/llama_tensor_split.h"

namespace folio::model {
namespace {

bool mentions(const Status& status, std::string_view text) {
  return status.message().find(text) != std::string_view::npos;
}

TEST(LlamaTensorSplitTest, AxesFollowMegatron) {
  EXPECT_EQ(llama_split_axis("blk.0.attn_q.weight"), LlamaSplitAxis::kColumns);
  EXPECT_EQ(llama_split_axis("blk.3.attn_v.bias"), LlamaSplitAxis::kColumns);
  EXPECT_EQ(llama_split_axis("blk.12.ffn_up.weight"), LlamaSplitAxis::kColumns);
  EXPECT_EQ(llama_split_axis("blk.1.attn_output.weight"), LlamaSplitAxis::kRows);
  EXPECT_EQ(llama_split_axis("blk.1.ffn_down.weight"), LlamaSplitAxis::kRows);
  EXPECT_EQ(llama_split_axis("blk.1.attn_q_norm.weight"), LlamaSplitAxis::kReplicated);
  EXPECT_EQ(llama_split_axis("token_embd.weight"), LlamaSplitAxis::kReplicated);
  EXPECT_EQ(llama_split_axis("output.weight"), LlamaSplitAxis::kReplicated);
}

TEST(LlamaTensorSplitTest, KvHeadsMustDivide) {
  LlamaShape shape;  // 4 heads, 2 KV heads
  EXPECT_TRUE(validate_llama_tensor_split(shape, {0, 2}).ok());
  const Status status = validate_llama_tensor_split(shape, {0, 3});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(status, "2 KV heads do not divide over 3 ranks")) << status;
  EXPECT_TRUE(mentions(status, "rank counts that split this model: 2")) << status;
  const Status four = validate_llama_tensor_split(shape, {1, 4});
  EXPECT_TRUE(mentions(four, "KV heads")) << four;
}

TEST(LlamaTensorSplitTest, FeedForwardWidthMustDivide) {
  LlamaShape shape;
  shape.ffn_size = 129;
  const Status status = validate_llama_tensor_split(shape, {0, 2});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(status, "feed-forward width 129")) << status;
  EXPECT_TRUE(mentions(status, "no rank count above 1")) << status;
}

TEST(LlamaTensorSplitTest, RowSplitMustNotCutQuantizationBlocks) {
  LlamaShape shape;  // q width 64, FFN 128
  shape.weight_dtype = DType::kQ8_0;
  EXPECT_TRUE(validate_llama_tensor_split(shape, {0, 2}).ok());  // 32 and 64 per rank
  shape.num_kv_heads = 4;
  // 4 ranks: attn_output's 64 input features in runs of 16, half a q8_0 block.
  const Status q8 = validate_llama_tensor_split(shape, {0, 4});
  EXPECT_EQ(q8.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mentions(q8, "blk.0.attn_output.weight (q8_0, 64 input features)")) << q8;
  EXPECT_TRUE(mentions(q8, "block of 32 values")) << q8;
  // Unquantized, 4 ranks split it.
  shape.weight_dtype = DType::kF16;
  EXPECT_TRUE(validate_llama_tensor_split(shape, {3, 4}).ok());
  // A k-quant ffn_down: blocks of 256 values, 512 features over 2 ranks but not over 4.
  shape.ffn_size = 512;
  shape.tensor_dtypes["blk.1.ffn_down.weight"] = DType::kQ4_K;
  EXPECT_TRUE(validate_llama_tensor_split(shape, {1, 2}).ok());
  const Status k_quant = validate_llama_tensor_split(shape, {1, 4});
  EXPECT_TRUE(mentions(k_quant, "blk.1.ffn_down.weight (q4_K, 512 input features)")) << k_quant;
  EXPECT_TRUE(mentions(k_quant, "rank counts that split this model: 2")) << k_quant;
}

TEST(LlamaTensorSplitTest, RankMustBeInTheGroup) {
  LlamaShape shape;
  EXPECT_EQ(validate_llama_tensor_split(shape, {2, 2}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate_llama_tensor_split(shape, {0, 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(validate_llama_tensor_split(shape, {-1, 2}).code(), StatusCode::kInvalidArgument);
}

ir::KvCacheShape rank_cache(const LlamaShape& shape, const LlamaTensorSplit& split) {
  return ir::KvCacheShape{
      llama_stage_kv_cache_geometry(shape, shape.num_layers, 16, DType::kF32, split), 4, 2};
}

TEST(LlamaTensorSplitGraphTest, RankGraphHasItsShapesAndOneAllReducePerRowSplit) {
  LlamaShape shape;
  shape.architecture = LlamaArchitecture::kQwen2;  // with q/k/v biases
  const LlamaTensorSplit split{1, 2};
  LlamaGraphOptions options;
  options.tensor_split = split;
  const ir::StepShape step{4, 2, 2, ir::StepPhase::kPrefill};
  Result<ir::Graph> graph = build_llama_step_graph(shape, step, rank_cache(shape, split), options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  int reductions = 0;
  for (const ir::Op& op : graph->ops()) {
    if (op.kind != ir::OpKind::kAllReduceSum) continue;
    ++reductions;
    const ir::TensorInfo& input = graph->tensor(op.inputs[0]);
    EXPECT_TRUE(input.name.ends_with(".attn_output") || input.name.ends_with(".ffn_down"))
        << input.name;
    EXPECT_EQ(input.shape[1], shape.hidden_size);
  }
  EXPECT_EQ(reductions, 2 * shape.num_layers);
  auto weight_shape = [&](std::string_view name) -> std::vector<int64_t> {
    for (const ir::TensorInfo& tensor : graph->tensors()) {
      if (tensor.name == name)
        return {tensor.shape.dims.begin(), tensor.shape.dims.begin() + tensor.shape.rank};
    }
    return {};
  };
  const int64_t head_dim = shape.head_dim();
  EXPECT_EQ(weight_shape("blk.0.attn_q.weight"),
            (std::vector<int64_t>{shape.num_heads / 2 * head_dim, shape.hidden_size}));
  EXPECT_EQ(weight_shape("blk.0.attn_k.bias"),
            (std::vector<int64_t>{shape.num_kv_heads / 2 * head_dim}));
  EXPECT_EQ(weight_shape("blk.0.attn_output.weight"),
            (std::vector<int64_t>{shape.hidden_size, shape.num_heads / 2 * head_dim}));
  EXPECT_EQ(weight_shape("blk.1.ffn_gate.weight"),
            (std::vector<int64_t>{shape.ffn_size / 2, shape.hidden_size}));
  EXPECT_EQ(weight_shape("blk.1.ffn_down.weight"),
            (std::vector<int64_t>{shape.hidden_size, shape.ffn_size / 2}));
  EXPECT_EQ(weight_shape("output.weight"),
            (std::vector<int64_t>{shape.vocab_size, shape.hidden_size}));
  EXPECT_EQ(weight_shape("blk.0.k_cache"),
            (std::vector<int64_t>{4, 16, shape.num_kv_heads / 2, head_dim}));

  // Unsplit, the same call emits no reduction.
  Result<ir::Graph> whole = build_llama_step_graph(shape, step, rank_cache(shape, {}));
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (const ir::Op& op : whole->ops()) EXPECT_NE(op.kind, ir::OpKind::kAllReduceSum);
}

TEST(LlamaTensorSplitGraphTest, RefusesIllegalSplitsAdaptersKvRangesAndTheWholeCache) {
  LlamaShape shape;
  const ir::StepShape step{1, 1, 1, ir::StepPhase::kDecode};
  LlamaGraphOptions options;
  options.tensor_split = {0, 3};
  EXPECT_EQ(build_llama_step_graph(shape, step, rank_cache(shape, {}), options).status().code(),
            StatusCode::kInvalidArgument);
  options.tensor_split = {0, 2};
  options.adapters = true;
  const Status adapters =
      build_llama_step_graph(shape, step, rank_cache(shape, {0, 2}), options).status();
  EXPECT_TRUE(mentions(adapters, "adapters are not supported with tensor parallelism")) << adapters;
  options.adapters = false;
  // One executor, one group: a rank cannot also be a KV-parallel member.
  options.kv_range_begin = 0;
  options.kv_range_end = 32;
  const Status both =
      build_llama_step_graph(shape, step, rank_cache(shape, {0, 2}), options).status();
  EXPECT_TRUE(mentions(both, "do not combine")) << both;
  options.kv_range_end = 0;
  // A cache of every KV head is not the rank's.
  const Status cache = build_llama_step_graph(shape, step, rank_cache(shape, {}), options).status();
  EXPECT_TRUE(mentions(cache, "(tensor rank 0 of 2)")) << cache;
}

}  // namespace
}  // namespace folio::model
