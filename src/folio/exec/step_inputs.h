// StepInputs: one engine step as the scheduler hands it to the executor, in flat int32 arrays
// (no dependency on kv/: the block manager's state arrives already flattened).
//
// Terms: the step's tokens are laid out sequence after sequence; sequence s owns step tokens
// [query_start[s], query_start[s + 1]). Its context length is the number of tokens in the KV
// cache for s once this step's keys are written; a token at absolute position p is stored at
// slot block_tables[s][p / block_size] * block_size + p % block_size. `logit_indices` lists the
// step tokens whose logits the caller wants (usually the last token of each sequence).
//
// StepShape is the padded shape a step graph is emitted for (T tokens, S sequence slots, R
// logit rows); StepLimits are the sizes the executor was built for, against which a step is
// validated before anything is written, so a malformed step changes no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "folio/base/status.h"
#include "folio/exec/bucket_policy.h"
#include "folio/ir/annotations.h"

namespace folio::exec {

struct StepInputs {
  std::span<const int32_t> token_ids;        // i32 [num_tokens]
  std::span<const int32_t> positions;        // i32 [num_tokens]
  std::span<const int32_t> slot_mapping;     // i32 [num_tokens]
  std::span<const int32_t> query_start;      // i32 [num_sequences + 1]: 0, ..., num_tokens
  std::span<const int32_t> context_lengths;  // i32 [num_sequences]
  // i32 [num_sequences, max_blocks_per_sequence], row-major; entries past a sequence's last
  // used block are ignored.
  std::span<const int32_t> block_tables;
  std::span<const int32_t> logit_indices;  // i32 [num_logit_rows], each in [0, num_tokens)

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_sequences() const { return static_cast<int32_t>(context_lengths.size()); }
  int32_t num_logit_rows() const { return static_cast<int32_t>(logit_indices.size()); }
  // Decode when every sequence contributes exactly one query token, prefill otherwise.
  // Requires: validate_step() is OK.
  StepPhase phase() const;
};

// The shape one step graph is emitted for. Every field is fixed per bucket: T is the padded
// token count, S = min(T, max sequences) and R = min(T, max logit rows).
struct StepShape {
  int32_t num_tokens = 0;          // T
  int32_t num_sequence_slots = 0;  // S
  int32_t num_logit_rows = 0;      // R
  StepPhase phase = StepPhase::kDecode;

  // The IR phase the graph is annotated with: decode buckets are kDecode; prefill buckets
  // serve prefill and mixed steps alike and are kMixed.
  ir::Phase ir_phase() const;
  friend bool operator==(const StepShape&, const StepShape&) = default;
};

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
};

// OK when `step` is well formed for `limits`: consistent array sizes, 1 <= tokens <= max,
// query_start increasing from 0 to num_tokens (every sequence has at least one query token),
// context lengths covering the query tokens and fitting the block table, positions equal to
// context_length - query_length + i, slots matching the block tables, used blocks in range and
// not reserved, distinct slots, token ids in the vocabulary, at most num_tokens logit rows, each a
// step token. `scratch` is reused between calls (no allocation once it is large enough).
Status validate_step(const StepInputs& step, const StepLimits& limits,
                     std::vector<int64_t>& scratch);

}  // namespace folio::exec

template <>
struct std::hash<folio::exec::StepShape> {
  size_t operator()(const folio::exec::StepShape& shape) const noexcept {
    const uint64_t packed = (uint64_t(uint32_t(shape.num_tokens)) << 32) ^
                            (uint64_t(uint32_t(shape.num_sequence_slots)) << 12) ^
                            (uint64_t(uint32_t(shape.num_logit_rows)) << 2) ^
                            static_cast<uint64_t>(shape.phase);
    return std::hash<uint64_t>()(packed);
  }
};
