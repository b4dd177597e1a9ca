// The Llama-family forward pass of one engine step, emitted as an ir/ graph.
//
// One graph per padded step shape (a bucket): T step tokens, S sequence slots, R logit rows.
// Per layer: RMSNorm, Q/K/V projections (with bias for Qwen 2), RoPE (normal pairs for Llama,
// NeoX halves for Qwen 2), KV-cache write, paged attention (grouped-query), output projection,
// residual add, RMSNorm, gate and up projections, SwiGLU, down projection, residual add; then
// the final RMSNorm, a gather of the R rows whose logits are wanted, and the LM head (the
// output matrix, or the token embedding when they are tied).
//
// Names the executor binds by: weights by their GGUF names, KV caches as "blk.N.k_cache" /
// "blk.N.v_cache", persistent inputs by the executor's names (exec::kInput*, persistent_inputs.h)
// and the output exec::kOutputLogits, f32 [R, vocab].
#pragma once

#include <cstdint>
#include <string_view>

#include "folio/base/result.h"
#include "folio/exec/executor.h"
#include "folio/exec/persistent_inputs.h"
#include "folio/ir/graph.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/dtype.h"

namespace folio::model {

// The padded shape of one step and of the KV cache it reads.
struct LlamaStepShape {
  ir::Phase phase = ir::Phase::kPrefill;
  int64_t num_tokens = 1;               // T
  int64_t num_sequences = 1;            // S
  int64_t num_logit_rows = 1;           // R
  int64_t max_blocks_per_sequence = 1;  // B
  int64_t num_kv_blocks = 1;            // blocks in the cache (the KV tensors' first dimension)
  int64_t block_size = 16;              // tokens per block
  DType kv_dtype = DType::kF32;
};

// Errors (kInvalidArgument): an invalid model shape (validate_llama_shape) or step shape.
Result<ir::Graph> build_llama_step_graph(const LlamaShape& model, const LlamaStepShape& step);

// The name of layer `layer`'s key or value cache tensor.
std::string llama_key_cache_name(int64_t layer);
std::string llama_value_cache_name(int64_t layer);

}  // namespace folio::model
