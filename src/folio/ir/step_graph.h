// The step-graph contract: what a model layer emits and the executor runs, so that model/ and
// exec/ depend on ir/ and not on each other.
//
// - A step graph is the forward pass of one padded step shape (a bucket): StepShape's T tokens,
//   S sequence slots and R logit rows, over a paged KV cache of KvCacheShape. A GraphFactory
//   emits one per shape; the executor captures or runs it.
// - Inputs are named after the StepBatch fields they carry (step_batch.h): kInputTokenIds ...
//   The executor binds them to its persistent input buffers by these names.
// - The output kOutputLogits is f32 [R, vocab].
// - Pipeline stages (issue 15): a graph of a contiguous range of layers that does not start at
//   the first layer reads the residual stream from kInputHidden instead of embedding
//   kInputTokenIds; one that does not end at the last layer outputs the residual stream as
//   kOutputHidden instead of logits. Both are f32 [T, hidden], every step token (padding rows
//   included), so the output of one stage is the input of the next, row for row.
// - Weights are named by their GGUF names and found through a WeightSource; bind_weight checks
//   what the source returns against the graph's tensor.
// - KV caches are one key and one value tensor per layer, [num_blocks, block_size, kv_heads,
//   head_dim], used by the layer's kv_cache_write and paged_attention ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string_view>

#include "folio/base/result.h"
#include "folio/ir/annotations.h"
#include "folio/ir/graph.h"
#include "folio/ir/kv_cache_geometry.h"
#include "folio/ir/step_batch.h"
#include "folio/tensor/tensor_view.h"

namespace folio::ir {

inline constexpr std::string_view kInputTokenIds = "token_ids";          // i32 [T]
inline constexpr std::string_view kInputPositions = "positions";         // i32 [T]
inline constexpr std::string_view kInputSlotMapping = "slot_mapping";    // i32 [T]
inline constexpr std::string_view kInputSeqLens = "seq_lens";            // i32 [S]
inline constexpr std::string_view kInputQueryStart = "query_start";      // i32 [S + 1]
inline constexpr std::string_view kInputBlockTables = "block_tables";    // i32 [S, B]
inline constexpr std::string_view kInputLogitIndices = "logit_indices";  // i32 [R]
// Each token's adapter-table slot: StepBatch::adapter_slots of the token's sequence; 0 for
// padding tokens and when the step has no adapter slots. Only graphs with lora ops have it.
inline constexpr std::string_view kInputTokenAdapterSlots = "token_adapter_slots";  // i32 [T]
// The slot of the token of each logit row (the LM head's adapter update); 0 for padding rows.
inline constexpr std::string_view kInputLogitAdapterSlots = "logit_adapter_slots";  // i32 [R]
inline constexpr std::string_view kOutputLogits = "logits";  // f32 [R, vocab]
// The residual stream entering and leaving a pipeline stage's layers.
inline constexpr std::string_view kInputHidden = "hidden_in";    // f32 [T, hidden]
inline constexpr std::string_view kOutputHidden = "hidden_out";  // f32 [T, hidden]

// The shape one step graph is emitted for. Every field is fixed per bucket: T is the padded
// token count, S = min(T, max sequences) and R = min(T, max logit rows).
struct StepShape {
  int32_t num_tokens = 0;          // T
  int32_t num_sequence_slots = 0;  // S
  int32_t num_logit_rows = 0;      // R
  StepPhase phase = StepPhase::kDecode;

  // The IR phase the graph is annotated with: decode buckets are kDecode; prefill buckets
  // serve prefill and mixed steps alike and are kMixed.
  Phase ir_phase() const;
  friend bool operator==(const StepShape&, const StepShape&) = default;
};

// The paged KV cache a step graph reads and writes: the shape of a block, how many blocks the
// cache tensors hold, and the width B of a block-table row.
struct KvCacheShape {
  KvCacheGeometry geometry;
  int64_t num_blocks = 0;  // including the reserved dummy blocks
  int32_t max_blocks_per_sequence = 0;
};

using GraphFactory = std::function<Result<Graph>(const StepShape& shape)>;

// Where weights come from. Thread-safety: find_weight may be called from any thread.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The tensor named `name` (its GGUF name), or kNotFound. The memory must stay valid and
  // unchanged for as long as any executor built on this source lives: captured programs keep
  // its pointers.
  virtual Result<TensorView> find_weight(std::string_view name) const = 0;
};

// The weight behind `tensor`, checked against its dtype and shape.
Result<std::byte*> bind_weight(const TensorInfo& tensor, const WeightSource& weights);

}  // namespace folio::ir

template <>
struct std::hash<folio::ir::StepShape> {
  size_t operator()(const folio::ir::StepShape& shape) const noexcept {
    const uint64_t packed = (uint64_t(uint32_t(shape.num_tokens)) << 32) ^
                            (uint64_t(uint32_t(shape.num_sequence_slots)) << 12) ^
                            (uint64_t(uint32_t(shape.num_logit_rows)) << 2) ^
                            static_cast<uint64_t>(shape.phase);
    return std::hash<uint64_t>()(packed);
  }
};
