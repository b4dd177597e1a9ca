#include "folio/lora/adapter_file.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string_view>

#include "folio/base/random.h"
#include "folio/tensor/quantize.h"

namespace folio::lora {
namespace {

constexpr std::string_view kSuffixA = ".lora_a";
constexpr std::string_view kSuffixB = ".lora_b";

template <typename... Args>
Status file_error(const std::string& source, fmt::format_string<Args...> format, Args&&... args) {
  return invalid_argument("LoRA adapter {}: {}", source,
                          fmt::format(format, std::forward<Args>(args)...));
}

// The reader's errors already name the file: they get the prefix only. A missing or mistyped
// key is kInvalidArgument whatever the reader says: the file is well-formed, not an adapter.
Status reader_error(const Status& status, std::string_view hint = "") {
  return invalid_argument("LoRA adapter {}{}", status.message(), hint);
}

template <typename... Args>
Status tensor_error(const std::string& source, std::string_view tensor,
                    fmt::format_string<Args...> format, Args&&... args) {
  return invalid_argument("LoRA adapter {}: tensor '{}': {}", source, tensor,
                          fmt::format(format, std::forward<Args>(args)...));
}

int64_t aligned(int64_t bytes) {
  return (bytes + kAdapterMatrixAlignment - 1) / kAdapterMatrixAlignment * kAdapterMatrixAlignment;
}

// A required metadata string with the value llama.cpp insists on.
Status check_string(const gguf::GgufFile& file, std::string_view key, std::string_view expected,
                    std::string_view why) {
  Result<std::string_view> value = file.get_string(key);
  if (!value.ok()) {
    return reader_error(value.status(),
                        fmt::format(" (a LoRA adapter has {} = \"{}\"; {})", key, expected, why));
  }
  if (*value != expected) {
    return file_error(file.source(), "{} is \"{}\", expected \"{}\" ({})", key, *value, expected,
                      why);
  }
  return Status();
}

Result<float> read_alpha(const gguf::GgufFile& file) {
  constexpr std::string_view kAlphaKey = "adapter.lora.alpha";
  if (!file.contains(kAlphaKey)) return 0.0f;
  Result<double> alpha = file.get_floating(kAlphaKey);
  if (!alpha.ok()) return reader_error(alpha.status());
  if (!std::isfinite(*alpha) || std::fabs(*alpha) > std::numeric_limits<float>::max()) {
    return file_error(file.source(), "{} = {} is not a finite f32", kAlphaKey, *alpha);
  }
  return static_cast<float>(*alpha);
}

// The two halves found for one base name while scanning the tensor table.
struct HalfPair {
  const gguf::GgufTensorInfo* a = nullptr;
  const gguf::GgufTensorInfo* b = nullptr;
};

// Sorts the file's tensors into pairs by base name; skips the norm tensors llama.cpp skips.
Result<std::map<std::string, HalfPair>> collect_halves(const gguf::GgufFile& file) {
  std::map<std::string, HalfPair> halves;
  for (const gguf::GgufTensorInfo& info : file.tensors()) {
    const std::string_view name = info.name;
    const bool is_a = name.ends_with(kSuffixA);
    const bool is_b = name.ends_with(kSuffixB);
    if (!is_a && !is_b) {
      // mergekit adds full norm vectors to adapters; llama.cpp ignores them, and so does Folio.
      if (name.ends_with("_norm.weight")) continue;
      return tensor_error(file.source(), name,
                          "unexpected name: a LoRA adapter's tensors end in {} or {}", kSuffixA,
                          kSuffixB);
    }
    const std::string base_name(name.substr(0, name.size() - kSuffixA.size()));
    // A low-rank update of a norm vector is not a projection update; skipped like the vectors.
    if (base_name.ends_with("_norm.weight")) continue;
    HalfPair& pair = halves[base_name];
    (is_a ? pair.a : pair.b) = &info;
  }
  return halves;
}

// A tensor of the pair as a GgufTensor, with the checks every half gets.
Result<gguf::GgufTensor> checked_half(const gguf::GgufFile& file,
                                      const gguf::GgufTensorInfo& info) {
  if (info.dimensions.size() != 2) {
    return tensor_error(file.source(), info.name,
                        "has {} dimensions; LoRA matrices have 2 (ggml [row length, rows])",
                        info.dimensions.size());
  }
  Result<gguf::GgufTensor> tensor = file.tensor(info.name);
  if (!tensor.ok()) return reader_error(tensor.status());
  if (!is_weight_dtype(tensor->dtype)) {
    return tensor_error(file.source(), info.name,
                        "dtype {} is not one a LoRA adapter may use (f32, f16, bf16, q8_0, q4_0)",
                        dtype_name(tensor->dtype));
  }
  return tensor;
}

// One pair against its target: shapes, rank.
Result<AdapterTensorPair> check_pair(const gguf::GgufFile& file, const model::LlamaShape& base,
                                     const model::AdapterTarget& target, const HalfPair& halves) {
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor a, checked_half(file, *halves.a));
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufTensor b, checked_half(file, *halves.b));
  const std::vector<int64_t>& a_dimensions = halves.a->dimensions;
  const std::vector<int64_t>& b_dimensions = halves.b->dimensions;
  // The rank is read from B, as llama.cpp does; A's must agree.
  const int64_t rank = b_dimensions[0];
  if (a_dimensions[0] != target.input_features) {
    return tensor_error(file.source(), halves.a->name,
                        "ggml shape [{}, {}]: its row length must be {}'s input features, {} "
                        "(an adapter made for another base model?)",
                        a_dimensions[0], a_dimensions[1], target.weight_name,
                        target.input_features);
  }
  if (b_dimensions[1] != target.output_features) {
    return tensor_error(file.source(), halves.b->name,
                        "ggml shape [{}, {}]: its rows must be {}'s output features, {} (an "
                        "adapter made for another base model?)",
                        b_dimensions[0], b_dimensions[1], target.weight_name,
                        target.output_features);
  }
  if (a_dimensions[1] != rank) {
    return tensor_error(file.source(), halves.a->name,
                        "rank {} differs from {}'s rank {} (ggml A is [input features, rank], B "
                        "[rank, output features])",
                        a_dimensions[1], halves.b->name, rank);
  }
  if (rank <= 0) {
    return tensor_error(file.source(), halves.b->name, "rank 0: a LoRA pair has rank 1 or more");
  }
  if (rank > base.hidden_size || rank > std::numeric_limits<int32_t>::max()) {
    return tensor_error(file.source(), halves.b->name,
                        "rank {} is larger than the base model's hidden size {}", rank,
                        base.hidden_size);
  }
  return AdapterTensorPair{target, a, b, rank};
}

}  // namespace

AdapterFile::AdapterFile(std::optional<gguf::MappedFile> mapping, std::vector<uint8_t> owned_bytes,
                         gguf::GgufFile file)
    : mapping_(std::move(mapping)), owned_bytes_(std::move(owned_bytes)), file_(std::move(file)) {}

Result<std::unique_ptr<AdapterFile>> AdapterFile::open(const std::string& path,
                                                       const model::LlamaShape& base) {
  FOLIO_ASSIGN_OR_RETURN(gguf::MappedFile mapping, gguf::MappedFile::open(path));
  const std::span<const uint8_t> bytes = mapping.bytes();
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::parse(bytes, path));
  // The mapping keeps its address when moved, so the spans `file` holds stay valid.
  std::unique_ptr<AdapterFile> adapter(
      new AdapterFile(std::move(mapping), std::vector<uint8_t>(), std::move(file)));
  adapter->content_hash_ = fnv1a64(bytes);
  return validate(std::move(adapter), base);
}

Result<std::unique_ptr<AdapterFile>> AdapterFile::parse(std::vector<uint8_t> bytes,
                                                        std::string source,
                                                        const model::LlamaShape& base) {
  const uint64_t hash = fnv1a64(bytes);
  FOLIO_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::parse(bytes, std::move(source)));
  // A moved vector keeps its buffer, so the spans `file` holds stay valid.
  std::unique_ptr<AdapterFile> adapter(
      new AdapterFile(std::nullopt, std::move(bytes), std::move(file)));
  adapter->content_hash_ = hash;
  return validate(std::move(adapter), base);
}

Result<std::unique_ptr<AdapterFile>> AdapterFile::validate(std::unique_ptr<AdapterFile> adapter,
                                                           const model::LlamaShape& base) {
  const gguf::GgufFile& file = adapter->file_;
  FOLIO_RETURN_IF_ERROR(check_string(file, "general.type", "adapter",
                                     "is this a model file rather than an adapter?"));
  FOLIO_RETURN_IF_ERROR(
      check_string(file, "adapter.type", "lora", "only LoRA adapters are supported"));
  const std::string_view architecture = model::llama_architecture_name(base.architecture);
  FOLIO_RETURN_IF_ERROR(
      check_string(file, "general.architecture", architecture, "the base model's architecture"));
  FOLIO_ASSIGN_OR_RETURN(adapter->alpha_, read_alpha(file));

  const std::vector<model::AdapterTarget> targets = model::llama_adapter_targets(base);
  adapter->num_base_targets_ = static_cast<int32_t>(targets.size());
  std::map<std::string_view, const model::AdapterTarget*> targets_by_name;
  for (const model::AdapterTarget& target : targets) {
    targets_by_name.emplace(target.weight_name, &target);
  }

  FOLIO_ASSIGN_OR_RETURN(auto halves, collect_halves(file));
  for (const auto& [base_name, pair] : halves) {
    const gguf::GgufTensorInfo* present = pair.a != nullptr ? pair.a : pair.b;
    if (pair.a == nullptr || pair.b == nullptr) {
      return tensor_error(file.source(), present->name, "{}{} is missing: a LoRA pair needs both",
                          base_name, pair.a == nullptr ? kSuffixA : kSuffixB);
    }
    auto target = targets_by_name.find(base_name);
    if (target == targets_by_name.end()) {
      if (base_name == "token_embd.weight") {
        return tensor_error(file.source(), present->name,
                            "adapters of the token embedding are not supported (it is a row "
                            "gather, not a projection)");
      }
      return tensor_error(
          file.source(), present->name,
          "'{}' is not a projection of the base model an adapter may update "
          "(attn_q/k/v/output, ffn_gate/up/down of blk.0 to blk.{}{})",
          base_name, base.num_layers - 1,
          base.tie_embeddings ? "; the LM head is tied to the embedding" : ", output.weight");
    }
    FOLIO_ASSIGN_OR_RETURN(AdapterTensorPair checked,
                           check_pair(file, base, *target->second, pair));
    adapter->max_rank_ = std::max(adapter->max_rank_, checked.rank);
    adapter->pairs_.push_back(std::move(checked));
  }
  if (adapter->pairs_.empty()) {
    return file_error(file.source(), "has no LoRA tensor pairs (<weight>.lora_a, .lora_b)");
  }
  std::sort(adapter->pairs_.begin(), adapter->pairs_.end(),
            [](const AdapterTensorPair& left, const AdapterTensorPair& right) {
              return left.target.index < right.target.index;
            });
  return adapter;
}

const AdapterTensorPair* AdapterFile::find_pair(int32_t index) const {
  auto found = std::lower_bound(
      pairs_.begin(), pairs_.end(), index,
      [](const AdapterTensorPair& pair, int32_t wanted) { return pair.target.index < wanted; });
  return found != pairs_.end() && found->target.index == index ? &*found : nullptr;
}

float adapter_scale(float alpha, int64_t rank, float user_scale) {
  FOLIO_DCHECK(rank > 0);
  if (alpha == 0.0f) return user_scale;
  return user_scale * alpha / static_cast<float>(rank);
}

int64_t adapter_weights_bytes(const AdapterFile& adapter, kernels::LoraWeightFormat format) {
  int64_t bytes = 0;
  for (const AdapterTensorPair& pair : adapter.pairs()) {
    bytes += aligned(kernels::lora_matrix_bytes(format, pair.rank, pair.target.input_features));
    bytes += aligned(kernels::lora_matrix_bytes(format, pair.rank, pair.target.output_features));
  }
  return bytes;
}

namespace {

// The tensor's values as f32, row after row (rows x row length). kInvalidArgument when one is
// not finite: the kernels would spread it over every output of the projection.
Status dequantize_tensor(const std::string& source, const gguf::GgufTensor& tensor,
                         std::vector<float>& values) {
  const int64_t row_length = tensor.info->dimensions[0];
  const int64_t rows = tensor.info->dimensions[1];
  values.resize(static_cast<size_t>(row_length * rows));
  const int64_t bytes_per_row = row_bytes(tensor.dtype, row_length);
  for (int64_t row = 0; row < rows; ++row) {
    dequantize_row(tensor.dtype, tensor.data.data() + row * bytes_per_row,
                   values.data() + row * row_length, row_length);
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return tensor_error(source, tensor.info->name, "value {} (row {}, column {}) is {}", i,
                          static_cast<int64_t>(i) / row_length,
                          static_cast<int64_t>(i) % row_length, values[i]);
    }
  }
  return Status();
}

}  // namespace

Result<std::vector<kernels::LoraSlotWeights>> write_adapter_weights(
    const AdapterFile& adapter, kernels::LoraWeightFormat format, float user_scale,
    std::span<std::byte> destination) {
  FOLIO_CHECK(static_cast<int64_t>(destination.size()) >= adapter_weights_bytes(adapter, format),
              "destination of {} bytes, the adapter's weights need {}", destination.size(),
              adapter_weights_bytes(adapter, format));
  FOLIO_CHECK(reinterpret_cast<uintptr_t>(destination.data()) % kAdapterMatrixAlignment == 0);
  if (!std::isfinite(user_scale)) {
    return file_error(adapter.source(), "the scale {} is not finite", user_scale);
  }
  std::vector<kernels::LoraSlotWeights> slots(static_cast<size_t>(adapter.num_base_targets()));
  std::vector<float> a_values;
  std::vector<float> b_values;
  std::vector<float> b_transposed;
  int64_t offset = 0;
  for (const AdapterTensorPair& pair : adapter.pairs()) {
    const int64_t rank = pair.rank;
    const int64_t inputs = pair.target.input_features;
    const int64_t outputs = pair.target.output_features;
    FOLIO_RETURN_IF_ERROR(dequantize_tensor(adapter.source(), pair.a, a_values));
    FOLIO_RETURN_IF_ERROR(dequantize_tensor(adapter.source(), pair.b, b_values));
    // B is output_features rows of rank values; the kernel expands along B^T's contiguous rows.
    b_transposed.resize(static_cast<size_t>(rank * outputs));
    for (int64_t output = 0; output < outputs; ++output) {
      for (int64_t r = 0; r < rank; ++r) {
        b_transposed[r * outputs + output] = b_values[output * rank + r];
      }
    }
    kernels::LoraSlotWeights& slot = slots[static_cast<size_t>(pair.target.index)];
    std::byte* a_destination = destination.data() + offset;
    kernels::write_lora_matrix(format, a_values.data(), rank, inputs, a_destination);
    offset += aligned(kernels::lora_matrix_bytes(format, rank, inputs));
    std::byte* b_destination = destination.data() + offset;
    kernels::write_lora_matrix(format, b_transposed.data(), rank, outputs, b_destination);
    offset += aligned(kernels::lora_matrix_bytes(format, rank, outputs));
    slot.a = a_destination;
    slot.b = b_destination;
    slot.rank = static_cast<int32_t>(rank);
    slot.scale = adapter_scale(adapter.alpha(), rank, user_scale);
    slot.format = format;
  }
  return slots;
}

}  // namespace folio::lora
