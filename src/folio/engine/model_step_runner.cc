#include "folio/engine/model_step_runner.h"

#include <algorithm>

namespace folio::engine {

Result<ir::StepOutput> ModelStepRunner::run(const ir::StepBatch& step) {
  if (pool_ != nullptr) pool_->advance_step();
  const bool any_adapter = std::any_of(step.adapter_ids.begin(), step.adapter_ids.end(),
                                       [](int64_t adapter) { return adapter != 0; });
  if (!any_adapter) return executor_.execute(step);
  if (adapters_ == nullptr) {
    return invalid_argument("this model was started without adapters; restart it with --lora");
  }
  ir::StepBatch bound = step;
  bound.adapter_slots = adapters_->bind_step(step.adapter_ids);
  return executor_.execute(bound);
}

}  // namespace folio::engine
