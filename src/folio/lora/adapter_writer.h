// Writers of LoRA adapter files in llama.cpp's format (adapter_file.h describes it): a
// deterministic random adapter for any base model, so tests, benchmarks and the reference
// goldens need no trained adapter (`folio make-adapter`), and trained adapters given in f32
// (`folio make-adapter --from-weights`).
//
// Metadata written: general.architecture (the base's), general.type = "adapter", general.name,
// adapter.type = "lora", adapter.lora.alpha (f32), general.quantization_version = 2 when a
// tensor is q8_0, folio.random_seed (random adapters). Tensors, by target index, A before B:
//   <weight>.lora_a   [input_features, rank]    (ggml order: rank rows of input_features)
//   <weight>.lora_b   [rank, output_features]   (output_features rows of rank)
// Each tensor is written in the requested dtype, except that q8_0 needs rows of whole 32-value
// blocks: a tensor whose row length is not a multiple of 32 (B whenever the rank is not) is
// written f16 instead (adapter_tensor_dtype).
//
// Random values (make_random_adapter_writer), each tensor from its own stream seeded by the
// seed and its name (as model files are, llama_model_file.h), z approximately standard normal
// (base/random.h):
//   A = z / sqrt(input_features)         so each of A x's rank values has the spread of one
//                                        input, as a base projection's outputs do;
//   B = 0.25 * z / sqrt(rank)            so B (A x) has a quarter of the spread of the base
//                                        projection's output W x (whose values have standard
//                                        deviation 1/sqrt(input_features)).
// At the default alpha (= rank, so scale 1 at user scale 1) the update moves every adapted
// projection by about a quarter of its own size: far beyond rounding, so a test sees whether
// it was applied, yet small enough that the model stays a perturbation of its base.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/model/llama_adapter_targets.h"
#include "folio/model/llama_model_file.h"
#include "folio/tensor/dtype.h"

namespace folio::lora {

// The spread of a random B relative to the base projection's output (header comment).
inline constexpr double kRandomAdapterUpdateFraction = 0.25;

// The dtype a tensor of rows of `row_length` values is written in when `requested` is asked
// for: f16 instead of q8_0 when the row is not a whole number of 32-value blocks.
DType adapter_tensor_dtype(DType requested, int64_t row_length);

struct RandomAdapterOptions {
  int64_t rank = 8;
  // The projections adapted in every layer; the LM head too when `output` (untied bases only).
  std::vector<model::LlamaProjection> projections = {
      model::LlamaProjection::kQuery, model::LlamaProjection::kKey,
      model::LlamaProjection::kValue, model::LlamaProjection::kAttentionOutput,
      model::LlamaProjection::kGate,  model::LlamaProjection::kUp,
      model::LlamaProjection::kDown};
  bool output = false;
  DType dtype = DType::kF16;   // f32, f16, bf16 or q8_0
  std::optional<float> alpha;  // nullopt: the rank (scale 1 at user scale 1)
  uint64_t seed = 1;
  std::string name = "folio random adapter";
};

// A writer of the random adapter for `base` (values generated while it writes).
// kInvalidArgument: an invalid base shape; a rank outside [1, hidden size]; no projection; a
// projection listed twice; `output` with tied embeddings; a dtype other than f32, f16, bf16,
// q8_0; a non-finite alpha.
Result<gguf::GgufWriter> make_random_adapter_writer(const model::LlamaShape& base,
                                                    const RandomAdapterOptions& options);

// One trained tensor in f32, in PyTorch's layout: shape [rows, row length], values row after
// row, so lora_a is [rank, input_features] and lora_b [output_features, rank].
struct AdapterTensorValues {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// A trained adapter: tensors named as in the file (<weight>.lora_a, <weight>.lora_b).
struct AdapterWeights {
  model::LlamaArchitecture architecture = model::LlamaArchitecture::kLlama;
  std::string name;
  float alpha = 0.0f;  // 0: the adapter is applied at the user's scale alone
  std::map<std::string, AdapterTensorValues> tensors;
};

// A writer of the trained adapter, its tensors in `dtype` (f32, f16, bf16 or q8_0; see
// adapter_tensor_dtype). kInvalidArgument naming the tensor: an architecture other than the
// base's; a name that is not <target>.lora_a or .lora_b of a target of `base`; a shape that is
// not 2-D with positive extents or does not fit the target; a value count other than the
// shape's; a non-finite value; a lone half of a pair; ranks of a pair that differ or exceed the
// hidden size; no tensor at all; a non-finite alpha; an unsupported dtype.
Result<gguf::GgufWriter> make_adapter_writer(const model::LlamaShape& base,
                                             const AdapterWeights& weights, DType dtype);

}  // namespace folio::lora
