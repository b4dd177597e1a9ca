// AdapterFile: a LoRA adapter in llama.cpp's GGUF format, opened against the base model it
// adapts, validated in full and used in place (read-only mapping, nothing copied at open).
//
// Terms. A *target* is a projection of the base the adapter may update (model/
// llama_adapter_targets.h: q, k, v, attention output, gate, up, down per layer, then the LM head
// when untied), with its index in the adapter table. A *pair* is the adapter's two matrices for
// one target: A ("shrink", rank x input_features) and B ("expand", output_features x rank), so
// the projection W (output_features x input_features) becomes W + scale * B A. The *rank* of a
// pair is its inner dimension; the *scale* is user_scale * alpha / rank (adapter_scale).
//
// The file (what llama.cpp's convert_lora_to_gguf.py writes, and `folio make-adapter`):
//   metadata  general.type = "adapter", adapter.type = "lora", general.architecture = the
//             base's ("llama" | "qwen2"), adapter.lora.alpha (f32; absent or 0: scale is the
//             user scale alone)
//   tensors   <base weight name>.lora_a   dtype [input_features, rank]    (ggml order)
//             <base weight name>.lora_b   dtype [rank, output_features]
//             dtype: f32, f16, bf16, q8_0 or q4_0, each tensor its own.
// Norm vectors (`*_norm.weight`, which mergekit adds and llama.cpp skips) and pairs of norm
// tensors (`*_norm.weight.lora_a/b`, which llama.cpp would refuse for their shape) are skipped;
// any other tensor is an error.
//
// Validation at open (each failure is kInvalidArgument naming the file and the key or tensor,
// or the GGUF reader's own error for a malformed file): the three metadata strings; alpha a
// finite float; every pair's base name a target of the base (the token embedding and unknown
// names are refused); both halves present; two dimensions each; A's row length the target's
// input features and B's rows its output features; ranks equal, positive and at most the base's
// hidden size; a dtype this file format allows; at least one pair. Duplicate tensor names are
// the reader's error. Values are hashed at open but not decoded: a non-finite value is
// write_adapter_weights' error.
//
// The weights (write_adapter_weights): for every pair, A as rank rows of input_features values
// and B^T (B transposed) as rank rows of output_features values, each matrix in a
// kernels::LoraWeightFormat and starting on a 64-byte boundary, in target-index order, A before
// B. One kernels::LoraSlotWeights per target of the base points at them.
//
// Thread-safety: immutable after open; every const method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/gguf/gguf_file.h"
#include "folio/gguf/mapped_file.h"
#include "folio/kernels/lora.h"
#include "folio/model/llama_adapter_targets.h"
#include "folio/model/llama_model_file.h"

namespace folio::lora {

// Every matrix of the weights starts on this boundary (a cache line; what SIMD loads want).
inline constexpr int64_t kAdapterMatrixAlignment = 64;

// One target's two matrices, in the file's bytes.
struct AdapterTensorPair {
  model::AdapterTarget target;
  gguf::GgufTensor a;  // dtype [rank, input_features] (ggml [input_features, rank])
  gguf::GgufTensor b;  // dtype [output_features, rank] (ggml [rank, output_features])
  int64_t rank = 0;
};

// Invariants: pairs() is non-empty, sorted by target index, one pair per target at most; every
// pair's rank is in [1, base hidden size]; max_rank() is the largest; every span points into
// the bytes this object owns.
class AdapterFile {
 public:
  // Maps `path` read-only and validates it against `base` (header comment). Errors name `path`.
  static Result<std::unique_ptr<AdapterFile>> open(const std::string& path,
                                                   const model::LlamaShape& base);
  // The same over bytes the AdapterFile takes ownership of (tests, files built in memory);
  // `source` names them in errors.
  static Result<std::unique_ptr<AdapterFile>> parse(std::vector<uint8_t> bytes, std::string source,
                                                    const model::LlamaShape& base);

  AdapterFile(const AdapterFile&) = delete;
  AdapterFile& operator=(const AdapterFile&) = delete;

  const std::string& source() const { return file_.source(); }
  const gguf::GgufFile& gguf() const { return file_; }
  // adapter.lora.alpha; 0 when the file has none.
  float alpha() const { return alpha_; }
  int64_t max_rank() const { return max_rank_; }
  // FNV-1a 64 (base/random.h) of the whole file: identifies the adapter's bytes, so caches of
  // its weights (and prefix-cache entries computed with it) can tell two files apart.
  uint64_t content_hash() const { return content_hash_; }
  int64_t file_bytes() const { return static_cast<int64_t>(file_.file_size()); }
  // Size of the base's adapter table (llama_adapter_targets(base).size()).
  int32_t num_base_targets() const { return num_base_targets_; }
  // The pairs, by target index.
  std::span<const AdapterTensorPair> pairs() const { return pairs_; }
  // The pair of target `index`, or nullptr when the adapter does not update it.
  const AdapterTensorPair* find_pair(int32_t index) const;

 private:
  AdapterFile(std::optional<gguf::MappedFile> mapping, std::vector<uint8_t> owned_bytes,
              gguf::GgufFile file);
  static Result<std::unique_ptr<AdapterFile>> validate(std::unique_ptr<AdapterFile> adapter,
                                                       const model::LlamaShape& base);

  // Own the bytes file_ parses (one of the two), declared first so they outlive it.
  std::optional<gguf::MappedFile> mapping_;
  std::vector<uint8_t> owned_bytes_;
  gguf::GgufFile file_;
  float alpha_ = 0.0f;
  int64_t max_rank_ = 0;
  uint64_t content_hash_ = 0;
  int32_t num_base_targets_ = 0;
  std::vector<AdapterTensorPair> pairs_;
};

// user_scale * alpha / rank, or user_scale when alpha is 0 (llama.cpp's rule: an adapter
// without alpha is applied at the user's scale). Requires: rank > 0.
float adapter_scale(float alpha, int64_t rank, float user_scale);

// Bytes write_adapter_weights needs: for every pair, A (rank rows of input_features) and B^T
// (rank rows of output_features) in `format`, each rounded up to kAdapterMatrixAlignment.
int64_t adapter_weights_bytes(const AdapterFile& adapter, kernels::LoraWeightFormat format);

// Dequantizes every pair to f32, transposes B, and writes A and B^T in `format` into
// `destination` (the layout in the header comment). Returns one LoraSlotWeights per target of
// the base (num_base_targets(), by index): rank, scale (adapter_scale with `user_scale`) and
// pointers into `destination` for the adapter's targets, rank 0 and null pointers for the
// others. kInvalidArgument naming the file and the tensor when a value is not finite, or when
// user_scale is not.
// Requires: destination.size() >= adapter_weights_bytes(adapter, format) and destination is
// aligned to kAdapterMatrixAlignment.
Result<std::vector<kernels::LoraSlotWeights>> write_adapter_weights(
    const AdapterFile& adapter, kernels::LoraWeightFormat format, float user_scale,
    std::span<std::byte> destination);

}  // namespace folio::lora
