// Requests: what a caller submits to the engine, and what it hears back.
//
// A request is a prompt (token ids) plus how to continue it: sampling parameters, when to stop
// (stop token ids, the model's end-of-sequence token unless ignore_eos, stop strings matched on
// the decoded text, max_tokens), its priority, an optional LoRA adapter, how many choices
// (num_choices, OpenAI's n), and callbacks. For each choice the engine calls on_token once per
// generated token, in order, and then on_finish exactly once: every accepted request gets
// exactly num_choices on_finish calls, whatever happens (completion, cancellation, preemption
// limit, runner failure, engine stop).
//
// Choices (num_choices = n > 1): the prompt is prefilled once; then n sequences share its KV
// blocks (copy-on-write) and continue independently, each with its own generator (choice i
// seeded with choice_seed(seed, i), engine.h: choice 0 draws exactly what the n = 1 request
// with the same seed draws), penalty history, stop-string matcher, text decoder, constraint
// (cloned) and max_tokens. TokenEvent::choice and Completion::choice say which; events of
// different choices interleave. Engine::cancel ends every choice.
//
// Text: each TokenEvent carries the text that became final with its token. Text is held back
// while it could be the start of a stop string, so one token's text may be empty and a later
// one may carry several tokens' worth; the concatenation of every event's text is the output
// text, which stops right before the first stop string. The token that completes a stop string,
// and a stop token, are still reported as tokens (their text is what precedes the stop).
//
// Logprobs (`logprobs`, token_logprobs.h for the definition): when asked, every TokenEvent
// carries the sampled token's log-probability under the model (its raw logits: before bias,
// constraint, penalties and temperature) and the `logprobs` most likely tokens at its position,
// and the Completion carries the sum over the generated tokens. Not asked, nothing is computed.
//
// Prompt logprobs (`prompt_logprobs`, OpenAI's echo + logprobs, how evaluation harnesses score
// log-likelihood): the logprob of every prompt token given the tokens before it, by the same
// definition, with the same number of top alternatives (`logprobs`, 0 when absent). The engine
// then computes the whole prompt (nothing from the prefix cache: cached tokens have no logits)
// and calls on_prompt_logprobs exactly once per request (whatever num_choices), with entries for
// prompt tokens 1 .. N - 1 (the first token has no context, so no entry), when the prefill
// completes and before the first on_token. With prompt_logprobs, max_tokens may be 0: the prompt is
// scored, nothing is generated, and the request finishes with kLength (such a prompt may fill the
// whole context). A request that ends before
// its prefill completes (cancelled, failed) never gets the call.
//
// Constraint (`constraint`, token_constraint.h; structured output): every step masks the
// logits row with it after the logit bias and before penalties and the pick, and tells it the
// token drawn. Once it must end, the request finishes with kStop and no stop token; a mask that
// leaves no finite logit finishes it with kError. Logprobs stay the model's own (unmasked).
//
// Priority: a larger value is more important. Waiting requests age: each `aging_interval`
// (SchedulerOptions) spent waiting counts as one more priority level when admitting.
//
// Callbacks run on the engine thread, between steps. They may call Engine::submit and
// Engine::cancel (which only queue) but must not block on the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/status.h"
#include "folio/base/strong_id.h"
#include "folio/engine/clock.h"
#include "folio/engine/sampling_params.h"
#include "folio/engine/token_constraint.h"
#include "folio/engine/token_logprobs.h"

namespace folio::engine {

struct RequestIdTag {};
using RequestId = StrongId<RequestIdTag, int64_t>;

// Lifecycle end states; exhaustive switches, no default.
enum class FinishReason : uint8_t {
  kStop,       // a stop token or stop string
  kLength,     // max_tokens, or the context limit
  kCancelled,  // Engine::cancel
  kError,      // see Completion::error
};
std::string_view finish_reason_name(FinishReason reason);

struct TokenEvent {
  RequestId request;
  int32_t token = 0;
  int32_t index = 0;      // 0 for the first generated token
  std::string_view text;  // text made final by this token; valid during the callback only
  // This token's logprob and top alternatives when the request asked (Request::logprobs), else
  // null; valid during the callback only.
  const TokenLogprobs* logprobs = nullptr;
  int32_t choice = 0;  // which choice, 0 .. num_choices - 1
};

struct RequestTiming {
  Duration queue_time{0};             // arrival -> first scheduled
  Duration time_to_first_token{0};    // arrival -> first token sampled
  Duration time_per_output_token{0};  // mean gap between later tokens (0 if fewer than 2)
  Duration total_time{0};             // arrival -> finish
};

struct Completion {
  RequestId request;
  int32_t choice = 0;  // which choice this ends, 0 .. num_choices - 1
  FinishReason reason = FinishReason::kError;
  Status error;                       // non-OK exactly when reason == kError
  std::optional<int32_t> stop_token;  // the stop token that ended it
  std::optional<std::string> stop_string;
  int32_t num_prompt_tokens = 0;
  int32_t num_generated_tokens = 0;  // tokens reported through on_token
  // Prompt tokens served from the prefix cache at the first admission (0 with prompt_logprobs).
  int32_t num_cached_prompt_tokens = 0;
  int32_t num_preemptions = 0;  // of this choice's sequence
  // The sum of the generated tokens' logprobs (0 for none) when the request asked for logprobs;
  // what OpenAI's best_of ranks choices by.
  std::optional<double> cumulative_logprob;
  RequestTiming timing;
};

struct Request {
  std::vector<int32_t> prompt;  // token ids, non-empty, each in [0, vocab size)
  SamplingParams sampling;
  // Per choice; >= 1 (>= 0 with prompt_logprobs); generation also ends at the engine's context
  // limit.
  int32_t max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;                // the model's EOS is a stop token unless set
  std::vector<std::string> stop_strings;  // non-empty strings; needs a text decoder
  int32_t priority = 0;                   // larger is more important
  // Choices generated from the prompt (OpenAI's n), in [1, the engine's max_num_sequences].
  int32_t num_choices = 1;
  int64_t adapter_id = 0;  // 0: the base model
  // Absent: no logprobs. k in [0, kMaxTopLogprobs]: each generated token's logprob and the k
  // most likely tokens at its position (TokenEvent::logprobs, Completion::cumulative_logprob).
  std::optional<int32_t> logprobs;
  // Optional: what may be generated (copies of the Request clone it).
  TokenConstraintPtr constraint;
  // Score the prompt: on_prompt_logprobs gets prompt tokens 1 .. N - 1's TokenLogprobs.
  bool prompt_logprobs = false;
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const Completion&)> on_finish;
  // With prompt_logprobs: entry i is prompt token i + 1's; the span is valid during the call.
  std::function<void(std::span<const TokenLogprobs>)> on_prompt_logprobs;
};

}  // namespace folio::engine
