// StepRunner: the engine's narrow view of the model, one forward step at a time.
//
// The scheduler decides which tokens of which sequences run in a step; the engine lays that out
// as the flat int32 arrays the graph executor takes (docs/design/exec.md "Step"), and a runner
// turns them into one logits row per sequence whose logits are wanted. The real runner (exec/
// over model/) pads to a bucket, copies the arrays into persistent buffers and replays or runs
// the step; the tests' runner (toy_step_runner.h) reads and writes the same paged KV cache
// through the same arrays, so scheduling bugs show up as wrong tokens.
//
// Terms. A step holds `num_sequences` segments; segment s is query tokens
// [query_start[s], query_start[s + 1]) of the step's `num_tokens`, all of one sequence, at
// consecutive positions ending at context length seq_lens[s] - 1: a prefill chunk (any length)
// or a decode (one token). Before the step, the sequence's KV for positions [0, seq_lens[s] -
// query length) is in the cache (computed earlier or served by the prefix cache); the step
// writes each query token's K and V at slot_mapping[token] (slot = block * block_size +
// offset) and attends over positions [0, position] through block table row s.
//
// Copies: copy-on-write and swap copies are run by the block manager's KvBlockCopier before
// run() is called, so the cache is consistent when the step starts.
//
// Thread-safety: run() is called from the engine's driving thread only, one step at a time;
// supports_adapter() from any thread.
#pragma once

#include <cstdint>
#include <span>

#include "folio/base/result.h"

namespace folio::engine {

struct ScheduledStep {
  int32_t num_tokens = 0;     // query tokens in the step, >= 1
  int32_t num_sequences = 0;  // segments, >= 1
  // Width of a block table row: ceil(max context tokens / block_size), fixed for an engine so
  // captured graphs see one shape. Entries past a sequence's blocks hold the dummy block.
  int32_t max_blocks_per_sequence = 0;
  int32_t max_query_length = 0;  // the longest segment; 1 for decode-only steps
  int32_t max_seq_len = 0;       // the longest context

  std::span<const int32_t> token_ids;     // i32 [num_tokens]
  std::span<const int32_t> positions;     // i32 [num_tokens]
  std::span<const int32_t> slot_mapping;  // i32 [num_tokens]
  std::span<const int32_t> query_start;   // i32 [num_sequences + 1], query_start[0] = 0
  std::span<const int32_t> seq_lens;      // i32 [num_sequences]: context length after the step
  std::span<const int32_t> block_tables;  // i32 [num_sequences, max_blocks_per_sequence]
  // i32 [num_logits]: indices into the step's tokens whose logits are wanted (the last token of
  // each segment that completes a prefill or decodes), ascending; logits row j is token
  // logit_indices[j].
  std::span<const int32_t> logit_indices;
  std::span<const int64_t> adapter_ids;  // i64 [num_sequences]; 0 is the base model

  bool is_decode_only() const { return max_query_length == 1; }
};

struct StepOutput {
  int32_t vocab_size = 0;
  // f32 [logit_indices.size(), vocab_size], row-major. Owned by the runner; valid until its next
  // run() call.
  std::span<const float> logits;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  // Runs one step. An error fails the requests scheduled in it (with this status) and leaves
  // the KV cache of their sequences unspecified; the engine frees them.
  virtual Result<StepOutput> run(const ScheduledStep& step) = 0;
  // Rows of every StepOutput.
  virtual int32_t vocab_size() const = 0;
  // Whether requests may name this adapter; called by Engine::submit, so from any thread. The
  // base model (0) always.
  virtual bool supports_adapter(int64_t adapter_id) const { return adapter_id == 0; }
};

}  // namespace folio::engine
