#include "folio/engine/engine_metrics.h"

namespace folio::engine {

namespace {

int64_t as_count(double value) {
  return static_cast<int64_t>(value);
}

}  // namespace

Result<EngineMetrics> EngineMetrics::create(metrics::Registry& registry) {
  EngineMetrics result;
  const std::string requests = "folio_engine_requests";
  const std::string requests_help = "Requests in the engine, by scheduler queue.";
  FOLIO_ASSIGN_OR_RETURN(result.waiting_,
                         registry.gauge(requests, requests_help, {{"state", "waiting"}}));
  FOLIO_ASSIGN_OR_RETURN(result.running_,
                         registry.gauge(requests, requests_help, {{"state", "running"}}));
  FOLIO_ASSIGN_OR_RETURN(result.swapped_,
                         registry.gauge(requests, requests_help, {{"state", "swapped"}}));
  FOLIO_ASSIGN_OR_RETURN(result.submitted_,
                         registry.counter("folio_engine_requests_submitted_total",
                                          "Requests accepted by the engine."));
  for (FinishReason reason : {FinishReason::kStop, FinishReason::kLength, FinishReason::kCancelled,
                              FinishReason::kError}) {
    FOLIO_ASSIGN_OR_RETURN(
        result.finished_[static_cast<int>(reason)],
        registry.counter("folio_engine_requests_finished_total", "Requests ended, by reason.",
                         {{"reason", std::string(finish_reason_name(reason))}}));
  }
  FOLIO_ASSIGN_OR_RETURN(result.steps_, registry.counter("folio_engine_steps_total",
                                                         "Forward steps run by the engine."));
  const std::string scheduled = "folio_engine_scheduled_tokens_total";
  const std::string scheduled_help = "Query tokens run in forward steps, by phase.";
  FOLIO_ASSIGN_OR_RETURN(result.prefill_tokens_,
                         registry.counter(scheduled, scheduled_help, {{"phase", "prefill"}}));
  FOLIO_ASSIGN_OR_RETURN(result.decode_tokens_,
                         registry.counter(scheduled, scheduled_help, {{"phase", "decode"}}));
  FOLIO_ASSIGN_OR_RETURN(
      result.prompt_tokens_,
      registry.counter("folio_engine_prompt_tokens_total", "Prompt tokens of accepted requests."));
  FOLIO_ASSIGN_OR_RETURN(result.generated_tokens_,
                         registry.counter("folio_engine_generated_tokens_total",
                                          "Tokens sampled and reported to requests."));
  const std::string preemptions = "folio_engine_preemptions_total";
  const std::string preemptions_help = "Sequences preempted for lack of KV memory, by mode.";
  FOLIO_ASSIGN_OR_RETURN(result.preempted_recompute_,
                         registry.counter(preemptions, preemptions_help, {{"mode", "recompute"}}));
  FOLIO_ASSIGN_OR_RETURN(result.preempted_swap_,
                         registry.counter(preemptions, preemptions_help, {{"mode", "swap"}}));
  FOLIO_ASSIGN_OR_RETURN(
      result.held_by_kv_share_,
      registry.counter("folio_engine_admissions_held_by_kv_share_total",
                       "Admissions held back to keep the phase split's decode KV share free."));
  const std::string split = "folio_engine_phase_split_share";
  const std::string split_help =
      "The scheduler's phase split: prefill's share of a decode step's tokens, decodes' share of "
      "the KV cache.";
  FOLIO_ASSIGN_OR_RETURN(result.prefill_token_share_,
                         registry.gauge(split, split_help, {{"budget", "prefill_tokens"}}));
  FOLIO_ASSIGN_OR_RETURN(result.decode_kv_share_,
                         registry.gauge(split, split_help, {{"budget", "decode_kv"}}));
  const std::string moves = "folio_engine_phase_split_moves_total";
  const std::string moves_help = "Moves of the phase split by the phase tuner, by share.";
  FOLIO_ASSIGN_OR_RETURN(result.token_share_moves_,
                         registry.counter(moves, moves_help, {{"budget", "prefill_tokens"}}));
  FOLIO_ASSIGN_OR_RETURN(result.kv_share_moves_,
                         registry.counter(moves, moves_help, {{"budget", "decode_kv"}}));
  const std::string decisions = "folio_engine_preemption_decisions_total";
  const std::string decisions_help =
      "Preemption victims recomputed or swapped by the cost model's choice (kCheaper).";
  FOLIO_ASSIGN_OR_RETURN(result.cost_chose_recompute_,
                         registry.counter(decisions, decisions_help, {{"choice", "recompute"}}));
  FOLIO_ASSIGN_OR_RETURN(result.cost_chose_swap_,
                         registry.counter(decisions, decisions_help, {{"choice", "swap"}}));
  FOLIO_ASSIGN_OR_RETURN(result.prefix_queried_,
                         registry.counter("folio_engine_prefix_cache_queried_blocks_total",
                                          "Full prompt blocks looked up in the prefix cache."));
  FOLIO_ASSIGN_OR_RETURN(result.prefix_hits_,
                         registry.counter("folio_engine_prefix_cache_hit_blocks_total",
                                          "Full prompt blocks served by the prefix cache."));
  FOLIO_ASSIGN_OR_RETURN(result.prefix_hit_rate_,
                         registry.gauge("folio_engine_prefix_cache_hit_rate",
                                        "Prefix cache hit blocks / queried blocks so far."));
  const std::string blocks = "folio_engine_kv_blocks";
  const std::string blocks_help = "KV cache blocks of held pages, by state.";
  FOLIO_ASSIGN_OR_RETURN(result.blocks_free_,
                         registry.gauge(blocks, blocks_help, {{"state", "free"}}));
  FOLIO_ASSIGN_OR_RETURN(result.blocks_owned_,
                         registry.gauge(blocks, blocks_help, {{"state", "owned"}}));
  FOLIO_ASSIGN_OR_RETURN(result.blocks_cached_,
                         registry.gauge(blocks, blocks_help, {{"state", "cached"}}));
  FOLIO_ASSIGN_OR_RETURN(result.blocks_padding_,
                         registry.gauge(blocks, blocks_help, {{"state", "padding"}}));
  FOLIO_ASSIGN_OR_RETURN(
      result.blocks_shared_,
      registry.gauge(
          "folio_engine_kv_shared_blocks",
          "KV cache blocks held by more than one sequence (forked choices, prefix hits)."));
  const std::vector<double> latency_buckets = metrics::exponential_buckets(0.001, 2.0, 16);
  FOLIO_ASSIGN_OR_RETURN(
      result.time_to_first_token_,
      registry.histogram("folio_engine_time_to_first_token_seconds",
                         "Seconds from submission to the first generated token.", latency_buckets));
  FOLIO_ASSIGN_OR_RETURN(
      result.time_per_output_token_,
      registry.histogram("folio_engine_time_per_output_token_seconds",
                         "Mean seconds between generated tokens after the first, per request.",
                         metrics::exponential_buckets(0.0001, 2.0, 16)));
  FOLIO_ASSIGN_OR_RETURN(result.step_time_,
                         registry.histogram("folio_engine_step_seconds",
                                            "Seconds per engine step (schedule, run, sample).",
                                            metrics::exponential_buckets(0.0001, 2.0, 16)));
  FOLIO_ASSIGN_OR_RETURN(result.recoveries_,
                         registry.counter("folio_dist_recoveries_total",
                                          "Recoveries of the step runner after it lost part of its "
                                          "state (a worker), by the engine."));
  FOLIO_ASSIGN_OR_RETURN(
      result.requests_recovered_,
      registry.counter("folio_dist_requests_recovered_total",
                       "Requests with a running sequence that lived on through a recovery."));
  FOLIO_ASSIGN_OR_RETURN(result.recovery_failures_,
                         registry.counter("folio_dist_recovery_failures_total",
                                          "Recoveries of the step runner that failed."));
  FOLIO_ASSIGN_OR_RETURN(
      result.recovery_time_,
      registry.histogram("folio_dist_recovery_seconds",
                         "Seconds from a failed step to its rerun: recover() and KV rebuild.",
                         metrics::exponential_buckets(0.001, 2.0, 16)));
  return result;
}

void EngineMetrics::on_submitted(int32_t num_prompt_tokens, int32_t num_choices) {
  submitted_->increment(num_choices);
  prompt_tokens_->increment(num_prompt_tokens);
}

void EngineMetrics::on_step(const StepPlan& plan, int64_t num_prefill_tokens, Duration step_time) {
  steps_->increment();
  prefill_tokens_->increment(static_cast<double>(num_prefill_tokens));
  decode_tokens_->increment(static_cast<double>(plan.num_tokens - num_prefill_tokens));
  step_time_->observe(to_seconds(step_time));
}

void EngineMetrics::on_phase_split(const PhaseSplit& split, int64_t token_share_moves,
                                   int64_t kv_share_moves) {
  prefill_token_share_->set(split.prefill_token_share);
  decode_kv_share_->set(split.decode_kv_share);
  token_share_moves_->increment(static_cast<double>(token_share_moves - reported_token_moves_));
  kv_share_moves_->increment(static_cast<double>(kv_share_moves - reported_kv_moves_));
  reported_token_moves_ = token_share_moves;
  reported_kv_moves_ = kv_share_moves;
}

void EngineMetrics::on_finished(FinishReason reason, const RequestTiming& timing,
                                int32_t num_generated) {
  finished_[static_cast<int>(reason)]->increment();
  if (num_generated >= 1) time_to_first_token_->observe(to_seconds(timing.time_to_first_token));
  if (num_generated >= 2) {
    time_per_output_token_->observe(to_seconds(timing.time_per_output_token));
  }
}

void EngineMetrics::on_state(int32_t num_waiting, int32_t num_running, int32_t num_swapped,
                             const kv::BlockCounts& blocks, int32_t num_padding_blocks,
                             const kv::PrefixCacheStats& prefix) {
  waiting_->set(num_waiting);
  running_->set(num_running);
  swapped_->set(num_swapped);
  blocks_free_->set(static_cast<double>(blocks.free));
  blocks_owned_->set(static_cast<double>(blocks.owned - num_padding_blocks));
  blocks_padding_->set(num_padding_blocks);
  blocks_cached_->set(static_cast<double>(blocks.cached));
  blocks_shared_->set(static_cast<double>(blocks.shared));
  prefix_queried_->increment(
      static_cast<double>(prefix.queried_blocks - reported_prefix_.queried_blocks));
  prefix_hits_->increment(static_cast<double>(prefix.hit_blocks - reported_prefix_.hit_blocks));
  reported_prefix_ = prefix;
  if (prefix.queried_blocks > 0) {
    prefix_hit_rate_->set(static_cast<double>(prefix.hit_blocks) /
                          static_cast<double>(prefix.queried_blocks));
  }
}

EngineStats EngineMetrics::snapshot() const {
  EngineStats stats;
  stats.num_waiting = as_count(waiting_->value());
  stats.num_running = as_count(running_->value());
  stats.num_swapped = as_count(swapped_->value());
  stats.requests_submitted = as_count(submitted_->value());
  for (const metrics::Counter* finished : finished_) {
    stats.requests_finished += as_count(finished->value());
  }
  stats.steps = as_count(steps_->value());
  stats.prefill_tokens = as_count(prefill_tokens_->value());
  stats.decode_tokens = as_count(decode_tokens_->value());
  stats.prompt_tokens = as_count(prompt_tokens_->value());
  stats.generated_tokens = as_count(generated_tokens_->value());
  stats.preemptions_by_recompute = as_count(preempted_recompute_->value());
  stats.preemptions_by_swap = as_count(preempted_swap_->value());
  stats.cost_chose_recompute = as_count(cost_chose_recompute_->value());
  stats.cost_chose_swap = as_count(cost_chose_swap_->value());
  stats.prefix_cache_queried_blocks = as_count(prefix_queried_->value());
  stats.prefix_cache_hit_blocks = as_count(prefix_hits_->value());
  stats.kv_shared_blocks = as_count(blocks_shared_->value());
  stats.prefill_token_share = prefill_token_share_->value();
  stats.decode_kv_share = decode_kv_share_->value();
  stats.phase_split_moves =
      as_count(token_share_moves_->value()) + as_count(kv_share_moves_->value());
  stats.admissions_held_by_kv_share = as_count(held_by_kv_share_->value());
  stats.recoveries = as_count(recoveries_->value());
  stats.requests_recovered = as_count(requests_recovered_->value());
  stats.recovery_failures = as_count(recovery_failures_->value());
  stats.recovery_observations = static_cast<int64_t>(recovery_time_->count());
  return stats;
}

}  // namespace folio::engine
