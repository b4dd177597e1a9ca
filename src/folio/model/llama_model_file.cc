#include "folio/model/llama_model_file.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <vector>

#include "folio/base/random.h"
#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_attention_metadata.h"
#include "folio/model/llama_graph.h"
#include "folio/model/llama_rope_scaling.h"
#include "folio/model/quantization_recipe.h"
#include "folio/tensor/quantize.h"
#include "folio/tokenizer/spm_vocabulary_builder.h"

namespace folio::model {

namespace {

uint64_t stream_seed(uint64_t seed, std::string_view tensor_name) {
  return SplitMix64(seed ^ fnv1a64(tensor_name)).next();
}

// Fills a [rows, row_length] tensor of `dtype` with mean + deviation * z per value, row by
// row, converting each f32 row to the dtype.
gguf::GgufWriter::TensorFill random_fill(DType dtype, int64_t row_length, int64_t rows,
                                         uint64_t seed, double mean, double deviation) {
  return [=](std::span<std::byte> destination) {
    Xoshiro256StarStar random(seed);
    std::vector<float> row(static_cast<size_t>(row_length));
    const int64_t bytes_per_row = row_bytes(dtype, row_length);
    FOLIO_CHECK(static_cast<int64_t>(destination.size()) == bytes_per_row * rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& value : row) {
        value = static_cast<float>(mean + deviation * approximately_normal(random));
      }
      quantize_row(dtype, row.data(), destination.data() + r * bytes_per_row, row_length);
    }
    return Status();
  };
}

// One tensor of a Llama file: its GGUF name, ggml-order dimensions ([row length, rows] or
// [length]), and whether it is a matrix (stored in the weight dtype) or a 1-D f32 tensor.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> dimensions;
  bool matrix;
};

// Every tensor of a file of `shape`, in file order (the list in the header comment).
std::vector<TensorSpec> tensor_specs(const LlamaShape& shape) {
  const int64_t hidden = shape.hidden_size;
  const int64_t q_dim = shape.q_dim();
  const int64_t kv_dim = shape.kv_dim();
  std::vector<TensorSpec> specs;
  auto matrix = [&](std::string name, int64_t row_length, int64_t rows) {
    specs.push_back({std::move(name), {row_length, rows}, true});
  };
  auto vector = [&](std::string name, int64_t length) {
    specs.push_back({std::move(name), {length}, false});
  };
  // llama.cpp's converter writes its extra tensors (rope_freqs) first.
  if (shape.rope_frequency_factors) vector("rope_freqs.weight", shape.head_dim() / 2);
  matrix("token_embd.weight", hidden, shape.vocab_size);
  for (int64_t layer = 0; layer < shape.num_layers; ++layer) {
    const std::string prefix = fmt::format("blk.{}.", layer);
    vector(prefix + "attn_norm.weight", hidden);
    const bool fused = shape.architecture == LlamaArchitecture::kPhi3;
    if (fused) {
      matrix(prefix + "attn_qkv.weight", hidden, q_dim + 2 * kv_dim);
    } else {
      matrix(prefix + "attn_q.weight", hidden, q_dim);
      matrix(prefix + "attn_k.weight", hidden, kv_dim);
      matrix(prefix + "attn_v.weight", hidden, kv_dim);
    }
    if (llama_has_query_key_norm(shape.architecture)) {
      vector(prefix + "attn_q_norm.weight", shape.head_dim());
      vector(prefix + "attn_k_norm.weight", shape.head_dim());
    }
    if (llama_has_attention_bias(shape.architecture)) {
      vector(prefix + "attn_q.bias", q_dim);
      vector(prefix + "attn_k.bias", kv_dim);
      vector(prefix + "attn_v.bias", kv_dim);
    }
    matrix(prefix + "attn_output.weight", q_dim, hidden);
    const bool gemma = llama_is_gemma(shape.architecture);
    if (gemma) vector(prefix + "post_attention_norm.weight", hidden);
    vector(prefix + "ffn_norm.weight", hidden);
    if (fused) {
      matrix(prefix + "ffn_up.weight", hidden, 2 * shape.ffn_size);
    } else {
      matrix(prefix + "ffn_gate.weight", hidden, shape.ffn_size);
      matrix(prefix + "ffn_up.weight", hidden, shape.ffn_size);
    }
    matrix(prefix + "ffn_down.weight", shape.ffn_size, hidden);
    if (gemma) vector(prefix + "post_ffw_norm.weight", hidden);
  }
  vector("output_norm.weight", hidden);
  if (!shape.tie_embeddings) matrix("output.weight", hidden, shape.vocab_size);
  return specs;
}

// The general.* and architecture metadata llama.cpp reads (everything but the vocabulary).
// The key order is part of the file's bytes, which tests pin by hash.
void add_shape_metadata(const LlamaShape& shape, const std::string& name,
                        gguf::GgufWriter& writer) {
  const std::string arch(llama_architecture_name(shape.architecture));
  auto u32 = [](int64_t value) { return gguf::GgufValue::of(static_cast<uint32_t>(value)); };
  writer.set("general.architecture", gguf::GgufValue::of_string(arch));
  writer.set("general.name", gguf::GgufValue::of_string(name));
  writer.set("general.file_type", gguf::GgufValue::of(llama_file_type(shape.weight_dtype)));
  bool quantized = dtype_info(shape.weight_dtype).quantized;
  for (const auto& entry : shape.tensor_dtypes) quantized |= dtype_info(entry.second).quantized;
  if (quantized) {
    writer.set("general.quantization_version", gguf::GgufValue::of<uint32_t>(2));
  }
  writer.set(arch + ".context_length", u32(shape.context_length));
  writer.set(arch + ".embedding_length", u32(shape.hidden_size));
  writer.set(arch + ".block_count", u32(shape.num_layers));
  writer.set(arch + ".feed_forward_length", u32(shape.ffn_size));
  writer.set(arch + ".attention.head_count", u32(shape.num_heads));
  writer.set(arch + ".attention.head_count_kv", u32(shape.num_kv_heads));
  writer.set(arch + ".rope.freq_base", gguf::GgufValue::of(shape.rope_theta));
  writer.set(arch + ".rope.dimension_count", u32(shape.head_dim()));
  writer.set(arch + ".attention.layer_norm_rms_epsilon",
             gguf::GgufValue::of(shape.rms_norm_epsilon));
  writer.set(arch + ".vocab_size", u32(shape.vocab_size));
  if (shape.key_length > 0) {
    writer.set(arch + ".attention.key_length", u32(shape.key_length));
    writer.set(arch + ".attention.value_length", u32(shape.key_length));
  }
  add_attention_metadata(shape, arch + ".", writer);
  add_rope_scaling_metadata(shape.rope_scaling, arch + ".rope.scaling.", writer);
}

Status add_random_tensors(const LlamaShape& shape, uint64_t seed, gguf::GgufWriter& writer) {
  for (TensorSpec& spec : tensor_specs(shape)) {
    const int64_t row_length = spec.dimensions[0];
    const int64_t rows = spec.matrix ? spec.dimensions[1] : 1;
    const uint64_t stream = stream_seed(seed, spec.name);
    gguf::GgufWriter::TensorFill fill;
    DType dtype = DType::kF32;
    if (spec.matrix) {
      // Deviation 1/sqrt(row length): each output of x·W has the variance of one input.
      dtype = shape.matrix_dtype(spec.name);
      fill = random_fill(dtype, row_length, rows, stream, 0.0,
                         1.0 / std::sqrt(static_cast<double>(row_length)));
    } else if (spec.name.ends_with(".bias")) {
      fill = random_fill(dtype, row_length, 1, stream, 0.0, 0.1);
    } else if (spec.name == "rope_freqs.weight") {
      // Divisors of the pairs' frequencies, all positive (|z| <= 2 sqrt 3): 2 +- 0.5 z moves
      // every angle well beyond the tests' tolerances.
      fill = random_fill(dtype, row_length, 1, stream, 2.0, 0.5);
    } else {
      fill = random_fill(dtype, row_length, 1, stream, 1.0, 0.05);
    }
    FOLIO_RETURN_IF_ERROR(
        writer.add_tensor(std::move(spec.name), dtype, std::move(spec.dimensions), fill));
  }
  return Status();
}

// The bytes of one trained tensor: matrices converted row by row to the weight dtype.
Result<std::vector<std::byte>> convert_tensor(const LlamaWeights& weights, const TensorSpec& spec) {
  auto found = weights.tensors.find(spec.name);
  if (found == weights.tensors.end()) return invalid_argument("tensor {} is missing", spec.name);
  const std::vector<float>& values = found->second;
  const int64_t row_length = spec.dimensions[0];
  const int64_t rows = spec.matrix ? spec.dimensions[1] : 1;
  if (static_cast<int64_t>(values.size()) != row_length * rows) {
    return invalid_argument("tensor {} has {} values, its shape [{}] needs {}", spec.name,
                            values.size(), fmt::join(spec.dimensions, ", "), row_length * rows);
  }
  for (float value : values) {
    if (!std::isfinite(value))
      return invalid_argument("tensor {} has a non-finite value", spec.name);
  }
  const DType dtype = spec.matrix ? weights.shape.matrix_dtype(spec.name) : DType::kF32;
  const int64_t bytes_per_row = row_bytes(dtype, row_length);
  std::vector<std::byte> bytes(static_cast<size_t>(bytes_per_row * rows));
  for (int64_t row = 0; row < rows; ++row) {
    quantize_row(dtype, values.data() + row * row_length, bytes.data() + row * bytes_per_row,
                 row_length);
  }
  return bytes;
}

Status check_size(std::string_view field, int64_t value) {
  if (value <= 0 || value > std::numeric_limits<uint32_t>::max()) {
    return invalid_argument("{} = {} must be between 1 and {}", field, value,
                            std::numeric_limits<uint32_t>::max());
  }
  return Status();
}

// Every matrix's dtype is a weight dtype whose quantization blocks tile its rows, and every
// tensor_dtypes entry names a matrix of the shape.
Status validate_matrix_dtypes(const LlamaShape& shape) {
  const std::vector<TensorSpec> specs = tensor_specs(shape);
  for (const auto& entry : shape.tensor_dtypes) {
    const std::string& name = entry.first;
    auto named = [&](const TensorSpec& spec) { return spec.matrix && spec.name == name; };
    if (std::find_if(specs.begin(), specs.end(), named) == specs.end()) {
      return invalid_argument(
          "tensor_dtypes names {}, which is no matrix of a {} model of this "
          "shape",
          name, llama_architecture_name(shape.architecture));
    }
    // q8_0 panels: a matrix LlamaModel repacked at load (never read from or written to a file).
    if (!is_weight_dtype(entry.second) && entry.second != DType::kQ8_0Panels) {
      return invalid_argument("tensor {}: dtype {} is not a dtype Folio computes matrices in", name,
                              dtype_name(entry.second));
    }
  }
  for (const TensorSpec& spec : specs) {
    if (!spec.matrix) continue;
    const DType dtype = shape.matrix_dtype(spec.name);
    const int64_t block = dtype_info(dtype).block_elements;
    if (spec.dimensions[0] % block != 0) {
      return invalid_argument(
          "tensor {} has rows of {} values; {} weights need multiples of {} (hidden_size {}, "
          "ffn_size {})",
          spec.name, spec.dimensions[0], dtype_name(dtype), block, shape.hidden_size,
          shape.ffn_size);
    }
  }
  return Status();
}

// Checks the file's tensors against the shape's list (each present, of its shape, norms and
// biases f32, nothing else) and records the dtype of every matrix that is not the weight dtype.
// The largest block_count a shard file may state: a shard holds fewer tensors than the model
// has layers, so the file's tensor count cannot bound the list built from the count.
constexpr int64_t kMaxShardModelLayers = 4096;

// `shard_tensors`: a shard file's tensors (llama_shard_tensor_names), the only ones required
// and allowed; nullptr for a whole model.
Status read_tensor_dtypes(const gguf::GgufFile& file, LlamaShape& shape,
                          const std::set<std::string, std::less<>>* shard_tensors) {
  // Every layer has several tensors: a layer count above the file's tensor count is refused
  // before the list is built (a corrupt count would otherwise cost memory in proportion).
  if (shard_tensors == nullptr && shape.num_layers > static_cast<int64_t>(file.tensors().size())) {
    return invalid_argument("{}.block_count is {}, but the file holds only {} tensors",
                            llama_architecture_name(shape.architecture), shape.num_layers,
                            file.tensors().size());
  }
  if (shard_tensors != nullptr && shape.num_layers > kMaxShardModelLayers) {
    return invalid_argument("{}.block_count is {}: a shard file's model may have at most {} layers",
                            llama_architecture_name(shape.architecture), shape.num_layers,
                            kMaxShardModelLayers);
  }
  std::vector<TensorSpec> specs = tensor_specs(shape);
  if (shard_tensors != nullptr) {
    std::erase_if(specs,
                  [&](const TensorSpec& spec) { return !shard_tensors->contains(spec.name); });
  }
  for (const TensorSpec& spec : specs) {
    const gguf::GgufTensorInfo* info = file.find_tensor(spec.name);
    if (info == nullptr) {
      return invalid_argument("tensor {} is missing; a {} model of this shape has it", spec.name,
                              llama_architecture_name(shape.architecture));
    }
    if (info->dimensions != spec.dimensions) {
      return invalid_argument("tensor {} has shape [{}], the model's metadata needs [{}]",
                              spec.name, fmt::join(info->dimensions, ", "),
                              fmt::join(spec.dimensions, ", "));
    }
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor tensor, file.tensor(spec.name));
    if (!spec.matrix) {
      if (tensor.dtype != DType::kF32) {
        return invalid_argument("tensor {} is {}; Folio reads norms and biases in f32", spec.name,
                                dtype_name(tensor.dtype));
      }
    } else if (tensor.dtype != shape.weight_dtype) {
      shape.tensor_dtypes.emplace(spec.name, tensor.dtype);
    }
  }
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    auto named = [&](const TensorSpec& spec) { return spec.name == info.name; };
    if (std::find_if(specs.begin(), specs.end(), named) == specs.end()) {
      return invalid_argument(
          "tensor {} is not part of a {} model as Folio runs it; refusing the "
          "file rather than ignoring the tensor",
          info.name, llama_architecture_name(shape.architecture));
    }
  }
  return Status();
}

// attention.key_length / value_length (into key_length when either is present) and
// rope.dimension_count, which must be the head dimension: the attention kernel reads keys and
// values of one width, and Folio rotates whole heads.
Status read_head_dimensions(const gguf::GgufFile& file, const std::string& prefix,
                            LlamaShape& shape) {
  const std::string key_key = prefix + "attention.key_length";
  const std::string value_key = prefix + "attention.value_length";
  if (file.contains(key_key) || file.contains(value_key)) {
    const int64_t derived = shape.num_heads > 0 ? shape.hidden_size / shape.num_heads : 0;
    int64_t key_length = derived;
    int64_t value_length = derived;
    if (file.contains(key_key)) {
      FOLIO_ASSIGN_OR_RETURN(key_length, file.get_integer(key_key));
    }
    if (file.contains(value_key)) {
      FOLIO_ASSIGN_OR_RETURN(value_length, file.get_integer(value_key));
    }
    if (key_length <= 0) return invalid_argument("{} = {} must be positive", key_key, key_length);
    if (key_length != value_length) {
      return invalid_argument(
          "{} = {} differs from {} = {}; Folio's attention needs keys and values of one width",
          key_key, key_length, value_key, value_length);
    }
    shape.key_length = key_length;
  }
  const std::string rotary_key = prefix + "rope.dimension_count";
  // head_dim() divides by the head count when no key_length is given; the count is validated
  // with the other sizes later, so a file with none stops here.
  if (file.contains(rotary_key) && shape.key_length <= 0 && shape.num_heads <= 0) {
    return invalid_argument("{}attention.head_count = {} must be positive", prefix,
                            shape.num_heads);
  }
  if (file.contains(rotary_key)) {
    FOLIO_ASSIGN_OR_RETURN(int64_t rotary_dim, file.get_integer(rotary_key));
    if (rotary_dim != shape.head_dim()) {
      return invalid_argument(
          "{} = {} rotates part of each head of {}; Folio rotates whole heads only", rotary_key,
          rotary_dim, shape.head_dim());
    }
  }
  return Status();
}

}  // namespace

std::string_view llama_architecture_name(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kLlama:
      return "llama";
    case LlamaArchitecture::kQwen2:
      return "qwen2";
    case LlamaArchitecture::kQwen3:
      return "qwen3";
    case LlamaArchitecture::kPhi3:
      return "phi3";
    case LlamaArchitecture::kGemma2:
      return "gemma2";
    case LlamaArchitecture::kGemma3:
      return "gemma3";
  }
  return "invalid";
}

std::string llama_architecture_names() {
  return "llama, qwen2, qwen3, phi3, gemma2, gemma3";
}

LlamaMatrixLocation llama_matrix_location(const LlamaShape& shape, std::string_view name) {
  if (shape.architecture != LlamaArchitecture::kPhi3 || !name.starts_with("blk.")) {
    return {std::string(name), 0, 0};
  }
  const size_t dot = name.find('.', 4);
  if (dot == std::string_view::npos) return {std::string(name), 0, 0};
  const std::string_view prefix = name.substr(0, dot + 1);  // "blk.N."
  const std::string_view projection = name.substr(dot + 1);
  const std::string qkv = fmt::format("{}attn_qkv.weight", prefix);
  const std::string up = fmt::format("{}ffn_up.weight", prefix);
  if (projection == "attn_q.weight") return {qkv, 0, shape.q_dim()};
  if (projection == "attn_k.weight") return {qkv, shape.q_dim(), shape.kv_dim()};
  if (projection == "attn_v.weight") return {qkv, shape.q_dim() + shape.kv_dim(), shape.kv_dim()};
  if (projection == "ffn_gate.weight") return {up, 0, shape.ffn_size};
  if (projection == "ffn_up.weight") return {up, shape.ffn_size, shape.ffn_size};
  return {std::string(name), 0, 0};
}

bool llama_has_attention_bias(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kQwen2:
      return true;
    case LlamaArchitecture::kLlama:
    case LlamaArchitecture::kQwen3:
    case LlamaArchitecture::kPhi3:
    case LlamaArchitecture::kGemma2:
    case LlamaArchitecture::kGemma3:
      return false;
  }
  return false;
}

bool llama_has_query_key_norm(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kQwen3:
    case LlamaArchitecture::kGemma3:
      return true;
    case LlamaArchitecture::kLlama:
    case LlamaArchitecture::kQwen2:
    case LlamaArchitecture::kPhi3:
    case LlamaArchitecture::kGemma2:
      return false;
  }
  return false;
}

bool llama_is_gemma(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kGemma2:
    case LlamaArchitecture::kGemma3:
      return true;
    case LlamaArchitecture::kLlama:
    case LlamaArchitecture::kQwen2:
    case LlamaArchitecture::kQwen3:
    case LlamaArchitecture::kPhi3:
      return false;
  }
  return false;
}

kernels::RopeStyle llama_rope_style(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kLlama:
      return kernels::RopeStyle::kNormal;
    case LlamaArchitecture::kQwen2:
    case LlamaArchitecture::kQwen3:
    case LlamaArchitecture::kPhi3:
    case LlamaArchitecture::kGemma2:
    case LlamaArchitecture::kGemma3:
      return kernels::RopeStyle::kNeox;
  }
  return kernels::RopeStyle::kNormal;
}

std::optional<LlamaArchitecture> llama_architecture_from_name(std::string_view name) {
  if (name == "llama") return LlamaArchitecture::kLlama;
  if (name == "qwen2") return LlamaArchitecture::kQwen2;
  if (name == "qwen3") return LlamaArchitecture::kQwen3;
  if (name == "phi3") return LlamaArchitecture::kPhi3;
  if (name == "gemma2") return LlamaArchitecture::kGemma2;
  if (name == "gemma3") return LlamaArchitecture::kGemma3;
  return std::nullopt;
}

int64_t LlamaShape::parameter_count() const {
  const int64_t hidden = hidden_size;
  int64_t per_layer =
      2 * hidden + 2 * hidden * q_dim() + 2 * hidden * kv_dim() + 3 * hidden * ffn_size;
  if (llama_has_attention_bias(architecture)) per_layer += q_dim() + 2 * kv_dim();
  if (llama_has_query_key_norm(architecture)) per_layer += 2 * head_dim();
  if (llama_is_gemma(architecture)) per_layer += 2 * hidden;  // post-norms
  return hidden * vocab_size * (tie_embeddings ? 1 : 2) + num_layers * per_layer + hidden;
}

DType LlamaShape::matrix_dtype(std::string_view name) const {
  auto found = tensor_dtypes.find(llama_matrix_location(*this, name).tensor);
  return found == tensor_dtypes.end() ? weight_dtype : found->second;
}

namespace {

// validate_llama_shape without the matrix dtypes: what read_llama_shape checks before it reads
// each matrix's dtype from the file (until then every matrix would be taken for blk.0.attn_q's).
Status validate_sizes_and_parameters(const LlamaShape& shape) {
  FOLIO_RETURN_IF_ERROR(check_size("vocab_size", shape.vocab_size));
  FOLIO_RETURN_IF_ERROR(check_size("hidden_size", shape.hidden_size));
  FOLIO_RETURN_IF_ERROR(check_size("num_layers", shape.num_layers));
  FOLIO_RETURN_IF_ERROR(check_size("num_heads", shape.num_heads));
  FOLIO_RETURN_IF_ERROR(check_size("num_kv_heads", shape.num_kv_heads));
  FOLIO_RETURN_IF_ERROR(check_size("ffn_size", shape.ffn_size));
  FOLIO_RETURN_IF_ERROR(check_size("context_length", shape.context_length));
  if (shape.vocab_size < tokenizer::kMinGeneratedVocabularySize) {
    return invalid_argument(
        "vocab_size = {} is below {}: the generated vocabulary needs 3 "
        "special and 256 byte tokens",
        shape.vocab_size, tokenizer::kMinGeneratedVocabularySize);
  }
  if (shape.sliding_window < 0 || shape.sliding_window > std::numeric_limits<int32_t>::max()) {
    return invalid_argument("sliding_window = {} must be in 0..2^31 - 1 (0: no window)",
                            shape.sliding_window);
  }
  if (shape.key_length < 0) {
    return invalid_argument("key_length = {} must not be negative (0: hidden_size / num_heads)",
                            shape.key_length);
  }
  if (shape.key_length > 0) FOLIO_RETURN_IF_ERROR(check_size("key_length", shape.key_length));
  if (shape.key_length == 0 && shape.hidden_size % shape.num_heads != 0) {
    return invalid_argument("hidden_size = {} is not a multiple of num_heads = {}",
                            shape.hidden_size, shape.num_heads);
  }
  if (shape.head_dim() % 2 != 0) {
    return invalid_argument("head dimension {} is odd; RoPE needs pairs", shape.head_dim());
  }
  if (shape.num_heads % shape.num_kv_heads != 0) {
    return invalid_argument("num_heads = {} is not a multiple of num_kv_heads = {}",
                            shape.num_heads, shape.num_kv_heads);
  }
  if (!is_weight_dtype(shape.weight_dtype)) {
    return invalid_argument("weight dtype {} is not f32, f16, bf16 or a block-quantized type",
                            dtype_name(shape.weight_dtype));
  }
  if (!(std::isfinite(shape.rope_theta) && shape.rope_theta > 0)) {
    return invalid_argument("rope_theta = {} must be positive and finite", shape.rope_theta);
  }
  FOLIO_RETURN_IF_ERROR(validate_rope_scaling(shape.rope_scaling, shape.rope_frequency_factors));
  if (!(std::isfinite(shape.rms_norm_epsilon) && shape.rms_norm_epsilon > 0)) {
    return invalid_argument("rms_norm_epsilon = {} must be positive and finite",
                            shape.rms_norm_epsilon);
  }
  return validate_attention_metadata(shape);
}

}  // namespace

Status validate_llama_shape(const LlamaShape& shape) {
  FOLIO_RETURN_IF_ERROR(validate_sizes_and_parameters(shape));
  return validate_matrix_dtypes(shape);
}

Result<gguf::GgufWriter> make_random_llama_writer(const LlamaShape& shape, uint64_t seed) {
  FOLIO_RETURN_IF_ERROR(validate_llama_shape(shape));
  gguf::GgufWriter writer;
  const std::string arch(llama_architecture_name(shape.architecture));
  add_shape_metadata(shape, fmt::format("folio random {}", arch), writer);
  writer.set("folio.random_seed", gguf::GgufValue::of(seed));
  FOLIO_ASSIGN_OR_RETURN(tokenizer::Vocabulary vocabulary,
                         tokenizer::build_llama_vocabulary(shape.vocab_size));
  tokenizer::write_vocabulary_metadata(vocabulary, writer);
  FOLIO_RETURN_IF_ERROR(add_random_tensors(shape, seed, writer));
  return writer;
}

Result<gguf::GgufWriter> make_llama_writer(const LlamaWeights& weights) {
  FOLIO_RETURN_IF_ERROR(validate_llama_shape(weights.shape));
  FOLIO_RETURN_IF_ERROR(tokenizer::validate_vocabulary(weights.vocabulary));
  if (weights.vocabulary.size() != weights.shape.vocab_size) {
    return invalid_argument("the vocabulary has {} tokens, the shape's vocab_size is {}",
                            weights.vocabulary.size(), weights.shape.vocab_size);
  }
  const std::vector<TensorSpec> specs = tensor_specs(weights.shape);
  for (const auto& tensor : weights.tensors) {
    // Not a structured binding: clang 14 (the fuzz build) cannot capture one in a lambda.
    const std::string& name = tensor.first;
    auto known = [&](const TensorSpec& spec) { return spec.name == name; };
    if (std::find_if(specs.begin(), specs.end(), known) == specs.end()) {
      return invalid_argument("tensor {} is not part of a {} model of this shape", name,
                              llama_architecture_name(weights.shape.architecture));
    }
  }
  gguf::GgufWriter writer;
  add_shape_metadata(weights.shape, weights.name, writer);
  tokenizer::write_vocabulary_metadata(weights.vocabulary, writer);
  for (const TensorSpec& spec : specs) {
    FOLIO_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, convert_tensor(weights, spec));
    const DType dtype = spec.matrix ? weights.shape.matrix_dtype(spec.name) : DType::kF32;
    FOLIO_RETURN_IF_ERROR(
        writer.add_tensor_bytes(spec.name, dtype, spec.dimensions, std::move(bytes)));
  }
  return writer;
}

Status write_random_llama_model(const std::string& path, const LlamaShape& shape, uint64_t seed) {
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufWriter writer, make_random_llama_writer(shape, seed));
  return writer.write_file(path);
}

namespace {

// What a whole model's file says through tensors, a shard file says through its keys.
Status read_shard_facts(const gguf::GgufFile& file, LlamaShape& shape) {
  FOLIO_ASSIGN_OR_RETURN(shape.vocab_size, file.get_integer(kLlamaShardVocabSizeKey));
  FOLIO_ASSIGN_OR_RETURN(std::string_view dtype, file.get_string(kLlamaShardWeightDtypeKey));
  const std::optional<DType> weight_dtype = dtype_from_name(dtype);
  if (!weight_dtype.has_value()) {
    return invalid_argument("{}: {} '{}' is not a dtype", file.source(), kLlamaShardWeightDtypeKey,
                            dtype);
  }
  shape.weight_dtype = *weight_dtype;
  FOLIO_ASSIGN_OR_RETURN(shape.tie_embeddings, file.get_bool(kLlamaShardTiedKey));
  return Status();
}

}  // namespace

Result<std::vector<std::string>> llama_shard_tensor_names(const LlamaShape& shape,
                                                          const LlamaShard& shard) {
  if (shard.first_layer < 0 || shard.first_layer >= shard.end_layer ||
      shard.end_layer > shape.num_layers) {
    return invalid_argument("shard layers [{}, {}) are not a non-empty range of the model's {}",
                            shard.first_layer, shard.end_layer, shape.num_layers);
  }
  LlamaGraphOptions options;
  options.first_layer = shard.first_layer;
  options.end_layer = shard.end_layer;
  const ir::KvCacheShape kv_cache{
      llama_stage_kv_cache_geometry(shape, shard.end_layer - shard.first_layer, 16, DType::kF32), 2,
      1};
  FOLIO_ASSIGN_OR_RETURN(
      const ir::Graph graph,
      build_llama_step_graph(shape, ir::StepShape{1, 1, 1, ir::StepPhase::kPrefill}, kv_cache,
                             options));
  std::set<std::string> names;
  for (const ir::TensorInfo& tensor : graph.tensors()) {
    if (tensor.residency == ir::Residency::kWeight) {
      names.insert(llama_matrix_location(shape, tensor.name).tensor);
    }
  }
  return std::vector<std::string>(names.begin(), names.end());
}

void set_llama_shard_keys(gguf::GgufWriter& writer, const LlamaShape& shape,
                          const LlamaShard& shard) {
  writer.set(std::string(kLlamaShardFirstLayerKey),
             gguf::GgufValue::of(static_cast<uint32_t>(shard.first_layer)));
  writer.set(std::string(kLlamaShardEndLayerKey),
             gguf::GgufValue::of(static_cast<uint32_t>(shard.end_layer)));
  writer.set(std::string(kLlamaShardVocabSizeKey),
             gguf::GgufValue::of(static_cast<uint64_t>(shape.vocab_size)));
  writer.set(std::string(kLlamaShardWeightDtypeKey),
             gguf::GgufValue::of_string(std::string(dtype_name(shape.weight_dtype))));
  writer.set(std::string(kLlamaShardTiedKey), gguf::GgufValue::of(shape.tie_embeddings));
}

Result<std::optional<LlamaShard>> read_llama_shard(const gguf::GgufFile& file) {
  if (!file.contains(kLlamaShardFirstLayerKey) && !file.contains(kLlamaShardEndLayerKey)) {
    return std::optional<LlamaShard>();
  }
  LlamaShard shard;
  FOLIO_ASSIGN_OR_RETURN(shard.first_layer, file.get_integer(kLlamaShardFirstLayerKey));
  FOLIO_ASSIGN_OR_RETURN(shard.end_layer, file.get_integer(kLlamaShardEndLayerKey));
  if (shard.first_layer < 0 || shard.first_layer >= shard.end_layer) {
    return invalid_argument("{}: shard layers [{}, {}) are not a non-empty range", file.source(),
                            shard.first_layer, shard.end_layer);
  }
  return std::optional<LlamaShard>(shard);
}

Result<LlamaShape> read_llama_shape(const gguf::GgufFile& file) {
  FOLIO_ASSIGN_OR_RETURN(std::string_view name, file.get_string("general.architecture"));
  const std::optional<LlamaArchitecture> architecture = llama_architecture_from_name(name);
  if (!architecture) {
    return invalid_argument("{}: general.architecture '{}' is not one Folio runs ({})",
                            file.source(), name, llama_architecture_names());
  }
  LlamaShape shape;
  shape.architecture = *architecture;
  const std::string prefix = std::string(name) + ".";
  FOLIO_ASSIGN_OR_RETURN(shape.hidden_size, file.get_integer(prefix + "embedding_length"));
  FOLIO_ASSIGN_OR_RETURN(shape.num_layers, file.get_integer(prefix + "block_count"));
  FOLIO_ASSIGN_OR_RETURN(shape.ffn_size, file.get_integer(prefix + "feed_forward_length"));
  FOLIO_ASSIGN_OR_RETURN(shape.num_heads, file.get_integer(prefix + "attention.head_count"));
  FOLIO_ASSIGN_OR_RETURN(shape.context_length, file.get_integer(prefix + "context_length"));
  shape.num_kv_heads = shape.num_heads;
  if (file.contains(prefix + "attention.head_count_kv")) {
    FOLIO_ASSIGN_OR_RETURN(shape.num_kv_heads,
                           file.get_integer(prefix + "attention.head_count_kv"));
  }
  if (file.contains(prefix + "rope.freq_base")) {
    FOLIO_ASSIGN_OR_RETURN(double theta, file.get_floating(prefix + "rope.freq_base"));
    shape.rope_theta = static_cast<float>(theta);
  }
  FOLIO_ASSIGN_OR_RETURN(double epsilon,
                         file.get_floating(prefix + "attention.layer_norm_rms_epsilon"));
  shape.rms_norm_epsilon = static_cast<float>(epsilon);
  FOLIO_RETURN_IF_ERROR(read_head_dimensions(file, prefix, shape));
  FOLIO_ASSIGN_OR_RETURN(shape.rope_scaling, read_rope_scaling(file, prefix, shape.context_length));
  shape.rope_frequency_factors = file.find_tensor("rope_freqs.weight") != nullptr;
  // The converter's rope_freqs are the llama3 factors themselves: the tensor replaces the keys.
  if (shape.rope_frequency_factors && shape.rope_scaling.kind == ir::RopeScalingKind::kLlama3) {
    shape.rope_scaling = ir::RopeScaling{};
  }
  FOLIO_RETURN_IF_ERROR(read_attention_metadata(file, prefix, shape));
  if (file.contains(prefix + "expert_count")) {
    FOLIO_ASSIGN_OR_RETURN(int64_t experts, file.get_integer(prefix + "expert_count"));
    if (experts > 0) {
      return invalid_argument(
          "{}: {}expert_count = {}: mixture-of-experts feed-forward layers are not implemented",
          file.source(), prefix, experts);
    }
  }

  FOLIO_ASSIGN_OR_RETURN(const std::optional<LlamaShard> shard, read_llama_shard(file));
  if (shard.has_value()) {
    FOLIO_RETURN_IF_ERROR(read_shard_facts(file, shape));
  } else {
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor embedding, file.tensor("token_embd.weight"));
    const std::vector<int64_t>& dimensions = embedding.info->dimensions;
    if (dimensions.size() != 2 || dimensions[0] != shape.hidden_size) {
      return invalid_argument("{}: token_embd.weight has shape [{}], expected [{}, vocab]",
                              file.source(), fmt::join(dimensions, ", "), shape.hidden_size);
    }
    shape.vocab_size = dimensions[1];
    FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor query,
                           file.tensor(llama_matrix_location(shape, "blk.0.attn_q.weight").tensor));
    shape.weight_dtype = query.dtype;
    shape.tie_embeddings = file.find_tensor("output.weight") == nullptr;
  }
  Status status = validate_sizes_and_parameters(shape);
  if (status.ok() && shard.has_value()) {
    Result<std::vector<std::string>> names = llama_shard_tensor_names(shape, *shard);
    if (!names.ok()) return names.status().with_context(file.source());
    const std::set<std::string, std::less<>> shard_tensors(names->begin(), names->end());
    status = read_tensor_dtypes(file, shape, &shard_tensors);
  } else if (status.ok()) {
    status = read_tensor_dtypes(file, shape, nullptr);
  }
  if (status.ok()) status = validate_llama_shape(shape);
  if (!status.ok()) return status.with_context(file.source());
  return shape;
}

}  // namespace folio::model
