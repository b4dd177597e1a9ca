#include "folio/engine/model_engine.h"

#include <algorithm>

#include "folio/device/host_virtual_memory.h"
#include "folio/exec/arena_memory.h"
#include "folio/exec/bucket_policy.h"

namespace folio::engine {
namespace {

int32_t ceil_div(int32_t a, int32_t b) {
  return (a + b - 1) / b;
}

}  // namespace

ModelEngine::~ModelEngine() {
  // The engine stops first (it ends unfinished requests), then the block manager gives its
  // pages back before the page source and the pool go.
  engine_.reset();
  runner_.reset();
  executor_.reset();
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
  page_source_ = std::make_unique<kv::PoolPageSource>(
      *pool_, 2, static_cast<int32_t>(std::min<int64_t>(kv_cap_pages, pool_options.num_pages)));

  const model::LlamaShape& shape = model_->shape();
  kv::BlockManagerOptions kv_options;
  kv_options.geometry = model_->kv_cache_geometry(options.block_size, options.kv_dtype);
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
                                                                  copier_, swap_space_.get()));
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
  exec::ExecutorResources resources{*thread_pool_, *arena_, model_->weights(),
                                    exec::KvCacheBinding{numbers, num_blocks}};
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
  if (options.use_graphs && options.precapture_seconds > 0) {
    const ir::StepPhase decode = ir::StepPhase::kDecode;
    FOLIO_RETURN_IF_ERROR(
        executor_->precapture(std::span(&decode, 1), options.precapture_seconds).status());
  }
  runner_ = std::make_unique<ModelStepRunner>(*executor_, adapters_.get(), pool_.get());
  return Status();
}

Result<std::unique_ptr<ModelEngine>> ModelEngine::create(std::unique_ptr<model::LlamaModel> model,
                                                         const ModelEngineOptions& options) {
  if (options.num_threads < 1) {
    return invalid_argument("thread count must be at least 1, got {}", options.num_threads);
  }
  std::unique_ptr<ModelEngine> bundle(new ModelEngine());
  bundle->model_ = std::move(model);
  bundle->thread_pool_ = std::make_unique<ThreadPool>(options.num_threads);
  FOLIO_RETURN_IF_ERROR(bundle->build_memory(options));
  FOLIO_RETURN_IF_ERROR(bundle->build_executor(options));

  EngineOptions engine_options;
  engine_options.scheduler = options.scheduler;
  engine_options.seed = options.seed;
  if (std::optional<tokenizer::TokenId> eos = bundle->model_->tokenizer().eos()) {
    engine_options.eos_token = static_cast<int32_t>(*eos);
  }
  EngineParts parts;
  parts.block_manager = bundle->block_manager_.get();
  parts.runner = bundle->runner_.get();
  parts.has_swap_space = bundle->swap_space_ != nullptr;
  parts.registry = &bundle->registry_;
  parts.adapters = bundle->adapters_.get();
  const tokenizer::Tokenizer* tokenizer = &bundle->model_->tokenizer();
  parts.text_decoder_factory =
      make_span_text_decoder_factory([tokenizer](std::span<const int32_t> ids) {
        // The sampler only draws ids inside the vocabulary, so decoding cannot fail. Generated
        // text continues the prompt, so a leading space is kept.
        tokenizer::DecodeOptions options;
        options.strip_leading_space = false;
        Result<std::string> text = tokenizer->decode(ids, options);
        FOLIO_CHECK(text.ok(), "decoding generated tokens: {}", text.status().to_string());
        return std::move(*text);
      });
  FOLIO_ASSIGN_OR_RETURN(bundle->engine_, Engine::create(engine_options, parts));
  return bundle;
}

}  // namespace folio::engine
