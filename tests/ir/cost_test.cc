// Cost hints against numbers computed by hand from the formulas in cost.h.
#include "folio/ir/cost.h"

#include <gtest/gtest.h>

#include "folio/ir/builder.h"
#include "testing/llama_test_graph.h"

namespace folio::ir {
namespace {

const CostHints& cost_of_last_op(const GraphBuilder& builder) {
  return builder.graph().op(OpId(builder.graph().num_ops() - 1)).annotations.cost;
}

class CostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ids_ = builder_.input("ids", DType::kI32, {8}).value();
    const TensorId table = builder_.weight("table", DType::kF32, {10, 64}).value();
    x_ = builder_.embedding(ids_, table, "x").value();  // f32 [8, 64]
  }
  GraphBuilder builder_{Phase::kDecode};
  TensorId ids_, x_;
};

TEST_F(CostTest, MatmulMatchesHandComputedFlopsAndBytes) {
  const TensorId w = builder_.weight("w", DType::kF32, {32, 64}).value();
  ASSERT_TRUE(builder_.matmul(x_, w, "y").ok());
  // 2 * rows * out * in; x 8*64*4 + w 32*64*4 bytes read; 8*32*4 written.
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{2 * 8 * 32 * 64, 2048 + 8192, 1024, 0}));

  const TensorId bias = builder_.weight("b", DType::kF32, {32}).value();
  ASSERT_TRUE(builder_.matmul(x_, w, bias, "y_bias").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{32768 + 8 * 32, 2048 + 8192 + 128, 1024, 0}));

  // q4_0: 64 columns are 2 blocks of 18 bytes per row.
  const TensorId quantized = builder_.weight("q", DType::kQ4_0, {32, 64}).value();
  ASSERT_TRUE(builder_.matmul(x_, quantized, "y_q").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{32768, 2048 + 32 * 2 * 18, 1024, 0}));
}

TEST_F(CostTest, EmbeddingReadsOnlyTheGatheredRows) {
  const TensorId table = builder_.weight("big_table", DType::kQ8_0, {50000, 64}).value();
  ASSERT_TRUE(builder_.embedding(ids_, table, "e").ok());
  // 8 ids of 4 bytes, 8 rows of 2 q8_0 blocks (34 bytes); one dequantizing multiply per element.
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{8 * 64, 32 + 8 * 68, 8 * 64 * 4, 0}));
}

TEST_F(CostTest, AllReduceCommunicatesItsPayload) {
  ASSERT_TRUE(builder_.all_reduce_sum(x_, "r").ok());
  // 512 f32 values: one add each, read and written once, and 2048 bytes handed to the group.
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{512, 2048, 2048, 2048}));
}

TEST_F(CostTest, ElementwiseNormAndRopeCosts) {
  ASSERT_TRUE(builder_.silu(x_, "s").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{4 * 512, 2048, 2048, 0}));
  ASSERT_TRUE(builder_.swiglu(x_, x_, "g").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{5 * 512, 4096, 2048, 0}));
  const TensorId norm = builder_.weight("norm", DType::kF32, {64}).value();
  ASSERT_TRUE(builder_.rms_norm(x_, norm, 1e-6f, "n").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{4 * 512, 2048 + 256, 2048, 0}));
  const TensorId positions = builder_.input("positions", DType::kI32, {8}).value();
  // 4 heads of 16, rotating the first 8 dimensions of each.
  ASSERT_TRUE(
      builder_.rope(x_, positions, {4, 16, 8, 10000.0f, kernels::RopeStyle::kNeox, {}}, "r").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{3 * 8 * 4 * 8, 2048 + 32, 2048, 0}));
}

TEST_F(CostTest, KvCacheWriteAndAttentionCosts) {
  const TensorId kv =
      builder_.matmul(x_, builder_.weight("wkv", DType::kF32, {32, 64}).value(), "kv").value();
  const Shape cache{32, 16, 2, 16};
  const TensorId k_cache = builder_.kv_cache("k", DType::kF16, cache).value();
  const TensorId v_cache = builder_.kv_cache("v", DType::kF16, cache).value();
  const TensorId slots = builder_.input("slots", DType::kI32, {8}).value();
  ASSERT_TRUE(builder_.kv_cache_write(kv, kv, slots, k_cache, v_cache, "write").ok());
  // Reads key and value (8*32*4 each) and the slots; writes 8*32 f16 values into each cache.
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{0, 2 * 1024 + 32, 2 * 8 * 32 * 2, 0}));

  const AttentionMetadata metadata{builder_.input("seq_lens", DType::kI32, {8}).value(),
                                   builder_.input("starts", DType::kI32, {9}).value(),
                                   builder_.input("tables", DType::kI32, {8, 4}).value()};
  ASSERT_TRUE(
      builder_.paged_attention(x_, k_cache, v_cache, metadata, {4, 2, 16, 0.25f}, "attn").ok());
  // Capacity 4 blocks * 16 = 64 tokens per sequence; a KV row is 2 heads * 16 * 2 bytes.
  const int64_t flops = 4 * 8 * 4 * 16 * 64;
  const int64_t read = 2048 + 32 + 36 + 128 + 2 * 8 * 64 * 64;
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{flops, read, 2048, 0}));
}

TEST_F(CostTest, GatherReadsOnlyTheGatheredRows) {
  const TensorId rows = builder_.input("rows", DType::kI32, {3}).value();
  ASSERT_TRUE(builder_.gather_rows(x_, rows, "g").ok());
  EXPECT_EQ(cost_of_last_op(builder_), (CostHints{0, 12 + 3 * 256, 3 * 256, 0}));
}

TEST(CostTotalsTest, LlamaGraphMatmulFlopsMatchTheModelShape) {
  const folio::testing::LlamaTestGraphConfig config;
  const model::LlamaShape& model = config.model;
  const Graph graph = folio::testing::build_llama_test_graph(config).value();
  const CostTotals totals = total_cost(graph);
  const int64_t t = config.step.num_tokens, h = model.hidden_size;
  const int64_t q = model.num_heads * model.head_dim(), kv = model.kv_dim();
  const int64_t per_layer = 2 * t * h * q + 2 * (2 * t * h * kv) + 2 * t * q * h +
                            2 * (2 * t * h * model.ffn_size) + 2 * t * model.ffn_size * h;
  const int64_t head = 2 * config.step.num_logit_rows * model.vocab_size * h;
  EXPECT_EQ(totals.of(OpKind::kMatMul).flops, model.num_layers * per_layer + head);
  EXPECT_EQ(totals.num_ops(OpKind::kMatMul), 7 * model.num_layers + 1);
  EXPECT_EQ(totals.num_ops(OpKind::kPagedAttention), model.num_layers);
  CostHints sum;
  for (const Op& op : graph.ops()) sum += op.annotations.cost;
  EXPECT_EQ(totals.total, sum);
  EXPECT_GT(totals.total.arithmetic_intensity(), 0.0);
}

}  // namespace
}  // namespace folio::ir
