// ModelStepRunner: the real StepRunner: a scheduled step's batch goes as it is to the graph
// executor (exec/), which validates it, pads it to a bucket and replays (or captures, or runs
// eagerly) the model's step graph, and returns one logits row per wanted token.
//
// Thread-safety: run() on the engine thread only (the executor is single-threaded).
#pragma once

#include "folio/engine/step_runner.h"
#include "folio/exec/executor.h"

namespace folio::engine {

class ModelStepRunner final : public StepRunner {
 public:
  // `executor` must outlive the runner.
  explicit ModelStepRunner(exec::Executor& executor) : executor_(executor) {}

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  int32_t vocab_size() const override {
    return static_cast<int32_t>(executor_.limits().vocab_size);
  }

  // How the last step ran (replayed, captured, eager): for statistics and tests.
  exec::StepPath last_path() const { return executor_.last_step_path(); }

 private:
  exec::Executor& executor_;
};

}  // namespace folio::engine
