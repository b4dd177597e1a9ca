// Engine: continuous batching of requests over one model, one step at a time, on its own thread.
//
// A step (DESIGN.md "One step of the engine"): drain the inbox (submissions, cancellations) ->
// schedule (scheduler.h) -> run the KV block copies -> build the step batch (step_batch_builder.h)
// -> StepRunner::run -> record prompt logprobs (rows of every prompt position, when asked) ->
// fork the choices of a request whose prompt prefill completed -> sample one token per sampling
// row (sampler.h; each choice of a just-forked request from the same row) -> append it,
// detokenize, match stops -> stream it -> finish sequences that are done (their blocks are
// freed, full computed blocks stay CACHED) -> report.
//
// Ownership: the engine borrows the block manager and the runner; while the engine exists, the
// thread driving it (its loop thread after start(), else whoever calls step()) is the block
// manager's owner thread, and nothing else may touch it. Request state is owned by the engine.
//
// Guarantees: every request accepted by submit() ends with exactly one on_finish call (stop,
// length, cancelled, or error with a message: never fits the KV cache, preempted too often, the
// runner failed, the engine stopped); tokens are streamed once each, in order. Greedy output
// does not depend on batching, chunking or preemption, since a preempted sequence keeps its
// tokens and its generator's state and recomputes (or swaps back) exactly the same KV.
//
// Thread-safety: submit(), cancel(), stats() and the metrics registry may be used from any
// thread at any time. Submissions and cancellations go to an inbox under `inbox_mutex_`, drained
// by the driving thread at the start of each step (DESIGN.md: frees from other threads reach
// the owner through a queue drained each step). step(), run_until_idle() and the queries marked
// "driving thread" may only be called while the loop thread is not running.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/mutex.h"
#include "folio/base/result.h"
#include "folio/engine/clock.h"
#include "folio/engine/engine_metrics.h"
#include "folio/engine/memory_pressure_handler.h"
#include "folio/engine/phase_budget_tuner.h"
#include "folio/engine/request.h"
#include "folio/engine/sampler.h"
#include "folio/engine/scheduler.h"
#include "folio/engine/step_batch_builder.h"
#include "folio/engine/step_runner.h"
#include "folio/engine/text_decoder.h"
#include "folio/exec/op_profile.h"
#include "folio/kv/block_manager.h"

namespace folio::engine {

// The seed of choice `choice` of a request whose seed is `request_seed` (its own, or the one the
// engine derived): choice 0 keeps it, so an n > 1 request's choice 0 equals the same request
// with n = 1; the others are SplitMix64-mixed with their index.
uint64_t choice_seed(uint64_t request_seed, int32_t choice);

struct EngineOptions {
  SchedulerOptions scheduler;  // its phase_split is the tuner's initial split
  // Fed every step that ran; when it moves, the scheduler takes its split from the next step.
  PhaseBudgetTunerOptions phase_tuner;
  std::optional<int32_t> eos_token;  // the model's end of sequence: a stop token by default
  uint64_t seed = 0;                 // seeds requests that bring none (with their id)
};

// What the engine drives; borrowed, must outlive it.
struct EngineParts {
  kv::BlockManager* block_manager = nullptr;  // required
  StepRunner* runner = nullptr;               // required
  bool has_swap_space = false;                // the block manager was given a HostSwapSpace
  const Clock* clock = nullptr;               // null: a SteadyClock owned by the engine
  metrics::Registry* registry = nullptr;      // null: a registry owned by the engine
  TextDecoderFactory text_decoder_factory;    // empty: no text, no stop strings
  // Adapters requests may name (their ids); null: the runner's supports_adapter() decides.
  lora::AdapterManager* adapters = nullptr;
  // Reacts to memory pressure before each schedule; null: no pressure handling.
  MemoryPressureHandler* pressure = nullptr;
  // How PreemptionMode::kCheaper prices victims (preemption_cost.h); required for that mode.
  const PreemptionCostModel* preemption_cost = nullptr;
  // Per-op profile (exec/op_profile.h), the one the runner's executor times kernels into: the
  // engine adds step building and sampling to each step's rows and ends the step with its wall
  // time and phase. Null: no timing. Driving thread only.
  exec::OpProfile* profile = nullptr;
};

class Engine {
 public:
  // Errors: missing parts, invalid options, an EOS outside the runner's vocabulary, metric
  // families that conflict with the registry's.
  static Result<std::unique_ptr<Engine>> create(const EngineOptions& options,
                                                const EngineParts& parts);
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  // Stops the loop thread and ends every unfinished request with an error.
  ~Engine();

  // Validates and queues a request. Errors (kInvalidArgument, nothing queued): an empty prompt,
  // a token outside the vocabulary, a prompt leaving no room for one token in the context
  // limit (a prompt only scored, max_tokens 0 with prompt_logprobs, may fill it), max_tokens < 1 (<
  // 0 with prompt_logprobs), bad sampling parameters (logit bias included), logprobs outside [0,
  // 20], num_choices outside [1, max_num_sequences], empty stop strings or stop strings without a
  // text decoder, an adapter the runner does not serve; kFailedPrecondition after stop().
  Result<RequestId> submit(Request request);
  // Asks for the request to end with kCancelled at the start of the next step (every choice not
  // finished yet: one on_finish each), its blocks freed in that step. Unknown or already
  // finished ids are ignored.
  void cancel(RequestId request);

  // Starts the loop thread: it steps while there is work and sleeps on the inbox otherwise.
  // Requires: not started.
  void start();
  // Stops and joins the loop thread (if started), then ends every unfinished request with
  // kError (kUnavailable). Later submissions fail. Idempotent. Not from a request callback.
  void stop();

  // Driving thread: one step. Returns whether a forward step ran.
  bool step();
  // Driving thread: steps until no request is left. Requires: not started.
  void run_until_idle();
  // Driving thread: requests not yet finished (including those still in the inbox).
  bool has_unfinished_requests();
  // Driving thread: aborts unless the scheduler's and the block manager's invariants hold.
  void check_invariants() const;

  EngineStats stats() const { return metrics_.snapshot(); }
  metrics::Registry& registry() { return *registry_; }
  // The number of block table columns steps use.
  int32_t max_blocks_per_sequence() const { return max_blocks_per_sequence_; }

 private:
  struct RequestState;
  struct ChoiceState;

  Engine(const EngineOptions& options, const EngineParts& parts, EngineMetrics metrics,
         std::unique_ptr<Clock> owned_clock, std::unique_ptr<metrics::Registry> owned_registry,
         std::unique_ptr<Scheduler> scheduler, PhaseBudgetTuner phase_tuner);

  Status validate(const Request& request) const;
  void loop();
  bool step_once();
  // Takes the inbox; admits submissions, applies cancellations.
  void drain_inbox();
  void accept(std::unique_ptr<RequestState> state);
  void run_plan(StepPlan& plan, TimePoint started);
  // With a profile: charges the time since the last lap to `row` (if given) and starts the
  // next lap.
  void profile_lap(std::optional<exec::ProfileRow> row);
  // The choice a scheduled sequence belongs to. Requires: its request is unfinished.
  ChoiceState& choice_of(const Sequence& sequence);
  // Fills the prompt logprobs of the positions of an all-logits segment from its rows
  // (f32 [segment.num_tokens, vocab]).
  void record_prompt_logprobs(RequestState& state, const ScheduledSegment& segment,
                              std::span<const float> rows);
  // Choice 0's prefill completed with this sampling row: deliver the prompt logprobs, fork the
  // other choices, and sample every choice's first token (or end them all when max_tokens is 0).
  void complete_prefill(ChoiceState& choice, std::span<const float> logits_row);
  // Samples the next token of `choice` from one logits row and streams it.
  void accept_token(ChoiceState& choice, std::span<const float> logits_row);
  // Ends a choice: releases its sequence (unless the scheduler already has), reports it. A
  // choice 0 ending before the fork ends its unforked siblings too. The last choice to end
  // removes the request.
  void finish(ChoiceState& choice, FinishReason reason, const Status& error);
  // Ends every choice of the request not finished yet; an unknown id is ignored.
  void finish_request(RequestId id, FinishReason reason, const Status& error);
  void fail_segments(const StepPlan& plan, const Status& error);
  void report_state();
  // Feeds the step to the phase tuner and applies the split it moves to.
  void tune_phases(const StepPlan& plan, Duration step_time);

  const EngineOptions options_;
  kv::BlockManager& block_manager_;
  StepRunner& runner_;
  lora::AdapterManager* const adapters_;
  MemoryPressureHandler* const pressure_;
  exec::OpProfile* const profile_;
  std::chrono::steady_clock::time_point profile_lap_start_;  // driving thread only
  // The last step's appends had to preempt (a failed allocation, for the pressure handler).
  bool appends_preempted_ = false;
  std::unique_ptr<Clock> owned_clock_;
  const Clock& clock_;
  std::unique_ptr<metrics::Registry> owned_registry_;
  metrics::Registry* registry_;
  TextDecoderFactory text_decoder_factory_;
  const int32_t vocab_size_;
  const int32_t max_context_tokens_;
  const int32_t max_blocks_per_sequence_;
  EngineMetrics metrics_;

  // --- Driving thread only.
  std::unique_ptr<Scheduler> scheduler_;
  PhaseBudgetTuner phase_tuner_;
  StepBatchBuilder step_batch_builder_;
  Sampler sampler_;
  std::vector<float> logits_scratch_;  // f32 [vocab]: the sampler rewrites its row
  std::unordered_map<RequestId, std::unique_ptr<RequestState>> requests_;

  // --- Inbox, shared with submitting threads.
  mutable Mutex inbox_mutex_;
  std::condition_variable inbox_changed_;  // signalled under inbox_mutex_
  std::vector<std::unique_ptr<RequestState>> submissions_ FOLIO_GUARDED_BY(inbox_mutex_);
  std::vector<RequestId> cancellations_ FOLIO_GUARDED_BY(inbox_mutex_);
  int64_t next_request_id_ FOLIO_GUARDED_BY(inbox_mutex_) = 1;
  int64_t next_seq_id_ FOLIO_GUARDED_BY(inbox_mutex_) = 1;  // a KV sequence per choice
  bool accepting_ FOLIO_GUARDED_BY(inbox_mutex_) = true;
  bool stop_requested_ FOLIO_GUARDED_BY(inbox_mutex_) = false;

  std::thread loop_thread_;  // joinable while started; touched by start()/stop() only
};

}  // namespace folio::engine
