#include "folio/model/llama_rope_scaling.h"

#include <cmath>

namespace folio::model {
namespace {

// An optional floating key into `value` (unchanged when absent).
Status read_optional_float(const gguf::GgufFile& file, const std::string& key, float& value) {
  if (!file.contains(key)) return Status();
  FOLIO_ASSIGN_OR_RETURN(double read, file.get_floating(key));
  value = static_cast<float>(read);
  return Status();
}

}  // namespace

std::string_view rope_scaling_type_name(ir::RopeScalingKind kind) {
  switch (kind) {
    case ir::RopeScalingKind::kNone:
      return "none";
    case ir::RopeScalingKind::kLinear:
      return "linear";
    case ir::RopeScalingKind::kLlama3:
      return "llama3";
    case ir::RopeScalingKind::kYarn:
      return "yarn";
  }
  return "invalid";
}

void add_rope_scaling_metadata(const ir::RopeScaling& scaling, const std::string& prefix,
                               gguf::GgufWriter& writer) {
  if (scaling.kind == ir::RopeScalingKind::kNone) return;
  const auto u32 = [](int64_t value) { return gguf::GgufValue::of(static_cast<uint32_t>(value)); };
  writer.set(prefix + "type",
             gguf::GgufValue::of_string(std::string(rope_scaling_type_name(scaling.kind))));
  writer.set(prefix + "factor", gguf::GgufValue::of(scaling.factor));
  switch (scaling.kind) {
    case ir::RopeScalingKind::kNone:
    case ir::RopeScalingKind::kLinear:
      return;
    case ir::RopeScalingKind::kLlama3:
      writer.set(prefix + "low_freq_factor", gguf::GgufValue::of(scaling.low_frequency_factor));
      writer.set(prefix + "high_freq_factor", gguf::GgufValue::of(scaling.high_frequency_factor));
      writer.set(prefix + "original_context_length", u32(scaling.original_context_length));
      return;
    case ir::RopeScalingKind::kYarn:
      writer.set(prefix + "original_context_length", u32(scaling.original_context_length));
      writer.set(prefix + "yarn_ext_factor", gguf::GgufValue::of(scaling.extrapolation_factor));
      writer.set(prefix + "yarn_attn_factor", gguf::GgufValue::of(scaling.attention_factor));
      writer.set(prefix + "yarn_beta_fast", gguf::GgufValue::of(scaling.beta_fast));
      writer.set(prefix + "yarn_beta_slow", gguf::GgufValue::of(scaling.beta_slow));
      return;
  }
}

Status validate_rope_scaling(const ir::RopeScaling& scaling, bool rope_frequency_factors) {
  const std::string_view kind = rope_scaling_type_name(scaling.kind);
  if (!(std::isfinite(scaling.factor) && scaling.factor > 0)) {
    return invalid_argument("{} RoPE scaling factor {} must be positive and finite", kind,
                            scaling.factor);
  }
  switch (scaling.kind) {
    case ir::RopeScalingKind::kNone:
    case ir::RopeScalingKind::kLinear:
      break;
    case ir::RopeScalingKind::kLlama3:
      if (!(scaling.low_frequency_factor > 0 &&
            scaling.high_frequency_factor > scaling.low_frequency_factor &&
            scaling.original_context_length > 0)) {
        return invalid_argument(
            "llama3 RoPE scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({}) and a "
            "positive original_context_length ({})",
            scaling.low_frequency_factor, scaling.high_frequency_factor,
            scaling.original_context_length);
      }
      break;
    case ir::RopeScalingKind::kYarn:
      if (!(scaling.extrapolation_factor >= 0 && scaling.attention_factor > 0 &&
            scaling.beta_slow > 0 && scaling.beta_fast > scaling.beta_slow &&
            scaling.original_context_length > 0)) {
        return invalid_argument(
            "yarn RoPE scaling needs yarn_ext_factor ({}) >= 0, yarn_attn_factor ({}) > 0, 0 < "
            "yarn_beta_slow ({}) < yarn_beta_fast ({}) and a positive original_context_length "
            "({})",
            scaling.extrapolation_factor, scaling.attention_factor, scaling.beta_slow,
            scaling.beta_fast, scaling.original_context_length);
      }
      break;
  }
  if (rope_frequency_factors && (scaling.kind == ir::RopeScalingKind::kLlama3 ||
                                 scaling.kind == ir::RopeScalingKind::kYarn)) {
    return invalid_argument(
        "rope_freqs.weight with {} RoPE scaling: Folio applies one set of frequency factors", kind);
  }
  return Status();
}

Result<ir::RopeScaling> read_rope_scaling(const gguf::GgufFile& file, const std::string& prefix,
                                          int64_t context_length) {
  const std::string scaling_prefix = prefix + "rope.scaling.";
  float factor = 0.0f;  // 0: absent
  if (file.contains(scaling_prefix + "factor")) {
    FOLIO_RETURN_IF_ERROR(read_optional_float(file, scaling_prefix + "factor", factor));
  } else {
    FOLIO_RETURN_IF_ERROR(read_optional_float(file, prefix + "rope.scale_linear", factor));
  }
  std::string type = "linear";  // llama.cpp's default
  const std::string type_key = scaling_prefix + "type";
  if (file.contains(type_key)) {
    FOLIO_ASSIGN_OR_RETURN(std::string_view read, file.get_string(type_key));
    type = read;
  }
  ir::RopeScaling scaling;
  if (type == "none" || (type == "linear" && (factor == 0.0f || factor == 1.0f))) {
    scaling.kind = ir::RopeScalingKind::kNone;
  } else if (type == "linear") {
    scaling.kind = ir::RopeScalingKind::kLinear;
    scaling.factor = factor;
  } else if (type == "llama3" || type == "yarn") {
    if (factor == 0.0f) {
      return invalid_argument("{} = '{}' needs {}factor", type_key, type, scaling_prefix);
    }
    scaling.factor = factor;
    const std::string context_key = scaling_prefix + "original_context_length";
    if (type == "llama3") {
      scaling.kind = ir::RopeScalingKind::kLlama3;
      FOLIO_RETURN_IF_ERROR(read_optional_float(file, scaling_prefix + "low_freq_factor",
                                                scaling.low_frequency_factor));
      FOLIO_RETURN_IF_ERROR(read_optional_float(file, scaling_prefix + "high_freq_factor",
                                                scaling.high_frequency_factor));
    } else {
      scaling.kind = ir::RopeScalingKind::kYarn;
      scaling.original_context_length = context_length;
      if (file.contains(scaling_prefix + "yarn_log_multiplier")) {
        return invalid_argument("{}yarn_log_multiplier (DeepSeek's YaRN) is not implemented",
                                scaling_prefix);
      }
      FOLIO_RETURN_IF_ERROR(read_optional_float(file, scaling_prefix + "yarn_ext_factor",
                                                scaling.extrapolation_factor));
      FOLIO_RETURN_IF_ERROR(
          read_optional_float(file, scaling_prefix + "yarn_attn_factor", scaling.attention_factor));
      float attention_factor = 1.0f;  // rope.scaling.attn_factor, folded in as llama.cpp does
      FOLIO_RETURN_IF_ERROR(
          read_optional_float(file, scaling_prefix + "attn_factor", attention_factor));
      scaling.attention_factor *= attention_factor;
      FOLIO_RETURN_IF_ERROR(
          read_optional_float(file, scaling_prefix + "yarn_beta_fast", scaling.beta_fast));
      FOLIO_RETURN_IF_ERROR(
          read_optional_float(file, scaling_prefix + "yarn_beta_slow", scaling.beta_slow));
    }
    if (file.contains(context_key)) {
      FOLIO_ASSIGN_OR_RETURN(scaling.original_context_length, file.get_integer(context_key));
    }
  } else {
    return invalid_argument(
        "{} = '{}' is not a RoPE scaling Folio implements (none, linear, "
        "llama3, yarn)",
        type_key, type);
  }
  return scaling;
}

}  // namespace folio::model
