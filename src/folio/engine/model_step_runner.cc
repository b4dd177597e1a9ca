#include "folio/engine/model_step_runner.h"

namespace folio::engine {

Result<StepOutput> ModelStepRunner::run(const ScheduledStep& step) {
  if (step.max_blocks_per_sequence != max_blocks_per_sequence_) {
    return invalid_argument("step has block tables of {} columns; the model's graphs expect {}",
                            step.max_blocks_per_sequence, max_blocks_per_sequence_);
  }
  for (int64_t adapter : step.adapter_ids) {
    if (adapter != 0) return invalid_argument("adapter {} is not served by this model", adapter);
  }
  const exec::StepInputs inputs{step.token_ids,    step.positions, step.slot_mapping,
                                step.query_start,  step.seq_lens,  step.block_tables,
                                step.logit_indices};
  FOLIO_ASSIGN_OR_RETURN(exec::StepOutput output, executor_.execute(inputs));
  last_path_ = output.path;
  StepOutput result;
  result.vocab_size = static_cast<int32_t>(output.vocab);
  result.logits = output.logits.first(static_cast<size_t>(output.num_rows) * output.vocab);
  return result;
}

}  // namespace folio::engine
