// Test graphs for the IR and for every layer that consumes it (exec/ tests link this library):
//
// - build_llama_like_test_graph: the forward pass of a small Llama-family model for one step,
//   emitted the way model/ emits it (embedding, per layer RMSNorm, Q/K/V matmuls with optional
//   bias, RoPE, KV-cache write, paged attention, output matmul, residual add, RMSNorm, gate/up,
//   SwiGLU, down, residual add; final RMSNorm, gather of the logit rows, LM head).
// - build_random_test_graph: a random valid graph from a seed, mixing every op kind with
//   activations of varied sizes and lifetimes, for property tests of the passes.
#pragma once

#include <cstdint>

#include "folio/base/result.h"
#include "folio/ir/graph.h"
#include "folio/ir/op.h"

namespace folio::ir::testing {

struct LlamaLikeConfig {
  Phase phase = Phase::kPrefill;
  int64_t num_tokens = 16;     // T: the bucket
  int64_t num_sequences = 4;   // S: sequence slots of the step
  int64_t num_logit_rows = 4;  // R: rows gathered for the LM head
  int64_t num_layers = 2;
  int64_t hidden = 64;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t head_dim = 16;
  int64_t ffn = 128;
  int64_t vocab = 96;
  int64_t num_blocks = 32;
  int64_t block_size = 16;
  int64_t max_blocks_per_sequence = 4;
  bool qkv_bias = false;  // Qwen2
  kernels::RopeStyle rope_style = kernels::RopeStyle::kNormal;
  DType weight_dtype = DType::kF32;  // matmul weights and the embedding table
  DType kv_dtype = DType::kF32;
  float epsilon = 1e-5f;
  float rope_theta = 10000.0f;
};

// Names follow GGUF ("token_embd.weight", "blk.0.attn_q.weight", ...); persistent inputs are
// "token_ids", "positions", "slot_mapping", "seq_lens", "query_start", "block_tables",
// "logit_indices"; the output is "logits" f32 [R, vocab].
Result<Graph> build_llama_like_test_graph(const LlamaLikeConfig& config = {});

struct RandomGraphOptions {
  int32_t num_ops = 40;
  int64_t num_tokens = 8;
  // Probability (in percent) that a step emits attention (with its KV-cache write).
  int32_t attention_percent = 15;
};

Result<Graph> build_random_test_graph(uint64_t seed, const RandomGraphOptions& options = {});

}  // namespace folio::ir::testing
