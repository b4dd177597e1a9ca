// StepInputs: lays a StepPlan out as the flat int32 arrays of a ScheduledStep (step_runner.h),
// reusing its buffers from step to step.
//
// Invariants after build(): token_ids, positions and slot_mapping have num_tokens entries;
// query_start is the running sum of segment lengths; block_tables has num_sequences rows of
// max_blocks_per_sequence entries; logit_indices lists, in segment order, the last token of
// every segment that wants logits.
// Thread-safety: one owner (the engine thread).
#pragma once

#include <cstdint>
#include <vector>

#include "folio/base/status.h"
#include "folio/engine/scheduler.h"
#include "folio/engine/step_runner.h"
#include "folio/kv/block_manager.h"

namespace folio::engine {

class StepInputs {
 public:
  // Requires: max_blocks_per_sequence >= the block count of any sequence the engine accepts.
  explicit StepInputs(int32_t max_blocks_per_sequence)
      : max_blocks_per_sequence_(max_blocks_per_sequence) {}

  // Requires: plan is non-empty and every segment's sequence is resident in block_manager with
  // its query tokens allocated.
  Status build(const StepPlan& plan, const kv::BlockManager& block_manager);
  // Valid until the next build().
  ScheduledStep view() const;

 private:
  int32_t max_blocks_per_sequence_;
  int32_t max_query_length_ = 0;
  int32_t max_seq_len_ = 0;
  std::vector<int32_t> token_ids_;
  std::vector<int32_t> positions_;
  std::vector<int32_t> slot_mapping_;
  std::vector<int32_t> query_start_;
  std::vector<int32_t> seq_lens_;
  std::vector<int32_t> block_tables_;
  std::vector<int32_t> logit_indices_;
  std::vector<int64_t> adapter_ids_;
  std::vector<kv::SeqId> seqs_;
  std::vector<kv::StepSegment> kv_segments_;
};

}  // namespace folio::engine
