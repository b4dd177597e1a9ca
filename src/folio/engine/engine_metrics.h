// EngineMetrics: the engine's statistics, kept in a base/metrics Registry (names prefixed
// folio_engine_) so the server's /metrics endpoint exports them, and readable as one snapshot
// (EngineStats) by tests, benchmarks and tools.
//
// Series:
//   folio_engine_requests{state="waiting|running|swapped"}          gauge, after every step
//   folio_engine_requests_submitted_total                            counter
//   folio_engine_requests_finished_total{reason="stop|length|cancelled|error"}  counter
//     (both count choices: a request of n choices counts n submitted and n finished)
//   folio_engine_steps_total                                         counter (steps that ran)
//   folio_engine_scheduled_tokens_total{phase="prefill|decode"}      counter (query tokens)
//   folio_engine_prompt_tokens_total, folio_engine_generated_tokens_total  counters
//   folio_engine_preemptions_total{mode="recompute|swap"}            counter
//   folio_engine_preemption_decisions_total{choice="recompute|swap"}  counter: victims the
//     cost model decided (PreemptionMode::kCheaper or prefer_cheaper_preemption), by its choice
//   folio_engine_prefix_cache_queried_blocks_total, _hit_blocks_total  counters
//   folio_engine_prefix_cache_hit_rate                               gauge (hit / queried blocks)
//   folio_engine_kv_blocks{state="free|owned|cached"}                gauge
//   folio_engine_kv_shared_blocks                                    gauge: owned blocks held
//     by more than one sequence (choices sharing their prompt, prefix-cache hits)
//   folio_engine_phase_split_share{budget="prefill_tokens|decode_kv"}  gauge: the scheduler's
//     phase split (scheduler.h PhaseSplit), as the phase tuner moves it
//   folio_engine_phase_split_moves_total{budget="prefill_tokens|decode_kv"}  counter: its moves
//   folio_engine_admissions_held_by_kv_share_total                   counter: admissions the
//     split's decode KV share held back (one per candidate per step)
//   folio_engine_time_to_first_token_seconds, folio_engine_time_per_output_token_seconds,
//   folio_engine_step_seconds                                        histograms
// Recovery of the step runner (engine.h "Recovery"; named folio_dist_ with the rest of the
// distributed runner's series, though the engine counts them):
//   folio_dist_recoveries_total            counter: recover() calls that succeeded
//   folio_dist_requests_recovered_total    counter: requests that had a running sequence at a
//     successful recovery and lived on (those past max_recoveries_per_request are not counted)
//   folio_dist_recovery_failures_total     counter: recover() calls that failed
//   folio_dist_recovery_seconds            histogram: a recovery's recover() calls and KV
//     rebuild (replay or sending back to recompute), from the failed step to the step run again
//
// Thread-safety: updates come from the engine thread; snapshot() and the registry's render()
// may run on any thread (the metrics are atomics; see metrics.h).
#pragma once

#include <cstdint>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/engine/request.h"
#include "folio/engine/scheduler.h"
#include "folio/kv/block_allocator.h"

namespace folio::engine {

struct EngineStats {
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t num_swapped = 0;
  int64_t requests_submitted = 0;
  int64_t requests_finished = 0;
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // query tokens run in prefill chunks
  int64_t decode_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions_by_recompute = 0;
  int64_t preemptions_by_swap = 0;
  int64_t cost_chose_recompute = 0;
  int64_t cost_chose_swap = 0;
  int64_t prefix_cache_queried_blocks = 0;
  int64_t prefix_cache_hit_blocks = 0;
  int64_t kv_shared_blocks = 0;
  double prefill_token_share = 1.0;  // the phase split now
  double decode_kv_share = 0.0;
  int64_t phase_split_moves = 0;  // both shares' moves
  int64_t admissions_held_by_kv_share = 0;
  int64_t recoveries = 0;
  int64_t requests_recovered = 0;
  int64_t recovery_failures = 0;
  int64_t recovery_observations = 0;  // folio_dist_recovery_seconds' count
};

class EngineMetrics {
 public:
  // Registers every series; errors if the registry holds a conflicting family.
  static Result<EngineMetrics> create(metrics::Registry& registry);

  void on_submitted(int32_t num_prompt_tokens, int32_t num_choices);
  void on_step(const StepPlan& plan, int64_t num_prefill_tokens, Duration step_time);
  void on_generated_token() { generated_tokens_->increment(); }
  void on_preemptions(const StepPlan& plan) {
    preempted_recompute_->increment(plan.num_preempted_by_recompute);
    preempted_swap_->increment(plan.num_preempted_by_swap);
    held_by_kv_share_->increment(plan.num_held_by_kv_share);
    cost_chose_recompute_->increment(plan.num_cost_chose_recompute);
    cost_chose_swap_->increment(plan.num_cost_chose_swap);
  }
  // The split now and the tuner's cumulative moves of each share.
  void on_phase_split(const PhaseSplit& split, int64_t token_share_moves, int64_t kv_share_moves);
  void on_finished(FinishReason reason, const RequestTiming& timing, int32_t num_generated);
  // A successful recover() with `num_requests` requests living on through it.
  void on_recovery(int64_t num_requests) {
    recoveries_->increment();
    requests_recovered_->increment(static_cast<double>(num_requests));
  }
  void on_recovery_failure() { recovery_failures_->increment(); }
  // A recovery ended (rebuilt, or given up): its recover() calls and KV rebuild took `time`.
  void on_recovery_time(Duration time) { recovery_time_->observe(to_seconds(time)); }
  // Gauges of queue lengths and KV blocks; the prefix cache counters advance to `prefix`.
  // `num_padding_blocks` of `blocks.owned` are the reserved blocks padding tokens write to:
  // reported as their own state, so "owned" counts the requests' blocks only (0 when idle).
  void on_state(int32_t num_waiting, int32_t num_running, int32_t num_swapped,
                const kv::BlockCounts& blocks, int32_t num_padding_blocks,
                const kv::PrefixCacheStats& prefix);

  EngineStats snapshot() const;

 private:
  EngineMetrics() = default;

  metrics::Gauge* waiting_ = nullptr;
  metrics::Gauge* running_ = nullptr;
  metrics::Gauge* swapped_ = nullptr;
  metrics::Counter* submitted_ = nullptr;
  metrics::Counter* finished_[4] = {};  // indexed by FinishReason
  metrics::Counter* steps_ = nullptr;
  metrics::Counter* prefill_tokens_ = nullptr;
  metrics::Counter* decode_tokens_ = nullptr;
  metrics::Counter* prompt_tokens_ = nullptr;
  metrics::Counter* generated_tokens_ = nullptr;
  metrics::Counter* preempted_recompute_ = nullptr;
  metrics::Counter* preempted_swap_ = nullptr;
  metrics::Counter* held_by_kv_share_ = nullptr;
  metrics::Gauge* prefill_token_share_ = nullptr;
  metrics::Gauge* decode_kv_share_ = nullptr;
  metrics::Counter* token_share_moves_ = nullptr;
  metrics::Counter* kv_share_moves_ = nullptr;
  metrics::Counter* cost_chose_recompute_ = nullptr;
  metrics::Counter* cost_chose_swap_ = nullptr;
  metrics::Counter* prefix_queried_ = nullptr;
  metrics::Counter* prefix_hits_ = nullptr;
  metrics::Gauge* prefix_hit_rate_ = nullptr;
  metrics::Gauge* blocks_free_ = nullptr;
  metrics::Gauge* blocks_owned_ = nullptr;
  metrics::Gauge* blocks_cached_ = nullptr;
  metrics::Gauge* blocks_padding_ = nullptr;
  metrics::Gauge* blocks_shared_ = nullptr;
  metrics::Histogram* time_to_first_token_ = nullptr;
  metrics::Histogram* time_per_output_token_ = nullptr;
  metrics::Histogram* step_time_ = nullptr;
  metrics::Counter* recoveries_ = nullptr;
  metrics::Counter* requests_recovered_ = nullptr;
  metrics::Counter* recovery_failures_ = nullptr;
  metrics::Histogram* recovery_time_ = nullptr;
  // The block manager's cumulative prefix statistics at the last on_state (engine thread only).
  kv::PrefixCacheStats reported_prefix_;
  // The tuner's cumulative moves at the last on_phase_split (engine thread only).
  int64_t reported_token_moves_ = 0;
  int64_t reported_kv_moves_ = 0;
};

}  // namespace folio::engine
