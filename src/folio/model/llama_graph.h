// The Llama-family forward pass of one engine step, emitted as an ir/ graph.
//
// One graph per padded step shape (a bucket): T step tokens, S sequence slots, R logit rows.
// Per layer: RMSNorm, Q/K/V projections (with bias for Qwen 2), per-head RMSNorm of Q and K
// (Qwen 3, Gemma 3), RoPE (normal pairs for Llama, NeoX halves for the others; the model's RoPE
// scaling and rope_freqs factors; Gemma 3's local layers: base 10000, unscaled), KV-cache write,
// paged attention (grouped-query; the layer's sliding window; Gemma 2's score soft cap),
// output projection, (Gemma: RMSNorm,) residual add, RMSNorm, gate and up projections, SwiGLU
// (Gemma: GeGLU), down projection, (Gemma: RMSNorm,) residual add; then the final RMSNorm, a
// gather of the R rows whose logits are wanted, the LM head (the output matrix, or the token
// embedding when they are tied) and, when the model has one, the final logit soft cap. Gemma
// scales the embeddings by sqrt(hidden_size) before the first layer. With adapters on, each adapter
// target's projection is followed by a lora op (ir/op.h) adding each token's adapter update.
//
// It follows the step-graph contract (ir/step_graph.h): inputs named ir::kInput*, the output
// ir::kOutputLogits, f32 [R, vocab], weights by their GGUF names, and KV caches named
// "blk.N.k_cache" / "blk.N.v_cache".
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/step_graph.h"
#include "folio/model/llama_model_file.h"
#include "folio/model/llama_tensor_split.h"

namespace folio::model {

struct LlamaGraphOptions {
  // Follow every adapter target's projection (llama_adapter_targets.h) with a lora op reading
  // the input token_adapter_slots, so one graph serves any mix of adapters and the base model.
  // Off, the graph is the base model's alone and pays nothing for adapters.
  bool adapters = false;
  // The pipeline stage this graph runs (issue 15): layers [first_layer, end_layer), end_layer
  // nullopt meaning the model's layer count. A stage that starts after layer 0 reads the
  // residual stream from ir::kInputHidden instead of embedding token ids; one that ends before
  // the last layer outputs it as ir::kOutputHidden instead of the final norm, logit-row gather
  // and LM head. Its KV cache holds its layers only (the geometry's num_layers is
  // end_layer - first_layer) under their absolute names ("blk.N.k_cache"). The default, the
  // whole model as one stage, is the single-process graph.
  int64_t first_layer = 0;
  std::optional<int64_t> end_layer;
  // The tensor-parallel rank this graph runs (issue 15, slice 4; llama_tensor_split.h): q, k, v,
  // gate and up column-split (the rank's heads, KV heads and FFN features only), attn_output
  // and ffn_down row-split, each followed by an all_reduce_sum op (named
  // "blk.N.attn_output.all_reduce" / "blk.N.ffn_down.all_reduce") that adds the ranks' partial
  // sums; embedding, norms and LM head replicated. The graph's weights keep their GGUF names
  // with the rank's shapes (llama_tensor_shard.h serves them); its KV cache holds the rank's KV
  // heads (llama_stage_kv_cache_geometry with the split). Not with adapters.
  LlamaTensorSplit tensor_split;

  // A member of a KV-parallel group (issue 15, slice 6; dist.md "KV-parallel groups"):
  // kv_range_end > 0 means its KV cache holds positions [kv_range_begin, kv_range_end) of
  // every sequence (block table entry 0 is the block of kv_range_begin, a multiple of the
  // block size), and each layer's attention is the member's partial attention followed by
  // attention_merge, which gathers every member's partial through the executor's step
  // collectives. 0, 0: the single-process attention.
  int64_t kv_range_begin = 0;
  int64_t kv_range_end = 0;
};

// The step graph of `step`'s bucket over a paged cache of `kv_cache`. Errors
// (kInvalidArgument): an invalid model shape (validate_llama_shape) or step shape, an empty or
// out-of-range layer range, an illegal tensor split (validate_llama_tensor_split) or one with
// adapters, or a KV cache whose geometry is not the stage's (its layer count, the rank's KV
// heads, head dimension).
Result<ir::Graph> build_llama_step_graph(const LlamaShape& model, const ir::StepShape& step,
                                         const ir::KvCacheShape& kv_cache,
                                         const LlamaGraphOptions& options = {});

// The KV block geometry of `model`'s attention layers, with blocks of `block_size` tokens of
// `dtype`: what a cache must have for the model's step graphs.
ir::KvCacheGeometry llama_kv_cache_geometry(const LlamaShape& model, int32_t block_size,
                                            DType dtype);
// The same for the `num_layers` layers of one pipeline stage, holding the KV heads of one
// tensor-parallel rank of `split`. Requires: a legal split (validate_llama_tensor_split).
ir::KvCacheGeometry llama_stage_kv_cache_geometry(const LlamaShape& model, int64_t num_layers,
                                                  int32_t block_size, DType dtype,
                                                  const LlamaTensorSplit& split = {});

// The name of layer `layer`'s key or value cache tensor.
std::string llama_key_cache_name(int64_t layer);
std::string llama_value_cache_name(int64_t layer);

}  // namespace folio::model
