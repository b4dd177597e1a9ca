#include "folio/model/quantize_model.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <span>
#include <thread>

#include "folio/base/check.h"
#include "folio/gguf/gguf_writer.h"
#include "folio/tensor/quantize.h"

namespace folio::model {
namespace {

// Output bytes converted between two progress reports (and the unit of work of one pass of the
// threads), so a large tensor shows progress and every thread has rows to convert.
constexpr uint64_t kBytesPerPass = uint64_t{8} << 20;

Result<RecipeModel> read_recipe_model(const gguf::GgufFile& input) {
  FOLIO_ASSIGN_OR_RETURN(const std::string_view architecture,
                         input.get_string("general.architecture"));
  const std::string prefix(architecture);
  RecipeModel model;
  FOLIO_ASSIGN_OR_RETURN(model.num_layers, input.get_integer(prefix + ".block_count"));
  FOLIO_ASSIGN_OR_RETURN(model.num_heads, input.get_integer(prefix + ".attention.head_count"));
  model.num_kv_heads =
      input.get_integer(prefix + ".attention.head_count_kv").value_or(model.num_heads);
  // llama.cpp's model-type detection: an 80-layer Llama with grouped-query attention (or any
  // 80-layer Qwen 2) is its 70B type.
  model.is_70b = model.num_layers == 80 &&
                 ((architecture == "llama" && model.num_heads != model.num_kv_heads) ||
                  architecture == "qwen2");
  return model;
}

int64_t element_count(const std::vector<int64_t>& dimensions) {
  int64_t count = 1;
  for (int64_t extent : dimensions) count *= extent;
  return count;
}

// Converts rows [first, last) of a tensor from `source` to `target` bytes.
void convert_rows(const TensorConversion& tensor, std::span<const std::byte> source,
                  std::span<std::byte> target, int64_t first, int64_t last,
                  std::vector<float>& row) {
  const int64_t row_length = tensor.dimensions[0];
  const int64_t source_row_bytes = row_bytes(tensor.source, row_length);
  const int64_t target_row_bytes = row_bytes(tensor.target, row_length);
  row.resize(static_cast<size_t>(row_length));
  for (int64_t r = first; r < last; ++r) {
    dequantize_row(tensor.source, source.data() + r * source_row_bytes, row.data(), row_length);
    quantize_row(tensor.target, row.data(), target.data() + r * target_row_bytes, row_length);
  }
}

// The fill function of one converted tensor: passes of about kBytesPerPass output bytes, each
// split across the threads by row, with a progress report after each pass.
gguf::GgufWriter::TensorFill conversion_fill(const TensorConversion& tensor,
                                             std::span<const std::byte> source, int threads,
                                             const QuantizeOptions& options, uint64_t& bytes_done,
                                             uint64_t total_bytes) {
  return [&tensor, source, threads, &options, &bytes_done,
          total_bytes](std::span<std::byte> destination) -> Status {
    const int64_t row_length = tensor.dimensions[0];
    const int64_t rows = element_count(tensor.dimensions) / row_length;
    const auto target_row_bytes = static_cast<uint64_t>(row_bytes(tensor.target, row_length));
    const int64_t rows_per_pass = std::max<int64_t>(
        1, static_cast<int64_t>(kBytesPerPass / std::max<uint64_t>(1, target_row_bytes)));
    std::vector<std::vector<float>> row_buffers(static_cast<size_t>(threads));
    for (int64_t pass_first = 0; pass_first < rows; pass_first += rows_per_pass) {
      const int64_t pass_last = std::min(rows, pass_first + rows_per_pass);
      const int64_t pass_rows = pass_last - pass_first;
      const int64_t workers = std::min<int64_t>(threads, pass_rows);
      auto rows_of = [&](int64_t worker) {
        return std::pair{pass_first + pass_rows * worker / workers,
                         pass_first + pass_rows * (worker + 1) / workers};
      };
      std::vector<std::jthread> helpers;
      for (int64_t worker = 1; worker < workers; ++worker) {
        helpers.emplace_back([&, worker] {
          const auto [first, last] = rows_of(worker);
          convert_rows(tensor, source, destination, first, last, row_buffers[worker]);
        });
      }
      const auto [first, last] = rows_of(0);
      convert_rows(tensor, source, destination, first, last, row_buffers[0]);
      helpers.clear();  // joins
      bytes_done += static_cast<uint64_t>(pass_rows) * target_row_bytes;
      if (options.progress) options.progress(bytes_done, total_bytes);
    }
    return Status();
  };
}

}  // namespace

Result<QuantizationPlan> plan_quantization(const gguf::GgufFile& input, QuantizationRecipe recipe) {
  Result<RecipeModel> model = read_recipe_model(input);
  if (!model.ok()) return model.status().with_context(input.source());
  std::vector<RecipeTensor> tensors;
  tensors.reserve(input.tensors().size());
  for (const gguf::GgufTensorInfo& info : input.tensors()) {
    const std::optional<DType> dtype = dtype_from_ggml_type(info.type.code);
    if (!dtype) {
      return invalid_argument("{}: tensor {} has ggml type {}, which Folio cannot convert or copy",
                              input.source(), info.name, info.type.name);
    }
    tensors.push_back(RecipeTensor{info.name, info.dimensions, *dtype});
  }
  Result<std::vector<TensorDtypeChoice>> choices = choose_tensor_dtypes(recipe, *model, tensors);
  if (!choices.ok()) return choices.status().with_context(input.source());

  QuantizationPlan plan;
  plan.recipe = recipe;
  for (size_t i = 0; i < tensors.size(); ++i) {
    TensorConversion conversion;
    conversion.name = std::move(tensors[i].name);
    conversion.dimensions = std::move(tensors[i].dimensions);
    conversion.source = tensors[i].dtype;
    conversion.target = (*choices)[i].dtype;
    conversion.fell_back_from = (*choices)[i].fell_back_from;
    // A quantizable tensor is a matrix whose rows the chosen dtype divides (fallbacks end at
    // f16); a kept tensor keeps the input's valid layout.
    conversion.target_bytes =
        static_cast<uint64_t>(element_count(conversion.dimensions) / conversion.dimensions[0] *
                              row_bytes(conversion.target, conversion.dimensions[0]));
    plan.total_target_bytes += conversion.target_bytes;
    plan.tensors.push_back(std::move(conversion));
  }
  std::sort(plan.tensors.begin(), plan.tensors.end(),
            [](const TensorConversion& a, const TensorConversion& b) { return a.name < b.name; });
  return plan;
}

Status write_quantized_model(const gguf::GgufFile& input, const QuantizationPlan& plan,
                             const std::string& output_path, const QuantizeOptions& options) {
  FOLIO_CHECK(options.threads >= 1, "quantizing with {} threads", options.threads);
  gguf::GgufWriter writer;
  for (const gguf::GgufKeyValue& entry : input.metadata()) writer.set(entry.key, entry.value);
  writer.set("general.quantization_version", gguf::GgufValue::of<uint32_t>(2));
  writer.set("general.file_type", gguf::GgufValue::of<uint32_t>(llama_file_type(plan.recipe)));

  uint64_t bytes_done = 0;
  for (const TensorConversion& tensor : plan.tensors) {
    const gguf::GgufTensorInfo* info = input.find_tensor(tensor.name);
    FOLIO_CHECK(info != nullptr, "the plan names tensor {}, which {} lacks", tensor.name,
                input.source());
    const std::span<const std::byte> source = input.tensor_bytes(*info);
    gguf::GgufWriter::TensorFill fill;
    if (tensor.source == tensor.target) {
      fill = [source, &tensor, &options, &bytes_done,
              total = plan.total_target_bytes](std::span<std::byte> destination) -> Status {
        std::memcpy(destination.data(), source.data(), destination.size());
        bytes_done += tensor.target_bytes;
        if (options.progress) options.progress(bytes_done, total);
        return Status();
      };
    } else {
      fill = conversion_fill(tensor, source, options.threads, options, bytes_done,
                             plan.total_target_bytes);
    }
    FOLIO_RETURN_IF_ERROR(writer.add_tensor(tensor.name, tensor.target, tensor.dimensions, fill)
                              .with_context(output_path));
  }
  return writer.write_file(output_path).with_context(output_path);
}

Status quantize_model_file(const std::string& input_path, const std::string& output_path,
                           QuantizationRecipe recipe, const QuantizeOptions& options) {
  FOLIO_ASSIGN_OR_RETURN(const gguf::GgufFile input, gguf::GgufFile::open(input_path));
  FOLIO_ASSIGN_OR_RETURN(const QuantizationPlan plan, plan_quantization(input, recipe));
  if (options.on_plan) options.on_plan(plan);
  return write_quantized_model(input, plan, output_path, options);
}

}  // namespace folio::model
