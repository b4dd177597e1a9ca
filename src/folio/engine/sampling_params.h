// SamplingParams: how a request turns each logits row into its next token.
//
// The pipeline (sampler.h), in order: the logit bias, the request's token constraint (its mask;
// token_constraint.h), penalties over the sequence's tokens (repetition over the prompt and the
// generated tokens, presence and frequency over the generated tokens), then either
// greedy argmax (temperature 0) or temperature scaling, softmax, top-k, top-p, min-p and one draw
// from the request's seeded generator (random.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "folio/base/status.h"

namespace folio::engine {

// OpenAI's logit_bias entry: `bias` is added to the logit of `token` before anything else sees
// the row. -100 all but bans a token, 100 all but forces it.
struct LogitBias {
  int32_t token = 0;  // in [0, vocab size)
  float bias = 0.0f;  // in [-100, 100]
};

struct SamplingParams {
  // 0: greedy, the argmax of the penalized logits (lowest token id on ties); no randomness is
  // drawn. Otherwise logits are divided by it before softmax. Finite, >= 0.
  float temperature = 1.0f;
  // Keep only the k most likely tokens; 0 keeps all. >= 0.
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability reaches top_p. In (0, 1].
  float top_p = 1.0f;
  // Drop tokens less likely than min_p times the most likely token's probability. In [0, 1].
  float min_p = 0.0f;
  // CTRL-style: a positive logit of a token seen in the prompt or the output is divided by it, a
  // negative one multiplied. > 0; 1 is off.
  float repetition_penalty = 1.0f;
  // OpenAI-style, over generated tokens only: logit -= presence_penalty if the token occurred,
  // and -= frequency_penalty * its count. Each in [-2, 2].
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // The generator's seed. Absent: the engine derives one from its own seed and the request id,
  // so a run of the same submissions is still reproducible.
  std::optional<uint64_t> seed;
  // Added to the logits row first, before the constraint's mask, the penalties and the greedy
  // or sampled pick (so both see it). A token listed twice gets both biases. Logprobs the engine
  // reports are the model's own, before the bias.
  std::vector<LogitBias> logit_bias;

  bool is_greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
  // kInvalidArgument naming the first field out of range (top_k above vocab_size, a logit_bias
  // token outside the vocabulary or a bias outside [-100, 100] included).
  Status validate(int32_t vocab_size) const;
};

}  // namespace folio::engine
