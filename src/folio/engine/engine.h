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
// runner failed, too many recoveries, the runner unavailable, the engine stopped); tokens are
// streamed once each, in order. Output (greedy, and seeded sampling) does not depend on
// batching, chunking, preemption or recoveries of the runner, since a preempted or recovered
// sequence keeps its tokens and its generator's state and recomputes (or swaps back, or
// replays) exactly the same KV.
//
// Recovery (step_runner.h; docs/design/engine.md "Recovery"): when run() fails, the engine asks
// the runner to recover(). The commit rule: a step's tokens are accepted (sampled, streamed,
// appended) only from a run() that succeeded, so a failed step produces nothing, and the
// sampler's state and each choice's generator advance only with accepted tokens. On success
// the engine rebuilds the KV the runner lost (replay() of every running sequence's computed
// tokens, or every running sequence back to recompute), drops the prefix cache's ref-0 blocks
// (their KV may be gone too), and runs the same plan again. Each recovery counts against every
// request with a running sequence; past max_recoveries_per_request it ends with kUnavailable.
// When recover() fails and the runner reports itself unavailable, every request ends with
// kUnavailable, submit() refuses new ones (kUnavailable), and the loop thread calls recover()
// again every recovery_retry_interval until it succeeds. A runner without recovery (StepRunner's
// default: recover() returns the failure, available() stays true) behaves as before: a failed
// step fails its own requests only.
//
// Thread-safety: submit(), cancel(), stats(), health() and the metrics registry may be used from
// any thread at any time. Submissions and cancellations go to an inbox under `inbox_mutex_`,
// drained by the driving thread at the start of each step (DESIGN.md: frees from other threads
// reach the owner through a queue drained each step). step(), run_until_idle() and the queries
// marked "driving thread" may only be called while the loop thread is not running.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
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
#include "folio/kv/kv_cache.h"
#include "folio/kv/kv_parallel_cache.h"

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
  // Recoveries of the step runner (see "Recovery" above) a request may live through while it
  // has a running sequence; the next one ends it with kError (kUnavailable). >= 0.
  int32_t max_recoveries_per_request = 3;
  // While the runner is unavailable, the loop thread asks it to recover this often. > 0.
  Duration recovery_retry_interval = std::chrono::seconds(1);
  // A loss of some stages' KV (RunnerRecovery::kStageKv) is rebuilt by replaying the running
  // sequences through those stages only; false: by recomputing every running sequence, as for
  // kAllKv (the baseline the replay is measured against; the output is the same). Over a
  // KV-parallel group lost KV is always recomputed.
  bool replay_lost_stages = true;
};

// What the server's /health reads (Engine::health()), from any thread.
struct EngineHealth {
  // False while the step runner is unavailable (a recovery failed; requests are refused).
  bool runner_available = true;
  // Requests accepted and not finished (waiting, running or swapped, or still in the inbox).
  bool has_work = false;
  // Seconds (of the engine's clock) since the driving thread last finished a step; 0 while its
  // loop waits for work. It grows during a step that does not return (a runner call stuck on a
  // lost worker), so has_work with a large value means the engine is stuck.
  double seconds_since_progress = 0;
};

// What the engine drives; borrowed, must outlive it.
struct EngineParts {
  // The KV cache: one block manager, or (kv_parallel_cache set, block_manager null) a
  // KV-parallel group whose steps carry every member's slots and block tables
  // (ir::StepBatch::kv_members; dist.md "KV-parallel groups"). Exactly one is required.
  kv::BlockManager* block_manager = nullptr;
  kv::KvParallelCache* kv_parallel_cache = nullptr;
  StepRunner* runner = nullptr;             // required
  bool has_swap_space = false;              // the block manager was given a HostSwapSpace
  const Clock* clock = nullptr;             // null: a SteadyClock owned by the engine
  metrics::Registry* registry = nullptr;    // null: a registry owned by the engine
  TextDecoderFactory text_decoder_factory;  // empty: no text, no stop strings
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
  // text decoder, an adapter the runner does not serve; kFailedPrecondition after stop();
  // kUnavailable (nothing queued) while the step runner is unavailable (see "Recovery").
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

  // From any thread: whether the runner is available, whether work is pending, and how long
  // since the driving thread last made progress (EngineHealth).
  EngineHealth health() const;

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
  // One step (step_once() notes the progress after it).
  bool run_step();
  // Runs the plan and accepts its tokens; false when it did not complete (failed, or voided
  // by a recovery that sent its sequences back to recompute).
  bool run_plan(StepPlan& plan, TimePoint started);
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

  // --- Recovery of the step runner (engine_recovery.cc).
  enum class StepRecovery {
    kRunAgain,     // the runner recovered and the lost KV is rebuilt: run the (pruned) plan again
    kRecomputing,  // every running sequence went back to recompute: the plan is void
    kFailed,       // the runner did not recover: the plan's requests (or all) have failed
  };
  // After run() failed with `failure` while running `plan`: recover() until the runner is
  // re-formed and the KV it lost is rebuilt, failing the requests past their recovery limit
  // (their segments leave the plan).
  StepRecovery recover_step(StepPlan& plan, Status failure);
  // Counts a successful recovery against every request with a running sequence, ends those
  // past max_recoveries_per_request (taking their segments out of `plan`, if given) and returns
  // how many requests live on.
  int64_t count_recovery(StepPlan* plan);
  // Rebuilds what `lost` says is lost; an error from replay() when it fails.
  Status rebuild_lost_kv(const RunnerRecovery& lost);
  // Replays every running sequence's computed tokens through stages 0..through_stage.
  Status replay_running_kv(int32_t through_stage);
  // Lost stage KV is replayed (options_.replay_lost_stages), except over a KV-parallel group,
  // whose running sequences recompute it.
  bool replays_lost_stages() const {
    return options_.replay_lost_stages && kv_parallel_cache_ == nullptr;
  }
  // The step's arrays over the engine's cache (every member's for a KV-parallel group).
  Result<ir::StepBatch> build_step(const StepPlan& plan);
  // The cached (ref-0) prefix blocks' KV is lost: drop them from the prefix cache.
  void drop_cached_prefixes();
  // The runner did not recover and is unavailable: every request ends with kUnavailable and
  // submissions are refused until restore_runner() succeeds.
  void enter_runner_unavailable(const Status& recover_error);
  // While unavailable: one recover() attempt; true when the runner is back.
  bool restore_runner();
  void fail_all_requests(const Status& error);
  // Driving thread: the engine made progress now (health()).
  void note_progress();
  // Driving thread: the loop waits for work (health() reports no stall meanwhile).
  void note_idle();
  void report_state();
  // Feeds the step to the phase tuner and applies the split it moves to.
  void tune_phases(const StepPlan& plan, Duration step_time);

  const EngineOptions options_;
  kv::KvCache& kv_cache_;                         // *block_manager_ or *kv_parallel_cache_
  kv::BlockManager* const block_manager_;         // null for a KV-parallel group
  kv::KvParallelCache* const kv_parallel_cache_;  // null for one block manager
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
  // The recover() failure the runner is unavailable since (runner_unavailable_ is true): what
  // restore_runner() passes to recover() again.
  Status runner_failure_;

  // --- Health, read by health() on any thread.
  // True from a failed recovery (with the runner unavailable) until restore_runner() succeeded.
  // Stored (release) by the driving thread; loaded (acquire) by submit() and health().
  std::atomic<bool> runner_unavailable_{false};
  // Requests accepted and not finished: incremented by submit() (release, under inbox_mutex_,
  // before the request is visible to the driving thread), decremented by the driving thread
  // (release) when a request's last choice ends; loaded (acquire) by health().
  std::atomic<int64_t> num_unfinished_requests_{0};
  // The engine clock's nanoseconds when the driving thread last finished a step, or
  // kIdleProgress while its loop waits for work. Stored (release) by the driving thread only
  // after run() and recover() returned, so a stuck runner call never looks like progress;
  // loaded (acquire) by health().
  static constexpr int64_t kIdleProgress = std::numeric_limits<int64_t>::min();
  std::atomic<int64_t> progress_nanoseconds_{0};

  // --- Inbox, shared with submitting threads.
  mutable Mutex inbox_mutex_;
  std::condition_variable inbox_changed_;  // signalled under inbox_mutex_
  std::vector<std::unique_ptr<RequestState>> submissions_ FOLIO_GUARDED_BY(inbox_mutex_);
  std::vector<RequestId> cancellations_ FOLIO_GUARDED_BY(inbox_mutex_);
  int64_t next_request_id_ FOLIO_GUARDED_BY(inbox_mutex_) = 1;
  int64_t next_seq_id_ FOLIO_GUARDED_BY(inbox_mutex_) = 1;  // a KV sequence per choice
  bool accepting_ FOLIO_GUARDED_BY(inbox_mutex_) = true;
  // Why the runner is unavailable (runner_unavailable_), for submit()'s refusals.
  std::string unavailable_cause_ FOLIO_GUARDED_BY(inbox_mutex_);
  bool stop_requested_ FOLIO_GUARDED_BY(inbox_mutex_) = false;

  std::thread loop_thread_;  // joinable while started; touched by start()/stop() only
};

}  // namespace folio::engine
