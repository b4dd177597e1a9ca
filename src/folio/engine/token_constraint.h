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
// In the engine (request.h): each step for a constrained request runs bias -> mask_logits ->
// penalties and the pick; the drawn token goes to accept() (an error there is a broken
// invariant: the mask allowed the token); once must_end() holds after a token, the request ends
// with FinishReason::kStop (no stop token: Completion::stop_token stays empty). A mask that
// leaves no finite logit ends the request with kError.
//
// Thread-safety: one instance per choice, used by the engine's driving thread only; clone()
// gives each choice of an n > 1 request its own.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <utility>

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

// An owning pointer to a TokenConstraint whose copies are clones, so a Request holding one stays
// copyable (a copied request gets its own constraint in the same state). Null: no constraint.
// Assign a std::unique_ptr to it: `request.constraint = std::make_unique<MyConstraint>(...)`.
class TokenConstraintPtr {
 public:
  TokenConstraintPtr() = default;
  TokenConstraintPtr(std::nullptr_t) {}  // NOLINT(google-explicit-constructor)
  template <typename Derived>
  requires std::is_base_of_v<TokenConstraint, Derived> TokenConstraintPtr(
      std::unique_ptr<Derived> owned)  // NOLINT(google-explicit-constructor)
      : owned_(std::move(owned)) {}
  TokenConstraintPtr(const TokenConstraintPtr& other)
      : owned_(other.owned_ != nullptr ? other.owned_->clone() : nullptr) {}
  TokenConstraintPtr& operator=(const TokenConstraintPtr& other) {
    if (this != &other) owned_ = other.owned_ != nullptr ? other.owned_->clone() : nullptr;
    return *this;
  }
  TokenConstraintPtr(TokenConstraintPtr&&) noexcept = default;
  TokenConstraintPtr& operator=(TokenConstraintPtr&&) noexcept = default;

  TokenConstraint* get() const { return owned_.get(); }
  TokenConstraint* operator->() const { return owned_.get(); }
  TokenConstraint& operator*() const { return *owned_; }
  explicit operator bool() const { return owned_ != nullptr; }
  // Gives up ownership.
  std::unique_ptr<TokenConstraint> release() && { return std::move(owned_); }

 private:
  std::unique_ptr<TokenConstraint> owned_;
};

}  // namespace folio::engine
