// Generated Llama model files: deterministic bytes for a seed, llama.cpp's tensor names and
// shapes, well-conditioned values, ggml-exact quantization, and a shape that reads back.
#include "folio/model/llama_model_file.h"

#include <algorithm>
#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/base/random.h"
#include "folio/gguf/gguf_file.h"
#include "folio/tensor/quantize.h"
#include "folio/tokenizer/tokenizer.h"
#include "testing/llama_shapes.h"

namespace folio::model {
namespace {

using ::testing::HasSubstr;

std::vector<uint8_t> model_bytes(const LlamaShape& shape, uint64_t seed) {
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, seed);
  FOLIO_CHECK(writer.ok(), "{}", writer.status().to_string());
  return *writer->write_to_buffer();
}

LlamaShape small_shape(DType dtype) {
  return folio::testing::small_llama_shape(dtype, 300);
}

std::vector<float> tensor_as_f32(const gguf::GgufFile& file, std::string_view name) {
  const gguf::GgufTensor tensor = *file.tensor(name);
  const int64_t row_length = tensor.info->dimensions[0];
  const int64_t rows = tensor.info->element_count / row_length;
  std::vector<float> values(static_cast<size_t>(tensor.info->element_count));
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(tensor.dtype, tensor.data.data() + r * row_bytes(tensor.dtype, row_length),
                   values.data() + r * row_length, row_length);
  }
  return values;
}

TEST(DeterministicRandomTest, SplitMixMatchesTheReferenceOutput) {
  EXPECT_EQ(SplitMix64(0).next(), 0xe220a8397b1dcdafull);  // splitmix64.c's first output for 0
}

TEST(DeterministicRandomTest, ApproximatelyNormalHasUnitMomentsAndBoundedRange) {
  Xoshiro256StarStar random(7);
  constexpr int kSamples = 200000;
  double sum = 0, sum_of_squares = 0, largest = 0;
  for (int i = 0; i < kSamples; ++i) {
    const double value = approximately_normal(random);
    sum += value;
    sum_of_squares += value * value;
    largest = std::max(largest, std::fabs(value));
  }
  EXPECT_NEAR(sum / kSamples, 0.0, 0.01);
  EXPECT_NEAR(sum_of_squares / kSamples, 1.0, 0.02);
  EXPECT_LE(largest, 2 * std::sqrt(3.0));
}

TEST(LlamaModelFileTest, SameSeedGivesIdenticalBytesAndOtherSeedsDiffer) {
  for (DType dtype : {DType::kF32, DType::kQ4_0}) {
    const LlamaShape shape = small_shape(dtype);
    const std::vector<uint8_t> first = model_bytes(shape, 42);
    EXPECT_EQ(first, model_bytes(shape, 42));
    const std::vector<uint8_t> other = model_bytes(shape, 43);
    ASSERT_EQ(first.size(), other.size());  // same layout, different weights
    EXPECT_NE(first, other);
    const gguf::GgufFile a = *gguf::GgufFile::parse(first);
    const gguf::GgufFile b = *gguf::GgufFile::parse(other);
    for (const gguf::GgufTensorInfo& info : a.tensors()) {
      const auto bytes_a = a.tensor_bytes(info);
      const auto bytes_b = b.tensor_bytes(*b.find_tensor(info.name));
      EXPECT_FALSE(std::equal(bytes_a.begin(), bytes_a.end(), bytes_b.begin())) << info.name;
    }
  }
}

TEST(LlamaModelFileTest, TensorsHaveLlamaCppNamesShapesAndTypes) {
  LlamaShape shape = small_shape(DType::kQ8_0);
  const std::vector<uint8_t> bytes = model_bytes(shape, 1);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  struct Expected {
    std::string name;
    std::vector<int64_t> dimensions;
    DType dtype;
  };
  std::vector<Expected> expected = {{"token_embd.weight", {64, 300}, DType::kQ8_0}};
  for (int layer = 0; layer < 2; ++layer) {
    const std::string p = fmt::format("blk.{}.", layer);
    expected.push_back({p + "attn_norm.weight", {64}, DType::kF32});
    expected.push_back({p + "attn_q.weight", {64, 64}, DType::kQ8_0});
    expected.push_back({p + "attn_k.weight", {64, 32}, DType::kQ8_0});
    expected.push_back({p + "attn_v.weight", {64, 32}, DType::kQ8_0});
    expected.push_back({p + "attn_output.weight", {64, 64}, DType::kQ8_0});
    expected.push_back({p + "ffn_norm.weight", {64}, DType::kF32});
    expected.push_back({p + "ffn_gate.weight", {64, 96}, DType::kQ8_0});
    expected.push_back({p + "ffn_up.weight", {64, 96}, DType::kQ8_0});
    expected.push_back({p + "ffn_down.weight", {96, 64}, DType::kQ8_0});
  }
  expected.push_back({"output_norm.weight", {64}, DType::kF32});
  expected.push_back({"output.weight", {64, 300}, DType::kQ8_0});
  ASSERT_EQ(file.tensors().size(), expected.size());
  int64_t parameters = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(file.tensors()[i].name, expected[i].name);
    EXPECT_EQ(file.tensors()[i].dimensions, expected[i].dimensions) << expected[i].name;
    EXPECT_EQ(file.tensor(expected[i].name)->dtype, expected[i].dtype) << expected[i].name;
    parameters += file.tensors()[i].element_count;
  }
  EXPECT_EQ(parameters, shape.parameter_count());
  EXPECT_EQ(*file.get_string("general.architecture"), "llama");
  EXPECT_EQ(*file.get<uint32_t>("general.file_type"), 7u);
  EXPECT_EQ(*file.get<uint32_t>("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(*file.get<uint64_t>("folio.random_seed"), 1u);
}

TEST(LlamaModelFileTest, TiedQwen2ModelHasBiasesAndNoOutputMatrix) {
  LlamaShape shape = small_shape(DType::kF16);
  shape.architecture = LlamaArchitecture::kQwen2;
  shape.tie_embeddings = true;
  shape.rope_theta = 1000000.0f;
  const std::vector<uint8_t> bytes = model_bytes(shape, 5);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(file.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(file.find_tensor("blk.1.attn_k.bias")->dimensions, std::vector<int64_t>{32});
  EXPECT_EQ(*file.get_floating("qwen2.rope.freq_base"), 1000000.0);
  int64_t parameters = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) parameters += info.element_count;
  EXPECT_EQ(parameters, shape.parameter_count());
}

// A shard file (issue 15's weight cache): the whole file's metadata, the shard keys and only the
// tensors of `names` (those of `extra` too, to break it).
std::vector<uint8_t> shard_bytes(const gguf::GgufFile& file, const LlamaShape& shape,
                                 const LlamaShard& shard, const std::vector<std::string>& names) {
  gguf::GgufWriter writer;
  for (const gguf::GgufKeyValue& entry : file.metadata()) writer.set(entry.key, entry.value);
  set_llama_shard_keys(writer, shape, shard);
  for (const std::string& name : names) {
    const gguf::GgufTensor tensor = *file.tensor(name);
    std::vector<std::byte> bytes(tensor.data.begin(), tensor.data.end());
    FOLIO_CHECK(
        writer.add_tensor_bytes(name, tensor.dtype, tensor.info->dimensions, std::move(bytes)).ok(),
        "{}", name);
  }
  return *writer.write_to_buffer();
}

TEST(LlamaModelFileTest, ShardFilesReadBackAsTheWholeShapeAndHoldOnlyTheirLayersTensors) {
  for (const LlamaArchitecture architecture :
       {LlamaArchitecture::kLlama, LlamaArchitecture::kQwen2, LlamaArchitecture::kPhi3}) {
    LlamaShape shape = small_shape(DType::kQ8_0);
    shape.architecture = architecture;
    shape.num_layers = 4;
    shape.tie_embeddings = architecture == LlamaArchitecture::kQwen2;
    const std::vector<uint8_t> bytes = model_bytes(shape, 9);
    const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
    const LlamaShape whole = *read_llama_shape(file);
    for (const LlamaShard shard : {LlamaShard{0, 1}, LlamaShard{1, 3}, LlamaShard{3, 4}}) {
      SCOPED_TRACE(fmt::format("{} [{}, {})", llama_architecture_name(architecture),
                               shard.first_layer, shard.end_layer));
      const std::vector<std::string> names = *llama_shard_tensor_names(whole, shard);
      for (const std::string& name : names) {
        EXPECT_NE(file.find_tensor(name), nullptr) << name;
        if (name.starts_with("blk.")) {
          const int64_t layer = std::stoll(name.substr(4));
          EXPECT_TRUE(layer >= shard.first_layer && layer < shard.end_layer) << name;
        }
      }
      const auto holds = [&](const std::string& name) {
        return std::find(names.begin(), names.end(), name) != names.end();
      };
      EXPECT_EQ(holds("token_embd.weight"),
                shard.first_layer == 0 || (shape.tie_embeddings && shard.end_layer == 4));
      EXPECT_EQ(holds("output_norm.weight"), shard.end_layer == 4);
      EXPECT_EQ(holds("output.weight"), !shape.tie_embeddings && shard.end_layer == 4);
      if (architecture == LlamaArchitecture::kPhi3) {
        EXPECT_TRUE(holds(fmt::format("blk.{}.attn_qkv.weight", shard.first_layer)));
      }

      const std::vector<uint8_t> shard_file = shard_bytes(file, whole, shard, names);
      const gguf::GgufFile parsed = *gguf::GgufFile::parse(shard_file);
      const Result<LlamaShape> read = read_llama_shape(parsed);
      ASSERT_TRUE(read.ok()) << read.status();
      EXPECT_EQ(*read, whole);
      const std::optional<LlamaShard> keys = *read_llama_shard(parsed);
      ASSERT_TRUE(keys.has_value());
      EXPECT_EQ(keys->first_layer, shard.first_layer);
      EXPECT_EQ(keys->end_layer, shard.end_layer);

      // One tensor short, or one of another layer too: refused, naming it.
      std::vector<std::string> missing = names;
      const std::string dropped = fmt::format("blk.{}.ffn_down.weight", shard.first_layer);
      std::erase(missing, dropped);
      const std::vector<uint8_t> short_file = shard_bytes(file, whole, shard, missing);
      const Result<LlamaShape> refused = read_llama_shape(*gguf::GgufFile::parse(short_file));
      ASSERT_FALSE(refused.ok());
      EXPECT_THAT(std::string(refused.status().message()), HasSubstr(dropped));
      std::vector<std::string> foreign = names;
      const std::string other =
          fmt::format("blk.{}.ffn_norm.weight", shard.first_layer == 0 ? 3 : 0);
      foreign.push_back(other);
      const std::vector<uint8_t> foreign_file = shard_bytes(file, whole, shard, foreign);
      const Result<LlamaShape> extra = read_llama_shape(*gguf::GgufFile::parse(foreign_file));
      ASSERT_FALSE(extra.ok());
      EXPECT_THAT(std::string(extra.status().message()), HasSubstr(other));
    }
  }
  EXPECT_FALSE(llama_shard_tensor_names(small_shape(DType::kF32), LlamaShard{1, 1}).ok());
}

TEST(LlamaModelFileTest, Qwen3ModelHasPerHeadQueryKeyNormsAndNoBiases) {
  LlamaShape shape = small_shape(DType::kF16);
  shape.architecture = LlamaArchitecture::kQwen3;
  shape.key_length = 32;
  const std::vector<uint8_t> bytes = model_bytes(shape, 5);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(*file.get_string("general.architecture"), "qwen3");
  EXPECT_EQ(file.find_tensor("blk.1.attn_q_norm.weight")->dimensions, std::vector<int64_t>{32});
  EXPECT_EQ(file.find_tensor("blk.1.attn_k_norm.weight")->dimensions, std::vector<int64_t>{32});
  EXPECT_EQ(file.tensor("blk.1.attn_k_norm.weight")->dtype, DType::kF32);
  EXPECT_EQ(file.find_tensor("blk.0.attn_q.bias"), nullptr);
  int64_t parameters = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) parameters += info.element_count;
  EXPECT_EQ(parameters, shape.parameter_count());
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
}

TEST(LlamaModelFileTest, Phi3ModelFusesQkvAndGateUpAndLocatesEachProjection) {
  LlamaShape shape = small_shape(DType::kQ8_0);
  shape.architecture = LlamaArchitecture::kPhi3;
  shape.tensor_dtypes = {{"blk.1.attn_qkv.weight", DType::kF16}};
  const std::vector<uint8_t> bytes = model_bytes(shape, 5);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  // q 64 + k 32 + v 32 rows; gate 96 + up 96 rows.
  EXPECT_EQ(file.find_tensor("blk.0.attn_qkv.weight")->dimensions, (std::vector<int64_t>{64, 128}));
  EXPECT_EQ(file.find_tensor("blk.0.ffn_up.weight")->dimensions, (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(file.find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(file.find_tensor("blk.0.ffn_gate.weight"), nullptr);
  int64_t parameters = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) parameters += info.element_count;
  EXPECT_EQ(parameters, shape.parameter_count());
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
  EXPECT_EQ(read->matrix_dtype("blk.1.attn_v.weight"), DType::kF16);
  EXPECT_EQ(read->matrix_dtype("blk.0.attn_v.weight"), DType::kQ8_0);
  struct Expected {
    const char* name;
    const char* tensor;
    int64_t first_row, rows;
  };
  for (const Expected& e : {Expected{"blk.1.attn_q.weight", "blk.1.attn_qkv.weight", 0, 64},
                            Expected{"blk.1.attn_k.weight", "blk.1.attn_qkv.weight", 64, 32},
                            Expected{"blk.1.attn_v.weight", "blk.1.attn_qkv.weight", 96, 32},
                            Expected{"blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", 0, 96},
                            Expected{"blk.0.ffn_up.weight", "blk.0.ffn_up.weight", 96, 96},
                            Expected{"blk.0.ffn_down.weight", "blk.0.ffn_down.weight", 0, 0}}) {
    const LlamaMatrixLocation location = llama_matrix_location(shape, e.name);
    EXPECT_EQ(location.tensor, e.tensor) << e.name;
    EXPECT_EQ(location.first_row, e.first_row) << e.name;
    EXPECT_EQ(location.rows, e.rows) << e.name;
  }
}

TEST(LlamaModelFileTest, ShapeReadsBackForEveryDtypeAndArchitecture) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (bool qwen2 : {false, true}) {
      LlamaShape shape = small_shape(dtype);
      shape.architecture = qwen2 ? LlamaArchitecture::kQwen2 : LlamaArchitecture::kLlama;
      shape.tie_embeddings = qwen2;
      shape.rms_norm_epsilon = 1e-6f;
      const std::vector<uint8_t> bytes = model_bytes(shape, 9);
      Result<LlamaShape> read = read_llama_shape(*gguf::GgufFile::parse(bytes));
      ASSERT_TRUE(read.ok()) << read.status().to_string();
      EXPECT_EQ(*read, shape) << dtype_name(dtype) << (qwen2 ? " qwen2" : " llama");
    }
  }
}

TEST(LlamaModelFileTest, MixedDtypesAreWrittenAndReadBackPerTensor) {
  LlamaShape shape = small_shape(DType::kQ4_0);
  shape.tensor_dtypes = {{"output.weight", DType::kQ8_0},
                         {"blk.1.attn_v.weight", DType::kF16},
                         {"blk.0.ffn_down.weight", DType::kF32}};
  const std::vector<uint8_t> bytes = model_bytes(shape, 4);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(file.tensor("output.weight")->dtype, DType::kQ8_0);
  EXPECT_EQ(file.tensor("blk.1.attn_v.weight")->dtype, DType::kF16);
  EXPECT_EQ(file.tensor("blk.0.attn_v.weight")->dtype, DType::kQ4_0);
  EXPECT_EQ(file.tensor("blk.0.ffn_down.weight")->dtype, DType::kF32);
  EXPECT_EQ(file.tensor("blk.0.ffn_norm.weight")->dtype, DType::kF32);
  EXPECT_EQ(*file.get<uint32_t>("general.file_type"), 2u);  // the weight dtype's, q4_0
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
}

TEST(LlamaModelFileTest, InvalidTensorDtypesAreRejectedNamingTheTensor) {
  LlamaShape shape = small_shape(DType::kF32);
  shape.tensor_dtypes = {{"blk.0.attn_norm.weight", DType::kF16}};
  EXPECT_THAT(validate_llama_shape(shape).message(),
              HasSubstr("blk.0.attn_norm.weight, which is no matrix"));
  shape.tensor_dtypes = {{"blk.7.attn_q.weight", DType::kF16}};
  EXPECT_THAT(validate_llama_shape(shape).message(), HasSubstr("blk.7.attn_q.weight"));
  shape.tensor_dtypes = {{"blk.1.ffn_up.weight", DType::kI32}};
  EXPECT_THAT(validate_llama_shape(shape).message(),
              HasSubstr("tensor blk.1.ffn_up.weight: dtype i32"));
  shape.ffn_size = 80;  // f32 is fine with any row length, q8_0 is not
  shape.tensor_dtypes = {{"blk.1.ffn_down.weight", DType::kQ8_0}};
  EXPECT_THAT(validate_llama_shape(shape).message(),
              HasSubstr("blk.1.ffn_down.weight has rows of 80 values; q8_0 weights need"));
}

// The bytes of a generated model rewritten tensor by tensor: `edit` may change a tensor's name,
// dtype or dimensions (its bytes are then zeros of the new size), or return false to drop it.
using TensorEdit = bool (*)(std::string& name, DType& dtype, std::vector<int64_t>& dimensions);
std::vector<uint8_t> edited_model(const std::vector<uint8_t>& bytes, TensorEdit edit) {
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  gguf::GgufWriter writer;
  for (const gguf::GgufKeyValue& entry : file.metadata()) writer.set(entry.key, entry.value);
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    std::string name = info.name;
    DType dtype = file.tensor(info.name)->dtype;
    std::vector<int64_t> dimensions = info.dimensions;
    if (!edit(name, dtype, dimensions)) continue;
    const std::span<const std::byte> original = file.tensor_bytes(info);
    std::vector<std::byte> data(original.begin(), original.end());
    if (name != info.name || dtype != file.tensor(info.name)->dtype ||
        dimensions != info.dimensions) {
      int64_t rows = 1;
      for (size_t d = 1; d < dimensions.size(); ++d) rows *= dimensions[d];
      data.assign(static_cast<size_t>(rows * row_bytes(dtype, dimensions[0])), std::byte{0});
    }
    FOLIO_CHECK(writer.add_tensor_bytes(name, dtype, dimensions, std::move(data)).ok());
  }
  return *writer.write_to_buffer();
}

TEST(LlamaModelFileTest, ReadingRefusesTensorsThatDoNotFitNamingThem) {
  const std::vector<uint8_t> bytes = model_bytes(small_shape(DType::kF16), 6);
  struct Case {
    TensorEdit edit;
    const char* message;
  };
  const Case cases[] = {
      {[](std::string& name, DType&, std::vector<int64_t>&) {
         return name != "blk.1.ffn_up.weight";
       },
       "tensor blk.1.ffn_up.weight is missing"},
      {[](std::string& name, DType&, std::vector<int64_t>& dimensions) {
         if (name == "blk.0.attn_k.weight") dimensions = {64, 64};
         return true;
       },
       "tensor blk.0.attn_k.weight has shape [64, 64], the model's metadata needs [64, 32]"},
      {[](std::string& name, DType& dtype, std::vector<int64_t>&) {
         if (name == "output_norm.weight") dtype = DType::kF16;
         return true;
       },
       "tensor output_norm.weight is f16; Folio reads norms and biases in f32"},
      {[](std::string& name, DType&, std::vector<int64_t>& dimensions) {
         // A mixture-of-experts file: the FFN's experts in one 3-D tensor.
         if (name == "blk.1.ffn_gate.weight") {
           name = "blk.1.ffn_gate_exps.weight";
           dimensions = {64, 96, 4};
         }
         return true;
       },
       "tensor blk.1.ffn_gate.weight is missing"},
      {[](std::string& name, DType&, std::vector<int64_t>&) {
         if (name == "blk.1.ffn_norm.weight") name = "blk.1.ffn_gate_inp.weight";
         return name != "blk.1.ffn_norm.weight";
       },
       "tensor blk.1.ffn_norm.weight is missing"},
  };
  for (const Case& c : cases) {
    const gguf::GgufFile file = *gguf::GgufFile::parse_owned(edited_model(bytes, c.edit), "m.gguf");
    const Status status = read_llama_shape(file).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
    EXPECT_THAT(status.message(), HasSubstr("m.gguf"));
  }
  // A tensor the architecture does not have, beside all those it has.
  Result<gguf::GgufWriter> writer = make_random_llama_writer(small_shape(DType::kF16), 6);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer
                  ->add_tensor_bytes("blk.0.ffn_gate_exps.weight", DType::kF32, {64, 96, 4},
                                     std::vector<std::byte>(64 * 96 * 4 * 4))
                  .ok());
  const gguf::GgufFile file = *gguf::GgufFile::parse_owned(*writer->write_to_buffer());
  EXPECT_THAT(read_llama_shape(file).status().message(),
              HasSubstr("tensor blk.0.ffn_gate_exps.weight is not part of a llama model"));
}

TEST(LlamaModelFileTest, HeadsWiderThanHiddenOverHeadsAreWrittenAndReadBack) {
  LlamaShape shape = small_shape(DType::kQ8_0);
  shape.architecture = LlamaArchitecture::kQwen2;
  shape.key_length = 48;  // 4 heads of 48 over a hidden size of 64
  const std::vector<uint8_t> bytes = model_bytes(shape, 8);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(file.find_tensor("blk.0.attn_q.weight")->dimensions, (std::vector<int64_t>{64, 192}));
  EXPECT_EQ(file.find_tensor("blk.0.attn_k.weight")->dimensions, (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(file.find_tensor("blk.0.attn_q.bias")->dimensions, std::vector<int64_t>{192});
  EXPECT_EQ(file.find_tensor("blk.0.attn_output.weight")->dimensions,
            (std::vector<int64_t>{192, 64}));
  EXPECT_EQ(*file.get<uint32_t>("qwen2.attention.key_length"), 48u);
  EXPECT_EQ(*file.get<uint32_t>("qwen2.attention.value_length"), 48u);
  EXPECT_EQ(*file.get<uint32_t>("qwen2.rope.dimension_count"), 48u);
  int64_t parameters = 0;
  for (const gguf::GgufTensorInfo& info : file.tensors()) parameters += info.element_count;
  EXPECT_EQ(parameters, shape.parameter_count());
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
  EXPECT_EQ(read->head_dim(), 48);
}

TEST(LlamaModelFileTest, ReadingRefusesHeadWidthsFolioCannotRunNamingTheKey) {
  struct Case {
    const char* key;
    uint32_t value;
    const char* message;
  };
  const Case cases[] = {
      {"llama.attention.value_length", 32,
       "llama.attention.key_length = 16 differs from llama.attention.value_length = 32"},
      {"llama.rope.dimension_count", 8, "llama.rope.dimension_count = 8 rotates part of each head"},
      {"llama.attention.key_length", 0, "llama.attention.key_length = 0 must be positive"},
  };
  for (const Case& c : cases) {
    Result<gguf::GgufWriter> writer = make_random_llama_writer(small_shape(DType::kF32), 3);
    ASSERT_TRUE(writer.ok());
    writer->set(c.key, gguf::GgufValue::of(c.value));
    const gguf::GgufFile file = *gguf::GgufFile::parse_owned(*writer->write_to_buffer());
    const Status status = read_llama_shape(file).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(LlamaModelFileTest, RopeScalingIsWrittenAndReadBackForEveryKind) {
  std::vector<LlamaShape> shapes(5, small_shape(DType::kF32));
  shapes[0].rope_scaling = {.kind = ir::RopeScalingKind::kLinear, .factor = 4.0f};
  shapes[1].rope_scaling = {.kind = ir::RopeScalingKind::kLlama3,
                            .factor = 8.0f,
                            .low_frequency_factor = 2.0f,
                            .high_frequency_factor = 6.0f,
                            .original_context_length = 64};
  shapes[2].rope_scaling = {.kind = ir::RopeScalingKind::kYarn,
                            .factor = 4.0f,
                            .original_context_length = 32,
                            .extrapolation_factor = 0.5f,
                            .attention_factor = 1.5f,
                            .beta_fast = 16.0f,
                            .beta_slow = 2.0f};
  shapes[3].rope_frequency_factors = true;
  shapes[4].rope_frequency_factors = true;
  shapes[4].rope_scaling = shapes[0].rope_scaling;
  for (const LlamaShape& shape : shapes) {
    const std::vector<uint8_t> bytes = model_bytes(shape, 10);
    const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
    Result<LlamaShape> read = read_llama_shape(file);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(*read, shape);
    EXPECT_EQ(file.find_tensor("rope_freqs.weight") != nullptr, shape.rope_frequency_factors);
  }
}

// A generated f32 model with metadata `edit`ed: the shape read back, or its error.
Result<LlamaShape> read_with_metadata(void (*edit)(gguf::GgufWriter& writer),
                                      bool rope_frequency_factors = false) {
  LlamaShape shape = small_shape(DType::kF32);
  shape.rope_frequency_factors = rope_frequency_factors;
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 3);
  FOLIO_CHECK(writer.ok());
  edit(*writer);
  const gguf::GgufFile file = *gguf::GgufFile::parse_owned(*writer->write_to_buffer());
  return read_llama_shape(file);
}

TEST(LlamaModelFileTest, RopeScalingKeysAreReadAsLlamaCppReadsThem) {
  // No type: linear, from rope.scaling.factor or the older rope.scale_linear.
  Result<LlamaShape> shape = read_with_metadata([](gguf::GgufWriter& writer) {
    writer.set("llama.rope.scale_linear", gguf::GgufValue::of(2.0f));
  });
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling.kind, ir::RopeScalingKind::kLinear);
  EXPECT_EQ(shape->rope_scaling.factor, 2.0f);
  // A factor of 1 scales nothing.
  shape = read_with_metadata([](gguf::GgufWriter& writer) {
    writer.set("llama.rope.scaling.factor", gguf::GgufValue::of(1.0f));
  });
  EXPECT_EQ(shape->rope_scaling.kind, ir::RopeScalingKind::kNone);
  // yarn's defaults: the model's context length, ext and attn factors 1, betas 32 and 1; the
  // older rope.scaling.attn_factor multiplies yarn_attn_factor.
  shape = read_with_metadata([](gguf::GgufWriter& writer) {
    writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("yarn"));
    writer.set("llama.rope.scaling.factor", gguf::GgufValue::of(4.0f));
    writer.set("llama.rope.scaling.attn_factor", gguf::GgufValue::of(0.5f));
  });
  ASSERT_TRUE(shape.ok()) << shape.status();
  const ir::RopeScaling yarn{.kind = ir::RopeScalingKind::kYarn,
                             .factor = 4.0f,
                             .original_context_length = 128,
                             .attention_factor = 0.5f};
  EXPECT_EQ(shape->rope_scaling, yarn);
  // Beside rope_freqs.weight, llama3 keys are the same factors: the tensor is used.
  shape = read_with_metadata(
      [](gguf::GgufWriter& writer) {
        writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("llama3"));
        writer.set("llama.rope.scaling.factor", gguf::GgufValue::of(8.0f));
      },
      /*rope_frequency_factors=*/true);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->rope_scaling.kind, ir::RopeScalingKind::kNone);
  EXPECT_TRUE(shape->rope_frequency_factors);
}

TEST(LlamaModelFileTest, RopeScalingFolioDoesNotImplementIsRefusedNamingTheKey) {
  struct Case {
    void (*edit)(gguf::GgufWriter& writer);
    bool rope_frequency_factors;
    const char* message;
  };
  const Case cases[] = {
      {[](gguf::GgufWriter& writer) {
         writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("longrope"));
       },
       false, "llama.rope.scaling.type = 'longrope' is not a RoPE scaling Folio implements"},
      {[](gguf::GgufWriter& writer) {
         writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("yarn"));
         writer.set("llama.rope.scaling.factor", gguf::GgufValue::of(4.0f));
         writer.set("llama.rope.scaling.yarn_log_multiplier", gguf::GgufValue::of(0.1f));
       },
       false, "llama.rope.scaling.yarn_log_multiplier (DeepSeek's YaRN) is not implemented"},
      {[](gguf::GgufWriter& writer) {
         writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("llama3"));
       },
       false, "llama.rope.scaling.type = 'llama3' needs llama.rope.scaling.factor"},
      {[](gguf::GgufWriter& writer) {
         writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("yarn"));
         writer.set("llama.rope.scaling.factor", gguf::GgufValue::of(4.0f));
       },
       true, "rope_freqs.weight with yarn RoPE scaling"},
      {[](gguf::GgufWriter& writer) {
         writer.set("llama.rope.scaling.type", gguf::GgufValue::of_string("llama3"));
         writer.set("llama.rope.scaling.factor", gguf::GgufValue::of(8.0f));
         writer.set("llama.rope.scaling.high_freq_factor", gguf::GgufValue::of(0.5f));
       },
       false, "llama3 RoPE scaling needs 0 < low_freq_factor (1) < high_freq_factor (0.5)"},
  };
  for (const Case& c : cases) {
    const Status status = read_with_metadata(c.edit, c.rope_frequency_factors).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(LlamaModelFileTest, SlidingWindowIsWrittenAndReadBack) {
  LlamaShape shape = small_shape(DType::kF32);
  shape.sliding_window = 4096;
  const std::vector<uint8_t> bytes = model_bytes(shape, 12);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  EXPECT_EQ(*file.get<uint32_t>("llama.attention.sliding_window"), 4096u);
  Result<LlamaShape> read = read_llama_shape(file);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, shape);
}

TEST(LlamaModelFileTest, MixtureOfExpertsIsRefusedNamingTheKey) {
  const Status status = read_with_metadata([](gguf::GgufWriter& writer) {
                          writer.set("llama.expert_count", gguf::GgufValue::of<uint32_t>(8));
                        }).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("llama.expert_count = 8: mixture-of-experts"));
  EXPECT_TRUE(read_with_metadata([](gguf::GgufWriter& writer) {
                writer.set("llama.expert_count", gguf::GgufValue::of<uint32_t>(0));
              }).ok());
}

// A corrupt layer count is refused before anything proportional to it is built (the GGUF fuzz
// run found a count of millions costing gigabytes).
TEST(LlamaModelFileTest, LayerCountAboveTheFilesTensorCountIsRefused) {
  const Status status = read_with_metadata([](gguf::GgufWriter& writer) {
                          writer.set("llama.block_count", gguf::GgufValue::of<uint32_t>(3'000'000));
                        }).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("llama.block_count is 3000000, but the file holds only"));
}

// Found by the GGUF fuzz run: a zero head count with rope.dimension_count divided by zero.
TEST(LlamaModelFileTest, ZeroHeadCountIsRefusedNamingTheKey) {
  const Status status =
      read_with_metadata([](gguf::GgufWriter& writer) {
        writer.set("llama.attention.head_count", gguf::GgufValue::of<uint32_t>(0));
        writer.set("llama.rope.dimension_count", gguf::GgufValue::of<uint32_t>(16));
      }).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("llama.attention.head_count = 0 must be positive"));
}

TEST(LlamaModelFileTest, ValuesAreWellConditioned) {
  LlamaShape shape = small_shape(DType::kF32);
  shape.hidden_size = 256;
  shape.ffn_size = 512;
  const std::vector<uint8_t> bytes = model_bytes(shape, 3);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    const std::vector<float> values = tensor_as_f32(file, info.name);
    double sum = 0, sum_of_squares = 0;
    for (float value : values) {
      sum += value;
      sum_of_squares += static_cast<double>(value) * value;
    }
    const double mean = sum / values.size();
    const double deviation = std::sqrt(sum_of_squares / values.size() - mean * mean);
    if (info.dimensions.size() == 1) {  // norm weights
      EXPECT_NEAR(mean, 1.0, 0.02) << info.name;
      EXPECT_NEAR(deviation, 0.05, 0.01) << info.name;
    } else {
      const double expected = 1.0 / std::sqrt(static_cast<double>(info.dimensions[0]));
      EXPECT_NEAR(mean, 0.0, 0.1 * expected) << info.name;
      EXPECT_NEAR(deviation, expected, 0.05 * expected) << info.name;
    }
  }
}

TEST(LlamaModelFileTest, QuantizedWeightsAreTheReferenceQuantizationOfTheF32Weights) {
  const std::vector<uint8_t> f32_bytes = model_bytes(small_shape(DType::kF32), 11);
  const gguf::GgufFile f32_file = *gguf::GgufFile::parse(f32_bytes);
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    const std::vector<uint8_t> bytes = model_bytes(small_shape(dtype), 11);
    const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
    for (const char* name : {"token_embd.weight", "blk.1.ffn_down.weight"}) {
      const std::vector<float> reference = tensor_as_f32(f32_file, name);
      const gguf::GgufTensor tensor = *file.tensor(name);
      std::vector<std::byte> expected(tensor.data.size());
      const int64_t row_length = tensor.info->dimensions[0];
      for (int64_t r = 0; r < tensor.info->element_count / row_length; ++r) {
        quantize_row(dtype, reference.data() + r * row_length,
                     expected.data() + r * row_bytes(dtype, row_length), row_length);
      }
      EXPECT_TRUE(std::equal(expected.begin(), expected.end(), tensor.data.begin()))
          << dtype_name(dtype) << " " << name;
    }
  }
}

TEST(LlamaModelFileTest, GeneratedTokenizerWorks) {
  const std::vector<uint8_t> bytes = model_bytes(small_shape(DType::kQ4_0), 2);
  const gguf::GgufFile file = *gguf::GgufFile::parse(bytes);
  Result<tokenizer::Tokenizer> tokenizer = tokenizer::Tokenizer::from_gguf(file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().to_string();
  EXPECT_EQ(tokenizer->vocab_size(), 300);
  const std::string text = "The light has not failed since.";
  const std::vector<tokenizer::TokenId> ids = tokenizer->encode(text);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(*tokenizer->decode(ids), text);
}

TEST(LlamaModelFileTest, InvalidShapesAreRejectedNamingTheField) {
  struct Case {
    void (*mutate)(LlamaShape&);
    const char* message;
  };
  const Case cases[] = {
      {[](LlamaShape& s) { s.vocab_size = 258; }, "vocab_size = 258 is below 259"},
      {[](LlamaShape& s) { s.hidden_size = 0; }, "hidden_size = 0 must be between 1"},
      {[](LlamaShape& s) { s.num_layers = int64_t{1} << 33; }, "num_layers = 8589934592"},
      {[](LlamaShape& s) { s.num_heads = 3; }, "hidden_size = 64 is not a multiple of num_heads"},
      {[](LlamaShape& s) { s.num_heads = 64; }, "head dimension 1"},
      {[](LlamaShape& s) { s.key_length = 15; }, "head dimension 15 is odd"},
      {[](LlamaShape& s) { s.key_length = -2; }, "key_length = -2 must not be negative"},
      {[](LlamaShape& s) { s.num_kv_heads = 3; }, "not a multiple of num_kv_heads = 3"},
      {[](LlamaShape& s) { s.weight_dtype = DType::kI8; }, "weight dtype i8"},
      {[](LlamaShape& s) { s.ffn_size = 48; }, "multiples of 32"},
      {[](LlamaShape& s) { s.rope_theta = -1; }, "rope_theta"},
      {[](LlamaShape& s) { s.rms_norm_epsilon = NAN; }, "rms_norm_epsilon"},
  };
  for (const Case& c : cases) {
    LlamaShape shape = small_shape(DType::kQ8_0);
    c.mutate(shape);
    const Status status = make_random_llama_writer(shape, 1).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST(LlamaModelFileTest, ReadingANonLlamaFileNamesWhatIsMissing) {
  gguf::GgufWriter writer;
  writer.set("general.architecture", gguf::GgufValue::of_string("llama"));
  writer.set("llama.embedding_length", gguf::GgufValue::of<uint32_t>(64));
  const gguf::GgufFile file =
      *gguf::GgufFile::parse_owned(*writer.write_to_buffer(), "partial.gguf");
  const Status status = read_llama_shape(file).status();
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("'llama.block_count' is missing"));
  gguf::GgufWriter other;
  other.set("general.architecture", gguf::GgufValue::of_string("mamba"));
  const gguf::GgufFile mamba = *gguf::GgufFile::parse_owned(*other.write_to_buffer());
  EXPECT_THAT(
      read_llama_shape(mamba).status().message(),
      HasSubstr("'mamba' is not one Folio runs (llama, qwen2, qwen3, phi3, gemma2, gemma3)"));
}

}  // namespace
}  // namespace folio::model
