// folio generate: one prompt through the engine, the text streamed to stdout as it is made.
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>

#include "apps/folio/commands.h"
#include "apps/folio/engine_options.h"

namespace folio::app {
namespace {

struct GenerateOptions {
  EngineCommandOptions engine;
  std::string prompt;
  int32_t max_tokens = 64;
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  uint64_t seed = 0;
  bool seed_given = false;
  std::vector<std::string> stop;
  std::string adapter;
};

void run_generate(const GenerateOptions& options) {
  Result<std::unique_ptr<engine::ModelEngine>> bundle = start_model_engine(options.engine);
  check_command(bundle.status());
  engine::ModelEngine& model_engine = **bundle;
  const tokenizer::Tokenizer& tokenizer = model_engine.model().tokenizer();

  engine::Request request;
  request.prompt = tokenizer.encode(options.prompt);
  request.max_tokens = options.max_tokens;
  request.sampling.temperature = options.temperature;
  request.sampling.top_k = options.top_k;
  request.sampling.top_p = options.top_p;
  request.sampling.min_p = options.min_p;
  request.sampling.repetition_penalty = options.repetition_penalty;
  if (options.seed_given) request.sampling.seed = options.seed;
  request.stop_strings = options.stop;
  Result<int64_t> adapter = resolve_adapter(model_engine, options.adapter);
  check_command(adapter.status());
  request.adapter_id = *adapter;

  std::mutex mutex;
  std::condition_variable finished_signal;
  std::optional<engine::Completion> completion;
  request.on_token = [](const engine::TokenEvent& event) {
    std::fwrite(event.text.data(), 1, event.text.size(), stdout);
    std::fflush(stdout);
  };
  request.on_finish = [&](const engine::Completion& done) {
    std::lock_guard lock(mutex);
    completion = done;
    finished_signal.notify_all();
  };
  std::fputs(options.prompt.c_str(), stdout);
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();
  model_engine.engine().start();
  check_command(model_engine.engine().submit(std::move(request)).status());
  {
    std::unique_lock lock(mutex);
    finished_signal.wait(lock, [&] { return completion.has_value(); });
  }
  model_engine.engine().stop();
  std::fputs("\n", stdout);
  std::fflush(stdout);  // the summary goes to stderr: keep it after the text when piped
  check_command(completion->error);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double ttft = std::chrono::duration<double>(completion->timing.time_to_first_token).count();
  std::fprintf(stderr,
               "[%d prompt tokens, %d generated, finish: %s; first token %.1f ms, %.1f tokens/s "
               "overall]\n",
               completion->num_prompt_tokens, completion->num_generated_tokens,
               std::string(engine::finish_reason_name(completion->reason)).c_str(), ttft * 1e3,
               completion->num_generated_tokens / seconds);
  if (const int64_t recoveries = model_engine.engine().stats().recoveries; recoveries > 0) {
    std::fprintf(stderr, "[recovered from a lost worker %lld time%s]\n",
                 static_cast<long long>(recoveries), recoveries == 1 ? "" : "s");
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto options = std::make_shared<GenerateOptions>();
  CLI::App* command = app.add_subcommand("generate", "Generate text from a prompt");
  add_engine_options(*command, options->engine);
  command->add_option("-p,--prompt", options->prompt, "Prompt text")->required();
  command->add_option("-n,--max-tokens", options->max_tokens, "Tokens to generate")
      ->capture_default_str();
  command->add_option("--temperature", options->temperature, "0: greedy")->capture_default_str();
  command->add_option("--top-k", options->top_k, "Keep the k most likely tokens (0: all)");
  command->add_option("--top-p", options->top_p, "Nucleus sampling mass");
  command->add_option("--min-p", options->min_p, "Drop tokens below min-p x the most likely");
  command->add_option("--repetition-penalty", options->repetition_penalty, "1: off");
  command->add_option("--seed", options->seed, "Sampling seed")
      ->each([options](const std::string&) { options->seed_given = true; });
  command->add_option("--stop", options->stop, "Stop string (repeatable)");
  command->add_option("--adapter", options->adapter,
                      "Adapter to generate with (a --lora name, or base; default: the only "
                      "--lora given)");
  command->callback([options] { run_generate(*options); });
}

}  // namespace folio::app
