// Llama-family model files: the shape of a Llama model (LlamaShape), reading it from GGUF
// metadata, writing a deterministic random-weight model of any shape, so tests and benchmarks
// need no download (`folio make-model`), and writing trained weights given in f32
// (`folio make-model --from-weights`, the shipped demo model).
//
// A generated file is what llama.cpp's converter writes for a Llama (or Qwen 2) checkpoint:
//   metadata   general.architecture = "llama" | "qwen2" | "qwen3" | "phi3" | "gemma2" | "gemma3",
//              general.name, general.file_type,
//              <arch>.context_length, .embedding_length, .block_count, .feed_forward_length,
//              .attention.head_count, .attention.head_count_kv, .rope.freq_base,
//              .rope.dimension_count, .attention.layer_norm_rms_epsilon, .vocab_size,
//              .attention.key_length and .value_length (only when key_length is set),
//              .attention.sliding_window (only when set; always for gemma2),
//              .attn_logit_softcapping, .final_logit_softcapping (gemma2 always; gemma3's final
//              cap only when set: llama_attention_metadata.h),
//              .rope.scaling.type, .factor and the kind's own keys (only with scaling: llama3
//              .low_freq_factor, .high_freq_factor, .original_context_length; yarn
//              .original_context_length, .yarn_ext_factor, .yarn_attn_factor,
//              .yarn_beta_fast, .yarn_beta_slow),
//              tokenizer.ggml.* (random models: a generated SentencePiece vocabulary,
//              spm_vocabulary_builder.h; trained models: their own), folio.random_seed (random)
//   tensors    (ggml order: [row length, rows]; `dtype` is the matrix's dtype: the shape's
//              weight dtype, or its entry in tensor_dtypes)
//     rope_freqs.weight             f32   [head_dim / 2]   (with rope_frequency_factors)
//     token_embd.weight             dtype [hidden, vocab]
//     blk.N.attn_norm.weight        f32   [hidden]
//     blk.N.attn_q.weight           dtype [hidden, heads * head_dim]   (head_dim: head_dim())
//     blk.N.attn_k.weight           dtype [hidden, kv_heads * head_dim]
//     blk.N.attn_v.weight           dtype [hidden, kv_heads * head_dim]
//     blk.N.attn_q/k/v.bias         f32   [heads * head_dim] / [kv_heads * head_dim]  (qwen2)
//     blk.N.attn_q_norm.weight      f32   [head_dim]                          (qwen3, gemma3)
//     blk.N.attn_k_norm.weight      f32   [head_dim]                          (qwen3, gemma3)
//     blk.N.attn_qkv.weight         dtype [hidden, (heads + 2 kv_heads) * head_dim] (phi3, for
//                                         attn_q/k/v)
//     blk.N.ffn_up.weight           dtype [hidden, 2 ffn] (phi3: gate rows, then up rows; no
//                                         ffn_gate)
//     blk.N.attn_output.weight      dtype [heads * head_dim, hidden]
//     blk.N.post_attention_norm.weight  f32 [hidden]                       (gemma2, gemma3)
//     blk.N.ffn_norm.weight         f32   [hidden]
//     blk.N.ffn_gate.weight         dtype [hidden, ffn]
//     blk.N.ffn_up.weight           dtype [hidden, ffn]
//     blk.N.ffn_down.weight         dtype [ffn, hidden]
//     blk.N.post_ffw_norm.weight    f32   [hidden]                         (gemma2, gemma3)
//     output_norm.weight            f32   [hidden]
//     output.weight                 dtype [hidden, vocab]   (absent when embeddings are tied,
//                                         always for Gemma)
// Values keep activations well-conditioned: a matrix with rows of length n holds values of
// standard deviation 1/sqrt(n) (so each output of x·W has the variance of one input); norm
// weights are 1 + 0.05·z; biases 0.1·z; z approximately standard normal
// (base/random.h). Each tensor has its own random stream seeded from the seed and its
// name, so the bytes depend only on (shape, seed). Quantized weights are made by tensor/'s
// ggml-exact reference quantizers.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/ir/op.h"
#include "folio/tensor/dtype.h"
#include "folio/tokenizer/vocabulary.h"

namespace folio::model {

// The Llama-family architectures Folio runs, by general.architecture:
//   llama  Llama, Mistral-style files: normal (adjacent-pair) RoPE, no biases.
//   qwen2  Q/K/V biases, NeoX RoPE.
//   qwen3  no biases, NeoX RoPE, and an RMSNorm of each query and key head before RoPE
//          (blk.N.attn_q_norm / attn_k_norm, f32 [head_dim]).
//   phi3   Phi-3: NeoX RoPE, Q, K and V fused in one matrix (blk.N.attn_qkv, rows q then k
//          then v) and gate and up in another (blk.N.ffn_up, rows gate then up); no ffn_gate.
//   gemma2 Gemma 2: embeddings scaled by sqrt(hidden_size), NeoX RoPE, an RMSNorm after the
//          attention and after the feed-forward (post_attention_norm, post_ffw_norm) before each
//          residual add, GeGLU feed-forward (gelu(gate) * up, tanh approximation), attention
//          and final logits soft-capped (cap * tanh(x / cap)), even layers sliding-window
//          (local) and odd ones global, output tied to the embedding. The GGUF norm weights
//          are used as stored (llama.cpp's converter has already added Gemma's 1).
//   gemma3 Gemma 3 (text): Gemma 2 without the attention soft cap (the final one only when the
//          file sets it), with Qwen 3's per-head q/k RMSNorm, five local layers to one global
//          (layer i global when i % 6 == 5), and local layers rotating with base 10000 and no
//          RoPE scaling while global ones use rope.freq_base and the file's scaling.
enum class LlamaArchitecture { kLlama, kQwen2, kQwen3, kPhi3, kGemma2, kGemma3 };

std::string_view llama_architecture_name(LlamaArchitecture architecture);  // "llama", "qwen2", ...
std::optional<LlamaArchitecture> llama_architecture_from_name(std::string_view name);
// The names of every architecture, for messages ("llama, qwen2, qwen3").
std::string llama_architecture_names();
// Whether Q, K and V projections have biases (qwen2).
bool llama_has_attention_bias(LlamaArchitecture architecture);
// Whether each query and key head is RMS-normalized before RoPE (qwen3, gemma3).
bool llama_has_query_key_norm(LlamaArchitecture architecture);
// Whether the architecture is a Gemma: scaled embeddings, post-norms, GeGLU, tied output.
bool llama_is_gemma(LlamaArchitecture architecture);
// Which values RoPE pairs (kNormal for llama, kNeox for the others).
kernels::RopeStyle llama_rope_style(LlamaArchitecture architecture);

struct LlamaShape;

// Where a matrix the step graph names (llama's names: blk.N.attn_q.weight, ffn_gate, ...) lives
// in the file: a tensor, and for Phi-3's fused matrices the run of its rows (output features)
// that is this projection. Rows of a GGUF matrix are contiguous, whatever the dtype, so the
// projection is a view of the fused tensor, with no copy.
struct LlamaMatrixLocation {
  std::string tensor;     // GGUF name
  int64_t first_row = 0;  // the first output feature
  int64_t rows = 0;       // 0: the whole tensor
};
LlamaMatrixLocation llama_matrix_location(const LlamaShape& shape, std::string_view name);

struct LlamaShape {
  LlamaArchitecture architecture = LlamaArchitecture::kLlama;
  int64_t vocab_size = 512;
  int64_t hidden_size = 64;  // embedding_length
  int64_t num_layers = 2;    // block_count
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  // attention.key_length (= value_length): each head's width, when it is not hidden_size /
  // num_heads (Gemma, Qwen 3); 0: hidden_size / num_heads, and the keys are not written.
  int64_t key_length = 0;
  int64_t ffn_size = 128;  // feed_forward_length
  int64_t context_length = 256;
  // attention.sliding_window: > 0, each token of a sliding-window layer attends to itself and
  // the sliding_window - 1 tokens before it only (every layer for Mistral; Gemma's local layers,
  // is_sliding_window_layer); 0: the whole past, and the key is not written.
  int64_t sliding_window = 0;
  // attn_logit_softcapping: > 0, attention scores soft-capped (Gemma 2); 0: none.
  float attention_logit_soft_cap = 0.0f;
  // final_logit_softcapping: > 0, logits soft-capped (Gemma 2, optional for Gemma 3); 0: none.
  float final_logit_soft_cap = 0.0f;
  float rope_theta = 10000.0f;  // rope.freq_base
  // rope.scaling.*: none, linear (positions divided by factor), llama3 or yarn (op.h).
  ir::RopeScaling rope_scaling;
  // The file has rope_freqs.weight, f32 [head_dim / 2]: each pair's frequency is divided by its
  // entry (what llama.cpp's converter writes for Llama 3.1 instead of scaling keys). Not with
  // llama3 or yarn scaling.
  bool rope_frequency_factors = false;
  float rms_norm_epsilon = 1e-5f;
  // Of the matrices not named in tensor_dtypes (read from blk.0.attn_q.weight); it also sets
  // the written general.file_type. Norms and biases are always f32.
  DType weight_dtype = DType::kF32;
  bool tie_embeddings = false;  // output projection reuses token_embd.weight
  // Matrices stored in a dtype other than weight_dtype, by GGUF name: files on model hubs mix
  // dtypes (a Q4_K_M file has a q6_K output.weight and some attn_v / ffn_down, q4_K elsewhere).
  // Empty for a file of one weight dtype.
  std::map<std::string, DType, std::less<>> tensor_dtypes;

  // The dtype of the matrix the graph names `name` (llama_matrix_location's tensor's
  // tensor_dtypes entry, or weight_dtype).
  DType matrix_dtype(std::string_view name) const;

  int64_t head_dim() const { return key_length > 0 ? key_length : hidden_size / num_heads; }
  int64_t q_dim() const { return num_heads * head_dim(); }
  int64_t kv_dim() const { return num_kv_heads * head_dim(); }
  // Whether layer `layer` attends through the sliding window: sliding_window > 0 and, for
  // Gemma, a local layer (llama.cpp's swa pattern: gemma2 layer % 2 == 0, gemma3 layer % 6 != 5).
  bool is_sliding_window_layer(int64_t layer) const;
  // The softmax scale: 1 / sqrt(head_dim), except for Gemma's 27B models (46 layers for gemma2,
  // 62 for gemma3), whose query_pre_attn_scalar is hidden_size / num_heads (llama.cpp infers
  // the model from the layer count the same way; the scalar is not in the file).
  float attention_scale() const;
  // Parameters of the generated file (every tensor's elements).
  int64_t parameter_count() const;

  friend bool operator==(const LlamaShape&, const LlamaShape&) = default;
};

// kInvalidArgument naming the field: a size that is not positive or not < 2^32; vocab_size <
// 259 (the generated vocabulary's minimum); without key_length, hidden_size not a multiple of
// num_heads; a negative key_length; an odd
// head_dim (RoPE rotates pairs); num_heads not a multiple of num_kv_heads; a matrix dtype
// (weight_dtype or a tensor_dtypes entry) that is not a weight dtype (tensor/quantize.h); a
// matrix whose rows are not a whole number of its dtype's quantization blocks (naming the
// tensor); a tensor_dtypes entry naming no matrix of the shape; rope_theta or rms_norm_epsilon
// not positive and finite; the Gemma fields (llama_attention_metadata.h's
// validate_attention_metadata): soft caps outside Gemma or not finite, gemma2 without both
// caps or without a window, gemma3 with an attention cap, a Gemma with an untied output.
Status validate_llama_shape(const LlamaShape& shape);

// A writer holding the whole model; tensor bytes are generated while it writes.
Result<gguf::GgufWriter> make_random_llama_writer(const LlamaShape& shape, uint64_t seed);
Status write_random_llama_model(const std::string& path, const LlamaShape& shape, uint64_t seed);

// A trained model: every tensor of the header's list in f32, row-major (a matrix of ggml shape
// [row length, rows] holds rows * row length values, row after row), with its vocabulary.
struct LlamaWeights {
  LlamaShape shape;  // weight_dtype: the dtype the matrices are written in
  std::string name;  // general.name
  tokenizer::Vocabulary vocabulary;
  std::map<std::string, std::vector<float>> tensors;  // GGUF name -> values
};

// A writer holding the model: matrices converted to their dtype (shape.matrix_dtype) with tensor/'s
// ggml-exact quantizers, 1-D tensors kept f32. kInvalidArgument: an invalid shape or
// vocabulary; a vocabulary size other than shape.vocab_size; a missing or unexpected tensor; a
// tensor whose value count does not match its shape; a non-finite value.
Result<gguf::GgufWriter> make_llama_writer(const LlamaWeights& weights);

// A shard of a model (issue 15's weight cache, docs/design/dist.md): layers
// [first_layer, end_layer) and what their step graph reads besides: the embedding for a shard
// from layer 0, the final norm and the LM head (the embedding when tied) for one ending at the
// last layer, rope_freqs.weight where the model has it. A shard file holds the whole model's
// metadata, the shard keys below and only the shard's tensors; read_llama_shape takes from the
// keys what it would read from tensors the shard lacks (the vocabulary size, the weight dtype,
// whether embeddings are tied) and checks only the shard's tensors.
struct LlamaShard {
  int64_t first_layer = 0;
  int64_t end_layer = 0;
};
inline constexpr std::string_view kLlamaShardFirstLayerKey = "folio.shard.first_layer";
inline constexpr std::string_view kLlamaShardEndLayerKey = "folio.shard.end_layer";
inline constexpr std::string_view kLlamaShardVocabSizeKey = "folio.shard.vocab_size";
inline constexpr std::string_view kLlamaShardWeightDtypeKey = "folio.shard.weight_dtype";
inline constexpr std::string_view kLlamaShardTiedKey = "folio.shard.tie_embeddings";

// GGUF names of the tensors the step graph of `shard`'s layers reads, sorted, each once (a
// fused Phi-3 matrix once for its projections). kInvalidArgument: an empty or out-of-range
// layer range, an invalid shape.
Result<std::vector<std::string>> llama_shard_tensor_names(const LlamaShape& shape,
                                                          const LlamaShard& shard);
// Sets the shard keys for `shard` of the whole model `shape` (as read from its file).
void set_llama_shard_keys(gguf::GgufWriter& writer, const LlamaShape& shape,
                          const LlamaShard& shard);
// The shard the file's keys describe; nullopt for a whole model. kInvalidArgument naming the key
// when some shard keys are missing or malformed.
Result<std::optional<LlamaShard>> read_llama_shard(const gguf::GgufFile& file);

// Reads the shape back from a file's metadata and tensors (vocabulary size from
// token_embd.weight, weight dtype from blk.0.attn_q.weight, tied embeddings from the absence of
// output.weight, every other matrix's dtype from its tensor into tensor_dtypes). Optional keys
// take llama.cpp's defaults (head_count_kv = head_count, rope.freq_base = 10000,
// attention.key_length = value_length = embedding_length / head_count). A value_length other
// than key_length, and a rope.dimension_count other than the head dimension (partial
// rotation), are refused naming the key. RoPE scaling as llama.cpp reads it: rope.scaling.type
// (default linear), rope.scaling.factor (or the older rope.scale_linear; absent or 1: no
// scaling); llama3 and yarn read their keys with llama.cpp's defaults (yarn: ext_factor 1,
// attn_factor 1 times rope.scaling.attn_factor, beta_fast 32, beta_slow 1, original context
// length = context_length); any other type (longrope, ...) and yarn_log_multiplier are refused
// naming the key. rope_freqs.weight sets rope_frequency_factors (and, beside llama3 scaling,
// replaces it: it holds the same factors). Every tensor
// is checked against the header's list: errors name the missing or malformed key, a missing
// tensor, a tensor of another shape, a norm or bias that is not f32, and a tensor that is not
// part of the architecture (e.g. a mixture-of-experts tensor, a Gemma 3 vision-tower tensor),
// which Folio refuses rather than ignoring. Gemma's windows and soft caps: as
// llama_attention_metadata.h's read_attention_metadata. A shard file (the shard keys above):
// the vocabulary size, weight dtype and tied embeddings from its keys, and only the shard's
// tensors required and allowed.
Result<LlamaShape> read_llama_shape(const gguf::GgufFile& file);

}  // namespace folio::model
