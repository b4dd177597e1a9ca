// folio plan: the pipeline placement of a model over N workers (dist/pipeline_plan.h), printed
// without running anything: layers per worker, weight and KV bytes per worker, weight bytes
// each decode token reads per stage, prefill FLOPs, and the activation bytes crossing each cut
// per token. Fails, saying what is missing, when the model cannot fit the workers' memory.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/folio/commands.h"
#include "folio/dist/pipeline_plan.h"
#include "folio/gguf/gguf_file.h"
#include "folio/model/llama_model_file.h"

namespace folio::app {
namespace {

struct PlanOptions {
  std::string model_path;
  int32_t workers = 0;
  std::vector<int64_t> worker_memory;
  int64_t kv_tokens = 0;
  std::string balance = "decode";
  std::string kv_dtype = "f16";
  int32_t prefill_tokens = 512;
};

void run_plan(const PlanOptions& options) {
  Result<gguf::GgufFile> file = gguf::GgufFile::open(options.model_path);
  check_command(file.status());
  Result<model::LlamaShape> shape = model::read_llama_shape(*file);
  check_command(shape.status());
  const std::optional<DType> kv_dtype = dtype_from_name(options.kv_dtype);
  if (!kv_dtype || (*kv_dtype != DType::kF16 && *kv_dtype != DType::kF32)) {
    check_command(invalid_argument("--kv-dtype must be f16 or f32, got '{}'", options.kv_dtype));
  }
  dist::PipelinePlanOptions plan_options;
  if (options.balance == "decode") {
    plan_options.balance = dist::PipelineBalance::kDecode;
  } else if (options.balance == "prefill") {
    plan_options.balance = dist::PipelineBalance::kPrefill;
  } else {
    check_command(
        invalid_argument("--balance must be decode or prefill, got '{}'", options.balance));
  }
  plan_options.kv_tokens = options.kv_tokens > 0 ? options.kv_tokens : shape->context_length;
  std::vector<dist::PipelineWorker> workers;
  if (!options.worker_memory.empty()) {
    if (options.workers != 0 &&
        options.workers != static_cast<int32_t>(options.worker_memory.size())) {
      check_command(invalid_argument("--workers {} but --worker-memory lists {} workers",
                                     options.workers, options.worker_memory.size()));
    }
    for (size_t w = 0; w < options.worker_memory.size(); ++w) {
      workers.push_back({fmt::format("worker{}", w), options.worker_memory[w]});
    }
  } else {
    for (int32_t w = 0; w < options.workers; ++w) {
      workers.push_back({fmt::format("worker{}", w), std::nullopt});
    }
  }
  Result<dist::PipelineModelCost> cost =
      dist::llama_pipeline_cost(*shape, *kv_dtype, options.prefill_tokens);
  check_command(cost.status());
  Result<dist::PipelinePlan> plan = dist::plan_pipeline(*cost, workers, plan_options);
  check_command(plan.status());
  std::printf("model %s: %lld layers, hidden %lld, KV %s\n", options.model_path.c_str(),
              static_cast<long long>(shape->num_layers), static_cast<long long>(shape->hidden_size),
              options.kv_dtype.c_str());
  std::fputs(plan->to_string().c_str(), stdout);
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command = app.add_subcommand(
      "plan", "Print the pipeline placement of a model over workers (layers, bytes, transfers)");
  command->add_option("-m,--model", options->model_path, "GGUF model file")->required();
  command->add_option("--workers", options->workers, "Number of workers (no memory limit)");
  command
      ->add_option("--worker-memory", options->worker_memory,
                   "Each worker's memory budget in bytes, in pipeline order: BYTES,BYTES,...")
      ->delimiter(',');
  command->add_option("--kv-tokens", options->kv_tokens,
                      "KV tokens every stage holds (default: the model's context length)");
  command->add_option("--balance", options->balance, "Balance decode (bytes) or prefill (FLOPs)")
      ->capture_default_str();
  command->add_option("--kv-dtype", options->kv_dtype, "KV cache element type: f16 or f32")
      ->capture_default_str();
  command
      ->add_option("--prefill-tokens", options->prefill_tokens,
                   "Tokens of the prefill step the FLOPs are counted for")
      ->capture_default_str();
  command->callback([options] {
    if (options->workers <= 0 && options->worker_memory.empty()) {
      check_command(invalid_argument("give --workers N or --worker-memory BYTES,BYTES,..."));
    }
    run_plan(*options);
  });
}

}  // namespace folio::app
