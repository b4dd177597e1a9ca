// Op: one node of the IR graph: a kind, the tensors it reads (inputs), the activations or
// outputs it produces (outputs, each produced by exactly this op), the external state it writes
// in place (updates: KV cache tensors only), kind-specific attributes and the annotations of
// seed 002 §2.3 (phase, modality, cost hints).
//
// The operand list of each kind is fixed and positional; the constants below name the
// positions so kernels and the executor never guess. T is the step's padded token count (the
// bucket), S the number of sequence slots of the step, "float" one of f32, f16, bf16, and every
// 2-D activation is row-major [rows, columns]. Shapes and dtypes are checked by
// op_signature.h; FLOPs and bytes are estimated by cost.h.
//
//   kind            inputs                                              -> output
//   embedding       token_ids i32 [T], table any [vocab, hidden]        -> float [T, hidden]
//   rms_norm        x float [T, G * H], weight f32|x.dtype [H]          -> x.dtype [T, G * H]
//                   each group of H columns normalized on its own (G = 1: the hidden state;
//                   G = heads: Qwen 3's per-head q/k norms)
//   matmul          x float [T, K], weight any [N, K], (bias f32|x.dtype [N]) -> x.dtype [T, N]
//                   y = x * weight^T + bias; the weight is stored as N rows of K (GGUF layout)
//   add, mul        a float [..], b same dtype and shape                 -> a.dtype, a.shape
//   silu            x float [..]                                         -> x.dtype, x.shape
//   swiglu          gate float [T, F], up same dtype and shape           -> silu(gate) * up
//   geglu           gate float [T, F], up same dtype and shape           -> gelu(gate) * up
//                   (GELU's tanh approximation, Gemma's feed-forward)
//   scale           x float [..]                                 -> factor * x, x.dtype, x.shape
//   soft_cap        x float [..]                         -> cap * tanh(x / cap), x.dtype, x.shape
//                   (Gemma 2's final logit soft-capping)
//   rope            x float [T, heads * head_dim], positions i32 [T], (frequency_factors f32
//                   [rotary_dim / 2], a weight: GGUF's rope_freqs, dividing each pair's
//                   frequency; not with llama3 or yarn scaling, which make their own)
//                                                                        -> x.dtype [T, ...]
//   kv_cache_write  key float [T, kv_heads * head_dim], value (same), slot_mapping i32 [T];
//                   updates key_cache, value_cache float [blocks, block_size, kv_heads,
//                   head_dim]: token t goes to slot s = slot_mapping[t], i.e. block
//                   s / block_size, row s % block_size. No outputs.
//   paged_attention query float [T, heads * head_dim], key_cache, value_cache, seq_lens i32 [S]
//                   (KV tokens of each sequence after this step's write), query_start i32
//                   [S + 1] (first query row of each sequence; the last entry is the number of
//                   real tokens), block_tables i32 [S, max_blocks]  -> query.dtype [T, heads *
//                   head_dim]; causal: query row i of a sequence sees its KV tokens
//                   0 .. seq_len - rows_of_sequence + i (the last sliding_window of them when
//                   the attributes set one); scores soft-capped when the attributes set a
//                   logit_soft_cap. A KV-parallel member's partial attention (the attributes
//                   set kv_range_end > 0; dist.md "KV-parallel groups"): the cache holds
//                   positions [kv_range_begin, kv_range_end) of each sequence, block table
//                   entry 0 being the block of kv_range_begin; queries attend to the visible
//                   keys in that range only, and a second output lse f32 [T, heads] holds each
//                   query's log-sum-exp (-inf: no key in range).
//   attention_merge partial float [T, heads * head_dim], lse f32 [T, heads] (a KV-parallel
//                   paged_attention's outputs)                       -> partial.dtype [T, heads
//                   * head_dim]: every member's partial gathered from the executor's step
//                   collectives and merged by log-sum-exp in member order (kernels/cpu/
//                   attention_merge.h): attention over the union of the members' ranges.
//   gather_rows     x float [T, H], indices i32 [R]                      -> x.dtype [R, H]
//   all_reduce_sum  x f32 [..]                                           -> f32, x.shape
//                   the sum over the members of the executor's group (exec/step_collectives.h)
//                   of their x: tensor parallelism's partial projections (a row-split o or
//                   down projection) made whole; every member gets the same bits. The padded
//                   rows of the bucket are summed too, so every member passes the same size.
//   lora            x float [T, K], base float [T, N] (the projection of x), token_adapter_slots
//                   i32 [T]                                              -> base.dtype [T, N]
//                   base plus each token's adapter update scale * B (A x), read from row
//                   `target` of the adapter table the executor binds (kernels/lora.h); tokens
//                   of slot 0 get base unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "folio/base/strong_id.h"
#include "folio/ir/annotations.h"
#include "folio/kernels/rope_style.h"
#include "folio/tensor/dtype.h"

namespace folio::ir {

struct TensorIdTag {};
struct OpIdTag {};
// Index of a tensor in its graph (dense, from 0).
using TensorId = StrongId<TensorIdTag, int32_t>;
// Index of an op in its graph (dense, from 0); also its position in program order.
using OpId = StrongId<OpIdTag, int32_t>;

enum class OpKind : uint8_t {
  kEmbedding,
  kRmsNorm,
  kMatMul,
  kAdd,
  kMul,
  kSilu,
  kSwiGlu,
  kRope,
  kKvCacheWrite,
  kPagedAttention,
  kGatherRows,
  kLora,
  kGeGlu,
  kScale,
  kSoftCap,
  kAllReduceSum,
  kAttentionMerge,
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kAttentionMerge) + 1;

std::string_view op_kind_name(OpKind kind);

// Operand positions.
namespace embedding_input {
inline constexpr int kTokenIds = 0, kTable = 1;
}
namespace rms_norm_input {
inline constexpr int kX = 0, kWeight = 1;
}
namespace matmul_input {
inline constexpr int kX = 0, kWeight = 1, kBias = 2;
}
namespace rope_input {
inline constexpr int kX = 0, kPositions = 1, kFrequencyFactors = 2;
}
namespace kv_cache_write_input {
inline constexpr int kKey = 0, kValue = 1, kSlotMapping = 2;
}
namespace kv_cache_write_update {
inline constexpr int kKeyCache = 0, kValueCache = 1;
}
namespace attention_input {
inline constexpr int kQuery = 0, kKeyCache = 1, kValueCache = 2, kSeqLens = 3, kQueryStartLoc = 4,
                     kBlockTables = 5;
}
namespace attention_output {
inline constexpr int kOutput = 0, kLse = 1;  // kLse: KV-parallel partial attention only
}
namespace attention_merge_input {
inline constexpr int kPartial = 0, kLse = 1;
}
namespace gather_rows_input {
inline constexpr int kX = 0, kIndices = 1;
}
namespace lora_input {
inline constexpr int kX = 0, kBase = 1, kTokenAdapterSlots = 2;
}

struct NoAttributes {
  friend bool operator==(const NoAttributes&, const NoAttributes&) = default;
};

struct EmbeddingAttributes {
  DType output_dtype = DType::kF32;  // float; rows of the table are dequantized into it
  friend bool operator==(const EmbeddingAttributes&, const EmbeddingAttributes&) = default;
};

struct RmsNormAttributes {
  float epsilon = 1e-5f;  // > 0: y = x / sqrt(mean(x^2) + epsilon) * weight
  friend bool operator==(const RmsNormAttributes&, const RmsNormAttributes&) = default;
};

enum class RopeScalingKind : uint8_t {
  kNone,
  kLinear,  // positions divided by `factor`
  kLlama3,  // Llama 3.1 frequency-dependent scaling
  // YaRN as ggml computes it: per pair, the angle blends the interpolated (divided by `factor`)
  // and the original one by a ramp between the dimensions where beta_fast and beta_slow
  // rotations fit in original_context_length, times extrapolation_factor; cosines and sines
  // are scaled by attention_factor * (1 + 0.1 ln factor) (the last term only when
  // extrapolation_factor != 0).
  kYarn,
};

struct RopeScaling {
  RopeScalingKind kind = RopeScalingKind::kNone;
  float factor = 1.0f;
  float low_frequency_factor = 1.0f;       // kLlama3 only
  float high_frequency_factor = 4.0f;      // kLlama3 only
  int64_t original_context_length = 8192;  // kLlama3 and kYarn
  float extrapolation_factor = 1.0f;       // kYarn only: ggml's ext_factor, >= 0
  float attention_factor = 1.0f;           // kYarn only: ggml's attn_factor, > 0
  float beta_fast = 32.0f;                 // kYarn only: > beta_slow
  float beta_slow = 1.0f;                  // kYarn only: > 0
  friend bool operator==(const RopeScaling&, const RopeScaling&) = default;
};

struct RopeAttributes {
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t rotary_dim = 0;  // even, <= head_dim: the leading dimensions of each head rotated
  float theta = 10000.0f;  // frequency base
  kernels::RopeStyle style = kernels::RopeStyle::kNormal;
  RopeScaling scaling;
  friend bool operator==(const RopeAttributes&, const RopeAttributes&) = default;
};

struct AttentionAttributes {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // divides num_heads (grouped-query attention)
  int64_t head_dim = 0;
  float scale = 0.0f;  // softmax scale, > 0 (usually 1 / sqrt(head_dim))
  // > 0: a query at position p sees keys at positions (p - sliding_window, p] only (Mistral's
  // and Gemma's local layers); 0: the whole past.
  int64_t sliding_window = 0;
  // > 0: each scaled score s becomes logit_soft_cap * tanh(s / logit_soft_cap) before the
  // softmax (Gemma 2); 0: no cap.
  float logit_soft_cap = 0.0f;
  // KV-parallel member (issue 15, slice 6): kv_range_end > 0 makes this a partial attention
  // over the cache's positions [kv_range_begin, kv_range_end) with a log-sum-exp output;
  // kv_range_begin is a multiple of the block size. 0, 0: the whole sequence, one output.
  int64_t kv_range_begin = 0;
  int64_t kv_range_end = 0;
  bool is_kv_parallel() const { return kv_range_end > 0; }
  friend bool operator==(const AttentionAttributes&, const AttentionAttributes&) = default;
};

// The adapter-table row a lora op reads: the model's index of the projection it updates
// (model/llama_adapter_targets.h for Llama).
struct LoraAttributes {
  int32_t target = 0;  // >= 0
  friend bool operator==(const LoraAttributes&, const LoraAttributes&) = default;
};

struct ScaleAttributes {
  float factor = 1.0f;  // finite
  friend bool operator==(const ScaleAttributes&, const ScaleAttributes&) = default;
};

struct SoftCapAttributes {
  float cap = 1.0f;  // > 0, finite
  friend bool operator==(const SoftCapAttributes&, const SoftCapAttributes&) = default;
};

using OpAttributes =
    std::variant<NoAttributes, EmbeddingAttributes, RmsNormAttributes, RopeAttributes,
                 AttentionAttributes, LoraAttributes, ScaleAttributes, SoftCapAttributes>;

struct OpAnnotations {
  Phase phase = Phase::kPrefill;
  Modality modality = Modality::kText;
  CostHints cost;
};

struct Op {
  OpId id;  // assigned by Graph::add_op
  OpKind kind = OpKind::kAdd;
  std::string name;    // for dumps and errors, e.g. "blk.3.attn_q"
  int32_t layer = -1;  // transformer layer index, -1 outside the layers
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;
  std::vector<TensorId> updates;  // external state written in place (KV cache)
  OpAttributes attributes;
  OpAnnotations annotations;
};

// The op kinds that run eagerly between graph pieces in piecewise mode (split.h): their launch
// shape depends on per-sequence lengths, not only on T, so a captured launch cannot be replayed.
constexpr bool is_attention(OpKind kind) {
  return kind == OpKind::kPagedAttention;
}

}  // namespace folio::ir
