// Quantization recipes and `folio quantize`'s core: the dtype each recipe gives each tensor
// (against tables derived by hand from llama.cpp's rules), files written for every recipe
// checked at the GGUF level (dtypes, metadata, file type, values close to the original), the
// block-size fallbacks, and the errors a user meets.
#include "folio/model/quantize_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/base/random.h"
#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_model.h"
#include "folio/model/llama_model_file.h"
#include "folio/model/quantization_recipe.h"
#include "folio/tensor/quantize.h"

namespace folio::model {
namespace {

using ::testing::HasSubstr;
using Recipe = QuantizationRecipe;

// The tensors of a Llama model with `layers` layers (hidden 256, FFN 512), as the recipe sees
// them, in file order.
std::vector<RecipeTensor> llama_tensors(int layers, bool tied) {
  std::vector<RecipeTensor> tensors;
  tensors.push_back({"token_embd.weight", {256, 1000}, DType::kF32});
  for (int layer = 0; layer < layers; ++layer) {
    const std::string prefix = fmt::format("blk.{}.", layer);
    tensors.push_back({prefix + "attn_norm.weight", {256}, DType::kF32});
    tensors.push_back({prefix + "attn_q.weight", {256, 256}, DType::kF32});
    tensors.push_back({prefix + "attn_k.weight", {256, 64}, DType::kF32});
    tensors.push_back({prefix + "attn_v.weight", {256, 64}, DType::kF32});
    tensors.push_back({prefix + "attn_output.weight", {256, 256}, DType::kF32});
    tensors.push_back({prefix + "ffn_norm.weight", {256}, DType::kF32});
    tensors.push_back({prefix + "ffn_gate.weight", {256, 512}, DType::kF32});
    tensors.push_back({prefix + "ffn_up.weight", {256, 512}, DType::kF32});
    tensors.push_back({prefix + "ffn_down.weight", {512, 256}, DType::kF32});
  }
  tensors.push_back({"output_norm.weight", {256}, DType::kF32});
  if (!tied) tensors.push_back({"output.weight", {256, 1000}, DType::kF32});
  return tensors;
}

std::map<std::string, DType> chosen_dtypes(Recipe recipe, const RecipeModel& model,
                                           const std::vector<RecipeTensor>& tensors) {
  Result<std::vector<TensorDtypeChoice>> choices = choose_tensor_dtypes(recipe, model, tensors);
  FOLIO_CHECK(choices.ok(), "{}", choices.status().to_string());
  std::map<std::string, DType> result;
  for (size_t i = 0; i < tensors.size(); ++i) result[tensors[i].name] = (*choices)[i].dtype;
  return result;
}

RecipeModel model_of(int layers, int heads, int kv_heads) {
  RecipeModel model;
  model.num_layers = layers;
  model.num_heads = heads;
  model.num_kv_heads = kv_heads;
  return model;
}

// In a 32-layer model llama-quantize visits attn_v / ffn_down in name order: blk.0, blk.1,
// blk.10 ... blk.19, blk.2, blk.20 ... blk.29, blk.3, blk.30, blk.31, blk.4 ... blk.9. Its
// "more bits" ordinals (i < 4, i >= 28, (i - 4) % 3 == 2) are 0-3, 6, 9, 12, 15, 18, 21, 24,
// 27 and 28-31, which are these layers:
const std::set<int> kMoreBitsLayersOf32 = {0, 1, 2, 5, 6, 7, 8, 9, 10, 11, 14, 17, 22, 25, 28, 30};

TEST(QuantizationRecipeTest, Q4_K_MGivesQ6_KToMoreBitsLayersCountedInNameOrder) {
  const auto dtypes = chosen_dtypes(Recipe::kQ4_K_M, model_of(32, 32, 8), llama_tensors(32, false));
  for (int layer = 0; layer < 32; ++layer) {
    const DType expected = kMoreBitsLayersOf32.contains(layer) ? DType::kQ6_K : DType::kQ4_K;
    EXPECT_EQ(dtypes.at(fmt::format("blk.{}.attn_v.weight", layer)), expected) << layer;
    EXPECT_EQ(dtypes.at(fmt::format("blk.{}.ffn_down.weight", layer)), expected) << layer;
    EXPECT_EQ(dtypes.at(fmt::format("blk.{}.attn_q.weight", layer)), DType::kQ4_K);
    EXPECT_EQ(dtypes.at(fmt::format("blk.{}.attn_output.weight", layer)), DType::kQ4_K);
    EXPECT_EQ(dtypes.at(fmt::format("blk.{}.ffn_norm.weight", layer)), DType::kF32);
  }
  EXPECT_EQ(dtypes.at("output.weight"), DType::kQ6_K);
  EXPECT_EQ(dtypes.at("token_embd.weight"), DType::kQ4_K);
  EXPECT_EQ(dtypes.at("output_norm.weight"), DType::kF32);
}

TEST(QuantizationRecipeTest, Q3_K_MAndQ4_K_SRaiseTheFirstLayersInNameOrder) {
  // Q3_K_M: attn_v ordinals 0, 1 (layers 0, 1) and ffn_down ordinals below 32 / 16 = 2 get
  // q5_K; the other attn_v and ffn_down and every attn_output get q4_K.
  const auto q3 = chosen_dtypes(Recipe::kQ3_K_M, model_of(32, 32, 32), llama_tensors(32, false));
  // Q4_K_S: ordinals below 4 (layers 0, 1, 10, 11) of attn_v and of ffn_down (32 / 8) get q5_K.
  const auto q4 = chosen_dtypes(Recipe::kQ4_K_S, model_of(32, 32, 32), llama_tensors(32, false));
  for (int layer = 0; layer < 32; ++layer) {
    const bool first_two = layer < 2;
    const bool first_four = layer < 2 || layer == 10 || layer == 11;
    EXPECT_EQ(q3.at(fmt::format("blk.{}.attn_v.weight", layer)),
              first_two ? DType::kQ5_K : DType::kQ4_K);
    EXPECT_EQ(q3.at(fmt::format("blk.{}.ffn_down.weight", layer)),
              first_two ? DType::kQ5_K : DType::kQ4_K);
    EXPECT_EQ(q3.at(fmt::format("blk.{}.attn_output.weight", layer)), DType::kQ4_K);
    EXPECT_EQ(q3.at(fmt::format("blk.{}.ffn_up.weight", layer)), DType::kQ3_K);
    EXPECT_EQ(q4.at(fmt::format("blk.{}.attn_v.weight", layer)),
              first_four ? DType::kQ5_K : DType::kQ4_K);
    EXPECT_EQ(q4.at(fmt::format("blk.{}.ffn_down.weight", layer)),
              first_four ? DType::kQ5_K : DType::kQ4_K);
  }
}

TEST(QuantizationRecipeTest, GroupedQueryAttentionAnd70BRaiseAttentionValue) {
  // Q2_K: attn_v q3_K, or q4_K when 4 or more heads share a KV head.
  EXPECT_EQ(chosen_dtypes(Recipe::kQ2_K, model_of(4, 8, 8), llama_tensors(4, false))
                .at("blk.3.attn_v.weight"),
            DType::kQ3_K);
  EXPECT_EQ(chosen_dtypes(Recipe::kQ2_K, model_of(4, 8, 2), llama_tensors(4, false))
                .at("blk.3.attn_v.weight"),
            DType::kQ4_K);
  // IQ4_XS: attn_v q5_K with grouped-query attention of 4, else iq4_xs.
  EXPECT_EQ(chosen_dtypes(Recipe::kIQ4_XS, model_of(4, 8, 2), llama_tensors(4, false))
                .at("blk.3.attn_v.weight"),
            DType::kQ5_K);
  EXPECT_EQ(chosen_dtypes(Recipe::kIQ4_XS, model_of(4, 8, 4), llama_tensors(4, false))
                .at("blk.3.attn_v.weight"),
            DType::kIQ4_XS);
  // A 70B model: Q3_K_S's q3_K attn_v becomes q5_K.
  RecipeModel seventy = model_of(4, 8, 1);
  seventy.is_70b = true;
  EXPECT_EQ(
      chosen_dtypes(Recipe::kQ3_K_S, seventy, llama_tensors(4, false)).at("blk.3.attn_v.weight"),
      DType::kQ5_K);
}

TEST(QuantizationRecipeTest, TiedEmbeddingsTakeTheOutputMatrixDtype) {
  EXPECT_EQ(chosen_dtypes(Recipe::kQ4_K_M, model_of(4, 8, 2), llama_tensors(4, true))
                .at("token_embd.weight"),
            DType::kQ6_K);
  EXPECT_EQ(chosen_dtypes(Recipe::kQ8_0, model_of(4, 8, 2), llama_tensors(4, true))
                .at("token_embd.weight"),
            DType::kQ8_0);
  EXPECT_EQ(chosen_dtypes(Recipe::kQ4_0, model_of(4, 8, 2), llama_tensors(4, false))
                .at("token_embd.weight"),
            DType::kQ4_0);
}

TEST(QuantizationRecipeTest, RecipeNamesParseIgnoringCaseAndUnknownNamesListTheValidOnes) {
  for (Recipe recipe : kAllQuantizationRecipes) {
    std::string lower(quantization_recipe_name(recipe));
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    Result<Recipe> parsed = parse_quantization_recipe(lower);
    ASSERT_TRUE(parsed.ok()) << lower;
    EXPECT_EQ(*parsed, recipe);
  }
  const Status status = parse_quantization_recipe("Q4_K_X").status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'Q4_K_X'"));
  EXPECT_THAT(status.message(), HasSubstr("Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M"));
  EXPECT_THAT(status.message(), HasSubstr("Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, F16"));
}

// ---- Files ----

std::string temporary_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

LlamaShape test_shape(int64_t hidden, int64_t ffn) {
  LlamaShape shape;
  shape.vocab_size = 300;
  shape.hidden_size = hidden;
  shape.num_layers = 4;
  shape.num_heads = 8;  // over 2 KV heads: grouped-query attention of 4
  shape.num_kv_heads = 2;
  shape.ffn_size = ffn;
  shape.context_length = 128;
  return shape;
}

// Writes a random f32 model of `shape` and returns its path.
std::string write_model(const LlamaShape& shape, const std::string& name) {
  const std::string path = temporary_path(name);
  Result<gguf::GgufWriter> writer = make_random_llama_writer(shape, 3);
  FOLIO_CHECK(writer.ok(), "{}", writer.status().to_string());
  FOLIO_CHECK(writer->write_file(path).ok(), "writing {}", path);
  return path;
}

std::vector<float> dequantized(const gguf::GgufFile& file, std::string_view name) {
  const gguf::GgufTensor tensor = *file.tensor(name);
  const int64_t row_length = tensor.info->dimensions[0];
  std::vector<float> values(static_cast<size_t>(tensor.info->element_count));
  for (int64_t r = 0; r < tensor.info->element_count / row_length; ++r) {
    dequantize_row(tensor.dtype, tensor.data.data() + r * row_bytes(tensor.dtype, row_length),
                   values.data() + r * row_length, row_length);
  }
  return values;
}

double relative_rms_error(const std::vector<float>& original, const std::vector<float>& value) {
  double error = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < original.size(); ++i) {
    error += (static_cast<double>(value[i]) - original[i]) * (value[i] - original[i]);
    norm += static_cast<double>(original[i]) * original[i];
  }
  return std::sqrt(error / norm);
}

// Relative RMS bounds on gaussian weights: the tensor tests' bounds for the block types
// (tests/tensor/quantize_blocks_test.cc, 1.3x measured), f16 / bf16 by their mantissas.
double error_bound(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 1e-9;
    case DType::kF16:
      return 1e-3;
    case DType::kBF16:
      return 8e-3;
    case DType::kQ8_0:
      return 0.01;
    case DType::kQ6_K:
      return 0.023;
    case DType::kQ5_0:
    case DType::kQ5_1:
      return 0.055;
    case DType::kQ5_K:
      return 0.047;
    case DType::kQ4_K:
      return 0.092;
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      return 0.12;
    case DType::kQ3_K:
      return 0.19;
    case DType::kQ2_K:
      return 0.38;
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      break;
  }
  return 0.0;
}

// The expected dtypes of the 4-layer test model (grouped-query attention 4, layer names in
// name order = layer order), derived by hand from llama.cpp's rules: "more bits" layers of 4
// are 2 and 3 (i >= 7 * 4 / 8 = 3, or (i - 0) % 3 == 2); 4 / 8 = 4 / 16 = 0 "first layers".
struct ExpectedMixture {
  Recipe recipe;
  uint32_t file_type;  // LLAMA_FTYPE
  DType base;          // attn_q/k, ffn_gate/up, token_embd
  DType attention_value[4];
  DType ffn_down[4];
  DType attention_output;
  DType output;
};

std::vector<ExpectedMixture> expected_mixtures() {
  using enum DType;
  auto all = [](DType d) { return std::array<DType, 4>{d, d, d, d}; };
  auto mix = [](Recipe recipe, uint32_t file_type, DType base, std::array<DType, 4> value,
                std::array<DType, 4> down, DType attention_output, DType output) {
    ExpectedMixture m{recipe, file_type, base, {}, {}, attention_output, output};
    std::copy(value.begin(), value.end(), m.attention_value);
    std::copy(down.begin(), down.end(), m.ffn_down);
    return m;
  };
  const std::array<DType, 4> q4_more = {kQ4_K, kQ4_K, kQ6_K, kQ6_K};
  const std::array<DType, 4> q5_more = {kQ5_K, kQ5_K, kQ6_K, kQ6_K};
  return {
      mix(Recipe::kQ4_0, 2, kQ4_0, all(kQ4_0), all(kQ4_0), kQ4_0, kQ6_K),
      mix(Recipe::kQ4_1, 3, kQ4_1, all(kQ4_1), all(kQ4_1), kQ4_1, kQ6_K),
      mix(Recipe::kQ5_0, 8, kQ5_0, all(kQ5_0), all(kQ5_0), kQ5_0, kQ6_K),
      mix(Recipe::kQ5_1, 9, kQ5_1, all(kQ5_1), all(kQ5_1), kQ5_1, kQ6_K),
      mix(Recipe::kQ8_0, 7, kQ8_0, all(kQ8_0), all(kQ8_0), kQ8_0, kQ8_0),
      mix(Recipe::kQ2_K, 10, kQ2_K, all(kQ4_K), all(kQ3_K), kQ3_K, kQ6_K),
      mix(Recipe::kQ3_K_S, 11, kQ3_K, all(kQ3_K), all(kQ3_K), kQ3_K, kQ6_K),
      mix(Recipe::kQ3_K_M, 12, kQ3_K, {kQ5_K, kQ5_K, kQ4_K, kQ4_K}, all(kQ4_K), kQ4_K, kQ6_K),
      mix(Recipe::kQ3_K_L, 13, kQ3_K, all(kQ5_K), all(kQ5_K), kQ5_K, kQ6_K),
      mix(Recipe::kQ4_K_S, 14, kQ4_K, all(kQ5_K), all(kQ4_K), kQ4_K, kQ6_K),
      mix(Recipe::kQ4_K_M, 15, kQ4_K, q4_more, q4_more, kQ4_K, kQ6_K),
      mix(Recipe::kQ5_K_S, 16, kQ5_K, all(kQ5_K), all(kQ5_K), kQ5_K, kQ6_K),
      mix(Recipe::kQ5_K_M, 17, kQ5_K, q5_more, q5_more, kQ5_K, kQ6_K),
      mix(Recipe::kQ6_K, 18, kQ6_K, all(kQ6_K), all(kQ6_K), kQ6_K, kQ6_K),
      mix(Recipe::kIQ4_NL, 25, kIQ4_NL, all(kQ5_K), all(kIQ4_NL), kIQ4_NL, kQ6_K),
      mix(Recipe::kIQ4_XS, 30, kIQ4_XS, all(kQ5_K), all(kIQ4_XS), kIQ4_XS, kQ6_K),
      mix(Recipe::kF16, 1, kF16, all(kF16), all(kF16), kF16, kF16),
      mix(Recipe::kBF16, 32, kBF16, all(kBF16), all(kBF16), kBF16, kBF16),
      mix(Recipe::kF32, 0, kF32, all(kF32), all(kF32), kF32, kF32),
  };
}

DType expected_dtype(const ExpectedMixture& mixture, const std::string& name) {
  if (name == "output.weight") return mixture.output;
  if (!name.starts_with("blk.")) return name.ends_with("_norm.weight") ? DType::kF32 : mixture.base;
  const int layer = name[4] - '0';
  if (name.ends_with("_norm.weight")) return DType::kF32;
  if (name.ends_with("attn_v.weight")) return mixture.attention_value[layer];
  if (name.ends_with("ffn_down.weight")) return mixture.ffn_down[layer];
  if (name.ends_with("attn_output.weight")) return mixture.attention_output;
  return mixture.base;
}

TEST(QuantizeModelTest, EveryRecipeWritesItsMixtureWithMetadataAndCloseValues) {
  const std::string input_path = write_model(test_shape(256, 512), "quantize_input.gguf");
  const gguf::GgufFile input = *gguf::GgufFile::open(input_path);
  const std::vector<ExpectedMixture> mixtures = expected_mixtures();
  ASSERT_EQ(mixtures.size(), std::size(kAllQuantizationRecipes));
  for (const ExpectedMixture& mixture : mixtures) {
    SCOPED_TRACE(std::string(quantization_recipe_name(mixture.recipe)));
    const std::string output_path = temporary_path("quantize_output.gguf");
    QuantizeOptions options;
    options.threads = 2;
    uint64_t last_done = 0;
    uint64_t last_total = 0;
    options.progress = [&](uint64_t done, uint64_t total) {
      EXPECT_GE(done, last_done);
      last_done = done;
      last_total = total;
    };
    ASSERT_TRUE(quantize_model_file(input_path, output_path, mixture.recipe, options).ok());
    EXPECT_EQ(last_done, last_total);  // the progress reaches every byte
    const gguf::GgufFile output = *gguf::GgufFile::open(output_path);

    EXPECT_EQ(*output.get<uint32_t>("general.file_type"), mixture.file_type);
    EXPECT_EQ(*output.get<uint32_t>("general.quantization_version"), 2u);
    for (const gguf::GgufKeyValue& entry : input.metadata()) {
      if (entry.key == "general.file_type") continue;
      const gguf::GgufValue* copied = output.find(entry.key);
      ASSERT_NE(copied, nullptr) << entry.key;
      EXPECT_TRUE(*copied == entry.value) << entry.key;
    }
    ASSERT_EQ(output.tensors().size(), input.tensors().size());
    for (size_t i = 1; i < output.tensors().size(); ++i) {
      EXPECT_LT(output.tensors()[i - 1].name, output.tensors()[i].name);  // name order
    }
    for (const gguf::GgufTensorInfo& info : output.tensors()) {
      const DType dtype = *dtype_from_ggml_type(info.type.code);
      EXPECT_EQ(dtype, expected_dtype(mixture, info.name)) << info.name;
      EXPECT_EQ(info.dimensions, input.find_tensor(info.name)->dimensions) << info.name;
      const std::vector<float> original = dequantized(input, info.name);
      const double error = relative_rms_error(original, dequantized(output, info.name));
      EXPECT_LE(error, error_bound(dtype)) << info.name << " as " << dtype_name(dtype);
    }
  }
}

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(stream), std::istreambuf_iterator<char>()};
}

// Rows are split between threads, never computed differently: the bytes do not depend on the
// thread count.
TEST(QuantizeModelTest, ThreadCountDoesNotChangeTheBytes) {
  const std::string input = write_model(test_shape(256, 512), "quantize_threads.gguf");
  std::vector<uint8_t> single;
  for (int threads : {1, 3}) {
    const std::string output = temporary_path(fmt::format("quantize_threads_{}.gguf", threads));
    QuantizeOptions options;
    options.threads = threads;
    ASSERT_TRUE(quantize_model_file(input, output, Recipe::kQ4_K_M, options).ok());
    if (threads == 1) {
      single = file_bytes(output);
      ASSERT_FALSE(single.empty());
    } else {
      EXPECT_TRUE(file_bytes(output) == single);
    }
  }
}

// A recipe that gives every matrix one dtype (Q8_0: the output stays q8_0 too) writes a file the
// model loader opens, with the tensors in name order rather than the generator's order.
TEST(QuantizeModelTest, SingleDtypeRecipesLoadAsModels) {
  const LlamaShape shape = test_shape(256, 512);
  const std::string input = write_model(shape, "quantize_load.gguf");
  for (Recipe recipe : {Recipe::kQ8_0, Recipe::kF16}) {
    const std::string output = temporary_path("quantize_load_out.gguf");
    ASSERT_TRUE(quantize_model_file(input, output, recipe, {}).ok());
    // Unpacked: the shape is the file's (packed q8_0 matrices would be named q8_0 panels).
    Result<std::unique_ptr<LlamaModel>> model =
        LlamaModel::open(output, LlamaLoadOptions{.pack_q8_0_panels = false});
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    LlamaShape expected = shape;
    expected.weight_dtype = recipe_default_dtype(recipe);
    EXPECT_EQ((*model)->shape(), expected) << quantization_recipe_name(recipe);
  }
}

// A mixture loads as a model whose every matrix has the file's dtype, also when the first
// matrix's dtype (blk.0.attn_q: q4_K) does not divide another matrix's rows (ffn_down's 352,
// which fell back to q5_0 / q8_0).
TEST(QuantizeModelTest, MixturesWithFallbacksLoadWithEachMatrixInItsOwnDtype) {
  const LlamaShape shape = test_shape(256, 352);
  const std::string input = write_model(shape, "quantize_mixture_load.gguf");
  for (Recipe recipe : {Recipe::kQ4_K_M, Recipe::kQ3_K_M, Recipe::kQ6_K, Recipe::kIQ4_XS}) {
    SCOPED_TRACE(std::string(quantization_recipe_name(recipe)));
    const std::string output = temporary_path("quantize_mixture_load_out.gguf");
    ASSERT_TRUE(quantize_model_file(input, output, recipe, {}).ok());
    // Unpacked: the shape then names each matrix's file dtype (q8_0 ones are not q8_0 panels).
    Result<std::unique_ptr<LlamaModel>> model =
        LlamaModel::open(output, LlamaLoadOptions{.pack_q8_0_panels = false});
    ASSERT_TRUE(model.ok()) << model.status().to_string();
    const gguf::GgufFile file = *gguf::GgufFile::open(output);
    std::set<DType> dtypes;
    for (const gguf::GgufTensorInfo& info : file.tensors()) {
      if (info.dimensions.size() != 2) continue;
      const DType dtype = file.tensor(info.name)->dtype;
      dtypes.insert(dtype);
      EXPECT_EQ((*model)->shape().matrix_dtype(info.name), dtype) << info.name;
    }
    EXPECT_GE(dtypes.size(), 2u) << "the recipe should mix dtypes on this shape";
  }
}

// A quantized input is converted through f32: each row of the output is exactly the new
// dtype's quantization of the input row's dequantized values; unchanged dtypes keep their bytes.
TEST(QuantizeModelTest, QuantizedInputsAreDequantizedThenQuantized) {
  LlamaShape shape = test_shape(256, 512);
  shape.weight_dtype = DType::kQ8_0;
  const std::string input_path = write_model(shape, "quantize_q8_input.gguf");
  const std::string output_path = temporary_path("quantize_q8_output.gguf");
  ASSERT_TRUE(quantize_model_file(input_path, output_path, Recipe::kQ5_K_M, {}).ok());
  const gguf::GgufFile input = *gguf::GgufFile::open(input_path);
  const gguf::GgufFile output = *gguf::GgufFile::open(output_path);
  for (const gguf::GgufTensorInfo& info : output.tensors()) {
    const gguf::GgufTensor converted = *output.tensor(info.name);
    const gguf::GgufTensor original = *input.tensor(info.name);
    if (converted.dtype == original.dtype) {
      EXPECT_TRUE(std::equal(converted.data.begin(), converted.data.end(), original.data.begin(),
                             original.data.end()))
          << info.name;
      continue;
    }
    const std::vector<float> values = dequantized(input, info.name);
    const int64_t row_length = info.dimensions[0];
    std::vector<std::byte> expected(converted.data.size());
    for (int64_t r = 0; r < info.element_count / row_length; ++r) {
      quantize_row(converted.dtype, values.data() + r * row_length,
                   expected.data() + r * row_bytes(converted.dtype, row_length), row_length);
    }
    EXPECT_TRUE(
        std::equal(expected.begin(), expected.end(), converted.data.begin(), converted.data.end()))
        << info.name << " as " << dtype_name(converted.dtype);
  }
}

TEST(QuantizeModelTest, RowsThatDoNotDivideAK_QuantFallBackAsLlamaCppDoes) {
  // Hidden 96: rows of 96 divide 32-value blocks only; ffn_down's rows of 192 likewise.
  const std::string path = write_model(test_shape(96, 192), "quantize_fallback.gguf");
  const gguf::GgufFile input = *gguf::GgufFile::open(path);
  Result<QuantizationPlan> plan = plan_quantization(input, Recipe::kQ4_K_M);
  ASSERT_TRUE(plan.ok()) << plan.status().to_string();
  for (const TensorConversion& tensor : plan->tensors) {
    SCOPED_TRACE(tensor.name);
    if (tensor.dimensions.size() == 1) {
      EXPECT_EQ(tensor.target, DType::kF32);
      EXPECT_FALSE(tensor.fell_back_from);
    } else if (tensor.name == "output.weight") {
      // The output rule itself picks q8_0 when q4_K does not divide: no fallback to report.
      EXPECT_EQ(tensor.target, DType::kQ8_0);
      EXPECT_FALSE(tensor.fell_back_from);
    } else if (tensor.name == "blk.2.attn_v.weight" || tensor.name == "blk.3.attn_v.weight" ||
               tensor.name == "blk.2.ffn_down.weight" || tensor.name == "blk.3.ffn_down.weight") {
      EXPECT_EQ(tensor.target, DType::kQ8_0);  // q6_K -> q8_0
      EXPECT_EQ(tensor.fell_back_from, DType::kQ6_K);
    } else {
      EXPECT_EQ(tensor.target, DType::kQ5_0);  // q4_K -> q5_0
      EXPECT_EQ(tensor.fell_back_from, DType::kQ4_K);
    }
  }
  // Q2_K: q2_K and q3_K fall back to iq4_nl, q4_K (attn_v) to q5_0.
  Result<QuantizationPlan> q2 = plan_quantization(input, Recipe::kQ2_K);
  ASSERT_TRUE(q2.ok());
  for (const TensorConversion& tensor : q2->tensors) {
    if (tensor.name == "blk.0.attn_q.weight" || tensor.name == "blk.0.ffn_down.weight") {
      EXPECT_EQ(tensor.target, DType::kIQ4_NL) << tensor.name;
    }
    if (tensor.name == "blk.0.attn_v.weight") {
      EXPECT_EQ(tensor.target, DType::kQ5_0);
    }
  }
  // The file is written with those dtypes.
  const std::string output_path = temporary_path("quantize_fallback_out.gguf");
  ASSERT_TRUE(write_quantized_model(input, *plan, output_path, QuantizeOptions{}).ok());
  const gguf::GgufFile output = *gguf::GgufFile::open(output_path);
  EXPECT_EQ(output.tensor("blk.0.attn_q.weight")->dtype, DType::kQ5_0);
  EXPECT_EQ(output.tensor("blk.3.ffn_down.weight")->dtype, DType::kQ8_0);
}

TEST(QuantizeModelTest, RowsNoDtypeOfTheRecipeDividesFallBackToF16OrFailNamingTheTensor) {
  // Hidden 80 divides neither 256 nor 32.
  const std::string path = write_model(test_shape(80, 160), "quantize_odd.gguf");
  const gguf::GgufFile input = *gguf::GgufFile::open(path);
  // q4_0 has no fallback: an error naming the first such tensor and the sizes.
  const Status q4_0 = plan_quantization(input, Recipe::kQ4_0).status();
  EXPECT_EQ(q4_0.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(q4_0.message(), HasSubstr("token_embd.weight"));
  EXPECT_THAT(q4_0.message(), HasSubstr("rows of 80 values"));
  EXPECT_THAT(q4_0.message(), HasSubstr("no fallback"));
  // F16 needs no blocks.
  EXPECT_TRUE(plan_quantization(input, Recipe::kF16).ok());
}

TEST(QuantizeModelTest, MissingInputAndUnwritableOutputAreErrorsNamingThePath) {
  const std::string missing = temporary_path("no_such_model.gguf");
  const Status input_error =
      quantize_model_file(missing, temporary_path("unused.gguf"), Recipe::kQ8_0, {});
  EXPECT_FALSE(input_error.ok());
  EXPECT_THAT(input_error.to_string(), HasSubstr(missing));

  const std::string input = write_model(test_shape(256, 512), "quantize_errors.gguf");
  const std::string unwritable = temporary_path("no_such_directory/out.gguf");
  const Status output_error = quantize_model_file(input, unwritable, Recipe::kQ8_0, {});
  EXPECT_FALSE(output_error.ok());
  EXPECT_THAT(output_error.to_string(), HasSubstr(unwritable));
  EXPECT_FALSE(std::filesystem::exists(unwritable));
}

// The shipped demo model's f16 file quantized by every recipe gives, tensor for tensor, the types
// and bytes llama.cpp's llama-quantize (c392e50, no importance matrix) wrote for the same recipe:
// the two outputs were compared tensor by tensor (39 of 39 identical for each recipe; only the
// tensor order in the file differs), and the digests below were computed from llama-quantize's
// files by a separate Python script. The digest is FNV-1a over the tensors' own FNV-1a hashes
// in name order, so it does not depend on file order.
struct LlamaQuantizeDigest {
  Recipe recipe;
  uint64_t digest;
};

uint64_t tensor_digest(const gguf::GgufFile& file) {
  std::vector<std::string> names;
  for (const gguf::GgufTensorInfo& info : file.tensors()) names.push_back(info.name);
  std::sort(names.begin(), names.end());
  std::vector<uint8_t> hashes;
  for (const std::string& name : names) {
    const std::span<const std::byte> bytes = file.tensor_bytes(*file.find_tensor(name));
    const uint64_t hash = fnv1a64(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    for (int shift = 0; shift < 64; shift += 8)
      hashes.push_back(static_cast<uint8_t>(hash >> shift));
  }
  return fnv1a64(hashes);
}

class LlamaQuantizeParityTest : public ::testing::TestWithParam<LlamaQuantizeDigest> {};

TEST_P(LlamaQuantizeParityTest, DemoModelQuantizesToLlamaQuantizesBytes) {
  const std::string input = std::string(FOLIO_SOURCE_DIR) + "/models/demo/kjv-f16.gguf";
  const std::string output = temporary_path(
      fmt::format("llama_parity_{}.gguf", quantization_recipe_name(GetParam().recipe)));
  QuantizeOptions options;
  options.threads = 2;
  ASSERT_TRUE(quantize_model_file(input, output, GetParam().recipe, options).ok());
  const gguf::GgufFile file = *gguf::GgufFile::open(output);
  EXPECT_EQ(tensor_digest(file), GetParam().digest)
      << fmt::format("0x{:016x}", tensor_digest(file));
  std::filesystem::remove(output);
}

INSTANTIATE_TEST_SUITE_P(
    EveryRecipe, LlamaQuantizeParityTest,
    ::testing::Values(LlamaQuantizeDigest{Recipe::kQ4_0, 0x12d33b470275e33cull},
                      LlamaQuantizeDigest{Recipe::kQ4_1, 0x23b90f9a859cef2bull},
                      LlamaQuantizeDigest{Recipe::kQ5_0, 0xb9f8fbbecd1eca00ull},
                      LlamaQuantizeDigest{Recipe::kQ5_1, 0xf61a8b44270c6ff6ull},
                      LlamaQuantizeDigest{Recipe::kQ8_0, 0x990587b3072a952full},
                      LlamaQuantizeDigest{Recipe::kQ2_K, 0xf5b91d85ff04911bull},
                      LlamaQuantizeDigest{Recipe::kQ3_K_S, 0x8bfd23795db8655full},
                      LlamaQuantizeDigest{Recipe::kQ3_K_M, 0xc685e0d1e4bc012bull},
                      LlamaQuantizeDigest{Recipe::kQ3_K_L, 0x8fe2285dd924dbffull},
                      LlamaQuantizeDigest{Recipe::kQ4_K_S, 0xcf69cb0034f74be5ull},
                      LlamaQuantizeDigest{Recipe::kQ4_K_M, 0xdfa40cb1e7f09c5dull},
                      LlamaQuantizeDigest{Recipe::kQ5_K_S, 0x8a472164c3742dd8ull},
                      LlamaQuantizeDigest{Recipe::kQ5_K_M, 0xe77442fe64820ad9ull},
                      LlamaQuantizeDigest{Recipe::kQ6_K, 0x661d1740319d5263ull},
                      LlamaQuantizeDigest{Recipe::kIQ4_NL, 0xefdde0d1930bfa98ull},
                      LlamaQuantizeDigest{Recipe::kIQ4_XS, 0xcad293fc3a2d3d1dull}),
    [](const ::testing::TestParamInfo<LlamaQuantizeDigest>& info) {
      return std::string(quantization_recipe_name(info.param.recipe));
    });

}  // namespace
}  // namespace folio::model
