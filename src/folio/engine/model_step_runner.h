// ModelStepRunner: the real StepRunner: a scheduled step's flat arrays go to the graph executor
// (exec/), which pads them to a bucket and replays (or captures, or runs eagerly) the model's
// step graph, and returns one logits row per wanted token.
//
// Thread-safety: run() on the engine thread only (the executor is single-threaded).
#pragma once

#include "folio/engine/step_runner.h"
#include "folio/exec/executor.h"

namespace folio::engine {

class ModelStepRunner final : public StepRunner {
 public:
  // `executor` must outlive the runner; its graphs were emitted for block tables of
  // `max_blocks_per_sequence` columns.
  ModelStepRunner(exec::Executor& executor, int32_t vocab_size, int32_t max_blocks_per_sequence)
      : executor_(executor),
        vocab_size_(vocab_size),
        max_blocks_per_sequence_(max_blocks_per_sequence) {}

  Result<StepOutput> run(const ScheduledStep& step) override;
  int32_t vocab_size() const override { return vocab_size_; }

  // How the last step ran (replayed, captured, eager): for statistics and tests.
  exec::StepPath last_path() const { return last_path_; }

 private:
  exec::Executor& executor_;
  const int32_t vocab_size_;
  const int32_t max_blocks_per_sequence_;
  exec::StepPath last_path_ = exec::StepPath::kEager;
};

}  // namespace folio::engine
