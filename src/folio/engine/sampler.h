// Sampler: one logits row -> one token, following SamplingParams (sampling_params.h).
//
// Terms: the *history* of a sequence is what penalties look at: the distinct prompt tokens and
// the count of each generated token (TokenHistory). The *candidates* are the (token,
// probability) pairs still eligible after truncation; a draw picks one with probability
// proportional to its (unnormalized) weight.
//
// Steps, in order:
//   0. logit bias (in place): each SamplingParams::logit_bias entry added to its token's logit;
//      then the request's token constraint, if any, masks what may not come next (-infinity);
//      a mask that leaves no finite logit is an error naming the constraint;
//   1. penalties (in place on the logits): repetition over prompt and generated tokens, then
//      frequency and presence over generated tokens;
//   2. greedy (temperature 0): argmax, lowest token id on ties; stop;
//   3. temperature: logits / temperature;
//   4. top-k: the k largest scaled logits (lowest id first on ties);
//   5. softmax over what is left (in double);
//   6. top-p: sorted by probability (descending, lowest id first on ties), the shortest prefix
//      whose probability sum reaches top_p;
//   7. min-p: tokens with probability >= min_p * the largest probability;
//   8. draw: u = uniform [0, 1) * total weight; the first candidate (in candidate order) whose
//      running weight sum exceeds u.
// NaN logits count as -infinity; a row with no finite logit is an error, not a token.
// Reproducibility: the draw sequence is fixed by the generator (random.h); the probabilities use
// std::exp in double, so platforms whose libm rounds exp differently in the last bit may, very
// rarely, pick a neighbouring token at a boundary.
//
// Thread-safety: a Sampler keeps scratch buffers; one thread at a time. TokenHistory likewise.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "folio/base/random.h"
#include "folio/base/result.h"
#include "folio/engine/sampling_params.h"
#include "folio/engine/token_constraint.h"

namespace folio::engine {

// What the penalties of one sequence look at.
// Invariants: prompt_tokens() is sorted and distinct; every count is >= 1.
class TokenHistory {
 public:
  TokenHistory() = default;
  explicit TokenHistory(std::span<const int32_t> prompt);

  void add_generated(int32_t token) { ++generated_counts_[token]; }
  int32_t generated_count(int32_t token) const;
  std::span<const int32_t> prompt_tokens() const { return prompt_tokens_; }
  const std::unordered_map<int32_t, int32_t>& generated_counts() const { return generated_counts_; }

 private:
  std::vector<int32_t> prompt_tokens_;
  std::unordered_map<int32_t, int32_t> generated_counts_;
};

struct Candidate {
  int32_t token = 0;
  double probability = 0.0;  // normalized over the final candidate set
};

// Step 0 alone. logits: f32 [vocab]. Requires: bias tokens lie in [0, logits.size()).
void apply_logit_bias(std::span<float> logits, const SamplingParams& params);
// Bias, then the constraint's mask (null: none). An error when the mask left no finite logit.
Status bias_and_mask(std::span<float> logits, const SamplingParams& params,
                     TokenConstraint* constraint);

// Step 1 alone. logits: f32 [vocab]. Requires: history tokens lie in [0, logits.size()).
void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     const TokenHistory& history);

// Step 2 alone: the argmax, lowest index on ties, NaN never chosen. kInvalidArgument when no
// logit is finite (NaN or -infinity everywhere).
Result<int32_t> greedy_token(std::span<const float> logits);

class Sampler {
 public:
  // The token for one logits row. logits: f32 [vocab], overwritten by bias and penalties. Greedy
  // draws nothing from `generator`; every other setting draws exactly one double.
  // `constraint` (may be null) masks the row after the bias; the caller tells it the token.
  // Requires: params.validate(logits.size()) is OK.
  Result<int32_t> sample(std::span<float> logits, const SamplingParams& params,
                         const TokenHistory& history, Xoshiro256StarStar& generator,
                         TokenConstraint* constraint = nullptr);

  // Steps 0, 1 and 3-7: the distribution a non-greedy draw picks from, in candidate order, with
  // probabilities renormalized to sum to 1. For tests and tools.
  Result<std::vector<Candidate>> distribution(std::span<float> logits, const SamplingParams& params,
                                              const TokenHistory& history,
                                              TokenConstraint* constraint = nullptr);

 private:
  // Fills candidates_ (weights unnormalized, total in *total_weight).
  Status build_candidates(std::span<float> logits, const SamplingParams& params,
                          const TokenHistory& history, TokenConstraint* constraint,
                          double* total_weight);
  void keep_top_k(int32_t top_k);
  void softmax(double* total_weight);
  void keep_top_p(double top_p, double* total_weight);
  void keep_min_p(double min_p, double* total_weight);

  // A candidate while the pipeline runs: `value` is the scaled logit until softmax, then the
  // unnormalized weight exp(logit - max).
  struct Scored {
    int32_t token = 0;
    double value = 0.0;
  };
  std::vector<Scored> candidates_;  // scratch
};

}  // namespace folio::engine
