#include "folio/engine/model_engine.h"

#include <algorithm>

#include "folio/base/log.h"
#include "folio/device/host_virtual_memory.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/bucket_policy.h"

namespace folio::engine {
namespace {

int32_t ceil_div(int32_t a, int32_t b) {
  return (a + b - 1) / b;
}

// The copier of an engine whose KV caches live with a remote runner (a pipeline of workers):
// copy-on-write copies go to the runner (StepRunner::copy_blocks, which copies them in every
// stage's cache); swap copies are refused, since host swap is not relayed to workers
// (ModelEngine::create refuses swap space with a remote runner, so they never come). The runner
// is created after the block manager (it needs the executor's layout), hence the indirection.
class RemoteKvBlockCopier final : public kv::KvBlockCopier {
 public:
  explicit RemoteKvBlockCopier(const std::unique_ptr<StepRunner>& runner) : runner_(runner) {}

  Status copy_blocks(const kv::KvLayoutNumbers&, std::span<const kv::BlockCopy> copies) override {
    if (runner_ == nullptr) {
      return failed_precondition(
          "{} copy-on-write KV block copies before the remote step runner "
          "exists",
          copies.size());
    }
    return runner_->copy_blocks(copies);
  }
  Status copy_to_host(const kv::KvLayoutNumbers&, kv::HostSwapSpace&,
                      std::span<const kv::BlockCopy> copies) override {
    return refuse_swap("swap-out", copies.size());
  }
  Status copy_to_device(const kv::KvLayoutNumbers&, const kv::HostSwapSpace&,
                        std::span<const kv::BlockCopy> copies) override {
    return refuse_swap("swap-in", copies.size());
  }

 private:
  static Status refuse_swap(std::string_view kind, size_t count) {
    return failed_precondition(
        "{} {} KV block copies: the KV caches live on the pipeline's workers, and host swap "
        "with workers is not supported; run without swap space (no --swap-mib)",
        count, kind);
  }

  const std::unique_ptr<StepRunner>& runner_;
};

}  // namespace

ModelEngine::~ModelEngine() {
  // The engine stops first (it ends unfinished requests), then the block manager gives its
  // pages back before the page source and the pool go.
  engine_.reset();
  remote_runner_.reset();
  pressure_.reset();
  calibrating_runner_.reset();
  runner_.reset();
  executor_.reset();
  kv_parallel_cache_.reset();
  member_managers_.clear();
  member_sources_.clear();
  block_manager_.reset();
  // Hot adapters hold pool pages.
  adapters_.reset();
}

Status ModelEngine::build_memory(const ModelEngineOptions& options) {
  if (options.page_bytes <= 0 || options.memory_budget_bytes < options.page_bytes) {
    return invalid_argument("memory budget {} B must hold at least one page of {} B",
                            options.memory_budget_bytes, options.page_bytes);
  }
  FOLIO_ASSIGN_OR_RETURN(virtual_memory_, device::make_host_virtual_memory());
  memory::PagePoolOptions pool_options;
  pool_options.name = "model";
  pool_options.page_size = static_cast<size_t>(options.page_bytes);
  pool_options.num_pages = options.memory_budget_bytes / options.page_bytes;
  pool_options.metrics = &registry_;
  FOLIO_ASSIGN_OR_RETURN(pool_, memory::PagePool::create(*virtual_memory_, pool_options));
  arena_ = exec::MultiShapeArena::create(std::make_unique<exec::PoolArenaMemory>(*pool_, 1));
  if (options.kv_cache_bytes < 0) {
    return invalid_argument("KV cache cap {} B must be positive (or 0 for no cap)",
                            options.kv_cache_bytes);
  }
  const int64_t kv_cap_pages =
      options.kv_cache_bytes == 0
          ? 0
          : std::max<int64_t>(1, options.kv_cache_bytes / options.page_bytes);
  if (options.remote_runner) {
    copier_ = std::make_unique<RemoteKvBlockCopier>(remote_runner_);
  } else {
    copier_ = std::make_unique<kv::HostKvBlockCopier>();
  }
  page_source_ = std::make_unique<kv::PoolPageSource>(
      *pool_, 2, static_cast<int32_t>(std::min<int64_t>(kv_cap_pages, pool_options.num_pages)));

  const model::LlamaShape& shape = model_->shape();
  kv::BlockManagerOptions kv_options;
  kv_options.geometry = model_->kv_cache_geometry(options.block_size, options.kv_dtype);
  kv_options.watermark = options.kv_watermark;
  // Enough padding blocks for the bucket ladder's largest padding (the executor checks it).
  FOLIO_ASSIGN_OR_RETURN(const exec::BucketPolicy ladder,
                         exec::BucketPolicy::create(exec::BucketPolicy::default_ladder()));
  kv_options.num_dummy_blocks = std::max(1, ceil_div(ladder.max_padding(), options.block_size));
  kv_options.max_context_tokens = options.max_context_tokens > 0
                                      ? options.max_context_tokens
                                      : static_cast<int32_t>(shape.context_length);
  if (options.swap_bytes > 0) {
    const int64_t block_bytes = kv_options.geometry.block_bytes();
    swap_space_ = std::make_unique<kv::HostSwapSpace>(
        block_bytes, static_cast<int32_t>(options.swap_bytes / block_bytes));
  }
  FOLIO_ASSIGN_OR_RETURN(block_manager_, kv::BlockManager::create(kv_options, *page_source_,
                                                                  *copier_, swap_space_.get()));
  return Status();
}

Status ModelEngine::build_executor(const ModelEngineOptions& options) {
  const kv::BlockManagerOptions& kv_options = block_manager_->options();
  const kv::KvLayoutNumbers numbers = block_manager_->layout();
  const int64_t num_blocks = int64_t{page_source_->capacity_pages()} * numbers.blocks_per_page;
  const int32_t max_blocks_per_sequence =
      ceil_div(kv_options.max_context_tokens, kv_options.geometry.block_size);
  const ir::KvCacheShape kv_cache{kv_options.geometry, num_blocks, max_blocks_per_sequence};

  exec::ExecutorOptions executor_options;
  executor_options.name = "model";
  executor_options.max_sequences = options.scheduler.max_num_sequences;
  executor_options.max_logit_rows = options.max_logit_rows;
  executor_options.max_num_tokens = std::max(options.scheduler.max_num_batched_tokens,
                                             exec::BucketPolicy::default_ladder().back());
  executor_options.first_dummy_block = block_manager_->dummy_block().value();
  executor_options.num_dummy_blocks = block_manager_->num_dummy_blocks();
  executor_options.mode =
      options.use_graphs ? exec::ExecutionMode::kGraph : exec::ExecutionMode::kEager;
  executor_options.metrics = &registry_;
  if (options.profile) {
    profile_ = std::make_unique<exec::OpProfile>();
    executor_options.profile = profile_.get();
  }
  exec::ExecutorResources resources{*thread_pool_, *arena_, *pool_, model_->weights(),
                                    exec::KvCacheBinding{numbers, num_blocks, 0}};
  model::LlamaGraphOptions graph_options;
  if (options.adapters) {
    lora::AdapterManagerOptions adapter_options = options.adapter_options;
    adapter_options.max_sequences = options.scheduler.max_num_sequences;
    adapter_options.metrics = &registry_;
    FOLIO_ASSIGN_OR_RETURN(adapters_,
                           lora::AdapterManager::create(model_->shape(), *pool_, adapter_options));
    resources.adapters = adapters_->table_binding();
    graph_options.adapters = true;
  }
  FOLIO_ASSIGN_OR_RETURN(
      executor_, exec::Executor::create(model_->graph_factory(kv_cache, graph_options), resources,
                                        executor_options));
  // With a remote runner the local executor runs no step: nothing to capture ahead.
  if (options.use_graphs && options.precapture_seconds > 0 && !options.remote_runner) {
    const ir::StepPhase decode = ir::StepPhase::kDecode;
    FOLIO_RETURN_IF_ERROR(
        executor_->precapture(std::span(&decode, 1), options.precapture_seconds).status());
  }
  runner_ = std::make_unique<ModelStepRunner>(*executor_, adapters_.get(), pool_.get());
  remote_setup_ = RemoteStepSetup{.num_kv_blocks = num_blocks,
                                  .block_size = kv_options.geometry.block_size,
                                  .max_blocks_per_sequence = max_blocks_per_sequence,
                                  .kv_dtype = kv_options.geometry.dtype,
                                  .first_dummy_block = executor_options.first_dummy_block,
                                  .num_dummy_blocks = executor_options.num_dummy_blocks,
                                  .bucket_ladder = executor_options.bucket_ladder,
                                  .max_num_tokens = executor_options.max_num_tokens,
                                  .max_sequences = executor_options.max_sequences,
                                  .max_logit_rows = executor_options.max_logit_rows,
                                  .use_graphs = options.use_graphs,
                                  .registry = &registry_};
  return Status();
}

Status ModelEngine::build_kv_parallel(const ModelEngineOptions& options) {
  const int32_t members = options.kv_parallel_members;
  const kv::BlockManagerOptions& local = block_manager_->options();
  const int32_t block_size = local.geometry.block_size;
  const int32_t tokens_per_member =
      options.kv_tokens_per_member > 0
          ? options.kv_tokens_per_member
          : ceil_div(ceil_div(local.max_context_tokens, members), block_size) * block_size;
  if (tokens_per_member % block_size != 0) {
    return invalid_argument(
        "kv_tokens_per_member {} is not a multiple of the block size {}; round it to whole "
        "blocks",
        tokens_per_member, block_size);
  }
  kv::BlockManagerOptions member_options = local;
  member_options.max_context_tokens = tokens_per_member;
  const int64_t block_bytes = local.geometry.block_bytes();
  const int64_t blocks_per_page = options.page_bytes / block_bytes;
  const auto num_pages =
      static_cast<int32_t>(std::max<int64_t>(1, options.kv_cache_bytes / options.page_bytes));
  std::vector<kv::BlockManager*> managers;
  for (int32_t member = 0; member < members; ++member) {
    // Pages the coordinator never writes: the KV lives in the members; untouched, the
    // allocation stays virtual.
    member_sources_.push_back(
        std::make_unique<kv::FixedPageSource>(blocks_per_page * block_bytes, num_pages));
    FOLIO_ASSIGN_OR_RETURN(std::unique_ptr<kv::BlockManager> manager,
                           kv::BlockManager::create(member_options, *member_sources_.back(),
                                                    *copier_, /*swap_space=*/nullptr));
    // Every member's padding blocks must be the ids the runner is told (RemoteStepSetup).
    if (member > 0 && manager->dummy_block() != member_managers_.front()->dummy_block()) {
      return internal_error("KV-parallel members reserve different padding blocks");
    }
    managers.push_back(manager.get());
    member_managers_.push_back(std::move(manager));
  }
  FOLIO_ASSIGN_OR_RETURN(kv_parallel_cache_,
                         kv::KvParallelCache::create(managers, tokens_per_member));
  remote_setup_.num_kv_blocks = int64_t{num_pages} * blocks_per_page;
  remote_setup_.max_blocks_per_sequence = tokens_per_member / block_size;
  remote_setup_.first_dummy_block = member_managers_.front()->dummy_block().value();
  remote_setup_.num_dummy_blocks = member_managers_.front()->num_dummy_blocks();
  remote_setup_.kv_parallel_members = members;
  remote_setup_.kv_tokens_per_member = tokens_per_member;
  log::info("KV-parallel group: {} members of {} tokens ({} blocks each), context {} tokens",
            members, tokens_per_member, remote_setup_.num_kv_blocks,
            kv_parallel_cache_->max_context_tokens());
  return Status();
}

Result<SchedulerOptions> ModelEngine::fit_steps_to_memory(const ModelEngineOptions& options) {
  SchedulerOptions scheduler = options.scheduler;
  if (!(options.max_step_memory_fraction > 0.0 && options.max_step_memory_fraction <= 1.0)) {
    return invalid_argument("the share of the budget one step may take, {}, must be in (0, 1]",
                            options.max_step_memory_fraction);
  }
  const double allowed =
      options.max_step_memory_fraction * static_cast<double>(options.memory_budget_bytes);
  int32_t tokens = scheduler.max_num_batched_tokens;
  const int32_t smallest = std::max(1, scheduler.max_num_sequences);
  while (true) {
    FOLIO_ASSIGN_OR_RETURN(const int64_t bytes,
                           executor_->step_activation_bytes(tokens, ir::StepPhase::kPrefill));
    if (static_cast<double>(bytes) <= allowed) break;
    if (tokens <= smallest) {
      return resource_exhausted(
          "a step of {} tokens needs {:.1f} MiB of activations, more than {:.0f}% of the {} MiB "
          "memory budget; give the engine more memory or run fewer sequences at once",
          tokens, static_cast<double>(bytes) / (1 << 20), 100 * options.max_step_memory_fraction,
          options.memory_budget_bytes >> 20);
    }
    tokens = std::max(smallest, tokens / 2);
  }
  if (tokens < scheduler.max_num_batched_tokens) {
    log::info(
        "steps cut to {} tokens (from {}) so that one step's activations fit {:.0f}% of the "
        "{} MiB memory budget",
        tokens, scheduler.max_num_batched_tokens, 100 * options.max_step_memory_fraction,
        options.memory_budget_bytes >> 20);
    scheduler.max_num_batched_tokens = tokens;
    scheduler.prefill_chunk_size = std::min(scheduler.prefill_chunk_size, tokens);
  }
  return scheduler;
}

Status ModelEngine::build_preemption_cost(const ModelEngineOptions& options) {
  // With a swap space in any mode: kCheaper decides by it, and the others may be told to
  // (Scheduler::set_prefer_cheaper_preemption, at critical memory pressure).
  if (swap_space_ == nullptr) return Status();
  const kv::BlockManagerOptions& kv_options = block_manager_->options();
  const int32_t block_size = kv_options.geometry.block_size;
  // Prefill graphs of one sequence at powers of two up to the context limit; each graph's
  // block-table width covers just its tokens, so paged attention's cost bound (over the table's
  // capacity, ir/cost.h) is the prefill's own.
  std::vector<int32_t> token_counts;
  for (int64_t count = block_size; count < kv_options.max_context_tokens; count *= 2) {
    token_counts.push_back(static_cast<int32_t>(count));
  }
  token_counts.push_back(kv_options.max_context_tokens);
  model::LlamaGraphOptions graph_options;
  graph_options.adapters = options.adapters;
  const int32_t num_dummy_blocks = block_manager_->num_dummy_blocks();
  auto prefill_graph = [&](int32_t num_tokens) -> Result<ir::Graph> {
    const int32_t num_blocks = ceil_div(num_tokens, block_size);
    const ir::KvCacheShape kv_cache{kv_options.geometry, int64_t{num_blocks} + num_dummy_blocks,
                                    num_blocks};
    const ir::StepShape shape{num_tokens, 1, 1, ir::StepPhase::kPrefill};
    return model_->graph_factory(kv_cache, graph_options)(shape);
  };
  FOLIO_ASSIGN_OR_RETURN(RecomputeCostCurve curve,
                         RecomputeCostCurve::from_step_graphs(prefill_graph, token_counts));
  PreemptionRates rates;
  rates.host_copy_bytes_per_second = kv::measure_host_copy_bytes_per_second();
  // A copy reads and writes each byte: the memory traffic a step can move per second.
  rates.memory_bytes_per_second = 2 * rates.host_copy_bytes_per_second;
  FOLIO_ASSIGN_OR_RETURN(
      preemption_cost_,
      PreemptionCostModel::create(std::move(curve), kv_options.geometry.block_bytes(), rates));
  calibrating_runner_ = std::make_unique<CostCalibratingStepRunner>(*runner_, *preemption_cost_);
  return Status();
}

Result<std::unique_ptr<ModelEngine>> ModelEngine::create(std::unique_ptr<model::LlamaModel> model,
                                                         const ModelEngineOptions& options) {
  if (options.num_threads < 1) {
    return invalid_argument("thread count must be at least 1, got {}", options.num_threads);
  }
  if (options.remote_runner && (options.adapters || options.swap_bytes > 0)) {
    return invalid_argument(
        "a remote step runner serves the base model without swap space: adapters and swap are "
        "not relayed to pipeline workers yet");
  }
  if (options.kv_parallel_members < 1) {
    return invalid_argument("kv_parallel_members must be at least 1, got {}",
                            options.kv_parallel_members);
  }
  const bool kv_parallel = options.kv_parallel_members > 1;
  if (kv_parallel) {
    if (!options.remote_runner) {
      return invalid_argument(
          "a KV-parallel group of {} members needs a remote_runner that runs the members (worker "
          "processes, or executors on threads); set kv_parallel_members to 1 to run locally",
          options.kv_parallel_members);
    }
    if (options.kv_cache_bytes <= 0) {
      return invalid_argument(
          "a KV-parallel group needs kv_cache_bytes set to each member's KV cache size (its "
          "members' caches are not in the local pool)");
    }
    if (options.scheduler.preemption_mode != PreemptionMode::kRecompute) {
      return invalid_argument(
          "a KV-parallel group preempts by recompute only (its members' swaps are not "
          "coordinated); set scheduler.preemption_mode to recompute");
    }
  }
  std::unique_ptr<ModelEngine> bundle(new ModelEngine());
  bundle->model_ = std::move(model);
  bundle->thread_pool_ = std::make_unique<ThreadPool>(options.num_threads);
  FOLIO_RETURN_IF_ERROR(bundle->build_memory(options));
  FOLIO_RETURN_IF_ERROR(bundle->build_executor(options));
  if (kv_parallel) FOLIO_RETURN_IF_ERROR(bundle->build_kv_parallel(options));
  FOLIO_RETURN_IF_ERROR(bundle->build_preemption_cost(options));
  if (options.remote_runner) {
    FOLIO_ASSIGN_OR_RETURN(bundle->remote_runner_, options.remote_runner(bundle->remote_setup_));
  }

  EngineOptions engine_options;
  FOLIO_ASSIGN_OR_RETURN(engine_options.scheduler, bundle->fit_steps_to_memory(options));
  engine_options.phase_tuner = options.phase_tuner;
  engine_options.seed = options.seed;
  engine_options.max_recoveries_per_request = options.max_recoveries_per_request;
  engine_options.replay_lost_stages = options.replay_lost_stages;
  engine_options.recovery_retry_interval = options.recovery_retry_interval;
  if (std::optional<tokenizer::TokenId> eos = bundle->model_->tokenizer().eos()) {
    engine_options.eos_token = static_cast<int32_t>(*eos);
  }
  if (options.pressure.enabled) {
    PressureSources sources;
    sources.pool = bundle->pool_.get();
    sources.block_manager = bundle->block_manager_.get();
    // A group's KV utilization is its members' (summed); the pool holds the graph arena.
    sources.kv_cache = bundle->kv_parallel_cache_.get();
    sources.registry = &bundle->registry_;
    exec::Executor* executor = bundle->executor_.get();
    sources.release_idle_captures = [executor](int64_t idle_steps) -> int64_t {
      Result<int64_t> released = executor->release_idle_memory(idle_steps);
      if (!released.ok()) {
        log::warn("giving back idle graph memory failed: {}", released.status().to_string());
        return 0;
      }
      return *released;
    };
    FOLIO_ASSIGN_OR_RETURN(bundle->pressure_,
                           MemoryPressureHandler::create(options.pressure, sources));
  }
  EngineParts parts;
  parts.pressure = bundle->pressure_.get();
  if (kv_parallel) {
    parts.kv_parallel_cache = bundle->kv_parallel_cache_.get();
  } else {
    parts.block_manager = bundle->block_manager_.get();
  }
  if (bundle->remote_runner_ != nullptr) {
    parts.runner = bundle->remote_runner_.get();
  } else if (bundle->calibrating_runner_ != nullptr) {
    parts.runner = bundle->calibrating_runner_.get();
  } else {
    parts.runner = bundle->runner_.get();
  }
  parts.preemption_cost = bundle->preemption_cost_.get();
  parts.has_swap_space = bundle->swap_space_ != nullptr;
  parts.registry = &bundle->registry_;
  parts.adapters = bundle->adapters_.get();
  parts.profile = bundle->profile_.get();
  // Generated text continues the prompt, so a leading space is kept.
  tokenizer::DecodeOptions decode_options;
  decode_options.strip_leading_space = false;
  parts.text_decoder_factory =
      make_tokenizer_text_decoder_factory(&bundle->model_->tokenizer(), decode_options);
  FOLIO_ASSIGN_OR_RETURN(bundle->engine_, Engine::create(engine_options, parts));
  return bundle;
}

}  // namespace folio::engine
