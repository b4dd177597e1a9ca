#include "folio/engine/sampling_params.h"

#include <cmath>

namespace folio::engine {

Status SamplingParams::validate(int32_t vocab_size) const {
  if (!std::isfinite(temperature) || temperature < 0.0f) {
    return invalid_argument("temperature must be a finite number >= 0 (0 is greedy), got {}",
                            temperature);
  }
  if (top_k < 0 || top_k > vocab_size) {
    return invalid_argument("top_k must be in [0, {}] (0 keeps every token), got {}", vocab_size,
                            top_k);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) {
    return invalid_argument("top_p must be in (0, 1], got {}", top_p);
  }
  if (!(min_p >= 0.0f && min_p <= 1.0f)) {
    return invalid_argument("min_p must be in [0, 1], got {}", min_p);
  }
  if (!std::isfinite(repetition_penalty) || repetition_penalty <= 0.0f) {
    return invalid_argument("repetition_penalty must be a finite number > 0 (1 is off), got {}",
                            repetition_penalty);
  }
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f)) {
    return invalid_argument("presence_penalty must be in [-2, 2], got {}", presence_penalty);
  }
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f)) {
    return invalid_argument("frequency_penalty must be in [-2, 2], got {}", frequency_penalty);
  }
  for (const LogitBias& entry : logit_bias) {
    if (entry.token < 0 || entry.token >= vocab_size) {
      return invalid_argument("logit_bias names token {}, outside the vocabulary of {} tokens",
                              entry.token, vocab_size);
    }
    if (!(entry.bias >= -100.0f && entry.bias <= 100.0f)) {
      return invalid_argument("logit_bias of token {} must be in [-100, 100], got {}", entry.token,
                              entry.bias);
    }
  }
  return Status();
}

}  // namespace folio::engine
