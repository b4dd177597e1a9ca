#include "testing/fault_injecting_step_runner.h"

#include <cstring>

namespace folio::engine::testing {

namespace {

// The loss that covers both.
RunnerRecovery larger_loss(const std::optional<RunnerRecovery>& earlier,
                           const RunnerRecovery& later) {
  using LostKv = RunnerRecovery::LostKv;
  if (!earlier.has_value()) return later;
  if (earlier->lost_kv == LostKv::kAllKv || later.lost_kv == LostKv::kAllKv) {
    return RunnerRecovery{LostKv::kAllKv, -1};
  }
  if (earlier->lost_kv == LostKv::kNone) return later;
  if (later.lost_kv == LostKv::kNone) return *earlier;
  return RunnerRecovery{LostKv::kStageKv,
                        std::max(earlier->replay_through_stage, later.replay_through_stage)};
}

}  // namespace

Result<ir::StepOutput> FaultInjectingStepRunner::run(const ir::StepBatch& step) {
  if (gate_) gate_();
  const int64_t index = num_runs_.fetch_add(1, std::memory_order_relaxed);
  if (plan_) {
    if (const std::optional<Fault> fault = plan_(Call::kRun, index, step))
      return inject(*fault, step);
  }
  return inner_.run(step);
}

Status FaultInjectingStepRunner::replay(const ir::StepBatch& step, int32_t through_stage) {
  const int64_t index = num_replays_.fetch_add(1, std::memory_order_relaxed);
  last_replay_stage_ = std::max(last_replay_stage_, through_stage);
  if (!step.logit_indices.empty()) {
    return invalid_argument("a replay step asks for {} logits rows", step.logit_indices.size());
  }
  if (plan_) {
    if (const std::optional<Fault> fault = plan_(Call::kReplay, index, step)) {
      return inject(*fault, step);
    }
  }
  return inner_.run(step).status();
}

Status FaultInjectingStepRunner::inject(const Fault& fault, const ir::StepBatch& step) {
  num_faults_.fetch_add(1, std::memory_order_relaxed);
  // Surviving stages wrote the step's KV before the lost one failed.
  if (fault.run_first) FOLIO_RETURN_IF_ERROR(inner_.run(step).status());
  switch (fault.loss.lost_kv) {
    case RunnerRecovery::LostKv::kNone:
      break;
    case RunnerRecovery::LostKv::kStageKv:
      lose_kv(fault.first_layer, fault.end_layer);
      break;
    case RunnerRecovery::LostKv::kAllKv:
      lose_kv(0, -1);
      break;
  }
  pending_ = larger_loss(pending_, fault.loss);
  return unavailable("injected fault: a worker was lost during step {}", num_runs());
}

void FaultInjectingStepRunner::lose_kv(int32_t first_layer, int32_t end_layer) {
  const Status processed = block_manager_.process_evictions();
  FOLIO_CHECK(processed.ok(), "{}", processed.to_string());
  const kv::KvLayoutNumbers layout = block_manager_.layout();
  if (end_layer < 0) end_layer = layout.num_layers;
  const int64_t layer_bytes = layout.block_bytes / layout.num_layers;
  const bool nan = random_.next() % 2 == 0;  // NaN in f16 and f32, or random bytes
  const kv::BlockAllocator& allocator = block_manager_.allocator();
  for (int64_t block = 0; block < allocator.capacity_blocks(); ++block) {
    if (allocator.state(kv::BlockId(static_cast<int32_t>(block))) == kv::BlockState::kUnbacked) {
      continue;
    }
    std::byte* begin = layout.block_pointer(block) + first_layer * layer_bytes;
    const int64_t bytes = (end_layer - first_layer) * layer_bytes;
    if (nan) {
      std::memset(begin, 0xff, static_cast<size_t>(bytes));
      continue;
    }
    for (int64_t offset = 0; offset < bytes; offset += 8) {
      const uint64_t word = random_.next();
      std::memcpy(begin + offset, &word, static_cast<size_t>(std::min<int64_t>(8, bytes - offset)));
    }
  }
}

Result<RunnerRecovery> FaultInjectingStepRunner::recover(const Status& failure) {
  num_recovers_.fetch_add(1, std::memory_order_relaxed);
  if (recover_fails_.load(std::memory_order_relaxed)) {
    // Release: pairs with the acquire in available().
    available_.store(false, std::memory_order_release);
    return unavailable("injected fault: no worker can take the lost one's place");
  }
  if (!pending_.has_value() && available()) return failure;  // not ours: not recoverable
  // Back after being unavailable with nothing injected since: the workers' KV is gone.
  const RunnerRecovery recovery =
      pending_.value_or(RunnerRecovery{RunnerRecovery::LostKv::kAllKv, -1});
  pending_.reset();
  // Release: pairs with the acquire in available().
  available_.store(true, std::memory_order_release);
  return recovery;
}

}  // namespace folio::engine::testing
