// TensorParallelStepRunner: the coordinator's engine::StepRunner over tensor-parallel workers
// (issue 15, slice 4). Every worker is one rank (model/llama_tensor_split.h) of the whole model;
// the ranks form a gloo group among themselves (dist/gloo_collectives.h) when prepared, and
// their all_reduce_sum ops go through it, never through the coordinator. Each step's arrays go
// to every rank at once (worker.proto RunStage, one call per rank on a thread of its own: each
// rank's step waits inside its collectives for the others), and rank 0's logits are the step's
// output (every rank computes the same ones; only rank 0 sends them).
//
// create() prepares every rank at once (PrepareStage with tensor_rank / tensor_ranks and the
// rendezvous: each rank's worker forms its side of the group before answering, so the calls
// must be in flight together). The ranks' replies must agree (vocabulary; no residual stream).
//
// Failures: a rank's error fails the step, naming the rank and worker; its peers then fail or
// time out inside their collectives, and the group is broken (dist.md "Broken group"). There is
// no recovery yet: recover() keeps StepRunner's default (not recoverable).
//
// Thread-safety: as StepRunner: run() and copy_blocks() from the engine's driving thread only;
// traffic() from that thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/stage_group.h"
#include "folio/dist/worker_client.h"
#include "folio/engine/step_runner.h"

namespace folio::dist {

// What the ranks' steps cost so far.
struct TensorParallelTraffic {
  int64_t steps = 0;
  int64_t tokens = 0;
  // gRPC messages between the coordinator and every rank, both directions.
  int64_t request_bytes = 0;
  int64_t reply_bytes = 0;
  // Among the ranks, as rank 0 saw it: time inside collectives (waiting for the slowest rank
  // included) and the f32 bytes it reduced; a ring all-reduce over n ranks puts
  // 2 (n - 1) / n of them on the wire from each rank.
  int64_t communication_ns = 0;
  int64_t reduced_bytes = 0;
  int64_t num_ranks = 1;
  int64_t block_copies = 0;

  int64_t wire_bytes_per_rank() const {
    return num_ranks > 1 ? reduced_bytes * 2 * (num_ranks - 1) / num_ranks : 0;
  }
};

class TensorParallelStepRunner final : public engine::StepRunner {
 public:
  // Prepares rank r of workers.size() on workers[r] (at least two workers), each with `spec`
  // (the whole model: first_layer 0, end_layer the layer count; tensor_rank and tensor_ranks
  // are set here; collective_store a directory every worker reaches, or empty for the rendezvous
  // store worker 0 serves over gRPC) for the model of `model_hash`, all at once. Errors name the
  // rank and its worker.
  static Result<std::unique_ptr<TensorParallelStepRunner>> create(
      std::vector<std::unique_ptr<WorkerClient>> workers, const PipelineStageSpec& spec,
      const std::string& model_hash);
  ~TensorParallelStepRunner() override;

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  // Queued; the next run() sends every queued batch to every rank before its step (each rank's
  // KV cache holds its own KV heads of every block).
  Status copy_blocks(std::span<const kv::BlockCopy> copies) override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t max_logit_rows() const override { return max_logit_rows_; }

  const std::vector<PreparedStage>& ranks() const { return group_.prepared(); }
  const TensorParallelTraffic& traffic() const { return traffic_; }

 private:
  explicit TensorParallelStepRunner(StageGroup group) : group_(std::move(group)) {}
  Status send_copies();

  StageGroup group_;
  int32_t vocab_size_ = 0;
  int32_t max_logit_rows_ = 0;
  std::vector<std::vector<kv::BlockCopy>> queued_copies_;
  TensorParallelTraffic traffic_;
};

}  // namespace folio::dist
