// StepBatch: one engine step as every layer below the scheduler sees it, in flat int32 arrays.
// The scheduler's builder (engine/step_batch_builder.h) fills it once; the executor validates it,
// copies it into its persistent input buffers and the kernels read those buffers through
// argument structs whose fields carry the same names. The IR's step-graph inputs are named after
// these fields too (step_graph.h), so one field has one name from the scheduler to the kernels.
//
// Terms. A step holds `num_sequences()` segments; segment s is step tokens
// [query_start[s], query_start[s + 1]), all of one sequence, at consecutive positions ending at
// seq_lens[s] - 1: a prefill chunk (any length) or a decode (one token). Before the step, the
// sequence's KV for positions [0, seq_lens[s] - query length) is in the cache (computed earlier
// or served by the prefix cache); the step writes each token's K and V at slot_mapping[token]
// (slot = block * block_size + offset) and attends over positions [0, position] through block
// table row s. `logit_indices` lists the step tokens whose logits are wanted.
//
// A StepBatch only views its arrays: whoever built it owns them, and it is valid until the
// builder's next step.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace folio::ir {

// Decode-only steps replay one full graph; steps with any prefill token replay a piecewise
// program (graph pieces around eagerly run attention).
enum class StepPhase : uint8_t { kDecode, kPrefill };

std::string_view step_phase_name(StepPhase phase);

// One KV-parallel member's part of a step (dist.md "KV-parallel groups"): every member of a
// group runs the same tokens, positions and segments over its own cache, which holds its range of
// each sequence's positions; only the slots and the block tables differ. slot_mapping: a token
// the member holds gets its slot there, every other -1; block_tables: row s starts at the block
// of the member's first position (the dummy block for a sequence that does not reach it).
struct KvMemberArrays {
  std::span<const int32_t> slot_mapping;  // i32 [num_tokens]
  std::span<const int32_t> block_tables;  // i32 [num_sequences, max_blocks_per_sequence]
};

struct StepBatch {
  std::span<const int32_t> token_ids;     // i32 [num_tokens]
  std::span<const int32_t> positions;     // i32 [num_tokens]
  std::span<const int32_t> slot_mapping;  // i32 [num_tokens]
  std::span<const int32_t> query_start;   // i32 [num_sequences + 1]: 0, ..., num_tokens
  std::span<const int32_t> seq_lens;      // i32 [num_sequences]: context length after the step
  // i32 [num_sequences, max_blocks_per_sequence], row-major. Entries past a sequence's blocks
  // hold the dummy block (or anything: they are never read).
  std::span<const int32_t> block_tables;
  // i32 [num_logit_rows]: step tokens whose logits are wanted (the last token of each segment
  // that completes a prefill or decodes), ascending; logits row j is token logit_indices[j].
  std::span<const int32_t> logit_indices;
  // i64 [num_sequences], or empty for "all the base model"; 0 is the base model. The engine's
  // adapter ids (lora/adapter_registry.h); what the graphs read is adapter_slots.
  std::span<const int64_t> adapter_ids;
  // Width of a block table row: fixed for an engine (ceil(max context / block_size)), so
  // captured graphs see one shape.
  int32_t max_blocks_per_sequence = 0;
  // i32 [num_sequences], or empty for "no adapter in this step": the row of the adapter table
  // (kernels/lora.h) holding each sequence's adapter for this step, 0 for none. The runner that
  // binds the step's adapters to the table fills it (engine/model_step_runner.h); the executor
  // gives every token its sequence's slot (the graph input token_adapter_slots).
  std::span<const int32_t> adapter_slots = {};
  // One entry per member of a KV-parallel group, or empty when the step's KV is in one cache
  // (slot_mapping and block_tables above). When set, slot_mapping and block_tables above are
  // member 0's, so a runner that ignores the group still sees a well-formed step.
  std::span<const KvMemberArrays> kv_members = {};

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_sequences() const { return static_cast<int32_t>(seq_lens.size()); }
  int32_t num_logit_rows() const { return static_cast<int32_t>(logit_indices.size()); }
  // The adapter of segment `sequence` (0, the base model, when adapter_ids is empty).
  int64_t adapter_id(int32_t sequence) const {
    return adapter_ids.empty() ? 0 : adapter_ids[static_cast<size_t>(sequence)];
  }
  int32_t num_kv_members() const { return static_cast<int32_t>(kv_members.size()); }
  // The step as member `member` runs it: its slots and block tables in place of member 0's, and
  // no kv_members (a member runs one cache). Requires: member < num_kv_members().
  StepBatch for_kv_member(int32_t member) const;
  // The longest segment (1 for decode-only steps). Requires: query_start well formed.
  int32_t max_query_length() const;
  // Decode when every segment holds exactly one token, prefill otherwise.
  StepPhase phase() const {
    return max_query_length() == 1 ? StepPhase::kDecode : StepPhase::kPrefill;
  }
};

// What a step returns: one logits row per logit index; or, from a pipeline stage that is not
// the last (step_graph.h), the residual stream of every step token instead.
struct StepOutput {
  // f32 [num_rows, vocab_size], row-major. Owned by whoever ran the step; valid until it runs
  // the next one. Empty from a stage that is not the last.
  std::span<const float> logits;
  int32_t num_rows = 0;
  int32_t vocab_size = 0;
  // f32 [num_tokens, hidden_size]: the residual stream leaving a stage that is not the last (the
  // next stage's input), valid like logits; empty (hidden_size 0) otherwise.
  std::span<const float> hidden = {};
  int64_t hidden_size = 0;
};

}  // namespace folio::ir
