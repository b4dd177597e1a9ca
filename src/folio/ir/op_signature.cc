#include "folio/ir/op_signature.h"

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace folio::ir {
namespace {

// Checks operands of one op and words errors as "<kind> '<name>': <role> '<tensor>' ...".
class SignatureChecker {
 public:
  SignatureChecker(const Graph& graph, const Op& op) : graph_(graph), op_(op) {}

  template <typename... Args>
  Status error(fmt::format_string<Args...> format, Args&&... args) const {
    return invalid_argument("{} '{}': {}", op_kind_name(op_.kind), op_.name,
                            fmt::format(format, std::forward<Args>(args)...));
  }

  Status counts(size_t min_inputs, size_t max_inputs, size_t num_updates) const {
    if (op_.inputs.size() < min_inputs || op_.inputs.size() > max_inputs) {
      return error("takes {} to {} inputs, got {}", min_inputs, max_inputs, op_.inputs.size());
    }
    if (op_.updates.size() != num_updates) {
      return error("updates {} tensors in place, got {}", num_updates, op_.updates.size());
    }
    return Status();
  }

  size_t num_inputs() const { return op_.inputs.size(); }
  const TensorInfo& input(int index) const {
    return graph_.tensor(op_.inputs[static_cast<size_t>(index)]);
  }
  const TensorInfo& update(int index) const {
    return graph_.tensor(op_.updates[static_cast<size_t>(index)]);
  }

  Status is_float_tensor(const TensorInfo& tensor, std::string_view role) const {
    if (is_float(tensor.dtype)) return Status();
    return error("{} '{}' is {}; expected f32, f16 or bf16", role, tensor.name,
                 dtype_name(tensor.dtype));
  }
  Status has_dtype(const TensorInfo& tensor, DType dtype, std::string_view role) const {
    if (tensor.dtype == dtype) return Status();
    return error("{} '{}' is {}; expected {}", role, tensor.name, dtype_name(tensor.dtype),
                 dtype_name(dtype));
  }
  Status has_rank(const TensorInfo& tensor, int rank, std::string_view role) const {
    if (tensor.shape.rank == rank) return Status();
    return error("{} '{}' has shape {}; expected rank {}", role, tensor.name,
                 tensor.shape.to_string(), rank);
  }
  // Dimension `dim` of `tensor` must be `expected` (described by `what`, e.g. "the token count").
  Status has_dim(const TensorInfo& tensor, int dim, int64_t expected, std::string_view role,
                 std::string_view what) const {
    if (tensor.shape[dim] == expected) return Status();
    return error("{} '{}' has shape {}; dimension {} must be {} ({})", role, tensor.name,
                 tensor.shape.to_string(), dim, expected, what);
  }
  Status same_type(const TensorInfo& a, const TensorInfo& b) const {
    if (a.dtype == b.dtype && a.shape == b.shape) return Status();
    return error("operands '{}' {} {} and '{}' {} {} must have the same dtype and shape", a.name,
                 dtype_name(a.dtype), a.shape.to_string(), b.name, dtype_name(b.dtype),
                 b.shape.to_string());
  }
  Status has_residency(const TensorInfo& tensor, Residency residency, std::string_view role) const {
    if (tensor.residency == residency) return Status();
    return error("{} '{}' has residency {}; expected {}", role, tensor.name,
                 residency_name(tensor.residency), residency_name(residency));
  }
  template <typename Attributes>
  Result<Attributes> attributes() const {
    if (const Attributes* found = std::get_if<Attributes>(&op_.attributes)) return *found;
    return error("carries the wrong attribute type (variant index {})", op_.attributes.index());
  }

 private:
  const Graph& graph_;
  const Op& op_;
};

using Specs = std::vector<OutputSpec>;

Result<Specs> infer_embedding(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(2, 2, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<EmbeddingAttributes>());
  const TensorInfo& ids = check.input(embedding_input::kTokenIds);
  const TensorInfo& table = check.input(embedding_input::kTable);
  FOLIO_RETURN_IF_ERROR(check.has_dtype(ids, DType::kI32, "token ids"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(ids, 1, "token ids"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(table, 2, "table"));
  if (!is_float(attributes.output_dtype)) {
    return check.error("output dtype {} is not f32, f16 or bf16",
                       dtype_name(attributes.output_dtype));
  }
  if (table.dtype == DType::kI32 || table.dtype == DType::kI8) {
    return check.error("table '{}' is {}; expected a float or quantized dtype", table.name,
                       dtype_name(table.dtype));
  }
  return Specs{{attributes.output_dtype, Shape{ids.shape[0], table.shape[1]}}};
}

Result<Specs> infer_rms_norm(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(2, 2, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<RmsNormAttributes>());
  const TensorInfo& x = check.input(rms_norm_input::kX);
  const TensorInfo& weight = check.input(rms_norm_input::kWeight);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(x, 2, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(weight, 1, "weight"));
  if (weight.dtype != DType::kF32 && weight.dtype != x.dtype) {
    return check.error("weight '{}' is {}; expected f32 or {}", weight.name,
                       dtype_name(weight.dtype), dtype_name(x.dtype));
  }
  if (weight.shape[0] <= 0 || x.shape[1] % weight.shape[0] != 0) {
    return check.error(
        "weight '{}' has shape {}; dimension 0 must be {} or a divisor of it (the input's "
        "columns, normalized in groups of the weight's length)",
        weight.name, weight.shape.to_string(), x.shape[1]);
  }
  if (!(attributes.epsilon > 0.0f)) {
    return check.error("epsilon {} is not positive", attributes.epsilon);
  }
  return Specs{{x.dtype, x.shape}};
}

Result<Specs> infer_matmul(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(2, 3, 0));
  FOLIO_RETURN_IF_ERROR(check.attributes<NoAttributes>().status());
  const TensorInfo& x = check.input(matmul_input::kX);
  const TensorInfo& weight = check.input(matmul_input::kWeight);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(x, 2, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(weight, 2, "weight"));
  if (weight.dtype == DType::kI32 || weight.dtype == DType::kI8) {
    return check.error("weight '{}' is {}; expected a float or quantized dtype", weight.name,
                       dtype_name(weight.dtype));
  }
  if (weight.shape[1] != x.shape[1]) {
    return check.error(
        "input '{}' {} has {} columns but weight '{}' {} expects {} (weight is "
        "[out_features, in_features])",
        x.name, x.shape.to_string(), x.shape[1], weight.name, weight.shape.to_string(),
        weight.shape[1]);
  }
  if (check.num_inputs() == 3) {
    const TensorInfo& bias = check.input(matmul_input::kBias);
    FOLIO_RETURN_IF_ERROR(check.has_rank(bias, 1, "bias"));
    FOLIO_RETURN_IF_ERROR(check.has_dim(bias, 0, weight.shape[0], "bias", "the out features"));
    if (bias.dtype != DType::kF32 && bias.dtype != x.dtype) {
      return check.error("bias '{}' is {}; expected f32 or {}", bias.name, dtype_name(bias.dtype),
                         dtype_name(x.dtype));
    }
  }
  return Specs{{x.dtype, Shape{x.shape[0], weight.shape[0]}}};
}

Result<Specs> infer_elementwise(const SignatureChecker& check, int num_inputs, bool rank2) {
  FOLIO_RETURN_IF_ERROR(check.counts(num_inputs, num_inputs, 0));
  FOLIO_RETURN_IF_ERROR(check.attributes<NoAttributes>().status());
  const TensorInfo& a = check.input(0);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(a, "input"));
  if (rank2) FOLIO_RETURN_IF_ERROR(check.has_rank(a, 2, "input"));
  if (num_inputs == 2) FOLIO_RETURN_IF_ERROR(check.same_type(a, check.input(1)));
  return Specs{{a.dtype, a.shape}};
}

Result<Specs> infer_scale(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(1, 1, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<ScaleAttributes>());
  if (!std::isfinite(attributes.factor)) {
    return check.error("factor {} is not finite", attributes.factor);
  }
  const TensorInfo& x = check.input(0);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  return Specs{{x.dtype, x.shape}};
}

// Collectives move f32 (dist/collectives.h), so the op takes and gives f32 only.
Result<Specs> infer_all_reduce_sum(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(1, 1, 0));
  FOLIO_RETURN_IF_ERROR(check.attributes<NoAttributes>().status());
  const TensorInfo& x = check.input(0);
  FOLIO_RETURN_IF_ERROR(check.has_dtype(x, DType::kF32, "input"));
  return Specs{{x.dtype, x.shape}};
}

Result<Specs> infer_soft_cap(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(1, 1, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<SoftCapAttributes>());
  if (!(attributes.cap > 0.0f && std::isfinite(attributes.cap))) {
    return check.error("cap {} must be positive and finite", attributes.cap);
  }
  const TensorInfo& x = check.input(0);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  return Specs{{x.dtype, x.shape}};
}

Result<Specs> infer_rope(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(2, 3, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<RopeAttributes>());
  const TensorInfo& x = check.input(rope_input::kX);
  const TensorInfo& positions = check.input(rope_input::kPositions);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(x, 2, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_dtype(positions, DType::kI32, "positions"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(positions, 1, "positions"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(positions, 0, x.shape[0], "positions", "the token count"));
  if (attributes.num_heads <= 0 || attributes.head_dim <= 0) {
    return check.error("num_heads {} and head_dim {} must be positive", attributes.num_heads,
                       attributes.head_dim);
  }
  if (attributes.rotary_dim <= 0 || attributes.rotary_dim % 2 != 0 ||
      attributes.rotary_dim > attributes.head_dim) {
    return check.error("rotary_dim {} must be even and in 2..head_dim ({})", attributes.rotary_dim,
                       attributes.head_dim);
  }
  FOLIO_RETURN_IF_ERROR(check.has_dim(x, 1, attributes.num_heads * attributes.head_dim, "input",
                                      "num_heads * head_dim"));
  if (!(attributes.theta > 0.0f) || !(attributes.scaling.factor > 0.0f)) {
    return check.error("theta {} and scaling factor {} must be positive", attributes.theta,
                       attributes.scaling.factor);
  }
  const RopeScaling& scaling = attributes.scaling;
  if (scaling.kind == RopeScalingKind::kLlama3 &&
      !(scaling.low_frequency_factor > 0.0f &&
        scaling.high_frequency_factor > scaling.low_frequency_factor &&
        scaling.original_context_length > 0)) {
    return check.error(
        "llama3 RoPE scaling needs 0 < low_frequency_factor ({}) < "
        "high_frequency_factor ({}) and a positive original context length ({})",
        scaling.low_frequency_factor, scaling.high_frequency_factor,
        scaling.original_context_length);
  }
  if (scaling.kind == RopeScalingKind::kYarn &&
      !(scaling.extrapolation_factor >= 0.0f && scaling.attention_factor > 0.0f &&
        scaling.beta_slow > 0.0f && scaling.beta_fast > scaling.beta_slow &&
        scaling.original_context_length > 0)) {
    return check.error(
        "yarn RoPE scaling needs extrapolation_factor ({}) >= 0, attention_factor ({}) > 0, "
        "0 < beta_slow ({}) < beta_fast ({}) and a positive original context length ({})",
        scaling.extrapolation_factor, scaling.attention_factor, scaling.beta_slow,
        scaling.beta_fast, scaling.original_context_length);
  }
  if (check.num_inputs() == 3) {
    const TensorInfo& factors = check.input(rope_input::kFrequencyFactors);
    FOLIO_RETURN_IF_ERROR(check.has_residency(factors, Residency::kWeight, "frequency factors"));
    FOLIO_RETURN_IF_ERROR(check.has_dtype(factors, DType::kF32, "frequency factors"));
    FOLIO_RETURN_IF_ERROR(check.has_rank(factors, 1, "frequency factors"));
    FOLIO_RETURN_IF_ERROR(check.has_dim(factors, 0, attributes.rotary_dim / 2, "frequency factors",
                                        "rotary_dim / 2"));
    if (scaling.kind == RopeScalingKind::kLlama3 || scaling.kind == RopeScalingKind::kYarn) {
      return check.error("frequency factors '{}' with {} scaling, which makes its own",
                         factors.name,
                         scaling.kind == RopeScalingKind::kLlama3 ? "llama3" : "yarn");
    }
  }
  return Specs{{x.dtype, x.shape}};
}

// Checks a [blocks, block_size, kv_heads, head_dim] cache.
Status check_cache(const SignatureChecker& check, const TensorInfo& cache, int64_t kv_heads,
                   int64_t head_dim, std::string_view role) {
  FOLIO_RETURN_IF_ERROR(check.has_residency(cache, Residency::kKvCache, role));
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(cache, role));
  FOLIO_RETURN_IF_ERROR(check.has_rank(cache, 4, role));
  FOLIO_RETURN_IF_ERROR(check.has_dim(cache, 2, kv_heads, role, "the KV heads"));
  return check.has_dim(cache, 3, head_dim, role, "the head dim");
}

Result<Specs> infer_kv_cache_write(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(3, 3, 2));
  FOLIO_RETURN_IF_ERROR(check.attributes<NoAttributes>().status());
  const TensorInfo& key = check.input(kv_cache_write_input::kKey);
  const TensorInfo& slots = check.input(kv_cache_write_input::kSlotMapping);
  const TensorInfo& key_cache = check.update(kv_cache_write_update::kKeyCache);
  const TensorInfo& value_cache = check.update(kv_cache_write_update::kValueCache);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(key, "key"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(key, 2, "key"));
  FOLIO_RETURN_IF_ERROR(check.same_type(key, check.input(kv_cache_write_input::kValue)));
  FOLIO_RETURN_IF_ERROR(check.has_dtype(slots, DType::kI32, "slot mapping"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(slots, 1, "slot mapping"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(slots, 0, key.shape[0], "slot mapping", "the token count"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(key_cache, 4, "key cache"));
  const int64_t kv_heads = key_cache.shape[2];
  const int64_t head_dim = key_cache.shape[3];
  FOLIO_RETURN_IF_ERROR(check_cache(check, key_cache, kv_heads, head_dim, "key cache"));
  FOLIO_RETURN_IF_ERROR(check_cache(check, value_cache, kv_heads, head_dim, "value cache"));
  if (key_cache.id == value_cache.id) {
    return check.error("key and value cache are the same tensor '{}'", key_cache.name);
  }
  if (!(key_cache.shape == value_cache.shape) || key_cache.dtype != value_cache.dtype) {
    return check.error("key cache {} {} and value cache {} {} differ", dtype_name(key_cache.dtype),
                       key_cache.shape.to_string(), dtype_name(value_cache.dtype),
                       value_cache.shape.to_string());
  }
  FOLIO_RETURN_IF_ERROR(check.has_dim(key, 1, kv_heads * head_dim, "key", "kv_heads * head_dim"));
  return Specs{};
}

Status check_attention_attributes(const SignatureChecker& check,
                                  const AttentionAttributes& attributes) {
  if (attributes.num_heads <= 0 || attributes.num_kv_heads <= 0 || attributes.head_dim <= 0) {
    return check.error("num_heads {}, num_kv_heads {} and head_dim {} must be positive",
                       attributes.num_heads, attributes.num_kv_heads, attributes.head_dim);
  }
  if (attributes.num_heads % attributes.num_kv_heads != 0) {
    return check.error("num_heads {} is not a multiple of num_kv_heads {}", attributes.num_heads,
                       attributes.num_kv_heads);
  }
  if (!(attributes.scale > 0.0f)) return check.error("scale {} is not positive", attributes.scale);
  if (attributes.sliding_window < 0 ||
      attributes.sliding_window > std::numeric_limits<int32_t>::max()) {
    return check.error("sliding_window {} must be in 0..2^31 - 1 (0: no window)",
                       attributes.sliding_window);
  }
  if (!(attributes.logit_soft_cap >= 0.0f && std::isfinite(attributes.logit_soft_cap))) {
    return check.error("logit_soft_cap {} must be finite and not negative (0: no cap)",
                       attributes.logit_soft_cap);
  }
  return Status();
}

Result<Specs> infer_paged_attention(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(6, 6, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<AttentionAttributes>());
  FOLIO_RETURN_IF_ERROR(check_attention_attributes(check, attributes));
  const TensorInfo& query = check.input(attention_input::kQuery);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(query, "query"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(query, 2, "query"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(query, 1, attributes.num_heads * attributes.head_dim, "query",
                                      "num_heads * head_dim"));
  const TensorInfo& key_cache = check.input(attention_input::kKeyCache);
  const TensorInfo& value_cache = check.input(attention_input::kValueCache);
  FOLIO_RETURN_IF_ERROR(
      check_cache(check, key_cache, attributes.num_kv_heads, attributes.head_dim, "key cache"));
  FOLIO_RETURN_IF_ERROR(
      check_cache(check, value_cache, attributes.num_kv_heads, attributes.head_dim, "value cache"));
  if (!(key_cache.shape == value_cache.shape)) {
    return check.error("key cache {} and value cache {} differ", key_cache.shape.to_string(),
                       value_cache.shape.to_string());
  }
  const TensorInfo& seq_lens = check.input(attention_input::kSeqLens);
  const TensorInfo& starts = check.input(attention_input::kQueryStartLoc);
  const TensorInfo& tables = check.input(attention_input::kBlockTables);
  for (const auto& [tensor, role, rank] :
       {std::tuple<const TensorInfo&, std::string_view, int>{seq_lens, "seq_lens", 1},
        {starts, "query_start", 1},
        {tables, "block_tables", 2}}) {
    FOLIO_RETURN_IF_ERROR(check.has_dtype(tensor, DType::kI32, role));
    FOLIO_RETURN_IF_ERROR(check.has_rank(tensor, rank, role));
  }
  const int64_t num_sequences = seq_lens.shape[0];
  FOLIO_RETURN_IF_ERROR(
      check.has_dim(starts, 0, num_sequences + 1, "query_start", "sequences + 1"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(tables, 0, num_sequences, "block_tables", "sequences"));
  if (!attributes.is_kv_parallel()) {
    if (attributes.kv_range_begin != 0) {
      return check.error("kv_range_begin {} without a kv_range_end (0, 0: the whole sequence)",
                         attributes.kv_range_begin);
    }
    return Specs{{query.dtype, query.shape}};
  }
  // A KV-parallel member's partial attention: its range and the log-sum-exp output.
  const int64_t block_size = key_cache.shape[1];
  if (attributes.kv_range_begin < 0 || attributes.kv_range_begin % block_size != 0 ||
      attributes.kv_range_end <= attributes.kv_range_begin) {
    return check.error(
        "KV range [{}, {}) must start at a multiple of the block size {} and not "
        "be empty",
        attributes.kv_range_begin, attributes.kv_range_end, block_size);
  }
  return Specs{{query.dtype, query.shape},
               {DType::kF32, Shape{query.shape[0], attributes.num_heads}}};
}

Result<Specs> infer_attention_merge(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(2, 2, 0));
  FOLIO_RETURN_IF_ERROR(check.attributes<NoAttributes>().status());
  const TensorInfo& partial = check.input(attention_merge_input::kPartial);
  const TensorInfo& lse = check.input(attention_merge_input::kLse);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(partial, "partial"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(partial, 2, "partial"));
  FOLIO_RETURN_IF_ERROR(check.has_dtype(lse, DType::kF32, "lse"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(lse, 2, "lse"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(lse, 0, partial.shape[0], "lse", "partial rows"));
  if (lse.shape[1] <= 0 || partial.shape[1] % lse.shape[1] != 0) {
    return check.error("partial of {} columns is not {} heads of a head size", partial.shape[1],
                       lse.shape[1]);
  }
  return Specs{{partial.dtype, partial.shape}};
}

Result<Specs> infer_gather_rows(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(2, 2, 0));
  FOLIO_RETURN_IF_ERROR(check.attributes<NoAttributes>().status());
  const TensorInfo& x = check.input(gather_rows_input::kX);
  const TensorInfo& indices = check.input(gather_rows_input::kIndices);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(x, 2, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_dtype(indices, DType::kI32, "indices"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(indices, 1, "indices"));
  return Specs{{x.dtype, Shape{indices.shape[0], x.shape[1]}}};
}

Result<Specs> infer_lora(const SignatureChecker& check) {
  FOLIO_RETURN_IF_ERROR(check.counts(3, 3, 0));
  FOLIO_ASSIGN_OR_RETURN(const auto attributes, check.attributes<LoraAttributes>());
  if (attributes.target < 0) return check.error("adapter target {} is negative", attributes.target);
  const TensorInfo& x = check.input(lora_input::kX);
  const TensorInfo& base = check.input(lora_input::kBase);
  const TensorInfo& slots = check.input(lora_input::kTokenAdapterSlots);
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(x, "input"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(x, 2, "input"));
  FOLIO_RETURN_IF_ERROR(check.is_float_tensor(base, "base"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(base, 2, "base"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(base, 0, x.shape[0], "base", "input rows"));
  FOLIO_RETURN_IF_ERROR(check.has_dtype(slots, DType::kI32, "token_adapter_slots"));
  FOLIO_RETURN_IF_ERROR(check.has_rank(slots, 1, "token_adapter_slots"));
  FOLIO_RETURN_IF_ERROR(check.has_dim(slots, 0, x.shape[0], "token_adapter_slots", "input rows"));
  return Specs{{base.dtype, base.shape}};
}

}  // namespace

Result<std::vector<OutputSpec>> infer_outputs(const Graph& graph, const Op& op) {
  const SignatureChecker check(graph, op);
  switch (op.kind) {
    case OpKind::kEmbedding:
      return infer_embedding(check);
    case OpKind::kRmsNorm:
      return infer_rms_norm(check);
    case OpKind::kMatMul:
      return infer_matmul(check);
    case OpKind::kAdd:
    case OpKind::kMul:
      return infer_elementwise(check, 2, /*rank2=*/false);
    case OpKind::kSilu:
      return infer_elementwise(check, 1, /*rank2=*/false);
    case OpKind::kSwiGlu:
      return infer_elementwise(check, 2, /*rank2=*/true);
    case OpKind::kRope:
      return infer_rope(check);
    case OpKind::kKvCacheWrite:
      return infer_kv_cache_write(check);
    case OpKind::kPagedAttention:
      return infer_paged_attention(check);
    case OpKind::kGatherRows:
      return infer_gather_rows(check);
    case OpKind::kLora:
      return infer_lora(check);
    case OpKind::kGeGlu:
      return infer_elementwise(check, 2, /*rank2=*/true);
    case OpKind::kScale:
      return infer_scale(check);
    case OpKind::kSoftCap:
      return infer_soft_cap(check);
    case OpKind::kAllReduceSum:
      return infer_all_reduce_sum(check);
    case OpKind::kAttentionMerge:
      return infer_attention_merge(check);
  }
  return check.error("unknown op kind {}", static_cast<int>(op.kind));
}

}  // namespace folio::ir
