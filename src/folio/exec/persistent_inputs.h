// PersistentInputs: the step's input buffers at fixed addresses (seed 000 §4.2.1). One set,
// sized for the largest step the executor accepts and allocated outside the graph arena (one
// pinned allocation of the page pool, content kTemporary: step_memory.h), is shared by every
// captured program: a program reads its inputs through pointers bound at
// capture, so each step copies its arrays into the prefix of these buffers and fills the
// padding up to the bucket instead of handing the program new memory.
//
// The step-graph contract names the buffers (ir/step_graph.h: ir::kInputTokenIds ...); bind()
// resolves an IR input tensor to its buffer after checking that the tensor's shape fits. Two
// scalars the kernels read at run time have no IR tensor: num_sequences (attention) and
// num_logit_rows (the gather of the logit rows).
//
// Padding, for a step of n tokens and k sequences padded to shape (T, S, R):
//   token ids and positions of tokens [n, T) are 0; their slots are distinct slots of the
//   reserved dummy blocks (so their KV writes land somewhere harmless and never race);
//   sequences [k, S) have context length 0, query_start = n and block tables full of the first
//   dummy block; padding tokens have adapter slot 0 (none); logit indices [r, R) are 0 and the
//   kernels zero those rows (num_logit_rows = r).
//
// A pipeline stage that does not start at the first layer also reads the residual stream
// (ir::kInputHidden, f32 [T, hidden_size]): the step's rows are copied in and padding rows are 0.
//
// Thread-safety: none; the executor writes the buffers before each step, on its thread.
// Invariant: buffer addresses never change after create().
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "folio/base/result.h"
#include "folio/exec/step_limits.h"
#include "folio/exec/step_memory.h"
#include "folio/ir/graph.h"
#include "folio/ir/step_graph.h"
#include "folio/memory/page_pool.h"

namespace folio::exec {

class PersistentInputs {
 public:
  // Requires: limits' max_* fields positive. Errors: a dummy region that is empty or outside
  // the cache (kInvalidArgument); no pages in `pool` (kResourceExhausted). `pool` must outlive
  // the buffers.
  static Result<std::unique_ptr<PersistentInputs>> create(const StepLimits& limits,
                                                          memory::PagePool& pool);

  // Copies `step` (and `hidden`, the residual stream of its tokens for a stage that reads one)
  // into the buffers' prefix and fills the padding up to `shape`.
  // Requires: validate_step(step, limits).ok(); shape.num_tokens >= step tokens,
  // num_sequence_slots >= step sequences, num_logit_rows >= step logit rows, all <= limits;
  // hidden holds step tokens * limits.hidden_size values (none when hidden_size is 0).
  void write(const ir::StepBatch& step, const ir::StepShape& shape,
             std::span<const float> hidden = {});

  // The buffer behind IR input `tensor` (matched by name), or kInvalidArgument when the name is
  // not a persistent input, its dtype is not the buffer's (i32; f32 for the hidden input), or
  // its shape does not fit the buffer (block tables must have exactly max_blocks_per_sequence
  // columns, the hidden input exactly hidden_size).
  Result<std::byte*> bind(const ir::TensorInfo& tensor) const;

  const int32_t* num_sequences() const { return num_sequences_.as<int32_t>(); }
  const int32_t* num_logit_rows() const { return num_logit_rows_.as<int32_t>(); }
  const int32_t* positions() const { return positions_.as<int32_t>(); }
  const int32_t* seq_lens() const { return seq_lens_.as<int32_t>(); }
  const StepLimits& limits() const { return limits_; }

 private:
  PersistentInputs(const StepLimits& limits, memory::PageAllocation memory);

  StepLimits limits_;
  memory::PageAllocation memory_;  // every buffer below is a slice of it
  PoolSlice token_ids_;            // i32 [max_tokens]
  PoolSlice positions_;            // i32 [max_tokens]
  PoolSlice slot_mapping_;         // i32 [max_tokens]
  PoolSlice seq_lens_;             // i32 [max_sequences]
  PoolSlice query_start_;          // i32 [max_sequences + 1]
  PoolSlice block_tables_;         // i32 [max_sequences, max_blocks_per_sequence]
  PoolSlice logit_indices_;        // i32 [max_logit_rows]
  PoolSlice token_adapter_slots_;  // i32 [max_tokens]
  PoolSlice logit_adapter_slots_;  // i32 [max_logit_rows]
  PoolSlice num_sequences_;        // i32 scalar
  PoolSlice num_logit_rows_;       // i32 scalar
  PoolSlice hidden_;               // f32 [max_tokens, hidden_size]; empty when hidden_size is 0
};

}  // namespace folio::exec
