// StepLimits: the sizes an executor was built for, against which every step (ir::StepBatch,
// ir/step_batch.h) is validated before anything is written, so a malformed step changes no
// state.
#pragma once

#include <cstdint>
#include <vector>

#include "folio/base/status.h"
#include "folio/ir/step_batch.h"

namespace folio::exec {

struct StepLimits {
  int32_t max_tokens = 0;
  int32_t max_sequences = 0;
  int32_t max_logit_rows = 0;
  int32_t max_blocks_per_sequence = 0;
  int64_t num_kv_blocks = 0;  // blocks of the KV cache
  int32_t block_size = 0;
  int64_t vocab_size = 0;
  // Blocks [first_dummy_block, first_dummy_block + num_dummy_blocks) are reserved for padding
  // tokens; no real sequence may use them.
  int64_t first_dummy_block = 0;
  int32_t num_dummy_blocks = 0;
  // Rows of the adapter table the graphs' lora ops read (slot 0 included); 0 when the graphs
  // have no lora ops, and then every adapter slot of a step must be 0.
  int32_t num_adapter_slots = 0;
  // Width of the residual stream a pipeline stage's graphs read (ir::kInputHidden, f32
  // [T, hidden_size]); 0 when they embed token ids instead.
  int64_t hidden_size = 0;
  // A KV-parallel member's executor (its graphs' partial attention, dist.md "KV-parallel
  // groups"): its cache holds positions [kv_range_begin, kv_range_end) of every sequence. Block
  // table rows start at the block of kv_range_begin and cover the held part of each context;
  // a token's slot is in this cache when its position is in the range and -1 (not written
  // here) otherwise. kv_range_end 0: the whole sequence.
  int64_t kv_range_begin = 0;
  int64_t kv_range_end = 0;
};

// OK when `step` is well formed for `limits`: consistent array sizes (block table rows of
// exactly max_blocks_per_sequence columns, adapter ids and adapter slots each empty or one per
// sequence, slots below num_adapter_slots or 0), 1 <= tokens <=
// max, query_start increasing from 0 to num_tokens (every sequence has at least one query token),
// context lengths covering the query tokens and fitting the block table, positions equal to
// context_length - query_length + i, slots matching the block tables, used blocks in range and
// not reserved, distinct slots (-1, "not in this member's range", may repeat), token ids in the
// vocabulary, at most num_tokens logit rows, each a step token. `scratch` is reused between calls
// (no allocation once it is large enough).
Status validate_step(const ir::StepBatch& step, const StepLimits& limits,
                     std::vector<int64_t>& scratch);

}  // namespace folio::exec
