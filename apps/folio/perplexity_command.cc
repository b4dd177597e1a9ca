// folio perplexity: the perplexity of a text file under the model, with sliding windows of a
// context and a stride (the definition is in src/folio/engine/perplexity.h), run through the
// engine's KV cache and graph executor; prints the perplexity and the evaluation speed (text,
// and JSON with --json).
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "apps/folio/commands.h"
#include "apps/folio/engine_options.h"
#include "apps/folio/progress_bar.h"
#include "apps/folio/read_file.h"
#include "folio/engine/perplexity.h"

namespace folio::app {
namespace {

struct PerplexityCommandOptions {
  EngineCommandOptions engine;
  std::string text_path;
  int32_t context = 0;
  int32_t stride = 0;
  std::string json_path;
  std::string adapter;
};

void write_json(const PerplexityCommandOptions& options, const engine::PerplexityResult& result,
                int threads) {
  const nlohmann::json report = {
      {"model", options.engine.model_path},
      {"text_file", options.text_path},
      {"adapter", options.adapter},
      {"tokens", result.num_tokens},
      {"context", result.context},
      {"stride", result.stride},
      {"windows", result.num_windows},
      {"scored_tokens", result.num_scored_tokens},
      {"evaluated_tokens", result.num_evaluated_tokens},
      {"mean_nll", result.mean_nll},
      {"perplexity", result.perplexity},
      {"seconds", result.seconds},
      {"tokens_per_second", result.tokens_per_second()},
      {"graphs", !options.engine.no_graphs},
      {"threads", threads},
  };
  std::ofstream out(options.json_path);
  out << report.dump(2) << "\n";
  if (!out) check_command(internal_error("cannot write {}", options.json_path));
}

void run_perplexity(const PerplexityCommandOptions& options) {
  Result<std::string> text = read_file(options.text_path);
  check_command(text.status());
  if (text->empty()) {
    check_command(invalid_argument("text file '{}' is empty", options.text_path));
  }
  if (options.engine.chunk_size < 1) {
    check_command(invalid_argument("--chunk-size must be at least 1"));
  }
  Result<std::unique_ptr<engine::ModelEngine>> bundle =
      start_model_engine(options.engine, [&](engine::ModelEngineOptions& engine_options) {
        // Every token of a chunk wants its logits; no decode graphs are needed.
        engine_options.max_logit_rows = options.engine.chunk_size;
        engine_options.precapture_seconds = 0;
      });
  check_command(bundle.status());
  engine::ModelEngine& model_engine = **bundle;

  engine::PerplexityOptions perplexity_options;
  perplexity_options.context = options.context;
  perplexity_options.stride = options.stride;
  perplexity_options.chunk_tokens = options.engine.chunk_size;
  Result<int64_t> adapter = resolve_adapter(model_engine, options.adapter);
  check_command(adapter.status());
  perplexity_options.adapter_id = *adapter;
  std::optional<ProgressBar> bar;  // the window count is known at the first window
  perplexity_options.on_window = [&](const engine::PerplexityProgress& progress) {
    if (!bar)
      bar.emplace("perplexity", progress.num_windows, ProgressUnit::kItems, "windows",
                  !options.engine.quiet);
    bar->update(progress.windows_done);
  };
  Result<engine::PerplexityResult> result =
      engine::compute_text_perplexity(model_engine, *text, perplexity_options);
  if (bar) bar->finish();
  check_command(result.status());

  const int threads = model_engine.thread_pool().num_threads();
  std::printf(
      "folio perplexity: %s, %lld tokens, context %d, stride %d, %d windows, graphs %s, "
      "%d threads\n",
      options.text_path.c_str(), static_cast<long long>(result->num_tokens), result->context,
      result->stride, result->num_windows, options.engine.no_graphs ? "off" : "on", threads);
  std::printf("  perplexity  %.4f (mean NLL %.6f nats over %lld scored tokens)\n",
              result->perplexity, result->mean_nll,
              static_cast<long long>(result->num_scored_tokens));
  std::printf("  speed       %.1f tokens/s (%lld tokens evaluated incl. overlap, %.2f s)\n",
              result->tokens_per_second(), static_cast<long long>(result->num_evaluated_tokens),
              result->seconds);
  if (!options.json_path.empty()) write_json(options, *result, threads);
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
  auto options = std::make_shared<PerplexityCommandOptions>();
  CLI::App* command =
      app.add_subcommand("perplexity", "Perplexity of a text file, with sliding windows");
  add_engine_options(*command, options->engine);
  command->add_option("-f,--file", options->text_path, "Text file to evaluate")->required();
  command->add_option("-c,--context", options->context,
                      "Tokens per window (0: the model's context length)");
  command->add_option("--stride", options->stride,
                      "Tokens between window starts (0: half the context)");
  command->add_option("--json", options->json_path, "Also write the result as JSON here");
  command->add_option("--adapter", options->adapter,
                      "Adapter to evaluate (a --lora name, or base; default: the only --lora "
                      "given)");
  command->callback([options] { run_perplexity(*options); });
}

}  // namespace folio::app
