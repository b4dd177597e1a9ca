// PipelineStepRunner: the coordinator's engine::StepRunner over a pipeline of workers (issue 15,
// slice 3). The coordinator keeps the scheduler, the block tables and the sampler; each step's
// arrays go to every stage in turn (worker.proto RunStage), with the residual stream each stage
// returns as the next one's input, and the last stage's logits come back as the step's output.
// Every call carries a deadline (WorkerClientOptions::step_timeout) and every error names the
// worker and stage it came from.
//
// The stages are prepared by create() (PrepareStage), in order, before the first step: a
// worker that is unreachable, holds another model, cannot fit its stage or answers with
// stages that do not chain (widths of the residual stream, contiguous layers from 0 to the
// last) is an error before serving starts.
//
// Recovery (issue 16, docs/design/dist.md "Recovery"): the runner holds an epoch (kFirstEpoch
// at start) that every stage call carries, and a lease on every worker (WorkerLeaseMonitor).
// A stage call that fails because its worker is gone or stopped (UNAVAILABLE, a deadline, a
// call the lease monitor cancelled, a missed lease, a reply of another epoch or incarnation,
// a refusal because the worker lost its stage) fails run() with kUnavailable naming the worker
// and stage, and the runner needs recovery: run() and replay() refuse (kUnavailable) until
// recover() succeeds. recover() moves to the next epoch, finds every lost stage (the failed one
// unless a Ping shows it alive and the same incarnation, those whose lease was lost, those whose
// worker restarted, those that cannot be fenced), fences the survivors into the new epoch
// (keeping their KV), prepares each lost stage on a replacement (PipelineRecoveryOptions::
// replace_worker, or the lost worker's own address) in the new epoch, and reports kStageKv up
// to the highest lost stage (kNone when nothing was lost). replay() then runs the engine's
// replay steps through stages 0..k only. Without a replacement, the layers are split again over
// the survivors when a replanner is given (every stage re-prepared: kAllKv); otherwise recover()
// fails (kUnavailable) and available() is false until a later recover() succeeds.
//
// Copies (protocol revision 4): copy_blocks() (copy-on-write of forked sequences' blocks, from
// the engine's block manager) only queues; run() and replay() first send every queued batch to
// every stage (CopyBlocks), then the step. The queue is dropped only once every stage copied it,
// so after a failure the batches go again after recover(): to the stages that copied already
// (harmless: no step wrote a destination since) and the ones that had not. They go before a
// replay's step, so a copy out of a block that the lost stage's replacement never had is
// overwritten by the replay wherever a running sequence reads it. Queuing rather than sending
// keeps copy_blocks() from failing: the block manager flushes copies while the scheduler
// allocates, where a failure could not be recovered from. Workers given up
// on that come back (their beats arrive) are counted as stale and told to exit.
//
// Thread-safety: as StepRunner: run(), recover() and replay() from the engine's driving thread
// only; available() and recovery_counters() from any thread. The lease monitor's thread only
// sets per-stage flags and cancels calls in flight.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/metrics.h"
#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/recovery_stats.h"
#include "folio/dist/shard_source.h"
#include "folio/dist/worker_client.h"
#include "folio/dist/worker_lease_monitor.h"
#include "folio/engine/step_runner.h"

namespace folio::dist {

// What crossed the wire so far (serialized gRPC messages, both directions).
struct PipelineTraffic {
  int64_t steps = 0;
  int64_t tokens = 0;
  int64_t request_bytes = 0;
  int64_t reply_bytes = 0;
  int64_t block_copies = 0;  // copy-on-write pairs copied by every stage
};

// Finds a worker to take a lost stage's place; called by recover() on the engine thread. An
// error: no worker now (recover() fails with it, and may be called again later).
using WorkerReplacer = std::function<Result<std::unique_ptr<WorkerClient>>(
    int32_t stage, const std::string& lost_address)>;

// Splits the model over the surviving workers (in pipeline order) when a lost stage has no
// replacement: one spec per survivor, contiguous layers from 0 to the model's last (e.g. by
// plan_pipeline over their declared memory). Called by recover() on the engine thread. An
// error: the survivors cannot hold the model.
using PipelineReplanner =
    std::function<Result<std::vector<PipelineStageSpec>>(const std::vector<WorkerInfo>& survivors)>;

struct PipelineRecoveryOptions {
  // Each worker beats every lease_interval; lease_misses intervals without a beat and it is lost.
  std::chrono::milliseconds lease_interval{100};
  int32_t lease_misses = 3;
  // Empty: reconnect to the lost worker's own address (a worker restarted there).
  WorkerReplacer replace_worker;
  // Empty: no re-planning (a stage without a replacement fails recover()). Set: the surviving
  // workers are prepared with the new split in the new epoch, and recover() reports kAllKv.
  PipelineReplanner replan_on_survivors;
  // The folio_dist_* series of RecoveryStats; null: none.
  metrics::Registry* registry = nullptr;
  // The weight cache (issue 15, slice 5): a worker without the model file (empty model hash)
  // is sent its stage's shard before every PrepareStage, at create() and for a replacement or a
  // re-plan alike. Null: such a worker is prepared as it is (and refuses). Must outlive the
  // runner.
  ShardSource* weight_source = nullptr;
};

class PipelineStepRunner final : public engine::StepRunner {
 public:
  // Prepares specs[i] on workers[i] (same sizes, at least one) for the model of `model_hash` in
  // epoch kFirstEpoch, and starts the workers' leases.
  static Result<std::unique_ptr<PipelineStepRunner>> create(
      std::vector<std::unique_ptr<WorkerClient>> workers, std::vector<PipelineStageSpec> specs,
      const std::string& model_hash, PipelineRecoveryOptions recovery = {});
  ~PipelineStepRunner() override;

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  // Queues the batch (kInvalidArgument, queuing nothing, for one that breaks
  // check_block_copies()); the next run() or replay() sends the queued batches, in order, to
  // every stage (worker.proto CopyBlocks) before its step, so a worker lost during a copy fails
  // that run() or replay() and goes through recover() like any lost worker. See "Copies" above.
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t max_logit_rows() const override { return max_logit_rows_; }
  Result<engine::RunnerRecovery> recover(const Status& failure) override;
  Status replay(const ir::StepBatch& step, int32_t through_stage) override;
  bool available() const override { return available_.load(std::memory_order_acquire); }

  const std::vector<PreparedStage>& stages() const { return prepared_; }
  const PipelineTraffic& traffic() const { return traffic_; }
  uint64_t epoch() const { return epoch_; }
  // The worker of each stage now (its address and incarnation). Engine thread only.
  const WorkerInfo& worker_info(int32_t stage) const;
  // A snapshot of the recovery counters; from any thread.
  RecoveryCounters recovery_counters() const { return stats_->snapshot(); }

 private:
  PipelineStepRunner() = default;

  // Whether a stage call's answer (its epoch and incarnation) or the lease shows the worker of
  // `stage` lost; if so the runner needs recovery and the error says why.
  Status check_answer(int32_t stage, uint64_t epoch, uint64_t incarnation);
  // Sends the queued copy batches to every stage; drops them once all copied. A worker failure:
  // lose(); another error: the batches are dropped (they would fail again) and it is returned.
  Status send_copies();
  // Runs stages 0..through; the last stage's answer is in results_[through].
  Status run_stages(const ir::StepBatch& step, int32_t through);
  // A stage call failed because its worker is lost (or may be): the runner needs recovery.
  Status lose(int32_t stage, const Status& cause);
  // Whether a stage call's error means its worker may be gone rather than a bad request.
  static bool is_worker_failure(const Status& status);
  // Marks `stage` lost (its KV with it) and gives its client up.
  void mark_lost(int32_t stage, const std::string& why);
  // Puts a replacement in `stage`'s place, prepared in the current epoch.
  Status replace(int32_t stage);
  // Prepares the layers over the stages not lost, as recovery_.replan_on_survivors splits them,
  // in the current epoch; `no_replacement` says why it is needed.
  Status replan_on_survivors(const Status& no_replacement);
  // Starts a lease monitor over the current workers.
  Status start_leases();

  std::vector<std::shared_ptr<WorkerClient>> workers_;
  std::vector<PipelineStageSpec> specs_;
  std::vector<PreparedStage> prepared_;
  std::string model_hash_;
  int32_t vocab_size_ = 0;
  int32_t max_logit_rows_ = 0;
  // Reused between steps: each stage's answer (the last one's logits are the step's output).
  std::vector<StageStepResult> results_;
  // Copy batches queued by copy_blocks(), in order, not yet copied by every stage.
  std::vector<std::vector<kv::BlockCopy>> queued_copies_;
  PipelineTraffic traffic_;

  PipelineRecoveryOptions recovery_;
  uint64_t epoch_ = kFirstEpoch;
  // Set by a failure of a worker, cleared by a recover() that succeeded.
  bool needs_recovery_ = false;
  Status failure_;
  // Stages whose worker is lost and not yet replaced.
  std::vector<bool> stage_lost_;
  // The highest stage whose KV was lost since the last recover() that succeeded; -1: none.
  int32_t kv_lost_through_ = -1;
  std::atomic<bool> available_{true};
  std::unique_ptr<RecoveryStats> stats_ = std::make_unique<RecoveryStats>();
  // Declared after stats_, which it counts into: destroyed (its thread joined) first.
  std::unique_ptr<WorkerLeaseMonitor> monitor_;
};

}  // namespace folio::dist
