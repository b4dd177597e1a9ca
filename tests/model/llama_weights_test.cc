// Writing trained weights (make_llama_writer, behind `folio make-model --from-weights`): the
// tensors of a random f32 model, given back as trained weights, must produce exactly the tensor
// bytes the random-model writer produces for each weight dtype (both convert f32 rows with
// tensor/'s quantizers), the shape and vocabulary must read back, and bad input must be refused
// with a message naming the problem.
#include <cmath>
#include <cstring>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/quantize.h"
#include "folio/tokenizer/tokenizer.h"
#include "testing/llama_shapes.h"

namespace folio::model {
namespace {

using ::testing::HasSubstr;

LlamaShape test_shape(DType dtype) {
  return folio::testing::small_llama_shape(dtype, 320);
}

gguf::GgufFile parse(const gguf::GgufWriter& writer) {
  Result<std::vector<uint8_t>> bytes = writer.write_to_buffer();
  FOLIO_CHECK(bytes.ok(), "{}", bytes.status().to_string());
  Result<gguf::GgufFile> file = gguf::GgufFile::parse_owned(std::move(*bytes));
  FOLIO_CHECK(file.ok(), "{}", file.status().to_string());
  return std::move(*file);
}

// The random f32 model of `shape` as trained weights (every tensor's f32 values).
LlamaWeights random_weights(const LlamaShape& shape, uint64_t seed) {
  LlamaShape f32_shape = shape;
  f32_shape.weight_dtype = DType::kF32;
  const gguf::GgufFile file = parse(*make_random_llama_writer(f32_shape, seed));
  LlamaWeights weights;
  weights.shape = shape;
  weights.name = "trained test model";
  weights.vocabulary = *tokenizer::read_vocabulary(file);
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    const std::span<const std::byte> bytes = file.tensor_bytes(info);
    std::vector<float> values(static_cast<size_t>(info.element_count));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    weights.tensors.emplace(info.name, std::move(values));
  }
  return weights;
}

class LlamaWeightsDtypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(LlamaWeightsDtypeTest, TensorsMatchTheRandomWriterForTheSameValues) {
  const LlamaShape shape = test_shape(GetParam());
  const gguf::GgufFile expected = parse(*make_random_llama_writer(shape, 5));
  Result<gguf::GgufWriter> writer = make_llama_writer(random_weights(shape, 5));
  ASSERT_TRUE(writer.ok()) << writer.status().to_string();
  const gguf::GgufFile written = parse(*writer);

  ASSERT_EQ(written.tensors().size(), expected.tensors().size());
  for (const gguf::GgufTensorInfo& info : expected.tensors()) {
    SCOPED_TRACE(info.name);
    const gguf::GgufTensorInfo* actual = written.find_tensor(info.name);
    ASSERT_NE(actual, nullptr);
    EXPECT_EQ(actual->dimensions, info.dimensions);
    EXPECT_EQ(actual->type.name, info.type.name);
    const auto expected_bytes = expected.tensor_bytes(info);
    const auto actual_bytes = written.tensor_bytes(*actual);
    ASSERT_EQ(actual_bytes.size(), expected_bytes.size());
    EXPECT_EQ(std::memcmp(actual_bytes.data(), expected_bytes.data(), expected_bytes.size()), 0);
  }
  Result<LlamaShape> read_back = read_llama_shape(written);
  ASSERT_TRUE(read_back.ok()) << read_back.status().to_string();
  EXPECT_EQ(*read_back, shape);
  EXPECT_EQ(*written.get_string("general.name"), "trained test model");
  EXPECT_FALSE(written.contains("folio.random_seed"));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LlamaWeightsDtypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0,
                                           DType::kQ4_0),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(LlamaWeightsTest, WritesTheGivenVocabulary) {
  LlamaWeights weights = random_weights(test_shape(DType::kF16), 6);
  weights.vocabulary.add_space_prefix = false;
  weights.vocabulary.tokens[300] = "▁lighthouse";
  const gguf::GgufFile written = parse(*make_llama_writer(weights));
  Result<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_gguf(written);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_FALSE(tokenizer->vocabulary().add_space_prefix);
  EXPECT_EQ(tokenizer->find_piece("▁lighthouse"), 300);
  EXPECT_EQ(*tokenizer->decode(tokenizer->encode("a lighthouse")), "a lighthouse");
}

Status writer_status(const LlamaWeights& weights) {
  return make_llama_writer(weights).status();
}

TEST(LlamaWeightsTest, RefusesBadInputNamingTheProblem) {
  const LlamaWeights good = random_weights(test_shape(DType::kQ8_0), 7);
  ASSERT_TRUE(writer_status(good).ok());

  LlamaWeights missing = good;
  missing.tensors.erase("blk.1.ffn_up.weight");
  EXPECT_THAT(writer_status(missing).message(), HasSubstr("blk.1.ffn_up.weight is missing"));

  LlamaWeights extra = good;
  extra.tensors["blk.2.attn_q.weight"] = {1.0f};
  EXPECT_THAT(writer_status(extra).message(), HasSubstr("blk.2.attn_q.weight is not part"));

  LlamaWeights short_tensor = good;
  short_tensor.tensors["output_norm.weight"].pop_back();
  EXPECT_THAT(writer_status(short_tensor).message(),
              HasSubstr("output_norm.weight has 63 values, its shape [64] needs 64"));

  LlamaWeights not_finite = good;
  not_finite.tensors["blk.0.attn_k.weight"][17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(writer_status(not_finite).message(),
              HasSubstr("blk.0.attn_k.weight has a non-finite value"));

  LlamaWeights wrong_vocabulary = good;
  wrong_vocabulary.shape.vocab_size = 384;
  EXPECT_THAT(writer_status(wrong_vocabulary).message(), HasSubstr("vocabulary has 320 tokens"));

  LlamaWeights bad_shape = good;
  bad_shape.shape.ffn_size = 100;  // not a multiple of the q8_0 block
  EXPECT_EQ(writer_status(bad_shape).code(), StatusCode::kInvalidArgument);

  LlamaWeights bad_vocabulary = good;
  bad_vocabulary.vocabulary.scores.pop_back();
  EXPECT_EQ(writer_status(bad_vocabulary).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace folio::model
