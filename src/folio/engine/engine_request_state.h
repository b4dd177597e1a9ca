// Engine::RequestState: everything the engine keeps about one accepted request. Internal to the
// engine's implementation files.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "folio/base/random.h"
#include "folio/engine/engine.h"
#include "folio/engine/sampler.h"
#include "folio/engine/sequence.h"
#include "folio/engine/stop_string_matcher.h"

namespace folio::engine {

// Thread-safety: built by submit() on any thread, handed to the driving thread through the
// inbox (the mutex orders the hand-off), used by the driving thread only afterwards.
struct Engine::RequestState {
  // Takes the request's callbacks, stop token ids and stop strings; leaves its prompt.
  explicit RequestState(Request& request)
      : sampling(request.sampling),
        max_tokens(request.max_tokens),
        num_top_logprobs(request.logprobs),
        stop_token_ids(std::move(request.stop_token_ids)),
        on_token(std::move(request.on_token)),
        on_finish(std::move(request.on_finish)),
        on_prompt_logprobs(std::move(request.on_prompt_logprobs)),
        history(request.prompt),
        constraint(std::move(request.constraint).release()),
        matcher(std::move(request.stop_strings)) {}

  Sequence sequence;
  SamplingParams sampling;
  int32_t max_tokens = 0;
  std::optional<int32_t> num_top_logprobs;  // Request::logprobs
  std::vector<int32_t> stop_token_ids;      // sorted; the EOS included unless ignore_eos
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const Completion&)> on_finish;
  std::function<void(std::span<const TokenLogprobs>)> on_prompt_logprobs;
  // Entry p: prompt token p + 1's, filled chunk by chunk while sequence.wants_prompt_logits.
  std::vector<TokenLogprobs> prompt_logprobs;

  TokenHistory history;
  std::unique_ptr<TokenConstraint> constraint;  // null: unconstrained
  Xoshiro256StarStar generator{0};              // reseeded at submission
  std::unique_ptr<TextDecoder> decoder;         // null without a text decoder factory
  StopStringMatcher matcher;

  int32_t num_reported = 0;       // tokens streamed through on_token
  TokenLogprobs token_logprobs;   // the last token's, when asked (reused)
  double cumulative_logprob = 0;  // over the tokens streamed
  std::optional<int32_t> stop_token;
  std::optional<std::string> stop_string;
  TimePoint first_scheduled;
  TimePoint first_token;
  TimePoint last_token;
};

}  // namespace folio::engine
