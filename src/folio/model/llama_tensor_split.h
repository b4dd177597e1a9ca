// Tensor parallelism of a Llama-family model (issue 15, slice 4): how the matrices of one layer
// divide over `num_ranks` ranks, and when they may.
//
// Terms (Megatron's, for a projection y = x · Wᵀ with W stored [out, in] as in GGUF):
// - **Column split**: each rank holds a run of W's output features, i.e. a run of its stored
//   rows (contiguous in every dtype, so no quantization block is ever cut). q, k, v, gate and
//   up (and q/k/v biases) are column-split: rank r holds heads [r * heads / n, (r + 1) * heads /
//   n), KV heads likewise, and FFN features [r * ffn / n, (r + 1) * ffn / n). Attention then
//   runs on the rank's own heads with the rank's own KV cache (its KV heads only).
// - **Row split**: each rank holds a run of W's input features, i.e. a run of columns of each
//   stored row. attn_output (o) and ffn_down are row-split: each rank multiplies its part of
//   the attention output (or of the SwiGLU output) and gets a partial sum of the full result,
//   which an all_reduce_sum op adds over the group. A run of columns is a whole number of
//   quantization blocks only when the rank's input width is a multiple of the dtype's block
//   (32 values for q8_0 / q4_0 ..., 256 for the k-quants): otherwise a block would be cut.
// - **Replicated**: everything else (embedding, norms, LM head, q/k norm weights, rope_freqs):
//   every rank holds it whole. Every rank computes the same logits; the coordinator reads rank
//   0's. A vocabulary split of the LM head would need an all_gather op the IR does not have.
//
// Legality (validate_llama_tensor_split): KV heads divisible by the rank count (each rank holds
// whole heads; query heads are a multiple of KV heads, so they divide too), the FFN width
// divisible, and no row split cutting a quantization block.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "folio/base/status.h"

namespace folio::model {

struct LlamaShape;

// Rank `rank` of `num_ranks`. The default (rank 0 of 1) is the unsplit model.
struct LlamaTensorSplit {
  int64_t rank = 0;
  int64_t num_ranks = 1;

  bool is_split() const { return num_ranks > 1; }
  // The run [first, first + count) of `total` parts that this rank holds. Requires: total is a
  // multiple of num_ranks.
  int64_t part(int64_t total) const { return total / num_ranks; }
  int64_t first(int64_t total) const { return rank * part(total); }
};

// How a tensor the step graph names divides over the ranks.
enum class LlamaSplitAxis : uint8_t {
  kReplicated,  // whole on every rank
  kColumns,     // rows of the stored [out, in] (or a bias's values) split: output features
  kRows,        // columns of the stored [out, in] split: input features
};

// The axis of the weight the graph names `name` ("blk.3.attn_q.weight", "output.weight", ...).
LlamaSplitAxis llama_split_axis(std::string_view name);
std::string_view llama_split_axis_name(LlamaSplitAxis axis);

// kInvalidArgument, with a message naming the rank counts that would work, when `split` is not a
// legal tensor split of `model`: num_ranks < 1 or rank outside [0, num_ranks); KV heads or the
// FFN width not divisible by num_ranks; a row-split matrix (attn_output, ffn_down of any layer)
// whose per-rank input width is not a whole number of its dtype's blocks.
Status validate_llama_tensor_split(const LlamaShape& model, const LlamaTensorSplit& split);

}  // namespace folio::model
