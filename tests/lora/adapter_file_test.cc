// AdapterFile and the adapter writers: files the writers produce read back with every pair in
// place; every malformed or mismatched adapter is refused with an error naming the file and the
// tensor; write_adapter_weights lays out A and B^T as the kernels read them, with the scale rule.
#include "folio/lora/adapter_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "folio/base/random.h"
#include "folio/lora/adapter_writer.h"
#include "folio/tensor/half.h"
#include "folio/tensor/quantize.h"
#include "testing/raw_gguf.h"

namespace folio::lora {
namespace {

using kernels::LoraWeightFormat;
using ::testing::HasSubstr;

constexpr char kSource[] = "adapter-under-test.gguf";

// The small preset of `folio make-model`: hidden 64, 2 layers, 4 heads, 2 KV heads (kv width
// 32), FFN 128, vocabulary 512, untied: 15 targets.
model::LlamaShape small_base() {
  return model::LlamaShape{};
}

std::vector<uint8_t> to_bytes(const gguf::GgufWriter& writer) {
  Result<std::vector<uint8_t>> bytes = writer.write_to_buffer();
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : std::vector<uint8_t>();
}

Result<std::unique_ptr<AdapterFile>> parse(const gguf::GgufWriter& writer,
                                           const model::LlamaShape& base = small_base()) {
  return AdapterFile::parse(to_bytes(writer), kSource, base);
}

std::vector<float> sequence(int64_t count, float start, float step) {
  std::vector<float> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = start + step * static_cast<float>(i % 97);
  return values;
}

// A hand-built adapter file: metadata set by the test, tensors f32 of ggml dimensions.
class RawAdapter {
 public:
  explicit RawAdapter(std::string architecture = "llama") {
    writer.set("general.architecture", gguf::GgufValue::of_string(std::move(architecture)));
    writer.set("general.type", gguf::GgufValue::of_string("adapter"));
    writer.set("adapter.type", gguf::GgufValue::of_string("lora"));
    writer.set("adapter.lora.alpha", gguf::GgufValue::of(16.0f));
  }
  RawAdapter& tensor(const std::string& name, std::vector<int64_t> dimensions,
                     DType dtype = DType::kF32) {
    const int64_t count =
        std::accumulate(dimensions.begin(), dimensions.end(), int64_t{1}, std::multiplies<>());
    const std::vector<float> values = sequence(count, -0.5f, 0.01f);
    std::vector<std::byte> bytes(static_cast<size_t>(row_bytes(dtype, count)));
    if (is_weight_dtype(dtype)) {
      quantize_row(dtype, values.data(), bytes.data(), count);
    }
    Status status = writer.add_tensor_bytes(name, dtype, std::move(dimensions), std::move(bytes));
    EXPECT_TRUE(status.ok()) << status;
    return *this;
  }
  // A well-formed pair for the target `weight` of ggml shape [inputs, outputs].
  RawAdapter& pair(const std::string& weight, int64_t inputs, int64_t outputs, int64_t rank) {
    tensor(weight + ".lora_a", {inputs, rank});
    return tensor(weight + ".lora_b", {rank, outputs});
  }
  Status open_status(const model::LlamaShape& base = small_base()) const {
    return parse(writer, base).status();
  }

  gguf::GgufWriter writer;
};

// Expects kInvalidArgument (or `code`) whose message names the file and every fragment.
void expect_refused(const Status& status, std::vector<std::string> fragments,
                    StatusCode code = StatusCode::kInvalidArgument) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr(kSource));
  for (const std::string& fragment : fragments) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(fragment));
  }
}

// Owned 64-byte-aligned storage for write_adapter_weights.
struct AlignedBuffer {
  explicit AlignedBuffer(int64_t bytes)
      : storage(static_cast<size_t>(bytes + kAdapterMatrixAlignment)) {
    const auto address = reinterpret_cast<uintptr_t>(storage.data());
    const size_t skip =
        (kAdapterMatrixAlignment - address % kAdapterMatrixAlignment) % kAdapterMatrixAlignment;
    span = std::span<std::byte>(storage.data() + skip, static_cast<size_t>(bytes));
  }
  std::vector<std::byte> storage;
  std::span<std::byte> span;
};

// The f32 values of a tensor of the file, row after row.
std::vector<float> file_values(const gguf::GgufTensor& tensor) {
  const int64_t row_length = tensor.info->dimensions[0];
  const int64_t rows = tensor.info->dimensions[1];
  std::vector<float> values(static_cast<size_t>(row_length * rows));
  for (int64_t row = 0; row < rows; ++row) {
    dequantize_row(tensor.dtype, tensor.data.data() + row * row_bytes(tensor.dtype, row_length),
                   values.data() + row * row_length, row_length);
  }
  return values;
}

TEST(AdapterFileTest, RandomAdapterRoundTripsWithEveryPairByTargetIndex) {
  RandomAdapterOptions options;
  options.rank = 8;
  options.output = true;
  Result<gguf::GgufWriter> writer = make_random_adapter_writer(small_base(), options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  const std::vector<uint8_t> bytes = to_bytes(*writer);
  auto adapter = AdapterFile::parse(bytes, kSource, small_base());
  ASSERT_TRUE(adapter.ok()) << adapter.status();

  const std::vector<model::AdapterTarget> targets = model::llama_adapter_targets(small_base());
  EXPECT_EQ((*adapter)->num_base_targets(), 15);
  ASSERT_EQ((*adapter)->pairs().size(), targets.size());
  EXPECT_EQ((*adapter)->alpha(), 8.0f);  // the default alpha is the rank
  EXPECT_EQ((*adapter)->max_rank(), 8);
  EXPECT_EQ((*adapter)->content_hash(), fnv1a64(bytes));
  EXPECT_EQ((*adapter)->file_bytes(), static_cast<int64_t>(bytes.size()));
  for (size_t i = 0; i < targets.size(); ++i) {
    const AdapterTensorPair& pair = (*adapter)->pairs()[i];
    EXPECT_EQ(pair.target.index, targets[i].index);
    EXPECT_EQ(pair.target.weight_name, targets[i].weight_name);
    EXPECT_EQ(pair.rank, 8);
    EXPECT_EQ(pair.a.dtype, DType::kF16);
    EXPECT_EQ(pair.a.info->name, targets[i].weight_name + ".lora_a");
    EXPECT_EQ(pair.a.info->dimensions, (std::vector<int64_t>{targets[i].input_features, 8}));
    EXPECT_EQ(pair.b.info->dimensions, (std::vector<int64_t>{8, targets[i].output_features}));
    EXPECT_EQ((*adapter)->find_pair(targets[i].index), &pair);
  }
}

TEST(AdapterFileTest, RandomAdapterIsDeterministicPerSeed) {
  RandomAdapterOptions options;
  const std::vector<uint8_t> first = to_bytes(*make_random_adapter_writer(small_base(), options));
  EXPECT_EQ(first, to_bytes(*make_random_adapter_writer(small_base(), options)));
  options.seed = 2;
  EXPECT_NE(first, to_bytes(*make_random_adapter_writer(small_base(), options)));
}

// The adapters of tests/data/reference/regenerate.sh are these bytes: `folio make-adapter` and
// a test building the adapter in memory agree, and the goldens' "adapter_fnv1a64" pins them.
TEST(AdapterFileTest, RandomAdapterMatchesTheReferenceGoldensAdapters) {
  RandomAdapterOptions f16;  // lora_llama_f32_gqa_f16: --rank 16 --dtype f16 --targets
  f16.rank = 16;             // q,k,v,o,gate,up,down,output --seed 21
  f16.output = true;
  f16.seed = 21;
  EXPECT_EQ(fnv1a64(to_bytes(*make_random_adapter_writer(small_base(), f16))),
            0x8810d8bdca6d176cull);
  model::LlamaShape qwen2 = small_base();  // make-model --arch qwen2 --tie-embeddings
  qwen2.architecture = model::LlamaArchitecture::kQwen2;
  qwen2.tie_embeddings = true;
  qwen2.weight_dtype = DType::kF16;
  RandomAdapterOptions q8;  // lora_qwen2_f16_tied_q8_0: --rank 32 --dtype q8_0 --seed 24
  q8.rank = 32;
  q8.dtype = DType::kQ8_0;
  q8.seed = 24;
  EXPECT_EQ(fnv1a64(to_bytes(*make_random_adapter_writer(qwen2, q8))), 0x840e3940ac8f68b5ull);
}

TEST(AdapterFileTest, RandomAdapterValuesHaveTheDocumentedSpread) {
  RandomAdapterOptions options;
  options.rank = 16;
  options.dtype = DType::kF32;
  auto adapter = parse(*make_random_adapter_writer(small_base(), options));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  auto deviation = [](const std::vector<float>& values) {
    double sum = 0;
    for (float value : values) sum += static_cast<double>(value) * value;
    return std::sqrt(sum / static_cast<double>(values.size()));
  };
  for (const AdapterTensorPair& pair : (*adapter)->pairs()) {
    const double a_expected = 1.0 / std::sqrt(static_cast<double>(pair.target.input_features));
    const double b_expected = kRandomAdapterUpdateFraction / 4.0;  // 0.25 / sqrt(16)
    EXPECT_NEAR(deviation(file_values(pair.a)), a_expected, 0.1 * a_expected);
    EXPECT_NEAR(deviation(file_values(pair.b)), b_expected, 0.1 * b_expected);
  }
}

TEST(AdapterFileTest, RandomQ8AdapterWritesRowsThatAreNotWholeBlocksAsF16) {
  RandomAdapterOptions options;
  options.rank = 8;  // B's rows hold 8 values: not a q8_0 block
  options.dtype = DType::kQ8_0;
  auto adapter = parse(*make_random_adapter_writer(small_base(), options));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  for (const AdapterTensorPair& pair : (*adapter)->pairs()) {
    EXPECT_EQ(pair.a.dtype, DType::kQ8_0);
    EXPECT_EQ(pair.b.dtype, DType::kF16);
  }
  options.rank = 32;
  adapter = parse(*make_random_adapter_writer(small_base(), options));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->pairs()[0].b.dtype, DType::kQ8_0);
  EXPECT_TRUE((*adapter)->gguf().contains("general.quantization_version"));
}

TEST(AdapterFileTest, RandomAdapterTargetsOnlyTheChosenProjections) {
  RandomAdapterOptions options;
  options.projections = {model::LlamaProjection::kValue, model::LlamaProjection::kDown};
  auto adapter = parse(*make_random_adapter_writer(small_base(), options));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  ASSERT_EQ((*adapter)->pairs().size(), 4u);
  EXPECT_EQ((*adapter)->pairs()[0].target.weight_name, "blk.0.attn_v.weight");
  EXPECT_EQ((*adapter)->pairs()[1].target.weight_name, "blk.0.ffn_down.weight");
  EXPECT_EQ((*adapter)->pairs()[3].target.weight_name, "blk.1.ffn_down.weight");
  EXPECT_EQ(
      (*adapter)->find_pair(model::llama_adapter_target_index(0, model::LlamaProjection::kQuery)),
      nullptr);
}

TEST(AdapterFileTest, RandomAdapterOptionsAreChecked) {
  model::LlamaShape tied = small_base();
  tied.tie_embeddings = true;
  RandomAdapterOptions options;
  options.output = true;
  EXPECT_THAT(std::string(make_random_adapter_writer(tied, options).status().message()),
              HasSubstr("ties its LM head"));
  options = {};
  options.rank = 65;
  EXPECT_THAT(std::string(make_random_adapter_writer(small_base(), options).status().message()),
              HasSubstr("rank 65"));
  options = {};
  options.dtype = DType::kQ4_0;
  EXPECT_EQ(make_random_adapter_writer(small_base(), options).status().code(),
            StatusCode::kInvalidArgument);
  options = {};
  options.projections = {model::LlamaProjection::kUp, model::LlamaProjection::kUp};
  EXPECT_THAT(std::string(make_random_adapter_writer(small_base(), options).status().message()),
              HasSubstr("ffn_up is listed twice"));
}

TEST(AdapterFileTest, OpensFromAPathWithTheSameContentHash) {
  const std::string path =
      (std::filesystem::path(::testing::TempDir()) / "folio_adapter_file_test.gguf").string();
  Result<gguf::GgufWriter> writer = make_random_adapter_writer(small_base(), {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(writer->write_file(path).ok());
  auto adapter = AdapterFile::open(path, small_base());
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->source(), path);
  EXPECT_EQ((*adapter)->content_hash(), fnv1a64(to_bytes(*writer)));
  std::filesystem::remove(path);

  const Status missing = AdapterFile::open(path, small_base()).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.message()), HasSubstr(path));
}

// --- Validation: each bad input is refused naming the file and the tensor -----------------

TEST(AdapterFileTest, RefusesAModelFileOrAnotherAdapterType) {
  RawAdapter not_adapter;
  not_adapter.writer.set("general.type", gguf::GgufValue::of_string("model"));
  not_adapter.pair("blk.0.attn_q.weight", 64, 64, 4);
  expect_refused(not_adapter.open_status(), {"general.type", "\"model\""});

  gguf::GgufWriter no_type;
  no_type.set("general.architecture", gguf::GgufValue::of_string("llama"));
  expect_refused(parse(no_type).status(), {"general.type"});

  RawAdapter control_vector;
  control_vector.writer.set("adapter.type", gguf::GgufValue::of_string("control_vector"));
  control_vector.pair("blk.0.attn_q.weight", 64, 64, 4);
  expect_refused(control_vector.open_status(), {"adapter.type", "control_vector"});
}

TEST(AdapterFileTest, RefusesAnotherArchitecture) {
  RawAdapter qwen("qwen2");
  qwen.pair("blk.0.attn_q.weight", 64, 64, 4);
  expect_refused(qwen.open_status(), {"general.architecture", "qwen2", "llama"});
}

TEST(AdapterFileTest, ReadsAlphaAsF32AndTreatsAMissingOneAsZero) {
  RawAdapter raw;
  raw.pair("blk.0.attn_q.weight", 64, 64, 4);
  auto adapter = parse(raw.writer);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->alpha(), 16.0f);

  gguf::GgufWriter without_alpha;
  without_alpha.set("general.architecture", gguf::GgufValue::of_string("llama"));
  without_alpha.set("general.type", gguf::GgufValue::of_string("adapter"));
  without_alpha.set("adapter.type", gguf::GgufValue::of_string("lora"));
  RawAdapter copy;
  copy.writer = without_alpha;
  copy.pair("blk.0.attn_q.weight", 64, 64, 4);
  adapter = parse(copy.writer);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->alpha(), 0.0f);

  raw.writer.set("adapter.lora.alpha", gguf::GgufValue::of_string("16"));
  expect_refused(raw.open_status(), {"adapter.lora.alpha"});
  raw.writer.set("adapter.lora.alpha", gguf::GgufValue::of(std::numeric_limits<float>::infinity()));
  expect_refused(raw.open_status(), {"adapter.lora.alpha", "finite"});
}

TEST(AdapterFileTest, RefusesTargetsTheBaseDoesNotHave) {
  RawAdapter beyond_last_layer;
  beyond_last_layer.pair("blk.2.attn_q.weight", 64, 64, 4);
  expect_refused(beyond_last_layer.open_status(), {"blk.2.attn_q.weight.lora_a", "blk.1"});

  RawAdapter embedding;
  embedding.pair("token_embd.weight", 64, 512, 4);
  expect_refused(embedding.open_status(), {"token_embd.weight.lora_a", "token embedding"});

  model::LlamaShape tied = small_base();
  tied.tie_embeddings = true;
  RawAdapter output;
  output.pair("output.weight", 64, 512, 4);
  EXPECT_TRUE(output.open_status(small_base()).ok()) << output.open_status(small_base());
  expect_refused(output.open_status(tied), {"output.weight.lora_a", "tied"});
}

TEST(AdapterFileTest, RefusesALoneHalfOfAPair) {
  RawAdapter only_a;
  only_a.pair("blk.0.attn_q.weight", 64, 64, 4).tensor("blk.0.attn_k.weight.lora_a", {64, 4});
  expect_refused(only_a.open_status(),
                 {"blk.0.attn_k.weight.lora_a", "blk.0.attn_k.weight.lora_b", "missing"});
  RawAdapter only_b;
  only_b.tensor("blk.1.ffn_down.weight.lora_b", {4, 64});
  expect_refused(only_b.open_status(), {"blk.1.ffn_down.weight.lora_b", "missing"});
}

TEST(AdapterFileTest, DuplicateTensorNamesAreTheReadersError) {
  gguf::testing::RawGguf raw;
  raw.header(3, 2, 0)
      .tensor_info("blk.0.attn_q.weight.lora_a", {64, 4}, 0, 0)
      .tensor_info("blk.0.attn_q.weight.lora_a", {64, 4}, 0, 1024)
      .pad_to(32)
      .zeros(2048);
  const Status status = AdapterFile::parse(raw.bytes, kSource, small_base()).status();
  expect_refused(status, {"blk.0.attn_q.weight.lora_a", "twice"}, StatusCode::kDataLoss);
}

TEST(AdapterFileTest, RefusesShapesThatDoNotFitTheTarget) {
  RawAdapter wrong_input;
  wrong_input.tensor("blk.0.attn_q.weight.lora_a", {32, 4})
      .tensor("blk.0.attn_q.weight.lora_b", {4, 64});
  expect_refused(wrong_input.open_status(), {"blk.0.attn_q.weight.lora_a", "[32, 4]", "64"});

  RawAdapter wrong_output;  // attn_k's output is the KV width, 32
  wrong_output.pair("blk.0.attn_k.weight", 64, 64, 4);
  expect_refused(wrong_output.open_status(), {"blk.0.attn_k.weight.lora_b", "32"});

  RawAdapter ranks_differ;
  ranks_differ.tensor("blk.0.attn_q.weight.lora_a", {64, 8})
      .tensor("blk.0.attn_q.weight.lora_b", {4, 64});
  expect_refused(ranks_differ.open_status(), {"blk.0.attn_q.weight.lora_a", "rank 8", "rank 4"});

  RawAdapter transposed;  // A stored as [rank, n_in]: the retired "finetune" layout
  transposed.tensor("blk.0.ffn_up.weight.lora_a", {4, 64})
      .tensor("blk.0.ffn_up.weight.lora_b", {4, 128});
  expect_refused(transposed.open_status(), {"blk.0.ffn_up.weight.lora_a"});

  RawAdapter three_dimensions;
  three_dimensions.tensor("blk.0.attn_q.weight.lora_a", {64, 4, 1})
      .tensor("blk.0.attn_q.weight.lora_b", {4, 64});
  expect_refused(three_dimensions.open_status(), {"blk.0.attn_q.weight.lora_a", "3 dimensions"});
}

TEST(AdapterFileTest, RefusesRankZeroAndRanksAboveTheHiddenSize) {
  RawAdapter zero;
  zero.pair("blk.0.attn_q.weight", 64, 64, 0);
  expect_refused(zero.open_status(), {"blk.0.attn_q.weight.lora_b", "rank 0"});

  RawAdapter too_large;
  too_large.pair("blk.0.ffn_down.weight", 128, 64, 65);
  expect_refused(too_large.open_status(), {"blk.0.ffn_down.weight.lora_b", "rank 65", "64"});
}

TEST(AdapterFileTest, RefusesDtypesAnAdapterCannotUse) {
  RawAdapter integers;
  integers.tensor("blk.0.attn_q.weight.lora_a", {64, 4}, DType::kI32)
      .tensor("blk.0.attn_q.weight.lora_b", {4, 64});
  expect_refused(integers.open_status(), {"blk.0.attn_q.weight.lora_a", "i32"});

  RawAdapter quantized;  // q4_0 and q8_0 A are fine: rows of 64 values
  quantized.tensor("blk.0.attn_q.weight.lora_a", {64, 4}, DType::kQ4_0)
      .tensor("blk.0.attn_q.weight.lora_b", {4, 64}, DType::kBF16)
      .tensor("blk.0.attn_k.weight.lora_a", {64, 4}, DType::kQ8_0)
      .tensor("blk.0.attn_k.weight.lora_b", {4, 32}, DType::kF16);
  EXPECT_TRUE(quantized.open_status().ok()) << quantized.open_status();
}

TEST(AdapterFileTest, SkipsNormTensorsAndRefusesOtherNames) {
  RawAdapter norms;
  norms.pair("blk.0.attn_q.weight", 64, 64, 4)
      .tensor("blk.0.attn_norm.weight", {64})
      .tensor("blk.1.ffn_norm.weight.lora_a", {64, 4})
      .tensor("blk.1.ffn_norm.weight.lora_b", {4, 64});
  auto adapter = parse(norms.writer);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->pairs().size(), 1u);

  RawAdapter full_weight;
  full_weight.pair("blk.0.attn_q.weight", 64, 64, 4).tensor("blk.0.attn_k.weight", {64, 32});
  expect_refused(full_weight.open_status(), {"blk.0.attn_k.weight", ".lora_a"});

  RawAdapter empty;
  empty.tensor("output_norm.weight", {64});
  expect_refused(empty.open_status(), {"no LoRA tensor pairs"});
}

TEST(AdapterFileTest, RefusesTruncatedAndHostileFiles) {
  RandomAdapterOptions options;
  options.projections = {model::LlamaProjection::kQuery};
  const std::vector<uint8_t> bytes = to_bytes(*make_random_adapter_writer(small_base(), options));
  for (size_t size : {size_t{0}, size_t{3}, size_t{24}, bytes.size() / 3, bytes.size() - 1}) {
    std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(size));
    const Status status = AdapterFile::parse(truncated, kSource, small_base()).status();
    EXPECT_FALSE(status.ok()) << "size " << size;
    EXPECT_THAT(std::string(status.message()), HasSubstr(kSource)) << "size " << size;
  }
  gguf::testing::RawGguf hostile;
  hostile.header(3, uint64_t{1} << 62, 0);
  const Status status = AdapterFile::parse(hostile.bytes, kSource, small_base()).status();
  expect_refused(status, {"tensor count"}, StatusCode::kDataLoss);
}

// --- Trained adapters (make_adapter_writer) -----------------------------------------------

// q of layer 0 (rank 4) and the LM head (rank 2), in PyTorch shapes.
AdapterWeights trained_weights() {
  AdapterWeights weights;
  weights.name = "trained";
  weights.alpha = 4.0f;
  weights.tensors["blk.0.attn_q.weight.lora_a"] = {{4, 64}, sequence(4 * 64, -0.3f, 0.007f)};
  weights.tensors["blk.0.attn_q.weight.lora_b"] = {{64, 4}, sequence(64 * 4, 0.2f, -0.005f)};
  weights.tensors["output.weight.lora_a"] = {{2, 64}, sequence(2 * 64, 0.1f, 0.003f)};
  weights.tensors["output.weight.lora_b"] = {{512, 2}, sequence(512 * 2, -0.1f, 0.002f)};
  return weights;
}

TEST(AdapterWriterTest, TrainedWeightsRoundTripInPyTorchLayout) {
  const AdapterWeights weights = trained_weights();
  Result<gguf::GgufWriter> writer = make_adapter_writer(small_base(), weights, DType::kF32);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto adapter = parse(*writer);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_EQ((*adapter)->alpha(), 4.0f);
  ASSERT_EQ((*adapter)->pairs().size(), 2u);
  const AdapterTensorPair& q = (*adapter)->pairs()[0];
  const AdapterTensorPair& output = (*adapter)->pairs()[1];
  EXPECT_EQ(q.rank, 4);
  EXPECT_EQ(output.rank, 2);
  EXPECT_EQ(output.target.index, 14);
  // PyTorch [rows, row length] is ggml [row length, rows]: the values keep their order.
  EXPECT_EQ(file_values(q.a), weights.tensors.at("blk.0.attn_q.weight.lora_a").values);
  EXPECT_EQ(file_values(q.b), weights.tensors.at("blk.0.attn_q.weight.lora_b").values);
  EXPECT_EQ(file_values(output.b), weights.tensors.at("output.weight.lora_b").values);
}

TEST(AdapterWriterTest, TrainedWeightsAreCheckedAgainstTheBase) {
  auto message = [](const AdapterWeights& weights) {
    return std::string(make_adapter_writer(small_base(), weights, DType::kF16).status().message());
  };
  AdapterWeights lone = trained_weights();
  lone.tensors.erase("output.weight.lora_b");
  EXPECT_THAT(message(lone), HasSubstr("output.weight.lora_b is missing"));

  AdapterWeights wrong_shape = trained_weights();
  wrong_shape.tensors["blk.0.attn_q.weight.lora_a"].shape = {4, 32};
  EXPECT_THAT(message(wrong_shape), HasSubstr("blk.0.attn_q.weight.lora_a: shape [4, 32]"));

  AdapterWeights wrong_count = trained_weights();
  wrong_count.tensors["blk.0.attn_q.weight.lora_a"].values.pop_back();
  EXPECT_THAT(message(wrong_count), HasSubstr("255 values"));

  AdapterWeights not_finite = trained_weights();
  not_finite.tensors["output.weight.lora_a"].values[5] = std::nanf("");
  EXPECT_THAT(message(not_finite), HasSubstr("output.weight.lora_a: a value is nan"));

  AdapterWeights ranks_differ = trained_weights();
  ranks_differ.tensors["output.weight.lora_b"] = {{512, 3}, std::vector<float>(512 * 3, 0.0f)};
  EXPECT_THAT(message(ranks_differ), HasSubstr("output.weight.lora_b: rank 3"));

  AdapterWeights unknown = trained_weights();
  unknown.tensors["blk.0.attn_qkv.weight.lora_a"] = {{4, 64}, std::vector<float>(256, 0.0f)};
  EXPECT_THAT(message(unknown), HasSubstr("blk.0.attn_qkv.weight.lora_a"));

  AdapterWeights qwen = trained_weights();
  qwen.architecture = model::LlamaArchitecture::kQwen2;
  EXPECT_THAT(message(qwen), HasSubstr("architecture qwen2"));

  EXPECT_THAT(message(AdapterWeights{}), HasSubstr("no tensors"));
}

// --- The weights in the kernels' formats ---------------------------------------------------

TEST(AdapterWeightsTest, F16FileIsWrittenExactlyWithBTransposed) {
  RandomAdapterOptions options;
  options.rank = 8;
  options.output = true;
  auto adapter = parse(*make_random_adapter_writer(small_base(), options));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  const int64_t bytes = adapter_weights_bytes(**adapter, LoraWeightFormat::kF16);
  AlignedBuffer buffer(bytes);
  auto slots = write_adapter_weights(**adapter, LoraWeightFormat::kF16, 0.5f, buffer.span);
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->size(), 15u);
  int64_t expected_bytes = 0;
  for (const AdapterTensorPair& pair : (*adapter)->pairs()) {
    const kernels::LoraSlotWeights& slot = (*slots)[pair.target.index];
    const int64_t inputs = pair.target.input_features;
    const int64_t outputs = pair.target.output_features;
    expected_bytes += (inputs * 8 * 2 + 63) / 64 * 64 + (outputs * 8 * 2 + 63) / 64 * 64;
    EXPECT_EQ(slot.rank, 8);
    EXPECT_EQ(slot.scale, 0.5f);  // alpha 8 / rank 8 * user scale 0.5
    EXPECT_EQ(slot.format, LoraWeightFormat::kF16);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slot.a) % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(slot.b) % 64, 0u);
    EXPECT_GE(slot.a, buffer.span.data());
    EXPECT_LE(slot.b + outputs * 8 * 2, buffer.span.data() + bytes);
    const std::vector<float> a = file_values(pair.a);  // [rank, inputs]
    const std::vector<float> b = file_values(pair.b);  // [outputs, rank]
    for (int64_t r = 0; r < 8; ++r) {
      for (int64_t i = 0; i < inputs; ++i) {
        ASSERT_EQ(kernels::read_lora_value(LoraWeightFormat::kF16, slot.a, 8, inputs, r, i),
                  a[r * inputs + i]);
      }
      for (int64_t o = 0; o < outputs; ++o) {
        ASSERT_EQ(kernels::read_lora_value(LoraWeightFormat::kF16, slot.b, 8, outputs, r, o),
                  b[o * 8 + r]);
      }
    }
  }
  EXPECT_EQ(bytes, expected_bytes);
}

TEST(AdapterWeightsTest, Int8IsWithinHalfAStepOfEveryValue) {
  const AdapterWeights weights = trained_weights();
  auto adapter = parse(*make_adapter_writer(small_base(), weights, DType::kBF16));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  AlignedBuffer buffer(adapter_weights_bytes(**adapter, LoraWeightFormat::kInt8));
  auto slots = write_adapter_weights(**adapter, LoraWeightFormat::kInt8, 2.0f, buffer.span);
  ASSERT_TRUE(slots.ok()) << slots.status();
  // Within half a step of the block's scale, max |value| / 127 over its 32 values.
  auto check = [](const std::byte* matrix, const std::vector<float>& expected, int64_t rows,
                  int64_t columns) {
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t column = 0; column < columns; ++column) {
        const int64_t block = column / 32 * 32;
        float largest = 0.0f;
        for (int64_t c = block; c < std::min(columns, block + 32); ++c) {
          largest = std::max(largest, std::fabs(expected[row * columns + c]));
        }
        const float value =
            kernels::read_lora_value(LoraWeightFormat::kInt8, matrix, rows, columns, row, column);
        ASSERT_NEAR(value, expected[row * columns + column], 0.5f * largest / 127.0f * 1.0001f)
            << "row " << row << " column " << column;
      }
    }
  };
  for (const AdapterTensorPair& pair : (*adapter)->pairs()) {
    const kernels::LoraSlotWeights& slot = (*slots)[pair.target.index];
    EXPECT_EQ(slot.scale, 2.0f * 4.0f / static_cast<float>(pair.rank));
    const std::vector<float> b = file_values(pair.b);
    std::vector<float> b_transposed(b.size());
    const int64_t outputs = pair.target.output_features;
    for (int64_t o = 0; o < outputs; ++o) {
      for (int64_t r = 0; r < pair.rank; ++r) b_transposed[r * outputs + o] = b[o * pair.rank + r];
    }
    check(slot.a, file_values(pair.a), pair.rank, pair.target.input_features);
    check(slot.b, b_transposed, pair.rank, outputs);
  }
}

TEST(AdapterWeightsTest, TargetsTheAdapterLacksHaveRankZeroAndNoMatrices) {
  auto adapter = parse(*make_adapter_writer(small_base(), trained_weights(), DType::kF16));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  AlignedBuffer buffer(adapter_weights_bytes(**adapter, LoraWeightFormat::kF16));
  auto slots = write_adapter_weights(**adapter, LoraWeightFormat::kF16, 1.0f, buffer.span);
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->size(), 15u);
  for (int32_t index = 0; index < 15; ++index) {
    const bool present = index == 0 || index == 14;
    EXPECT_EQ((*slots)[index].rank > 0, present) << index;
    EXPECT_EQ((*slots)[index].a != nullptr, present) << index;
    EXPECT_EQ((*slots)[index].b != nullptr, present) << index;
  }
}

TEST(AdapterWeightsTest, ANonFiniteValueIsRefusedNamingTheTensor) {
  RawAdapter raw;
  raw.pair("blk.0.attn_q.weight", 64, 64, 4);
  std::vector<uint16_t> halves(64 * 4, f32_to_f16(0.5f));
  halves[70] = 0x7c00;  // +inf in f16
  std::vector<std::byte> bytes(halves.size() * 2);
  std::memcpy(bytes.data(), halves.data(), bytes.size());
  ASSERT_TRUE(
      raw.writer.add_tensor_bytes("blk.1.attn_q.weight.lora_b", DType::kF16, {4, 64}, bytes).ok());
  raw.tensor("blk.1.attn_q.weight.lora_a", {64, 4});
  auto adapter = parse(raw.writer);
  ASSERT_TRUE(adapter.ok()) << adapter.status();  // values are not read at open
  AlignedBuffer buffer(adapter_weights_bytes(**adapter, LoraWeightFormat::kF16));
  expect_refused(
      write_adapter_weights(**adapter, LoraWeightFormat::kF16, 1.0f, buffer.span).status(),
      {"blk.1.attn_q.weight.lora_b", "inf"});
}

TEST(AdapterScaleTest, IsUserScaleTimesAlphaOverRankOrTheUserScaleWithoutAlpha) {
  EXPECT_EQ(adapter_scale(16.0f, 8, 1.0f), 2.0f);
  EXPECT_EQ(adapter_scale(16.0f, 8, 0.25f), 0.5f);
  EXPECT_EQ(adapter_scale(8.0f, 32, 1.0f), 0.25f);
  EXPECT_EQ(adapter_scale(0.0f, 8, 0.75f), 0.75f);
  EXPECT_EQ(adapter_scale(0.0f, 64, 1.0f), 1.0f);
}

TEST(AdapterScaleTest, SlotsOfAnAdapterWithoutAlphaUseTheUserScale) {
  AdapterWeights weights = trained_weights();
  weights.alpha = 0.0f;
  auto adapter = parse(*make_adapter_writer(small_base(), weights, DType::kF16));
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  AlignedBuffer buffer(adapter_weights_bytes(**adapter, LoraWeightFormat::kF16));
  auto slots = write_adapter_weights(**adapter, LoraWeightFormat::kF16, 0.75f, buffer.span);
  ASSERT_TRUE(slots.ok()) << slots.status();
  EXPECT_EQ((*slots)[0].scale, 0.75f);
  EXPECT_EQ((*slots)[14].scale, 0.75f);
}

}  // namespace
}  // namespace folio::lora
