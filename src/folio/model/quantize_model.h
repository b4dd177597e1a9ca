// Quantizing a model file (`folio quantize`): read a GGUF model in any weight dtypes and write a
// new one whose tensors take the dtypes a quantization recipe (quantization_recipe.h) picks,
// as llama.cpp's llama-quantize does without an importance matrix.
//
// The output file:
// - metadata: every entry of the input, in its order, then general.quantization_version = 2 and
//   general.file_type = the recipe's LLAMA_FTYPE (replacing the input's values in place);
// - tensors: in name order (llama-quantize's order), each with the input's name and
//   dimensions. A tensor whose dtype does not change keeps its bytes; any other is converted
//   row by row: dequantized to f32 (tensor/ dequantize_row), then quantized to its new dtype
//   (quantize_row, ggml's reference quantizers).
// Planning (the dtype of every tensor, and the fallbacks) is separate from writing, so a caller
// can show the plan before the work starts.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "folio/base/result.h"
#include "folio/gguf/gguf_file.h"
#include "folio/model/quantization_recipe.h"
#include "folio/tensor/dtype.h"

namespace folio::model {

struct TensorConversion {
  std::string name;
  std::vector<int64_t> dimensions;      // ggml order: dimensions[0] is the row length
  DType source = DType::kF32;           // its dtype in the input
  DType target = DType::kF32;           // its dtype in the output
  std::optional<DType> fell_back_from;  // the recipe's dtype, when the row did not divide it
  uint64_t target_bytes = 0;
};

struct QuantizationPlan {
  QuantizationRecipe recipe = QuantizationRecipe::kQ4_K_M;
  std::vector<TensorConversion> tensors;  // in the order they are written: by name
  uint64_t total_target_bytes = 0;        // tensor bytes of the output, without padding
};

// The dtype of every tensor of `input` under `recipe`. Reads general.architecture and
// <arch>.block_count, .attention.head_count (and _kv, defaulting to head_count). Errors
// (kInvalidArgument or kNotFound, naming the file and the key or tensor): missing metadata, a
// tensor of a ggml type Folio does not convert, a row no dtype of the recipe can hold.
Result<QuantizationPlan> plan_quantization(const gguf::GgufFile& input, QuantizationRecipe recipe);

struct QuantizeOptions {
  int threads = 1;  // rows of one tensor are converted by this many threads
  // Called from the writing thread after each piece of output, with the tensor bytes written
  // so far and plan.total_target_bytes; may be empty.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // quantize_model_file calls this with the plan before writing (to report fallbacks); may be
  // empty.
  std::function<void(const QuantizationPlan& plan)> on_plan;
};

// Writes `plan` (made from `input`) to `output_path` through a temporary file, so a failed
// write leaves nothing under the final name. Errors name the path. Requires: threads >= 1.
Status write_quantized_model(const gguf::GgufFile& input, const QuantizationPlan& plan,
                             const std::string& output_path, const QuantizeOptions& options);

// Opens `input_path`, plans `recipe` and writes `output_path`: `folio quantize`. Errors name the
// path at fault (an input that is missing or not GGUF, an output that cannot be written).
Status quantize_model_file(const std::string& input_path, const std::string& output_path,
                           QuantizationRecipe recipe, const QuantizeOptions& options);

}  // namespace folio::model
