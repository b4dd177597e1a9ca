// Engine::RequestState and Engine::ChoiceState: everything the engine keeps about one accepted
// request and each of its choices. Internal to the engine's implementation files.
//
// A request of n choices has n ChoiceStates, each with its own sequence, generator, history,
// text decoder, stop-string matcher, constraint and counters. Choice 0's sequence prefills the
// prompt; when the prefill completes, choices 1 .. n-1 fork from it (their sequences share its
// blocks) and every choice samples its first token from the same logits row. Until then the
// other choices are *unforked*: their sequences are not in the scheduler, and if choice 0 ends
// early (cancelled, failed) they end with it.
//
// Invariants: choices.size() == num_choices; num_unfinished counts the choices not finished;
// `forked` is true once choices 1 .. n-1 joined the scheduler (from the start when n == 1).
// The request leaves the engine's table when its last choice finishes.
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

// Thread-safety (both): built by submit() on any thread, handed to the driving thread through
// the inbox (the mutex orders the hand-off), used by the driving thread only afterwards.
struct Engine::ChoiceState {
  ChoiceState(RequestState* owner, int32_t choice_index, std::span<const int32_t> prompt,
              std::vector<std::string> stop_strings)
      : request(owner), index(choice_index), history(prompt), matcher(std::move(stop_strings)) {}

  RequestState* request;  // the owner
  int32_t index;          // the choice index, 0 .. num_choices - 1
  Sequence sequence;
  TokenHistory history;
  Xoshiro256StarStar generator{0};       // seeded at submission
  std::unique_ptr<TextDecoder> decoder;  // null without a text decoder factory
  StopStringMatcher matcher;
  std::unique_ptr<TokenConstraint> constraint;  // null: unconstrained

  bool finished = false;
  int32_t num_reported = 0;       // tokens streamed through on_token
  TokenLogprobs token_logprobs;   // the last token's, when asked (reused)
  double cumulative_logprob = 0;  // over the tokens streamed
  std::optional<int32_t> stop_token;
  std::optional<std::string> stop_string;
  TimePoint first_token;
  TimePoint last_token;
};

struct Engine::RequestState {
  // Takes the request's callbacks and stop token ids; leaves its prompt, stop strings and
  // constraint (submit() gives them to the choices).
  explicit RequestState(Request& request)
      : sampling(request.sampling),
        max_tokens(request.max_tokens),
        num_top_logprobs(request.logprobs),
        num_choices(request.num_choices),
        stop_token_ids(std::move(request.stop_token_ids)),
        on_token(std::move(request.on_token)),
        on_finish(std::move(request.on_finish)),
        on_prompt_logprobs(std::move(request.on_prompt_logprobs)),
        num_unfinished(request.num_choices),
        forked(request.num_choices == 1) {}

  RequestId id;
  SamplingParams sampling;
  int32_t max_tokens = 0;
  std::optional<int32_t> num_top_logprobs;  // Request::logprobs
  int32_t num_choices = 1;
  std::vector<int32_t> stop_token_ids;  // sorted; the EOS included unless ignore_eos
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const Completion&)> on_finish;
  std::function<void(std::span<const TokenLogprobs>)> on_prompt_logprobs;
  // Entry p: prompt token p + 1's, filled chunk by chunk while choice 0 wants prompt logits.
  std::vector<TokenLogprobs> prompt_logprobs;

  std::vector<std::unique_ptr<ChoiceState>> choices;  // stable addresses: sequences are shared
  int32_t num_unfinished = 1;
  bool forked = true;
  // Recoveries of the step runner while the request had a running sequence (engine.h).
  int32_t num_recoveries = 0;
  TimePoint first_scheduled;
};

}  // namespace folio::engine
