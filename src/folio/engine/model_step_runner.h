// ModelStepRunner: the real StepRunner: a scheduled step's batch goes to the graph executor
// (exec/), which validates it, pads it to a bucket and replays (or captures, or runs eagerly)
// the model's step graph, and returns one logits row per wanted token. With adapters, the step's
// adapters are first bound to the adapter table (lora/adapter_manager.h) and the batch carries
// each sequence's table slot; the captured graphs read the table at run time, so any mix of
// adapters replays the same graph.
//
// Each step advances the page pool's step counter, the clock of its eviction recency.
//
// Thread-safety: run() on the engine thread only (the executor is single-threaded).
#pragma once

#include "folio/engine/step_runner.h"
#include "folio/exec/executor.h"
#include "folio/lora/adapter_manager.h"
#include "folio/memory/page_pool.h"

namespace folio::engine {

class ModelStepRunner final : public StepRunner {
 public:
  // `executor`, and `adapters` and `pool` when given, must outlive the runner. Without
  // adapters, a step naming one is an error.
  ModelStepRunner(exec::Executor& executor, lora::AdapterManager* adapters = nullptr,
                  memory::PagePool* pool = nullptr)
      : executor_(executor), adapters_(adapters), pool_(pool) {}

  Result<ir::StepOutput> run(const ir::StepBatch& step) override;
  int32_t vocab_size() const override {
    return static_cast<int32_t>(executor_.limits().vocab_size);
  }
  int32_t max_logit_rows() const override { return executor_.limits().max_logit_rows; }

  // How the last step ran (replayed, captured, eager): for statistics and tests.
  exec::StepPath last_path() const { return executor_.last_step_path(); }

 private:
  exec::Executor& executor_;
  lora::AdapterManager* const adapters_;
  memory::PagePool* const pool_;
};

}  // namespace folio::engine
