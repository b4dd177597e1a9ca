#include "folio/engine/model_step_runner.h"

namespace folio::engine {

Result<ir::StepOutput> ModelStepRunner::run(const ir::StepBatch& step) {
  for (int64_t adapter : step.adapter_ids) {
    if (adapter != 0) return invalid_argument("adapter {} is not served by this model", adapter);
  }
  return executor_.execute(step);
}

}  // namespace folio::engine
