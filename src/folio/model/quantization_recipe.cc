#include "folio/model/quantization_recipe.h"

#include <algorithm>
#include <cctype>

#include "folio/base/check.h"
#include "folio/tensor/quantize.h"

namespace folio::model {
namespace {

using Recipe = QuantizationRecipe;

// The tensor kinds the rules tell apart (llama.cpp's tensor_category, for the Llama family).
enum class TensorKind {
  kTokenEmbedding,
  kOutput,
  kAttentionValue,
  kAttentionOutput,
  kFfnDown,
  kOther
};

TensorKind tensor_kind(std::string_view name) {
  if (name == "output.weight") return TensorKind::kOutput;
  if (name == "token_embd.weight") return TensorKind::kTokenEmbedding;
  if (name.find("attn_v.weight") != std::string_view::npos) return TensorKind::kAttentionValue;
  if (name.find("attn_output.weight") != std::string_view::npos) {
    return TensorKind::kAttentionOutput;
  }
  if (name.find("ffn_down") != std::string_view::npos) return TensorKind::kFfnDown;
  return TensorKind::kOther;
}

bool use_more_bits(int64_t ordinal, int64_t count) {
  return ordinal < count / 8 || ordinal >= 7 * count / 8 || (ordinal - count / 8) % 3 == 2;
}

bool divides(DType dtype, int64_t row_length) {
  return row_length % dtype_info(dtype).block_elements == 0;
}

// What a rule knows of one tensor besides the model: its ordinal among the tensors of its kind in
// name order, and how many attn_v tensors there are.
struct TensorPosition {
  int64_t ordinal = 0;
  int64_t num_attention_value_tensors = 0;
  bool tied_embeddings = false;
};

// The recipe's dtype for a quantizable tensor of a quantized recipe, before any fallback
// (llama.cpp's llama_tensor_get_type_impl, the branches a Llama or Qwen 2 model reaches).
DType rule_dtype(Recipe recipe, const RecipeModel& model, const RecipeTensor& tensor,
                 const TensorPosition& position) {
  const DType base = recipe_default_dtype(recipe);
  const TensorKind kind = tensor_kind(tensor.name);
  const int64_t grouped_query = model.num_heads / std::max<int64_t>(1, model.num_kv_heads);
  const int64_t ordinal = position.ordinal;
  if (kind == TensorKind::kOutput ||
      (position.tied_embeddings && kind == TensorKind::kTokenEmbedding)) {
    if (!divides(base, tensor.dimensions[0])) return DType::kQ8_0;
    return base == DType::kQ8_0 ? DType::kQ8_0 : DType::kQ6_K;
  }
  switch (kind) {
    case TensorKind::kAttentionValue: {
      DType dtype = base;
      const int64_t count = position.num_attention_value_tensors;
      if (recipe == Recipe::kQ2_K) {
        dtype = grouped_query >= 4 ? DType::kQ4_K : DType::kQ3_K;
      } else if (recipe == Recipe::kQ3_K_M) {
        dtype = ordinal < 2 ? DType::kQ5_K : DType::kQ4_K;
      } else if (recipe == Recipe::kQ3_K_L) {
        dtype = DType::kQ5_K;
      } else if ((recipe == Recipe::kIQ4_NL || recipe == Recipe::kIQ4_XS) && grouped_query >= 4) {
        dtype = DType::kQ5_K;
      } else if ((recipe == Recipe::kQ4_K_M || recipe == Recipe::kQ5_K_M) &&
                 use_more_bits(ordinal, count)) {
        dtype = DType::kQ6_K;
      } else if (recipe == Recipe::kQ4_K_S && ordinal < 4) {
        dtype = DType::kQ5_K;
      }
      // 70B models share each attn_v across 8 heads: it is 8x smaller than attn_q, so more
      // bits cost little.
      if (model.is_70b && (dtype == DType::kQ3_K || dtype == DType::kQ4_K)) dtype = DType::kQ5_K;
      return dtype;
    }
    case TensorKind::kFfnDown: {
      const int64_t count = model.num_layers;
      switch (recipe) {
        case Recipe::kQ2_K:
          return DType::kQ3_K;
        case Recipe::kQ3_K_M:
          return ordinal < count / 16 ? DType::kQ5_K : DType::kQ4_K;
        case Recipe::kQ3_K_L:
          return DType::kQ5_K;
        case Recipe::kQ4_K_M:
        case Recipe::kQ5_K_M:
          return use_more_bits(ordinal, count) ? DType::kQ6_K : base;
        case Recipe::kIQ4_NL:
        case Recipe::kIQ4_XS:  // without an importance matrix
        case Recipe::kQ4_K_S:
          return ordinal < count / 8 ? DType::kQ5_K : base;
        case Recipe::kQ4_0:
        case Recipe::kQ4_1:
        case Recipe::kQ5_0:
        case Recipe::kQ5_1:
        case Recipe::kQ8_0:
        case Recipe::kQ3_K_S:
        case Recipe::kQ5_K_S:
        case Recipe::kQ6_K:
        case Recipe::kF16:
        case Recipe::kBF16:
        case Recipe::kF32:
          return base;
      }
      return base;
    }
    case TensorKind::kAttentionOutput:
      if (recipe == Recipe::kQ2_K) return DType::kQ3_K;
      if (recipe == Recipe::kQ3_K_M) return DType::kQ4_K;
      if (recipe == Recipe::kQ3_K_L) return DType::kQ5_K;
      return base;
    case TensorKind::kTokenEmbedding:
    case TensorKind::kOutput:
    case TensorKind::kOther:
      return base;
  }
  return base;
}

// The 32-value type llama.cpp falls back to; nullopt for a dtype with none.
std::optional<DType> fallback_dtype(DType dtype) {
  switch (dtype) {
    case DType::kQ2_K:
    case DType::kQ3_K:
    case DType::kIQ4_XS:
      return DType::kIQ4_NL;
    case DType::kQ4_K:
      return DType::kQ5_0;
    case DType::kQ5_K:
      return DType::kQ5_1;
    case DType::kQ6_K:
      return DType::kQ8_0;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kIQ4_NL:
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      return std::nullopt;
  }
  return std::nullopt;
}

bool equal_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

}  // namespace

std::string_view quantization_recipe_name(QuantizationRecipe recipe) {
  switch (recipe) {
    case Recipe::kQ4_0:
      return "Q4_0";
    case Recipe::kQ4_1:
      return "Q4_1";
    case Recipe::kQ5_0:
      return "Q5_0";
    case Recipe::kQ5_1:
      return "Q5_1";
    case Recipe::kQ8_0:
      return "Q8_0";
    case Recipe::kQ2_K:
      return "Q2_K";
    case Recipe::kQ3_K_S:
      return "Q3_K_S";
    case Recipe::kQ3_K_M:
      return "Q3_K_M";
    case Recipe::kQ3_K_L:
      return "Q3_K_L";
    case Recipe::kQ4_K_S:
      return "Q4_K_S";
    case Recipe::kQ4_K_M:
      return "Q4_K_M";
    case Recipe::kQ5_K_S:
      return "Q5_K_S";
    case Recipe::kQ5_K_M:
      return "Q5_K_M";
    case Recipe::kQ6_K:
      return "Q6_K";
    case Recipe::kIQ4_NL:
      return "IQ4_NL";
    case Recipe::kIQ4_XS:
      return "IQ4_XS";
    case Recipe::kF16:
      return "F16";
    case Recipe::kBF16:
      return "BF16";
    case Recipe::kF32:
      return "F32";
  }
  FOLIO_UNREACHABLE("unknown quantization recipe {}", static_cast<int>(recipe));
}

std::optional<QuantizationRecipe> quantization_recipe_from_name(std::string_view name) {
  for (QuantizationRecipe recipe : kAllQuantizationRecipes) {
    if (equal_ignoring_case(name, quantization_recipe_name(recipe))) return recipe;
  }
  return std::nullopt;
}

std::string quantization_recipe_names() {
  std::string names;
  for (QuantizationRecipe recipe : kAllQuantizationRecipes) {
    if (!names.empty()) names += ", ";
    names += quantization_recipe_name(recipe);
  }
  return names;
}

Result<QuantizationRecipe> parse_quantization_recipe(std::string_view name) {
  if (std::optional<QuantizationRecipe> recipe = quantization_recipe_from_name(name)) {
    return *recipe;
  }
  return invalid_argument("unknown quantization type '{}': use one of {}", name,
                          quantization_recipe_names());
}

DType recipe_default_dtype(QuantizationRecipe recipe) {
  switch (recipe) {
    case Recipe::kQ4_0:
      return DType::kQ4_0;
    case Recipe::kQ4_1:
      return DType::kQ4_1;
    case Recipe::kQ5_0:
      return DType::kQ5_0;
    case Recipe::kQ5_1:
      return DType::kQ5_1;
    case Recipe::kQ8_0:
      return DType::kQ8_0;
    case Recipe::kQ2_K:
      return DType::kQ2_K;
    case Recipe::kQ3_K_S:
    case Recipe::kQ3_K_M:
    case Recipe::kQ3_K_L:
      return DType::kQ3_K;
    case Recipe::kQ4_K_S:
    case Recipe::kQ4_K_M:
      return DType::kQ4_K;
    case Recipe::kQ5_K_S:
    case Recipe::kQ5_K_M:
      return DType::kQ5_K;
    case Recipe::kQ6_K:
      return DType::kQ6_K;
    case Recipe::kIQ4_NL:
      return DType::kIQ4_NL;
    case Recipe::kIQ4_XS:
      return DType::kIQ4_XS;
    case Recipe::kF16:
      return DType::kF16;
    case Recipe::kBF16:
      return DType::kBF16;
    case Recipe::kF32:
      return DType::kF32;
  }
  FOLIO_UNREACHABLE("unknown quantization recipe {}", static_cast<int>(recipe));
}

uint32_t llama_file_type(QuantizationRecipe recipe) {
  switch (recipe) {
    case Recipe::kF32:
      return 0;  // LLAMA_FTYPE_ALL_F32
    case Recipe::kF16:
      return 1;
    case Recipe::kQ4_0:
      return 2;
    case Recipe::kQ4_1:
      return 3;
    case Recipe::kQ8_0:
      return 7;
    case Recipe::kQ5_0:
      return 8;
    case Recipe::kQ5_1:
      return 9;
    case Recipe::kQ2_K:
      return 10;
    case Recipe::kQ3_K_S:
      return 11;
    case Recipe::kQ3_K_M:
      return 12;
    case Recipe::kQ3_K_L:
      return 13;
    case Recipe::kQ4_K_S:
      return 14;
    case Recipe::kQ4_K_M:
      return 15;
    case Recipe::kQ5_K_S:
      return 16;
    case Recipe::kQ5_K_M:
      return 17;
    case Recipe::kQ6_K:
      return 18;
    case Recipe::kIQ4_NL:
      return 25;
    case Recipe::kIQ4_XS:
      return 30;
    case Recipe::kBF16:
      return 32;
  }
  FOLIO_UNREACHABLE("unknown quantization recipe {}", static_cast<int>(recipe));
}

uint32_t llama_file_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return llama_file_type(Recipe::kF32);
    case DType::kF16:
      return llama_file_type(Recipe::kF16);
    case DType::kBF16:
      return llama_file_type(Recipe::kBF16);
    case DType::kQ8_0:
      return llama_file_type(Recipe::kQ8_0);
    case DType::kQ4_0:
      return llama_file_type(Recipe::kQ4_0);
    case DType::kQ4_1:
      return llama_file_type(Recipe::kQ4_1);
    case DType::kQ5_0:
      return llama_file_type(Recipe::kQ5_0);
    case DType::kQ5_1:
      return llama_file_type(Recipe::kQ5_1);
    case DType::kQ2_K:
      return llama_file_type(Recipe::kQ2_K);
    case DType::kQ3_K:
      return llama_file_type(Recipe::kQ3_K_S);
    case DType::kQ4_K:
      return llama_file_type(Recipe::kQ4_K_S);
    case DType::kQ5_K:
      return llama_file_type(Recipe::kQ5_K_S);
    case DType::kQ6_K:
      return llama_file_type(Recipe::kQ6_K);
    case DType::kIQ4_NL:
      return llama_file_type(Recipe::kIQ4_NL);
    case DType::kIQ4_XS:
      return llama_file_type(Recipe::kIQ4_XS);
    case DType::kI32:
    case DType::kI8:
    case DType::kQ8_0Panels:
      break;
  }
  FOLIO_UNREACHABLE("{} is not a weight dtype", dtype_name(dtype));
}

bool is_quantizable_tensor(std::string_view name, std::span<const int64_t> dimensions) {
  // ggml_n_dims: trailing extents of 1 do not count.
  size_t rank = dimensions.size();
  while (rank > 1 && dimensions[rank - 1] == 1) --rank;
  return rank >= 2 && name.ends_with("weight") &&
         name.find("_norm.weight") == std::string_view::npos;
}

namespace {

Result<TensorDtypeChoice> choose_one(Recipe recipe, const RecipeModel& model,
                                     const RecipeTensor& tensor, const TensorPosition& position) {
  FOLIO_CHECK(!tensor.dimensions.empty(), "tensor {} has no dimensions", tensor.name);
  if (!is_quantizable_tensor(tensor.name, tensor.dimensions))
    return TensorDtypeChoice{tensor.dtype, std::nullopt};
  const DType base = recipe_default_dtype(recipe);
  if (!dtype_info(base).quantized) return TensorDtypeChoice{base, std::nullopt};
  const DType preferred = rule_dtype(recipe, model, tensor, position);
  const int64_t row_length = tensor.dimensions[0];
  if (divides(preferred, row_length)) return TensorDtypeChoice{preferred, std::nullopt};
  const std::optional<DType> fallback = fallback_dtype(preferred);
  if (!fallback) {
    return invalid_argument(
        "tensor {}: rows of {} values are not a whole number of {}-value {} blocks, and {} has no "
        "fallback type; use a recipe whose blocks divide the rows, such as F16",
        tensor.name, row_length, dtype_info(preferred).block_elements, dtype_name(preferred),
        dtype_name(preferred));
  }
  const DType chosen = divides(*fallback, row_length) ? *fallback : DType::kF16;
  return TensorDtypeChoice{chosen, preferred};
}

}  // namespace

Result<std::vector<TensorDtypeChoice>> choose_tensor_dtypes(QuantizationRecipe recipe,
                                                            const RecipeModel& model,
                                                            std::span<const RecipeTensor> tensors) {
  // Positions in name order, the order llama-quantize counts in.
  std::vector<size_t> by_name(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) by_name[i] = i;
  std::sort(by_name.begin(), by_name.end(),
            [&](size_t a, size_t b) { return tensors[a].name < tensors[b].name; });
  TensorPosition common;
  common.tied_embeddings = true;
  for (const RecipeTensor& tensor : tensors) {
    if (tensor_kind(tensor.name) == TensorKind::kOutput) common.tied_embeddings = false;
    if (tensor_kind(tensor.name) == TensorKind::kAttentionValue) {
      ++common.num_attention_value_tensors;
    }
  }
  std::vector<TensorPosition> positions(tensors.size(), common);
  int64_t attention_values_seen = 0;
  int64_t ffn_downs_seen = 0;
  for (size_t index : by_name) {
    // llama.cpp advances its counters only for tensors it converts.
    if (!is_quantizable_tensor(tensors[index].name, tensors[index].dimensions)) continue;
    const TensorKind kind = tensor_kind(tensors[index].name);
    if (kind == TensorKind::kAttentionValue) positions[index].ordinal = attention_values_seen++;
    if (kind == TensorKind::kFfnDown) positions[index].ordinal = ffn_downs_seen++;
  }
  std::vector<TensorDtypeChoice> choices;
  choices.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    FOLIO_ASSIGN_OR_RETURN(TensorDtypeChoice choice,
                           choose_one(recipe, model, tensors[i], positions[i]));
    choices.push_back(choice);
  }
  return choices;
}

}  // namespace folio::model
