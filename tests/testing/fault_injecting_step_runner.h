// FaultInjectingStepRunner: a StepRunner that wraps another (the toy model, or the real model's
// runner) and behaves like a pipeline of workers that loses one (engine/step_runner.h
// "Recovery"), for tests of the engine's recovery.
//
// A fault plan decides, call by call, whether a run() or replay() fails. A failing call may first
// run the step through the wrapped runner (the surviving stages wrote their KV before the lost
// one failed) and then loses KV: with kStageKv it overwrites the chosen layers of every held KV
// block with garbage (NaN bytes or random bytes), with kAllKv every layer, with kNone nothing;
// then it returns kUnavailable. recover() reports that loss (the largest since the last
// recover()), unless the test made it fail: then the runner is unavailable() until a later
// recover() succeeds. A recover() after a failure it did not inject returns that failure (not
// recoverable), so a real error is never hidden. replay() runs the step through the wrapped runner,
// which writes the KV of every layer (a local runner cannot stop at a stage: the layers it rewrites
// get the same bytes), and discards the logits.
//
// A gate (set_run_gate) makes run() call a function first, which may block: a stuck worker.
//
// Thread-safety: run(), replay() and recover() on the engine's driving thread; available(),
// set_recover_fails(), the counters and set_run_gate() (before the engine starts) from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>

#include "folio/base/random.h"
#include "folio/engine/step_runner.h"
#include "folio/kv/block_manager.h"

namespace folio::engine::testing {

class FaultInjectingStepRunner final : public StepRunner {
 public:
  enum class Call { kRun, kReplay };
  // A fault: what it loses, and whether the wrapped runner runs the step first.
  struct Fault {
    RunnerRecovery loss;
    // With kStageKv: the layers [first_layer, end_layer) lose their KV; end_layer -1: to the
    // last layer.
    int32_t first_layer = 0;
    int32_t end_layer = -1;
    bool run_first = false;
  };
  // Called with every run() and replay() (numbered from 0 per kind) and its step: a fault, or
  // nothing.
  using FaultPlan =
      std::function<std::optional<Fault>(Call call, int64_t index, const ir::StepBatch& step)>;

  // `inner` and `block_manager` (whose KV cache `inner` reads and writes) must outlive the
  // runner. `seed` picks the garbage.
  FaultInjectingStepRunner(StepRunner& inner, kv::BlockManager& block_manager, uint64_t seed = 1)
      : inner_(inner), block_manager_(block_manager), random_(seed) {}

  void set_fault_plan(FaultPlan plan) { plan_ = std::move(plan); }
  // True: recover() fails and the runner stays unavailable until it succeeds (false again).
  void set_recover_fails(bool fails) { recover_fails_.store(fails, std::memory_order_relaxed); }
  // Called at the start of every run(), before anything else; it may block.
  void set_run_gate(std::function<void()> gate) { gate_ = std::move(gate); }

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  Status replay(const ir::StepBatch& step, int32_t through_stage) override;
  Result<RunnerRecovery> recover(const Status& failure) override;
  bool available() const override {
    // Acquire: pairs with the release stores in recover().
    return available_.load(std::memory_order_acquire);
  }
  // Copies are never failed here: the wrapped runner's answer.
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override {
    return inner_.copy_blocks(copies);
  }
  int32_t vocab_size() const override { return inner_.vocab_size(); }
  int32_t max_logit_rows() const override { return inner_.max_logit_rows(); }
  bool supports_adapter(int64_t adapter_id) const override {
    return inner_.supports_adapter(adapter_id);
  }

  int64_t num_runs() const { return num_runs_.load(std::memory_order_relaxed); }
  int64_t num_replays() const { return num_replays_.load(std::memory_order_relaxed); }
  int64_t num_faults() const { return num_faults_.load(std::memory_order_relaxed); }
  int64_t num_recovers() const { return num_recovers_.load(std::memory_order_relaxed); }
  // The largest through_stage a replay() was given; -1 before any.
  int32_t last_replay_stage() const { return last_replay_stage_; }

 private:
  // Applies `fault` (the call `step` fails with it); returns the failure.
  Status inject(const Fault& fault, const ir::StepBatch& step);
  void lose_kv(int32_t first_layer, int32_t end_layer);

  StepRunner& inner_;
  // Only to find the held blocks (after processing the page source's eviction notices, so no
  // page it overwrites belongs to anyone else now).
  kv::BlockManager& block_manager_;
  SplitMix64 random_;
  FaultPlan plan_;
  std::function<void()> gate_;
  std::optional<RunnerRecovery> pending_;  // lost since the last recover()
  std::atomic<bool> recover_fails_{false};
  // Stored (release) by recover() on the driving thread; loaded (acquire) by available().
  std::atomic<bool> available_{true};
  // Relaxed counters: each stands alone, read by tests after the engine went idle or stopped.
  std::atomic<int64_t> num_runs_{0};
  std::atomic<int64_t> num_replays_{0};
  std::atomic<int64_t> num_faults_{0};
  std::atomic<int64_t> num_recovers_{0};
  int32_t last_replay_stage_ = -1;
};

}  // namespace folio::engine::testing
