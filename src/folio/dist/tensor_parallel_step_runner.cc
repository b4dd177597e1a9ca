#include "folio/dist/tensor_parallel_step_runner.h"

#include <utility>

#include <fmt/format.h>

namespace folio::dist {

Result<std::unique_ptr<TensorParallelStepRunner>> TensorParallelStepRunner::create(
    std::vector<std::unique_ptr<WorkerClient>> workers, const PipelineStageSpec& spec,
    const std::string& model_hash) {
  const size_t num_ranks = workers.size();
  if (num_ranks < 2) {
    return invalid_argument("tensor parallelism needs at least two workers, got {}", num_ranks);
  }
  FOLIO_ASSIGN_OR_RETURN(StageGroup group, StageGroup::prepare(
                                               std::move(workers),
                                               [&](size_t r) {
                                                 PipelineStageSpec rank_spec = spec;
                                                 rank_spec.tensor_rank = static_cast<int64_t>(r);
                                                 rank_spec.tensor_ranks =
                                                     static_cast<int64_t>(num_ranks);
                                                 return rank_spec;
                                               },
                                               model_hash));
  std::unique_ptr<TensorParallelStepRunner> runner(new TensorParallelStepRunner(std::move(group)));
  runner->vocab_size_ = runner->group_.vocab_size();
  runner->max_logit_rows_ = spec.max_logit_rows > 0 ? spec.max_logit_rows : spec.max_sequences;
  runner->traffic_.num_ranks = static_cast<int64_t>(num_ranks);
  return runner;
}

TensorParallelStepRunner::~TensorParallelStepRunner() = default;

Status TensorParallelStepRunner::copy_blocks(std::span<const kv::BlockCopy> copies) {
  if (copies.empty()) return Status();
  queued_copies_.emplace_back(copies.begin(), copies.end());
  return Status();
}

Status TensorParallelStepRunner::send_copies() {
  while (!queued_copies_.empty()) {
    const std::vector<kv::BlockCopy>& batch = queued_copies_.front();
    if (Status copied = group_.copy_blocks(batch); !copied.ok()) {
      queued_copies_.clear();
      return copied;
    }
    traffic_.block_copies += static_cast<int64_t>(batch.size());
    queued_copies_.erase(queued_copies_.begin());
  }
  return Status();
}

Result<ir::StepOutput> TensorParallelStepRunner::run(const ir::StepBatch& step) {
  FOLIO_RETURN_IF_ERROR(send_copies());
  FOLIO_RETURN_IF_ERROR(group_.run([&](size_t) { return step; }));
  const StageStepResult& result = group_.results().front();
  ++traffic_.steps;
  traffic_.tokens += step.num_tokens();
  group_.add_wire_bytes(traffic_.request_bytes, traffic_.reply_bytes);
  traffic_.communication_ns += result.communication_ns;
  traffic_.reduced_bytes += result.reduced_bytes;
  return group_.output();
}

}  // namespace folio::dist
