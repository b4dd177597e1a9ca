// Engine: one step, from the scheduler's plan to streamed tokens and finished requests.
#include <algorithm>

#include "folio/base/check.h"
#include "folio/engine/engine.h"
#include "folio/engine/engine_request_state.h"

namespace folio::engine {

bool Engine::step() {
  FOLIO_CHECK(!loop_thread_.joinable(), "step() while the engine loop thread runs");
  return step_once();
}

void Engine::run_until_idle() {
  FOLIO_CHECK(!loop_thread_.joinable(), "run_until_idle() while the engine loop thread runs");
  while (has_unfinished_requests()) step_once();
}

bool Engine::step_once() {
  drain_inbox();
  // Finished adapter loads become visible to this step's admissions.
  if (adapters_ != nullptr) adapters_->maintain();
  if (!scheduler_->has_unfinished()) {
    report_state();
    return false;
  }
  const TimePoint started = clock_.now();
  StepPlan plan = scheduler_->schedule(started);
  metrics_.on_preemptions(plan);
  for (auto& [sequence, error] : plan.failed) {
    finish(*requests_.at(sequence->request), FinishReason::kError, std::move(error));
  }
  const bool ran = !plan.empty();
  if (ran) run_plan(plan, started);
  report_state();
  return ran;
}

void Engine::run_plan(StepPlan& plan, TimePoint started) {
  int64_t num_prefill_tokens = 0;
  for (const ScheduledSegment& segment : plan.segments) {
    Sequence& sequence = *segment.sequence;
    if (!sequence.scheduled_once) {
      sequence.scheduled_once = true;
      requests_.at(sequence.request)->first_scheduled = started;
    }
    if (!segment.is_decode) num_prefill_tokens += segment.num_tokens;
  }
  if (Status copied = block_manager_.apply_pending_copies(); !copied.ok()) {
    fail_segments(plan, copied.with_context("copying KV blocks before the step"));
    return;
  }
  Result<ir::StepBatch> built = step_batch_builder_.build(plan, block_manager_);
  FOLIO_CHECK(built.ok(), "laying out a step: {}", built.status().to_string());
  const ir::StepBatch& step = *built;
  Result<ir::StepOutput> output = runner_.run(step);
  if (!output.ok()) {
    fail_segments(plan, output.status().with_context("model step"));
    return;
  }
  if (output->vocab_size != vocab_size_ ||
      output->logits.size() != step.logit_indices.size() * static_cast<size_t>(vocab_size_)) {
    fail_segments(plan, internal_error("the step runner returned {} logits of vocabulary {} for "
                                       "{} rows of vocabulary {}",
                                       output->logits.size(), output->vocab_size,
                                       step.logit_indices.size(), vocab_size_));
    return;
  }
  scheduler_->complete(plan);
  const auto vocab = static_cast<size_t>(vocab_size_);
  size_t row = 0;
  for (const ScheduledSegment& segment : plan.segments) {
    const int32_t num_rows = segment.num_logit_rows();
    if (num_rows == 0) continue;
    const std::span<const float> rows =
        output->logits.subspan(row * vocab, static_cast<size_t>(num_rows) * vocab);
    row += static_cast<size_t>(num_rows);
    // Looked up per segment: accept_token may finish (and so destroy) the request it samples
    // for, never another one.
    RequestState& state = *requests_.at(segment.sequence->request);
    if (segment.all_logits) record_prompt_logprobs(state, segment, rows);
    if (!segment.wants_logits) continue;
    if (state.sequence.wants_prompt_logits) {
      // The prefill completed: every prompt position has its entry.
      state.sequence.wants_prompt_logits = false;
      if (state.on_prompt_logprobs) state.on_prompt_logprobs(state.prompt_logprobs);
      state.prompt_logprobs = {};
    }
    if (state.max_tokens == 0) {
      finish(state, FinishReason::kLength, Status());
      continue;
    }
    accept_token(state, rows.subspan(rows.size() - vocab));
  }
  metrics_.on_step(plan, num_prefill_tokens, clock_.now() - started);
}

void Engine::record_prompt_logprobs(RequestState& state, const ScheduledSegment& segment,
                                    std::span<const float> rows) {
  const Sequence& sequence = state.sequence;
  const auto vocab = static_cast<size_t>(vocab_size_);
  const int32_t num_top = state.num_top_logprobs.value_or(0);
  for (int32_t index = 0; index < segment.num_tokens; ++index) {
    // The row at position p predicts prompt token p + 1 (the last prompt position's row
    // predicts the first generated token instead).
    const int32_t position = segment.first_position + index;
    if (position + 1 >= sequence.num_prompt_tokens) break;
    compute_token_logprobs(rows.subspan(static_cast<size_t>(index) * vocab, vocab),
                           sequence.tokens[static_cast<size_t>(position) + 1], num_top,
                           state.prompt_logprobs[static_cast<size_t>(position)]);
  }
}

void Engine::accept_token(RequestState& state, std::span<const float> logits_row) {
  Result<int32_t> sampled = 0;
  if (state.sampling.is_greedy() && !state.sampling.has_penalties() &&
      state.sampling.logit_bias.empty() && state.constraint == nullptr) {
    sampled = greedy_token(logits_row);  // nothing to rewrite: no copy of the row
  } else {
    logits_scratch_.assign(logits_row.begin(), logits_row.end());
    sampled = sampler_.sample(logits_scratch_, state.sampling, state.history, state.generator,
                              state.constraint.get());
  }
  if (!sampled.ok()) {
    finish(state, FinishReason::kError, sampled.status().with_context("sampling"));
    return;
  }
  const int32_t token = *sampled;
  if (state.constraint != nullptr) {
    const Status accepted = state.constraint->accept(token);
    FOLIO_CHECK(accepted.ok(),
                "request {}: the token constraint refused token {} its mask allowed: {}",
                state.sequence.request, token, accepted.to_string());
  }
  std::optional<FinishReason> reason;
  std::string text;
  if (std::binary_search(state.stop_token_ids.begin(), state.stop_token_ids.end(), token)) {
    reason = FinishReason::kStop;
    state.stop_token = token;
  } else if (state.decoder != nullptr) {
    Result<std::string> delta = state.decoder->push(token);
    if (!delta.ok()) {
      finish(state, FinishReason::kError,
             delta.status().with_context(fmt::format("detokenizing token {}", token)));
      return;
    }
    StopStringMatcher::Output matched = state.matcher.push(*delta);
    text = std::move(matched.released);
    if (matched.matched_stop.has_value()) {
      reason = FinishReason::kStop;
      state.stop_string = state.matcher.stop_strings()[*matched.matched_stop];
    }
  }
  Sequence& sequence = state.sequence;
  sequence.tokens.push_back(token);
  state.history.add_generated(token);
  // The constraint is complete: nothing but an end token could follow.
  if (!reason.has_value() && state.constraint != nullptr && state.constraint->must_end()) {
    reason = FinishReason::kStop;
  }
  if (!reason.has_value() &&
      (sequence.num_generated() >= state.max_tokens ||
       static_cast<int64_t>(sequence.tokens.size()) >= max_context_tokens_)) {
    reason = FinishReason::kLength;
  }
  if (reason.has_value() && state.decoder != nullptr && !state.matcher.stopped()) {
    // Ending for another reason: release what the decoder and the matcher still hold, unless
    // it completes a stop string.
    StopStringMatcher::Output matched = state.matcher.push(state.decoder->finish());
    text += matched.released;
    if (matched.matched_stop.has_value()) {
      state.stop_string = state.matcher.stop_strings()[*matched.matched_stop];
    } else {
      text += state.matcher.flush();
    }
  }
  const TimePoint now = clock_.now();
  if (state.num_reported == 0) state.first_token = now;
  state.last_token = now;
  const TokenLogprobs* logprobs = nullptr;
  if (state.num_top_logprobs.has_value()) {
    // From the model's raw row (logits_row), never the rewritten scratch.
    compute_token_logprobs(logits_row, token, *state.num_top_logprobs, state.token_logprobs);
    state.cumulative_logprob += state.token_logprobs.logprob;
    logprobs = &state.token_logprobs;
  }
  const int32_t index = state.num_reported++;
  metrics_.on_generated_token();
  if (state.on_token) {
    state.on_token(TokenEvent{sequence.request, token, index, text, logprobs});
  }
  if (reason.has_value()) finish(state, *reason, Status());
}

void Engine::finish(RequestState& state, FinishReason reason, Status error) {
  Sequence& sequence = state.sequence;
  FOLIO_DCHECK((reason == FinishReason::kError) == !error.ok());
  // Sequences failed by the scheduler are already released.
  if (sequence.status != SequenceStatus::kFinished) scheduler_->finish(&sequence);
  const TimePoint now = clock_.now();
  Completion completion;
  completion.request = sequence.request;
  completion.reason = reason;
  completion.error = std::move(error);
  completion.stop_token = state.stop_token;
  completion.stop_string = state.stop_string;
  completion.num_prompt_tokens = sequence.num_prompt_tokens;
  completion.num_generated_tokens = state.num_reported;
  completion.num_cached_prompt_tokens = std::max(sequence.num_cached_prompt_tokens, 0);
  completion.num_preemptions = sequence.num_preemptions;
  if (state.num_top_logprobs.has_value()) completion.cumulative_logprob = state.cumulative_logprob;
  RequestTiming& timing = completion.timing;
  if (sequence.scheduled_once) timing.queue_time = state.first_scheduled - sequence.arrival;
  if (state.num_reported >= 1) timing.time_to_first_token = state.first_token - sequence.arrival;
  if (state.num_reported >= 2) {
    timing.time_per_output_token =
        (state.last_token - state.first_token) / (state.num_reported - 1);
  }
  timing.total_time = now - sequence.arrival;
  metrics_.on_finished(reason, timing, state.num_reported);
  // Out of the table before the callback, so a callback that cancels its own id finds nothing.
  std::unique_ptr<RequestState> owned = std::move(requests_.at(sequence.request));
  requests_.erase(sequence.request);
  if (owned->on_finish) owned->on_finish(completion);
}

void Engine::fail_segments(const StepPlan& plan, const Status& error) {
  for (const ScheduledSegment& segment : plan.segments) {
    finish(*requests_.at(segment.sequence->request), FinishReason::kError, error);
  }
}

void Engine::report_state() {
  metrics_.on_state(scheduler_->num_waiting(), scheduler_->num_running(), scheduler_->num_swapped(),
                    block_manager_.counts(), block_manager_.prefix_stats());
}

}  // namespace folio::engine
