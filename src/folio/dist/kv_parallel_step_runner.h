// KvParallelStepRunner: the coordinator's engine::StepRunner over the members of a KV-parallel
// group on `folio worker` processes (issue 15, slice 6; dist.md "KV-parallel groups"). Member g
// holds positions [g T, (g + 1) T) of every sequence (T = kv_tokens_per_member) in a KV cache of
// its own, runs the whole model with member graphs (model LlamaGraphOptions::kv_range_*), and
// merges each layer's attention with the other members' by log-sum-exp over a gloo group the
// members form among themselves (never through the coordinator). Each step goes to every member
// at once, member g with its own slots and block tables (ir::StepBatch::for_kv_member); member
// 0's logits are the step's output (every member computes the same ones; only member 0 sends
// them). The fan-out is StageGroup's, as for tensor ranks.
//
// Copy-on-write block copies are refused: the engine's copies name block ids without the member
// whose cache holds them (each member has its own block ids), so no member could apply them.
//
// Failures: a member's error fails the step naming the member and its worker; the others then
// fail or time out inside their collectives and the group is broken. No recovery yet.
//
// Thread-safety: as StepRunner: run() from the engine's driving thread only; traffic() from it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/stage_group.h"
#include "folio/dist/worker_client.h"
#include "folio/engine/step_runner.h"

namespace folio::dist {

// What the members' steps cost so far.
struct KvParallelTraffic {
  int64_t steps = 0;
  int64_t tokens = 0;
  // gRPC messages between the coordinator and every member, both directions.
  int64_t request_bytes = 0;
  int64_t reply_bytes = 0;
  // Among the members, as member 0 saw it: time inside its all_gathers (waiting for the slowest
  // member included) and the bytes they received from the other members (each member sends as
  // many to each other member).
  int64_t communication_ns = 0;
  int64_t gathered_bytes = 0;
  int64_t num_members = 1;
};

class KvParallelStepRunner final : public engine::StepRunner {
 public:
  // Prepares member g of workers.size() on workers[g] (at least two), each with `spec` (the
  // whole model; kv_tokens_per_member > 0, a multiple of the block size; collective_store a
  // directory every worker reaches, or empty for the store worker 0 serves over gRPC; kv_member and
  // kv_members are set here) for the model of `model_hash`, all at once. Errors name the member and
  // its worker.
  static Result<std::unique_ptr<KvParallelStepRunner>> create(
      std::vector<std::unique_ptr<WorkerClient>> workers, const PipelineStageSpec& spec,
      const std::string& model_hash);
  ~KvParallelStepRunner() override;

  // `step` must carry one KvMemberArrays per member (kInvalidArgument otherwise).
  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override;
  int32_t vocab_size() const override { return group_.vocab_size(); }
  int32_t max_logit_rows() const override { return max_logit_rows_; }

  int32_t num_members() const { return static_cast<int32_t>(group_.size()); }
  int64_t tokens_per_member() const { return tokens_per_member_; }
  const std::vector<PreparedStage>& members() const { return group_.prepared(); }
  const KvParallelTraffic& traffic() const { return traffic_; }

 private:
  explicit KvParallelStepRunner(StageGroup group) : group_(std::move(group)) {}

  StageGroup group_;
  int32_t max_logit_rows_ = 0;
  int64_t tokens_per_member_ = 0;
  KvParallelTraffic traffic_;
};

}  // namespace folio::dist
