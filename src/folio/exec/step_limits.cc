#include "folio/exec/step_limits.h"

#include <algorithm>
#include <limits>
#include <string>

namespace folio::exec {

namespace {

Status check_sizes(const ir::StepBatch& step, const StepLimits& limits) {
  const int64_t tokens = static_cast<int64_t>(step.token_ids.size());
  if (tokens < 1 || tokens > limits.max_tokens) {
    return invalid_argument("step has {} tokens; expected 1 to {}", tokens, limits.max_tokens);
  }
  if (step.positions.size() != step.token_ids.size() ||
      step.slot_mapping.size() != step.token_ids.size()) {
    return invalid_argument(
        "step arrays disagree on the token count: {} token ids, {} positions, {} slots", tokens,
        step.positions.size(), step.slot_mapping.size());
  }
  const int64_t sequences = static_cast<int64_t>(step.seq_lens.size());
  if (sequences < 1 || sequences > limits.max_sequences) {
    return invalid_argument("step has {} sequences; expected 1 to {}", sequences,
                            limits.max_sequences);
  }
  if (static_cast<int64_t>(step.query_start.size()) != sequences + 1) {
    return invalid_argument("query_start has {} entries; expected num_sequences + 1 = {}",
                            step.query_start.size(), sequences + 1);
  }
  if (step.max_blocks_per_sequence != limits.max_blocks_per_sequence) {
    return invalid_argument("step has block tables of {} columns; the model's graphs expect {}",
                            step.max_blocks_per_sequence, limits.max_blocks_per_sequence);
  }
  if (!step.adapter_ids.empty() && static_cast<int64_t>(step.adapter_ids.size()) != sequences) {
    return invalid_argument("step has {} adapter ids for {} sequences", step.adapter_ids.size(),
                            sequences);
  }
  if (!step.adapter_slots.empty() && static_cast<int64_t>(step.adapter_slots.size()) != sequences) {
    return invalid_argument("step has {} adapter slots for {} sequences", step.adapter_slots.size(),
                            sequences);
  }
  for (const int32_t slot : step.adapter_slots) {
    if (slot != 0 && (slot < 0 || slot >= limits.num_adapter_slots)) {
      return invalid_argument(
          "adapter slot {} is outside the adapter table's {} slots (the model was built {})", slot,
          limits.num_adapter_slots,
          limits.num_adapter_slots == 0 ? "without adapters" : "with fewer slots");
    }
  }
  if (static_cast<int64_t>(step.block_tables.size()) !=
      sequences * limits.max_blocks_per_sequence) {
    return invalid_argument(
        "block_tables has {} entries; expected num_sequences * max_blocks_per_sequence = {} * {}",
        step.block_tables.size(), sequences, limits.max_blocks_per_sequence);
  }
  const int64_t rows = static_cast<int64_t>(step.logit_indices.size());
  if (rows > limits.max_logit_rows || rows > tokens) {
    return invalid_argument(
        "step asks for {} logit rows; at most {} (and no more than its {} tokens)", rows,
        limits.max_logit_rows, tokens);
  }
  return Status();
}

bool is_dummy_block(int64_t block, const StepLimits& limits) {
  return block >= limits.first_dummy_block &&
         block < limits.first_dummy_block + limits.num_dummy_blocks;
}

// Checks sequence s: its query range, context length, used blocks, positions and slots.
Status check_sequence(const ir::StepBatch& step, const StepLimits& limits, int64_t s) {
  const int64_t begin = step.query_start[s];
  const int64_t end = step.query_start[s + 1];
  const int64_t context = step.seq_lens[s];
  const int64_t capacity = int64_t{limits.max_blocks_per_sequence} * limits.block_size;
  // The positions this cache holds: all, or a KV-parallel member's range.
  const int64_t range_begin = limits.kv_range_begin;
  const int64_t range_end =
      limits.kv_range_end > 0 ? limits.kv_range_end : std::numeric_limits<int64_t>::max();
  const int64_t held = std::max<int64_t>(0, std::min(context, range_end) - range_begin);
  if (context < end - begin || held > capacity) {
    return invalid_argument(
        "sequence {} has context length {} for {} query tokens; expected {} to {} (the block "
        "table's capacity{})",
        s, context, end - begin, end - begin, range_begin + capacity,
        range_begin > 0 ? fmt::format(" from position {}", range_begin) : std::string());
  }
  const int32_t* table = step.block_tables.data() + s * limits.max_blocks_per_sequence;
  const int64_t used_blocks = (held + limits.block_size - 1) / limits.block_size;
  for (int64_t i = 0; i < used_blocks; ++i) {
    if (table[i] < 0 || table[i] >= limits.num_kv_blocks || is_dummy_block(table[i], limits)) {
      return invalid_argument(
          "sequence {} block table entry {} is block {}; expected a block in [0, {}) outside the "
          "reserved padding blocks [{}, {})",
          s, i, table[i], limits.num_kv_blocks, limits.first_dummy_block,
          limits.first_dummy_block + limits.num_dummy_blocks);
    }
  }
  for (int64_t t = begin; t < end; ++t) {
    const int64_t position = context - (end - begin) + (t - begin);
    if (step.positions[t] != position) {
      return invalid_argument("token {} (sequence {}) has position {}; expected {}", t, s,
                              step.positions[t], position);
    }
    const bool held_here = position >= range_begin && position < range_end;
    const int64_t offset = position - range_begin;
    const int64_t slot = held_here
                             ? int64_t{table[offset / limits.block_size]} * limits.block_size +
                                   offset % limits.block_size
                             : -1;
    if (step.slot_mapping[t] != slot) {
      return invalid_argument(
          "token {} (sequence {}, position {}) has slot {}; its block table puts it at slot {}", t,
          s, position, step.slot_mapping[t], slot);
    }
  }
  return Status();
}

}  // namespace

Status validate_step(const ir::StepBatch& step, const StepLimits& limits,
                     std::vector<int64_t>& scratch) {
  FOLIO_RETURN_IF_ERROR(check_sizes(step, limits));
  const int64_t tokens = step.num_tokens();
  const int64_t sequences = step.num_sequences();
  if (step.query_start[0] != 0 || step.query_start[sequences] != tokens) {
    return invalid_argument("query_start runs from {} to {}; expected 0 to the token count {}",
                            step.query_start[0], step.query_start[sequences], tokens);
  }
  for (int64_t s = 0; s < sequences; ++s) {
    if (step.query_start[s + 1] <= step.query_start[s]) {
      return invalid_argument(
          "query_start[{}] = {} does not exceed query_start[{}] = {}: every sequence needs at "
          "least one query token",
          s + 1, step.query_start[s + 1], s, step.query_start[s]);
    }
  }
  for (int64_t s = 0; s < sequences; ++s) FOLIO_RETURN_IF_ERROR(check_sequence(step, limits, s));
  for (int64_t t = 0; t < tokens; ++t) {
    if (step.token_ids[t] < 0 || step.token_ids[t] >= limits.vocab_size) {
      return invalid_argument("token {} has id {}; the vocabulary has {} entries", t,
                              step.token_ids[t], limits.vocab_size);
    }
  }
  for (size_t r = 0; r < step.logit_indices.size(); ++r) {
    if (step.logit_indices[r] < 0 || step.logit_indices[r] >= tokens) {
      return invalid_argument("logit index {} is {}; expected a step token in [0, {})", r,
                              step.logit_indices[r], tokens);
    }
  }
  // Two tokens writing one slot would race in the KV write and leave either value.
  scratch.assign(step.slot_mapping.begin(), step.slot_mapping.end());
  std::sort(scratch.begin(), scratch.end());
  // -1 (a KV-parallel member's "not mine") may repeat; checked per token above.
  const auto first_slot = std::upper_bound(scratch.begin(), scratch.end(), int64_t{-1});
  const auto duplicate = std::adjacent_find(first_slot, scratch.end());
  if (duplicate != scratch.end()) {
    return invalid_argument("slot {} is written by two tokens of the step", *duplicate);
  }
  return Status();
}

}  // namespace folio::exec
