// The Llama step graph (the model layer's emitter, as ir/ passes see it) end to end: structure,
// annotations, variants (Qwen2 bias and NeoX RoPE, quantized weights, decode buckets), and the
// readable dump.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/ir/buffer_plan.h"
#include "folio/ir/cost.h"
#include "folio/ir/dump.h"
#include "folio/ir/lifetime.h"
#include "folio/ir/split.h"
#include "folio/ir/verify.h"
#include "testing/llama_test_graph.h"

namespace folio::ir {
namespace {

using ::testing::HasSubstr;

TEST(LlamaGraphTest, HasTheExpectedOpsPerLayer) {
  folio::testing::LlamaTestGraphConfig config;
  config.model.num_layers = 3;
  const Graph graph = folio::testing::build_llama_test_graph(config).value();
  ASSERT_TRUE(verify(graph).ok());
  // embedding; per layer attn_norm, q, k, v, 2 rope, kv write, attention, output, add, ffn_norm,
  // gate, up, swiglu, down, add; final norm, gather, LM head.
  EXPECT_EQ(graph.num_ops(), 1 + 16 * 3 + 3);
  const CostTotals totals = total_cost(graph);
  EXPECT_EQ(totals.num_ops(OpKind::kRope), 2 * 3);
  EXPECT_EQ(totals.num_ops(OpKind::kKvCacheWrite), 3);
  EXPECT_EQ(totals.num_ops(OpKind::kRmsNorm), 2 * 3 + 1);
  EXPECT_EQ(totals.num_ops(OpKind::kAdd), 2 * 3);
  for (const Op& op : graph.ops()) {
    EXPECT_EQ(op.annotations.phase, Phase::kMixed);  // a prefill bucket
    EXPECT_EQ(op.annotations.modality, Modality::kText);
    const bool in_layer = op.name.starts_with("blk.");
    EXPECT_EQ(op.layer >= 0, in_layer) << op.name;
    if (in_layer) {
      EXPECT_TRUE(op.name.starts_with(fmt::format("blk.{}.", op.layer))) << op.name;
    }
  }
  const TensorInfo& logits = graph.tensor(graph.find_tensor("logits").value());
  EXPECT_EQ(logits.residency, Residency::kOutput);
  EXPECT_EQ(logits.shape, (Shape{config.step.num_logit_rows, config.model.vocab_size}));
  EXPECT_EQ(graph.tensor(graph.find_tensor("blk.2.k_cache").value()).residency,
            Residency::kKvCache);
}

TEST(LlamaGraphTest, VariantsBuildAndVerify) {
  folio::testing::LlamaTestGraphConfig qwen;
  qwen.model.architecture = model::LlamaArchitecture::kQwen2;  // Q/K/V bias, NeoX RoPE
  qwen.model.weight_dtype = DType::kQ8_0;
  qwen.kv_dtype = DType::kF16;
  Result<Graph> graph = folio::testing::build_llama_test_graph(qwen);
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  EXPECT_TRUE(graph->find_tensor("blk.1.attn_v.bias").has_value());
  EXPECT_EQ(std::get<RopeAttributes>(graph->op(OpId(5)).attributes).style,
            kernels::RopeStyle::kNeox);

  folio::testing::LlamaTestGraphConfig decode;
  decode.step = ir::StepShape{8, 8, 8, StepPhase::kDecode};
  ASSERT_TRUE(folio::testing::build_llama_test_graph(decode).ok());

  // A hidden size the quantized block cannot hold is an error, not a crash.
  folio::testing::LlamaTestGraphConfig bad = qwen;
  bad.model.hidden_size = 48;  // head_dim 12
  const Status status = folio::testing::build_llama_test_graph(bad).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("multiples of 32"));
}

// A KV-parallel member's graph (issue 15, slice 6): each layer's attention is a partial over
// the member's range with a log-sum-exp, merged by attention_merge; the rest is unchanged, and
// the piecewise split still puts only the attention between pieces (the merge runs in them).
TEST(LlamaGraphTest, KvParallelMemberMergesPartialAttention) {
  folio::testing::LlamaTestGraphConfig config;
  model::LlamaGraphOptions options;
  options.kv_range_begin = 64;
  options.kv_range_end = 128;
  Result<Graph> graph =
      model::build_llama_step_graph(config.model, config.step, config.kv_cache(), options);
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(verify(*graph).ok());
  const CostTotals totals = total_cost(*graph);
  EXPECT_EQ(totals.num_ops(OpKind::kPagedAttention), 2);
  EXPECT_EQ(totals.num_ops(OpKind::kAttentionMerge), 2);
  EXPECT_EQ(graph->num_ops(), 1 + 17 * 2 + 3);
  const TensorInfo& lse = graph->tensor(graph->find_tensor("blk.1.attention_partial.lse").value());
  EXPECT_EQ(lse.shape, (Shape{config.step.num_tokens, config.model.num_heads}));
  EXPECT_THAT(dump_graph(*graph), HasSubstr("kv_range=[64, 128)"));
  const PiecewiseSplit split = split_at_attention(*graph, program_order(*graph));
  int attention_segments = 0;
  for (const Segment& segment : split.segments) {
    if (segment.kind == SegmentKind::kEager) ++attention_segments;
  }
  EXPECT_EQ(attention_segments, 2);

  options.kv_range_begin = 8;  // not on a block of 16
  EXPECT_EQ(model::build_llama_step_graph(config.model, config.step, config.kv_cache(), options)
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(LlamaGraphTest, DumpsReadableText) {
  const Graph graph = folio::testing::build_llama_test_graph().value();
  const std::string text = dump_graph(graph);
  EXPECT_THAT(text, HasSubstr("graph phase=mixed"));
  EXPECT_THAT(text, HasSubstr("token_embd.weight f32 [512, 64] weight"));
  EXPECT_THAT(text, HasSubstr("paged_attention 'blk.1.attention' layer=1"));
  EXPECT_THAT(text, HasSubstr("updates (%"));
  EXPECT_THAT(text, HasSubstr("{heads=4 kv_heads=2 head_dim=16 scale=0.25}"));
  EXPECT_THAT(text, HasSubstr("matmul x15: flops="));

  const std::vector<OpId> order = program_order(graph);
  const PiecewiseSplit split = split_at_attention(graph, order);
  EXPECT_THAT(dump_split(graph, split),
              HasSubstr("1 eager positions [8, 9) ops=1 'blk.0.attention'"));
  const BufferPlan plan = plan_buffers(analyze_lifetimes(graph, order)).value();
  EXPECT_THAT(dump_buffer_plan(graph, plan),
              HasSubstr(fmt::format("arena: peak {} bytes", plan.peak_bytes)));
}

}  // namespace
}  // namespace folio::ir
