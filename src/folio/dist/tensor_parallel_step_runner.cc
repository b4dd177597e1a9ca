#include "folio/dist/tensor_parallel_step_runner.h"

#include <thread>
#include <utility>

#include <fmt/format.h>

namespace folio::dist {
namespace {

// Runs call(r) for every rank r at once, rank 0 on the calling thread: a rank's step waits for
// the others inside its collectives, so the calls must be in flight together.
template <typename Call>
void for_each_rank_at_once(size_t num_ranks, Call&& call) {
  std::vector<std::thread> threads;
  threads.reserve(num_ranks - 1);
  for (size_t r = 1; r < num_ranks; ++r) threads.emplace_back([&call, r] { call(r); });
  call(0);
  for (std::thread& thread : threads) thread.join();
}

}  // namespace

Result<std::unique_ptr<TensorParallelStepRunner>> TensorParallelStepRunner::create(
    std::vector<std::unique_ptr<WorkerClient>> workers, const PipelineStageSpec& spec,
    const std::string& model_hash) {
  const size_t num_ranks = workers.size();
  if (num_ranks < 2) {
    return invalid_argument("tensor parallelism needs at least two workers, got {}", num_ranks);
  }
  if (spec.collective_store.empty()) {
    return invalid_argument(
        "tensor parallelism needs a rendezvous directory every worker reaches "
        "(PipelineStageSpec::collective_store)");
  }
  std::unique_ptr<TensorParallelStepRunner> runner(new TensorParallelStepRunner());
  std::vector<Result<PreparedStage>> prepared(num_ranks, internal_error("not prepared"));
  for_each_rank_at_once(num_ranks, [&](size_t r) {
    PipelineStageSpec rank_spec = spec;
    rank_spec.tensor_rank = static_cast<int64_t>(r);
    rank_spec.tensor_ranks = static_cast<int64_t>(num_ranks);
    prepared[r] = workers[r]->prepare_stage(rank_spec, model_hash, kFirstEpoch);
  });
  for (size_t r = 0; r < num_ranks; ++r) {
    if (!prepared[r].ok()) {
      return prepared[r].status().with_context(fmt::format(
          "preparing tensor rank {} of {} on worker {}", r, num_ranks, workers[r]->info().address));
    }
    if (prepared[r]->hidden_input_size != 0 || prepared[r]->hidden_output_size != 0 ||
        prepared[r]->vocab_size != prepared[0]->vocab_size || prepared[r]->vocab_size <= 0) {
      return failed_precondition(
          "tensor rank {} on worker {} reads {} and writes {} residual values with {} logits "
          "columns; every rank must run the whole model with rank 0's {} columns",
          r, workers[r]->info().address, prepared[r]->hidden_input_size,
          prepared[r]->hidden_output_size, prepared[r]->vocab_size, prepared[0]->vocab_size);
    }
    runner->prepared_.push_back(*prepared[r]);
  }
  runner->vocab_size_ = runner->prepared_.front().vocab_size;
  runner->max_logit_rows_ = spec.max_logit_rows > 0 ? spec.max_logit_rows : spec.max_sequences;
  runner->workers_ = std::move(workers);
  runner->results_.resize(num_ranks);
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
    for (size_t r = 0; r < workers_.size(); ++r) {
      Result<std::pair<uint64_t, uint64_t>> answer =
          workers_[r]->copy_blocks(prepared_[r].stage_id, batch, kFirstEpoch);
      if (!answer.ok()) {
        queued_copies_.clear();
        return answer.status().with_context(
            fmt::format("copying {} KV blocks on tensor rank {} ({})", batch.size(), r,
                        workers_[r]->info().address));
      }
    }
    traffic_.block_copies += static_cast<int64_t>(batch.size());
    queued_copies_.erase(queued_copies_.begin());
  }
  return Status();
}

Result<ir::StepOutput> TensorParallelStepRunner::run(const ir::StepBatch& step) {
  FOLIO_RETURN_IF_ERROR(send_copies());
  std::vector<Status> statuses(workers_.size());
  for_each_rank_at_once(workers_.size(), [&](size_t r) {
    statuses[r] = workers_[r]->run_stage(prepared_[r].stage_id, step, {}, results_[r], kFirstEpoch);
  });
  for (size_t r = 0; r < workers_.size(); ++r) {
    if (!statuses[r].ok()) {
      return statuses[r].with_context(fmt::format("tensor rank {} of {} (worker {})", r,
                                                  workers_.size(), workers_[r]->info().address));
    }
  }
  const StageStepResult& result = results_.front();
  if (result.vocab_size != vocab_size_ ||
      result.logits.size() != static_cast<size_t>(result.num_rows) * vocab_size_) {
    return data_loss("tensor rank 0 ({}) sent {} logits for {} rows of {} columns",
                     workers_.front()->info().address, result.logits.size(), result.num_rows,
                     vocab_size_);
  }
  ++traffic_.steps;
  traffic_.tokens += step.num_tokens();
  for (const StageStepResult& rank : results_) {
    traffic_.request_bytes += rank.request_bytes;
    traffic_.reply_bytes += rank.reply_bytes;
  }
  traffic_.communication_ns += result.communication_ns;
  traffic_.reduced_bytes += result.reduced_bytes;
  return ir::StepOutput{.logits = result.logits,
                        .num_rows = result.num_rows,
                        .vocab_size = result.vocab_size,
                        .hidden = {},
                        .hidden_size = 0};
}

}  // namespace folio::dist
