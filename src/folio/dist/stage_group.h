// StageGroup: stages on several workers that form a worker group and run every step together
// (tensor-parallel ranks, KV-parallel members): the coordinator's fan-out shared by
// TensorParallelStepRunner and KvParallelStepRunner. Each member's stage forms its side of the
// group's gloo group while being prepared and waits inside its collectives for the others while
// running a step, so every member's call must be in flight at once: a thread per member beside
// the caller's, which runs member 0.
//
// Failures: a member's error fails the call, naming every failing member
// (PipelineStageSpec::describe()) and its worker, with a gone worker's code (kUnavailable) when
// one is, else the first failure's; the group is then
// broken (dist.md "Broken group"): no recovery here.
//
// Thread-safety: none; one thread at a time (a step runner's driving thread).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/worker_client.h"
#include "folio/ir/step_batch.h"
#include "folio/kv/kv_types.h"

namespace folio::dist {

// Runs call(m) for every member m of num_members at once, member 0 on the calling thread.
void for_each_member_at_once(size_t num_members, const std::function<void(size_t)>& call);

class StageGroup {
 public:
  // Prepares member m on workers[m] with spec_of(m) (at least two workers; each spec names its
  // member: group_rank() == m, group_size() == workers.size()), all at once, in kFirstEpoch.
  // Every member must run the whole model and answer with the same logits columns. Errors name
  // the member and its worker.
  static Result<StageGroup> prepare(std::vector<std::unique_ptr<WorkerClient>> workers,
                                    const std::function<PipelineStageSpec(size_t)>& spec_of,
                                    const std::string& model_hash);

  // Sends step_of(m) to member m, every member at once; results() holds the answers.
  Status run(const std::function<ir::StepBatch(size_t)>& step_of);
  // The same copy-on-write copies on every member, one after another.
  Status copy_blocks(std::span<const kv::BlockCopy> copies);

  size_t size() const { return workers_.size(); }
  const std::vector<PreparedStage>& prepared() const { return prepared_; }
  const std::vector<StageStepResult>& results() const { return results_; }
  // The last run's logits (member 0's) as a step's output; valid until the next run.
  ir::StepOutput output() const;
  // Adds the last run's gRPC bytes to and from every member to the two counters.
  void add_wire_bytes(int64_t& request_bytes, int64_t& reply_bytes) const;
  int32_t vocab_size() const { return prepared_.front().vocab_size; }
  // "KV-parallel member 1 of 2 (worker 127.0.0.1:5001)".
  std::string name(size_t member) const;

 private:
  std::vector<std::unique_ptr<WorkerClient>> workers_;
  std::vector<PipelineStageSpec> specs_;
  std::vector<PreparedStage> prepared_;
  std::vector<StageStepResult> results_;  // reused between steps, one per member
};

}  // namespace folio::dist
