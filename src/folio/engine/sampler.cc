#include "folio/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>

#include "folio/kernels/cpu/sampling.h"
#include "folio/kernels/cpu/vector_ops.h"

namespace folio::engine {

namespace {

// Descending value, then ascending token: the order top-k, top-p and ties follow.
template <typename Scored>
bool ranks_before(const Scored& left, const Scored& right) {
  if (left.value != right.value) return left.value > right.value;
  return left.token < right.token;
}

}  // namespace

TokenHistory::TokenHistory(std::span<const int32_t> prompt)
    : prompt_tokens_(prompt.begin(), prompt.end()) {
  std::sort(prompt_tokens_.begin(), prompt_tokens_.end());
  prompt_tokens_.erase(std::unique(prompt_tokens_.begin(), prompt_tokens_.end()),
                       prompt_tokens_.end());
}

int32_t TokenHistory::generated_count(int32_t token) const {
  const auto entry = generated_counts_.find(token);
  return entry == generated_counts_.end() ? 0 : entry->second;
}

void apply_logit_bias(std::span<float> logits, const SamplingParams& params) {
  for (const LogitBias& entry : params.logit_bias) {
    logits[static_cast<size_t>(entry.token)] += entry.bias;
  }
}

Status bias_and_mask(std::span<float> logits, const SamplingParams& params,
                     TokenConstraint* constraint) {
  apply_logit_bias(logits, params);
  if (constraint == nullptr) return Status();
  constraint->mask_logits(logits);
  const bool any_finite = std::any_of(logits.begin(), logits.end(), [](float logit) {
    return !std::isnan(logit) && logit != -std::numeric_limits<float>::infinity();
  });
  if (!any_finite) {
    return invalid_argument(
        "the request's token constraint allows no token the model can produce (every allowed "
        "token's logit is -infinity or NaN)");
  }
  return Status();
}

void apply_penalties(std::span<float> logits, const SamplingParams& params,
                     const TokenHistory& history) {
  if (params.repetition_penalty != 1.0f) {
    const float penalty = params.repetition_penalty;
    auto penalize = [&](int32_t token) {
      float& logit = logits[static_cast<size_t>(token)];
      logit = logit > 0.0f ? logit / penalty : logit * penalty;
    };
    // Each distinct token once, whether it occurs in the prompt, the output or both.
    for (int32_t token : history.prompt_tokens()) penalize(token);
    for (const auto& [token, count] : history.generated_counts()) {
      if (!std::binary_search(history.prompt_tokens().begin(), history.prompt_tokens().end(),
                              token)) {
        penalize(token);
      }
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    for (const auto& [token, count] : history.generated_counts()) {
      logits[static_cast<size_t>(token)] -=
          params.presence_penalty + params.frequency_penalty * static_cast<float>(count);
    }
  }
}

Result<int32_t> greedy_token(std::span<const float> logits) {
  // The kernels' argmax (vectorized on the CPU's widest path; the engine's own scalar-compiled
  // loop took about 30 us per 32,000-entry row). It returns the first index of the maximum,
  // NaN never winning; that value is finite or +infinity unless no logit is.
  const int64_t index =
      logits.empty() ? 0
                     : kernels::cpu::first_maximum_index(kernels::cpu::vector_ops(), logits.data(),
                                                         static_cast<int64_t>(logits.size()));
  if (logits.empty() ||
      !(logits[static_cast<size_t>(index)] > -std::numeric_limits<float>::infinity())) {
    return invalid_argument("no finite logit among {} (all NaN or -infinity)", logits.size());
  }
  return static_cast<int32_t>(index);
}

Result<int32_t> Sampler::sample(std::span<float> logits, const SamplingParams& params,
                                const TokenHistory& history, Xoshiro256StarStar& generator,
                                TokenConstraint* constraint) {
  if (params.is_greedy()) {
    FOLIO_RETURN_IF_ERROR(bias_and_mask(logits, params, constraint));
    apply_penalties(logits, params, history);
    return greedy_token(logits);
  }
  double total_weight = 0.0;
  FOLIO_RETURN_IF_ERROR(build_candidates(logits, params, history, constraint, &total_weight));
  const double threshold = generator.next_double() * total_weight;
  double running = 0.0;
  for (const Scored& candidate : candidates_) {
    running += candidate.value;
    if (running > threshold) return candidate.token;
  }
  // Rounding left the running sum a hair short of total_weight: the last candidate.
  return candidates_.back().token;
}

Result<std::vector<Candidate>> Sampler::distribution(std::span<float> logits,
                                                     const SamplingParams& params,
                                                     const TokenHistory& history,
                                                     TokenConstraint* constraint) {
  double total_weight = 0.0;
  FOLIO_RETURN_IF_ERROR(build_candidates(logits, params, history, constraint, &total_weight));
  std::vector<Candidate> result;
  result.reserve(candidates_.size());
  for (const Scored& candidate : candidates_) {
    result.push_back(Candidate{candidate.token, candidate.value / total_weight});
  }
  return result;
}

Status Sampler::build_candidates(std::span<float> logits, const SamplingParams& params,
                                 const TokenHistory& history, TokenConstraint* constraint,
                                 double* total_weight) {
  FOLIO_RETURN_IF_ERROR(bias_and_mask(logits, params, constraint));
  apply_penalties(logits, params, history);
  candidates_.clear();
  candidates_.reserve(logits.size());
  const double inverse_temperature = 1.0 / static_cast<double>(params.temperature);
  for (size_t token = 0; token < logits.size(); ++token) {
    const float logit = logits[token];
    // NaN and -infinity have zero probability; dropping them here keeps softmax finite.
    if (std::isnan(logit) || logit == -std::numeric_limits<float>::infinity()) continue;
    if (logit == std::numeric_limits<float>::infinity()) {
      return invalid_argument("logit of token {} is +infinity", token);
    }
    candidates_.push_back(Scored{static_cast<int32_t>(token), logit * inverse_temperature});
  }
  if (candidates_.empty()) {
    return invalid_argument("no finite logit among {} (all NaN or -infinity)", logits.size());
  }
  if (params.top_k > 0) keep_top_k(params.top_k);
  softmax(total_weight);
  if (params.top_p < 1.0f) keep_top_p(params.top_p, total_weight);
  if (params.min_p > 0.0f) keep_min_p(params.min_p, total_weight);
  return Status();
}

void Sampler::keep_top_k(int32_t top_k) {
  if (static_cast<size_t>(top_k) >= candidates_.size()) return;
  const auto kth = candidates_.begin() + top_k;
  std::nth_element(candidates_.begin(), kth - 1, candidates_.end(), ranks_before<Scored>);
  // nth_element leaves the k best (by the strict order, so ties resolve by id) in front.
  candidates_.erase(kth, candidates_.end());
}

void Sampler::softmax(double* total_weight) {
  double max_value = -std::numeric_limits<double>::infinity();
  for (const Scored& candidate : candidates_) max_value = std::max(max_value, candidate.value);
  double total = 0.0;
  for (Scored& candidate : candidates_) {
    candidate.value = std::exp(candidate.value - max_value);
    total += candidate.value;
  }
  *total_weight = total;
}

void Sampler::keep_top_p(double top_p, double* total_weight) {
  std::sort(candidates_.begin(), candidates_.end(), ranks_before<Scored>);
  const double target = top_p * *total_weight;
  double running = 0.0;
  size_t keep = 0;
  while (keep < candidates_.size()) {
    running += candidates_[keep].value;
    ++keep;
    if (running >= target) break;
  }
  candidates_.resize(keep);
  *total_weight = running;
}

void Sampler::keep_min_p(double min_p, double* total_weight) {
  double max_weight = 0.0;
  for (const Scored& candidate : candidates_) max_weight = std::max(max_weight, candidate.value);
  const double threshold = min_p * max_weight;
  double total = 0.0;
  std::erase_if(candidates_, [&](const Scored& candidate) {
    if (candidate.value < threshold) return true;
    total += candidate.value;
    return false;
  });
  *total_weight = total;
}

}  // namespace folio::engine
