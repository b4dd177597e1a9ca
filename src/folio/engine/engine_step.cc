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

void Engine::profile_lap(std::optional<exec::ProfileRow> row) {
  if (profile_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  if (row.has_value()) {
    profile_->add(*row, std::chrono::duration<double>(now - profile_lap_start_).count());
  }
  profile_lap_start_ = now;
}

bool Engine::step_once() {
  const bool ran = run_step();
  note_progress();
  return ran;
}

bool Engine::run_step() {
  const auto step_start = profile_ != nullptr ? std::chrono::steady_clock::now()
                                              : std::chrono::steady_clock::time_point();
  if (profile_ != nullptr) {
    // Work between steps (start-up captures, a failed step) is no step's.
    profile_->discard_step();
    profile_lap_start_ = step_start;
  }
  drain_inbox();
  // Relaxed: this thread is the only one that stores it.
  if (runner_unavailable_.load(std::memory_order_relaxed) && !restore_runner()) {
    // Still unavailable: what arrived meanwhile (submissions that raced the refusal) ends now.
    fail_all_requests(
        unavailable("the model's step runner is unavailable: {}", runner_failure_.message()));
    report_state();
    return false;
  }
  // Finished adapter loads become visible to this step's admissions.
  if (adapters_ != nullptr) adapters_->maintain();
  if (!scheduler_->has_unfinished()) {
    report_state();
    return false;
  }
  const TimePoint started = clock_.now();
  if (pressure_ != nullptr) pressure_->before_schedule(*scheduler_, appends_preempted_);
  StepPlan plan = scheduler_->schedule(started);
  appends_preempted_ = plan.num_preempted_by_recompute + plan.num_preempted_by_swap >
                       plan.num_preempted_for_pressure;
  if (pressure_ != nullptr) pressure_->after_schedule(plan);
  metrics_.on_preemptions(plan);
  for (auto& [sequence, error] : plan.failed) {
    finish(choice_of(*sequence), FinishReason::kError, error);
  }
  const bool ran = !plan.empty();
  if (ran && run_plan(plan, started)) tune_phases(plan, clock_.now() - started);
  report_state();
  if (ran && profile_ != nullptr) {
    profile_->end_step(
        plan.num_prefill_tokens > 0 ? exec::ProfilePhase::kPrefill : exec::ProfilePhase::kDecode,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count());
  }
  return ran;
}

Engine::ChoiceState& Engine::choice_of(const Sequence& sequence) {
  RequestState& state = *requests_.at(sequence.request);
  return *state.choices[static_cast<size_t>(sequence.choice)];
}

bool Engine::run_plan(StepPlan& plan, TimePoint started) {
  for (const ScheduledSegment& segment : plan.segments) {
    Sequence& sequence = *segment.sequence;
    if (!sequence.scheduled_once) {
      sequence.scheduled_once = true;
      requests_.at(sequence.request)->first_scheduled = started;
    }
  }
  if (Status copied = kv_cache_.apply_pending_copies(); !copied.ok()) {
    fail_segments(plan, copied.with_context("copying KV blocks before the step"));
    return false;
  }
  // The commit rule (engine.h "Recovery"): nothing of the plan is accepted until a run() of it
  // succeeds; a failed one is recovered from and the same plan (less the requests the recovery
  // ended) runs again.
  ir::StepBatch step;
  ir::StepOutput output;
  while (true) {
    Result<ir::StepBatch> built = build_step(plan);
    FOLIO_CHECK(built.ok(), "laying out a step: {}", built.status().to_string());
    step = *built;
    profile_lap(exec::ProfileRow::kStepBuilding);
    Result<ir::StepOutput> ran = runner_.run(step);
    profile_lap(std::nullopt);  // the executor charged the step's own rows
    if (ran.ok()) {
      output = *ran;
      break;
    }
    switch (recover_step(plan, ran.status())) {
      case StepRecovery::kRunAgain:
        if (plan.empty()) return false;
        continue;
      case StepRecovery::kRecomputing:
      case StepRecovery::kFailed:
        return false;
    }
  }
  if (output.vocab_size != vocab_size_ ||
      output.logits.size() != step.logit_indices.size() * static_cast<size_t>(vocab_size_)) {
    fail_segments(plan, internal_error("the step runner returned {} logits of vocabulary {} for "
                                       "{} rows of vocabulary {}",
                                       output.logits.size(), output.vocab_size,
                                       step.logit_indices.size(), vocab_size_));
    return false;
  }
  int64_t num_prefill_tokens = 0;
  for (const ScheduledSegment& segment : plan.segments) {
    if (!segment.is_decode) num_prefill_tokens += segment.num_tokens;
  }
  scheduler_->complete(plan);
  const auto vocab = static_cast<size_t>(vocab_size_);
  size_t row = 0;
  for (const ScheduledSegment& segment : plan.segments) {
    const int32_t num_rows = segment.num_logit_rows();
    if (num_rows == 0) continue;
    const std::span<const float> rows =
        output.logits.subspan(row * vocab, static_cast<size_t>(num_rows) * vocab);
    row += static_cast<size_t>(num_rows);
    // Looked up per segment: a segment's processing may finish (and so destroy) its own
    // request, never another one, and each choice has at most one segment.
    ChoiceState& choice = choice_of(*segment.sequence);
    if (segment.all_logits) record_prompt_logprobs(*choice.request, segment, rows);
    if (!segment.wants_logits) continue;
    const std::span<const float> logits_row = rows.subspan(rows.size() - vocab);
    if (choice.index == 0 && (!choice.request->forked || segment.sequence->wants_prompt_logits)) {
      complete_prefill(choice, logits_row);
    } else {
      accept_token(choice, logits_row);
    }
  }
  metrics_.on_step(plan, num_prefill_tokens, clock_.now() - started);
  profile_lap(exec::ProfileRow::kSampling);
  return true;
}

void Engine::record_prompt_logprobs(RequestState& state, const ScheduledSegment& segment,
                                    std::span<const float> rows) {
  const Sequence& sequence = *segment.sequence;
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

void Engine::complete_prefill(ChoiceState& choice, std::span<const float> logits_row) {
  RequestState& state = *choice.request;
  Sequence& sequence = choice.sequence;
  if (sequence.wants_prompt_logits) {
    // Every prompt position has its entry now.
    sequence.wants_prompt_logits = false;
    if (state.on_prompt_logprobs) state.on_prompt_logprobs(state.prompt_logprobs);
    state.prompt_logprobs = {};
  }
  if (state.max_tokens == 0) {
    finish_request(state.id, FinishReason::kLength, Status());
    return;
  }
  if (!state.forked) {
    // The prompt's KV is computed once; every other choice shares its blocks (copy-on-write at
    // its first append into the shared last block).
    for (size_t index = 1; index < state.choices.size(); ++index) {
      scheduler_->fork(&sequence, &state.choices[index]->sequence);
    }
    state.forked = true;
  }
  // Each choice draws its first token from the same row with its own generator. The request
  // (and `state`) goes away when its last choice finishes, which can only be the last one here.
  const auto num_choices = static_cast<size_t>(state.num_choices);
  for (size_t index = 0; index < num_choices; ++index) {
    accept_token(*state.choices[index], logits_row);
  }
}

void Engine::accept_token(ChoiceState& choice, std::span<const float> logits_row) {
  const RequestState& state = *choice.request;
  Result<int32_t> sampled = 0;
  if (state.sampling.is_greedy() && !state.sampling.has_penalties() &&
      state.sampling.logit_bias.empty() && choice.constraint == nullptr) {
    sampled = greedy_token(logits_row);  // nothing to rewrite: no copy of the row
  } else {
    logits_scratch_.assign(logits_row.begin(), logits_row.end());
    sampled = sampler_.sample(logits_scratch_, state.sampling, choice.history, choice.generator,
                              choice.constraint.get());
  }
  if (!sampled.ok()) {
    finish(choice, FinishReason::kError, sampled.status().with_context("sampling"));
    return;
  }
  const int32_t token = *sampled;
  if (choice.constraint != nullptr) {
    const Status accepted = choice.constraint->accept(token);
    FOLIO_CHECK(accepted.ok(),
                "request {}: the token constraint refused token {} its mask allowed: {}", state.id,
                token, accepted.to_string());
  }
  std::optional<FinishReason> reason;
  std::string text;
  if (std::binary_search(state.stop_token_ids.begin(), state.stop_token_ids.end(), token)) {
    reason = FinishReason::kStop;
    choice.stop_token = token;
  } else if (choice.decoder != nullptr) {
    Result<std::string> delta = choice.decoder->push(token);
    if (!delta.ok()) {
      finish(choice, FinishReason::kError,
             delta.status().with_context(fmt::format("detokenizing token {}", token)));
      return;
    }
    StopStringMatcher::Output matched = choice.matcher.push(*delta);
    text = std::move(matched.released);
    if (matched.matched_stop.has_value()) {
      reason = FinishReason::kStop;
      choice.stop_string = choice.matcher.stop_strings()[*matched.matched_stop];
    }
  }
  Sequence& sequence = choice.sequence;
  sequence.tokens.push_back(token);
  choice.history.add_generated(token);
  // The constraint is complete: nothing but an end token could follow.
  if (!reason.has_value() && choice.constraint != nullptr && choice.constraint->must_end()) {
    reason = FinishReason::kStop;
  }
  if (!reason.has_value() &&
      (sequence.num_generated() >= state.max_tokens ||
       static_cast<int64_t>(sequence.tokens.size()) >= max_context_tokens_)) {
    reason = FinishReason::kLength;
  }
  if (reason.has_value() && choice.decoder != nullptr && !choice.matcher.stopped()) {
    // Ending for another reason: release what the decoder and the matcher still hold, unless
    // it completes a stop string.
    StopStringMatcher::Output matched = choice.matcher.push(choice.decoder->finish());
    text += matched.released;
    if (matched.matched_stop.has_value()) {
      choice.stop_string = choice.matcher.stop_strings()[*matched.matched_stop];
    } else {
      text += choice.matcher.flush();
    }
  }
  const TimePoint now = clock_.now();
  if (choice.num_reported == 0) choice.first_token = now;
  choice.last_token = now;
  const TokenLogprobs* logprobs = nullptr;
  if (state.num_top_logprobs.has_value()) {
    // From the model's raw row (logits_row), never the rewritten scratch.
    compute_token_logprobs(logits_row, token, *state.num_top_logprobs, choice.token_logprobs);
    choice.cumulative_logprob += choice.token_logprobs.logprob;
    logprobs = &choice.token_logprobs;
  }
  const int32_t index = choice.num_reported++;
  metrics_.on_generated_token();
  if (state.on_token) {
    state.on_token(TokenEvent{state.id, token, index, text, logprobs, choice.index});
  }
  if (reason.has_value()) finish(choice, *reason, Status());
}

void Engine::finish(ChoiceState& choice, FinishReason reason, const Status& error) {
  FOLIO_DCHECK((reason == FinishReason::kError) == !error.ok());
  FOLIO_CHECK(!choice.finished, "choice {} of request {} finished twice", choice.index,
              choice.sequence.request);
  RequestState& state = *choice.request;
  // A choice 0 ending before the fork takes the unforked choices with it: they never ran.
  std::vector<ChoiceState*> ending = {&choice};
  if (!state.forked) {
    for (const std::unique_ptr<ChoiceState>& other : state.choices) {
      if (other.get() != &choice && !other->finished) ending.push_back(other.get());
    }
  }
  const TimePoint now = clock_.now();
  std::vector<Completion> completions;
  completions.reserve(ending.size());
  for (ChoiceState* ended : ending) {
    Sequence& sequence = ended->sequence;
    // Sequences failed by the scheduler are already released; unforked ones were never added.
    const bool scheduled = ended->index == 0 || state.forked;
    if (scheduled && sequence.status != SequenceStatus::kFinished) scheduler_->finish(&sequence);
    ended->finished = true;
    --state.num_unfinished;
    Completion& completion = completions.emplace_back();
    completion.request = state.id;
    completion.choice = ended->index;
    completion.reason = reason;
    completion.error = error;
    completion.stop_token = ended->stop_token;
    completion.stop_string = ended->stop_string;
    completion.num_prompt_tokens = sequence.num_prompt_tokens;
    completion.num_generated_tokens = ended->num_reported;
    // Unforked choices have no admission of their own: choice 0's counts for them.
    const Sequence& admitted = scheduled ? sequence : choice.sequence;
    completion.num_cached_prompt_tokens = std::max(admitted.num_cached_prompt_tokens, 0);
    completion.num_preemptions = sequence.num_preemptions;
    if (state.num_top_logprobs.has_value()) {
      completion.cumulative_logprob = ended->cumulative_logprob;
    }
    RequestTiming& timing = completion.timing;
    if (admitted.scheduled_once) timing.queue_time = state.first_scheduled - sequence.arrival;
    const int32_t num_reported = ended->num_reported;
    if (num_reported >= 1) timing.time_to_first_token = ended->first_token - sequence.arrival;
    if (num_reported >= 2) {
      timing.time_per_output_token = (ended->last_token - ended->first_token) / (num_reported - 1);
    }
    timing.total_time = now - sequence.arrival;
    metrics_.on_finished(reason, timing, num_reported);
  }
  // Out of the table before the callbacks once the last choice ended, so a callback that
  // cancels its own id finds nothing; `owned` keeps the callbacks alive meanwhile.
  std::unique_ptr<RequestState> owned;
  if (state.num_unfinished == 0) {
    owned = std::move(requests_.at(state.id));
    requests_.erase(state.id);
    // Release: pairs with the acquire in health().
    num_unfinished_requests_.fetch_sub(1, std::memory_order_release);
  }
  if (state.on_finish) {
    for (const Completion& completion : completions) state.on_finish(completion);
  }
}

void Engine::fail_segments(const StepPlan& plan, const Status& error) {
  for (const ScheduledSegment& segment : plan.segments) {
    // Each segment is its own choice; failing one never ends another that has a segment.
    const Sequence& sequence = *segment.sequence;
    if (!requests_.contains(sequence.request)) continue;
    ChoiceState& choice = choice_of(sequence);
    if (!choice.finished) finish(choice, FinishReason::kError, error);
  }
}

void Engine::tune_phases(const StepPlan& plan, Duration step_time) {
  if (!phase_tuner_.options().enabled) return;
  PhaseObservation observation;
  observation.prefill_tokens = plan.num_prefill_tokens;
  observation.decode_tokens = plan.num_tokens - plan.num_prefill_tokens;
  observation.prefill_limited_by_split = plan.prefill_limited_by_split;
  observation.num_waiting = scheduler_->num_waiting() + scheduler_->num_swapped();
  const TimePoint now = clock_.now();
  if (const std::optional<TimePoint> oldest = scheduler_->oldest_waiting_arrival()) {
    observation.oldest_wait = now - *oldest;
  }
  observation.preemptions = plan.num_preempted_by_recompute + plan.num_preempted_by_swap;
  observation.held_by_kv_share = plan.num_held_by_kv_share;
  // Over every member of a KV-parallel group.
  const int64_t max_blocks = kv_cache_.total_sequence_blocks();
  observation.kv_utilization =
      max_blocks > 0 ? static_cast<double>(kv_cache_.total_counts().owned) / max_blocks : 0.0;
  observation.step_time = step_time;
  if (!phase_tuner_.observe(observation)) return;
  const Status applied = scheduler_->set_phase_split(phase_tuner_.split());
  FOLIO_CHECK(applied.ok(), "the phase tuner's split: {}", applied.to_string());
  metrics_.on_phase_split(phase_tuner_.split(), phase_tuner_.num_token_share_moves(),
                          phase_tuner_.num_kv_share_moves());
}

Result<ir::StepBatch> Engine::build_step(const StepPlan& plan) {
  if (kv_parallel_cache_ != nullptr) return step_batch_builder_.build(plan, *kv_parallel_cache_);
  return step_batch_builder_.build(plan, *block_manager_);
}

void Engine::report_state() {
  metrics_.on_state(scheduler_->num_waiting(), scheduler_->num_running(), scheduler_->num_swapped(),
                    kv_cache_.total_counts(),
                    static_cast<int32_t>(kv_cache_.total_reserved_blocks()),
                    kv_cache_.total_prefix_stats());
}

}  // namespace folio::engine
