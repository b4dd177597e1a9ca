// Quantization recipes: the per-tensor dtype mixtures that llama.cpp's llama-quantize writes
// under the names people download (Q4_K_M, Q5_K_S, IQ4_XS, ...), for the Llama / Qwen 2 family.
//
// Terms:
// - recipe: a named mixture (llama.cpp's `llama_ftype`). Each has a *default dtype* (q4_K for
//   Q4_K_M) and rules that give some tensors more bits: the output matrix (q6_K unless the recipe
//   is Q8_0), and by recipe attn_v, attn_output and ffn_down in chosen layers.
// - quantizable tensor: one llama.cpp would convert: at least 2 dimensions (counting only up to
//   the last extent above 1, as ggml_n_dims does), a name ending in "weight" and no
//   "_norm.weight". Every other tensor (norms, biases) keeps its dtype and bytes.
// - ordinal: a tensor's index among the tensors of its kind (attn_v, ffn_down) in *name order*,
//   which is the order llama-quantize visits and writes tensors (its tensor map is sorted by
//   name, so with 10 or more layers blk.10 comes third). The layer rules read ordinals, not the
//   layer numbers in the names, exactly as llama.cpp does.
// - "use more bits" layers (ordinal i of n): i < n/8, i >= 7n/8, or (i - n/8) % 3 == 2.
// - fallback: a tensor whose row length is not a multiple of its dtype's block size takes a
//   32-value type instead (q2_K, q3_K, iq4_xs -> iq4_nl; q4_K -> q5_0; q5_K -> q5_1; q6_K ->
//   q8_0), or f16 if even that does not divide; the 32-value types (q4_0 ... q8_0, iq4_nl)
//   have no fallback, and such a tensor is an error.
// The F16, BF16 and F32 recipes convert every quantizable tensor to that dtype, with no rules.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "folio/base/result.h"
#include "folio/tensor/dtype.h"

namespace folio::model {

enum class QuantizationRecipe {
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kQ8_0,
  kQ2_K,
  kQ3_K_S,
  kQ3_K_M,
  kQ3_K_L,
  kQ4_K_S,
  kQ4_K_M,
  kQ5_K_S,
  kQ5_K_M,
  kQ6_K,
  kIQ4_NL,
  kIQ4_XS,
  kF16,
  kBF16,
  kF32,
};

inline constexpr QuantizationRecipe kAllQuantizationRecipes[] = {
    QuantizationRecipe::kQ4_0,   QuantizationRecipe::kQ4_1,   QuantizationRecipe::kQ5_0,
    QuantizationRecipe::kQ5_1,   QuantizationRecipe::kQ8_0,   QuantizationRecipe::kQ2_K,
    QuantizationRecipe::kQ3_K_S, QuantizationRecipe::kQ3_K_M, QuantizationRecipe::kQ3_K_L,
    QuantizationRecipe::kQ4_K_S, QuantizationRecipe::kQ4_K_M, QuantizationRecipe::kQ5_K_S,
    QuantizationRecipe::kQ5_K_M, QuantizationRecipe::kQ6_K,   QuantizationRecipe::kIQ4_NL,
    QuantizationRecipe::kIQ4_XS, QuantizationRecipe::kF16,    QuantizationRecipe::kBF16,
    QuantizationRecipe::kF32,
};

// "Q4_K_M", as llama-quantize spells it.
std::string_view quantization_recipe_name(QuantizationRecipe recipe);
// By name, ignoring case ("q4_k_m" names Q4_K_M).
std::optional<QuantizationRecipe> quantization_recipe_from_name(std::string_view name);
// "Q4_0, Q4_1, ..., F32": every name, for error messages.
std::string quantization_recipe_names();
// As quantization_recipe_from_name; kInvalidArgument naming `name` and listing every recipe.
Result<QuantizationRecipe> parse_quantization_recipe(std::string_view name);

// The dtype most quantizable tensors get (q4_K for Q4_K_M).
DType recipe_default_dtype(QuantizationRecipe recipe);
// llama.cpp's LLAMA_FTYPE value of the recipe (general.file_type): 15 for Q4_K_M.
uint32_t llama_file_type(QuantizationRecipe recipe);
// llama.cpp's LLAMA_FTYPE for a file whose matrices are all `dtype` (a k-quant is its _S
// recipe: q4_K -> 14). Requires: is_weight_dtype(dtype).
uint32_t llama_file_type(DType dtype);

// What the rules read of the model besides its tensors.
struct RecipeModel {
  int64_t num_layers = 0;  // <arch>.block_count: the range of ffn_down ordinals
  int64_t num_heads = 1;
  int64_t num_kv_heads = 1;
  bool is_70b = false;  // llama.cpp's LLM_TYPE_70B (80 layers): attn_v gets q5_K
};

// One tensor of the input.
struct RecipeTensor {
  std::string name;
  std::vector<int64_t> dimensions;  // ggml order: dimensions[0] is the row length
  DType dtype = DType::kF32;        // its dtype in the input
};

struct TensorDtypeChoice {
  DType dtype = DType::kF32;            // what the tensor is written as
  std::optional<DType> fell_back_from;  // the recipe's dtype when the row did not divide it
};

// Whether llama.cpp would convert the tensor at all (see "quantizable tensor" above).
bool is_quantizable_tensor(std::string_view name, std::span<const int64_t> dimensions);

// The dtype `recipe` gives each of a model's tensors (every tensor of the file, in any order;
// the choices come in the same order). Embeddings count as tied when there is no
// output.weight. kInvalidArgument, naming the tensor, its row length and the dtype, when a row
// is not a whole number of blocks of a dtype that has no fallback.
Result<std::vector<TensorDtypeChoice>> choose_tensor_dtypes(QuantizationRecipe recipe,
                                                            const RecipeModel& model,
                                                            std::span<const RecipeTensor> tensors);

}  // namespace folio::model
