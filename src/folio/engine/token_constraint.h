// TokenConstraint: which tokens a request may generate next, for structured output (a JSON
// schema, a tool call's arguments). The engine asks it for a mask before every draw and tells it
// every token drawn; it never looks inside.
//
// Terms: the constraint has *end tokens* (given when it is built: the model's end of sequence,
// the chat template's end of turn). An end token is allowed exactly when the text so far is a
// complete match; every other token is allowed exactly when the text it completes can still be
// extended to a complete match.
//
// The engine's order for one logits row: logit bias, then mask_logits, then penalties and the
// sampler's pipeline (sampler.h). Logprobs the engine reports are the model's own (before bias
// and mask), so a constraint never changes what a token's logprob says about the model.
//
// Thread-safety: one instance per choice, used by the engine's driving thread only; clone()
// gives each choice of an n > 1 request its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "folio/base/status.h"

namespace folio::engine {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // Sets logits[t] to -infinity for every token t that may not come next. logits: f32 [vocab].
  virtual void mask_logits(std::span<float> logits) = 0;
  // Advances past `token`. kInvalidArgument (state unchanged) when the token was not allowed.
  virtual Status accept(int32_t token) = 0;
  // Whether nothing but an end token may follow: the engine then ends the request with
  // FinishReason::kStop without running another step.
  virtual bool must_end() const = 0;
  // An independent copy in the same state.
  virtual std::unique_ptr<TokenConstraint> clone() const = 0;
};

}  // namespace folio::engine
