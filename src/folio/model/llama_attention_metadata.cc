#include "folio/model/llama_attention_metadata.h"

#include <cmath>

namespace folio::model {
namespace {

// llama.cpp's Gemma 2 defaults, for files that leave the keys out.
constexpr int64_t kGemma2DefaultSlidingWindow = 4096;
constexpr float kGemma2DefaultAttentionSoftCap = 50.0f;
constexpr float kGemma2DefaultFinalSoftCap = 30.0f;

// A soft cap read from `key` when the file has it (else `value` is kept): positive and finite.
Status read_soft_cap(const gguf::GgufFile& file, const std::string& key, float& value) {
  if (!file.contains(key)) return Status();
  FOLIO_ASSIGN_OR_RETURN(double cap, file.get_floating(key));
  if (!(std::isfinite(cap) && cap > 0)) {
    return invalid_argument("{} = {} must be positive and finite", key, cap);
  }
  value = static_cast<float>(cap);
  return Status();
}

// Keys llama.cpp does not read for Gemma (it fixes their values per architecture) but other
// converters may write: accepted only when they say what Folio runs, else refused naming them.
Status check_fixed_gemma_keys(const gguf::GgufFile& file, const std::string& prefix,
                              const LlamaShape& shape) {
  const std::string pattern_key = prefix + "attention.sliding_window_pattern";
  if (file.contains(pattern_key)) {
    const int64_t pattern = llama_sliding_window_pattern(shape.architecture);
    Result<int64_t> value = file.get_integer(pattern_key);
    if (!value.ok() || *value != pattern) {
      return invalid_argument(
          "{} is not {}: a {} model's layer pattern is fixed (every {}th layer global); Folio "
          "refuses other patterns rather than ignore them",
          pattern_key, pattern, llama_architecture_name(shape.architecture), pattern);
    }
  }
  const std::string local_base_key = prefix + "rope.freq_base_swa";
  if (file.contains(local_base_key)) {
    const float local_base =
        shape.architecture == LlamaArchitecture::kGemma3 ? kGemmaLocalRopeTheta : shape.rope_theta;
    FOLIO_ASSIGN_OR_RETURN(double value, file.get_floating(local_base_key));
    if (static_cast<float>(value) != local_base) {
      return invalid_argument(
          "{} = {}: a {} model's local layers rotate with base {}; Folio refuses another base "
          "rather than ignore it",
          local_base_key, value, llama_architecture_name(shape.architecture), local_base);
    }
  }
  return Status();
}

}  // namespace

bool LlamaShape::is_sliding_window_layer(int64_t layer) const {
  if (sliding_window <= 0) return false;
  const int64_t pattern = llama_sliding_window_pattern(architecture);
  return pattern == 0 || layer % pattern < pattern - 1;
}

float LlamaShape::attention_scale() const {
  const bool gemma_27b = (architecture == LlamaArchitecture::kGemma2 && num_layers == 46) ||
                         (architecture == LlamaArchitecture::kGemma3 && num_layers == 62);
  const int64_t scalar = gemma_27b ? hidden_size / num_heads : head_dim();
  return 1.0f / std::sqrt(static_cast<float>(scalar));
}

int64_t llama_sliding_window_pattern(LlamaArchitecture architecture) {
  switch (architecture) {
    case LlamaArchitecture::kGemma2:
      return 2;
    case LlamaArchitecture::kGemma3:
      return 6;
    case LlamaArchitecture::kLlama:
    case LlamaArchitecture::kQwen2:
    case LlamaArchitecture::kQwen3:
    case LlamaArchitecture::kPhi3:
      return 0;
  }
  return 0;
}

void add_attention_metadata(const LlamaShape& shape, const std::string& prefix,
                            gguf::GgufWriter& writer) {
  const bool gemma2 = shape.architecture == LlamaArchitecture::kGemma2;
  if (shape.sliding_window > 0 || gemma2) {
    writer.set(prefix + "attention.sliding_window",
               gguf::GgufValue::of(static_cast<uint32_t>(shape.sliding_window)));
  }
  if (gemma2) {
    writer.set(prefix + "attn_logit_softcapping",
               gguf::GgufValue::of(shape.attention_logit_soft_cap));
  }
  if (gemma2 || shape.final_logit_soft_cap > 0) {
    writer.set(prefix + "final_logit_softcapping", gguf::GgufValue::of(shape.final_logit_soft_cap));
  }
}

Status read_attention_metadata(const gguf::GgufFile& file, const std::string& prefix,
                               LlamaShape& shape) {
  const bool gemma2 = shape.architecture == LlamaArchitecture::kGemma2;
  const std::string window_key = prefix + "attention.sliding_window";
  shape.sliding_window = gemma2 ? kGemma2DefaultSlidingWindow : 0;
  if (file.contains(window_key)) {
    FOLIO_ASSIGN_OR_RETURN(shape.sliding_window, file.get_integer(window_key));
    if (shape.sliding_window < 0) {
      return invalid_argument("{} = {} must not be negative", window_key, shape.sliding_window);
    }
  }
  if (llama_is_gemma(shape.architecture)) {
    FOLIO_RETURN_IF_ERROR(check_fixed_gemma_keys(file, prefix, shape));
  }
  const std::string attention_key = prefix + "attn_logit_softcapping";
  const std::string final_key = prefix + "final_logit_softcapping";
  switch (shape.architecture) {
    case LlamaArchitecture::kGemma2:
      shape.attention_logit_soft_cap = kGemma2DefaultAttentionSoftCap;
      shape.final_logit_soft_cap = kGemma2DefaultFinalSoftCap;
      FOLIO_RETURN_IF_ERROR(read_soft_cap(file, attention_key, shape.attention_logit_soft_cap));
      return read_soft_cap(file, final_key, shape.final_logit_soft_cap);
    case LlamaArchitecture::kGemma3:
      if (file.contains(attention_key)) {
        return invalid_argument(
            "{} is set: llama.cpp ignores an attention soft cap on gemma3 and Hugging Face "
            "applies it, so Folio refuses the file rather than guess",
            attention_key);
      }
      return read_soft_cap(file, final_key, shape.final_logit_soft_cap);
    case LlamaArchitecture::kLlama:
    case LlamaArchitecture::kQwen2:
    case LlamaArchitecture::kQwen3:
    case LlamaArchitecture::kPhi3:
      return Status();  // llama.cpp reads no soft caps for these
  }
  return Status();
}

Status validate_attention_metadata(const LlamaShape& shape) {
  const std::string_view arch = llama_architecture_name(shape.architecture);
  for (float cap : {shape.attention_logit_soft_cap, shape.final_logit_soft_cap}) {
    if (!(std::isfinite(cap) && cap >= 0)) {
      return invalid_argument("a logit soft cap of {} must be finite and not negative (0: none)",
                              cap);
    }
  }
  if (!llama_is_gemma(shape.architecture)) {
    if (shape.attention_logit_soft_cap > 0 || shape.final_logit_soft_cap > 0) {
      return invalid_argument("logit soft caps are Gemma's; a {} model has none", arch);
    }
    return Status();
  }
  if (!shape.tie_embeddings) {
    return invalid_argument(
        "a {} model's output is token_embd.weight; output.weight is not part of it", arch);
  }
  if (shape.rope_frequency_factors) {
    return invalid_argument("rope_freqs.weight is not part of a {} model", arch);
  }
  if (shape.architecture == LlamaArchitecture::kGemma2) {
    if (shape.attention_logit_soft_cap <= 0 || shape.final_logit_soft_cap <= 0) {
      return invalid_argument(
          "gemma2 soft-caps attention and final logits: attention_logit_soft_cap ({}) and "
          "final_logit_soft_cap ({}) must be positive",
          shape.attention_logit_soft_cap, shape.final_logit_soft_cap);
    }
    if (shape.sliding_window <= 0) {
      return invalid_argument("gemma2's even layers slide: sliding_window ({}) must be positive",
                              shape.sliding_window);
    }
  } else if (shape.attention_logit_soft_cap > 0) {
    return invalid_argument("attention_logit_soft_cap = {}: gemma3 attention is not soft-capped",
                            shape.attention_logit_soft_cap);
  }
  return Status();
}

}  // namespace folio::model
