// Gemma 2 and Gemma 3 files and graphs: llama.cpp's tensor list and keys, its defaults for keys
// a file leaves out, what Folio refuses naming the key or tensor, and the per-layer attention
// (local and global layers, Gemma 3's local RoPE base, soft caps) the step graph emits. Logits
// against the PyTorch reference: llama_forward_test.cc (gemma2_f16, gemma3_f16).
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_attention_metadata.h"
#include "folio/model/llama_graph.h"
#include "folio/model/llama_model_file.h"
#include "testing/llama_shapes.h"

namespace folio::model {
namespace {

using ::testing::HasSubstr;

LlamaShape gemma_shape(LlamaArchitecture architecture) {
  LlamaShape shape = folio::testing::small_llama_shape(DType::kF16, 300);
  shape.architecture = architecture;
  shape.tie_embeddings = true;
  shape.key_length = 32;
  shape.sliding_window = 6;
  if (architecture == LlamaArchitecture::kGemma2) {
    shape.attention_logit_soft_cap = 50.0f;
    shape.final_logit_soft_cap = 30.0f;
  } else {
    shape.num_layers = 7;
    shape.rope_theta = 1e6f;
  }
  return shape;
}

std::vector<uint8_t> model_bytes(const LlamaShape& shape) {
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 5);
  FOLIO_CHECK(writer.ok(), "{}", writer.status().to_string());
  return *writer->write_to_buffer();
}

// The file of `bytes` without the keys `dropped`, with `set` applied and one more f32 tensor
// `extra_tensor` when it is not empty: what another converter might have written.
Result<LlamaShape> read_rewritten(const std::vector<uint8_t>& bytes,
                                  const std::set<std::string>& dropped,
                                  void (*set)(gguf::GgufWriter&) = nullptr,
                                  const std::string& extra_tensor = "") {
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  gguf::GgufWriter writer;
  for (const gguf::GgufKeyValue& entry : file.metadata()) {
    if (!dropped.contains(entry.key)) writer.set(entry.key, entry.value);
  }
  if (set != nullptr) set(writer);
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    const gguf::GgufTensor tensor = *file.tensor(info.name);
    FOLIO_RETURN_IF_ERROR(
        writer.add_tensor_bytes(info.name, tensor.dtype, info.dimensions,
                                std::vector<std::byte>(tensor.data.begin(), tensor.data.end())));
  }
  if (!extra_tensor.empty()) {
    FOLIO_RETURN_IF_ERROR(writer.add_tensor_bytes(extra_tensor, DType::kF32, {64},
                                                  std::vector<std::byte>(64 * sizeof(float))));
  }
  return read_llama_shape(*gguf::GgufFile::parse_owned(*writer.write_to_buffer()));
}

TEST(GemmaModelFileTest, Gemma2HasPostNormsSoftCapsAndATiedOutput) {
  const LlamaShape shape = gemma_shape(LlamaArchitecture::kGemma2);
  const std::vector<uint8_t> bytes = model_bytes(shape);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(*file.get_string("general.architecture"), "gemma2");
  EXPECT_EQ(*file.get_floating("gemma2.attn_logit_softcapping"), 50.0);
  EXPECT_EQ(*file.get_floating("gemma2.final_logit_softcapping"), 30.0);
  EXPECT_EQ(*file.get_integer("gemma2.attention.sliding_window"), 6);
  for (const char* name : {"blk.1.post_attention_norm.weight", "blk.1.post_ffw_norm.weight"}) {
    ASSERT_NE(file.find_tensor(name), nullptr) << name;
    EXPECT_EQ(file.find_tensor(name)->dimensions, std::vector<int64_t>{64});
  }
  EXPECT_EQ(file.find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ(file.find_tensor("output.weight"), nullptr);
  int64_t parameters = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) parameters += info.element_count;
  EXPECT_EQ(parameters, shape.parameter_count());
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
}

TEST(GemmaModelFileTest, Gemma3HasQueryKeyNormsAndNoAttentionSoftCap) {
  LlamaShape shape = gemma_shape(LlamaArchitecture::kGemma3);
  shape.rope_scaling.kind = ir::RopeScalingKind::kLinear;
  shape.rope_scaling.factor = 8.0f;
  const std::vector<uint8_t> bytes = model_bytes(shape);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(file.find_tensor("blk.6.attn_k_norm.weight")->dimensions, std::vector<int64_t>{32});
  EXPECT_NE(file.find_tensor("blk.6.post_ffw_norm.weight"), nullptr);
  EXPECT_FALSE(file.contains("gemma3.attn_logit_softcapping"));
  EXPECT_FALSE(file.contains("gemma3.final_logit_softcapping"));
  int64_t parameters = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) parameters += info.element_count;
  EXPECT_EQ(parameters, shape.parameter_count());
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
  // An optional final cap is written and read back.
  shape.final_logit_soft_cap = 20.0f;
  read = read_llama_shape(*gguf::GgufFile::parse(model_bytes(shape)));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
}

TEST(GemmaModelFileTest, KeysAFileLeavesOutTakeLlamaCppDefaults) {
  const std::vector<uint8_t> gemma2 = model_bytes(gemma_shape(LlamaArchitecture::kGemma2));
  Result<LlamaShape> read =
      read_rewritten(gemma2, {"gemma2.attn_logit_softcapping", "gemma2.final_logit_softcapping",
                              "gemma2.attention.sliding_window"});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->attention_logit_soft_cap, 50.0f);
  EXPECT_EQ(read->final_logit_soft_cap, 30.0f);
  EXPECT_EQ(read->sliding_window, 4096);
  // Gemma 3 without a window: every layer global (llama.cpp's swa_type none).
  const std::vector<uint8_t> gemma3 = model_bytes(gemma_shape(LlamaArchitecture::kGemma3));
  read = read_rewritten(gemma3, {"gemma3.attention.sliding_window"});
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->sliding_window, 0);
  EXPECT_EQ(read->final_logit_soft_cap, 0.0f);
  // The fixed keys llama.cpp does not read are accepted with the values it fixes.
  EXPECT_TRUE(read_rewritten(gemma3, {}, [](gguf::GgufWriter& writer) {
                writer.set("gemma3.attention.sliding_window_pattern",
                           gguf::GgufValue::of<uint32_t>(6));
                writer.set("gemma3.rope.freq_base_swa", gguf::GgufValue::of(10000.0f));
              }).ok());
  for (int64_t layer = 0; layer < read->num_layers; ++layer) {
    EXPECT_FALSE(read->is_sliding_window_layer(layer)) << layer;
  }
}

TEST(GemmaModelFileTest, WhatFolioDoesNotImplementIsRefusedNamingTheKeyOrTensor) {
  const std::vector<uint8_t> gemma2 = model_bytes(gemma_shape(LlamaArchitecture::kGemma2));
  const std::vector<uint8_t> gemma3 = model_bytes(gemma_shape(LlamaArchitecture::kGemma3));
  struct Case {
    Result<LlamaShape> read;
    const char* message;
  };
  const Case cases[] = {
      {read_rewritten(gemma3, {},
                      [](gguf::GgufWriter& writer) {
                        writer.set("gemma3.attn_logit_softcapping", gguf::GgufValue::of(50.0f));
                      }),
       "gemma3.attn_logit_softcapping is set"},
      {read_rewritten(gemma2, {},
                      [](gguf::GgufWriter& writer) {
                        writer.set("gemma2.final_logit_softcapping", gguf::GgufValue::of(0.0f));
                      }),
       "gemma2.final_logit_softcapping = 0 must be positive"},
      // Gemma 3's vision tower (a multimodal file) is not part of the text model.
      {read_rewritten(gemma3, {}, nullptr, "v.blk.0.attn_norm.weight"),
       "tensor v.blk.0.attn_norm.weight is not part of a gemma3 model"},
      {read_rewritten(gemma2, {}, nullptr, "output.weight"), "output.weight"},
      {read_rewritten(gemma3, {},
                      [](gguf::GgufWriter& writer) {
                        writer.set("gemma3.attention.sliding_window_pattern",
                                   gguf::GgufValue::of<uint32_t>(4));
                      }),
       "gemma3.attention.sliding_window_pattern is not 6"},
      {read_rewritten(gemma3, {},
                      [](gguf::GgufWriter& writer) {
                        writer.set("gemma3.rope.freq_base_swa", gguf::GgufValue::of(5e5f));
                      }),
       "gemma3.rope.freq_base_swa = 500000"},
      {read_rewritten(gemma2, {}, nullptr, "rope_freqs.weight"), "rope_freqs.weight"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.read.status().code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(c.read.status().message(), HasSubstr(c.message));
  }
}

TEST(GemmaModelFileTest, InvalidGemmaShapesAreRejectedNamingTheField) {
  LlamaShape shape = gemma_shape(LlamaArchitecture::kGemma2);
  shape.attention_logit_soft_cap = 0;
  EXPECT_THAT(validate_llama_shape(shape).message(), HasSubstr("attention_logit_soft_cap"));
  shape = gemma_shape(LlamaArchitecture::kGemma2);
  shape.sliding_window = 0;
  EXPECT_THAT(validate_llama_shape(shape).message(), HasSubstr("sliding_window"));
  shape = gemma_shape(LlamaArchitecture::kGemma3);
  shape.attention_logit_soft_cap = 50;
  EXPECT_THAT(validate_llama_shape(shape).message(), HasSubstr("gemma3 attention is not"));
  shape = gemma_shape(LlamaArchitecture::kGemma3);
  shape.tie_embeddings = false;
  EXPECT_THAT(validate_llama_shape(shape).message(), HasSubstr("output.weight"));
  shape = folio::testing::small_llama_shape(DType::kF32, 300);
  shape.final_logit_soft_cap = 30;
  EXPECT_THAT(validate_llama_shape(shape).message(), HasSubstr("soft caps are Gemma's"));
  shape.final_logit_soft_cap = std::nanf("");
  EXPECT_FALSE(validate_llama_shape(shape).ok());
}

TEST(GemmaModelFileTest, LocalLayersFollowLlamaCppsPatternAndTheScaleItsModelSizes) {
  const LlamaShape gemma2 = gemma_shape(LlamaArchitecture::kGemma2);
  EXPECT_TRUE(gemma2.is_sliding_window_layer(0));
  EXPECT_FALSE(gemma2.is_sliding_window_layer(1));
  EXPECT_TRUE(gemma2.is_sliding_window_layer(40));
  const LlamaShape gemma3 = gemma_shape(LlamaArchitecture::kGemma3);
  for (int64_t layer = 0; layer < 12; ++layer) {
    EXPECT_EQ(gemma3.is_sliding_window_layer(layer), layer % 6 != 5) << layer;
  }
  LlamaShape mistral = folio::testing::small_llama_shape(DType::kF32, 300);
  mistral.sliding_window = 8;
  EXPECT_TRUE(mistral.is_sliding_window_layer(1));
  // 1 / sqrt(head_dim), but hidden / heads for the 27B models (46 gemma2, 62 gemma3 layers).
  EXPECT_FLOAT_EQ(gemma2.attention_scale(), 1.0f / std::sqrt(32.0f));
  LlamaShape large = gemma2;
  large.num_layers = 46;
  EXPECT_FLOAT_EQ(large.attention_scale(), 1.0f / std::sqrt(16.0f));
  large.architecture = LlamaArchitecture::kGemma3;
  EXPECT_FLOAT_EQ(large.attention_scale(), 1.0f / std::sqrt(32.0f));
  large.num_layers = 62;
  EXPECT_FLOAT_EQ(large.attention_scale(), 1.0f / std::sqrt(16.0f));
}

// The graph's attention and RoPE attributes per layer, and the Gemma-only ops.
class GemmaGraphTest : public ::testing::Test {
 protected:
  static ir::Graph build(const LlamaShape& shape) {
    const ir::StepShape step{4, 2, 2, ir::StepPhase::kPrefill};
    const ir::KvCacheShape cache{llama_kv_cache_geometry(shape, 16, DType::kF32), 8, 4};
    Result<ir::Graph> graph = build_llama_step_graph(shape, step, cache);
    FOLIO_CHECK(graph.ok(), "{}", graph.status().to_string());
    return std::move(*graph);
  }
  static const ir::Op& op_named(const ir::Graph& graph, const std::string& name) {
    for (const ir::Op& op : graph.ops()) {
      if (op.name == name) return op;
    }
    FOLIO_CHECK(false, "no op {}", name);
    return graph.ops().front();
  }
};

TEST_F(GemmaGraphTest, Gemma3LocalLayersSlideWithTheLocalRopeBaseAndGlobalOnesScale) {
  LlamaShape shape = gemma_shape(LlamaArchitecture::kGemma3);
  shape.rope_scaling.kind = ir::RopeScalingKind::kLinear;
  shape.rope_scaling.factor = 8.0f;
  const ir::Graph graph = build(shape);
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    const bool global = layer % 6 == 5;
    const auto& attention = std::get<ir::AttentionAttributes>(
        op_named(graph, fmt::format("blk.{}.attention", layer)).attributes);
    EXPECT_EQ(attention.sliding_window, global ? 0 : 6) << layer;
    EXPECT_EQ(attention.logit_soft_cap, 0.0f);
    for (const char* rope_op : {"q_rope", "k_rope"}) {
      const auto& rope = std::get<ir::RopeAttributes>(
          op_named(graph, fmt::format("blk.{}.{}", layer, rope_op)).attributes);
      EXPECT_EQ(rope.theta, global ? 1e6f : 10000.0f) << layer;
      EXPECT_EQ(rope.scaling.kind,
                global ? ir::RopeScalingKind::kLinear : ir::RopeScalingKind::kNone)
          << layer;
    }
  }
  EXPECT_EQ(std::get<ir::ScaleAttributes>(op_named(graph, "embed_scale").attributes).factor, 8.0f);
  EXPECT_EQ(op_named(graph, "blk.0.ffn_geglu").kind, ir::OpKind::kGeGlu);
  // No final cap: the LM head's matmul is the output.
  EXPECT_EQ(op_named(graph, std::string(ir::kOutputLogits)).kind, ir::OpKind::kMatMul);
}

TEST_F(GemmaGraphTest, Gemma2CapsAttentionScoresAndLogits) {
  const LlamaShape shape = gemma_shape(LlamaArchitecture::kGemma2);
  const ir::Graph graph = build(shape);
  const auto& local =
      std::get<ir::AttentionAttributes>(op_named(graph, "blk.0.attention").attributes);
  const auto& global =
      std::get<ir::AttentionAttributes>(op_named(graph, "blk.1.attention").attributes);
  EXPECT_EQ(local.sliding_window, 6);
  EXPECT_EQ(global.sliding_window, 0);
  EXPECT_EQ(local.logit_soft_cap, 50.0f);
  EXPECT_EQ(std::get<ir::RopeAttributes>(op_named(graph, "blk.0.q_rope").attributes).theta,
            shape.rope_theta);
  const ir::Op& logits = op_named(graph, std::string(ir::kOutputLogits));
  EXPECT_EQ(logits.kind, ir::OpKind::kSoftCap);
  EXPECT_EQ(std::get<ir::SoftCapAttributes>(logits.attributes).cap, 30.0f);
  EXPECT_EQ(op_named(graph, "blk.1.post_ffw_norm").kind, ir::OpKind::kRmsNorm);
}

}  // namespace
}  // namespace folio::model
