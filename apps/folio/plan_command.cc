// folio plan: the placement of a model over N workers, printed without running anything.
// --placement pp (dist/pipeline_plan.h): layers per worker, weight and KV bytes per worker,
// weight bytes each decode token reads per stage, prefill FLOPs, and the activation bytes
// crossing each cut per token. --placement tp (dist/tensor_parallel_plan.h): heads, KV heads
// and FFN features per worker, bytes per worker (split and replicated), and the all-reduce
// bytes per token. --placement auto: both, and the one the cost model chose, with why. Fails,
// saying what is missing, when the model cannot fit the workers' memory or cannot be split.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/folio/commands.h"
#include "folio/dist/pipeline_plan.h"
#include "folio/dist/tensor_parallel_plan.h"
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
  std::string placement = "pp";
  // The cost model of --placement auto (dist::PlacementCostModel).
  double memory_gbps = 10.0;
  double link_latency_us = 100.0;
  double link_gbps = 1.0;
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
  Result<dist::Placement> placement = dist::parse_placement(options.placement);
  check_command(placement.status());
  std::printf("model %s: %lld layers, hidden %lld, %lld heads, %lld KV heads, FFN %lld, KV %s\n",
              options.model_path.c_str(), static_cast<long long>(shape->num_layers),
              static_cast<long long>(shape->hidden_size), static_cast<long long>(shape->num_heads),
              static_cast<long long>(shape->num_kv_heads), static_cast<long long>(shape->ffn_size),
              options.kv_dtype.c_str());
  Result<dist::PipelinePlan> pipeline = invalid_argument("not planned");
  if (*placement != dist::Placement::kTensor) {
    Result<dist::PipelineModelCost> cost =
        dist::llama_pipeline_cost(*shape, *kv_dtype, options.prefill_tokens);
    check_command(cost.status());
    pipeline = dist::plan_pipeline(*cost, workers, plan_options);
  }
  Result<dist::TensorParallelPlan> tensor = invalid_argument("not planned");
  if (*placement != dist::Placement::kPipeline) {
    tensor = dist::plan_tensor_parallel(
        *shape, workers, {.kv_dtype = *kv_dtype, .kv_tokens = plan_options.kv_tokens});
  }
  switch (*placement) {
    case dist::Placement::kPipeline:
      check_command(pipeline.status());
      std::fputs(pipeline->to_string().c_str(), stdout);
      return;
    case dist::Placement::kTensor:
      check_command(tensor.status());
      std::fputs(tensor->to_string().c_str(), stdout);
      return;
    case dist::Placement::kAuto:
      break;
  }
  const dist::PlacementCostModel cost_model{.memory_bytes_per_second = options.memory_gbps * 1e9,
                                            .link_latency_seconds = options.link_latency_us * 1e-6,
                                            .link_bytes_per_second = options.link_gbps * 1e9};
  Result<dist::PlacementChoice> choice = dist::choose_placement(pipeline, tensor, cost_model);
  check_command(choice.status());
  if (pipeline.ok()) std::fputs(pipeline->to_string().c_str(), stdout);
  if (tensor.ok()) std::fputs(tensor->to_string().c_str(), stdout);
  std::printf("placement auto chose %s\n", choice->reason.c_str());
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto options = std::make_shared<PlanOptions>();
  CLI::App* command = app.add_subcommand(
      "plan",
      "Print the placement of a model over workers: pipeline (layers), tensor (heads), or the "
      "cheaper by the cost model (bytes per worker, transfers per token)");
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
  command
      ->add_option("--placement", options->placement,
                   "pp (layers over workers), tp (heads and FFN features over workers) or auto "
                   "(the cheaper decode token by the cost model)")
      ->capture_default_str();
  command
      ->add_option("--memory-gbps", options->memory_gbps,
                   "Cost model of --placement auto: each worker's memory read bandwidth, GB/s")
      ->capture_default_str();
  command
      ->add_option("--link-latency-us", options->link_latency_us,
                   "Cost model of --placement auto: one message between workers, us")
      ->capture_default_str();
  command
      ->add_option("--link-gbps", options->link_gbps,
                   "Cost model of --placement auto: bandwidth between workers, GB/s")
      ->capture_default_str();
  command->callback([options] {
    if (options->workers <= 0 && options->worker_memory.empty()) {
      check_command(invalid_argument("give --workers N or --worker-memory BYTES,BYTES,..."));
    }
    run_plan(*options);
  });
}

}  // namespace folio::app
