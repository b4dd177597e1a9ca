#include "folio/dist/stage_group.h"

#include <thread>
#include <utility>

#include <fmt/format.h>

namespace folio::dist {

void for_each_member_at_once(size_t num_members, const std::function<void(size_t)>& call) {
  std::vector<std::thread> threads;
  threads.reserve(num_members > 0 ? num_members - 1 : 0);
  for (size_t m = 1; m < num_members; ++m) threads.emplace_back([&call, m] { call(m); });
  if (num_members > 0) call(0);
  for (std::thread& thread : threads) thread.join();
}

Result<StageGroup> StageGroup::prepare(std::vector<std::unique_ptr<WorkerClient>> workers,
                                       const std::function<PipelineStageSpec(size_t)>& spec_of,
                                       const std::string& model_hash) {
  const size_t size = workers.size();
  StageGroup group;
  for (size_t m = 0; m < size; ++m) {
    group.specs_.push_back(spec_of(m));
    const PipelineStageSpec& spec = group.specs_.back();
    if (spec.group_rank() != static_cast<int64_t>(m) ||
        spec.group_size() != static_cast<int64_t>(size)) {
      return invalid_argument("the spec of worker {} of {} names {}", m, size, spec.describe());
    }
  }
  if (size < 2) return invalid_argument("a worker group needs at least two workers, got {}", size);
  // Without a rendezvous directory the members meet in the store member 0's worker serves over
  // gRPC, at its address as this coordinator reaches it.
  for (PipelineStageSpec& spec : group.specs_) {
    if (spec.collective_store.empty() && spec.collective_store_address.empty()) {
      spec.collective_store_address = workers.front()->info().address;
    }
  }
  std::vector<Result<PreparedStage>> prepared(size, internal_error("not prepared"));
  for_each_member_at_once(size, [&](size_t m) {
    prepared[m] = workers[m]->prepare_stage(group.specs_[m], model_hash, kFirstEpoch);
  });
  group.workers_ = std::move(workers);
  for (size_t m = 0; m < size; ++m) {
    if (!prepared[m].ok()) {
      return prepared[m].status().with_context(fmt::format("preparing {}", group.name(m)));
    }
    if (prepared[m]->hidden_input_size != 0 || prepared[m]->hidden_output_size != 0 ||
        prepared[m]->vocab_size != prepared[0]->vocab_size || prepared[m]->vocab_size <= 0) {
      return failed_precondition(
          "{} reads {} and writes {} residual values with {} logits columns; every member must "
          "run the whole model with member 0's {} columns",
          group.name(m), prepared[m]->hidden_input_size, prepared[m]->hidden_output_size,
          prepared[m]->vocab_size, prepared[0]->vocab_size);
    }
    group.prepared_.push_back(*prepared[m]);
  }
  group.results_.resize(size);
  return group;
}

std::string StageGroup::name(size_t member) const {
  return fmt::format("{} (worker {})", specs_[member].describe(), workers_[member]->info().address);
}

Status StageGroup::run(const std::function<ir::StepBatch(size_t)>& step_of) {
  std::vector<Status> statuses(size());
  for_each_member_at_once(size(), [&](size_t m) {
    statuses[m] =
        workers_[m]->run_stage(prepared_[m].stage_id, step_of(m), {}, results_[m], kFirstEpoch);
  });
  // A member that is gone fails its own call, and its peers fail inside their collectives: every
  // failing member is named; the code is a gone worker's (kUnavailable) if any, else the first
  // failure's.
  Status failed;
  std::string failures;
  for (size_t m = 0; m < size(); ++m) {
    if (statuses[m].ok()) continue;
    // A member whose worker is gone (kUnavailable) is the cause; its peers' failures follow.
    if (failed.ok() || (statuses[m].code() == StatusCode::kUnavailable &&
                        failed.code() != StatusCode::kUnavailable)) {
      failed = statuses[m];
    }
    failures +=
        fmt::format("{}{}: {}", failures.empty() ? "" : "; ", name(m), statuses[m].message());
  }
  if (!failed.ok()) return Status(failed.code(), failures);
  const StageStepResult& first = results_.front();
  if (first.vocab_size != vocab_size() ||
      first.logits.size() != static_cast<size_t>(first.num_rows) * vocab_size()) {
    return data_loss("{} sent {} logits for {} rows of {} columns", name(0), first.logits.size(),
                     first.num_rows, vocab_size());
  }
  return Status();
}

ir::StepOutput StageGroup::output() const {
  const StageStepResult& first = results_.front();
  return ir::StepOutput{.logits = first.logits,
                        .num_rows = first.num_rows,
                        .vocab_size = first.vocab_size,
                        .hidden = {},
                        .hidden_size = 0};
}

void StageGroup::add_wire_bytes(int64_t& request_bytes, int64_t& reply_bytes) const {
  for (const StageStepResult& member : results_) {
    request_bytes += member.request_bytes;
    reply_bytes += member.reply_bytes;
  }
}

Status StageGroup::copy_blocks(std::span<const kv::BlockCopy> copies) {
  for (size_t m = 0; m < size(); ++m) {
    Result<std::pair<uint64_t, uint64_t>> answer =
        workers_[m]->copy_blocks(prepared_[m].stage_id, copies, kFirstEpoch);
    if (!answer.ok()) {
      return answer.status().with_context(
          fmt::format("copying {} KV blocks on {}", copies.size(), name(m)));
    }
  }
  return Status();
}

}  // namespace folio::dist
