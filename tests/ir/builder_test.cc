// GraphBuilder: shape and dtype inference, and errors (never crashes, never half-built state)
// for operands that do not fit the op's signature.
#include "folio/ir/builder.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/ir/verify.h"

namespace folio::ir {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTokens = 8;

// A builder with the common external tensors of one step.
class BuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    positions_ = builder_.input("positions", DType::kI32, {kTokens}).value();
    x_ = builder_.input("x_input", DType::kI32, {kTokens}).value();
    table_ = builder_.weight("table", DType::kF32, {100, 64}).value();
    hidden_ = builder_.embedding(x_, table_, "hidden").value();
  }

  // Asserts `status` is an invalid-argument error mentioning `text` and the graph is unchanged.
  void expect_rejected(const Status& status, const std::string& text) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_THAT(std::string(status.message()), HasSubstr(text));
    EXPECT_EQ(builder_.graph().num_tensors(), num_tensors_before_);
    EXPECT_EQ(builder_.graph().num_ops(), num_ops_before_);
  }
  void snapshot() {
    num_tensors_before_ = builder_.graph().num_tensors();
    num_ops_before_ = builder_.graph().num_ops();
  }

  GraphBuilder builder_{Phase::kPrefill};
  TensorId positions_, x_, table_, hidden_;  // hidden_: f32 [8, 64]
  int32_t num_tensors_before_ = 0;
  int32_t num_ops_before_ = 0;
};

TEST_F(BuilderTest, InfersOutputShapesAndDtypes) {
  const TensorId w = builder_.weight("w", DType::kQ8_0, {48, 64}).value();
  const TensorId y = builder_.matmul(hidden_, w, "y").value();
  EXPECT_EQ(builder_.graph().tensor(y).shape, (Shape{kTokens, 48}));
  EXPECT_EQ(builder_.graph().tensor(y).dtype, DType::kF32);
  EXPECT_EQ(builder_.graph().tensor(y).residency, Residency::kActivation);
  const TensorId rows = builder_.input("rows", DType::kI32, {3}).value();
  const TensorId gathered = builder_.gather_rows(y, rows, "gathered").value();
  EXPECT_EQ(builder_.graph().tensor(gathered).shape, (Shape{3, 48}));
  const Op& op = builder_.graph().op(OpId(1));
  EXPECT_EQ(op.kind, OpKind::kMatMul);
  EXPECT_EQ(op.annotations.phase, Phase::kPrefill);
  EXPECT_EQ(op.annotations.modality, Modality::kText);
  EXPECT_GT(op.annotations.cost.flops, 0);
}

TEST_F(BuilderTest, OpsCarryTheCurrentLayer) {
  builder_.set_layer(3);
  const TensorId y = builder_.silu(hidden_, "y").value();
  builder_.set_layer(-1);
  const TensorId z = builder_.silu(y, "z").value();
  EXPECT_EQ(builder_.graph().op(OpId(1)).layer, 3);
  EXPECT_EQ(builder_.graph().op(OpId(2)).layer, -1);
  static_cast<void>(z);
}

TEST_F(BuilderTest, MatmulRejectsMismatchedInnerDimension) {
  const TensorId w = builder_.weight("w", DType::kF32, {32, 48}).value();
  snapshot();
  expect_rejected(builder_.matmul(hidden_, w, "y").status(), "has 64 columns but weight 'w'");
}

TEST_F(BuilderTest, MatmulRejectsBiasOfWrongLengthOrIntegerWeight) {
  const TensorId w = builder_.weight("w", DType::kF32, {32, 64}).value();
  const TensorId bias = builder_.weight("bias", DType::kF32, {31}).value();
  const TensorId int_weight = builder_.weight("int_w", DType::kI8, {32, 64}).value();
  snapshot();
  expect_rejected(builder_.matmul(hidden_, w, bias, "y").status(), "bias 'bias'");
  expect_rejected(builder_.matmul(hidden_, int_weight, "y").status(),
                  "expected a float or quantized");
}

TEST_F(BuilderTest, ElementwiseOpsRejectMismatchedShapesAndDtypes) {
  const TensorId narrow =
      builder_
          .silu(builder_.matmul(hidden_, builder_.weight("w", DType::kF32, {32, 64}).value(), "n")
                    .value(),
                "narrow")
          .value();
  const TensorId half_table = builder_.weight("half_table", DType::kF16, {100, 64}).value();
  const TensorId half = builder_.embedding(x_, half_table, "half", DType::kF16).value();
  snapshot();
  expect_rejected(builder_.add(hidden_, narrow, "sum").status(), "same dtype and shape");
  expect_rejected(builder_.mul(hidden_, half, "product").status(), "same dtype and shape");
  expect_rejected(builder_.swiglu(hidden_, narrow, "glu").status(), "same dtype and shape");
  expect_rejected(builder_.silu(positions_, "s").status(), "expected f32, f16 or bf16");
}

TEST_F(BuilderTest, RmsNormRejectsWrongWeightOrEpsilon) {
  const TensorId short_weight = builder_.weight("short", DType::kF32, {63}).value();
  const TensorId weight = builder_.weight("norm", DType::kF32, {64}).value();
  snapshot();
  expect_rejected(builder_.rms_norm(hidden_, short_weight, 1e-5f, "n").status(),
                  "dimension 0 must be 64");
  expect_rejected(builder_.rms_norm(hidden_, weight, 0.0f, "n").status(), "epsilon");
  // A weight of a divisor of the columns normalizes each group of that many (per-head norms).
  const TensorId head_weight = builder_.weight("head_norm", DType::kF32, {16}).value();
  const Result<TensorId> heads = builder_.rms_norm(hidden_, head_weight, 1e-5f, "heads");
  ASSERT_TRUE(heads.ok()) << heads.status();
  EXPECT_EQ(builder_.graph().tensor(*heads).shape, builder_.graph().tensor(hidden_).shape);
}

TEST_F(BuilderTest, RopeRejectsBadHeadsPositionsAndRotaryDim) {
  const TensorId short_positions =
      builder_.input("short_positions", DType::kI32, {kTokens - 1}).value();
  snapshot();
  RopeAttributes rope{4, 16, 16, 10000.0f, kernels::RopeStyle::kNormal, {}};
  expect_rejected(builder_.rope(hidden_, short_positions, rope, "r").status(), "the token count");
  rope.num_heads = 3;
  expect_rejected(builder_.rope(hidden_, positions_, rope, "r").status(), "num_heads * head_dim");
  rope.num_heads = 4;
  rope.rotary_dim = 15;
  expect_rejected(builder_.rope(hidden_, positions_, rope, "r").status(), "rotary_dim 15");
  rope.rotary_dim = 16;
  rope.theta = -1.0f;
  expect_rejected(builder_.rope(hidden_, positions_, rope, "r").status(), "theta");
  rope.theta = 500000.0f;
  rope.scaling = {RopeScalingKind::kLlama3, 8.0f, 4.0f, 1.0f, 8192};
  expect_rejected(builder_.rope(hidden_, positions_, rope, "r").status(), "llama3 RoPE scaling");
  rope.scaling.high_frequency_factor = 4.0f;
  rope.scaling.low_frequency_factor = 1.0f;
  EXPECT_TRUE(builder_.rope(hidden_, positions_, rope, "r").ok());
}

TEST_F(BuilderTest, RopeFrequencyFactorsAndYarnAreChecked) {
  const TensorId factors = builder_.weight("rope_freqs.weight", DType::kF32, {8}).value();
  const TensorId short_factors = builder_.weight("short", DType::kF32, {4}).value();
  const TensorId f16_factors = builder_.weight("f16", DType::kF16, {8}).value();
  snapshot();
  RopeAttributes rope{4, 16, 16, 10000.0f, kernels::RopeStyle::kNormal, {}};
  EXPECT_TRUE(builder_.rope(hidden_, positions_, factors, rope, "with_factors").ok());
  snapshot();
  expect_rejected(builder_.rope(hidden_, positions_, short_factors, rope, "r").status(),
                  "rotary_dim / 2");
  expect_rejected(builder_.rope(hidden_, positions_, f16_factors, rope, "r").status(),
                  "is f16; expected f32");
  rope.scaling = {.kind = RopeScalingKind::kYarn, .factor = 4.0f, .beta_fast = 1.0f};
  expect_rejected(builder_.rope(hidden_, positions_, rope, "r").status(),
                  "0 < beta_slow (1) < beta_fast (1)");
  rope.scaling.beta_fast = 32.0f;
  expect_rejected(builder_.rope(hidden_, positions_, factors, rope, "r").status(),
                  "with yarn scaling, which makes its own");
  EXPECT_TRUE(builder_.rope(hidden_, positions_, rope, "yarn").ok());
}

TEST_F(BuilderTest, AttentionRejectsCachesAndHeadsThatDoNotFit) {
  const TensorId k_cache = builder_.kv_cache("k_cache", DType::kF16, {8, 16, 2, 16}).value();
  const TensorId v_cache = builder_.kv_cache("v_cache", DType::kF16, {8, 16, 2, 16}).value();
  const TensorId not_cache = builder_.weight("not_cache", DType::kF16, {8, 16, 2, 16}).value();
  AttentionMetadata metadata{builder_.input("seq_lens", DType::kI32, {2}).value(),
                             builder_.input("query_start", DType::kI32, {3}).value(),
                             builder_.input("block_tables", DType::kI32, {2, 4}).value()};
  const TensorId wrong_starts = builder_.input("wrong_starts", DType::kI32, {2}).value();
  snapshot();
  AttentionAttributes attention{4, 2, 16, 0.25f};
  EXPECT_TRUE(builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "ok").ok());
  snapshot();
  expect_rejected(
      builder_.paged_attention(hidden_, not_cache, v_cache, metadata, attention, "a").status(),
      "residency weight; expected kv_cache");
  attention.num_kv_heads = 3;
  expect_rejected(
      builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "a").status(),
      "not a multiple of num_kv_heads");
  attention.num_kv_heads = 4;
  expect_rejected(
      builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "a").status(),
      "the KV heads");
  attention.num_kv_heads = 2;
  metadata.query_start = wrong_starts;
  expect_rejected(
      builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "a").status(),
      "sequences + 1");
}

TEST_F(BuilderTest, GemmaOpsKeepTheirInputShapeAndCheckTheirAttributes) {
  const TensorId up = builder_.embedding(x_, table_, "up").value();
  const TensorId gated = builder_.geglu(hidden_, up, "gated").value();
  EXPECT_EQ(builder_.graph().tensor(gated).shape, (Shape{kTokens, 64}));
  const TensorId scaled = builder_.scale(hidden_, 8.0f, "scaled").value();
  EXPECT_EQ(builder_.graph().tensor(scaled).shape, (Shape{kTokens, 64}));
  const TensorId capped = builder_.soft_cap(hidden_, 30.0f, "capped").value();
  EXPECT_EQ(std::get<SoftCapAttributes>(builder_.graph().op(OpId(4)).attributes).cap, 30.0f);
  EXPECT_EQ(builder_.graph().tensor(capped).dtype, DType::kF32);
  const TensorId narrow = builder_.weight("narrow", DType::kF32, {kTokens, 32}).value();
  snapshot();
  expect_rejected(builder_.geglu(hidden_, narrow, "a").status(),
                  "must have the same dtype and shape");
  expect_rejected(builder_.soft_cap(hidden_, 0.0f, "a").status(), "cap 0 must be positive");
  expect_rejected(builder_.soft_cap(hidden_, INFINITY, "a").status(),
                  "must be positive and finite");
  expect_rejected(builder_.scale(hidden_, NAN, "a").status(), "is not finite");
  expect_rejected(builder_.scale(positions_, 2.0f, "a").status(), "input");

  const TensorId k_cache = builder_.kv_cache("k_cache", DType::kF32, {8, 16, 2, 16}).value();
  const TensorId v_cache = builder_.kv_cache("v_cache", DType::kF32, {8, 16, 2, 16}).value();
  AttentionMetadata metadata{builder_.input("seq_lens", DType::kI32, {2}).value(),
                             builder_.input("query_start", DType::kI32, {3}).value(),
                             builder_.input("block_tables", DType::kI32, {2, 4}).value()};
  snapshot();
  AttentionAttributes attention{
      .num_heads = 4, .num_kv_heads = 2, .head_dim = 16, .scale = 0.25f, .logit_soft_cap = -1.0f};
  expect_rejected(
      builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "a").status(),
      "logit_soft_cap -1");
  attention.logit_soft_cap = 50.0f;
  EXPECT_TRUE(builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "ok").ok());
}

TEST_F(BuilderTest, AllReduceSumKeepsItsShapeAndTakesF32Only) {
  const TensorId summed = builder_.all_reduce_sum(hidden_, "summed").value();
  EXPECT_EQ(builder_.graph().tensor(summed).shape, (Shape{kTokens, 64}));
  EXPECT_EQ(builder_.graph().tensor(summed).dtype, DType::kF32);
  EXPECT_EQ(builder_.graph().op(OpId(1)).kind, OpKind::kAllReduceSum);
  const TensorId half = builder_.embedding(x_, table_, "half", DType::kF16).value();
  snapshot();
  expect_rejected(builder_.all_reduce_sum(half, "a").status(), "expected f32");
  expect_rejected(builder_.all_reduce_sum(positions_, "a").status(), "expected f32");
}

// A KV-parallel member's attention (issue 15, slice 6): a partial over its range with a
// log-sum-exp output "<name>.lse" f32 [T, heads], then attention_merge back to [T, heads *
// head_dim]; ranges that do not start on a block, or are empty, are refused.
TEST_F(BuilderTest, KvParallelAttentionOutputsLogSumExpAndMerges) {
  const TensorId k_cache = builder_.kv_cache("k_cache", DType::kF32, {8, 16, 2, 16}).value();
  const TensorId v_cache = builder_.kv_cache("v_cache", DType::kF32, {8, 16, 2, 16}).value();
  AttentionMetadata metadata{builder_.input("seq_lens", DType::kI32, {2}).value(),
                             builder_.input("query_start", DType::kI32, {3}).value(),
                             builder_.input("block_tables", DType::kI32, {2, 4}).value()};
  snapshot();
  AttentionAttributes attention{.num_heads = 4,
                                .num_kv_heads = 2,
                                .head_dim = 16,
                                .scale = 0.25f,
                                .kv_range_begin = 8,
                                .kv_range_end = 72};
  expect_rejected(
      builder_.paged_attention_partial(hidden_, k_cache, v_cache, metadata, attention, "a")
          .status(),
      "multiple of the block size 16");
  attention.kv_range_begin = 64;
  attention.kv_range_end = 64;
  expect_rejected(
      builder_.paged_attention_partial(hidden_, k_cache, v_cache, metadata, attention, "a")
          .status(),
      "not be empty");
  attention.kv_range_end = 128;
  const Result<PartialAttention> partial =
      builder_.paged_attention_partial(hidden_, k_cache, v_cache, metadata, attention, "partial");
  ASSERT_TRUE(partial.ok()) << partial.status();
  EXPECT_EQ(builder_.graph().tensor(partial->output).shape, (Shape{kTokens, 64}));
  EXPECT_EQ(builder_.graph().tensor(partial->lse).name, "partial.lse");
  EXPECT_EQ(builder_.graph().tensor(partial->lse).dtype, DType::kF32);
  EXPECT_EQ(builder_.graph().tensor(partial->lse).shape, (Shape{kTokens, 4}));
  snapshot();
  expect_rejected(builder_.attention_merge(partial->output, positions_, "a").status(), "lse");
  const Result<TensorId> merged = builder_.attention_merge(partial->output, partial->lse, "merged");
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(builder_.graph().tensor(*merged).shape, (Shape{kTokens, 64}));
  // A partial is emitted as one (its two outputs named), never as the whole-sequence op.
  snapshot();
  EXPECT_EQ(
      builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "c").status().code(),
      StatusCode::kInvalidArgument);
  attention.kv_range_end = 0;  // a begin without an end
  expect_rejected(
      builder_.paged_attention(hidden_, k_cache, v_cache, metadata, attention, "c").status(),
      "kv_range_begin 64 without a kv_range_end");
  // The whole-sequence attention is not a partial.
  attention.kv_range_begin = attention.kv_range_end = 0;
  EXPECT_EQ(builder_.paged_attention_partial(hidden_, k_cache, v_cache, metadata, attention, "b")
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(BuilderTest, KvCacheWriteRejectsWrongCachesAndSlots) {
  const TensorId kv =
      builder_.matmul(hidden_, builder_.weight("wk", DType::kF32, {32, 64}).value(), "kv").value();
  const TensorId k_cache = builder_.kv_cache("k_cache", DType::kF16, {8, 16, 2, 16}).value();
  const TensorId v_cache = builder_.kv_cache("v_cache", DType::kF16, {8, 16, 2, 16}).value();
  const TensorId other = builder_.kv_cache("other", DType::kF16, {8, 16, 4, 8}).value();
  const TensorId float_slots = builder_.input("float_slots", DType::kF32, {kTokens}).value();
  snapshot();
  expect_rejected(builder_.kv_cache_write(kv, kv, positions_, k_cache, k_cache, "w"),
                  "same tensor");
  expect_rejected(builder_.kv_cache_write(kv, kv, positions_, k_cache, other, "w"), "the KV heads");
  expect_rejected(builder_.kv_cache_write(kv, kv, float_slots, k_cache, v_cache, "w"),
                  "slot mapping");
  expect_rejected(builder_.kv_cache_write(hidden_, hidden_, positions_, k_cache, v_cache, "w"),
                  "kv_heads * head_dim");
  EXPECT_TRUE(builder_.kv_cache_write(kv, kv, positions_, k_cache, v_cache, "w").ok());
  EXPECT_TRUE(builder_.graph().op(OpId(builder_.graph().num_ops() - 1)).outputs.empty());
}

TEST_F(BuilderTest, EmbeddingRejectsNonIntegerIdsAndIntegerOutputs) {
  snapshot();
  expect_rejected(builder_.embedding(hidden_, table_, "e").status(), "token ids 'hidden' is f32");
  expect_rejected(builder_.embedding(x_, table_, "e", DType::kI32).status(), "output dtype i32");
}

TEST_F(BuilderTest, RejectsDuplicateNamesUnknownIdsAndBadShapes) {
  snapshot();
  const Status duplicate = builder_.silu(hidden_, "hidden").status();
  EXPECT_EQ(duplicate.code(), StatusCode::kAlreadyExists) << duplicate.to_string();
  expect_rejected(builder_.silu(TensorId(999), "s").status(), "not a tensor of this graph");
  expect_rejected(builder_.weight("zero", DType::kF32, {0, 4}).status(), "non-positive");
  expect_rejected(builder_.weight("q", DType::kQ4_0, {4, 40}).status(), "multiple of 32");
  EXPECT_EQ(builder_.weight("table", DType::kF32, {4}).status().code(), StatusCode::kAlreadyExists);
}

TEST_F(BuilderTest, OnlyActivationsBecomeOutputs) {
  snapshot();
  expect_rejected(builder_.mark_output(table_), "only an activation");
  ASSERT_TRUE(builder_.mark_output(hidden_).ok());
  EXPECT_EQ(builder_.graph().tensor(hidden_).residency, Residency::kOutput);
  EXPECT_FALSE(builder_.mark_output(hidden_).ok());
}

TEST_F(BuilderTest, FinishVerifiesAndResetsTheBuilder) {
  ASSERT_TRUE(builder_.silu(hidden_, "y").ok());
  Result<Graph> graph = builder_.finish();
  ASSERT_TRUE(graph.ok()) << graph.status().to_string();
  EXPECT_EQ(graph->num_ops(), 2);
  EXPECT_TRUE(verify(*graph).ok());
  EXPECT_EQ(builder_.graph().num_ops(), 0);
  EXPECT_EQ(builder_.graph().num_tensors(), 0);
}

}  // namespace
}  // namespace folio::ir
