#include "folio/engine/step_batch_builder.h"

namespace folio::engine {

ir::StepBatch StepBatchBuilder::lay_out(const StepPlan& plan) {
  token_ids_.clear();
  positions_.clear();
  query_start_.assign(1, 0);
  seq_lens_.clear();
  logit_indices_.clear();
  adapter_ids_.clear();
  seqs_.clear();
  kv_segments_.clear();
  for (const ScheduledSegment& segment : plan.segments) {
    const Sequence& sequence = *segment.sequence;
    const auto first = sequence.tokens.begin() + segment.first_position;
    token_ids_.insert(token_ids_.end(), first, first + segment.num_tokens);
    for (int32_t offset = 0; offset < segment.num_tokens; ++offset) {
      positions_.push_back(segment.first_position + offset);
    }
    query_start_.push_back(static_cast<int32_t>(token_ids_.size()));
    const int32_t seq_len = segment.first_position + segment.num_tokens;
    seq_lens_.push_back(seq_len);
    if (segment.all_logits) {
      for (int32_t index = query_start_.back() - segment.num_tokens; index < query_start_.back();
           ++index) {
        logit_indices_.push_back(index);
      }
    } else if (segment.wants_logits) {
      logit_indices_.push_back(query_start_.back() - 1);
    }
    adapter_ids_.push_back(sequence.adapter_id);
    seqs_.push_back(sequence.seq);
    kv_segments_.push_back(
        kv::StepSegment{sequence.seq, segment.first_position, segment.num_tokens});
  }
  ir::StepBatch batch;
  batch.token_ids = token_ids_;
  batch.positions = positions_;
  batch.query_start = query_start_;
  batch.seq_lens = seq_lens_;
  batch.logit_indices = logit_indices_;
  batch.adapter_ids = adapter_ids_;
  batch.max_blocks_per_sequence = max_blocks_per_sequence_;
  return batch;
}

Result<ir::StepBatch> StepBatchBuilder::build(const StepPlan& plan,
                                              const kv::BlockManager& block_manager) {
  ir::StepBatch batch = lay_out(plan);
  slot_mapping_.resize(token_ids_.size());
  FOLIO_RETURN_IF_ERROR(block_manager.fill_slot_mapping(kv_segments_, slot_mapping_));
  block_tables_.resize(seqs_.size() * static_cast<size_t>(max_blocks_per_sequence_));
  FOLIO_RETURN_IF_ERROR(
      block_manager.fill_block_tables(seqs_, max_blocks_per_sequence_, block_tables_));
  batch.slot_mapping = slot_mapping_;
  batch.block_tables = block_tables_;
  return batch;
}

Result<ir::StepBatch> StepBatchBuilder::build(const StepPlan& plan,
                                              const kv::KvParallelCache& cache) {
  ir::StepBatch batch = lay_out(plan);
  const auto num_members = static_cast<size_t>(cache.num_groups());
  member_slot_mappings_.resize(num_members);
  member_block_tables_.resize(num_members);
  kv_members_.resize(num_members);
  for (size_t member = 0; member < num_members; ++member) {
    std::vector<int32_t>& slots = member_slot_mappings_[member];
    std::vector<int32_t>& tables = member_block_tables_[member];
    slots.resize(token_ids_.size());
    tables.resize(seqs_.size() * static_cast<size_t>(max_blocks_per_sequence_));
    const auto group = static_cast<int32_t>(member);
    FOLIO_RETURN_IF_ERROR(cache.fill_slot_mapping(group, kv_segments_, slots));
    FOLIO_RETURN_IF_ERROR(cache.fill_block_tables(group, seqs_, max_blocks_per_sequence_, tables));
    kv_members_[member] = ir::KvMemberArrays{slots, tables};
  }
  batch.slot_mapping = member_slot_mappings_.front();
  batch.block_tables = member_block_tables_.front();
  batch.kv_members = kv_members_;
  return batch;
}

}  // namespace folio::engine
