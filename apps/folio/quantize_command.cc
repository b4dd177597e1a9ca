// folio quantize IN.gguf OUT.gguf --type NAME [--threads N]: writes a copy of a model whose
// tensors take the dtypes of a llama.cpp quantization recipe (Q4_K_M, Q8_0, IQ4_XS, F16, ...;
// model/quantization_recipe.h), printing each tensor that falls back to another dtype, with a
// progress bar over the bytes written.
#include <cstdio>
#include <string>
#include <thread>

#include "apps/folio/commands.h"
#include "apps/folio/progress_bar.h"
#include "folio/model/quantize_model.h"

namespace folio::app {
namespace {

struct QuantizeCommandOptions {
  std::string input;
  std::string output;
  std::string type;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool quiet = false;
};

void run_quantize(const QuantizeCommandOptions& options) {
  Result<model::QuantizationRecipe> recipe = model::parse_quantization_recipe(options.type);
  check_command(recipe.status());
  if (options.threads < 1) {
    check_command(invalid_argument("--threads {} must be at least 1", options.threads));
  }
  std::unique_ptr<ProgressBar> bar;
  model::QuantizeOptions quantize;
  quantize.threads = options.threads;
  quantize.on_plan = [&](const model::QuantizationPlan& plan) {
    for (const model::TensorConversion& tensor : plan.tensors) {
      if (!tensor.fell_back_from) continue;
      std::printf("%s: rows of %lld values do not divide %s blocks; using %s\n",
                  tensor.name.c_str(), static_cast<long long>(tensor.dimensions[0]),
                  std::string(dtype_name(*tensor.fell_back_from)).c_str(),
                  std::string(dtype_name(tensor.target)).c_str());
    }
    std::fflush(stdout);
    bar = std::make_unique<ProgressBar>("quantizing", static_cast<int64_t>(plan.total_target_bytes),
                                        ProgressUnit::kBytes, "", !options.quiet);
  };
  quantize.progress = [&](uint64_t done, uint64_t) { bar->update(static_cast<int64_t>(done)); };
  check_command(model::quantize_model_file(options.input, options.output, *recipe, quantize));
  if (bar) bar->finish();
  std::printf("wrote %s (%s)\n", options.output.c_str(),
              std::string(model::quantization_recipe_name(*recipe)).c_str());
}

}  // namespace

void add_quantize_command(CLI::App& app) {
  auto options = std::make_shared<QuantizeCommandOptions>();
  CLI::App* command = app.add_subcommand(
      "quantize", "Write a copy of a GGUF model quantized with a llama.cpp recipe (Q4_K_M, ...)");
  command->add_option("input", options->input, "GGUF model to read")->required();
  command->add_option("output", options->output, "GGUF file to write")->required();
  command->add_option("--type", options->type, "Recipe: " + model::quantization_recipe_names())
      ->required();
  command->add_option("--threads", options->threads, "Threads converting rows")
      ->capture_default_str();
  command->add_flag("-q,--quiet", options->quiet, "No progress bar");
  command->callback([options] { run_quantize(*options); });
}

}  // namespace folio::app
