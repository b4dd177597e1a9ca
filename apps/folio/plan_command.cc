// folio plan: the placement of a model over N workers, printed without running anything.
// --placement pp (dist/pipeline_plan.h): layers per worker, weight and KV bytes per worker,
// weight bytes each decode token reads per stage, prefill FLOPs, and the activation bytes
// crossing each cut per token. --placement tp (dist/tensor_parallel_plan.h): heads, KV heads
// and FFN features per worker, bytes per worker (split and replicated), and the all-reduce
// bytes per token. --placement auto: both, and the one the cost model chose, with why.
// --kv-parallel N: a KV-parallel group instead (dist.md "KV-parallel groups"): positions, KV and
// weight bytes per member, and the bytes each member receives per token. Fails,
// saying what is missing, when the model cannot fit the workers' memory or cannot be split.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/folio/commands.h"
#include "folio/dist/pipeline_plan.h"
#include "folio/dist/pipeline_stage.h"
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
  // A KV-parallel group of this many members (1: none), each holding kv_tokens_per_member
  // positions of every sequence (0: the KV tokens split evenly, in whole blocks).
  int32_t kv_parallel = 1;
  int32_t kv_tokens_per_member = 0;
  int32_t block_size = 16;
};

// The KV-parallel group of `options.kv_parallel` members over `workers`: every member holds the
// whole model and its range of each sequence's KV; per token and layer each member receives the
// other members' partial attention (heads x (head_dim + 1) f32).
void print_kv_parallel_plan(const PlanOptions& options, const model::LlamaShape& shape,
                            DType kv_dtype, int64_t kv_tokens,
                            const std::vector<dist::PipelineWorker>& workers) {
  const int32_t members = options.kv_parallel;
  if (static_cast<int32_t>(workers.size()) != members) {
    check_command(invalid_argument(
        "--kv-parallel {} needs one worker per member, got {} (KV-parallel groups and pipeline "
        "stages do not combine yet)",
        members, workers.size()));
  }
  if (options.placement != "pp") {
    check_command(invalid_argument(
        "--kv-parallel with --placement {}: KV-parallel groups and tensor splits do not combine "
        "yet",
        options.placement));
  }
  if (options.block_size <= 0 || options.kv_tokens_per_member % options.block_size != 0) {
    check_command(invalid_argument("--kv-tokens-per-member {} is not a multiple of --block-size {}",
                                   options.kv_tokens_per_member, options.block_size));
  }
  int64_t per_member = options.kv_tokens_per_member;
  if (per_member == 0) {
    const int64_t blocks = (kv_tokens + options.block_size - 1) / options.block_size;
    per_member = (blocks + members - 1) / members * options.block_size;
  }
  const int64_t element_bytes = kv_dtype == DType::kF32 ? 4 : 2;
  const int64_t kv_bytes_per_token = 2 * shape.num_layers * shape.kv_dim() * element_bytes;
  Result<int64_t> weight_bytes = dist::llama_stage_weight_bytes(shape, 0, shape.num_layers);
  check_command(weight_bytes.status());
  const int64_t kv_bytes = kv_bytes_per_token * per_member;
  const int64_t received =
      int64_t{members - 1} * shape.num_layers * shape.num_heads * (shape.head_dim() + 1) * 4;
  std::printf(
      "KV-parallel group of %d members: %lld positions of each sequence per member (a context "
      "of %lld), blocks of %d\n",
      members, static_cast<long long>(per_member), static_cast<long long>(per_member * members),
      options.block_size);
  for (int32_t g = 0; g < members; ++g) {
    const dist::PipelineWorker& worker = workers[static_cast<size_t>(g)];
    std::printf(
        "  member %d on %s: positions [%lld, %lld), %.1f MiB of weights (the whole "
        "model), %.1f KiB of KV for one sequence's range\n",
        g, worker.name.c_str(), static_cast<long long>(g * per_member),
        static_cast<long long>((g + 1) * per_member),
        static_cast<double>(*weight_bytes) / (1 << 20), static_cast<double>(kv_bytes) / (1 << 10));
    if (worker.memory_bytes && *worker.memory_bytes < *weight_bytes + kv_bytes) {
      check_command(resource_exhausted(
          "member {} needs {} bytes ({} of weights, {} of KV), more than its worker's {}: "
          "give more members or fewer --kv-tokens-per-member",
          g, *weight_bytes + kv_bytes, *weight_bytes, kv_bytes, *worker.memory_bytes));
    }
  }
  std::printf(
      "  per token: %lld all_gathers (one per layer); each member receives %lld bytes "
      "(%d other members x %lld heads x %lld floats x 4 per layer) and sends %lld to "
      "each other member\n",
      static_cast<long long>(shape.num_layers), static_cast<long long>(received), members - 1,
      static_cast<long long>(shape.num_heads), static_cast<long long>(shape.head_dim() + 1),
      static_cast<long long>(received / std::max(1, members - 1)));
}

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
  if (options.kv_parallel > 1) {
    print_kv_parallel_plan(options, *shape, *kv_dtype, plan_options.kv_tokens, workers);
    return;
  }
  if (options.kv_tokens_per_member > 0) {
    check_command(invalid_argument("--kv-tokens-per-member needs --kv-parallel N (N > 1)"));
  }
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
  command
      ->add_option("--kv-parallel", options->kv_parallel,
                   "Plan a KV-parallel group of this many workers instead: each holds the whole "
                   "model and a range of every sequence's KV")
      ->capture_default_str();
  command->add_option("--kv-tokens-per-member", options->kv_tokens_per_member,
                      "Positions of each sequence a KV-parallel member holds (0: --kv-tokens "
                      "split evenly in whole blocks)");
  command->add_option("--block-size", options->block_size, "Tokens per KV block")
      ->capture_default_str();
  command->callback([options] {
    if (options->workers <= 0 && options->worker_memory.empty()) {
      check_command(invalid_argument("give --workers N or --worker-memory BYTES,BYTES,..."));
    }
    run_plan(*options);
  });
}

}  // namespace folio::app
