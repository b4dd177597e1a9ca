#include "folio/dist/kv_parallel_step_runner.h"

#include <utility>

#include <fmt/format.h>

namespace folio::dist {

Result<std::unique_ptr<KvParallelStepRunner>> KvParallelStepRunner::create(
    std::vector<std::unique_ptr<WorkerClient>> workers, const PipelineStageSpec& spec,
    const std::string& model_hash) {
  const size_t num_members = workers.size();
  if (num_members < 2) {
    return invalid_argument("a KV-parallel group needs at least two workers, got {}", num_members);
  }
  if (spec.kv_tokens_per_member <= 0 || spec.block_size <= 0 ||
      spec.kv_tokens_per_member % spec.block_size != 0) {
    return invalid_argument(
        "a KV-parallel member holds a range of whole blocks: {} tokens per member is not a "
        "positive multiple of the block size {}",
        spec.kv_tokens_per_member, spec.block_size);
  }
  if (spec.tensor_ranks > 1) {
    return invalid_argument("KV-parallel groups and tensor splits do not combine yet");
  }
  FOLIO_ASSIGN_OR_RETURN(StageGroup group, StageGroup::prepare(
                                               std::move(workers),
                                               [&](size_t g) {
                                                 PipelineStageSpec member = spec;
                                                 member.kv_member = static_cast<int64_t>(g);
                                                 member.kv_members =
                                                     static_cast<int64_t>(num_members);
                                                 return member;
                                               },
                                               model_hash));
  std::unique_ptr<KvParallelStepRunner> runner(new KvParallelStepRunner(std::move(group)));
  runner->max_logit_rows_ = spec.max_logit_rows > 0 ? spec.max_logit_rows : spec.max_sequences;
  runner->tokens_per_member_ = spec.kv_tokens_per_member;
  runner->traffic_.num_members = static_cast<int64_t>(num_members);
  return runner;
}

KvParallelStepRunner::~KvParallelStepRunner() = default;

Status KvParallelStepRunner::copy_blocks(std::span<const kv::BlockCopy> copies) {
  if (copies.empty()) return Status();
  return failed_precondition(
      "{} copy-on-write KV block copies for a KV-parallel group of {}: a copy names no member "
      "and each member has block ids of its own, so none is relayed (fork the sequences "
      "without copies, or run without --kv-parallel)",
      copies.size(), group_.size());
}

Result<ir::StepOutput> KvParallelStepRunner::run(const ir::StepBatch& step) {
  if (step.num_kv_members() != num_members()) {
    return invalid_argument(
        "a step for a KV-parallel group of {} members carries the slots and block tables of {}: "
        "the engine's KV-parallel cache must have as many members as the runner's workers",
        num_members(), step.num_kv_members());
  }
  FOLIO_RETURN_IF_ERROR(
      group_.run([&](size_t g) { return step.for_kv_member(static_cast<int32_t>(g)); }));
  const StageStepResult& result = group_.results().front();
  ++traffic_.steps;
  traffic_.tokens += step.num_tokens();
  group_.add_wire_bytes(traffic_.request_bytes, traffic_.reply_bytes);
  traffic_.communication_ns += result.communication_ns;
  traffic_.gathered_bytes += result.gathered_bytes;
  return group_.output();
}

}  // namespace folio::dist
