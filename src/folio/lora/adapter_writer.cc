#include "folio/lora/adapter_writer.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>

#include "folio/base/random.h"
#include "folio/tensor/quantize.h"

namespace folio::lora {
namespace {

constexpr std::string_view kSuffixA = ".lora_a";
constexpr std::string_view kSuffixB = ".lora_b";

Status check_dtype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
      return Status();
    case DType::kQ4_0:
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
    case DType::kIQ4_NL:
    case DType::kIQ4_XS:
      break;
  }
  return invalid_argument("adapter dtype {} is not supported: use f32, f16, bf16 or q8_0",
                          dtype_name(dtype));
}

Status check_rank(int64_t rank, const model::LlamaShape& base) {
  if (rank < 1 || rank > base.hidden_size) {
    return invalid_argument("rank {} must be between 1 and the base model's hidden size {}", rank,
                            base.hidden_size);
  }
  return Status();
}

// The metadata llama.cpp's adapter loader reads, in a fixed order (the order is part of the
// file's bytes, which the reference goldens pin by hash).
void add_metadata(const model::LlamaShape& base, const std::string& name, float alpha,
                  bool any_q8_0, gguf::GgufWriter& writer) {
  writer.set("general.architecture",
             gguf::GgufValue::of_string(std::string(llama_architecture_name(base.architecture))));
  writer.set("general.type", gguf::GgufValue::of_string("adapter"));
  writer.set("general.name", gguf::GgufValue::of_string(name));
  writer.set("adapter.type", gguf::GgufValue::of_string("lora"));
  writer.set("adapter.lora.alpha", gguf::GgufValue::of(alpha));
  if (any_q8_0) writer.set("general.quantization_version", gguf::GgufValue::of<uint32_t>(2));
}

// Rows of f32 values converted one by one to the tensor's dtype.
std::vector<std::byte> convert_rows(DType dtype, const float* values, int64_t row_length,
                                    int64_t rows) {
  const int64_t bytes_per_row = row_bytes(dtype, row_length);
  std::vector<std::byte> bytes(static_cast<size_t>(bytes_per_row * rows));
  for (int64_t row = 0; row < rows; ++row) {
    quantize_row(dtype, values + row * row_length, bytes.data() + row * bytes_per_row, row_length);
  }
  return bytes;
}

uint64_t stream_seed(uint64_t seed, std::string_view tensor_name) {
  // The model files' recipe (llama_model_file.cc): one stream per tensor, from seed and name.
  return SplitMix64(seed ^ fnv1a64(tensor_name)).next();
}

// A tensor of `rows` rows of `row_length` values deviation * z, generated while writing.
Status add_random_tensor(gguf::GgufWriter& writer, std::string name, DType dtype,
                         int64_t row_length, int64_t rows, uint64_t seed, double deviation) {
  const uint64_t stream = stream_seed(seed, name);
  auto fill = [=](std::span<std::byte> destination) {
    Xoshiro256StarStar random(stream);
    std::vector<float> row(static_cast<size_t>(row_length));
    const int64_t bytes_per_row = row_bytes(dtype, row_length);
    FOLIO_CHECK(static_cast<int64_t>(destination.size()) == bytes_per_row * rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& value : row) value = static_cast<float>(deviation * approximately_normal(random));
      quantize_row(dtype, row.data(), destination.data() + r * bytes_per_row, row_length);
    }
    return Status();
  };
  return writer.add_tensor(std::move(name), dtype, {row_length, rows}, fill);
}

}  // namespace

DType adapter_tensor_dtype(DType requested, int64_t row_length) {
  if (requested == DType::kQ8_0 && row_length % kQuantBlockElements != 0) return DType::kF16;
  return requested;
}

Result<gguf::GgufWriter> make_random_adapter_writer(const model::LlamaShape& base,
                                                    const RandomAdapterOptions& options) {
  FOLIO_RETURN_IF_ERROR(model::validate_llama_shape(base));
  FOLIO_RETURN_IF_ERROR(check_rank(options.rank, base));
  FOLIO_RETURN_IF_ERROR(check_dtype(options.dtype));
  if (options.projections.empty() && !options.output) {
    return invalid_argument("a random adapter needs at least one target projection");
  }
  std::set<model::LlamaProjection> projections;
  for (model::LlamaProjection projection : options.projections) {
    if (!projections.insert(projection).second) {
      return invalid_argument("target {} is listed twice",
                              model::llama_projection_name(projection));
    }
  }
  if (options.output && base.tie_embeddings) {
    return invalid_argument(
        "the base model ties its LM head to the token embedding, so output.weight cannot be a "
        "target");
  }
  const float alpha = options.alpha.value_or(static_cast<float>(options.rank));
  if (!std::isfinite(alpha)) return invalid_argument("alpha {} is not finite", alpha);

  const int64_t rank = options.rank;
  const std::vector<model::AdapterTarget> all_targets = model::llama_adapter_targets(base);
  const int32_t num_layer_targets =
      static_cast<int32_t>(base.num_layers) * model::kLlamaProjectionsPerLayer;
  std::vector<const model::AdapterTarget*> targets;
  bool any_q8_0 = false;
  for (const model::AdapterTarget& target : all_targets) {
    // Indices below num_layer_targets are layer * 7 + projection (llama_adapter_targets.h).
    const bool wanted = target.index < num_layer_targets
                            ? projections.contains(static_cast<model::LlamaProjection>(
                                  target.index % model::kLlamaProjectionsPerLayer))
                            : options.output;
    if (!wanted) continue;
    targets.push_back(&target);
    any_q8_0 = any_q8_0 ||
               adapter_tensor_dtype(options.dtype, target.input_features) == DType::kQ8_0 ||
               adapter_tensor_dtype(options.dtype, rank) == DType::kQ8_0;
  }

  gguf::GgufWriter writer;
  add_metadata(base, options.name, alpha, any_q8_0, writer);
  writer.set("folio.random_seed", gguf::GgufValue::of(options.seed));
  const double b_deviation = kRandomAdapterUpdateFraction / std::sqrt(static_cast<double>(rank));
  for (const model::AdapterTarget* target : targets) {
    const int64_t inputs = target->input_features;
    FOLIO_RETURN_IF_ERROR(add_random_tensor(writer, target->weight_name + std::string(kSuffixA),
                                            adapter_tensor_dtype(options.dtype, inputs), inputs,
                                            rank, options.seed,
                                            1.0 / std::sqrt(static_cast<double>(inputs))));
    FOLIO_RETURN_IF_ERROR(add_random_tensor(writer, target->weight_name + std::string(kSuffixB),
                                            adapter_tensor_dtype(options.dtype, rank), rank,
                                            target->output_features, options.seed, b_deviation));
  }
  return writer;
}

namespace {

// The checks of one trained tensor that need no other tensor. `rows, row_length` is its
// PyTorch shape; `expected_rows` / `expected_row_length` are what its target fixes (-1: the
// rank, free here).
Status check_values(const std::string& name, const AdapterTensorValues& tensor,
                    int64_t expected_rows, int64_t expected_row_length) {
  if (tensor.shape.size() != 2 || tensor.shape[0] <= 0 || tensor.shape[1] <= 0) {
    return invalid_argument("tensor {}: shape [{}] must be [rows, row length], both positive", name,
                            fmt::join(tensor.shape, ", "));
  }
  const int64_t rows = tensor.shape[0];
  const int64_t row_length = tensor.shape[1];
  if ((expected_rows >= 0 && rows != expected_rows) ||
      (expected_row_length >= 0 && row_length != expected_row_length)) {
    return invalid_argument(
        "tensor {}: shape [{}, {}] does not fit the base model, which needs "
        "[{}, {}] (lora_a is [rank, input features], lora_b [output "
        "features, rank])",
        name, rows, row_length, expected_rows >= 0 ? fmt::to_string(expected_rows) : "rank",
        expected_row_length >= 0 ? fmt::to_string(expected_row_length) : "rank");
  }
  if (static_cast<int64_t>(tensor.values.size()) != rows * row_length) {
    return invalid_argument("tensor {}: {} values, its shape [{}, {}] needs {}", name,
                            tensor.values.size(), rows, row_length, rows * row_length);
  }
  for (float value : tensor.values) {
    if (!std::isfinite(value)) return invalid_argument("tensor {}: a value is {}", name, value);
  }
  return Status();
}

struct TrainedPair {
  const model::AdapterTarget* target = nullptr;
  const std::string* a_name = nullptr;
  const AdapterTensorValues* a = nullptr;
  const std::string* b_name = nullptr;
  const AdapterTensorValues* b = nullptr;
};

// The trained tensors grouped into pairs by target index, each checked against its target.
Result<std::map<int32_t, TrainedPair>> trained_pairs(
    const model::LlamaShape& base, const std::vector<model::AdapterTarget>& targets,
    const AdapterWeights& weights) {
  std::map<int32_t, TrainedPair> pairs;
  for (const auto& [name, tensor] : weights.tensors) {
    const bool is_a = name.ends_with(kSuffixA);
    if (!is_a && !name.ends_with(kSuffixB)) {
      return invalid_argument("tensor {}: a LoRA tensor's name ends in {} or {}", name, kSuffixA,
                              kSuffixB);
    }
    const std::string_view weight_name =
        std::string_view(name).substr(0, name.size() - kSuffixA.size());
    auto target = std::find_if(targets.begin(), targets.end(),
                               [&](const auto& t) { return t.weight_name == weight_name; });
    if (target == targets.end()) {
      return invalid_argument(
          "tensor {}: '{}' is not a projection of the base model an adapter may update "
          "(attn_q/k/v/output, ffn_gate/up/down of blk.0 to blk.{}{})",
          name, weight_name, base.num_layers - 1,
          base.tie_embeddings ? "; the LM head is tied to the embedding" : ", output.weight");
    }
    if (is_a) {
      FOLIO_RETURN_IF_ERROR(check_values(name, tensor, -1, target->input_features));
    } else {
      FOLIO_RETURN_IF_ERROR(check_values(name, tensor, target->output_features, -1));
    }
    TrainedPair& pair = pairs[target->index];
    pair.target = &*target;
    (is_a ? pair.a_name : pair.b_name) = &name;
    (is_a ? pair.a : pair.b) = &tensor;
  }
  for (const auto& [index, pair] : pairs) {
    const std::string suffix(pair.a == nullptr ? kSuffixA : kSuffixB);
    if (pair.a == nullptr || pair.b == nullptr) {
      return invalid_argument("tensor {}: {}{} is missing: a LoRA pair needs both",
                              pair.a != nullptr ? *pair.a_name : *pair.b_name,
                              pair.target->weight_name, suffix);
    }
    const int64_t rank = pair.a->shape[0];
    if (pair.b->shape[1] != rank) {
      return invalid_argument("tensor {}: rank {} differs from {}'s rank {}", *pair.b_name,
                              pair.b->shape[1], *pair.a_name, rank);
    }
    FOLIO_RETURN_IF_ERROR(check_rank(rank, base).with_context(*pair.a_name));
  }
  if (pairs.empty()) return invalid_argument("the adapter has no tensors");
  return pairs;
}

}  // namespace

Result<gguf::GgufWriter> make_adapter_writer(const model::LlamaShape& base,
                                             const AdapterWeights& weights, DType dtype) {
  FOLIO_RETURN_IF_ERROR(model::validate_llama_shape(base));
  FOLIO_RETURN_IF_ERROR(check_dtype(dtype));
  if (weights.architecture != base.architecture) {
    return invalid_argument("the adapter's architecture {} is not the base model's {}",
                            model::llama_architecture_name(weights.architecture),
                            model::llama_architecture_name(base.architecture));
  }
  if (!std::isfinite(weights.alpha)) {
    return invalid_argument("alpha {} is not finite", weights.alpha);
  }
  const std::vector<model::AdapterTarget> targets = model::llama_adapter_targets(base);
  FOLIO_ASSIGN_OR_RETURN(auto pairs, trained_pairs(base, targets, weights));
  bool any_q8_0 = false;
  for (const auto& [index, pair] : pairs) {
    any_q8_0 = any_q8_0 || adapter_tensor_dtype(dtype, pair.a->shape[1]) == DType::kQ8_0 ||
               adapter_tensor_dtype(dtype, pair.b->shape[1]) == DType::kQ8_0;
  }
  gguf::GgufWriter writer;
  add_metadata(base, weights.name, weights.alpha, any_q8_0, writer);
  for (const auto& [index, pair] : pairs) {
    // PyTorch [rows, row length] is ggml [row length, rows]: the values are already in order.
    for (const auto& [name, tensor] :
         {std::pair{pair.a_name, pair.a}, std::pair{pair.b_name, pair.b}}) {
      const int64_t rows = tensor->shape[0];
      const int64_t row_length = tensor->shape[1];
      const DType tensor_dtype = adapter_tensor_dtype(dtype, row_length);
      FOLIO_RETURN_IF_ERROR(writer.add_tensor_bytes(
          *name, tensor_dtype, {row_length, rows},
          convert_rows(tensor_dtype, tensor->values.data(), row_length, rows)));
    }
  }
  return writer;
}

}  // namespace folio::lora
