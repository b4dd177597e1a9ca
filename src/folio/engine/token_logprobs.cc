#include "folio/engine/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "folio/base/check.h"

namespace folio::engine {

namespace {

constexpr double kNegativeInfinity = -std::numeric_limits<double>::infinity();

// NaN has probability 0, like -infinity.
double logit_value(float logit) {
  return std::isnan(logit) ? kNegativeInfinity : static_cast<double>(logit);
}

double logprob_of(float logit, double normalizer) {
  const double value = logit_value(logit);
  // A row without any finite logit gives every token probability 0 (not NaN).
  if (value == kNegativeInfinity || normalizer == kNegativeInfinity) return kNegativeInfinity;
  return value - normalizer;
}

}  // namespace

double log_sum_exp(std::span<const float> logits) {
  double largest = kNegativeInfinity;
  for (float logit : logits) largest = std::max(largest, logit_value(logit));
  if (largest == kNegativeInfinity) return kNegativeInfinity;
  double sum = 0;
  for (float logit : logits) sum += std::exp(logit_value(logit) - largest);
  // The same association as perplexity.cc's negative log-likelihood: log(sum) + largest.
  return std::log(sum) + largest;
}

void compute_token_logprobs(std::span<const float> logits, int32_t token, int32_t num_top,
                            TokenLogprobs& out) {
  FOLIO_DCHECK(token >= 0 && static_cast<size_t>(token) < logits.size() && num_top >= 0);
  const double normalizer = log_sum_exp(logits);
  out.token = token;
  out.logprob = logprob_of(logits[static_cast<size_t>(token)], normalizer);
  out.top.clear();
  if (num_top == 0) return;
  // One pass keeping the best num_top (<= 20) sorted; ids ascend, so a later equal logit never
  // passes an earlier one: lowest id first on ties.
  const auto limit = static_cast<size_t>(std::min<int64_t>(num_top, std::ssize(logits)));
  for (size_t index = 0; index < logits.size(); ++index) {
    const double value = logit_value(logits[index]);
    if (out.top.size() == limit && !(value > out.top.back().logprob)) continue;
    const auto position = std::upper_bound(out.top.begin(), out.top.end(), value,
                                           [](double candidate, const TopLogprob& kept) {
                                             return candidate > kept.logprob;
                                           }) -
                          out.top.begin();
    if (out.top.size() == limit) out.top.pop_back();
    out.top.insert(out.top.begin() + position, TopLogprob{static_cast<int32_t>(index), value});
  }
  // The entries hold raw logits while ranking; now their logprobs.
  for (TopLogprob& entry : out.top) {
    entry.logprob = logprob_of(logits[static_cast<size_t>(entry.token)], normalizer);
  }
}

}  // namespace folio::engine
