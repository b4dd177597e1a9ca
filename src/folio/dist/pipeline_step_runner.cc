#include "folio/dist/pipeline_step_runner.h"

#include <fmt/format.h>

#include <algorithm>

#include "folio/base/log.h"

namespace folio::dist {
namespace {

// Whether `prepared` answers like `before` (a replacement of a stage must chain as it did).
bool same_shape(const PreparedStage& prepared, const PreparedStage& before) {
  return prepared.hidden_input_size == before.hidden_input_size &&
         prepared.hidden_output_size == before.hidden_output_size &&
         prepared.vocab_size == before.vocab_size;
}

}  // namespace

Result<std::unique_ptr<PipelineStepRunner>> PipelineStepRunner::create(
    std::vector<std::unique_ptr<WorkerClient>> workers, std::vector<PipelineStageSpec> specs,
    const std::string& model_hash, PipelineRecoveryOptions recovery) {
  if (workers.empty() || workers.size() != specs.size()) {
    return invalid_argument("a pipeline needs one stage per worker: {} workers, {} stages",
                            workers.size(), specs.size());
  }
  if (recovery.lease_interval.count() <= 0 || recovery.lease_misses <= 0) {
    return invalid_argument("a lease needs a positive interval and misses: {} ms, {} misses",
                            recovery.lease_interval.count(), recovery.lease_misses);
  }
  std::unique_ptr<PipelineStepRunner> runner(new PipelineStepRunner());
  for (size_t s = 0; s < specs.size(); ++s) {
    const PipelineStageSpec& spec = specs[s];
    const std::string& address = workers[s]->info().address;
    const int64_t expected_first = s == 0 ? 0 : specs[s - 1].end_layer;
    if (spec.first_layer != expected_first) {
      return invalid_argument(
          "stage {} (worker {}) starts at layer {}; the stages must cover the layers in order "
          "from 0, so it must start at {}",
          s, address, spec.first_layer, expected_first);
    }
    Result<PreparedStage> prepared = prepare_stage_with_weights(*workers[s], recovery.weight_source,
                                                                spec, model_hash, kFirstEpoch);
    if (!prepared.ok()) {
      return prepared.status().with_context(
          fmt::format("preparing stage {} (layers [{}, {})) on worker {}", s, spec.first_layer,
                      spec.end_layer, address));
    }
    const bool first = s == 0, last = s + 1 == specs.size();
    const int64_t hidden_in = s == 0 ? 0 : runner->prepared_.back().hidden_output_size;
    const bool chains = prepared->hidden_input_size == hidden_in &&
                        (prepared->hidden_output_size > 0) == !last &&
                        (prepared->vocab_size > 0) == last && (first || hidden_in > 0);
    if (!chains) {
      return failed_precondition(
          "stage {} on worker {} (layers [{}, {})) reads a residual stream of {} values and "
          "writes {} ({} logits columns), which does not chain after the previous stage's {}: "
          "the last stage must end at the model's last layer",
          s, address, spec.first_layer, spec.end_layer, prepared->hidden_input_size,
          prepared->hidden_output_size, prepared->vocab_size, hidden_in);
    }
    runner->prepared_.push_back(*prepared);
  }
  runner->vocab_size_ = runner->prepared_.back().vocab_size;
  runner->max_logit_rows_ =
      specs.back().max_logit_rows > 0 ? specs.back().max_logit_rows : specs.back().max_sequences;
  for (std::unique_ptr<WorkerClient>& worker : workers)
    runner->workers_.push_back(std::move(worker));
  runner->specs_ = std::move(specs);
  runner->model_hash_ = model_hash;
  runner->results_.resize(runner->specs_.size());
  runner->stage_lost_.assign(runner->specs_.size(), false);
  if (recovery.registry != nullptr) {
    FOLIO_RETURN_IF_ERROR(runner->stats_->export_to(*recovery.registry));
  }
  runner->stats_->set_epoch(kFirstEpoch);
  runner->recovery_ = std::move(recovery);
  FOLIO_RETURN_IF_ERROR(runner->start_leases());
  return runner;
}

Status PipelineStepRunner::start_leases() {
  monitor_.reset();  // the old leases end (their streams cancelled) before the new ones start
  const auto num_stages = static_cast<int32_t>(workers_.size());
  monitor_ = std::make_unique<WorkerLeaseMonitor>(
      num_stages,
      LeaseOptions{.interval = recovery_.lease_interval, .misses = recovery_.lease_misses},
      *stats_);
  for (int32_t s = 0; s < num_stages; ++s) {
    FOLIO_RETURN_IF_ERROR(monitor_->watch(s, workers_[static_cast<size_t>(s)], epoch_));
  }
  return Status();
}

PipelineStepRunner::~PipelineStepRunner() = default;

const WorkerInfo& PipelineStepRunner::worker_info(int32_t stage) const {
  return workers_[static_cast<size_t>(stage)]->info();
}

bool PipelineStepRunner::is_worker_failure(const Status& status) {
  switch (status.code()) {
    case StatusCode::kUnavailable:         // gone, or unreachable
    case StatusCode::kDeadlineExceeded:    // stopped, or the link is down
    case StatusCode::kCancelled:           // given up on by the lease monitor
    case StatusCode::kFailedPrecondition:  // restarted: it holds no stage, or another epoch
      return true;
    default:
      return false;
  }
}

Status PipelineStepRunner::lose(int32_t stage, const Status& cause) {
  const auto s = static_cast<size_t>(stage);
  needs_recovery_ = true;
  failure_ = unavailable("pipeline stage {} (layers [{}, {})): worker {} is lost: {}", stage,
                         specs_[s].first_layer, specs_[s].end_layer, workers_[s]->info().address,
                         cause.message());
  return failure_;
}

Status PipelineStepRunner::check_answer(int32_t stage, uint64_t epoch, uint64_t incarnation) {
  const WorkerClient& worker = *workers_[static_cast<size_t>(stage)];
  if (epoch != epoch_ || incarnation != worker.info().incarnation) {
    stats_->add_stale_reply();
    return lose(stage, unavailable("it answered for epoch {} as incarnation {:016x}; the "
                                   "coordinator is at epoch {} with incarnation {:016x}",
                                   epoch, incarnation, epoch_, worker.info().incarnation));
  }
  // A lease declared lost during the call: the answer may be from a worker given up on.
  if (monitor_->lost(stage)) return lose(stage, unavailable("it missed its lease during the call"));
  return Status();
}

Status PipelineStepRunner::copy_blocks(std::span<const kv::BlockCopy> copies) {
  if (copies.empty()) return Status();
  FOLIO_RETURN_IF_ERROR(check_block_copies(copies, specs_.front().num_kv_blocks));
  queued_copies_.emplace_back(copies.begin(), copies.end());
  return Status();
}

Status PipelineStepRunner::send_copies() {
  if (queued_copies_.empty()) return Status();
  const auto num_stages = static_cast<int32_t>(workers_.size());
  while (!queued_copies_.empty()) {
    const std::vector<kv::BlockCopy>& batch = queued_copies_.front();
    for (int32_t stage = 0; stage < num_stages; ++stage) {
      const auto s = static_cast<size_t>(stage);
      if (monitor_->lost(stage)) {
        return lose(stage, unavailable("it missed its lease before a KV block copy"));
      }
      Result<std::pair<uint64_t, uint64_t>> answer =
          workers_[s]->copy_blocks(prepared_[s].stage_id, batch, epoch_);
      if (!answer.ok()) {
        if (is_worker_failure(answer.status()) || monitor_->lost(stage)) {
          return lose(stage, answer.status());
        }
        queued_copies_.clear();
        return answer.status().with_context(
            fmt::format("copying {} KV blocks in pipeline stage {} (layers [{}, {}))", batch.size(),
                        stage, specs_[s].first_layer, specs_[s].end_layer));
      }
      FOLIO_RETURN_IF_ERROR(check_answer(stage, answer->first, answer->second));
    }
    traffic_.block_copies += static_cast<int64_t>(batch.size());
    queued_copies_.erase(queued_copies_.begin());  // every stage copied it
  }
  return Status();
}

Status PipelineStepRunner::run_stages(const ir::StepBatch& step, int32_t through) {
  if (needs_recovery_) {
    return unavailable("the pipeline needs recovery before it runs a step: {}", failure_.message());
  }
  FOLIO_RETURN_IF_ERROR(send_copies());
  std::span<const float> hidden;
  for (int32_t stage = 0; stage <= through; ++stage) {
    const auto s = static_cast<size_t>(stage);
    WorkerClient& worker = *workers_[s];
    StageStepResult& result = results_[s];
    if (monitor_->lost(stage)) {
      return lose(stage, unavailable("it missed its lease before the step"));
    }
    const Status status = worker.run_stage(prepared_[s].stage_id, step, hidden, result, epoch_);
    if (!status.ok()) {
      if (is_worker_failure(status) || monitor_->lost(stage)) return lose(stage, status);
      return status.with_context(fmt::format("pipeline stage {} (layers [{}, {}))", stage,
                                             specs_[s].first_layer, specs_[s].end_layer));
    }
    FOLIO_RETURN_IF_ERROR(check_answer(stage, result.epoch, result.incarnation));
    traffic_.request_bytes += result.request_bytes;
    traffic_.reply_bytes += result.reply_bytes;
    hidden = result.hidden_out;
  }
  return Status();
}

Result<ir::StepOutput> PipelineStepRunner::run(const ir::StepBatch& step) {
  FOLIO_RETURN_IF_ERROR(run_stages(step, static_cast<int32_t>(workers_.size()) - 1));
  ++traffic_.steps;
  traffic_.tokens += step.num_tokens();
  const StageStepResult& last = results_.back();
  if (last.num_rows != step.num_logit_rows() || last.vocab_size != vocab_size_ ||
      last.logits.size() != static_cast<size_t>(int64_t{last.num_rows} * vocab_size_)) {
    return data_loss("worker {} returned {} logits for {} rows of {}, the step wants {} rows",
                     workers_.back()->info().address, last.logits.size(), last.num_rows,
                     last.vocab_size, step.num_logit_rows());
  }
  return ir::StepOutput{last.logits, last.num_rows, vocab_size_, {}, 0};
}

Status PipelineStepRunner::replay(const ir::StepBatch& step, int32_t through_stage) {
  if (through_stage < 0 || through_stage >= static_cast<int32_t>(workers_.size())) {
    return invalid_argument("replay through stage {} of a pipeline of {} stages", through_stage,
                            workers_.size());
  }
  // Replay writes KV only: no stage computes logits, whatever the step asked for.
  ir::StepBatch without_logits = step;
  without_logits.logit_indices = {};
  FOLIO_RETURN_IF_ERROR(run_stages(without_logits, through_stage));
  ++traffic_.steps;
  traffic_.tokens += step.num_tokens();
  return Status();
}

void PipelineStepRunner::mark_lost(int32_t stage, const std::string& why) {
  const auto s = static_cast<size_t>(stage);
  if (!stage_lost_[s]) stats_->add_workers_lost(1);
  stage_lost_[s] = true;
  kv_lost_through_ = std::max(kv_lost_through_, stage);
  workers_[s]->abandon(why);
  log::warn("folio coordinator: pipeline stage {} lost worker {} (incarnation {:016x}): {}", stage,
            workers_[s]->info().address, workers_[s]->info().incarnation, why);
}

Status PipelineStepRunner::replace(int32_t stage) {
  const auto s = static_cast<size_t>(stage);
  const WorkerInfo lost = workers_[s]->info();
  Result<std::unique_ptr<WorkerClient>> replacement =
      recovery_.replace_worker
          ? recovery_.replace_worker(stage, lost.address)
          : WorkerClient::connect(lost.address, ModelIdentity{.hash = model_hash_, .name = ""},
                                  workers_[s]->options());
  if (!replacement.ok()) {
    return unavailable(
        "pipeline stage {} (layers [{}, {})) lost worker {} and found no worker to "
        "take its place: {}",
        stage, specs_[s].first_layer, specs_[s].end_layer, lost.address,
        replacement.status().to_string());
  }
  std::shared_ptr<WorkerClient> worker = std::move(replacement).value();
  Result<PreparedStage> prepared =
      prepare_stage_with_weights(*worker, recovery_.weight_source, specs_[s], model_hash_, epoch_);
  if (!prepared.ok()) {
    return unavailable(
        "pipeline stage {} (layers [{}, {})): its replacement worker {} could not "
        "prepare it: {}",
        stage, specs_[s].first_layer, specs_[s].end_layer, worker->info().address,
        prepared.status().to_string());
  }
  if (!same_shape(*prepared, prepared_[s])) {
    return failed_precondition(
        "pipeline stage {}: replacement worker {} reads {} and writes {} values ({} logits "
        "columns), the lost stage {} and {} ({})",
        stage, worker->info().address, prepared->hidden_input_size, prepared->hidden_output_size,
        prepared->vocab_size, prepared_[s].hidden_input_size, prepared_[s].hidden_output_size,
        prepared_[s].vocab_size);
  }
  FOLIO_RETURN_IF_ERROR(monitor_->watch(stage, worker, epoch_));
  log::info(
      "folio coordinator: pipeline stage {} moved from worker {} to {} (incarnation "
      "{:016x}) in epoch {}",
      stage, lost.address, worker->info().address, worker->info().incarnation, epoch_);
  prepared_[s] = *prepared;
  workers_[s] = std::move(worker);
  stage_lost_[s] = false;
  return Status();
}

Status PipelineStepRunner::replan_on_survivors(const Status& no_replacement) {
  std::vector<size_t> survivors;
  std::vector<WorkerInfo> infos;
  for (size_t s = 0; s < workers_.size(); ++s) {
    if (stage_lost_[s]) continue;
    survivors.push_back(s);
    infos.push_back(workers_[s]->info());
  }
  if (survivors.empty()) {
    return unavailable("no worker of the pipeline survived to re-plan over: {}",
                       no_replacement.message());
  }
  Result<std::vector<PipelineStageSpec>> specs = recovery_.replan_on_survivors(infos);
  if (!specs.ok()) {
    return unavailable("{}; re-planning over the {} surviving workers failed: {}",
                       no_replacement.message(), survivors.size(), specs.status().to_string());
  }
  if (specs->size() != survivors.size() || specs->front().first_layer != 0 ||
      specs->back().end_layer != specs_.back().end_layer) {
    return invalid_argument(
        "a re-plan must give each of the {} surviving workers a stage, covering layers [0, {}): it "
        "gave {} stages",
        survivors.size(), specs_.back().end_layer, specs->size());
  }
  // From here the survivors' stages are replaced: whatever happens, their old KV is gone.
  std::vector<std::shared_ptr<WorkerClient>> workers;
  std::vector<PreparedStage> prepared;
  for (size_t i = 0; i < survivors.size(); ++i) {
    const PipelineStageSpec& spec = (*specs)[i];
    std::shared_ptr<WorkerClient> worker = workers_[survivors[i]];
    const bool last = i + 1 == survivors.size();
    const int64_t hidden_in = i == 0 ? 0 : prepared.back().hidden_output_size;
    Result<PreparedStage> stage = (i > 0 && spec.first_layer != (*specs)[i - 1].end_layer)
                                      ? Result<PreparedStage>(invalid_argument(
                                            "re-planned stage {} starts at layer {}, not {}", i,
                                            spec.first_layer, (*specs)[i - 1].end_layer))
                                      : prepare_stage_with_weights(*worker, recovery_.weight_source,
                                                                   spec, model_hash_, epoch_);
    const bool chains = stage.ok() && stage->hidden_input_size == hidden_in &&
                        (stage->hidden_output_size > 0) == !last && (stage->vocab_size > 0) == last;
    if (!chains) {
      stage_lost_.assign(workers_.size(), true);
      kv_lost_through_ = static_cast<int32_t>(workers_.size()) - 1;
      return unavailable("re-planned stage {} (layers [{}, {})) on worker {}: {}", i,
                         spec.first_layer, spec.end_layer, worker->info().address,
                         stage.ok() ? std::string("does not chain") : stage.status().to_string());
    }
    workers.push_back(std::move(worker));
    prepared.push_back(*stage);
  }
  for (size_t s = 0; s < workers_.size(); ++s) {
    if (stage_lost_[s]) workers_[s]->abandon("its stage was re-planned over the survivors");
  }
  workers_ = std::move(workers);
  specs_ = std::move(specs).value();
  prepared_ = std::move(prepared);
  results_.assign(workers_.size(), StageStepResult{});
  stage_lost_.assign(workers_.size(), false);
  return start_leases();
}

Result<engine::RunnerRecovery> PipelineStepRunner::recover(const Status& failure) {
  if (failure.code() != StatusCode::kUnavailable) return failure;  // not a lost worker
  // A new epoch first: whatever answers for the old one from now on is stale.
  ++epoch_;
  stats_->set_epoch(epoch_);
  const auto num_stages = static_cast<int32_t>(workers_.size());
  for (int32_t stage = 0; stage < num_stages; ++stage) {
    const auto s = static_cast<size_t>(stage);
    if (stage_lost_[s]) continue;
    if (monitor_->lost(stage) || workers_[s]->abandoned()) {
      mark_lost(stage, "its lease was lost");
      continue;
    }
    // A survivor must answer as the incarnation that holds the stage, and take the new epoch
    // keeping it (and its KV).
    Result<std::chrono::nanoseconds> ping = workers_[s]->ping();
    if (!ping.ok()) {
      mark_lost(stage, ping.status().to_string());
      continue;
    }
    Result<uint64_t> fenced = workers_[s]->fence(epoch_, prepared_[s].stage_id);
    if (!fenced.ok()) {
      mark_lost(stage, fenced.status().to_string());
    } else if (*fenced != workers_[s]->info().incarnation) {
      mark_lost(stage, fmt::format("incarnation {:016x} answered Fence", *fenced));
    }
  }
  for (int32_t stage = 0; stage < num_stages; ++stage) {
    if (!stage_lost_[static_cast<size_t>(stage)]) continue;
    Status replaced = replace(stage);
    if (!replaced.ok() && recovery_.replan_on_survivors) {
      replaced = replan_on_survivors(replaced);
      if (replaced.ok()) {
        // Every stage was prepared again: all the KV is gone.
        kv_lost_through_ = -1;
        needs_recovery_ = false;
        failure_ = Status();
        stats_->add_recovery();
        available_.store(true, std::memory_order_release);
        log::info("folio coordinator: pipeline re-planned over {} surviving workers in epoch {}",
                  workers_.size(), epoch_);
        return engine::RunnerRecovery{.lost_kv = engine::RunnerRecovery::LostKv::kAllKv,
                                      .replay_through_stage = -1};
      }
    }
    if (!replaced.ok()) {
      available_.store(false, std::memory_order_release);
      log::error("folio coordinator: recovery in epoch {} failed: {}", epoch_,
                 replaced.to_string());
      return replaced;
    }
  }
  engine::RunnerRecovery recovery;
  if (kv_lost_through_ >= 0) {
    recovery.lost_kv = engine::RunnerRecovery::LostKv::kStageKv;
    recovery.replay_through_stage = kv_lost_through_;
  } else {
    recovery.lost_kv = engine::RunnerRecovery::LostKv::kNone;
  }
  kv_lost_through_ = -1;
  needs_recovery_ = false;
  failure_ = Status();
  stats_->add_recovery();
  available_.store(true, std::memory_order_release);
  log::info("folio coordinator: pipeline re-formed in epoch {} ({})", epoch_,
            recovery.lost_kv == engine::RunnerRecovery::LostKv::kNone
                ? std::string("no KV lost")
                : fmt::format("KV lost through stage {}", recovery.replay_through_stage));
  return recovery;
}

}  // namespace folio::dist
