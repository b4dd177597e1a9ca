// folio_structured_output_tpot: what structured output costs per generated token, end to end.
// The same batch of requests runs through a ModelEngine with and without a JSON schema
// constraint (StructuredOutput over the model's vocabulary), alternating in the same run, and
// the mean time per output token of each is compared. Not a timed test: it prints the figures.
//
// Usage: folio_structured_output_tpot --model FILE [--batches 1,32] [--tokens 64] [--passes 3]
// Requests ignore EOS and the constrained ones use a schema whose answers are long (an array
// of up to 64 objects), so both runs generate about --tokens tokens per request.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <vector>

#include <CLI/CLI.hpp>

#include "folio/engine/model_engine.h"
#include "folio/model/llama_model.h"
#include "folio/server/json_schema_grammar.h"
#include "folio/server/structured_output.h"
#include "folio/server/vocabulary_index.h"

namespace {

using namespace folio;

constexpr std::string_view kSchema = R"({"type": "object", "properties": {
  "items": {"type": "array", "maxItems": 64, "items": {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "count": {"type": "integer"},
    "kind": {"enum": ["tool", "food", "book"]},
    "fresh": {"type": "boolean"}}, "required": ["name", "count", "kind", "fresh"]}}},
  "required": ["items"]})";

struct PassResult {
  double mean_tpot_ms = 0;
  double tokens = 0;
};

// Runs `batch` requests at once; returns the mean of their mean TPOTs.
PassResult run_pass(engine::ModelEngine& model_engine, int32_t batch, int32_t tokens,
                    const std::shared_ptr<const server::Grammar>& grammar,
                    const std::shared_ptr<const server::VocabularyIndex>& vocabulary, uint64_t seed,
                    float temperature) {
  std::mutex mutex;
  std::condition_variable done;
  int32_t finished = 0;
  double tpot_sum = 0, token_sum = 0;
  const std::vector<int32_t> prompt = model_engine.model().tokenizer().encode("List the things:");
  for (int32_t index = 0; index < batch; ++index) {
    engine::Request request;
    request.prompt = prompt;
    request.max_tokens = tokens;
    request.ignore_eos = true;
    request.sampling.temperature = temperature;
    request.sampling.seed = seed + static_cast<uint64_t>(index);
    if (grammar != nullptr) {
      request.constraint = std::move(*server::make_structured_output(
          grammar, vocabulary, vocabulary->end_of_generation_tokens()));
    }
    request.on_finish = [&](const engine::Completion& completion) {
      std::lock_guard lock(mutex);
      tpot_sum += std::chrono::duration<double, std::milli>(completion.timing.time_per_output_token)
                      .count();
      token_sum += completion.num_generated_tokens;
      ++finished;
      done.notify_all();
    };
    FOLIO_CHECK(model_engine.engine().submit(std::move(request)).ok());
  }
  std::unique_lock lock(mutex);
  done.wait(lock, [&] { return finished == batch; });
  return PassResult{tpot_sum / batch, token_sum / batch};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Structured output's cost per generated token, with and without the constraint"};
  std::string model_path;
  std::vector<int32_t> batches = {1, 32};
  int32_t tokens = 64;
  int32_t passes = 3;
  int32_t threads = 2;
  float temperature = 1.0f;
  app.add_option("--model", model_path, "GGUF model")->required();
  app.add_option("--batches", batches, "Concurrent requests per pass")->delimiter(',');
  app.add_option("--tokens", tokens, "max_tokens per request");
  app.add_option("--passes", passes, "Passes of each kind, alternating");
  app.add_option("--threads", threads, "Engine threads");
  app.add_option("--temperature", temperature,
                 "Sampling temperature (0: greedy; sampling at 1 sorts every allowed token, so "
                 "a mask that leaves few makes the draw cheaper)");
  CLI11_PARSE(app, argc, argv);

  Result<std::unique_ptr<model::LlamaModel>> model = model::LlamaModel::open(model_path);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
    return 1;
  }
  engine::ModelEngineOptions options;
  options.num_threads = threads;
  options.scheduler.max_num_sequences =
      std::max(64, *std::max_element(batches.begin(), batches.end()));
  Result<std::unique_ptr<engine::ModelEngine>> model_engine =
      engine::ModelEngine::create(std::move(*model), options);
  if (!model_engine.ok()) {
    std::fprintf(stderr, "%s\n", model_engine.status().to_string().c_str());
    return 1;
  }
  (*model_engine)->engine().start();
  auto vocabulary =
      std::move(server::VocabularyIndex::create((*model_engine)->model().tokenizer()).value());
  auto grammar = std::make_shared<const server::Grammar>(
      std::move(server::compile_json_schema(kSchema).value()));
  // Warm-up: graphs captured, caches filled.
  run_pass(**model_engine, 4, 8, nullptr, vocabulary, 1, temperature);
  run_pass(**model_engine, 4, 8, grammar, vocabulary, 1, temperature);
  std::printf("batch  tokens/request  TPOT plain (ms)  TPOT constrained (ms)  ratio\n");
  for (int32_t batch : batches) {
    std::vector<double> plain, constrained;
    double plain_tokens = 0, constrained_tokens = 0;
    for (int32_t pass = 0; pass < passes; ++pass) {
      const PassResult without =
          run_pass(**model_engine, batch, tokens, nullptr, vocabulary, 100 + pass, temperature);
      const PassResult with =
          run_pass(**model_engine, batch, tokens, grammar, vocabulary, 100 + pass, temperature);
      plain.push_back(without.mean_tpot_ms);
      constrained.push_back(with.mean_tpot_ms);
      plain_tokens += without.tokens / passes;
      constrained_tokens += with.tokens / passes;
    }
    std::sort(plain.begin(), plain.end());
    std::sort(constrained.begin(), constrained.end());
    const double plain_median = plain[plain.size() / 2];
    const double constrained_median = constrained[constrained.size() / 2];
    std::printf("%5d  %6.1f / %6.1f  %15.3f  %21.3f  %5.3f\n", batch, plain_tokens,
                constrained_tokens, plain_median, constrained_median,
                constrained_median / plain_median);
  }
  (*model_engine)->engine().stop();
  return 0;
}
