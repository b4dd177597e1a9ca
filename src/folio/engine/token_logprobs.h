// TokenLogprobs: what the model said about one token: its log-probability and the most likely
// alternatives at its position, as OpenAI's `logprobs` report them.
//
// Definition (the one `folio perplexity` uses, perplexity.h, so a harness summing these gets the
// perplexity's negative log-likelihood): for the logits row that predicts the token,
//   logprob(t) = logits[t] - (log(sum_v exp(logits[v] - m)) + m),  m = max_v logits[v],
// computed in double from the model's raw f32 row: before logit bias, constraint masks,
// penalties and temperature, so what a logprob says is the model's own view. NaN logits count as
// -infinity (probability 0). The top alternatives are ordered by logprob descending, lowest
// token id first on ties.
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace folio::engine {

// The most top alternatives a request may ask for (OpenAI's limit).
inline constexpr int32_t kMaxTopLogprobs = 20;

struct TopLogprob {
  int32_t token = 0;
  double logprob = 0.0;
};

struct TokenLogprobs {
  int32_t token = 0;            // the token this entry is about (sampled, or the prompt's)
  double logprob = 0.0;         // its log-probability; <= 0, -infinity when the model gives it none
  std::vector<TopLogprob> top;  // the num_top most likely tokens (fewer if the vocabulary is)
};

// log(sum_v exp(logits[v])), computed stably in double; -infinity when no logit is finite.
// logits: f32 [vocab].
double log_sum_exp(std::span<const float> logits);

// Fills `out` for `token` from the raw row `logits` (f32 [vocab]) with the num_top most likely
// tokens. Reuses out.top's capacity. Requires: token in [0, logits.size()), num_top >= 0.
void compute_token_logprobs(std::span<const float> logits, int32_t token, int32_t num_top,
                            TokenLogprobs& out);

}  // namespace folio::engine
