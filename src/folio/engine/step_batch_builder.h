// StepBatchBuilder: lays the scheduler's StepPlan out as the flat int32 arrays of an
// ir::StepBatch (ir/step_batch.h), once per step, reusing its buffers from step to step. The
// batch it returns is what the runner, the executor and the kernels read; nothing copies it
// field by field on the way.
//
// Invariants after build(): token_ids, positions and slot_mapping have num_tokens entries;
// query_start is the running sum of segment lengths; block_tables has num_sequences rows of
// max_blocks_per_sequence entries; logit_indices lists, in segment order, the last token of
// every segment that wants logits, or every token of a segment that wants all its logits.
//
// Over a KV-parallel group (kv::KvParallelCache) the batch also carries each member's slots and
// block tables (ir::StepBatch::kv_members, member g's from KvParallelCache::fill_*(g, ...)),
// member 0's doubling as the batch's own slot_mapping and block_tables; block-table rows are
// then a member's width (its range in blocks).
// Thread-safety: one owner (the engine thread).
#pragma once

#include <cstdint>
#include <vector>

#include "folio/base/result.h"
#include "folio/engine/scheduler.h"
#include "folio/ir/step_batch.h"
#include "folio/kv/block_manager.h"
#include "folio/kv/kv_parallel_cache.h"

namespace folio::engine {

class StepBatchBuilder {
 public:
  // Requires: max_blocks_per_sequence >= the block count of any sequence the engine accepts.
  explicit StepBatchBuilder(int32_t max_blocks_per_sequence)
      : max_blocks_per_sequence_(max_blocks_per_sequence) {}

  // Requires: plan is non-empty and every segment's sequence is resident in block_manager with
  // its query tokens allocated.
  // The batch views the builder's buffers: valid until the next build().
  Result<ir::StepBatch> build(const StepPlan& plan, const kv::BlockManager& block_manager);
  // As above over a KV-parallel group: every member's arrays in kv_members.
  Result<ir::StepBatch> build(const StepPlan& plan, const kv::KvParallelCache& cache);

 private:
  // Everything but the KV arrays; the batch's KV spans are left empty.
  ir::StepBatch lay_out(const StepPlan& plan);

  std::vector<std::vector<int32_t>> member_slot_mappings_;
  std::vector<std::vector<int32_t>> member_block_tables_;
  std::vector<ir::KvMemberArrays> kv_members_;
  int32_t max_blocks_per_sequence_;
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
