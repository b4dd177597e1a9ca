// PipelineStepRunner: the coordinator's engine::StepRunner over a pipeline of workers (issue 15,
// slice 3). The coordinator keeps the scheduler, the block tables and the sampler; each step's
// arrays go to every stage in turn (worker.proto RunStage), with the residual stream each stage
// returns as the next one's input, and the last stage's logits come back as the step's output.
// Every call carries a deadline (WorkerClientOptions::step_timeout) and every error names the
// worker and stage it came from.
//
// The stages are prepared by create() (PrepareStage), in order, before the first step: a
// worker that is unreachable, holds another model, cannot fit its stage or answers with
// stages that do not chain (widths of the residual stream, contiguous layers from 0 to the
// last) is an error before serving starts.
//
// Thread-safety: as StepRunner: run() from the engine's driving thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/dist/pipeline_stage.h"
#include "folio/dist/worker_client.h"
#include "folio/engine/step_runner.h"

namespace folio::dist {

// What crossed the wire so far (serialized gRPC messages, both directions).
struct PipelineTraffic {
  int64_t steps = 0;
  int64_t tokens = 0;
  int64_t request_bytes = 0;
  int64_t reply_bytes = 0;
};

class PipelineStepRunner final : public engine::StepRunner {
 public:
  // Prepares specs[i] on workers[i] (same sizes, at least one) for the model of `model_hash`.
  static Result<std::unique_ptr<PipelineStepRunner>> create(
      std::vector<std::unique_ptr<WorkerClient>> workers, std::vector<PipelineStageSpec> specs,
      const std::string& model_hash);

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  int32_t vocab_size() const override { return vocab_size_; }
  int32_t max_logit_rows() const override { return max_logit_rows_; }

  const std::vector<PreparedStage>& stages() const { return prepared_; }
  const PipelineTraffic& traffic() const { return traffic_; }

 private:
  PipelineStepRunner() = default;

  std::vector<std::unique_ptr<WorkerClient>> workers_;
  std::vector<PipelineStageSpec> specs_;
  std::vector<PreparedStage> prepared_;
  int32_t vocab_size_ = 0;
  int32_t max_logit_rows_ = 0;
  // Reused between steps: each stage's answer (the last one's logits are the step's output).
  std::vector<StageStepResult> results_;
  PipelineTraffic traffic_;
};

}  // namespace folio::dist
