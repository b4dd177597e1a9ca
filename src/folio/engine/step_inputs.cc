#include "folio/engine/step_inputs.h"

#include <algorithm>

namespace folio::engine {

Status StepInputs::build(const StepPlan& plan, const kv::BlockManager& block_manager) {
  token_ids_.clear();
  positions_.clear();
  query_start_.assign(1, 0);
  seq_lens_.clear();
  logit_indices_.clear();
  adapter_ids_.clear();
  seqs_.clear();
  kv_segments_.clear();
  max_query_length_ = 0;
  max_seq_len_ = 0;
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
    if (segment.wants_logits) logit_indices_.push_back(query_start_.back() - 1);
    adapter_ids_.push_back(sequence.cache_namespace.adapter_id);
    seqs_.push_back(sequence.seq);
    kv_segments_.push_back(
        kv::StepSegment{sequence.seq, segment.first_position, segment.num_tokens});
    max_query_length_ = std::max(max_query_length_, segment.num_tokens);
    max_seq_len_ = std::max(max_seq_len_, seq_len);
  }
  slot_mapping_.resize(token_ids_.size());
  FOLIO_RETURN_IF_ERROR(block_manager.fill_slot_mapping(kv_segments_, slot_mapping_));
  block_tables_.resize(seqs_.size() * static_cast<size_t>(max_blocks_per_sequence_));
  return block_manager.fill_block_tables(seqs_, max_blocks_per_sequence_, block_tables_);
}

ScheduledStep StepInputs::view() const {
  ScheduledStep step;
  step.num_tokens = static_cast<int32_t>(token_ids_.size());
  step.num_sequences = static_cast<int32_t>(seqs_.size());
  step.max_blocks_per_sequence = max_blocks_per_sequence_;
  step.max_query_length = max_query_length_;
  step.max_seq_len = max_seq_len_;
  step.token_ids = token_ids_;
  step.positions = positions_;
  step.slot_mapping = slot_mapping_;
  step.query_start = query_start_;
  step.seq_lens = seq_lens_;
  step.block_tables = block_tables_;
  step.logit_indices = logit_indices_;
  step.adapter_ids = adapter_ids_;
  return step;
}

}  // namespace folio::engine
